// Scratch: diffusion.group_norm_silu variants on H200 (sm_90).
//   nvcc -O3 -arch=sm_90 -std=c++17 gns_bench.cu -o gns && ./gns
//
// out = silu(group_norm(x) * weight[c] + bias[c]), x [N, C, L] bf16, G groups, eps 1e-5.
// A group (n, g) is one contiguous run of C/G * L elements (group_vecs 16-byte vectors).
//
// Why the kreg resident kernel (v0) may reach only ~51% of copy (a hypothesis this file
// tests): every block loads its chunk, then does two block + cluster reductions, then
// computes and stores. Estimated from the PTX (no SASS tools here), the epilogue is ~15-20
// issue slots an element (expf ~8 instructions, __fdividef 2-3, conversions, affine,
// pack) and 2 MUFU ops (ex2 + rcp at 16/clk/SM); at 4.2 TB/s an SM sub-partition has ~32
// cycles for each 32 elements (one warp instruction's worth), so the epilogue is a large
// part of the budget and runs only in the store phase. With ~2 blocks/SM that start
// together and have identical work, the DRAM idles while the SMs compute and the SMs idle
// while the loads are in flight.
//
// Variants (each a self-contained kernel):
//   v0 resident 512x8, exact math   faithful copy of kreg's resident kernel and launch shape
//   v1 resident 512x8, fast math    same, epilogue = one FFMA + ex2.approx + rcp.approx
//   v2 resident 256x4, 5 blocks/SM  fast math, split x4: more, smaller blocks in different phases
//   v3 resident 256x8, 4 blocks/SM  fast math, split x2: 256-thread blocks, same bytes per SM
//   v4 L2 two-pass in a cluster     pass 1 shifted sums (evict_last), one cluster reduction,
//                                   pass 2 re-reads the chunk from L2; nothing held, 6/SM
//   v5 TMA chunk in shared memory   cp.async.bulk loads the chunk to smem, stats from smem,
//                                   normalize in place, cp.async.bulk store; ~6 blocks x 32 KB
//   v6 lagged pipeline (1 kernel)   block t (atomic ticket): stats of chunk t (DRAM), then
//                                   normalizes chunk t-D (L2), D ~ 1.5 waves: every block both
//                                   reads and writes; partials published with release/acquire
//   v7 two kernels per L2 slab      stats kernel + normalize kernel for <= 16 MB of groups
//   v8 = v4 with tanh.approx SiLU   silu(z) = h + h*tanh(h), h = z/2: 1 MUFU, 3 instructions;
//                                   NOT bf16-faithful where z << 0 (tanh.approx ~2^-11 abs
//                                   error times |z|/2): looser tolerance, reported as APPROX
//
// Checks: (1) five small shapes (partial warps, channel boundaries inside chunks, uneven
// splits, clusters of 5/10/16) against the CPU reference of plugins/diffusion/reference.cpp
// (double statistics, fp32 element math): |d| <= 1e-2 |ref| + 1e-3. (2) On the three SD
// shapes: the same CPU check, and |d| <= 2^-7 max(|a|,|v0|) + 2^-16 against v0's output
// (one bf16 rounding step), max abs diff reported; one more run must give the same bits.
// Outputs are filled with NaN before each checked run. Inputs: fixed-seed random x with
// per-(n, c) mean in [-3, 3] and spread in [0.5, 2], weight in [-1.5, 1.5], bias in [-1, 1].
// Timing: CUDA events around each call, median of 30, rotating over >= 256 MB of
// input/output sets; the copy kernel is timed the same way on the same buffers.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t err_ = (x);                                                                     \
    if (err_ != cudaSuccess) {                                                                  \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_), __FILE__, __LINE__, \
                  #x);                                                                          \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

// ============================================================================
// kreg device helpers, copied (trimmed to what is used) from core/include/kreg/device/
// ============================================================================
namespace kd {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float kIdentity = 0.0f;
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullWarpMask, v, offset));
  }
  return v;
}

template <int N, typename Op>
__device__ __forceinline__ void block_row_reduce(float (&v)[N], Op op, float* scratch) {
  const int width = static_cast<int>(blockDim.x);
  if (width <= kWarpSize) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = warp_reduce(v[i], op, width);
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warps_per_row = width / kWarpSize;
  const int first_warp = static_cast<int>(threadIdx.y) * warps_per_row;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = warp_reduce(v[i], op);
    if (lane == 0)
      scratch[i * kWarpSize + first_warp + static_cast<int>(threadIdx.x) / kWarpSize] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = lane < warps_per_row ? scratch[i * kWarpSize + first_warp + lane] : Op::kIdentity;
    v[i] = warp_reduce(v[i], op);
  }
}

template <typename Op>
__device__ __forceinline__ float block_row_reduce(float v, Op op, float* scratch) {
  float one[1] = {v};
  block_row_reduce(one, op, scratch);
  return one[0];
}
__device__ __forceinline__ float block_row_sum(float v, float* scratch) {
  return block_row_reduce(v, SumOp{}, scratch);
}
template <int N>
__device__ __forceinline__ void block_row_sum(float (&v)[N], float* scratch) {
  block_row_reduce(v, SumOp{}, scratch);
}

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  FastDivisor() = default;
  __host__ __device__ explicit FastDivisor(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    multiplier =
        static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return (__umulhi(n, multiplier) + n) >> shift;
  }
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float_again(__nv_bfloat16 v) {
  float f;
  asm volatile("mov.b32 %0, {%1, %2};" : "=f"(f) : "h"(uint16_t{0}), "h"(__bfloat16_as_ushort(v)));
  return f;
}

template <typename T, int N>
struct vec_t {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static constexpr int kWordBytes = kBytes < 16 ? kBytes : 16;
  static_assert(kWordBytes == 16, "this copy keeps only the 16-byte forms");
  using Word = uint4;
  static constexpr int kWords = kBytes / kWordBytes;

  alignas(kWordBytes) T data[N];

  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }

  __device__ __forceinline__ void load_stream(const T* ptr) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(data)[w] = __ldcs(reinterpret_cast<const Word*>(ptr) + w);
    }
  }
  __device__ __forceinline__ void store_stream(T* ptr) const {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      __stcs(reinterpret_cast<Word*>(ptr) + w, reinterpret_cast<const Word*>(data)[w]);
    }
  }
  // float -> bf16 pairs (the only cast the kernels use).
  template <typename U>
  __device__ __forceinline__ void cast_from(const vec_t<U, N>& src) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      *reinterpret_cast<__nv_bfloat162*>(&data[i]) =
          __float22bfloat162_rn(make_float2(src.data[i], src.data[i + 1]));
    }
  }
};
// vec_t<float, 8> is 32 bytes: only used as an array of floats.
template <>
struct vec_t<float, 8> {
  float data[8];
  __device__ __forceinline__ float& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const float& operator[](int i) const { return data[i]; }
};

}  // namespace kd

using kd::FastDivisor;
using kd::vec_t;

// ============================================================================
// Epilogue math. kMath 0: kreg's (x - mean) * (w * rstd) + b, z / (1 + expf(-z)).
// kMath 1: y = x * p + q (p = w * rstd, q = b - mean * p), z / (1 + 2^(-z log2 e)) with
// ex2.approx.ftz + rcp.approx.ftz (both ~1-2 ulp; 5 instructions, 2 MUFU).
// kMath 2: h = x * p/2 + q/2, silu = h + h * tanh.approx(h) (3 instructions, 1 MUFU).
// ============================================================================
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + expf(-z)); }

