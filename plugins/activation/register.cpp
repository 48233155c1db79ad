// The activation group's implementations, listed as data.
#include "activation.hpp"

namespace kreg::activation {
namespace {

constexpr const char* kSiluAndMul = "silu_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()";
constexpr const char* kGeluAndMul = "gelu_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()";
constexpr const char* kGeluTanhAndMul =
    "gelu_tanh_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()";
constexpr const char* kDtypes = "bf16|f16|f32";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

constexpr KernelDef kKernels[] = {
    {.op = "activation.silu_and_mul",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kSiluAndMul,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "SiLU-gated product reference: silu(x[:, :D]) * x[:, D:], fp32 math",
     .impl = bind<&silu_and_mul_cpu>,
     .source = "reference.cpp"},
    {.op = "activation.gelu_and_mul",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kGeluAndMul,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "Exact (erf) GELU-gated product reference: gelu(x[:, :D]) * x[:, D:]",
     .impl = bind<&gelu_and_mul_cpu>,
     .source = "reference.cpp"},
    {.op = "activation.gelu_tanh_and_mul",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kGeluTanhAndMul,
     .dtypes = kDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "Tanh-approximated GELU-gated product reference: gelu_tanh(x[:, :D]) * "
                    "x[:, D:]",
     .impl = bind<&gelu_tanh_and_mul_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "activation.silu_and_mul",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kSiluAndMul,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "SiLU-gated product, grid-stride over 16-byte vectors of both halves",
     .impl = bind<&silu_and_mul_cuda>,
     .source = "act_and_mul.cu"},
    {.op = "activation.gelu_and_mul",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kGeluAndMul,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Exact (erf) GELU-gated product, grid-stride over 16-byte vectors",
     .impl = bind<&gelu_and_mul_cuda>,
     .source = "act_and_mul.cu"},
    {.op = "activation.gelu_tanh_and_mul",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kGeluTanhAndMul,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Tanh-approximated GELU-gated product, grid-stride over 16-byte vectors",
     .impl = bind<&gelu_tanh_and_mul_cuda>,
     .source = "act_and_mul.cu"},
#endif
};

}  // namespace
}  // namespace kreg::activation

KREG_PLUGIN("activation", "0.1.0", kreg::activation::kKernels);
