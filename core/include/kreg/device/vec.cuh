// Vectorized global-memory access for kreg's CUDA kernels.
//
// A kernel moves data through vec_t<T, N>: N elements of T that travel together in the
// widest load or store their size allows (one 16-byte instruction for 8 bf16 or 4 float,
// several for a 32-byte vec_t<float, 8>). Arithmetic converts to float once, does fp32
// math and rounds once at the store, so the kernel body reads like the formula:
//
//   vec_t<float, 8> a;
//   a.cast_load(x + i);                   // 8 bf16 -> 8 floats
//   for (int j = 0; j < 8; ++j) a[j] *= scale;
//   a.cast_store(out + i);                // 8 floats -> 8 bf16, round-to-nearest-even
//
// Alignment: load/store need `ptr` aligned to min(16, sizeof(T) * N) bytes. Host
// launchers pick N from the pointers and the row length (see max_vec_elems below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace kreg::device {

// ---- Scalar conversions ----

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// to_float for a value converted once already and needed again later (after a block
// reduction, say). The conversion is an opaque instruction the compiler cannot merge with
// the first one, so it keeps the packed 16-bit value live (half the registers) rather than
// the floats of the first conversion; the instruction is cheaper than the occupancy.
__device__ __forceinline__ float to_float_again(float v) { return v; }
__device__ __forceinline__ float to_float_again(__half v) {
  float f;
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(__half_as_ushort(v)));
  return f;
}
__device__ __forceinline__ float to_float_again(__nv_bfloat16 v) {
  float f;
  asm volatile("mov.b32 %0, {%1, %2};" : "=f"(f) : "h"(uint16_t{0}), "h"(__bfloat16_as_ushort(v)));
  return f;
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, float>, "kreg vec_t: element type must be float/half/bf16");
    return v;
  }
}

namespace detail {

// The unsigned type the hardware moves in one instruction of `kBytes` bytes.
template <int kBytes>
struct RawWord;
template <>
struct RawWord<16> {
  using type = uint4;
};
template <>
struct RawWord<8> {
  using type = uint2;
};
template <>
struct RawWord<4> {
  using type = uint32_t;
};
template <>
struct RawWord<2> {
  using type = uint16_t;
};
template <>
struct RawWord<1> {
  using type = uint8_t;
};

// Two floats into a packed pair of 16-bit floats: a single cvt instruction on sm_80+.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_float2(type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ type from_float2(float2 v) { return __float22bfloat162_rn(v); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ float2 to_float2(type v) { return __half22float2(v); }
  static __device__ __forceinline__ type from_float2(float2 v) { return __float22half2_rn(v); }
};

}  // namespace detail

// word_t<kBytes>: the unsigned type the hardware moves in one load or store of kBytes
// bytes (16, 8, 4, 2 or 1). vec_t moves its data as these; kernels that copy bytes
// without looking at them (a row of row_bytes bytes as row_bytes / kBytes words, every
// address kBytes-aligned) use them directly.
template <int kBytes>
using word_t = typename detail::RawWord<kBytes>::type;

template <typename T, int N>
struct vec_t {
  static_assert(N > 0 && (N & (N - 1)) == 0, "kreg vec_t: N must be a power of two");
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  // Bytes per memory instruction: the whole vector up to 16 (the widest LDG/STG).
  static constexpr int kWordBytes = kBytes < 16 ? kBytes : 16;
  using Word = word_t<kWordBytes>;
  static constexpr int kWords = kBytes / kWordBytes;

