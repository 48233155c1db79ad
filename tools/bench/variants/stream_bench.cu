// Scratch: cache-hint and words-per-thread variants of the three streaming kernels that
// trail torch (copy_rows 16384x4096, residual_gate_add 16x4096x3072 [B,H], concat_mla_k
// T=8192 H=128). nvcc -O3 -arch=sm_90 -std=c++17 stream_bench.cu -o sb && ./sb
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

enum Hint { kCs = 0, kPlain = 1, kNcPlain = 2, kCsLoadPlainStore = 3, kL2EvictFirst = 4 };

template <int H>
__device__ __forceinline__ uint4 ld(const uint4* p) {
  if constexpr (H == kCs || H == kCsLoadPlainStore) return __ldcs(p);
  if constexpr (H == kNcPlain) return __ldg(p);
  if constexpr (H == kL2EvictFirst) {
    uint4 v;
    asm volatile(
        "{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
        "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], pol; }"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  }
  return *p;
}
template <int H>
__device__ __forceinline__ void st(uint4* p, uint4 v) {
  if constexpr (H == kCs) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

__device__ __forceinline__ int64_t rd(const void* p) { return *static_cast<const int64_t*>(p); }

// copy_rows-like: every thread reads offset/count scalars (device), then kWords words.
template <int H, int kWords, bool kScalars>
__global__ void __launch_bounds__(256)
    copy_k(const uint4* __restrict__ src, uint4* __restrict__ dst, const void* off, const void* cnt,
           int64_t rows, int64_t row_words, int64_t host_off) {
  int64_t o = host_off, n = rows;
  if constexpr (kScalars) {
    o = rd(off);
    n = rd(cnt);
  }
  const int64_t total = n * row_words;
  uint4* d = dst + o * row_words;
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * 256 * kWords) + threadIdx.x;
  uint4 w[kWords];
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const int64_t i = base + u * 256;
    if (i < total) w[u] = ld<H>(src + i);
  }
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const int64_t i = base + u * 256;
    if (i < total) st<H>(d + i, w[u]);
  }
}

// Grid-stride persistent copy, kWords in flight.
template <int H, int kWords>
__global__ void __launch_bounds__(256)
    copy_gs(const uint4* __restrict__ src, uint4* __restrict__ dst, const void* off,
            const void* cnt, int64_t row_words) {
  const int64_t o = rd(off), n = rd(cnt);
  const int64_t total = n * row_words;
  uint4* d = dst + o * row_words;
  const int64_t step = static_cast<int64_t>(gridDim.x) * 256 * kWords;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * 256 * kWords + threadIdx.x; base < total;
       base += step) {
    uint4 w[kWords];
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const int64_t i = base + u * 256;
      if (i < total) w[u] = ld<H>(src + i);
    }
#pragma unroll
    for (int u = 0; u < kWords; ++u) {
      const int64_t i = base + u * 256;
      if (i < total) st<H>(d + i, w[u]);
    }
  }
}

__device__ __forceinline__ uint4 gate_math(uint4 r, uint4 x, uint4 g) {
  uint4 y;
  const __nv_bfloat162* rr = reinterpret_cast<const __nv_bfloat162*>(&r);
  const __nv_bfloat162* xx = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* gg = reinterpret_cast<const __nv_bfloat162*>(&g);
  __nv_bfloat162* yy = reinterpret_cast<__nv_bfloat162*>(&y);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 a = __bfloat1622float2(rr[j]), b = __bfloat1622float2(xx[j]),
           c = __bfloat1622float2(gg[j]);
    yy[j] = __floats2bfloat162_rn(a.x + c.x * b.x, a.y + c.y * b.y);
  }
  return y;
}

// residual_gate_add [B,S,H] with gate [B,H]; one vector (8 bf16) a thread x kWords.
template <int H, int kWords>
__global__ void __launch_bounds__(256)
    gate_k(const uint4* residual, const uint4* x, const uint4* __restrict__ gate, uint4* out,
           uint32_t vecs_per_row, uint32_t tokens, uint32_t total) {
  const uint32_t base = blockIdx.x * 256 * kWords + threadIdx.x;
  uint4 r[kWords], xv[kWords], g[kWords];
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const uint32_t i = base + u * 256;
    if (i < total) {
      const uint32_t row = i / vecs_per_row, col = i - row * vecs_per_row;
      const uint32_t b = row / tokens;
      r[u] = ld<H>(residual + i);
      xv[u] = ld<H>(x + i);
      g[u] = gate[b * vecs_per_row + col];
    }
  }
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const uint32_t i = base + u * 256;
    if (i < total) st<H>(out + i, gate_math(r[u], xv[u], g[u]));
  }
}