__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float tanh_approx(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// z < -88: 2^(127+) = inf, rcp(inf) = 0, z * 0 = -0 (SiLU's limit).
__device__ __forceinline__ float silu_fast(float z) {
  return z * rcp_approx(1.0f + ex2_approx(z * -1.4426950408889634f));
}

struct Epi {
  float p, q, m;
};
template <int kMath>
__device__ __forceinline__ Epi make_epi(float w_rstd, float b, float mean) {
  if constexpr (kMath == 0) {
    return {w_rstd, b, mean};
  } else if constexpr (kMath == 1) {
    return {w_rstd, fmaf(-mean, w_rstd, b), 0.0f};
  } else {
    return {0.5f * w_rstd, 0.5f * fmaf(-mean, w_rstd, b), 0.0f};
  }
}
template <int kMath>
__device__ __forceinline__ float apply_epi(float xf, const Epi& e) {
  if constexpr (kMath == 0) {
    return silu((xf - e.m) * e.p + e.q);
  } else if constexpr (kMath == 1) {
    return silu_fast(fmaf(xf, e.p, e.q));
  } else {
    const float h = fmaf(xf, e.p, e.q);
    return fmaf(h, tanh_approx(h), h);
  }
}

// bf16 pairs in a 32-bit word: element 2i in the low half.
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  const __nv_bfloat162_raw r = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}
template <int kMath>
__device__ __forceinline__ uint32_t norm_word(uint32_t w, const Epi& e) {
  return pack_bf2(apply_epi<kMath>(bf_lo(w), e), apply_epi<kMath>(bf_hi(w), e));
}
template <int kMath>
__device__ __forceinline__ uint4 norm_vec(const uint4& q, const Epi& e) {
  return make_uint4(norm_word<kMath>(q.x, e), norm_word<kMath>(q.y, e), norm_word<kMath>(q.z, e),
                    norm_word<kMath>(q.w, e));
}
// s1 += x - x0, s2 += (x - x0)^2 over the 8 elements of q.
__device__ __forceinline__ void acc_shifted(const uint4& q, float x0, float& s1, float& s2) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float d = bf_lo(w[i]) - x0;
    s1 += d;
    s2 = fmaf(d, d, s2);
    d = bf_hi(w[i]) - x0;
    s1 += d;
    s2 = fmaf(d, d, s2);
  }
}
__device__ __forceinline__ float acc_sum(const uint4& q, float s) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) s += bf_lo(w[i]) + bf_hi(w[i]);
  return s;
}
__device__ __forceinline__ float acc_sqdev(const uint4& q, float mean, float s) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = bf_lo(w[i]) - mean, b = bf_hi(w[i]) - mean;
    s = fmaf(a, a, s);
    s = fmaf(b, b, s);
  }
  return s;
}

// ---- cache-policy loads, cluster barrier halves, release/acquire flags ----
__device__ __forceinline__ uint64_t policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// x is never written by these kernels: the non-coherent path is safe.
__device__ __forceinline__ uint4 ld_hint(const uint4* ptr, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr), "l"(pol));
  return v;
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- TMA (cp.async.bulk) and mbarrier ----
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bulk_s2g(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ============================================================================
// v0-v3: kreg's resident kernel (plugins/diffusion/group_norm_silu.cu), copied verbatim
// except that the launch bounds and the epilogue math are template parameters
// (kThreads = 512, kMinBlocks = 2, kMath = 0 is the kreg kernel).
// ============================================================================
__device__ __forceinline__ float group_sum(float v, float* scratch, float* partial,
                                           uint32_t split) {
  v = kd::block_row_sum(v, scratch);
  if (split == 1) return v;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *partial = v;
  cluster.sync();
  float total = 0.0f;
  for (uint32_t r = 0; r < split; ++r) total += *cluster.map_shared_rank(partial, r);
  return total;
}

template <typename T, int kVec, int kItems, int kThreads, int kMinBlocks, int kMath>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    resident_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                    const T* __restrict__ bias, T* __restrict__ out, uint32_t groups,
                    uint32_t channels_per_group, FastDivisor vecs_per_channel, uint32_t group_vecs,
                    uint32_t chunk_vecs, uint32_t split, float eps) {
  __shared__ float scratch_mean[kd::kWarpSize];
  __shared__ float scratch_var[kd::kWarpSize];
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
      for (int j = 0; j < kVec; ++j) sum += kd::to_float(held[k][j]);
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
        const float d = kd::to_float_again(held[k][j]) - mean;
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
      const float w = kd::to_float(__ldg(weight + c)) * rstd;
      const float b = kd::to_float(__ldg(bias + c));
      vec_t<float, kVec> y;
      if constexpr (kMath == 0) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          y[j] = silu((kd::to_float_again(held[k][j]) - mean) * w + b);
        }
      } else {
        const Epi e = make_epi<kMath>(w, b, mean);
#pragma unroll
        for (int j = 0; j < kVec; ++j) y[j] = apply_epi<kMath>(kd::to_float_again(held[k][j]), e);
      }
      vec_t<T, kVec> raw;
      raw.cast_from(y);
      raw.store_stream(og + static_cast<int64_t>(v) * kVec);
    }
  }
  // No block may leave (freeing its shared memory) while another block of its
  // cluster can still read its partial sums.
  if (split > 1) cg::this_cluster().sync();
}

// ============================================================================
// v4 / v8: two passes within a cluster, the second from L2. The chunk is streamed in
// batches of kItems vectors a thread (nothing is held across the reduction, so ~40
// registers and 6+ blocks per SM); pass 1 accumulates sums of x - x0 (x0 = the group's
// first element, the same shift in every block of the group, so the partials add up)
// with an L2 evict_last hint, one block + cluster reduction, pass 2 re-reads the chunk
// (L2 hit, evict_first) and streams the result out. The DSMEM lifetime barrier is split
// (arrive right after the partials are read, wait before exit).
// ============================================================================
__device__ __forceinline__ void cluster_sum2(float (&s)[2], float* scratch, float* partial,
                                             uint32_t split) {
  kd::block_row_sum(s, scratch);
  if (split == 1) return;
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
  cluster_arrive_release();  // matched by cluster_wait_acquire() before the block exits
}

template <int kItems, int kThreads, int kMinBlocks, int kMath>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    l2_cluster_kernel(const bf16* __restrict__ x, const bf16* __restrict__ weight,
                      const bf16* __restrict__ bias, bf16* __restrict__ out, uint32_t groups,
                      uint32_t cpg, FastDivisor vpc, uint32_t group_vecs, uint32_t chunk_vecs,
                      uint32_t split, float eps) {
  __shared__ float scratch[2 * kd::kWarpSize];
  __shared__ float partial[2];
  const uint32_t tid = threadIdx.x;
  const uint32_t group = blockIdx.x / split;
  const uint32_t part = blockIdx.x - group * split;
  const uint32_t begin = part * chunk_vecs;
  const uint32_t end = min(begin + chunk_vecs, group_vecs);
  const uint4* xg = reinterpret_cast<const uint4*>(x) + static_cast<size_t>(group) * group_vecs;
  uint4* og = reinterpret_cast<uint4*>(out) + static_cast<size_t>(group) * group_vecs;
  const float x0 = kd::to_float(__ldg(x + static_cast<size_t>(group) * group_vecs * 8));

  const uint64_t keep = policy_evict_last();
  float s[2] = {0.0f, 0.0f};
  for (uint32_t v0 = begin + tid; v0 < end; v0 += kItems * kThreads) {
    uint4 buf[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = v0 + k * kThreads;
      if (v < end) buf[k] = ld_hint(xg + v, keep);
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (v0 + k * kThreads < end) acc_shifted(buf[k], x0, s[0], s[1]);
    }
  }
  cluster_sum2(s, scratch, partial, split);
  const float inv_n = 1.0f / static_cast<float>(static_cast<int64_t>(group_vecs) * 8);
  const float md = s[0] * inv_n;
  const float var = fmaxf(s[1] * inv_n - md * md, 0.0f);
  const float mean = x0 + md;
  const float rstd = rsqrtf(var + eps);

  const uint64_t drop = policy_evict_first();
  const uint32_t first_channel = (group % groups) * cpg;
  for (uint32_t v0 = begin + tid; v0 < end; v0 += kItems * kThreads) {
    uint4 buf[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = v0 + k * kThreads;
      if (v < end) buf[k] = ld_hint(xg + v, drop);
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = v0 + k * kThreads;
      if (v < end) {
        const uint32_t c = first_channel + vpc.div(v);
        const float w = kd::to_float(__ldg(weight + c)) * rstd;
        const float b = kd::to_float(__ldg(bias + c));
        __stcs(og + v, norm_vec<kMath>(buf[k], make_epi<kMath>(w, b, mean)));
      }
    }
  }
  if (split > 1) cluster_wait_acquire();
}

