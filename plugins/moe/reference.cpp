// CPU references of the moe group: the plain loops that define what the CUDA kernels must
// compute. Floating-point steps are the kernels' own, in fp32, in the same order wherever
// the order is fixed (softcap, keys, group scores, the renormalization sum), so expert ids
// agree exactly with the GPU's except at ties closer than the fp32 rounding of a
// transcendental function.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"
#include "moe.hpp"
#include "routing.hpp"

namespace kreg::moe {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- sum ----

template <typename T>
void sum_rows(const T* x, T* out, int64_t tokens, int64_t k, int64_t h, float scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) acc += load_as_float(x[(t * k + j) * h + i]);
      out[t * h + i] = store_from_float<T>(acc * scale);
    }
  }
}

// ---- routing ----

template <typename T>
void route_rows(const T* gating, float* out_w, int32_t* out_ids, const RoutingParams& p) {
  const int E = p.experts;
  std::vector<float> l(static_cast<size_t>(E)), score(l.size()), key(l.size());
  std::vector<char> allowed(l.size());
  std::vector<int> order(l.size());
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int e = 0; e < E; ++e) {
      float v = load_as_float(gating[t * E + e]);
      if (p.softcap > 0.0f) v = p.softcap * std::tanh(v / p.softcap);
      l[static_cast<size_t>(e)] = v;
    }
    switch (p.score) {
      case Score::kLogit:
        score = l;
        break;
      case Score::kSigmoid:
        for (int e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-l[e]));
        break;
      case Score::kSoftmax: {
        float m = kNegInf;
        for (int e = 0; e < E; ++e) m = std::max(m, l[e]);
        float sum = 0.0f;
        for (int e = 0; e < E; ++e) {
          score[e] = std::exp(l[e] - m);
          sum += score[e];
        }
        for (int e = 0; e < E; ++e) score[e] = score[e] / sum;
        break;
      }
    }
    for (int e = 0; e < E; ++e) {
      float v = p.key_on_score ? score[e] : l[e];
      if (p.bias != nullptr) v = v + p.bias[e];
      key[e] = std::isnan(v) ? kNegInf : v;
      allowed[e] = 1;
    }
    if (p.n_group > 1) {
      const int gsize = E / p.n_group;
      std::vector<float> gscore(static_cast<size_t>(p.n_group));
      for (int g = 0; g < p.n_group; ++g) {
        float top1 = kNegInf, top2 = kNegInf;
        for (int i = 0; i < gsize; ++i) {
          const float v = key[g * gsize + i];
          if (v > top1) {
            top2 = top1;
            top1 = v;
          } else if (v > top2) {
            top2 = v;
          }
        }
        const float gs = gsize >= 2 ? top1 + top2 : top1;
        gscore[g] = std::isnan(gs) ? kNegInf : gs;
      }
      std::vector<int> groups(static_cast<size_t>(p.n_group));
      std::iota(groups.begin(), groups.end(), 0);
      std::stable_sort(groups.begin(), groups.end(),
                       [&](int a, int b) { return gscore[a] > gscore[b]; });
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int r = 0; r < p.topk_group; ++r) {
        for (int i = 0; i < gsize; ++i) allowed[groups[r] * gsize + i] = 1;
      }
    }
    std::iota(order.begin(), order.end(), 0);
    // Allowed experts first, each part by descending key; stable: ties keep index order.
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (allowed[a] != allowed[b]) return allowed[a] > allowed[b];
      return key[a] > key[b];
    });
    const float first = score[order[0]];
    std::vector<float> tvals(static_cast<size_t>(p.k));
    float wsum = 0.0f;
    for (int j = 0; j < p.k; ++j) {
      const float s = score[order[j]];
      tvals[j] = p.softmax_topk ? std::exp(s - first) : s;
      wsum += tvals[j];
    }
    const bool norm = p.renormalize || p.softmax_topk;
    for (int j = 0; j < p.k; ++j) {
      out_w[t * p.k + j] = (norm ? tvals[j] / wsum : tvals[j]) * p.scale;
      out_ids[t * p.k + j] = order[j];
    }
  }
}

KernelStatus route_typed(Context& ctx, const DLTensor& gating, DLTensor& out_w, DLTensor& out_ids,
                         const RoutingParams& p) {
  const char* op = ctx.op();
  float* w = data_ptr<float>(out_w);
  int32_t* ids = data_ptr<int32_t>(out_ids);
  return host::visit_float_dtype(ctx, op, gating, [&](auto tag) {
    route_rows(data_ptr<const decltype(tag)>(gating), w, ids, p);
  });
}

}  // namespace

