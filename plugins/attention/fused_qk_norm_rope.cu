// CUDA fused_qk_norm_rope: in place on packed qkv[T, (nq + nk + nv) * hd], every q and k
// head is RMS-normalized with its own weight (q_weight or k_weight) and then rotated by
// the rotary embedding of its token's position (theta = base, computed here, no cache);
// v heads are not touched.
//
// Launch shape: one block per token, min(8, nq + nk) warps, one warp per head at a time:
// lane l holds the head's elements [l * hd / 32, (l + 1) * hd / 32) in registers (one
// 4/8/16-byte load for hd = 64/128/256), the sum of squares is a warp butterfly, and the
// NeoX partner of element i (i + hd / 2) is in lane l ^ 16 (one shuffle). A warp loads up
// to kBatch heads before it reduces any, to keep loads in flight. The token's cos/sin
// table (hd / 2 angles) is computed once per block into shared memory, while the first
// loads are in flight, and shared by all of the token's heads.
//
// hd = 128 with 16-byte aligned tensors (Llama, Qwen3) takes the half-warp kernel
// instead: a half warp per head, lane l holding elements [8 (l % 16), 8 (l % 16) + 8) (one
// 16-byte load and store), the sum of squares a 16-lane butterfly, the NeoX partner in lane
// l ^ 8; four warps (eight heads at a time) a token in 128-thread blocks, each half warp
// loading all of its heads up front. The token's 64 angles are computed by every warp
// (lane m: angles 2m and 2m + 1) and handed to the lanes that need them with shuffles; the
// only shared memory is the 64 frequencies (one copy from the parameter a block, one
// barrier). H200, T=32768 32/8/8 bf16 NeoX: 210.0 -> 169.3 us (75% -> 93% of copy; GPT-J
// 198.5 -> 168.9; scratch benchmark, 2026-12-02): the warp per head moved 8 bytes a lane
// and its 61 registers left 4 blocks (40 KB of loads) an SM. In the plugin (vs_torch.py,
// 2026-12-02, four rounds): the per-lane parameter reads kept it at 205.0 / 196.0 us
// (NeoX / GPT-J); this kernel runs 175.1-175.4 / 173.3-190.8. 7 blocks an SM for the
// 40-head form (72 registers) was slower: 179.0 / 185.8.
//
// Numerics: inv_freq[i] = base^(-2i / hd) is computed on the host in double and rounded
// to fp32 (the CPU reference does the same, so both get the same fp32 value); the angle
// is the fp32 product float(pos) * inv_freq[i]; sincosf (full-range, not the fast
// intrinsic) of it. The normalized head stays in fp32 through the rotation and is rounded
// once at the store.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL, device::launch): qkv, the weights and
// the positions may all be the previous kernel's output, so both kernels wait
// (griddepcontrol.wait) before their first load (the frequencies, a __grid_constant__
// parameter, are read after it too) and let the next kernel be scheduled once the
// token's first loads are issued: after the position's load in the warp kernel (a later
// batch of heads, past 64 q + k heads, loads after it: safe, the next kernel writes
// nothing before its own wait, which returns once this grid has finished), after the
// weights' in the half-warp kernel (all of its loads).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention.hpp"
#include "checks.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention {
namespace {

using device::to_float;
using device::vec_t;

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
  device::pdl_wait();

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
  device::pdl_launch_dependents();
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
      sum_sq = device::warp_sum(sum_sq);
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
          const float other = __shfl_xor_sync(device::kFullWarpMask, y[j], 16);
          const int i = (lane & 15) * kElems + j;
          const float c = cos_s[i], s = sin_s[i];
          out[j] = device::from_float<T>(first_half ? y[j] * c - other * s : y[j] * c + other * s);
        }
      } else {
#pragma unroll
        for (int p = 0; p < kElems / 2; ++p) {
          const int i = (lane * kElems) / 2 + p;
          const float c = cos_s[i], s = sin_s[i];
          const float a = y[2 * p], bb = y[2 * p + 1];
          out[2 * p] = device::from_float<T>(a * c - bb * s);
          out[2 * p + 1] = device::from_float<T>(bb * c + a * s);
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

// ---- The half-warp kernel (hd = 128, 16-byte aligned) ----

constexpr int kHwHeadDim = 128;
constexpr int kHwWarpsPerToken = 4;  // 8 half warps: heads h, h + 8, ... each
constexpr int kHwThreads = kHwWarpsPerToken * device::kWarpSize;
constexpr int kHwHalfWarps = 2 * kHwWarpsPerToken;

// The cosines and sines of one lane's 8 elements (NeoX) or 4 pairs (GPT-J).
template <bool kNeox>
struct LaneRotation {
  static constexpr int kN = kNeox ? 8 : 4;
  float c[kN], s[kN];
};

// Every lane computes angles 2 lane and 2 lane + 1 of the token and fetches the ones its
// elements need from the lanes that hold them (compile-time choices: one shuffle a value).
// All 32 lanes must call it.
template <bool kNeox>
__device__ __forceinline__ LaneRotation<kNeox> lane_rotation(float fpos, float2 freq, int lane) {
  float s0, c0, s1, c1;
  sincosf(fpos * freq.x, &s0, &c0);
  sincosf(fpos * freq.y, &s1, &c1);
  LaneRotation<kNeox> r;
  if constexpr (kNeox) {
    // Element j of lane l is pair 8 (l % 8) + j (either half), held by lane 4 (l % 8) + j / 2.
    const int base = 4 * (lane & 7);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      r.c[j] = __shfl_sync(device::kFullWarpMask, (j & 1) ? c1 : c0, base + (j >> 1));
      r.s[j] = __shfl_sync(device::kFullWarpMask, (j & 1) ? s1 : s0, base + (j >> 1));
    }
  } else {
    // Pair p of lane l is pair 4 (l % 16) + p, held by lane 2 (l % 16) + p / 2.
    const int base = 2 * (lane & 15);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      r.c[p] = __shfl_sync(device::kFullWarpMask, (p & 1) ? c1 : c0, base + (p >> 1));
      r.s[p] = __shfl_sync(device::kFullWarpMask, (p & 1) ? s1 : s0, base + (p >> 1));
    }
  }
  return r;
}

