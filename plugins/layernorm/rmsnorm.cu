// CUDA RMSNorm for the layernorm group: one kernel template serves rmsnorm,
// fused_add_rmsnorm and their Gemma variants.
//
// Launch shape: a block row of blockDim.x threads (up to 1024) owns kRows rows of H
// elements, each thread the same kItems vectors of kVec elements in each of them (kVec:
// 16 bytes when H and the pointers allow, else narrower). Short rows stack blockDim.y
// block rows into blocks of 256 threads. Each thread loads its vectors once, keeps them
// in registers across the block reduction and writes the result from them, so every byte
// is read once and written once. Rows longer than the register window
// (kItems * blockDim.x vectors) re-read the remainder in the second pass, from L2.
//
// For the common sizes (H <= 8192 in 16-bit types) that is one vector per row per thread,
// 512 threads per block for H = 4096, two rows per thread for plain rmsnorm, and at most
// 32 registers so that four blocks share an SM (the shape torch.compile's Triton kernel
// also picks): the bytes in flight per SM, not the arithmetic, set the speed.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"
#include "layernorm.hpp"

namespace kreg::layernorm {
namespace {

using device::vec_t;

constexpr int kMaxThreadsPerRow = 1024;
// Threads per block when several short rows share a block.
constexpr int kShortRowBlockThreads = 256;

// Two 16-byte vectors per thread fit in 32 registers (one where they are kept as fp32: the
// fused form's sums, f32 data), so four 512-thread blocks share an SM and keep 64 KB of
// loads in flight per SM.
template <typename T, int kItems, int kRows, bool kFusedAdd>
constexpr int kMinBlocksPerSm = (kItems * kRows <= (kFusedAdd || sizeof(T) == 4 ? 1 : 2)) ? 2 : 1;

// kSignalLate: plain rmsnorm lets the next kernel be scheduled after its stores rather than
// at its start (the decode-size launch below; FlashInfer's placement).
template <typename T, int kVec, int kItems, int kRows, bool kFusedAdd, bool kGemma,
          bool kSignalLate = false>
__global__ void __launch_bounds__(kMaxThreadsPerRow, (kMinBlocksPerSm<T, kItems, kRows, kFusedAdd>))
    rmsnorm_kernel(const T* in, T* residual, const T* __restrict__ weight, T* out, int64_t rows,
                   int vecs_per_row, float eps, bool weight_early) {
  __shared__ float scratch[kRows * device::kWarpSize];
  // Plain rmsnorm keeps x in its storage type (exact, and half the registers); the fused
  // form must keep the unrounded fp32 sum x + residual.
  using Held = std::conditional_t<kFusedAdd, float, T>;

  const int tid = static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(blockDim.x);
  const int row_elems = vecs_per_row * kVec;
  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y) * kRows;
  // No early return for rows past the end: every thread takes part in the reduction.
  auto live = [&](int r) { return first_row + r < rows; };
  auto row_offset = [&](int r) { return (first_row + r) * row_elems; };

  auto load_sum = [&](int r, int v, vec_t<float, kVec>& s) {
    vec_t<T, kVec> raw;
    raw.load(in + row_offset(r) + v * kVec);
    s.cast_from(raw);
    if constexpr (kFusedAdd) {
      raw.load(residual + row_offset(r) + v * kVec);
      vec_t<float, kVec> res;
      res.cast_from(raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) s[j] += res[j];
    }
  };
  auto sum_squares = [](const auto& s) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc += device::to_float(s[j]) * device::to_float(s[j]);
    return acc;
  };
  auto normalize_store = [&](int r, int v, const auto& s, const vec_t<T, kVec>& w, float scale) {
    vec_t<float, kVec> y;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float wj = kGemma ? 1.0f + device::to_float(w[j]) : device::to_float(w[j]);
      y[j] = device::to_float_again(s[j]) * scale * wj;
    }
    y.cast_store(out + row_offset(r) + v * kVec);
  };

  vec_t<Held, kVec> held[kRows][kItems];
  float sum_sq[kRows];
  // With stable inputs (KREG_LAUNCH_STABLE_INPUTS) the weight is not the previous kernel's
  // output: its lines are prefetched into L1 before the wait, so that the second pass's
  // weight loads hit there instead of waiting on L2/DRAM after the reduction. No registers.
  if (weight_early) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = tid + k * step;
      if (v < vecs_per_row) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"(weight + v * kVec));
      }
    }
  }
  // With PDL: plain rmsnorm lets the next kernel be scheduled at once (it waits for this
  // grid to finish before it reads anything; H100, graph chains: T = 16 H = 4096 1.93 ->
  // 1.84 us against signalling after the reduction, T = 64 H = 7168 3.15 -> 3.13). The fused
  // form signals after its reduction: at once was slower there (T = 64 H = 7168 3.25 ->
  // 3.30). x and residual may be the previous kernel's output.
  if constexpr (!kFusedAdd && !kSignalLate) device::pdl_launch_dependents();
  device::pdl_wait();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    sum_sq[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = tid + k * step;
      if (live(r) && v < vecs_per_row) {
        if constexpr (kFusedAdd) {
          load_sum(r, v, held[r][k]);
          held[r][k].cast_store(residual + row_offset(r) + v * kVec);
        } else {
          held[r][k].load(in + row_offset(r) + v * kVec);
        }
        sum_sq[r] += sum_squares(held[r][k]);
      }
    }
    // Beyond the register window: sum only. The residual is written in the second
    // pass, which must still read its original value.
    for (int v = tid + kItems * step; live(r) && v < vecs_per_row; v += step) {
      vec_t<float, kVec> s;
      load_sum(r, v, s);
      sum_sq[r] += sum_squares(s);
    }
  }

  device::block_row_sum(sum_sq, scratch);
  // The fused form: every load of the first pass is done, the next kernel may be scheduled.
  if constexpr (kFusedAdd) device::pdl_launch_dependents();

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float scale = rsqrtf(sum_sq[r] / static_cast<float>(row_elems) + eps);
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = tid + k * step;
      if (live(r) && v < vecs_per_row) {
        // The weight is loaded here rather than held across the barrier, which would cost
        // the registers that let four blocks share an SM (measured: loading it first with
        // x was 3-8% slower). The kRows rows of a thread share the load.
        vec_t<T, kVec> w;
        w.load(weight + v * kVec);
        normalize_store(r, v, held[r][k], w, scale);
      }
    }
    for (int v = tid + kItems * step; live(r) && v < vecs_per_row; v += step) {
      vec_t<float, kVec> s;
      load_sum(r, v, s);
      if constexpr (kFusedAdd) s.cast_store(residual + row_offset(r) + v * kVec);
      vec_t<T, kVec> wv;
      wv.load(weight + v * kVec);
      normalize_store(r, v, s, wv, scale);
    }
  }
  if constexpr (kSignalLate) device::pdl_launch_dependents();
}

