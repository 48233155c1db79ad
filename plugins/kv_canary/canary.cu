// CUDA kernels of the kv_canary group.
//
// stamp: one thread per plan row computes the hash chain. A row that continues the row
// before it (its prev_slot is that row's slot) is left to the thread of its run's first
// row, which walks the run in order: decode batches (runs of one) are fully parallel, a
// prefill chunk of L tokens costs one thread L dependent mixes. Data hashes are computed by
// a second kernel, a group of lanes per row.
//
// verify: a group of G lanes per plan row (G = 1 without data hashing; with it, the
// smallest power of two covering the row's 16-byte chunks, at most 32). The lanes sum the
// row's word hashes, reduce them with shuffles, and the group's first lane checks the
// record and appends a violation: atomicAdd on the counter gives the row's index in the
// ring buffer, and only indices below its capacity are written. The order of violations
// is therefore unspecified; the set is the CPU reference's.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "canary_hash.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/warp.cuh"
#include "kv_canary.hpp"

namespace kreg::kv_canary {
namespace {

constexpr int kBlockThreads = 256;

struct PlanRow {
  int64_t slot, token, position, prev_slot;
};

__device__ __forceinline__ PlanRow load_plan(const int64_t* plan, int64_t i) {
  const int64_t* p = plan + 4 * i;
  return {__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3)};
}

__device__ __forceinline__ bool in_range(const PlanRow& r, int64_t num_slots) {
  return r.slot >= 0 && r.slot < num_slots && r.prev_slot >= -1 && r.prev_slot < num_slots;
}

// Sum of the word hashes of this lane's share of a row; kPair: 16-byte loads.
template <bool kPair>
__device__ __forceinline__ uint64_t row_hash_part(const char* row, int64_t row_bytes, int lane,
                                                  int lanes) {
  uint64_t sum = 0;
  if constexpr (kPair) {
    const auto* p = reinterpret_cast<const ulonglong2*>(row);
    const int64_t chunks = row_bytes / 16;
    for (int64_t c = lane; c < chunks; c += lanes) {
      const ulonglong2 w = __ldcs(p + c);
      sum += word_hash(w.x, static_cast<uint64_t>(2 * c)) +
             word_hash(w.y, static_cast<uint64_t>(2 * c + 1));
    }
  } else {
    const auto* p = reinterpret_cast<const unsigned long long*>(row);
    const int64_t words = row_bytes / 8;
    for (int64_t c = lane; c < words; c += lanes) {
      sum += word_hash(__ldcs(p + c), static_cast<uint64_t>(c));
    }
  }
  return sum;
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

__global__ void __launch_bounds__(kBlockThreads)
    stamp_chain_kernel(int64_t* __restrict__ rec, const int64_t* __restrict__ plan, int64_t n,
                       int64_t num_slots, bool zero_data) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (i >= n) return;
  PlanRow r = load_plan(plan, i);
  if (i > 0) {
    const PlanRow before = load_plan(plan, i - 1);
    if (in_range(before, num_slots) && r.prev_slot == before.slot) return;  // not a run start
  }
  if (!in_range(r, num_slots)) return;
  uint64_t prev =
      r.prev_slot == -1 ? kChainSeed : static_cast<uint64_t>(rec[4 * r.prev_slot + kChain]);
  for (int64_t j = i;;) {
    const uint64_t chain = chain_mix(prev, r.token, r.position);
    int64_t* out = rec + 4 * r.slot;
    out[kToken] = r.token;
    out[kPosition] = r.position;
    out[kChain] = static_cast<int64_t>(chain);
    if (zero_data) out[kData] = 0;
    prev = chain;
    if (++j >= n) break;
    const PlanRow next = load_plan(plan, j);
    if (next.prev_slot != r.slot) break;  // next row starts its own run
    r = next;
    if (!in_range(r, num_slots)) break;  // skipped; the row after it starts a run
  }
}

template <bool kPair>
__global__ void __launch_bounds__(kBlockThreads)
    stamp_data_kernel(int64_t* __restrict__ rec, const int64_t* __restrict__ plan,
                      const char* __restrict__ kv, int64_t n, int64_t num_slots, int64_t row_bytes,
                      int log2_lanes) {
  const RowGroup g = row_group(log2_lanes);
  PlanRow r{-1, 0, 0, 0};
  if (g.row < n) r = load_plan(plan, g.row);
  const bool live = g.row < n && in_range(r, num_slots);
  uint64_t sum =
      live ? row_hash_part<kPair>(kv + r.slot * row_bytes, row_bytes, g.lane, g.lanes) : 0;
  sum = device::warp_sum(sum, g.lanes);  // every lane of the warp calls it
  if (live && g.lane == 0) {
    rec[4 * r.slot + kData] =
        static_cast<int64_t>(finish_data_hash(sum, static_cast<uint64_t>(row_bytes)));
  }
}

__device__ __forceinline__ void append(int64_t* violations, int64_t* count, int64_t cap,
                                       int64_t slot, int64_t reason, int64_t expected,
                                       int64_t found) {
  const auto at =
      static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(count), 1ull));
  if (at < 0 || at >= cap) return;  // counted, not stored
  int64_t* row = violations + 4 * at;
  row[0] = slot;
  row[1] = reason;
  row[2] = expected;
  row[3] = found;
}

