// The elementwise group: one output element from the same element of one or two inputs
// (softcap, sigmoid_gate_mul, add_constant). docs/ops/elementwise.md states each contract.
//
// Every function trusts its frame: the core has checked dtypes (all tensors share one of
// bf16/f16/f32), ranks, the named dimensions ([T,H] everywhere), device and contiguity.
// The attributes are checked here, by both backends alike (the helpers below).
#pragma once

#include <cmath>
#include <limits>

#include "kreg/plugin.hpp"

namespace kreg::elementwise {

// An attribute as the fp32 the kernels compute with, or an argument error naming the op
// and the attribute: it must be finite after the conversion to fp32 (a value past fp32's
// range would become inf), and `positive` also asks for at least fp32's smallest normal
// number after it (softcap multiplies by 1/cap: a cap that rounds to 0, or whose
// reciprocal overflows, would turn x = 0 into NaN).
inline KernelStatus fp32_attr(Context& ctx, const char* name, double v, bool positive, float* out) {
  const bool in_range = std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max();
  const float f = in_range ? static_cast<float>(v) : 0.0f;
  if (!in_range || (positive && !(f >= std::numeric_limits<float>::min()))) {
    return ctx.fail(
        KREG_INVALID_ARGUMENT, "%s: %s = %g must be %s", ctx.op(), name, v,
        positive ? "a finite number > 0 (as fp32, at least 1.17549e-38)" : "finite (as fp32)");
  }
  *out = f;
  return kOk;
}

// CPU references (reference.cpp).
KernelStatus softcap_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double cap);
KernelStatus sigmoid_gate_mul_cpu(Context& ctx, const DLTensor& x, const DLTensor& gate,
                                  DLTensor& out);
KernelStatus add_constant_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double c);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (elementwise.cu, add_constant.cu); they enqueue on ctx.stream() and return
// without waiting.
KernelStatus softcap_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double cap);
KernelStatus sigmoid_gate_mul_cuda(Context& ctx, const DLTensor& x, const DLTensor& gate,
                                   DLTensor& out);
KernelStatus add_constant_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double c);
#endif

}  // namespace kreg::elementwise
