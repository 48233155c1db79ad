// The moe group: expert routing (topk_softmax, grouped_topk, route), the token-slot sort
// that feeds grouped GEMMs (align_block_size) and the weighted expert-output sum (sum).
// docs/ops/moe.md states the exact contract of each op.
//
// Every function trusts its frame: the core has checked dtypes, ranks, the named
// dimensions, device and contiguity against the signature in register.cpp. What a
// signature cannot express (k <= E, attribute ranges, the method name) is checked by the
// shared host code in routing.cpp, identically for both backends.
#pragma once

#include <string_view>

#include "kreg/plugin.hpp"

namespace kreg::moe {

// CPU references (reference.cpp).
KernelStatus sum_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double routed_scaling_factor);
KernelStatus topk_softmax_cpu(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                              DLTensor& out_weights, DLTensor& out_ids, bool renormalize,
                              double softcapping);
KernelStatus grouped_topk_cpu(Context& ctx, const DLTensor& gating, const DLTensor& correction_bias,
                              DLTensor& out_weights, DLTensor& out_ids, int64_t n_group,
                              int64_t topk_group, bool renormalize, double routed_scaling_factor);
KernelStatus route_cpu(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                       DLTensor& out_weights, DLTensor& out_ids, std::string_view method,
                       int64_t n_group, int64_t topk_group, double routed_scaling_factor);
KernelStatus align_block_size_cpu(Context& ctx, const DLTensor& topk_ids,
                                  DLTensor& out_sorted_token_ids, DLTensor& out_expert_ids,
                                  DLTensor& out_num_tokens_post_pad, int64_t num_experts,
                                  int64_t block_size, bool ignore_invalid);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels. They enqueue on ctx.stream() and return without waiting.
KernelStatus sum_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                      double routed_scaling_factor);  // sum.cu
// routing.cu
KernelStatus topk_softmax_cuda(Context& ctx, const DLTensor& gating,
                               const DLTensor* correction_bias, DLTensor& out_weights,
                               DLTensor& out_ids, bool renormalize, double softcapping);
KernelStatus grouped_topk_cuda(Context& ctx, const DLTensor& gating,
                               const DLTensor& correction_bias, DLTensor& out_weights,
                               DLTensor& out_ids, int64_t n_group, int64_t topk_group,
                               bool renormalize, double routed_scaling_factor);
KernelStatus route_cuda(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                        DLTensor& out_weights, DLTensor& out_ids, std::string_view method,
                        int64_t n_group, int64_t topk_group, double routed_scaling_factor);
// align.cu
KernelStatus align_block_size_cuda(Context& ctx, const DLTensor& topk_ids,
                                   DLTensor& out_sorted_token_ids, DLTensor& out_expert_ids,
                                   DLTensor& out_num_tokens_post_pad, int64_t num_experts,
                                   int64_t block_size, bool ignore_invalid);
// JIT (topk_softmax_jit.cpp; docs/jit.md): the source the core compiles for the call's E,
// K and dtype, and its launcher (which hands the shapes it does not take to
// topk_softmax_cuda).
extern const kreg_jit_desc kTopkSoftmaxJit;
KernelStatus topk_softmax_jit(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                              DLTensor& out_weights, DLTensor& out_ids, bool renormalize,
                              double softcapping);
#endif

}  // namespace kreg::moe
