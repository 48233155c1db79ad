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
// What does not depend on slot order is written in parallel, never by a serial loop: the
// whole of out_sorted_token_ids is first filled with the sentinel (16-byte stores; D then
// overwrites the real slots, ordered after the fill by a barrier or a kernel boundary),
// the segment starts are one block scan of the padded counts (C below), and
// out_expert_ids[b] is found by a binary search of b * block_size in the segment starts.
//
// Tiny N (N <= 1024, E <= 1024: decode): align_tiny_kernel below, one slot a thread, two
// barriers, straight-line code.
//
// Small N (at most 8 chunks of 512 slots, N <= 4096): one block of W = 16 warps (fewer
// for large E: the rows must fit in 47 KiB of shared memory) fills, does A, then C (the
// scan, its thread per expert also turning the expert's column of rows into prefixes: B),
// then the expert ids and D. Four barriers; no workspace.
//
// Larger N: two kernels over C chunks of at least 512 slots (C <= 128), so that the work
// spreads over the SMs instead of one:
//   1. count: one block per chunk fills its share of out_sorted_token_ids with the
//      sentinel and counts its slots per expert (shared atomics; order does not matter for
//      a count) into a workspace row counts[chunk][E'] (E' = E rounded up to 4: 16-byte
//      rows; one coalesced store per block);
//   2. scatter: one block per chunk does A over its chunk, then reads all C rows (16-byte
//      loads, many in flight: 4 E' C bytes from L2, 64 KiB at C = 64, E = 256) for each
//      expert's total and its count in the chunks before this one, scans the padded totals
//      (C, the same in every block), places its warps' prefixes (B: segment start + the
//      earlier chunks + the earlier warps), writes its share of out_expert_ids (block 0
//      also the total) and does D.
// The workspace (4 E' C bytes) is a device::Workspace: the host's allocator when the call
// frame offers one (torch's caching allocator under the Python extension), else
// cudaMallocAsync on the call's stream; freed after the scatter is enqueued, in stream
// order, so graph-capturable.
//
// Programmatic dependent launch (ctx.pdl()): each kernel zeroes its shared histograms,
// then waits (griddepcontrol.wait) before its first global access, and lets the next
// kernel be scheduled once its loads of the inputs are done. The scatter kernel counts its
// chunk (A) BEFORE its wait: it reads only topk_ids, which the count kernel does not
// write, and the scatter kernel cannot start before every block of the count kernel has
// passed its own wait (a dependent launches once all blocks of the grid before it have
// signalled, and they signal after waiting), so the kernel that produced topk_ids has
// completed by then. Its reads of counts[] and its stores come after its wait.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
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
// the static arrays.
constexpr int kSmemInts = (48 * 1024 - 1024) / 4;
constexpr int kUnroll = 16;

// The single-block path.
constexpr int kSmallWarps = 16;  // fewer for large E

// The multi-block path.
constexpr int kMinChunk = 512;   // slots per chunk, at least
constexpr int kMaxChunks = 128;  // chunks, at most (bigger N: bigger chunks)
constexpr int kMinChunks = 9;    // fewer chunks than this: the single-block kernel
constexpr int kChunkWarps = 8;   // warps of a count or scatter block (fewer for large E)

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
// expert (same_expert_lanes) and `slot` the lane's slot. The loads bypass L1 (ld.global.cg):
// the scatter kernel reads topk_ids before its programmatic-launch wait (see above).
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
      e[u] = i < end ? __ldcg(ids + i) : -1;
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

