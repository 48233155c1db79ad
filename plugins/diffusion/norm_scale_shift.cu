// CUDA norm_scale_shift (adaLN modulation): out = layernorm(x) * (1 + scale) +
// shift on rows of H elements, with an optional weight and bias applied to the
// norm first.
//
// Launch shape. Each row is read from DRAM once and held in registers, in the
// storage type, across two reductions (the mean, then the sum of squared
// deviations from it: a true two-pass variance, no cancellation). Only then are
// the modulation rows (and weight/bias) loaded, through the read-only path: a
// [B,H] scale/shift row is shared by the S rows of its batch and comes from L1
// or L2. The output is stored with an evict-first hint.
//  - Rows of up to 512 16-byte vectors (H <= 4096 in bf16/f16, 2048 in f32): a
//    warp (or an aligned group of 2..32 lanes for short rows) per row, kItems in
//    {1, 2, 4, 8, 12, 16} vectors a lane, shuffle-only reductions (no barrier, no
//    shared memory), four rows per 128-thread block. H = 3072 bf16 is 12 vectors
//    a lane: 6 KB of loads in flight per warp, ~20+ warps per SM.
//  - [B,H] scale and shift on rows of 257..384 16-byte vectors (H = 3072 bf16, the
//    SD3 / Flux width) in calls of many rows: the staged kernel. A block of 8 warps
//    owns 32 consecutive rows of one batch (S % 32 == 0), four a warp; it copies the
//    batch's scale and shift rows (and weight / bias) into shared memory once, while
//    its first rows' loads are in flight, and every row then modulates from there
//    instead of re-reading 2 x H elements through L1/L2 after its reductions (a
//    dependent round trip per row). H200, B=16 S=4096 H=3072 bf16: 270.0 -> 219.7 us,
//    71% -> 88% of copy (scratch benchmark, 2026-12-02).
//  - Longer rows and narrow vectors (odd H, misaligned views): blockDim.x lanes
//    per row (up to 1024) with kItems vectors each and block reductions; the
//    part of a row beyond the register window is re-read (from L2) per pass.
//  - Few rows (decode-sized calls, e.g. B=1 S=16 H=3072: a warp per row was 16
//    warps on 132 SMs, each lane holding 12 vectors, 80 registers, 9.9 us): a block
//    per row with one or two 16-byte vectors a lane (H/8 threads in bf16), while
//    the blocks fit in one wave (2048 threads an SM); the latency is then one
//    load, two block reductions and one store.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL): every kernel waits before its first
// load and lets the next kernel be scheduled once its rows' loads are done (after the mean
// in the row kernel, after the staging barrier in the staged one).
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::diffusion {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kMaxThreadsPerRow = 1024;
constexpr int kWarpRowBlockThreads = 128;             // rows of at most one warp: 4+ rows a block
constexpr int kWarpRowVecs = 16 * device::kWarpSize;  // the longest warp-per-row row
// One wave of the H200 (132 SMs of 2048 threads): calls whose block-per-row launch fits
// in it take that launch (the count only steers the choice, never the results).
constexpr int64_t kSms = 132;
constexpr int64_t kThreadsPerSm = 2048;
// The staged kernel: kStagedWarps warps of kStagedRowsPerWarp rows a block.
constexpr int kStagedWarps = 8;
constexpr int kStagedRowsPerWarp = 4;
constexpr int kStagedRows = kStagedWarps * kStagedRowsPerWarp;
constexpr int kStagedItems = 12;  // vectors a lane: rows of 257..384 vectors

struct NormArgs {
  const void* x;
  const void* scale;
  const void* shift;
  const void* weight;  // null: omitted
  const void* bias;    // null: omitted
  void* out;
  int64_t rows;    // B * S
  int64_t tokens;  // S
  int64_t hidden;  // H
  float eps;
  bool scale_per_token;
  bool shift_per_token;
  bool pdl;  // programmatic dependent launch (the caller's KREG_LAUNCH_PDL)
};

// blockDim.x lanes per row (a power of two up to 32, or a multiple of 32),
// blockDim.y rows per block; kItems vectors of kVec elements held per lane.
template <typename T, int kVec, int kItems, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    norm_scale_shift_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                            const T* __restrict__ shift, const T* __restrict__ weight,
                            const T* __restrict__ bias, T* __restrict__ out, int rows,
                            FastDivisor tokens, int vecs_per_row, float eps, bool scale_per_token,
                            bool shift_per_token) {
  // One scratch per reduction: the second needs no barrier before it reuses the
  // first's. Unused when a row is at most a warp (shuffle-only reductions).
  __shared__ float scratch_mean[device::kWarpSize];
  __shared__ float scratch_var[device::kWarpSize];

  const int tid = static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(blockDim.x);
  const int row = static_cast<int>(blockIdx.x * blockDim.y + threadIdx.y);
  // No early return for a row past the end: every thread takes part in the
  // reductions (block-wide ones have a barrier, shuffles name all 32 lanes).
  const bool live = row < rows;
  const int64_t hidden = static_cast<int64_t>(vecs_per_row) * kVec;
  const T* xr = x + static_cast<int64_t>(live ? row : 0) * hidden;

  auto sum_of = [](const vec_t<T, kVec>& v) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc += device::to_float(v[j]);
    return acc;
  };
  auto sq_dev_of = [](const vec_t<T, kVec>& v, float mean) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float d = device::to_float_again(v[j]) - mean;
      acc += d * d;
    }
    return acc;
  };

  // All loads of the window first (kItems vectors in flight), then the sums.
  device::pdl_wait();
  vec_t<T, kVec> held[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) held[k].load_nc(xr + static_cast<int64_t>(v) * kVec);
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) sum += sum_of(held[k]);
  }
  for (int v = tid + kItems * step; live && v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    t.load_nc(xr + static_cast<int64_t>(v) * kVec);
    sum += sum_of(t);
  }
  const float mean = device::block_row_sum(sum, scratch_mean) / static_cast<float>(hidden);
  device::pdl_launch_dependents();

  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) sq += sq_dev_of(held[k], mean);
  }
  for (int v = tid + kItems * step; live && v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    t.load_nc(xr + static_cast<int64_t>(v) * kVec);
    sq += sq_dev_of(t, mean);
  }
  const float var = device::block_row_sum(sq, scratch_var) / static_cast<float>(hidden);
  const float rstd = rsqrtf(var + eps);
  if (!live) return;  // past the last barrier

  const int64_t batch = tokens.div(static_cast<uint32_t>(row));
  const T* scale_row = scale + (scale_per_token ? row : batch) * hidden;
  const T* shift_row = shift + (shift_per_token ? row : batch) * hidden;
  T* out_row = out + static_cast<int64_t>(row) * hidden;
  auto modulate_store = [&](int v, const vec_t<T, kVec>& xv) {
    const int64_t at = static_cast<int64_t>(v) * kVec;
    vec_t<T, kVec> sc_raw, sh_raw;
    sc_raw.load_nc(scale_row + at);
    sh_raw.load_nc(shift_row + at);
    vec_t<float, kVec> sc, sh, y;
    sc.cast_from(sc_raw);
    sh.cast_from(sh_raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = (device::to_float_again(xv[j]) - mean) * rstd;
    if (weight != nullptr) {
      vec_t<T, kVec> w_raw;
      w_raw.load_nc(weight + at);
      vec_t<float, kVec> w;
      w.cast_from(w_raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) y[j] = y[j] * w[j];
    }
    if (bias != nullptr) {
      vec_t<T, kVec> b_raw;
      b_raw.load_nc(bias + at);
      vec_t<float, kVec> b;
      b.cast_from(b_raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) y[j] = y[j] + b[j];
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = y[j] * (1.0f + sc[j]) + sh[j];
    vec_t<T, kVec> o;
    o.cast_from(y);
    o.store_stream(out_row + at);
  };
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (v < vecs_per_row) modulate_store(v, held[k]);
  }
  for (int v = tid + kItems * step; v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    t.load_nc(xr + static_cast<int64_t>(v) * kVec);
    modulate_store(v, t);
  }
}

