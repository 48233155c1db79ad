// Scratch benchmark (not part of kreg): candidate kernels for the two ops that miss their
// bandwidth goals on the H200.
//  (a) diffusion.norm_scale_shift, B=16 S=4096 H=3072 bf16, eps 1e-6:
//      A1: scale/shift [B,H], no weight/bias        (goal 90% of copy; ~71% now)
//      A2: scale/shift [B,S,H] + weight/bias [H]    (~94% now; must not regress)
//      (tools/bench/cases/diffusion.py's two large cases)
//  (b) kvcache.set_mla_kv_buffer, n=32768 tokens of 512 + 64 bf16 into a [P=65536, 576]
//      buffer at distinct random i64 slots (tools/bench/cases/kvcache.py; goal 85%).
// Variant 0 of each is a copy of the kernel and launch shape in plugins/ (norm_scale_shift.cu
// and store.cu as of commits bcda17f / 75cde9a); the others are candidates. Every variant is
// checked against a CPU reference (plain loops as plugins/*/reference.cpp) on random inputs
// from fixed seeds, then timed: CUDA events around each call, all calls enqueued back to
// back (as tools/bench/vs_torch.py), median of 30, rotating over buffer sets of > 200 MB,
// next to a 16-byte-per-thread copy of the same bytes (and a 1 GiB copy, vs_torch's
// reference) timed in the same program.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 nss_mla_bench.cu -o nm && ./nm
//
// (a) variants (a warp per row, 12 16-byte vectors a lane held in registers, two-pass stats
//     unless noted; registers as ptxas reports them for CUDA 13.0):
//   V0 kreg's kernel and launcher: 128-thread blocks of 4 rows, x via ld.global.nc, [B,H]
//      scale/shift re-read per row through L1/L2 after the reductions (80 regs, 24 warps/SM).
//   V1 V0 with x (and per-token scale/shift) loaded L1::no_allocate: the 6 KB x rows streaming
//      through L1 may evict the shared [B,H] rows, so every row re-fetches 12 KB from L2.
//   V2 8 warps x 4 rows a block (32 rows of one batch): [B,H] scale/shift and weight/bias
//      staged in shared memory once per block (no per-row L1/L2 modulation traffic).
//   V3 V2 + the next row's x (and per-token scale/shift) prefetched into L2 before this
//      row's reductions: more bytes in flight at no register cost.
//   V4 4 warps x 8 rows, the next row's x loaded into a second register set before this row's
//      reductions (2 rows in flight a warp; 167 regs, 12 warps/SM).
//   V5 V3 with one-pass shifted statistics (one fused reduction instead of two in a chain).
//   V6 TMA: x rows bulk-copied (cp.async.bulk + mbarrier) into a 2-deep ring per warp, so the
//      next rows are always in flight without registers; modulation staged as V2.
// (b) variants (16-byte words, 72 a row; loads evict-first as kreg):
//   V0 kreg: one word per thread over the flat (row, word) index, 256-thread blocks.
//   V1 a warp per token: 3 words a lane (2.25 used), index broadcast, loads then stores.
//   V2 a half warp per token: 5 words a lane (4.5 used), 16 tokens a block.
//   V3 flat index, 4 words a thread (64 B in flight a thread instead of 16).
//   V4 persistent one-wave grid, a warp per token, next token's index and words loaded
//      before this token's stores.
//   V5 V1 with evict-first (st.global.cs) stores instead of default ones.
//   V6 TMA bulk copies: a thread per token moves its 1152 bytes global -> shared -> slot.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#define CK(...)                                                                   \
  do {                                                                            \
    const cudaError_t e_ = (__VA_ARGS__);                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #__VA_ARGS__, \
              cudaGetErrorString(e_));                                            \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------------------------------
// PTX helpers shared by the candidates
// ---------------------------------------------------------------------------------------
namespace ptx {

// 16-byte load through the non-coherent path that does not allocate in L1: for data read
// once (x rows, per-token modulation rows), so it does not evict what L1 should keep.
__device__ __forceinline__ uint4 ld_na(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_nc(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}
__device__ __forceinline__ void st_cs(void* p, uint4 v) { __stcs(static_cast<uint4*>(p), v); }
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes mbarrier.init visible to the async proxy (the bulk copies that complete on it).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Bulk (TMA, non-tensor) copy global -> shared, completing `bytes` on mbarrier `bar`.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// Bulk copy shared -> global (bulk async-group).
__device__ __forceinline__ void bulk_s2g(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Waits until every committed bulk group has finished reading its shared-memory source.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Orders this thread's generic-proxy shared-memory accesses before its later async-proxy ones.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace ptx

// ---------------------------------------------------------------------------------------
// Variant 0 sources: copies of kreg's device helpers (vec.cuh, reduce.cuh, warp.cuh,
// fast_divisor.cuh) and of the two kernels with their launchers. Changes: namespaces; the
// C++20 std::bit_ceil as a loop (this file is C++17); norm_scale_shift_kernel got a
// template flag kNoAlloc (false = the original code, bit for bit; true = variant A1);
// set_mla's fallback kernel for >= 2^31 words is left out (not reached here).
// ---------------------------------------------------------------------------------------
namespace orig {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float_again(float v) { return v; }
__device__ __forceinline__ float to_float_again(__half v) {
  float f;
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(__half_as_ushort(v)));
  return f;
}
__device__ __forceinline__ float to_float_again(__nv_bfloat16 v) {
  float f;
  asm volatile("mov.b32 %0, {%1, %2};" : "=f"(f) : "h"(uint16_t{0}), "h"(__bfloat16_as_ushort(v)));
  return f;
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    return v;
  }
}

namespace detail {
template <int kBytes>
struct RawWord;
template <>
struct RawWord<16> {
  using type = uint4;
};
template <>
struct RawWord<8> {
  using type = uint2;
};
template <>
struct RawWord<4> {
  using type = uint32_t;
};
template <>
struct RawWord<2> {
  using type = uint16_t;
};
template <>
struct RawWord<1> {
  using type = uint8_t;
};
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_float2(type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ type from_float2(float2 v) { return __float22bfloat162_rn(v); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ float2 to_float2(type v) { return __half22float2(v); }
  static __device__ __forceinline__ type from_float2(float2 v) { return __float22half2_rn(v); }
};
}  // namespace detail

template <int kBytes>
using word_t = typename detail::RawWord<kBytes>::type;

template <typename T, int N>
struct vec_t {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static constexpr int kWordBytes = kBytes < 16 ? kBytes : 16;
  using Word = word_t<kWordBytes>;
  static constexpr int kWords = kBytes / kWordBytes;

  alignas(kWordBytes) T data[N];

  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }

  __device__ __forceinline__ void load_nc(const T* ptr) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(data)[w] = __ldg(reinterpret_cast<const Word*>(ptr) + w);
    }
  }
  // Variant A1 only: ld.global.nc.L1::no_allocate (16-byte vectors).
  __device__ __forceinline__ void load_na(const T* ptr) {
    static_assert(kBytes == 16);
    *reinterpret_cast<uint4*>(data) = ptx::ld_na(ptr);
  }
  __device__ __forceinline__ void store_stream(T* ptr) const {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      __stcs(reinterpret_cast<Word*>(ptr) + w, reinterpret_cast<const Word*>(data)[w]);
    }
  }
  template <typename U>
  __device__ __forceinline__ void cast_from(const vec_t<U, N>& src) {
    if constexpr (std::is_same_v<T, U>) {
      *this = src;
    } else if constexpr (std::is_same_v<T, float> && !std::is_same_v<U, float> && N % 2 == 0) {
      using P = detail::Pair<U>;
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const float2 f = P::to_float2(*reinterpret_cast<const typename P::type*>(&src.data[i]));
        data[i] = f.x;
        data[i + 1] = f.y;
      }
    } else if constexpr (std::is_same_v<U, float> && !std::is_same_v<T, float> && N % 2 == 0) {
      using P = detail::Pair<T>;
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        *reinterpret_cast<typename P::type*>(&data[i]) =
            P::from_float2(make_float2(src.data[i], src.data[i + 1]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) data[i] = from_float<T>(to_float(src.data[i]));
    }
  }
};

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

// ---- plugins/diffusion/norm_scale_shift.cu ----

constexpr int kMaxThreadsPerRow = 1024;
constexpr int kWarpRowBlockThreads = 128;
constexpr int kWarpRowVecs = 16 * kWarpSize;
constexpr int64_t kSms = 132;
constexpr int64_t kThreadsPerSm = 2048;

struct NormArgs {
  const void* x;
  const void* scale;
  const void* shift;
  const void* weight;
  const void* bias;
  void* out;
  int64_t rows;
  int64_t tokens;
  int64_t hidden;
  float eps;
  bool scale_per_token;
  bool shift_per_token;
};

