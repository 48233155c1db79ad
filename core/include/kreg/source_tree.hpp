// The plugin source tree (plugins/<group>/), read without building it: which folders are
// groups, which sources each group's CMakeLists.txt compiles, and which sources exist.
// Validation's groups-guard and sources-built checks compare these with the manifest and
// with what the built plugins say about themselves.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kreg/status.hpp"

namespace kreg {

// What a group folder's CMakeLists.txt says: the kreg_add_plugin(<group> SOURCES ...
// CUDA_SOURCES ...) call.
struct PluginBuild {
  std::string group;              // kreg_add_plugin's first argument
  std::set<std::string> sources;  // SOURCES and CUDA_SOURCES, relative to the folder
  int line = 0;                   // of the call, 1-based
  // Arguments the parser cannot evaluate (variables, generator expressions, globs): with
  // any of them, the list of sources is not known exactly.
  std::vector<std::string> unresolved;
};

// Parses the kreg_add_plugin call in `cmake_text`; nullopt when there is none.
std::optional<PluginBuild> parse_plugin_build(const std::string& cmake_text);

// The names given to add_subdirectory() in plugins/CMakeLists.txt.
std::set<std::string> parse_subdirectories(const std::string& cmake_text);

// Group folders: the subfolders of `plugins_src` that have a CMakeLists.txt, sorted.
std::vector<std::string> group_folders(const std::filesystem::path& plugins_src);

// Every .cu and .cpp file under `folder` (recursively, hidden folders skipped), relative
// to it with '/' separators, sorted.
std::vector<std::string> kernel_sources(const std::filesystem::path& folder);

// The whole file, read as a RegularFile (kreg/regular_file.hpp): NOT_FOUND when missing,
// INVALID_ARGUMENT naming what it is when it is not a regular file (a FIFO is never waited
// on), RESOURCE_EXHAUSTED when larger than `max_bytes`, DATA_LOSS when it changed while
// being read.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{4} << 20;  // a CMakeLists.txt
Result<std::string> read_text_file(const std::filesystem::path& file,
                                   uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace kreg
