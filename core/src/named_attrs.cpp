// Named values -> positional kreg_attr slots: KernelHandle::attrs (an op's attributes) and
// the resource types' creation parameters (resource.cpp) both go through fill_named_attrs,
// so both refuse the same things in the same words: an unknown name (listing the known
// ones), a name given twice, a value of the wrong type, a string with a NUL byte (the
// plugin reads a C string: it would see the value cut there) and a missing required one.
#include <string>
#include <type_traits>
#include <variant>

#include "kreg/text.hpp"
#include "registry_group.hpp"

namespace kreg::detail {

namespace {

// One value as slot type `want`; an int where a float is wanted is converted. False when
// it does not fit.
bool convert(const NamedAttr& na, int32_t want, const AttrSlots& slots, kreg_attr& out) {
  out.type = want;
  return std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          if (want != KREG_ATTR_STRING || v.find('\0') != std::string::npos) return false;
          out.value.s = slots.keep(v);
          return true;
        } else if constexpr (std::is_same_v<V, double>) {
          out.value.f = v;
          return want == KREG_ATTR_FLOAT;
        } else if constexpr (std::is_same_v<V, bool>) {
          out.value.i = v ? 1 : 0;
          return want == KREG_ATTR_BOOL;
        } else if constexpr (std::is_same_v<V, ResourceArg>) {
          out.value.r = v.resource;
          return want == KREG_ATTR_RESOURCE && slots.resources;
        } else {
          static_assert(std::is_same_v<V, int64_t>);
          if (want == KREG_ATTR_FLOAT) {
            out.value.f = static_cast<double>(v);
            return true;
          }
          out.value.i = v;
          return want == KREG_ATTR_INT;
        }
      },
      na.value);
}

}  // namespace

Status fill_named_attrs(const AttrSlots& slots, const std::vector<NamedAttr>& named,
                        std::span<kreg_attr> out) {
  const Signature& sig = slots.sig;
  const auto n = static_cast<size_t>(sig.num_attrs);
  const std::string& owner = slots.owner;
  const std::string noun = slots.noun;
  std::vector<bool> given(n, false);
  for (const NamedAttr& na : named) {
    size_t idx = n;
    for (size_t a = 0; a < n; ++a) {
      if (sig.attr(static_cast<int>(a)).name == na.name) idx = a;
    }
    if (idx == n) {
      std::string names;
      for (size_t a = 0; a < n; ++a) names += (a ? ", " : "") + sig.attr(static_cast<int>(a)).name;
      return Status(KREG_INVALID_ARGUMENT, owner + ": unknown " + noun + " '" + excerpt(na.name) +
                                               "' (" + noun +
                                               "s: " + (names.empty() ? "none" : names) + ")");
    }
    if (given[idx]) {
      return Status(KREG_INVALID_ARGUMENT,
                    owner + ": " + noun + " '" + na.name + "' is given twice");
    }
    const int32_t want = slots.types[idx];
    if (!convert(na, want, slots, out[idx])) {
      return Status(KREG_INVALID_ARGUMENT,
                    owner + ": " + noun + " '" + na.name + "' must be " + attr_type_name(want) +
                        (want == KREG_ATTR_STRING ? " without NUL bytes" : ""));
    }
    given[idx] = true;
  }
  for (size_t a = 0; a < n; ++a) {
    const Param& p = sig.attr(static_cast<int>(a));
    if (!given[a] && !p.has_default) {
      return Status(KREG_INVALID_ARGUMENT,
                    owner + ": missing required " + noun + " '" + p.name + "'");
    }
  }
  return Status();
}

}  // namespace kreg::detail
