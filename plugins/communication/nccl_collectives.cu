// The NCCL transport of the communication group (comm.hpp): CUDA tensors on the comm's
// device, enqueued on the call's stream with no host synchronisation (graph-capturable).
//
// all_reduce_add_rmsnorm is ncclAllReduce(sum) in place, then one kernel for the residual
// add and the RMSNorm: one block per row; each thread holds its vectors of the fp32 sum
// x + residual in registers across the block reduction (16-byte vectors where H and the
// pointers allow), so x and residual are read once and written once; rows longer than the
// register window re-read the rest (from L2). The arithmetic is layernorm's
// fused_add_rmsnorm (and the CPU version's): s = x + residual in fp32, residual = s
// rounded, x = s * rsqrt(mean(s^2) + eps) * w rounded, the norm of the unrounded s.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "comm.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"
#include "nccl.hpp"

namespace kreg::communication {
namespace {

using device::vec_t;

constexpr int kMaxThreads = 1024;

template <typename T, int kVec, int kItems>
__global__ void __launch_bounds__(kMaxThreads)
    add_rmsnorm_kernel(T* x, T* residual, const T* __restrict__ weight, int vecs_per_row,
                       float eps) {
  __shared__ float scratch[device::kWarpSize];
  const int tid = static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(blockDim.x);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * vecs_per_row * kVec;
  T* xr = x + row;
  T* rr = residual + row;

  auto load_sum = [&](int v, vec_t<float, kVec>& s) {
    vec_t<T, kVec> raw;
    raw.load(xr + v * kVec);
    s.cast_from(raw);
    raw.load(rr + v * kVec);
    vec_t<float, kVec> res;
    res.cast_from(raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) s[j] += res[j];
  };
  auto squares = [](const vec_t<float, kVec>& s) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc += s[j] * s[j];
    return acc;
  };
  auto store = [&](int v, const vec_t<float, kVec>& s, float scale) {
    vec_t<T, kVec> w;
    w.load(weight + v * kVec);
    vec_t<float, kVec> y;
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = s[j] * scale * device::to_float(w[j]);
    y.cast_store(xr + v * kVec);
  };

  vec_t<float, kVec> held[kItems];
  float sum_sq = 0.0f;
  // With PDL the previous kernel on the stream (NCCL's) may still run: wait for it.
  device::pdl_wait();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (v < vecs_per_row) {
      load_sum(v, held[k]);
      held[k].cast_store(rr + v * kVec);
      sum_sq += squares(held[k]);
    }
  }
  // Beyond the register window: sum only; the residual is written in the second pass,
  // which must still read its original value.
  for (int v = tid + kItems * step; v < vecs_per_row; v += step) {
    vec_t<float, kVec> s;
    load_sum(v, s);
    sum_sq += squares(s);
  }
  sum_sq = device::block_row_sum(sum_sq, scratch);
  device::pdl_launch_dependents();
  const float scale = rsqrtf(sum_sq / static_cast<float>(vecs_per_row * kVec) + eps);
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int v = tid + k * step;
    if (v < vecs_per_row) store(v, held[k], scale);
  }
  for (int v = tid + kItems * step; v < vecs_per_row; v += step) {
    vec_t<float, kVec> s;
    load_sum(v, s);
    s.cast_store(rr + v * kVec);
    store(v, s, scale);
  }
}

int round_up(int n, int m) { return (n + m - 1) / m * m; }

template <typename T, int kVec>
cudaError_t launch_add_rmsnorm(T* x, T* residual, const T* weight, int64_t rows, int64_t hidden,
                               float eps, bool pdl, cudaStream_t stream) {
  const int vecs = static_cast<int>(hidden / kVec);
  // One vector a thread up to 1024 vectors (H = 8192 bf16), else four a thread.
  if (vecs <= kMaxThreads) {
    const dim3 block(std::max(device::kWarpSize, round_up(vecs, device::kWarpSize)));
    return device::launch(add_rmsnorm_kernel<T, kVec, 1>, dim3(static_cast<unsigned>(rows)), block,
                          0, stream, pdl, x, residual, weight, vecs, eps);
  }
  const dim3 block(std::min(kMaxThreads, round_up((vecs + 3) / 4, device::kWarpSize)));
  return device::launch(add_rmsnorm_kernel<T, kVec, 4>, dim3(static_cast<unsigned>(rows)), block, 0,
                        stream, pdl, x, residual, weight, vecs, eps);
}