// dst[begin, end) = v by every thread of the block: 16-byte stores between a scalar head
// and tail (dst may be any int32 view). Not unrolled: a thread stores a few vectors, and
// unrolled copies only grow the code a single cold block must fetch.
__device__ __forceinline__ void block_fill(int32_t* __restrict__ dst, int begin, int end,
                                           int32_t v) {
  if (begin >= end) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int misalign = static_cast<int>(reinterpret_cast<uintptr_t>(dst + begin) / 4 % 4);
  const int head_end = min(end, begin + (4 - misalign) % 4);
#pragma unroll 1
  for (int i = begin + tid; i < head_end; i += nthreads) dst[i] = v;
  const int body = (end - head_end) / 4;
  int4* vdst = reinterpret_cast<int4*>(dst + head_end);
  const int4 v4 = make_int4(v, v, v, v);
#pragma unroll 1
  for (int i = tid; i < body; i += nthreads) vdst[i] = v4;
#pragma unroll 1
  for (int i = head_end + body * 4 + tid; i < end; i += nthreads) dst[i] = v;
}

// C, by every thread of the block, each owning a contiguous run of experts: start[x] =
// the exclusive scan of the padded counts ceil(count_of(x) / bs) * bs over the experts;
// for each expert the owner then calls place(x, start[x]) (B). Returns the padded total
// to every thread. start[] is complete after the caller's next __syncthreads.
template <typename CountOf, typename Place>
__device__ __forceinline__ int scan_segments(int num_experts, int bs, int32_t* start,
                                             int32_t* warp_totals, CountOf&& count_of,
                                             Place&& place) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int per = (num_experts + nthreads - 1) / nthreads;
  const int x0 = min(num_experts, tid * per);
  const int x1 = min(num_experts, x0 + per);
  int local = 0;
  for (int x = x0; x < x1; ++x) {
    const int c = count_of(x);
    start[x] = c;  // the count, until the scan below gives the start
    local += (c + bs - 1) / bs * bs;
  }
  int total = 0;
  int run = device::block_exclusive_scan(local, warp_totals, &total);
  for (int x = x0; x < x1; ++x) {
    const int c = start[x];
    start[x] = run;
    place(x, run);
    run += (c + bs - 1) / bs * bs;
  }
  return total;
}

// out_expert_ids[b] for b in [b0, b1), by every thread of the block: the expert whose
// segment holds position b * bs, i.e. the last expert whose start is at most that (the
// experts before it with the same start are empty); -1 from the padded total on.
__device__ __forceinline__ void write_block_experts(int32_t* __restrict__ blocks, int b0, int b1,
                                                    const int32_t* start, int num_experts, int bs,
                                                    int total) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  for (int b = b0 + tid; b < b1; b += nthreads) {
    const int64_t pos = static_cast<int64_t>(b) * bs;
    int expert = -1;
    if (pos < total) {
      int lo = 0, hi = num_experts;  // start[lo] <= pos (start[0] = 0), start[hi] > pos
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (start[mid] <= pos) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      expert = lo;
    }
    blocks[b] = expert;
  }
}

// ---- Small N: one block ----

__global__ void __launch_bounds__(kSmallWarps* kLanes)
    align_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ sorted,
                 int32_t* __restrict__ blocks, int32_t* __restrict__ total_out,
                 const AlignParams p) {
  extern __shared__ int4 smem4[];
  __shared__ int32_t warp_totals[kMaxWarps];
  int32_t* smem = reinterpret_cast<int32_t*>(smem4);
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int warp = tid / kLanes;
  const int nwarps = nthreads / kLanes;
  const int E = p.num_experts;
  const int bs = p.block_size;
  const int n = static_cast<int>(p.slots);
  int32_t* hist = smem;                // [nwarps][E]
  int32_t* start = smem + nwarps * E;  // [E]
  int32_t* my_hist = hist + warp * E;

  // Pieces of whole 32-slot steps: a small N goes to the first warps, each step full.
  const int seg = ((n + nwarps - 1) / nwarps + kLanes - 1) / kLanes * kLanes;
  const int seg_begin = min(n, warp * seg);
  const int seg_end = min(n, seg_begin + seg);

  for (int i = tid; i < nwarps * E; i += nthreads) hist[i] = 0;
  __syncthreads();
  device::pdl_wait();  // before the first global access
  block_fill(sorted, 0, static_cast<int>(p.sorted_len), n);
  count_piece(ids, seg_begin, seg_end, E, my_hist);  // A
  __syncthreads();                  // the rows are complete; the fill is ordered before D's stores
  const int total = scan_segments(  // C and B
      E, bs, start, warp_totals,
      [&](int x) {
        int c = 0;
        for (int w = 0; w < nwarps; ++w) c += hist[w * E + x];
        return c;
      },
      [&](int x, int s) {
        for (int w = 0; w < nwarps; ++w) {
          const int c = hist[w * E + x];
          hist[w * E + x] = s;
          s += c;
        }
      });
  if (tid == 0) total_out[0] = total;
  __syncthreads();  // start[] and the warps' prefixes are complete
  device::pdl_launch_dependents();
  write_block_experts(blocks, 0, static_cast<int>(p.blocks_len), start, E, bs, total);
  scatter_piece(ids, seg_begin, seg_end, E, my_hist, sorted);  // D
}

