// The activation group: gated activations act(x[:, :D]) * x[:, D:] for SiLU, exact GELU
// and tanh-approximated GELU. docs/kernels.md states the exact contract of each op.
//
// Every function trusts its frame: the core has checked dtypes (x and out share one of
// bf16/f16/f32), ranks, the named dimensions (x is [T, 2*D], out is [T, D]), device and
// contiguity.
#pragma once

#include "kreg/plugin.hpp"

namespace kreg::activation {

// Which activation gates the product; each op binds one instantiation
// (act_and_mul_cpu<Act::kSilu> serves activation.silu_and_mul).
enum class Act { kSilu, kGelu, kGeluTanh };

// CPU references (reference.cpp), instantiated there for every Act.
template <Act A>
KernelStatus act_and_mul_cpu(Context& ctx, const DLTensor& x, DLTensor& out);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (act_and_mul.cu), instantiated there for every Act. They enqueue on
// ctx.stream() and return without waiting.
template <Act A>
KernelStatus act_and_mul_cuda(Context& ctx, const DLTensor& x, DLTensor& out);
#endif

}  // namespace kreg::activation