template <bool kHash, bool kPair>
__global__ void __launch_bounds__(kBlockThreads)
    verify_kernel(const int64_t* __restrict__ rec, const int64_t* __restrict__ plan,
                  const char* __restrict__ kv, int64_t* __restrict__ violations,
                  int64_t* __restrict__ count, int64_t n, int64_t num_slots, int64_t cap,
                  int64_t row_bytes, int log2_lanes) {
  const RowGroup g = row_group(log2_lanes);
  PlanRow r{-1, 0, 0, 0};
  if (g.row < n) r = load_plan(plan, g.row);
  const bool ok = g.row < n && in_range(r, num_slots);
  uint64_t data = 0;
  if constexpr (kHash) {
    uint64_t sum =
        ok ? row_hash_part<kPair>(kv + r.slot * row_bytes, row_bytes, g.lane, g.lanes) : 0;
    sum = device::warp_sum(sum, g.lanes);  // every lane of the warp calls it
    data = finish_data_hash(sum, static_cast<uint64_t>(row_bytes));
  }
  if (g.row >= n || g.lane != 0) return;
  if (!ok) {
    const bool slot_ok = r.slot >= 0 && r.slot < num_slots;
    append(violations, count, cap, r.slot, kReasonRange, num_slots, slot_ok ? r.prev_slot : r.slot);
    return;
  }
  const int64_t* got = rec + 4 * r.slot;
  const int64_t t = got[kToken], p = got[kPosition], c = got[kChain];
  const uint64_t prev =
      r.prev_slot == -1 ? kChainSeed : static_cast<uint64_t>(__ldg(rec + 4 * r.prev_slot + kChain));
  const auto chain = static_cast<int64_t>(chain_mix(prev, r.token, r.position));
  int64_t reason = 0;
  if (t != r.token) reason |= kReasonToken;
  if (p != r.position) reason |= kReasonPosition;
  if (c != chain) reason |= kReasonChain;
  int64_t d = 0;
  if constexpr (kHash) {
    d = got[kData];
    if (d != static_cast<int64_t>(data)) reason |= kReasonData;
  }
  if (reason == 0) return;
  if (reason & kReasonToken) {
    append(violations, count, cap, r.slot, reason, r.token, t);
  } else if (reason & kReasonPosition) {
    append(violations, count, cap, r.slot, reason, r.position, p);
  } else if (reason & kReasonChain) {
    append(violations, count, cap, r.slot, reason, chain, c);
  } else {
    append(violations, count, cap, r.slot, reason, static_cast<int64_t>(data), d);
  }
}

// ---- Host side ----

