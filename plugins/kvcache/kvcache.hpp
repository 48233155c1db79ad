// The kvcache group: writing new K/V rows into paged caches (kvcache.store, with an
// optional FP8 E4M3 cache), writing MLA latent rows (kvcache.set_mla_kv_buffer), and
// moving indexed KV rows between device and pinned host memory (kvcache.transfer,
// kvcache.transfer_layers). docs/ops/kvcache.md states the exact contract of each op.
//
// Every function trusts its frame: the core has checked dtypes, ranks, the named
// dimensions, device and contiguity. What a signature cannot express (a cache dtype that
// must equal k's or be fp8, a row width that is a sum, scale ranges) is checked by the
// shared helpers below, identically on both backends.
#pragma once

#include <cmath>
#include <cstdint>

#include "kreg/dtype.hpp"
#include "kreg/plugin.hpp"

namespace kreg::kvcache {

// ---- Argument checks shared by the CPU reference and the CUDA launchers ----

inline DType dtype_of(const DLTensor& t) { return from_dl(t.dtype).value_or(DType::kCount); }

// The dtype's name for messages (kreg::dtype_name lives in the core library, which plugins
// do not link).
inline const char* dtype_label(const DLTensor& t) {
  switch (dtype_of(t)) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    case DType::kF8E4M3:
      return "f8e4m3";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    default:
      return "another dtype";
  }
}

// kvcache.store: both caches share one dtype, which is k's or f8e4m3; scales are
// positive and finite, and only an fp8 cache takes a scale other than 1.
inline KernelStatus check_store(Context& ctx, const char* op, const DLTensor& k,
                                const DLTensor& k_cache, const DLTensor& v_cache, double k_scale,
                                double v_scale) {
  const DType kd = dtype_of(k), cd = dtype_of(k_cache);
  if (dtype_of(v_cache) != cd) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'v_cache' has dtype %s, but 'k_cache' has %s (the caches "
                    "share one dtype)",
                    op, dtype_label(v_cache), dtype_label(k_cache));
  }
  if (cd != kd && cd != DType::kF8E4M3) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'k_cache' has dtype %s; expected k's dtype (%s) or f8e4m3", op,
                    dtype_label(k_cache), dtype_label(k));
  }
  for (const auto& [name, s] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
    if (cd == DType::kF8E4M3) {
      if (!(s > 0.0) || !std::isfinite(static_cast<float>(s))) {
        return ctx.fail(KREG_INVALID_ARGUMENT,
                        "%s: attribute '%s' is %g; an fp8 cache needs a positive, finite scale", op,
                        name, s);
      }
    } else if (s != 1.0) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: attribute '%s' is %g, but the caches are %s: a scale applies only to "
                      "f8e4m3 caches (leave it at 1.0)",
                      op, name, s, dtype_label(k_cache));
    }
  }
  return kOk;
}

// kvcache.set_mla_kv_buffer: kv_buffer rows are k_nope's and k_rope's side by side.
inline KernelStatus check_mla(Context& ctx, const char* op, const DLTensor& kv_buffer,
                              const DLTensor& k_nope, const DLTensor& k_rope) {
  if (kv_buffer.shape[1] != k_nope.shape[1] + k_rope.shape[1]) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'kv_buffer' has rows of %lld elements, expected Dn + Dr = "
                    "%lld + %lld (k_nope's and k_rope's widths)",
                    op, static_cast<long long>(kv_buffer.shape[1]),
                    static_cast<long long>(k_nope.shape[1]),
                    static_cast<long long>(k_rope.shape[1]));
  }
  return kOk;
}

// kvcache.transfer / transfer_layers: rows are a whole number of 16-byte words.
inline KernelStatus check_row_bytes(Context& ctx, const char* op, const char* what,
                                    int64_t row_bytes) {
  if (row_bytes <= 0 || row_bytes % 16 != 0 || row_bytes > (int64_t{1} << 30)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: %s is %lld bytes; rows must be a positive multiple of 16 bytes (at "
                    "most 1 GiB)",
                    op, what, static_cast<long long>(row_bytes));
  }
  return kOk;
}

// Bytes per element (kreg::dtype_size lives in the core library).
inline int64_t elem_bytes(const DLTensor& t) { return (t.dtype.bits * t.dtype.lanes + 7) / 8; }

