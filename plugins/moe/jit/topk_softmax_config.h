// The shapes the JIT moe.topk_softmax kernel (topk_softmax.cu.jit) takes and its launch
// shape, from the compile-time expert count E, top-k K and element size: included by the
// JIT source under NVRTC and by the host launcher (topk_softmax_jit.cpp), so both sides
// agree on what the kernel can hold. Plain C++17, no includes.
//
// A token's E logits are read as 16-byte vectors and spread over `lanes` lanes exactly as
// the AOT kernel (routing.cu) spreads them: lane i of the token holds vectors c * lanes + i
// for c < chunks. With fewer than 32 vectors in a row (E = 64 bf16: 8 vectors) the token
// takes only that many lanes and a warp serves 32 / lanes tokens, where the AOT kernel
// leaves the other lanes idle; each lane then holds, and sums in the same order, the same
// experts as in the AOT kernel, so the softmax sums (and the weights) are bit-identical.
#pragma once

namespace kreg_jit {

inline constexpr int kTopkWarps = 4;  // warps per block
inline constexpr int kTopkThreads = 32 * kTopkWarps;
// E at most 512 (16 logits a lane, as the AOT kernel); K at most 32: the K rounds of the
// arg-max are unrolled, and realistic routers pick 1 to 16 experts.
inline constexpr long long kTopkMaxExperts = 512;
inline constexpr long long kTopkMaxK = 32;

struct TopkConfig {
  bool ok;     // the JIT kernel takes this (E, K, element size)
  int vec;     // elements per 16-byte vector
  int lanes;   // lanes per token: min(E / vec, 32), a power of two
  int chunks;  // vectors per lane
  int rows;    // tokens per block
};

// E must be a power of two and a whole number of vectors (E >= 8 for 16-bit types, >= 4
// for f32), so that every lane holds whole vectors and no slot is padding.
constexpr TopkConfig topk_config(long long e, long long k, int elem_bytes) {
  TopkConfig c{false, 0, 0, 0, 0};
  if (elem_bytes != 2 && elem_bytes != 4) return c;
  const int vec = 16 / elem_bytes;
  const bool pow2 = e > 0 && (e & (e - 1)) == 0;
  if (!pow2 || e < vec || e > kTopkMaxExperts || k < 1 || k > e || k > kTopkMaxK) return c;
  const int vecs = static_cast<int>(e / vec);
  c.vec = vec;
  c.lanes = vecs < 32 ? vecs : 32;
  c.chunks = vecs / c.lanes;
  c.rows = kTopkWarps * (32 / c.lanes);
  c.ok = true;
  return c;
}

}  // namespace kreg_jit
