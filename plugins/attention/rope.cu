// CUDA rope: rotary embedding in place on q[T, Hq, D] and k[T, Hk, D] from an fp32
// cos/sin cache [max_pos, rotary_dim] (cosines in the first half of a row, sines in the
// second), NeoX (pairs i, i + rotary_dim / 2) or GPT-J (pairs 2i, 2i + 1) pairing. Only
// the first rotary_dim elements of a head are read or written.
//
// Launch shape: one thread per chunk of a head's rotated part: kVec pairs' worth of
// elements. NeoX: kVec elements of the first half and the kVec partners of the second
// half, with kVec cosines and sines; GPT-J: kVec consecutive elements (kVec / 2 pairs).
// The fast path moves 16-byte vectors (kVec = 8 for 16-bit types, 4 for f32) and needs
// the rotary half (NeoX) or rotary_dim (GPT-J), D and the pointers to fit them; otherwise
// every element moves alone. 256 threads a block, one thread per chunk over all tokens:
// the flat index splits into (token, head, chunk) with multiply-high dividers. A token's
// cache row is re-read by every head of the token and stays in L1/L2.
//
// Programmatic dependent launch (the caller's KREG_LAUNCH_PDL, device::launch): a thread
// waits (griddepcontrol.wait) before its first load, since q, k and the positions may be
// the previous kernel's output, and lets the next kernel be scheduled once its last load
// (the cache row) is issued.
//
// Out-of-range positions (< 0 or >= max_pos) cannot be reported from the device without a
// synchronization: such a token is skipped (its q and k rows stay unrotated) and nothing
// outside the cache is read. The CPU reference reports them as an error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention.hpp"
#include "checks.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention {
namespace {

using device::FastDivisor;
using device::to_float;
using device::vec_t;

constexpr int kBlockThreads = 256;

// N elements of T (aligned for vec_t<T, N> when kAligned) as floats, and back.
template <int N, bool kAligned, typename T>
__device__ __forceinline__ void load_floats(float (&dst)[N], const T* p) {
  if constexpr (kAligned) {
    vec_t<float, N> f;
    f.cast_load(p);
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = f[j];
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = to_float(p[j]);
  }
}

template <int N, bool kAligned, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&src)[N]) {
  if constexpr (kAligned) {
    vec_t<float, N> f;
#pragma unroll
    for (int j = 0; j < N; ++j) f[j] = src[j];
    f.cast_store(p);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = device::from_float<T>(src[j]);
  }
}

struct RopeShape {
  int heads_q;
  int heads_k;
  int head_dim;
  int rotary_dim;
  int64_t max_pos;
  bool pos64;  // positions are int64 (else int32)
};

template <typename T, int kVec, bool kNeox, bool kAligned>
__global__ void __launch_bounds__(kBlockThreads)
    rope_kernel(T* __restrict__ q, T* __restrict__ k, const float* __restrict__ cache,
                const void* __restrict__ positions, RopeShape shape, int64_t token_begin,
                uint32_t total, FastDivisor chunks_per_token, FastDivisor chunks_per_head) {
  const uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= total) return;
  const uint32_t local_token = chunks_per_token.div(g);
  const uint32_t item = g - local_token * chunks_per_token.divisor;
  const int head = static_cast<int>(chunks_per_head.div(item));
  const int chunk = static_cast<int>(item - static_cast<uint32_t>(head) * chunks_per_head.divisor);
  const int64_t t = token_begin + local_token;
  T* x = head < shape.heads_q ? q + (t * shape.heads_q + head) * shape.head_dim
                              : k + (t * shape.heads_k + (head - shape.heads_q)) * shape.head_dim;
  const int half = shape.rotary_dim / 2;
  device::pdl_wait();
  // The head's elements are loaded before the position is known: the two loads overlap
  // instead of the cache row waiting behind the position.
  constexpr int kPairs = kNeox ? kVec : kVec / 2;
  float a[kPairs], b[kPairs];
  float e[kVec];
  const int first = chunk * kVec;  // NeoX: first pair; GPT-J: first element
  if constexpr (kNeox) {
    load_floats<kVec, kAligned>(a, x + first);
    load_floats<kVec, kAligned>(b, x + half + first);
  } else {
    load_floats<kVec, kAligned>(e, x + first);
  }
  const int64_t pos = shape.pos64 ? static_cast<const int64_t*>(positions)[t]
                                  : static_cast<const int32_t*>(positions)[t];
  if (pos < 0 || pos >= shape.max_pos) {
    device::pdl_launch_dependents();
    return;
  }
  const float* cos_row = cache + pos * shape.rotary_dim;
  const float* sin_row = cos_row + half;
  const int first_pair = kNeox ? first : first / 2;
  float c[kPairs], s[kPairs];
  load_floats<kPairs, kAligned>(c, cos_row + first_pair);
  load_floats<kPairs, kAligned>(s, sin_row + first_pair);
  device::pdl_launch_dependents();
  if constexpr (!kNeox) {
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      a[p] = e[2 * p];
      b[p] = e[2 * p + 1];
    }
  }
  float ra[kPairs], rb[kPairs];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    ra[p] = a[p] * c[p] - b[p] * s[p];
    rb[p] = b[p] * c[p] + a[p] * s[p];
  }
  if constexpr (kNeox) {
    store_floats<kVec, kAligned>(x + first, ra);
    store_floats<kVec, kAligned>(x + half + first, rb);
  } else {
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      e[2 * p] = ra[p];
      e[2 * p + 1] = rb[p];
    }
    store_floats<kVec, kAligned>(x + first, e);
  }
}

