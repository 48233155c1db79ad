// CUDA per-token-group quantization (fp8 and int8, row- and column-major scales, the fused
// silu_and_mul form): the arithmetic of quant_math.hpp, so the bytes and scales equal the
// CPU reference's.
//
// Fast path (group_size / kVec lanes per group, a power of two up to 32, where kVec =
// 16 / sizeof(T) and the pointers allow 16-byte loads): every thread loads one 16-byte
// vector of its group (two for the fused op: gate and up), the group's max travels by
// butterfly shuffles inside its aligned lanes (no shared memory), and each thread stores
// its kVec output bytes; lane 0 of the group stores the scale. One thread per vector and
// short blocks, as the activation kernels (the best shape measured there). Loads and
// stores carry an evict-first hint: every byte is touched once.
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

template <typename T, GroupOp kOp, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    group_quant_vec_kernel(const T* __restrict__ x, Params p, int lanes_log2) {
  constexpr bool kSilu = is_silu(kOp);
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const int lanes = 1 << lanes_log2;
  const uint32_t gid = i >> lanes_log2;
  const uint32_t sub = i & static_cast<uint32_t>(lanes - 1);
  // Out-of-range threads stay for the shuffles (whole groups are in or out together).
  const bool valid = gid < p.n_groups;
  const uint32_t t = p.groups.div(gid);
  const uint32_t g = gid - t * p.groups.divisor;
  const int64_t col = static_cast<int64_t>(g) * p.group_size + static_cast<int64_t>(sub) * kVec;
  const T* src = x + static_cast<int64_t>(t) * p.x_row + col;
  device::pdl_wait();
  vec_t<T, kVec> a_raw;
  vec_t<T, kVec> b_raw;
  if (valid) {
    a_raw.load_stream(src);
    if constexpr (kSilu) b_raw.load_stream(src + p.hidden);
  } else {
    a_raw.fill(T{});
    b_raw.fill(T{});
  }
  device::pdl_launch_dependents();
  vec_t<float, kVec> v;
  v.cast_from(a_raw);
  if constexpr (kSilu) {
    vec_t<float, kVec> up;
    up.cast_from(b_raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = silu_mul_f(v[j], up[j]);
  }
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));
  amax = device::warp_max(amax, lanes);
  if (!valid) return;
  const float s = quant_scale(amax, p.eps, is_int8(kOp) ? kInt8Max : kFp8Max, p.ue8m0);
  vec_t<uint8_t, kVec> q;
#pragma unroll
  for (int j = 0; j < kVec; ++j) q[j] = quantize<kOp>(v[j], s);
  q.store_stream(p.out + static_cast<int64_t>(t) * p.hidden + col);
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

  // Lanes per group on the fast path; 0: the scalar fallback (a warp per group).
  int lanes_log2 = -1;
  if (shape.group_size % kVec == 0 && device::aligned16(xp) &&
      reinterpret_cast<uintptr_t>(outp) % kVec == 0) {
    const int64_t lanes = shape.group_size / kVec;
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
      err = device::launch(group_quant_vec_kernel<T, kOp, kVec>, dim3(blocks), dim3(kBlockThreads),
                           0, stream, ctx.pdl(), xr, p, lanes_log2);
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