std::optional<NcclDataType> nccl_dtype(DLDataType t) {
  const auto d = from_dl(t);
  if (!d) return std::nullopt;
  switch (*d) {
    case DType::kF32:
      return kNcclFloat32;
    case DType::kF16:
      return kNcclFloat16;
    case DType::kBF16:
      return kNcclBfloat16;
    default:
      return std::nullopt;
  }
}

// A world of one rank without a communicator (a host-only comm, as tools create by
// default): there is nothing to exchange, so the CUDA ops run without NCCL on the tensors'
// device (all_reduce leaves x as it is, all_gather and reduce_scatter copy, the fused op
// is the norm alone).
bool local(const Comm& c) { return c.world_size == 1 && c.nccl_comm == nullptr; }

// The comm can run NCCL collectives: it has a communicator, and no asynchronous error.
KernelStatus check_comm(Context& ctx, const char* op, Comm& c) {
  if (local(c)) return kOk;
  if (c.nccl_comm == nullptr || c.nccl == nullptr) {
    return ctx.fail(KREG_FAILED_PRECONDITION,
                    "%s: %s: comm '%s' has no NCCL communicator (created with device -1); CUDA "
                    "tensors need a comm created for their device",
                    op, c.where().c_str(), c.name.c_str());
  }
  NcclResult async = kNcclSuccess;
  const NcclResult r = c.nccl->comm_get_async_error(static_cast<NcclComm>(c.nccl_comm), &async);
  if (r != kNcclSuccess) {
    return ctx.fail(KREG_UNAVAILABLE, "%s: %s: ncclCommGetAsyncError failed: %s", op,
                    c.where().c_str(), c.nccl->error_text(r).c_str());
  }
  if (async != kNcclSuccess && async != kNcclInProgress) {
    return ctx.fail(KREG_UNAVAILABLE, "%s: %s: the NCCL communicator failed earlier: %s", op,
                    c.where().c_str(), c.nccl->error_text(async).c_str());
  }
  return kOk;
}

// A tensor the NCCL path can take: on the comm's device, contiguous, an NCCL dtype, the
// same dtype as `ref` (when given).
KernelStatus check_tensor(Context& ctx, const char* op, const char* arg, const DLTensor& t,
                          const Comm& c, const DLTensor* ref, const char* ref_name,
                          NcclDataType* dtype) {
  if (t.device.device_type != kDLCUDA || (!local(c) && t.device.device_id != c.device)) {
    return ctx.fail(
        KREG_INVALID_ARGUMENT, "%s: %s: %s is on device type %d id %d; comm '%s' is on cuda:%lld",
        op, c.where().c_str(), arg, static_cast<int>(t.device.device_type),
        static_cast<int>(t.device.device_id), c.name.c_str(), static_cast<long long>(c.device));
  }
  if (!detail::is_contiguous(t))
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: %s must be contiguous", op, arg);
  const auto d = nccl_dtype(t.dtype);
  if (!d) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: %s has dtype code %d bits %d; f32, f16 or bf16 expected", op, arg,
                    static_cast<int>(t.dtype.code), static_cast<int>(t.dtype.bits));
  }
  if (ref != nullptr && (t.dtype.code != ref->dtype.code || t.dtype.bits != ref->dtype.bits)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: %s and %s have different dtypes", op, arg,
                    ref_name);
  }
  *dtype = *d;
  return kOk;
}

