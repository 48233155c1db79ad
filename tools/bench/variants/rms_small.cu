// Scratch: rmsnorm T=64 H=7168 bf16 launch-shape variants, timed as CUDA-graph replays
// of a 64-call chain (each call reads the previous call's output), plain and PDL.
// nvcc -O3 -arch=sm_90 -std=c++17 rms_small.cu -o rs && ./rs
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_go() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__device__ __forceinline__ float sumsq(uint4 v) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  float s = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(p[j]);
    s += f.x * f.x + f.y * f.y;
  }
  return s;
}
__device__ __forceinline__ uint4 norm(uint4 v, uint4 w, float scale) {
  uint4 y;
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  const __nv_bfloat162* q = reinterpret_cast<const __nv_bfloat162*>(&w);
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&y);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(p[j]), g = __bfloat1622float2(q[j]);
    o[j] = __floats2bfloat162_rn(f.x * scale * g.x, f.y * scale * g.y);
  }
  return y;
}

__device__ __forceinline__ float block_sum(float v, float* sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  v = lane < nw ? sm[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// kItems vectors a thread, one row a block (or a cluster of kSplit blocks per row).
template <int kItems, bool kWeightEarly, int kSplit>
__global__ void rms(const uint4* in, const uint4* __restrict__ w, uint4* out, int vpr, float eps) {
  __shared__ float sm[33];
  const int row = blockIdx.x / kSplit, part = blockIdx.x % kSplit;
  const int vpart = vpr / kSplit;
  const uint4* x = in + int64_t(row) * vpr + part * vpart;
  const uint4* ww = w + part * vpart;
  uint4* y = out + int64_t(row) * vpr + part * vpart;
  uint4 v[kItems], wv[kItems];
  pdl_wait();
  float s = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < vpart) {
      v[k] = x[i];
      if (kWeightEarly) wv[k] = ww[i];
    }
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < vpart) s += sumsq(v[k]);
  }
  s = block_sum(s, sm);
  if constexpr (kSplit > 1) {
    cg::cluster_group cl = cg::this_cluster();
    if (threadIdx.x == 0) sm[32] = s;
    cl.sync();
    float tot = 0;
#pragma unroll
    for (int r = 0; r < kSplit; ++r) tot += *cl.map_shared_rank(&sm[32], r);
    s = tot;
    cl.sync();  // peers' smem stays alive until all have read it
  }
  pdl_go();
  const float scale = rsqrtf(s / float(vpr * 8) + eps);
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < vpart) {
      if (!kWeightEarly) wv[k] = ww[i];
      y[i] = norm(v[k], wv[k], scale);
    }
  }
}

struct Variant {
  const char* name;
  void (*kernel)(const uint4*, const uint4*, uint4*, int, float);
  int threads, split;
};

int main() {
  const int T = 64, H = 7168, vpr = H / 8;
  const int kBufs = 5, kCalls = 64;
  std::vector<uint4*> buf(kBufs);
  for (auto& b : buf) {
    CK(cudaMalloc(&b, size_t(T) * vpr * 16));
    std::vector<__nv_bfloat16> h(size_t(T) * H);
    for (size_t i = 0; i < h.size(); ++i)
      h[i] = __float2bfloat16(0.5f + (i * 2654435761u % 1000) / 1000.f);
    CK(cudaMemcpy(b, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  uint4* w;
  CK(cudaMalloc(&w, vpr * 16));
  {
    std::vector<__nv_bfloat16> h(H);
    for (int i = 0; i < H; ++i) h[i] = __float2bfloat16(1.0f + (i % 7) * 0.01f);
    CK(cudaMemcpy(w, h.data(), H * 2, cudaMemcpyHostToDevice));
  }
  Variant vs[] = {
      {"448x2 weight-after (kreg)", rms<2, false, 1>, 448, 1},
      {"448x2 weight-with-x", rms<2, true, 1>, 448, 1},
      {"896x1 weight-after", rms<1, false, 1>, 896, 1},
      {"896x1 weight-with-x", rms<1, true, 1>, 896, 1},
      {"cluster2 448x1 weight-after", rms<1, false, 2>, 448, 2},
      {"cluster2 448x1 weight-with-x", rms<1, true, 2>, 448, 2},
      {"cluster4 224x1 weight-with-x", rms<1, true, 4>, 224, 4},
      {"cluster2 224x2 weight-with-x", rms<2, true, 2>, 224, 2},
      {"cluster7 128x1 weight-with-x", rms<1, true, 7>, 128, 7},
  };
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int pass = 0; pass < 3; ++pass) {
    for (const Variant& v : vs) {
      for (int pdl = 0; pdl < 2; ++pdl) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < kCalls; ++c) {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(T * v.split);
          cfg.blockDim = dim3(v.threads);
          cfg.stream = st;
          cudaLaunchAttribute at[2];
          int n = 0;
          if (pdl) {
            at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[n].val.programmaticStreamSerializationAllowed = 1;
            ++n;
          }
          if (v.split > 1) {
            at[n].id = cudaLaunchAttributeClusterDimension;
            at[n].val.clusterDim.x = v.split;
            at[n].val.clusterDim.y = 1;
            at[n].val.clusterDim.z = 1;
            ++n;
          }
          cfg.attrs = at;
          cfg.numAttrs = n;
          CK(cudaLaunchKernelEx(&cfg, v.kernel, (const uint4*)buf[c % kBufs], (const uint4*)w,
                                buf[(c + 1) % kBufs], vpr, 1e-6f));
        }
        CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, st));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<float> ts;
        for (int r = 0; r < 50; ++r) {
          CK(cudaEventRecord(a, st));
          CK(cudaGraphLaunch(ge, st));
          CK(cudaEventRecord(b, st));
          CK(cudaEventSynchronize(b));
          float ms;
          CK(cudaEventElapsedTime(&ms, a, b));
          ts.push_back(ms * 1000 / kCalls);
        }
        std::sort(ts.begin(), ts.end());
        printf("%-34s %s %6.2f us/call\n", v.name, pdl ? "pdl  " : "plain", ts[ts.size() / 2]);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
    }
  }
  return 0;
}
