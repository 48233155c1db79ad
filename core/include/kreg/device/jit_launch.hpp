// Host side of a JIT implementation (docs/jit.md): launching the kernel the core compiled
// for this call (ctx.jit_kernel(), a CUkernel, which the runtime takes as a cudaKernel_t
// cast to a pointer) on the call's stream, with programmatic dependent launch when the
// caller asks for it. Through the CUDA runtime, like every other launch in a plugin: the
// plugin links no driver library and loads on machines without a GPU.
#pragma once

#include <cuda_runtime.h>

#include "kreg/plugin.hpp"

namespace kreg::device {

// Launches ctx.jit_kernel() with `args` (pointers to each kernel argument, in order).
inline KernelStatus jit_launch(Context& ctx, dim3 grid, dim3 block, unsigned smem, void** args) {
  const void* kernel = ctx.jit_kernel();
  if (kernel == nullptr) {
    return ctx.fail(KREG_FAILED_PRECONDITION,
                    "%s: no compiled JIT kernel in the call frame (a core older than ABI 1.3?)",
                    ctx.op());
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = static_cast<cudaStream_t>(ctx.stream());
  cudaLaunchAttribute attr{};
  if (ctx.pdl()) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  const cudaError_t rc = cudaLaunchKernelExC(&cfg, kernel, args);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // returned, not left for a later check
    return ctx.fail(KREG_INTERNAL, "%s: launching the JIT kernel failed: %s", ctx.op(),
                    cudaGetErrorString(rc));
  }
  return kOk;
}

}  // namespace kreg::device