int log2_lanes_for(int64_t chunks) {
  const auto lanes = std::bit_ceil(static_cast<uint64_t>(std::clamp<int64_t>(chunks, 1, 32)));
  return std::countr_zero(lanes);
}

unsigned grid_for(int64_t rows, int log2_lanes) {
  const int64_t per_block = kBlockThreads >> log2_lanes;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

bool pairs_ok(const char* kv, int64_t row_bytes) {
  return row_bytes % 16 == 0 && device::aligned16(kv);
}

}  // namespace

KernelStatus stamp_cuda(Context& ctx, DLTensor& canary, const DLTensor& plan, const DLTensor* kv) {
  const char* const kOp = ctx.op();
  const int64_t num_slots = canary.shape[0], n = plan.shape[0];
  int64_t row_bytes = 0;
  if (KernelStatus st = check_kv(ctx, kOp, kv, num_slots, &row_bytes); !st.ok()) return st;
  const bool hash_data = kv != nullptr;
  if (n == 0) return kOk;
  if (n > (int64_t{1} << 40)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: plan of %lld rows is too long", kOp,
                    static_cast<long long>(n));
  }
  const device::DeviceGuard guard(canary);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  auto* rec = data_ptr<int64_t>(canary);
  const auto* p = data_ptr<const int64_t>(plan);
  stamp_chain_kernel<<<grid_for(n, 0), kBlockThreads, 0, stream>>>(rec, p, n, num_slots,
                                                                   !hash_data);
  if (hash_data) {
    const char* data = data_ptr<const char>(*kv);
    if (pairs_ok(data, row_bytes)) {
      const int lg = log2_lanes_for(row_bytes / 16);
      stamp_data_kernel<true><<<grid_for(n, lg), kBlockThreads, 0, stream>>>(
          rec, p, data, n, num_slots, row_bytes, lg);
    } else {
      const int lg = log2_lanes_for(row_bytes / 8);
      stamp_data_kernel<false><<<grid_for(n, lg), kBlockThreads, 0, stream>>>(
          rec, p, data, n, num_slots, row_bytes, lg);
    }
  }
  return device::launch_status(ctx, kOp);
}

KernelStatus verify_cuda(Context& ctx, const DLTensor& canary, const DLTensor& plan,
                         DLTensor& violations, DLTensor& count, const DLTensor* kv) {
  const char* const kOp = ctx.op();
  const int64_t num_slots = canary.shape[0], n = plan.shape[0], cap = violations.shape[0];
  int64_t row_bytes = 0;
  if (KernelStatus st = check_kv(ctx, kOp, kv, num_slots, &row_bytes); !st.ok()) return st;
  const bool hash_data = kv != nullptr;
  if (n == 0) return kOk;
  if (n > (int64_t{1} << 40)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: plan of %lld rows is too long", kOp,
                    static_cast<long long>(n));
  }
  const device::DeviceGuard guard(canary);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const auto* rec = data_ptr<const int64_t>(canary);
  const auto* p = data_ptr<const int64_t>(plan);
  const char* data = hash_data ? data_ptr<const char>(*kv) : nullptr;
  auto* out = data_ptr<int64_t>(violations);
  auto* total = data_ptr<int64_t>(count);
  if (!hash_data) {
    verify_kernel<false, false><<<grid_for(n, 0), kBlockThreads, 0, stream>>>(
        rec, p, data, out, total, n, num_slots, cap, 0, 0);
  } else if (pairs_ok(data, row_bytes)) {
    const int lg = log2_lanes_for(row_bytes / 16);
    verify_kernel<true, true><<<grid_for(n, lg), kBlockThreads, 0, stream>>>(
        rec, p, data, out, total, n, num_slots, cap, row_bytes, lg);
  } else {
    const int lg = log2_lanes_for(row_bytes / 8);
    verify_kernel<true, false><<<grid_for(n, lg), kBlockThreads, 0, stream>>>(
        rec, p, data, out, total, n, num_slots, cap, row_bytes, lg);
  }
  return device::launch_status(ctx, kOp);
}

}  // namespace kreg::kv_canary