// ---- Tiny N: one block, one slot a thread ----

// N <= 1024 and E <= 1024 (decode: T = 64, k = 8, E = 256), when the rows fit: one block
// of max(N, E) threads rounded up to whole warps; thread t owns slot t and expert t. The
// work is tiny, so the time is latency and a cold instruction cache: straight-line code
// (no unrolled loops), two block barriers, and every value kept in registers between
// the phases.
//   1. Each warp zeroes its own histogram row (no block barrier: only the warp writes it
//      before barrier 1), loads its 32 ids, starts the sentinel fill, groups its lanes by
//      expert (same_expert_lanes) and the group's lowest lane stores the group's size.
//   -- barrier 1: the rows are complete.
//   2. Thread x sums column x (expert x's count), pads it, and scans the padded counts
//      within its warp (the in-warp exclusive prefix to seg_in_warp[x], the warp's sum to
//      warp_totals); thread t sums column e = ids[t] over the warps before its own.
//   -- barrier 2: seg_in_warp[] and warp_totals[] are complete; the fill is ordered
//      before the slot stores.
//   3. Every warp scans warp_totals (one load a lane, then shuffles): expert x's segment
//      start is seg_in_warp[x] + the totals of the warps before x's. Thread x writes its
//      expert's entries of out_expert_ids, thread t its slot at start[e] + the earlier
//      warps' count of e + its rank among its warp's lanes with expert e.
constexpr int kTinyMaxThreads = 1024;

int tiny_threads(int64_t slots, int num_experts) {
  return static_cast<int>((std::max<int64_t>(slots, num_experts) + kLanes - 1) / kLanes * kLanes);
}

// Shared ints of the tiny kernel: the rows [warps][E] and seg_in_warp[E]; 0 when the
// shape is not one for it.
int tiny_smem_ints(int64_t slots, int num_experts) {
  if (slots > kTinyMaxThreads || num_experts > kTinyMaxThreads) return 0;
  const int ints = (tiny_threads(slots, num_experts) / kLanes + 1) * num_experts;
  return ints <= kSmemInts ? ints : 0;
}

