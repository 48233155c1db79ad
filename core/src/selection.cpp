// Selection: which implementation of an op runs for these arguments (or this target).
// One rule, Registry::select, serves resolve() and the by-name Registry::call: a pass
// that builds no strings and allocates nothing picks the first acceptable implementation
// (highest priority first); only when none is acceptable does a second pass over the same
// checks write down each candidate's reason.
#include <algorithm>
#include <cstdio>

#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::CheckFailure;
using detail::device_string;
using detail::Impl;
using detail::OpEntry;

namespace detail {

bool sm_in_caps(const KernelSpec& spec, int sm) {
  for (const Capability& c : spec.capabilities) {
    if (sm >= c.sm_min && sm <= c.sm_max) return true;
  }
  return false;
}

std::string caps_string(const KernelSpec& spec) {
  std::string s;
  for (const Capability& c : spec.capabilities) {
    if (!s.empty()) s += " or ";
    s += c.to_string();
  }
  return s;
}

std::vector<std::pair<std::string, std::string>> parse_forced_backends(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      out.emplace_back("*", std::string(item));
    } else {
      out.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace detail

namespace {

// "sm_75"
std::string sm_name(int sm) { return "sm_" + std::to_string(sm); }

// The device the arguments (or the target) ask for.
DLDevice device_of(std::span<DLTensor* const> args, const Target* target) {
  if (target != nullptr) return target->device;
  if (!args.empty() && args[0] != nullptr) return args[0]->device;
  return DLDevice{kDLCPU, 0};
}

// Does `impl` run on `device` (its kind, an available backend, the device's SM inside
// a capability window)? No strings: this is the fast path.
bool runs_on(const Impl& impl, const DLDevice& device) {
  const int32_t type = impl.plan.device_type;
  if (device.device_type != type || !impl.backend->available()) return false;
  if (type == kDLCPU) return true;
  const auto sm = impl.backend->sm_of(device.device_id);
  return sm && detail::sm_in_caps(impl.spec, *sm);
}

// Why runs_on(impl, device) is false, or "" when it is not.
std::string device_reason(const Impl& impl, const DLDevice& device) {
  const KernelSpec& spec = impl.spec;
  if (device.device_type != spec.device_type()) {
    return "runs on " + device_type_name(spec.device_type()) + " tensors, the arguments are on " +
           device_string(device);
  }
  if (!impl.backend->available()) {
    return "backend unavailable: " + impl.backend->unavailable_reason();
  }
  if (spec.device_type() == kDLCPU) return "";
  const auto sm = impl.backend->sm_of(device.device_id);
  if (!sm) return "cannot read the compute capability of " + device_string(device);
  if (detail::sm_in_caps(spec, *sm)) return "";
  // The library's images say more than the windows: which builds exist.
  if (!spec.provenance.cuda_images.empty()) {
    const std::string file = std::filesystem::path(spec.provenance.library).filename().string();
    return "no image for " + sm_name(*sm) + " in " +
           escape_control(file.empty() ? spec.provenance.library : file) + ": built " +
           spec.provenance.cuda_images;
  }
  return device_string(device) + " is sm" + std::to_string(*sm) + ", the implementation needs " +
         detail::caps_string(spec);
}

}  // namespace

std::string describe_target(const Target& t) {
  return device_string(t.device) + (t.dtype ? " " + std::string(dtype_name(*t.dtype)) : "");
}

const std::string* Registry::forced_backend(std::string_view op) const {
  const std::string* result = nullptr;
  size_t best = 0;  // the most specific pattern wins
  for (const auto& [pattern, backend] : force_) {
    size_t score = 0;
    if (pattern == "*") {
      score = 1;
    } else if (pattern.size() > 2 && pattern.ends_with(".*") &&
               op.substr(0, op.find('.')) ==
                   std::string_view(pattern).substr(0, pattern.size() - 2)) {
      score = 2;
    } else if (pattern == op) {
      score = 3;
    }
    if (score > best) {
      best = score;
      result = &backend;
    }
  }
  return result;
}

const Impl* Registry::select(std::string_view op, const OpEntry& entry,
                             std::span<DLTensor* const> args, const Target* target,
                             const std::span<const kreg_attr>* attrs, const ResolveOptions* options,
                             std::string* why) const {
  const std::string* want = options != nullptr && options->backend ? &*options->backend : nullptr;
  bool forced = false;
  if (want == nullptr && !force_.empty()) {
    want = forced_backend(op);
    forced = want != nullptr;
  }
  const DLDevice device = device_of(args, target);
  // The fast pass: every check, no strings.
  bool any_backend = false;
  for (const Impl* impl : entry.impls) {
    if (want != nullptr && impl->spec.backend != *want) continue;
    any_backend = true;
    if (!runs_on(*impl, device)) continue;
    if (target != nullptr) {
      if (target->dtype && !(impl->plan.shared_dtypes & mask_of(*target->dtype))) continue;
    } else if (attrs != nullptr ? !impl->plan.accepts(args, *attrs)
                                : !impl->plan.accepts_tensors(args)) {
      continue;
    }
    // A jit implementation runs as the specialization for these tensors (compiled on
    // first use); it cannot be chosen for a target without tensors, and one that cannot
    // be compiled leaves the choice to the next implementation.
    if (impl->jit.load(std::memory_order_acquire) != nullptr) {
      if (target != nullptr && target->dims.empty()) continue;
      if (const Impl* s = specialize_jit(*impl, args, target, nullptr)) return s;
      continue;
    }
    return impl;
  }
  if (why == nullptr) return nullptr;
  // Nothing fits: the same checks again, each failure in words.
  const std::string forced_note = forced ? " (forced by KREG_FORCE_BACKEND)" : "";
  if (!any_backend) {
    std::string have;
    for (const Impl* impl : entry.impls) have += (have.empty() ? "" : ", ") + impl->spec.backend;
    *why = "op '" + std::string(op) + "' has no implementation for backend '" + *want + "'" +
           forced_note + " (it has: " + have + ")";
    return nullptr;
  }
  std::string reasons;
  for (const Impl* impl : entry.impls) {
    if (want != nullptr && impl->spec.backend != *want) continue;
    std::string reason = device_reason(*impl, device);
    if (reason.empty() && target != nullptr && target->dtype &&
        !(impl->plan.shared_dtypes & mask_of(*target->dtype))) {
      reason = "dtype " + std::string(dtype_name(*target->dtype)) + " not supported (" +
               dtype_set_name(impl->plan.shared_dtypes) + ")";
    }
    if (reason.empty() && target == nullptr) {
      detail::CheckResult r = impl->plan.diagnose(args, {});
      if (r.why == CheckFailure::kAttrCount) r = {};  // attributes are checked per call
      if (r.why != CheckFailure::kNone) reason = KernelHandle(impl).explain(r, args, {}).message();
    }
    if (reason.empty() && impl->jit.load(std::memory_order_acquire) != nullptr) {
      if (target != nullptr && target->dims.empty()) {
        reason =
            "a jit implementation is specialized for the call's shapes: resolve with the "
            "tensors (or a target with its dimensions)";
      } else if (const Impl* s = specialize_jit(*impl, args, target, &reason)) {
        return s;
      }
    }
    // Accepted by the tensors alone: only the attributes failed (call's fast pass); the
    // caller reports them through the handle.
    if (reason.empty()) return impl;
    reasons += "\n  - " + impl->spec.backend + ": " + reason;
  }
  *why = "no implementation of '" + std::string(op) + "' accepts " +
         (target ? describe_target(*target) : "these arguments") + forced_note + ":" + reasons;
  return nullptr;
}

Result<KernelHandle> Registry::resolve(std::string_view op, std::span<DLTensor* const> args,
                                       const ResolveOptions& options) {
  const OpEntry* entry = find_op_or_alias(op, true);
  if (entry == nullptr) return unknown_op(op);
  std::string why;
  const Impl* impl = select(op, *entry, args, nullptr, nullptr, &options, &why);
  if (impl == nullptr) {
    return Status(why.starts_with("op '") ? KREG_NOT_FOUND : KREG_INVALID_ARGUMENT, why);
  }
  return KernelHandle(impl);
}

Result<KernelHandle> Registry::resolve(std::string_view op, const Target& target,
                                       const ResolveOptions& options) {
  const OpEntry* entry = find_op_or_alias(op, true);
  if (entry == nullptr) return unknown_op(op);
  std::string why;
  const Impl* impl = select(op, *entry, {}, &target, nullptr, &options, &why);
  if (impl == nullptr) {
    return Status(why.starts_with("op '") ? KREG_NOT_FOUND : KREG_INVALID_ARGUMENT, why);
  }
  return KernelHandle(impl);
}

Status Registry::call(std::string_view op, std::span<DLTensor* const> tensors,
                      std::span<const kreg_attr> attrs, const CallOptions& options) {
  const OpEntry* entry = find_op_or_alias(op, true);
  if (entry == nullptr) [[unlikely]]
    return unknown_op(op);
  // The fast pass checks the attributes too, so its choice can be invoked directly.
  if (const Impl* impl = select(op, *entry, tensors, nullptr, &attrs, nullptr, nullptr))
      [[likely]] {
    if (detail::moves_nothing(impl->plan, tensors)) [[unlikely]]
      return Status();
    return detail::invoke(*impl, tensors, attrs, options);
  }
  // Off the fast path: the implementation the tensors select says what is wrong with the
  // attributes, or every candidate's reason when none fits the tensors.
  std::string why;
  const Impl* impl = select(op, *entry, tensors, nullptr, nullptr, nullptr, &why);
  if (impl == nullptr) {
    return Status(why.starts_with("op '") ? KREG_NOT_FOUND : KREG_INVALID_ARGUMENT, why);
  }
  return KernelHandle(impl).call(tensors, attrs, options);
}

}  // namespace kreg
