// CUDA decode: paged decode attention with GQA, flash-decoding style: the entry point
// and the first split kernel, on CUDA cores (FMA). The default split kernel runs on tensor
// cores (decode_mma.cu); this one runs when KREG_DECODE_KERNEL=fma is set (read once), for
// comparisons. What both share (splits, merge, workspace) is in decode.cuh.
//
//   out[b, h] = softmax(scale * q[b, h] . K_j) V_j over the tokens j < seq_lens[b], where
//   token j of sequence b is row (block_table[b, j / P], j % P, h / (Hq / Hk)) of the caches.
//
// Split kernel: one block of 128 threads per (split, kv head, group chunk, sequence). A
// sequence's length is cut into num_splits equal ranges (rounded up to whole tiles) on the
// device, from seq_lens[b], so the splits of every sequence carry equal work whatever its
// length. A block streams its range's K and V rows through shared memory in tiles of
// 2048 / D tokens (8 KiB for K and V together), kStages tiles in flight with cp.async
// (zero-filled for tokens past the end or whose page id is out of range; those tokens are
// masked out of the softmax); the block table is read one tile ahead, so its latency is
// off the copies' path. Each K/V row is read from HBM once for the kG query heads of the
// block: all of a kv head's query heads when Hq / Hk is 1, 2 or 4, chunks of 4 for groups
// of 8 or more (8 heads a thread would need 247 registers: 2 blocks an SM instead of 4),
// else chunks of the largest of 4, 2, 1 dividing the group.
//
// Within a tile, a row is spread over D / 8 lanes (16 bytes each) and a warp takes
// 256 / D rows at a time; each such lane group keeps its own running max, sum and output
// for the kG heads (online softmax in the log2 domain: scale * log2(e) is folded into q),
// updated once per tile for the group's rows of the tile. At the end the block's lane
// groups are merged in shared memory. With one split the block writes out = acc / sum
// directly; with more it writes (acc, max, sum) partials to a workspace and a merge kernel
// (launched with PDL, so its launch overlaps the split kernel) combines the splits by
// log-sum-exp, all splits of a (sequence, head) read at once.
//
// num_splits comes from the SM count and the split kernel's occupancy (asked once per
// device) and the table's capacity: enough splits of at least 64 tokens that small
// batches fill the GPU (B=1 ctx 4096 Llama-3-8B: 64 splits, 512 blocks), few or one for
// large batches (choose_splits).
//
// Workspace: B * Hq * num_splits * (D + 2) floats, a device::Workspace: the host's
// allocator when the call frame offers one (torch's caching allocator under the Python
// extension), else cudaMallocAsync on the call's stream, freed after the merge is enqueued
// (stream-ordered, so it is graph-capturable: a capture records allocation and free
// nodes). No workspace when one split suffices.
//
// PDL: the split kernel is a programmatic launch when the caller asks (ctx.pdl()); it
// waits before its first load and lets dependents be scheduled once every block has
// started. The merge waits before reading the partials.
//
// Empty sequences (seq_lens[b] == 0) give zeros. Lengths are clamped to [0, max_pages *
// page_size] and page ids outside [0, num_pages) contribute nothing: no read outside the
// caches or the table. The CPU reference reports both as errors.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "attention.hpp"
#include "checks.hpp"
#include "decode.cuh"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention {
namespace {

using decode_detail::cp_async_commit;
using decode_detail::cp_async_wait;
using decode_detail::DecodeParams;
using device::FastDivisor;
using device::to_float;
using device::vec_t;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 4;
constexpr int kVec = 8;  // 16 bytes of a 16-bit type

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  decode_detail::cp_async_16(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, pred);
}

