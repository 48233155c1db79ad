// CPU references of the layernorm group: the plain loops that define what the CUDA
// kernels must compute (fp32 math, one rounding at each store).
#include <cmath>
#include <cstdint>

#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"
#include "layernorm.hpp"

namespace kreg::layernorm {
namespace {

// 1 / sqrt(mean + eps). The sum of squares is accumulated in double so that the
// reference sits as close to the exact value as fp32 allows; the CUDA kernels' fp32 tree
// sums differ from it by a few fp32 ulps, far below one ulp of bf16/f16.
float inv_rms(double sum_sq, int64_t hidden, float eps) {
  return 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(hidden)) + eps);
}

template <bool kGemma, typename T>
float weight_at(const T* w, int64_t i) {
  const float v = load_as_float(w[i]);
  return kGemma ? 1.0f + v : v;
}

template <bool kGemma, typename T>
void rmsnorm_rows(const T* x, const T* w, T* out, int64_t rows, int64_t hidden, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * hidden;
    T* outr = out + r * hidden;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < hidden; ++i) {
      const double v = load_as_float(xr[i]);
      sum_sq += v * v;
    }
    const float scale = inv_rms(sum_sq, hidden, eps);
    for (int64_t i = 0; i < hidden; ++i) {
      outr[i] = store_from_float<T>(load_as_float(xr[i]) * scale * weight_at<kGemma>(w, i));
    }
  }
}

// Two passes over the row instead of a buffer: the second recomputes s = x + residual
// from inputs it has not yet overwritten, so the norm uses the unrounded fp32 sum.
template <bool kGemma, typename T>
void fused_add_rmsnorm_rows(T* x, T* residual, const T* w, int64_t rows, int64_t hidden,
                            float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * hidden;
    T* rr = residual + r * hidden;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < hidden; ++i) {
      const double s = load_as_float(xr[i]) + load_as_float(rr[i]);
      sum_sq += s * s;
    }
    const float scale = inv_rms(sum_sq, hidden, eps);
    for (int64_t i = 0; i < hidden; ++i) {
      const float s = load_as_float(xr[i]) + load_as_float(rr[i]);
      rr[i] = store_from_float<T>(s);
      xr[i] = store_from_float<T>(s * scale * weight_at<kGemma>(w, i));
    }
  }
}

template <bool kGemma>
KernelStatus rmsnorm_impl(Context& ctx, const char* op, const DLTensor& x, const DLTensor& weight,
                          DLTensor& out, double eps) {
  return host::visit_float_dtype(ctx, op, x, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_rows<kGemma>(data_ptr<const T>(x), data_ptr<const T>(weight), data_ptr<T>(out),
                         x.shape[0], x.shape[1], static_cast<float>(eps));
  });
}

template <bool kGemma>
KernelStatus fused_add_rmsnorm_impl(Context& ctx, const char* op, DLTensor& x, DLTensor& residual,
                                    const DLTensor& weight, double eps) {
  return host::visit_float_dtype(ctx, op, x, [&](auto tag) {
    using T = decltype(tag);
    fused_add_rmsnorm_rows<kGemma>(data_ptr<T>(x), data_ptr<T>(residual), data_ptr<const T>(weight),
                                   x.shape[0], x.shape[1], static_cast<float>(eps));
  });
}

}  // namespace

KernelStatus rmsnorm_cpu(Context& ctx, const DLTensor& x, const DLTensor& weight, DLTensor& out,
                         double eps) {
  return rmsnorm_impl<false>(ctx, "layernorm.rmsnorm", x, weight, out, eps);
}

KernelStatus gemma_rmsnorm_cpu(Context& ctx, const DLTensor& x, const DLTensor& weight,
                               DLTensor& out, double eps) {
  return rmsnorm_impl<true>(ctx, "layernorm.gemma_rmsnorm", x, weight, out, eps);
}

KernelStatus fused_add_rmsnorm_cpu(Context& ctx, DLTensor& x, DLTensor& residual,
                                   const DLTensor& weight, double eps) {
  return fused_add_rmsnorm_impl<false>(ctx, "layernorm.fused_add_rmsnorm", x, residual, weight,
                                       eps);
}

KernelStatus gemma_fused_add_rmsnorm_cpu(Context& ctx, DLTensor& x, DLTensor& residual,
                                         const DLTensor& weight, double eps) {
  return fused_add_rmsnorm_impl<true>(ctx, "layernorm.gemma_fused_add_rmsnorm", x, residual, weight,
                                      eps);
}

}  // namespace kreg::layernorm
