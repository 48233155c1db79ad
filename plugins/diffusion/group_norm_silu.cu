// CUDA group_norm_silu: out = silu(group_norm(x) * weight[c] + bias[c]) for
// x[N,C,*].
//
// A group (sample n, channels g*C/G .. (g+1)*C/G - 1, all spatial positions) is
// one contiguous run of C/G * L elements.
//
// Cluster two-pass path (sm_90, 16-byte vectors, groups of 2049 .. 8 * 4096
// vectors; tools/bench/variants/gns_bench.cu's v4): a group is split over
// `split` = ceil(group_vecs / 2048) <= 8 blocks of 256 threads that form a
// thread block cluster, each with a contiguous chunk of <= 4096 vectors (a
// multiple of 32, the last one shorter). Nothing is held across the reduction
// (<= 40 registers, 6 blocks per SM): pass 1 streams the chunk in batches of 4
// vectors a thread with an L2 evict_last hint and sums x - x0 and (x - x0)^2
// (x0: the group's first element, the same shift in every block, so that the
// partials add and the one-pass variance does not cancel); one block + cluster
// reduction (partials read through distributed shared memory in rank order:
// every block gets the same bits); pass 2 re-reads the chunk (an L2 hit: at most
// 64 KB a block, at most ~50 MB in flight on 132 SMs, evict_first) and streams the
// result out. A block arrives at a cluster barrier as soon as it has read the
// partials and waits on it only before exiting. Many small blocks in different
// phases keep DRAM busy while others compute (the resident kernel's blocks load,
// reduce, then compute, all together). SD shape N=16, C=512, 64x64, G=32 bf16:
// groups of 8192 vectors, split 4 -> 2048 blocks of 256 threads, 2048 vectors
// each (8 a thread). Chunks of ~2048 rather than ~1024 vectors (H100, plugin
// A/B, docs/performance.md's eleventh round): 60.3 -> 57.6 us at that shape;
// N=2, C=128, 256x256 (groups of 32768 vectors, split 8, chunks of 4096) moved
// here from the resident path: 43.4 -> 39.5 us.
//
// Resident path (16-byte vectors, groups of up to 8 * 4096 vectors not taken by
// the cluster two-pass path): every element is read from DRAM once. A group is
// split over `split` blocks (a thread block cluster of `split` blocks on sm_90,
// one block elsewhere), each of up to 512 threads holding kItems (<= 8) vectors
// of its contiguous chunk in registers. The mean and then the sum of squared
// deviations (exact two-pass) are reduced over the block (shuffles + one
// barrier) and over the cluster (each block's partial in shared memory, read by
// every block through distributed shared memory in rank order: deterministic),
// then each block normalizes its registers, applies the channel's affine and
// SiLU and streams the result out. The split is the smallest that fits the
// group, doubled while the grid has fewer than two blocks per SM. Shapes: groups
// of <= 2048 vectors on sm_90 and groups of <= 4096 vectors on older GPUs.
//
// Both paths use the same epilogue: (x - mean) * (weight[c] * rstd) + bias[c],
// then SiLU with __expf and __fdividef.
//
// Fallback (narrow vectors, larger groups, or groups above 4096 vectors without
// clusters): one block per group, two passes: shifted one-pass statistics, then
// a re-read (mostly from L2) to normalize.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL, with the cluster attribute where there
// is one): every kernel waits before its first load of x and lets the next kernel be
// scheduled once its statistics are reduced (pass 2's re-read of x is safe: the next
// kernel writes nothing before its own wait, which returns after this grid has finished).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
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

constexpr int kMaxThreads = 1024;
constexpr int kBatch = 4;  // vectors per thread in flight

constexpr int kResidentThreads = 512;  // per block; two blocks per SM at <= 64 registers
constexpr int kResidentItems = 8;      // vectors held per thread, at most
constexpr int kMaxSplit = 8;           // the portable cluster size limit

constexpr int kTwoPassThreads = 256;        // per block of the cluster two-pass kernel
constexpr int kTwoPassMinBlocks = 6;        // blocks per SM: <= 40 registers
constexpr int64_t kTwoPassChunk = 2048;     // vectors a block, the target
constexpr int64_t kTwoPassMaxChunk = 4096;  // vectors a block, at most (16 bytes each)

