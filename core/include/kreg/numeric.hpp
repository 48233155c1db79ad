// Host-side conversions between float and the 16-bit floating formats, for CPU
// reference kernels, tools and tests. Round-to-nearest-even, NaN kept quiet, matching
// CUDA's __float2bfloat16_rn / __float2half_rn.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kreg {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float to_float(f16 v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t man = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline f16 to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return f16{sign};
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24
    uint32_t half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16{static_cast<uint16_t>(sign | half)};
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
  return f16{static_cast<uint16_t>(sign | ((r - (112u << 23)) >> 13))};
}

// Rounds a float through the storage type T (identity for float).
template <typename T>
inline float round_through(float f) {
  if constexpr (std::is_same_v<T, bf16>) {
    return to_float(to_bf16(f));
  } else if constexpr (std::is_same_v<T, f16>) {
    return to_float(to_f16(f));
  } else {
    return f;
  }
}

template <typename T>
inline float load_as_float(const T& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return to_float(v);
  }
}

template <typename T>
inline T store_from_float(float f) {
  if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(f);
  } else if constexpr (std::is_same_v<T, f16>) {
    return to_f16(f);
  } else {
    return f;
  }
}

}  // namespace kreg
