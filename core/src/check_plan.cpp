// The compiled argument check: a KernelSpec's signature -> CheckPlan (make_impl), and
// CheckPlan::diagnose, the slow twin of CheckPlan::accepts (registry.hpp) that says which
// rule failed. The messages for those failures are in call_errors.cpp.
#include <array>
#include <bit>
#include <utility>

#include "kreg/registry.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::CheckFailure;
using detail::CheckPlan;
using detail::CheckResult;
using detail::ExactShapeCache;
using detail::Impl;
using detail::ShapeMatchFn;

namespace {

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
    case ArgKind::kResource:
      return KREG_ATTR_RESOURCE;
    case ArgKind::kTensor:
      break;
  }
  return 0;
}

}  // namespace

namespace detail {

std::unique_ptr<Impl> make_impl(const KernelSpec& spec) {
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->backend = find_backend(spec.backend);
  impl->fn.store(spec.fn, std::memory_order_relaxed);
  impl->jit.store(spec.jit.get(), std::memory_order_relaxed);
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
    if (p.kind == ArgKind::kResource) {
      plan.resource_attrs[plan.num_resources++] = static_cast<int8_t>(ai);
      plan.resource_hash[ai] = detail::hash_id(p.resource_type);
    }
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
        p.cb_shift = (f.coef & (f.coef - 1)) == 0
                         ? static_cast<int8_t>(std::countr_zero(static_cast<uint32_t>(f.coef)))
                         : int8_t{-1};
      }
    }
  }
  plan.match_shapes = detail::shape_matcher(plan.num_tensors);
  plan.inline_attrs = plan.num_resources > 0 ? int8_t{-1} : plan.num_attrs;
  // Point string defaults at storage only now: the vector no longer moves.
  for (int i = 0; i < plan.num_attrs; ++i) {
    if (plan.attr_types[i] == KREG_ATTR_STRING) {
      plan.defaults[i].value.s = impl->string_defaults[static_cast<size_t>(i)].c_str();
    }
  }
  return impl;
}

namespace {

using Verdict = ExactShapeCache::Verdict;

// The ways past the first, for exactly N tensors.
template <size_t N>
[[gnu::noinline]] bool match_other_ways(const CheckPlan& plan, DLTensor* const* t) {
  for (uint32_t w = 1; w < CheckPlan::kShapeWays; ++w) {
    const Verdict v = plan.last[w].compare_n<N>(t);
    if (v == Verdict::kEqual) return true;
    if (v == Verdict::kUnusual) return match_shapes_any(plan, t);
  }
  return false;
}

// Every way, for exactly N tensors: the first way's compare straight-line (a hit there is
// the steady state of one shape: no loop, few registers), then the others; unusual
// tensors (kUnusual) take the loop of match_shapes_any.
template <size_t N>
bool match_ways(const CheckPlan& plan, DLTensor* const* t) {
  const Verdict v = plan.last[0].compare_n<N>(t);
  if (v == Verdict::kEqual) [[likely]]
    return true;
  if (v == Verdict::kDiffers) return match_other_ways<N>(plan, t);
  return match_shapes_any(plan, t);
}

// A tensorless op has nothing to compare: its calls take call_general (whose full check
// of no tensors is a compare of the count).
bool match_none(const CheckPlan&, DLTensor* const*) { return false; }

// Arities up to kMaxSpecializedArity have their own compare (every shipped op has at most
// 6 tensors); past it, the loop of match_shapes_any (each instance is a few hundred bytes
// per tensor).
constexpr int kMaxSpecializedArity = 8;
static_assert(kMaxSpecializedArity <= kMaxTensors);

template <size_t... N>
constexpr std::array<ShapeMatchFn, sizeof...(N) + 1> matcher_table(std::index_sequence<N...>) {
  return {&match_none, &match_ways<N + 1>...};
}
constexpr auto kMatchers = matcher_table(std::make_index_sequence<kMaxSpecializedArity>{});

}  // namespace

ShapeMatchFn shape_matcher(int num_tensors) {
  return num_tensors >= 0 && num_tensors <= kMaxSpecializedArity
             ? kMatchers[static_cast<size_t>(num_tensors)]
             : &match_shapes_any;
}

bool match_shapes_any(const CheckPlan& plan, DLTensor* const* t) {
  const std::span<DLTensor* const> s(t, static_cast<size_t>(plan.num_tensors));
  for (const ExactShapeCache& way : plan.last) {
    if (way.matches(s)) return true;
  }
  return false;
}