inline int64_t row_bytes_of(const DLTensor& t) {
  int64_t n = elem_bytes(t);
  for (int i = 1; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// kvcache.transfer: src and dst are [rows, ...] of the shared dtype with equal row sizes,
// a whole number of 16-byte words (rank >= 1; a row is everything after dimension 0).
inline KernelStatus check_transfer(Context& ctx, const char* op, const DLTensor& src,
                                   const DLTensor& dst) {
  for (const auto& [name, t] : {std::pair{"src", &src}, std::pair{"dst", &dst}}) {
    if (t->ndim < 1) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: argument '%s' is a scalar; expected [rows, ...] (a row is everything "
                      "after dimension 0)",
                      op, name);
    }
  }
  const int64_t sb = row_bytes_of(src), db = row_bytes_of(dst);
  if (sb != db) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'dst' has rows of %lld bytes, but 'src' has rows of %lld bytes "
                    "(rows are copied whole)",
                    op, static_cast<long long>(db), static_cast<long long>(sb));
  }
  return check_row_bytes(ctx, op, "the row size of 'src' and 'dst'", sb);
}

// kvcache.transfer_layers: what the attributes can be checked for (the addresses in the
// pointer tables cannot be, without reading them).
inline KernelStatus check_transfer_layers(Context& ctx, const char* op, int64_t row_bytes,
                                          int64_t src_rows, int64_t dst_rows, int64_t src_stride,
                                          int64_t dst_stride) {
  if (KernelStatus st = check_row_bytes(ctx, op, "attribute 'row_bytes'", row_bytes); !st.ok()) {
    return st;
  }
  for (const auto& [name, v] : {std::pair{"src_rows", src_rows}, std::pair{"dst_rows", dst_rows}}) {
    if (v < 0) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute '%s' is %lld; expected >= 0", op, name,
                      static_cast<long long>(v));
    }
  }
  for (const auto& [name, v] :
       {std::pair{"src_stride", src_stride}, std::pair{"dst_stride", dst_stride}}) {
    if (v != 0 && (v < row_bytes || v > (int64_t{1} << 40))) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: attribute '%s' is %lld bytes; expected 0 (= row_bytes, packed rows) "
                      "or at least row_bytes (%lld)",
                      op, name, static_cast<long long>(v), static_cast<long long>(row_bytes));
    }
  }
  return kOk;
}

// ---- CPU references (reference.cpp) ----

KernelStatus store_cpu(Context& ctx, const DLTensor& k, const DLTensor& v,
                       const DLTensor& slot_mapping, DLTensor& k_cache, DLTensor& v_cache,
                       double k_scale, double v_scale);
KernelStatus set_mla_kv_buffer_cpu(Context& ctx, DLTensor& kv_buffer, const DLTensor& loc,
                                   const DLTensor& k_nope, const DLTensor& k_rope);
KernelStatus transfer_cpu(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                          const DLTensor& src, DLTensor& dst);
KernelStatus transfer_layers_cpu(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                                 const DLTensor& src_ptrs, const DLTensor& dst_ptrs,
                                 int64_t row_bytes, int64_t src_rows, int64_t dst_rows,
                                 int64_t src_stride, int64_t dst_stride);

#if defined(KREG_PLUGIN_HAS_CUDA)
// ---- CUDA kernels (store.cu). They enqueue on ctx.stream() and return without waiting.
KernelStatus store_cuda(Context& ctx, const DLTensor& k, const DLTensor& v,
                        const DLTensor& slot_mapping, DLTensor& k_cache, DLTensor& v_cache,
                        double k_scale, double v_scale);
KernelStatus set_mla_kv_buffer_cuda(Context& ctx, DLTensor& kv_buffer, const DLTensor& loc,
                                    const DLTensor& k_nope, const DLTensor& k_rope);
// ---- transfer.cu ----
KernelStatus transfer_cuda(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                           const DLTensor& src, DLTensor& dst);
KernelStatus transfer_layers_cuda(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                                  const DLTensor& src_ptrs, const DLTensor& dst_ptrs,
                                  int64_t row_bytes, int64_t src_rows, int64_t dst_rows,
                                  int64_t src_stride, int64_t dst_stride);
#endif

}  // namespace kreg::kvcache
