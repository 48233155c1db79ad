// CUDA kernels for kvcache.store and kvcache.set_mla_kv_buffer: scattering rows into a
// cache at indices, as whole 16-byte words where the sizes and pointers allow.
//
// Launch shape (kvcache.store; set_mla_kv_buffer's fallback): 256-thread blocks; each row (a token)
// is owned by a group of G lanes, G the smallest power of two >= the row's word count, at most 32
// (a warp), so short rows still fill the warp with several rows. A lane loads up to kUnroll words
// of its row (k and v rows back to back for store) before it stores any, which keeps 8 16-byte
// loads in flight per lane: at Hk * D = 1024 bf16 one warp moves its token's 4 KiB in one round.
// Grid: ceil(rows / (256 / G)) blocks. Source rows are read once (evict-first loads); cache rows
// are stored normally, attention reads them next. Calls of 16 MiB or more take the flat kernel
// (store_flat_kernel: a word a thread, evict-first stores) instead.
//
// The row's index is loaded together with the row's first words, not before them: its
// value is needed only at the first store, so the index and the data take one round trip
// to memory instead of two; with short rows (set_mla_kv_buffer's 1152 bytes) the second
// round trip was a large share of each row's time.
//
// set_mla_kv_buffer moves one 16-byte word per thread instead (flat index over the n
// rows' words, split into (row, word) with a multiply-high divider), 256-thread blocks,
// smaller ones (about one per SM) when the call is small. With 16 lanes of ~4.5 words
// per 1152-byte row, one load-then-store round per thread, the SMs held (by count) ~19 MB
// of loads at once: n = 32768 (38 MB) ran as about two bulk rounds of
// loads, then stores (55-69% of copy). One word per thread keeps ~4 MB in flight, the
// blocks retire and refill continuously (copy_rows' shape, 95% of copy at 256 MiB), and
// a decode-sized call (n = 16: 1152 words) is 36 blocks of 32 threads instead of one block.
// The old kernel remains for calls of 2^31 words or more.
//
// Indices outside [0, rows of the cache) (-1 is the padding convention) skip the row.
// Duplicate indices race: one of the rows lands, which one is unspecified.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL, device::launch): every kernel waits
// (griddepcontrol.wait) before its first load, the index included (rows and indices
// alike may be the previous kernel's output), and lets the next kernel be scheduled once
// its loads are issued: in the row kernels after each round's loads (the first counts,
// repeats are no-ops; a row of up to one round a lane is all loaded by then), before the
// index is checked. Threads past the last row return before the wait, those of a skipped
// row after it.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kvcache.hpp"

