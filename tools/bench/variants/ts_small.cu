// Scratch: diffusion.timestep_embedding at decode sizes (N = 2 dim = 320 shift 1, the SD
// UNet's; N = 16 dim = 256 flip, Flux's), where torch.compile's one Triton kernel took
// 1.31 us a call and kreg's 1.52 (H200, graph replays). Which part of the kernel is the
// difference: the double-precision exp of the frequencies, the grid (a block a row), or
// nothing but the node itself?
//   nvcc -O3 -arch=sm_90 -std=c++17 ts_small.cu -o ts && ./ts
//
// Variants (fp32 output [N, dim], t fp32; every exact variant is checked bit for bit
// against V0, the plugin's small-call kernel):
//   V0 plugin   one frequency a thread, a block row per row, exp in double (the plugin)
//   V1 param    frequencies computed on the host (the same double exp), passed in a
//               __grid_constant__ table of the launch's parameters
//   V2 table    the same table in device memory (__ldg)
//   V3 one blk  V0's math, one block for all rows (thread = (row, frequency))
//   V4 expf     fp32 expf: NOT the reference's frequencies (informational only)
//   Z  floor    a kernel that stores zeros to the same output: the node's cost alone
// Timing: a CUDA graph of 64 calls, median of 200 replays, per call; each variant twice,
// interleaved.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

struct Emb {
  int64_t half;
  bool flip, pad;
  float log_max_period, denominator, scale;
};

__host__ __device__ inline float freq_of(const Emb& e, int64_t i) {
  const float exponent = (-e.log_max_period * static_cast<float>(i)) / e.denominator;
  return static_cast<float>(exp(static_cast<double>(exponent)));
}

constexpr int kTable = 512;
struct Table {
  float f[kTable];
};

template <int kMode>  // 0 double exp, 1 param table, 2 device table, 4 expf
__global__ void __launch_bounds__(256)
    ts_rowblock(const float* __restrict__ t, float* __restrict__ out, int64_t rows, int64_t dim,
                Emb e, const __grid_constant__ Table tab, const float* __restrict__ dtab) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = blockIdx.y;
  const float tv = t[r];
  float f = 0.0f;
  if (i < e.half) {
    if constexpr (kMode == 0) f = freq_of(e, i);
    if constexpr (kMode == 1) f = tab.f[i];
    if constexpr (kMode == 2) f = __ldg(dtab + i);
    if constexpr (kMode == 4) f = expf((-e.log_max_period * static_cast<float>(i)) / e.denominator);
  }
  float s, c;
  sincosf((tv * f) * e.scale, &s, &c);
  float* row = out + r * dim;
  if (i < e.half) {
    row[(e.flip ? e.half : 0) + i] = s;
    row[(e.flip ? 0 : e.half) + i] = c;
  }
  if (e.pad && blockIdx.x == 0 && threadIdx.x == 0) row[dim - 1] = 0.0f;
}

__global__ void ts_oneblock(const float* __restrict__ t, float* __restrict__ out, int64_t rows,
                            int64_t dim, Emb e) {
  for (int64_t k = threadIdx.x; k < rows * e.half; k += blockDim.x) {
    const int64_t r = k / e.half, i = k - r * e.half;
    const float f = freq_of(e, i);
    float s, c;
    sincosf((t[r] * f) * e.scale, &s, &c);
    float* row = out + r * dim;
    row[(e.flip ? e.half : 0) + i] = s;
    row[(e.flip ? 0 : e.half) + i] = c;
    if (e.pad && i == 0) row[dim - 1] = 0.0f;
  }
}

__global__ void zero_kernel(float* __restrict__ out, int64_t n) {
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) out[k] = 0.0f;
}

struct Case {
  const char* name;
  int64_t rows, dim;
  bool flip;
  double shift;
};