// ============================================================================
// v5: the chunk lives in shared memory. One thread issues cp.async.bulk copies of the
// chunk into dynamic smem (an mbarrier counts the bytes), the exact two-pass statistics
// (as v0) read smem, the normalized result overwrites smem in place, and one thread
// stores the chunk with cp.async.bulk (waits only until smem has been read). Registers
// hold nothing: 256 threads, ~6 blocks x 32 KB of data per SM (v0: 2 x 64 KB).
// ============================================================================
constexpr uint32_t kBulkPiece = 4096;  // bytes per cp.async.bulk instruction

template <int kThreads, int kMinBlocks, int kMath>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    tma_kernel(const bf16* __restrict__ x, const bf16* __restrict__ weight,
               const bf16* __restrict__ bias, bf16* __restrict__ out, uint32_t groups, uint32_t cpg,
               FastDivisor vpc, uint32_t group_vecs, uint32_t chunk_vecs, uint32_t split,
               float eps) {
  extern __shared__ __align__(128) uint4 sdata[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ float scratch_mean[kd::kWarpSize];
  __shared__ float scratch_var[kd::kWarpSize];
  __shared__ float partial[2];
  const uint32_t tid = threadIdx.x;
  const uint32_t group = blockIdx.x / split;
  const uint32_t part = blockIdx.x - group * split;
  const uint32_t begin = part * chunk_vecs;
  const uint32_t end = min(begin + chunk_vecs, group_vecs);
  const uint32_t n = end > begin ? end - begin : 0;
  const uint32_t bytes = n * 16u;
  const uint4* xc =
      reinterpret_cast<const uint4*>(x) + static_cast<size_t>(group) * group_vecs + begin;
  uint4* oc = reinterpret_cast<uint4*>(out) + static_cast<size_t>(group) * group_vecs + begin;
  const uint32_t bar_addr = smem_u32(&bar);
  const uint32_t s_addr = smem_u32(sdata);

  if (tid == 0) {
    mbar_init(bar_addr, 1);
    fence_mbar_init();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect_tx(bar_addr, bytes);
    for (uint32_t off = 0; off < bytes; off += kBulkPiece) {
      bulk_g2s(s_addr + off, reinterpret_cast<const char*>(xc) + off, min(kBulkPiece, bytes - off),
               bar_addr);
    }
  }
  while (!mbar_try_wait(bar_addr, 0)) {
  }

  float sum = 0.0f;
  for (uint32_t v = tid; v < n; v += kThreads) sum = acc_sum(sdata[v], sum);
  const float inv_n = 1.0f / static_cast<float>(static_cast<int64_t>(group_vecs) * 8);
  const float mean = group_sum(sum, scratch_mean, &partial[0], split) * inv_n;
  float sq = 0.0f;
  for (uint32_t v = tid; v < n; v += kThreads) sq = acc_sqdev(sdata[v], mean, sq);
  const float var = group_sum(sq, scratch_var, &partial[1], split) * inv_n;
  if (split > 1) cluster_arrive_release();  // remote partials read; wait before exit
  const float rstd = rsqrtf(var + eps);

  const uint32_t first_channel = (group % groups) * cpg;
  for (uint32_t v = tid; v < n; v += kThreads) {
    const uint32_t c = first_channel + vpc.div(begin + v);
    const float w = kd::to_float(__ldg(weight + c)) * rstd;
    const float b = kd::to_float(__ldg(bias + c));
    sdata[v] = norm_vec<kMath>(sdata[v], make_epi<kMath>(w, b, mean));
  }
  fence_proxy_async_smem();  // generic-proxy smem writes -> visible to the bulk copy
  __syncthreads();
  if (tid == 0) {
    for (uint32_t off = 0; off < bytes; off += kBulkPiece) {
      bulk_s2g(reinterpret_cast<char*>(oc) + off, s_addr + off, min(kBulkPiece, bytes - off));
    }
    bulk_commit();
    bulk_wait_read_all();  // smem must stay until the copies have read it
  }
  if (split > 1) cluster_wait_acquire();
}

// ============================================================================
// v6: lagged single-kernel pipeline. Chunks are numbered group-major (t = group * split +
// part). Block with ticket t (atomicAdd on a counter that is never reset; the host passes
// the value it had before this launch) loads chunk t (DRAM, evict_last) and chunk t - lag
// (read by ticket t - lag earlier, so an L2 hit; evict_first), reduces chunk t's shifted
// sums and publishes them (partials[t], then flags[t] = epoch with st.release), then
// waits (ld.acquire) for the `split` flags of chunk t - lag's group, adds those partials
// in rank order (every chunk of a group gets the same bits) and normalizes + stores.
// lag >= split, so every flag waited on belongs to a smaller ticket, i.e. to a block that
// is already resident and publishes before it waits: no deadlock. The L2 working set is
// ~lag chunks (1.5 waves). Every block does a DRAM read and a DRAM write, so reads and
// writes overlap by construction. A spin limit turns a hang into a reported error.
// ============================================================================
constexpr int kLagMaxSplit = 64;

template <int kItems, int kThreads, int kMinBlocks, int kMath>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    lagged_kernel(const bf16* __restrict__ x, const bf16* __restrict__ weight,
                  const bf16* __restrict__ bias, bf16* __restrict__ out, uint32_t groups,
                  uint32_t cpg, FastDivisor vpc, uint32_t group_vecs, uint32_t chunk_vecs,
                  uint32_t split, uint32_t n_chunks, uint32_t lag, float eps,
                  unsigned long long* __restrict__ ticket_counter, unsigned long long ticket_base,
                  uint32_t epoch, uint32_t* __restrict__ flags, float2* __restrict__ partials,
                  int* __restrict__ error) {
  __shared__ uint32_t s_ticket;
  __shared__ float scratch[2 * kd::kWarpSize];
  __shared__ float2 s_part[kLagMaxSplit];
  const uint32_t tid = threadIdx.x;
  if (tid == 0) s_ticket = static_cast<uint32_t>(atomicAdd(ticket_counter, 1ull) - ticket_base);
  __syncthreads();
  const uint32_t t = s_ticket;
  const bool do_stats = t < n_chunks;
  const bool do_norm = t >= lag && t - lag < n_chunks;
  const uint4* x4 = reinterpret_cast<const uint4*>(x);

  const uint32_t sc = do_stats ? t : 0;
  const uint32_t sgrp = sc / split;
  const uint32_t sbegin = (sc - sgrp * split) * chunk_vecs;
  const uint32_t send = min(sbegin + chunk_vecs, group_vecs);
  const uint4* xs = x4 + static_cast<size_t>(sgrp) * group_vecs;
  const uint32_t nc = do_norm ? t - lag : 0;
  const uint32_t ngrp = nc / split;
  const uint32_t nbegin = (nc - ngrp * split) * chunk_vecs;
  const uint32_t nend = min(nbegin + chunk_vecs, group_vecs);
  const uint4* xn = x4 + static_cast<size_t>(ngrp) * group_vecs;
  uint4* on = reinterpret_cast<uint4*>(out) + static_cast<size_t>(ngrp) * group_vecs;

  uint4 a[kItems], q[kItems];
  if (do_stats) {
    const uint64_t keep = policy_evict_last();
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = sbegin + tid + k * kThreads;
      if (v < send) a[k] = ld_hint(xs + v, keep);
    }
  }
  if (do_norm) {
    const uint64_t drop = policy_evict_first();
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = nbegin + tid + k * kThreads;
      if (v < nend) q[k] = ld_hint(xn + v, drop);
    }
  }
  float s[2] = {0.0f, 0.0f};
  if (do_stats) {
    const float x0 = kd::to_float(__ldg(x + static_cast<size_t>(sgrp) * group_vecs * 8));
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (sbegin + tid + k * kThreads < send) acc_shifted(a[k], x0, s[0], s[1]);
    }
  }
  kd::block_row_sum(s, scratch);
  if (do_stats && tid == 0) {
    partials[t] = make_float2(s[0], s[1]);
    st_release(flags + t, epoch);
  }
  if (do_norm) {
    const uint32_t c0 = ngrp * split;
    for (uint32_t r = tid; r < split; r += kThreads) {
      uint32_t spins = 0;
      while (ld_acquire(flags + c0 + r) != epoch) {
        __nanosleep(32);
        if (++spins > (1u << 20)) {  // healthy waits are a few hundred polls
          atomicExch(error, 1);
          break;
        }
      }
      s_part[r] = __ldcg(partials + c0 + r);
    }
    __syncthreads();
    float S0 = 0.0f, S1 = 0.0f;
    for (uint32_t r = 0; r < split; ++r) {
      S0 += s_part[r].x;
      S1 += s_part[r].y;
    }
    const float x0 = kd::to_float(__ldg(x + static_cast<size_t>(ngrp) * group_vecs * 8));
    const float inv_n = 1.0f / static_cast<float>(static_cast<int64_t>(group_vecs) * 8);
    const float md = S0 * inv_n;
    const float var = fmaxf(S1 * inv_n - md * md, 0.0f);
    const float mean = x0 + md;
    const float rstd = rsqrtf(var + eps);
    const uint32_t first_channel = (ngrp % groups) * cpg;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = nbegin + tid + k * kThreads;
      if (v < nend) {
        const uint32_t c = first_channel + vpc.div(v);
        const float w = kd::to_float(__ldg(weight + c)) * rstd;
        const float b = kd::to_float(__ldg(bias + c));
        __stcs(on + v, norm_vec<kMath>(q[k], make_epi<kMath>(w, b, mean)));
      }
    }
  }
}

