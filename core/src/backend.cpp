#include "kreg/backend.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <boost/dll/shared_library.hpp>

#include "dll_error.hpp"
#include "kreg/jit.hpp"

namespace kreg {

namespace {

class CpuBackend final : public KernelBackend {
 public:
  std::string_view name() const override { return "cpu"; }
  DLDeviceType device_type() const override { return kDLCPU; }
  bool available() const noexcept override { return true; }
  std::optional<int> sm_of(int) const noexcept override { return std::nullopt; }
  std::string_view launch_semantics() const override {
    return "synchronous on the calling thread; the stream is ignored";
  }
};

// Talks to the CUDA driver through libcuda.so.1 loaded at run time, only to learn whether
// a GPU exists and its compute capability. Kernels themselves live in plugins.
class CudaBackend final : public KernelBackend {
 public:
  std::string_view name() const override { return "cuda"; }
  DLDeviceType device_type() const override { return kDLCUDA; }
  bool available() const noexcept override {
    probe();
    return device_count_ > 0;
  }
  std::string unavailable_reason() const override {
    probe();
    return reason_;
  }
  std::optional<int> sm_of(int device_id) const noexcept override {
    probe();
    if (device_id < 0 || device_id >= device_count_ || device_id >= kMaxDevices) {
      return std::nullopt;
    }
    return sm_[static_cast<size_t>(device_id)];
  }
  std::string_view launch_semantics() const override {
    return "asynchronous on the given stream (cudaStream_t; null = default stream)";
  }

 private:
  static constexpr int kMaxDevices = 64;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using AttrFn = int (*)(int*, int, int);

  void probe() const noexcept {
    std::call_once(once_, [this] {
      try {
        boost::dll::shared_library lib(
            "libcuda.so.1",
            boost::dll::load_mode::search_system_folders | boost::dll::load_mode::rtld_local);
        auto init = lib.get<int(unsigned)>("cuInit");
        auto count = lib.get<int(int*)>("cuDeviceGetCount");
        auto get = lib.get<int(int*, int)>("cuDeviceGet");
        auto attr = lib.get<int(int*, int, int)>("cuDeviceGetAttribute");
        if (int rc = init(0); rc != 0) {
          reason_ = "cuInit failed with CUresult " + std::to_string(rc) + " (no usable GPU)";
          return;
        }
        int n = 0;
        if (count(&n) != 0 || n <= 0) {
          reason_ = "the CUDA driver reports no devices";
          return;
        }
        constexpr int kMajor = 75, kMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
        for (int i = 0; i < n && i < kMaxDevices; ++i) {
          int dev = 0, major = 0, minor = 0;
          if (get(&dev, i) == 0 && attr(&major, kMajor, dev) == 0 &&
              attr(&minor, kMinor, dev) == 0) {
            sm_[static_cast<size_t>(i)] = major * 10 + minor;
          }
        }
        device_count_ = n;
        // The driver stays loaded for the process's life (deliberately leaked): CUDA
        // contexts and the runtime's exit handlers still need it after static teardown.
        new boost::dll::shared_library(std::move(lib));
      } catch (const std::exception& e) {
        reason_ = std::string("no CUDA driver (libcuda.so.1): ") + detail::dll_error_text(e);
      }
    });
  }

  mutable std::once_flag once_;
  mutable int device_count_ = 0;
  mutable std::array<int, kMaxDevices> sm_{};
  mutable std::string reason_;
};

const CpuBackend kCpu;
const CudaBackend kCuda;

// A backend that runs on the CUDA devices and needs one more library on top of the driver:
// available when CUDA is and `require()` finds that library (asked once, lazily).
class OnCudaBackend : public KernelBackend {
 public:
  DLDeviceType device_type() const final { return kDLCUDA; }
  bool available() const noexcept final {
    probe();
    return ok_;
  }
  std::string unavailable_reason() const final {
    probe();
    return reason_;
  }
  std::optional<int> sm_of(int device_id) const noexcept final { return kCuda.sm_of(device_id); }

 protected:
  // Empty when the library is usable, else why not.
  virtual std::string require() const = 0;

 private:
  void probe() const noexcept {
    std::call_once(once_, [this] {
      if (!kCuda.available()) {
        reason_ = kCuda.unavailable_reason();
        return;
      }
      try {
        reason_ = require();
        ok_ = reason_.empty();
      } catch (const std::exception& e) {
        reason_ = std::string("the ") + std::string(name()) + " backend: " + e.what();
      }
    });
  }
  mutable std::once_flag once_;
  mutable bool ok_ = false;
  mutable std::string reason_;
};

// CUDA source compiled at resolve time (kreg/jit.hpp): NVRTC, loaded at run time like the
// driver.
class JitBackend final : public OnCudaBackend {
 public:
  std::string_view name() const override { return "jit"; }
  std::string_view launch_semantics() const override {
    return "compiled by NVRTC when resolved; then asynchronous on the given stream";
  }

 private:
  std::string require() const override {
    auto v = jit::nvrtc_version();
    if (v) return {};
    return v.status().message().empty() ? "NVRTC is not usable" : v.status().message();
  }
};

const JitBackend kJit;

// Collectives on NCCL (the communication group): libnccl.so.2 loadable at run time (as the
// plugin opens it: $KREG_NCCL_LIBRARY, else the system's libnccl.so.2, else the CUDA
// toolkit's). Only probed; the plugin makes the NCCL calls.
class NcclBackend final : public OnCudaBackend {
 public:
  std::string_view name() const override { return "nccl"; }
  std::string_view launch_semantics() const override {
    return "NCCL collectives and kernels, asynchronous on the given stream";
  }

 private:
  std::string require() const override {
    std::vector<std::string> tries;
    if (const char* env = std::getenv("KREG_NCCL_LIBRARY"); env != nullptr && env[0] != '\0') {
      tries.emplace_back(env);
    } else {
      tries = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"};
    }
    std::string why;
    for (const std::string& lib_name : tries) {
      try {
        boost::dll::shared_library lib(lib_name, boost::dll::load_mode::search_system_folders |
                                                     boost::dll::load_mode::rtld_local);
        (void)lib.get<int(int*)>("ncclGetVersion");
        return {};  // unloaded again: the plugin opens its own
      } catch (const std::exception& e) {
        why += (why.empty() ? "" : "; ") + lib_name + ": " + e.what();
      }
    }
    return "no NCCL (" + why + ")";
  }
};

const NcclBackend kNccl;

}  // namespace

const KernelBackend* find_backend(std::string_view name) {
  if (name == "cpu") return &kCpu;
  if (name == "cuda") return &kCuda;
  if (name == "jit") return &kJit;
  if (name == "nccl") return &kNccl;
  return nullptr;
}

std::vector<const KernelBackend*> all_backends() { return {&kCpu, &kCuda, &kJit, &kNccl}; }

}  // namespace kreg