template <typename T, int kDim, int kG>
// At most 128 registers (4 blocks an SM, which choose_splits' occupancy query then sees).
__global__ void __launch_bounds__(kThreads, 4) decode_split_kernel(DecodeParams<T> p) {
  constexpr int kLanes = kDim / kVec;                          // lanes per row: 8, 16, 32
  constexpr int kRowsPerWarp = 32 / kLanes;                    // rows a warp takes at once
  constexpr int kGroups = kWarps * kRowsPerWarp;               // lane groups per block
  constexpr int kTile = 2048 / kDim;                           // tokens per tile: 32, 16, 8
  constexpr int kRounds = kTile / kGroups;                     // 2
  constexpr int kChunksPerThread = kTile * kLanes / kThreads;  // 2
  constexpr int kStageElems = kTile * kDim;
  static_assert(kRounds * kGroups == kTile && kChunksPerThread * kThreads == kTile * kLanes);
  static_assert(kGroups * kG * kDim * sizeof(float) <= kStages * 2 * kStageElems * sizeof(T),
                "the block merge reuses the pipeline's shared memory");

  __shared__ alignas(16) unsigned char smem_raw[kStages * 2 * kStageElems * sizeof(T)];
  __shared__ bool valid_s[kStages][kTile];
  __shared__ float red_m[kGroups][kG];
  __shared__ float red_l[kGroups][kG];
  T* const tiles = reinterpret_cast<T*>(smem_raw);  // stage s: K at 2s, V at 2s + 1

  const int split = static_cast<int>(blockIdx.x);
  const int chunks = p.group / kG;
  const int kh = static_cast<int>(blockIdx.y) / chunks;
  const int hq0 = kh * p.group + (static_cast<int>(blockIdx.y) - kh * chunks) * kG;
  const int b = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int group_id = (tid / 32) * kRowsPerWarp + lane / kLanes;
  const int dl = lane % kLanes;  // this lane's 8 elements: [dl * 8, dl * 8 + 8)

  // With PDL: every input may be the previous kernel's output (a cache append, rope on q).
  device::pdl_wait();

  // This split's token range [begin, end) of sequence b.
  const int capacity = p.max_pages * p.page_size;
  const int len = min(max(p.seq_lens[b], 0), capacity);
  const int per_split = ((len + p.num_splits - 1) / p.num_splits + kTile - 1) / kTile * kTile;
  const int begin = min(len, split * per_split);
  const int end = min(len, begin + per_split);
  const int num_tiles = (end - begin + kTile - 1) / kTile;

  // The page ids of this thread's copy chunks of a tile, read one tile ahead of their
  // use: the table load's latency then overlaps a tile's math instead of delaying the
  // tile's copies (it was on every iteration's critical path). -1 past the end.
  const int32_t* table = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  auto lookup = [&](int tile, int32_t(&pages)[kChunksPerThread]) {
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int tok = begin + tile * kTile + (tid + i * kThreads) / kLanes;
      pages[i] = tok < end ? table[p.page_div.div(static_cast<uint32_t>(tok))] : -1;
    }
  };
  auto issue = [&](int tile, int stage, const int32_t(&pages)[kChunksPerThread]) {
    T* ks = tiles + (2 * stage) * kStageElems;
    T* vs = tiles + (2 * stage + 1) * kStageElems;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int cid = tid + i * kThreads;
      const int tt = cid / kLanes;
      const int dc = cid % kLanes;
      const int tok = begin + tile * kTile + tt;
      const int64_t page = pages[i];
      const bool ok = page >= 0 && page < p.num_pages;  // also false past the end (-1)
      const T* src_k = p.k_cache;
      const T* src_v = p.v_cache;
      if (ok) {
        const int slot =
            tok - static_cast<int>(p.page_div.div(static_cast<uint32_t>(tok))) * p.page_size;
        const int64_t row = (page * p.page_size + slot) * p.heads_k + kh;
        src_k += row * kDim + dc * kVec;
        src_v += row * kDim + dc * kVec;
      }
      cp_async_16(ks + tt * kDim + dc * kVec, src_k, ok);
      cp_async_16(vs + tt * kDim + dc * kVec, src_v, ok);
      if (dc == 0) valid_s[stage][tt] = ok;
    }
  };

  // Prologue: the first tiles' page ids all loaded before any copy waits on one.
  int32_t pages[kStages][kChunksPerThread];
