// What a plugin library must pass before any of its code runs, in validation and in the
// host alike: it is a regular file of bounded size, path safety (it lies inside the plugin
// folder, is owned by this user or root, and nobody else can change it or any folder down
// to it) and integrity (its SHA-256 equals the manifest's pin, when pinned).
//
// The library is opened once (RegularFile: no blocking on a FIFO, fstat-checked) and every
// check looks at that descriptor: the path is resolved only to check it still names the
// opened file. A pinned library is copied from the descriptor into a private file while
// being hashed, the pin is checked against the copy's hash, and the copy is what gets
// loaded: the bytes hashed are the bytes mapped, whatever happens to the path afterwards.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "kreg/manifest.hpp"
#include "kreg/regular_file.hpp"
#include "kreg/status.hpp"

namespace kreg {

// The largest plugin library admission opens (hashes, copies).
inline constexpr uint64_t kMaxAdmittedLibraryBytes = uint64_t{4} << 30;

// Opens a plugin library for admission: RegularFile::open with the library cap. Errors
// name the file and what it is instead (a FIFO, a directory, ...).
Result<RegularFile> open_library_file(const std::filesystem::path& library);

// PERMISSION_DENIED when the opened library, after symbolic links
// (std::filesystem::canonical), lies outside `plugin_dir` (after symbolic links too), when
// it or any folder from the plugin folder down to it is writable by its group or by
// others, or is owned by another user than this process's (root may own anything).
// ABORTED when the path no longer names the opened file (replaced in between).
// NOT_FOUND when the plugin folder does not exist.
Status check_path_safety(const RegularFile& library, const std::filesystem::path& plugin_dir);
// The same on a path: opens it first (so a FIFO or a device is refused, never read).
Status check_path_safety(const std::filesystem::path& library,
                         const std::filesystem::path& plugin_dir);

// FAILED_PRECONDITION naming both hashes when `actual` (the hash of `library`) is not
// `expected` (64 lowercase hex digits).
Status pin_mismatch(const std::filesystem::path& library, std::string_view expected,
                    std::string_view actual);
// Hashes the opened file's descriptor and compares; DATA_LOSS when it changed meanwhile.
Status check_pin(const RegularFile& library, std::string_view expected);
// The same on a path (opened as open_library_file does).
Status check_pin(const std::filesystem::path& library, std::string_view expected);

struct AdmitOptions {
  // Copy the library into a private file (regular_file.hpp's PrivateCopy) and load that.
  // Always done when the entry is pinned.
  bool private_copy = false;
  // The copy's file name stem ("<group>.<generation>"), to tell copies apart in maps.
  std::string copy_name;
};

// A library that passed admission, ready to load.
struct AdmittedLibrary {
  RegularFile file;                 // the user's file, opened once
  std::optional<PrivateCopy> copy;  // when copied: what to load
  std::string sha256;               // when pinned: the hash of the loaded bytes

  // What dlopen (or a child's pre-check) must open.
  const std::filesystem::path& load_path() const { return copy ? copy->path() : file.path(); }
};

// Path safety (its plugin_dir, or the library's own folder when the entry has none), the
// private copy when asked or pinned, and the pin on the copy's hash. Messages start with
// "group '<name>'" and name the user's path, never the private copy.
Result<AdmittedLibrary> admit_library(const GroupEntry& entry, const AdmitOptions& options);
// Only the checks, for callers that load nothing.
Status admit_library(const GroupEntry& entry);

}  // namespace kreg