// ============================================================================
// v7: two kernels per slab of groups small enough (<= 16 MB of x) to stay in L2 between
// them: a statistics kernel (one block per chunk writes its shifted sums) and a
// normalize kernel (adds its group's partials in rank order, re-reads the chunk).
// ============================================================================
template <int kItems, int kThreads>
__global__ void __launch_bounds__(kThreads)
    slab_stats_kernel(const bf16* __restrict__ x, uint32_t group_vecs, uint32_t chunk_vecs,
                      uint32_t split, uint32_t chunk0, float2* __restrict__ partials) {
  __shared__ float scratch[2 * kd::kWarpSize];
  const uint32_t tid = threadIdx.x;
  const uint32_t c = chunk0 + blockIdx.x;
  const uint32_t group = c / split;
  const uint32_t begin = (c - group * split) * chunk_vecs;
  const uint32_t end = min(begin + chunk_vecs, group_vecs);
  const uint4* xg = reinterpret_cast<const uint4*>(x) + static_cast<size_t>(group) * group_vecs;
  const float x0 = kd::to_float(__ldg(x + static_cast<size_t>(group) * group_vecs * 8));
  const uint64_t keep = policy_evict_last();
  float s[2] = {0.0f, 0.0f};
  for (uint32_t v0 = begin + tid; v0 < end; v0 += kItems * kThreads) {
    uint4 buf[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = v0 + k * kThreads;
      if (v < end) buf[k] = ld_hint(xg + v, keep);
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (v0 + k * kThreads < end) acc_shifted(buf[k], x0, s[0], s[1]);
    }
  }
  kd::block_row_sum(s, scratch);
  if (tid == 0) partials[c] = make_float2(s[0], s[1]);
}

template <int kItems, int kThreads, int kMath>
__global__ void __launch_bounds__(kThreads)
    slab_norm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ weight,
                     const bf16* __restrict__ bias, bf16* __restrict__ out, uint32_t groups,
                     uint32_t cpg, FastDivisor vpc, uint32_t group_vecs, uint32_t chunk_vecs,
                     uint32_t split, uint32_t chunk0, const float2* __restrict__ partials,
                     float eps) {
  __shared__ float2 s_part[kLagMaxSplit];
  const uint32_t tid = threadIdx.x;
  const uint32_t c = chunk0 + blockIdx.x;
  const uint32_t group = c / split;
  const uint32_t begin = (c - group * split) * chunk_vecs;
  const uint32_t end = min(begin + chunk_vecs, group_vecs);
  for (uint32_t r = tid; r < split; r += kThreads) s_part[r] = partials[group * split + r];
  __syncthreads();
  float S0 = 0.0f, S1 = 0.0f;
  for (uint32_t r = 0; r < split; ++r) {
    S0 += s_part[r].x;
    S1 += s_part[r].y;
  }
  const float x0 = kd::to_float(__ldg(x + static_cast<size_t>(group) * group_vecs * 8));
  const float inv_n = 1.0f / static_cast<float>(static_cast<int64_t>(group_vecs) * 8);
  const float md = S0 * inv_n;
  const float var = fmaxf(S1 * inv_n - md * md, 0.0f);
  const float mean = x0 + md;
  const float rstd = rsqrtf(var + eps);
  const uint4* xg = reinterpret_cast<const uint4*>(x) + static_cast<size_t>(group) * group_vecs;
  uint4* og = reinterpret_cast<uint4*>(out) + static_cast<size_t>(group) * group_vecs;
  const uint64_t drop = policy_evict_first();
  const uint32_t first_channel = (group % groups) * cpg;
  for (uint32_t v0 = begin + tid; v0 < end; v0 += kItems * kThreads) {
    uint4 buf[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = v0 + k * kThreads;
      if (v < end) buf[k] = ld_hint(xg + v, drop);
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const uint32_t v = v0 + k * kThreads;
      if (v < end) {
        const uint32_t ch = first_channel + vpc.div(v);
        const float w = kd::to_float(__ldg(weight + ch)) * rstd;
        const float b = kd::to_float(__ldg(bias + ch));
        __stcs(og + v, norm_vec<kMath>(buf[k], make_epi<kMath>(w, b, mean)));
      }
    }
  }
}