bool CheckPlan::accepts_call(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const {
  if (!accepts_attrs(a)) return false;
  // With every attribute given and of its type, accepts_inline() refused the tensors: the
  // ways missed a moment ago (a store since then only costs this call the full check).
  if (a.size() != static_cast<size_t>(inline_attrs) &&
      t.size() == static_cast<size_t>(num_tensors) && match_shapes(*this, t.data())) {
    return true;
  }
  if (!accepts_tensors(t)) return false;
  // Nothing to remember of a tensorless call (its full check is the count's compare), nor
  // of one that moves nothing (it must not reach the kernel from the inline path).
  if (!t.empty() && !moves_nothing(*this, t)) {
    last[next_way.fetch_add(1, std::memory_order_relaxed) % kShapeWays].remember(t);
  }
  return true;
}

bool moves_nothing(const CheckPlan& plan, std::span<DLTensor* const> t) {
  if (plan.num_resources > 0) return false;
  bool any = false;
  for (const DLTensor* x : t) {
    if (x == nullptr) continue;  // an absent optional tensor
    bool empty = false;
    for (int k = 0; k < x->ndim; ++k) empty |= x->shape[k] == 0;
    if (!empty) return false;
    any = true;
  }
  return any;
}

Status invoke_general(const Impl& impl, std::span<DLTensor* const> tensors,
                      std::span<const kreg_attr> attrs, const CallOptions& options) {
  const CheckPlan& plan = impl.plan;
  const kreg_attr* attr_ptr = attrs.data();
  kreg_attr full[kMaxAttrs];
  if (static_cast<int>(attrs.size()) < plan.num_attrs) {
    size_t i = 0;
    for (; i < attrs.size(); ++i) full[i] = attrs[i];
    for (; i < static_cast<size_t>(plan.num_attrs); ++i) full[i] = plan.defaults[i];
    attr_ptr = full;
  }
  kreg_kernel_fn fn = impl.fn.load(std::memory_order_acquire);
  if (plan.num_resources > 0) {
    // The resource's state belongs to the generation that created it: run that one's code.
    const kreg_resource* r = attr_ptr[plan.resource_attrs[0]].value.r;
    if (r->generation != impl.generation.load(std::memory_order_acquire)) {
      fn = fn_of_generation(impl, r->generation);
      if (fn == nullptr) return no_generation_error(impl, *r);
    }
  }
  return invoke_complete(impl, fn, tensors, {attr_ptr, static_cast<size_t>(plan.num_attrs)},
                         options);
}

void ExactShapeCache::remember(std::span<DLTensor* const> t) {
  if (t.size() > static_cast<size_t>(kMaxTensors)) return;
  for (const DLTensor* x : t) {
    // Keeps what it has (accepted too, still valid). Accepted calls have ndim >= 0.
    if (x != nullptr && (x->ndim < 0 || x->ndim > kMaxRank)) return;
  }
  // One writer: whoever moves seq from even to odd. The others skip (their words were
  // accepted too; their next call stores them if it misses again).
  uint64_t s = seq.load(std::memory_order_relaxed);
  if ((s & 1) || !seq.compare_exchange_strong(s, s + 1, std::memory_order_relaxed)) return;
  // Orders the odd seq before the words: a reader that sees any new word sees seq changed.
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < t.size(); ++i) {
    const DLTensor* x = t[i];
    Slot& slot = slots[i];
    if (x == nullptr) {
      slot.word.store(kNullWord, std::memory_order_relaxed);
      continue;
    }
    slot.word.store(rank_dtype_word(*x), std::memory_order_relaxed);
    slot.device.store(device_word(x->device), std::memory_order_relaxed);
    // Without strides: the row-major ones, which the full check accepts for this shape
    // (strides_row_major). The products never wrap: the full check accepted this call, so
    // its element count fits int64 (shape_sane, kTooLarge).
    uint64_t row_major = 1;
    for (int k = x->ndim - 1; k >= 0; --k) {
      slot.shape[k].store(x->shape[k], std::memory_order_relaxed);
      slot.strides[k].store(x->strides != nullptr ? x->strides[k] : static_cast<int64_t>(row_major),
                            std::memory_order_relaxed);
      row_major *= static_cast<uint64_t>(x->shape[k]);
    }
  }
  seq.store(s + 2, std::memory_order_release);  // 64 bits: never wraps back to 0
}

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
  for (int k = 0; k < num_resources; ++k) {
    const int j = resource_attrs[k];
    const kreg_resource* r = a[static_cast<size_t>(j)].value.r;
    if (r == nullptr) return {CheckFailure::kResourceNull, static_cast<int8_t>(j)};
    const ResourceSlot* slot = slot_of(r);
    if (slot->type_hash != resource_hash[j]) {
      return {CheckFailure::kResourceType, static_cast<int8_t>(j)};
    }
    if (!slot->live.load(std::memory_order_acquire)) {
      return {CheckFailure::kResourceDestroyed, static_cast<int8_t>(j)};
    }
  }
  return {};
}

}  // namespace detail

Status KernelHandle::call_general(std::span<DLTensor* const> tensors,
                                  std::span<const kreg_attr> attrs, void* stream,
                                  const kreg_host_services* services, uint64_t launch_flags) const {
  const Impl& impl = *impl_;
  const CheckPlan& plan = impl.plan;
  if (!plan.accepts_call(tensors, attrs)) {
    return explain(plan.diagnose(tensors, attrs), tensors, attrs);
  }
  if (detail::moves_nothing(plan, tensors)) return Status();
  return detail::invoke(impl, tensors, attrs, CallOptions{stream, services, launch_flags});
}

}  // namespace kreg