// SiLU of the fp32 pre-activation: z / (1 + e^-z). __expf (ex2.approx of z * log2 e, about
// 2 ulp) and __fdividef (a reciprocal and a multiply, 2 ulp): far below a 16-bit output's
// rounding, within f32's tolerance. For e^-z = inf (z < -88) it gives -0, SiLU's limit.
// The epilogue's math is the kernel's limit once the loads are done: with the accurate
// expf, N=16 C=512 64x64 G=32 bf16 took 61.2 us on the H200, with __expf 53.9 (scratch
// benchmark, 2026-12-02).
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }

// The epilogue of the 16-byte paths: vector x of channel c, (x - mean) * (weight[c] * rstd)
// + bias[c], SiLU, streamed to dst. kAgain converts x with to_float_again (the resident
// kernel, whose registers hold x across both reductions).
template <bool kAgain, typename T, int kVec>
__device__ __forceinline__ void normalize_silu_store(const vec_t<T, kVec>& x, uint32_t c,
                                                     const T* __restrict__ weight,
                                                     const T* __restrict__ bias, float mean,
                                                     float rstd, T* dst) {
  const float w = device::to_float(__ldg(weight + c)) * rstd;
  const float b = device::to_float(__ldg(bias + c));
  vec_t<float, kVec> y;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float xf = kAgain ? device::to_float_again(x[j]) : device::to_float(x[j]);
    y[j] = silu((xf - mean) * w + b);
  }
  vec_t<T, kVec> raw;
  raw.cast_from(y);
  raw.store_stream(dst);
}

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

  device::pdl_wait();
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
  device::pdl_launch_dependents();

  const uint32_t first_channel = (group % groups) * channels_per_group;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const uint32_t v = begin + tid + k * step;
    if (v < end) {
      normalize_silu_store<true>(held[k], first_channel + vecs_per_channel.div(v), weight, bias,
                                 mean, rstd, og + static_cast<int64_t>(v) * kVec);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // No block may leave (freeing its shared memory) while another block of its
  // cluster can still read its partial sums.
  if (split > 1) cooperative_groups::this_cluster().sync();
#endif
}

// ---- Cluster two-pass path ----
//
// Its device code is compiled for sm_90+ (and seen by the host pass); an older
// image gets a trapping kernel, as the host never launches it there.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

constexpr int kTwoPassItems = 4;  // vectors a thread in flight per batch

// L2 eviction-priority policies for the loads below (createpolicy: sm_80+).
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// A 16-byte vector through the read-only path, not allocated in L1, with an L2
// policy. x is only read by the kernel (and every element is read before the
// thread that reads it last writes the same position of `out`).
template <typename T, int kVec>
__device__ __forceinline__ void load_l2_hint(vec_t<T, kVec>& v, const T* ptr, uint64_t policy) {
  static_assert(vec_t<T, kVec>::kBytes == 16, "16-byte vectors only");
  uint4& d = *reinterpret_cast<uint4*>(v.data);
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w)
               : "l"(ptr), "l"(policy));
}

// s[0], s[1] summed over the block, then over the `split` blocks of the cluster
// (in rank order, so every block gets the same bits). Every thread must call it.
// With split > 1 it leaves the block arrived at a cluster barrier (after reading
// the other blocks' partials) that cluster_exit_wait() completes.
__device__ __forceinline__ void cluster_sums(float (&s)[2], float* scratch, float* partial,
                                             uint32_t split) {
  device::block_row_sum(s, scratch);
  if (split == 1) return;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) {
    partial[0] = s[0];
    partial[1] = s[1];
  }
  cluster.sync();
  float a = 0.0f, b = 0.0f;
  for (uint32_t r = 0; r < split; ++r) {
    const float* p = cluster.map_shared_rank(partial, r);
    a += p[0];
    b += p[1];
  }
  s[0] = a;
  s[1] = b;
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}

