// CUDA moe.align_block_size: token slots sorted by expert, each expert's segment padded
// to a multiple of block_size; the result is deterministic (within an expert, slots in
// increasing order) and equal to the CPU reference's.
//
// The N = T*k slots are cut into contiguous pieces, each owned by one warp; what a warp
// does with its piece is the same in both paths below:
//   A. It counts its slots per expert into its own shared histogram row, 32 slots a step:
//      the lanes with the same expert find each other (same_expert_lanes: one ballot per
//      bit of the expert id) and the lowest of them adds the group's size (no atomics).
//   B. Per expert, the rows become exclusive prefixes over the warps, plus where the
//      block's slots of that expert start in the output.
//   D. It walks its piece again and writes every slot at its row's prefix + its rank among
//      the step's lanes with the same expert, advancing the prefix by the group's size.
// Ids outside [0, num_experts) are skipped. Loads are issued 16 steps at a time, and steps
// with no valid id are skipped. (Grouping by ballots rather than __match_any_sync: that
// instruction is slow, and the single block took 81 us at 32768 slots with it, 62 without.)
//
// Small N (fewer than kMinChunks chunks of slots): one block of W warps does everything
// (W = 32 when (32 + 2) * E ints fit in 47 KiB of shared memory, fewer for large E), with
// C. a block scan of the padded counts for each expert's segment start, between B and D.
//
// Larger N: three kernels over C chunks of at least 512 slots (C <= 128), so that the
// work spreads over the SMs instead of one:
//   1. count: one block per chunk counts its slots per expert (shared atomics; order does
//      not matter for a count) into a workspace counts[E][C];
//   2. offsets: one block turns each expert's row into exclusive prefixes over the chunks
//      (in chunk order, which keeps the slot order), scans the padded totals into segment
//      starts, adds each expert's start to its row, and writes the padding, the expert_ids
//      blocks, the unused tails and the total;
//   3. scatter: one block per chunk runs A, B and D above over its chunk, its warps'
//      prefixes starting at offsets[e][chunk].
// The workspace (E * C ints) is a device::Workspace: the host's allocator when the call
// frame offers one (torch's caching allocator under the Python extension), else
// cudaMallocAsync on the call's stream; freed after the scatter is enqueued, in stream
// order, so graph-capturable.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kreg/device/warp.cuh"
#include "kreg/device/workspace.cuh"
#include "moe.hpp"
#include "routing.hpp"

namespace kreg::moe {
namespace {

using device::kFullWarpMask;
constexpr int kLanes = device::kWarpSize;
constexpr int kMaxWarps = 32;
// Dynamic shared memory, in ints: 48 KiB (the limit without an opt-in) less 1 KiB for
// the static arrays. num_experts <= 2048 leaves at least 3 warps.
constexpr int kSmemInts = (48 * 1024 - 1024) / 4;
constexpr int kUnroll = 16;

// The multi-block path.
constexpr int kMinChunk = 512;   // slots per chunk, at least
constexpr int kMaxChunks = 128;  // chunks, at most (bigger N: bigger chunks)
constexpr int kMinChunks = 9;    // fewer chunks than this: the single-block kernel
constexpr int kChunkWarps = 8;   // warps of a count or scatter block (fewer for large E)
constexpr int kOffsetsThreads = 1024;

// The lanes whose `valid` expert id equals this lane's (a mask that includes this lane;
// meaningless for an invalid lane). Ids are below 2^bits: two ids are equal when every
// bit is, and one ballot per bit tells each lane which lanes share that bit with it.
__device__ __forceinline__ unsigned same_expert_lanes(int expert, bool valid, int bits) {
  unsigned same = __ballot_sync(kFullWarpMask, valid);
  for (int b = 0; b < bits; ++b) {
    const bool bit = (expert >> b) & 1;
    const unsigned ones = __ballot_sync(kFullWarpMask, bit);
    same &= bit ? ones : ~ones;
  }
  return same;
}

__device__ __forceinline__ int expert_bits(int num_experts) {
  return num_experts > 1 ? 32 - __clz(num_experts - 1) : 0;
}

// A warp's walk over its slots [begin, end), shared by A and D: the ids are loaded
// kUnroll steps of 32 at a time, and for each step with a valid id in some lane,
// step(expert, valid, same, slot) runs on every lane, `same` being the lanes with the same
// expert (same_expert_lanes) and `slot` the lane's slot.
template <typename Step>
__device__ __forceinline__ void for_each_step(const int32_t* __restrict__ ids, int begin, int end,
                                              int num_experts, Step&& step) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int bits = expert_bits(num_experts);
  for (int base = begin; base < end; base += kUnroll * kLanes) {
    int e[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kLanes + lane;
      e[u] = i < end ? __ldg(ids + i) : -1;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool valid = e[u] >= 0 && e[u] < num_experts;
      if (!__any_sync(kFullWarpMask, valid)) continue;  // past the piece's end, say
      const unsigned same = same_expert_lanes(e[u], valid, bits);
      step(e[u], valid, same, base + u * kLanes + lane);
    }
  }
}

// A: this warp's slots [begin, end) counted per expert into my_hist (zeroed by the caller).
__device__ __forceinline__ void count_piece(const int32_t* __restrict__ ids, int begin, int end,
                                            int num_experts, int32_t* my_hist) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  for_each_step(ids, begin, end, num_experts, [&](int e, bool valid, unsigned same, int) {
    if (valid && lane == __ffs(same) - 1) my_hist[e] += __popc(same);
    __syncwarp();
  });
}