// ---- the copy kernel (16 bytes a thread) and a spin kernel that keeps the GPU busy
// while the timed launches are queued ----
__global__ void __launch_bounds__(256)
    copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i < n) out[i] = in[i];
}
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// ============================================================================
// Host side
// ============================================================================
namespace {

struct Shape {
  const char* name;
  int N, C, L, G;
};
struct Geo {
  int64_t cpg, vpc, gv, tg, elems;
};
Geo geo_of(const Shape& s) {
  Geo g;
  g.cpg = s.C / s.G;
  g.vpc = s.L / 8;
  g.gv = g.cpg * g.vpc;
  g.tg = static_cast<int64_t>(s.N) * s.G;
  g.elems = static_cast<int64_t>(s.N) * s.C * s.L;
  return g;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

constexpr float kEps = 1e-5f;
constexpr int kReps = 30;
constexpr int kWarmup = 3;
constexpr uint32_t kWorkspace = 1u << 17;  // flags / partials entries (chunks of one call)

int g_sms = 0;
uint32_t g_epoch = 0;
unsigned long long g_ticket_base = 0;
unsigned long long* g_ticket = nullptr;
uint32_t* g_flags = nullptr;
float2* g_partials = nullptr;
int* g_error = nullptr;

using GnKernel = void (*)(const bf16*, const bf16*, const bf16*, bf16*, uint32_t, uint32_t,
                          FastDivisor, uint32_t, uint32_t, uint32_t, float);

struct Plan {
  bool ok = false;
  std::string note;  // the configuration, or why the variant does not apply
  GnKernel kern = nullptr;
  uint32_t split = 1, chunk = 0, threads = 0, items = 0, grid = 0;
  uint32_t n_chunks = 0, lag = 0, slab_groups = 0;
  size_t smem = 0;
  int occ = 0;
};

struct Dev {
  const bf16* x;
  const bf16* w;
  const bf16* b;
  bf16* out;
};

struct VariantInfo {
  const char* name;
  int math;
};
const VariantInfo kVariants[] = {
    {"v0 resident 512x8 (kreg)", 0}, {"v1 resident 512x8 fast", 1}, {"v2 resident 256x4 fast", 1},
    {"v3 resident 256x8 fast", 1},   {"v4 L2 2-pass cluster", 1},   {"v5 TMA smem chunk", 1},
    {"v6 lagged pipeline", 1},       {"v7 2 kernels / slab", 1},    {"v8 v4 + tanh silu", 2},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

// Minimum blocks per SM for the 256-thread resident kernels: 64 registers at 8 items,
// 48 at 4 (40 spills), 32 below.
template <int kItems>
constexpr int res256_min_blocks() {
  return kItems >= 8 ? 4 : kItems >= 4 ? 5 : 8;
}

GnKernel pick_resident(int vid, int items) {
  switch (vid) {
    case 0:
      switch (items) {
        case 1:
          return resident_kernel<bf16, 8, 1, 512, 2, 0>;
        case 2:
          return resident_kernel<bf16, 8, 2, 512, 2, 0>;
        case 4:
          return resident_kernel<bf16, 8, 4, 512, 2, 0>;
        default:
          return resident_kernel<bf16, 8, 8, 512, 2, 0>;
      }
    case 1:
      switch (items) {
        case 1:
          return resident_kernel<bf16, 8, 1, 512, 2, 1>;
        case 2:
          return resident_kernel<bf16, 8, 2, 512, 2, 1>;
        case 4:
          return resident_kernel<bf16, 8, 4, 512, 2, 1>;
        default:
          return resident_kernel<bf16, 8, 8, 512, 2, 1>;
      }
    default:  // v2, v3: 256 threads
      switch (items) {
        case 1:
          return resident_kernel<bf16, 8, 1, 256, res256_min_blocks<1>(), 1>;
        case 2:
          return resident_kernel<bf16, 8, 2, 256, res256_min_blocks<2>(), 1>;
        case 4:
          return resident_kernel<bf16, 8, 4, 256, res256_min_blocks<4>(), 1>;
        default:
          return resident_kernel<bf16, 8, 8, 256, res256_min_blocks<8>(), 1>;
      }
  }
}

// Sets the attributes a (cluster) launch of p.kern needs and checks that it can run.
void prepare(Plan& p) {
  if (p.split > 8) {
    CK(cudaFuncSetAttribute(p.kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  if (p.smem > 48 * 1024) {
    CK(cudaFuncSetAttribute(p.kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(p.smem)));
  }
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p.occ, p.kern, static_cast<int>(p.threads),
                                                   p.smem));
  if (p.occ == 0) {
    p.ok = false;
    p.note += " [0 blocks/SM]";
    return;
  }
  if (p.split > 1) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p.grid);
    cfg.blockDim = dim3(p.threads);
    cfg.dynamicSmemBytes = p.smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = p.split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, p.kern, &cfg);
        e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it and report the variant as n/a
      p.ok = false;
      p.note += std::string(" [cluster query: ") + cudaGetErrorString(e) + "]";
      return;
    }
    if (clusters == 0) {
      p.ok = false;
      p.note += " [cluster not schedulable]";
      return;
    }
    p.note += " clusters<=" + std::to_string(clusters);
  }
  p.ok = true;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// kreg's try_resident, with the block size, the split limit and the preferred number of
// vectors a thread as parameters (v0: 512, 8, 8).
Plan plan_resident(const Shape& s, int vid, int threads_max, int max_split, int prefer_items) {
  const Geo g = geo_of(s);
  Plan p;
  int64_t block_vecs = int64_t{threads_max} * prefer_items;
  int64_t split = ceil_div(g.gv, block_vecs);
  if (split > max_split && prefer_items < 8) {
    block_vecs = int64_t{threads_max} * 8;
    split = ceil_div(g.gv, block_vecs);
  }
  if (split > max_split) {
    p.note = "group too large for the resident path";
    return p;
  }
  while (split * 2 <= max_split && g.tg * split < 2 * int64_t{g_sms} && g.gv >= split * 2 * 1024) {
    split *= 2;
  }
  const int64_t chunk = round_up(ceil_div(g.gv, split), 32);
  const int items = chunk <= threads_max       ? 1
                    : chunk <= 2 * threads_max ? 2
                    : chunk <= 4 * threads_max ? 4
                                               : 8;
  p.split = static_cast<uint32_t>(split);
  p.chunk = static_cast<uint32_t>(chunk);
  p.items = items;
  p.threads = static_cast<uint32_t>(std::max<int64_t>(32, ceil_div(chunk, items) + 31) / 32 * 32);
  p.grid = static_cast<uint32_t>(g.tg * split);
  p.kern = pick_resident(vid, items);
  p.note = fmt("split %u, %u blk x %u thr x %u vec", p.split, p.grid, p.threads, p.items);
  prepare(p);
  if (p.ok) p.note += fmt(", %d/SM", p.occ);
  return p;
}

// split and chunk for the non-resident kernels: chunks of at most `target` vectors, at
// most `max_split` per group (larger chunks are looped over).
void split_chunks(const Geo& g, int64_t target, int64_t max_split, Plan& p) {
  int64_t split = std::min(ceil_div(g.gv, target), max_split);
  p.split = static_cast<uint32_t>(split);
  p.chunk = static_cast<uint32_t>(round_up(ceil_div(g.gv, split), 32));
}

Plan plan_variant(int vid, const Shape& s) {
  const Geo g = geo_of(s);
  Plan p;
  if (s.L % 8 != 0 || s.C % s.G != 0) {
    p.note = "needs L % 8 == 0";
    return p;
  }
  switch (vid) {
    case 0:
    case 1:
      return plan_resident(s, vid, 512, 8, 8);
    case 2:
      return plan_resident(s, vid, 256, 16, 4);
    case 3:
      return plan_resident(s, vid, 256, 16, 8);
    case 4:
    case 8: {
      split_chunks(g, 1024, 16, p);
      p.threads = 256;
      p.items = 4;
      p.grid = static_cast<uint32_t>(g.tg * p.split);
      p.kern = vid == 4 ? l2_cluster_kernel<4, 256, 6, 1> : l2_cluster_kernel<4, 256, 6, 2>;
      p.note = fmt("split %u, %u blk x 256 thr, chunk %u vec", p.split, p.grid, p.chunk);
      prepare(p);
      if (p.ok) p.note += fmt(", %d/SM", p.occ);
      return p;
    }
    case 5: {
      split_chunks(g, 2048, 16, p);
      p.threads = 256;
      p.grid = static_cast<uint32_t>(g.tg * p.split);
      p.smem = size_t{p.chunk} * 16;
      if (p.smem > 200 * 1024) {
        p.note = "chunk too large for shared memory";
        return p;
      }
      p.kern = tma_kernel<256, 6, 1>;
      p.note = fmt("split %u, %u blk x 256 thr, %zu B smem", p.split, p.grid, p.smem);
      prepare(p);
      if (p.ok) p.note += fmt(", %d/SM", p.occ);
      return p;
    }
    case 6:
    case 7: {
      const int64_t split = ceil_div(g.gv, 1024);
      if (split > kLagMaxSplit) {
        p.note = "group too large";
        return p;
      }
      split_chunks(g, 1024, kLagMaxSplit, p);
      p.threads = 256;
      p.items = 4;
      if (p.chunk > p.threads * p.items) {  // v6 loads its chunk in one batch
        p.note = "chunk larger than one batch";
        return p;
      }
      p.n_chunks = static_cast<uint32_t>(g.tg * p.split);
      if (p.n_chunks > kWorkspace) {
        p.note = "too many chunks for the workspace";
        return p;
      }
      if (vid == 6) {
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p.occ, lagged_kernel<4, 256, 4, 1>, 256,
                                                         0));
        const int64_t resident = int64_t{p.occ} * g_sms;
        p.lag = static_cast<uint32_t>(
            std::min<int64_t>(p.n_chunks, std::max<int64_t>(p.split, resident * 3 / 2 + p.split)));
        p.grid = p.n_chunks + p.lag;
        p.note = fmt("split %u, %u chunks of %u vec, lag %u (%.1f MB), %d/SM", p.split, p.n_chunks,
                     p.chunk, p.lag, p.lag * p.chunk * 16.0 / 1e6, p.occ);
      } else {
        const int64_t group_bytes = g.gv * 16;
        p.slab_groups = static_cast<uint32_t>(std::max<int64_t>(1, (16 << 20) / group_bytes));
        const int64_t slabs = ceil_div(g.tg, p.slab_groups);
        p.note =
            fmt("split %u, chunk %u vec, %lld slabs of %u groups (%lld launches)", p.split, p.chunk,
                static_cast<long long>(slabs), p.slab_groups, static_cast<long long>(2 * slabs));
      }
      p.ok = true;
      return p;
    }
    default:
      p.note = "unknown variant";
      return p;
  }
}

