// Scratch memory for a CUDA kernel, from the host's allocator when the host offers one
// (kreg_host_services in the call frame, ABI 1.2: torch's caching allocator under the
// Python extension) and otherwise from cudaMallocAsync on the call's stream. Freed on the
// same stream when it goes out of scope, after the kernels using it were enqueued: the
// memory is reused only by work ordered after them. Never allocate behind the host's back
// with cudaMalloc/cudaMallocAsync directly.
//
//   device::Workspace ws(ctx, bytes, x.device);
//   if (!ws.ok()) return ws.fail(ctx);
//   kernel<<<grid, block, 0, stream>>>(static_cast<int32_t*>(ws.data()), ...);
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>

#include "kreg/plugin.hpp"

namespace kreg::device {

class Workspace {
 public:
  Workspace(const Context& ctx, size_t bytes, DLDevice device)
      : ctx_(ctx), bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    if (ctx.host_allocates()) {
      // The host's message goes into our own buffer, not the call's: fail() formats the
      // call's message from it, and a buffer cannot be both source and destination.
      host_ = true;
      const kreg_host_services* s = ctx.services();
      kreg_error err{sizeof(kreg_error), reason_, sizeof(reason_)};
      ptr_ = s->workspace_alloc(s->self, bytes, device, ctx.stream(), &err);
      reason_[sizeof(reason_) - 1] = '\0';  // a host that filled the buffer without a NUL
      if (ptr_ == nullptr && reason_[0] == '\0') {
        std::snprintf(reason_, sizeof(reason_), "the host's allocator returned no memory");
      }
      return;
    }
    const cudaError_t e = cudaMallocAsync(&ptr_, bytes, static_cast<cudaStream_t>(ctx.stream()));
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      cudaGetLastError();  // not reported again by the next launch check
      std::snprintf(reason_, sizeof(reason_), "%s", cudaGetErrorString(e));
    }
  }
  ~Workspace() {
    if (ptr_ == nullptr) return;
    if (host_) {
      ctx_.host_free(ptr_, bytes_, device_);
    } else {
      cudaFreeAsync(ptr_, static_cast<cudaStream_t>(ctx_.stream()));
    }
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  bool ok() const { return bytes_ == 0 || ptr_ != nullptr; }
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  bool from_host() const { return host_; }
  // RESOURCE_EXHAUSTED naming the op, the size, the allocator and its reason.
  KernelStatus fail(const Context& ctx) const {
    return ctx.fail(KREG_RESOURCE_EXHAUSTED, "%s: cannot allocate %zu bytes of workspace (%s): %s",
                    ctx.op(), bytes_, host_ ? "host allocator" : "cudaMallocAsync", reason_);
  }

 private:
  const Context& ctx_;
  size_t bytes_;
  DLDevice device_;
  void* ptr_ = nullptr;
  bool host_ = false;
  char reason_[256] = {};
};

}  // namespace kreg::device