// D: this warp's slots [begin, end) written at my_hist[e] (the next free position of
// expert e for this warp) + the rank among the step's lanes with expert e.
__device__ __forceinline__ void scatter_piece(const int32_t* __restrict__ ids, int begin, int end,
                                              int num_experts, int32_t* my_hist,
                                              int32_t* __restrict__ sorted) {
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const unsigned lanes_below = (1u << lane) - 1u;
  for_each_step(ids, begin, end, num_experts, [&](int e, bool valid, unsigned same, int slot) {
    if (valid) sorted[my_hist[e] + __popc(same & lanes_below)] = slot;
    __syncwarp();
    if (valid && lane == __ffs(same) - 1) my_hist[e] += __popc(same);
    __syncwarp();
  });
}

// C and the outputs that do not depend on slot order, by every thread of the block: from
// the complete count[E] (shared), start[E] (shared) = exclusive scan of the padded counts;
// then each expert's padding (the sentinel N) and expert_ids blocks, the unused tails
// (sentinel, and -1 blocks) and the total. start[] is complete when this returns.
__device__ void lay_out_segments(const int32_t* count, int32_t* start, int32_t* warp_totals,
                                 int32_t* __restrict__ sorted, int32_t* __restrict__ blocks,
                                 int32_t* __restrict__ total_out, const AlignParams& p) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int lane = tid % kLanes;
  const int warp = tid / kLanes;
  const int nwarps = nthreads / kLanes;
  const int E = p.num_experts;
  const int bs = p.block_size;
  // Each thread owns a contiguous run of experts.
  const int per = (E + nthreads - 1) / nthreads;
  const int x0 = min(E, tid * per);
  const int x1 = min(E, x0 + per);
  int local = 0;
  for (int x = x0; x < x1; ++x) local += (count[x] + bs - 1) / bs * bs;
  int total = 0;
  int run = device::block_exclusive_scan(local, warp_totals, &total);
  for (int x = x0; x < x1; ++x) {
    start[x] = run;
    run += (count[x] + bs - 1) / bs * bs;
  }
  __syncthreads();

  const int sentinel = static_cast<int>(p.slots);
  for (int x = warp; x < E; x += nwarps) {
    const int c = count[x];
    const int padded = (c + bs - 1) / bs * bs;
    const int s = start[x];
    for (int j = c + lane; j < padded; j += kLanes) sorted[s + j] = sentinel;
    for (int b = lane; b < padded / bs; b += kLanes) blocks[s / bs + b] = x;
  }
  for (int j = total + tid; j < p.sorted_len; j += nthreads) sorted[j] = sentinel;
  for (int b = total / bs + tid; b < p.blocks_len; b += nthreads) blocks[b] = -1;
  if (tid == 0) total_out[0] = total;
}

// ---- Small N: one block ----