namespace kreg::kvcache {
namespace {

using device::vec_t;

constexpr int kBlockThreads = 256;
constexpr int kUnroll = 8;

// The widest word (16, 8, 4, 2 or 1 bytes) dividing every size and every address.
template <typename... Ptrs>
int word_bytes(std::initializer_list<int64_t> sizes, const Ptrs*... ptrs) {
  uint64_t bits = (reinterpret_cast<uintptr_t>(ptrs) | ... | uint64_t{16});
  for (int64_t s : sizes) bits |= static_cast<uint64_t>(s);
  return static_cast<int>(std::min<uint64_t>(16, bits & (~bits + 1)));  // lowest set bit
}

// Lanes per row: the smallest power of two covering `words`, at most a warp.
int log2_lanes_for(int64_t words) {
  const auto lanes = std::bit_ceil(static_cast<uint64_t>(std::clamp<int64_t>(words, 1, 32)));
  return std::countr_zero(lanes);
}

// Lanes per row for a copy of `words` words: enough lanes that each loads at most
// `per_lane` of them in one round, so that a short row (set_mla_kv_buffer's 72 words)
// is taken by fewer lanes, each with several loads in flight, and a warp carries several
// rows at once; long rows still get a whole warp.
int log2_lanes_for_copy(int64_t words, int per_lane) {
  return log2_lanes_for((words + per_lane - 1) / per_lane);
}

struct RowGroup {
  int64_t row;  // the row this lane's group owns
  int lane;     // the lane within the group
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

// ---- kvcache.store, same dtype: a copy of words ----

template <typename Idx, typename W>
__global__ void __launch_bounds__(kBlockThreads)
    store_copy_kernel(const W* __restrict__ k, const W* __restrict__ v,
                      const Idx* __restrict__ slots, W* __restrict__ k_cache,
                      W* __restrict__ v_cache, int64_t tokens, int64_t num_slots, int row_words,
                      int log2_lanes) {
  const RowGroup g = row_group(log2_lanes);
  if (g.row >= tokens) return;
  device::pdl_wait();
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
    device::pdl_launch_dependents();
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

// Large same-dtype calls in 16-byte words: one word per thread over the flat index of the
// tokens' k and v words (split into (token, word) with a multiply-high divider), evict-first
// loads and stores. A call this large (>= kFlatMinBytes) does not stay in L2 for the
// attention that reads the cache next, so the stores need not either. H200, T=32768 Hk=8
// D=128 bf16: 76.0 us (warp per token, default stores) -> 72.1 (scratch benchmark,
// 2026-12-02; the flat shape with default stores was 77.7).
template <typename Idx>
__global__ void __launch_bounds__(kBlockThreads)
    store_flat_kernel(const uint4* __restrict__ k, const uint4* __restrict__ v,
                      const Idx* __restrict__ slots, uint4* __restrict__ k_cache,
                      uint4* __restrict__ v_cache, uint32_t total_threads, int64_t num_slots,
                      uint32_t row_words, device::FastDivisor token_words) {
  const uint32_t i = blockIdx.x * kBlockThreads + threadIdx.x;
  if (i >= total_threads) return;
  const uint32_t t = token_words.div(i);
  const uint32_t j = i - t * token_words.divisor;
  device::pdl_wait();
  // The index and the word are independent loads: one round trip for both.
  const int64_t slot = load_index(slots, t);
  const bool is_v = j >= row_words;
  const uint32_t col = is_v ? j - row_words : j;
  const uint4 w = __ldcs((is_v ? v : k) + static_cast<int64_t>(t) * row_words + col);
  device::pdl_launch_dependents();
  if (slot < 0 || slot >= num_slots) return;
  __stcs((is_v ? v_cache : k_cache) + slot * row_words + col, w);
}
constexpr int64_t kFlatMinBytes = int64_t{16} << 20;  // bytes read by the call

// ---- kvcache.store into an fp8 E4M3 cache ----

// N values -> N E4M3 bytes: x / scale (IEEE fp32 division, as the reference), rounded to
// nearest even with saturation to +-448 (satfinite), NaN -> 0x7f.
template <int N>
struct Fp8Pack {
  static_assert(N == 8 || N == 1);
  using Word = std::conditional_t<N == 8, uint2, unsigned char>;
  static __device__ __forceinline__ Word pack(const vec_t<float, N>& f, float scale) {
    if constexpr (N == 1) {
      return static_cast<unsigned char>(
          __nv_cvt_float_to_fp8(__fdiv_rn(f[0], scale), __NV_SATFINITE, __NV_E4M3));
    } else {
      uint32_t w[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t word = 0;
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int i = 4 * h + 2 * p;
          const float2 pair = make_float2(__fdiv_rn(f[i], scale), __fdiv_rn(f[i + 1], scale));
          // The pair's first value lands in the low byte (memory order).
          const uint32_t two =
              static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3));
          word |= two << (16 * p);
        }
        w[h] = word;
      }
      return make_uint2(w[0], w[1]);
    }
  }
};

template <typename Idx, typename T, int N>
__global__ void __launch_bounds__(kBlockThreads)
    store_fp8_kernel(const T* __restrict__ k, const T* __restrict__ v,
                     const Idx* __restrict__ slots, typename Fp8Pack<N>::Word* __restrict__ k_cache,
                     typename Fp8Pack<N>::Word* __restrict__ v_cache, int64_t tokens,
                     int64_t num_slots, int row_vecs, int log2_lanes, float k_scale,
                     float v_scale) {
  constexpr int kFp8Unroll = 4;
  const RowGroup g = row_group(log2_lanes);
  if (g.row >= tokens) return;
  device::pdl_wait();
  const int64_t slot = load_index(slots, g.row);  // in flight with the first loads below
  const T* ks = k + g.row * row_vecs * N;
  const T* vs = v + g.row * row_vecs * N;
  const int total = 2 * row_vecs;
  for (int base = g.lane; base < total; base += kFp8Unroll * g.lanes) {
    vec_t<T, N> buf[kFp8Unroll];
#pragma unroll
    for (int u = 0; u < kFp8Unroll; ++u) {
      const int j = base + u * g.lanes;
      if (j < total) buf[u].load_stream(j < row_vecs ? ks + j * N : vs + (j - row_vecs) * N);
    }
    device::pdl_launch_dependents();
    if (slot < 0 || slot >= num_slots) return;
    auto* kd = k_cache + slot * row_vecs;
    auto* vd = v_cache + slot * row_vecs;
#pragma unroll
    for (int u = 0; u < kFp8Unroll; ++u) {
      const int j = base + u * g.lanes;
      if (j < total) {
        vec_t<float, N> f;
        f.cast_from(buf[u]);
        if (j < row_vecs) {
          kd[j] = Fp8Pack<N>::pack(f, k_scale);
        } else {
          vd[j - row_vecs] = Fp8Pack<N>::pack(f, v_scale);
        }
      }
    }
  }
}

// ---- kvcache.set_mla_kv_buffer: row = k_nope row ++ k_rope row ----

template <typename Idx, typename W>
__global__ void __launch_bounds__(kBlockThreads)
    set_mla_kernel(W* __restrict__ kv_buffer, const Idx* __restrict__ loc,
                   const W* __restrict__ k_nope, const W* __restrict__ k_rope, int64_t n,
                   int64_t rows, int nope_words, int rope_words, int log2_lanes) {
  const RowGroup g = row_group(log2_lanes);
  if (g.row >= n) return;
  device::pdl_wait();
  const int64_t dst_row = load_index(loc, g.row);  // in flight with the first loads below
  const int total = nope_words + rope_words;
  const W* ns = k_nope + g.row * nope_words;
  const W* rs = k_rope + g.row * rope_words;
  for (int base = g.lane; base < total; base += kUnroll * g.lanes) {
    W buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * g.lanes;
      if (j < total) buf[u] = j < nope_words ? __ldcs(ns + j) : __ldcs(rs + (j - nope_words));
    }
    device::pdl_launch_dependents();
    if (dst_row < 0 || dst_row >= rows) return;
    W* d = kv_buffer + dst_row * total;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * g.lanes;
      if (j < total) d[j] = buf[u];
    }
  }
}

