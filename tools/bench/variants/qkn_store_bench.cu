// Scratch benchmark (not part of kreg): candidate kernels for two ops that miss their
// bandwidth goals on the H200 (sm_90, 132 SMs):
//  (a) attention.fused_qk_norm_rope, T=32768, heads 32/8/8, hd=128, bf16, int64 positions:
//      NeoX (base 1e6, the 210 us / 76% case, goal 90%) and GPT-J (base 1e4), as in
//      tools/bench/cases/attention.py; bytes = q and k heads read + written, two weights,
//      the positions.
//  (b) kvcache.store, T=32768 Hk=8 D=128 page=16 bf16->bf16 into [4096, 16, 8, 128]
//      caches at distinct random int64 slots (tools/bench/cases/kvcache.py; ~83% now,
//      goal 85-90%).
// Candidates (details at each kernel):
//  A1 half warp per head, 16-byte lanes, 4 warps a token, 128-thread blocks, no smem/barrier
//  A2 A1 + one bulk L2 prefetch (cp.async.bulk.prefetch) of token t + 2048's q/k heads
//  A3 a warp per token (20 heads a half warp in flight), 8 tokens a 256-thread block
//  A4 A1 persistent, the next token's heads loaded while the current one is computed
//  A5 TMA ring: 16 stages of a token's 10 KB q/k heads, 1 producer + 8 consumer warps
//  A6 A1 with a Cody-Waite reduction + __sincosf instead of sincosf (diagnostic)
//  B1 one 16-byte word per thread (256-thread block = a token), ld.cs
//  B2 4 tokens a 128-thread block (8 words a thread), indices first
//  B3 persistent warp per token, next token's index and words loaded before the stores
//  B4 B1 with default loads;  B5 B1 with st.cs stores
//  B6 TMA bulk copies, a thread per token (2 x 2 KiB in, 2 x 2 KiB out), 8 tokens a block
// Variant 0 of each is a copy of the kernel and launch shape in plugins/ (fused_qk_norm_rope.cu
// and store.cu as of commits 147ebb7 / 75cde9a); the others are candidates. Every variant is
// checked against a CPU reference (the loops of plugins/*/reference.cpp) on random inputs from
// fixed seeds, then timed: CUDA events around each call, all calls enqueued back to back,
// median of 30, rotating over buffer sets of > 200 MB (one set each here: a call touches
// more), next to a 16-byte-per-thread copy of the same bytes (and a 1 GiB copy, vs_torch's
// reference) timed in the same program. Register counts, spills and blocks/SM are printed
// for every variant.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 qkn_store_bench.cu -o qs && ./qs
#include <cuda_bf16.h>
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

inline int g_sms = 132;

// ---------------------------------------------------------------------------------------
// PTX helpers (mbarriers and bulk copies, sm_90)
// ---------------------------------------------------------------------------------------
namespace ptx {

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
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits for the completion of the phase of parity `parity`. A wait of more than 2^32 clocks
// (~2 s) traps instead of hanging: the launch then fails with an error the host reports.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try(bar, parity)) return;
  const long long start = clock64();
  while (!mbar_try(bar, parity)) {
    if (clock64() - start > (1ll << 32)) {
      printf("mbarrier wait timed out: block %d thread %d parity %u\n",
             static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), parity);
      __trap();
    }
  }
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
// Bulk prefetch of `bytes` (a multiple of 16, 16-byte aligned) from global memory into L2.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// Orders this thread's earlier shared-memory accesses before its later async-proxy ones.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace ptx

// ---------------------------------------------------------------------------------------
// Variant 0 sources: copies of kreg's device helpers (vec.cuh, warp.cuh) and of the two
// kernels with their launchers. Changes: namespaces; only the pieces these cases reach
// (bf16, hd = 128 instantiations; 16-byte words for store); std::bit_ceil (C++20) as a loop.
// ---------------------------------------------------------------------------------------
namespace orig {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  static_assert(std::is_same_v<T, __nv_bfloat16>, "bench: bf16 only");
  return __float2bfloat16_rn(v);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullWarpMask, v, offset);
  }
  return v;
}

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
template <int kBytes>
using word_t = typename RawWord<kBytes>::type;

template <typename T, int N>
struct vec_t {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static constexpr int kWordBytes = kBytes < 16 ? kBytes : 16;
  using Word = word_t<kWordBytes>;
  static constexpr int kWords = kBytes / kWordBytes;
  alignas(kWordBytes) T data[N];
  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }
  __device__ __forceinline__ void load(const T* ptr) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(data)[w] = reinterpret_cast<const Word*>(ptr)[w];
    }
  }
  __device__ __forceinline__ void store(T* ptr) const {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(ptr)[w] = reinterpret_cast<const Word*>(data)[w];
    }
  }
};

// ---- plugins/attention/fused_qk_norm_rope.cu ----

constexpr int kMaxWarps = 8;
constexpr int kBatch = 8;
constexpr int kMaxHalf = 128;

struct InvFreq {
  float v[kMaxHalf];
};

struct QkvShape {
  int heads_q;
  int heads_qk;  // q and k heads: the ones this op rewrites
  int64_t width;
  float eps;
  bool pos64;
  bool aligned;  // qkv and the weights are aligned for vec_t<T, hd / 32>
};

template <int N, typename T>
__device__ __forceinline__ void load_raw(vec_t<T, N>& v, const T* p, bool aligned) {
  if (aligned) {
    v.load(p);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = p[j];
  }
}

template <typename T, int kHeadDim, bool kNeox>
__global__ void __launch_bounds__(kMaxWarps * 32)
    fused_qk_norm_rope_kernel(T* __restrict__ qkv, const T* __restrict__ q_weight,
                              const T* __restrict__ k_weight, const void* __restrict__ positions,
                              QkvShape shape, const __grid_constant__ InvFreq inv_freq) {
  constexpr int kElems = kHeadDim / 32;
  constexpr int kHalf = kHeadDim / 2;
  __shared__ float cos_s[kHalf];
  __shared__ float sin_s[kHalf];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  const int64_t t = blockIdx.x;
  T* row = qkv + t * shape.width;

  // The first batch of heads goes out before anything else.
  vec_t<T, kElems> raw[kBatch];
  auto load_batch = [&](int first) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int h = first + warp + b * warps;
      if (h < shape.heads_qk) load_raw(raw[b], row + h * kHeadDim + lane * kElems, shape.aligned);
    }
  };
  load_batch(0);

  float wq[kElems], wk[kElems];
  {
    vec_t<T, kElems> w;
    load_raw(w, q_weight + lane * kElems, shape.aligned);
#pragma unroll
    for (int j = 0; j < kElems; ++j) wq[j] = to_float(w[j]);
    load_raw(w, k_weight + lane * kElems, shape.aligned);
#pragma unroll
    for (int j = 0; j < kElems; ++j) wk[j] = to_float(w[j]);
  }

  const int64_t pos = shape.pos64 ? static_cast<const int64_t*>(positions)[t]
                                  : static_cast<const int32_t*>(positions)[t];
  const float fpos = static_cast<float>(pos);
  for (int i = static_cast<int>(threadIdx.x); i < kHalf; i += static_cast<int>(blockDim.x)) {
    float s, c;
    sincosf(fpos * inv_freq.v[i], &s, &c);
    sin_s[i] = s;
    cos_s[i] = c;
  }
  __syncthreads();

  const float inv_dim = 1.0f / static_cast<float>(kHeadDim);
  for (int first = 0; first < shape.heads_qk; first += kBatch * warps) {
    if (first > 0) load_batch(first);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int h = first + warp + b * warps;  // uniform across the warp
      if (h >= shape.heads_qk) break;
      const bool is_q = h < shape.heads_q;
      float y[kElems];
      float sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kElems; ++j) {
        y[j] = to_float(raw[b][j]);
        sum_sq += y[j] * y[j];
      }
      sum_sq = warp_sum(sum_sq);
      const float inv_rms = rsqrtf(sum_sq * inv_dim + shape.eps);