__global__ void __launch_bounds__(kMaxWarps* kLanes)
    align_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ sorted,
                 int32_t* __restrict__ blocks, int32_t* __restrict__ total_out,
                 const AlignParams p) {
  extern __shared__ int32_t smem[];
  __shared__ int32_t warp_totals[kMaxWarps];
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int warp = tid / kLanes;
  const int nwarps = nthreads / kLanes;
  const int E = p.num_experts;
  const int n = static_cast<int>(p.slots);
  int32_t* hist = smem;                // [nwarps][E]
  int32_t* count = smem + nwarps * E;  // [E]
  int32_t* start = count + E;          // [E]
  int32_t* my_hist = hist + warp * E;

  const int seg = (n + nwarps - 1) / nwarps;
  const int seg_begin = min(n, warp * seg);
  const int seg_end = min(n, seg_begin + seg);

  for (int i = tid; i < nwarps * E; i += nthreads) hist[i] = 0;
  __syncthreads();
  count_piece(ids, seg_begin, seg_end, E, my_hist);  // A
  __syncthreads();
  for (int x = tid; x < E; x += nthreads) {  // B
    int run = 0;
    for (int w = 0; w < nwarps; ++w) {
      const int c = hist[w * E + x];
      hist[w * E + x] = run;
      run += c;
    }
    count[x] = run;
  }
  __syncthreads();
  lay_out_segments(count, start, warp_totals, sorted, blocks, total_out, p);  // C
  for (int i = tid; i < nwarps * E; i += nthreads) hist[i] += start[i % E];
  __syncthreads();
  scatter_piece(ids, seg_begin, seg_end, E, my_hist, sorted);  // D
}

// ---- Larger N: count, offsets, scatter ----

struct Chunks {
  int size;   // slots per chunk
  int count;  // C
};

Chunks chunks_for(int64_t slots) {
  const int64_t per_chunk = (slots + kMaxChunks - 1) / kMaxChunks;
  const int64_t size =
      std::max<int64_t>(kMinChunk, (per_chunk + kMinChunk - 1) / kMinChunk * kMinChunk);
  return {static_cast<int>(size), static_cast<int>((slots + size - 1) / size)};
}

// 1. counts[e * C + chunk] = slots of expert e in the chunk.
__global__ void align_count_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ counts,
                                   int slots, int num_experts, int chunk_size, int num_chunks) {
  extern __shared__ int32_t hist[];  // [E]
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  for (int x = tid; x < num_experts; x += nthreads) hist[x] = 0;
  __syncthreads();
  const int chunk = static_cast<int>(blockIdx.x);
  const int begin = chunk * chunk_size;
  const int end = min(slots, begin + chunk_size);
  for (int i = begin + tid; i < end; i += nthreads) {
    const int e = __ldg(ids + i);
    if (e >= 0 && e < num_experts) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int x = tid; x < num_experts; x += nthreads) counts[x * num_chunks + chunk] = hist[x];
}

// 2. counts[e][c] -> start[e] + (slots of expert e in chunks before c); the layout.
__global__ void __launch_bounds__(kOffsetsThreads)
    align_offsets_kernel(int32_t* __restrict__ counts, int32_t* __restrict__ sorted,
                         int32_t* __restrict__ blocks, int32_t* __restrict__ total_out,
                         const AlignParams p, int num_chunks) {
  extern __shared__ int32_t smem[];
  __shared__ int32_t warp_totals[kMaxWarps];
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int E = p.num_experts;
  const int C = num_chunks;
  int32_t* count = smem;      // [E]
  int32_t* start = smem + E;  // [E]

  // `tpe` adjacent lanes (a power of two <= 32) share an expert's row: each sums a run of
  // it, an exclusive scan over the tpe lanes places the runs, and each writes its run's
  // prefixes. Every thread takes the same number of rounds (shuffles need the whole warp).
  int tpe = 1;
  while (tpe < kLanes && tpe * 2 * E <= nthreads) tpe *= 2;
  const int sub = tid % tpe;
  const int experts_per_round = nthreads / tpe;
  const int per = (C + tpe - 1) / tpe;
  const int c0 = min(C, sub * per);
  const int c1 = min(C, c0 + per);
  for (int e0 = 0; e0 < E; e0 += experts_per_round) {
    const int e = e0 + tid / tpe;
    const bool active = e < E;
    int32_t* row = counts + static_cast<int64_t>(e) * C;
    int sum = 0;
    if (active) {
#pragma unroll 8
      for (int c = c0; c < c1; ++c) sum += row[c];
    }
    const int incl = device::warp_inclusive_scan(sum, tpe);
    if (active) {
      device::serial_exclusive_scan(row, row, c0, c1, incl - sum);
      if (sub == tpe - 1) count[e] = incl;
    }
  }
  __syncthreads();
  lay_out_segments(count, start, warp_totals, sorted, blocks, total_out, p);
  for (int i = tid; i < E * C; i += nthreads) counts[i] += start[i / C];
}

