// CUDA moe.sum: out[t, :] = round((sum_j x[t, j, :]) * routed_scaling_factor), fp32
// accumulation in the order j = 0, 1, ..., k-1 (the CPU reference's order, so f32 results
// are bitwise equal to it).
//
// Launch shape: one thread per output vector of kVec elements (16 bytes when H and the
// pointers allow), kThreads threads a block; blockIdx.x walks the vectors of a row,
// blockIdx.y the tokens (grid-stride past 65535 tokens). Each thread issues its k loads
// in batches of kBatch before adding, so a thread keeps up to kBatch * 16 bytes in
// flight; at T = 32768, H = 4096 bf16 that is 131072 blocks of 128 threads. Loads and
// stores carry the evict-first hint: every byte is touched once. With programmatic
// dependent launch (ctx.pdl()) a thread waits before its first load and lets the next
// kernel be scheduled after its first token's loads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"
#include "moe.hpp"

namespace kreg::moe {
namespace {

using device::vec_t;

constexpr int kThreads = 128;
constexpr int kBatch = 8;
constexpr int64_t kMaxGridY = 65535;

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    moe_sum_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t tokens, int k, int64_t h,
                   float scale) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (col >= h) return;
  device::pdl_wait();
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const T* src = x + t * k * h + col;
    vec_t<float, kVec> acc;
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[v] = 0.0f;
    for (int j0 = 0; j0 < k; j0 += kBatch) {
      vec_t<T, kVec> raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (j0 + u < k) raw[u].load_stream(src + static_cast<int64_t>(j0 + u) * h);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (j0 + u < k) {
          vec_t<float, kVec> f;
          f.cast_from(raw[u]);
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc[v] += f[v];
        }
      }
    }
    device::pdl_launch_dependents();  // repeated calls change nothing
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[v] *= scale;
    vec_t<T, kVec> y;
    y.cast_from(acc);
    y.store_stream(out + t * h + col);
  }
}

template <typename T, int kVec>
cudaError_t launch(const T* x, T* out, int64_t tokens, int k, int64_t h, float scale,
                   cudaStream_t stream, bool pdl) {
  const int64_t vecs = h / kVec;
  const dim3 grid(static_cast<unsigned>((vecs + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min(tokens, kMaxGridY)));
  return device::launch(moe_sum_kernel<T, kVec>, grid, dim3(kThreads), 0, stream, pdl, x, out,
                        tokens, k, h, scale);
}

template <typename T>
cudaError_t launch_typed(const DLTensor& x, DLTensor& out, float scale, cudaStream_t stream,
                         bool pdl) {
  const T* xp = data_ptr<const T>(x);
  T* outp = data_ptr<T>(out);
  const int64_t tokens = x.shape[0];
  const int k = static_cast<int>(x.shape[1]);
  const int64_t h = x.shape[2];
  return device::visit_vec_elems<T>(device::max_vec_elems<T>(h, xp, outp), [&](auto vec) {
    return launch<T, decltype(vec)::value>(xp, outp, tokens, k, h, scale, stream, pdl);
  });
}

}  // namespace

KernelStatus sum_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                      double routed_scaling_factor) {
  const char* op = ctx.op();
  if (!std::isfinite(routed_scaling_factor)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'routed_scaling_factor' must be finite",
                    op);
  }
  const int64_t tokens = x.shape[0], k = x.shape[1], h = x.shape[2];
  if (tokens == 0 || h == 0) return kOk;
  if (k > INT32_MAX || h > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: k = %lld or H = %lld is too large", op,
                    static_cast<long long>(k), static_cast<long long>(h));
  }
  const auto scale = static_cast<float>(routed_scaling_factor);
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    return device::launch_status(ctx, op,
                                 launch_typed<decltype(tag)>(x, out, scale, stream, ctx.pdl()));
  });
}

}  // namespace kreg::moe