// concat_mla_k: out[t,h] = nope[t,h] (16 vecs) ++ rope[t] (8 vecs); kVec=8 bf16.
template <int H>
__global__ void __launch_bounds__(192)
    concat_k(const uint4* __restrict__ nope, const uint4* __restrict__ rope,
             uint4* __restrict__ out, int heads) {
  const int c = threadIdx.x;
  const int h = blockIdx.y * blockDim.y + threadIdx.y;
  if (h >= heads) return;
  const int64_t t = blockIdx.x, row = t * heads + h;
  uint4 v = c < 16 ? ld<H>(nope + row * 16 + c) : rope[t * 8 + (c - 16)];
  st<H>(out + row * 24 + c, v);
}
// concat, flat: one thread per output vector over the whole [T*H*24] range, 256 threads.
template <int H, int kWords>
__global__ void __launch_bounds__(256)
    concat_flat(const uint4* __restrict__ nope, const uint4* __restrict__ rope,
                uint4* __restrict__ out, int heads, uint32_t total) {
  const uint32_t base = blockIdx.x * 256 * kWords + threadIdx.x;
  uint4 v[kWords];
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const uint32_t i = base + u * 256;
    if (i < total) {
      const uint32_t row = i / 24, c = i - row * 24;
      const uint32_t t = row / heads;
      v[u] = c < 16 ? ld<H>(nope + row * 16 + c) : rope[t * 8 + (c - 16)];
    }
  }
#pragma unroll
  for (int u = 0; u < kWords; ++u) {
    const uint32_t i = base + u * 256;
    if (i < total) st<H>(out + i, v[u]);
  }
}

// Random finite bf16 pairs (|x| in [2^-8, 2^8)), like torch.randn's bit patterns.
__global__ void fill_random(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    const uint32_t lo = (h & 0x807f) | ((0x77 + ((h >> 7) & 15)) << 7);
    const uint32_t hi = ((h >> 16) & 0x807f) | ((0x77 + ((h >> 23) & 15)) << 7);
    p[i] = lo | (hi << 16);
  }
}
static bool g_random = false;
static void init(void* p, size_t bytes, int byte) {
  if (g_random) {
    fill_random<<<1024, 256>>>(static_cast<uint32_t*>(p), bytes / 4,
                               uint32_t(bytes) ^ uint32_t(byte));
    CK(cudaDeviceSynchronize());
  } else {
    CK(cudaMemset(p, byte, bytes));
  }
}

template <typename F>
float time_us(F&& f, int reps = 60) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  g_random = argc > 1;
  printf("data: %s\n", g_random ? "random" : "memset");
  // ---- copy_rows: src 16384x4096 bf16 -> dst 32768x4096 at 8192 ----
  const int64_t rows = 16384, row_words = 4096 * 2 / 16, dst_rows = 32768;
  uint4 *src, *dst;
  int64_t* sc;
  CK(cudaMalloc(&src, rows * row_words * 16));
  CK(cudaMalloc(&dst, dst_rows * row_words * 16));
  CK(cudaMalloc(&sc, 16));
  init(src, rows * row_words * 16, 1);
  int64_t h_sc[2] = {8192, rows};
  CK(cudaMemcpy(sc, h_sc, 16, cudaMemcpyHostToDevice));
  const double copy_bytes = 2.0 * rows * row_words * 16;
  auto rep = [&](const char* name, float us, double bytes) {
    printf("%-48s %8.2f us %7.1f GB/s\n", name, us, bytes / us / 1e3);
  };
  const int64_t words = rows * row_words;
