// CUDA per-token and per-tensor FP8 quantization, with quant_math.hpp's arithmetic (bytes
// and scales equal the CPU reference's).
//
// Both quantize with quant_math.hpp's e4m3_codes_recip (a bracketed multiplication by 1/s,
// exact, with the division where it cannot decide a code) rather than a division per
// element.
//
// per_token_quant_fp8: one block per row. Each thread keeps its (at most kRegs) vectors of
// the row in registers between the max and the quantization, so every byte is read once;
// rows too long for that (more than 8 * 1024 vectors) are read a second time (kRegs = 0).
//
// per_tensor_quant_fp8, dynamic: cudaMemsetAsync(scale, 0), then a grid-stride max kernel
// whose blocks each fold their scale max(amax_b, eps) / 448 into scale[0] by atomicMax on
// the bits (non-negative floats order as their bits; the division is monotonic, so the
// largest block scale is the scale of the largest |x|), then the quantize kernel, which
// reads scale[0] on the device. No host synchronisation, graph-capturable; the result does
// not depend on the order of the atomics.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"
#include "quant_math.hpp"
#include "quantization.hpp"

namespace kreg::quantization {
namespace {

using device::vec_t;

__device__ __forceinline__ uint8_t e4m3(float v, float s) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(scaled_clamped(v, s, kFp8Max), __NV_SATFINITE, __NV_E4M3));
}

// The codes of v under scale s, stored at dst; r = RN(1 / s). Whole words of four codes
// by quant_math.hpp's reciprocal (exact; the division only for a word it cannot decide),
// single codes by the division.
template <bool kPerWord, int kVec>
__device__ __forceinline__ void quantize_store(const vec_t<float, kVec>& v, float s, float r,
                                               uint8_t* dst) {
  if constexpr (kVec % 4 == 0) {
    vec_t<uint32_t, kVec / 4> w;
    // per_token keeps a row's vectors in registers: the per-word fallback of
    // e4m3_codes_recip (the group kernel's) measured 14% slower here on an H200 (278 us
    // against 245 at 32768 x 7168), so a vector the bracket cannot decide is redone
    // whole. per_tensor takes the group kernel's path (317 us against 347).
    if constexpr (kPerWord) {
      if (e4m3_recip_ok(s)) {
        e4m3_codes_recip<kVec>(v.data, s, r, w.data);
      } else {
        e4m3_codes_div<kVec>(v.data, s, w.data);
      }
    } else if (!e4m3_recip_ok(s) || e4m3_codes_bracket<kVec>(v.data, r, w.data) != 0) {
      e4m3_codes_div<kVec>(v.data, s, w.data);
    }
    w.store_stream(reinterpret_cast<uint32_t*>(dst));
  } else {
    vec_t<uint8_t, kVec> q;
#pragma unroll
    for (int j = 0; j < kVec; ++j) q[j] = e4m3(v[j], s);
    q.store_stream(dst);
  }
}

// ---- per_token_quant_fp8 ----

// Launched with up to 1024 threads: the bound keeps the registers within an SM's 64K for
// that many (kRegs = 8 of bf16 took 72 without it, and a launch of over 896 threads failed).
template <typename T, int kVec, int kRegs>
__global__ void __launch_bounds__(1024)
    token_quant_kernel(const T* __restrict__ x, uint8_t* __restrict__ out,
                       float* __restrict__ scales, int64_t h) {
  __shared__ float scratch[device::kWarpSize];
  const int64_t row = blockIdx.x;
  const int64_t nvec = h / kVec;
  const T* src = x + row * h;
  uint8_t* dst = out + row * h;
  const int64_t tid = threadIdx.x;
  const int64_t stride = blockDim.x;
  device::pdl_wait();
  float amax = 0.0f;
  vec_t<T, kVec> regs[kRegs > 0 ? kRegs : 1];
  if constexpr (kRegs > 0) {
#pragma unroll
    for (int k = 0; k < kRegs; ++k) {
      const int64_t i = tid + k * stride;
      if (i < nvec) {
        regs[k].load_stream(src + i * kVec);
        vec_t<float, kVec> v;
        v.cast_from(regs[k]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));
      }
    }
  } else {
    for (int64_t i = tid; i < nvec; i += stride) {
      vec_t<float, kVec> v;
      v.cast_load(src + i * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));
    }
  }
  device::pdl_launch_dependents();
  amax = device::block_row_max(amax, scratch);
  const float s = group_scale(amax, kDefaultEps, kFp8Max);
  const float r = __frcp_rn(s);
  if (tid == 0) scales[row] = s;
  if constexpr (kRegs > 0) {
#pragma unroll
    for (int k = 0; k < kRegs; ++k) {
      const int64_t i = tid + k * stride;
      if (i < nvec) {
        vec_t<float, kVec> v;
        v.cast_from(regs[k]);
        quantize_store<false>(v, s, r, dst + i * kVec);
      }
    }
  } else {
    for (int64_t i = tid; i < nvec; i += stride) {
      vec_t<float, kVec> v;
      v.cast_load(src + i * kVec);
      quantize_store<false>(v, s, r, dst + i * kVec);
    }
  }
}

template <typename T, int kVec, int kRegs>
cudaError_t launch_token(const T* x, uint8_t* out, float* scales, int64_t rows, int64_t h,
                         int threads, cudaStream_t stream, bool pdl) {
  return device::launch(token_quant_kernel<T, kVec, kRegs>, dim3(static_cast<unsigned>(rows)),
                        dim3(static_cast<unsigned>(threads)), 0, stream, pdl, x, out, scales, h);
}

