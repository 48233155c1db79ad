// CPU references of the embeddings group, and the argument checks both backends share.
// A gather moves bytes without looking at them, so the result is bit-exact (NaNs, -0.0
// and subnormals included) and the CUDA kernels must equal it byte for byte.
#include <cstdint>
#include <cstring>

#include "embeddings.hpp"

namespace kreg::embeddings {

KernelStatus gather_plan(Context& ctx, const DLTensor& ids, const DLTensor& table, int64_t start,
                         GatherPlan& plan) {
  const int64_t rows = table.shape[0];
  if (start < 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: argument 'vocab_start' = %lld must be >= 0",
                    ctx.op(), static_cast<long long>(start));
  }
  if (start > INT64_MAX - rows) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'vocab_start' = %lld plus the shard's %lld rows overflows int64",
                    ctx.op(), static_cast<long long>(start), static_cast<long long>(rows));
  }
  // The core has checked the dtype against bf16|f16|f32 and that the shape's bytes fit
  // in int64.
  const int64_t elem_bytes = table.dtype.bits / 8;
  plan.tokens = ids.shape[0];
  plan.rows = rows;
  plan.row_bytes = table.shape[1] * elem_bytes;
  plan.start = start;
  return kOk;
}

namespace {

// Copies row ids[t] - start of the table into out[t] (zeros where the id is outside
// [start, start + rows)); returns how many ids were outside.
template <typename I>
int64_t gather_rows(const I* ids, const char* table, char* out, const GatherPlan& p) {
  int64_t outside = 0;
  const auto row = static_cast<size_t>(p.row_bytes);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const auto id = static_cast<int64_t>(ids[t]);
    // id >= start >= 0 first, so id - start cannot overflow.
    char* dst = out + t * p.row_bytes;
    if (id >= p.start && id - p.start < p.rows) {
      if (row > 0) std::memcpy(dst, table + (id - p.start) * p.row_bytes, row);
    } else {
      if (row > 0) std::memset(dst, 0, row);
      ++outside;
    }
  }
  return outside;
}

KernelStatus gather(Context& ctx, const DLTensor& ids, const DLTensor& table, DLTensor& out,
                    int64_t start, DLTensor* invalid) {
  GatherPlan plan;
  if (KernelStatus st = gather_plan(ctx, ids, table, start, plan); !st.ok()) return st;
  const char* tp = data_ptr<const char>(table);
  char* op = data_ptr<char>(out);
  const int64_t outside = ids.dtype.bits == 64
                              ? gather_rows(data_ptr<const int64_t>(ids), tp, op, plan)
                              : gather_rows(data_ptr<const int32_t>(ids), tp, op, plan);
  if (invalid != nullptr) {
    // The counter accumulates, wrapping at 2^32 like the device's atomicAdd (unsigned
    // arithmetic: no signed overflow).
    auto* c = data_ptr<int32_t>(*invalid);
    *c = static_cast<int32_t>(static_cast<uint32_t>(*c) + static_cast<uint32_t>(outside));
  }
  return kOk;
}

}  // namespace

KernelStatus lookup_cpu(Context& ctx, const DLTensor& ids, const DLTensor& table, DLTensor& out,
                        DLTensor* invalid) {
  return gather(ctx, ids, table, out, 0, invalid);
}

KernelStatus vocab_parallel_lookup_cpu(Context& ctx, const DLTensor& ids,
                                       const DLTensor& table_shard, DLTensor& out,
                                       int64_t vocab_start) {
  return gather(ctx, ids, table_shard, out, vocab_start, nullptr);
}

}  // namespace kreg::embeddings