// One word per thread: thread i moves word i % total of row i / total.
template <typename Idx, typename W>
__global__ void __launch_bounds__(kBlockThreads)
    set_mla_flat_kernel(W* __restrict__ kv_buffer, const Idx* __restrict__ loc,
                        const W* __restrict__ k_nope, const W* __restrict__ k_rope,
                        uint32_t total_threads, int64_t rows, uint32_t nope_words,
                        uint32_t rope_words, device::FastDivisor row_words) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total_threads) return;
  const uint32_t r = row_words.div(i);
  const uint32_t j = i - r * row_words.divisor;
  device::pdl_wait();
  // The index and the word are independent loads: one round trip for both.
  const int64_t dst_row = load_index(loc, r);
  const W w = j < nope_words
                  ? __ldcs(k_nope + static_cast<int64_t>(r) * nope_words + j)
                  : __ldcs(k_rope + static_cast<int64_t>(r) * rope_words + (j - nope_words));
  device::pdl_launch_dependents();
  if (dst_row < 0 || dst_row >= rows) return;
  kv_buffer[dst_row * row_words.divisor + j] = w;
}

// ---- Host launchers ----

unsigned grid_for(int64_t rows, int log2_lanes) {
  const int64_t rows_per_block = kBlockThreads >> log2_lanes;
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

struct StoreArgs {
  const void* k;
  const void* v;
  const void* slots;
  void* k_cache;
  void* v_cache;
  int64_t tokens;
  int64_t num_slots;
  int64_t row_elems;
  float k_scale;
  float v_scale;
  bool pdl;  // programmatic dependent launch (the caller's KREG_LAUNCH_PDL)
};

template <typename Idx, int kWordBytes>
void launch_store_copy(const StoreArgs& a, int64_t row_bytes, cudaStream_t stream) {
  using W = device::word_t<kWordBytes>;
  const int64_t words = row_bytes / kWordBytes;
  const int64_t threads = a.tokens * 2 * words;
  if (kWordBytes == 16 && a.tokens * 2 * row_bytes >= kFlatMinBytes && threads <= INT32_MAX) {
    device::launch(store_flat_kernel<Idx>,
                   dim3(static_cast<unsigned>((threads + kBlockThreads - 1) / kBlockThreads)),
                   dim3(kBlockThreads), 0, stream, a.pdl, static_cast<const uint4*>(a.k),
                   static_cast<const uint4*>(a.v), static_cast<const Idx*>(a.slots),
                   static_cast<uint4*>(a.k_cache), static_cast<uint4*>(a.v_cache),
                   static_cast<uint32_t>(threads), a.num_slots, static_cast<uint32_t>(words),
                   device::FastDivisor(static_cast<uint32_t>(2 * words)));
    return;
  }
  const int log2_lanes = log2_lanes_for(2 * words);
  device::launch(store_copy_kernel<Idx, W>, dim3(grid_for(a.tokens, log2_lanes)),
                 dim3(kBlockThreads), 0, stream, a.pdl, static_cast<const W*>(a.k),
                 static_cast<const W*>(a.v), static_cast<const Idx*>(a.slots),
                 static_cast<W*>(a.k_cache), static_cast<W*>(a.v_cache), a.tokens, a.num_slots,
                 static_cast<int>(words), log2_lanes);
}

template <typename Idx>
void store_copy(const StoreArgs& a, int64_t row_bytes, cudaStream_t stream) {
  switch (word_bytes({row_bytes}, a.k, a.v, a.k_cache, a.v_cache)) {
    case 16:
      return launch_store_copy<Idx, 16>(a, row_bytes, stream);
    case 8:
      return launch_store_copy<Idx, 8>(a, row_bytes, stream);
    case 4:
      return launch_store_copy<Idx, 4>(a, row_bytes, stream);
    case 2:
      return launch_store_copy<Idx, 2>(a, row_bytes, stream);
    default:
      return launch_store_copy<Idx, 1>(a, row_bytes, stream);
  }
}

template <typename Idx, typename T, int N>
void launch_store_fp8(const StoreArgs& a, cudaStream_t stream) {
  using Word = typename Fp8Pack<N>::Word;
  const int64_t vecs = a.row_elems / N;
  const int log2_lanes = log2_lanes_for(2 * vecs);
  device::launch(store_fp8_kernel<Idx, T, N>, dim3(grid_for(a.tokens, log2_lanes)),
                 dim3(kBlockThreads), 0, stream, a.pdl, static_cast<const T*>(a.k),
                 static_cast<const T*>(a.v), static_cast<const Idx*>(a.slots),
                 static_cast<Word*>(a.k_cache), static_cast<Word*>(a.v_cache), a.tokens,
                 a.num_slots, static_cast<int>(vecs), log2_lanes, a.k_scale, a.v_scale);
}

template <typename Idx, typename T>
void store_fp8(const StoreArgs& a, cudaStream_t stream) {
  // Eight values a step: one 16-byte load of bf16/f16 (two of f32), one 8-byte store.
  const int in_bytes = std::min<int>(16, 8 * sizeof(T));
  const bool wide = a.row_elems % 8 == 0 && word_bytes({in_bytes}, a.k, a.v) >= in_bytes &&
                    word_bytes({8}, a.k_cache, a.v_cache) >= 8;
  if (wide) return launch_store_fp8<Idx, T, 8>(a, stream);
  launch_store_fp8<Idx, T, 1>(a, stream);
}

template <typename Idx>
void store_fp8_typed(DType in, const StoreArgs& a, cudaStream_t stream) {
  switch (in) {
    case DType::kBF16:
      return store_fp8<Idx, __nv_bfloat16>(a, stream);
    case DType::kF16:
      return store_fp8<Idx, __half>(a, stream);
    default:
      return store_fp8<Idx, float>(a, stream);
  }
}

template <typename Idx, int kWordBytes>
void launch_set_mla(void* buf, const void* loc, const void* nope, const void* rope, int64_t n,
                    int64_t rows, int64_t nope_bytes, int64_t rope_bytes, cudaStream_t stream,
                    bool pdl) {
  using W = device::word_t<kWordBytes>;
  const int64_t nope_words = nope_bytes / kWordBytes, rope_words = rope_bytes / kWordBytes;
  const int64_t row_words = nope_words + rope_words;
  // n * row_words < 2^31: 32-bit flat indices and the FastDivisor's range.
  if (n <= (int64_t{INT32_MAX} - 1) / row_words) {
    const int64_t threads = n * row_words;
    // Small calls: blocks of at least a warp, about one per SM (of 132), rather than a
    // few 256-thread blocks that serialize their rows' loads on a few SMs.
    constexpr int64_t kSms = 132;
    int64_t block = kBlockThreads;
    if (threads < kBlockThreads * kSms) {
      block = std::clamp<int64_t>(((threads + kSms - 1) / kSms + 31) / 32 * 32, 32, kBlockThreads);
    }
    device::launch(
        set_mla_flat_kernel<Idx, W>, dim3(static_cast<unsigned>((threads + block - 1) / block)),
        dim3(static_cast<unsigned>(block)), 0, stream, pdl, static_cast<W*>(buf),
        static_cast<const Idx*>(loc), static_cast<const W*>(nope), static_cast<const W*>(rope),
        static_cast<uint32_t>(threads), rows, static_cast<uint32_t>(nope_words),
        static_cast<uint32_t>(rope_words), device::FastDivisor(static_cast<uint32_t>(row_words)));
    return;
  }
  const int log2_lanes = log2_lanes_for_copy(nope_words + rope_words, kUnroll);
  device::launch(set_mla_kernel<Idx, W>, dim3(grid_for(n, log2_lanes)), dim3(kBlockThreads), 0,
                 stream, pdl, static_cast<W*>(buf), static_cast<const Idx*>(loc),
                 static_cast<const W*>(nope), static_cast<const W*>(rope), n, rows,
                 static_cast<int>(nope_words), static_cast<int>(rope_words), log2_lanes);
}

template <typename Idx>
void set_mla(void* buf, const void* loc, const void* nope, const void* rope, int64_t n,
             int64_t rows, int64_t nope_bytes, int64_t rope_bytes, cudaStream_t stream, bool pdl) {
  switch (word_bytes({nope_bytes, rope_bytes}, buf, nope, rope)) {
    case 16:
      return launch_set_mla<Idx, 16>(buf, loc, nope, rope, n, rows, nope_bytes, rope_bytes, stream,
                                     pdl);
    case 8:
      return launch_set_mla<Idx, 8>(buf, loc, nope, rope, n, rows, nope_bytes, rope_bytes, stream,
                                    pdl);
    case 4:
      return launch_set_mla<Idx, 4>(buf, loc, nope, rope, n, rows, nope_bytes, rope_bytes, stream,
                                    pdl);
    case 2:
      return launch_set_mla<Idx, 2>(buf, loc, nope, rope, n, rows, nope_bytes, rope_bytes, stream,
                                    pdl);
    default:
      return launch_set_mla<Idx, 1>(buf, loc, nope, rope, n, rows, nope_bytes, rope_bytes, stream,
                                    pdl);
  }
}

}  // namespace