cudaError_t launch_gn(const Plan& p, const Shape& s, const Geo& g, const Dev& d, cudaStream_t st) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.grid);
  cfg.blockDim = dim3(p.threads);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  if (p.split > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = p.split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, p.kern, d.x, d.w, d.b, d.out, static_cast<uint32_t>(s.G),
                            static_cast<uint32_t>(g.cpg), FastDivisor(static_cast<uint32_t>(g.vpc)),
                            static_cast<uint32_t>(g.gv), p.chunk, p.split, kEps);
}

cudaError_t launch_variant(int vid, const Plan& p, const Shape& s, const Dev& d, cudaStream_t st) {
  const Geo g = geo_of(s);
  const FastDivisor vpc(static_cast<uint32_t>(g.vpc));
  if (vid == 6) {
    const uint32_t epoch = ++g_epoch;
    const unsigned long long base = g_ticket_base;
    g_ticket_base += p.grid;
    lagged_kernel<4, 256, 4, 1><<<p.grid, 256, 0, st>>>(
        d.x, d.w, d.b, d.out, static_cast<uint32_t>(s.G), static_cast<uint32_t>(g.cpg), vpc,
        static_cast<uint32_t>(g.gv), p.chunk, p.split, p.n_chunks, p.lag, kEps, g_ticket, base,
        epoch, g_flags, g_partials, g_error);
    return cudaGetLastError();
  }
  if (vid == 7) {
    for (int64_t g0 = 0; g0 < g.tg; g0 += p.slab_groups) {
      const int64_t ng = std::min<int64_t>(p.slab_groups, g.tg - g0);
      const auto c0 = static_cast<uint32_t>(g0 * p.split);
      const auto blocks = static_cast<uint32_t>(ng * p.split);
      slab_stats_kernel<4, 256><<<blocks, 256, 0, st>>>(d.x, static_cast<uint32_t>(g.gv), p.chunk,
                                                        p.split, c0, g_partials);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      slab_norm_kernel<4, 256, 1><<<blocks, 256, 0, st>>>(
          d.x, d.w, d.b, d.out, static_cast<uint32_t>(s.G), static_cast<uint32_t>(g.cpg), vpc,
          static_cast<uint32_t>(g.gv), p.chunk, p.split, c0, g_partials, kEps);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  return launch_gn(p, s, g, d, st);
}

// ---- host data, reference, comparison ----
float bf2f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uni() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0,1)
};

// x[n, c, :] ~ mu(n, c) + sigma(n, c) * (approximately normal), weight in [-1.5, 1.5],
// bias in [-1, 1]: channels of one group differ in mean and spread.
void make_inputs(const Shape& s, uint64_t seed, std::vector<uint16_t>& x, std::vector<uint16_t>& w,
                 std::vector<uint16_t>& b) {
  Rng r{seed};
  const Geo g = geo_of(s);
  x.resize(static_cast<size_t>(g.elems));
  w.resize(s.C);
  b.resize(s.C);
  for (int c = 0; c < s.C; ++c) {
    w[c] = f2bf(1.5f * (2.0f * r.uni() - 1.0f));
    b[c] = f2bf(2.0f * r.uni() - 1.0f);
  }
  for (int64_t nc = 0; nc < int64_t{s.N} * s.C; ++nc) {
    const float mu = 3.0f * (2.0f * r.uni() - 1.0f);
    const float sigma = 0.5f + 1.5f * r.uni();
    uint16_t* row = x.data() + nc * s.L;
    for (int i = 0; i < s.L; ++i) {
      const uint64_t z = r.next();
      const float u1 = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
      const float u2 = static_cast<float>(z & 0xffffffu) * (1.0f / 16777216.0f);
      row[i] = f2bf(mu + sigma * 2.449f * (u1 + u2 - 1.0f));  // triangular, unit variance
    }
  }
}

// plugins/diffusion/reference.cpp: double statistics, fp32 element math, one rounding.
void cpu_reference(const Shape& s, const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                   const std::vector<uint16_t>& b, std::vector<uint16_t>& out) {
  const Geo g = geo_of(s);
  const int64_t group_elems = g.cpg * s.L;
  out.resize(x.size());
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t grp = 0; grp < s.G; ++grp) {
      const int64_t base = (n * s.C + grp * g.cpg) * s.L;
      double sum = 0;
      for (int64_t i = 0; i < group_elems; ++i) sum += bf2f(x[base + i]);
      const double mean = sum / static_cast<double>(group_elems);
      double sq = 0;
      for (int64_t i = 0; i < group_elems; ++i) {
        const double d = bf2f(x[base + i]) - mean;
        sq += d * d;
      }
      const auto fmean = static_cast<float>(mean);
      const float rstd =
          1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(group_elems)) + kEps);
      for (int64_t i = 0; i < group_elems; ++i) {
        const int64_t c = grp * g.cpg + i / s.L;
        const float y = (bf2f(x[base + i]) - fmean) * rstd * bf2f(w[c]) + bf2f(b[c]);
        out[base + i] = f2bf(y / (1.0f + std::exp(-y)));
      }
    }
  }
}

