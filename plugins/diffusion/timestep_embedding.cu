// CUDA timestep_embedding: out[n, :] = [sin(args), cos(args)] (or [cos, sin])
// with args[i] = t[n] * freq[i] * scale, freq[i] = exp(-ln(max_period) * i /
// (half - shift)), and a zero last column for odd dim.
//
// Launch shape (large calls): each thread owns 4 consecutive frequencies, computed once (exp
// in double, rounded to fp32, bit-identical to the CPU reference's) and kept in
// registers while it walks rows n = blockIdx.y, blockIdx.y + gridDim.y, ...;
// per row it writes its 4 sines and 4 cosines, as two float4 stores when dim %
// 8 == 0 and out is 16-byte aligned (evict-first: the output is written once).
// gridDim.y is about rows / 32 (at least min(rows, 1024), at most 65535): a
// block walks up to ~32 rows, so the
// double-precision exp of the frequencies is amortized over them (with one row
// per block it cost as much as the sines); N = 65536, dim = 1024 is 2048 blocks
// of 128 threads, one wave of 16 blocks per SM. The argument is rounded exactly as
// diffusers' fp32 code rounds it ((t * freq) * scale); the sine and cosine come
// from sincosf (full-range argument reduction, no fast-math).
//
// Small calls (N * dim/2 up to one wave of threads; N = 2, dim = 320 was one block of 64
// threads per row, 40 of them busy, each computing 4 double exps and 4 sincosf, 3.5 us in
// ncu): one frequency per thread, a block row of up to 256 threads per row, so a thread's
// latency is one exp and one sincosf.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL): the frequencies depend on the attributes
// only, so the kernel computes them before griddepcontrol.wait, overlapping the kernel
// before it on the stream; t is loaded after the wait. Without PDL the first row's t is
// loaded before the frequencies instead (its round trip overlaps the exp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::diffusion {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kFreqsPerThread = 4;                       // large calls; small ones take one
constexpr int64_t kSmallMaxPairs = int64_t{132} * 2048;  // rows * half: one wave of threads
constexpr int64_t kMaxRowBlocks = 65535;
constexpr int64_t kRowsPerBlock = 32;  // rows a block walks, about

// kFreqs consecutive frequencies a thread; kFloat4 (kFreqs == 4): float4 stores.
template <typename T, int kFreqs, bool kFloat4>
__global__ void __launch_bounds__(kMaxThreads)
    timestep_embedding_kernel(const T* __restrict__ t, float* __restrict__ out, int64_t rows,
                              int64_t dim, TimestepEmbedding e, bool pdl) {
  static_assert(!kFloat4 || kFreqs == 4);
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kFreqs;
  // Without PDL the first row's timestep is loaded before the frequencies are computed, so
  // that its round trip overlaps the double-precision exp instead of following it (small
  // calls are one row a block: that load and the exp are the whole latency). With PDL t
  // may be the previous kernel's output: the exp overlaps that kernel instead, and t is
  // read after the wait.
  const int64_t r0 = blockIdx.y;
  float t0 = 0.0f;
  if (!pdl && r0 < rows) t0 = device::to_float(t[r0]);
  float freq[kFreqs];
#pragma unroll
  for (int j = 0; j < kFreqs; ++j) {
    freq[j] = i0 + j < e.half ? timestep_frequency(e, i0 + j) : 0.0f;
  }
  if (pdl) {
    device::pdl_wait();
    if (r0 < rows) t0 = device::to_float(t[r0]);
    device::pdl_launch_dependents();
  }
  const int64_t sin_col = e.flip ? e.half : 0;
  const int64_t cos_col = e.flip ? 0 : e.half;
  const bool writes_pad = e.pad && blockIdx.x == 0 && threadIdx.x == 0;
  for (int64_t r = r0; r < rows; r += gridDim.y) {
    const float tv = r == r0 ? t0 : device::to_float(t[r]);
    float s[kFreqs], c[kFreqs];
#pragma unroll
    for (int j = 0; j < kFreqs; ++j) {
      const float arg = (tv * freq[j]) * e.scale;
      sincosf(arg, &s[j], &c[j]);
    }
    float* row = out + r * dim;
    if constexpr (kFloat4) {
      // half % 4 == 0: a thread's 4 frequencies are all in range or all out.
      if (i0 < e.half) {
        __stcs(reinterpret_cast<float4*>(row + sin_col + i0), make_float4(s[0], s[1], s[2], s[3]));
        __stcs(reinterpret_cast<float4*>(row + cos_col + i0), make_float4(c[0], c[1], c[2], c[3]));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kFreqs; ++j) {
        if (i0 + j < e.half) {
          row[sin_col + i0 + j] = s[j];
          row[cos_col + i0 + j] = c[j];
        }
      }
    }
    if (writes_pad) row[dim - 1] = 0.0f;
  }
}