template <typename T, int kVec, int kItems, int kMaxThreads, bool kNoAlloc>
__global__ void __launch_bounds__(kMaxThreads)
    norm_scale_shift_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                            const T* __restrict__ shift, const T* __restrict__ weight,
                            const T* __restrict__ bias, T* __restrict__ out, int rows,
                            FastDivisor tokens, int vecs_per_row, float eps, bool scale_per_token,
                            bool shift_per_token) {
  __shared__ float scratch_mean[kWarpSize];
  __shared__ float scratch_var[kWarpSize];

  const int tid = static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(blockDim.x);
  const int row = static_cast<int>(blockIdx.x * blockDim.y + threadIdx.y);
  const bool live = row < rows;
  const int64_t hidden = static_cast<int64_t>(vecs_per_row) * kVec;
  const T* xr = x + static_cast<int64_t>(live ? row : 0) * hidden;

  auto sum_of = [](const vec_t<T, kVec>& v) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc += to_float(v[j]);
    return acc;
  };
  auto sq_dev_of = [](const vec_t<T, kVec>& v, float mean) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float d = to_float_again(v[j]) - mean;
      acc += d * d;
    }
    return acc;
  };
  auto load_x = [](vec_t<T, kVec>& v, const T* p) {
    if constexpr (kNoAlloc) {
      v.load_na(p);
    } else {
      v.load_nc(p);
    }
  };

  vec_t<T, kVec> held[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) load_x(held[k], xr + static_cast<int64_t>(v) * kVec);
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) sum += sum_of(held[k]);
  }
  for (int v = tid + kItems * step; live && v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    load_x(t, xr + static_cast<int64_t>(v) * kVec);
    sum += sum_of(t);
  }
  const float mean = block_row_sum(sum, scratch_mean) / static_cast<float>(hidden);

  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (live && v < vecs_per_row) sq += sq_dev_of(held[k], mean);
  }
  for (int v = tid + kItems * step; live && v < vecs_per_row; v += step) {
    vec_t<T, kVec> t;
    load_x(t, xr + static_cast<int64_t>(v) * kVec);
    sq += sq_dev_of(t, mean);
  }
  const float var = block_row_sum(sq, scratch_var) / static_cast<float>(hidden);
  const float rstd = rsqrtf(var + eps);
  if (!live) return;

  const int64_t batch = tokens.div(static_cast<uint32_t>(row));
  const T* scale_row = scale + (scale_per_token ? row : batch) * hidden;
  const T* shift_row = shift + (shift_per_token ? row : batch) * hidden;
  T* out_row = out + static_cast<int64_t>(row) * hidden;
  auto modulate_store = [&](int v, const vec_t<T, kVec>& xv) {
    const int64_t at = static_cast<int64_t>(v) * kVec;
    vec_t<T, kVec> sc_raw, sh_raw;
    if constexpr (kNoAlloc) {
      // Per-token rows are streamed (read once): no L1 allocation either.
      if (scale_per_token) {
        sc_raw.load_na(scale_row + at);
      } else {
        sc_raw.load_nc(scale_row + at);
      }
      if (shift_per_token) {
        sh_raw.load_na(shift_row + at);
      } else {
        sh_raw.load_nc(shift_row + at);
      }
    } else {
      sc_raw.load_nc(scale_row + at);
      sh_raw.load_nc(shift_row + at);
    }
    vec_t<float, kVec> sc, sh, y;
    sc.cast_from(sc_raw);
    sh.cast_from(sh_raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = (to_float_again(xv[j]) - mean) * rstd;
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
    load_x(t, xr + static_cast<int64_t>(v) * kVec);
    modulate_store(v, t);
  }
}

inline int round_up(int n, int m) { return (n + m - 1) / m * m; }
inline unsigned bit_ceil_u(unsigned v) {  // std::bit_ceil (C++20)
  unsigned p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The launch the last call took (for the printout).
struct LaunchShape {
  const void* fn = nullptr;
  dim3 grid, block;
};
inline LaunchShape g_last_nss;
inline bool g_describe_only = false;  // launch() records its shape without launching

template <typename T, int kVec, int kItems, int kMaxThreads, bool kNoAlloc>
cudaError_t launch(const NormArgs& a, cudaStream_t stream) {
  const int vecs = static_cast<int>(a.hidden / kVec);
  const int threads_per_row = (vecs + kItems - 1) / kItems;
  dim3 block;
  if (threads_per_row <= kWarpSize) {
    block.x = bit_ceil_u(static_cast<unsigned>(threads_per_row));
  } else {
    block.x =
        static_cast<unsigned>(std::min(kMaxThreadsPerRow, round_up(threads_per_row, kWarpSize)));
  }
  unsigned rows_per_block = 1;
  if (block.x <= kWarpSize) {
    const unsigned per_warp = kWarpSize / block.x;
    const unsigned per_block = kWarpRowBlockThreads / block.x;
    rows_per_block = a.rows >= 16 * int64_t{per_block} * 132 ? per_block : per_warp;
  }
  block.y = rows_per_block;
  const dim3 grid(static_cast<unsigned>((a.rows + block.y - 1) / block.y));
  auto* fn = norm_scale_shift_kernel<T, kVec, kItems, kMaxThreads, kNoAlloc>;
  g_last_nss = {reinterpret_cast<const void*>(fn), grid, block};
  if (g_describe_only) return cudaSuccess;
  fn<<<grid, block, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.scale), static_cast<const T*>(a.shift),
      static_cast<const T*>(a.weight), static_cast<const T*>(a.bias), static_cast<T*>(a.out),
      static_cast<int>(a.rows), FastDivisor(static_cast<uint32_t>(a.tokens)), vecs, a.eps,
      a.scale_per_token, a.shift_per_token);
  return cudaGetLastError();
}

// 16-byte vectors only (the benchmark's pointers and H allow them; launch_typed's width
// switch is not copied).
template <typename T, int kVec, bool kNoAlloc>
cudaError_t launch_with_vec(const NormArgs& a, cudaStream_t stream) {
  static_assert(kVec * sizeof(T) == 16);
  const int64_t vecs = a.hidden / kVec;
  constexpr int kW = kWarpSize;
  static_assert(kWarpRowVecs == 16 * kW);
  if (vecs > kW && vecs <= 2 * kMaxThreadsPerRow) {
    const bool one = vecs <= kMaxThreadsPerRow;
    const int64_t threads = round_up(static_cast<int>(one ? vecs : (vecs + 1) / 2), kW);
    if (a.rows <= kSms * (kThreadsPerSm / threads)) {
      return one ? launch<T, kVec, 1, kMaxThreadsPerRow, kNoAlloc>(a, stream)
                 : launch<T, kVec, 2, kMaxThreadsPerRow, kNoAlloc>(a, stream);
    }
  }
  if (vecs <= 1 * kW) return launch<T, kVec, 1, kWarpRowBlockThreads, kNoAlloc>(a, stream);
  if (vecs <= 2 * kW) return launch<T, kVec, 2, kWarpRowBlockThreads, kNoAlloc>(a, stream);
  if (vecs <= 4 * kW) return launch<T, kVec, 4, kWarpRowBlockThreads, kNoAlloc>(a, stream);
  if (vecs <= 8 * kW) return launch<T, kVec, 8, kWarpRowBlockThreads, kNoAlloc>(a, stream);
  if (vecs <= 12 * kW) return launch<T, kVec, 12, kWarpRowBlockThreads, kNoAlloc>(a, stream);
  if (vecs <= 16 * kW) return launch<T, kVec, 16, kWarpRowBlockThreads, kNoAlloc>(a, stream);
  return launch<T, kVec, 8, kMaxThreadsPerRow, kNoAlloc>(a, stream);
}

// ---- plugins/kvcache/store.cu: set_mla_kv_buffer ----

constexpr int kBlockThreads = 256;

template <typename Idx>
__device__ __forceinline__ int64_t load_index(const Idx* idx, int64_t i) {
  return static_cast<int64_t>(__ldg(idx + i));
}

template <typename Idx, typename W>
__global__ void __launch_bounds__(kBlockThreads)
    set_mla_flat_kernel(W* __restrict__ kv_buffer, const Idx* __restrict__ loc,
                        const W* __restrict__ k_nope, const W* __restrict__ k_rope,
                        uint32_t total_threads, int64_t rows, uint32_t nope_words,
                        uint32_t rope_words, FastDivisor row_words) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total_threads) return;
  const uint32_t r = row_words.div(i);
  const uint32_t j = i - r * row_words.divisor;
  const int64_t dst_row = load_index(loc, r);
  const W w = j < nope_words
                  ? __ldcs(k_nope + static_cast<int64_t>(r) * nope_words + j)
                  : __ldcs(k_rope + static_cast<int64_t>(r) * rope_words + (j - nope_words));
  if (dst_row < 0 || dst_row >= rows) return;
  kv_buffer[dst_row * row_words.divisor + j] = w;
}