struct NormArgs {
  const void* in;
  void* residual;  // null unless fused
  const void* weight;
  void* out;
  int64_t rows;
  int64_t hidden;
  float eps;
  bool pdl = false;     // programmatic dependent launch (the caller's KREG_LAUNCH_PDL)
  bool stable = false;  // with pdl: the weight is not the previous kernel's output
};

template <typename T, int kVec, int kItems, int kRows, bool kFusedAdd, bool kGemma,
          bool kSignalLate = false>
void launch(const NormArgs& a, dim3 block, cudaStream_t stream) {
  // Fewer block rows than the call has rows would leave threads idle; keep the grid.
  const int64_t row_groups = (a.rows + kRows - 1) / kRows;
  block.y = static_cast<unsigned>(std::min<int64_t>(block.y, row_groups));
  const dim3 grid(static_cast<unsigned>((row_groups + block.y - 1) / block.y));
  device::launch(rmsnorm_kernel<T, kVec, kItems, kRows, kFusedAdd, kGemma, kSignalLate>, grid,
                 block, 0, stream, a.pdl, static_cast<const T*>(a.in), static_cast<T*>(a.residual),
                 static_cast<const T*>(a.weight), static_cast<T*>(a.out), a.rows,
                 static_cast<int>(a.hidden / kVec), a.eps, a.stable);
}

int round_up(int n, int m) { return (n + m - 1) / m * m; }

// Picks the block shape and register window for rows of H / kVec vectors.
template <typename T, int kVec, bool kFusedAdd, bool kGemma>
void launch_with_vec(const NormArgs& a, cudaStream_t stream) {
  const int vecs = static_cast<int>(a.hidden / kVec);
  constexpr bool kFullWidth = kVec * sizeof(T) == 16;
  if (vecs <= device::kWarpSize) {
    // Short rows: a power-of-two group of lanes per row and several rows per block, so
    // the reduction stays inside a warp.
    const unsigned lanes = std::bit_ceil(static_cast<unsigned>(vecs));
    const dim3 block(lanes, kShortRowBlockThreads / lanes);
    return launch<T, kVec, 1, 2, kFusedAdd, kGemma>(a, block, stream);
  }
  int items = kFullWidth ? std::min(4, (vecs + kMaxThreadsPerRow - 1) / kMaxThreadsPerRow) : 4;
  // Plain 16-bit rows of 512..1024 vectors (H 4096..8192 bf16): two vectors a thread over
  // half as many threads, one row a block, rather than 512-1024-thread blocks with two
  // rows a thread. H200, 32768 rows: H = 4096 84.7% -> 92.4% of copy bandwidth, H = 7168
  // 72% -> 88% (one row a thread at 896 threads: 64.5%).
  if constexpr (kFullWidth && !kFusedAdd && sizeof(T) == 2) {
    // Decode sizes (at most 512 rows): FlashInfer's launch, a vector a thread and one row a
    // block (896 threads x T blocks at H = 7168), signalling the next kernel after the
    // stores. H100, kreg bench graph chains, two rounds (docs/performance.md, session 16):
    // T = 64 H = 7168 with PDL 3.13 -> 2.44 us (plain 3.86 -> 3.25), T = 16 H = 4096 1.84
    // -> 1.51 (plain 2.38 -> 2.05). The shape alone gave 2.65 / 1.48, the late signal alone
    // 3.15 / 1.91; two rows a thread at 896 threads (sixth round) 3.44.
    if (vecs >= 512 && items == 1 && a.rows <= 512) {
      return launch<T, kVec, 1, 1, kFusedAdd, kGemma, true>(
          a, dim3(round_up(vecs, device::kWarpSize), 1), stream);
    }
  }
  if (kFullWidth && !kFusedAdd && sizeof(T) == 2 && vecs >= 512 && items == 1) items = 2;
  dim3 block(std::min(kMaxThreadsPerRow, round_up((vecs + items - 1) / items, device::kWarpSize)));
  block.y = std::max(1u, kShortRowBlockThreads / block.x);
  if constexpr (kFullWidth) {
    // One vector per row per thread (the fused form up to H = 8192 bf16). Plain 16-bit
    // rows shorter than 512 vectors go two to a thread, sharing the weight vector, so
    // each thread has two loads in flight; the fused form already loads two tensors.
    if (items == 1) {
      constexpr int kRows = kFusedAdd || sizeof(T) == 4 ? 1 : 2;
      return launch<T, kVec, 1, kRows, kFusedAdd, kGemma>(a, block, stream);
    }
    if (items == 2) return launch<T, kVec, 2, 1, kFusedAdd, kGemma>(a, block, stream);
  }
  // Narrow vectors (odd sizes or misaligned pointers) and very long rows share one
  // instantiation with a 4-vector window; anything longer is re-read from L2.
  launch<T, kVec, 4, 1, kFusedAdd, kGemma>(a, block, stream);
}