struct Diff {
  double max_abs = 0, max_rel = 0;
  size_t bad = 0;
};
// ulp_mode: |a - b| <= 2^-7 max(|a|, |b|) + 2^-16 (one bf16 rounding step, with a floor for
// values near 0); otherwise |a - b| <= rtol |b| + atol. NaN anywhere is bad.
Diff compare(const uint16_t* a, const uint16_t* b, size_t n, bool ulp_mode, double rtol,
             double atol) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    const double fa = bf2f(a[i]), fb = bf2f(b[i]);
    if (std::isnan(fa) || std::isnan(fb)) {
      ++d.bad;
      continue;
    }
    const double e = std::fabs(fa - fb);
    d.max_abs = std::max(d.max_abs, e);
    if (std::fabs(fb) > 1e-2) d.max_rel = std::max(d.max_rel, e / std::fabs(fb));
    const double tol =
        ulp_mode ? std::ldexp(std::max(std::fabs(fa), std::fabs(fb)), -7) + std::ldexp(1.0, -16)
                 : rtol * std::fabs(fb) + atol;
    if (e > tol) ++d.bad;
  }
  return d;
}
double cpu_rtol(int vid) { return kVariants[vid].math == 2 ? 2e-2 : 1e-2; }
double cpu_atol(int vid) { return kVariants[vid].math == 2 ? 1e-2 : 1e-3; }

// Runs the variant once on d (out pre-filled with NaN), checks the launch and v6's hang
// flag; false on a device-side failure.
bool run_once(int vid, const Plan& p, const Shape& s, const Dev& d, size_t out_bytes,
              cudaStream_t st) {
  CK(cudaMemsetAsync(d.out, 0xff, out_bytes, st));
  CK(launch_variant(vid, p, s, d, st));
  CK(cudaStreamSynchronize(st));
  int err = 0;
  CK(cudaMemcpy(&err, g_error, sizeof err, cudaMemcpyDeviceToHost));
  if (err != 0) {
    CK(cudaMemset(g_error, 0, sizeof err));
    CK(cudaDeviceSynchronize());
    return false;
  }
  return true;
}

struct Timer {
  cudaEvent_t e0[kReps], e1[kReps];
  Timer() {
    for (int r = 0; r < kReps; ++r) {
      CK(cudaEventCreate(&e0[r]));
      CK(cudaEventCreate(&e1[r]));
    }
  }
  // Median over kReps of one call (rep r uses buffer set r % sets), timed with events.
  template <class F>
  float median_us(F&& rep, int sets, cudaStream_t st) {
    for (int r = 0; r < kWarmup; ++r) rep(r % sets);
    CK(cudaStreamSynchronize(st));
    spin_kernel<<<1, 1, 0, st>>>(4000000);  // ~2 ms: the host queues every rep behind it
    CK(cudaGetLastError());
    for (int r = 0; r < kReps; ++r) {
      CK(cudaEventRecord(e0[r], st));
      rep((r + kWarmup) % sets);
      CK(cudaEventRecord(e1[r], st));
    }
    CK(cudaStreamSynchronize(st));
    std::vector<float> t(kReps);
    for (int r = 0; r < kReps; ++r) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0[r], e1[r]));
      t[r] = ms * 1000.0f;
    }
    std::sort(t.begin(), t.end());
    return 0.5f * (t[kReps / 2 - 1] + t[kReps / 2]);
  }
};

struct Row {
  std::string variant, shape, note, check;
  float us;
  double gbs, pct;
};

}  // namespace