template <typename T>
cudaError_t launch(const DLTensor& t, DLTensor& out, const TimestepEmbedding& e,
                   cudaStream_t stream, bool pdl) {
  const int64_t rows = t.shape[0];
  const int64_t dim = out.shape[1];
  const T* tp = data_ptr<const T>(t);
  float* op = data_ptr<float>(out);
  if (rows * e.half <= kSmallMaxPairs) {
    // One frequency a thread, one row per block row (rows beyond 65535 are walked).
    const int64_t threads_needed = std::max<int64_t>(1, e.half);
    const int64_t threads = std::min<int64_t>(kMaxThreads, (threads_needed + 31) / 32 * 32);
    const dim3 grid(static_cast<unsigned>((threads_needed + threads - 1) / threads),
                    static_cast<unsigned>(std::min(rows, kMaxRowBlocks)));
    return device::launch(timestep_embedding_kernel<T, 1, false>, grid,
                          dim3(static_cast<unsigned>(threads)), 0, stream, pdl, tp, op, rows, dim,
                          e, pdl);
  }
  const int64_t threads_needed =
      std::max<int64_t>(1, (e.half + kFreqsPerThread - 1) / kFreqsPerThread);
  const int64_t threads = std::min<int64_t>(kMaxThreads, (threads_needed + 31) / 32 * 32);
  // ~32 rows a block (at least min(rows, 1024) blocks), amortizing the frequencies.
  const int64_t row_blocks =
      std::min(std::max((rows + kRowsPerBlock - 1) / kRowsPerBlock, std::min<int64_t>(rows, 1024)),
               kMaxRowBlocks);
  const dim3 grid(static_cast<unsigned>((threads_needed + threads - 1) / threads),
                  static_cast<unsigned>(row_blocks));
  const bool float4_ok = dim % 8 == 0 && device::aligned16(op);
  const auto kernel = float4_ok ? timestep_embedding_kernel<T, kFreqsPerThread, true>
                                : timestep_embedding_kernel<T, kFreqsPerThread, false>;
  return device::launch(kernel, grid, dim3(static_cast<unsigned>(threads)), 0, stream, pdl, tp, op,
                        rows, dim, e, pdl);
}

}  // namespace

KernelStatus timestep_embedding_cuda(Context& ctx, const DLTensor& t, DLTensor& out, int64_t dim,
                                     bool flip_sin_to_cos, double downscale_freq_shift,
                                     double scale, int64_t max_period) {
  const char* const kOp = ctx.op();
  TimestepEmbedding e;
  if (KernelStatus st = timestep_embedding_args(ctx, out, dim, flip_sin_to_cos,
                                                downscale_freq_shift, scale, max_period, e);
      !st.ok()) {
    return st;
  }
  if (t.shape[0] == 0 || dim == 0) return kOk;
  const device::DeviceGuard guard(t);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, kOp, t, [&](auto tag) {
    return device::launch_status(ctx, kOp, launch<decltype(tag)>(t, out, e, stream, ctx.pdl()));
  });
}

}  // namespace kreg::diffusion
