// The moe group's implementations, listed as data. docs/ops/moe.md has the full contract.
#include "moe.hpp"

namespace kreg::moe {
namespace {

constexpr const char* kSum =
    "sum(Tensor[T,K,H] x, Tensor(a!)[T,H] out, float routed_scaling_factor=1.0) -> ()";
constexpr const char* kTopkSoftmax =
    "topk_softmax(Tensor[T,E] gating, Tensor?<f32>[E] correction_bias, "
    "Tensor<f32>(a!)[T,K] out_weights, Tensor<i32>(b!)[T,K] out_ids, bool renormalize=false, "
    "float softcapping=0.0) -> ()";
constexpr const char* kGroupedTopk =
    "grouped_topk(Tensor[T,E] gating, Tensor<f32>[E] correction_bias, "
    "Tensor<f32>(a!)[T,K] out_weights, Tensor<i32>(b!)[T,K] out_ids, int n_group, "
    "int topk_group, bool renormalize=true, float routed_scaling_factor=1.0) -> ()";
constexpr const char* kRoute =
    "route(Tensor[T,E] gating, Tensor?<f32>[E] correction_bias, Tensor<f32>(a!)[T,K] out_weights, "
    "Tensor<i32>(b!)[T,K] out_ids, str method=\"Default\", int n_group=1, int topk_group=1, "
    "float routed_scaling_factor=1.0) -> ()";
constexpr const char* kAlign =
    "align_block_size(Tensor<i32>[T,K] topk_ids, Tensor<i32>(a!)[P] out_sorted_token_ids, "
    "Tensor<i32>(b!)[B] out_expert_ids, Tensor<i32>(c!)[1] out_num_tokens_post_pad, "
    "int num_experts, int block_size, bool ignore_invalid=false) -> ()";
constexpr const char* kFloatDtypes = "bf16|f16|f32";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

#define KREG_MOE_SUM_DOC                                                                      \
  "out[t,h] = round((sum over j = 0..K-1 of x[t,j,h]) * routed_scaling_factor): fp32 sum in " \
  "index order, one rounding at the store; out must not overlap x"
#define KREG_MOE_TOPK_SOFTMAX_DOC                                                               \
  "Softmax routing, E <= 512, 1 <= K <= E. l = float(gating), l = c*tanh(l/c) if "              \
  "softcapping c > 0; weights = softmax(l) of the K experts with the largest selection keys, "  \
  "key = l + correction_bias when given (the bias steers SELECTION only; the "                  \
  "weights come from the unbiased softmax) else l; picks in descending key order, ties to the " \
  "lower index; renormalize divides the K weights by their fp32 sum"
#define KREG_MOE_GROUPED_TOPK_DOC                                                               \
  "DeepSeek-V3 group-limited routing: s = sigmoid(gating), b = s + correction_bias; E experts " \
  "in n_group (<= 32) equal groups, group score = sum of its top-2 b (the one b for 1-expert "  \
  "groups); the topk_group best groups are kept (ties to the lower group); the K experts with " \
  "the largest b among them, descending, ties to the lower index; weights = s of the picks, "   \
  "divided by their fp32 sum if renormalize, times routed_scaling_factor"
#define KREG_MOE_ROUTE_DOC                                                                        \
  "Routing by method (l = float(gating), picks = top-K by key, descending, ties to the lower "    \
  "index; every weight is finally times routed_scaling_factor): Default: key l, w = softmax(l); " \
  "Renormalize: key l, w = softmax over the K picked logits; DeepSeekV3: as moe.grouped_topk "    \
  "with n_group/topk_group, renormalized; Llama4 (K = 1): key l, w = sigmoid(l); "                \
  "RenormalizeNaive: key l, w = softmax(l) / its sum over the picks; TopK: key l, w = l; "        \
  "SigmoidRenorm: key l, w = sigmoid(l) / its sum over the picks; MiniMax2: key sigmoid(l) + "    \
  "correction_bias, w = sigmoid(l) / its sum over the picks; Sigmoid: key l, w = sigmoid(l). "    \
  "correction_bias (optional) is required by DeepSeekV3 and MiniMax2, ignored by the others; "    \
  "n_group/topk_group by DeepSeekV3 "                                                             \
  "only. An unknown method is an error listing the valid ones"
#define KREG_MOE_ALIGN_DOC                                                                        \
  "Sorts the N = T*K token slots (flat indices into topk_ids) by expert: expert e's slots, in "   \
  "increasing order, fill a segment padded with the sentinel N to a multiple of block_size; "     \
  "segments follow in expert order; out_expert_ids[b] = the expert of block b, -1 past the "      \
  "used blocks; the rest of out_sorted_token_ids is the sentinel; out_num_tokens_post_pad = the " \
  "padded total. Needs P >= N + num_experts*(block_size-1), B >= ceil(that / block_size), "       \
  "num_experts <= 2048. Ids outside [0, num_experts): skipped with ignore_invalid"

constexpr KernelDef kKernels[] = {
    {.op = "moe.sum",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kSum,
     .dtypes = kFloatDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = "Expert-output sum reference: " KREG_MOE_SUM_DOC,
     .impl = bind<&sum_cpu>,
     .source = "reference.cpp"},
    {.op = "moe.topk_softmax",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kTopkSoftmax,
     .dtypes = kFloatDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = KREG_MOE_TOPK_SOFTMAX_DOC " (reference, fp32)",
     .impl = bind<&topk_softmax_cpu>,
     .source = "reference.cpp"},
    {.op = "moe.grouped_topk",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kGroupedTopk,
     .dtypes = kFloatDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = KREG_MOE_GROUPED_TOPK_DOC " (reference, fp32)",
     .impl = bind<&grouped_topk_cpu>,
     .source = "reference.cpp"},
    {.op = "moe.route",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kRoute,
     .dtypes = kFloatDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = KREG_MOE_ROUTE_DOC " (reference, fp32)",
     .impl = bind<&route_cpu>,
     .source = "reference.cpp"},
    {.op = "moe.align_block_size",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kAlign,
     .dtypes = "i32",
     .traits = kCpuTraits,
     .priority = 0,
     .description = KREG_MOE_ALIGN_DOC ", else an error (reference)",
     .impl = bind<&align_block_size_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "moe.sum",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kSum,
     .dtypes = kFloatDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Expert-output sum, one thread per 16-byte output vector, K loads in "
                    "flight: " KREG_MOE_SUM_DOC,
     .impl = bind<&sum_cuda>,
     .source = "sum.cu"},
    {.op = "moe.topk_softmax",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kTopkSoftmax,
     .dtypes = kFloatDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = KREG_MOE_TOPK_SOFTMAX_DOC " (one warp per token, logits in registers)",
     .impl = bind<&topk_softmax_cuda>,
     .source = "routing.cu"},
    {.op = "moe.grouped_topk",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kGroupedTopk,
     .dtypes = kFloatDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = KREG_MOE_GROUPED_TOPK_DOC " (one warp per token, logits in registers)",
     .impl = bind<&grouped_topk_cuda>,
     .source = "routing.cu"},
    {.op = "moe.route",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kRoute,
     .dtypes = kFloatDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = KREG_MOE_ROUTE_DOC " (one warp per token, logits in registers)",
     .impl = bind<&route_cuda>,
     .source = "routing.cu"},
    {.op = "moe.align_block_size",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kAlign,
     .dtypes = "i32",
     .traits = kCudaTraits,
     .priority = 100,
     .description = KREG_MOE_ALIGN_DOC
     "; without it they are skipped too (a kernel cannot fail "
     "after launch without a synchronization) (per-warp shared histograms; one block up "
     "to 4608 slots, else count, offsets and scatter kernels over <= 128 chunks)",
     .impl = bind<&align_block_size_cuda>,
     .source = "align.cu"},
#endif
};

}  // namespace
}  // namespace kreg::moe

KREG_PLUGIN("moe", "0.1.0", kreg::moe::kKernels);
