// PluginLibrary: one ops group's shared object, loaded with Boost.DLL (rtld_local,
// rtld_now), its descriptor read and checked (ABI major, struct sizes, group name,
// version) and its kernel table turned into KernelSpecs. No plugin-owned object outlives
// the library: specs copy every string; only kernel function pointers point inside.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kreg/abi.h"
#include "kreg/kernel_spec.hpp"
#include "kreg/status.hpp"

namespace kreg {

struct PluginInfo {
  std::string group;
  std::string version;
  uint16_t abi_major = 0;
  uint16_t abi_minor = 0;
  std::string compiler;
  int32_t cuda_version = 0;  // 0: built without CUDA
  std::string cuda_archs;
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

  // Loads `file` and checks its descriptor. Runs no plugin code except the entry
  // function (and static initializers, which dlopen runs).
  static Result<std::unique_ptr<PluginLibrary>> open(const std::filesystem::path& file,
                                                     const Expect& expect,
                                                     Stage* failed_at = nullptr);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const PluginInfo& info() const { return info_; }
  const std::vector<KernelSpec>& kernels() const { return kernels_; }

  // Runs the plugin's init hook (once); shutdown runs on destruction if init ran.
  Status init();

 private:
  struct Impl;
  explicit PluginLibrary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  PluginInfo info_;
  std::vector<KernelSpec> kernels_;
  bool initialized_ = false;
};

// Whether `file` exports the entry symbol, read from its ELF symbol table without loading
// it (boost::dll::library_info). An error names what is wrong with the file.
Status check_entry_symbol(const std::filesystem::path& file);

}  // namespace kreg
