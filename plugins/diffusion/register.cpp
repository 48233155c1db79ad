// The diffusion group's ops, registered by op (kreg/plugin.hpp). The descriptions state
// each op's contract; docs/ops/diffusion.md has the details.
#include "diffusion.hpp"

namespace kreg::diffusion {
namespace {

constexpr Op kOps[] = {
    {.signature = "timestep_embedding(Tensor[N] t, Tensor<f32>(a!)[N,D] out, int dim, bool "
                  "flip_sin_to_cos=false, float downscale_freq_shift=1.0, float scale=1.0, int "
                  "max_period=10000) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "diffusers get_timestep_embedding: t[N] (bf16/f16/f32) -> out[N,dim] f32; half "
                    "= dim/2, freq[i] = exp(-ln(max_period) * i / (half - downscale_freq_shift)), "
                    "arg = t * freq * scale, out = [sin(arg), cos(arg)] ([cos, sin] if "
                    "flip_sin_to_cos), odd dim: last column 0; dim must equal out's width, "
                    "max_period >= 1, downscale_freq_shift != half. CUDA: 4 frequencies per thread "
                    "held across rows, float4 stores.",
     .impls = {cpu(bind<&timestep_embedding_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&timestep_embedding_cuda>, "timestep_embedding.cu"))}},
    {.signature = "norm_scale_shift(Tensor[B,S,H] x, Tensor scale, Tensor shift, Tensor?[H] "
                  "weight, Tensor?[H] bias, Tensor(a!)[B,S,H] out, float eps=1e-6) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "adaLN modulate: out = layernorm(x) * (1 + scale) + shift over H (biased "
                    "variance, eps); x, out [B,S,H]; scale, shift each [B,H] (broadcast over S) or "
                    "[B,S,H]; optional weight [H] and bias [H] (each may be omitted): layernorm(x) "
                    "* weight + bias first; one dtype, fp32 math, one rounding. CUDA: a warp per "
                    "row up to 512 16-byte vectors (12 per lane at H = 3072 bf16), several warps "
                    "beyond; the row held in registers across a two-pass mean/variance reduction.",
     .impls = {cpu(bind<&norm_scale_shift_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&norm_scale_shift_cuda>, "norm_scale_shift.cu"))}},
    {.signature = "residual_gate_add(Tensor[B,S,H] residual, Tensor[B,S,H] x, Tensor gate, "
                  "Tensor(a!)[B,S,H] out) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "out = residual + gate * x; residual, x, out [B,S,H]; gate [B,H] (broadcast "
                    "over S) or [B,S,H]; one dtype (bf16/f16/f32), fp32 math, one rounding; out "
                    "may alias residual or x. CUDA: one thread per 16-byte vector, broadcast gate "
                    "indexed through multiply-high dividers.",
     .impls = {cpu(bind<&residual_gate_add_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&residual_gate_add_cuda>, "residual_gate_add.cu"))}},
    {.signature = "group_norm_silu(Tensor x, Tensor[C] weight, Tensor[C] bias, Tensor(a!) out, int "
                  "num_groups, float eps=1e-5) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "out = silu(group_norm(x) * weight[c] + bias[c]); x, out [N,C,*] (rank >= 2, "
                    "trailing dims flattened), weight, bias [C]; num_groups divides C; statistics "
                    "over C/G channels x spatial (biased variance, eps); one dtype, fp32 math, one "
                    "rounding. CUDA (16-byte vectors, sm_90): a group split over a cluster of "
                    "blocks, shifted one-pass statistics reduced over the cluster, then an L2 "
                    "re-read to normalize; small groups held in registers; else one block per "
                    "(sample, group).",
     .impls = {cpu(bind<&group_norm_silu_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&group_norm_silu_cuda>, "group_norm_silu.cu"))}},
};

}  // namespace
}  // namespace kreg::diffusion

KREG_GROUP("diffusion", kreg::diffusion::kOps);
