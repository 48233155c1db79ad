// What a plugin library must pass before any of its code runs, in validation and in the
// host alike: path safety (it lies inside the plugin folder and nobody but its owner can
// change it) and integrity (its SHA-256 equals the manifest's pin, when pinned).
//
// Both are checked on the path dlopen will use. Between the check and the load the file
// could in principle be swapped, but path safety is what rules that out: only the owner of
// the file and of every folder down to it (or root) can replace it, and they can as well
// edit the manifest.
#pragma once

#include <filesystem>
#include <string_view>

#include "kreg/manifest.hpp"
#include "kreg/status.hpp"

namespace kreg {

// PERMISSION_DENIED when `library`, after symbolic links (std::filesystem::canonical),
// lies outside `plugin_dir` (after symbolic links too), or when the library file or any
// folder from the plugin folder down to it is writable by its group or by others.
// NOT_FOUND when either path does not exist.
Status check_path_safety(const std::filesystem::path& library,
                         const std::filesystem::path& plugin_dir);

// FAILED_PRECONDITION naming both hashes when the file's SHA-256 is not `expected` (64
// lowercase hex digits); NOT_FOUND / DATA_LOSS when it cannot be read.
Status check_pin(const std::filesystem::path& library, std::string_view expected);

// Both checks for a manifest entry, path safety first (its plugin_dir, or the library's
// own folder when the entry has none); the pin only when the entry has one.
Status admit_library(const GroupEntry& entry);

}  // namespace kreg
