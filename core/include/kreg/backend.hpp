// KernelBackend: where an implementation runs and how a call is launched. The core ships
// "cpu", "cuda", "jit" (kreg/jit.hpp) and "nccl" (collectives; libnccl.so.2 probed at run time);
// the CUDA one probes the driver (libcuda.so.1) at run time, so the core has no CUDA build or link
// dependency.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <dlpack/dlpack.h>

namespace kreg {

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  virtual std::string_view name() const = 0;
  virtual DLDeviceType device_type() const = 0;
  // Can implementations of this backend run on this machine? Never throws; cached.
  virtual bool available() const noexcept = 0;
  // Why not, when available() is false.
  virtual std::string unavailable_reason() const { return {}; }
  // SM (major*10+minor) of device `device_id`, when the notion applies and is known.
  virtual std::optional<int> sm_of(int device_id) const noexcept = 0;
  // Launch semantics, for humans: "synchronous" or "asynchronous on the given stream".
  virtual std::string_view launch_semantics() const = 0;
};

// The built-in backends by name ("cpu", "cuda"); nullptr if unknown.
const KernelBackend* find_backend(std::string_view name);
std::vector<const KernelBackend*> all_backends();

}  // namespace kreg
