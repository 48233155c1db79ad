// CUDA softcap and sigmoid_gate_mul: the map kernel of elementwise.cuh with each op's
// function; the same formulas, in the same fp32 order, as reference.cpp.
#include <cuda_runtime.h>

#include "elementwise.cuh"
#include "elementwise.hpp"

namespace kreg::elementwise {
namespace {

// cap * tanh(x * (1/cap)). CUDA's tanhf (not tanh.approx, whose relative error is about
// 2^-11): at most 2 ulp from tanh (CUDA Math API), saturating to +-1 for large |x| and
// equal to +-1 at +-inf, so the result is +-cap, never NaN, for every non-NaN x.
struct Softcap {
  static constexpr int kUnroll = 4;  // elementwise.cuh
  float cap;
  float inv_cap;
  __device__ __forceinline__ float operator()(float a) const { return cap * tanhf(a * inv_cap); }
};

// x * sigmoid(g) as x / (1 + exp(-g)) with expf and an IEEE division (as silu_and_mul):
// g << 0 gives exp(-g) = inf and a product of 0; g >> 0 gives x.
struct SigmoidGateMul {
  static constexpr int kUnroll = 4;
  __device__ __forceinline__ float operator()(float a, float g) const {
    return a / (1.0f + expf(-g));
  }
};

}  // namespace

KernelStatus softcap_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double cap) {
  float c = 0;
  if (KernelStatus st = fp32_attr(ctx, "cap", cap, true, &c); !st.ok()) return st;
  return map_cuda(ctx, x, nullptr, out, Softcap{c, 1.0f / c});
}

KernelStatus sigmoid_gate_mul_cuda(Context& ctx, const DLTensor& x, const DLTensor& gate,
                                   DLTensor& out) {
  return map_cuda(ctx, x, &gate, out, SigmoidGateMul{});
}

}  // namespace kreg::elementwise