#define COPY(HINT, W, SC)                                                                       \
  rep("copy " #HINT " words=" #W " scalars=" #SC, time_us([&] {                                 \
        copy_k<HINT, W, SC><<<(words + 256 * W - 1) / (256 * W), 256>>>(src, dst, sc, sc + 1,   \
                                                                        rows, row_words, 8192); \
      }),                                                                                       \
      copy_bytes)
  for (int pass = 0; pass < (g_random ? 1 : 2); ++pass) {
    COPY(kCs, 1, true);
    COPY(kPlain, 1, true);
    COPY(kNcPlain, 1, true);
    COPY(kCsLoadPlainStore, 1, true);
    COPY(kL2EvictFirst, 1, true);
    COPY(kCs, 1, false);
    COPY(kPlain, 1, false);
    COPY(kCs, 2, true);
    COPY(kPlain, 2, true);
    COPY(kCsLoadPlainStore, 2, true);
    COPY(kCs, 4, true);
    COPY(kPlain, 4, true);
    COPY(kCsLoadPlainStore, 4, true);
    for (int blocks : {528, 1056, 2112}) {
      char nm[96];
      snprintf(nm, sizeof nm, "copy grid-stride plain words=4 blocks=%d", blocks);
      rep(nm,
          time_us([&] { copy_gs<kPlain, 4><<<blocks, 256>>>(src, dst, sc, sc + 1, row_words); }),
          copy_bytes);
      snprintf(nm, sizeof nm, "copy grid-stride cs words=4 blocks=%d", blocks);
      rep(nm, time_us([&] { copy_gs<kCs, 4><<<blocks, 256>>>(src, dst, sc, sc + 1, row_words); }),
          copy_bytes);
    }
    rep("cudaMemcpyAsync D2D", time_us([&] {
          CK(cudaMemcpyAsync(dst + 8192 * row_words, src, words * 16, cudaMemcpyDeviceToDevice));
        }),
        copy_bytes);
  }
  CK(cudaFree(src));
  CK(cudaFree(dst));

  // ---- residual_gate_add 16x4096x3072 bf16, gate [B,H] ----
  {
    const uint32_t B = 16, S = 4096, Hd = 3072, vpr = Hd / 8;
    const uint32_t total = B * S * vpr;
    uint4 *r, *x, *g, *o;
    CK(cudaMalloc(&r, size_t(total) * 16));
    CK(cudaMalloc(&x, size_t(total) * 16));
    CK(cudaMalloc(&o, size_t(total) * 16));
    CK(cudaMalloc(&g, size_t(B) * vpr * 16));
    init(r, size_t(total) * 16, 0x3f);
    init(x, size_t(total) * 16, 0x3e);
    init(g, size_t(B) * vpr * 16, 0x3d);
    const double bytes = 3.0 * total * 16 + B * vpr * 16;
#define GATE(HINT, W)                                                                           \
  rep("gate " #HINT " words=" #W, time_us([&] {                                                 \
        gate_k<HINT, W><<<(total + 256 * W - 1) / (256 * W), 256>>>(r, x, g, o, vpr, S, total); \
      }),                                                                                       \
      bytes)
    for (int pass = 0; pass < (g_random ? 1 : 2); ++pass) {
      GATE(kCs, 1);
      GATE(kPlain, 1);
      GATE(kCsLoadPlainStore, 1);
      GATE(kNcPlain, 1);
      GATE(kL2EvictFirst, 1);
      GATE(kCs, 2);
      GATE(kPlain, 2);
      GATE(kCsLoadPlainStore, 2);
      GATE(kPlain, 4);
    }
    CK(cudaFree(r));
    CK(cudaFree(x));
    CK(cudaFree(o));
    CK(cudaFree(g));
  }

  // ---- concat_mla_k T=8192 H=128 ----
  {
    const int T = 8192, Hh = 128;
    uint4 *nope, *rope, *out;
    CK(cudaMalloc(&nope, size_t(T) * Hh * 16 * 16));
    CK(cudaMalloc(&rope, size_t(T) * 8 * 16));
    CK(cudaMalloc(&out, size_t(T) * Hh * 24 * 16));
    init(nope, size_t(T) * Hh * 16 * 16, 1);
    init(rope, size_t(T) * 8 * 16, 2);
    const double bytes = 2.0 * (double(T) * Hh * 128 + T * 64 + double(T) * Hh * 192);
    const uint32_t total = uint32_t(T) * Hh * 24;
#define CONCAT(HINT)                                                                           \
  rep("concat rowblock " #HINT,                                                                \
      time_us([&] { concat_k<HINT><<<dim3(T, Hh / 8), dim3(24, 8)>>>(nope, rope, out, Hh); }), \
      bytes)
#define CONCATF(HINT, W)                                                              \
  rep("concat flat " #HINT " words=" #W, time_us([&] {                                \
        concat_flat<HINT, W>                                                          \
            <<<(total + 256 * W - 1) / (256 * W), 256>>>(nope, rope, out, Hh, total); \
      }),                                                                             \
      bytes)
    for (int pass = 0; pass < (g_random ? 1 : 2); ++pass) {
      CONCAT(kCs);
      CONCAT(kPlain);
      CONCAT(kCsLoadPlainStore);
      CONCAT(kNcPlain);
      CONCATF(kCs, 1);
      CONCATF(kPlain, 1);
      CONCATF(kCsLoadPlainStore, 1);
      CONCATF(kPlain, 2);
      CONCATF(kCsLoadPlainStore, 2);
    }
    // torch.cat-like reference point: a plain copy of the same bytes.
    CK(cudaFree(nope));
    CK(cudaFree(rope));
    CK(cudaFree(out));
  }
  return 0;
}