// launch_set_mla<Idx, 16>'s flat branch (16-byte words: bf16 512 + 64).
template <typename Idx, int kWordBytes>
bool launch_set_mla(void* buf, const void* loc, const void* nope, const void* rope, int64_t n,
                    int64_t rows, int64_t nope_bytes, int64_t rope_bytes, cudaStream_t stream) {
  using W = word_t<kWordBytes>;
  const int64_t nope_words = nope_bytes / kWordBytes, rope_words = rope_bytes / kWordBytes;
  const int64_t row_words = nope_words + rope_words;
  if (n > (int64_t{INT32_MAX} - 1) / row_words) return false;  // the fallback kernel's range
  const int64_t threads = n * row_words;
  constexpr int64_t kSmsL = 132;
  int64_t block = kBlockThreads;
  if (threads < kBlockThreads * kSmsL) {
    block = std::clamp<int64_t>(((threads + kSmsL - 1) / kSmsL + 31) / 32 * 32, 32, kBlockThreads);
  }
  set_mla_flat_kernel<Idx, W>
      <<<static_cast<unsigned>((threads + block - 1) / block), static_cast<unsigned>(block), 0,
         stream>>>(static_cast<W*>(buf), static_cast<const Idx*>(loc), static_cast<const W*>(nope),
                   static_cast<const W*>(rope), static_cast<uint32_t>(threads), rows,
                   static_cast<uint32_t>(nope_words), static_cast<uint32_t>(rope_words),
                   FastDivisor(static_cast<uint32_t>(row_words)));
  return true;
}

}  // namespace orig

// ---------------------------------------------------------------------------------------
// (a) norm_scale_shift candidates (bf16, 16-byte vectors, a warp per row, H <= 32 * kItems * 8)
// ---------------------------------------------------------------------------------------
namespace nss {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kItems = 12;  // vectors per lane: H = 3072 bf16 is 384 vectors = 12 x 32 lanes

__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// Conversions of a value already converted once (the trick of kreg's to_float_again): opaque,
// so the compiler keeps the packed bf16 pairs live (half the registers), not the floats.
__device__ __forceinline__ float lo_again(uint32_t w) {
  uint32_t u;
  asm volatile("shl.b32 %0, %1, 16;" : "=r"(u) : "r"(w));
  return __uint_as_float(u);
}
__device__ __forceinline__ float hi_again(uint32_t w) {
  uint32_t u;
  asm volatile("and.b32 %0, %1, %2;" : "=r"(u) : "r"(w), "r"(0xffff0000u));
  return __uint_as_float(u);
}
__device__ __forceinline__ void unpack8(uint4 q, float (&f)[8]) {
  f[0] = lo(q.x), f[1] = hi(q.x), f[2] = lo(q.y), f[3] = hi(q.y);
  f[4] = lo(q.z), f[5] = hi(q.z), f[6] = lo(q.w), f[7] = hi(q.w);
}
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // a -> low half (lower address)
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// x row loads: volatile, so that they stay where the variant puts them (the compiler would
// otherwise be free to hoist the next row's loads above this row's stores, __restrict__
// pointers, and so to turn every variant into a register-hungry prefetching one).
__device__ __forceinline__ uint4 ld_row_vec(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void load_row(uint4 (&d)[kItems], const bf16* __restrict__ x,
                                         int64_t row, int hidden, int vecs, int lane) {
  const bf16* xr = x + row * hidden;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = lane + 32 * k;
    if (v < vecs) d[k] = ld_row_vec(xr + v * 8);
  }
}
// The 128-byte lines of a row of `hidden` bf16 into L2 (lanes take lines lane, lane + 32, ...).
__device__ __forceinline__ void prefetch_row_l2(const bf16* base, int64_t row, int hidden,
                                                int lane) {
  const int lines = hidden * 2 / 128;
  for (int l = lane; l < lines; l += 32) ptx::prefetch_l2(base + row * hidden + l * 64);
}

// The row's mean and rstd over the warp: two passes (mean, then squared deviations from it,
// as kreg) or one pass of sums of (x - p) and (x - p)^2, p = the row's first element (one
// fused reduction; no catastrophic cancellation while |mean - p| is a few std).
template <bool kOnePass>
__device__ __forceinline__ void row_stats(const uint4 (&v)[kItems], int lane, int vecs, float hf,
                                          float eps, float& mean, float& rstd) {
  if constexpr (!kOnePass) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (lane + 32 * k < vecs) {
        const uint4 q = v[k];
        s += ((lo(q.x) + hi(q.x)) + (lo(q.y) + hi(q.y))) +
             ((lo(q.z) + hi(q.z)) + (lo(q.w) + hi(q.w)));
      }
    }
    mean = warp_sum(s) / hf;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (lane + 32 * k < vecs) {
        const uint4 q = v[k];
        const float d0 = lo_again(q.x) - mean, d1 = hi_again(q.x) - mean;
        const float d2 = lo_again(q.y) - mean, d3 = hi_again(q.y) - mean;
        const float d4 = lo_again(q.z) - mean, d5 = hi_again(q.z) - mean;
        const float d6 = lo_again(q.w) - mean, d7 = hi_again(q.w) - mean;
        sq += ((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)) +
              ((d4 * d4 + d5 * d5) + (d6 * d6 + d7 * d7));
      }
    }
    rstd = rsqrtf(warp_sum(sq) / hf + eps);
  } else {
    const float p = __shfl_sync(kFull, lo(v[0].x), 0);  // lane 0's vector 0: element 0
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      if (lane + 32 * k < vecs) {
        float f[8];
        unpack8(v[k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] -= p;
        s1 += ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
        s2 += ((f[0] * f[0] + f[1] * f[1]) + (f[2] * f[2] + f[3] * f[3])) +
              ((f[4] * f[4] + f[5] * f[5]) + (f[6] * f[6] + f[7] * f[7]));
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s1 += __shfl_xor_sync(kFull, s1, o);
      s2 += __shfl_xor_sync(kFull, s2, o);
    }
    const float m1 = s1 / hf;
    mean = p + m1;
    rstd = rsqrtf(fmaxf(s2 / hf - m1 * m1, 0.0f) + eps);
  }
}

// Where a row's modulation comes from. kTok: scale and shift are [B,S,H] (streamed from
// global memory, no L1 allocation); else [B,H] rows staged in shared memory. kAffine: weight
// and bias [H], staged in shared memory. The candidates take both as template flags (the two
// benchmark cases are ([B,H], none) and ([B,S,H], weight+bias); other mixes: not applicable).
struct Mod {
  const bf16* scale;  // the whole tensor (kTok)
  const bf16* shift;
  const uint4* s_sc;  // shared, vecs vectors each (!kTok)
  const uint4* s_sh;
  const uint4* s_w;  // (kAffine)
  const uint4* s_b;
};

template <bool kTok, bool kAffine>
__device__ __forceinline__ void modulate_store(const uint4 (&v)[kItems], int64_t row, int hidden,
                                               int vecs, int lane, float mean, float rstd,
                                               const Mod& m, bf16* __restrict__ out) {
  bf16* orow = out + row * hidden;
  const bf16* scr = kTok ? m.scale + row * hidden : nullptr;
  const bf16* shr = kTok ? m.shift + row * hidden : nullptr;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int vv = lane + 32 * k;
    if (vv >= vecs) continue;
    uint4 scq, shq;
    if constexpr (kTok) {
      scq = ptx::ld_na(scr + vv * 8);
      shq = ptx::ld_na(shr + vv * 8);
    } else {
      scq = m.s_sc[vv];
      shq = m.s_sh[vv];
    }
    const uint4 q = v[k];
    float y[8] = {lo_again(q.x), hi_again(q.x), lo_again(q.y), hi_again(q.y),
                  lo_again(q.z), hi_again(q.z), lo_again(q.w), hi_again(q.w)};
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = (y[j] - mean) * rstd;
    if constexpr (kAffine) {
      float w[8], b[8];
      unpack8(m.s_w[vv], w);
      unpack8(m.s_b[vv], b);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = y[j] * w[j] + b[j];
    }
    float sc[8], sh[8];
    unpack8(scq, sc);
    unpack8(shq, sh);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = y[j] * (1.0f + sc[j]) + sh[j];
    ptx::st_cs(orow + vv * 8, make_uint4(pack2(y[0], y[1]), pack2(y[2], y[3]), pack2(y[4], y[5]),
                                         pack2(y[6], y[7])));
  }
}

// Copies the block's [B,H] scale/shift rows (!kTok) and weight/bias (kAffine) to shared memory.
template <bool kTok, bool kAffine>
__device__ __forceinline__ void stage_mod(uint4* s, const bf16* scale, const bf16* shift,
                                          const bf16* w, const bf16* b, int64_t batch, int hidden,
                                          int vecs) {
  for (int v = static_cast<int>(threadIdx.x); v < vecs; v += static_cast<int>(blockDim.x)) {
    if constexpr (!kTok) {
      s[v] = ptx::ld_nc(scale + batch * hidden + v * 8);
      s[vecs + v] = ptx::ld_nc(shift + batch * hidden + v * 8);
    }
    if constexpr (kAffine) {
      s[2 * vecs + v] = ptx::ld_nc(w + v * 8);
      s[3 * vecs + v] = ptx::ld_nc(b + v * 8);
    }
  }
}

enum class Pre {
  kNone,  // row i + 1's loads are issued after row i's stores
  kL2,    // row i + 1's x (and per-token scale/shift) lines are prefetched into L2 first
  kRegs,  // row i + 1's x is loaded into a second register set before row i's reductions
};

