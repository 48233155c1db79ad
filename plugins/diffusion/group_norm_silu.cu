// CUDA group_norm_silu: out = silu(group_norm(x) * weight[c] + bias[c]) for
// x[N,C,*].
//
// A group (sample n, channels g*C/G .. (g+1)*C/G - 1, all spatial positions) is
// one contiguous run of C/G * L elements. Launch shape: one block per (n, g),
// up to 1024 threads, 16-byte vectors when L and both pointers allow (a vector
// then never straddles two channels). Pass 1 reads the group with normal loads,
// kBatch vectors in flight per thread, and accumulates the sum and the sum of
// squares of (x - x0), x0 the group's first element: shifting by a sample of
// the data keeps the one-pass variance free of cancellation when |mean| >> std.
// One block reduction of the two sums gives mean and rstd. Pass 2 re-reads the
// group (from L2: at most two 1024-thread blocks run per SM, so the groups in
// flight stay well under the 50 MB L2 for groups of up to ~128 KB), applies the
// per-channel affine and SiLU and streams the result out.
//
// SD-like shape N = 16, C = 512, 64 x 64, G = 32: 512 blocks of 1024 threads,
// groups of 65536 elements (128 KB in bf16). Few, very large groups (N = 1)
// leave SMs idle: one block per group is the limit of this design (a
// cluster-split variant is future work).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::diffusion {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kMaxThreads = 1024;
constexpr int kBatch = 4;  // vectors per thread in flight

template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    group_norm_silu_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                           const T* __restrict__ bias, T* __restrict__ out, uint32_t groups,
                           uint32_t channels_per_group, FastDivisor vecs_per_channel,
                           uint32_t group_vecs, float eps) {
  __shared__ float scratch[2 * device::kWarpSize];
  const uint32_t tid = threadIdx.x;
  const uint32_t step = blockDim.x;
  const int64_t group_elems = static_cast<int64_t>(group_vecs) * kVec;
  const T* xg = x + static_cast<int64_t>(blockIdx.x) * group_elems;
  T* og = out + static_cast<int64_t>(blockIdx.x) * group_elems;
  const uint32_t first_channel = (blockIdx.x % groups) * channels_per_group;

  const float x0 = device::to_float(xg[0]);
  float sums[2] = {0.0f, 0.0f};  // sum of (x - x0), sum of (x - x0)^2
  for (uint32_t v0 = tid; v0 < group_vecs; v0 += kBatch * step) {
    vec_t<T, kVec> buf[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const uint32_t v = v0 + b * step;
      if (v < group_vecs) buf[b].load(xg + static_cast<int64_t>(v) * kVec);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (v0 + b * step < group_vecs) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = device::to_float(buf[b][j]) - x0;
          sums[0] += d;
          sums[1] += d * d;
        }
      }
    }
  }
  device::block_row_sum(sums, scratch);
  const float inv_n = 1.0f / static_cast<float>(group_elems);
  const float mean_d = sums[0] * inv_n;
  const float var = fmaxf(sums[1] * inv_n - mean_d * mean_d, 0.0f);
  const float mean = x0 + mean_d;
  const float rstd = rsqrtf(var + eps);

  for (uint32_t v0 = tid; v0 < group_vecs; v0 += kBatch * step) {
    vec_t<T, kVec> buf[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const uint32_t v = v0 + b * step;
      if (v < group_vecs) buf[b].load_stream(xg + static_cast<int64_t>(v) * kVec);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const uint32_t v = v0 + b * step;
      if (v < group_vecs) {
        const uint32_t c = first_channel + vecs_per_channel.div(v);
        const float w = device::to_float(weight[c]);
        const float bb = device::to_float(bias[c]);
        vec_t<float, kVec> y;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float z = (device::to_float(buf[b][j]) - mean) * rstd * w + bb;
          y[j] = z / (1.0f + expf(-z));
        }
        vec_t<T, kVec> raw;
        raw.cast_from(y);
        raw.store_stream(og + static_cast<int64_t>(v) * kVec);
      }
    }
  }
}

struct GroupArgs {
  const void* x;
  const void* weight;
  const void* bias;
  void* out;
  GroupNormShape shape;
  float eps;
};

template <typename T, int kVec>
cudaError_t launch(const GroupArgs& a, cudaStream_t stream) {
  const int64_t cpg = a.shape.channels / a.shape.groups;
  const int64_t vpc = a.shape.spatial / kVec;
  const int64_t group_vecs = cpg * vpc;
  const int64_t wanted = (group_vecs + kBatch - 1) / kBatch;
  const auto threads =
      static_cast<unsigned>(std::min<int64_t>(kMaxThreads, (wanted + 31) / 32 * 32));
  const auto blocks = static_cast<unsigned>(a.shape.batch * a.shape.groups);
  group_norm_silu_kernel<T, kVec><<<blocks, threads, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.weight), static_cast<const T*>(a.bias),
      static_cast<T*>(a.out), static_cast<uint32_t>(a.shape.groups), static_cast<uint32_t>(cpg),
      FastDivisor(static_cast<uint32_t>(vpc)), static_cast<uint32_t>(group_vecs), a.eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const GroupArgs& a, cudaStream_t stream) {
  // Rows of L elements (one channel's spatial positions) start every group and
  // channel.
  switch (device::max_vec_elems<T>(a.shape.spatial, static_cast<const T*>(a.x),
                                   static_cast<const T*>(a.out))) {
    case 8:
      if constexpr (sizeof(T) == 2) return launch<T, 8>(a, stream);
      break;
    case 4:
      return launch<T, 4>(a, stream);
    case 2:
      return launch<T, 2>(a, stream);
    default:
      break;
  }
  return launch<T, 1>(a, stream);
}

}  // namespace

KernelStatus group_norm_silu_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                  const DLTensor& bias, DLTensor& out, int64_t num_groups,
                                  double eps) {
  constexpr const char* kOp = "diffusion.group_norm_silu";
  GroupArgs a{.x = data_ptr<const void>(x),
              .weight = data_ptr<const void>(weight),
              .bias = data_ptr<const void>(bias),
              .out = data_ptr<void>(out),
              .shape = {},
              .eps = static_cast<float>(eps)};
  if (KernelStatus st = group_norm_shape(ctx, x, weight, bias, out, num_groups, a.shape);
      !st.ok()) {
    return st;
  }
  const int64_t group_elems = a.shape.channels / a.shape.groups * a.shape.spatial;
  if (a.shape.batch == 0 || group_elems == 0) return kOk;
  // 32-bit vector indices within a group, one block per group.
  if (group_elems > INT32_MAX || a.shape.batch * a.shape.groups > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: %lld groups of %lld elements are more than one launch handles", kOp,
                    static_cast<long long>(a.shape.batch * a.shape.groups),
                    static_cast<long long>(group_elems));
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