__global__ void __launch_bounds__(kTinyMaxThreads)
    align_tiny_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ sorted,
                      int32_t* __restrict__ blocks, int32_t* __restrict__ total_out,
                      const AlignParams p) {
  extern __shared__ int4 smem4[];
  __shared__ int32_t warp_totals[kMaxWarps];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kLanes;
  const int warp = tid / kLanes;
  const int nwarps = static_cast<int>(blockDim.x) / kLanes;
  const int E = p.num_experts;
  const int bs = p.block_size;
  const int n = static_cast<int>(p.slots);
  int32_t* hist = reinterpret_cast<int32_t*>(smem4);  // [nwarps][E]
  int32_t* seg_in_warp = hist + nwarps * E;           // [E]
  int32_t* my_hist = hist + warp * E;

#pragma unroll 1
  for (int x = lane; x < E; x += kLanes) my_hist[x] = 0;
  __syncwarp();
  device::pdl_wait();  // before the first global access
  const int e = tid < n ? __ldg(ids + tid) : -1;
  block_fill(sorted, 0, static_cast<int>(p.sorted_len), n);
  const bool valid = e >= 0 && e < E;
  const unsigned same = same_expert_lanes(e, valid, expert_bits(E));
  if (valid && lane == __ffs(same) - 1) my_hist[e] = __popc(same);  // one group per expert
  __syncthreads();                                                  // 1: the rows are complete
  device::pdl_launch_dependents();

  int count = 0;  // expert tid's slots
  if (tid < E) {
#pragma unroll 4  // independent loads in flight: a load-add chain costs ~30 cycles a row
    for (int w = 0; w < nwarps; ++w) count += hist[w * E + tid];
  }
  const int padded = (count + bs - 1) / bs * bs;
  const int inclusive = device::warp_inclusive_scan(padded);
  if (tid < E) seg_in_warp[tid] = inclusive - padded;
  if (lane == kLanes - 1) warp_totals[warp] = inclusive;
  int rank = __popc(same & ((1u << lane) - 1u));  // slot tid's place among expert e's slots
  if (valid) {
#pragma unroll 4  // independent loads in flight: a load-add chain costs ~30 cycles a row
    for (int w = 0; w < warp; ++w) rank += hist[w * E + e];
  }
  __syncthreads();  // 2: seg_in_warp[] and warp_totals[]; the fill before the slot stores

  const int wt = lane < nwarps ? warp_totals[lane] : 0;
  const int wt_incl = device::warp_inclusive_scan(wt);
  const int total = __shfl_sync(kFullWarpMask, wt_incl, kLanes - 1);
  const int wt_before = wt_incl - wt;  // lane w: the totals of the warps before warp w
  const int my_start = __shfl_sync(kFullWarpMask, wt_before, warp) + seg_in_warp[min(tid, E - 1)];
  const int e_warp_start = __shfl_sync(kFullWarpMask, wt_before, valid ? e / kLanes : 0);
  if (tid == 0) total_out[0] = total;
  if (tid < E) {
#pragma unroll 1
    for (int b = my_start / bs; b < (my_start + padded) / bs; ++b) blocks[b] = tid;
  }
#pragma unroll 1
  for (int b = total / bs + tid; b < static_cast<int>(p.blocks_len); b += nwarps * kLanes) {
    blocks[b] = -1;
  }
  if (valid) sorted[e_warp_start + seg_in_warp[e] + rank] = tid;
}

// ---- Larger N: count, scatter ----

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

// The workspace row: E rounded up to whole 16-byte vectors.
int row_len(int num_experts) { return (num_experts + 3) / 4 * 4; }

// Shared ints of a scatter block of `warps` warps: the per-group partial sums (totals and
// earlier chunks), start[E] and the warps' rows.
__host__ __device__ __forceinline__ int scatter_groups(int threads, int row) {
  const int quads = row / 4;
  return threads / quads > 1 ? threads / quads : 1;
}
int scatter_smem_ints(int warps, int num_experts) {
  const int row = row_len(num_experts);
  return 2 * scatter_groups(warps * kLanes, row) * row + num_experts + warps * num_experts;
}

// This block's share [begin, end) of [0, len) cut in `parts` pieces of whole vectors.
__device__ __forceinline__ void share_of(int64_t len, int parts, int part, int& begin, int& end) {
  const int64_t per = ((len + parts - 1) / parts + 3) / 4 * 4;
  const int64_t b = part * per;
  begin = static_cast<int>(b < len ? b : len);
  end = static_cast<int>(b + per < len ? b + per : len);
}