template <typename T, int kVec, bool kNeox, bool kAligned>
cudaError_t launch(T* q, T* k, const float* cache, const void* positions, const RopeShape& shape,
                   int64_t tokens, cudaStream_t stream, bool pdl) {
  const int64_t chunks_per_head = (kNeox ? shape.rotary_dim / 2 : shape.rotary_dim) / kVec;
  const int64_t chunks_per_token = (shape.heads_q + shape.heads_k) * chunks_per_head;
  const int64_t tokens_per_launch = std::max<int64_t>(1, INT32_MAX / chunks_per_token);
  const FastDivisor token_div(static_cast<uint32_t>(chunks_per_token));
  const FastDivisor head_div(static_cast<uint32_t>(chunks_per_head));
  for (int64_t t0 = 0; t0 < tokens; t0 += tokens_per_launch) {
    const int64_t n = std::min(tokens_per_launch, tokens - t0);
    const auto total = static_cast<uint32_t>(n * chunks_per_token);
    const auto blocks = static_cast<unsigned>((total + kBlockThreads - 1) / kBlockThreads);
    const cudaError_t err =
        device::launch(rope_kernel<T, kVec, kNeox, kAligned>, dim3(blocks), dim3(kBlockThreads), 0,
                       stream, pdl, q, k, cache, positions, shape, t0, total, token_div, head_div);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T, bool kNeox>
cudaError_t launch_typed(T* q, T* k, const float* cache, const void* positions,
                         const RopeShape& shape, int64_t tokens, cudaStream_t stream, bool pdl) {
  constexpr int kWide = 16 / sizeof(T);
  const int span = kNeox ? shape.rotary_dim / 2 : shape.rotary_dim;
  const bool fast = span % kWide == 0 && shape.head_dim % kWide == 0 && device::aligned16(q) &&
                    device::aligned16(k) && device::aligned16(cache);
  if (fast) {
    // GPT-J: two 16-byte words of a head a thread, so that, as in NeoX (whose thread
    // takes a word from each half), a thread rotates 8 pairs from 32-byte reads of the
    // cosine and sine rows instead of 4 pairs from 16-byte ones: half the cache-row
    // requests per element moved.
    if constexpr (!kNeox) {
      if (span % (2 * kWide) == 0) {
        return launch<T, 2 * kWide, false, true>(q, k, cache, positions, shape, tokens, stream,
                                                 pdl);
      }
    }
    return launch<T, kWide, kNeox, true>(q, k, cache, positions, shape, tokens, stream, pdl);
  }
  return launch < T, kNeox ? 1 : 2, kNeox,
         false > (q, k, cache, positions, shape, tokens, stream, pdl);
}

}  // namespace

KernelStatus rope_cuda(Context& ctx, DLTensor& q, DLTensor& k, const DLTensor& cos_sin_cache,
                       const DLTensor& positions, bool is_neox) {
  const char* op = ctx.op();
  if (auto st = check_rope(ctx, op, q, cos_sin_cache); !st.ok()) return st;
  const int64_t tokens = q.shape[0];
  const int64_t heads = q.shape[1] + k.shape[1];
  if (tokens == 0 || heads == 0) return kOk;
  if (heads * q.shape[2] > INT32_MAX / 2) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: (Hq + Hk) * D = %lld is too large", op,
                    static_cast<long long>(heads * q.shape[2]));
  }
  const RopeShape shape{static_cast<int>(q.shape[1]), static_cast<int>(k.shape[1]),
                        static_cast<int>(q.shape[2]), static_cast<int>(cos_sin_cache.shape[1]),
                        cos_sin_cache.shape[0],       from_dl(positions.dtype) == DType::kI64};
  const float* cache = data_ptr<const float>(cos_sin_cache);
  const void* pos = data_ptr<const void>(positions);
  const device::DeviceGuard guard(q);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, q, [&](auto tag) {
    using T = decltype(tag);
    T* qp = data_ptr<T>(q);
    T* kp = data_ptr<T>(k);
    const bool pdl = ctx.pdl();
    const cudaError_t err =
        is_neox ? launch_typed<T, true>(qp, kp, cache, pos, shape, tokens, stream, pdl)
                : launch_typed<T, false>(qp, kp, cache, pos, shape, tokens, stream, pdl);
    return device::launch_status(ctx, op, err);
  });
}

}  // namespace kreg::attention