// kHeads: heads a half warp carries, at least ceil((nq + nk) / 8). Up to 5 (40 heads: 4 KB
// of loads a warp) the kernel fits 64 registers and 8 blocks share an SM; more heads get
// the registers they hold (no spills) at fewer blocks an SM.
template <int kHeads>
constexpr int kHwMinBlocks = kHeads <= 5 ? 8 : (kHeads <= 8 ? 5 : 4);

// Eight 16-bit elements of T in one 16-byte word, to and from fp32. The kernel keeps heads
// and weights as these words (a select of vec_t structs went through the stack and left
// the 40-head form spilling at 64 registers).
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& r, float (&f)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      f[2 * q] = __uint_as_float(w[q] << 16);  // the lower element of the pair: low bits
      f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    } else {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&w[q]));
      f[2 * q] = v.x;
      f[2 * q + 1] = v.y;
    }
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 p = __float22bfloat162_rn(make_float2(lo, hi));
    return *reinterpret_cast<const uint32_t*>(&p);
  } else {
    const __half2 p = __float22half2_rn(make_float2(lo, hi));
    return *reinterpret_cast<const uint32_t*>(&p);
  }
}

// One head's 8 elements of this lane, RMS-normalized with weight w and rotated. All 32
// lanes must call it (shuffles); each half warp carries its own head.
template <typename T, bool kNeox>
__device__ __forceinline__ uint4 norm_rope8(const uint4& raw, const uint4& weight,
                                            const LaneRotation<kNeox>& rot, float eps, int lane) {
  float y[8], w[8];
  unpack8<T>(raw, y);
  unpack8<T>(weight, w);
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) sum_sq += y[j] * y[j];
#pragma unroll
  for (int o = 8; o > 0; o /= 2) sum_sq += __shfl_xor_sync(device::kFullWarpMask, sum_sq, o);
  const float inv_rms = rsqrtf(sum_sq * (1.0f / static_cast<float>(kHwHeadDim)) + eps);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = y[j] * inv_rms * w[j];
  float out[8];
  if constexpr (kNeox) {
    const bool first_half = (lane & 8) == 0;  // elements 0..63 of the head: x1
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float other = __shfl_xor_sync(device::kFullWarpMask, y[j], 8);
      out[j] = first_half ? y[j] * rot.c[j] - other * rot.s[j] : y[j] * rot.c[j] + other * rot.s[j];
    }
  } else {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float a = y[2 * p], b = y[2 * p + 1];
      out[2 * p] = a * rot.c[p] - b * rot.s[p];
      out[2 * p + 1] = b * rot.c[p] + a * rot.s[p];
    }
  }
  return make_uint4(pack2<T>(out[0], out[1]), pack2<T>(out[2], out[3]), pack2<T>(out[4], out[5]),
                    pack2<T>(out[6], out[7]));
}

