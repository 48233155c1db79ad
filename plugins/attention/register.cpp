// The attention group's ops, registered by op (kreg/plugin.hpp).
#include "attention.hpp"

namespace kreg::attention {
namespace {

constexpr Op kOps[] = {
    {.signature = "concat_mla_k(Tensor[T,H,128] k_nope, Tensor[T,1,64] k_rope, "
                  "Tensor(a!)[T,H,192] out) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "MLA key concat: out[t, h] = concat(k_nope[t, h], k_rope[t, 0]) (128 + 64 = "
                    "192), a copy; CUDA: one 16-byte vector per thread, 192-element output rows, "
                    "k_rope broadcast from L1/L2",
     .impls = {cpu(bind<&concat_mla_k_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&concat_mla_k_cuda>, "concat_mla_k.cu"))}},
    {.signature = "mrope_interleave(Tensor[3,S,D] x, Tensor(a!)[S,D] out, int section_t=24, "
                  "int section_h=20, int section_w=20) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Interleaved M-RoPE merge: out[s, i] = x[1, s, i] if i % 3 == 1 and i < 3 * "
                    "section_h, x[2, s, i] if i % 3 == 2 and i < 3 * section_w, else x[0, s, i] "
                    "(mrope_section = [section_t, section_h, section_w], attributes); CUDA: one "
                    "output vector per thread, streams 1 and 2 read only where their interleaved "
                    "range reaches",
     .impls = {cpu(bind<&mrope_interleave_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&mrope_interleave_cuda>, "mrope_interleave.cu"))}},
    {.signature = "rope(Tensor(a!)[T,Hq,D] q, Tensor(b!)[T,Hk,D] k, Tensor<f32>[P,R] "
                  "cos_sin_cache, Tensor<i32|i64>[T] positions, bool is_neox=true) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Rotary embedding, in place on q and k: the first R = cos_sin_cache.shape[1] "
                    "elements of each head rotated by cache row positions[t] (cos half, then sin "
                    "half), NeoX or GPT-J pairs; a position outside the cache is an OUT_OF_RANGE "
                    "error on CPU, and leaves its token unrotated on CUDA (no read outside it); "
                    "CUDA: one thread per 16-byte chunk of pairs",
     .impls = {cpu(bind<&rope_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&rope_cuda>, "rope.cu"))}},
    {.signature = "fused_qk_norm_rope(Tensor(a!)[T,W] qkv, Tensor[Dh] q_weight, Tensor[Dh] "
                  "k_weight, Tensor<i32|i64>[T] positions, int num_heads_q=32, int num_heads_k=8, "
                  "int num_heads_v=8, int head_dim=128, float eps=1e-6, float base=10000.0, bool "
                  "is_neox=true) -> ()",
     .dtypes = "bf16|f16",
     .description = "In place on packed qkv: per-head RMSNorm of q and k heads (q_weight, "
                    "k_weight), then full-head rope with inv_freq = base^(-2i/head_dim) in fp32, "
                    "NeoX or GPT-J; v untouched; head_dim 64/128/256; CUDA: one block per token, "
                    "one warp per head, cos/sin computed once per token in shared memory",
     .impls = {cpu(bind<&fused_qk_norm_rope_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&fused_qk_norm_rope_cuda>, "fused_qk_norm_rope.cu"))}},
    {.signature = "decode(Tensor[B,Hq,D] q, Tensor[N,P,Hk,D] k_cache, Tensor[N,P,Hk,D] v_cache, "
                  "Tensor<i32>[B,M] block_table, Tensor<i32>[B] seq_lens, Tensor(a!)[B,Hq,D] "
                  "out, float scale) -> ()",
     .dtypes = "bf16|f16",
     .description = "Paged decode attention (GQA): out[b, h] = softmax(scale q k^T) v over the "
                    "first seq_lens[b] tokens of the pages block_table[b]; an empty sequence "
                    "gives zeros; out-of-range lengths or pages are OUT_OF_RANGE errors; CUDA: "
                    "flash-decoding on tensor cores, blocks of (split, kv head, up to 8 query "
                    "heads, batch) stream K/V pages once per GQA group through per-warp cp.async "
                    "pipelines into mma.sync QK^T and PV, partial max/sum/output per split in a "
                    "stream-ordered workspace, log-sum-exp merge",
     // cp.async, ldmatrix, mma.sync on bf16 and movmatrix: sm_80 and newer.
     .impls = {cpu(bind<&decode_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&decode_cuda>, "decode.cu").sm(80))}},
};

}  // namespace
}  // namespace kreg::attention

KREG_GROUP("attention", kreg::attention::kOps);
