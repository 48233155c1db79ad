// Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011; the Random123 library's philox4x32 with 10 rounds), written once for both
// the CPU reference and the CUDA kernels of the sampling group so that they draw the same
// numbers: plain integer C++, no library. tests/kernels/sampling_test.cpp checks it
// against Random123's published known-answer vectors (its tests/kat_vectors).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KREG_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define KREG_SAMPLING_HD inline
#endif

namespace kreg::sampling {

struct Philox4x32 {
  uint32_t v[4];
};

// The 64-bit product a * b as (high word, low word).
KREG_SAMPLING_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32-10 of counter `c` under key (k0, k1): Random123's philox4x32_R(10, ...),
// the key bumped by the Weyl constants between rounds.
KREG_SAMPLING_HD Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c.v[0], hi0, lo0);
    philox_mulhilo(kM1, c.v[2], hi1, lo1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// The sampling group's draw for one row of one call: 64 random bits from the counter
// (offset low, offset high, row, 0) under the key (seed low, seed high).
KREG_SAMPLING_HD uint64_t philox_draw(uint64_t seed, uint64_t offset, uint32_t row) {
  const Philox4x32 r = philox4x32_10(
      Philox4x32{{static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), row, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<uint64_t>(r.v[0]) | (static_cast<uint64_t>(r.v[1]) << 32);
}

}  // namespace kreg::sampling