// V2-V5: kWarps warps a block, a warp per row, kRowsPerWarp rows per warp (rows warp,
// warp + kWarps, ... of the block's kWarps * kRowsPerWarp consecutive rows, all of one
// batch). [B,H] modulation and weight/bias are staged in shared memory once per block; x
// rows and per-token rows are loaded without L1 allocation; out is stored evict-first.
template <int kWarps, int kRowsPerWarp, int kMinBlocks, Pre kPre, bool kOnePass, bool kTok,
          bool kAffine>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    nss_rows_kernel(const bf16* __restrict__ x, const bf16* __restrict__ scale,
                    const bf16* __restrict__ shift, const bf16* __restrict__ weight,
                    const bf16* __restrict__ bias, bf16* __restrict__ out, int rows, int tokens,
                    int hidden, float eps) {
  extern __shared__ uint4 s_mod[];  // 4 * vecs vectors: scale, shift, weight, bias
  const int vecs = hidden / 8;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int row0 = static_cast<int>(blockIdx.x) * (kWarps * kRowsPerWarp);
  const int64_t batch = row0 / tokens;
  const float hf = static_cast<float>(hidden);
  const Mod m{scale, shift, s_mod, s_mod + vecs, s_mod + 2 * vecs, s_mod + 3 * vecs};

  uint4 cur[kItems];
  int r = row0 + warp;
  if (r < rows) load_row(cur, x, r, hidden, vecs, lane);  // in flight during the staging
  stage_mod<kTok, kAffine>(s_mod, scale, shift, weight, bias, batch, hidden, vecs);
  __syncthreads();

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i, r += kWarps) {
    if (r >= rows) break;  // warp-uniform
    const bool has_next = i + 1 < kRowsPerWarp && r + kWarps < rows;
    uint4 nxt[kItems];
    if (has_next) {
      if constexpr (kPre == Pre::kRegs) load_row(nxt, x, r + kWarps, hidden, vecs, lane);
      if constexpr (kPre == Pre::kL2) prefetch_row_l2(x, r + kWarps, hidden, lane);
      if constexpr (kPre != Pre::kNone && kTok) {
        prefetch_row_l2(scale, r + kWarps, hidden, lane);
        prefetch_row_l2(shift, r + kWarps, hidden, lane);
      }
    }
    float mean, rstd;
    row_stats<kOnePass>(cur, lane, vecs, hf, eps, mean, rstd);
    modulate_store<kTok, kAffine>(cur, r, hidden, vecs, lane, mean, rstd, m, out);
    if (has_next) {
      if constexpr (kPre == Pre::kRegs) {
#pragma unroll
        for (int k = 0; k < kItems; ++k) cur[k] = nxt[k];
      } else {
        load_row(cur, x, r + kWarps, hidden, vecs, lane);
      }
    }
  }
}

// V6: x rows arrive by bulk copy (TMA, cp.async.bulk, one instruction per 6 KB row) into a
// kStages-deep ring of row buffers per warp; a warp moves its row from shared memory to
// registers, hands the buffer to the copy of the row kStages ahead, then computes and stores
// as V2. Bytes in flight cost no registers: each warp always has its next rows on the way.
template <int kWarps, int kRowsPerWarp, int kStages, int kMinBlocks, bool kTok, bool kAffine>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    nss_tma_kernel(const bf16* __restrict__ x, const bf16* __restrict__ scale,
                   const bf16* __restrict__ shift, const bf16* __restrict__ weight,
                   const bf16* __restrict__ bias, bf16* __restrict__ out, int rows, int tokens,
                   int hidden, float eps) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kBarBytes = (kWarps * kStages * 8 + 127) / 128 * 128;
  const int vecs = hidden / 8;
  const uint32_t row_bytes = static_cast<uint32_t>(hidden) * 2;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  unsigned char* ring = smem + kBarBytes;
  uint4* s_mod = reinterpret_cast<uint4*>(ring + static_cast<size_t>(kWarps) * kStages * row_bytes);

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int row0 = static_cast<int>(blockIdx.x) * (kWarps * kRowsPerWarp);
  const int64_t batch = row0 / tokens;
  const float hf = static_cast<float>(hidden);
  const Mod m{scale, shift, s_mod, s_mod + vecs, s_mod + 2 * vecs, s_mod + 3 * vecs};

  if (threadIdx.x == 0) {
    for (int i = 0; i < kWarps * kStages; ++i) ptx::mbar_init(ptx::smem_u32(&bars[i]), 1);
    ptx::fence_mbar_init();
  }
  __syncthreads();

  auto row_of = [&](int i) { return row0 + warp + i * kWarps; };
  auto bar_of = [&](int i) { return ptx::smem_u32(&bars[warp * kStages + i % kStages]); };
  auto buf_of = [&](int i) {
    return ring + static_cast<size_t>(warp * kStages + i % kStages) * row_bytes;
  };
  auto issue = [&](int i) {  // lane 0 only
    const uint32_t bar = bar_of(i);
    ptx::mbar_arrive_expect_tx(bar, row_bytes);
    ptx::bulk_g2s(ptx::smem_u32(buf_of(i)), x + static_cast<int64_t>(row_of(i)) * hidden, row_bytes,
                  bar);
  };
  if (lane == 0) {
    for (int i = 0; i < kStages && i < kRowsPerWarp; ++i) {
      if (row_of(i) < rows) issue(i);
    }
  }
  stage_mod<kTok, kAffine>(s_mod, scale, shift, weight, bias, batch, hidden, vecs);
  __syncthreads();

  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = row_of(i);
    if (r >= rows) break;  // warp-uniform
    ptx::mbar_wait(bar_of(i), static_cast<uint32_t>(i / kStages) & 1u);
    const uint4* src = reinterpret_cast<const uint4*>(buf_of(i));
    uint4 cur[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = lane + 32 * k;
      if (v < vecs) cur[k] = src[v];
    }
    __syncwarp();  // every lane has read the buffer: it can take the row kStages ahead
    if (lane == 0 && i + kStages < kRowsPerWarp && row_of(i + kStages) < rows) {
      ptx::fence_proxy_async();
      issue(i + kStages);
    }
    if constexpr (kTok) {
      if (i + 1 < kRowsPerWarp && row_of(i + 1) < rows) {
        prefetch_row_l2(scale, row_of(i + 1), hidden, lane);
        prefetch_row_l2(shift, row_of(i + 1), hidden, lane);
      }
    }
    float mean, rstd;
    row_stats<false>(cur, lane, vecs, hf, eps, mean, rstd);
    modulate_store<kTok, kAffine>(cur, r, hidden, vecs, lane, mean, rstd, m, out);
  }
}

struct Call {
  const bf16* x;
  const bf16* scale;
  const bf16* shift;
  const bf16* weight;  // null: omitted
  const bf16* bias;
  bf16* out;
  int B, S, H;
  float eps;
  bool sc_tok, sh_tok;
};

struct Shape {
  const void* fn = nullptr;
  int threads = 0;
  size_t smem = 0;
  unsigned grid = 0;
};

// The (kTok, kAffine) instantiation for the call: 0 = ([B,H], none), 1 = ([B,S,H], weight
// and bias), -1 = another mix or a shape the candidates do not cover (not applicable).
inline int mode_of(const Call& c, int rows_per_block) {
  const int vecs = c.H / 8;
  if (c.H % 8 != 0 || vecs > 32 * kItems || c.S % rows_per_block != 0) return -1;
  if (!c.sc_tok && !c.sh_tok && !c.weight && !c.bias) return 0;
  if (c.sc_tok && c.sh_tok && c.weight && c.bias) return 1;
  return -1;
}

// Launches (shape == null) or describes the launch (shape != null, nothing launched).
// Returns false where the variant does not cover the call.
template <int kWarps, int kRowsPerWarp, int kMinBlocks, Pre kPre, bool kOnePass>
bool launch_rows(const Call& c, Shape* shape) {
  constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
  const int mode = mode_of(c, kRowsPerBlock);
  if (mode < 0) return false;
  auto* fn = mode == 0
                 ? nss_rows_kernel<kWarps, kRowsPerWarp, kMinBlocks, kPre, kOnePass, false, false>
                 : nss_rows_kernel<kWarps, kRowsPerWarp, kMinBlocks, kPre, kOnePass, true, true>;
  const int rows = c.B * c.S;
  const size_t smem = 4 * static_cast<size_t>(c.H / 8) * 16;
  const unsigned grid = static_cast<unsigned>(rows / kRowsPerBlock);
  if (shape) {
    *shape = {reinterpret_cast<const void*>(fn), kWarps * 32, smem, grid};
    return true;
  }
  fn<<<grid, kWarps * 32, smem>>>(c.x, c.scale, c.shift, c.weight, c.bias, c.out, rows, c.S, c.H,
                                  c.eps);
  CK(cudaGetLastError());
  return true;
}

