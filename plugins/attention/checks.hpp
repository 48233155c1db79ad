// Argument checks shared by the CPU references and the CUDA launchers: what the
// signatures cannot express. Both backends run the same checks, so a call is refused (or
// accepted) the same way whichever implementation the registry picks.
#pragma once

#include <cmath>
#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::attention {

inline KernelStatus check_mrope_sections(Context& ctx, const char* op, int64_t section_t,
                                         int64_t section_h, int64_t section_w) {
  if (section_t < 0 || section_h < 0 || section_w < 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attributes 'section_t', 'section_h', 'section_w' must be >= 0, got "
                    "%lld, %lld, %lld",
                    op, static_cast<long long>(section_t), static_cast<long long>(section_h),
                    static_cast<long long>(section_w));
  }
  return kOk;
}

// rotary_dim is the cache's second dimension: even, 1..head_dim.
inline KernelStatus check_rope(Context& ctx, const char* op, const DLTensor& q,
                               const DLTensor& cos_sin_cache) {
  const int64_t head_dim = q.shape[2];
  const int64_t rotary_dim = cos_sin_cache.shape[1];
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'cos_sin_cache' has %lld columns (rotary_dim); it must be even "
                    "and in [2, head_dim = %lld]",
                    op, static_cast<long long>(rotary_dim), static_cast<long long>(head_dim));
  }
  return kOk;
}

inline KernelStatus check_fused_qk_norm_rope(Context& ctx, const char* op, const DLTensor& qkv,
                                             const DLTensor& q_weight, const DLTensor& k_weight,
                                             int64_t num_heads_q, int64_t num_heads_k,
                                             int64_t num_heads_v, int64_t head_dim, double eps,
                                             double base) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'head_dim' = %lld is not supported (64, 128 or 256)", op,
                    static_cast<long long>(head_dim));
  }
  if (num_heads_q < 0 || num_heads_k < 0 || num_heads_v < 0 || num_heads_q > 4096 ||
      num_heads_k > 4096 || num_heads_v > 4096) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attributes 'num_heads_q', 'num_heads_k', 'num_heads_v' must be in "
                    "[0, 4096], got %lld, %lld, %lld",
                    op, static_cast<long long>(num_heads_q), static_cast<long long>(num_heads_k),
                    static_cast<long long>(num_heads_v));
  }
  const int64_t width = (num_heads_q + num_heads_k + num_heads_v) * head_dim;
  if (qkv.shape[1] != width) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'qkv' has %lld columns, expected (num_heads_q + num_heads_k + "
                    "num_heads_v) * head_dim = %lld",
                    op, static_cast<long long>(qkv.shape[1]), static_cast<long long>(width));
  }
  if (q_weight.shape[0] != head_dim || k_weight.shape[0] != head_dim) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: arguments 'q_weight' and 'k_weight' must have head_dim = %lld elements, "
                    "got %lld and %lld",
                    op, static_cast<long long>(head_dim), static_cast<long long>(q_weight.shape[0]),
                    static_cast<long long>(k_weight.shape[0]));
  }
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'eps' = %g must be finite and >= 0", op,
                    eps);
  }
  if (!(base > 0.0) || !std::isfinite(base)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'base' = %g must be finite and > 0", op,
                    base);
  }
  return kOk;
}

inline KernelStatus check_decode(Context& ctx, const char* op, const DLTensor& q,
                                 const DLTensor& k_cache, double scale) {
  const int64_t num_heads_q = q.shape[1];
  const int64_t head_dim = q.shape[2];
  const int64_t num_heads_k = k_cache.shape[2];
  const int64_t page_size = k_cache.shape[1];
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'q' has head size D = %lld; supported: 64, 128, 256", op,
                    static_cast<long long>(head_dim));
  }
  if (num_heads_k <= 0 || num_heads_q % num_heads_k != 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'k_cache' has Hk = %lld heads; Hq = %lld must be a positive "
                    "multiple of it (GQA)",
                    op, static_cast<long long>(num_heads_k), static_cast<long long>(num_heads_q));
  }
  if (page_size <= 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: argument 'k_cache' has page size 0", op);
  }
  if (!std::isfinite(scale)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'scale' = %g must be finite", op, scale);
  }
  return kOk;
}

}  // namespace kreg::attention