KernelStatus sum_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double routed_scaling_factor) {
  if (!std::isfinite(routed_scaling_factor)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: attribute 'routed_scaling_factor' must be "
                    "finite",
                    ctx.op());
  }
  const int64_t tokens = x.shape[0], k = x.shape[1], h = x.shape[2];
  const auto scale = static_cast<float>(routed_scaling_factor);
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    sum_rows(data_ptr<const T>(x), data_ptr<T>(out), tokens, k, h, scale);
  });
}

KernelStatus topk_softmax_cpu(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                              DLTensor& out_weights, DLTensor& out_ids, bool renormalize,
                              double softcapping) {
  RoutingParams p;
  if (KernelStatus st = topk_softmax_params(ctx, gating, correction_bias, out_weights, renormalize,
                                            softcapping, p);
      !st.ok()) {
    return st;
  }
  return route_typed(ctx, gating, out_weights, out_ids, p);
}

KernelStatus grouped_topk_cpu(Context& ctx, const DLTensor& gating, const DLTensor& correction_bias,
                              DLTensor& out_weights, DLTensor& out_ids, int64_t n_group,
                              int64_t topk_group, bool renormalize, double routed_scaling_factor) {
  RoutingParams p;
  if (KernelStatus st = grouped_topk_params(ctx, gating, correction_bias, out_weights, n_group,
                                            topk_group, renormalize, routed_scaling_factor, p);
      !st.ok()) {
    return st;
  }
  return route_typed(ctx, gating, out_weights, out_ids, p);
}

KernelStatus route_cpu(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                       DLTensor& out_weights, DLTensor& out_ids, std::string_view method,
                       int64_t n_group, int64_t topk_group, double routed_scaling_factor) {
  RoutingParams p;
  if (KernelStatus st = route_params(ctx, gating, correction_bias, out_weights, method, n_group,
                                     topk_group, routed_scaling_factor, p);
      !st.ok()) {
    return st;
  }
  return route_typed(ctx, gating, out_weights, out_ids, p);
}

KernelStatus align_block_size_cpu(Context& ctx, const DLTensor& topk_ids,
                                  DLTensor& out_sorted_token_ids, DLTensor& out_expert_ids,
                                  DLTensor& out_num_tokens_post_pad, int64_t num_experts,
                                  int64_t block_size, bool ignore_invalid) {
  AlignParams p;
  if (KernelStatus st = align_params(ctx, topk_ids, out_sorted_token_ids, out_expert_ids,
                                     num_experts, block_size, p);
      !st.ok()) {
    return st;
  }
  const int32_t* ids = data_ptr<const int32_t>(topk_ids);
  int32_t* sorted = data_ptr<int32_t>(out_sorted_token_ids);
  int32_t* blocks = data_ptr<int32_t>(out_expert_ids);
  const int64_t E = p.num_experts, bs = p.block_size;
  std::vector<std::vector<int32_t>> slots_of(static_cast<size_t>(E));
  for (int64_t i = 0; i < p.slots; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= E) {
      if (ignore_invalid) continue;
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: argument 'topk_ids' holds expert %d at slot %lld, "
                      "outside [0, num_experts = %lld) (set ignore_invalid to skip such slots)",
                      ctx.op(), e, static_cast<long long>(i), static_cast<long long>(E));
    }
    slots_of[static_cast<size_t>(e)].push_back(static_cast<int32_t>(i));
  }
  const auto sentinel = static_cast<int32_t>(p.slots);
  int64_t pos = 0;
  for (int64_t e = 0; e < E; ++e) {
    const auto& s = slots_of[static_cast<size_t>(e)];
    const int64_t padded = (static_cast<int64_t>(s.size()) + bs - 1) / bs * bs;
    for (int64_t b = 0; b < padded / bs; ++b) blocks[pos / bs + b] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < padded; ++j) {
      sorted[pos + j] = j < static_cast<int64_t>(s.size()) ? s[static_cast<size_t>(j)] : sentinel;
    }
    pos += padded;
  }
  for (int64_t j = pos; j < p.sorted_len; ++j) sorted[j] = sentinel;
  for (int64_t b = pos / bs; b < p.blocks_len; ++b) blocks[b] = -1;
  data_ptr<int32_t>(out_num_tokens_post_pad)[0] = static_cast<int32_t>(pos);
  return kOk;
}

}  // namespace kreg::moe