template <typename T, bool kFusedAdd, bool kGemma>
void launch_typed(const NormArgs& a, cudaStream_t stream) {
  const auto* in = static_cast<const T*>(a.in);
  const auto* weight = static_cast<const T*>(a.weight);
  const auto* out = static_cast<const T*>(a.out);
  const auto* residual = static_cast<const T*>(a.residual);
  // A null residual has every alignment, so plain rmsnorm is not held back by it.
  return device::visit_vec_elems<T>(
      device::max_vec_elems<T>(a.hidden, in, weight, out, residual), [&](auto vec) {
        return launch_with_vec<T, decltype(vec)::value, kFusedAdd, kGemma>(a, stream);
      });
}

template <bool kFusedAdd, bool kGemma>
KernelStatus run(Context& ctx, const char* op, const DLTensor& x, NormArgs a) {
  a.pdl = ctx.pdl();
  a.stable = ctx.stable_inputs();
  if (a.rows == 0 || a.hidden == 0) return kOk;
  if (a.hidden > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: hidden size %lld is too large", op,
                    static_cast<long long>(a.hidden));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    launch_typed<decltype(tag), kFusedAdd, kGemma>(a, stream);
    return device::launch_status(ctx, op);
  });
}

template <bool kGemma>
KernelStatus rmsnorm_impl(Context& ctx, const char* op, const DLTensor& x, const DLTensor& weight,
                          DLTensor& out, double eps) {
  const NormArgs a{.in = data_ptr<const void>(x),
                   .residual = nullptr,
                   .weight = data_ptr<const void>(weight),
                   .out = data_ptr<void>(out),
                   .rows = x.shape[0],
                   .hidden = x.shape[1],
                   .eps = static_cast<float>(eps)};
  return run<false, kGemma>(ctx, op, x, a);
}

template <bool kGemma>
KernelStatus fused_add_rmsnorm_impl(Context& ctx, const char* op, DLTensor& x, DLTensor& residual,
                                    const DLTensor& weight, double eps) {
  // In place: x is both the input and the output.
  const NormArgs a{.in = data_ptr<const void>(x),
                   .residual = data_ptr<void>(residual),
                   .weight = data_ptr<const void>(weight),
                   .out = data_ptr<void>(x),
                   .rows = x.shape[0],
                   .hidden = x.shape[1],
                   .eps = static_cast<float>(eps)};
  return run<true, kGemma>(ctx, op, x, a);
}

}  // namespace

KernelStatus rmsnorm_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight, DLTensor& out,
                          double eps) {
  return rmsnorm_impl<false>(ctx, "layernorm.rmsnorm", x, weight, out, eps);
}

KernelStatus gemma_rmsnorm_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                DLTensor& out, double eps) {
  return rmsnorm_impl<true>(ctx, "layernorm.gemma_rmsnorm", x, weight, out, eps);
}

KernelStatus fused_add_rmsnorm_cuda(Context& ctx, DLTensor& x, DLTensor& residual,
                                    const DLTensor& weight, double eps) {
  return fused_add_rmsnorm_impl<false>(ctx, "layernorm.fused_add_rmsnorm", x, residual, weight,
                                       eps);
}

KernelStatus gemma_fused_add_rmsnorm_cuda(Context& ctx, DLTensor& x, DLTensor& residual,
                                          const DLTensor& weight, double eps) {
  return fused_add_rmsnorm_impl<true>(ctx, "layernorm.gemma_fused_add_rmsnorm", x, residual, weight,
                                      eps);
}

}  // namespace kreg::layernorm