#pragma unroll
      for (int j = 0; j < kElems; ++j) y[j] = y[j] * inv_rms * (is_q ? wq[j] : wk[j]);
      vec_t<T, kElems> out;
      if constexpr (kNeox) {
        // Lanes 0-15 hold the first half (x1), lanes 16-31 the second (x2):
        // x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
        const bool first_half = lane < 16;
#pragma unroll
        for (int j = 0; j < kElems; ++j) {
          const float other = __shfl_xor_sync(kFullWarpMask, y[j], 16);
          const int i = (lane & 15) * kElems + j;
          const float c = cos_s[i], s = sin_s[i];
          out[j] = from_float<T>(first_half ? y[j] * c - other * s : y[j] * c + other * s);
        }
      } else {
#pragma unroll
        for (int p = 0; p < kElems / 2; ++p) {
          const int i = (lane * kElems) / 2 + p;
          const float c = cos_s[i], s = sin_s[i];
          const float a = y[2 * p], bb = y[2 * p + 1];
          out[2 * p] = from_float<T>(a * c - bb * s);
          out[2 * p + 1] = from_float<T>(bb * c + a * s);
        }
      }
      T* dst = row + h * kHeadDim + lane * kElems;
      if (shape.aligned) {
        out.store(dst);
      } else {
#pragma unroll
        for (int j = 0; j < kElems; ++j) dst[j] = out[j];
      }
    }
  }
}

template <typename T, int kHeadDim, bool kNeox>
cudaError_t launch_qkn(T* qkv, const T* qw, const T* kw, const void* positions,
                       const QkvShape& shape, int64_t tokens, const InvFreq& inv_freq,
                       cudaStream_t stream) {
  const int warps = std::min(kMaxWarps, shape.heads_qk);
  fused_qk_norm_rope_kernel<T, kHeadDim, kNeox>
      <<<static_cast<unsigned>(tokens), warps * 32, 0, stream>>>(qkv, qw, kw, positions, shape,
                                                                 inv_freq);
  return cudaGetLastError();
}

// ---- plugins/kvcache/store.cu: kvcache.store, same dtype ----

constexpr int kBlockThreads = 256;
constexpr int kUnroll = 8;

int log2_lanes_for(int64_t words) {
  uint64_t lanes = 1;
  while (lanes < static_cast<uint64_t>(std::clamp<int64_t>(words, 1, 32))) lanes *= 2;
  int l = 0;
  while ((uint64_t{1} << l) < lanes) ++l;
  return l;
}

struct RowGroup {
  int64_t row;
  int lane;
  int lanes;
};

__device__ __forceinline__ RowGroup row_group(int log2_lanes) {
  const int tid = static_cast<int>(threadIdx.x);
  return {static_cast<int64_t>(blockIdx.x) * (kBlockThreads >> log2_lanes) + (tid >> log2_lanes),
          tid & ((1 << log2_lanes) - 1), 1 << log2_lanes};
}

template <typename Idx>
__device__ __forceinline__ int64_t load_index(const Idx* idx, int64_t i) {
  return static_cast<int64_t>(__ldg(idx + i));
}

template <typename Idx, typename W>
__global__ void __launch_bounds__(kBlockThreads)
    store_copy_kernel(const W* __restrict__ k, const W* __restrict__ v,
                      const Idx* __restrict__ slots, W* __restrict__ k_cache,
                      W* __restrict__ v_cache, int64_t tokens, int64_t num_slots, int row_words,
                      int log2_lanes) {
  const RowGroup g = row_group(log2_lanes);
  if (g.row >= tokens) return;
  const int64_t slot = load_index(slots, g.row);  // in flight with the first loads below
  const W* ks = k + g.row * row_words;
  const W* vs = v + g.row * row_words;
  const int total = 2 * row_words;  // k's words, then v's
  for (int base = g.lane; base < total; base += kUnroll * g.lanes) {
    W buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * g.lanes;
      if (j < total) buf[u] = j < row_words ? __ldcs(ks + j) : __ldcs(vs + (j - row_words));
    }
    if (slot < 0 || slot >= num_slots) return;
    W* kd = k_cache + slot * row_words;
    W* vd = v_cache + slot * row_words;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * g.lanes;
      if (j < total) {
        if (j < row_words) {
          kd[j] = buf[u];
        } else {
          vd[j - row_words] = buf[u];
        }
      }
    }
  }
}

unsigned grid_for(int64_t rows, int log2_lanes) {
  const int64_t rows_per_block = kBlockThreads >> log2_lanes;
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

// launch_store_copy<int64_t, 16> of store.cu (the case's 16-byte words, i64 slots).
void launch_store_copy16(const void* k, const void* v, const int64_t* slots, void* kc, void* vc,
                         int64_t tokens, int64_t num_slots, int64_t row_bytes,
                         cudaStream_t stream) {
  using W = word_t<16>;
  const int64_t words = row_bytes / 16;
  const int log2_lanes = log2_lanes_for(2 * words);
  store_copy_kernel<int64_t, W><<<grid_for(tokens, log2_lanes), kBlockThreads, 0, stream>>>(
      static_cast<const W*>(k), static_cast<const W*>(v), slots, static_cast<W*>(kc),
      static_cast<W*>(vc), tokens, num_slots, static_cast<int>(words), log2_lanes);
}

}  // namespace orig

// ---------------------------------------------------------------------------------------
// Launch bookkeeping shared by both ops
// ---------------------------------------------------------------------------------------
struct Shape {
  const void* fn = nullptr;
  int threads = 0;
  size_t smem = 0;
  unsigned grid = 0;
};

template <typename K>
void set_shape(Shape* s, K* fn, int threads, size_t smem, unsigned grid) {
  *s = {reinterpret_cast<const void*>(fn), threads, smem, grid};
}

// Blocks of `fn` resident per SM (at least 1), cached by the caller.
template <typename K>
int blocks_per_sm(K* fn, int threads, size_t smem) {
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem));
  return std::max(per_sm, 1);
}

// ---------------------------------------------------------------------------------------
// (a) fused_qk_norm_rope candidates, hd = 128 bf16.
//
// Common layout (A1-A6): a half warp per head, lane l holds elements [8 hl, 8 hl + 8) of it
// (hl = l & 15: one 16-byte access); the sum of squares is a 16-lane butterfly (xor 8..1);
// the NeoX partner of element i (i + 64) is in lane l ^ 8; GPT-J pairs are inside a lane.
// A warp's two half warps take adjacent heads, so one warp instruction moves 512
// contiguous bytes. The token's 64 angles are computed per warp, no shared memory and no
// block barrier: lane m takes angles 2m and 2m + 1 (two sincosf) and every lane fetches
// the 8 (NeoX) or 4 (GPT-J) cos/sin it needs with shuffles (lane 4 (l & 7) + j / 2, resp.
// 2 hl + p / 2: a compile-time register choice, so one shuffle per value).
// The numerics are the kernel's: fp32 angle float(pos) * inv_freq[i] (inv_freq from the
// host's double pow), full-range sincosf (A6: a Cody-Waite reduction + __sincosf), the
// normalized head in fp32, one rounding at the store. The table is read from a 256-byte
// device buffer (the plugin would keep one per device), not from a __grid_constant__
// parameter: lanes index it with distinct addresses, which the constant cache serializes.
// ---------------------------------------------------------------------------------------
namespace qkn {

constexpr int kHD = 128;
constexpr unsigned kFull = 0xffffffffu;

struct Args {
  bf16* qkv;
  const bf16* qw;
  const bf16* kw;
  const int64_t* pos;
  const float* inv_freq;  // 64 floats, device memory
  int tokens;
  int heads_q;
  int heads_qk;
  int64_t width;  // elements per token row
  float eps;
};

__device__ __forceinline__ void unpack8(const uint4& r, float (&f)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    f[2 * q] = __uint_as_float(w[q] << 16);  // the lower element of the pair: low bits
    f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 p = __float22bfloat162_rn(make_float2(lo, hi));
  return *reinterpret_cast<const uint32_t*>(&p);
}

template <bool kFast>
__device__ __forceinline__ void sin_cos(float a, float* s, float* c) {
  if constexpr (kFast) {
    // a - k 2pi with 2pi = C1 + C2 (C1 = float(2pi)), both by fma: |r| <= pi, absolute
    // error ~2.5e-7 for |a| up to ~1e6; then the fast intrinsic (abs error 2^-21.4 on
    // [-pi, pi]).
    const float k = rintf(a * 0.159154943091895336f);
    float r = fmaf(k, -6.28318548202514648f, a);
    r = fmaf(k, 1.74845553146951715e-07f, r);
    __sincosf(r, s, c);
  } else {
    sincosf(a, s, c);
  }
}

template <bool kNeox>
struct Rot {
  static constexpr int N = kNeox ? 8 : 4;
  float c[N], s[N];
};

// All 32 lanes must call it (shuffles).
template <bool kNeox, bool kFast>
__device__ __forceinline__ Rot<kNeox> make_rot(float fpos, float2 invf, int lane) {
  float s0, c0, s1, c1;
  sin_cos<kFast>(fpos * invf.x, &s0, &c0);  // angle 2 lane
  sin_cos<kFast>(fpos * invf.y, &s1, &c1);  // angle 2 lane + 1
  Rot<kNeox> r;
  if constexpr (kNeox) {
    // Lane l's elements are pairs i = 8 (l & 7) + j: held by lane 4 (l & 7) + j / 2.
    const int base = 4 * (lane & 7);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      r.c[j] = __shfl_sync(kFull, (j & 1) ? c1 : c0, base + (j >> 1));
      r.s[j] = __shfl_sync(kFull, (j & 1) ? s1 : s0, base + (j >> 1));
    }
  } else {
    // Lane l's pairs are i = 4 hl + p: held by lane 2 hl + p / 2.
    const int base = 2 * (lane & 15);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      r.c[p] = __shfl_sync(kFull, (p & 1) ? c1 : c0, base + (p >> 1));
      r.s[p] = __shfl_sync(kFull, (p & 1) ? s1 : s0, base + (p >> 1));
    }
  }
  return r;
}

