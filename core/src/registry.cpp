#include "kreg/registry.hpp"

#include "registry_group.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "kreg/admission.hpp"
#include "kreg/plugin_probe.hpp"
#include "kreg/text.hpp"

namespace kreg {

using detail::CheckFailure;
using detail::CheckPlan;
using detail::Impl;
using detail::OpEntry;

// Registry::Group is defined in registry_group.hpp (shared with reload.cpp).

namespace {

std::string device_string(const DLDevice& d) {
  return device_type_name(d.device_type) + ":" + std::to_string(d.device_id);
}

std::string shape_string(const DLTensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) {
    if (i) s += ",";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

const char* attr_type_name(int32_t type) {
  switch (type) {
    case KREG_ATTR_INT:
      return "int";
    case KREG_ATTR_FLOAT:
      return "float";
    case KREG_ATTR_BOOL:
      return "bool";
    case KREG_ATTR_STRING:
      return "str";
    default:
      return "unknown";
  }
}

int32_t attr_type_of(ArgKind k) {
  switch (k) {
    case ArgKind::kInt:
      return KREG_ATTR_INT;
    case ArgKind::kFloat:
      return KREG_ATTR_FLOAT;
    case ArgKind::kBool:
      return KREG_ATTR_BOOL;
    case ArgKind::kString:
      return KREG_ATTR_STRING;
    case ArgKind::kTensor:
      break;
  }
  return 0;
}

std::unique_ptr<Impl> make_impl(const KernelSpec& spec) {
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->backend = find_backend(spec.backend);
  impl->fn.store(spec.fn, std::memory_order_relaxed);
  CheckPlan& plan = impl->plan;
  const Signature& sig = spec.signature;
  plan.device_type = spec.device_type();
  plan.shared_dtypes = spec.dtypes;
  plan.num_tensors = static_cast<int8_t>(sig.num_tensors);
  plan.num_attrs = static_cast<int8_t>(sig.num_attrs);
  plan.num_symbols = static_cast<int8_t>(sig.symbols.size());
  impl->string_defaults.resize(static_cast<size_t>(sig.num_attrs));
  int ti = 0, ai = 0;
  for (const Param& p : sig.params) {
    if (p.kind == ArgKind::kTensor) {
      if (p.optional) plan.optional_mask |= 1u << ti;
      if (p.host_ok) plan.host_ok_mask |= 1u << ti;
      detail::TensorRule& r = plan.tensors[ti++];
      r.dtypes = p.dtypes;
      r.ndim = p.ranked ? static_cast<int8_t>(p.dims.size()) : int8_t{-1};
      for (size_t k = 0; k < p.dims.size(); ++k) r.dims[k] = p.dims[k];
      continue;
    }
    plan.attr_types[ai] = attr_type_of(p.kind);
    if (p.has_default) {
      plan.defaults[ai] = p.default_value;
      if (p.kind == ArgKind::kString) {
        impl->string_defaults[static_cast<size_t>(ai)] = p.default_text;
      }
    } else {
      plan.num_required_attrs = static_cast<int8_t>(ai + 1);
    }
    ++ai;
  }
  // Compile the fast path: shared-dtype words and the shape steps in argument order.
  for (int d = 0; d < static_cast<int>(DType::kCount); ++d) {
    if (plan.shared_dtypes & mask_of(static_cast<DType>(d))) {
      plan.shared_words[plan.num_shared_words++] = detail::pack_dtype(to_dl(static_cast<DType>(d)));
    }
  }
  struct FirstUse {
    int tensor = -1, dim = 0, coef = 1;
  } first[kMaxSymbols];
  // Required tensors first: they bind every symbol (the schema guarantees it), so the
  // steps of optional tensors only ever compare with required ones and can be skipped.
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < plan.num_tensors; ++i) {
      const bool optional = (plan.optional_mask >> i) & 1u;
      if (optional != (pass == 1)) continue;
      const detail::TensorRule& r = plan.tensors[i];
      plan.fast[i].ndim = r.ndim;
      plan.fast[i].dtypes = r.dtypes;
      if (r.dtypes == 0 && plan.first_shared < 0) plan.first_shared = static_cast<int8_t>(i);
      for (int k = 0; k < r.ndim; ++k) {
        const DimExpr& e = r.dims[k];
        if (e.symbol >= 0 && first[e.symbol].tensor < 0) {
          first[e.symbol] = {i, k, e.coef};
          if (e.coef != 1) {
            detail::DimDivisor& d = plan.divisors[plan.num_divisors++];
            d.tensor = static_cast<uint8_t>(i);
            d.dim = static_cast<uint8_t>(k);
            d.coef = e.coef;
            d.mask = (e.coef & (e.coef - 1)) == 0 ? e.coef - 1 : 0;
          }
          continue;
        }
        detail::DimPair& p = plan.pairs[plan.num_pairs + plan.num_opt_pairs];
        (optional ? plan.num_opt_pairs : plan.num_pairs)++;
        p.ta = static_cast<uint8_t>(i);
        p.da = static_cast<uint8_t>(k);
        if (e.symbol < 0) {
          p.tb = detail::DimPair::kLiteral;
          p.literal = e.literal;
          continue;
        }
        const FirstUse& f = first[e.symbol];
        p.tb = static_cast<uint8_t>(f.tensor);
        p.db = static_cast<uint8_t>(f.dim);
        p.ca = e.coef;
        p.cb = f.coef;
      }
    }
  }
  // Point string defaults at storage only now: the vector no longer moves.
  for (int i = 0; i < plan.num_attrs; ++i) {
    if (plan.attr_types[i] == KREG_ATTR_STRING) {
      plan.defaults[i].value.s = impl->string_defaults[static_cast<size_t>(i)].c_str();
    }
  }
  return impl;
}

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

}  // namespace

