// The activation group's ops, registered by op (kreg/plugin.hpp).
#include "activation.hpp"

namespace kreg::activation {
namespace {

constexpr Op kOps[] = {
    {.signature = "silu_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "SiLU-gated product: silu(x[:, :D]) * x[:, D:], fp32 math; CUDA: "
                    "grid-stride over 16-byte vectors of both halves",
     .impls = {cpu(bind<&act_and_mul_cpu<Act::kSilu>>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&act_and_mul_cuda<Act::kSilu>>, "act_and_mul.cu"))}},
    {.signature = "gelu_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Exact (erf) GELU-gated product: gelu(x[:, :D]) * x[:, D:]; CUDA: "
                    "grid-stride over 16-byte vectors",
     .impls = {cpu(bind<&act_and_mul_cpu<Act::kGelu>>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&act_and_mul_cuda<Act::kGelu>>, "act_and_mul.cu"))}},
    {.signature = "gelu_tanh_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Tanh-approximated GELU-gated product: gelu_tanh(x[:, :D]) * x[:, D:]; "
                    "CUDA: grid-stride over 16-byte vectors",
     .impls = {cpu(bind<&act_and_mul_cpu<Act::kGeluTanh>>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&act_and_mul_cuda<Act::kGeluTanh>>, "act_and_mul.cu"))}},
};

}  // namespace
}  // namespace kreg::activation

KREG_GROUP("activation", kreg::activation::kOps);