template <typename T, int kVec>
cudaError_t launch_token_vec(const T* x, uint8_t* out, float* scales, int64_t rows, int64_t h,
                             cudaStream_t stream, bool pdl) {
  const int64_t nvec = h / kVec;
  auto threads_for = [&](int64_t per_thread) {
    const int64_t t = (nvec + per_thread - 1) / per_thread;
    return static_cast<int>(std::max<int64_t>(32, (t + 31) / 32 * 32));
  };
  // The fewest vectors per thread that keeps the block at <= 256 threads, up to 8 (then up
  // to 1024 threads), else the two-pass form.
  if (nvec <= 256)
    return launch_token<T, kVec, 1>(x, out, scales, rows, h, threads_for(1), stream, pdl);
  if (nvec <= 512)
    return launch_token<T, kVec, 2>(x, out, scales, rows, h, threads_for(2), stream, pdl);
  if (nvec <= 1024)
    return launch_token<T, kVec, 4>(x, out, scales, rows, h, threads_for(4), stream, pdl);
  if (nvec <= 8 * 1024)
    return launch_token<T, kVec, 8>(x, out, scales, rows, h, threads_for(8), stream, pdl);
  return launch_token<T, kVec, 0>(x, out, scales, rows, h, 1024, stream, pdl);
}

// ---- per_tensor_quant_fp8 ----

template <typename T, int kVec>
__global__ void tensor_amax_kernel(const T* __restrict__ x, int64_t nvec,
                                   unsigned int* __restrict__ scale_bits) {
  __shared__ float scratch[device::kWarpSize];
  float amax = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec;
       i += stride) {
    vec_t<float, kVec> v;
    v.cast_load(x + i * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = device::block_row_max(amax, scratch);
  if (threadIdx.x == 0) atomicMax(scale_bits, float_bits(group_scale(amax, kDefaultEps, kFp8Max)));
}

template <typename T, int kVec>
__global__ void tensor_quant_kernel(const T* __restrict__ x, uint8_t* __restrict__ out,
                                    const float* __restrict__ scale, int64_t nvec) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nvec) return;
  const float s = *scale;
  const float r = __frcp_rn(s);
  vec_t<T, kVec> raw;
  raw.load_stream(x + i * kVec);
  vec_t<float, kVec> v;
  v.cast_from(raw);
  quantize_store<true>(v, s, r, out + i * kVec);
}

constexpr int kFlatThreads = 256;

template <typename T, int kVec>
cudaError_t launch_tensor(const T* x, uint8_t* out, float* scale, int64_t n, bool is_static,
                          cudaStream_t stream) {
  const int64_t nvec = n / kVec;
  if (!is_static) {
    if (cudaError_t err = cudaMemsetAsync(scale, 0, sizeof(float), stream); err != cudaSuccess) {
      return err;
    }
    int dev = 0;
    int sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      sms = 132;
    }
    const int64_t want = (nvec + kFlatThreads - 1) / kFlatThreads;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(want, int64_t{sms} * 8));
    tensor_amax_kernel<T, kVec>
        <<<blocks, kFlatThreads, 0, stream>>>(x, nvec, reinterpret_cast<unsigned int*>(scale));
    if (cudaError_t err = cudaPeekAtLastError(); err != cudaSuccess) return err;
  }
  const auto blocks = static_cast<unsigned>((nvec + kFlatThreads - 1) / kFlatThreads);
  tensor_quant_kernel<T, kVec><<<blocks, kFlatThreads, 0, stream>>>(x, out, scale, nvec);
  return cudaPeekAtLastError();
}

uint8_t* out_bytes(DLTensor& out) { return static_cast<uint8_t*>(out.data) + out.byte_offset; }

}  // namespace

KernelStatus token_quant_fp8_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                  DLTensor& out_scales) {
  const char* op = ctx.op();
  const int64_t rows = x.shape[0];
  const int64_t h = x.shape[1];
  if (rows == 0) return kOk;
  if (rows > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: T = %lld is too large (one block per row)", op,
                    static_cast<long long>(rows));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    const T* xp = data_ptr<const T>(x);
    uint8_t* outp = out_bytes(out);
    float* sp = data_ptr<float>(out_scales);
    const bool vec =
        h % kVec == 0 && device::aligned16(xp) && reinterpret_cast<uintptr_t>(outp) % kVec == 0;
    cudaError_t err = vec ? launch_token_vec<T, kVec>(xp, outp, sp, rows, h, stream, ctx.pdl())
                          : launch_token_vec<T, 1>(xp, outp, sp, rows, h, stream, ctx.pdl());
    if (err != cudaSuccess) cudaGetLastError();
    return device::launch_status(ctx, op, err);
  });
}

KernelStatus tensor_quant_fp8_cuda(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& scale,
                                   bool is_static) {
  const char* op = ctx.op();
  const int64_t n = x.shape[0] * x.shape[1];
  if (n == 0) return kOk;  // nothing to scale: the scale is left as it is
  if (n / kFlatThreads > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: x has too many elements (%lld)", op,
                    static_cast<long long>(n));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    const T* xp = data_ptr<const T>(x);
    uint8_t* outp = out_bytes(out);
    float* sp = data_ptr<float>(scale);
    const bool vec =
        n % kVec == 0 && device::aligned16(xp) && reinterpret_cast<uintptr_t>(outp) % kVec == 0;
    cudaError_t err = vec ? launch_tensor<T, kVec>(xp, outp, sp, n, is_static, stream)
                          : launch_tensor<T, 1>(xp, outp, sp, n, is_static, stream);
    if (err != cudaSuccess) cudaGetLastError();
    return device::launch_status(ctx, op, err);
  });
}

}  // namespace kreg::quantization
