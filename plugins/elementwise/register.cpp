// The elementwise group's ops, registered by op (kreg/plugin.hpp). The descriptions state
// each contract; docs/ops/elementwise.md has the details.
#include "elementwise.hpp"

namespace kreg::elementwise {
namespace {

constexpr Op kOps[] = {
    {.signature = "softcap(Tensor[T,H] x, Tensor(a!)[T,H] out, float cap) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Logit soft-capping (Gemma 2): out = cap * tanh(x * (1/cap)), cap a finite "
                    "fp32 > 0; fp32 math (tanhf, saturating to +-cap), one rounding; out may "
                    "alias x. CUDA: one thread per 16-byte vector, evict-first, PDL.",
     .impls = {cpu(bind<&softcap_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&softcap_cuda>, "elementwise.cu"))}},
    {.signature = "sigmoid_gate_mul(Tensor[T,H] x, Tensor[T,H] gate, Tensor(a!)[T,H] out) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Sigmoid-gated product: out = x * sigmoid(gate) = x / (1 + exp(-gate)); "
                    "fp32 math, one rounding; out may alias x or gate. CUDA: one thread per "
                    "16-byte vector of both inputs, evict-first, PDL.",
     .impls = {cpu(bind<&sigmoid_gate_mul_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&sigmoid_gate_mul_cuda>, "elementwise.cu"))}},
    {.signature = "add_constant(Tensor[T,H] x, Tensor(a!)[T,H] out, float c) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "out = x + c (SGLang's JIT example kernel), c a finite fp32; fp32 math, "
                    "one rounding; out may alias x. CUDA: one thread per 16-byte vector, "
                    "evict-first, PDL.",
     .impls = {cpu(bind<&add_constant_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&add_constant_cuda>, "add_constant.cu"))}},
};

}  // namespace
}  // namespace kreg::elementwise

KREG_GROUP("elementwise", kreg::elementwise::kOps);
