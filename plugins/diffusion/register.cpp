// The diffusion group's implementations, listed as data. The descriptions state
// each op's contract; docs/ops/diffusion.md has the details.
#include "diffusion.hpp"

namespace kreg::diffusion {
namespace {

constexpr const char* kTimestepEmbedding =
    "timestep_embedding(Tensor[N] t, Tensor<f32>(a!)[N,D] out, int dim, "
    "bool flip_sin_to_cos=false, float downscale_freq_shift=1.0, float "
    "scale=1.0, "
    "int max_period=10000) -> ()";
constexpr const char* kNormScaleShift =
    "norm_scale_shift(Tensor[B,S,H] x, Tensor scale, Tensor shift, Tensor?[H] weight, "
    "Tensor?[H] bias, Tensor(a!)[B,S,H] out, float eps=1e-6) -> ()";
constexpr const char* kResidualGateAdd =
    "residual_gate_add(Tensor[B,S,H] residual, Tensor[B,S,H] x, Tensor gate, "
    "Tensor(a!)[B,S,H] out) -> ()";
constexpr const char* kGroupNormSilu =
    "group_norm_silu(Tensor x, Tensor[C] weight, Tensor[C] bias, Tensor(a!) "
    "out, "
    "int num_groups, float eps=1e-5) -> ()";
constexpr const char* kDtypes = "bf16|f16|f32";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

constexpr const char* kTimestepEmbeddingContract =
    "diffusers get_timestep_embedding: t[N] (bf16/f16/f32) -> out[N,dim] f32; "
    "half = dim/2, "
    "freq[i] = exp(-ln(max_period) * i / (half - downscale_freq_shift)), arg = "
    "t * freq * "
    "scale, out = [sin(arg), cos(arg)] ([cos, sin] if flip_sin_to_cos), odd "
    "dim: last column "
    "0; dim must equal out's width, max_period >= 1, downscale_freq_shift != "
    "half";
constexpr const char* kNormScaleShiftContract =
    "adaLN modulate: out = layernorm(x) * (1 + scale) + shift over H (biased "
    "variance, eps); "
    "x, out [B,S,H]; scale, shift each [B,H] (broadcast over S) or [B,S,H]; "
    "optional weight [H] and bias [H] (each may be omitted): layernorm(x) * weight + bias "
    "first; one dtype, fp32 math, one rounding";
constexpr const char* kResidualGateAddContract =
    "out = residual + gate * x; residual, x, out [B,S,H]; gate [B,H] "
    "(broadcast over S) or "
    "[B,S,H]; one dtype (bf16/f16/f32), fp32 math, one rounding; out may alias "
    "residual or x";
constexpr const char* kGroupNormSiluContract =
    "out = silu(group_norm(x) * weight[c] + bias[c]); x, out [N,C,*] (rank >= "
    "2, trailing "
    "dims flattened), weight, bias [C]; num_groups divides C; statistics over "
    "C/G channels x "
    "spatial (biased variance, eps); one dtype, fp32 math, one rounding";

constexpr KernelDef kKernels[] = {
    {.op = "diffusion.timestep_embedding",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kTimestepEmbedding,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kTimestepEmbeddingContract,
     .impl = bind<&timestep_embedding_cpu>,
     .source = "reference.cpp"},
    {.op = "diffusion.norm_scale_shift",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kNormScaleShift,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kNormScaleShiftContract,
     .impl = bind<&norm_scale_shift_cpu>,
     .source = "reference.cpp"},
    {.op = "diffusion.residual_gate_add",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kResidualGateAdd,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kResidualGateAddContract,
     .impl = bind<&residual_gate_add_cpu>,
     .source = "reference.cpp"},
    {.op = "diffusion.group_norm_silu",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kGroupNormSilu,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kGroupNormSiluContract,
     .impl = bind<&group_norm_silu_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "diffusion.timestep_embedding",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kTimestepEmbedding,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Sinusoidal timestep embedding, 4 frequencies per thread "
                    "held across rows, "
                    "float4 stores. Same contract as the cpu reference.",
     .impl = bind<&timestep_embedding_cuda>,
     .source = "timestep_embedding.cu"},
    {.op = "diffusion.norm_scale_shift",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kNormScaleShift,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "adaLN modulate: a warp per row up to 512 16-byte vectors (12 per "
                    "lane at H = 3072 bf16), several warps beyond; the row held in "
                    "registers across a two-pass mean/variance reduction. Same contract as "
                    "the cpu reference.",
     .impl = bind<&norm_scale_shift_cuda>,
     .source = "norm_scale_shift.cu"},
    {.op = "diffusion.residual_gate_add",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kResidualGateAdd,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Gated residual add, one thread per 16-byte vector, broadcast gate "
                    "indexed "
                    "through multiply-high dividers. Same contract as the cpu reference.",
     .impl = bind<&residual_gate_add_cuda>,
     .source = "residual_gate_add.cu"},
    {.op = "diffusion.group_norm_silu",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kGroupNormSilu,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "GroupNorm + SiLU, one block per (sample, group): shifted one-pass "
                    "statistics, then an L2 re-read to normalize. Same contract as the "
                    "cpu "
                    "reference.",
     .impl = bind<&group_norm_silu_cuda>,
     .source = "group_norm_silu.cu"},
#endif
};

}  // namespace
}  // namespace kreg::diffusion

KREG_PLUGIN("diffusion", "0.1.0", kreg::diffusion::kKernels);