// 1. The sentinel fill of this chunk's share of `sorted`; counts[chunk][e] = slots of
// expert e in the chunk (0 in the row's padding).
__global__ void __launch_bounds__(kChunkWarps* kLanes)
    align_count_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ counts,
                       int32_t* __restrict__ sorted, const AlignParams p, int chunk_size,
                       int num_chunks) {
  extern __shared__ int32_t row_hist[];  // [row]
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int E = p.num_experts;
  const int row = (E + 3) / 4 * 4;
  const int slots = static_cast<int>(p.slots);
  for (int x = tid; x < row; x += nthreads) row_hist[x] = 0;
  __syncthreads();
  device::pdl_wait();  // before the first global access
  const int chunk = static_cast<int>(blockIdx.x);
  int fill_begin = 0, fill_end = 0;
  share_of(p.sorted_len, num_chunks, chunk, fill_begin, fill_end);
  block_fill(sorted, fill_begin, fill_end, slots);
  const int begin = chunk * chunk_size;
  const int end = min(slots, begin + chunk_size);
  for (int i = begin + tid; i < end; i += nthreads) {
    const int e = __ldg(ids + i);
    if (e >= 0 && e < E) atomicAdd(&row_hist[e], 1);
  }
  device::pdl_launch_dependents();
  __syncthreads();
  int32_t* out = counts + static_cast<int64_t>(chunk) * row;
  for (int x = tid; x < row; x += nthreads) out[x] = row_hist[x];
}

