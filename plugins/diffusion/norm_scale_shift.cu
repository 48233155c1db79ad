// CUDA norm_scale_shift (adaLN modulation): out = layernorm(x) * (1 + scale) +
// shift on rows of H elements, with an optional affine weight/bias applied to
// the norm first.
//
// Launch shape (layernorm's rmsnorm): a block row of blockDim.x threads owns
// one row of x; each thread loads the same kItems vectors of kVec elements (16
// bytes when H and every pointer allow) and keeps them in registers, in the
// storage type, across two block reductions: the mean, then the sum of squared
// deviations from it (two passes over registers, no cancellation). The
// modulation rows (and the affine weight/bias) are loaded only for the final
// pass, so they do not cost registers across the barriers; a [B,H] scale/shift
// is re-read by S rows from L2. Rows longer than the register window (kItems *
// blockDim.x vectors) re-read the remainder from L2 in each later pass. Short
// rows stack blockDim.y rows into 256-thread blocks with a warp-only reduction.
//
// At B*S = 65536 rows of H = 3072 bf16: 384 threads a block (one 16-byte vector
// each), 65536 blocks; every byte of x, out and a per-token scale/shift moves
// once.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::diffusion {
namespace {

using device::vec_t;

constexpr int kMaxThreadsPerRow = 1024;
constexpr int kShortRowBlockThreads = 256;

struct NormArgs {
  const void* x;
  const void* scale;
  const void* shift;
  const void* weight;
  const void* bias;
  void* out;
  int64_t rows;    // B * S
  int64_t tokens;  // S
  int64_t hidden;  // H
  float eps;
  bool scale_per_token;
  bool shift_per_token;
  bool affine;
};

template <typename T, int kVec, int kItems>
__global__ void __launch_bounds__(kMaxThreadsPerRow)
    norm_scale_shift_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                            const T* __restrict__ shift, const T* __restrict__ weight,
                            const T* __restrict__ bias, T* __restrict__ out, int64_t rows,
                            int64_t tokens, int vecs_per_row, float eps, bool scale_per_token,
                            bool shift_per_token, bool affine) {
  // One scratch per reduction: the second needs no barrier before it reuses the
  // first's.
  __shared__ float scratch_mean[device::kWarpSize];
  __shared__ float scratch_var[device::kWarpSize];

  const int tid = static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(blockDim.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  // No early return for a row past the end: every thread takes part in the
  // reductions.
  const bool live = row < rows;
  const int64_t hidden = static_cast<int64_t>(vecs_per_row) * kVec;
  const T* xr = x + row * hidden;

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

  vec_t<T, kVec> held[kItems];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) {
      held[k].load(xr + v * kVec);
      sum += sum_of(held[k]);
    }
  }
  for (int v = tid + kItems * step; live && v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    t.load(xr + v * kVec);
    sum += sum_of(t);
  }
  const float mean = device::block_row_sum(sum, scratch_mean) / static_cast<float>(hidden);

  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) sq += sq_dev_of(held[k], mean);
  }
  for (int v = tid + kItems * step; live && v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    t.load(xr + v * kVec);
    sq += sq_dev_of(t, mean);
  }
  const float var = device::block_row_sum(sq, scratch_var) / static_cast<float>(hidden);
  const float rstd = rsqrtf(var + eps);
  if (!live) return;  // past the last barrier

  const int64_t batch = row / tokens;
  const T* scale_row = scale + (scale_per_token ? row : batch) * hidden;
  const T* shift_row = shift + (shift_per_token ? row : batch) * hidden;
  T* out_row = out + row * hidden;
  auto modulate_store = [&](int v, const vec_t<T, kVec>& xv) {
    vec_t<float, kVec> sc, sh, y;
    sc.cast_load(scale_row + v * kVec);
    sh.cast_load(shift_row + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = (device::to_float_again(xv[j]) - mean) * rstd;
    if (affine) {
      vec_t<float, kVec> w, b;
      w.cast_load(weight + v * kVec);
      b.cast_load(bias + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) y[j] = y[j] * w[j] + b[j];
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = y[j] * (1.0f + sc[j]) + sh[j];
    y.cast_store(out_row + v * kVec);
  };
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (v < vecs_per_row) modulate_store(v, held[k]);
  }
  for (int v = tid + kItems * step; v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    t.load(xr + v * kVec);
    modulate_store(v, t);
  }
}

