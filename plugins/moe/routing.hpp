// What one routing call computes, shared by the CPU reference (reference.cpp) and the CUDA
// kernel (routing.cu): every routing op and method is one RoutingParams, built and checked
// on the host by the functions below, so both backends accept and refuse the same calls.
//
// Per token, with l the logits (gating converted to fp32, then softcapped if softcap > 0):
//   score_e = l_e | softmax(l)_e | sigmoid(l_e)                          (score)
//   key_e   = (key_on_score ? score_e : l_e) + (bias ? bias_e : 0)     (selection key)
//   group limit (n_group > 1): the topk_group groups with the largest sum of their two
//     largest keys are kept; experts of other groups cannot be picked
//   picks   = the k largest keys, in descending order, ties to the lower expert index
//   t_j     = softmax_topk ? exp(score_j - score_0) : score_j            (score_j of pick j)
//   w_j     = ((renormalize || softmax_topk) ? t_j / sum_j t_j : t_j) * scale
// A NaN key counts as -inf (it can still be picked, after every other expert).
#pragma once

#include <cstdint>
#include <string_view>

#include "kreg/plugin.hpp"

namespace kreg::moe {

// Routing kernels keep a token's logits in one warp's registers: 16 per lane.
inline constexpr int kMaxRoutingExperts = 512;
// Group scores live one per lane.
inline constexpr int kMaxGroups = 32;

enum class Score : int32_t { kLogit = 0, kSoftmax = 1, kSigmoid = 2 };

struct RoutingParams {
  int64_t tokens = 0;
  int32_t experts = 0;
  int32_t k = 0;
  int32_t n_group = 1;  // 1: no group limit
  int32_t topk_group = 1;
  Score score = Score::kLogit;
  bool key_on_score = false;
  bool softmax_topk = false;
  bool renormalize = false;
  float softcap = 0.0f;
  float scale = 1.0f;
  const float* bias = nullptr;  // [experts], or null
};

// The valid `method` names of moe.route, comma-separated.
inline constexpr const char* kRouteMethods =
    "Default, Renormalize, DeepSeekV3, Llama4, RenormalizeNaive, TopK, SigmoidRenorm, MiniMax2, "
    "Sigmoid";

// Each checks what the signature cannot (k <= E, E <= 512, attribute ranges, the method)
// and fills `p`; on a bad call it returns ctx.fail(...) naming the op and the argument.
KernelStatus topk_softmax_params(Context& ctx, const DLTensor& gating, const DLTensor* bias,
                                 const DLTensor& out_weights, bool renormalize, double softcapping,
                                 RoutingParams& p);
KernelStatus grouped_topk_params(Context& ctx, const DLTensor& gating, const DLTensor& bias,
                                 const DLTensor& out_weights, int64_t n_group, int64_t topk_group,
                                 bool renormalize, double routed_scaling_factor, RoutingParams& p);
KernelStatus route_params(Context& ctx, const DLTensor& gating, const DLTensor* bias,
                          const DLTensor& out_weights, std::string_view method, int64_t n_group,
                          int64_t topk_group, double routed_scaling_factor, RoutingParams& p);

// moe.align_block_size: the checked sizes of one call.
struct AlignParams {
  int64_t slots = 0;  // T * k: the sentinel value
  int32_t num_experts = 0;
  int32_t block_size = 0;
  int64_t sorted_len = 0;  // out_sorted_token_ids' length
  int64_t blocks_len = 0;  // out_expert_ids' length
};
inline constexpr int64_t kMaxAlignExperts = 2048;
KernelStatus align_params(Context& ctx, const DLTensor& topk_ids, const DLTensor& sorted,
                          const DLTensor& expert_ids, int64_t num_experts, int64_t block_size,
                          AlignParams& p);

}  // namespace kreg::moe
