// CPU references of the diffusion group: the plain loops that define what the CUDA
// kernels must compute. Inputs are converted to fp32, statistics are accumulated in
// double, the per-element math is fp32, and each output is rounded once, at its store.
#include <cmath>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::diffusion {
namespace {

float silu(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

KernelStatus timestep_embedding_cpu(Context& ctx, const DLTensor& t, DLTensor& out, int64_t dim,
                                    bool flip_sin_to_cos, double downscale_freq_shift, double scale,
                                    int64_t max_period) {
  const char* const kOp = ctx.op();
  TimestepEmbedding e;
  if (KernelStatus st = timestep_embedding_args(ctx, out, dim, flip_sin_to_cos,
                                                downscale_freq_shift, scale, max_period, e);
      !st.ok()) {
    return st;
  }
  const int64_t n = t.shape[0];
  float* o = data_ptr<float>(out);
  return host::visit_float_dtype(ctx, kOp, t, [&](auto tag) {
    using T = decltype(tag);
    const T* tp = data_ptr<const T>(t);
    for (int64_t r = 0; r < n; ++r) {
      const float tv = load_as_float(tp[r]);
      float* row = o + r * dim;
      for (int64_t i = 0; i < e.half; ++i) {
        // diffusers' order: (t * freq) first, then * scale, each rounded to fp32.
        const float arg = (tv * timestep_frequency(e, i)) * e.scale;
        const auto s = static_cast<float>(std::sin(static_cast<double>(arg)));
        const auto c = static_cast<float>(std::cos(static_cast<double>(arg)));
        row[e.flip ? e.half + i : i] = s;
        row[e.flip ? i : e.half + i] = c;
      }
      if (e.pad) row[dim - 1] = 0.0f;
    }
  });
}

KernelStatus norm_scale_shift_cpu(Context& ctx, const DLTensor& x, const DLTensor& scale,
                                  const DLTensor& shift, const DLTensor* weight,
                                  const DLTensor* bias, DLTensor& out, double eps) {
  const char* const kOp = ctx.op();
  bool scale_per_token = false, shift_per_token = false;
  if (KernelStatus st = modulation_layout(ctx, kOp, "scale", scale, x, scale_per_token); !st.ok())
    return st;
  if (KernelStatus st = modulation_layout(ctx, kOp, "shift", shift, x, shift_per_token); !st.ok())
    return st;
  const int64_t batch = x.shape[0], tokens = x.shape[1], hidden = x.shape[2];
  const auto feps = static_cast<float>(eps);
  return host::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = data_ptr<const T>(x);
    const T* scp = data_ptr<const T>(scale);
    const T* shp = data_ptr<const T>(shift);
    const T* wp = weight ? data_ptr<const T>(*weight) : nullptr;
    const T* bp = bias ? data_ptr<const T>(*bias) : nullptr;
    T* op = data_ptr<T>(out);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t s = 0; s < tokens; ++s) {
        const int64_t row = b * tokens + s;
        const T* xr = xp + row * hidden;
        const T* scr = scp + (scale_per_token ? row : b) * hidden;
        const T* shr = shp + (shift_per_token ? row : b) * hidden;
        double sum = 0;
        for (int64_t h = 0; h < hidden; ++h) sum += load_as_float(xr[h]);
        const double mean = sum / static_cast<double>(hidden);
        double sq = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          const double d = load_as_float(xr[h]) - mean;
          sq += d * d;
        }
        const auto fmean = static_cast<float>(mean);
        const float rstd =
            1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(hidden)) + feps);
        for (int64_t h = 0; h < hidden; ++h) {
          float y = (load_as_float(xr[h]) - fmean) * rstd;
          if (wp) y = y * load_as_float(wp[h]);
          if (bp) y = y + load_as_float(bp[h]);
          y = y * (1.0f + load_as_float(scr[h])) + load_as_float(shr[h]);
          op[row * hidden + h] = store_from_float<T>(y);
        }
      }
    }
  });
}

KernelStatus residual_gate_add_cpu(Context& ctx, const DLTensor& residual, const DLTensor& x,
                                   const DLTensor& gate, DLTensor& out) {
  const char* const kOp = ctx.op();
  bool per_token = false;
  if (KernelStatus st = modulation_layout(ctx, kOp, "gate", gate, x, per_token); !st.ok())
    return st;
  const int64_t batch = x.shape[0], tokens = x.shape[1], hidden = x.shape[2];
  return host::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    using T = decltype(tag);
    const T* rp = data_ptr<const T>(residual);
    const T* xp = data_ptr<const T>(x);
    const T* gp = data_ptr<const T>(gate);
    T* op = data_ptr<T>(out);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t s = 0; s < tokens; ++s) {
        const int64_t row = b * tokens + s;
        const T* gr = gp + (per_token ? row : b) * hidden;
        for (int64_t h = 0; h < hidden; ++h) {
          const int64_t i = row * hidden + h;
          // Read both inputs before the store: out may alias residual or x.
          const float y = load_as_float(rp[i]) + load_as_float(gr[h]) * load_as_float(xp[i]);
          op[i] = store_from_float<T>(y);
        }
      }
    }
  });
}

KernelStatus group_norm_silu_cpu(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                 const DLTensor& bias, DLTensor& out, int64_t num_groups,
                                 double eps) {
  const char* const kOp = ctx.op();
  GroupNormShape g;
  if (KernelStatus st = group_norm_shape(ctx, x, weight, bias, out, num_groups, g); !st.ok())
    return st;
  const int64_t channels_per_group = g.channels / g.groups;
  const int64_t group_elems = channels_per_group * g.spatial;
  const auto feps = static_cast<float>(eps);
  return host::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = data_ptr<const T>(x);
    const T* wp = data_ptr<const T>(weight);
    const T* bp = data_ptr<const T>(bias);
    T* op = data_ptr<T>(out);
    for (int64_t n = 0; n < g.batch; ++n) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        // A group is contiguous: channels grp*Cg .. grp*Cg + Cg - 1 of sample n.
        const int64_t base = (n * g.channels + grp * channels_per_group) * g.spatial;
        double sum = 0;
        for (int64_t i = 0; i < group_elems; ++i) sum += load_as_float(xp[base + i]);
        const double mean = group_elems > 0 ? sum / static_cast<double>(group_elems) : 0.0;
        double sq = 0;
        for (int64_t i = 0; i < group_elems; ++i) {
          const double d = load_as_float(xp[base + i]) - mean;
          sq += d * d;
        }
        const auto fmean = static_cast<float>(mean);
        const float rstd =
            1.0f / std::sqrt(static_cast<float>(sq / static_cast<double>(group_elems)) + feps);
        for (int64_t i = 0; i < group_elems; ++i) {
          const int64_t c = grp * channels_per_group + i / g.spatial;
          const float y = (load_as_float(xp[base + i]) - fmean) * rstd * load_as_float(wp[c]) +
                          load_as_float(bp[c]);
          op[base + i] = store_from_float<T>(silu(y));
        }
      }
    }
  });
}

}  // namespace kreg::diffusion
