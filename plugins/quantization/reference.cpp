// CPU references of the quantization group: the plain loops that define what the CUDA
// kernels must compute, byte for byte (quant_math.hpp's arithmetic on both sides).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kreg/device/fp8_e4m3.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"
#include "quant_math.hpp"
#include "quantization.hpp"

namespace kreg::quantization {
namespace {

uint8_t to_e4m3(float q) { return device::float_to_e4m3(q); }
int8_t to_int8(float q) { return static_cast<int8_t>(q_rint(q)); }

// The value the op quantizes at column c of row `row` (x's row, 2H wide when fused).
template <bool kSilu, typename T>
float value_at(const T* row, int64_t h, int64_t c) {
  if constexpr (kSilu) {
    return silu_mul_f(load_as_float(row[c]), load_as_float(row[h + c]));
  } else {
    return load_as_float(row[c]);
  }
}

template <GroupOp kOp, typename T, typename Q>
void group_rows(const T* x, Q* out, float* scales, const GroupShape& s, bool ue8m0) {
  constexpr bool kSilu = is_silu(kOp);
  const float qmax = is_int8(kOp) ? kInt8Max : kFp8Max;
  const int64_t x_cols = kSilu ? 2 * s.hidden : s.hidden;
  for (int64_t t = 0; t < s.tokens; ++t) {
    const T* row = x + t * x_cols;
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t c0 = g * s.group_size;
      float amax = 0.0f;
      for (int64_t c = c0; c < c0 + s.group_size; ++c) {
        amax = std::fmax(amax, std::fabs(value_at<kSilu>(row, s.hidden, c)));
      }
      const float sc = quant_scale(amax, s.eps, qmax, ue8m0);
      if constexpr (is_col_major(kOp)) {
        scales[g * s.scale_ld + t] = sc;
      } else {
        scales[t * s.groups + g] = sc;
      }
      for (int64_t c = c0; c < c0 + s.group_size; ++c) {
        const float q = scaled_clamped(value_at<kSilu>(row, s.hidden, c), sc, qmax);
        if constexpr (is_int8(kOp)) {
          out[t * s.hidden + c] = to_int8(q);
        } else {
          out[t * s.hidden + c] = to_e4m3(q);
        }
      }
    }
  }
}

template <GroupOp kOp>
KernelStatus group_quant(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& out_scales,
                         int64_t group_size, double eps, bool ue8m0) {
  GroupShape shape;
  if (const KernelStatus st = check_group_args(ctx, kOp, out, out_scales, group_size, eps, &shape);
      !st.ok()) {
    return st;
  }
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_int8(kOp)) {
      group_rows<kOp>(data_ptr<const T>(x), data_ptr<int8_t>(out), data_ptr<float>(out_scales),
                      shape, ue8m0);
    } else {
      group_rows<kOp>(data_ptr<const T>(x), data_ptr<uint8_t>(out), data_ptr<float>(out_scales),
                      shape, ue8m0);
    }
  });
}

}  // namespace

template <GroupOp kOp>
KernelStatus group_quant_fp8_cpu(Context& ctx, const DLTensor& x, DLTensor& out,
                                 DLTensor& out_scales, int64_t group_size, double eps,
                                 bool scale_ue8m0) {
  return group_quant<kOp>(ctx, x, out, out_scales, group_size, eps, scale_ue8m0);
}

template KernelStatus group_quant_fp8_cpu<GroupOp::kFp8>(Context&, const DLTensor&, DLTensor&,
                                                         DLTensor&, int64_t, double, bool);
template KernelStatus group_quant_fp8_cpu<GroupOp::kFp8ColMajor>(Context&, const DLTensor&,
                                                                 DLTensor&, DLTensor&, int64_t,
                                                                 double, bool);
template KernelStatus group_quant_fp8_cpu<GroupOp::kSiluFp8>(Context&, const DLTensor&, DLTensor&,
                                                             DLTensor&, int64_t, double, bool);
template KernelStatus group_quant_fp8_cpu<GroupOp::kSiluFp8ColMajor>(Context&, const DLTensor&,
                                                                     DLTensor&, DLTensor&, int64_t,
                                                                     double, bool);

KernelStatus group_quant_int8_cpu(Context& ctx, const DLTensor& x, DLTensor& out,
                                  DLTensor& out_scales, int64_t group_size, double eps) {
  return group_quant<GroupOp::kInt8>(ctx, x, out, out_scales, group_size, eps, false);
}

KernelStatus token_quant_fp8_cpu(Context& ctx, const DLTensor& x, DLTensor& out,
                                 DLTensor& out_scales) {
  const int64_t rows = x.shape[0];
  const int64_t h = x.shape[1];
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = data_ptr<const T>(x);
    auto* op = data_ptr<uint8_t>(out);
    auto* sp = data_ptr<float>(out_scales);
    for (int64_t t = 0; t < rows; ++t) {
      const T* row = xp + t * h;
      float amax = 0.0f;
      for (int64_t c = 0; c < h; ++c) amax = std::fmax(amax, std::fabs(load_as_float(row[c])));
      const float s = group_scale(amax, kDefaultEps, kFp8Max);
      sp[t] = s;
      for (int64_t c = 0; c < h; ++c) {
        op[t * h + c] = to_e4m3(scaled_clamped(load_as_float(row[c]), s, kFp8Max));
      }
    }
  });
}

KernelStatus tensor_quant_fp8_cpu(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& scale,
                                  bool is_static) {
  const int64_t n = x.shape[0] * x.shape[1];
  if (n == 0) return kOk;  // nothing to scale: the scale is left as it is
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = data_ptr<const T>(x);
    auto* op = data_ptr<uint8_t>(out);
    auto* sp = data_ptr<float>(scale);
    if (!is_static) {
      float amax = 0.0f;
      for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(load_as_float(xp[i])));
      sp[0] = group_scale(amax, kDefaultEps, kFp8Max);
    }
    const float s = sp[0];
    for (int64_t i = 0; i < n; ++i)
      op[i] = to_e4m3(scaled_clamped(load_as_float(xp[i]), s, kFp8Max));
  });
}

}  // namespace kreg::quantization
