// The quantization group: per-token-group, per-token and per-tensor quantization of bf16,
// f16 and f32 activations to FP8 E4M3 (and int8 per group), with fp32 scales.
// docs/ops/quantization.md states the exact contract of each op; quant_math.hpp holds the
// arithmetic both sides share.
//
// Every function trusts its frame: the core has checked dtypes (x is bf16/f16/f32, out is
// f8e4m3 or i8, scales f32), ranks, the named dimensions, device and contiguity. What the
// signature cannot say (H a multiple of group_size, G = H / group_size, eps) is checked by
// check_group_args, the same on both sides.
#pragma once

#include <cmath>
#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::quantization {

// Which per-token-group op a function serves.
enum class GroupOp {
  kFp8,              // per_token_group_quant_fp8: scales [T, G]
  kFp8ColMajor,      // per_token_group_quant_fp8_col_major: scales stored [G, P], P >= T
  kSiluFp8,          // silu_and_mul_per_token_group_quant_fp8: x [T, 2H]
  kSiluFp8ColMajor,  // silu_and_mul_per_token_group_quant_fp8_col_major
  kInt8,             // per_token_group_quant_int8
};

constexpr bool is_silu(GroupOp op) {
  return op == GroupOp::kSiluFp8 || op == GroupOp::kSiluFp8ColMajor;
}
constexpr bool is_col_major(GroupOp op) {
  return op == GroupOp::kFp8ColMajor || op == GroupOp::kSiluFp8ColMajor;
}
constexpr bool is_int8(GroupOp op) { return op == GroupOp::kInt8; }

// The shape of one per-token-group call, from its checked frame.
struct GroupShape {
  int64_t tokens = 0;  // T
  int64_t hidden = 0;  // H: out's columns (x has 2H for the fused ops)
  int64_t groups = 0;  // G = H / group_size
  int64_t group_size = 0;
  int64_t scale_ld = 0;  // col-major: P, the distance between two groups' scale columns
  float eps = 0.0f;
};

// Checks what the signature cannot express and fills `shape`. Fails with
// KREG_INVALID_ARGUMENT naming the op and the argument.
inline KernelStatus check_group_args(Context& ctx, GroupOp kind, const DLTensor& out,
                                     const DLTensor& out_scales, int64_t group_size, double eps,
                                     GroupShape* shape) {
  const char* op = ctx.op();
  const int64_t t = out.shape[0];
  const int64_t h = out.shape[1];
  if (group_size < 1) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: argument 'group_size' = %lld must be >= 1", op,
                    static_cast<long long>(group_size));
  }
  if (h % group_size != 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'group_size' = %lld does not divide H = %lld (out's columns)", op,
                    static_cast<long long>(group_size), static_cast<long long>(h));
  }
  const int64_t g = h / group_size;
  const int64_t scale_groups = is_col_major(kind) ? out_scales.shape[0] : out_scales.shape[1];
  if (scale_groups != g) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'out_scales' has %lld groups (dimension G); expected H / "
                    "group_size = %lld / %lld = %lld",
                    op, static_cast<long long>(scale_groups), static_cast<long long>(h),
                    static_cast<long long>(group_size), static_cast<long long>(g));
  }
  if (is_col_major(kind) && out_scales.shape[1] < t) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'out_scales' is [G, P] with P = %lld < T = %lld (P is T, or T "
                    "rounded up to a multiple of 4 for TMA)",
                    op, static_cast<long long>(out_scales.shape[1]), static_cast<long long>(t));
  }
  const auto eps_f = static_cast<float>(eps);
  if (!(std::isfinite(eps) && eps_f > 0.0f && std::isfinite(eps_f))) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'eps' = %g must be positive and finite in fp32 (an all-zero "
                    "group would get the scale 0)",
                    op, eps);
  }
  *shape = GroupShape{t, h, g, group_size, is_col_major(kind) ? out_scales.shape[1] : g, eps_f};
  return kOk;
}

// CPU references (reference.cpp).
template <GroupOp kOp>
KernelStatus group_quant_fp8_cpu(Context& ctx, const DLTensor& x, DLTensor& out,
                                 DLTensor& out_scales, int64_t group_size, double eps,
                                 bool scale_ue8m0);
KernelStatus group_quant_int8_cpu(Context& ctx, const DLTensor& x, DLTensor& out,
                                  DLTensor& out_scales, int64_t group_size, double eps);
KernelStatus token_quant_fp8_cpu(Context& ctx, const DLTensor& x, DLTensor& out,
                                 DLTensor& out_scales);
KernelStatus tensor_quant_fp8_cpu(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& scale,
                                  bool is_static);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (group_quant.cu, token_quant.cu). They enqueue on ctx.stream() and return
// without waiting.
template <GroupOp kOp>
KernelStatus group_quant_fp8_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                  DLTensor& out_scales, int64_t group_size, double eps,
                                  bool scale_ue8m0);
KernelStatus group_quant_int8_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                   DLTensor& out_scales, int64_t group_size, double eps);
KernelStatus token_quant_fp8_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                  DLTensor& out_scales);
KernelStatus tensor_quant_fp8_cuda(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& scale,
                                   bool is_static);
#endif

}  // namespace kreg::quantization
