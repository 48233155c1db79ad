// Host-side pieces every CUDA entry point of a kreg plugin shares.
//
// A CUDA entry point (the function a KernelDef binds) does, in this order:
//   1. the argument checks that need no CUDA call, and the early return of an empty call;
//   2. DeviceGuard on its first tensor: the calling thread's current device may be another
//      one than the tensors' (PyTorch code running on cuda:1 with cuda:0 current, say),
//      and every CUDA call below (launches, cudaMallocAsync, device attributes) acts on
//      the current device;
//   3. visit_float_dtype (or visit_dtype<...> for another set of element types);
//   4. the launches, on ctx.stream();
//   5. launch_status: the launch error, if any, as the kernel's status.
//
//   KernelStatus scale_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double s) {
//     constexpr const char* kOp = "group.scale";
//     if (numel(x) == 0) return kOk;
//     const device::DeviceGuard guard(x);
//     if (!guard.ok()) return guard.fail(ctx, kOp);
//     return device::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
//       using T = decltype(tag);
//       scale_kernel<T><<<blocks, 256, 0, stream>>>(data_ptr<const T>(x), ...);
//       return device::launch_status(ctx, kOp);
//     });
//   }
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/plugin.hpp"

namespace kreg::device {

// ---- The device ----

// Makes a CUDA device current for the guard's lifetime: one cudaGetDevice, a cudaSetDevice
// only when another device is current, and the previous device restored on destruction
// only if it was changed. Never throws: a failure is kept for ok() / fail(), and cleared
// from cudaGetLastError so that it is not reported again by a later launch check.
class DeviceGuard {
 public:
  // `device` < 0: nothing to do.
  explicit DeviceGuard(int device) : device_(device) {
    if (device < 0) return;
    int current = 0;
    err_ = cudaGetDevice(&current);
    if (err_ == cudaSuccess && current != device) {
      err_ = cudaSetDevice(device);
      if (err_ == cudaSuccess) previous_ = current;
    }
    if (err_ != cudaSuccess) cudaGetLastError();
  }

  // The device `t` lives on; nothing to do for a tensor that is not device memory
  // (page-locked host memory, say).
  explicit DeviceGuard(const DLTensor& t)
      : DeviceGuard(t.device.device_type == kDLCUDA ? t.device.device_id : -1) {}

  ~DeviceGuard() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }

  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  bool ok() const { return err_ == cudaSuccess; }

  // The failure as the entry point's status; call it when !ok().
  KernelStatus fail(Context& ctx, const char* op) const {
    return ctx.fail(KREG_UNAVAILABLE, "%s: cannot make CUDA device %d current: %s", op, device_,
                    cudaGetErrorString(err_));
  }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t err_ = cudaSuccess;
};

// ---- The element type ----

// kreg::ElementType and kreg::visit_dtype (dtype_visit.hpp), with CUDA's 16-bit types.
using kreg::ElementType;
using kreg::visit_dtype;

}  // namespace kreg::device

template <>
struct kreg::ElementType<__nv_bfloat16> {
  static constexpr DType kDType = DType::kBF16;
  static constexpr const char* kName = "bf16";
};
template <>
struct kreg::ElementType<__half> {
  static constexpr DType kDType = DType::kF16;
  static constexpr const char* kName = "f16";
};

namespace kreg::device {

// The floating-point types of most kernels: bf16, f16 or f32.
template <typename Fn>
KernelStatus visit_float_dtype(Context& ctx, const char* op, const DLTensor& t, Fn&& fn) {
  return visit_dtype<__nv_bfloat16, __half, float>(ctx, op, t, static_cast<Fn&&>(fn));
}

// ---- After the launches ----

// A launch error (`err`, a launcher's result) as the kernel's status. The runtime's
// last-error slot is cleared with it: a launcher may only have peeked at it
// (device::launch), and the next op's launch_status(ctx, op) must not report it again.
inline KernelStatus launch_status(Context& ctx, const char* op, cudaError_t err) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ctx.fail(KREG_INTERNAL, "%s: kernel launch failed: %s", op, cudaGetErrorString(err));
  }
  return kOk;
}

// The launches' error as read (and cleared) by cudaGetLastError, as the kernel's status.
inline KernelStatus launch_status(Context& ctx, const char* op) {
  return launch_status(ctx, op, cudaGetLastError());
}

// ---- Pointers ----

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace kreg::device