template <typename T, bool kNeox, int kHeads>
__global__ void __launch_bounds__(kHwThreads, kHwMinBlocks<kHeads>)
    fused_qk_norm_rope_hw_kernel(T* __restrict__ qkv, const T* __restrict__ q_weight,
                                 const T* __restrict__ k_weight, const void* __restrict__ positions,
                                 QkvShape shape, const __grid_constant__ InvFreq inv_freq) {
  const int lane = static_cast<int>(threadIdx.x) % device::kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / device::kWarpSize;
  const int hl = lane & 15;
  const int first_head = warp * 2 + (lane >> 4);
  const int t = static_cast<int>(blockIdx.x);
  T* row = qkv + static_cast<int64_t>(t) * shape.width;
  device::pdl_wait();
  uint4 raw[kHeads];
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int h = first_head + k * kHwHalfWarps;
    raw[k] = make_uint4(0, 0, 0, 0);
    if (h < shape.heads_qk) raw[k] = *reinterpret_cast<const uint4*>(row + h * kHwHeadDim + hl * 8);
  }
  const int64_t pos = shape.pos64 ? static_cast<const int64_t*>(positions)[t]
                                  : static_cast<const int32_t*>(positions)[t];
  const uint4 wq = __ldg(reinterpret_cast<const uint4*>(q_weight) + hl);
  const uint4 wk = __ldg(reinterpret_cast<const uint4*>(k_weight) + hl);
  device::pdl_launch_dependents();
  // Lane m's two frequencies, 2m and 2m + 1. The first warp copies them from the parameter
  // into shared memory and the block reads them from there: read from the parameter by
  // every lane, each at its own address, the constant cache serializes them (256 reads a
  // block, not 32; tools/bench/variants/qkn_store_bench.cu A7 vs A8).
  __shared__ float2 freq_s[device::kWarpSize];
  if (warp == 0) freq_s[lane] = make_float2(inv_freq.v[2 * lane], inv_freq.v[2 * lane + 1]);
  __syncthreads();
  const LaneRotation<kNeox> rot = lane_rotation<kNeox>(static_cast<float>(pos), freq_s[lane], lane);
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int h = first_head + k * kHwHalfWarps;
    // Both half warps of a warp run every step (shuffles): a head past the end computes on
    // zeros and stores nothing.
    const uint4 out =
        norm_rope8<T, kNeox>(raw[k], h < shape.heads_q ? wq : wk, rot, shape.eps, lane);
    if (h < shape.heads_qk) *reinterpret_cast<uint4*>(row + h * kHwHeadDim + hl * 8) = out;
  }
}

template <typename T, bool kNeox, int kHeads>
cudaError_t launch_hw(T* qkv, const T* qw, const T* kw, const void* positions,
                      const QkvShape& shape, int64_t tokens, const InvFreq& inv_freq,
                      cudaStream_t stream, bool pdl) {
  return device::launch(fused_qk_norm_rope_hw_kernel<T, kNeox, kHeads>,
                        dim3(static_cast<unsigned>(tokens)), dim3(kHwThreads), 0, stream, pdl, qkv,
                        qw, kw, positions, shape, inv_freq);
}

// The half-warp kernel for up to 80 q + k heads (10 a half warp); false: not taken.
template <typename T, bool kNeox>
bool try_launch_hw(T* qkv, const T* qw, const T* kw, const void* positions, const QkvShape& shape,
                   int64_t tokens, const InvFreq& inv_freq, cudaStream_t stream, bool pdl,
                   cudaError_t& err) {
  const int per_half_warp = (shape.heads_qk + kHwHalfWarps - 1) / kHwHalfWarps;
  auto go = [&](auto heads) {
    err = launch_hw<T, kNeox, decltype(heads)::value>(qkv, qw, kw, positions, shape, tokens,
                                                      inv_freq, stream, pdl);
    return true;
  };
  if (per_half_warp <= 1) return go(std::integral_constant<int, 1>{});
  if (per_half_warp <= 2) return go(std::integral_constant<int, 2>{});
  if (per_half_warp <= 4) return go(std::integral_constant<int, 4>{});
  if (per_half_warp <= 5) return go(std::integral_constant<int, 5>{});
  if (per_half_warp <= 8) return go(std::integral_constant<int, 8>{});
  if (per_half_warp <= 10) return go(std::integral_constant<int, 10>{});
  return false;
}

