// The JIT backend (docs/jit.md): an implementation whose code is CUDA source shipped in
// its plugin (kreg_jit_desc, ABI 1.3), compiled by NVRTC for the device's exact
// architecture and for compile-time values taken from the call (dimension extents, the
// dtype), cached by content (kreg/jit_cache.hpp), loaded with the driver's library API.
// NVRTC (libnvrtc.so) and the driver (libcuda.so.1) are loaded at run time: the core keeps
// no CUDA link dependency, and without them the JIT implementations are unavailable with
// the reason.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dlpack/dlpack.h>

#include "kreg/dtype.hpp"
#include "kreg/status.hpp"

namespace kreg {

struct KernelSpec;
struct Signature;

namespace jit {
class Cache;
}

// A JIT implementation's source, copied out of its plugin's kreg_jit_desc.
struct JitSource {
  std::string source_name;  // "rmsnorm_jit.cu"
  std::string source;
  std::vector<std::pair<std::string, std::string>> headers;  // (include name, text)
  std::string kernel;                                        // "ns::k<{H}, {dtype}>"
  std::vector<std::string> params;                           // "H", "dtype"
  std::vector<std::string> options;                          // extra NVRTC options
};

// Limits on what a plugin's kreg_jit_desc may hold (kernel_spec.cpp, plugin_library.cpp).
inline constexpr size_t kMaxJitTextBytes = size_t{1} << 20;  // the source, each header
inline constexpr uint32_t kMaxJitHeaders = 64;
inline constexpr size_t kMaxJitParams = 8;
inline constexpr size_t kMaxJitOptions = 32;

// Reads and checks a kreg_jit_desc against its op's signature (params name dimension
// symbols of required tensors, or "dtype"; every {param} appears in `kernel`). The
// pointers must be readable (PluginLibrary has checked a plugin's).
Result<std::shared_ptr<const JitSource>> read_jit_source(const void* desc /* kreg_jit_desc */,
                                                         const Signature& sig);

namespace jit {

// The compile-time values of one specialization, in the order of JitSource::params.
struct Specialization {
  std::vector<std::pair<std::string, std::string>> values;  // ("H", "4096"), ("dtype", "bf16")
  std::string text() const;                                 // "H=4096,dtype=bf16"
};

// From a call's tensors (each symbol's extent, the shared dtype), or from a tool's
// dimension values and dtype (kreg jit build). Errors name the missing value.
Result<Specialization> specialize(const KernelSpec& spec, std::span<DLTensor* const> args);
Result<Specialization> specialize(const KernelSpec& spec,
                                  const std::map<std::string, int64_t>& dims,
                                  std::optional<DType> dtype);

// The kernel's name expression with the values filled in.
std::string kernel_expression(const JitSource& src, const Specialization& s);

// "sm_90a" for sm 90 (and 100, 101, 103, 120, 121: the arch-specific targets, which a
// cubin for that exact device may use), "sm_89" otherwise.
std::string arch_name(int sm);

// NVRTC, loaded on first use: whether it is there and its version ("13.0"), or why not.
Result<std::string> nvrtc_version();

// One compiled specialization: the cubin and the kernel's lowered (mangled) name.
struct Compiled {
  std::string key;        // the cache key (64 hex digits)
  std::string lowered;    // the kernel's symbol in the cubin
  std::string cubin;      // the image
  bool compiled = false;  // false: taken from the cache
  double seconds = 0;     // compile (or lookup) wall time
  std::string note;       // a one-line notice from the cache, or ""
};

// The cache key of a specialization: a hash of the source, every header, the kernel
// expression, the compile options (architecture included), NVRTC's version and the kreg
// ABI, never a path (docs/jit.md).
Result<std::string> cache_key(const JitSource& src, const Specialization& s, std::string_view arch);

// Compiles (or finds in `cache`) one specialization for `arch`. Needs NVRTC, not a GPU.
Result<Compiled> build(const KernelSpec& spec, const JitSource& src, const Specialization& s,
                       std::string_view arch, Cache& cache);

// Loads a compiled specialization for the current process: the CUkernel (as a pointer)
// usable on every device of the process (cuLibraryLoadData). Needs the driver and a GPU.
Result<const void*> load(const Compiled& c);

// The process's cache (Cache::default_dir(), opened once), for the registry and tools.
Result<Cache*> process_cache();

}  // namespace jit
}  // namespace kreg
