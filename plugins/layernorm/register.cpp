// The layernorm group's implementations, listed as data.
#include "layernorm.hpp"

namespace kreg::layernorm {
namespace {

constexpr const char* kRmsnorm =
    "rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, float eps=1e-6) -> ()";
constexpr const char* kGemmaRmsnorm =
    "gemma_rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, float eps=1e-6) -> ()";
constexpr const char* kFusedAddRmsnorm =
    "fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, Tensor[H] weight, "
    "float eps=1e-6) -> ()";
constexpr const char* kGemmaFusedAddRmsnorm =
    "gemma_fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, Tensor[H] weight, "
    "float eps=1e-6) -> ()";
constexpr const char* kDtypes = "bf16|f16|f32";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

constexpr KernelDef kKernels[] = {
    {.op = "layernorm.rmsnorm",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kRmsnorm,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "RMSNorm reference: x * rsqrt(mean(x^2) + eps) * w, fp32 math, one rounding",
     .impl = bind<&rmsnorm_cpu>,
     .source = "reference.cpp"},
    {.op = "layernorm.gemma_rmsnorm",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kGemmaRmsnorm,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "Gemma RMSNorm reference: weight applied as (1 + w), fp32 math, one rounding",
     .impl = bind<&gemma_rmsnorm_cpu>,
     .source = "reference.cpp"},
    {.op = "layernorm.fused_add_rmsnorm",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kFusedAddRmsnorm,
     .dtypes = kDtypes,
     .traits = kCpuTraits | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = "In-place residual add + RMSNorm reference: residual = x + residual, "
                    "x = rmsnorm of the unrounded fp32 sum",
     .impl = bind<&fused_add_rmsnorm_cpu>,
     .source = "reference.cpp"},
    {.op = "layernorm.gemma_fused_add_rmsnorm",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kGemmaFusedAddRmsnorm,
     .dtypes = kDtypes,
     .traits = kCpuTraits | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = "In-place residual add + Gemma RMSNorm (1 + w) reference, norm of the "
                    "unrounded fp32 sum",
     .impl = bind<&gemma_fused_add_rmsnorm_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "layernorm.rmsnorm",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kRmsnorm,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "RMSNorm, one block row per token, 16-byte vectors held in registers "
                    "across the reduction: one read, one write",
     .impl = bind<&rmsnorm_cuda>,
     .source = "rmsnorm.cu"},
    {.op = "layernorm.gemma_rmsnorm",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kGemmaRmsnorm,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Gemma RMSNorm (1 + w), one block row per token, 16-byte vectors held in "
                    "registers across the reduction",
     .impl = bind<&gemma_rmsnorm_cuda>,
     .source = "rmsnorm.cu"},
    {.op = "layernorm.fused_add_rmsnorm",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kFusedAddRmsnorm,
     .dtypes = kDtypes,
     .traits = kCudaTraits | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = "In-place residual add + RMSNorm in one pass, fp32 sum kept in registers "
                    "across the reduction",
     .impl = bind<&fused_add_rmsnorm_cuda>,
     .source = "rmsnorm.cu"},
    {.op = "layernorm.gemma_fused_add_rmsnorm",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kGemmaFusedAddRmsnorm,
     .dtypes = kDtypes,
     .traits = kCudaTraits | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = "In-place residual add + Gemma RMSNorm (1 + w) in one pass, fp32 sum kept "
                    "in registers",
     .impl = bind<&gemma_fused_add_rmsnorm_cuda>,
     .source = "rmsnorm.cu"},
#endif
};

}  // namespace
}  // namespace kreg::layernorm

KREG_PLUGIN("layernorm", "0.1.0", kreg::layernorm::kKernels);