// One head's 8 elements of this lane: RMS-normalized with weight w and rotated. All 32
// lanes must call it (shuffles); each half warp carries its own head.
template <bool kNeox>
__device__ __forceinline__ uint4 norm_rope(const uint4& raw, const float (&w)[8],
                                           const Rot<kNeox>& r, float eps, int lane) {
  float y[8];
  unpack8(raw, y);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) ss += y[j] * y[j];
#pragma unroll
  for (int o = 8; o > 0; o /= 2) ss += __shfl_xor_sync(kFull, ss, o);
  const float inv_rms = rsqrtf(ss * (1.0f / static_cast<float>(kHD)) + eps);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = y[j] * inv_rms * w[j];
  float out[8];
  if constexpr (kNeox) {
    const bool first_half = (lane & 8) == 0;  // elements 0..63: x1
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float other = __shfl_xor_sync(kFull, y[j], 8);
      const float c = r.c[j], s = r.s[j];
      out[j] = first_half ? y[j] * c - other * s : y[j] * c + other * s;
    }
  } else {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float c = r.c[p], s = r.s[p];
      const float a = y[2 * p], b = y[2 * p + 1];
      out[2 * p] = a * c - b * s;
      out[2 * p + 1] = b * c + a * s;
    }
  }
  return make_uint4(pack2(out[0], out[1]), pack2(out[2], out[3]), pack2(out[4], out[5]),
                    pack2(out[6], out[7]));
}

__device__ __forceinline__ uint4 ld16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void st16(bf16* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }

// A1, A2, A3, A6: kWPT warps per token, kTPB tokens per block; each half warp loads all of its kHPH
// heads (h = its index among the token's 2 kWPT half warps + k 2 kWPT) up front, then the
// position, the table pair, the weights; computes the angles while the loads fly; then
// normalizes, rotates and stores head by head.
//
// kPrefetch > 0 (A2): the token group's first lane also issues one bulk L2 prefetch of the
// q/k heads of token t + kPrefetch (a block that runs about two waves later), so that the
// later block's loads hit L2: more bytes in flight than the registers hold.
//
// kFreq (A7, A8: where the inv_freq table comes from): 0 the device buffer a.inv_freq, one
// float2 a lane; 1 a __grid_constant__ parameter read by every lane at its own address (the
// plugin's kernel of 2026-12-02: the constant cache serializes the 32 addresses of a warp's
// load, 64 a warp, 256 a block); 2 the same parameter copied into shared memory by the first
// warp (32 addresses a block) behind one block barrier.
template <bool kNeox, int kWPT, int kTPB, int kHPH, bool kFast, int kMinBlocks, int kPrefetch,
          int kFreq = 0>
__global__ void __launch_bounds__(kWPT* kTPB * 32, kMinBlocks)
    qkn_direct_kernel(const Args a, const __grid_constant__ orig::InvFreq inv) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int t = static_cast<int>(blockIdx.x) * kTPB + warp / kWPT;
  if (t >= a.tokens) return;  // warp-uniform; no block barrier below
  const int hl = lane & 15;
  const int first_head = (warp % kWPT) * 2 + (lane >> 4);
  bf16* row = a.qkv + static_cast<int64_t>(t) * a.width;
  uint4 raw[kHPH];
#pragma unroll
  for (int k = 0; k < kHPH; ++k) {
    const int h = first_head + k * 2 * kWPT;
    raw[k] = make_uint4(0, 0, 0, 0);
    if (h < a.heads_qk) raw[k] = ld16(row + h * kHD + hl * 8);
  }
  if constexpr (kPrefetch > 0) {
    if (warp % kWPT == 0 && lane == 0 && t + kPrefetch < a.tokens) {
      ptx::bulk_prefetch_l2(a.qkv + static_cast<int64_t>(t + kPrefetch) * a.width,
                            static_cast<uint32_t>(a.heads_qk) * kHD * 2);
    }
  }
  const float fpos = static_cast<float>(__ldg(a.pos + t));
  float2 invf;
  if constexpr (kFreq == 0) {
    invf = __ldg(reinterpret_cast<const float2*>(a.inv_freq) + lane);
  } else if constexpr (kFreq == 1) {
    invf = make_float2(inv.v[2 * lane], inv.v[2 * lane + 1]);
  } else {
    __shared__ float2 freq_s[32];
    if (threadIdx.x < 32) freq_s[lane] = make_float2(inv.v[2 * lane], inv.v[2 * lane + 1]);
    __syncthreads();
    invf = freq_s[lane];
  }
  const uint4 wq = __ldg(reinterpret_cast<const uint4*>(a.qw) + hl);
  const uint4 wk = __ldg(reinterpret_cast<const uint4*>(a.kw) + hl);
  const Rot<kNeox> rot = make_rot<kNeox, kFast>(fpos, invf, lane);
#pragma unroll
  for (int k = 0; k < kHPH; ++k) {
    const int h = first_head + k * 2 * kWPT;
    float w[8];
    unpack8(h < a.heads_q ? wq : wk, w);
    const uint4 out = norm_rope<kNeox>(raw[k], w, rot, a.eps, lane);
    if (h < a.heads_qk) st16(row + h * kHD + hl * 8, out);
  }
}

// A4: persistent, 4 warps (one token) a block, tokens blockIdx.x, + gridDim.x, ...; the next
// token's heads and position are loaded before the current token is computed (two register
// buffers, ping-pong).
template <bool kNeox, int kHPH, bool kFast, int kMinBlocks>
__global__ void __launch_bounds__(128, kMinBlocks) qkn_persist_kernel(const Args a) {
  constexpr int kWPT = 4;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int hl = lane & 15;
  const int first_head = warp * 2 + (lane >> 4);
  const int G = static_cast<int>(gridDim.x);
  int t = static_cast<int>(blockIdx.x);
  if (t >= a.tokens) return;
  const float2 invf = __ldg(reinterpret_cast<const float2*>(a.inv_freq) + lane);
  const uint4 wq = __ldg(reinterpret_cast<const uint4*>(a.qw) + hl);
  const uint4 wk = __ldg(reinterpret_cast<const uint4*>(a.kw) + hl);
  auto load = [&](int tok, uint4(&r)[kHPH], int64_t& p) {
    const bf16* row = a.qkv + static_cast<int64_t>(tok) * a.width;
#pragma unroll
    for (int k = 0; k < kHPH; ++k) {
      const int h = first_head + k * 2 * kWPT;
      r[k] = make_uint4(0, 0, 0, 0);
      if (h < a.heads_qk) r[k] = ld16(row + h * kHD + hl * 8);
    }
    p = __ldg(a.pos + tok);
  };
  auto compute = [&](int tok, const uint4(&r)[kHPH], int64_t p) {
    bf16* row = a.qkv + static_cast<int64_t>(tok) * a.width;
    const Rot<kNeox> rot = make_rot<kNeox, kFast>(static_cast<float>(p), invf, lane);
#pragma unroll
    for (int k = 0; k < kHPH; ++k) {
      const int h = first_head + k * 2 * kWPT;
      float w[8];
      unpack8(h < a.heads_q ? wq : wk, w);
      const uint4 out = norm_rope<kNeox>(r[k], w, rot, a.eps, lane);
      if (h < a.heads_qk) st16(row + h * kHD + hl * 8, out);
    }
  };
  uint4 ra[kHPH], rb[kHPH];
  int64_t pa = 0, pb = 0;
  load(t, ra, pa);
  while (true) {
    const int t1 = t + G;
    if (t1 < a.tokens) load(t1, rb, pb);
    compute(t, ra, pa);
    if (t1 >= a.tokens) break;
    const int t2 = t1 + G;
    if (t2 < a.tokens) load(t2, ra, pa);
    compute(t1, rb, pb);
    if (t2 >= a.tokens) break;
    t = t2;
  }
}

