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
  const std::string& what() const { return what_; }
  // The rest of what fstat saw at open: who owns the file, its permission bits, and its
  // identity (to compare with what a path resolves to now).
  unsigned mode() const { return mode_; }
  unsigned owner() const { return uid_; }
  uint64_t device() const { return dev_; }
  uint64_t inode() const { return ino_; }

  // DATA_LOSS when the file is no longer what open saw: another size, modification or
  // status-change time (something wrote it, truncated it or replaced its bytes since).
  Status unchanged_since_open() const;

  // The whole contents, read with pread from offset 0. A file that changed size since
  // open (a build still writing it) is DATA_LOSS, never a partial or unbounded read.
  Result<std::string> read_all() const;

 private:
  RegularFile(int fd, std::filesystem::path path, std::string what)
      : fd_(fd), path_(std::move(path)), what_(std::move(what)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  unsigned mode_ = 0, uid_ = 0;
  uint64_t dev_ = 0, ino_ = 0;
  int64_t mtime_ns_ = 0, ctime_ns_ = 0;
  std::filesystem::path path_;
  std::string what_;
};

// A copy of a file in a folder only this process can write ($TMPDIR/kreg-<pid>-XXXXXX,
// mode 0700, created on first use and removed at exit), at a path no earlier copy had:
// what the host dlopens, so the build may rewrite or truncate its output while the mapped
// code keeps running, and the loaded bytes are exactly the bytes that were checked.
// Removing the file (the destructor) does not unmap a library loaded from it.
class PrivateCopy {
 public:
  PrivateCopy(PrivateCopy&& o) noexcept;
  PrivateCopy& operator=(PrivateCopy&& o) noexcept;
  PrivateCopy(const PrivateCopy&) = delete;
  PrivateCopy& operator=(const PrivateCopy&) = delete;
  ~PrivateCopy();  // unlinks the copy

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  // The copy's SHA-256 (64 lowercase hex digits), computed from the bytes as they were
  // written; empty when the copy was made without hashing.
  const std::string& sha256() const { return sha256_; }

 private:
  friend Result<PrivateCopy> copy_to_private(const RegularFile&, std::string_view, bool);
  PrivateCopy(std::filesystem::path path, uint64_t size, std::string sha256)
      : path_(std::move(path)), size_(size), sha256_(std::move(sha256)) {}
  std::filesystem::path path_;
  uint64_t size_ = 0;
  std::string sha256_;
};

// Copies `src` (from its descriptor: never the path again) to
// <private folder>/<name>.<counter>.so, hashing the bytes on the way when `hash` is set.
// Exactly src.size() bytes: a file that shrank, grew or was rewritten while being copied
// (unchanged_since_open) is DATA_LOSS and leaves no copy behind.
Result<PrivateCopy> copy_to_private(const RegularFile& src, std::string_view name, bool hash);

// The private folder itself (created on first use).
Result<std::filesystem::path> private_folder();

// RegularFile::open + read_all.
Result<std::string> read_regular_file(const std::filesystem::path& path, std::string_view what,
                                      uint64_t max_bytes);

// "a FIFO", "a character device", "a directory", ... for an st_mode.
std::string file_kind(unsigned mode);

}  // namespace kreg
