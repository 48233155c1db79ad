// The grammar group: constrained decoding's token masks (xgrammar's
// apply_token_bitmask_inplace). docs/ops/grammar.md states the contract.
//
// The core has checked dtypes (logits bf16/f16/f32, bitmask and indices i32), the named
// dimensions (logits [B,V], bitmask [B,W]), device and contiguity; indices is rank-free
// in the signature (see register.cpp), so its rank is checked here, as is W against V.
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::grammar {

// The 32-bit words a bitmask row needs for V tokens: ceil(V / 32).
inline int64_t words_for(int64_t vocab) { return vocab / 32 + (vocab % 32 != 0); }

// The checks both backends make before touching anything: indices (when given) is one
// dimension, and the bitmask has a bit for every token (32 W >= V).
inline KernelStatus check_args(Context& ctx, const DLTensor& logits, const DLTensor& bitmask,
                               const DLTensor* indices) {
  const int64_t vocab = logits.shape[1];
  const int64_t words = bitmask.shape[1];
  if (words < words_for(vocab)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: bitmask has W = %lld words per row, which cover %lld tokens; V = %lld "
                    "needs W >= %lld",
                    ctx.op(), static_cast<long long>(words), static_cast<long long>(32 * words),
                    static_cast<long long>(vocab), static_cast<long long>(words_for(vocab)));
  }
  if (indices != nullptr && indices->ndim != 1) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: indices must be one-dimensional [R], got rank %d",
                    ctx.op(), indices->ndim);
  }
  return kOk;
}

// CPU reference (reference.cpp).
KernelStatus apply_token_bitmask_cpu(Context& ctx, DLTensor& logits, const DLTensor& bitmask,
                                     const DLTensor* indices);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernel (apply_token_bitmask.cu); enqueues on ctx.stream() and returns.
KernelStatus apply_token_bitmask_cuda(Context& ctx, DLTensor& logits, const DLTensor& bitmask,
                                      const DLTensor* indices);
#endif

}  // namespace kreg::grammar
