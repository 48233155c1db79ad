// PluginLibrary: one ops group's shared object, read first through the bounds-checked
// ELF reader (elf_file.hpp: structure, and an entry symbol that is an exported function),
// loaded with Boost.DLL (rtld_local, rtld_now), its descriptor read defensively (every
// pointer checked to lie in the library's own loaded segments, every string bounded) and
// checked (ABI major, struct sizes, group name, version), its kernel table turned into
// KernelSpecs (records of any 1.x size, walked by the plugin's stride; ABI 1.2 capability
// records when present), and the CUDA implementations' claims checked against the CUDA
// images in the library's fatbinary (kreg/fatbin.hpp). No plugin-owned object outlives the library:
// specs copy every string; only kernel function pointers point inside.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kreg/abi.h"
#include "kreg/kernel_spec.hpp"
#include "kreg/resource.hpp"
#include "kreg/status.hpp"

namespace kreg {

// Limits on what a plugin file and its descriptor may make the core read.
inline constexpr uint64_t kMaxPluginLibraryBytes = uint64_t{4} << 30;  // the .so file
inline constexpr size_t kMaxPluginStructBytes = 4096;   // any struct_size it hands over
inline constexpr uint32_t kMaxPluginKernels = 4096;     // num_kernels
inline constexpr uint32_t kMaxPluginCapabilities = 64;  // num_caps / num_capabilities
inline constexpr size_t kMaxPluginNameBytes = 256;      // group, version, build strings
inline constexpr size_t kMaxPluginStringBytes =
    65536;  // any kernel record string (make_kernel_spec caps each field lower)

struct PluginInfo {
  std::string group;
  std::string version;
  uint16_t abi_major = 0;
  uint16_t abi_minor = 0;
  std::string compiler;
  int32_t cuda_version = 0;  // 0: built without CUDA
  std::string cuda_archs;
  // The CUDA images the library holds (CudaImages::summary(), kreg/fatbin.hpp); "" when
  // no implementation is CUDA (the fatbinary is not read).
  std::string cuda_images;
  std::filesystem::path path;
  std::string abi_string() const;   // "1.0"
  std::string cuda_string() const;  // "13.0 (80-real,90)" or "none"
};

class PluginLibrary {
 public:
  struct Expect {
    std::string group;                   // the descriptor must name this group
    std::optional<std::string> version;  // and, if set, this version
  };

  // Where opening failed, for validators that name a check per stage.
  enum class Stage { kFile, kLoad, kEntry, kAbi, kGroup, kVersion, kKernels, kOk };

  // Checks `file` as check_entry_symbol does, loads it and checks its descriptor. Runs no
  // plugin code except the entry function (and static initializers, which dlopen runs).
  static Result<std::unique_ptr<PluginLibrary>> open(const std::filesystem::path& file,
                                                     const Expect& expect,
                                                     Stage* failed_at = nullptr);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const PluginInfo& info() const { return info_; }
  const std::vector<KernelSpec>& kernels() const { return kernels_; }
  // ABI 1.4: the resource types it declares (resource.hpp).
  const std::vector<ResourceTypeSpec>& resource_types() const { return resource_types_; }

  // Runs the plugin's init hook (once); shutdown runs on destruction if init ran.
  Status init();

 private:
  struct Impl;
  explicit PluginLibrary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  PluginInfo info_;
  std::vector<KernelSpec> kernels_;
  std::vector<ResourceTypeSpec> resource_types_;
  bool initialized_ = false;
};

// Whether `file` is a well-formed ELF shared object for this host (ElfFile: headers,
// segments, sections, symbol tables) that exports the entry symbol as a function, read
// without loading it. PluginLibrary::open runs the same checks before dlopen. An error
// names what is wrong and where in the file.
Status check_entry_symbol(const std::filesystem::path& file);

}  // namespace kreg
