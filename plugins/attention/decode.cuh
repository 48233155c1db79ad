// attention.decode around its split kernel: the parameters, the cp.async helpers, the split
// count, the log-sum-exp merge of the splits and the launch of split + merge.
//
// A split kernel writes, per (sequence b, query head h, split s), either out[b, h] directly
// (one split) or the unnormalized partial acc[D] with (max in log2 units, sum) into the
// workspace; decode_merge_kernel combines the splits. The split kernel is decode_mma.cu's
// (tensor cores); decode.cu is the entry point.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "attention.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/device/workspace.cuh"

namespace kreg::attention::decode_detail {

constexpr int kMaxSplits = 128;
constexpr int kMinTokensPerSplit = 64;
constexpr int kBlockCostTokens = 64;  // a split block's fixed cost, in tokens (choose_splits)
constexpr int kMergeThreads = 128;

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
  device::FastDivisor page_div = device::FastDivisor(1);  // by page_size: token -> (page, slot)
  int max_pages;
  int num_splits;
  float scale_log2;  // scale * log2(e)
};

__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(pred ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// This split's token range [begin, end) of sequence b: a sequence's length (clamped to the
// table's capacity) cut into num_splits equal ranges rounded up to whole tiles of kTile.
struct SplitRange {
  int begin, end;
};
template <int kTile, typename T>
__device__ __forceinline__ SplitRange split_range(const DecodeParams<T>& p, int b, int split) {
  const int capacity = p.max_pages * p.page_size;
  const int len = min(max(p.seq_lens[b], 0), capacity);
  const int per_split = ((len + p.num_splits - 1) / p.num_splits + kTile - 1) / kTile * kTile;
  const int begin = min(len, split * per_split);
  return {begin, min(len, begin + per_split)};
}

// One block of kMergeThreads per (sequence, query head): the splits' partials combined by
// log-sum-exp. All splits' (max, sum) are read at once (one per thread) and reduced
// across the block; then kDim / 4 threads take a split's row as float4s and the block
// takes kRows splits at a time, so the loads of many splits are in flight together.
// Splits that saw no token (max -inf) get weight 0 (their acc is 0).
template <typename T, int kDim>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_kernel(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml,
                        T* __restrict__ out, int num_splits) {
  constexpr int kLanes = kDim / 4;
  constexpr int kRows = kMergeThreads / kLanes;  // 8, 4, 2
  static_assert(kMergeThreads >= kMaxSplits && kRows * kLanes == kMergeThreads);
  __shared__ float scratch[2][device::kWarpSize];
  __shared__ float w_s[kMergeThreads];
  __shared__ alignas(16) float part[kRows][kDim];

  // The split kernel's partials: launched with PDL, this grid may start before it ends.
  device::pdl_wait();
  const int64_t bh = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const float2 ml = tid < num_splits ? ws_ml[bh * num_splits + tid] : make_float2(-INFINITY, 0.0f);
  const float mx = device::block_row_max(ml.x, scratch[0]);
  const float w = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - mx);
  const float sum = device::block_row_sum(w * ml.y, scratch[1]);
  w_s[tid] = w;
  __syncthreads();

  const int row = tid / kLanes;
  const int c = (tid % kLanes) * 4;
  const float* src = ws_acc + bh * num_splits * kDim + c;
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = row; s < num_splits; s += kRows) {
    const float ws = w_s[s];
    const float4 v = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(s) * kDim);
    a.x += ws * v.x;
    a.y += ws * v.y;
    a.z += ws * v.z;
    a.w += ws * v.w;
  }
  device::pdl_launch_dependents();
  *reinterpret_cast<float4*>(&part[row][c]) = a;
  __syncthreads();
  for (int d = tid; d < kDim; d += kMergeThreads) {
    float t = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) t += part[r][d];
    out[bh * kDim + d] = device::from_float<T>(sum > 0.0f ? t / sum : 0.0f);
  }
}

