// CUDA per-token-group quantization (fp8 and int8, row- and column-major scales, the fused
// silu_and_mul form): the arithmetic of quant_math.hpp, so the bytes and scales equal the
// CPU reference's.
//
// Fast path (group_size / kVec a power of two, kVec = 16 / sizeof(T), 16-byte aligned x
// and kVec-aligned out): each thread holds kPer 16-byte vectors of one group (two loads
// each for the fused op: gate and up), vector k * lanes + sub of the group for its lane
// sub, so every load instruction of a warp reads runs of lanes * 16 contiguous bytes. All
// loads are issued before any arithmetic; the group's max travels by butterfly shuffles
// inside its lanes (no shared memory); lane 0 stores the scale. kPer = 4 on large
// problems: 64 bytes in flight per thread and the per-thread work (index split, shuffles,
// the scale and its reciprocal) spread over 32 elements, where one vector per thread left
// the kernel issue-bound at 60% of copy bandwidth on an H200. kPer = 1 on decode-sized
// problems, which are latency-bound: the most threads, the shortest chain per thread.
// The e4m3 codes come from a multiplication by 1/s: exact as it is for a power-of-two s
// (UE8M0), else bracketed on both sides, which decides almost every code exactly; only a
// word of four codes the bracket cannot decide is redone with the division
// (quant_math.hpp: e4m3_codes_recip, with the proof). Redoing a thread's 32 codes instead
// left the kernel issue-bound at 75% of copy: bf16 data makes near ties common enough
// that most warps took the division path. Loads and stores carry
// an evict-first hint: every byte is touched once.
//
// Fallback (any other group size or alignment): one warp per group, scalar loads, the max
// in a first pass and the quantization in a second one over the same (now cached) group.
//
// Indices: a launch covers at most 2^31 - 1 threads, so group indices are 32-bit and split
// into (row, group) by a FastDivisor; element offsets are 64-bit. Longer problems are cut
// into several launches by rows.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/device/warp.cuh"
#include "kreg/dtype.hpp"
#include "quant_math.hpp"
#include "quantization.hpp"

namespace kreg::quantization {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kBlockThreads = 256;
constexpr int64_t kMaxThreadsPerLaunch = INT32_MAX;
// Threads an H200 holds at once (132 SMs x 2048). The fast path gives each thread 4
// vectors once that still leaves two full waves of threads (2 vectors from two waves of 2),
// so that the wider threads never leave SMs idle; decode-sized calls keep one vector.
constexpr int64_t kWideFrom = 2 * 132 * 2048;

struct Params {
  uint8_t* out;  // e4m3 or int8 bytes
  float* scales;
  int64_t x_row;       // x's row length: H, or 2H for the fused ops
  int64_t hidden;      // H
  int64_t scale_ld;    // col-major: P
  FastDivisor groups;  // G
  uint32_t group_size;
  uint32_t n_groups;  // groups in this launch
  float eps;
  bool ue8m0;
};

template <GroupOp kOp>
__device__ __forceinline__ uint8_t quantize(float v, float s) {
  if constexpr (is_int8(kOp)) {
    const float q = scaled_clamped(v, s, kInt8Max);
    return static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(q)));
  } else {
    const float q = scaled_clamped(v, s, kFp8Max);
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
  }
}

template <GroupOp kOp>
__device__ __forceinline__ void store_scale(const Params& p, uint32_t t, uint32_t g, float s) {
  if constexpr (is_col_major(kOp)) {
    p.scales[static_cast<int64_t>(g) * p.scale_ld + t] = s;
  } else {
    p.scales[static_cast<int64_t>(t) * p.groups.divisor + g] = s;
  }
}

// The int8 codes of v[0 .. N) (v[4w] in the low byte of codes[w]), by the division.
template <int N>
__device__ __forceinline__ void int8_codes(const float* v, float s, uint32_t* codes) {
  static_assert(N % 4 == 0, "int8_codes: whole words of four codes");
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const auto b = static_cast<uint8_t>(
          static_cast<int8_t>(__float2int_rn(scaled_clamped(v[4 * w + j], s, kInt8Max))));
      word |= static_cast<uint32_t>(b) << (8 * j);
    }
    codes[w] = word;
  }
}

