// kreg_jit/prelude.cuh: what a JIT source (docs/jit.md) compiles against under NVRTC.
// Self-contained on purpose: NVRTC gets no include path, so a JIT source and its headers
// are exactly the text hashed into its cache key. The element types are named as kreg
// names dtypes (f32, f16, bf16), so a kernel expression "k<{dtype}>" reads
// "kreg_jit::k<kreg_jit::bf16>" once the dtype is filled in. Conversions go through PTX
// (round to nearest even), as cuda_bf16.h's do.
#pragma once

namespace kreg_jit {

using f32 = float;
struct f16 {
  unsigned short bits;
};
struct bf16 {
  unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}
__device__ __forceinline__ float to_float(f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}

template <typename T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float f) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}
template <>
__device__ __forceinline__ f16 from_float<f16>(float f) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}

// N elements of T moved as one load or store of N * sizeof(T) bytes (16 at most).
template <int Bytes>
struct Word;
template <>
struct Word<16> {
  using type = uint4;
};
template <>
struct Word<8> {
  using type = uint2;
};
template <>
struct Word<4> {
  using type = unsigned;
};
template <>
struct Word<2> {
  using type = unsigned short;
};

template <typename T, int N>
struct Vec {
  using W = typename Word<N * sizeof(T)>::type;
  union {
    W word;
    T elems[N];
  };
  __device__ __forceinline__ void load(const T* p) { word = *reinterpret_cast<const W*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<W*>(p) = word; }
};
template <int N>
struct Vec<f32, N> {
  f32 elems[N];
  __device__ __forceinline__ void load(const f32* p) {
#pragma unroll
    for (int i = 0; i < N; ++i) elems[i] = p[i];
  }
  __device__ __forceinline__ void store(f32* p) const {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = elems[i];
  }
};
template <>
struct Vec<f32, 4> {
  union {
    float4 word;
    f32 elems[4];
  };
  __device__ __forceinline__ void load(const f32* p) { word = *reinterpret_cast<const float4*>(p); }
  __device__ __forceinline__ void store(f32* p) const { *reinterpret_cast<float4*>(p) = word; }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Programmatic dependent launch (sm90+): no-ops elsewhere and when launched without it.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace kreg_jit