template <int kWarps, int kRowsPerWarp, int kStages, int kMinBlocks>
bool launch_tma(const Call& c, Shape* shape) {
  constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
  const int mode = mode_of(c, kRowsPerBlock);
  if (mode < 0) return false;
  auto* fn = mode == 0 ? nss_tma_kernel<kWarps, kRowsPerWarp, kStages, kMinBlocks, false, false>
                       : nss_tma_kernel<kWarps, kRowsPerWarp, kStages, kMinBlocks, true, true>;
  constexpr int kBarBytes = (kWarps * kStages * 8 + 127) / 128 * 128;
  const size_t smem = kBarBytes + static_cast<size_t>(kWarps) * kStages * c.H * 2 +
                      4 * static_cast<size_t>(c.H / 8) * 16;
  static size_t allowed[2] = {0, 0};  // per instantiation: set once, outside the timed calls
  if (smem > 48 * 1024 && allowed[mode] < smem) {
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    allowed[mode] = smem;
  }
  const int rows = c.B * c.S;
  const unsigned grid = static_cast<unsigned>(rows / kRowsPerBlock);
  if (shape) {
    *shape = {reinterpret_cast<const void*>(fn), kWarps * 32, smem, grid};
    return true;
  }
  fn<<<grid, kWarps * 32, smem>>>(c.x, c.scale, c.shift, c.weight, c.bias, c.out, rows, c.S, c.H,
                                  c.eps);
  CK(cudaGetLastError());
  return true;
}

// V0 / V1: kreg's launcher. With shape != null it only reports the launch it takes (the
// launcher's choice, replayed without launching).
template <bool kNoAlloc>
bool launch_orig(const Call& c, Shape* shape) {
  const orig::NormArgs a{c.x, c.scale, c.shift, c.weight, c.bias,  c.out, int64_t{c.B} * c.S,
                         c.S, c.H,     c.eps,   c.sc_tok, c.sh_tok};
  if (c.H % 8 != 0) return false;
  if (shape) {
    orig::g_describe_only = true;
    CK(orig::launch_with_vec<bf16, 8, kNoAlloc>(a, nullptr));
    orig::g_describe_only = false;
    const auto& l = orig::g_last_nss;
    *shape = {l.fn, static_cast<int>(l.block.x * l.block.y), 0, l.grid.x};
    return true;
  }
  CK(orig::launch_with_vec<bf16, 8, kNoAlloc>(a, nullptr));
  return true;
}

}  // namespace nss

// ---------------------------------------------------------------------------------------
// (b) set_mla_kv_buffer candidates: bf16 512 + 64 = 64 + 8 16-byte words a row, i64 loc.
// ---------------------------------------------------------------------------------------
namespace mla {

constexpr int kNopeW = 64, kRopeW = 8, kRowW = 72;  // 16-byte words
constexpr int kRowBytes = kRowW * 16;               // 1152

template <bool kCs>
__device__ __forceinline__ void st(uint4* p, uint4 v) {
  if constexpr (kCs) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

// V1, V2, V5: kLanes lanes (32: a warp, 16: a half warp) per token, 16-byte words, every
// lane loads the token's index (one broadcast request) together with its kPer words, then
// stores them. 256-thread blocks: 256 / kLanes tokens a block.
template <int kLanes, bool kCs>
__global__ void __launch_bounds__(256)
    mla_group_kernel(uint4* __restrict__ kv, const int64_t* __restrict__ loc,
                     const uint4* __restrict__ nope, const uint4* __restrict__ rope, int n,
                     int64_t rows) {
  constexpr int kPer = (kRowW + kLanes - 1) / kLanes;
  const int lane = static_cast<int>(threadIdx.x) & (kLanes - 1);
  const int t =
      static_cast<int>(blockIdx.x) * (256 / kLanes) + static_cast<int>(threadIdx.x) / kLanes;
  if (t >= n) return;
  const int64_t dst = __ldg(loc + t);
  uint4 w[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int j = lane + u * kLanes;
    if (j < kRowW) {
      w[u] = j < kNopeW ? __ldcs(nope + static_cast<int64_t>(t) * kNopeW + j)
                        : __ldcs(rope + static_cast<int64_t>(t) * kRopeW + (j - kNopeW));
    }
  }
  if (dst < 0 || dst >= rows) return;
  uint4* d = kv + dst * kRowW;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int j = lane + u * kLanes;
    if (j < kRowW) st<kCs>(d + j, w[u]);
  }
}

// V3: V0's flat (row, word) index with kWords words a thread (words i, i + 256, ... of the
// block's 256 * kWords): all loads (and their rows' indices) first, then the stores.
template <int kWords>
__global__ void __launch_bounds__(256)
    mla_flat_multi_kernel(uint4* __restrict__ kv, const int64_t* __restrict__ loc,
                          const uint4* __restrict__ nope, const uint4* __restrict__ rope,
                          uint32_t total, int64_t rows, orig::FastDivisor row_words) {
  const uint32_t base = blockIdx.x * (256u * kWords) + threadIdx.x;
  int64_t dst[kWords];
  uint32_t col[kWords];
  uint4 w[kWords];
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const uint32_t i = base + 256u * u;
    dst[u] = -1;
    if (i < total) {
      const uint32_t r = row_words.div(i);
      col[u] = i - r * kRowW;
      dst[u] = __ldg(loc + r);
      w[u] = col[u] < kNopeW ? __ldcs(nope + static_cast<int64_t>(r) * kNopeW + col[u])
                             : __ldcs(rope + static_cast<int64_t>(r) * kRopeW + (col[u] - kNopeW));
    }
  }
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    if (dst[u] >= 0 && dst[u] < rows) kv[dst[u] * kRowW + col[u]] = w[u];
  }
}

// V4: a persistent grid (one wave), a warp per token, tokens gw, gw + W, ...; the next
// token's index and words are loaded before the current token's stores (software pipeline).
__global__ void __launch_bounds__(256)
    mla_persist_kernel(uint4* __restrict__ kv, const int64_t* __restrict__ loc,
                       const uint4* __restrict__ nope, const uint4* __restrict__ rope, int n,
                       int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int nw = static_cast<int>(gridDim.x) * 8;
  int t = static_cast<int>(blockIdx.x) * 8 + (static_cast<int>(threadIdx.x) >> 5);
  if (t >= n) return;
  auto load = [&](int tok, int64_t& d, uint4& a, uint4& b, uint4& c) {
    d = __ldg(loc + tok);
    a = __ldcs(nope + static_cast<int64_t>(tok) * kNopeW + lane);
    b = __ldcs(nope + static_cast<int64_t>(tok) * kNopeW + 32 + lane);
    if (lane < kRopeW) c = __ldcs(rope + static_cast<int64_t>(tok) * kRopeW + lane);
  };
  int64_t d;
  uint4 a, b, c;
  load(t, d, a, b, c);
  while (true) {
    const int tn = t + nw;
    int64_t dn = -1;
    uint4 an, bn, cn;
    if (tn < n) load(tn, dn, an, bn, cn);
    if (d >= 0 && d < rows) {
      uint4* p = kv + d * kRowW;
      p[lane] = a;
      p[32 + lane] = b;
      if (lane < kRopeW) p[64 + lane] = c;
    }
    if (tn >= n) break;
    t = tn;
    d = dn;
    a = an;
    b = bn;
    c = cn;
  }
}

// V6: bulk copies (TMA): a thread per token, 32 tokens a block; each thread copies its
// token's 1024 + 128 bytes into its 1152-byte shared buffer (two cp.async.bulk completing
// on its own mbarrier), then writes the buffer to the slot's row with one bulk store.
constexpr int kTmaTokens = 32;
__global__ void __launch_bounds__(kTmaTokens)
    mla_tma_kernel(unsigned char* __restrict__ kv, const int64_t* __restrict__ loc,
                   const unsigned char* __restrict__ nope, const unsigned char* __restrict__ rope,
                   int n, int64_t rows) {
  extern __shared__ __align__(128) unsigned char buf[];  // kTmaTokens * 1152
  __shared__ __align__(8) uint64_t bars[kTmaTokens];
  const int lane = static_cast<int>(threadIdx.x);
  const int t = static_cast<int>(blockIdx.x) * kTmaTokens + lane;
  if (t >= n) return;
  const int64_t dst = __ldg(loc + t);  // needed only at the store
  const uint32_t bar = ptx::smem_u32(&bars[lane]);
  const uint32_t s = ptx::smem_u32(buf + lane * kRowBytes);
  ptx::mbar_init(bar, 1);
  ptx::fence_mbar_init();
  ptx::mbar_arrive_expect_tx(bar, kRowBytes);
  ptx::bulk_g2s(s, nope + static_cast<int64_t>(t) * (kNopeW * 16), kNopeW * 16, bar);
  ptx::bulk_g2s(s + kNopeW * 16, rope + static_cast<int64_t>(t) * (kRopeW * 16), kRopeW * 16, bar);
  ptx::mbar_wait(bar, 0);
  if (dst >= 0 && dst < rows) {
    ptx::fence_proxy_async();
    ptx::bulk_s2g(kv + dst * kRowBytes, s, kRowBytes);
    ptx::bulk_commit();
    ptx::bulk_wait_read_all();  // the buffer must outlive the store's reads
  }
}