// max(0, |v|) over the raw vectors, NaNs ignored (fmaxf's rule): on pairs of 16-bit
// floats for bf16 and f16 (abs and max are exact, so this is the max of the fp32 values),
// which needs no fp32 copy of the vectors.
template <typename T, int kVec, int kPer>
__device__ __forceinline__ float abs_max(const vec_t<T, kVec> (&raw)[kPer]) {
  if constexpr (std::is_same_v<T, float>) {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) m = fmaxf(m, fabsf(raw[k][j]));
    }
    return m;
  } else {
    using Pair = typename device::detail::Pair<T>::type;
    Pair m;
    m.x = device::from_float<T>(0.0f);
    m.y = m.x;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
#pragma unroll
      for (int j = 0; j < kVec; j += 2) {
        m = __hmax2(m, __habs2(*reinterpret_cast<const Pair*>(&raw[k][j])));
      }
    }
    return fmaxf(device::to_float(m.x), device::to_float(m.y));
  }
}

template <typename T, GroupOp kOp, int kVec, int kPer>
__global__ void __launch_bounds__(kBlockThreads)
    group_quant_vec_kernel(const T* __restrict__ x, Params p, int lanes_log2) {
  constexpr bool kSilu = is_silu(kOp);
  constexpr int kElems = kPer * kVec;
  static_assert(kVec % 4 == 0, "group_quant_vec_kernel: whole words of codes per vector");
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t lanes = 1u << lanes_log2;
  const uint32_t gid = i >> lanes_log2;
  const uint32_t sub = i & (lanes - 1);
  // Out-of-range threads stay for the shuffles (whole groups are in or out together).
  const bool valid = gid < p.n_groups;
  const uint32_t t = p.groups.div(gid);
  const uint32_t g = gid - t * p.groups.divisor;
  const int64_t col = static_cast<int64_t>(g) * p.group_size + static_cast<int64_t>(sub) * kVec;
  const int64_t stride = static_cast<int64_t>(lanes) * kVec;  // between a thread's vectors
  const T* src = x + static_cast<int64_t>(t) * p.x_row + col;
  device::pdl_wait();
  vec_t<T, kVec> a_raw[kPer];
  vec_t<T, kVec> b_raw[kSilu ? kPer : 1];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if (valid) {
      a_raw[k].load_stream(src + k * stride);
      if constexpr (kSilu) b_raw[k].load_stream(src + k * stride + p.hidden);
    } else {
      a_raw[k].fill(T{});
      if constexpr (kSilu) b_raw[k].fill(T{});
    }
  }
  device::pdl_launch_dependents();
  // The values: for the fused op computed once and kept (silu is the costly part); else
  // converted from the raw vectors each time they are needed, which keeps half the
  // registers live (the raw vectors) and so more threads, and more loads, per SM.
  float y[kSilu ? kElems : 1];
  float amax = 0.0f;
  if constexpr (kSilu) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      vec_t<float, kVec> gate;
      vec_t<float, kVec> up;
      gate.cast_from(a_raw[k]);
      up.cast_from(b_raw[k]);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        y[k * kVec + j] = silu_mul_f(gate[j], up[j]);
        amax = fmaxf(amax, fabsf(y[k * kVec + j]));
      }
    }
  } else {
    amax = abs_max(a_raw);
  }
  amax = device::warp_max(amax, static_cast<int>(lanes));
  if (!valid) return;
  const float s = quant_scale(amax, p.eps, is_int8(kOp) ? kInt8Max : kFp8Max, p.ue8m0);
  auto values = [&](int k, float* f) {
    if constexpr (kSilu) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = y[k * kVec + j];
    } else {
      vec_t<float, kVec> v;
      v.cast_from(a_raw[k]);
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = v[j];
    }
  };
  constexpr int kWords = kVec / 4;  // words of four codes per vector
  uint32_t codes[kPer * kWords];
  bool decided = false;
  if constexpr (!is_int8(kOp)) {
    if (e4m3_recip_ok(s)) {
      const float r = __frcp_rn(s);
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        float f[kVec];
        values(k, f);
        e4m3_codes_recip<kVec>(f, s, r, codes + k * kWords);
      }
      decided = true;
    }
  }
  if (!decided) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      float f[kVec];
      values(k, f);
      if constexpr (is_int8(kOp)) {
        int8_codes<kVec>(f, s, codes + k * kWords);
      } else {
        e4m3_codes_div<kVec>(f, s, codes + k * kWords);
      }
    }
  }
  uint8_t* dst = p.out + static_cast<int64_t>(t) * p.hidden + col;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    vec_t<uint32_t, kVec / 4> w;