// A5: bulk copies (TMA) into a ring of kStages token buffers in shared memory
// (heads_qk * 256 bytes each: a token's q and k heads are contiguous, one cp.async.bulk).
// Persistent: block b owns tokens b, b + G, ... (local index n). Warp kConsumers is the
// producer (one lane): for each n it waits until stage n % kStages is free (empty
// barrier), then issues the token's copy completing on the full barrier. Consumer warp w
// takes the tokens n = w (mod kConsumers), a whole token per warp (so the angles are
// computed once per token): the position (prefetched one token ahead) and angles first,
// then it waits for the data, normalizes and rotates head pairs from shared memory into
// 16-byte global stores, and frees the stage (one arrive). No block barrier after setup.
template <bool kNeox, int kConsumers, int kStages, bool kFast>
__global__ void __launch_bounds__((kConsumers + 1) * 32, 1) qkn_tma_kernel(const Args a) {
  extern __shared__ __align__(128) unsigned char qkn_ring[];
  __shared__ __align__(8) uint64_t full_bar[kStages];
  __shared__ __align__(8) uint64_t empty_bar[kStages];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const uint32_t stage_bytes = static_cast<uint32_t>(a.heads_qk) * kHD * 2;
  const int G = static_cast<int>(gridDim.x);
  const int b = static_cast<int>(blockIdx.x);
  const int nloc = b < a.tokens ? (a.tokens - 1 - b) / G + 1 : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(ptx::smem_u32(&full_bar[s]), 1);
      ptx::mbar_init(ptx::smem_u32(&empty_bar[s]), 1);
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  if (warp == kConsumers) {  // producer
    if (lane == 0) {
      for (int n = 0; n < nloc; ++n) {
        const int s = n % kStages;
        if (n >= kStages) ptx::mbar_wait(ptx::smem_u32(&empty_bar[s]), ((n / kStages) - 1) & 1);
        const uint32_t full = ptx::smem_u32(&full_bar[s]);
        ptx::mbar_arrive_expect_tx(full, stage_bytes);
        ptx::bulk_g2s(ptx::smem_u32(qkn_ring + static_cast<size_t>(s) * stage_bytes),
                      a.qkv + static_cast<int64_t>(b + n * G) * a.width, stage_bytes, full);
      }
    }
    return;
  }
  const int hl = lane & 15;
  const int half = lane >> 4;
  const float2 invf = __ldg(reinterpret_cast<const float2*>(a.inv_freq) + lane);
  float wq[8], wk[8];
  unpack8(__ldg(reinterpret_cast<const uint4*>(a.qw) + hl), wq);
  unpack8(__ldg(reinterpret_cast<const uint4*>(a.kw) + hl), wk);
  int64_t pos_cur = warp < nloc ? __ldg(a.pos + b + warp * G) : 0;
  for (int n = warp; n < nloc; n += kConsumers) {
    const int nn = n + kConsumers;
    const int64_t pos_nxt = nn < nloc ? __ldg(a.pos + b + static_cast<int64_t>(nn) * G) : 0;
    const Rot<kNeox> rot = make_rot<kNeox, kFast>(static_cast<float>(pos_cur), invf, lane);
    const int s = n % kStages;
    ptx::mbar_wait(ptx::smem_u32(&full_bar[s]), (n / kStages) & 1);
    const unsigned char* sb = qkn_ring + static_cast<size_t>(s) * stage_bytes;
    bf16* row = a.qkv + static_cast<int64_t>(b + n * G) * a.width;
#pragma unroll 2
    for (int h0 = 0; h0 < a.heads_qk; h0 += 2) {
      const int h = h0 + half;
      const bool valid = h < a.heads_qk;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (valid) raw = *reinterpret_cast<const uint4*>(sb + h * (kHD * 2) + hl * 16);
      const bool is_q = h < a.heads_q;
      float w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = is_q ? wq[j] : wk[j];
      const uint4 out = norm_rope<kNeox>(raw, w, rot, a.eps, lane);
      if (valid) st16(row + h * kHD + hl * 8, out);
    }
    __syncwarp();  // every lane's reads of stage s are done
    if (lane == 0) ptx::mbar_arrive(ptx::smem_u32(&empty_bar[s]));
    pos_cur = pos_nxt;
  }
}

struct Call {
  bf16* qkv;
  const bf16* qw;
  const bf16* kw;
  const int64_t* pos;
  const float* inv_freq_dev;
  const orig::InvFreq* inv_freq_host;
  int tokens, heads_q, heads_k, heads_v;
  float eps;
  bool neox;
};

Args args_of(const Call& c) {
  return {c.qkv,
          c.qw,
          c.kw,
          c.pos,
          c.inv_freq_dev,
          c.tokens,
          c.heads_q,
          c.heads_q + c.heads_k,
          static_cast<int64_t>(c.heads_q + c.heads_k + c.heads_v) * kHD,
          c.eps};
}

// A0: kreg's launch, as fused_qk_norm_rope_cuda builds it (bf16, hd 128, int64 positions).
bool launch_orig(const Call& c, Shape* shape) {
  const uintptr_t bytes = static_cast<uintptr_t>(kHD / 32) * sizeof(bf16);
  const uintptr_t bits = reinterpret_cast<uintptr_t>(c.qkv) | reinterpret_cast<uintptr_t>(c.qw) |
                         reinterpret_cast<uintptr_t>(c.kw);
  const orig::QkvShape s{c.heads_q,
                         c.heads_q + c.heads_k,
                         static_cast<int64_t>(c.heads_q + c.heads_k + c.heads_v) * kHD,
                         c.eps,
                         true,
                         bits % bytes == 0};
  if (shape) {
    const int warps = std::min(orig::kMaxWarps, s.heads_qk);
    auto* fn = c.neox ? orig::fused_qk_norm_rope_kernel<bf16, kHD, true>
                      : orig::fused_qk_norm_rope_kernel<bf16, kHD, false>;
    set_shape(shape, fn, warps * 32, 0, static_cast<unsigned>(c.tokens));
    return true;
  }
  const cudaError_t err =
      c.neox ? orig::launch_qkn<bf16, kHD, true>(c.qkv, c.qw, c.kw, c.pos, s, c.tokens,
                                                 *c.inv_freq_host, nullptr)
             : orig::launch_qkn<bf16, kHD, false>(c.qkv, c.qw, c.kw, c.pos, s, c.tokens,
                                                  *c.inv_freq_host, nullptr);
  CK(err);
  return true;
}

template <int kWPT, int kTPB, int kHPH, bool kFast, int kMinBlocks, int kPrefetch, int kFreq = 0>
bool launch_direct(const Call& c, Shape* shape) {
  const Args a = args_of(c);
  if (a.heads_qk > 2 * kWPT * kHPH) return false;
  if (kFreq == 2 && kTPB != 1) return false;  // the smem copy assumes the block is one token
  auto* fn = c.neox
                 ? qkn_direct_kernel<true, kWPT, kTPB, kHPH, kFast, kMinBlocks, kPrefetch, kFreq>
                 : qkn_direct_kernel<false, kWPT, kTPB, kHPH, kFast, kMinBlocks, kPrefetch, kFreq>;
  const int threads = kWPT * kTPB * 32;
  const unsigned grid = static_cast<unsigned>((c.tokens + kTPB - 1) / kTPB);
  if (shape) {
    set_shape(shape, fn, threads, 0, grid);
    return true;
  }
  fn<<<grid, threads>>>(a, *c.inv_freq_host);
  CK(cudaGetLastError());
  return true;
}

template <int kHPH, bool kFast, int kMinBlocks>
bool launch_persist(const Call& c, Shape* shape) {
  const Args a = args_of(c);
  if (a.heads_qk > 8 * kHPH) return false;
  auto* fn = c.neox ? qkn_persist_kernel<true, kHPH, kFast, kMinBlocks>
                    : qkn_persist_kernel<false, kHPH, kFast, kMinBlocks>;
  static int per_sm[2] = {0, 0};
  int& ps = per_sm[c.neox ? 1 : 0];
  if (ps == 0) ps = blocks_per_sm(fn, 128, 0);
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>(c.tokens, static_cast<int64_t>(g_sms) * ps));
  if (shape) {
    set_shape(shape, fn, 128, 0, grid);
    return true;
  }
  fn<<<grid, 128>>>(a);
  CK(cudaGetLastError());
  return true;
}