struct Call {
  void* kv;
  const int64_t* loc;
  const void* nope;
  const void* rope;
  int n;
  int64_t rows;
};

struct Shape {
  const void* fn = nullptr;
  int threads = 0;
  size_t smem = 0;
  unsigned grid = 0;
};

inline int g_sms = 132;

bool launch_orig(const Call& c, Shape* shape) {
  if (shape) {
    const int64_t threads = int64_t{c.n} * kRowW;
    *shape = {reinterpret_cast<const void*>(orig::set_mla_flat_kernel<int64_t, uint4>), 256, 0,
              static_cast<unsigned>((threads + 255) / 256)};
    return true;
  }
  const bool ok = orig::launch_set_mla<int64_t, 16>(c.kv, c.loc, c.nope, c.rope, c.n, c.rows,
                                                    kNopeW * 16, kRopeW * 16, nullptr);
  CK(cudaGetLastError());
  return ok;
}

template <int kLanes, bool kCs>
bool launch_group(const Call& c, Shape* shape) {
  auto* fn = mla_group_kernel<kLanes, kCs>;
  const int per_block = 256 / kLanes;
  const unsigned grid = static_cast<unsigned>((c.n + per_block - 1) / per_block);
  if (shape) {
    *shape = {reinterpret_cast<const void*>(fn), 256, 0, grid};
    return true;
  }
  fn<<<grid, 256>>>(static_cast<uint4*>(c.kv), c.loc, static_cast<const uint4*>(c.nope),
                    static_cast<const uint4*>(c.rope), c.n, c.rows);
  CK(cudaGetLastError());
  return true;
}

template <int kWords>
bool launch_flat_multi(const Call& c, Shape* shape) {
  const int64_t total = int64_t{c.n} * kRowW;
  if (total >= INT32_MAX) return false;
  auto* fn = mla_flat_multi_kernel<kWords>;
  const unsigned grid = static_cast<unsigned>((total + 256 * kWords - 1) / (256 * kWords));
  if (shape) {
    *shape = {reinterpret_cast<const void*>(fn), 256, 0, grid};
    return true;
  }
  fn<<<grid, 256>>>(static_cast<uint4*>(c.kv), c.loc, static_cast<const uint4*>(c.nope),
                    static_cast<const uint4*>(c.rope), static_cast<uint32_t>(total), c.rows,
                    orig::FastDivisor(kRowW));
  CK(cudaGetLastError());
  return true;
}

bool launch_persist(const Call& c, Shape* shape) {
  static int per_sm = 0;
  if (per_sm == 0) {
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mla_persist_kernel, 256, 0));
    if (per_sm < 1) per_sm = 1;
  }
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>((int64_t{c.n} + 7) / 8, int64_t{g_sms} * per_sm));
  if (shape) {
    *shape = {reinterpret_cast<const void*>(mla_persist_kernel), 256, 0, grid};
    return true;
  }
  mla_persist_kernel<<<grid, 256>>>(static_cast<uint4*>(c.kv), c.loc,
                                    static_cast<const uint4*>(c.nope),
                                    static_cast<const uint4*>(c.rope), c.n, c.rows);
  CK(cudaGetLastError());
  return true;
}

bool launch_tma(const Call& c, Shape* shape) {
  const size_t smem = size_t{kTmaTokens} * kRowBytes;  // 36 KB: under the 48 KB default
  const unsigned grid = static_cast<unsigned>((c.n + kTmaTokens - 1) / kTmaTokens);
  if (shape) {
    *shape = {reinterpret_cast<const void*>(mla_tma_kernel), kTmaTokens, smem, grid};
    return true;
  }
  mla_tma_kernel<<<grid, kTmaTokens, smem>>>(
      static_cast<unsigned char*>(c.kv), c.loc, static_cast<const unsigned char*>(c.nope),
      static_cast<const unsigned char*>(c.rope), c.n, c.rows);
  CK(cudaGetLastError());
  return true;
}

}  // namespace mla

// ---------------------------------------------------------------------------------------
// Host side: copy baseline, timing, data, references
// ---------------------------------------------------------------------------------------

__global__ void __launch_bounds__(256)
    copy16_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t words) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i < words) dst[i] = src[i];
}
void copy16(const void* src, void* dst, int64_t words) {
  copy16_kernel<<<static_cast<unsigned>((words + 255) / 256), 256>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), words);
  CK(cudaGetLastError());
}

constexpr int kReps = 30;

// Median microseconds of one call (calls rotate over `sets` buffer sets); every call between
// its own pair of events, all enqueued back to back, one synchronization at the end.
template <typename F>
float median_us(F&& launch, int sets) {
  for (int i = 0; i < 3; ++i) launch(i % sets);
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * kReps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < kReps; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    launch(i % sets);
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> t(kReps);
  for (int i = 0; i < kReps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1000.0f;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return 0.5f * (t[kReps / 2 - 1] + t[kReps / 2]);
}

std::string kernel_info(const void* fn, int threads, size_t smem, unsigned grid) {
  if (fn == nullptr) return "";
  cudaFuncAttributes a{};
  CK(cudaFuncGetAttributes(&a, fn));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem));
  char s[200];
  snprintf(s, sizeof s,
           "regs %d, spill %zu B, %d thr x %u blocks, smem %zu B, %d blocks/SM (%d warps)",
           a.numRegs, static_cast<size_t>(a.localSizeBytes), threads, grid, smem, per_sm,
           per_sm * threads / 32);
  return s;
}

// Deterministic random numbers (splitmix64).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uni() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

inline float bf2f(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f2bf(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Diff {
  double max_abs = 0;
  int64_t bad = 0;
  int64_t first_bad = -1;
};
// bf16 results against the reference: max |diff| (NaN counts as inf); "bad" where the
// difference exceeds one bf16 rounding step of the reference (the GPU's fp32 statistics
// can move a rounding by one ulp, never more).
Diff compare_bf16(const uint16_t* got, const uint16_t* want, size_t n) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    const float g = bf2f(got[i]), w = bf2f(want[i]);
    double e = std::fabs(static_cast<double>(g) - w);
    if (e != e) e = INFINITY;
    if (e > d.max_abs) d.max_abs = e;
    if (!(e <= std::fabs(w) * (1.0 / 128) + 1e-3)) {
      if (d.bad++ == 0) d.first_bad = static_cast<int64_t>(i);
    }
  }
  return d;
}
// Exact comparison (set_mla is a copy).
Diff compare_exact(const uint16_t* got, const uint16_t* want, size_t n) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      if (d.bad++ == 0) d.first_bad = static_cast<int64_t>(i);
      double e = std::fabs(static_cast<double>(bf2f(got[i])) - bf2f(want[i]));
      if (e != e) e = INFINITY;
      d.max_abs = std::max(d.max_abs, e);
    }
  }
  return d;
}

// The CPU reference of plugins/diffusion/reference.cpp (bf16).
void ref_norm_scale_shift(const uint16_t* x, const uint16_t* sc, const uint16_t* sh, bool sc_tok,
                          bool sh_tok, const uint16_t* w, const uint16_t* b, int B, int S, int H,
                          float eps, uint16_t* out) {
  for (int64_t bi = 0; bi < B; ++bi) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t row = bi * S + s;
      const uint16_t* xr = x + row * H;
      const uint16_t* scr = sc + (sc_tok ? row : bi) * H;
      const uint16_t* shr = sh + (sh_tok ? row : bi) * H;
      double sum = 0;
      for (int h = 0; h < H; ++h) sum += bf2f(xr[h]);
      const double mean = sum / H;
      double sq = 0;
      for (int h = 0; h < H; ++h) {
        const double d = bf2f(xr[h]) - mean;
        sq += d * d;
      }
      const auto fmean = static_cast<float>(mean);
      const float rstd = 1.0f / std::sqrt(static_cast<float>(sq / H) + eps);
      for (int h = 0; h < H; ++h) {
        float y = (bf2f(xr[h]) - fmean) * rstd;
        if (w) y = y * bf2f(w[h]);
        if (b) y = y + bf2f(b[h]);
        y = y * (1.0f + bf2f(scr[h])) + bf2f(shr[h]);
        out[row * H + h] = f2bf(y);
      }
    }
  }
}

void report(const char* id, const char* name, const char* cas, float us, double bytes,
            double copy_gbps, double big_gbps, const std::string& check) {
  const double gbps = bytes / us * 1e-3;
  printf("%-3s %-34s %-22s %9.2f us %7.0f GB/s %6.1f%% copy %6.1f%% 1GiB  %s\n", id, name, cas, us,
         gbps, 100.0 * gbps / copy_gbps, 100.0 * gbps / big_gbps, check.c_str());
  fflush(stdout);
}

double g_big_copy_gbps = 0;

