// Argument checks the signatures cannot express, shared by the CPU references and the
// CUDA launchers so that both backends accept and refuse exactly the same calls.
#include <cmath>
#include <string>

#include "diffusion.hpp"

namespace kreg::diffusion {
namespace {

std::string shape_text(const DLTensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "]";
}

}  // namespace

KernelStatus modulation_layout(Context& ctx, const char* op, const char* name, const DLTensor& t,
                               const DLTensor& x, bool& per_token) {
  const int64_t b = x.shape[0], s = x.shape[1], h = x.shape[2];
  if (t.ndim == 2 && t.shape[0] == b && t.shape[1] == h) {
    per_token = false;
    return kOk;
  }
  if (t.ndim == 3 && t.shape[0] == b && t.shape[1] == s && t.shape[2] == h) {
    per_token = true;
    return kOk;
  }
  return ctx.fail(KREG_INVALID_ARGUMENT,
                  "%s: argument '%s' has shape %s, expected [B,H] = [%lld,%lld] or [B,S,H] = "
                  "[%lld,%lld,%lld]",
                  op, name, shape_text(t).c_str(), static_cast<long long>(b),
                  static_cast<long long>(h), static_cast<long long>(b), static_cast<long long>(s),
                  static_cast<long long>(h));
}

KernelStatus group_norm_shape(Context& ctx, const DLTensor& x, const DLTensor& weight,
                              const DLTensor& bias, const DLTensor& out, int64_t num_groups,
                              GroupNormShape& shape) {
  const char* const kOp = ctx.op();
  if (x.ndim < 2) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'x' has shape %s, expected rank >= 2 ([N,C,*])", kOp,
                    shape_text(x).c_str());
  }
  if (out.ndim != x.ndim) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: argument 'out' has shape %s, expected %s (x's)",
                    kOp, shape_text(out).c_str(), shape_text(x).c_str());
  }
  for (int i = 0; i < x.ndim; ++i) {
    if (out.shape[i] != x.shape[i]) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: argument 'out' has shape %s, expected %s (x's)",
                      kOp, shape_text(out).c_str(), shape_text(x).c_str());
    }
  }
  const int64_t c = x.shape[1];
  if (weight.shape[0] != c) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'weight' has shape %s, expected [C] = [%lld]", kOp,
                    shape_text(weight).c_str(), static_cast<long long>(c));
  }
  if (bias.shape[0] != c) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'bias' has shape %s, expected [C] = [%lld]", kOp,
                    shape_text(bias).c_str(), static_cast<long long>(c));
  }
  if (num_groups < 1 || c % num_groups != 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'num_groups' = %lld must be >= 1 and divide C = %lld", kOp,
                    static_cast<long long>(num_groups), static_cast<long long>(c));
  }
  shape.batch = x.shape[0];
  shape.channels = c;
  shape.spatial = 1;
  for (int i = 2; i < x.ndim; ++i) shape.spatial *= x.shape[i];
  shape.groups = num_groups;
  return kOk;
}

KernelStatus timestep_embedding_args(Context& ctx, const DLTensor& out, int64_t dim,
                                     bool flip_sin_to_cos, double downscale_freq_shift,
                                     double scale, int64_t max_period, TimestepEmbedding& e) {
  const char* const kOp = ctx.op();
  if (dim != out.shape[1]) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'dim' = %lld must equal the width of argument 'out' (%lld)", kOp,
                    static_cast<long long>(dim), static_cast<long long>(out.shape[1]));
  }
  if (max_period < 1) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'max_period' = %lld must be >= 1", kOp,
                    static_cast<long long>(max_period));
  }
  e.half = dim / 2;
  const double denominator = static_cast<double>(e.half) - downscale_freq_shift;
  // diffusers divides by (half - shift): zero gives NaN (0/0) in column 0 and infinities
  // elsewhere, never a useful embedding.
  if (e.half > 0 && !(std::fabs(denominator) > 0)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'downscale_freq_shift' = %g must differ from dim / 2 = %lld "
                    "(the exponent is divided by their difference)",
                    kOp, downscale_freq_shift, static_cast<long long>(e.half));
  }
  if (!std::isfinite(scale)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'scale' = %g must be finite", kOp, scale);
  }
  e.flip = flip_sin_to_cos;
  e.pad = dim % 2 != 0;
  e.log_max_period = static_cast<float>(std::log(static_cast<double>(max_period)));
  e.denominator = static_cast<float>(denominator);
  e.scale = static_cast<float>(scale);
  return kOk;
}

}  // namespace kreg::diffusion