int round_up(int n, int m) { return (n + m - 1) / m * m; }

template <typename T, int kVec, int kItems>
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
  block.y = std::max(1u, kShortRowBlockThreads / block.x);
  block.y = static_cast<unsigned>(std::min<int64_t>(block.y, a.rows));
  const dim3 grid(static_cast<unsigned>((a.rows + block.y - 1) / block.y));
  norm_scale_shift_kernel<T, kVec, kItems><<<grid, block, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.scale), static_cast<const T*>(a.shift),
      static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), static_cast<T*>(a.out),
      a.rows, a.tokens, vecs, a.eps, a.scale_per_token, a.shift_per_token, a.affine);
  return cudaGetLastError();
}

// Full-width vectors hold one vector per thread up to 1024 vectors a row (H <=
// 8192 in 16-bit types), two up to 2048, else four (and re-read the rest);
// narrow vectors (odd H or misaligned views) always hold four.
template <typename T, int kVec>
cudaError_t launch_with_vec(const NormArgs& a, cudaStream_t stream) {
  const int64_t vecs = a.hidden / kVec;
  if constexpr (kVec * sizeof(T) == 16) {
    if (vecs <= kMaxThreadsPerRow) return launch<T, kVec, 1>(a, stream);
    if (vecs <= 2 * kMaxThreadsPerRow) return launch<T, kVec, 2>(a, stream);
  }
  return launch<T, kVec, 4>(a, stream);
}

template <typename T>
cudaError_t launch_typed(const NormArgs& a, cudaStream_t stream) {
  // Unused weight/bias (affine off) still count: they are real [H] tensors of
  // the call.
  switch (device::max_vec_elems<T>(a.hidden, static_cast<const T*>(a.x),
                                   static_cast<const T*>(a.scale), static_cast<const T*>(a.shift),
                                   static_cast<const T*>(a.weight), static_cast<const T*>(a.bias),
                                   static_cast<const T*>(a.out))) {
    case 8:
      if constexpr (sizeof(T) == 2) return launch_with_vec<T, 8>(a, stream);
      break;
    case 4:
      return launch_with_vec<T, 4>(a, stream);
    case 2:
      return launch_with_vec<T, 2>(a, stream);
    default:
      break;
  }
  return launch_with_vec<T, 1>(a, stream);
}

}  // namespace

KernelStatus norm_scale_shift_cuda(Context& ctx, const DLTensor& x, const DLTensor& scale,
                                   const DLTensor& shift, const DLTensor& weight,
                                   const DLTensor& bias, DLTensor& out, double eps, bool affine) {
  constexpr const char* kOp = "diffusion.norm_scale_shift";
  NormArgs a{.x = data_ptr<const void>(x),
             .scale = data_ptr<const void>(scale),
             .shift = data_ptr<const void>(shift),
             .weight = data_ptr<const void>(weight),
             .bias = data_ptr<const void>(bias),
             .out = data_ptr<void>(out),
             .rows = x.shape[0] * x.shape[1],
             .tokens = x.shape[1],
             .hidden = x.shape[2],
             .eps = static_cast<float>(eps),
             .scale_per_token = false,
             .shift_per_token = false,
             .affine = affine};
  if (KernelStatus st = modulation_layout(ctx, kOp, "scale", scale, x, a.scale_per_token); !st.ok())
    return st;
  if (KernelStatus st = modulation_layout(ctx, kOp, "shift", shift, x, a.shift_per_token); !st.ok())
    return st;
  if (a.rows == 0 || a.hidden == 0) return kOk;
  if (a.hidden > INT32_MAX || a.rows > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: B*S = %lld rows of H = %lld are too many", kOp,
                    static_cast<long long>(a.rows), static_cast<long long>(a.hidden));
  }
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  cudaError_t err = cudaSuccess;
  switch (from_dl(x.dtype).value_or(DType::kCount)) {
    case DType::kBF16:
      err = launch_typed<__nv_bfloat16>(a, stream);
      break;
    case DType::kF16:
      err = launch_typed<__half>(a, stream);
      break;
    case DType::kF32:
      err = launch_typed<float>(a, stream);
      break;
    default:
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: dtype must be bf16, f16 or f32", kOp);
  }
  if (err != cudaSuccess) {
    return ctx.fail(KREG_INTERNAL, "%s: kernel launch failed: %s", kOp, cudaGetErrorString(err));
  }
  return kOk;
}

}  // namespace kreg::diffusion