namespace detail {

// The same rules as accepts(), one at a time, to say which one failed.
CheckResult CheckPlan::diagnose(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const {
  if (static_cast<int>(t.size()) != num_tensors) {
    return {CheckFailure::kTensorCount};
  }
  if (static_cast<int>(a.size()) > num_attrs || static_cast<int>(a.size()) < num_required_attrs) {
    return {CheckFailure::kAttrCount};
  }
  int64_t sym[kMaxSymbols];
  for (int s = 0; s < num_symbols; ++s) sym[s] = -1;
  uint32_t shared = 0;
  int32_t device_id = 0;
  for (int i = 0; i < num_tensors; ++i) {
    const DLTensor* x = t[static_cast<size_t>(i)];
    const auto arg = static_cast<int8_t>(i);
    if (x == nullptr) {
      if ((optional_mask >> i) & 1u) continue;
      return {CheckFailure::kNullTensor, arg};
    }
    const bool host = ((host_ok_mask >> i) & 1u) && is_host_memory(x->device);
    if (!host) {
      if (x->device.device_type != device_type) return {CheckFailure::kDevice, arg};
      if (i == 0) {
        device_id = x->device.device_id;
      } else if (x->device.device_id != device_id) {
        return {CheckFailure::kDeviceMismatch, arg};
      }
    }
    const TensorRule& r = tensors[i];
    // Before anything reads the shape: a caller's ndim and shape pointer are not trusted.
    if (static_cast<uint32_t>(x->ndim) > static_cast<uint32_t>(kMaxCallNdim) ||
        (x->ndim > 0 && x->shape == nullptr)) {
      return {CheckFailure::kBadShape, arg};
    }
    if (r.dtypes == 0) {
      const uint32_t code = pack_dtype(x->dtype);
      if (shared == 0) {
        auto d = from_dl(x->dtype);
        if (!d || !(shared_dtypes & mask_of(*d))) return {CheckFailure::kDType, arg};
        shared = code;
      } else if (code != shared) {
        return {CheckFailure::kSharedDType, arg};
      }
    } else {
      auto d = from_dl(x->dtype);
      if (!d || !(r.dtypes & mask_of(*d))) return {CheckFailure::kDType, arg};
    }
    if (r.ndim >= 0 && x->ndim != r.ndim) return {CheckFailure::kRank, arg};
    const int bad =
        check_extents(x->shape, x->ndim, dl_item_bytes(x->dtype.bits, x->dtype.lanes), nullptr);
    if (bad >= 0) return {CheckFailure::kNegativeDim, arg, static_cast<int8_t>(bad)};
    if (bad == kShapeTooLarge) return {CheckFailure::kTooLarge, arg};
    if (r.ndim >= 0) {
      for (int k = 0; k < r.ndim; ++k) {
        const DimExpr& e = r.dims[k];
        int64_t v = x->shape[k];
        if (e.symbol < 0) {
          if (v != e.literal) return {CheckFailure::kDim, arg, static_cast<int8_t>(k)};
          continue;
        }
        // e.coef is in [1, INT32_MAX] (the schema's range): no division by zero.
        if (e.coef != 1) {
          if (v % e.coef != 0) {
            return {CheckFailure::kDimDivisible, arg, static_cast<int8_t>(k)};
          }
          v /= e.coef;
        }
        int64_t& bound = sym[e.symbol];
        if (bound < 0) {
          bound = v;
        } else if (bound != v) {
          return {CheckFailure::kDim, arg, static_cast<int8_t>(k)};
        }
      }
    }
    if (x->strides != nullptr && !strides_row_major(*x)) {
      return {CheckFailure::kContiguous, arg};
    }
  }
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].type != attr_types[j]) {
      return {CheckFailure::kAttrType, static_cast<int8_t>(j)};
    }
  }
  return {};
}

