// CUDA group_norm_silu: out = silu(group_norm(x) * weight[c] + bias[c]) for
// x[N,C,*].
//
// A group (sample n, channels g*C/G .. (g+1)*C/G - 1, all spatial positions) is
// one contiguous run of C/G * L elements.
//
// Resident path (16-byte vectors, groups of up to 8 * 4096 vectors): every
// element is read from DRAM once. A group is split over `split` blocks (a
// thread block cluster of `split` blocks on sm_90, one block elsewhere), each of
// up to 512 threads holding kItems (<= 8) vectors of its contiguous chunk in
// registers. The mean and then the sum of squared deviations (exact two-pass)
// are reduced over the block (shuffles + one barrier) and over the cluster (each
// block's partial in shared memory, read by every block through distributed
// shared memory in rank order: deterministic), then each block normalizes its
// registers, applies the channel's affine and SiLU and streams the result out.
// The split is the smallest that fits the group, doubled while the grid has
// fewer than two blocks per SM. SD shapes: N=16, C=512, 64x64, G=32: groups of
// 8192 vectors, split 2 -> 1024 blocks of 512 threads x 8 vectors (2 per SM);
// N=2, C=128, 256x256: groups of 32768 vectors, split 8 -> 512 blocks.
//
// Fallback (narrow vectors, larger groups, or groups above 4096 vectors without
// clusters): one block per group, two passes: shifted one-pass statistics, then
// a re-read (mostly from L2) to normalize.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::diffusion {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kMaxThreads = 1024;
constexpr int kBatch = 4;  // vectors per thread in flight

constexpr int kResidentThreads = 512;  // per block; two blocks per SM at <= 64 registers
constexpr int kResidentItems = 8;      // vectors held per thread, at most
constexpr int kMaxSplit = 8;           // the portable cluster size limit

// SiLU of the fp32 pre-activation: z / (1 + e^-z). __expf (ex2.approx of z * log2 e, about
// 2 ulp) and __fdividef (a reciprocal and a multiply, 2 ulp): far below a 16-bit output's
// rounding, within f32's tolerance. For e^-z = inf (z < -88) it gives -0, SiLU's limit.
// The epilogue's math is the kernel's limit once the loads are done: with the accurate
// expf, N=16 C=512 64x64 G=32 bf16 took 61.2 us on the H200, with __expf 53.9 (scratch
// benchmark, 2026-12-02).
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }

// The sum of v over the block, then over the `split` blocks of the cluster (in
// rank order, so every block gets the same bits). Every thread must call it.
__device__ __forceinline__ float group_sum(float v, float* scratch, float* partial,
                                           uint32_t split) {
  v = device::block_row_sum(v, scratch);
  if (split == 1) return v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *partial = v;
  cluster.sync();
  float total = 0.0f;
  for (uint32_t r = 0; r < split; ++r) total += *cluster.map_shared_rank(partial, r);
  return total;
#else
  __trap();  // the host splits a group only on sm_90+
  return v;
#endif
}

// One group per `split` consecutive blocks (a cluster when split > 1): block
// part p holds vectors [p * chunk_vecs, min((p + 1) * chunk_vecs, group_vecs)).
template <typename T, int kVec, int kItems>
__global__ void __launch_bounds__(kResidentThreads, 2)
    group_norm_silu_resident_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                    const T* __restrict__ bias, T* __restrict__ out,
                                    uint32_t groups, uint32_t channels_per_group,
                                    FastDivisor vecs_per_channel, uint32_t group_vecs,
                                    uint32_t chunk_vecs, uint32_t split, float eps) {
  __shared__ float scratch_mean[device::kWarpSize];
  __shared__ float scratch_var[device::kWarpSize];
  __shared__ float partial[2];  // this block's two sums, read by the cluster
  const uint32_t tid = threadIdx.x;
  const uint32_t step = blockDim.x;
  const uint32_t group = blockIdx.x / split;
  const uint32_t part = blockIdx.x - group * split;
  const uint32_t begin = part * chunk_vecs;
  const uint32_t end = min(begin + chunk_vecs, group_vecs);
  const int64_t group_elems = static_cast<int64_t>(group_vecs) * kVec;
  const T* xg = x + static_cast<int64_t>(group) * group_elems;
  T* og = out + static_cast<int64_t>(group) * group_elems;

  vec_t<T, kVec> held[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const uint32_t v = begin + tid + k * step;
    if (v < end) held[k].load_stream(xg + static_cast<int64_t>(v) * kVec);
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if (begin + tid + k * step < end) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += device::to_float(held[k][j]);
    }
  }
  const float inv_n = 1.0f / static_cast<float>(group_elems);
  const float mean = group_sum(sum, scratch_mean, &partial[0], split) * inv_n;
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    if (begin + tid + k * step < end) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = device::to_float_again(held[k][j]) - mean;
        sq += d * d;
      }
    }
  }
  const float var = group_sum(sq, scratch_var, &partial[1], split) * inv_n;
  const float rstd = rsqrtf(var + eps);

  const uint32_t first_channel = (group % groups) * channels_per_group;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const uint32_t v = begin + tid + k * step;
    if (v < end) {
      const uint32_t c = first_channel + vecs_per_channel.div(v);
      const float w = device::to_float(__ldg(weight + c)) * rstd;
      const float b = device::to_float(__ldg(bias + c));
      vec_t<float, kVec> y;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        y[j] = silu((device::to_float_again(held[k][j]) - mean) * w + b);
      }
      vec_t<T, kVec> raw;
      raw.cast_from(y);
      raw.store_stream(og + static_cast<int64_t>(v) * kVec);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // No block may leave (freeing its shared memory) while another block of its
  // cluster can still read its partial sums.
  if (split > 1) cooperative_groups::this_cluster().sync();
