// CUDA moe.align_block_size: token slots sorted by expert, each expert's segment padded
// to a multiple of block_size; the result is deterministic (within an expert, slots in
// increasing order) and equal to the CPU reference's.
//
// One block of W warps (W = 32 when (32 + 2) * E ints fit in 47 KiB of shared memory,
// fewer for large E: 256 experts get 32 warps, 2048 get 3). The N = T*k slots are cut into W
// contiguous segments, one per warp.
//   A. Each warp counts its segment per expert into its own shared histogram row, 32
//      slots a step: the lanes with the same expert find each other (same_expert_lanes:
//      one ballot per bit of the expert id) and the lowest of them adds the group's
//      size (no atomics, no contention between warps).
//   B. Per expert, the rows become exclusive prefixes over the warps (where warp w's
//      slots of expert e start inside e's segment) and their total is e's count.
//   C. A block scan of the padded counts gives each expert's segment start.
//   D. Each warp walks its segment again and writes every slot at
//      start[e] + prefix[w][e] + (its rank among the step's lanes with expert e); the
//      warps also write each expert's padding (the sentinel T*k) and its expert_ids
//      blocks, and the block fills the unused tails (sentinel, and -1 blocks).
// Ids outside [0, num_experts) are skipped. Loads are issued 16 steps at a time so one SM
// keeps enough of the id array in flight; steps with no valid id are skipped.
// Grouping by ballots rather than __match_any_sync: match.any is a slow instruction (its
// unit serialises the warps of an SM), and with 32 warps each matching 2 x N / 1024
// steps it bounded the whole kernel (20 us at 512 slots, 81 us at 32768 on the H200).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "moe.hpp"
#include "routing.hpp"