Status kernel_error(const Impl& impl, int32_t rc, const char* message, size_t capacity) {
  auto code = static_cast<kreg_status_code>(rc);
  if (rc < 0 || rc > KREG_UNAUTHENTICATED) code = KREG_UNKNOWN;
  const std::string_view text(message, ::strnlen(message, capacity));
  return Status(
      code, impl.spec.op + " (" + impl.spec.backend +
                "): " + (text.empty() ? "kernel failed without a message" : escape_control(text)) +
                (code == KREG_UNKNOWN && rc != KREG_UNKNOWN
                     ? " (non-canonical status " + std::to_string(rc) + ")"
                     : ""));
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Argument errors

Status KernelHandle::explain(const detail::CheckResult& r, std::span<DLTensor* const> tensors,
                             std::span<const kreg_attr> attrs) const {
  const KernelSpec& spec = impl_->spec;
  const Signature& sig = spec.signature;
  const CheckPlan& plan = impl_->plan;
  const std::string head = spec.op + " (" + spec.backend + "): ";
  auto tensor_names = [&] {
    std::string s;
    for (int i = 0; i < sig.num_tensors; ++i) s += (i ? ", " : "") + sig.tensor(i).name;
    return s;
  };
  auto arg_name = [&](int i) {
    return "argument '" + sig.tensor(i).name + "' (tensor " + std::to_string(i + 1) + " of " +
           std::to_string(sig.num_tensors) + ")";
  };
  auto fail = [&](const std::string& what) {
    return Status(KREG_INVALID_ARGUMENT, head + what + "; signature: " + escape_control(sig.text));
  };
  const int i = r.arg;
  switch (r.why) {
    case CheckFailure::kNone:
      break;
    case CheckFailure::kTensorCount:
      return fail("expected " + std::to_string(sig.num_tensors) + " tensors (" + tensor_names() +
                  "), got " + std::to_string(tensors.size()));
    case CheckFailure::kAttrCount: {
      std::string names;
      for (int a = 0; a < sig.num_attrs; ++a) names += (a ? ", " : "") + sig.attr(a).name;
      return fail("expected " + std::to_string(plan.num_required_attrs) + " to " +
                  std::to_string(sig.num_attrs) + " attributes (" + names + "), got " +
                  std::to_string(attrs.size()));
    }
    case CheckFailure::kNullTensor:
      return fail(arg_name(i) + " is null");
    case CheckFailure::kDevice:
      return fail(arg_name(i) + " is on " + device_string(tensors[i]->device) + ", but backend " +
                  spec.backend + " runs on " + device_type_name(plan.device_type) + " tensors");
    case CheckFailure::kDeviceMismatch:
      return fail(arg_name(i) + " is on " + device_string(tensors[i]->device) + ", but '" +
                  sig.tensor(0).name + "' is on " + device_string(tensors[0]->device));
    case CheckFailure::kDType: {
      const DTypeMask allowed =
          plan.tensors[i].dtypes ? plan.tensors[i].dtypes : plan.shared_dtypes;
      return fail(arg_name(i) + " has dtype " + describe_dl(tensors[i]->dtype) + ", expected " +
                  dtype_set_name(allowed));
    }
    case CheckFailure::kSharedDType: {
      int first = 0;
      while (plan.tensors[first].dtypes != 0) ++first;
      return fail(arg_name(i) + " has dtype " + describe_dl(tensors[i]->dtype) + ", but '" +
                  sig.tensor(first).name + "' has " + describe_dl(tensors[first]->dtype) +
                  " (these tensors share one dtype)");
    }
    case CheckFailure::kRank:
      return fail(arg_name(i) + " has rank " + std::to_string(tensors[i]->ndim) + " " +
                  shape_string(*tensors[i]) + ", expected rank " +
                  std::to_string(plan.tensors[i].ndim) + " " + sig.shape_name(sig.tensor(i)));
    case CheckFailure::kBadShape:
      return fail(arg_name(i) +
                  (tensors[i]->ndim > 0 && tensors[i]->shape == nullptr
                       ? " has ndim " + std::to_string(tensors[i]->ndim) + " but a null shape"
                       : " has ndim " + std::to_string(tensors[i]->ndim) + ", outside [0, " +
                             std::to_string(detail::kMaxCallNdim) + "]"));
    case CheckFailure::kNegativeDim:
      return fail(arg_name(i) + " has shape " + shape_string(*tensors[i]) + ": dim " +
                  std::to_string(r.dim) + " is negative");
    case CheckFailure::kTooLarge:
      return fail(arg_name(i) + " has shape " + shape_string(*tensors[i]) + " of " +
                  describe_dl(tensors[i]->dtype) +
                  ": its size in bytes overflows int64 (at most 9223372036854775807 bytes)");
    case CheckFailure::kDimDivisible: {
      const DimExpr& e = plan.tensors[i].dims[r.dim];
      return fail(arg_name(i) + " dim " + std::to_string(r.dim) + " (" + sig.dim_name(e) + ") is " +
                  std::to_string(tensors[i]->shape[r.dim]) + ", not a multiple of " +
                  std::to_string(e.coef));
    }
    case CheckFailure::kDim: {
      const DimExpr& e = plan.tensors[i].dims[r.dim];
      const int64_t got = tensors[i]->shape[r.dim];
      if (e.symbol < 0) {
        return fail(arg_name(i) + " dim " + std::to_string(r.dim) + " is " + std::to_string(got) +
                    ", expected " + std::to_string(e.literal));
      }
      // Find where the symbol was bound first, to name both sides.
      for (int j = 0; j <= i; ++j) {
        if (tensors[j] == nullptr) continue;  // an omitted optional tensor binds nothing
        for (int k = 0; k < plan.tensors[j].ndim; ++k) {
          const DimExpr& f = plan.tensors[j].dims[k];
          if (f.symbol != e.symbol) continue;
          const int64_t value = tensors[j]->shape[k] / f.coef;
          return fail(arg_name(i) + " has shape " + shape_string(*tensors[i]) + ", expected " +
                      sig.shape_name(sig.tensor(i)) + ": dim " + std::to_string(r.dim) + " (" +
                      sig.dim_name(e) + ") is " + std::to_string(got) + ", but " +
                      sig.symbols[static_cast<size_t>(e.symbol)] + " = " + std::to_string(value) +
                      " from '" + sig.tensor(j).name + "' dim " + std::to_string(k));
        }
      }
      break;
    }
    case CheckFailure::kContiguous: {
      std::string strides = "[";
      for (int k = 0; k < tensors[i]->ndim; ++k) {
        strides += (k ? "," : "") + std::to_string(tensors[i]->strides[k]);
      }
      return fail(arg_name(i) + " is not contiguous (shape " + shape_string(*tensors[i]) +
                  ", strides " + strides + "]); kreg kernels take row-major contiguous tensors");
    }
    case CheckFailure::kAttrType:
      return fail("attribute '" + sig.attr(i).name + "' (attribute " + std::to_string(i + 1) +
                  ") must be " + attr_type_name(plan.attr_types[i]) + ", got " +
                  attr_type_name(attrs[static_cast<size_t>(i)].type));
  }
  return fail("argument check failed");
}

Result<AttrList> KernelHandle::attrs(const std::vector<NamedAttr>& named) const {
  const Signature& sig = impl_->spec.signature;
  const CheckPlan& plan = impl_->plan;
  AttrList list;
  list.attrs_.assign(plan.defaults, plan.defaults + plan.num_attrs);
  std::vector<bool> given(static_cast<size_t>(plan.num_attrs), false);
  for (const NamedAttr& na : named) {
    int idx = -1;
    for (int a = 0; a < sig.num_attrs; ++a) {
      if (sig.attr(a).name == na.name) idx = a;
    }
    if (idx < 0) {
      std::string names;
      for (int a = 0; a < sig.num_attrs; ++a) names += (a ? ", " : "") + sig.attr(a).name;
      return Status(KREG_INVALID_ARGUMENT,
                    impl_->spec.op + ": unknown attribute '" + excerpt(na.name) +
                        "' (attributes: " + (names.empty() ? "none" : names) + ")");
    }
    kreg_attr& out = list.attrs_[static_cast<size_t>(idx)];
    const int32_t want = plan.attr_types[idx];
    out.type = want;
    bool ok = true;
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            ok = want == KREG_ATTR_STRING;
            list.strings_.push_back(std::make_unique<std::string>(v));
            out.value.s = list.strings_.back()->c_str();
          } else if constexpr (std::is_same_v<V, double>) {
            ok = want == KREG_ATTR_FLOAT;
            out.value.f = v;
          } else if constexpr (std::is_same_v<V, bool>) {
            ok = want == KREG_ATTR_BOOL;
            out.value.i = v ? 1 : 0;
          } else {
            ok = want == KREG_ATTR_INT || want == KREG_ATTR_FLOAT;
            if (want == KREG_ATTR_FLOAT) {
              out.value.f = static_cast<double>(v);
            } else {
              out.value.i = v;
            }
          }
        },
        na.value);
    if (!ok) {
      return Status(KREG_INVALID_ARGUMENT, impl_->spec.op + ": attribute '" + na.name +
                                               "' must be " + attr_type_name(want));
    }
    given[static_cast<size_t>(idx)] = true;
  }
  for (int a = 0; a < sig.num_attrs; ++a) {
    if (!given[static_cast<size_t>(a)] && !sig.attr(a).has_default) {
      return Status(KREG_INVALID_ARGUMENT,
                    impl_->spec.op + ": missing required attribute '" + sig.attr(a).name + "'");
    }
  }
  return list;
}

