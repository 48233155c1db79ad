// Division by a run-time constant as a multiply-high, an add and a shift.
//
// GPUs have no integer divide instruction; the emulated one costs more than the rest of
// an element-wise kernel's integer work. Kernels that split a flat index into (row,
// column) or a row into (batch, token) build a FastDivisor on the host and pass it by
// value. Exact for dividends and divisors below 2^31 (Granlund-Montgomery with the
// "n + mulhi" form: the sum stays below 2^32 there).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kreg::device {

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  FastDivisor() = default;
  // d in [1, 2^31).
  __host__ __device__ explicit FastDivisor(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    multiplier =
        static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return (__umulhi(n, multiplier) + n) >> shift;
  }
};

}  // namespace kreg::device