// The staged kernel (see the top): blockDim = (32, kStagedWarps); warp w of block b takes
// rows b * kStagedRows + w + i * kStagedWarps, i < kStagedRowsPerWarp, all of batch
// b * kStagedRows / S. rows % kStagedRows == 0 (the host checks S % kStagedRows == 0), so
// every warp's rows exist. Shared memory: scale, shift, then weight and bias when given,
// vecs_per_row vectors each.
template <typename T, int kVec>
__global__ void __launch_bounds__(kStagedWarps* device::kWarpSize, 3)
    norm_scale_shift_staged_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                   const T* __restrict__ shift, const T* __restrict__ weight,
                                   const T* __restrict__ bias, T* __restrict__ out, int tokens,
                                   int vecs_per_row, float eps) {
  using V = vec_t<T, kVec>;
  extern __shared__ uint4 staged_raw[];
  V* const s_scale = reinterpret_cast<V*>(staged_raw);
  V* const s_shift = s_scale + vecs_per_row;
  V* const s_weight = s_shift + vecs_per_row;
  V* const s_bias = s_weight + (weight != nullptr ? vecs_per_row : 0);
  const int lane = static_cast<int>(threadIdx.x);
  const int warp = static_cast<int>(threadIdx.y);
  const int64_t hidden = static_cast<int64_t>(vecs_per_row) * kVec;
  const int row0 = static_cast<int>(blockIdx.x) * kStagedRows;
  const int64_t batch = row0 / tokens;

  device::pdl_wait();
  V held[kStagedItems];
  auto load_row = [&](int row) {
    const T* xr = x + static_cast<int64_t>(row) * hidden;
#pragma unroll
    for (int k = 0; k < kStagedItems; ++k) {
      const int v = lane + k * device::kWarpSize;
      if (v < vecs_per_row) held[k].load_no_l1(xr + static_cast<int64_t>(v) * kVec);
    }
  };
  load_row(row0 + warp);  // in flight while the modulation is staged
  const int tid = warp * device::kWarpSize + lane;
  for (int v = tid; v < vecs_per_row; v += kStagedWarps * device::kWarpSize) {
    const int64_t at = static_cast<int64_t>(v) * kVec;
    s_scale[v].load_nc(scale + batch * hidden + at);
    s_shift[v].load_nc(shift + batch * hidden + at);
    if (weight != nullptr) s_weight[v].load_nc(weight + at);
    if (bias != nullptr) s_bias[v].load_nc(bias + at);
  }
  __syncthreads();
  device::pdl_launch_dependents();

  const float inv_h = 1.0f / static_cast<float>(hidden);
#pragma unroll 1
  for (int i = 0; i < kStagedRowsPerWarp; ++i) {
    const int row = row0 + warp + i * kStagedWarps;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kStagedItems; ++k) {
      if (lane + k * device::kWarpSize < vecs_per_row) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += device::to_float(held[k][j]);
      }
    }
    const float mean = device::warp_reduce(sum, device::SumOp{}) * inv_h;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < kStagedItems; ++k) {
      if (lane + k * device::kWarpSize < vecs_per_row) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = device::to_float_again(held[k][j]) - mean;
          sq += d * d;
        }
      }
    }
    const float rstd = rsqrtf(device::warp_reduce(sq, device::SumOp{}) * inv_h + eps);
    T* out_row = out + static_cast<int64_t>(row) * hidden;
