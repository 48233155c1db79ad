// CPU references of the kvcache group: the plain loops that define what the CUDA kernels
// must do. Rows are moved as bytes; the only arithmetic is the fp8 cache's
// x / scale (one fp32 division) rounded to E4M3. The transfers run on host memory (plain
// or page-locked) and take the rows in index order, so with duplicate destination
// indices the last row wins.
#include <cstdint>
#include <cstring>

#include "kreg/device/fp8_e4m3.hpp"
#include "kreg/numeric.hpp"
#include "kvcache.hpp"

namespace kreg::kvcache {
namespace {

// Row indices come as i32 or i64; the core has checked which.
int64_t index_at(const DLTensor& idx, int64_t i) {
  return dtype_of(idx) == DType::kI32 ? data_ptr<const int32_t>(idx)[i]
                                      : data_ptr<const int64_t>(idx)[i];
}

template <typename T>
void quantize_row(const T* src, uint8_t* dst, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = device::float_to_e4m3(load_as_float(src[i]) / scale);
}

void quantize_row(DType dt, const void* src, uint8_t* dst, int64_t n, float scale) {
  switch (dt) {
    case DType::kBF16:
      return quantize_row(static_cast<const bf16*>(src), dst, n, scale);
    case DType::kF16:
      return quantize_row(static_cast<const f16*>(src), dst, n, scale);
    default:
      return quantize_row(static_cast<const float*>(src), dst, n, scale);
  }
}

}  // namespace

KernelStatus store_cpu(Context& ctx, const DLTensor& k, const DLTensor& v,
                       const DLTensor& slot_mapping, DLTensor& k_cache, DLTensor& v_cache,
                       double k_scale, double v_scale) {
  const char* const kOp = ctx.op();
  if (KernelStatus st = check_store(ctx, kOp, k, k_cache, v_cache, k_scale, v_scale); !st.ok()) {
    return st;
  }
  const int64_t tokens = k.shape[0];
  const int64_t row_elems = k.shape[1] * k.shape[2];
  const int64_t num_slots = k_cache.shape[0] * k_cache.shape[1];
  const bool fp8 = dtype_of(k_cache) == DType::kF8E4M3;
  const auto in_size = elem_bytes(k);
  const int64_t in_row = row_elems * in_size;
  const int64_t cache_row = fp8 ? row_elems : in_row;
  const auto* ks = data_ptr<const uint8_t>(k);
  const auto* vs = data_ptr<const uint8_t>(v);
  auto* kc = data_ptr<uint8_t>(k_cache);
  auto* vc = data_ptr<uint8_t>(v_cache);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = index_at(slot_mapping, t);
    if (slot < 0 || slot >= num_slots) continue;  // -1 pads; out of range is skipped too
    if (fp8) {
      quantize_row(dtype_of(k), ks + t * in_row, kc + slot * cache_row, row_elems,
                   static_cast<float>(k_scale));
      quantize_row(dtype_of(v), vs + t * in_row, vc + slot * cache_row, row_elems,
                   static_cast<float>(v_scale));
    } else {
      std::memcpy(kc + slot * cache_row, ks + t * in_row, static_cast<size_t>(in_row));
      std::memcpy(vc + slot * cache_row, vs + t * in_row, static_cast<size_t>(in_row));
    }
  }
  return kOk;
}

KernelStatus set_mla_kv_buffer_cpu(Context& ctx, DLTensor& kv_buffer, const DLTensor& loc,
                                   const DLTensor& k_nope, const DLTensor& k_rope) {
  if (KernelStatus st = check_mla(ctx, ctx.op(), kv_buffer, k_nope, k_rope); !st.ok()) {
    return st;
  }
  const int64_t n = loc.shape[0];
  const int64_t rows = kv_buffer.shape[0];
  const auto e = elem_bytes(kv_buffer);
  const int64_t nope = k_nope.shape[1] * e, rope = k_rope.shape[1] * e;
  const auto* np = data_ptr<const uint8_t>(k_nope);
  const auto* rp = data_ptr<const uint8_t>(k_rope);
  auto* buf = data_ptr<uint8_t>(kv_buffer);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = index_at(loc, i);
    if (l < 0 || l >= rows) continue;  // -1 pads; out of range is skipped too
    uint8_t* dst = buf + l * (nope + rope);
    std::memcpy(dst, np + i * nope, static_cast<size_t>(nope));
    std::memcpy(dst + nope, rp + i * rope, static_cast<size_t>(rope));
  }
  return kOk;
}

namespace {

// dst rows dst_idx[i] = src rows src_idx[i], for every i with both indices in range.
void copy_indexed_rows(const int64_t* src_idx, const int64_t* dst_idx, int64_t n,
                       const uint8_t* src, int64_t src_rows, int64_t src_stride, uint8_t* dst,
                       int64_t dst_rows, int64_t dst_stride, int64_t row_bytes) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = src_idx[i], d = dst_idx[i];
    if (s < 0 || s >= src_rows || d < 0 || d >= dst_rows) continue;  // skipped, not an error
    std::memmove(dst + d * dst_stride, src + s * src_stride, static_cast<size_t>(row_bytes));
  }
}

}  // namespace

KernelStatus transfer_cpu(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                          const DLTensor& src, DLTensor& dst) {
  if (KernelStatus st = check_transfer(ctx, ctx.op(), src, dst); !st.ok()) return st;
  const int64_t row = row_bytes_of(src);
  copy_indexed_rows(data_ptr<const int64_t>(src_idx), data_ptr<const int64_t>(dst_idx),
                    src_idx.shape[0], data_ptr<const uint8_t>(src), src.shape[0], row,
                    data_ptr<uint8_t>(dst), dst.shape[0], row, row);
  return kOk;
}

KernelStatus transfer_layers_cpu(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                                 const DLTensor& src_ptrs, const DLTensor& dst_ptrs,
                                 int64_t row_bytes, int64_t src_rows, int64_t dst_rows,
                                 int64_t src_stride, int64_t dst_stride) {
  if (KernelStatus st = check_transfer_layers(ctx, ctx.op(), row_bytes, src_rows, dst_rows,
                                              src_stride, dst_stride);
      !st.ok()) {
    return st;
  }
  const int64_t ss = src_stride != 0 ? src_stride : row_bytes;
  const int64_t ds = dst_stride != 0 ? dst_stride : row_bytes;
  const auto* sp = data_ptr<const int64_t>(src_ptrs);
  const auto* dp = data_ptr<const int64_t>(dst_ptrs);
  for (int64_t l = 0; l < src_ptrs.shape[0]; ++l) {
    if (sp[l] == 0 || dp[l] == 0) continue;  // a null address skips the layer
    copy_indexed_rows(data_ptr<const int64_t>(src_idx), data_ptr<const int64_t>(dst_idx),
                      src_idx.shape[0], reinterpret_cast<const uint8_t*>(sp[l]), src_rows, ss,
                      reinterpret_cast<uint8_t*>(dp[l]), dst_rows, ds, row_bytes);
  }
  return kOk;
}

}  // namespace kreg::kvcache
