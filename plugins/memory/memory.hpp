// The memory group: copies whose row range lives on the device, so that a host never
// waits for the GPU to learn how much to copy. docs/ops/memory.md states the contracts.
//
// Every function trusts what the core checked (device, contiguity, the dtype sets); the
// shapes the signature cannot express are checked by copy_rows_plan() below.
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

// Host-and-device functions below: shared by the CPU reference and the CUDA kernels.
#if defined(__CUDACC__)
#define KREG_MEMORY_HOST_DEVICE __host__ __device__
#else
#define KREG_MEMORY_HOST_DEVICE
#endif

namespace kreg::memory {

// The fixed geometry of one copy_rows call; the range itself is read at run time.
struct RowCopyPlan {
  int64_t src_rows = 0;
  int64_t dst_rows = 0;
  int64_t row_bytes = 0;  // bytes of one row (trailing dimensions times the element size)
};

// Checks that src and dst have the same rank (>= 1) and trailing shape; fills `plan`.
KernelStatus copy_rows_plan(Context& ctx, const DLTensor& src, const DLTensor& dst,
                            RowCopyPlan& plan);

// The rows copy_rows moves, from the offset and count values: a negative offset or count
// copies nothing; otherwise count is clamped so that both row ranges lie inside their
// tensors. Returns the first source row, the first destination row and the row count.
struct RowRange {
  int64_t src_row = 0;
  int64_t dst_row = 0;
  int64_t rows = 0;
};
KREG_MEMORY_HOST_DEVICE inline RowRange clamp_row_range(int64_t offset, int64_t count,
                                                        bool offset_on_src, int64_t src_rows,
                                                        int64_t dst_rows) {
  RowRange r;
  if (offset < 0 || count <= 0) return r;
  // Room after the offset in the offset tensor, all of the other one: no sums that
  // could overflow for hostile values.
  const int64_t offset_rows = offset_on_src ? src_rows : dst_rows;
  const int64_t other_rows = offset_on_src ? dst_rows : src_rows;
  if (offset >= offset_rows) return r;
  int64_t n = count;
  if (n > offset_rows - offset) n = offset_rows - offset;
  if (n > other_rows) n = other_rows;
  r.rows = n;
  r.src_row = offset_on_src ? offset : 0;
  r.dst_row = offset_on_src ? 0 : offset;
  return r;
}

// CPU reference (reference.cpp).
KernelStatus copy_rows_cpu(Context& ctx, const DLTensor& src, DLTensor& dst, const DLTensor& offset,
                           const DLTensor& count, bool offset_on_src);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernel (copy_rows.cu): enqueues on ctx.stream(), no host synchronisation.
KernelStatus copy_rows_cuda(Context& ctx, const DLTensor& src, DLTensor& dst,
                            const DLTensor& offset, const DLTensor& count, bool offset_on_src);
#endif

}  // namespace kreg::memory
