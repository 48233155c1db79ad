// The layernorm group: RMSNorm, its fused residual-add form and the Gemma variants
// (weight used as 1 + weight). docs/kernels.md states the exact contract of each op.
//
// Every function trusts its frame: the core has checked dtypes (all tensors share one of
// bf16/f16/f32), ranks, the named dimensions T and H, device and contiguity.
#pragma once

#include "kreg/plugin.hpp"

namespace kreg::layernorm {

// CPU references (reference.cpp).
KernelStatus rmsnorm_cpu(Context& ctx, const DLTensor& x, const DLTensor& weight, DLTensor& out,
                         double eps);
KernelStatus gemma_rmsnorm_cpu(Context& ctx, const DLTensor& x, const DLTensor& weight,
                               DLTensor& out, double eps);
KernelStatus fused_add_rmsnorm_cpu(Context& ctx, DLTensor& x, DLTensor& residual,
                                   const DLTensor& weight, double eps);
KernelStatus gemma_fused_add_rmsnorm_cpu(Context& ctx, DLTensor& x, DLTensor& residual,
                                         const DLTensor& weight, double eps);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (rmsnorm.cu). They enqueue on ctx.stream() and return without waiting.
KernelStatus rmsnorm_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight, DLTensor& out,
                          double eps);
KernelStatus gemma_rmsnorm_cuda(Context& ctx, const DLTensor& x, const DLTensor& weight,
                                DLTensor& out, double eps);
KernelStatus fused_add_rmsnorm_cuda(Context& ctx, DLTensor& x, DLTensor& residual,
                                    const DLTensor& weight, double eps);
KernelStatus gemma_fused_add_rmsnorm_cuda(Context& ctx, DLTensor& x, DLTensor& residual,
                                          const DLTensor& weight, double eps);

// JIT implementations (rmsnorm_jit.cpp; docs/jit.md): the source the core compiles for the
// call's H and dtype, and the launchers. Views whose base pointers are not 16-byte aligned
// take the AOT kernels above.
extern const kreg_jit_desc kRmsnormJit;
extern const kreg_jit_desc kGemmaRmsnormJit;
extern const kreg_jit_desc kFusedAddRmsnormJit;
extern const kreg_jit_desc kGemmaFusedAddRmsnormJit;
KernelStatus rmsnorm_jit(Context& ctx, const DLTensor& x, const DLTensor& weight, DLTensor& out,
                         double eps);
KernelStatus gemma_rmsnorm_jit(Context& ctx, const DLTensor& x, const DLTensor& weight,
                               DLTensor& out, double eps);
KernelStatus fused_add_rmsnorm_jit(Context& ctx, DLTensor& x, DLTensor& residual,
                                   const DLTensor& weight, double eps);
KernelStatus gemma_fused_add_rmsnorm_jit(Context& ctx, DLTensor& x, DLTensor& residual,
                                         const DLTensor& weight, double eps);
#endif

}  // namespace kreg::layernorm