#endif
}

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
          y[j] = silu((device::to_float(buf[b][j]) - mean) * rstd * w + bb);
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

template <typename T, int kVec, int kItems>
cudaError_t launch_resident(const GroupArgs& a, uint32_t group_vecs, uint32_t split,
                            uint32_t chunk_vecs, cudaStream_t stream) {
  const int64_t cpg = a.shape.channels / a.shape.groups;
  const auto threads = static_cast<unsigned>(
      std::max<int64_t>(32, (int64_t{chunk_vecs} + kItems - 1) / kItems + 31) / 32 * 32);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(a.shape.batch * a.shape.groups * split));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute cluster[1];
  if (split > 1) {
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = split;
    cluster[0].val.clusterDim.y = 1;
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, group_norm_silu_resident_kernel<T, kVec, kItems>,
                            static_cast<const T*>(a.x), static_cast<const T*>(a.weight),
                            static_cast<const T*>(a.bias), static_cast<T*>(a.out),
                            static_cast<uint32_t>(a.shape.groups), static_cast<uint32_t>(cpg),
                            FastDivisor(static_cast<uint32_t>(a.shape.spatial / kVec)), group_vecs,
                            chunk_vecs, split, a.eps);
}

// The resident path when the group fits (see the top of the file); false: use
// the two-pass kernel.
template <typename T, int kVec>
bool try_resident(const GroupArgs& a, cudaStream_t stream, cudaError_t& err) {
  const int64_t group_vecs = a.shape.channels / a.shape.groups * a.shape.spatial / kVec;
  const int64_t total_groups = a.shape.batch * a.shape.groups;
  constexpr int64_t kBlockVecs = int64_t{kResidentThreads} * kResidentItems;
  int device = 0, major = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return false;  // the two-pass kernel needs no device facts
  }
  const int64_t max_split = major >= 9 ? kMaxSplit : 1;
  int64_t split = (group_vecs + kBlockVecs - 1) / kBlockVecs;
  if (split > max_split) return false;
  // Few groups: split further (down to blocks of 1024 vectors) to fill the SMs.
  while (split * 2 <= max_split && total_groups * split < 2 * int64_t{sms} &&
         group_vecs >= split * 2 * 1024) {
    split *= 2;
  }
  if (total_groups * split > INT32_MAX) return false;
  const int64_t chunk = ((group_vecs + split - 1) / split + 31) / 32 * 32;
  const auto g = static_cast<uint32_t>(group_vecs);
  const auto s = static_cast<uint32_t>(split);
  const auto c = static_cast<uint32_t>(chunk);
  if (chunk <= kResidentThreads) {
    err = launch_resident<T, kVec, 1>(a, g, s, c, stream);
  } else if (chunk <= 2 * kResidentThreads) {
    err = launch_resident<T, kVec, 2>(a, g, s, c, stream);
  } else if (chunk <= 4 * kResidentThreads) {
    err = launch_resident<T, kVec, 4>(a, g, s, c, stream);
  } else {
    err = launch_resident<T, kVec, 8>(a, g, s, c, stream);
  }
  return true;
}

template <typename T>
cudaError_t launch_typed(const GroupArgs& a, cudaStream_t stream) {
  // Rows of L elements (one channel's spatial positions) start every group and
  // channel.
  const int vec_elems = device::max_vec_elems<T>(a.shape.spatial, static_cast<const T*>(a.x),
                                                 static_cast<const T*>(a.out));
  return device::visit_vec_elems<T>(vec_elems, [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    // 16-byte vectors: the resident kernel when the group fits.
    if constexpr (kVec * sizeof(T) == 16) {
      cudaError_t err = cudaSuccess;
      if (try_resident<T, kVec>(a, stream, err)) return err;
    }
    return launch<T, kVec>(a, stream);
  });
}

}  // namespace

KernelStatus group_norm_silu_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                  const DLTensor& bias, DLTensor& out, int64_t num_groups,
                                  double eps) {
  const char* const kOp = ctx.op();
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
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    return device::launch_status(ctx, kOp, launch_typed<decltype(tag)>(a, stream));
  });
}

}  // namespace kreg::diffusion
