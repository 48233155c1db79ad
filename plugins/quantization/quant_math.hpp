// The arithmetic of the quantization group, written once for the CPU references and the
// CUDA kernels (host and device functions), so that both compute the same floats bit for
// bit: every step is a correctly rounded IEEE operation (+, *, /, fma, rint), spelled so
// that neither compiler can contract or reassociate it (on the device, nvcc would turn a
// * b + c into an fma: the device forms use the _rn intrinsics, which it never contracts).
//
// The contract (docs/ops/quantization.md):
//   s   = max(amax, eps) / qmax                      (fp32 division, qmax = 448 or 127)
//   s   = 2^ceil(log2 s)                             (scale_ue8m0 only; exact, by bits)
//   q   = clamp(x / s, -qmax, qmax)                  (fp32 division; fmin/fmax)
//   out = e4m3(q) (nearest, ties to even) | int8: rint(q) (ties to even)
// and, for the fused ops, x = silu(gate) * up in fp32 with silu(a) = a / (1 + exp(-a)),
// exp being exp_f below (not the libm or CUDA expf, which differ from each other).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KREG_QUANT_HD __host__ __device__ __forceinline__
#else
#define KREG_QUANT_HD inline
#endif

namespace kreg::quantization {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kInt8Max = 127.0f;
// The eps of the ops without an eps attribute (per-token and dynamic per-tensor): SGLang's
// group default, so that an all-zero row gets a positive scale (docs/ops/quantization.md).
inline constexpr float kDefaultEps = 1e-10f;

KREG_QUANT_HD float q_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KREG_QUANT_HD float q_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KREG_QUANT_HD float q_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

KREG_QUANT_HD float q_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Round to the nearest integer, ties to even (the default rounding mode on the host).
KREG_QUANT_HD float q_rint(float a) {
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return std::nearbyint(a);
#endif
}

KREG_QUANT_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KREG_QUANT_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// max(amax, eps) / qmax. fmax ignores a NaN amax (IEEE maxNum, on both sides).
KREG_QUANT_HD float group_scale(float amax, float eps, float qmax) {
  return q_div(fmaxf(amax, eps), qmax);
}

// The smallest power of two >= s, for s > 0 (an infinity stays infinite): the UE8M0
// scale, computed on the bits, so it is exact everywhere (subnormal s included) and
// never NaN. A power of two is its own rounding.
KREG_QUANT_HD float round_up_pow2(float s) {
  const uint32_t u = float_bits(s);
  const uint32_t exp = u & 0x7f800000u;
  const uint32_t man = u & 0x007fffffu;
  if (exp == 0x7f800000u || man == 0) return s;        // inf, NaN, zero or a normal power of two
  if (exp != 0) return bits_float(exp + 0x00800000u);  // next binade; FLT_MAX rounds to inf
  // Subnormal: the mantissa is the value in units of 2^-149; round it up to a power of
  // two (2^23 units is the smallest normal, whose bits are also 2^23).
  uint32_t p = 1;
  while (p < man) p <<= 1;
  return bits_float(p);
}

KREG_QUANT_HD float quant_scale(float amax, float eps, float qmax, bool ue8m0) {
  const float s = group_scale(amax, eps, qmax);
  return ue8m0 ? round_up_pow2(s) : s;
}

// clamp(x / s, -qmax, qmax); NaN lands on -qmax (fmax(NaN, -qmax) = -qmax), on both sides.
KREG_QUANT_HD float scaled_clamped(float x, float s, float qmax) {
  return fminf(fmaxf(q_div(x, s), -qmax), qmax);
}

// exp(x) in fp32 from correctly rounded operations only (so host and device agree): x =
// n ln2 + r with |r| <= ln2 / 2 (Cody-Waite, ln2 split in two), exp(r) by its degree-7
// Taylor polynomial (truncation below 1e-8 relative), times 2^n in two exact steps.
// About 1 ulp from the true value.
KREG_QUANT_HD float exp_f(float x) {
  if (x > 88.72283935546875f) return INFINITY;
  if (x < -104.0f) return 0.0f;
  if (x != x) return x;
  const float n = q_rint(q_mul(x, 1.44269504088896341f));
  float r = q_fma(n, -0.693145751953125f, x);  // ln2's leading 16 bits: n * hi is exact
  r = q_fma(n, -1.428606765330187e-06f, r);
  float p = 1.0f / 5040.0f;
  p = q_fma(p, r, 1.0f / 720.0f);
  p = q_fma(p, r, 1.0f / 120.0f);
  p = q_fma(p, r, 1.0f / 24.0f);
  p = q_fma(p, r, 1.0f / 6.0f);
  p = q_fma(p, r, 0.5f);
  p = q_fma(p, r, 1.0f);
  p = q_fma(p, r, 1.0f);
  // 2^n as two normal powers of two (n in [-150, 128]): 2^a * 2^b, a = n / 2, b = n - a.
  const int ni = static_cast<int>(n);
  const int a = ni / 2;
  const int b = ni - a;
  p = q_mul(p, bits_float(static_cast<uint32_t>(a + 127) << 23));
  return q_mul(p, bits_float(static_cast<uint32_t>(b + 127) << 23));
}

// silu(a) = a / (1 + exp(-a)).
KREG_QUANT_HD float silu_f(float a) { return q_div(a, q_add(1.0f, exp_f(-a))); }

// The fused ops' value: silu(gate) * up, fp32, not rounded to the input type.
KREG_QUANT_HD float silu_mul_f(float gate, float up) { return q_mul(silu_f(gate), up); }

}  // namespace kreg::quantization