#pragma unroll
    for (int j = 0; j < kWords; ++j) w[j] = codes[k * kWords + j];
    w.store_stream(reinterpret_cast<uint32_t*>(dst + k * stride));
  }
  if (sub == 0) store_scale<kOp>(p, t, g, s);
}

template <typename T, GroupOp kOp>
__device__ __forceinline__ float load_value(const T* row, int64_t hidden, int64_t c) {
  if constexpr (is_silu(kOp)) {
    return silu_mul_f(device::to_float(row[c]), device::to_float(row[hidden + c]));
  } else {
    return device::to_float(row[c]);
  }
}

template <typename T, GroupOp kOp>
__global__ void __launch_bounds__(kBlockThreads)
    group_quant_scalar_kernel(const T* __restrict__ x, Params p) {
  const uint32_t gid = (blockIdx.x * blockDim.x + threadIdx.x) / device::kWarpSize;
  const int lane = device::lane_id();
  if (gid >= p.n_groups) return;  // the whole warp leaves together
  const uint32_t t = p.groups.div(gid);
  const uint32_t g = gid - t * p.groups.divisor;
  const int64_t col0 = static_cast<int64_t>(g) * p.group_size;
  const T* row = x + static_cast<int64_t>(t) * p.x_row;
  device::pdl_wait();
  float amax = 0.0f;
  for (int64_t c = col0 + lane; c < col0 + p.group_size; c += device::kWarpSize) {
    amax = fmaxf(amax, fabsf(load_value<T, kOp>(row, p.hidden, c)));
  }
  device::pdl_launch_dependents();
  amax = device::warp_max(amax);
  const float s = quant_scale(amax, p.eps, is_int8(kOp) ? kInt8Max : kFp8Max, p.ue8m0);
  uint8_t* out_row = p.out + static_cast<int64_t>(t) * p.hidden;
  for (int64_t c = col0 + lane; c < col0 + p.group_size; c += device::kWarpSize) {
    out_row[c] = quantize<kOp>(load_value<T, kOp>(row, p.hidden, c), s);
  }
  if (lane == 0) store_scale<kOp>(p, t, g, s);
}