template <int kConsumers, int kStages, bool kFast>
bool launch_tma(const Call& c, Shape* shape) {
  const Args a = args_of(c);
  const size_t smem = static_cast<size_t>(kStages) * a.heads_qk * kHD * 2;
  if (a.heads_qk == 0 || smem > 200 * 1024) return false;  // the static barriers need room too
  auto* fn = c.neox ? qkn_tma_kernel<true, kConsumers, kStages, kFast>
                    : qkn_tma_kernel<false, kConsumers, kStages, kFast>;
  const int threads = (kConsumers + 1) * 32;
  static int per_sm[2] = {0, 0};
  int& ps = per_sm[c.neox ? 1 : 0];
  if (ps == 0) {
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    ps = blocks_per_sm(fn, threads, smem);
  }
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>(c.tokens, static_cast<int64_t>(g_sms) * ps));
  if (shape) {
    set_shape(shape, fn, threads, smem, grid);
    return true;
  }
  fn<<<grid, threads, smem>>>(a);
  CK(cudaGetLastError());
  return true;
}

}  // namespace qkn

// ---------------------------------------------------------------------------------------
// (b) kvcache.store candidates: bf16 rows of Hk * D = 1024 elements = 128 16-byte words for
// k and as many for v; int64 slots; caches [num_slots, 128 words] each.
// ---------------------------------------------------------------------------------------
namespace kvs {

constexpr int kRowW = 128;  // 16-byte words of one k (or v) row

struct Call {
  const uint4* k;
  const uint4* v;
  const int64_t* slots;
  uint4* kc;
  uint4* vc;
  int tokens;
  int64_t num_slots;
};

template <bool kCs>
__device__ __forceinline__ uint4 ld(const uint4* p) {
  if constexpr (kCs) {
    return __ldcs(p);
  } else {
    return *p;
  }
}
template <bool kCs>
__device__ __forceinline__ void st(uint4* p, const uint4& v) {
  if constexpr (kCs) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

// B1, B4, B5: one 16-byte word per thread (copy_rows' / set_mla_flat's shape): thread i moves
// word i % 256 of token i / 256 (k's 128 words, then v's); a 256-thread block is one token.
// Every thread loads the token's index with its word (one broadcast request per warp).
template <bool kLdCs, bool kStCs>
__global__ void __launch_bounds__(256) store_flat_kernel(const Call c) {
  const uint32_t i = blockIdx.x * 256u + threadIdx.x;
  const uint32_t t = i / (2 * kRowW);
  if (t >= static_cast<uint32_t>(c.tokens)) return;
  const uint32_t j = i % (2 * kRowW);
  const int64_t slot = __ldg(c.slots + t);
  const bool is_v = j >= kRowW;
  const uint32_t col = is_v ? j - kRowW : j;
  const uint4 w = ld<kLdCs>((is_v ? c.v : c.k) + static_cast<int64_t>(t) * kRowW + col);
  if (slot < 0 || slot >= c.num_slots) return;
  st<kStCs>((is_v ? c.vc : c.kc) + slot * kRowW + col, w);
}

// B2: a 128-thread block takes kTok consecutive tokens; thread j moves word j of each
// token's k and v rows: all kTok indices first, then the 2 kTok loads, then the stores.
template <int kTok>
__global__ void __launch_bounds__(kRowW) store_tok_kernel(const Call c) {
  const int j = static_cast<int>(threadIdx.x);
  const int t0 = static_cast<int>(blockIdx.x) * kTok;
  int64_t slot[kTok];
  uint4 a[kTok], b[kTok];
#pragma unroll
  for (int u = 0; u < kTok; ++u) slot[u] = t0 + u < c.tokens ? __ldg(c.slots + t0 + u) : -1;
#pragma unroll
  for (int u = 0; u < kTok; ++u) {
    if (t0 + u < c.tokens) {
      const int64_t off = static_cast<int64_t>(t0 + u) * kRowW + j;
      a[u] = __ldcs(c.k + off);
      b[u] = __ldcs(c.v + off);
    }
  }
#pragma unroll
  for (int u = 0; u < kTok; ++u) {
    if (t0 + u < c.tokens && slot[u] >= 0 && slot[u] < c.num_slots) {
      c.kc[slot[u] * kRowW + j] = a[u];
      c.vc[slot[u] * kRowW + j] = b[u];
    }
  }
}

// B3: persistent grid (one wave), a warp per token (lane l: words l, l + 32, l + 64, l + 96
// of k and of v), tokens w, w + W, ...; the next token's index and words are loaded before
// the current token's stores (two register buffers, ping-pong).
__global__ void __launch_bounds__(256) store_persist_kernel(const Call c) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int W = static_cast<int>(gridDim.x) * 8;
  int t = static_cast<int>(blockIdx.x) * 8 + (static_cast<int>(threadIdx.x) >> 5);
  if (t >= c.tokens) return;
  auto load = [&](int tok, int64_t& s, uint4(&w)[8]) {
    s = __ldg(c.slots + tok);
    const int64_t base = static_cast<int64_t>(tok) * kRowW + lane;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      w[u] = __ldcs(c.k + base + 32 * u);
      w[4 + u] = __ldcs(c.v + base + 32 * u);
    }
  };
  auto store = [&](int64_t s, const uint4(&w)[8]) {
    if (s < 0 || s >= c.num_slots) return;
    const int64_t base = s * kRowW + lane;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      c.kc[base + 32 * u] = w[u];
      c.vc[base + 32 * u] = w[4 + u];
    }
  };
  int64_t sa = -1, sb = -1;
  uint4 wa[8], wb[8];
  load(t, sa, wa);
  while (true) {
    const int t1 = t + W;
    if (t1 < c.tokens) load(t1, sb, wb);
    store(sa, wa);
    if (t1 >= c.tokens) break;
    const int t2 = t1 + W;
    if (t2 < c.tokens) load(t2, sa, wa);
    store(sb, wb);
    if (t2 >= c.tokens) break;
    t = t2;
  }
}

// B6: bulk copies (TMA): a thread per token, kTmaTok tokens a block; the thread copies its
// token's k and v rows (2 x 2 KiB) into its 4 KiB shared buffer (two cp.async.bulk
// completing on its own mbarrier), then writes them to the slot's rows with two bulk stores.
constexpr int kTmaTok = 8;
constexpr int kRowBytes = kRowW * 16;
__global__ void __launch_bounds__(kTmaTok) store_tma_kernel(const Call c) {
  extern __shared__ __align__(128) unsigned char kvs_buf[];  // kTmaTok * 2 * kRowBytes
  __shared__ __align__(8) uint64_t bars[kTmaTok];
  const int i = static_cast<int>(threadIdx.x);
  const int t = static_cast<int>(blockIdx.x) * kTmaTok + i;
  if (t >= c.tokens) return;
  const int64_t slot = __ldg(c.slots + t);  // needed only at the stores
  const uint32_t bar = ptx::smem_u32(&bars[i]);
  const uint32_t s = ptx::smem_u32(kvs_buf + i * 2 * kRowBytes);
  ptx::mbar_init(bar, 1);
  ptx::fence_mbar_init();
  ptx::mbar_arrive_expect_tx(bar, 2 * kRowBytes);
  ptx::bulk_g2s(s, c.k + static_cast<int64_t>(t) * kRowW, kRowBytes, bar);
  ptx::bulk_g2s(s + kRowBytes, c.v + static_cast<int64_t>(t) * kRowW, kRowBytes, bar);
  ptx::mbar_wait(bar, 0);
  if (slot >= 0 && slot < c.num_slots) {
    ptx::fence_proxy_async();
    ptx::bulk_s2g(c.kc + slot * kRowW, s, kRowBytes);
    ptx::bulk_s2g(c.vc + slot * kRowW, s + kRowBytes, kRowBytes);
    ptx::bulk_commit();
    ptx::bulk_wait_read_all();  // the buffer must outlive the stores' reads
  }
}

bool launch_orig(const Call& c, Shape* shape) {
  if (shape) {
    const int log2_lanes = orig::log2_lanes_for(2 * kRowW);
    set_shape(shape, orig::store_copy_kernel<int64_t, uint4>, orig::kBlockThreads, 0,
              orig::grid_for(c.tokens, log2_lanes));
    return true;
  }
  orig::launch_store_copy16(c.k, c.v, c.slots, c.kc, c.vc, c.tokens, c.num_slots, kRowBytes,
                            nullptr);
  CK(cudaGetLastError());
  return true;
}

