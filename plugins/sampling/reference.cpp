// CPU references of the sampling group: the sort-based definition of each op (stable
// sort by descending value, index order for ties), with filter_math.hpp's fixed-point
// weights for the top-p cut and the draw, so the CUDA kernels (radix searches over the
// same keys) must pick the same tokens bit for bit.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "filter_math.hpp"
#include "sampling.hpp"

namespace kreg::sampling {
namespace {

// One row read as keys, with its max; `bad` when it has no distribution.
struct Row {
  std::vector<uint32_t> key;
  uint32_t max_key = 0;
  bool bad = false;
};

Row read_row(const float* p, int64_t V) {
  Row r;
  r.key.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) {
    const uint32_t k = key_of(p[i]);
    r.key[static_cast<size_t>(i)] = k;
    r.bad = r.bad || is_bad_key(k);
    r.max_key = std::max(r.max_key, k);
  }
  r.bad = r.bad || r.max_key == 0;
  return r;
}

// The row's indices by descending value, ties in index order.
std::vector<int32_t> descending(const Row& r) {
  std::vector<int32_t> order(r.key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return r.key[static_cast<size_t>(a)] > r.key[static_cast<size_t>(b)];
  });
  return order;
}

// How many of the descending order top-k keeps.
int64_t top_k_count(int32_t k, int64_t V) { return k <= 0 || k >= V ? V : k; }

// How many of the first `limit` of the descending order top-p keeps: the smallest prefix
// (at least 1) whose weight reaches top_p * (weight of those `limit`).
int64_t top_p_count(const Row& r, const std::vector<int32_t>& order, int64_t limit, float top_p) {
  if (top_p_keeps_all(top_p)) return limit;
  uint64_t total = 0;
  for (int64_t j = 0; j < limit; ++j)
    total += weight_of(r.key[static_cast<size_t>(order[static_cast<size_t>(j)])], r.max_key);
  const double target = top_p_target(top_p, total);
  uint64_t prefix = 0;
  for (int64_t j = 0; j < limit; ++j) {
    prefix += weight_of(r.key[static_cast<size_t>(order[static_cast<size_t>(j)])], r.max_key);
    if (reaches(prefix, target)) return j + 1;
  }
  return limit;
}

KernelStatus bad_row(Context& ctx, const char* op, int64_t row, const Row& r) {
  if (r.max_key == 0) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: row %lld of probs has no positive probability", op,
                    static_cast<long long>(row));
  }
  return ctx.fail(KREG_INVALID_ARGUMENT, "%s: row %lld of probs holds NaN or inf", op,
                  static_cast<long long>(row));
}

KernelStatus check_vocab(Context& ctx, const char* op, const DLTensor& probs) {
  const int64_t V = probs.shape[1];
  if (probs.shape[0] > 0 && (V < 1 || V > INT32_MAX)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: probs has V = %lld columns; need 1 <= V <= 2^31-1",
                    op, static_cast<long long>(V));
  }
  return kOk;
}

// Writes p / (sum of the kept p) for the kept tokens, 0 elsewhere; sum in double, one
// fp32 division per token (as the kernel does).
void renorm(const Row& r, const std::vector<int32_t>& order, int64_t n, float* out) {
  const size_t V = r.key.size();
  std::vector<char> kept(V, 0);
  for (int64_t j = 0; j < n; ++j) kept[static_cast<size_t>(order[static_cast<size_t>(j)])] = 1;
  double sum = 0;
  for (size_t i = 0; i < V; ++i)
    if (kept[i]) sum += key_value(r.key[i]);
  const float s = static_cast<float>(sum);
  for (size_t i = 0; i < V; ++i) out[i] = kept[i] ? key_value(r.key[i]) / s : 0.0f;
}

// Draws from the kept tokens (kept[i]) of row `row`: the first, in index order, whose
// inclusive prefix weight exceeds draw_point(philox bits, total kept weight).
int32_t draw(const Row& r, const std::vector<char>& kept, uint64_t seed, uint64_t offset,
             int64_t row) {
  uint64_t total = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i]) total += weight_of(r.key[i], r.max_key);
  const uint64_t point = draw_point(philox_draw(seed, offset, static_cast<uint32_t>(row)), total);
  uint64_t prefix = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (!kept[i]) continue;
    prefix += weight_of(r.key[i], r.max_key);
    if (point < prefix) return static_cast<int32_t>(i);
  }
  return -1;  // unreachable: the max is kept and weighs at least 2^32 > point
}

}  // namespace