template <typename T, GroupOp kOp>
cudaError_t launch_typed(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& out_scales,
                         const GroupShape& shape, bool ue8m0) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const T* xp = data_ptr<const T>(x);
  auto* outp = static_cast<uint8_t*>(out.data) + out.byte_offset;
  float* sp = data_ptr<float>(out_scales);
  const int64_t x_row = is_silu(kOp) ? 2 * shape.hidden : shape.hidden;

  // The fast path's vectors per thread (kPer) and lanes per group (a power of two up to
  // 32); lanes_log2 < 0: the scalar fallback (a warp per group).
  int per = 1;
  int lanes_log2 = -1;
  const int64_t vecs_per_group = shape.group_size / kVec;
  if (shape.group_size % kVec == 0 && (vecs_per_group & (vecs_per_group - 1)) == 0 &&
      device::aligned16(xp) && reinterpret_cast<uintptr_t>(outp) % kVec == 0) {
    const int64_t vecs = shape.tokens * shape.groups * vecs_per_group;
    per = vecs >= 4 * kWideFrom ? 4 : vecs >= 2 * kWideFrom ? 2 : 1;
    per = static_cast<int>(std::min<int64_t>(per, vecs_per_group));  // one group per thread
    while (vecs_per_group / per > 32 && per < 4) per *= 2;
    const int64_t lanes = vecs_per_group / per;
    for (int l = 0; l <= 5; ++l) {
      if ((int64_t{1} << l) == lanes) lanes_log2 = l;
    }
  }
  const int64_t threads_per_group = lanes_log2 >= 0 ? (int64_t{1} << lanes_log2) : 32;
  const int64_t rows_per_launch =
      std::max<int64_t>(1, kMaxThreadsPerLaunch / (shape.groups * threads_per_group));
  Params p{};
  p.x_row = x_row;
  p.hidden = shape.hidden;
  p.scale_ld = shape.scale_ld;
  p.groups = FastDivisor(static_cast<uint32_t>(shape.groups));
  p.group_size = static_cast<uint32_t>(shape.group_size);
  p.eps = shape.eps;
  p.ue8m0 = ue8m0;
  for (int64_t row = 0; row < shape.tokens; row += rows_per_launch) {
    const int64_t n = std::min(rows_per_launch, shape.tokens - row);
    p.n_groups = static_cast<uint32_t>(n * shape.groups);
    p.out = outp + row * shape.hidden;
    p.scales = is_col_major(kOp) ? sp + row : sp + row * shape.groups;
    const int64_t threads = n * shape.groups * threads_per_group;
    const auto blocks = static_cast<unsigned>((threads + kBlockThreads - 1) / kBlockThreads);
    const T* xr = xp + row * x_row;
    cudaError_t err;
    if (lanes_log2 >= 0) {
      auto* kernel = per == 4   ? group_quant_vec_kernel<T, kOp, kVec, 4>
                     : per == 2 ? group_quant_vec_kernel<T, kOp, kVec, 2>
                                : group_quant_vec_kernel<T, kOp, kVec, 1>;
      err = device::launch(kernel, dim3(blocks), dim3(kBlockThreads), 0, stream, ctx.pdl(), xr, p,
                           lanes_log2);
    } else {
      err = device::launch(group_quant_scalar_kernel<T, kOp>, dim3(blocks), dim3(kBlockThreads), 0,
                           stream, ctx.pdl(), xr, p);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();  // returned, not left for a later check
      return err;
    }
  }
  return cudaSuccess;
}

template <GroupOp kOp>
KernelStatus group_quant(Context& ctx, const DLTensor& x, DLTensor& out, DLTensor& out_scales,
                         int64_t group_size, double eps, bool ue8m0) {
  const char* op = ctx.op();
  GroupShape shape;
  if (const KernelStatus st = check_group_args(ctx, kOp, out, out_scales, group_size, eps, &shape);
      !st.ok()) {
    return st;
  }
  if (shape.tokens == 0 || shape.hidden == 0) return kOk;
  // A row's groups (times 32 lanes at most) must fit one launch's 32-bit thread indices.
  if (shape.groups > kMaxThreadsPerLaunch / 32 || shape.group_size > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: H = %lld is too large for one row of groups", op,
                    static_cast<long long>(shape.hidden));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    return device::launch_status(
        ctx, op, launch_typed<decltype(tag), kOp>(ctx, x, out, out_scales, shape, ue8m0));
  });
}

}  // namespace

template <GroupOp kOp>
KernelStatus group_quant_fp8_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                  DLTensor& out_scales, int64_t group_size, double eps,
                                  bool scale_ue8m0) {
  return group_quant<kOp>(ctx, x, out, out_scales, group_size, eps, scale_ue8m0);
}

template KernelStatus group_quant_fp8_cuda<GroupOp::kFp8>(Context&, const DLTensor&, DLTensor&,
                                                          DLTensor&, int64_t, double, bool);
template KernelStatus group_quant_fp8_cuda<GroupOp::kFp8ColMajor>(Context&, const DLTensor&,
                                                                  DLTensor&, DLTensor&, int64_t,
                                                                  double, bool);
template KernelStatus group_quant_fp8_cuda<GroupOp::kSiluFp8>(Context&, const DLTensor&, DLTensor&,
                                                              DLTensor&, int64_t, double, bool);
template KernelStatus group_quant_fp8_cuda<GroupOp::kSiluFp8ColMajor>(Context&, const DLTensor&,
                                                                      DLTensor&, DLTensor&, int64_t,
                                                                      double, bool);

KernelStatus group_quant_int8_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                   DLTensor& out_scales, int64_t group_size, double eps) {
  return group_quant<GroupOp::kInt8>(ctx, x, out, out_scales, group_size, eps, false);
}

}  // namespace kreg::quantization