template <bool kLdCs, bool kStCs>
bool launch_flat(const Call& c, Shape* shape) {
  auto* fn = store_flat_kernel<kLdCs, kStCs>;
  const unsigned grid = static_cast<unsigned>(c.tokens);  // 256 threads = one token
  if (shape) {
    set_shape(shape, fn, 256, 0, grid);
    return true;
  }
  fn<<<grid, 256>>>(c);
  CK(cudaGetLastError());
  return true;
}

template <int kTok>
bool launch_tok(const Call& c, Shape* shape) {
  auto* fn = store_tok_kernel<kTok>;
  const unsigned grid = static_cast<unsigned>((c.tokens + kTok - 1) / kTok);
  if (shape) {
    set_shape(shape, fn, kRowW, 0, grid);
    return true;
  }
  fn<<<grid, kRowW>>>(c);
  CK(cudaGetLastError());
  return true;
}

bool launch_persist(const Call& c, Shape* shape) {
  static int per_sm = 0;
  if (per_sm == 0) per_sm = blocks_per_sm(store_persist_kernel, 256, 0);
  const unsigned grid = static_cast<unsigned>(
      std::min<int64_t>((c.tokens + 7) / 8, static_cast<int64_t>(g_sms) * per_sm));
  if (shape) {
    set_shape(shape, store_persist_kernel, 256, 0, grid);
    return true;
  }
  store_persist_kernel<<<grid, 256>>>(c);
  CK(cudaGetLastError());
  return true;
}

bool launch_tma(const Call& c, Shape* shape) {
  const size_t smem = static_cast<size_t>(kTmaTok) * 2 * kRowBytes;  // 32 KiB: < 48 KiB default
  const unsigned grid = static_cast<unsigned>((c.tokens + kTmaTok - 1) / kTmaTok);
  if (shape) {
    set_shape(shape, store_tma_kernel, kTmaTok, smem, grid);
    return true;
  }
  store_tma_kernel<<<grid, kTmaTok, smem>>>(c);
  CK(cudaGetLastError());
  return true;
}

}  // namespace kvs

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

std::string kernel_info(const Shape& s) {
  if (s.fn == nullptr) return "";
  cudaFuncAttributes a{};
  CK(cudaFuncGetAttributes(&a, s.fn));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, s.fn, s.threads, s.smem));
  char buf[220];
  snprintf(buf, sizeof buf,
           "regs %d, spill %zu B, %d thr x %u blocks, smem %zu+%zu B, %d blocks/SM (%d warps)",
           a.numRegs, static_cast<size_t>(a.localSizeBytes), s.threads, s.grid,
           static_cast<size_t>(a.sharedSizeBytes), s.smem, per_sm, per_sm * s.threads / 32);
  return buf;
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

void report(const char* id, const char* name, const char* cas, float us, double bytes,
            double copy_gbps, double big_gbps, const std::string& check) {
  const double gbps = bytes / us * 1e-3;
  printf("%-3s %-44s %-13s %8.2f us %6.0f GB/s %6.1f%% copy %6.1f%% 1GiB  %s\n", id, name, cas, us,
         gbps, 100.0 * gbps / copy_gbps, 100.0 * gbps / big_gbps, check.c_str());
  fflush(stdout);
}

double g_big_copy_gbps = 0;

// Timed copy of bytes / 2 read + bytes / 2 written (16-byte words), on its own buffers.
double copy_baseline_gbps(double bytes, int sets) {
  const int64_t words = static_cast<int64_t>(bytes / 2) / 16;
  std::vector<void*> src(sets), dst(sets);
  for (int s = 0; s < sets; ++s) {
    CK(cudaMalloc(&src[s], words * 16));
    CK(cudaMalloc(&dst[s], words * 16));
    CK(cudaMemset(src[s], 0x5a, words * 16));
  }
  const float us = median_us([&](int s) { copy16(src[s], dst[s], words); }, sets);
  const double gbps = 2.0 * words * 16 / us * 1e-3;
  printf("-- %.2f MB per call, %d buffer set(s); copy of %.1f MB: %.2f us, %.0f GB/s\n",
         bytes / 1e6, sets, 2.0 * words * 16 / 1e6, us, gbps);
  for (int s = 0; s < sets; ++s) {
    CK(cudaFree(src[s]));
    CK(cudaFree(dst[s]));
  }
  return gbps;
}

// ---------------------------------------------------------------------------------------
// (a) fused_qk_norm_rope
// ---------------------------------------------------------------------------------------

// plugins/attention/reference.cpp's loops (bf16): double math, fp32 angle, one rounding
// (double -> float -> bf16) at the store.
void ref_qkn(std::vector<uint16_t>& x, const std::vector<uint16_t>& qw,
             const std::vector<uint16_t>& kw, const std::vector<int64_t>& pos, int T, int nq,
             int nk, int64_t width, int hd, float eps, const float* inv_freq, bool neox) {
  const int half = hd / 2;
  std::vector<double> c(half), s(half), y(hd);
  for (int t = 0; t < T; ++t) {
    const float p = static_cast<float>(pos[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = p * inv_freq[i];
      c[i] = std::cos(static_cast<double>(angle));
      s[i] = std::sin(static_cast<double>(angle));
    }
    for (int h = 0; h < nq + nk; ++h) {
      uint16_t* r = x.data() + static_cast<size_t>(t) * width + static_cast<size_t>(h) * hd;
      const uint16_t* w = h < nq ? qw.data() : kw.data();
      double sum_sq = 0.0;
      for (int i = 0; i < hd; ++i) {
        const double v = bf2f(r[i]);
        sum_sq += v * v;
      }
      const double inv_rms = 1.0 / std::sqrt(sum_sq / hd + static_cast<double>(eps));
      for (int i = 0; i < hd; ++i) y[i] = static_cast<double>(bf2f(r[i])) * inv_rms * bf2f(w[i]);
      for (int i = 0; i < half; ++i) {
        const int ia = neox ? i : 2 * i;
        const int ib = neox ? i + half : 2 * i + 1;
        const double a = y[ia], b = y[ib];
        r[ia] = f2bf(static_cast<float>(a * c[i] - b * s[i]));
        r[ib] = f2bf(static_cast<float>(b * c[i] + a * s[i]));
      }
    }
  }
}

struct QDiff {
  double max_abs = 0;
  int64_t bad = 0;  // q/k elements beyond one bf16 rounding step of the reference
  int64_t first_bad = -1;
  int64_t v_changed = 0;  // v elements not bit-identical to the input
  int64_t vs_v0 = -1;     // q/k elements not bit-identical to variant 0's result
};

QDiff compare_qkn(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                  const std::vector<uint16_t>* v0, int64_t width, int64_t qk_elems) {
  QDiff d;
  if (v0) d.vs_v0 = 0;
  const int64_t rows = static_cast<int64_t>(got.size()) / width;
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r * width);
    for (int64_t col = 0; col < qk_elems; ++col) {
      const size_t i = base + static_cast<size_t>(col);
      if (v0 && got[i] != (*v0)[i]) ++d.vs_v0;
      if (got[i] == want[i]) continue;  // the common case: bit-identical
      const float g = bf2f(got[i]), w = bf2f(want[i]);
      double e = std::fabs(static_cast<double>(g) - w);
      if (e != e) e = INFINITY;
      if (e > d.max_abs) d.max_abs = e;
      if (!(e <= std::fabs(w) * (1.0 / 128) + 1e-3)) {
        if (d.bad++ == 0) d.first_bad = static_cast<int64_t>(i);
      }
    }
    // v heads: untouched, bit for bit.
    if (std::memcmp(&got[base + qk_elems], &want[base + qk_elems], (width - qk_elems) * 2) != 0) {
      for (int64_t col = qk_elems; col < width; ++col) {
        d.v_changed += got[base + col] != want[base + col];
      }
    }
  }
  return d;
}

