// Warp-level building blocks shared by kreg's CUDA kernels: the lane constants, sums and
// prefix scans over (groups of) lanes, and a block-wide exclusive scan built on them.
//
// Every function here shuffles in a fixed order, so its result is the same bits from run to
// run, and every participating lane receives its value (no broadcast step). All 32 lanes of
// a warp must call a warp function (the shuffles use the full mask); `width`, where a
// function takes one, is a power of two up to 32 and splits the warp into aligned groups
// of that many lanes that each compute on their own.
#pragma once

#include <cuda_runtime.h>

namespace kreg::device {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarpMask = 0xffffffffu;

// The calling thread's lane in its warp, whatever the block's shape.
__device__ __forceinline__ int lane_id() {
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return static_cast<int>(lane);
}

// The sum over each aligned group of `width` lanes (a butterfly: offsets width/2 .. 1), for
// any type __shfl_xor_sync moves (int, uint64_t, float, double, ...).
template <typename T>
__device__ __forceinline__ T warp_sum(T v, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullWarpMask, v, offset);
  }
  return v;
}

// The inclusive prefix sum over each aligned group of `width` lanes: lane i of a group
// receives v[0] + ... + v[i] of its group (Hillis-Steele: offsets 1 .. width/2).
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int width = kWarpSize) {
  const int sub = lane_id() & (width - 1);
  for (int offset = 1; offset < width; offset *= 2) {
    const T other = __shfl_up_sync(kFullWarpMask, v, offset, width);
    if (sub >= offset) v += other;
  }
  return v;
}

// One thread's serial exclusive prefix sum: out[i] = run + in[begin] + ... + in[i - 1] for i
// in [begin, end); returns run + the sum of in[begin, end). `in` and `out` may be the same
// array (each element is read before its slot is written).
template <typename T>
__device__ __forceinline__ T serial_exclusive_scan(const T* in, T* out, int begin, int end, T run) {
  for (int i = begin; i < end; ++i) {
    const T v = in[i];
    out[i] = run;
    run += v;
  }
  return run;
}

// A block-wide exclusive prefix sum of one value per thread, in thread order: returns what
// the threads before this one hold together, and sets *total to the sum over the block (for
// every thread). blockDim is 1-D and a multiple of 32; `warp_totals` is blockDim.x / 32
// elements of shared memory.
//
// Contains a __syncthreads(): every thread of the block must call it, and the caller must
// synchronize again before it reuses `warp_totals`.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* warp_totals, T* total) {
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int nwarps = static_cast<int>(blockDim.x) / kWarpSize;
  const T inclusive = warp_inclusive_scan(v);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  T before = inclusive - v;
  T sum = T{};
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) before += warp_totals[w];
    sum += warp_totals[w];
  }
  *total = sum;
  return before;
}

}  // namespace kreg::device