#pragma unroll
    for (int k = 0; k < kStagedItems; ++k) {
      const int v = lane + k * device::kWarpSize;
      if (v >= vecs_per_row) continue;
      vec_t<float, kVec> sc, sh, y;
      sc.cast_from(s_scale[v]);
      sh.cast_from(s_shift[v]);
#pragma unroll
      for (int j = 0; j < kVec; ++j) y[j] = (device::to_float_again(held[k][j]) - mean) * rstd;
      if (weight != nullptr) {
        vec_t<float, kVec> w;
        w.cast_from(s_weight[v]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) y[j] = y[j] * w[j];
      }
      if (bias != nullptr) {
        vec_t<float, kVec> b;
        b.cast_from(s_bias[v]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) y[j] = y[j] + b[j];
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) y[j] = y[j] * (1.0f + sc[j]) + sh[j];
      vec_t<T, kVec> o;
      o.cast_from(y);
      o.store_stream(out_row + static_cast<int64_t>(v) * kVec);
    }
    if (i + 1 < kStagedRowsPerWarp) load_row(row + kStagedWarps);
  }
}

// Whether a call takes the staged kernel, and its launch.
template <typename T, int kVec>
bool staged_fits(const NormArgs& a) {
  const int64_t vecs = a.hidden / kVec;
  return kVec * sizeof(T) == 16 && !a.scale_per_token && !a.shift_per_token &&
         vecs > 8 * device::kWarpSize && vecs <= kStagedItems * device::kWarpSize &&
         a.tokens % kStagedRows == 0 && a.rows >= kSms * 3 * kStagedRows;
}

