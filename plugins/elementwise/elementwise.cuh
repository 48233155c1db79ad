// The one CUDA kernel template of the elementwise group: out[i] = fn(x[i]) or
// fn(x[i], y[i]) over a contiguous tensor taken as flat (the ops are [T,H], but no
// element depends on its position), fp32 math, one rounding at the store.
//
// Launch shape: 256-thread blocks, each thread Fn::kUnroll 16-byte vectors (one block
// covers 256 * Fn::kUnroll consecutive vectors, coalesced per step), as many blocks as that
// takes; short-lived blocks keep more loads in flight than a grid-stride loop. One vector
// a thread (plugins/activation/act_and_mul.cu's shape) gave 88-89% of copy on an H200
// at 32768 x 8192 bf16, where torch.compile's kernels reach 100%. Loads
// and stores carry the evict-first hint: every byte is touched once. The vector width
// depends only on the pointers' alignment (the tensor is flat, so its length need not be
// a multiple of the width): the last numel % kVec elements are one scalar thread each,
// in the last block.
//
// out may alias an input: every element is read and written by one thread, read first.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::elementwise {

inline constexpr int kMapBlockThreads = 256;
// Vectors per thread, all loaded before any is computed, for each op's Fn::kUnroll:
// measured on an H200 at 32768 x 8192 bf16 (vs_torch.py), four a thread took softcap from
// 89.3% to 91.4% of copy and sigmoid_gate_mul from 88.9% to 91.6%, but add_constant from
// 88.1% down to 84.0%, so add_constant keeps one.

// Whether Fn is a two-input function (fn(x, y)); else one-input (fn(x)).
template <typename Fn>
inline constexpr bool kBinary = std::is_invocable_v<const Fn&, float, float>;

template <typename T, int kVec, typename Fn>
__global__ void __launch_bounds__(kMapBlockThreads)
    map_kernel(const T* x, const T* y, T* out, int64_t vecs, int64_t n, Fn fn) {
  const int64_t base =
      static_cast<int64_t>(blockIdx.x) * kMapBlockThreads * Fn::kUnroll + threadIdx.x;
  // With PDL, x and y may be the previous kernel's output: nothing is read before this.
  device::pdl_wait();
  device::vec_t<T, kVec> x_raw[Fn::kUnroll];
  device::vec_t<T, kVec> y_raw[Fn::kUnroll];
#pragma unroll
  for (int u = 0; u < Fn::kUnroll; ++u) {
    const int64_t i = base + u * kMapBlockThreads;
    if (i < vecs) {
      x_raw[u].load_stream(x + i * kVec);
      if constexpr (kBinary<Fn>) y_raw[u].load_stream(y + i * kVec);
    }
  }
  // Every load of this thread is issued: the next kernel may be scheduled.
  device::pdl_launch_dependents();
#pragma unroll
  for (int u = 0; u < Fn::kUnroll; ++u) {
    const int64_t i = base + u * kMapBlockThreads;
    if (i >= vecs) continue;
    device::vec_t<float, kVec> a;
    a.cast_from(x_raw[u]);
    if constexpr (kBinary<Fn>) {
      device::vec_t<float, kVec> b;
      b.cast_from(y_raw[u]);
#pragma unroll
      for (int j = 0; j < kVec; ++j) a[j] = fn(a[j], b[j]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) a[j] = fn(a[j]);
    }
    device::vec_t<T, kVec> r;
    r.cast_from(a);
    r.store_stream(out + i * kVec);
  }
  // The last numel % kVec elements: one thread each, in the last block.
  const int64_t tail = vecs * kVec + threadIdx.x;
  if (blockIdx.x == gridDim.x - 1 && tail < n) {
    float r;
    if constexpr (kBinary<Fn>) {
      r = fn(device::to_float(x[tail]), device::to_float(y[tail]));
    } else {
      r = fn(device::to_float(x[tail]));
    }
    out[tail] = device::from_float<T>(r);
  }
}

template <typename T, int kVec, typename Fn>
cudaError_t launch_map(const T* x, const T* y, T* out, int64_t n, Fn fn, cudaStream_t stream,
                       bool pdl) {
  const int64_t vecs = n / kVec;
  constexpr int64_t kPerBlock = int64_t{kMapBlockThreads} * Fn::kUnroll;
  const int64_t blocks = std::max<int64_t>(1, (vecs + kPerBlock - 1) / kPerBlock);
  return device::launch(map_kernel<T, kVec, Fn>, dim3(static_cast<unsigned>(blocks)),
                        dim3(kMapBlockThreads), 0, stream, pdl, x, y, out, vecs, n, fn);
}

// The entry point's body for one op: fn applied to x (and y, for a two-input fn; null
// otherwise), written to out; every tensor has numel(x) elements.
template <typename Fn>
KernelStatus map_cuda(Context& ctx, const DLTensor& x, const DLTensor* y, DLTensor& out, Fn fn) {
  const char* op = ctx.op();
  const int64_t n = numel(x);
  if (n == 0) return kOk;
  // One thread per vector in a one-dimensional grid (at most 2^31 - 1 blocks): more than
  // 2^38 elements, which no device holds today.
  if (n / kMapBlockThreads >= INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: x has %lld elements, more than one launch covers",
                    op, static_cast<long long>(n));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = data_ptr<const T>(x);
    const T* yp = y ? data_ptr<const T>(*y) : nullptr;
    T* outp = data_ptr<T>(out);
    // The widest vector every pointer is aligned for (the flat length does not matter:
    // the tail is scalar), so `max_vec_elems` is given the widest width as the row.
    constexpr int kMaxVec = 16 / static_cast<int>(sizeof(T));
    const int vec = yp ? device::max_vec_elems<T>(kMaxVec, xp, yp, outp)
                       : device::max_vec_elems<T>(kMaxVec, xp, outp);
    return device::launch_status(ctx, op, device::visit_vec_elems<T>(vec, [&](auto v) {
                                   return launch_map<T, decltype(v)::value>(xp, yp, outp, n, fn,
                                                                            stream, ctx.pdl());
                                 }));
  });
}

}  // namespace kreg::elementwise
