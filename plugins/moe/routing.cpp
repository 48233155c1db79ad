// Host-side checks shared by both backends of the routing ops and align_block_size: what
// the signatures cannot express, refused identically on the CPU and on the GPU.
#include "routing.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace kreg::moe {
namespace {

KernelStatus common_params(Context& ctx, const char* op, const DLTensor& gating,
                           const DLTensor& out_weights, RoutingParams& p) {
  p = RoutingParams{};
  p.tokens = gating.shape[0];
  const int64_t experts = gating.shape[1];
  const int64_t k = out_weights.shape[1];
  if (experts < 1 || experts > kMaxRoutingExperts) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'gating' has E = %lld experts; supported: 1 to %d", op,
                    static_cast<long long>(experts), kMaxRoutingExperts);
  }
  if (k < 1 || k > experts) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: top-k = %lld (the last dimension of 'out_weights' and 'out_ids') must "
                    "be between 1 and E = %lld",
                    op, static_cast<long long>(k), static_cast<long long>(experts));
  }
  if (p.tokens > std::numeric_limits<int32_t>::max() / 2) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: T = %lld tokens is too many", op,
                    static_cast<long long>(p.tokens));
  }
  p.experts = static_cast<int32_t>(experts);
  p.k = static_cast<int32_t>(k);
  return kOk;
}

KernelStatus scale_param(Context& ctx, const char* op, double routed_scaling_factor,
                         RoutingParams& p) {
  if (!std::isfinite(routed_scaling_factor)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'routed_scaling_factor' must be finite",
                    op);
  }
  p.scale = static_cast<float>(routed_scaling_factor);
  return kOk;
}

KernelStatus group_params(Context& ctx, const char* op, int64_t n_group, int64_t topk_group,
                          RoutingParams& p) {
  if (n_group < 1 || n_group > kMaxGroups || p.experts % n_group != 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'n_group' = %lld must be between 1 and %d and divide E = %d", op,
                    static_cast<long long>(n_group), kMaxGroups, p.experts);
  }
  if (topk_group < 1 || topk_group > n_group) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'topk_group' = %lld must be between 1 and n_group = %lld", op,
                    static_cast<long long>(topk_group), static_cast<long long>(n_group));
  }
  const int64_t reachable = topk_group * (p.experts / n_group);
  if (p.k > reachable) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: top-k = %d exceeds the %lld experts of the topk_group = %lld kept groups",
                    op, p.k, static_cast<long long>(reachable), static_cast<long long>(topk_group));
  }
  p.n_group = static_cast<int32_t>(n_group);
  p.topk_group = static_cast<int32_t>(topk_group);
  return kOk;
}

KernelStatus missing_bias(Context& ctx, const char* op, const char* method) {
  return ctx.fail(KREG_INVALID_ARGUMENT,
                  "%s: method '%s' selects by score + correction_bias: argument "
                  "'correction_bias' is required",
                  op, method);
}

}  // namespace

KernelStatus topk_softmax_params(Context& ctx, const DLTensor& gating, const DLTensor* bias,
                                 const DLTensor& out_weights, bool renormalize, double softcapping,
                                 RoutingParams& p) {
  const char* op = ctx.op();
  if (KernelStatus st = common_params(ctx, op, gating, out_weights, p); !st.ok()) return st;
  if (!(softcapping >= 0) || !std::isfinite(softcapping)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'softcapping' must be 0 (off) or a positive finite cap", op);
  }
  p.score = Score::kSoftmax;
  p.renormalize = renormalize;
  p.softcap = static_cast<float>(softcapping);
  p.bias = bias != nullptr ? data_ptr<const float>(*bias) : nullptr;
  return kOk;
}

KernelStatus grouped_topk_params(Context& ctx, const DLTensor& gating, const DLTensor& bias,
                                 const DLTensor& out_weights, int64_t n_group, int64_t topk_group,
                                 bool renormalize, double routed_scaling_factor, RoutingParams& p) {
  const char* op = ctx.op();
  if (KernelStatus st = common_params(ctx, op, gating, out_weights, p); !st.ok()) return st;
  if (KernelStatus st = group_params(ctx, op, n_group, topk_group, p); !st.ok()) return st;
  if (KernelStatus st = scale_param(ctx, op, routed_scaling_factor, p); !st.ok()) return st;
  p.score = Score::kSigmoid;
  p.key_on_score = true;
  p.renormalize = renormalize;
  p.bias = data_ptr<const float>(bias);
  return kOk;
}

