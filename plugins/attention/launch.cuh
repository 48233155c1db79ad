// Host and device pieces shared by the attention group's CUDA launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"
#include "kreg/plugin.hpp"

namespace kreg::attention {

// Division by a run-time constant as a multiply-high and a shift (GPUs have no integer
// divide instruction), for splitting a flat thread index into coordinates. Exact for
// dividends and divisors below 2^31.
struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  explicit FastDivisor(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    multiplier =
        static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return (__umulhi(n, multiplier) + n) >> shift;
  }
};

// A launch error as the kernel's status.
inline KernelStatus launch_status(Context& ctx, const char* op, cudaError_t err) {
  if (err != cudaSuccess) {
    return ctx.fail(KREG_INTERNAL, "%s: kernel launch failed: %s", op, cudaGetErrorString(err));
  }
  return kOk;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls fn with a value of the element type (float, __nv_bfloat16, __half) of `t`.
template <typename Fn>
KernelStatus visit_float_dtype(Context& ctx, const char* op, const DLTensor& t, Fn&& fn) {
  switch (from_dl(t.dtype).value_or(DType::kCount)) {
    case DType::kBF16:
      return fn(__nv_bfloat16{});
    case DType::kF16:
      return fn(__half{});
    case DType::kF32:
      return fn(float{});
    default:
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: dtype must be bf16, f16 or f32", op);
  }
}

}  // namespace kreg::attention
