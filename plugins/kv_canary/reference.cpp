// CPU references of the kv_canary group: the plain loops that define what the CUDA
// kernels must compute.
#include <cstdint>
#include <cstring>

#include "canary_hash.hpp"
#include "kv_canary.hpp"

namespace kreg::kv_canary {
namespace {

struct PlanRow {
  int64_t slot, token, position, prev_slot;
};

PlanRow plan_row(const DLTensor& plan, int64_t i) {
  const int64_t* p = data_ptr<const int64_t>(plan) + 4 * i;
  return {p[0], p[1], p[2], p[3]};
}

bool in_range(const PlanRow& r, int64_t num_slots) {
  return r.slot >= 0 && r.slot < num_slots && r.prev_slot >= -1 && r.prev_slot < num_slots;
}

uint64_t data_hash(const DLTensor& kv, int64_t slot, int64_t row_bytes) {
  const char* row = data_ptr<const char>(kv) + slot * row_bytes;
  uint64_t sum = 0;
  for (int64_t i = 0; i < row_bytes / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, row + 8 * i, 8);
    sum += word_hash(w, static_cast<uint64_t>(i));
  }
  return finish_data_hash(sum, static_cast<uint64_t>(row_bytes));
}

}  // namespace

KernelStatus stamp_cpu(Context& ctx, DLTensor& canary, const DLTensor& plan, const DLTensor* kv) {
  const int64_t num_slots = canary.shape[0], n = plan.shape[0];
  int64_t row_bytes = 0;
  if (KernelStatus st = check_kv(ctx, ctx.op(), kv, num_slots, &row_bytes); !st.ok()) {
    return st;
  }
  const bool hash_data = kv != nullptr;
  auto* rec = data_ptr<int64_t>(canary);
  uint64_t last_chain = 0;
  for (int64_t i = 0; i < n; ++i) {
    const PlanRow r = plan_row(plan, i);
    // A row continues the previous one when it names that row's slot as its prev_slot:
    // it chains to the hash computed just before, not to the record stored earlier.
    const bool continues = i > 0 && in_range(plan_row(plan, i - 1), num_slots) &&
                           r.prev_slot == plan_row(plan, i - 1).slot;
    if (!in_range(r, num_slots)) continue;  // out-of-range rows are not stamped
    const uint64_t prev = continues ? last_chain
                          : r.prev_slot == -1
                              ? kChainSeed
                              : static_cast<uint64_t>(rec[4 * r.prev_slot + kChain]);
    last_chain = chain_mix(prev, r.token, r.position);
    int64_t* out = rec + 4 * r.slot;
    out[kToken] = r.token;
    out[kPosition] = r.position;
    out[kChain] = static_cast<int64_t>(last_chain);
    out[kData] = hash_data ? static_cast<int64_t>(data_hash(*kv, r.slot, row_bytes)) : 0;
  }
  return kOk;
}

KernelStatus verify_cpu(Context& ctx, const DLTensor& canary, const DLTensor& plan,
                        DLTensor& violations, DLTensor& count, const DLTensor* kv) {
  const int64_t num_slots = canary.shape[0], n = plan.shape[0], cap = violations.shape[0];
  int64_t row_bytes = 0;
  if (KernelStatus st = check_kv(ctx, ctx.op(), kv, num_slots, &row_bytes); !st.ok()) {
    return st;
  }
  const bool hash_data = kv != nullptr;
  const auto* rec = data_ptr<const int64_t>(canary);
  auto* out = data_ptr<int64_t>(violations);
  int64_t& total = *data_ptr<int64_t>(count);
  auto report = [&](int64_t slot, int64_t reason, int64_t expected, int64_t found) {
    const int64_t at = total++;
    if (at < 0 || at >= cap) return;  // counted, not stored
    int64_t* row = out + 4 * at;
    row[0] = slot;
    row[1] = reason;
    row[2] = expected;
    row[3] = found;
  };
  for (int64_t i = 0; i < n; ++i) {
    const PlanRow r = plan_row(plan, i);
    if (!in_range(r, num_slots)) {
      const bool slot_ok = r.slot >= 0 && r.slot < num_slots;
      report(r.slot, kReasonRange, num_slots, slot_ok ? r.prev_slot : r.slot);
      continue;
    }
    const int64_t* got = rec + 4 * r.slot;
    const uint64_t prev =
        r.prev_slot == -1 ? kChainSeed : static_cast<uint64_t>(rec[4 * r.prev_slot + kChain]);
    const auto chain = static_cast<int64_t>(chain_mix(prev, r.token, r.position));
    const int64_t data = hash_data ? static_cast<int64_t>(data_hash(*kv, r.slot, row_bytes)) : 0;
    int64_t reason = 0;
    if (got[kToken] != r.token) reason |= kReasonToken;
    if (got[kPosition] != r.position) reason |= kReasonPosition;
    if (got[kChain] != chain) reason |= kReasonChain;
    if (hash_data && got[kData] != data) reason |= kReasonData;
    if (reason == 0) continue;
    // expected / found: the values of the lowest reason bit.
    if (reason & kReasonToken) {
      report(r.slot, reason, r.token, got[kToken]);
    } else if (reason & kReasonPosition) {
      report(r.slot, reason, r.position, got[kPosition]);
    } else if (reason & kReasonChain) {
      report(r.slot, reason, chain, got[kChain]);
    } else {
      report(r.slot, reason, data, got[kData]);
    }
  }
  return kOk;
}

}  // namespace kreg::kv_canary