KernelStatus route_params(Context& ctx, const DLTensor& gating, const DLTensor* bias,
                          const DLTensor& out_weights, std::string_view method, int64_t n_group,
                          int64_t topk_group, double routed_scaling_factor, RoutingParams& p) {
  const char* op = ctx.op();
  if (KernelStatus st = common_params(ctx, op, gating, out_weights, p); !st.ok()) return st;
  if (KernelStatus st = scale_param(ctx, op, routed_scaling_factor, p); !st.ok()) return st;
  if (method == "Default") {
    p.score = Score::kSoftmax;
  } else if (method == "Renormalize") {
    p.score = Score::kLogit;
    p.softmax_topk = true;
  } else if (method == "DeepSeekV3") {
    if (KernelStatus st = group_params(ctx, op, n_group, topk_group, p); !st.ok()) return st;
    p.score = Score::kSigmoid;
    p.key_on_score = true;
    p.renormalize = true;
    if (bias == nullptr) return missing_bias(ctx, op, "DeepSeekV3");
    p.bias = data_ptr<const float>(*bias);
  } else if (method == "Llama4") {
    if (p.k != 1) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: method 'Llama4' routes each token to one expert; top-k is %d", op, p.k);
    }
    p.score = Score::kSigmoid;
  } else if (method == "RenormalizeNaive") {
    p.score = Score::kSoftmax;
    p.renormalize = true;
  } else if (method == "TopK") {
    p.score = Score::kLogit;
  } else if (method == "SigmoidRenorm") {
    p.score = Score::kSigmoid;
    p.renormalize = true;
  } else if (method == "MiniMax2") {
    p.score = Score::kSigmoid;
    p.key_on_score = true;
    p.renormalize = true;
    if (bias == nullptr) return missing_bias(ctx, op, "MiniMax2");
    p.bias = data_ptr<const float>(*bias);
  } else if (method == "Sigmoid") {
    p.score = Score::kSigmoid;
  } else {
    const std::string name(method.substr(0, 64));
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: unknown method '%s'; valid methods: %s", op,
                    name.c_str(), kRouteMethods);
  }
  return kOk;
}

KernelStatus align_params(Context& ctx, const DLTensor& topk_ids, const DLTensor& sorted,
                          const DLTensor& expert_ids, int64_t num_experts, int64_t block_size,
                          AlignParams& p) {
  const char* op = ctx.op();
  p = AlignParams{};
  if (num_experts < 1 || num_experts > kMaxAlignExperts) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'num_experts' = %lld must be between 1 and %lld", op,
                    static_cast<long long>(num_experts), static_cast<long long>(kMaxAlignExperts));
  }
  if (block_size < 1 || block_size > (1 << 20)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'block_size' = %lld must be between 1 and 2^20", op,
                    static_cast<long long>(block_size));
  }
  p.slots = topk_ids.shape[0] * topk_ids.shape[1];
  const int64_t max_padded = p.slots + num_experts * (block_size - 1);
  const int64_t max_blocks = (max_padded + block_size - 1) / block_size;
  if (max_padded > std::numeric_limits<int32_t>::max()) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: T*k + num_experts*(block_size-1) = %lld does not fit in int32", op,
                    static_cast<long long>(max_padded));
  }
  p.sorted_len = sorted.shape[0];
  p.blocks_len = expert_ids.shape[0];
  if (p.sorted_len < max_padded) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'out_sorted_token_ids' has %lld elements; it needs at least "
                    "T*k + num_experts*(block_size-1) = %lld",
                    op, static_cast<long long>(p.sorted_len), static_cast<long long>(max_padded));
  }
  if (p.blocks_len < max_blocks) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'out_expert_ids' has %lld elements; it needs at least "
                    "ceil((T*k + num_experts*(block_size-1)) / block_size) = %lld",
                    op, static_cast<long long>(p.blocks_len), static_cast<long long>(max_blocks));
  }
  if (p.sorted_len > std::numeric_limits<int32_t>::max() ||
      p.blocks_len > std::numeric_limits<int32_t>::max()) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: output lengths must fit in int32", op);
  }
  p.num_experts = static_cast<int32_t>(num_experts);
  p.block_size = static_cast<int32_t>(block_size);
  return kOk;
}

}  // namespace kreg::moe