int main() {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  int major = 0, l2 = 0;
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  std::printf("device: %s, sm_%d%d, %d SMs, L2 %.1f MB\n", prop.name, prop.major, prop.minor, g_sms,
              l2 / 1e6);
  if (major < 9) {
    std::printf("needs sm_90 (clusters, cp.async.bulk)\n");
    return 1;
  }
  CK(cudaMalloc(&g_ticket, sizeof(unsigned long long)));
  CK(cudaMemset(g_ticket, 0, sizeof(unsigned long long)));
  CK(cudaMalloc(&g_flags, kWorkspace * sizeof(uint32_t)));
  CK(cudaMemset(g_flags, 0, kWorkspace * sizeof(uint32_t)));
  CK(cudaMalloc(&g_partials, kWorkspace * sizeof(float2)));
  CK(cudaMalloc(&g_error, sizeof(int)));
  CK(cudaMemset(g_error, 0, sizeof(int)));
  // Everything below runs on a non-blocking stream: legacy-stream memsets and copies are
  // followed by a device synchronization before a kernel may read what they wrote.
  CK(cudaDeviceSynchronize());
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Timer timer;
  bool all_ok = true;
  bool variant_broken[kNumVariants] = {};

  // ---- 1. small shapes against the CPU reference ----
  const Shape small[] = {
      {"N2 C64 L1024 G8", 2, 64, 1024, 8},    // groups of 1024 vectors
      {"N3 C96 L576 G32", 3, 96, 576, 32},    // 216 vectors: partial warps, 3 channels
      {"N1 C64 L4096 G4", 1, 64, 4096, 4},    // 4 groups: split doubled to the limit
      {"N1 C8 L40000 G2", 1, 8, 40000, 2},    // 20000 vectors: uneven splits, big clusters
      {"N2 C320 L256 G32", 2, 320, 256, 32},  // 320 vectors
  };
  std::printf(
      "\n== correctness, small shapes (vs CPU reference: |d| <= 1e-2 |ref| + 1e-3; v8 "
      "2e-2 |ref| + 1e-2) ==\n");
  for (const Shape& s : small) {
    const Geo g = geo_of(s);
    std::vector<uint16_t> hx, hw, hb, ref, got(static_cast<size_t>(g.elems));
    make_inputs(s, 0x5eed0000u + s.C * 7 + s.L, hx, hw, hb);
    cpu_reference(s, hx, hw, hb, ref);
    const size_t bytes = hx.size() * 2;
    bf16 *dx, *dout, *dw, *db;
    CK(cudaMalloc(&dx, bytes));
    CK(cudaMalloc(&dout, bytes));
    CK(cudaMalloc(&dw, s.C * 2));
    CK(cudaMalloc(&db, s.C * 2));
    CK(cudaMemcpy(dx, hx.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), s.C * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb.data(), s.C * 2, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    const Dev d{dx, dw, db, dout};
    for (int v = 0; v < kNumVariants; ++v) {
      const Plan p = plan_variant(v, s);
      if (!p.ok) {
        std::printf("  %-26s %-18s n/a (%s)\n", kVariants[v].name, s.name, p.note.c_str());
        continue;
      }
      if (!run_once(v, p, s, d, bytes, st)) {
        std::printf("  %-26s %-18s FAIL: device reported a hang (spin limit)\n", kVariants[v].name,
                    s.name);
        all_ok = false;
        variant_broken[v] = true;
        continue;
      }
      CK(cudaMemcpy(got.data(), dout, bytes, cudaMemcpyDeviceToHost));
      const Diff df = compare(got.data(), ref.data(), got.size(), false, cpu_rtol(v), cpu_atol(v));
      const bool ok = df.bad == 0;
      if (!ok && kVariants[v].math != 2) all_ok = false;
      std::printf("  %-26s %-18s %s  max_abs %.3g max_rel %.3g bad %zu  [%s]\n", kVariants[v].name,
                  s.name, ok ? "ok  " : "FAIL", df.max_abs, df.max_rel, df.bad, p.note.c_str());
    }
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    CK(cudaFree(dw));
    CK(cudaFree(db));
  }

  // ---- 2. the SD shapes: check (CPU reference and v0), then time ----
  const Shape big[] = {
      {"N16 C512 64x64 G32", 16, 512, 4096, 32},
      {"N16 C320 64x64 G32", 16, 320, 4096, 32},
      {"N2 C128 256x256 G32", 2, 128, 65536, 32},
  };
  std::vector<Row> rows;
  for (const Shape& s : big) {
    const Geo g = geo_of(s);
    const size_t bytes = static_cast<size_t>(g.elems) * 2;
    const double io_bytes = 2.0 * static_cast<double>(bytes) + 4.0 * s.C;  // x + out + w + b
    const int sets = std::max<int>(2, static_cast<int>(ceil_div(256ll << 20, 2 * bytes)));
    std::printf("\n== %s: x %.1f MB, %d buffer sets (%.0f MB rotated) ==\n", s.name, bytes / 1e6,
                sets, sets * 2.0 * bytes / 1e6);
    std::vector<uint16_t> hx, hw, hb, ref, v0out, got(static_cast<size_t>(g.elems)), again;
    make_inputs(s, 0xb16b00b5u + s.C + s.L, hx, hw, hb);
    cpu_reference(s, hx, hw, hb, ref);
    std::vector<bf16*> dx(sets), dout(sets);
    bf16 *dw, *db;
    for (int i = 0; i < sets; ++i) {
      CK(cudaMalloc(&dx[i], bytes));
      CK(cudaMalloc(&dout[i], bytes));
    }
    CK(cudaMalloc(&dw, s.C * 2));
    CK(cudaMalloc(&db, s.C * 2));
    CK(cudaMemcpy(dx[0], hx.data(), bytes, cudaMemcpyHostToDevice));
    for (int i = 1; i < sets; ++i) CK(cudaMemcpy(dx[i], dx[0], bytes, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(dw, hw.data(), s.C * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb.data(), s.C * 2, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());  // D2D and pageable H2D copies may still be in flight

    const int64_t nvec = static_cast<int64_t>(bytes / 16);
    const auto copy_blocks = static_cast<unsigned>(ceil_div(nvec, 256));
    const float copy_us = timer.median_us(
        [&](int i) {
          copy_kernel<<<copy_blocks, 256, 0, st>>>(reinterpret_cast<const uint4*>(dx[i]),
                                                   reinterpret_cast<uint4*>(dout[i]), nvec);
          CK(cudaGetLastError());
        },
        sets, st);
    const double copy_gbs = 2.0 * bytes / (copy_us * 1e3);
    std::printf("  copy (16 B/thread, %.0f MB moved): %.1f us, %.0f GB/s\n", 2.0 * bytes / 1e6,
                copy_us, copy_gbs);
    {
      Row c;
      c.variant = "copy (16 B/thread)";
      c.shape = s.name;
      c.us = copy_us;
      c.gbs = copy_gbs;
      c.pct = 100.0;
      c.check = "-";
      rows.push_back(c);
    }

    for (int v = 0; v < kNumVariants; ++v) {
      Row row;
      row.variant = kVariants[v].name;
      row.shape = s.name;
      row.us = 0;
      row.gbs = row.pct = 0;
      const Plan p = plan_variant(v, s);
      row.note = p.note;
      if (!p.ok || variant_broken[v]) {
        row.check = variant_broken[v] ? "skipped (hung on small shapes)" : "n/a";
        std::printf("  %-26s n/a (%s)\n", row.variant.c_str(), p.note.c_str());
        rows.push_back(row);
        continue;
      }
      const Dev d0{dx[0], dw, db, dout[0]};
      if (!run_once(v, p, s, d0, bytes, st)) {
        row.check = "FAIL: hang flag";
        std::printf("  %-26s FAIL: device reported a hang (spin limit)\n", row.variant.c_str());
        all_ok = false;
        rows.push_back(row);
        continue;
      }
      CK(cudaMemcpy(got.data(), dout[0], bytes, cudaMemcpyDeviceToHost));
      const Diff dc = compare(got.data(), ref.data(), got.size(), false, cpu_rtol(v), cpu_atol(v));
      Diff d0diff;
      if (v == 0) {
        v0out = got;
      } else if (!v0out.empty()) {
        d0diff = compare(got.data(), v0out.data(), got.size(), true, 0, 0);
      }
      const bool approx = kVariants[v].math == 2;
      const bool ok = dc.bad == 0 && (v == 0 || d0diff.bad == 0);
      if (!ok && !approx) all_ok = false;

      row.us = timer.median_us(
          [&](int i) {
            CK(launch_variant(v, p, s, Dev{dx[i], dw, db, dout[i]}, st));
          },
          sets, st);
      row.gbs = io_bytes / (row.us * 1e3);
      row.pct = 100.0 * copy_us / row.us;
      // Determinism: one more run on set 0 must give the same bits as the checked run.
      bool det = true;
      {
        const Dev dd{dx[0], dw, db, dout[0]};
        if (!run_once(v, p, s, dd, bytes, st)) det = false;
        again.resize(got.size());
        CK(cudaMemcpy(again.data(), dout[0], bytes, cudaMemcpyDeviceToHost));
        det = det && std::memcmp(again.data(), got.data(), bytes) == 0;
      }
      if (!det && !approx) all_ok = false;
      row.check = fmt("%s cpu(max_abs %.2g bad %zu) v0(max_abs %.2g bad %zu)%s%s",
                      ok ? "ok  " : (approx ? "APPROX" : "FAIL"), dc.max_abs, dc.bad,
                      d0diff.max_abs, d0diff.bad, det ? "" : " NONDETERMINISTIC",
                      approx ? " [tanh: looser cpu tol, not bf16-faithful]" : "");
      std::printf("  %-26s %7.1f us %6.0f GB/s %5.1f%% copy  %s\n      [%s]\n", row.variant.c_str(),
                  row.us, row.gbs, row.pct, row.check.c_str(), row.note.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
    for (int i = 0; i < sets; ++i) {
      CK(cudaFree(dx[i]));
      CK(cudaFree(dout[i]));
    }
    CK(cudaFree(dw));
    CK(cudaFree(db));
  }

  std::printf(
      "\n== summary (median of %d, us; GB/s counts x + out + weight + bias; %%copy = copy "
      "time / variant time) ==\n",
      kReps);
  std::printf("%-26s %-20s %8s %8s %7s  check\n", "variant", "shape", "us", "GB/s", "%copy");
  for (const Row& r : rows) {
    if (r.us > 0) {
      std::printf("%-26s %-20s %8.1f %8.0f %6.1f%%  %s\n", r.variant.c_str(), r.shape.c_str(), r.us,
                  r.gbs, r.pct, r.check.c_str());
    } else {
      std::printf("%-26s %-20s %8s %8s %7s  %s (%s)\n", r.variant.c_str(), r.shape.c_str(), "-",
                  "-", "-", r.check.c_str(), r.note.c_str());
    }
  }
  std::printf("\n%s\n", all_ok ? "ALL CHECKS PASSED" : "SOME CHECKS FAILED");
  CK(cudaStreamDestroy(st));
  return all_ok ? 0 : 2;
}
