// Reading files that somebody else supplied (manifests, plugin libraries, lists of group
// names): opened once, without blocking, and refused unless the descriptor is a regular
// file of bounded size. Every later step (size, hash, ELF check, private copy) works on the
// same descriptor, so a file swapped for a FIFO or /dev/zero between two steps changes
// nothing, and nothing is read without a limit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "kreg/status.hpp"

namespace kreg {

class RegularFile {
 public:
  // Opens `path` read-only (O_NONBLOCK, so a FIFO cannot block the open; O_CLOEXEC) and
  // checks with fstat that it is a regular file of at most `max_bytes`. `what` names the
  // file in messages ("manifest", "plugin library", ...). Errors: NOT_FOUND (missing),
  // PERMISSION_DENIED, INVALID_ARGUMENT (not a regular file: says which kind it is),
  // RESOURCE_EXHAUSTED (larger than max_bytes: says both sizes).
  static Result<RegularFile> open(const std::filesystem::path& path, std::string_view what,
                                  uint64_t max_bytes);

  RegularFile(RegularFile&& o) noexcept;
  RegularFile& operator=(RegularFile&& o) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // as fstat saw it at open
  const std::filesystem::path& path() const { return path_; }

  // The whole contents, read with pread from offset 0. A file that changed size since
  // open (a build still writing it) is DATA_LOSS, never a partial or unbounded read.
  Result<std::string> read_all() const;

 private:
  RegularFile(int fd, uint64_t size, std::filesystem::path path, std::string what)
      : fd_(fd), size_(size), path_(std::move(path)), what_(std::move(what)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::filesystem::path path_;
  std::string what_;
};

// RegularFile::open + read_all.
Result<std::string> read_regular_file(const std::filesystem::path& path, std::string_view what,
                                      uint64_t max_bytes);

// "a FIFO", "a character device", "a directory", ... for an st_mode.
std::string file_kind(unsigned mode);

}  // namespace kreg