// The host-side inv_freq table, cached per thread for the last (base, head_dim): the
// struct is trivially destructible, so the thread_local registers no TLS destructor (the
// plugin stays unloadable).
const InvFreq& inv_freq_table(double base, int64_t head_dim) {
  struct Cache {
    double base = -1;
    int64_t head_dim = 0;
    InvFreq table;
  };
  static thread_local Cache cache;
  if (cache.base != base || cache.head_dim != head_dim) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      cache.table.v[i] = static_cast<float>(
          std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
    }
    cache.base = base;
    cache.head_dim = head_dim;
  }
  return cache.table;
}

template <typename T, int kHeadDim, bool kNeox>
cudaError_t launch(T* qkv, const T* qw, const T* kw, const void* positions, const QkvShape& shape,
                   int64_t tokens, const InvFreq& inv_freq, cudaStream_t stream, bool pdl) {
  const int warps = std::min(kMaxWarps, shape.heads_qk);
  return device::launch(fused_qk_norm_rope_kernel<T, kHeadDim, kNeox>,
                        dim3(static_cast<unsigned>(tokens)),
                        dim3(static_cast<unsigned>(warps * 32)), 0, stream, pdl, qkv, qw, kw,
                        positions, shape, inv_freq);
}

template <typename T, bool kNeox>
cudaError_t launch_dim(int64_t head_dim, T* qkv, const T* qw, const T* kw, const void* positions,
                       const QkvShape& shape, int64_t tokens, const InvFreq& inv_freq,
                       cudaStream_t stream, bool pdl) {
  switch (head_dim) {
    case 64:
      return launch<T, 64, kNeox>(qkv, qw, kw, positions, shape, tokens, inv_freq, stream, pdl);
    case 128:
      return launch<T, 128, kNeox>(qkv, qw, kw, positions, shape, tokens, inv_freq, stream, pdl);
    default:
      return launch<T, 256, kNeox>(qkv, qw, kw, positions, shape, tokens, inv_freq, stream, pdl);
  }
}

}  // namespace

KernelStatus fused_qk_norm_rope_cuda(Context& ctx, DLTensor& qkv, const DLTensor& q_weight,
                                     const DLTensor& k_weight, const DLTensor& positions,
                                     int64_t num_heads_q, int64_t num_heads_k, int64_t num_heads_v,
                                     int64_t head_dim, double eps, double base, bool is_neox) {
  const char* op = ctx.op();
  if (auto st = check_fused_qk_norm_rope(ctx, op, qkv, q_weight, k_weight, num_heads_q, num_heads_k,
                                         num_heads_v, head_dim, eps, base);
      !st.ok()) {
    return st;
  }
  const int64_t tokens = qkv.shape[0];
  if (tokens == 0 || num_heads_q + num_heads_k == 0) return kOk;
  if (tokens > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: T = %lld is too large", op,
                    static_cast<long long>(tokens));
  }
  const device::DeviceGuard guard(qkv);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const InvFreq& inv_freq = inv_freq_table(base, head_dim);
  const void* pos = data_ptr<const void>(positions);
  const bool pdl = ctx.pdl();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    T* p = data_ptr<T>(qkv);
    const T* qw = data_ptr<const T>(q_weight);
    const T* kw = data_ptr<const T>(k_weight);
    const uintptr_t bytes = static_cast<uintptr_t>(head_dim / 32) * sizeof(T);
    const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(qw) |
                           reinterpret_cast<uintptr_t>(kw);
    const QkvShape shape{static_cast<int>(num_heads_q),
                         static_cast<int>(num_heads_q + num_heads_k),
                         qkv.shape[1],
                         static_cast<float>(eps),
                         from_dl(positions.dtype) == DType::kI64,
                         bits % bytes == 0};
    cudaError_t err = cudaSuccess;
    const bool hw =
        head_dim == kHwHeadDim && bits % 16 == 0 &&
        (is_neox
             ? try_launch_hw<T, true>(p, qw, kw, pos, shape, tokens, inv_freq, stream, pdl, err)
             : try_launch_hw<T, false>(p, qw, kw, pos, shape, tokens, inv_freq, stream, pdl, err));
    if (!hw) {
      err = is_neox ? launch_dim<T, true>(head_dim, p, qw, kw, pos, shape, tokens, inv_freq, stream,
                                          pdl)
                    : launch_dim<T, false>(head_dim, p, qw, kw, pos, shape, tokens, inv_freq,
                                           stream, pdl);
    }
    return device::launch_status(ctx, op, err);
  };
  return device::visit_dtype<__nv_bfloat16, __half>(ctx, op, qkv, run);
}

}  // namespace kreg::attention
