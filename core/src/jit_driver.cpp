// Loading a compiled JIT specialization: the driver's library API (cuLibraryLoadData,
// CUDA 12+) through libcuda.so.1 loaded at run time. A CUlibrary is context-independent:
// its CUkernel runs on every device of the process (the driver loads it into a context on
// first launch there), so one load serves all devices, and nothing here needs a current
// context. Libraries are never unloaded: handles may hold their kernels for the process's
// life (the same rule as plugin generations).
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "kreg/jit.hpp"

namespace kreg::jit {
namespace {

using CUresult = int;
using CUlibrary = void*;
using CUkernel = void*;

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  CUresult (*load_data)(CUlibrary*, const void*, void*, void**, unsigned, void*, void**,
                        unsigned) = nullptr;
  CUresult (*get_kernel)(CUkernel*, CUlibrary, const char*) = nullptr;
};

const Driver* driver(std::string* why) {
  static std::once_flag once;
  static Driver* d = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = ::dlerror();
      reason = std::string("no CUDA driver (libcuda.so.1): ") + (e ? e : "not found");
      return;
    }
    auto* n = new Driver();
    n->init = reinterpret_cast<decltype(n->init)>(::dlsym(h, "cuInit"));
    n->error_string = reinterpret_cast<decltype(n->error_string)>(::dlsym(h, "cuGetErrorString"));
    n->load_data = reinterpret_cast<decltype(n->load_data)>(::dlsym(h, "cuLibraryLoadData"));
    n->get_kernel = reinterpret_cast<decltype(n->get_kernel)>(::dlsym(h, "cuLibraryGetKernel"));
    if (n->init == nullptr || n->load_data == nullptr || n->get_kernel == nullptr) {
      reason = "the CUDA driver lacks the library API (cuLibraryLoadData: driver 12.0 or newer)";
      return;
    }
    if (CUresult rc = n->init(0); rc != 0) {
      reason = "cuInit failed with CUresult " + std::to_string(rc);
      return;
    }
    d = n;
  });
  if (d == nullptr && why != nullptr) *why = reason;
  return d;
}

std::string cu_error(const Driver& d, CUresult rc) {
  const char* s = nullptr;
  if (d.error_string != nullptr && d.error_string(rc, &s) == 0 && s != nullptr) return s;
  return "CUresult " + std::to_string(rc);
}

}  // namespace

Result<const void*> load(const Compiled& c) {
  std::string why;
  const Driver* d = driver(&why);
  if (d == nullptr) return Status(KREG_UNAVAILABLE, why);
  CUlibrary lib = nullptr;
  if (CUresult rc = d->load_data(&lib, c.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      rc != 0) {
    return Status(KREG_INTERNAL,
                  "cuLibraryLoadData of JIT image " + c.key + ": " + cu_error(*d, rc));
  }
  CUkernel k = nullptr;
  if (CUresult rc = d->get_kernel(&k, lib, c.lowered.c_str()); rc != 0) {
    return Status(KREG_INTERNAL, "cuLibraryGetKernel(" + c.lowered + ") in JIT image " + c.key +
                                     ": " + cu_error(*d, rc));
  }
  return static_cast<const void*>(k);
}

}  // namespace kreg::jit