// 3. One chunk's slots, A, B and D, the warps' prefixes starting at offsets[e][chunk].
__global__ void align_scatter_kernel(const int32_t* __restrict__ ids,
                                     const int32_t* __restrict__ offsets,
                                     int32_t* __restrict__ sorted, int slots, int num_experts,
                                     int chunk_size, int num_chunks) {
  extern __shared__ int32_t hist[];  // [nwarps][E]
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int warp = tid / kLanes;
  const int nwarps = nthreads / kLanes;
  const int E = num_experts;
  const int chunk = static_cast<int>(blockIdx.x);
  const int begin = chunk * chunk_size;
  const int end = min(slots, begin + chunk_size);
  const int seg = (end - begin + nwarps - 1) / nwarps;
  const int seg_begin = min(end, begin + warp * seg);
  const int seg_end = min(end, seg_begin + seg);
  int32_t* my_hist = hist + warp * E;

  for (int i = tid; i < nwarps * E; i += nthreads) hist[i] = 0;
  __syncthreads();
  count_piece(ids, seg_begin, seg_end, E, my_hist);  // A
  __syncthreads();
  for (int x = tid; x < E; x += nthreads) {  // B, from the chunk's place in the output
    int run = offsets[static_cast<int64_t>(x) * num_chunks + chunk];
    for (int w = 0; w < nwarps; ++w) {
      const int c = hist[w * E + x];
      hist[w * E + x] = run;
      run += c;
    }
  }
  __syncthreads();
  scatter_piece(ids, seg_begin, seg_end, E, my_hist, sorted);  // D
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
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const auto* ids = data_ptr<const int32_t>(topk_ids);
  auto* sorted = data_ptr<int32_t>(out_sorted_token_ids);
  auto* blocks = data_ptr<int32_t>(out_expert_ids);
  auto* total = data_ptr<int32_t>(out_num_tokens_post_pad);
  const int E = p.num_experts;
  const Chunks chunks = chunks_for(p.slots);

  if (chunks.count < kMinChunks) {
    const int warps = std::min(kMaxWarps, kSmemInts / E - 2);
    const size_t smem = static_cast<size_t>(warps + 2) * E * sizeof(int32_t);
    align_kernel<<<1, warps * kLanes, smem, stream>>>(ids, sorted, blocks, total, p);
    return device::launch_status(ctx, op);
  }

  const device::Workspace ws(ctx, static_cast<size_t>(E) * chunks.count * sizeof(int32_t),
                             topk_ids.device);
  if (!ws.ok()) return ws.fail(ctx);
  auto* counts = static_cast<int32_t*>(ws.data());
  const int slots = static_cast<int>(p.slots);
  const int scatter_warps = std::min(kChunkWarps, kSmemInts / E - 1);
  align_count_kernel<<<chunks.count, kChunkWarps * kLanes, E * sizeof(int32_t), stream>>>(
      ids, counts, slots, E, chunks.size, chunks.count);
  align_offsets_kernel<<<1, kOffsetsThreads, 2 * E * sizeof(int32_t), stream>>>(
      counts, sorted, blocks, total, p, chunks.count);
  align_scatter_kernel<<<chunks.count, scatter_warps * kLanes,
                         static_cast<size_t>(scatter_warps) * E * sizeof(int32_t), stream>>>(
      ids, counts, sorted, slots, E, chunks.size, chunks.count);
  return device::launch_status(ctx, op);  // ws is freed after the scatter, in stream order
}

}  // namespace kreg::moe
