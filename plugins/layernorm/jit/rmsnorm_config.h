// The launch shape of the JIT RMSNorm kernels (rmsnorm.cu.jit), from the compile-time
// width H and element size: included by the JIT source under NVRTC and by the host
// launcher (rmsnorm_jit.cpp), so both sides agree. Plain C++17, no includes.
//
// Every row is read as 16-byte vectors whatever H is: a row starting off a 16-byte
// boundary (odd H) has a head of scalars up to the boundary, then aligned vectors (the
// body), then a tail of scalars, so no width falls back to scalar loads (the AOT kernel's
// cliff at H = 4097). Each thread keeps its `items` body vectors in registers between the
// two passes; head and tail (under a vector each) go to other lanes, one scalar a lane.
#pragma once

namespace kreg_jit {

struct RmsConfig {
  int vec;          // elements per 16-byte vector
  int items;        // body vectors per thread
  int threads;      // threads per row (blockDim.x), a multiple of 32
  int rows;         // rows per block (blockDim.y)
  int max_threads;  // the kernel's __launch_bounds__
  int min_blocks;
};

constexpr RmsConfig rms_config(int h, int elem_bytes, bool fused) {
  const int vec = 16 / elem_bytes;
  if (fused) {
    // As measured (H200, H = 4097 bf16: 88.7% of copy): one thread per started vector.
    const int vecs = (h + vec - 1) / vec;
    const int items = (vecs + 1023) / 1024;
    int threads = (vecs + items - 1) / items;
    threads = (threads + 31) / 32 * 32;
    if (threads < 32) threads = 32;
    const int rows = threads >= 256 ? 1 : 256 / threads;
    // One vector a thread fits 32 registers (as the AOT kernel's bound); wider rows
    // would spill under that bound.
    return RmsConfig{vec, items, threads, rows, 1024, items == 1 ? 2 : 1};
  }
  // Plain: slots for the longest body only (h / vec vectors, at a row starting on a
  // boundary); the head and tail scalars take no slot. H = 4097 bf16: 512 vectors, two a
  // thread over 256 threads (was 513 -> 288 threads, a ninth warp for one vector).
  const int vecs = h / vec;
  int items = (vecs + 1023) / 1024;
  // 16-bit rows of 512+ vectors: two vectors a thread over half as many threads (the AOT
  // kernel's measured choice: H = 4096 84.7% -> 92.4% of copy on an H200).
  if (elem_bytes == 2 && vecs >= 512 && items == 1) items = 2;
  if (items < 1) items = 1;
  int threads = (vecs + items - 1) / items;
  threads = (threads + 31) / 32 * 32;
  if (threads < 32) threads = 32;
  const int rows = threads >= 256 ? 1 : 256 / threads;
  // Up to two vectors a thread, kept in their storage type (8 registers), fit the kernel
  // in 32 registers: a full SM (2048 threads) of resident blocks, as the AOT kernel at
  // H = 4096. Unbounded (41 registers), blocks of 288 threads got 4 an SM, 56% occupancy,
  // and half the bytes in flight. Longer windows keep the compiler's choice.
  const int block = threads * rows;
  const int min_blocks = items <= 2 ? 2048 / block : 1;
  return RmsConfig{vec, items, threads, rows, block, min_blocks < 1 ? 1 : min_blocks};
}

}  // namespace kreg_jit