KernelStatus nccl_result(Context& ctx, const char* op, const Comm& c, const char* call,
                         NcclResult r) {
  if (r == kNcclSuccess) return kOk;
  return ctx.fail(KREG_INTERNAL, "%s: %s: %s failed: %s", op, c.where().c_str(), call,
                  c.nccl->error_text(r).c_str());
}

// One rank's all_gather / reduce_scatter: out is x.
KernelStatus local_copy(Context& ctx, const char* op, const DLTensor& x, DLTensor& out) {
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const size_t bytes = static_cast<size_t>(numel(x)) * ((x.dtype.bits + 7) / 8);
  if (bytes == 0) return kOk;
  const cudaError_t e = cudaMemcpyAsync(data_ptr<void>(out), data_ptr<const void>(x), bytes,
                                        cudaMemcpyDeviceToDevice,
                                        static_cast<cudaStream_t>(ctx.stream()));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return ctx.fail(KREG_INTERNAL, "%s: cudaMemcpyAsync failed: %s", op, cudaGetErrorString(e));
  }
  return kOk;
}

KernelStatus reduce_op(Context& ctx, const char* op, std::string_view name, NcclRedOp* out) {
  const auto r = parse_reduce_op(name);
  if (!r) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: op '%s' is not one of sum, prod, max, min, avg", op,
                    comm::detail::escape(name).c_str());
  }
  *out = static_cast<NcclRedOp>(static_cast<int>(*r));  // the same numbering as ncclRedOp_t
  return kOk;
}

}  // namespace

KernelStatus all_reduce_nccl(Context& ctx, DLTensor& x, Comm& comm, std::string_view op) {
  constexpr const char* kOp = "communication.all_reduce";
  NcclDataType dtype{};
  NcclRedOp redop{};
  KernelStatus s = check_comm(ctx, kOp, comm);
  if (s.ok()) s = check_tensor(ctx, kOp, "x", x, comm, nullptr, nullptr, &dtype);
  if (s.ok()) s = reduce_op(ctx, kOp, op, &redop);
  if (!s.ok()) return s;
  if (local(comm)) return kOk;  // the reduction of one rank is its own x
  // Every rank must take part, even with nothing to reduce: NCCL handles count 0.
  const device::DeviceGuard guard(static_cast<int>(comm.device));
  if (!guard.ok()) return guard.fail(ctx, kOp);
  return nccl_result(
      ctx, kOp, comm, "ncclAllReduce",
      comm.nccl->all_reduce(data_ptr<void>(x), data_ptr<void>(x), static_cast<size_t>(numel(x)),
                            dtype, redop, static_cast<NcclComm>(comm.nccl_comm), ctx.stream()));
}

KernelStatus all_gather_nccl(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm) {
  constexpr const char* kOp = "communication.all_gather";
  NcclDataType dtype{};
  KernelStatus s = check_comm(ctx, kOp, comm);
  if (s.ok()) s = check_tensor(ctx, kOp, "x", x, comm, nullptr, nullptr, &dtype);
  if (s.ok()) s = check_tensor(ctx, kOp, "out", out, comm, &x, "x", &dtype);
  if (!s.ok()) return s;
  int64_t want = 0;
  if (__builtin_mul_overflow(numel(x), comm.world_size, &want) || numel(out) != want) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: out has %lld elements; world size %lld times x's %lld expected", kOp,
                    static_cast<long long>(numel(out)), static_cast<long long>(comm.world_size),
                    static_cast<long long>(numel(x)));
  }
  if (local(comm)) return local_copy(ctx, kOp, x, out);
  const device::DeviceGuard guard(static_cast<int>(comm.device));
  if (!guard.ok()) return guard.fail(ctx, kOp);
  return nccl_result(ctx, kOp, comm, "ncclAllGather",
                     comm.nccl->all_gather(data_ptr<const void>(x), data_ptr<void>(out),
                                           static_cast<size_t>(numel(x)), dtype,
                                           static_cast<NcclComm>(comm.nccl_comm), ctx.stream()));
}