// 2. One chunk's slots: A; the totals and earlier-chunk counts from every row; C and B
// from the chunk's place in the output; its share of out_expert_ids; D.
__global__ void __launch_bounds__(kChunkWarps* kLanes)
    align_scatter_kernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ counts,
                         int32_t* __restrict__ sorted, int32_t* __restrict__ blocks,
                         int32_t* __restrict__ total_out, const AlignParams p, int chunk_size,
                         int num_chunks) {
  extern __shared__ int4 smem4[];
  __shared__ int32_t warp_totals[kMaxWarps];
  int32_t* smem = reinterpret_cast<int32_t*>(smem4);
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int warp = tid / kLanes;
  const int nwarps = nthreads / kLanes;
  const int E = p.num_experts;
  const int bs = p.block_size;
  const int C = num_chunks;
  const int row = (E + 3) / 4 * 4;
  const int quads = row / 4;
  const int groups = scatter_groups(nthreads, row);
  int32_t* part_total = smem;                   // [groups][row], 16-byte aligned rows
  int32_t* part_before = smem + groups * row;   // [groups][row]
  int32_t* start = part_before + groups * row;  // [E]
  int32_t* hist = start + E;                    // [nwarps][E]
  int32_t* my_hist = hist + warp * E;

  const int slots = static_cast<int>(p.slots);
  const int chunk = static_cast<int>(blockIdx.x);
  const int begin = chunk * chunk_size;
  const int end = min(slots, begin + chunk_size);
  const int seg = ((end - begin + nwarps - 1) / nwarps + kLanes - 1) / kLanes * kLanes;
  const int seg_begin = min(end, begin + warp * seg);
  const int seg_end = min(end, seg_begin + seg);

  for (int i = tid; i < nwarps * E; i += nthreads) hist[i] = 0;
  __syncthreads();
  count_piece(ids, seg_begin, seg_end, E, my_hist);  // A: topk_ids only, before the wait
  device::pdl_wait();                                // the count kernel's rows and fill

  // Group g of threads sums rows g, g + groups, ...: per expert (4 a thread), the total
  // and the count in the chunks before this one. Independent 16-byte loads.
  {
    const int g = tid / quads;
    const int4* rows = reinterpret_cast<const int4*>(counts);
    for (int q = tid % quads; g < groups && q < quads; q += nthreads) {
      int4 total = make_int4(0, 0, 0, 0), before = make_int4(0, 0, 0, 0);
#pragma unroll 8
      for (int c = g; c < C; c += groups) {
        const int4 v = rows[static_cast<int64_t>(c) * quads + q];
        total.x += v.x;
        total.y += v.y;
        total.z += v.z;
        total.w += v.w;
        if (c < chunk) {
          before.x += v.x;
          before.y += v.y;
          before.z += v.z;
          before.w += v.w;
        }
      }
      reinterpret_cast<int4*>(part_total + g * row)[q] = total;
      reinterpret_cast<int4*>(part_before + g * row)[q] = before;
    }
  }
  device::pdl_launch_dependents();
  __syncthreads();                  // the partial sums and the rows are complete
  const int total = scan_segments(  // C and B
      E, bs, start, warp_totals,
      [&](int x) {
        int c = 0;
        for (int g = 0; g < groups; ++g) c += part_total[g * row + x];
        return c;
      },
      [&](int x, int s) {
        for (int g = 0; g < groups; ++g) s += part_before[g * row + x];
        for (int w = 0; w < nwarps; ++w) {
          const int c = hist[w * E + x];
          hist[w * E + x] = s;
          s += c;
        }
      });
  if (chunk == 0 && tid == 0) total_out[0] = total;
  __syncthreads();  // start[] and the warps' prefixes are complete
  int b0 = 0, b1 = 0;
  share_of(p.blocks_len, C, chunk, b0, b1);
  write_block_experts(blocks, b0, b1, start, E, bs, total);
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

  if (const int ints = tiny_smem_ints(p.slots, E); ints > 0) {
    return device::launch_status(
        ctx, op,
        device::launch(align_tiny_kernel, dim3(1), dim3(tiny_threads(p.slots, E)),
                       static_cast<size_t>(ints) * sizeof(int32_t), stream, ctx.pdl(), ids, sorted,
                       blocks, total, p));
  }
  if (chunks.count < kMinChunks) {
    // E <= 2048 leaves at least 4 warps.
    const int warps = std::min(kSmallWarps, kSmemInts / E - 1);
    const size_t smem = static_cast<size_t>(warps + 1) * E * sizeof(int32_t);
    return device::launch_status(ctx, op,
                                 device::launch(align_kernel, dim3(1), dim3(warps * kLanes), smem,
                                                stream, ctx.pdl(), ids, sorted, blocks, total, p));
  }

  // The rows as whole 16-byte vectors: 16 bytes more, and the pointer rounded up.
  const int row = row_len(E);
  const device::Workspace ws(ctx, static_cast<size_t>(row) * chunks.count * sizeof(int32_t) + 16,
                             topk_ids.device);
  if (!ws.ok()) return ws.fail(ctx);
  auto* counts = reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(ws.data()) + 15) &
                                            ~static_cast<uintptr_t>(15));
  int scatter_warps = kChunkWarps;  // E = 2048: 2
  while (scatter_warps > 1 && scatter_smem_ints(scatter_warps, E) > kSmemInts) --scatter_warps;
  const size_t scatter_smem =
      static_cast<size_t>(scatter_smem_ints(scatter_warps, E)) * sizeof(int32_t);
  if (cudaError_t err =
          device::launch(align_count_kernel, dim3(chunks.count), dim3(kChunkWarps * kLanes),
                         static_cast<size_t>(row) * sizeof(int32_t), stream, ctx.pdl(), ids, counts,
                         sorted, p, chunks.size, chunks.count);
      err != cudaSuccess) {
    return device::launch_status(ctx, op, err);
  }
  return device::launch_status(  // ws is freed after the scatter, in stream order
      ctx, op,
      device::launch(align_scatter_kernel, dim3(chunks.count), dim3(scatter_warps * kLanes),
                     scatter_smem, stream, ctx.pdl(), ids, static_cast<const int32_t*>(counts),
                     sorted, blocks, total, p, chunks.size, chunks.count));
}

}  // namespace kreg::moe