KernelStatus store_cuda(Context& ctx, const DLTensor& k, const DLTensor& v,
                        const DLTensor& slot_mapping, DLTensor& k_cache, DLTensor& v_cache,
                        double k_scale, double v_scale) {
  const char* const kOp = ctx.op();
  if (KernelStatus st = check_store(ctx, kOp, k, k_cache, v_cache, k_scale, v_scale); !st.ok()) {
    return st;
  }
  const StoreArgs a{.k = data_ptr<const void>(k),
                    .v = data_ptr<const void>(v),
                    .slots = data_ptr<const void>(slot_mapping),
                    .k_cache = data_ptr<void>(k_cache),
                    .v_cache = data_ptr<void>(v_cache),
                    .tokens = k.shape[0],
                    .num_slots = k_cache.shape[0] * k_cache.shape[1],
                    .row_elems = k.shape[1] * k.shape[2],
                    .k_scale = static_cast<float>(k_scale),
                    .v_scale = static_cast<float>(v_scale),
                    .pdl = ctx.pdl()};
  if (a.tokens == 0 || a.row_elems == 0 || a.num_slots == 0) return kOk;
  const int64_t row_bytes = a.row_elems * elem_bytes(k);
  if (row_bytes > INT32_MAX / 2) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: rows of %lld bytes are too long", kOp,
                    static_cast<long long>(row_bytes));
  }
  const device::DeviceGuard guard(k);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const bool i32 = dtype_of(slot_mapping) == DType::kI32;
  if (dtype_of(k_cache) == DType::kF8E4M3) {
    if (i32) {
      store_fp8_typed<int32_t>(dtype_of(k), a, stream);
    } else {
      store_fp8_typed<int64_t>(dtype_of(k), a, stream);
    }
  } else if (i32) {
    store_copy<int32_t>(a, row_bytes, stream);
  } else {
    store_copy<int64_t>(a, row_bytes, stream);
  }
  return device::launch_status(ctx, kOp);
}

