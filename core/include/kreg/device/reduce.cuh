// Warp and block reductions shared by every kreg kernel.
//
// All of them are butterflies in a fixed order, so a result is bitwise identical from run
// to run (kernels built on them can declare KREG_TRAIT_DETERMINISTIC), and every
// participating thread receives the same value: no broadcast step is needed.
#pragma once

#include <cuda_runtime.h>

#include "kreg/device/warp.cuh"

namespace kreg::device {

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float kIdentity = 0.0f;
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float kIdentity = -__builtin_huge_valf();
};

// Reduces over aligned groups of `width` lanes (a power of two, at most 32); every lane
// receives its group's result. All 32 lanes of the warp must call it.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

// Reduces over the blockDim.x threads of each block row (the threads that share
// threadIdx.y), so one block can serve several short rows; with blockDim.y == 1 it is a
// whole-block reduction. N independent values are reduced together behind a single
// barrier (v[i] becomes the row's reduction of v[i]). blockDim.x must be a power of two
// up to 32 or a multiple of 32. `scratch` is N * 32 floats of shared memory.
//
// When blockDim.x > 32 this contains a __syncthreads(): every thread of the block must
// call it (mask out-of-range work, don't return early), and the caller must synchronize
// again before it reuses `scratch`.
template <int N, typename Op>
__device__ __forceinline__ void block_row_reduce(float (&v)[N], Op op, float* scratch) {
  const int width = static_cast<int>(blockDim.x);
  if (width <= kWarpSize) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = warp_reduce(v[i], op, width);
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warps_per_row = width / kWarpSize;
  const int first_warp = static_cast<int>(threadIdx.y) * warps_per_row;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = warp_reduce(v[i], op);
    if (lane == 0)
      scratch[i * kWarpSize + first_warp + static_cast<int>(threadIdx.x) / kWarpSize] = v[i];
  }
  __syncthreads();
  // Each warp of the row reduces all of the row's partials itself, which saves the
  // second barrier a write-then-broadcast would need.
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = lane < warps_per_row ? scratch[i * kWarpSize + first_warp + lane] : Op::kIdentity;
    v[i] = warp_reduce(v[i], op);
  }
}

template <typename Op>
__device__ __forceinline__ float block_row_reduce(float v, Op op, float* scratch) {
  float one[1] = {v};
  block_row_reduce(one, op, scratch);
  return one[0];
}

// warp_sum: warp.cuh's, for any type.
__device__ __forceinline__ float warp_max(float v, int width = kWarpSize) {
  return warp_reduce(v, MaxOp{}, width);
}
__device__ __forceinline__ float block_row_sum(float v, float* scratch) {
  return block_row_reduce(v, SumOp{}, scratch);
}
__device__ __forceinline__ float block_row_max(float v, float* scratch) {
  return block_row_reduce(v, MaxOp{}, scratch);
}
template <int N>
__device__ __forceinline__ void block_row_sum(float (&v)[N], float* scratch) {
  block_row_reduce(v, SumOp{}, scratch);
}

}  // namespace kreg::device
