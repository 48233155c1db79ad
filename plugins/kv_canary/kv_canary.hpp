// The kv_canary group: run-time detection of KV-cache corruption. Every KV slot owns a
// canary record {token, position, chain_hash, data_hash}; the records of one request
// form a hash chain (canary_hash.hpp). kv_canary.stamp writes the records of newly
// written slots, kv_canary.verify checks a plan against them and appends violations to a
// ring buffer. docs/ops/kv_canary.md states the exact contract.
//
// Every function trusts its frame: the core has checked dtypes (plans, records and
// violations i64), ranks, the named dimensions, device and contiguity. `kv` is optional
// (null: records only, no data hashes); what a signature cannot express about it (its
// first dimension and row size) is checked by check_kv below, identically on both
// backends.
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::kv_canary {

// kv, when given: [num_slots, ...] of any dtype, read as rows of bytes; a row is a
// positive multiple of 8 bytes and the data pointer 8-byte aligned. Sets *row_bytes (0
// when kv is omitted: no data hashing).
inline KernelStatus check_kv(Context& ctx, const char* op, const DLTensor* kv_or_null,
                             int64_t num_slots, int64_t* row_bytes) {
  *row_bytes = 0;
  if (kv_or_null == nullptr) return kOk;
  const DLTensor& kv = *kv_or_null;
  if (kv.ndim < 1 || kv.shape[0] != num_slots) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'kv' must be [num_slots = %lld, ...] (canary's first "
                    "dimension), got rank %d with first dimension %lld",
                    op, static_cast<long long>(num_slots), kv.ndim,
                    static_cast<long long>(kv.ndim >= 1 ? kv.shape[0] : -1));
  }
  int64_t bytes = (kv.dtype.bits * kv.dtype.lanes + 7) / 8;
  for (int i = 1; i < kv.ndim; ++i) bytes *= kv.shape[i];
  if (bytes <= 0 || bytes % 8 != 0 || bytes > (int64_t{1} << 30)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'kv' has rows of %lld bytes; data hashing needs a positive "
                    "multiple of 8 bytes (at most 1 GiB)",
                    op, static_cast<long long>(bytes));
  }
  if (reinterpret_cast<uintptr_t>(data_ptr<const char>(kv)) % 8 != 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'kv' data (data + byte_offset) is not 8-byte aligned", op);
  }
  *row_bytes = bytes;
  return kOk;
}

// CPU references (reference.cpp).
KernelStatus stamp_cpu(Context& ctx, DLTensor& canary, const DLTensor& plan, const DLTensor* kv);
KernelStatus verify_cpu(Context& ctx, const DLTensor& canary, const DLTensor& plan,
                        DLTensor& violations, DLTensor& count, const DLTensor* kv);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (canary.cu). They enqueue on ctx.stream() and return without waiting.
KernelStatus stamp_cuda(Context& ctx, DLTensor& canary, const DLTensor& plan, const DLTensor* kv);
KernelStatus verify_cuda(Context& ctx, const DLTensor& canary, const DLTensor& plan,
                         DLTensor& violations, DLTensor& count, const DLTensor* kv);
#endif

}  // namespace kreg::kv_canary