void run_qkn() {
  constexpr int T = 32768, nq = 32, nk = 8, nv = 8, hd = 128;
  constexpr int64_t width = static_cast<int64_t>(nq + nk + nv) * hd;
  constexpr int64_t qk_elems = static_cast<int64_t>(nq + nk) * hd;
  constexpr float eps = 1e-6f;
  const size_t n_el = static_cast<size_t>(T) * width;
  const size_t qkv_bytes = n_el * 2;
  const double bytes = 2.0 * 2 * T * (nq + nk) * hd + 2.0 * 2 * hd + 8.0 * T;  // the case's count
  const int sets = std::max(1, static_cast<int>(std::ceil(200e6 / bytes)));
  printf("\n== (a) attention.fused_qk_norm_rope T=%d heads %d/%d/%d hd=%d bf16, i64 positions ==\n",
         T, nq, nk, nv, hd);
  const double copy_gbps = copy_baseline_gbps(bytes, sets);

  // Random inputs: every (token, head) scaled by 2^u, u in [-4, 4), elements uniform in
  // [-2, 2) (so the RMS varies per head); weights 1 + 0.2 (u - 0.5); check positions random
  // in [0, 2^17) (beyond the bench's 0..T-1: sincosf's reduction of larger angles too).
  Rng rng(20261201);
  std::vector<uint16_t> h0(n_el);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < nq + nk + nv; ++h) {
      const float scale = std::exp2(rng.uni() * 8.0f - 4.0f);
      uint16_t* r = h0.data() + t * width + static_cast<int64_t>(h) * hd;
      for (int i = 0; i < hd; ++i) r[i] = f2bf((rng.uni() * 4.0f - 2.0f) * scale);
    }
  }
  std::vector<uint16_t> hqw(hd), hkw(hd);
  for (int i = 0; i < hd; ++i) {
    hqw[i] = f2bf(1.0f + 0.2f * (rng.uni() - 0.5f));
    hkw[i] = f2bf(1.0f + 0.2f * (rng.uni() - 0.5f));
  }
  std::vector<int64_t> pos_check(T), pos_bench(T);
  for (int t = 0; t < T; ++t) {
    pos_check[t] = static_cast<int64_t>(rng.next() % (uint64_t{1} << 17));
    pos_bench[t] = t;  // the bench case: torch.arange(T)
  }

  std::vector<bf16*> dqkv(sets);
  for (auto& p : dqkv) {
    CK(cudaMalloc(&p, qkv_bytes));
    CK(cudaMemcpy(p, h0.data(), qkv_bytes, cudaMemcpyHostToDevice));
  }
  bf16 *dqw, *dkw;
  int64_t *dpos_check, *dpos_bench;
  float* dinv;
  CK(cudaMalloc(&dqw, hd * 2));
  CK(cudaMalloc(&dkw, hd * 2));
  CK(cudaMalloc(&dpos_check, T * 8));
  CK(cudaMalloc(&dpos_bench, T * 8));
  CK(cudaMalloc(&dinv, sizeof(orig::InvFreq)));
  CK(cudaMemcpy(dqw, hqw.data(), hd * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dkw, hkw.data(), hd * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpos_check, pos_check.data(), T * 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpos_bench, pos_bench.data(), T * 8, cudaMemcpyHostToDevice));

  struct Variant {
    const char* id;
    const char* name;
    std::function<bool(const qkn::Call&, Shape*)> launch;
  };
  const std::vector<Variant> variants = {
      {"A0", "kreg: block/token, 8 warps, 8B lanes, smem cs", qkn::launch_orig},
      {"A1", "half-warp/head 16B, 4 warps/token, 128 thr",
       qkn::launch_direct<4, 1, 5, false, 8, 0>},
      {"A2", "A1 + bulk L2 prefetch of token t+2048", qkn::launch_direct<4, 1, 5, false, 8, 2048>},
      {"A3", "half-warp/head 16B, warp/token, 8 tok/blk",
       qkn::launch_direct<1, 8, 20, false, 2, 0>},
      {"A4", "A1 persistent, next token prefetched", qkn::launch_persist<5, false, 4>},
      {"A5", "TMA ring 16x10KB, 8 consumer warps (w/token)", qkn::launch_tma<8, 16, false>},
      {"A6", "A1 + fast sincos (Cody-Waite + __sincosf)", qkn::launch_direct<4, 1, 5, true, 8, 0>},
      {"A7", "A1, inv_freq from a grid-constant param",
       qkn::launch_direct<4, 1, 5, false, 8, 0, 1>},
      {"A8", "A1, param inv_freq via smem + barrier", qkn::launch_direct<4, 1, 5, false, 8, 0, 2>},
  };

  struct Case {
    const char* name;
    bool neox;
    double base;
  };
  const Case cases[] = {{"neox b=1e6", true, 1e6}, {"gptj b=1e4", false, 1e4}};
  std::vector<uint16_t> got(n_el), want, out_v0;
  for (const Case& cs : cases) {
    orig::InvFreq inv{};
    for (int i = 0; i < hd / 2; ++i) {
      inv.v[i] = static_cast<float>(std::pow(cs.base, -2.0 * i / static_cast<double>(hd)));
    }
    CK(cudaMemcpy(dinv, &inv, sizeof inv, cudaMemcpyHostToDevice));
    want = h0;
    ref_qkn(want, hqw, hkw, pos_check, T, nq, nk, width, hd, eps, inv.v, cs.neox);
    printf("-- case %s (reference done)\n", cs.name);
    for (const Variant& v : variants) {
      // Check on set 0 from the initial data with the random positions.
      CK(cudaMemcpy(dqkv[0], h0.data(), qkv_bytes, cudaMemcpyHostToDevice));
      const qkn::Call call{dqkv[0], dqw, dkw, dpos_check, dinv, &inv, T, nq, nk, nv, eps, cs.neox};
      if (!v.launch(call, nullptr)) {
        printf("%-3s %-44s not applicable\n", v.id, v.name);
        continue;
      }
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got.data(), dqkv[0], qkv_bytes, cudaMemcpyDeviceToHost));
      const bool first = v.id == variants[0].id;
      const QDiff d = compare_qkn(got, want, first ? nullptr : &out_v0, width, qk_elems);
      if (first) out_v0 = got;
      char chk[200];
      snprintf(chk, sizeof chk, "max|diff| %.3g, %lld beyond 1 bf16 step, %lld v changed%s%s",
               d.max_abs, static_cast<long long>(d.bad), static_cast<long long>(d.v_changed),
               d.vs_v0 >= 0 ? (", != A0: " + std::to_string(d.vs_v0)).c_str() : "",
               d.bad || d.v_changed ? "  MISMATCH" : "");
      if (d.bad) {
        const int64_t i = d.first_bad;
        printf("    %s: first mismatch token %lld head %lld elem %lld: got %g want %g\n", v.id,
               static_cast<long long>(i / width), static_cast<long long>((i % width) / hd),
               static_cast<long long>(i % hd), bf2f(got[i]), bf2f(want[i]));
      }
      // Timing: the bench's positions (0..T-1), in place (values stay normalized).
      const float us = median_us(
          [&](int s) {
            const qkn::Call c{dqkv[s], dqw, dkw, dpos_bench, dinv, &inv,
                              T,       nq,  nk,  nv,         eps,  cs.neox};
            v.launch(c, nullptr);
          },
          sets);
      report(v.id, v.name, cs.name, us, bytes, copy_gbps, g_big_copy_gbps, chk);
      Shape shape;
      v.launch(call, &shape);
      printf("    %s\n", kernel_info(shape).c_str());
    }
  }
  for (bf16* p : dqkv) CK(cudaFree(p));
  CK(cudaFree(dqw));
  CK(cudaFree(dkw));
  CK(cudaFree(dpos_check));
  CK(cudaFree(dpos_bench));
  CK(cudaFree(dinv));
}

