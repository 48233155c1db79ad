// The attention group's implementations, listed as data.
#include "attention.hpp"

namespace kreg::attention {
namespace {

constexpr const char* kConcatMlaK =
    "concat_mla_k(Tensor[T,H,128] k_nope, Tensor[T,1,64] k_rope, Tensor(a!)[T,H,192] out) -> ()";
constexpr const char* kMropeInterleave =
    "mrope_interleave(Tensor[3,S,D] x, Tensor(a!)[S,D] out, int section_t=24, "
    "int section_h=20, int section_w=20) -> ()";
constexpr const char* kRope =
    "rope(Tensor(a!)[T,Hq,D] q, Tensor(b!)[T,Hk,D] k, Tensor<f32>[P,R] cos_sin_cache, "
    "Tensor<i32|i64>[T] positions, bool is_neox=true) -> ()";
constexpr const char* kFusedQkNormRope =
    "fused_qk_norm_rope(Tensor(a!)[T,W] qkv, Tensor[Dh] q_weight, Tensor[Dh] k_weight, "
    "Tensor<i32|i64>[T] positions, int num_heads_q=32, int num_heads_k=8, int num_heads_v=8, "
    "int head_dim=128, float eps=1e-6, float base=10000.0, bool is_neox=true) -> ()";
constexpr const char* kDecode =
    "decode(Tensor[B,Hq,D] q, Tensor[N,P,Hk,D] k_cache, Tensor[N,P,Hk,D] v_cache, "
    "Tensor<i32>[B,M] block_table, Tensor<i32>[B] seq_lens, Tensor(a!)[B,Hq,D] out, "
    "float scale) -> ()";

constexpr const char* kAllFloat = "bf16|f16|f32";
constexpr const char* kHalfFloat = "bf16|f16";

// decode's pipeline uses cp.async (sm_80 and newer).
constexpr kreg_capability kCudaSm80Plus[] = {{kDLCUDA, 80, 121}};

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

constexpr KernelDef kKernels[] = {
    {.op = "attention.concat_mla_k",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kConcatMlaK,
     .dtypes = kAllFloat,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "MLA key concat reference: out[t, h] = concat(k_nope[t, h], k_rope[t, 0]) "
                    "(128 + 64 = 192), a copy",
     .impl = bind<&concat_mla_k_cpu>,
     .source = "reference.cpp"},
    {.op = "attention.mrope_interleave",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kMropeInterleave,
     .dtypes = kAllFloat,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "Interleaved M-RoPE merge reference: out[s, i] = x[1, s, i] if i % 3 == 1 "
                    "and i < 3 * section_h, x[2, s, i] if i % 3 == 2 and i < 3 * section_w, else "
                    "x[0, s, i] (mrope_section = [section_t, section_h, section_w], attributes)",
     .impl = bind<&mrope_interleave_cpu>,
     .source = "reference.cpp"},
    {.op = "attention.rope",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kRope,
     .dtypes = kAllFloat,
     .traits = kCpuTraits | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = "Rotary embedding reference, in place on q and k: the first R = "
                    "cos_sin_cache.shape[1] elements of each head rotated by cache row "
                    "positions[t] (cos half, then sin half), NeoX or GPT-J pairs; a position "
                    "outside the cache is an OUT_OF_RANGE error",
     .impl = bind<&rope_cpu>,
     .source = "reference.cpp"},
    {.op = "attention.fused_qk_norm_rope",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kFusedQkNormRope,
     .dtypes = kHalfFloat,
     .traits = kCpuTraits | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = "In place on packed qkv: per-head RMSNorm of q and k heads (q_weight, "
                    "k_weight), then full-head rope with inv_freq = base^(-2i/head_dim) in fp32, "
                    "NeoX or GPT-J; v untouched; head_dim 64/128/256",
     .impl = bind<&fused_qk_norm_rope_cpu>,
     .source = "reference.cpp"},
    {.op = "attention.decode",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kDecode,
     .dtypes = kHalfFloat,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "Paged decode attention reference (GQA): out[b, h] = softmax(scale q k^T) v "
                    "over the first seq_lens[b] tokens of the pages block_table[b]; an empty "
                    "sequence gives zeros; out-of-range lengths or pages are OUT_OF_RANGE errors",
     .impl = bind<&decode_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "attention.concat_mla_k",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kConcatMlaK,
     .dtypes = kAllFloat,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "MLA key concat: one 16-byte vector per thread, 192-element output rows, "
                    "k_rope broadcast from L1/L2",
     .impl = bind<&concat_mla_k_cuda>,
     .source = "concat_mla_k.cu"},
    {.op = "attention.mrope_interleave",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kMropeInterleave,
     .dtypes = kAllFloat,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Interleaved M-RoPE merge: one output vector per thread, streams 1 and 2 "
                    "read only where their interleaved range reaches",
     .impl = bind<&mrope_interleave_cuda>,
     .source = "mrope_interleave.cu"},
    {.op = "attention.rope",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kRope,
     .dtypes = kAllFloat,
     .traits = kCudaTraits | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = "Rotary embedding in place: one thread per 16-byte chunk of pairs; a "
                    "position outside the cache leaves its token unrotated (no read outside it)",
     .impl = bind<&rope_cuda>,
     .source = "rope.cu"},
    {.op = "attention.fused_qk_norm_rope",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kFusedQkNormRope,
     .dtypes = kHalfFloat,
     .traits = kCudaTraits | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = "Fused per-head q/k RMSNorm + rope in place: one block per token, one warp "
                    "per head, cos/sin computed once per token in shared memory",
     .impl = bind<&fused_qk_norm_rope_cuda>,
     .source = "fused_qk_norm_rope.cu"},
    {.op = "attention.decode",
     .backend = "cuda",
     .caps = kCudaSm80Plus,
     .signature = kDecode,
     .dtypes = kHalfFloat,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Paged decode attention, flash-decoding: blocks of (split, kv head, batch) "
                    "stream K/V pages once per GQA group through a cp.async pipeline, partial "
                    "max/sum/output per split in a stream-ordered workspace, log-sum-exp merge",
     .impl = bind<&decode_cuda>,
     .source = "decode.cu"},
#endif
};

}  // namespace
}  // namespace kreg::attention

KREG_PLUGIN("attention", "0.1.0", kreg::attention::kKernels);
