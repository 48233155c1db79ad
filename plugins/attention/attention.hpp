// The attention group: rotary embeddings (cos/sin cache and fused qk-norm + rope),
// interleaved M-RoPE merge, the MLA key concat and paged decode attention.
// docs/ops/attention.md states the exact contract of each op.
//
// Every function trusts its frame: the core has checked dtypes, ranks, the named
// dimensions, device and contiguity. What a signature cannot express (attribute ranges,
// head counts that must agree with a packed width, supported head sizes) is checked here.
#pragma once

#include "kreg/plugin.hpp"

namespace kreg::attention {

// CPU references (reference.cpp).
KernelStatus concat_mla_k_cpu(Context& ctx, const DLTensor& k_nope, const DLTensor& k_rope,
                              DLTensor& out);
KernelStatus mrope_interleave_cpu(Context& ctx, const DLTensor& x, DLTensor& out, int64_t section_t,
                                  int64_t section_h, int64_t section_w);
KernelStatus rope_cpu(Context& ctx, DLTensor& q, DLTensor& k, const DLTensor& cos_sin_cache,
                      const DLTensor& positions, bool is_neox);
KernelStatus fused_qk_norm_rope_cpu(Context& ctx, DLTensor& qkv, const DLTensor& q_weight,
                                    const DLTensor& k_weight, const DLTensor& positions,
                                    int64_t num_heads_q, int64_t num_heads_k, int64_t num_heads_v,
                                    int64_t head_dim, double eps, double base, bool is_neox);
KernelStatus decode_cpu(Context& ctx, const DLTensor& q, const DLTensor& k_cache,
                        const DLTensor& v_cache, const DLTensor& block_table,
                        const DLTensor& seq_lens, DLTensor& out, double scale);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels. They enqueue on ctx.stream() and return without waiting.
KernelStatus concat_mla_k_cuda(Context& ctx, const DLTensor& k_nope, const DLTensor& k_rope,
                               DLTensor& out);
KernelStatus mrope_interleave_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                   int64_t section_t, int64_t section_h, int64_t section_w);
KernelStatus rope_cuda(Context& ctx, DLTensor& q, DLTensor& k, const DLTensor& cos_sin_cache,
                       const DLTensor& positions, bool is_neox);
KernelStatus fused_qk_norm_rope_cuda(Context& ctx, DLTensor& qkv, const DLTensor& q_weight,
                                     const DLTensor& k_weight, const DLTensor& positions,
                                     int64_t num_heads_q, int64_t num_heads_k, int64_t num_heads_v,
                                     int64_t head_dim, double eps, double base, bool is_neox);
KernelStatus decode_cuda(Context& ctx, const DLTensor& q, const DLTensor& k_cache,
                         const DLTensor& v_cache, const DLTensor& block_table,
                         const DLTensor& seq_lens, DLTensor& out, double scale);
#endif

}  // namespace kreg::attention
