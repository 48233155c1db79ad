// CUDA add_constant: out = x + c (SGLang's reference JIT kernel), the smallest op of the
// map kernel in elementwise.cuh: the function is the whole op.
#include <cuda_runtime.h>

#include "elementwise.cuh"
#include "elementwise.hpp"

namespace kreg::elementwise {
namespace {

struct AddConstant {
  static constexpr int kUnroll = 1;  // elementwise.cuh: four a thread was slower here
  float c;
  __device__ __forceinline__ float operator()(float a) const { return a + c; }
};

}  // namespace

KernelStatus add_constant_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double c) {
  float cf = 0;
  if (KernelStatus st = fp32_attr(ctx, "c", c, false, &cf); !st.ok()) return st;
  return map_cuda(ctx, x, nullptr, out, AddConstant{cf});
}

}  // namespace kreg::elementwise