namespace kreg::moe {
namespace {

constexpr int kLanes = 32;
constexpr int kMaxWarps = 32;
// Dynamic shared memory, in ints: 48 KiB (the limit without an opt-in) less 1 KiB for
// the static arrays. num_experts <= 2048 leaves at least 3 warps.
constexpr int kSmemInts = (48 * 1024 - 1024) / 4;
constexpr int kUnroll = 16;
constexpr unsigned kFullMask = 0xffffffffu;

// The lanes whose `valid` expert id equals this lane's (a mask that includes this lane;
// meaningless for an invalid lane). Ids are below 2^bits: two ids are equal when every
// bit is, and one ballot per bit tells each lane which lanes share that bit with it.
__device__ __forceinline__ unsigned same_expert_lanes(int expert, bool valid, int bits) {
  unsigned same = __ballot_sync(kFullMask, valid);
  for (int b = 0; b < bits; ++b) {
    const bool bit = (expert >> b) & 1;
    const unsigned ones = __ballot_sync(kFullMask, bit);
    same &= bit ? ones : ~ones;
  }
  return same;
}

__global__ void __launch_bounds__(kMaxWarps* kLanes)
    align_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ sorted,
                 int32_t* __restrict__ blocks, int32_t* __restrict__ total_out,
                 const AlignParams p) {
  extern __shared__ int32_t smem[];
  __shared__ int32_t warp_totals[kMaxWarps];
  __shared__ int32_t total_s;
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int lane = tid % kLanes;
  const int warp = tid / kLanes;
  const int nwarps = nthreads / kLanes;
  const int E = p.num_experts;
  const int bs = p.block_size;
  const int n = static_cast<int>(p.slots);
  int32_t* hist = smem;                // [nwarps][E]
  int32_t* count = smem + nwarps * E;  // [E]
  int32_t* start = count + E;          // [E]
  int32_t* my_hist = hist + warp * E;

  const int seg = (n + nwarps - 1) / nwarps;
  const int seg_begin = std::min(n, warp * seg);
  const int seg_end = std::min(n, seg_begin + seg);
  const unsigned lanes_below = (1u << lane) - 1u;
  const int bits = E > 1 ? 32 - __clz(E - 1) : 0;  // expert ids fit in `bits` bits

  for (int i = tid; i < nwarps * E; i += nthreads) hist[i] = 0;
  __syncthreads();

  // A. Per-warp histograms.
  for (int base = seg_begin; base < seg_end; base += kUnroll * kLanes) {
    int e[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kLanes + lane;
      e[u] = i < seg_end ? __ldg(ids + i) : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool valid = e[u] >= 0 && e[u] < E;
      if (!__any_sync(kFullMask, valid)) continue;  // past the segment's end, say
      const unsigned same = same_expert_lanes(e[u], valid, bits);
      if (valid && lane == __ffs(same) - 1) my_hist[e[u]] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();

  // B. Prefixes over warps, totals per expert.
  for (int x = tid; x < E; x += nthreads) {
    int run = 0;
    for (int w = 0; w < nwarps; ++w) {
      const int c = hist[w * E + x];
      hist[w * E + x] = run;
      run += c;
    }
    count[x] = run;
  }
  __syncthreads();

  // C. Exclusive scan of the padded counts: each thread owns a contiguous run of experts.
  const int per = (E + nthreads - 1) / nthreads;
  const int x0 = std::min(E, tid * per);
  const int x1 = std::min(E, x0 + per);
  int local = 0;
  for (int x = x0; x < x1; ++x) local += (count[x] + bs - 1) / bs * bs;
  int incl = local;
#pragma unroll
  for (int off = 1; off < kLanes; off *= 2) {
    const int v = __shfl_up_sync(kFullMask, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == kLanes - 1) warp_totals[warp] = incl;
  __syncthreads();
  int run = incl - local;
  for (int w = 0; w < warp; ++w) run += warp_totals[w];
  for (int x = x0; x < x1; ++x) {
    start[x] = run;
    run += (count[x] + bs - 1) / bs * bs;
  }
  if (tid == nthreads - 1) total_s = run;  // the last thread's run ends at the total
  __syncthreads();

  // D. Scatter the slots.
  for (int base = seg_begin; base < seg_end; base += kUnroll * kLanes) {
    int e[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kLanes + lane;
      e[u] = i < seg_end ? __ldg(ids + i) : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool valid = e[u] >= 0 && e[u] < E;
      if (!__any_sync(kFullMask, valid)) continue;
      const unsigned same = same_expert_lanes(e[u], valid, bits);
      if (valid) {
        const int pos = start[e[u]] + my_hist[e[u]] + __popc(same & lanes_below);
        sorted[pos] = base + u * kLanes + lane;
      }
      __syncwarp();
      if (valid && lane == __ffs(same) - 1) my_hist[e[u]] += __popc(same);
      __syncwarp();
    }
  }

  // Padding and expert blocks, one warp per expert.
  const int sentinel = n;
  for (int x = warp; x < E; x += nwarps) {
    const int c = count[x];
    const int padded = (c + bs - 1) / bs * bs;
    const int s = start[x];
    for (int j = c + lane; j < padded; j += kLanes) sorted[s + j] = sentinel;
    for (int b = lane; b < padded / bs; b += kLanes) blocks[s / bs + b] = x;
  }
  const int total = total_s;
  for (int j = total + tid; j < p.sorted_len; j += nthreads) sorted[j] = sentinel;
  for (int b = total / bs + tid; b < p.blocks_len; b += nthreads) blocks[b] = -1;
  if (tid == 0) total_out[0] = total;
}

}  // namespace

KernelStatus align_block_size_cuda(Context& ctx, const DLTensor& topk_ids,
                                   DLTensor& out_sorted_token_ids, DLTensor& out_expert_ids,
                                   DLTensor& out_num_tokens_post_pad, int64_t num_experts,
                                   int64_t block_size, bool /*ignore_invalid*/) {
  const char* op = "moe.align_block_size";
  AlignParams p;
  if (KernelStatus st = align_params(ctx, topk_ids, out_sorted_token_ids, out_expert_ids,
                                     num_experts, block_size, p);
      !st.ok()) {
    return st;
  }
  const device::DeviceGuard guard(topk_ids);
  if (!guard.ok()) return guard.fail(ctx, op);
  const int warps = std::min(kMaxWarps, kSmemInts / p.num_experts - 2);
  const size_t smem = static_cast<size_t>(warps + 2) * p.num_experts * sizeof(int32_t);
  align_kernel<<<1, warps * kLanes, smem, static_cast<cudaStream_t>(ctx.stream())>>>(
      data_ptr<const int32_t>(topk_ids), data_ptr<int32_t>(out_sorted_token_ids),
      data_ptr<int32_t>(out_expert_ids), data_ptr<int32_t>(out_num_tokens_post_pad), p);
  return device::launch_status(ctx, op);
}

}  // namespace kreg::moe
