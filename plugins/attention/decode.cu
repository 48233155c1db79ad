// CUDA decode: paged decode attention with GQA, flash-decoding style.
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
// masked out of the softmax). Each K/V row is read from HBM once for the kG query heads of
// the block: all of a kv head's query heads when Hq / Hk is 1, 2, 4 or 8 (else chunks of
// the largest of those dividing it).
//
// Within a tile, a row is spread over D / 8 lanes (16 bytes each) and a warp takes
// 256 / D rows at a time; each such lane group keeps its own running max, sum and output
// for the kG heads (online softmax in the log2 domain: scale * log2(e) is folded into q).
// At the end the block's lane groups are merged in shared memory. With one split the block
// writes out = acc / sum directly; with more it writes (acc, max, sum) partials to a
// workspace and a merge kernel combines the splits by log-sum-exp.
//
// Workspace: B * Hq * num_splits * (D + 2) floats, a device::Workspace: the host's
// allocator when the call frame offers one (torch's caching allocator under the Python
// extension), else cudaMallocAsync on the call's stream, freed after the merge is enqueued
// (stream-ordered, so it is graph-capturable: a capture records allocation and free
// nodes). No workspace when one split suffices.
//
// Empty sequences (seq_lens[b] == 0) give zeros. Lengths are clamped to [0, max_pages *
// page_size] and page ids outside [0, num_pages) contribute nothing: no read outside the
// caches or the table. The CPU reference reports both as errors.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention.hpp"
#include "checks.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/device/workspace.cuh"

namespace kreg::attention {
namespace {

using device::FastDivisor;
using device::to_float;
using device::vec_t;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 4;
constexpr int kVec = 8;  // 16 bytes of a 16-bit type
constexpr int kMaxSplits = 128;
constexpr int kMinTokensPerSplit = 256;

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <typename T>
struct DecodeParams {
  const T* q;
  const T* k_cache;
  const T* v_cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  T* out;         // written directly when num_splits == 1
  float* ws_acc;  // [B, Hq, num_splits, D] unnormalized outputs
  float2* ws_ml;  // [B, Hq, num_splits] (max in log2 units, sum)
  int64_t num_pages;
  int heads_q;
  int heads_k;
  int group;  // Hq / Hk
  int page_size;
  FastDivisor page_div = FastDivisor(1);  // by page_size: token -> (page, slot)
  int max_pages;
  int num_splits;
  float scale_log2;  // scale * log2(e)
};

template <typename T, int kDim, int kG>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(DecodeParams<T> p) {
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

  // This split's token range [begin, end) of sequence b.
  const int capacity = p.max_pages * p.page_size;
  const int len = min(max(p.seq_lens[b], 0), capacity);
  const int per_split = ((len + p.num_splits - 1) / p.num_splits + kTile - 1) / kTile * kTile;
  const int begin = split * per_split;
  const int end = min(len, begin + per_split);
  const int num_tiles = end > begin ? (end - begin + kTile - 1) / kTile : 0;

  const int32_t* table = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  auto issue = [&](int tile, int stage) {
    T* ks = tiles + (2 * stage) * kStageElems;
    T* vs = tiles + (2 * stage + 1) * kStageElems;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int cid = tid + i * kThreads;
      const int tt = cid / kLanes;
      const int dc = cid % kLanes;
      const int tok = begin + tile * kTile + tt;
      bool ok = tok < end;
      const T* src_k = p.k_cache;
      const T* src_v = p.v_cache;
      if (ok) {
        const int page_index = static_cast<int>(p.page_div.div(static_cast<uint32_t>(tok)));
        const int slot = tok - page_index * p.page_size;
        const int64_t page = table[page_index];
        ok = page >= 0 && page < p.num_pages;
        if (ok) {
          const int64_t row = (page * p.page_size + slot) * p.heads_k + kh;
          src_k += row * kDim + dc * kVec;
          src_v += row * kDim + dc * kVec;
        }
      }
      cp_async_16(ks + tt * kDim + dc * kVec, src_k, ok);
      cp_async_16(vs + tt * kDim + dc * kVec, src_v, ok);
      if (dc == 0) valid_s[stage][tt] = ok;
    }
  };