  alignas(kWordBytes) T data[N];

  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }

  __device__ __forceinline__ void fill(T v) {
#pragma unroll
    for (int i = 0; i < N; ++i) data[i] = v;
  }

  // `ptr` must be aligned to kWordBytes.
  __device__ __forceinline__ void load(const T* ptr) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(data)[w] = reinterpret_cast<const Word*>(ptr)[w];
    }
  }

  __device__ __forceinline__ void store(T* ptr) const {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(ptr)[w] = reinterpret_cast<const Word*>(data)[w];
    }
  }

  // load through the read-only (non-coherent) path, ld.global.nc: for inputs no thread of
  // the kernel writes (a row shared by many blocks, say, that should stay in L1/L2).
  __device__ __forceinline__ void load_nc(const T* ptr) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(data)[w] = __ldg(reinterpret_cast<const Word*>(ptr) + w);
    }
  }

  // load through the read-only path without allocating in L1 (ld.global.nc.L1::no_allocate):
  // for data a kernel reads once, so that it does not evict what other rows re-read from L1.
  __device__ __forceinline__ void load_no_l1(const T* ptr) {
    if constexpr (kWordBytes == 16) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        uint4& d = reinterpret_cast<uint4*>(data)[w];
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d.x), "=r"(d.y), "=r"(d.z), "=r"(d.w)
                     : "l"(reinterpret_cast<const uint4*>(ptr) + w));
      }
    } else {
      load_nc(ptr);
    }
  }

  // load/store with an evict-first hint (ld/st.global.cs), for data a kernel touches once.
  __device__ __forceinline__ void load_stream(const T* ptr) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      reinterpret_cast<Word*>(data)[w] = __ldcs(reinterpret_cast<const Word*>(ptr) + w);
    }
  }

  __device__ __forceinline__ void store_stream(T* ptr) const {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      __stcs(reinterpret_cast<Word*>(ptr) + w, reinterpret_cast<const Word*>(data)[w]);
    }
  }

  // Loads N elements of U from `ptr` (aligned for vec_t<U, N>) and converts them to T.
  template <typename U>
  __device__ __forceinline__ void cast_load(const U* ptr) {
    vec_t<U, N> raw;
    raw.load(ptr);
    cast_from(raw);
  }

  // Converts to U (round-to-nearest-even) and stores N elements at `ptr`.
  template <typename U>
  __device__ __forceinline__ void cast_store(U* ptr) const {
    vec_t<U, N> raw;
    raw.cast_from(*this);
    raw.store(ptr);
  }

  // Element-wise conversion, through float; packed pairs where the hardware has them.
  template <typename U>
  __device__ __forceinline__ void cast_from(const vec_t<U, N>& src) {
    if constexpr (std::is_same_v<T, U>) {
      *this = src;
    } else if constexpr (std::is_same_v<T, float> && !std::is_same_v<U, float> && N % 2 == 0) {
      using P = detail::Pair<U>;
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const float2 f = P::to_float2(*reinterpret_cast<const typename P::type*>(&src.data[i]));
        data[i] = f.x;
        data[i + 1] = f.y;
      }
    } else if constexpr (std::is_same_v<U, float> && !std::is_same_v<T, float> && N % 2 == 0) {
      using P = detail::Pair<T>;
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        *reinterpret_cast<typename P::type*>(&data[i]) =
            P::from_float2(make_float2(src.data[i], src.data[i + 1]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) data[i] = from_float<T>(to_float(src.data[i]));
    }
  }
};

// ---- Host side: choosing the vector width ----

// The widest element count N (a power of two, at most 16 bytes of T) such that every
// row of `row_elems` elements starting at each of `ptrs` is aligned for vec_t<T, N>.
// Rows are contiguous, so row r starts at ptr + r * row_elems: N must divide row_elems
// and each base address must be aligned to N * sizeof(T).
template <typename T, typename... Ptrs>
__host__ __device__ inline int max_vec_elems(int64_t row_elems, const Ptrs*... ptrs) {
  int n = 16 / static_cast<int>(sizeof(T));
  const uintptr_t addr_bits = (reinterpret_cast<uintptr_t>(ptrs) | ... | uintptr_t{0});
  while (n > 1 && (row_elems % n != 0 || addr_bits % (n * sizeof(T)) != 0)) n /= 2;
  return n;
}

// Calls fn(std::integral_constant<int, N>{}) with N = vec_elems (a width max_vec_elems<T>
// returned) and returns fn's result, so that a launcher instantiates its kernel once per
// width (8, 4, 2, 1 for 16-bit T; 4, 2, 1 for float) without a switch of its own:
//
//   return visit_vec_elems<T>(max_vec_elems<T>(d, x, out), [&](auto vec) {
//     return launch<T, decltype(vec)::value>(x, out, rows, d, stream);
//   });
template <typename T, int N = 16 / static_cast<int>(sizeof(T)), typename Fn>
decltype(auto) visit_vec_elems(int vec_elems, Fn&& fn) {
  if constexpr (N > 1) {
    if (vec_elems < N) return visit_vec_elems<T, N / 2>(vec_elems, static_cast<Fn&&>(fn));
  }
  return fn(std::integral_constant<int, N>{});
}

}  // namespace kreg::device
