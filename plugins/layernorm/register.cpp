// The layernorm group's ops, registered by op (kreg/plugin.hpp).
#include "layernorm.hpp"

namespace kreg::layernorm {
namespace {

constexpr Op kOps[] = {
    {.signature = "rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, "
                  "float eps=1e-6) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "RMSNorm: x * rsqrt(mean(x^2) + eps) * w, fp32 math, one rounding; CUDA: "
                    "one block row per token, 16-byte vectors held in registers",
     .impls = {cpu(bind<&rmsnorm_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&rmsnorm_cuda>, "rmsnorm.cu"),
                            cuda_jit(bind<&rmsnorm_jit>, "rmsnorm_jit.cpp", &kRmsnormJit))}},
    {.signature = "gemma_rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, "
                  "float eps=1e-6) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Gemma RMSNorm: weight applied as (1 + w), fp32 math, one rounding",
     .impls = {cpu(bind<&gemma_rmsnorm_cpu>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&gemma_rmsnorm_cuda>, "rmsnorm.cu"),
                   cuda_jit(bind<&gemma_rmsnorm_jit>, "rmsnorm_jit.cpp", &kGemmaRmsnormJit))}},
    {.signature = "fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, "
                  "Tensor[H] weight, float eps=1e-6) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "In-place residual add + RMSNorm: residual = x + residual, x = rmsnorm "
                    "of the unrounded fp32 sum, in one pass",
     .impls = {cpu(bind<&fused_add_rmsnorm_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&fused_add_rmsnorm_cuda>, "rmsnorm.cu"),
                            cuda_jit(bind<&fused_add_rmsnorm_jit>, "rmsnorm_jit.cpp",
                                     &kFusedAddRmsnormJit))}},
    {.signature = "gemma_fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, "
                  "Tensor[H] weight, float eps=1e-6) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "In-place residual add + Gemma RMSNorm (1 + w), norm of the unrounded "
                    "fp32 sum, in one pass",
     .impls = {cpu(bind<&gemma_fused_add_rmsnorm_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&gemma_fused_add_rmsnorm_cuda>, "rmsnorm.cu"),
                            cuda_jit(bind<&gemma_fused_add_rmsnorm_jit>, "rmsnorm_jit.cpp",
                                     &kGemmaFusedAddRmsnormJit))}},
};

}  // namespace
}  // namespace kreg::layernorm

KREG_GROUP("layernorm", kreg::layernorm::kOps);
