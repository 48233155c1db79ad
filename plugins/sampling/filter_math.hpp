// The arithmetic that decides what the sampling group keeps and draws, written once for
// the CPU reference and the CUDA kernels (plain C++ usable from both): how a probability
// is read, the fixed-point weights that make every prefix sum exact and order-free, the
// top-p target, the tie count and the draw. docs/ops/sampling.md states the contract
// these implement.
#pragma once

#include <cstdint>
#include <cstring>

#include "philox.hpp"

namespace kreg::sampling {

// The bits of a float.
KREG_SAMPLING_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// How a probability is read, as its order key: NaN stays NaN (0x7fc00000 or any NaN
// pattern, flagged by is_bad_key), negative values and -0 read as +0, so that every key
// is a non-negative float's bit pattern and the unsigned order of keys is the order of
// values.
KREG_SAMPLING_HD uint32_t key_of(float p) {
  const uint32_t u = float_bits(p);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc00000u;  // NaN
  return (u >> 31) ? 0u : u;
}

// NaN or +inf: the row it is in has no distribution.
KREG_SAMPLING_HD bool is_bad_key(uint32_t key) { return key >= 0x7f800000u; }

// The float a key stands for.
KREG_SAMPLING_HD float key_value(uint32_t key) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(key);
#else
  float f;
  std::memcpy(&f, &key, sizeof f);
  return f;
#endif
}

// The fixed-point weight of a probability: q = floor(p * 2^(32 - E)), E the binary
// exponent of the row's largest probability (its key max_key), so the max weighs in
// [2^32, 2^33) and weights below max * 2^-32 round down (to 0 below 2^(E-32)). Integer
// sums of up to 2^31 weights fit in 64 bits and are exact in any order, which makes the
// top-p cut and the draw identical on the CPU and the GPU.
KREG_SAMPLING_HD uint64_t weight_of(uint32_t key, uint32_t max_key) {
  const int32_t e = static_cast<int32_t>(key >> 23), em = static_cast<int32_t>(max_key >> 23);
  const uint64_t m = (key & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
  const int32_t shift = (e > 1 ? e : 1) - (em > 1 ? em : 1) + 9;
  if (shift >= 0) return m << shift;
  return shift <= -32 ? 0 : m >> -shift;
}

// The top-p target for a set of total weight `total`: top_p * total in double, one IEEE
// rounding on both backends; a prefix of weight w reaches it when double(w) >= target.
KREG_SAMPLING_HD double top_p_target(float top_p, uint64_t total) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(static_cast<double>(top_p), __ull2double_rn(total));
#else
  return static_cast<double>(top_p) * static_cast<double>(total);
#endif
}

KREG_SAMPLING_HD bool reaches(uint64_t prefix, double target) {
#if defined(__CUDA_ARCH__)
  return __ull2double_rn(prefix) >= target;
#else
  return static_cast<double>(prefix) >= target;
#endif
}

// Top-p keeps everything for top_p >= 1 or NaN; else the smallest descending prefix,
// at least one token, whose weight reaches the target (top_p <= 0: the first max).
KREG_SAMPLING_HD bool top_p_keeps_all(float top_p) { return !(top_p < 1.0f); }

// The smallest m in [1, c_eq] with reaches(s_gt + m * q_t, target) (c_eq when none): how
// many of the c_eq tokens tied at the cut value (weight q_t each, after those above it of
// weight s_gt) a top-p cut keeps, in index order.
KREG_SAMPLING_HD uint32_t ties_needed(uint64_t s_gt, uint64_t q_t, uint32_t c_eq, double target) {
  uint32_t lo = 1, hi = c_eq;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (reaches(s_gt + static_cast<uint64_t>(mid) * q_t, target)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The min-p threshold key: tokens with key >= it are kept. min_p <= 0 or NaN keeps all
// (0); otherwise min_p * max rounded to fp32, capped at max (min_p >= 1 keeps the ties
// of the max).
KREG_SAMPLING_HD uint32_t min_p_threshold(float min_p, uint32_t max_key) {
  if (!(min_p > 0.0f)) return 0;
#if defined(__CUDA_ARCH__)
  const float thr = __fmul_rn(min_p, key_value(max_key));
#else
  const float thr = min_p * key_value(max_key);
#endif
  const uint32_t k = key_of(thr);
  return k < max_key ? k : max_key;
}

// The drawn point in [0, total): the high 64 bits of bits * total (a uniform integer,
// bias < total / 2^64). The token drawn is the first kept one, in index order, whose
// inclusive prefix weight exceeds it.
KREG_SAMPLING_HD uint64_t draw_point(uint64_t bits, uint64_t total) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(bits, total);
#else
  // Schoolbook on 32-bit halves (no __int128: the plugin builds with -Wpedantic).
  const uint64_t a0 = bits & 0xffffffffu, a1 = bits >> 32, b0 = total & 0xffffffffu,
                 b1 = total >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

}  // namespace kreg::sampling