// ---------------------------------------------------------------------------------------
// (a) norm_scale_shift
// ---------------------------------------------------------------------------------------
void run_nss() {
  constexpr int B = 16, S = 4096, H = 3072;
  constexpr float kEps = 1e-6f;
  const int64_t rows = int64_t{B} * S, elems = rows * H;
  printf("\n== (a) diffusion.norm_scale_shift B=%d S=%d H=%d bf16 eps=%g ==\n", B, S, H, kEps);

  // Inputs: per row x = mu + sigma * t, t triangular on (-1, 1), mu in [-3, 3), sigma in
  // [0.25, 2); modulation and bias uniform on [-0.2, 0.2), weight on [0.9, 1.1).
  std::vector<uint16_t> hx(elems), hsc_b(int64_t{B} * H), hsh_b(int64_t{B} * H), hw(H), hb(H);
  std::vector<uint16_t> hsc_t(elems), hsh_t(elems);
  {
    Rng rng(12345);
    for (int64_t r = 0; r < rows; ++r) {
      const float mu = (rng.uni() * 2 - 1) * 3, sigma = 0.25f + 1.75f * rng.uni();
      uint16_t* xr = hx.data() + r * H;
      for (int h = 0; h < H; h += 2) {
        const uint64_t v = rng.next();
        const float t0 = (float((v >> 0) & 0xffff) + float((v >> 16) & 0xffff)) / 65536.0f - 1.0f;
        const float t1 = (float((v >> 32) & 0xffff) + float((v >> 48) & 0xffff)) / 65536.0f - 1.0f;
        xr[h] = f2bf(mu + sigma * t0);
        xr[h + 1] = f2bf(mu + sigma * t1);
      }
    }
    auto fill_uniform = [&](std::vector<uint16_t>& v, float lo, float hi) {
      for (size_t i = 0; i < v.size(); i += 4) {
        const uint64_t r = rng.next();
        for (size_t k = 0; k < 4 && i + k < v.size(); ++k) {
          const float u = float((r >> (16 * k)) & 0xffff) / 65536.0f;
          v[i + k] = f2bf(lo + (hi - lo) * u);
        }
      }
    };
    fill_uniform(hsc_b, -0.2f, 0.2f);
    fill_uniform(hsh_b, -0.2f, 0.2f);
    fill_uniform(hw, 0.9f, 1.1f);
    fill_uniform(hb, -0.2f, 0.2f);
    fill_uniform(hsc_t, -0.2f, 0.2f);
    fill_uniform(hsh_t, -0.2f, 0.2f);
  }
  const size_t xbytes = static_cast<size_t>(elems) * 2;
  bf16 *dx, *dout, *dsc_b, *dsh_b, *dsc_t, *dsh_t, *dw, *db;
  CK(cudaMalloc(&dx, xbytes));
  CK(cudaMalloc(&dout, xbytes));
  CK(cudaMalloc(&dsc_t, xbytes));
  CK(cudaMalloc(&dsh_t, xbytes));
  CK(cudaMalloc(&dsc_b, hsc_b.size() * 2));
  CK(cudaMalloc(&dsh_b, hsh_b.size() * 2));
  CK(cudaMalloc(&dw, H * 2));
  CK(cudaMalloc(&db, H * 2));
  CK(cudaMemcpy(dx, hx.data(), xbytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dsc_t, hsc_t.data(), xbytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dsh_t, hsh_t.data(), xbytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dsc_b, hsc_b.data(), hsc_b.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dsh_b, hsh_b.data(), hsh_b.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, hw.data(), H * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), H * 2, cudaMemcpyHostToDevice));
  // Copy baseline buffers: the larger case's half of the bytes (read once, written once).
  const size_t copy_max = 2 * xbytes + 2 * H * 2;
  void *csrc, *cdst;
  CK(cudaMalloc(&csrc, copy_max));
  CK(cudaMalloc(&cdst, copy_max));
  CK(cudaMemset(csrc, 0x5a, copy_max));
  uint16_t* hgot;
  CK(cudaMallocHost(&hgot, xbytes));
  std::vector<uint16_t> href(elems);

  struct Variant {
    const char* id;
    const char* name;
    std::function<bool(const nss::Call&, nss::Shape*)> launch;
  };
  const std::vector<Variant> variants = {
      {"V0", "kreg: warp/row, 12 vec/lane", nss::launch_orig<false>},
      {"V1", "V0 + x/per-token L1::no_allocate", nss::launch_orig<true>},
      {"V2", "8w x 4 rows/blk, mod in smem", nss::launch_rows<8, 4, 3, nss::Pre::kNone, false>},
      {"V3", "V2 + L2 prefetch of next row", nss::launch_rows<8, 4, 3, nss::Pre::kL2, false>},
      {"V4", "4w x 8 rows, next row in regs", nss::launch_rows<4, 8, 3, nss::Pre::kRegs, false>},
      {"V5", "V3 + one-pass stats", nss::launch_rows<8, 4, 3, nss::Pre::kL2, true>},
      {"V6", "TMA row ring 4w x 2 stg x 16 rows", nss::launch_tma<4, 16, 2, 3>},
  };

  struct Case {
    const char* name;
    bool per_token, affine;
  };
  for (const Case& cs : {Case{"A1 [B,H]", false, false}, Case{"A2 [B,S,H]+affine", true, true}}) {
    const nss::Call call{dx,
                         cs.per_token ? dsc_t : dsc_b,
                         cs.per_token ? dsh_t : dsh_b,
                         cs.affine ? dw : nullptr,
                         cs.affine ? db : nullptr,
                         dout,
                         B,
                         S,
                         H,
                         kEps,
                         cs.per_token,
                         cs.per_token};
    const int64_t mod_elems = cs.per_token ? elems : int64_t{B} * H;
    const double bytes = 2.0 * (2.0 * elems + 2.0 * mod_elems + (cs.affine ? 2.0 * H : 0.0));
    ref_norm_scale_shift(hx.data(), cs.per_token ? hsc_t.data() : hsc_b.data(),
                         cs.per_token ? hsh_t.data() : hsh_b.data(), cs.per_token, cs.per_token,
                         cs.affine ? hw.data() : nullptr, cs.affine ? hb.data() : nullptr, B, S, H,
                         kEps, href.data());
    const int64_t copy_words = static_cast<int64_t>(bytes / 2) / 16;
    const float copy_us = median_us([&](int) { copy16(csrc, cdst, copy_words); }, 1);
    const double copy_gbps = 2.0 * copy_words * 16 / copy_us * 1e-3;
    printf(
        "-- case %s: %.1f MB per call (1 buffer set: inputs > 200 MB); copy of %.1f MB: %.2f us, "
        "%.0f GB/s\n",
        cs.name, bytes / 1e6, 2.0 * copy_words * 16 / 1e6, copy_us, copy_gbps);
    for (const Variant& v : variants) {
      nss::Shape shape;
      CK(cudaMemset(dout, 0xff, xbytes));  // NaN: a row the kernel skips cannot pass
      if (!v.launch(call, nullptr)) {
        printf("%-3s %-34s %-22s not applicable\n", v.id, v.name, cs.name);
        continue;
      }
      CK(cudaDeviceSynchronize());
      v.launch(call, &shape);  // describes the launch, launches nothing
      CK(cudaMemcpy(hgot, dout, xbytes, cudaMemcpyDeviceToHost));
      const Diff d = compare_bf16(hgot, href.data(), elems);
      char check[160];
      snprintf(check, sizeof check, "check: max|diff| %.4g, %lld > 1 ulp%s", d.max_abs,
               static_cast<long long>(d.bad), d.bad ? " MISMATCH" : " ok");
      if (d.bad) {
        const int64_t i = d.first_bad;
        printf("    first mismatch at row %lld col %lld: got %g want %g\n",
               static_cast<long long>(i / H), static_cast<long long>(i % H), bf2f(hgot[i]),
               bf2f(href[i]));
      }
      const float us = median_us([&](int) { v.launch(call, nullptr); }, 1);
      report(v.id, v.name, cs.name, us, bytes, copy_gbps, g_big_copy_gbps, check);
      printf("    %s\n", kernel_info(shape.fn, shape.threads, shape.smem, shape.grid).c_str());
    }
  }
  CK(cudaFreeHost(hgot));
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dout), static_cast<void*>(dsc_t),
                  static_cast<void*>(dsh_t), static_cast<void*>(dsc_b), static_cast<void*>(dsh_b),
                  static_cast<void*>(dw), static_cast<void*>(db), csrc, cdst}) {
    CK(cudaFree(p));
  }
}

