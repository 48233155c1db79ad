// The launch shape of the JIT RMSNorm kernels (rmsnorm.cu.jit), from the compile-time
// width H and element size: included by the JIT source under NVRTC and by the host
// launcher (rmsnorm_jit.cpp), so both sides agree. Plain C++17, no includes.
//
// Every row is read as 16-byte vectors whatever H is: a row starting off a 16-byte
// boundary (odd H) has a head of scalars up to the boundary, then aligned vectors, then a
// tail of scalars, so no width falls back to scalar loads (the AOT kernel's cliff at
// H = 4097). kItems vectors per thread stay in registers between the two passes.
#pragma once

namespace kreg_jit {

struct RmsConfig {
  int vec;      // elements per 16-byte vector
  int items;    // vectors per thread
  int threads;  // threads per row (blockDim.x), a multiple of 32
  int rows;     // rows per block (blockDim.y)
};

constexpr RmsConfig rms_config(int h, int elem_bytes, bool fused) {
  const int vec = 16 / elem_bytes;
  const int vecs = (h + vec - 1) / vec;
  int items = (vecs + 1023) / 1024;
  // Plain 16-bit rows of 512+ vectors: two vectors a thread over half as many threads
  // (the AOT kernel's measured choice: H = 4096 84.7% -> 92.4% of copy on an H200).
  if (!fused && elem_bytes == 2 && vecs >= 512 && items == 1) items = 2;
  int threads = (vecs + items - 1) / items;
  threads = (threads + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  const int rows = threads >= 256 ? 1 : 256 / threads;
  return RmsConfig{vec, items, threads, rows};
}

}  // namespace kreg_jit