// Splits per sequence. A block's time is about its tokens plus a fixed cost (the pipeline
// filling, the block merge, the partials' write: kBlockCostTokens), the grid runs in
// waves of `resident` blocks (SMs times blocks per SM), and a ragged batch leaves up to
// about half a block of tail; the count minimizing that estimate, at most kMaxSplits and
// at least `min_tokens` tokens of the table's capacity per split. Small batches get many
// short splits (B=1, Hk=8, ctx 4096: tens of splits), large ones few or one (no merge).
inline int choose_splits(int64_t base_blocks, int64_t capacity, int64_t resident,
                         int64_t min_tokens) {
  thread_local int64_t last_key[4] = {-1, -1, -1, -1};
  thread_local int last_splits = 1;
  if (last_key[0] == base_blocks && last_key[1] == capacity && last_key[2] == resident &&
      last_key[3] == min_tokens) {
    return last_splits;
  }
  const int64_t most = std::clamp<int64_t>(capacity / min_tokens, 1, kMaxSplits);
  int best = 1;
  double best_cost = INFINITY;
  for (int64_t s = 1; s <= most; ++s) {
    const double per_block = static_cast<double>(capacity) / static_cast<double>(s);
    const auto waves = static_cast<double>((base_blocks * s + resident - 1) / resident);
    const double cost = waves * (per_block + kBlockCostTokens) + 0.5 * per_block;
    if (cost < best_cost) {
      best_cost = cost;
      best = static_cast<int>(s);
    }
  }
  last_key[0] = base_blocks;
  last_key[1] = capacity;
  last_key[2] = resident;
  last_key[3] = min_tokens;
  last_splits = best;
  return best;
}

// SMs times `kernel`'s resident blocks per SM (with `smem` bytes of dynamic shared memory,
// which it is allowed first), asked once per device and cached in `known`.
template <typename Kernel>
cudaError_t resident_blocks(Kernel kernel, int threads, int smem, std::atomic<int> (&known)[64],
                            int64_t& out) {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const bool cached = dev >= 0 && dev < 64;
  if (cached) {
    if (const int n = known[dev].load(std::memory_order_relaxed); n > 0) {
      out = n;
      return cudaSuccess;
    }
  }
  // Always opted in: the default limit is 48 KiB of dynamic *and* static shared memory
  // together, so a kernel with 48 KiB dynamic and a few static bytes fails to launch.
  if (smem > 0) {
    if (const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess) {
      return e;
    }
  }
  int sms = 0, per_sm = 0;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
      e != cudaSuccess) {
    return e;
  }
  const int n = std::max(1, sms * per_sm);
  if (cached) known[dev].store(n, std::memory_order_relaxed);
  out = n;
  return cudaSuccess;
}

// The split kernel on grid (num_splits, y_blocks, batch) with p.num_splits already chosen,
// then, with more than one split, the merge; the workspace lives from the split kernel's
// launch to the merge's (stream-ordered: a CUDA-graph capture records its alloc and free).
template <typename T, int kDim, typename Kernel>
KernelStatus launch_split_and_merge(Context& ctx, const char* op, DecodeParams<T> p, int batch,
                                    int y_blocks, DLDevice device, Kernel kernel, int threads,
                                    int smem) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const size_t partials =
      p.num_splits > 1 ? static_cast<size_t>(batch) * p.heads_q * p.num_splits : 0;
  const size_t acc_bytes = partials * kDim * sizeof(float);
  cudaError_t err;
  {
    const device::Workspace ws(ctx, acc_bytes + partials * sizeof(float2), device);
    if (!ws.ok()) return ws.fail(ctx);
    if (p.num_splits > 1) {
      p.ws_acc = static_cast<float*>(ws.data());
      p.ws_ml = reinterpret_cast<float2*>(static_cast<char*>(ws.data()) + acc_bytes);
    }
    const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(y_blocks),
                    static_cast<unsigned>(batch));
    err = device::launch(kernel, grid, dim3(static_cast<unsigned>(threads)),
                         static_cast<size_t>(smem), stream, ctx.pdl(), p);
    if (err == cudaSuccess && p.num_splits > 1) {
      // Always a programmatic launch (where supported): the merge's blocks are scheduled
      // while the split kernel's last ones run, and wait in griddepcontrol.wait for its
      // partials; that hides the second launch's latency.
      err = device::launch(
          decode_merge_kernel<T, kDim>, dim3(static_cast<unsigned>(int64_t{batch} * p.heads_q)),
          dim3(kMergeThreads), 0, stream, true, static_cast<const float*>(p.ws_acc),
          static_cast<const float2*>(p.ws_ml), p.out, p.num_splits);
    }
  }  // ws freed here, after the merge in stream order
  // A failed cudaFreeAsync shows as the last error; read (and clear) it in any case.
  if (const cudaError_t free_err = cudaGetLastError(); err == cudaSuccess) err = free_err;
  return device::launch_status(ctx, op, err);
}

// The tensor-core split kernel's launch for head size kDim (decode_mma.cu); p.num_splits is
// chosen there.
template <typename T, int kDim>
KernelStatus launch_mma(Context& ctx, const char* op, const DecodeParams<T>& p, int batch,
                        DLDevice device);

}  // namespace kreg::attention::decode_detail