// ---------------------------------------------------------------------------------------
// (b) set_mla_kv_buffer
// ---------------------------------------------------------------------------------------
void run_mla() {
  constexpr int n = 32768;
  constexpr int64_t P = std::max<int64_t>(2 * n, 4096);
  constexpr int kElems = 576;  // 512 + 64 bf16
  const size_t kv_bytes = static_cast<size_t>(P) * kElems * 2;
  const size_t nope_bytes = size_t{n} * 512 * 2, rope_bytes = size_t{n} * 64 * 2;
  const double bytes = 2.0 * n * kElems * 2 + 8.0 * n;  // the bench case's count
  const int sets = static_cast<int>(std::ceil(200e6 / bytes));
  printf("\n== (b) kvcache.set_mla_kv_buffer n=%d 512+64 bf16, P=%lld rows, i64 loc ==\n", n,
         static_cast<long long>(P));

  // Host data: random finite bf16 rows (and a random initial buffer, so that rows no index
  // names are checked to keep their bytes), distinct random slots (a partial Fisher-Yates).
  Rng rng(777);
  auto rand_bf16 = [&](std::vector<uint16_t>& v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = f2bf((rng.uni() * 2 - 1) * 4);
  };
  std::vector<uint16_t> hkv0(static_cast<size_t>(P) * kElems), hnope(size_t{n} * 512),
      hrope(size_t{n} * 64);
  rand_bf16(hkv0);
  rand_bf16(hnope);
  rand_bf16(hrope);
  std::vector<int64_t> perm(P);
  for (int64_t i = 0; i < P; ++i) perm[i] = i;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(P - i));
    std::swap(perm[i], perm[j]);
  }
  std::vector<int64_t> loc_rand(perm.begin(), perm.begin() + n);
  std::vector<int64_t> loc_bad = loc_rand;  // padding (-1) and out-of-range entries skip rows
  for (int i = 0; i < n; ++i) {
    if (i % 37 == 5) loc_bad[i] = -1;
    if (i % 101 == 7) loc_bad[i] = P + i;
  }
  std::vector<int64_t> loc_sorted = loc_rand;
  std::sort(loc_sorted.begin(), loc_sorted.end());

  auto reference = [&](const std::vector<int64_t>& loc) {
    std::vector<uint16_t> r = hkv0;
    for (int i = 0; i < n; ++i) {
      const int64_t l = loc[i];
      if (l < 0 || l >= P) continue;
      std::memcpy(&r[l * kElems], &hnope[size_t{512} * i], 512 * 2);
      std::memcpy(&r[l * kElems + 512], &hrope[size_t{64} * i], 64 * 2);
    }
    return r;
  };

  struct Set {
    void* kv;
    int64_t* loc_rand;
    int64_t* loc_sorted;
    void* nope;
    void* rope;
    void* csrc;
    void* cdst;
  };
  const int64_t copy_words = static_cast<int64_t>(bytes / 2) / 16;
  std::vector<Set> sv(sets);
  for (Set& s : sv) {
    CK(cudaMalloc(&s.kv, kv_bytes));
    CK(cudaMalloc(&s.loc_rand, n * 8));
    CK(cudaMalloc(&s.loc_sorted, n * 8));
    CK(cudaMalloc(&s.nope, nope_bytes));
    CK(cudaMalloc(&s.rope, rope_bytes));
    CK(cudaMalloc(&s.csrc, copy_words * 16));
    CK(cudaMalloc(&s.cdst, copy_words * 16));
    CK(cudaMemcpy(s.kv, hkv0.data(), kv_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.loc_rand, loc_rand.data(), n * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.loc_sorted, loc_sorted.data(), n * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.nope, hnope.data(), nope_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.rope, hrope.data(), rope_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemset(s.csrc, 0x5a, copy_words * 16));
  }
  int64_t* dloc_bad;
  CK(cudaMalloc(&dloc_bad, n * 8));
  CK(cudaMemcpy(dloc_bad, loc_bad.data(), n * 8, cudaMemcpyHostToDevice));

  const float copy_us = median_us([&](int s) { copy16(sv[s].csrc, sv[s].cdst, copy_words); }, sets);
  const double copy_gbps = 2.0 * copy_words * 16 / copy_us * 1e-3;
  printf(
      "-- %.2f MB per call, %d buffer sets (%.0f MB touched per rotation); copy of %.1f MB: %.2f "
      "us, %.0f GB/s\n",
      bytes / 1e6, sets, sets * bytes / 1e6, 2.0 * copy_words * 16 / 1e6, copy_us, copy_gbps);

  struct Variant {
    const char* id;
    const char* name;
    std::function<bool(const mla::Call&, mla::Shape*)> launch;
  };
  const std::vector<Variant> variants = {
      {"V0", "kreg: flat, 1 word/thread", mla::launch_orig},
      {"V1", "warp/token, 3 words/lane", mla::launch_group<32, false>},
      {"V2", "half-warp/token, 5 words/lane", mla::launch_group<16, false>},
      {"V3", "flat, 4 words/thread", mla::launch_flat_multi<4>},
      {"V4", "persistent warp/token + prefetch", mla::launch_persist},
      {"V5", "V1 + evict-first (.cs) stores", mla::launch_group<32, true>},
      {"V6", "TMA bulk, thread/token, 32/blk", mla::launch_tma},
  };
  const std::vector<uint16_t> ref_rand = reference(loc_rand), ref_bad = reference(loc_bad),
                              ref_sorted = reference(loc_sorted);
  std::vector<uint16_t> got(hkv0.size());
  for (const Variant& v : variants) {
    // Checks on set 0: the bench's indices, indices with -1 / out-of-range entries, sorted.
    std::string check = "check:";
    bool applicable = true;
    for (int k = 0; k < 3 && applicable; ++k) {
      const int64_t* dl = k == 0 ? sv[0].loc_rand : k == 1 ? dloc_bad : sv[0].loc_sorted;
      const std::vector<uint16_t>& want = k == 0 ? ref_rand : k == 1 ? ref_bad : ref_sorted;
      CK(cudaMemcpy(sv[0].kv, hkv0.data(), kv_bytes, cudaMemcpyHostToDevice));
      const mla::Call call{sv[0].kv, dl, sv[0].nope, sv[0].rope, n, P};
      if (!v.launch(call, nullptr)) {
        applicable = false;
        break;
      }
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got.data(), sv[0].kv, kv_bytes, cudaMemcpyDeviceToHost));
      const Diff d = compare_exact(got.data(), want.data(), got.size());
      char s[96];
      snprintf(s, sizeof s, " %s max|diff| %g (%lld differ)%s",
               k == 0   ? "rand"
               : k == 1 ? "pad/oob"
                        : "sorted",
               d.max_abs, static_cast<long long>(d.bad), d.bad ? " MISMATCH" : "");
      check += s;
      if (d.bad) {
        printf("    %s: first mismatch at buffer row %lld elem %lld\n", v.id,
               static_cast<long long>(d.first_bad / kElems),
               static_cast<long long>(d.first_bad % kElems));
      }
    }
    if (!applicable) {
      printf("%-3s %-34s not applicable\n", v.id, v.name);
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      const float us = median_us(
          [&](int s) {
            const mla::Call call{
                sv[s].kv, k == 0 ? sv[s].loc_rand : sv[s].loc_sorted, sv[s].nope, sv[s].rope, n, P};
            v.launch(call, nullptr);
          },
          sets);
      report(v.id, v.name, k == 0 ? "random loc (bench)" : "sorted loc (diag.)", us, bytes,
             copy_gbps, g_big_copy_gbps, k == 0 ? check : std::string());
    }
    mla::Shape shape;
    const mla::Call call{sv[0].kv, sv[0].loc_rand, sv[0].nope, sv[0].rope, n, P};
    v.launch(call, &shape);
    printf("    %s\n", kernel_info(shape.fn, shape.threads, shape.smem, shape.grid).c_str());
  }
  for (Set& s : sv) {
    for (void* p : {s.kv, static_cast<void*>(s.loc_rand), static_cast<void*>(s.loc_sorted), s.nope,
                    s.rope, s.csrc, s.cdst}) {
      CK(cudaFree(p));
    }
  }
  CK(cudaFree(dloc_bad));
}

int main() {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, dev));
  mla::g_sms = p.multiProcessorCount;
  printf("%s: sm_%d%d, %d SMs, L2 %d MB, smem/SM %zu KB\n", p.name, p.major, p.minor,
         p.multiProcessorCount, p.l2CacheSize >> 20, p.sharedMemPerMultiprocessor >> 10);
  if (p.major < 9) {
    printf("needs sm_90 (bulk copies, mbarrier try_wait)\n");
    return 1;
  }
  // vs_torch.py's reference: a 1 GiB device copy, bytes read + written.
  {
    const int64_t words = (int64_t{1} << 30) / 16;
    void *a, *b;
    CK(cudaMalloc(&a, words * 16));
    CK(cudaMalloc(&b, words * 16));
    CK(cudaMemset(a, 0x5a, words * 16));
    const float us = median_us([&](int) { copy16(a, b, words); }, 1);
    const float us_memcpy =
        median_us([&](int) { CK(cudaMemcpyAsync(b, a, words * 16, cudaMemcpyDeviceToDevice)); }, 1);
    g_big_copy_gbps = 2.0 * words * 16 / us * 1e-3;
    printf("1 GiB copy: copy16 %.1f us %.0f GB/s; cudaMemcpyAsync %.1f us %.0f GB/s\n", us,
           g_big_copy_gbps, us_memcpy, 2.0 * words * 16 / us_memcpy * 1e-3);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  printf(
      "columns: variant, what, case, median us, GB/s, %% of a copy of the same bytes, %% of the 1 "
      "GiB copy, check\n");
  run_nss();
  run_mla();
  CK(cudaDeviceSynchronize());
  printf("\ndone\n");
  return 0;
}
