// The diffusion group's implementations, listed as data. The descriptions state each
// op's contract; docs/ops/diffusion.md has the details.
#include "diffusion.hpp"

namespace kreg::diffusion {
namespace {

constexpr const char* kResidualGateAdd =
    "residual_gate_add(Tensor[B,S,H] residual, Tensor[B,S,H] x, Tensor gate, "
    "Tensor(a!)[B,S,H] out) -> ()";
constexpr const char* kDtypes = "bf16|f16|f32";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

constexpr const char* kResidualGateAddContract =
    "out = residual + gate * x; residual, x, out [B,S,H]; gate [B,H] (broadcast over S) or "
    "[B,S,H]; one dtype (bf16/f16/f32), fp32 math, one rounding; out may alias residual or x";

constexpr KernelDef kKernels[] = {
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
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "diffusion.residual_gate_add",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kResidualGateAdd,
     .dtypes = kDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Gated residual add, one thread per 16-byte vector, broadcast gate indexed "
                    "through multiply-high dividers. Same contract as the cpu reference.",
     .impl = bind<&residual_gate_add_cuda>,
     .source = "residual_gate_add.cu"},
#endif
};

}  // namespace
}  // namespace kreg::diffusion

KREG_PLUGIN("diffusion", "0.1.0", kreg::diffusion::kKernels);
