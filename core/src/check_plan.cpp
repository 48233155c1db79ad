// The compiled argument check: a KernelSpec's signature -> CheckPlan (make_impl), and
// CheckPlan::diagnose, the slow twin of CheckPlan::accepts (registry.hpp) that says which
// rule failed. The messages for those failures are in call_errors.cpp.
#include <bit>

#include "kreg/registry.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::CheckFailure;
using detail::CheckPlan;
using detail::CheckResult;
using detail::ExactShapeCache;
using detail::Impl;

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
  // Point string defaults at storage only now: the vector no longer moves.
  for (int i = 0; i < plan.num_attrs; ++i) {
    if (plan.attr_types[i] == KREG_ATTR_STRING) {
      plan.defaults[i].value.s = impl->string_defaults[static_cast<size_t>(i)].c_str();
    }
  }
  return impl;
}

bool CheckPlan::accepts_call_other_ways(std::span<DLTensor* const> t) const {
  if (t.size() == static_cast<size_t>(num_tensors)) {
    for (uint32_t w = 1; w < kShapeWays; ++w) {
      if (last[w].matches(t)) return true;
    }
  }
  if (!accepts_tensors(t)) return false;
  last[next_way.fetch_add(1, std::memory_order_relaxed) % kShapeWays].remember(t);
  return true;
}

void ExactShapeCache::remember(std::span<DLTensor* const> t) {
  uint64_t m = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const DLTensor* x = t[i];
    if (x == nullptr) {
      m |= uint64_t{1} << i;
      continue;
    }
    if (x->ndim > kMaxRank) return;  // keeps what it has: accepted too, still valid
    if (x->strides != nullptr) m |= uint64_t{1} << (32 + i);
  }
  // One writer: whoever moves seq from even to odd. The others skip (their words were
  // accepted too; their next call stores them if it misses again).
  uint64_t s = seq.load(std::memory_order_relaxed);
  if ((s & 1) || !seq.compare_exchange_strong(s, s + 1, std::memory_order_relaxed)) return;
  // Orders the odd seq before the words: a reader that sees any new word sees seq changed.
  std::atomic_thread_fence(std::memory_order_release);
  masks.store(m, std::memory_order_relaxed);
  for (size_t i = 0; i < t.size(); ++i) {
    const DLTensor* x = t[i];
    if (x == nullptr) continue;
    device[i].store(device_word(x->device), std::memory_order_relaxed);
    rank_dtype[i].store(rank_dtype_word(*x), std::memory_order_relaxed);
    for (int k = 0; k < x->ndim; ++k) {
      shape[i][k].store(x->shape[k], std::memory_order_relaxed);
      if (x->strides != nullptr) strides[i][k].store(x->strides[k], std::memory_order_relaxed);
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
}  // namespace kreg
