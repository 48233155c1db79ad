// Host-side rounding of a float to FP8 E4M3 (the "fn" variant: no infinities, one NaN
// pattern per sign, largest finite value 448), as the CPU references store it, and back.
// It is the conversion CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
// performs in the kernels: round to nearest, ties to even; magnitudes beyond 448
// (infinities included) saturate to +-448; NaN becomes 0x7f. Plain C++ (no CUDA header),
// so CPU references and tests include it.
#pragma once

#include <cmath>
#include <cstdint>

namespace kreg::device {

inline uint8_t float_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  // Clamping first is exact: 448 is representable and everything at or above it
  // (up to infinity) saturates to it.
  const double a = std::fmin(std::fabs(static_cast<double>(x)), 448.0);
  if (a < 0x1p-6) {
    // Subnormals (and zero): multiples of 2^-9. A result of 8 is 2^-6, the smallest
    // normal, whose encoding is also 8 (exponent field 1, mantissa 0).
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9)));
  }
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): the unbiased exponent is e - 1
  --e;
  // Scale the significand to [8, 16) (three mantissa bits); powers of two are exact.
  double q = std::nearbyint(std::ldexp(a, 3 - e));
  if (q == 16.0) {
    q = 8.0;
    ++e;
  }
  return static_cast<uint8_t>(sign | ((e + 7) << 3) | (static_cast<int>(q) - 8));
}

inline float e4m3_to_float(uint8_t b) {
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  if (exp == 0xf && man == 0x7) return NAN;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(static_cast<float>(8 + man), exp - 10);
  return (b & 0x80) ? -mag : mag;
}

}  // namespace kreg::device
