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
#include <cuda_fp8.h>
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

#if defined(__CUDACC__)
// ---- Device: the e4m3 codes of x / s without a division per element ----
//
// A correctly rounded division costs about ten instructions, the largest part of the
// quantize kernels' work, and the contract needs its exact result only where it decides
// the code. The code c(q) = e4m3_satfinite(max(q, -448)) is a monotone step function of q
// (the satfinite conversion already clamps at +448 and the max sends NaN to -448, as
// scaled_clamped does), so it is enough to bracket RN(x / s):
//
//   r  = RN(1 / s), p = max(RN(x r), -448)
//   lo = RN(p (1 - 2^-21)), hi = RN(p (1 + 2^-21))
//   c(lo) == c(hi)  =>  c(RN(x / s)) == c(lo).
//
// Proof. Let u = 2^-24. With s and 1/s normal (e4m3_recip_ok), r = (1/s)(1 + e1) and,
// for |x r| >= 2^-126, RN(x r) = x r (1 + e2), |e1|, |e2| <= u, so RN(x / s) / RN(x r) =
// (1 + e3) / ((1 + e1)(1 + e2)) lies in [1 - 3.01u, 1 + 3.01u]; |lo| <= |p| (1 - 8u)(1 + u)
// < |p| (1 - 3.01u) and |hi| >= |p| (1 + 8u)(1 - u) > |p| (1 + 3.01u), so (same signs) lo
// and hi bracket RN(x / s), and c, monotone, is c(lo) on the whole bracket. That needs
// x / s, x r and lo normal, true for |x / s| >= 2^-100; below it, RN(x / s), lo and hi are
// all of x's sign and below 2^-10 in magnitude: each has the code of a zero of that sign
// (fmaxf keeps -0). If p was clamped (x r < -448 or NaN), lo and hi give -448's code, as does
// RN(x / s) (<= -448 (1 - 3.01u), or NaN, which the contract sends to -448). An overflow
// of x r (static per-tensor scales) gives +-inf, whose code is +-448's, as is that of
// every |RN(x / s)| >= 464.
//
// Where c(lo) != c(hi) (RN(x / s) within 2^-21 of a rounding boundary, or on it: rare for
// random scales, but bf16 data over scales with a short mantissa hits exact ties), the
// word is redone with the division; where s is outside the range, the caller divides.
inline constexpr float kBracketLo = 1.0f - 0x1p-21f;
inline constexpr float kBracketHi = 1.0f + 0x1p-21f;

// Whether s is in [2^-125, 2^126): s and 1/s are then normal and finite (so is r).
// Excludes 0, subnormals, infinity, NaN and negative s (the sign bit fails the test).
__device__ __forceinline__ bool e4m3_recip_ok(float s) {
  return (float_bits(s) >> 23) - 2u <= 250u;
}

// Two e4m3 codes (a in the low byte): the conversion
// __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) performs on each, as one cvt
// instruction where the hardware has it (sm_89+; ptxas refuses it for sm_80, which gets
// cuda_fp8.h's conversion, the same rounding).
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(b), "f"(a));
  return d;
#else
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(a, __NV_SATFINITE, __NV_E4M3)) |
         (static_cast<uint32_t>(__nv_cvt_float_to_fp8(b, __NV_SATFINITE, __NV_E4M3)) << 8);
#endif
}

// The same codes by the contract's division (exact everywhere).
template <int N>
__device__ __forceinline__ void e4m3_codes_div(const float* v, float s, uint32_t* codes) {
  static_assert(N % 4 == 0, "e4m3_codes_div: whole words of four codes");
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    float q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = scaled_clamped(v[4 * w + j], s, kFp8Max);
    codes[w] = e4m3x2(q[0], q[1]) | (e4m3x2(q[2], q[3]) << 16);
  }
}

// The bracket alone, for a whole vector: codes[w] = c(lo) of v[4w .. 4w + 3]; returns 0
// when every code is decided (else the codes are unusable and the caller divides).
template <int N>
__device__ __forceinline__ uint32_t e4m3_codes_bracket(const float* v, float r, uint32_t* codes) {
  static_assert(N % 4 == 0, "e4m3_codes_bracket: whole words of four codes");
  uint32_t differ = 0;
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    float lo[4], hi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p = fmaxf(q_mul(v[4 * w + j], r), -kFp8Max);
      lo[j] = q_mul(p, kBracketLo);
      hi[j] = q_mul(p, kBracketHi);
    }
    const uint32_t a = e4m3x2(lo[0], lo[1]) | (e4m3x2(lo[2], lo[3]) << 16);
    const uint32_t b = e4m3x2(hi[0], hi[1]) | (e4m3x2(hi[2], hi[3]) << 16);
    differ |= a ^ b;
    codes[w] = a;
  }
  return differ;
}

// Whether 1 / s is exact: s a power of two (with e4m3_recip_ok(s), r = 2^-k is normal).
// Then RN(x r) is RN(x / s) itself (one rounding of the same real), the UE8M0 case.
__device__ __forceinline__ bool recip_exact(float s) { return (float_bits(s) & 0x007fffffu) == 0; }

// codes[w] = the e4m3 codes of v[4w .. 4w + 3] (v[4w] in the low byte), exact, for s with
// e4m3_recip_ok(s) and r = RN(1 / s): from RN(x r) directly where 1 / s is exact, else
// by the bracket above, and by the division only for a word whose bracket cannot decide
// (so a near-tie costs four divisions, not a whole thread's: bf16 inputs make exact and
// near ties common, about one word in a few hundred).
template <int N>
__device__ __forceinline__ void e4m3_codes_recip(const float* v, float s, float r, uint32_t* codes) {
  static_assert(N % 4 == 0, "e4m3_codes_recip: whole words of four codes");
  if (recip_exact(s)) {
#pragma unroll
    for (int w = 0; w < N / 4; ++w) {
      float q[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = fmaxf(q_mul(v[4 * w + j], r), -kFp8Max);
      codes[w] = e4m3x2(q[0], q[1]) | (e4m3x2(q[2], q[3]) << 16);
    }
    return;
  }
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    float lo[4], hi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p = fmaxf(q_mul(v[4 * w + j], r), -kFp8Max);
      lo[j] = q_mul(p, kBracketLo);
      hi[j] = q_mul(p, kBracketHi);
    }
    const uint32_t a = e4m3x2(lo[0], lo[1]) | (e4m3x2(lo[2], lo[3]) << 16);
    const uint32_t b = e4m3x2(hi[0], hi[1]) | (e4m3x2(hi[2], hi[3]) << 16);
    codes[w] = a;
    if (a != b) e4m3_codes_div<4>(v + 4 * w, s, codes + w);
  }
}
#endif  // __CUDACC__

// silu(a) = a / (1 + exp(-a)).
KREG_QUANT_HD float silu_f(float a) { return q_div(a, q_add(1.0f, exp_f(-a))); }

// The fused ops' value: silu(gate) * up, fp32, not rounded to the input type.
KREG_QUANT_HD float silu_mul_f(float gate, float up) { return q_mul(silu_f(gate), up); }

}  // namespace kreg::quantization