int main() {
  const Case cases[] = {{"N=2 dim=320 shift 1", 2, 320, false, 1.0},
                        {"N=16 dim=256 flip", 16, 256, true, 0.0}};
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  bool all_ok = true;
  for (const Case& cs : cases) {
    Emb e{};
    e.half = cs.dim / 2;
    e.flip = cs.flip;
    e.pad = cs.dim % 2 == 1;
    e.log_max_period = static_cast<float>(std::log(10000.0));
    e.denominator = static_cast<float>(static_cast<double>(e.half) - cs.shift);
    e.scale = 1.0f;
    Table tab{};
    for (int64_t i = 0; i < e.half; ++i) tab.f[i] = freq_of(e, i);
    constexpr int kSets = 4;
    std::vector<float> ht(cs.rows * kSets);
    uint32_t seed = 12345;
    for (auto& v : ht) {
      seed = seed * 1664525u + 1013904223u;
      v = static_cast<float>(seed >> 8) / static_cast<float>(1 << 24) * 1000.0f;
    }
    float *t, *out, *dtab;
    const size_t out_n = static_cast<size_t>(cs.rows * cs.dim);
    CK(cudaMalloc(&t, ht.size() * 4));
    CK(cudaMalloc(&out, out_n * kSets * 4));
    CK(cudaMalloc(&dtab, kTable * 4));
    CK(cudaMemcpy(t, ht.data(), ht.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dtab, tab.f, kTable * 4, cudaMemcpyHostToDevice));
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(256, (e.half + 31) / 32 * 32));
    const dim3 grid(static_cast<unsigned>((e.half + threads - 1) / threads),
                    static_cast<unsigned>(cs.rows));
    const unsigned one_threads =
        static_cast<unsigned>(std::min<int64_t>(1024, (cs.rows * e.half + 31) / 32 * 32));
    auto launch = [&](int v, int set) {
      const float* ts = t + set * cs.rows;
      float* o = out + set * out_n;
      switch (v) {
        case 0:
          ts_rowblock<0><<<grid, threads, 0, st>>>(ts, o, cs.rows, cs.dim, e, tab, dtab);
          break;
        case 1:
          ts_rowblock<1><<<grid, threads, 0, st>>>(ts, o, cs.rows, cs.dim, e, tab, dtab);
          break;
        case 2:
          ts_rowblock<2><<<grid, threads, 0, st>>>(ts, o, cs.rows, cs.dim, e, tab, dtab);
          break;
        case 3:
          ts_oneblock<<<1, one_threads, 0, st>>>(ts, o, cs.rows, cs.dim, e);
          break;
        case 4:
          ts_rowblock<4><<<grid, threads, 0, st>>>(ts, o, cs.rows, cs.dim, e, tab, dtab);
          break;
        default:
          zero_kernel<<<1, 256, 0, st>>>(o, static_cast<int64_t>(out_n));
          break;
      }
    };
    const char* names[] = {"V0 plugin (double exp)", "V1 param table",    "V2 device table",
                           "V3 one block",           "V4 expf (inexact)", "Z  zero-store floor"};
    // Correctness: every exact variant equals V0 bit for bit on all sets.
    std::vector<float> ref(out_n * kSets), got(out_n * kSets);
    for (int s = 0; s < kSets; ++s) launch(0, s);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(ref.data(), out, ref.size() * 4, cudaMemcpyDeviceToHost));
    for (int v = 1; v <= 4; ++v) {
      CK(cudaMemset(out, 0xff, out_n * kSets * 4));
      for (int s = 0; s < kSets; ++s) launch(v, s);
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
      size_t diff = 0;
      float worst = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        if (std::memcmp(&got[k], &ref[k], 4) != 0) {
          ++diff;
          worst = std::max(worst, std::fabs(got[k] - ref[k]));
        }
      }
      const bool exact = v != 4;
      printf("%s %s: %zu of %zu values differ from V0 (max |d| %.3g)%s\n", cs.name, names[v], diff,
             got.size(), worst, exact ? (diff ? "  FAIL" : "  OK") : "  (not required)");
      if (exact && diff) all_ok = false;
    }
    // Timing.
    constexpr int kCalls = 64, kReps = 200;
    double med[6][2];
    for (int round = 0; round < 2; ++round) {
      for (int v = 0; v < 6; ++v) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < kCalls; ++c) launch(v, c % kSets);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, st));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ms(kReps);
        for (int r = 0; r < kReps; ++r) {
          CK(cudaEventRecord(a, st));
          CK(cudaGraphLaunch(ge, st));
          CK(cudaEventRecord(b, st));
          CK(cudaEventSynchronize(b));
          CK(cudaEventElapsedTime(&ms[r], a, b));
        }
        std::sort(ms.begin(), ms.end());
        med[v][round] = ms[kReps / 2] * 1e3 / kCalls;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        CK(cudaEventDestroy(a));
        CK(cudaEventDestroy(b));
      }
    }
    for (int v = 0; v < 6; ++v) {
      printf("%s %-24s %6.3f / %6.3f us a call\n", cs.name, names[v], med[v][0], med[v][1]);
    }
    CK(cudaFree(t));
    CK(cudaFree(out));
    CK(cudaFree(dtab));
  }
  printf(all_ok ? "ALL OK\n" : "SOME CHECK FAILED\n");
  return all_ok ? 0 : 1;
}
