// Host-side helpers every CUDA launcher uses.
#pragma once

#include <cuda_runtime.h>

namespace kreg::device {

// Makes the tensors' device current for one launch and restores the caller's afterwards:
// a stream and the memory it touches belong to one device, and the calling thread may
// have another one current. Costs one cudaGetDevice when nothing changes.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess && current != device &&
        cudaSetDevice(device) == cudaSuccess) {
      previous_ = current;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace kreg::device