KernelStatus set_mla_kv_buffer_cuda(Context& ctx, DLTensor& kv_buffer, const DLTensor& loc,
                                    const DLTensor& k_nope, const DLTensor& k_rope) {
  const char* const kOp = ctx.op();
  if (KernelStatus st = check_mla(ctx, kOp, kv_buffer, k_nope, k_rope); !st.ok()) return st;
  const int64_t n = loc.shape[0], rows = kv_buffer.shape[0];
  const auto e = elem_bytes(kv_buffer);
  const int64_t nope_bytes = k_nope.shape[1] * e, rope_bytes = k_rope.shape[1] * e;
  if (n == 0 || rows == 0 || nope_bytes + rope_bytes == 0) return kOk;
  if (nope_bytes + rope_bytes > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: rows of %lld bytes are too long", kOp,
                    static_cast<long long>(nope_bytes + rope_bytes));
  }
  const device::DeviceGuard guard(kv_buffer);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  void* buf = data_ptr<void>(kv_buffer);
  const void* idx = data_ptr<const void>(loc);
  const void* nope = data_ptr<const void>(k_nope);
  const void* rope = data_ptr<const void>(k_rope);
  if (dtype_of(loc) == DType::kI32) {
    set_mla<int32_t>(buf, idx, nope, rope, n, rows, nope_bytes, rope_bytes, stream, ctx.pdl());
  } else {
    set_mla<int64_t>(buf, idx, nope, rope, n, rows, nope_bytes, rope_bytes, stream, ctx.pdl());
  }
  return device::launch_status(ctx, kOp);
}

}  // namespace kreg::kvcache