// ---------------------------------------------------------------------------------------
// Registry

Registry::Registry() {
  const char* env = std::getenv("KREG_FORCE_BACKEND");
  if (env == nullptr || *env == '\0') return;
  std::string_view text(env);
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      force_.emplace_back("*", std::string(item));
    } else {
      force_.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
}

Registry::~Registry() {
  // Drop op tables before libraries: nothing that points into a plugin outlives it.
  index_.store(nullptr);
  indexes_.clear();
  for (auto& [name, g] : groups_) {
    g->table.store(nullptr);
    g->tables.clear();
  }
  impls_.clear();
  for (auto& [name, g] : groups_) g->library.reset();
}

std::optional<std::string> Registry::forced_backend(std::string_view op) const {
  std::optional<std::string> result;
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
      result = backend;
    }
  }
  return result;
}

Registry::Group& Registry::group_locked(const std::string& name) {
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    auto g = std::make_unique<Group>();
    g->name = name;
    it = groups_.emplace(name, std::move(g)).first;
  }
  return *it->second;
}

Registry::Group* Registry::find_group(std::string_view name) const {
  auto it = groups_.find(name);
  return it == groups_.end() ? nullptr : it->second.get();
}

Result<std::unique_ptr<Registry>> Registry::open(const Manifest& manifest,
                                                 const OpenOptions& options) {
  auto reg = std::make_unique<Registry>();
  std::lock_guard lock(reg->mu_);
  reg->open_options_ = options;
  for (const GroupEntry& e : manifest.groups) {
    Group& g = reg->group_locked(e.name);
    g.entry = e;
  }
  for (const AliasEntry& a : manifest.aliases) {
    if (Status st = reg->add_alias(a.from, a.to, a.message); !st.ok()) {
      return Status(st.code(), a.where.to_string() + ": " + st.message());
    }
  }
  for (const GroupEntry& e : manifest.groups) {
    if (!e.enabled || (e.load == LoadMode::kLazy && !options.load_lazy_groups)) continue;
    if (Status st = reg->load_locked(*reg->groups_.find(e.name)->second); !st.ok()) return st;
  }
  return reg;
}