template <typename T, int kVec>
cudaError_t launch_staged(const NormArgs& a, cudaStream_t stream) {
  const int vecs = static_cast<int>(a.hidden / kVec);
  const int tables = 2 + (a.weight != nullptr) + (a.bias != nullptr);
  const size_t smem = static_cast<size_t>(tables) * vecs * sizeof(vec_t<T, kVec>);
  const dim3 block(device::kWarpSize, kStagedWarps);
  const dim3 grid(static_cast<unsigned>(a.rows / kStagedRows));
  return device::launch(norm_scale_shift_staged_kernel<T, kVec>, grid, block, smem, stream, a.pdl,
                        static_cast<const T*>(a.x), static_cast<const T*>(a.scale),
                        static_cast<const T*>(a.shift), static_cast<const T*>(a.weight),
                        static_cast<const T*>(a.bias), static_cast<T*>(a.out),
                        static_cast<int>(a.tokens), vecs, a.eps);
}

int round_up(int n, int m) { return (n + m - 1) / m * m; }

template <typename T, int kVec, int kItems, int kMaxThreads>
cudaError_t launch(const NormArgs& a, cudaStream_t stream) {
  const int vecs = static_cast<int>(a.hidden / kVec);
  const int threads_per_row = (vecs + kItems - 1) / kItems;
  dim3 block;
  if (threads_per_row <= device::kWarpSize) {
    block.x = std::bit_ceil(static_cast<unsigned>(threads_per_row));
  } else {
    block.x = static_cast<unsigned>(
        std::min(kMaxThreadsPerRow, round_up(threads_per_row, device::kWarpSize)));
  }
  // Rows of at most a warp: 128-thread blocks, or single-warp blocks when the
  // call is small (a few hundred rows spread over more SMs). Blocks are always
  // whole warps: the shuffles name all 32 lanes (rows past the end idle).
  unsigned rows_per_block = 1;
  if (block.x <= device::kWarpSize) {
    const unsigned per_warp = device::kWarpSize / block.x;
    const unsigned per_block = kWarpRowBlockThreads / block.x;
    rows_per_block = a.rows >= 16 * int64_t{per_block} * 132 ? per_block : per_warp;
  }
  block.y = rows_per_block;
  const dim3 grid(static_cast<unsigned>((a.rows + block.y - 1) / block.y));
  return device::launch(norm_scale_shift_kernel<T, kVec, kItems, kMaxThreads>, grid, block, 0,
                        stream, a.pdl, static_cast<const T*>(a.x), static_cast<const T*>(a.scale),
                        static_cast<const T*>(a.shift), static_cast<const T*>(a.weight),
                        static_cast<const T*>(a.bias), static_cast<T*>(a.out),
                        static_cast<int>(a.rows), FastDivisor(static_cast<uint32_t>(a.tokens)),
                        vecs, a.eps, a.scale_per_token, a.shift_per_token);
}