  float qf[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    vec_t<float, kVec> v;
    v.cast_load(p.q + (static_cast<int64_t>(b) * p.heads_q + hq0 + g) * kDim + dl * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) qf[g][j] = v[j] * p.scale_log2;
  }
  float m[kG], l[kG], acc[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[g][j] = 0.0f;
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) issue(s, s);
    cp_async_commit();
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + kStages - 1;
    if (next < num_tiles) issue(next, next % kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = tile % kStages;
    const T* ks = tiles + (2 * stage) * kStageElems;
    const T* vs = tiles + (2 * stage + 1) * kStageElems;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int tt = r * kGroups + group_id;
      const bool ok = valid_s[stage][tt];
      vec_t<float, kVec> kf;
      kf.cast_load(ks + tt * kDim + dl * kVec);
      float s[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot += qf[g][j] * kf[j];
        s[g] = dot;
      }
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) {
#pragma unroll
        for (int g = 0; g < kG; ++g) s[g] += __shfl_xor_sync(device::kFullWarpMask, s[g], off);
      }
      vec_t<float, kVec> vf;
      vf.cast_load(vs + tt * kDim + dl * kVec);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float sg = ok ? s[g] : -INFINITY;
        if (sg > m[g]) {
          const float corr = exp2f(m[g] - sg);  // 0 while m is -inf
          l[g] *= corr;
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc[g][j] *= corr;
          m[g] = sg;
        }
        const float pr = ok ? exp2f(sg - m[g]) : 0.0f;
        l[g] += pr;
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[g][j] += pr * vf[j];
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

// One block of D threads per (sequence, query head): the splits' partials combined by
// log-sum-exp, in split order. Splits that saw no token (max -inf) are skipped.
template <typename T>
__global__ void decode_merge_kernel(const float* __restrict__ ws_acc,
                                    const float2* __restrict__ ws_ml, T* __restrict__ out,
                                    int num_splits, int dim) {
  const int64_t bh = blockIdx.x;
  const int d = static_cast<int>(threadIdx.x);
  const float2* ml = ws_ml + bh * num_splits;
  float mx = -INFINITY;
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, ml[s].x);
  float sum = 0.0f, a = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < num_splits; ++s) {
      const float2 v = ml[s];
      if (v.x == -INFINITY) continue;
      const float w = exp2f(v.x - mx);
      sum += w * v.y;
      a += w * ws_acc[(bh * num_splits + s) * dim + d];
    }
  }
  out[bh * dim + d] = device::from_float<T>(sum > 0.0f ? a / sum : 0.0f);
}

// Splits per sequence: enough blocks for about four per SM, at least kMinTokensPerSplit
// tokens of the table's capacity per split, at most kMaxSplits.
int choose_splits(int64_t base_blocks, int64_t capacity, int sms) {
  const int64_t want = (4 * static_cast<int64_t>(sms) + base_blocks - 1) / base_blocks;
  const int64_t by_length = std::max<int64_t>(1, capacity / kMinTokensPerSplit);
  return static_cast<int>(std::clamp<int64_t>(std::min(want, by_length), 1, kMaxSplits));
}

template <typename T, int kDim, int kG>
cudaError_t launch_split(const DecodeParams<T>& p, int batch, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.heads_k * (p.group / kG)), static_cast<unsigned>(batch));
  decode_split_kernel<T, kDim, kG><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int kDim>
cudaError_t launch_dim(const DecodeParams<T>& p, int batch, cudaStream_t stream) {
  if (p.group % 8 == 0) return launch_split<T, kDim, 8>(p, batch, stream);
  if (p.group % 4 == 0) return launch_split<T, kDim, 4>(p, batch, stream);
  if (p.group % 2 == 0) return launch_split<T, kDim, 2>(p, batch, stream);
  return launch_split<T, kDim, 1>(p, batch, stream);
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

  int dev = 0;
  int sms = 132;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    return device::launch_status(ctx, op);
  }
  const int kg = p.group % 8 == 0 ? 8 : p.group % 4 == 0 ? 4 : p.group % 2 == 0 ? 2 : 1;
  const int64_t base_blocks = batch * heads_k * (p.group / kg);
  p.num_splits = choose_splits(base_blocks, int64_t{p.max_pages} * p.page_size, sms);

  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const size_t partials =
      p.num_splits > 1 ? static_cast<size_t>(batch * heads_q * p.num_splits) : 0;
  const size_t acc_bytes = partials * static_cast<size_t>(dim) * sizeof(float);
  cudaError_t err;
  {
    const device::Workspace ws(ctx, acc_bytes + partials * sizeof(float2), q.device);
    if (!ws.ok()) return ws.fail(ctx);
    if (p.num_splits > 1) {
      p.ws_acc = static_cast<float*>(ws.data());
      p.ws_ml = reinterpret_cast<float2*>(static_cast<char*>(ws.data()) + acc_bytes);
    }
    switch (dim) {
      case 64:
        err = launch_dim<T, 64>(p, static_cast<int>(batch), stream);
        break;
      case 128:
        err = launch_dim<T, 128>(p, static_cast<int>(batch), stream);
        break;
      default:
        err = launch_dim<T, 256>(p, static_cast<int>(batch), stream);
        break;
    }
    if (err == cudaSuccess && p.num_splits > 1) {
      decode_merge_kernel<T>
          <<<static_cast<unsigned>(batch * heads_q), static_cast<unsigned>(dim), 0, stream>>>(
              p.ws_acc, p.ws_ml, p.out, p.num_splits, static_cast<int>(dim));
      err = cudaGetLastError();
    }
  }  // ws freed here, after the merge in stream order
  // A failed cudaFreeAsync shows as the last error; read (and clear) it in any case.
  if (const cudaError_t free_err = cudaGetLastError(); err == cudaSuccess) err = free_err;
  return device::launch_status(ctx, op, err);
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