Status Registry::load_group(const GroupEntry& entry) {
  std::lock_guard lock(mu_);
  Group& g = group_locked(entry.name);
  g.entry = entry;
  return load_locked(g);
}

Status Registry::load_locked(Group& g) const {
  if (!g.entry) {
    return Status(KREG_FAILED_PRECONDITION, "group '" + g.name + "' has no manifest entry");
  }
  if (!g.entry->enabled) {
    return Status(KREG_FAILED_PRECONDITION, "group '" + g.name + "' is disabled in the manifest (" +
                                                g.entry->where.to_string() + ")");
  }
  // Nothing of the library is mapped before it proves it is where it should be, that no
  // one else can change it, and that it is the build the manifest pinned; what is mapped
  // is exactly what was checked (load_generation, reload.cpp).
  GenerationRequest request;
  request.entry = &*g.entry;
  request.group = g.name;
  request.library = g.entry->library;
  request.version = g.entry->version;
  request.generation = g.generation + 1;
  request.private_copy = open_options_.private_copy;
  request.precheck_in_child = open_options_.precheck_in_child;
  request.precheck_timeout_s = open_options_.precheck_timeout_s;
  auto loaded = load_generation(request);
  if (!loaded) {
    g.error = loaded.status().message();
    return loaded.status();
  }
  std::unique_ptr<PluginLibrary> lib = std::move(loaded->library);
  // The init hook runs before the kernels become reachable: a lazily loaded group is
  // published while other threads may already be looking it up.
  if (Status st = lib->init(); !st.ok()) {
    g.error = st.message();
    return st;
  }
  if (Status st = publish_locked(g, loaded->kernels); !st.ok()) {
    g.error = st.message();
    return st;
  }
  g.library = std::move(lib);
  g.private_copy = loaded->private_copy;
  g.loaded_from = loaded->private_copy ? g.entry->library : std::filesystem::path();
  ++g.generation;
  g.error.clear();
  return OkStatus();
}

