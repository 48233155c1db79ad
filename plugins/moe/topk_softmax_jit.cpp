// The JIT moe.topk_softmax implementation (docs/jit.md): its source, embedded from
// jit/topk_softmax.cu.jit and jit/topk_softmax_config.h at build time, and the host
// launcher, which launches the kernel the core compiled for the call's E, K and dtype
// (ctx.jit_kernel()), or hands the call to the AOT kernel (routing.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "jit/topk_softmax_config.h"
#include "kreg/device/jit_launch.hpp"
#include "kreg/device/launch.cuh"
#include "moe.hpp"
#include "moe_jit_sources.h"  // generated (kreg_embed_jit_sources)
#include "routing.hpp"

namespace kreg::moe {
namespace {

constexpr kreg_jit_file kHeaders[] = {
    {"kreg_jit/prelude.cuh", kreg_jit_text::prelude_cuh},
    {"topk_softmax_config.h", kreg_jit_text::topk_softmax_config_h},
};

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

constexpr kreg_jit_desc kTopkSoftmaxJit{sizeof(kreg_jit_desc),
                                        "topk_softmax.cu.jit",
                                        kreg_jit_text::topk_softmax_cu_jit,
                                        kHeaders,
                                        sizeof(kHeaders) / sizeof(kHeaders[0]),
                                        0,
                                        "kreg_jit::topk_softmax<{E}, {K}, kreg_jit::{dtype}>",
                                        "E,K,dtype",
                                        ""};

// The JIT kernel takes E a power of two from one 16-byte vector up to 512 experts and
// K <= 32 (topk_config): then every lane holds whole vectors of one token, the same
// experts as in the AOT kernel, and the K rounds unroll. The AOT kernel serves the rest
// (E = 384 or 160: a ragged last chunk the JIT layout has no slots for; E below a vector;
// K > 32, whose unrolled rounds would cost compile time for shapes no router uses), and
// views whose gating or correction_bias is not 16-byte aligned (the JIT kernel reads both
// as 16-byte vectors; the AOT kernel narrows its vectors to the alignment).
KernelStatus topk_softmax_jit(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                              DLTensor& out_weights, DLTensor& out_ids, bool renormalize,
                              double softcapping) {
  const auto cfg =
      kreg_jit::topk_config(gating.shape[1], out_weights.shape[1], gating.dtype.bits / 8);
  const void* g = data_ptr<const void>(gating);
  const void* bias = correction_bias != nullptr ? data_ptr<const void>(*correction_bias) : nullptr;
  if (!cfg.ok || !aligned16(g) || (bias != nullptr && !aligned16(bias))) {
    return topk_softmax_cuda(ctx, gating, correction_bias, out_weights, out_ids, renormalize,
                             softcapping);
  }
  // The same checks, and the same messages, as the AOT kernel and the CPU reference.
  RoutingParams p;
  if (KernelStatus st = topk_softmax_params(ctx, gating, correction_bias, out_weights, renormalize,
                                            softcapping, p);
      !st.ok()) {
    return st;
  }
  if (p.tokens == 0) return kOk;
  const device::DeviceGuard guard(gating);
  if (!guard.ok()) return guard.fail(ctx, ctx.op());
  // p.tokens <= INT32_MAX / 2 (topk_softmax_params): the grid fits.
  const auto blocks = static_cast<unsigned>((p.tokens + cfg.rows - 1) / cfg.rows);
  float* w = data_ptr<float>(out_weights);
  int32_t* ids = data_ptr<int32_t>(out_ids);
  long long n = p.tokens;
  float cap = p.softcap;
  int renorm = p.renormalize ? 1 : 0;
  void* args[] = {&g, &bias, &w, &ids, &n, &cap, &renorm};
  return device::jit_launch(ctx, dim3(blocks), dim3(kreg_jit::kTopkThreads), 0, args);
}

}  // namespace kreg::moe