// ---------------------------------------------------------------------------------------
// (b) kvcache.store
// ---------------------------------------------------------------------------------------
void run_store() {
  constexpr int T = 32768, Hk = 8, D = 128, page = 16;
  constexpr int64_t num_slots = std::max<int64_t>(2 * T, 4096);  // P * page, P = 4096
  static_assert(num_slots % page == 0, "whole pages");
  constexpr int64_t row = static_cast<int64_t>(Hk) * D;  // bf16 elements per k (v) row
  static_assert(row * 2 == kvs::kRowW * 16, "the candidates are built for 2 KiB rows");
  const size_t src_bytes = static_cast<size_t>(T) * row * 2;
  const size_t cache_bytes = static_cast<size_t>(num_slots) * row * 2;
  const double bytes = 2.0 * T * Hk * D * (2 + 2) + 8.0 * T;  // the case's count
  const int sets = std::max(1, static_cast<int>(std::ceil(200e6 / bytes)));
  printf("\n== (b) kvcache.store T=%d Hk=%d D=%d page=%d bf16->bf16, %lld slots, i64 ==\n", T, Hk,
         D, page, static_cast<long long>(num_slots));
  const double copy_gbps = copy_baseline_gbps(bytes, sets);

  // Random rows and random initial caches (rows no slot names must keep their bytes);
  // distinct random slots (partial Fisher-Yates), as the bench's randperm; a second index
  // set with padding (-1) and out-of-range entries (rows skipped); a sorted one (diagnostic).
  Rng rng(4242);
  auto rand_bf16 = [&](std::vector<uint16_t>& v) {
    for (auto& e : v) e = f2bf((rng.uni() * 2 - 1) * 4);
  };
  std::vector<uint16_t> hk(static_cast<size_t>(T) * row), hv(hk.size()),
      hkc0(static_cast<size_t>(num_slots) * row), hvc0(hkc0.size());
  rand_bf16(hk);
  rand_bf16(hv);
  rand_bf16(hkc0);
  rand_bf16(hvc0);
  std::vector<int64_t> perm(num_slots);
  for (int64_t i = 0; i < num_slots; ++i) perm[i] = i;
  for (int64_t i = 0; i < T; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(num_slots - i));
    std::swap(perm[i], perm[j]);
  }
  std::vector<int64_t> slots_rand(perm.begin(), perm.begin() + T);
  std::vector<int64_t> slots_bad = slots_rand;
  for (int i = 0; i < T; ++i) {
    if (i % 37 == 5) slots_bad[i] = -1;
    if (i % 101 == 7) slots_bad[i] = num_slots + i;
  }
  std::vector<int64_t> slots_sorted = slots_rand;
  std::sort(slots_sorted.begin(), slots_sorted.end());

  auto reference = [&](const std::vector<int64_t>& sl, std::vector<uint16_t>& kc,
                       std::vector<uint16_t>& vc) {
    kc = hkc0;
    vc = hvc0;
    for (int i = 0; i < T; ++i) {
      const int64_t s = sl[i];
      if (s < 0 || s >= num_slots) continue;
      std::memcpy(&kc[s * row], &hk[static_cast<size_t>(i) * row], row * 2);
      std::memcpy(&vc[s * row], &hv[static_cast<size_t>(i) * row], row * 2);
    }
  };

  struct Set {
    void* k;
    void* v;
    void* kc;
    void* vc;
    int64_t* slots_rand;
    int64_t* slots_sorted;
  };
  std::vector<Set> sv(sets);
  for (Set& s : sv) {
    CK(cudaMalloc(&s.k, src_bytes));
    CK(cudaMalloc(&s.v, src_bytes));
    CK(cudaMalloc(&s.kc, cache_bytes));
    CK(cudaMalloc(&s.vc, cache_bytes));
    CK(cudaMalloc(&s.slots_rand, T * 8));
    CK(cudaMalloc(&s.slots_sorted, T * 8));
    CK(cudaMemcpy(s.k, hk.data(), src_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.v, hv.data(), src_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.kc, hkc0.data(), cache_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.vc, hvc0.data(), cache_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.slots_rand, slots_rand.data(), T * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.slots_sorted, slots_sorted.data(), T * 8, cudaMemcpyHostToDevice));
  }
  int64_t* dslots_bad;
  CK(cudaMalloc(&dslots_bad, T * 8));
  CK(cudaMemcpy(dslots_bad, slots_bad.data(), T * 8, cudaMemcpyHostToDevice));

  struct Variant {
    const char* id;
    const char* name;
    std::function<bool(const kvs::Call&, Shape*)> launch;
  };
  const std::vector<Variant> variants = {
      {"B0", "kreg: warp/token, 8 words/lane, ld.cs", kvs::launch_orig},
      {"B1", "flat 1 word/thread, ld.cs (blk = token)", kvs::launch_flat<true, false>},
      {"B2", "4 tokens/128-thr block, idx hoisted, ld.cs", kvs::launch_tok<4>},
      {"B3", "persistent warp/token, next token prefetched", kvs::launch_persist},
      {"B4", "B1 with default loads (no evict-first)", kvs::launch_flat<false, false>},
      {"B5", "B1 with evict-first stores (st.cs)", kvs::launch_flat<true, true>},
      {"B6", "TMA bulk, thread/token, 8 tokens/block", kvs::launch_tma},
  };
  std::vector<uint16_t> want_k[3], want_v[3];
  reference(slots_rand, want_k[0], want_v[0]);
  reference(slots_bad, want_k[1], want_v[1]);
  reference(slots_sorted, want_k[2], want_v[2]);
  std::vector<uint16_t> got_k(hkc0.size()), got_v(hvc0.size());
  const char* const check_names[3] = {"rand", "pad/oob", "sorted"};
  for (const Variant& v : variants) {
    std::string check = "check:";
    bool applicable = true;
    for (int k = 0; k < 3 && applicable; ++k) {
      const int64_t* dsl = k == 0 ? sv[0].slots_rand : k == 1 ? dslots_bad : sv[0].slots_sorted;
      CK(cudaMemcpy(sv[0].kc, hkc0.data(), cache_bytes, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(sv[0].vc, hvc0.data(), cache_bytes, cudaMemcpyHostToDevice));
      const kvs::Call call{static_cast<const uint4*>(sv[0].k),
                           static_cast<const uint4*>(sv[0].v),
                           dsl,
                           static_cast<uint4*>(sv[0].kc),
                           static_cast<uint4*>(sv[0].vc),
                           T,
                           num_slots};
      if (!v.launch(call, nullptr)) {
        applicable = false;
        break;
      }
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got_k.data(), sv[0].kc, cache_bytes, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(got_v.data(), sv[0].vc, cache_bytes, cudaMemcpyDeviceToHost));
      int64_t differ = 0, first = -1;
      double max_abs = 0;
      for (int c = 0; c < 2; ++c) {
        const std::vector<uint16_t>& g = c == 0 ? got_k : got_v;
        const std::vector<uint16_t>& w = c == 0 ? want_k[k] : want_v[k];
        if (std::memcmp(g.data(), w.data(), cache_bytes) == 0) continue;
        for (size_t i = 0; i < g.size(); ++i) {
          if (g[i] == w[i]) continue;
          if (differ++ == 0)
            first = static_cast<int64_t>(i) + (c ? static_cast<int64_t>(g.size()) : 0);
          double e = std::fabs(static_cast<double>(bf2f(g[i])) - bf2f(w[i]));
          if (e != e) e = INFINITY;
          max_abs = std::max(max_abs, e);
        }
      }
      char s[120];
      snprintf(s, sizeof s, " %s max|diff| %g (%lld differ)%s", check_names[k], max_abs,
               static_cast<long long>(differ), differ ? " MISMATCH" : "");
      check += s;
      if (differ) {
        const int64_t n = static_cast<int64_t>(hkc0.size());
        printf("    %s: first mismatch in %s_cache slot %lld elem %lld\n", v.id,
               first < n ? "k" : "v", static_cast<long long>((first % n) / row),
               static_cast<long long>(first % row));
      }
    }
    if (!applicable) {
      printf("%-3s %-44s not applicable\n", v.id, v.name);
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      const float us = median_us(
          [&](int s) {
            const kvs::Call c{static_cast<const uint4*>(sv[s].k),
                              static_cast<const uint4*>(sv[s].v),
                              k == 0 ? sv[s].slots_rand : sv[s].slots_sorted,
                              static_cast<uint4*>(sv[s].kc),
                              static_cast<uint4*>(sv[s].vc),
                              T,
                              num_slots};
            v.launch(c, nullptr);
          },
          sets);
      report(v.id, v.name, k == 0 ? "rand (bench)" : "sorted diag", us, bytes, copy_gbps,
             g_big_copy_gbps, k == 0 ? check : std::string());
    }
    Shape shape;
    const kvs::Call call{static_cast<const uint4*>(sv[0].k),
                         static_cast<const uint4*>(sv[0].v),
                         sv[0].slots_rand,
                         static_cast<uint4*>(sv[0].kc),
                         static_cast<uint4*>(sv[0].vc),
                         T,
                         num_slots};
    v.launch(call, &shape);
    printf("    %s\n", kernel_info(shape).c_str());
  }
  for (Set& s : sv) {
    for (void* p : {s.k, s.v, s.kc, s.vc, static_cast<void*>(s.slots_rand),
                    static_cast<void*>(s.slots_sorted)}) {
      CK(cudaFree(p));
    }
  }
  CK(cudaFree(dslots_bad));
}

int main() {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, dev));
  g_sms = p.multiProcessorCount;
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
      "columns: variant, what, case, median us, GB/s, %% of a copy of the same bytes, %% of the "
      "1 GiB copy, check\n");
  printf(
      "measured by vs_torch (H200): fused_qk_norm_rope neox 210.0 us (75.7%%), store 76.7 us "
      "(83%%)\n");
  run_qkn();
  run_store();
  CK(cudaDeviceSynchronize());
  printf("\ndone\n");
  return 0;
}