// 16-byte vectors: a block per row for calls of few rows (above); otherwise a warp
// per row up to 512 vectors (kItems = the smallest of 1, 2, 4, 8, 12, 16 that covers
// the row), else up to 1024 lanes of 8 vectors.
// Narrow vectors (odd H or misaligned views) always hold four.
template <typename T, int kVec>
cudaError_t launch_with_vec(const NormArgs& a, cudaStream_t stream) {
  const int64_t vecs = a.hidden / kVec;
  if constexpr (kVec * sizeof(T) == 16) {
    constexpr int kW = device::kWarpSize;
    static_assert(kWarpRowVecs == 16 * kW);
    // Few rows of more than a warp's vectors: a block per row, 1 or 2 vectors a lane.
    if (vecs > kW && vecs <= 2 * kMaxThreadsPerRow) {
      const bool one = vecs <= kMaxThreadsPerRow;
      const int64_t threads = round_up(static_cast<int>(one ? vecs : (vecs + 1) / 2), kW);
      if (a.rows <= kSms * (kThreadsPerSm / threads)) {
        return one ? launch<T, kVec, 1, kMaxThreadsPerRow>(a, stream)
                   : launch<T, kVec, 2, kMaxThreadsPerRow>(a, stream);
      }
    }
    if (staged_fits<T, kVec>(a)) return launch_staged<T, kVec>(a, stream);
    if (vecs <= 1 * kW) return launch<T, kVec, 1, kWarpRowBlockThreads>(a, stream);
    if (vecs <= 2 * kW) return launch<T, kVec, 2, kWarpRowBlockThreads>(a, stream);
    if (vecs <= 4 * kW) return launch<T, kVec, 4, kWarpRowBlockThreads>(a, stream);
    if (vecs <= 8 * kW) return launch<T, kVec, 8, kWarpRowBlockThreads>(a, stream);
    if (vecs <= 12 * kW) return launch<T, kVec, 12, kWarpRowBlockThreads>(a, stream);
    if (vecs <= 16 * kW) return launch<T, kVec, 16, kWarpRowBlockThreads>(a, stream);
    return launch<T, kVec, 8, kMaxThreadsPerRow>(a, stream);
  }
  return launch<T, kVec, 4, kMaxThreadsPerRow>(a, stream);
}

template <typename T>
cudaError_t launch_typed(const NormArgs& a, cudaStream_t stream) {
  return device::visit_vec_elems<T>(
      device::max_vec_elems<T>(a.hidden, static_cast<const T*>(a.x), static_cast<const T*>(a.scale),
                               static_cast<const T*>(a.shift), static_cast<const T*>(a.weight),
                               static_cast<const T*>(a.bias), static_cast<const T*>(a.out)),
      [&](auto vec) { return launch_with_vec<T, decltype(vec)::value>(a, stream); });
}

}  // namespace

KernelStatus norm_scale_shift_cuda(Context& ctx, const DLTensor& x, const DLTensor& scale,
                                   const DLTensor& shift, const DLTensor* weight,
                                   const DLTensor* bias, DLTensor& out, double eps) {
  const char* const kOp = ctx.op();
  NormArgs a{.x = data_ptr<const void>(x),
             .scale = data_ptr<const void>(scale),
             .shift = data_ptr<const void>(shift),
             .weight = weight ? data_ptr<const void>(*weight) : nullptr,
             .bias = bias ? data_ptr<const void>(*bias) : nullptr,
             .out = data_ptr<void>(out),
             .rows = x.shape[0] * x.shape[1],
             .tokens = x.shape[1],
             .hidden = x.shape[2],
             .eps = static_cast<float>(eps),
             .scale_per_token = false,
             .shift_per_token = false,
             .pdl = ctx.pdl()};
  if (KernelStatus st = modulation_layout(ctx, kOp, "scale", scale, x, a.scale_per_token); !st.ok())
    return st;
  if (KernelStatus st = modulation_layout(ctx, kOp, "shift", shift, x, a.shift_per_token); !st.ok())
    return st;
  if (a.rows == 0 || a.hidden == 0) return kOk;
  // 32-bit rows, vector indices and the FastDivisor range.
  if (a.hidden > INT32_MAX || a.rows > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: B*S = %lld rows of H = %lld are too many", kOp,
                    static_cast<long long>(a.rows), static_cast<long long>(a.hidden));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    return device::launch_status(ctx, kOp, launch_typed<decltype(tag)>(a, stream));
  });
}

}  // namespace kreg::diffusion