KernelStatus reduce_scatter_nccl(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm,
                                 std::string_view op) {
  constexpr const char* kOp = "communication.reduce_scatter";
  NcclDataType dtype{};
  NcclRedOp redop{};
  KernelStatus s = check_comm(ctx, kOp, comm);
  if (s.ok()) s = check_tensor(ctx, kOp, "x", x, comm, nullptr, nullptr, &dtype);
  if (s.ok()) s = check_tensor(ctx, kOp, "out", out, comm, &x, "x", &dtype);
  if (s.ok()) s = reduce_op(ctx, kOp, op, &redop);
  if (!s.ok()) return s;
  int64_t want = 0;
  if (__builtin_mul_overflow(numel(out), comm.world_size, &want) || numel(x) != want) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: x has %lld elements; world size %lld times out's %lld expected", kOp,
                    static_cast<long long>(numel(x)), static_cast<long long>(comm.world_size),
                    static_cast<long long>(numel(out)));
  }
  if (local(comm)) return local_copy(ctx, kOp, x, out);
  const device::DeviceGuard guard(static_cast<int>(comm.device));
  if (!guard.ok()) return guard.fail(ctx, kOp);
  return nccl_result(
      ctx, kOp, comm, "ncclReduceScatter",
      comm.nccl->reduce_scatter(data_ptr<const void>(x), data_ptr<void>(out),
                                static_cast<size_t>(numel(out)), dtype, redop,
                                static_cast<NcclComm>(comm.nccl_comm), ctx.stream()));
}

KernelStatus all_reduce_add_rmsnorm_nccl(Context& ctx, DLTensor& x, DLTensor& residual,
                                         const DLTensor& weight, Comm& comm, double eps) {
  constexpr const char* kOp = "communication.all_reduce_add_rmsnorm";
  NcclDataType dtype{};
  KernelStatus s = check_comm(ctx, kOp, comm);
  if (s.ok()) s = check_tensor(ctx, kOp, "x", x, comm, nullptr, nullptr, &dtype);
  if (s.ok()) s = check_tensor(ctx, kOp, "residual", residual, comm, &x, "x", &dtype);
  if (s.ok()) s = check_tensor(ctx, kOp, "weight", weight, comm, &x, "x", &dtype);
  if (!s.ok()) return s;
  if (x.ndim != 2 || residual.ndim != 2 || residual.shape[0] != x.shape[0] ||
      residual.shape[1] != x.shape[1] || numel(weight) != x.shape[1]) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: x and residual must be [T, H] of the same shape and weight [H]", kOp);
  }
  const int64_t rows = x.shape[0];
  const int64_t hidden = x.shape[1];
  if (hidden > INT32_MAX || rows > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: [%lld, %lld] is too large for one launch", kOp,
                    static_cast<long long>(rows), static_cast<long long>(hidden));
  }
  const device::DeviceGuard guard(local(comm) ? x.device.device_id : static_cast<int>(comm.device));
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  if (!local(comm)) {
    s = nccl_result(ctx, kOp, comm, "ncclAllReduce",
                    comm.nccl->all_reduce(data_ptr<void>(x), data_ptr<void>(x),
                                          static_cast<size_t>(numel(x)), dtype, kNcclSum,
                                          static_cast<NcclComm>(comm.nccl_comm), ctx.stream()));
  }
  if (!s.ok() || rows == 0 || hidden == 0) return s;
  return device::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    using T = decltype(tag);
    T* xp = data_ptr<T>(x);
    T* rp = data_ptr<T>(residual);
    const T* wp = data_ptr<const T>(weight);
    device::visit_vec_elems<T>(device::max_vec_elems<T>(hidden, xp, rp, wp), [&](auto vec) {
      return launch_add_rmsnorm<T, decltype(vec)::value>(
          xp, rp, wp, rows, hidden, static_cast<float>(eps), ctx.pdl(), stream);
    });
    return device::launch_status(ctx, kOp);
  });
}

}  // namespace kreg::communication
