// The diffusion group: the element-wise and normalization ops of diffusion transformers
// (adaLN modulation, gated residuals), UNets (group norm + SiLU) and their timestep
// embedding. docs/ops/diffusion.md states the exact contract of each op.
//
// The core checks dtypes, device, contiguity and the named dimensions of the signature;
// what a signature cannot express (a modulation tensor that is [B,H] or [B,S,H], the
// rank-free x of group_norm_silu, attribute ranges) is checked by the functions of
// arguments.cpp, which both backends call first.
#pragma once

#include <cmath>
#include <cstdint>

#include "kreg/plugin.hpp"

// Host-and-device functions below: shared by the CPU reference and the CUDA kernels.
#if defined(__CUDACC__)
#define KREG_DIFFUSION_HOST_DEVICE __host__ __device__
#else
#define KREG_DIFFUSION_HOST_DEVICE
#endif

namespace kreg::diffusion {

// ---- Argument checks shared by both backends (arguments.cpp) ----

// Whether a modulation tensor (scale, shift, gate) named `name` of an op on x[B,S,H] is
// per token ([B,S,H]) or per batch ([B,H], broadcast over S).
KernelStatus modulation_layout(Context& ctx, const char* op, const char* name, const DLTensor& t,
                               const DLTensor& x, bool& per_token);

struct GroupNormShape {
  int64_t batch = 0;     // N
  int64_t channels = 0;  // C
  int64_t spatial = 0;   // product of x's dimensions after the first two (1 for rank 2)
  int64_t groups = 0;    // G, divides C
};
KernelStatus group_norm_shape(Context& ctx, const DLTensor& x, const DLTensor& weight,
                              const DLTensor& bias, const DLTensor& out, int64_t num_groups,
                              GroupNormShape& shape);

struct TimestepEmbedding {
  int64_t half = 0;          // dim / 2 frequencies
  bool flip = false;         // [cos, sin] instead of [sin, cos]
  bool pad = false;          // odd dim: the last column is zero
  float log_max_period = 0;  // ln(max_period), rounded to fp32
  float denominator = 1;     // half - downscale_freq_shift, rounded to fp32
  float scale = 1;
};
KernelStatus timestep_embedding_args(Context& ctx, const DLTensor& out, int64_t dim,
                                     bool flip_sin_to_cos, double downscale_freq_shift,
                                     double scale, int64_t max_period, TimestepEmbedding& e);

// Frequency i of the embedding, as diffusers computes it in fp32 (exponent = -ln(P) * i,
// then / (half - shift), then exp), with the exp evaluated in double and rounded once so
// that the CPU and CUDA backends agree bit for bit on every frequency.
KREG_DIFFUSION_HOST_DEVICE inline float timestep_frequency(const TimestepEmbedding& e, int64_t i) {
  const float exponent = (-e.log_max_period * static_cast<float>(i)) / e.denominator;
  return static_cast<float>(exp(static_cast<double>(exponent)));
}

// ---- CPU references (reference.cpp) ----

KernelStatus timestep_embedding_cpu(Context& ctx, const DLTensor& t, DLTensor& out, int64_t dim,
                                    bool flip_sin_to_cos, double downscale_freq_shift, double scale,
                                    int64_t max_period);
// weight, bias: optional [H] tensors (null when omitted).
KernelStatus norm_scale_shift_cpu(Context& ctx, const DLTensor& x, const DLTensor& scale,
                                  const DLTensor& shift, const DLTensor* weight,
                                  const DLTensor* bias, DLTensor& out, double eps);
KernelStatus residual_gate_add_cpu(Context& ctx, const DLTensor& residual, const DLTensor& x,
                                   const DLTensor& gate, DLTensor& out);
KernelStatus group_norm_silu_cpu(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                 const DLTensor& bias, DLTensor& out, int64_t num_groups,
                                 double eps);

#if defined(KREG_PLUGIN_HAS_CUDA)
// ---- CUDA kernels (one .cu each); they enqueue on ctx.stream() and return ----

KernelStatus timestep_embedding_cuda(Context& ctx, const DLTensor& t, DLTensor& out, int64_t dim,
                                     bool flip_sin_to_cos, double downscale_freq_shift,
                                     double scale, int64_t max_period);
KernelStatus norm_scale_shift_cuda(Context& ctx, const DLTensor& x, const DLTensor& scale,
                                   const DLTensor& shift, const DLTensor* weight,
                                   const DLTensor* bias, DLTensor& out, double eps);
KernelStatus residual_gate_add_cuda(Context& ctx, const DLTensor& residual, const DLTensor& x,
                                    const DLTensor& gate, DLTensor& out);
KernelStatus group_norm_silu_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                  const DLTensor& bias, DLTensor& out, int64_t num_groups,
                                  double eps);
#endif

}  // namespace kreg::diffusion
