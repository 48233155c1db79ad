// The kv_canary hash functions, shared by the CPU reference and the CUDA kernels (and
// spelled out in docs/ops/kv_canary.md so that other code can recompute them). All
// arithmetic is on uint64_t, modulo 2^64; int64 values are reinterpreted, not converted.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KREG_CANARY_FN __host__ __device__ __forceinline__
#else
#define KREG_CANARY_FN inline
#endif

namespace kreg::kv_canary {

// Record layout: canary[slot] = {token, position, chain_hash, data_hash} (int64 each).
inline constexpr int kToken = 0, kPosition = 1, kChain = 2, kData = 3;

// Violation reasons (bits of the reason column).
inline constexpr int64_t kReasonToken = 1, kReasonPosition = 2, kReasonChain = 4, kReasonData = 8,
                         kReasonRange = 16;

// The chain's anchor, used as the previous hash of a request's first token
// (prev_slot = -1): "KVCANARY" in ASCII.
inline constexpr uint64_t kChainSeed = 0x4b5643414e415259ull;
inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// The splitmix64 finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits with full
// avalanche.
KREG_CANARY_FN uint64_t fmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// chain_hash = mix(prev chain_hash or kChainSeed, token, position).
KREG_CANARY_FN uint64_t chain_mix(uint64_t prev, int64_t token, int64_t position) {
  return fmix64(fmix64(prev ^ static_cast<uint64_t>(token)) + static_cast<uint64_t>(position) +
                kGolden);
}

// data_hash of a row of m little-endian 8-byte words w[0..m-1] (row_bytes = 8 m):
//   fmix64(row_bytes + sum_i fmix64(w[i] + (i + 1) * kGolden))
// A sum of independent word hashes, so a row can be hashed by many lanes in any order.
KREG_CANARY_FN uint64_t word_hash(uint64_t w, uint64_t i) { return fmix64(w + (i + 1) * kGolden); }
KREG_CANARY_FN uint64_t finish_data_hash(uint64_t sum, uint64_t row_bytes) {
  return fmix64(row_bytes + sum);
}

}  // namespace kreg::kv_canary