#pragma unroll
  for (int s = 0; s < kStages; ++s) lookup(s, pages[s]);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) issue(s, s, pages[s]);
    cp_async_commit();
  }
  int32_t next_pages[kChunksPerThread];
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) next_pages[i] = pages[kStages - 1][i];

  float qf[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    vec_t<float, kVec> v;
    v.cast_load(p.q + (static_cast<int64_t>(b) * p.heads_q + hq0 + g) * kDim + dl * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) qf[g][j] = v[j] * p.scale_log2;
  }
  // Every block has started reading: the merge kernel (or the caller's next kernel) may be
  // scheduled; it waits for this grid to complete before it reads anything.
  device::pdl_launch_dependents();

  float m[kG], l[kG], acc[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[g][j] = 0.0f;
  }

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + kStages - 1;
    if (next < num_tiles) issue(next, next % kStages, next_pages);
    cp_async_commit();
    if (next + 1 < num_tiles) lookup(next + 1, next_pages);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = tile % kStages;
    const T* ks = tiles + (2 * stage) * kStageElems;
    const T* vs = tiles + (2 * stage + 1) * kStageElems;
    // The lane group's kRounds rows of the tile: all scores first, then one max update
    // and one rescale per head for the tile (not one per row, and no divergent branch).
    float s[kRounds][kG];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      vec_t<float, kVec> kf;
      kf.cast_load(ks + (r * kGroups + group_id) * kDim + dl * kVec);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot += qf[g][j] * kf[j];
        s[r][g] = dot;
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) {
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          s[r][g] += __shfl_xor_sync(device::kFullWarpMask, s[r][g], off);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      if (!valid_s[stage][r * kGroups + group_id]) {
#pragma unroll
        for (int g = 0; g < kG; ++g) s[r][g] = -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int r = 0; r < kRounds; ++r) mx = fmaxf(mx, s[r][g]);
      // While nothing was seen (mx -inf) the reference 0 keeps exp2f's arguments -inf, not
      // NaN: corr and the weights are then 0.
      const float ref = mx == -INFINITY ? 0.0f : mx;
      const float corr = exp2f(m[g] - ref);
      m[g] = mx;
      l[g] *= corr;
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[g][j] *= corr;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        s[r][g] = exp2f(s[r][g] - ref);  // now the row's weight
        l[g] += s[r][g];
      }
    }
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      vec_t<float, kVec> vf;
      vf.cast_load(vs + (r * kGroups + group_id) * kDim + dl * kVec);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[g][j] += s[r][g] * vf[j];
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the block's lane groups: their states over disjoint tokens.
  float* red_acc = reinterpret_cast<float*>(smem_raw);  // [kGroups][kG][kDim]
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) red_acc[(group_id * kG + g) * kDim + dl * kVec + j] = acc[g][j];
    if (dl == 0) {
      red_m[group_id][g] = m[g];
      red_l[group_id][g] = l[g];
    }
  }
  __syncthreads();
  for (int o = tid; o < kG * kDim; o += kThreads) {
    const int g = o / kDim;
    const int d = o % kDim;
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kGroups; ++n) mx = fmaxf(mx, red_m[n][g]);
    float sum = 0.0f, a = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int n = 0; n < kGroups; ++n) {
        const float mn = red_m[n][g];
        if (mn == -INFINITY) continue;
        const float w = exp2f(mn - mx);
        sum += w * red_l[n][g];
        a += w * red_acc[(n * kG + g) * kDim + d];
      }
    }
    const int64_t bh = static_cast<int64_t>(b) * p.heads_q + hq0 + g;
    if (p.num_splits == 1) {
      p.out[bh * kDim + d] = device::from_float<T>(sum > 0.0f ? a / sum : 0.0f);
    } else {
      const int64_t idx = bh * p.num_splits + split;
      p.ws_acc[idx * kDim + d] = a;
      if (d == 0) p.ws_ml[idx] = make_float2(mx, sum);
    }
  }
}

template <typename T, int kDim, int kG>
KernelStatus launch_split(Context& ctx, const char* op, DecodeParams<T> p, int batch,
                          DLDevice device) {
  static std::atomic<int> known[64];  // resident blocks per device, 0 until asked
  int64_t resident = 0;
  if (const cudaError_t e = decode_detail::resident_blocks(decode_split_kernel<T, kDim, kG>,
                                                           kThreads, 0, known, resident);
      e != cudaSuccess) {
    cudaGetLastError();
    return device::launch_status(ctx, op, e);
  }
  const int y_blocks = p.heads_k * (p.group / kG);
  p.num_splits =
      decode_detail::choose_splits(int64_t{batch} * y_blocks, int64_t{p.max_pages} * p.page_size,
                                   resident, decode_detail::kMinTokensPerSplit);
  return decode_detail::launch_split_and_merge<T, kDim>(
      ctx, op, p, batch, y_blocks, device, decode_split_kernel<T, kDim, kG>, kThreads, 0);
}

