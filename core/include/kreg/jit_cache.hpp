// The JIT backend's cache of compiled images: content-addressed (the key is a SHA-256 of
// everything that went into a compile), shared by every process of one user, and safe when
// many of them start together on an empty cache.
//
// Layout, under the cache directory <dir> (Cache::default_dir):
//   <dir>/v1/<key>.kjit                  one entry: the image and what it was built for
//   <dir>/v1/<key>.lock                  the key's lock file (flock); stays after a build
//   <dir>/v1/.<key>.<pid>.<random>.tmp   an entry being written (renamed to <key>.kjit)
// <key> is 64 lowercase hex digits. Nothing in an entry names a path, so moving or copying
// the whole directory keeps every hit. "v1" is the entry format: a kreg that changes the
// format uses another folder and leaves this one alone.
//
// Entry file (integers little-endian):
//   8 bytes  magic "KREGJIT\0"
//   u32      format version (1)
//   4 fields key, op, specialization, arch: each a u32 length then that many bytes
//            (the key must equal the file name's; each meta field at most kMaxMetaBytes)
//   u64      payload size (at most kMaxImageBytes)
//   32 bytes SHA-256 of every byte before it, followed by the payload
//   payload  the image, exactly `payload size` bytes, then the end of the file
// A file that is not exactly this (bad magic or version, short or long, checksum mismatch,
// another key, not a regular file, too large) is an invalid entry: get_or_build says so
// once in Fetched::note and replaces it with a fresh build.
//
// Concurrency: readers take no lock (an entry appears only by rename, so it is either whole
// or absent). A builder takes the key's lock file (flock, blocking), looks again, and only
// then builds: N processes asking for one key build it once; different keys never wait on
// each other. Threads of one process are as safe as processes (each call opens its own
// lock descriptor).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/sha256.hpp"
#include "kreg/status.hpp"

namespace kreg::jit {

// The largest image the cache stores or reads back, and the largest meta field.
inline constexpr uint64_t kMaxImageBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxMetaBytes = uint64_t{64} << 10;

// Key material: an ordered list of (field, value) pairs. Each field and value is hashed
// after its length (u64 little-endian), so no two different lists hash alike
// (("ab","c") != ("a","bc")) and the order matters. Feed it everything that changes the
// compiled bytes (source, headers by name and text, options, specialization values, NVRTC
// version, arch, kreg ABI version) and never a path.
class KeyBuilder {
 public:
  KeyBuilder& add(std::string_view field, std::string_view value);
  // 64 lowercase hex digits; the builder is unchanged (more add calls may follow).
  std::string hex() const;

 private:
  Sha256 sha_;
};

// OK for exactly 64 lowercase hex digits, else INVALID_ARGUMENT naming the key (escaped):
// a key becomes a file name.
Status check_key(std::string_view key);

// Stored in the entry, shown by `kreg jit ls`.
struct EntryMeta {
  std::string op;
  std::string specialization;
  std::string arch;
};

struct EntryInfo {
  std::string key;
  EntryMeta meta;     // empty for an invalid entry
  uint64_t size = 0;  // the image's bytes; for an invalid entry, the file's size (0 if unknown)
  std::filesystem::file_time_type mtime{};  // when the entry was published
  std::string problem;  // empty: a valid entry; else what is wrong with it (one line)
};

struct Fetched {
  std::string image;
  bool compiled = false;  // true: built by this call (false: read from the cache)
  // Empty, or a one-line notice for the user: an invalid entry was rebuilt, the cache is
  // not writable and the image was compiled in memory, or the image could not be stored.
  std::string note;
};

class Cache {
 public:
  // $KREG_JIT_CACHE, else $XDG_CACHE_HOME/kreg/jit, else $HOME/.cache/kreg/jit, read at
  // each call; an empty variable counts as unset. A relative path is INVALID_ARGUMENT
  // naming the variable; none of the three set is FAILED_PRECONDITION.
  static Result<std::filesystem::path> default_dir();

  explicit Cache(std::filesystem::path dir);
  Cache(Cache&& o) noexcept;
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  Cache& operator=(Cache&&) = delete;

  // The stored image for `key`, else build(image) under the key's lock and the result
  // published. Errors: INVALID_ARGUMENT for a bad key or a meta field over kMaxMetaBytes,
  // and build's own Status, returned as it is. Everything else is not an error: a cache
  // directory that cannot be created or written gives an image compiled in memory (noted
  // once per Cache object), an invalid entry is noted and rebuilt, an image over
  // kMaxImageBytes or a failed write is returned unstored with a note.
  Result<Fetched> get_or_build(std::string_view key, const EntryMeta& meta,
                               const std::function<Status(std::string& image)>& build);

  // The image if a valid entry for `key` is present (nothing built, nothing locked); an
  // invalid key or entry is nullopt.
  std::optional<std::string> lookup(std::string_view key) const;

  // Every <key>.kjit in <dir>/v1, sorted by key, invalid ones included with `problem` set.
  // Each entry is read and checked in full (its checksum), one at a time.
  // A missing directory is an empty list; an unreadable one an error naming it.
  Result<std::vector<EntryInfo>> list() const;

  // Removes every entry (valid or not) and, for each key whose lock is free, its lock file
  // and leftover temporaries (a build in progress keeps its lock and temporary and
  // publishes its entry afterwards). Other files are left alone. Returns how many entries
  // were removed.
  Result<uint64_t> clear();

  const std::filesystem::path& dir() const { return dir_; }
  // <dir>/v1/<key>.kjit (INVALID_ARGUMENT for a bad key): for messages and tests.
  Result<std::filesystem::path> entry_path(std::string_view key) const;

 private:
  std::filesystem::path dir_;
  std::filesystem::path entries_;  // dir_/v1
  std::atomic<bool> noted_unwritable_{false};
};

}  // namespace kreg::jit
