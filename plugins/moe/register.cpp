// The moe group's ops, registered by op (kreg/plugin.hpp). docs/ops/moe.md has the full
// contract.
#include "moe.hpp"

namespace kreg::moe {
namespace {

constexpr Op kOps[] = {
    {.signature =
         "sum(Tensor[T,K,H] x, Tensor(a!)[T,H] out, float routed_scaling_factor=1.0) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Expert-output sum: out[t,h] = round((sum over j = 0..K-1 of x[t,j,h]) * "
                    "routed_scaling_factor): fp32 sum in index order, one rounding at the store; "
                    "out must not overlap x; CUDA: one thread per 16-byte output vector, K loads "
                    "in flight",
     .impls = {cpu(bind<&sum_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&sum_cuda>, "sum.cu"))}},
    {.signature = "topk_softmax(Tensor[T,E] gating, Tensor?<f32>[E] correction_bias, "
                  "Tensor<f32>(a!)[T,K] out_weights, Tensor<i32>(b!)[T,K] out_ids, bool "
                  "renormalize=false, float softcapping=0.0) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Softmax routing, E <= 512, 1 <= K <= E. l = float(gating), l = c*tanh(l/c) if "
                    "softcapping c > 0; weights = softmax(l) of the K experts with the largest "
                    "selection keys, key = l + correction_bias when given (the bias steers "
                    "SELECTION only; the weights come from the unbiased softmax) else l; picks in "
                    "descending key order, ties to the lower index; renormalize divides the K "
                    "weights by their fp32 sum; CPU: fp32; CUDA: one warp per token, logits in "
                    "registers",
     .impls = {cpu(bind<&topk_softmax_cpu>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&topk_softmax_cuda>, "routing.cu"),
                   cuda_jit(bind<&topk_softmax_jit>, "topk_softmax_jit.cpp", &kTopkSoftmaxJit)
                       .describe("JIT: compiled for the call's E, K and dtype; the CUDA kernel's "
                                 "ids and weights bit for bit; E a power of two of at least one "
                                 "16-byte vector and at most 512, K <= 32 and 16-byte aligned "
                                 "gating and correction_bias, else the CUDA kernel runs"))}},
    {.signature = "grouped_topk(Tensor[T,E] gating, Tensor<f32>[E] correction_bias, "
                  "Tensor<f32>(a!)[T,K] out_weights, Tensor<i32>(b!)[T,K] out_ids, int n_group, "
                  "int topk_group, bool renormalize=true, float routed_scaling_factor=1.0) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "DeepSeek-V3 group-limited routing: s = sigmoid(gating), b = s + "
                    "correction_bias; E experts in n_group (<= 32) equal groups, group score = sum "
                    "of its top-2 b (the one b for 1-expert groups); the topk_group best groups "
                    "are kept (ties to the lower group); the K experts with the largest b among "
                    "them, descending, ties to the lower index; weights = s of the picks, divided "
                    "by their fp32 sum if renormalize, times routed_scaling_factor; CPU: fp32; "
                    "CUDA: one warp per token, logits in registers",
     .impls = {cpu(bind<&grouped_topk_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&grouped_topk_cuda>, "routing.cu"))}},
    {.signature = "route(Tensor[T,E] gating, Tensor?<f32>[E] correction_bias, Tensor<f32>(a!)[T,K] "
                  "out_weights, Tensor<i32>(b!)[T,K] out_ids, str method=\"Default\", int "
                  "n_group=1, int topk_group=1, float routed_scaling_factor=1.0) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Routing by method (l = float(gating), picks = top-K by key, descending, ties "
                    "to the lower index; every weight is finally times routed_scaling_factor): "
                    "Default: key l, w = softmax(l); Renormalize: key l, w = softmax over the K "
                    "picked logits; DeepSeekV3: as moe.grouped_topk with n_group/topk_group, "
                    "renormalized; Llama4 (K = 1): key l, w = sigmoid(l); RenormalizeNaive: key l, "
                    "w = softmax(l) / its sum over the picks; TopK: key l, w = l; SigmoidRenorm: "
                    "key l, w = sigmoid(l) / its sum over the picks; MiniMax2: key sigmoid(l) + "
                    "correction_bias, w = sigmoid(l) / its sum over the picks; Sigmoid: key l, w = "
                    "sigmoid(l). correction_bias (optional) is required by DeepSeekV3 and "
                    "MiniMax2, ignored by the others; n_group/topk_group by DeepSeekV3 only. An "
                    "unknown method is an error listing the valid ones; CPU: fp32; CUDA: one warp "
                    "per token, logits in registers",
     .impls = {cpu(bind<&route_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&route_cuda>, "routing.cu"))}},
    {.signature = "align_block_size(Tensor<i32>[T,K] topk_ids, Tensor<i32>(a!)[P] "
                  "out_sorted_token_ids, Tensor<i32>(b!)[B] out_expert_ids, Tensor<i32>(c!)[1] "
                  "out_num_tokens_post_pad, int num_experts, int block_size, bool "
                  "ignore_invalid=false) -> ()",
     .dtypes = "i32",
     .description = "Sorts the N = T*K token slots (flat indices into topk_ids) by expert: expert "
                    "e's slots, in increasing order, fill a segment padded with the sentinel N to "
                    "a multiple of block_size; segments follow in expert order; out_expert_ids[b] "
                    "= the expert of block b, -1 past the used blocks; the rest of "
                    "out_sorted_token_ids is the sentinel; out_num_tokens_post_pad = the padded "
                    "total. Needs P >= N + num_experts*(block_size-1), B >= ceil(that / "
                    "block_size), num_experts <= 2048. Ids outside [0, num_experts): skipped with "
                    "ignore_invalid, else an error on CPU and skipped too on CUDA (a kernel cannot "
                    "fail after launch without a synchronization); CUDA: per-warp shared "
                    "histograms, sentinel fill first, one block scan of the padded counts; one "
                    "block up to 4096 slots, else count and scatter kernels over <= 128 chunks "
                    "(a workspace of 4*E*chunks bytes)",
     .impls = {cpu(bind<&align_block_size_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&align_block_size_cuda>, "align.cu"))}},
};

}  // namespace
}  // namespace kreg::moe

KREG_GROUP("moe", kreg::moe::kOps);