Status Registry::publish_locked(Group& g, const std::vector<KernelSpec>& specs) const {
  // Check everything first: a group is admitted whole or not at all.
  const Group::OpMap* old = g.table.load(std::memory_order_acquire);
  std::vector<const KernelSpec*> fresh;
  for (const KernelSpec& s : specs) {
    if (s.group() != g.name) {
      return Status(KREG_INVALID_ARGUMENT,
                    "op '" + excerpt(s.op) + "' does not belong to group '" + g.name + "'");
    }
    const Impl* existing = nullptr;
    if (old != nullptr) {
      if (auto it = old->find(s.op); it != old->end()) {
        for (const Impl* impl : it->second.impls) {
          if (impl->spec.backend == s.backend) existing = impl;
        }
      }
    }
    for (const KernelSpec* f : fresh) {
      if (f->op == s.op && f->backend == s.backend) {
        return Status(KREG_ALREADY_EXISTS, "conflicting registration of " + s.op + " (" +
                                               s.backend + "): registered twice by " +
                                               escape_control(s.source()));
      }
    }
    if (existing != nullptr) {
      if (existing->spec.same_registration(s)) continue;  // identical: no-op
      return Status(KREG_ALREADY_EXISTS,
                    "conflicting registration of " + s.op + " (" + s.backend +
                        "): " + escape_control(existing->spec.source()) + " registered it as '" +
                        escape_control(existing->spec.signature.text) + "' [" +
                        dtype_set_name(existing->spec.dtypes) + ", " + caps_string(existing->spec) +
                        "], " + escape_control(s.source()) + " as '" +
                        escape_control(s.signature.text) + "' [" + dtype_set_name(s.dtypes) + ", " +
                        caps_string(s) + "]");
    }
    fresh.push_back(&s);
  }
  if (fresh.empty() && old != nullptr) return OkStatus();
  auto table = old ? std::make_unique<Group::OpMap>(*old) : std::make_unique<Group::OpMap>();
  for (const KernelSpec* s : fresh) {
    impls_.push_back(make_impl(*s));
    Impl* impl = impls_.back().get();
    OpEntry& op = (*table)[s->op];
    op.id = s->op;
    op.impls.push_back(impl);
    std::stable_sort(op.impls.begin(), op.impls.end(), [](const Impl* a, const Impl* b) {
      return a->spec.priority > b->spec.priority;
    });
  }
  // Entries were copied: re-point each Impl at its entry in the new table.
  for (auto& [id, op] : *table) {
    for (Impl* impl : op.impls) impl->op = &op;
  }
  g.table.store(table.get(), std::memory_order_release);
  g.tables.push_back(std::move(table));
  std::vector<const OpEntry*> all;
  for (const auto& [name, group] : groups_) {
    if (const Group::OpMap* t = group->table.load(std::memory_order_acquire)) {
      for (const auto& [id, op] : *t) all.push_back(&op);
    }
  }
  auto index = std::make_unique<detail::OpIndex>(all);
  index_.store(index.get(), std::memory_order_release);
  indexes_.push_back(std::move(index));
  return OkStatus();
}

Status Registry::add(const KernelSpec& spec) {
  std::lock_guard lock(mu_);
  if (!is_valid_op_id(spec.op)) {
    return Status(KREG_INVALID_ARGUMENT,
                  "op id '" + excerpt(spec.op) + "' is not '<group>.<name>'");
  }
  if (spec.fn == nullptr || find_backend(spec.backend) == nullptr || spec.capabilities.empty()) {
    return Status(KREG_INVALID_ARGUMENT,
                  spec.op + ": a spec needs fn, a known backend and capabilities");
  }
  Group& g = group_locked(std::string(spec.group()));
  return publish_locked(g, {spec});
}

Status Registry::add_alias(const std::string& from, const std::string& to,
                           const std::string& message) {
  std::lock_guard lock(mu_);
  if (!is_valid_op_id(from) || !is_valid_op_id(to)) {
    return Status(KREG_INVALID_ARGUMENT, "alias " + excerpt(from) + " -> " + excerpt(to) +
                                             ": op ids must be '<group>.<name>'");
  }
  if (from == to) return Status(KREG_INVALID_ARGUMENT, "alias " + from + " points at itself");
  // The manifest parser refuses cycles; aliases added here must not close one either, or
  // a lookup through them would go round forever.
  std::string chain = from + " -> " + to;
  std::string_view next = to;
  for (size_t hops = 0; hops <= aliases_.size(); ++hops) {
    auto it = aliases_.find(next);
    if (it == aliases_.end()) break;
    next = it->second->to;
    chain += " -> " + std::string(next);
    if (next == from) {
      return Status(KREG_INVALID_ARGUMENT,
                    "alias " + from + " -> " + to + " would close an alias cycle: " + chain);
    }
  }
  auto a = std::make_unique<Alias>();
  a->to = to;
  a->message = message;
  if (!aliases_.emplace(from, std::move(a)).second) {
    return Status(KREG_ALREADY_EXISTS, "alias " + from + " is defined twice");
  }
  return OkStatus();
}

Status Registry::ensure_loaded(Group& g) const {
  if (g.table.load(std::memory_order_acquire) != nullptr) return OkStatus();
  std::lock_guard lock(mu_);
  if (g.table.load(std::memory_order_acquire) != nullptr) return OkStatus();
  if (!g.entry) return OkStatus();
  return load_locked(g);
}

const OpEntry* Registry::find_op(std::string_view op) const {
  if (const detail::OpIndex* index = index_.load(std::memory_order_acquire)) {
    if (const OpEntry* e = index->find(op)) return e;
  }
  const size_t dot = op.find('.');
  if (dot == std::string_view::npos) return nullptr;
  Group* g = find_group(op.substr(0, dot));
  if (g == nullptr) return nullptr;
  const Group::OpMap* table = g->table.load(std::memory_order_acquire);
  if (table == nullptr) [[unlikely]] {
    if (!ensure_loaded(*g).ok()) return nullptr;
    table = g->table.load(std::memory_order_acquire);
    if (table == nullptr) return nullptr;
  }
  auto it = table->find(op);
  return it == table->end() ? nullptr : &it->second;
}