// No block may leave (freeing its shared memory) while another block of its
// cluster can still read its partial sums: the wait half of cluster_sums' barrier.
__device__ __forceinline__ void cluster_exit_wait(uint32_t split) {
  if (split > 1) asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

// A thread's batch: vectors v0, v0 + kStep, ... (kTwoPassItems of them, those below end).
template <uint32_t kStep, typename T, int kVec>
__device__ __forceinline__ void load_batch(vec_t<T, kVec> (&buf)[kTwoPassItems], const T* xg,
                                           uint32_t v0, uint32_t end, uint64_t policy) {
#pragma unroll
  for (int k = 0; k < kTwoPassItems; ++k) {
    const uint32_t v = v0 + k * kStep;
    if (v < end) load_l2_hint(buf[k], xg + static_cast<int64_t>(v) * kVec, policy);
  }
}

#endif  // !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// One group per `split` consecutive blocks (a cluster): block part p owns
// vectors [p * chunk_vecs, min((p + 1) * chunk_vecs, group_vecs)), streamed in
// batches of kTwoPassItems vectors a thread, twice.
template <typename T, int kVec>
__global__ void __launch_bounds__(kTwoPassThreads, kTwoPassMinBlocks)
    group_norm_silu_cluster_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                   const T* __restrict__ bias, T* __restrict__ out, uint32_t groups,
                                   uint32_t channels_per_group, FastDivisor vecs_per_channel,
                                   uint32_t group_vecs, uint32_t chunk_vecs, uint32_t split,
                                   float eps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // the host takes this path only on sm_90+ (clusters)
#else
  constexpr uint32_t kStep = kTwoPassThreads;
  constexpr uint32_t kBatchVecs = kTwoPassItems * kTwoPassThreads;
  __shared__ float scratch[2 * device::kWarpSize];
  __shared__ float partial[2];  // this block's two sums, read by the cluster
  const uint32_t tid = threadIdx.x;
  const uint32_t group = blockIdx.x / split;
  const uint32_t part = blockIdx.x - group * split;
  const uint32_t begin = part * chunk_vecs;
  const uint32_t end = min(begin + chunk_vecs, group_vecs);
  const int64_t group_elems = static_cast<int64_t>(group_vecs) * kVec;
  const T* xg = x + static_cast<int64_t>(group) * group_elems;
  T* og = out + static_cast<int64_t>(group) * group_elems;
  device::pdl_wait();
  const float x0 = device::to_float(__ldg(xg));

  const uint64_t keep = l2_policy_evict_last();
  float sums[2] = {0.0f, 0.0f};  // sum of (x - x0), sum of (x - x0)^2
  for (uint32_t v0 = begin + tid; v0 < end; v0 += kBatchVecs) {
    vec_t<T, kVec> buf[kTwoPassItems];
    load_batch<kStep>(buf, xg, v0, end, keep);
#pragma unroll
    for (int k = 0; k < kTwoPassItems; ++k) {
      if (v0 + k * kStep < end) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = device::to_float(buf[k][j]) - x0;
          sums[0] += d;
          sums[1] += d * d;
        }
      }
    }
  }
  cluster_sums(sums, scratch, partial, split);
  device::pdl_launch_dependents();
  const float inv_n = 1.0f / static_cast<float>(group_elems);
  const float mean_d = sums[0] * inv_n;
  const float var = fmaxf(sums[1] * inv_n - mean_d * mean_d, 0.0f);
  const float mean = x0 + mean_d;
  const float rstd = rsqrtf(var + eps);

  const uint64_t drop = l2_policy_evict_first();
  const uint32_t first_channel = (group % groups) * channels_per_group;
  for (uint32_t v0 = begin + tid; v0 < end; v0 += kBatchVecs) {
    vec_t<T, kVec> buf[kTwoPassItems];
    load_batch<kStep>(buf, xg, v0, end, drop);
#pragma unroll
    for (int k = 0; k < kTwoPassItems; ++k) {
      const uint32_t v = v0 + k * kStep;
      if (v < end) {
        normalize_silu_store<false>(buf[k], first_channel + vecs_per_channel.div(v), weight, bias,
                                    mean, rstd, og + static_cast<int64_t>(v) * kVec);
      }
    }
  }
  cluster_exit_wait(split);
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

  device::pdl_wait();
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
  device::pdl_launch_dependents();
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
  bool pdl;  // programmatic dependent launch (the caller's KREG_LAUNCH_PDL)
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
  return device::launch(
      group_norm_silu_kernel<T, kVec>, dim3(blocks), dim3(threads), 0, stream, a.pdl,
      static_cast<const T*>(a.x), static_cast<const T*>(a.weight), static_cast<const T*>(a.bias),
      static_cast<T*>(a.out), static_cast<uint32_t>(a.shape.groups), static_cast<uint32_t>(cpg),
      FastDivisor(static_cast<uint32_t>(vpc)), static_cast<uint32_t>(group_vecs), a.eps);
}