// KREG_DECODE_KERNEL (read once per process) picks the split kernel, for A/B measurements
// in one build: unset or "mma" the tensor-core kernel, "mma8" its 8-warp shape, "fma" this
// file's kernel.
enum class Variant { kMma, kMma8, kFma };
Variant variant() {
  static const Variant v = [] {
    const char* e = std::getenv("KREG_DECODE_KERNEL");
    if (e != nullptr && std::strcmp(e, "fma") == 0) return Variant::kFma;
    if (e != nullptr && std::strcmp(e, "mma8") == 0) return Variant::kMma8;
    return Variant::kMma;
  }();
  return v;
}

template <typename T, int kDim>
KernelStatus launch_dim(Context& ctx, const char* op, const DecodeParams<T>& p, int batch,
                        DLDevice device) {
  if (const Variant v = variant(); v != Variant::kFma) {
    return decode_detail::launch_mma<T, kDim>(ctx, op, p, batch, device, v == Variant::kMma8);
  }
  // Groups of 8 (Llama-3-70B) run as two chunks of 4: with 8 heads a thread holds 128
  // floats of q and output (247 registers, 2 blocks an SM); two blocks of 4 heads (126
  // registers, 4 blocks an SM) read the same K/V rows about together, the second from L2.
  if (p.group % 4 == 0) return launch_split<T, kDim, 4>(ctx, op, p, batch, device);
  if (p.group % 2 == 0) return launch_split<T, kDim, 2>(ctx, op, p, batch, device);
  return launch_split<T, kDim, 1>(ctx, op, p, batch, device);
}

template <typename T>
KernelStatus run(Context& ctx, const char* op, const DLTensor& q, const DLTensor& k_cache,
                 const DLTensor& v_cache, const DLTensor& block_table, const DLTensor& seq_lens,
                 DLTensor& out, double scale) {
  const int64_t batch = q.shape[0], heads_q = q.shape[1], dim = q.shape[2];
  const int64_t heads_k = k_cache.shape[2];
  DecodeParams<T> p{};
  p.q = data_ptr<const T>(q);
  p.k_cache = data_ptr<const T>(k_cache);
  p.v_cache = data_ptr<const T>(v_cache);
  p.block_table = data_ptr<const int32_t>(block_table);
  p.seq_lens = data_ptr<const int32_t>(seq_lens);
  p.out = data_ptr<T>(out);
  p.num_pages = k_cache.shape[0];
  p.heads_q = static_cast<int>(heads_q);
  p.heads_k = static_cast<int>(heads_k);
  p.group = static_cast<int>(heads_q / heads_k);
  p.page_size = static_cast<int>(k_cache.shape[1]);
  p.page_div = FastDivisor(static_cast<uint32_t>(p.page_size));
  p.max_pages = static_cast<int>(block_table.shape[1]);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  if (!device::aligned16(p.q) || !device::aligned16(p.k_cache) || !device::aligned16(p.v_cache)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: arguments 'q', 'k_cache' and 'v_cache' must be 16-byte aligned", op);
  }
  const auto b = static_cast<int>(batch);
  switch (dim) {
    case 64:
      return launch_dim<T, 64>(ctx, op, p, b, q.device);
    case 128:
      return launch_dim<T, 128>(ctx, op, p, b, q.device);
    default:
      return launch_dim<T, 256>(ctx, op, p, b, q.device);
  }
}

}  // namespace

KernelStatus decode_cuda(Context& ctx, const DLTensor& q, const DLTensor& k_cache,
                         const DLTensor& v_cache, const DLTensor& block_table,
                         const DLTensor& seq_lens, DLTensor& out, double scale) {
  const char* op = "attention.decode";
  if (auto st = check_decode(ctx, op, q, k_cache, scale); !st.ok()) return st;
  const int64_t batch = q.shape[0], heads_q = q.shape[1];
  if (batch == 0 || heads_q == 0) return kOk;
  if (batch > 65535 || heads_q > 65535 || block_table.shape[1] * k_cache.shape[1] > INT32_MAX / 2) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: B = %lld, Hq = %lld (each at most 65535) or max_pages * page_size = %lld "
                    "(below 2^30) is too large",
                    op, static_cast<long long>(batch), static_cast<long long>(heads_q),
                    static_cast<long long>(block_table.shape[1] * k_cache.shape[1]));
  }
  const device::DeviceGuard guard(q);
  if (!guard.ok()) return guard.fail(ctx, op);
  return device::visit_dtype<__nv_bfloat16, __half>(ctx, op, q, [&](auto tag) {
    return run<decltype(tag)>(ctx, op, q, k_cache, v_cache, block_table, seq_lens, out, scale);
  });
}

}  // namespace kreg::attention