template <typename Visit>
const OpEntry* Registry::follow_aliases(const Alias& from, Visit&& visit) const {
  std::string_view name = from.to;
  // add_alias and the manifest refuse cycles; the bound keeps a lookup finite regardless.
  for (size_t hops = 0; hops <= aliases_.size(); ++hops) {
    visit(name);
    if (const OpEntry* e = find_op(name)) return e;
    auto it = aliases_.find(name);
    if (it == aliases_.end()) return nullptr;
    name = it->second->to;
  }
  return nullptr;
}

const OpEntry* Registry::find_op_or_alias(std::string_view op) const {
  if (const OpEntry* e = find_op(op)) return e;
  auto it = aliases_.find(op);
  if (it == aliases_.end()) return nullptr;
  const Alias& a = *it->second;
  std::string_view last;
  const OpEntry* e = follow_aliases(a, [&](std::string_view name) { last = name; });
  // A chain to a missing op says so in the lookup's error instead.
  if (e != nullptr && !a.warned.exchange(true)) [[unlikely]] {
    // Once per alias, so the strings cost nothing on later calls. The names are checked
    // op ids; the message is the manifest's free text.
    std::string via;
    follow_aliases(a, [&](std::string_view name) {
      if (name != last) via += (via.empty() ? " (via " : " -> ") + std::string(name);
    });
    if (!via.empty()) via += ")";
    const std::string line = "kreg: warning: op '" + std::string(op) +
                             "' is a deprecated alias of '" + std::string(last) + "'" + via +
                             (a.message.empty() ? "" : ": " + escape_control(a.message)) + "\n";
    std::fputs(line.c_str(), stderr);
  }
  return e;
}

std::optional<AliasChain> Registry::resolve_alias(std::string_view op) const {
  if (find_op(op) != nullptr) return std::nullopt;
  auto it = aliases_.find(op);
  if (it == aliases_.end()) return std::nullopt;
  AliasChain chain;
  chain.names.emplace_back(op);
  chain.message = it->second->message;
  chain.found = follow_aliases(*it->second, [&](std::string_view name) {
                  chain.names.emplace_back(name);
                }) != nullptr;
  return chain;
}

std::string AliasChain::text() const {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " -> ") + n;
  return s;
}

std::string describe_target(const Target& t) {
  return device_string(t.device) + (t.dtype ? " " + std::string(dtype_name(*t.dtype)) : "");
}

const Impl* Registry::select(std::string_view op, const OpEntry& entry,
                             std::span<DLTensor* const> args, const Target* target,
                             const ResolveOptions& options, std::string* why) const {
  std::optional<std::string> want = options.backend;
  std::string forced_note;
  if (!want) {
    want = forced_backend(op);
    if (want) forced_note = " (forced by KREG_FORCE_BACKEND)";
  }
  DLDevice device{kDLCPU, 0};
  if (target != nullptr) {
    device = target->device;
  } else if (!args.empty() && args[0] != nullptr) {
    device = args[0]->device;
  }
  bool any_backend = false;
  for (const Impl* impl : entry.impls) {
    if (want && impl->spec.backend != *want) continue;
    any_backend = true;
    const KernelSpec& spec = impl->spec;
    std::string reason;
    if (device.device_type != spec.device_type()) {
      reason = "runs on " + device_type_name(spec.device_type()) +
               " tensors, the arguments are on " + device_string(device);
    } else if (!impl->backend->available()) {
      reason = "backend unavailable: " + impl->backend->unavailable_reason();
    } else if (spec.device_type() != kDLCPU) {
      auto sm = impl->backend->sm_of(device.device_id);
      if (!sm) {
        reason = "cannot read the compute capability of " + device_string(device);
      } else if (!sm_in_caps(spec, *sm)) {
        reason = device_string(device) + " is sm" + std::to_string(*sm) +
                 ", the implementation needs " + caps_string(spec);
      }
    }
    if (reason.empty() && target != nullptr && target->dtype &&
        !(impl->plan.shared_dtypes & mask_of(*target->dtype))) {
      reason = "dtype " + std::string(dtype_name(*target->dtype)) + " not supported (" +
               dtype_set_name(impl->plan.shared_dtypes) + ")";
    }
    if (reason.empty() && target == nullptr) {
      detail::CheckResult r = impl->plan.diagnose(args, {});
      if (r.why == CheckFailure::kAttrCount) r = {};  // attributes are checked per call
      if (r.why != CheckFailure::kNone) {
        if (why == nullptr) continue;
        reason = KernelHandle(impl).explain(r, args, {}).message();
      }
    }
    if (reason.empty()) return impl;
    if (why != nullptr) *why += "\n  - " + spec.backend + ": " + reason;
  }
  if (why != nullptr && !any_backend) {
    std::string have;
    for (const Impl* impl : entry.impls) have += (have.empty() ? "" : ", ") + impl->spec.backend;
    *why = "op '" + std::string(op) + "' has no implementation for backend '" + *want + "'" +
           forced_note + " (it has: " + have + ")";
  } else if (why != nullptr) {
    *why = "no implementation of '" + std::string(op) + "' accepts " +
           (target ? describe_target(*target) : "these arguments") + forced_note + ":" + *why;
  }
  return nullptr;
}

