// A plugin's registration as data: the ELF section KREG_METADATA_SECTION (".kreg_metadata")
// that the SDK macros (KREG_GROUP, KREG_PLUGIN; kreg/plugin.hpp) write at compile time,
// read here with kreg's own bounds-checked ELF reader and without loading the library:
// no dlopen, no static initializer, no plugin code. `kreg list`, `kreg info`, the static
// rules of `kreg validate`, Registry::open for lazy groups and Python's reg.info use it.
//
// Format 1 (written by kreg::detail::write_metadata): a sequence of "key=value\0" pairs,
// values are any bytes but NUL, keys are [a-z_]+ and the first '=' ends the key:
//   kreg_metadata=1            first, always: the format version
//   abi=1.2                    the ABI the plugin was built against
//   group=<name>  version=<v>  compiler=<text>  cuda_version=<int>  cuda_archs=<list>
//   kernels=<N>
//   then N times, in this order:
//     kernel=<i>  op=<group.name>  backend=<name>  signature=<schema>  dtypes=<set>
//     arg_kinds=<kinds>  traits=<uint>  priority=<int>  flags=<uint>
//     caps=<device_type>:<sm_min>-<sm_max>[,...]  description=<text>  source=<file>
//   end=<N>
// Trailing NUL bytes after end= are padding. Anything else (a missing, repeated, unknown
// or out-of-order key, a number that does not parse or is out of range, N past the
// limits, bytes after end=) is an error naming the byte offset and the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/elf_file.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/plugin_library.hpp"
#include "kreg/status.hpp"

namespace kreg {

inline constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 20;  // the whole section

struct PluginMetadata {
  PluginInfo info;                  // group, version, ABI, compiler, CUDA; path = the file
  std::vector<KernelSpec> kernels;  // as make_kernel_spec builds them, with fn == nullptr
};

// Parses one blob. `where` names its origin in messages ("plugin library /x.so").
// Every kernel goes through make_kernel_spec's checks (op id, signature, arg kinds,
// dtypes, capabilities), as the loaded descriptor's kernels do.
Result<PluginMetadata> parse_plugin_metadata(std::string_view blob, const std::string& where);

// Reads the metadata section of an opened ELF file. NOT_FOUND when the library has none
// (built before ABI 1.2, or without the SDK's macros): such a group is listed as
// "metadata unavailable" until it is loaded.
Result<PluginMetadata> read_plugin_metadata(const ElfFile& elf, const std::filesystem::path& path);
// Opens `file` (RegularFile rules, kMaxPluginLibraryBytes) and reads it.
Result<PluginMetadata> read_plugin_metadata(const std::filesystem::path& file);

// Where the embedded metadata and the loaded library disagree (the `metadata-match` rule
// of kreg validate): group, version, build info, and per (op, backend) every field of the
// registration; kernels present on one side only. Empty when they agree. Capabilities
// are compared before the core narrows them to the fatbinary's images.
std::vector<std::string> compare_metadata(const PluginMetadata& embedded,
                                          const PluginInfo& loaded_info,
                                          const std::vector<KernelSpec>& loaded_kernels);

}  // namespace kreg
