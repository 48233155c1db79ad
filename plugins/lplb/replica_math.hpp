// The per-expert and per-slot arithmetic of replica_probabilities and dispatch, compiled
// for both the CPU references and the CUDA kernels so that the two give identical bits
// (fp32, fixed order, no fused multiply-adds involved).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LPLB_HD __host__ __device__ __forceinline__
#else
#define LPLB_HD inline
#endif

namespace kreg::lplb {

// max(v, 0), with NaN mapped to 0.
LPLB_HD float positive_part(float v) { return v > 0.0f ? v : 0.0f; }

// Probabilities of one expert's C replica slots (ids: its log2phy row; x: the LP solution
// of n_x values). A valid slot has an id in [0, n_x). use_x: the solve converged and the
// expert has tokens; otherwise, or when its replicas' x sum to 0, uniform over valid slots.
LPLB_HD void expert_probabilities(const int32_t* ids, int64_t C, const float* x, int64_t n_x,
                                  bool use_x, float* p) {
  int valid = 0;
  float sum = 0.0f;
  for (int64_t c = 0; c < C; ++c) {
    if (ids[c] >= 0 && ids[c] < n_x) {
      ++valid;
      sum += positive_part(x[ids[c]]);
    }
  }
  use_x = use_x && sum > 0.0f;
  const float uniform = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
  for (int64_t c = 0; c < C; ++c) {
    const bool ok = ids[c] >= 0 && ids[c] < n_x;
    p[c] = !ok ? 0.0f : use_x ? positive_part(x[ids[c]]) / sum : uniform;
  }
}

// The replica for one (token, slot): inverse CDF over the expert's valid replicas (id >= 0)
// of positive probability, u clamped to [0, 1]; uniform over the valid replicas when no
// probability is positive; -1 when the expert has no valid replica.
LPLB_HD int32_t pick_replica(const int32_t* row, const float* p, int64_t C, float u) {
  const float ui = u > 0.0f ? (u < 1.0f ? u : 1.0f) : 0.0f;  // NaN -> 0
  float total = 0.0f;
  int valid = 0;
  for (int64_t c = 0; c < C; ++c) {
    if (row[c] >= 0) {
      total += positive_part(p[c]);
      ++valid;
    }
  }
  int32_t pick = -1;
  if (total > 0.0f) {
    // The first replica whose cumulative probability exceeds u * total; the last one of
    // positive probability when u * total rounds up to the sum.
    const float target = ui * total;
    float cdf = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      const float pc = positive_part(p[c]);
      if (row[c] < 0 || !(pc > 0.0f)) continue;
      cdf += pc;
      pick = row[c];
      if (target < cdf) break;
    }
  } else if (valid > 0) {
    int nth = static_cast<int>(ui * static_cast<float>(valid));
    nth = nth < valid - 1 ? nth : valid - 1;
    for (int64_t c = 0; c < C; ++c) {
      if (row[c] < 0) continue;
      if (nth-- == 0) {
        pick = row[c];
        break;
      }
    }
  }
  return pick;
}

}  // namespace kreg::lplb
