#include "cublas_matmul.hpp"

#include <climits>
#include <map>
#include <mutex>
#include <string>

#if defined(KREG_HAVE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

namespace kreg::harness {

#if defined(KREG_HAVE_CUDA)
namespace {

// The entry points used, resolved once; `error` says why they are missing.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  // Spelled out: C++ sees cublasGemmEx overloaded.
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                         const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                         int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                         cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) text = nullptr;
  std::string error;
};

CublasApi load_cublas() {
  CublasApi api;
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why;
  if (lib == nullptr) {
    const char* e = dlerror();
    why = e != nullptr ? e : "not found";
    // Next to the CUDA runtime this process runs with (the toolkit's lib directory), for a
    // library folder that is neither on the loader's path nor in the executable's RUNPATH.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cudaGetErrorString), &info) != 0 &&
        info.dli_fname != nullptr) {
      const std::string runtime = info.dli_fname;
      const size_t slash = runtime.rfind('/');
      if (slash != std::string::npos) {
        lib = dlopen((runtime.substr(0, slash + 1) + name).c_str(), RTLD_NOW | RTLD_LOCAL);
      }
    }
  }
  if (lib == nullptr) {
    api.error = "cannot load " + name + " (cuBLAS, for the matmul): " + why;
    return api;
  }
  api.create = reinterpret_cast<decltype(api.create)>(dlsym(lib, "cublasCreate_v2"));
  api.gemm = reinterpret_cast<decltype(api.gemm)>(dlsym(lib, "cublasGemmEx"));
  api.text = reinterpret_cast<decltype(api.text)>(dlsym(lib, "cublasGetStatusString"));
  if (api.create == nullptr || api.gemm == nullptr || api.text == nullptr) {
    api.error = name + " lacks cublasCreate_v2, cublasGemmEx or cublasGetStatusString";
  }
  return api;
}

const CublasApi& cublas() {
  static const CublasApi api = load_cublas();
  return api;
}

// The handle of `device`, made on first use (a handle belongs to the device current when it
// is made); kept for the life of the process.
Result<cublasHandle_t> handle_for(const CublasApi& api, int device) {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = handles.find(device); it != handles.end()) return it->second;
  int current = 0;
  if (cudaError_t e = cudaGetDevice(&current); e != cudaSuccess) {
    return Status(KREG_INTERNAL, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return Status(KREG_INTERNAL,
                  "cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  }
  cublasHandle_t h = nullptr;
  const cublasStatus_t s = api.create(&h);
  cudaSetDevice(current);
  if (s != CUBLAS_STATUS_SUCCESS) {
    return Status(KREG_INTERNAL, std::string("cublasCreate: ") + api.text(s));
  }
  handles.emplace(device, h);
  return h;
}

}  // namespace
#endif

Status cublas_matmul(const Buffer& a, const Buffer& b, Buffer& out, int64_t m, int64_t n,
                     int64_t k) {
  const int device = out.tensor()->device.device_id;
  if (!a.on_gpu() || !b.on_gpu() || !out.on_gpu() || a.tensor()->device.device_id != device ||
      b.tensor()->device.device_id != device) {
    return Status(KREG_INVALID_ARGUMENT, "cublas_matmul: the three buffers must be on one GPU");
  }
  if (a.dtype() != out.dtype() || b.dtype() != out.dtype()) {
    return Status(KREG_INVALID_ARGUMENT, "cublas_matmul: the three buffers must share a dtype");
  }
  if (m < 0 || n < 0 || k < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX || a.numel() != m * k ||
      b.numel() != k * n || out.numel() != m * n) {
    return Status(KREG_INVALID_ARGUMENT, "cublas_matmul: the buffers do not hold [" +
                                             std::to_string(m) + "," + std::to_string(k) + "] @ [" +
                                             std::to_string(k) + "," + std::to_string(n) + "]");
  }
#if defined(KREG_HAVE_CUDA)
  cudaDataType_t type;
  switch (out.dtype()) {
    case DType::kF32:
      type = CUDA_R_32F;
      break;
    case DType::kF16:
      type = CUDA_R_16F;
      break;
    case DType::kBF16:
      type = CUDA_R_16BF;
      break;
    default:
      return Status(KREG_INVALID_ARGUMENT, "cublas_matmul: f32, f16 or bf16 only");
  }
  const CublasApi& api = cublas();
  if (!api.error.empty()) return Status(KREG_UNAVAILABLE, api.error);
  auto h = handle_for(api, device);
  if (!h) return h.status();
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = A B is column-major C' = B' A': the same memory.
  const cublasStatus_t s =
      api.gemm(*h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
               static_cast<int>(k), &one, b.tensor()->data, type, static_cast<int>(n),
               a.tensor()->data, type, static_cast<int>(k), &zero, out.tensor()->data, type,
               static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    return Status(KREG_INTERNAL, std::string("cublasGemmEx: ") + api.text(s));
  }
  return OkStatus();
#else
  return Status(KREG_UNAVAILABLE, "this kreg was built without CUDA");
#endif
}

}  // namespace kreg::harness