KernelStatus top_k_renorm_probs_cpu(Context& ctx, const DLTensor& probs, const DLTensor& top_k,
                                    DLTensor& out) {
  constexpr const char* kOp = "sampling.top_k_renorm_probs";
  if (KernelStatus st = check_vocab(ctx, kOp, probs); !st.ok()) return st;
  const int64_t B = probs.shape[0], V = probs.shape[1];
  const float* p = data_ptr<const float>(probs);
  const int32_t* k = data_ptr<const int32_t>(top_k);
  float* o = data_ptr<float>(out);
  for (int64_t b = 0; b < B; ++b) {
    const Row r = read_row(p + b * V, V);
    if (r.bad) return bad_row(ctx, kOp, b, r);
    renorm(r, descending(r), top_k_count(k[b], V), o + b * V);
  }
  return kOk;
}

KernelStatus top_p_renorm_probs_cpu(Context& ctx, const DLTensor& probs, const DLTensor& top_p,
                                    DLTensor& out) {
  constexpr const char* kOp = "sampling.top_p_renorm_probs";
  if (KernelStatus st = check_vocab(ctx, kOp, probs); !st.ok()) return st;
  const int64_t B = probs.shape[0], V = probs.shape[1];
  const float* p = data_ptr<const float>(probs);
  const float* tp = data_ptr<const float>(top_p);
  float* o = data_ptr<float>(out);
  for (int64_t b = 0; b < B; ++b) {
    const Row r = read_row(p + b * V, V);
    if (r.bad) return bad_row(ctx, kOp, b, r);
    const std::vector<int32_t> order = descending(r);
    renorm(r, order, top_p_count(r, order, V, tp[b]), o + b * V);
  }
  return kOk;
}

KernelStatus top_k_top_p_sampling_from_probs_cpu(Context& ctx, const DLTensor& probs,
                                                 const DLTensor& top_k, const DLTensor& top_p,
                                                 DLTensor& out_ids, DLTensor& rng) {
  constexpr const char* kOp = "sampling.top_k_top_p_sampling_from_probs";
  if (KernelStatus st = check_vocab(ctx, kOp, probs); !st.ok()) return st;
  const int64_t B = probs.shape[0], V = probs.shape[1];
  const float* p = data_ptr<const float>(probs);
  const int32_t* k = data_ptr<const int32_t>(top_k);
  const float* tp = data_ptr<const float>(top_p);
  int32_t* ids = data_ptr<int32_t>(out_ids);
  if (B == 0) return kOk;  // an empty batch leaves rng alone (the kernel launches nothing)
  int64_t* state = data_ptr<int64_t>(rng);
  const auto seed = static_cast<uint64_t>(state[0]), offset = static_cast<uint64_t>(state[1]);
  for (int64_t b = 0; b < B; ++b) {
    const Row r = read_row(p + b * V, V);
    if (r.bad) return bad_row(ctx, kOp, b, r);
    const std::vector<int32_t> order = descending(r);
    // Top-k first, then top-p over the top-k set renormalized: its cut is the prefix of
    // the same descending order reaching top_p * (weight of the top-k set).
    const int64_t n = top_p_count(r, order, top_k_count(k[b], V), tp[b]);
    std::vector<char> kept(static_cast<size_t>(V), 0);
    for (int64_t j = 0; j < n; ++j) kept[static_cast<size_t>(order[static_cast<size_t>(j)])] = 1;
    ids[b] = draw(r, kept, seed, offset, b);
  }
  state[1] = static_cast<int64_t>(offset + 1);
  return kOk;
}

KernelStatus min_p_sampling_from_probs_cpu(Context& ctx, const DLTensor& probs,
                                           const DLTensor& min_p, DLTensor& out_ids,
                                           DLTensor& rng) {
  constexpr const char* kOp = "sampling.min_p_sampling_from_probs";
  if (KernelStatus st = check_vocab(ctx, kOp, probs); !st.ok()) return st;
  const int64_t B = probs.shape[0], V = probs.shape[1];
  const float* p = data_ptr<const float>(probs);
  const float* mp = data_ptr<const float>(min_p);
  int32_t* ids = data_ptr<int32_t>(out_ids);
  if (B == 0) return kOk;  // an empty batch leaves rng alone (the kernel launches nothing)
  int64_t* state = data_ptr<int64_t>(rng);
  const auto seed = static_cast<uint64_t>(state[0]), offset = static_cast<uint64_t>(state[1]);
  for (int64_t b = 0; b < B; ++b) {
    const Row r = read_row(p + b * V, V);
    if (r.bad) return bad_row(ctx, kOp, b, r);
    const uint32_t thr = min_p_threshold(mp[b], r.max_key);
    std::vector<char> kept(static_cast<size_t>(V), 0);
    for (size_t i = 0; i < kept.size(); ++i) kept[i] = r.key[i] >= thr;
    ids[b] = draw(r, kept, seed, offset, b);
  }
  state[1] = static_cast<int64_t>(offset + 1);
  return kOk;
}

}  // namespace kreg::sampling