Status Registry::unknown_op(std::string_view op) const {
  // The caller's text, quoted as a short escaped excerpt: it may be anything.
  const std::string asked = "'" + excerpt(op) + "'";
  const auto chain = resolve_alias(op);  // outlives `end`, which may point into it
  std::string_view end = op;
  std::string via;
  if (chain) {
    end = chain->op();
    via = " (an alias: " + chain->text() + ", and no group registers " + chain->op() + ")";
  }
  const size_t dot = end.find('.');
  Group* g = dot == std::string_view::npos ? nullptr : find_group(end.substr(0, dot));
  if (g != nullptr && !g->error.empty()) {
    return Status(KREG_UNAVAILABLE,
                  "op " + asked + via + ": group '" + g->name + "' failed to load: " + g->error);
  }
  return Status(KREG_NOT_FOUND, "unknown op " + asked + via);
}

Result<KernelHandle> Registry::resolve(std::string_view op, std::span<DLTensor* const> args,
                                       const ResolveOptions& options) const {
  const OpEntry* entry = find_op_or_alias(op);
  if (entry == nullptr) return unknown_op(op);
  std::string why;
  const Impl* impl = select(op, *entry, args, nullptr, options, &why);
  if (impl == nullptr) {
    return Status(why.starts_with("op '") ? KREG_NOT_FOUND : KREG_INVALID_ARGUMENT, why);
  }
  return KernelHandle(impl);
}

Result<KernelHandle> Registry::resolve(std::string_view op, const Target& target,
                                       const ResolveOptions& options) const {
  const OpEntry* entry = find_op_or_alias(op);
  if (entry == nullptr) return unknown_op(op);
  std::string why;
  const Impl* impl = select(op, *entry, {}, &target, options, &why);
  if (impl == nullptr) {
    return Status(why.starts_with("op '") ? KREG_NOT_FOUND : KREG_INVALID_ARGUMENT, why);
  }
  return KernelHandle(impl);
}

Status Registry::call(std::string_view op, std::span<DLTensor* const> tensors,
                      std::span<const kreg_attr> attrs, const CallOptions& options) const {
  const OpEntry* entry = find_op_or_alias(op);
  if (entry != nullptr && force_.empty()) {
    // Fast path: the first implementation whose checks pass, highest priority first.
    for (const Impl* impl : entry->impls) {
      if (tensors.empty() || tensors[0] == nullptr ||
          tensors[0]->device.device_type != impl->plan.device_type) {
        continue;
      }
      if (impl->plan.device_type != kDLCPU) {
        auto sm = impl->backend->sm_of(tensors[0]->device.device_id);
        if (!sm || !sm_in_caps(impl->spec, *sm)) continue;
      }
      if (!impl->plan.accepts(tensors, attrs)) continue;
      return detail::invoke(*impl, tensors, attrs, options);
    }
  }
  auto handle = resolve(op, tensors);
  if (!handle) return handle.status();
  return handle->call(tensors, attrs, options);
}

// ---------------------------------------------------------------------------------------
// Introspection

std::vector<GroupInfo> Registry::groups() const {
  std::lock_guard lock(mu_);
  std::vector<GroupInfo> out;
  for (const auto& [name, g] : groups_) {
    GroupInfo info;
    info.name = name;
    const Group::OpMap* table = g->table.load(std::memory_order_acquire);
    info.loaded = table != nullptr;
    if (g->entry) {
      info.enabled = g->entry->enabled;
      info.load = g->entry->load;
    }
    if (g->library) {
      info.plugin = g->library->info();
      // A reloaded generation was mapped from a private copy: name the file it came from.
      if (!g->loaded_from.empty()) info.plugin->path = g->loaded_from;
      info.private_copy = g->private_copy;
    }
    info.generation = g->generation;
    info.error = g->error;
    if (table) {
      for (const auto& [id, op] : *table) info.ops.push_back(id);
      std::sort(info.ops.begin(), info.ops.end());
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const GroupInfo& a, const GroupInfo& b) { return a.name < b.name; });
  return out;
}

std::vector<std::string> Registry::op_ids() const {
  std::vector<std::string> ids;
  for (const GroupInfo& g : groups()) ids.insert(ids.end(), g.ops.begin(), g.ops.end());
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<const KernelSpec*> Registry::implementations(std::string_view op) const {
  std::vector<const KernelSpec*> out;
  if (const OpEntry* e = find_op(op)) {
    for (const Impl* impl : e->impls) out.push_back(&impl->spec);
  }
  return out;
}

std::optional<std::pair<std::string, std::string>> Registry::alias(std::string_view op) const {
  auto chain = resolve_alias(op);
  if (!chain) return std::nullopt;
  return std::make_pair(chain->op(), chain->message);
}

}  // namespace kreg
