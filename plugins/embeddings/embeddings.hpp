// The embeddings group: row gathers from an embedding table, out[t] = table[ids[t]], with
// out-of-range ids writing zero rows (lookup, which can count them on the device) and the
// tensor-parallel form that reads one rank's shard of the vocabulary
// (vocab_parallel_lookup). docs/ops/embeddings.md states the exact contracts.
//
// Every function trusts its frame: the core has checked dtypes (ids i32 or i64; table and
// out share one of bf16/f16/f32; invalid i32), ranks, the named dimensions, device and
// contiguity against the signatures in register.cpp. What a signature cannot express
// (vocab_start's range) is checked by gather_plan() below, identically for both backends.
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::embeddings {

// The geometry of one gather: out[t] = rows[ids[t] - start] for ids in
// [start, start + rows), a zero row otherwise.
struct GatherPlan {
  int64_t tokens = 0;     // T
  int64_t rows = 0;       // table rows (V, or the shard's Vs)
  int64_t row_bytes = 0;  // H * element size
  int64_t start = 0;      // the first id the table holds (0 for lookup)
};

// Fills `plan` from the frame; refuses start < 0 and start + rows past int64, naming the
// op and vocab_start.
KernelStatus gather_plan(Context& ctx, const DLTensor& ids, const DLTensor& table, int64_t start,
                         GatherPlan& plan);

// CPU references (reference.cpp).
KernelStatus lookup_cpu(Context& ctx, const DLTensor& ids, const DLTensor& table, DLTensor& out,
                        DLTensor* invalid);
KernelStatus vocab_parallel_lookup_cpu(Context& ctx, const DLTensor& ids,
                                       const DLTensor& table_shard, DLTensor& out,
                                       int64_t vocab_start);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (lookup.cu). They enqueue on ctx.stream() and return without waiting; the
// invalid counter is updated on the device (atomicAdd), never read by the host.
KernelStatus lookup_cuda(Context& ctx, const DLTensor& ids, const DLTensor& table, DLTensor& out,
                         DLTensor* invalid);
KernelStatus vocab_parallel_lookup_cuda(Context& ctx, const DLTensor& ids,
                                        const DLTensor& table_shard, DLTensor& out,
                                        int64_t vocab_start);
#endif

}  // namespace kreg::embeddings