// A kernel of the split paths (both take the same parameters): `split` blocks a group of
// `group_vecs` vectors, each owning `chunk_vecs`, forming a cluster when split > 1.
template <typename T, typename Kernel>
cudaError_t launch_split(Kernel kernel, unsigned threads, const GroupArgs& a, int vec_elems,
                         uint32_t group_vecs, uint32_t split, uint32_t chunk_vecs,
                         cudaStream_t stream) {
  const int64_t cpg = a.shape.channels / a.shape.groups;
  return device::launch_clusters(
      kernel, dim3(static_cast<unsigned>(a.shape.batch * a.shape.groups * split)), dim3(threads), 0,
      stream, a.pdl, split, static_cast<const T*>(a.x), static_cast<const T*>(a.weight),
      static_cast<const T*>(a.bias), static_cast<T*>(a.out), static_cast<uint32_t>(a.shape.groups),
      static_cast<uint32_t>(cpg), FastDivisor(static_cast<uint32_t>(a.shape.spatial / vec_elems)),
      group_vecs, chunk_vecs, split, a.eps);
}

template <typename T, int kVec, int kItems>
cudaError_t launch_resident(const GroupArgs& a, uint32_t group_vecs, uint32_t split,
                            uint32_t chunk_vecs, cudaStream_t stream) {
  const auto threads = static_cast<unsigned>(
      std::max<int64_t>(32, (int64_t{chunk_vecs} + kItems - 1) / kItems + 31) / 32 * 32);
  return launch_split<T>(group_norm_silu_resident_kernel<T, kVec, kItems>, threads, a, kVec,
                         group_vecs, split, chunk_vecs, stream);
}

template <typename T, int kVec>
cudaError_t launch_cluster_two_pass(const GroupArgs& a, uint32_t group_vecs, uint32_t split,
                                    uint32_t chunk_vecs, cudaStream_t stream) {
  return launch_split<T>(group_norm_silu_cluster_kernel<T, kVec>, kTwoPassThreads, a, kVec,
                         group_vecs, split, chunk_vecs, stream);
}

// The cluster two-pass path or the resident path when the group fits (see the
// top of the file); false: use the fallback kernel.
template <typename T, int kVec>
bool try_split(const GroupArgs& a, cudaStream_t stream, cudaError_t& err) {
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
  // Cluster two-pass: chunks of ~2048 (<= 4096) vectors, at least two a group.
  if (major >= 9 && group_vecs > kTwoPassChunk && group_vecs <= kMaxSplit * kTwoPassMaxChunk) {
    const int64_t split =
        std::min<int64_t>((group_vecs + kTwoPassChunk - 1) / kTwoPassChunk, kMaxSplit);
    if (total_groups * split <= INT32_MAX) {
      const int64_t chunk = ((group_vecs + split - 1) / split + 31) / 32 * 32;
      err = launch_cluster_two_pass<T, kVec>(a, static_cast<uint32_t>(group_vecs),
                                             static_cast<uint32_t>(split),
                                             static_cast<uint32_t>(chunk), stream);
      return true;
    }
  }
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
    // 16-byte vectors: the cluster two-pass or the resident kernel when the group fits.
    if constexpr (kVec * sizeof(T) == 16) {
      cudaError_t err = cudaSuccess;
      if (try_split<T, kVec>(a, stream, err)) return err;
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
              .eps = static_cast<float>(eps),
              .pdl = ctx.pdl()};
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
