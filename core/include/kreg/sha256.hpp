// SHA-256 (FIPS 180-4), for the manifest's integrity pins. The core carries its own small
// implementation because the machines kreg is deployed on may lack OpenSSL headers, and a
// pin is checked before any library is loaded, so it cannot come from a plugin.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "kreg/status.hpp"

namespace kreg {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Pads, returns the digest and leaves the object to be reset before reuse.
  Digest finish();
  void reset();

  static std::string hex(const Digest& d);  // 64 lowercase hex digits

 private:
  void compress(const uint8_t* block);

  uint32_t state_[8];
  uint64_t length_ = 0;  // bytes hashed so far
  uint8_t buffer_[64];
  size_t buffered_ = 0;
};

// The digest of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

class RegularFile;

// The digest of an opened file's contents (exactly the size fstat saw at open, read with
// pread from its descriptor) as 64 lowercase hex digits. DATA_LOSS when the file shrank,
// grew or was rewritten while being hashed.
Result<std::string> sha256_file(const RegularFile& file);

// Opens `file` as a RegularFile (never blocks on a FIFO; refuses anything but a regular
// file, and files over `max_bytes`) and hashes that descriptor. NOT_FOUND when missing,
// INVALID_ARGUMENT naming the kind of file when it is not a regular file,
// RESOURCE_EXHAUSTED when too large, DATA_LOSS when it changed while being read.
inline constexpr uint64_t kMaxHashedFileBytes = uint64_t{4} << 30;
Result<std::string> sha256_file(const std::filesystem::path& file,
                                uint64_t max_bytes = kMaxHashedFileBytes);

}  // namespace kreg
