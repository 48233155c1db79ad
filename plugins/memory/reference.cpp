// CPU reference of the memory group, and the shape checks both backends share.
#include <cstring>

#include "memory.hpp"

namespace kreg::memory {

KernelStatus copy_rows_plan(Context& ctx, const DLTensor& src, const DLTensor& dst,
                            RowCopyPlan& plan) {
  if (src.ndim < 1) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: argument 'src' must have rank >= 1 (rows first)",
                    ctx.op());
  }
  if (dst.ndim != src.ndim) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'dst' has rank %d, expected %d (the rank of src)", ctx.op(),
                    dst.ndim, src.ndim);
  }
  int64_t row_elems = 1;
  for (int d = 1; d < src.ndim; ++d) {
    if (dst.shape[d] != src.shape[d]) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: argument 'dst' has size %lld in dimension %d, expected "
                      "%lld (src's; the trailing shapes must agree)",
                      ctx.op(), static_cast<long long>(dst.shape[d]), d,
                      static_cast<long long>(src.shape[d]));
    }
    row_elems *= src.shape[d];
  }
  // The core has checked the dtype against the signature's set: one lane of 8 to 64 bits.
  const int64_t elem_bytes = (static_cast<int64_t>(src.dtype.bits) * src.dtype.lanes + 7) / 8;
  plan.src_rows = src.shape[0];
  plan.dst_rows = dst.shape[0];
  plan.row_bytes = row_elems * elem_bytes;
  return kOk;
}

namespace {

int64_t read_index(const DLTensor& t) {
  return t.dtype.bits == 64 ? *data_ptr<const int64_t>(t) : *data_ptr<const int32_t>(t);
}

}  // namespace

KernelStatus copy_rows_cpu(Context& ctx, const DLTensor& src, DLTensor& dst, const DLTensor& offset,
                           const DLTensor& count, bool offset_on_src) {
  RowCopyPlan plan;
  if (KernelStatus st = copy_rows_plan(ctx, src, dst, plan); !st.ok()) return st;
  const RowRange r = clamp_row_range(read_index(offset), read_index(count), offset_on_src,
                                     plan.src_rows, plan.dst_rows);
  if (r.rows == 0 || plan.row_bytes == 0) return kOk;
  // memmove: a caller passing overlapping views gets a defined result here, though the
  // CUDA kernel does not promise one.
  std::memmove(data_ptr<char>(dst) + r.dst_row * plan.row_bytes,
               data_ptr<const char>(src) + r.src_row * plan.row_bytes,
               static_cast<size_t>(r.rows * plan.row_bytes));
  return kOk;
}

}  // namespace kreg::memory
