// The CUDA images a plugin library really holds: its embedded fatbinary (the ELF section
// .nv_fatbin, one fatbin container per CUDA translation unit, each a list of SASS (cubin)
// and PTX entries for one architecture each), read with kreg's bounds-checked ELF reader
// and without loading the library or the CUDA driver.
//
// An implementation's claim (its capability windows) is checked against them: a device
// of SM s can run some image when the library holds SASS for sm_XY with X == s/10 and
// Y <= s%10 (not an arch-specific "a" image unless XY == s), or PTX for compute_XY with
// XY <= s (the driver JIT-compiles it). Library-wide: the fatbinary does not say which
// kernel each image holds, so a translation unit built for fewer architectures than the
// others is not told apart (docs/plugins.md says so).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/elf_file.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/status.hpp"

namespace kreg {

struct CudaImage {
  enum class Kind : uint8_t { kSass, kPtx };
  Kind kind = Kind::kSass;
  int32_t sm = 0;              // major*10+minor: sm_90 -> 90
  bool arch_specific = false;  // sm_90a: runs on sm_90 only
  // sm_100f / compute_100f: family-specific. The SASS runs where plain sm_100 SASS does
  // (sm_10x); the PTX is JIT-compiled for its own major only (sm_100, sm_103), never newer.
  bool family_specific = false;
  std::string name() const;  // "sm_90", "sm_90a", "sm_100f", "compute_90"
  bool runs_on(int32_t sm) const;
  bool operator==(const CudaImage&) const = default;
};

struct CudaImages {
  bool has_fatbin = false;        // the library has a .nv_fatbin section
  std::vector<CudaImage> images;  // distinct, sorted: SASS by SM, then PTX by SM
  bool runs_on(int32_t sm) const;
  // "sm_80, sm_90, compute_90" (or "none" / "no .nv_fatbin section").
  std::string summary() const;
};

// Limits: the section (512 MiB), containers (4096), entries per container (4096).
inline constexpr uint64_t kMaxFatbinSection = uint64_t{512} << 20;
inline constexpr uint64_t kMaxFatbinContainers = 4096;
inline constexpr uint64_t kMaxFatbinEntries = 4096;

// The images of `elf`'s .nv_fatbin section (has_fatbin false, no error, when it has none).
// Messages name the file as elf.what() does.
Result<CudaImages> read_cuda_images(const ElfFile& elf);

// The images described by the bytes of a .nv_fatbin section (has_fatbin true). Only the
// container and entry headers are read, never a payload (compressed or not); entries of
// kinds other than PTX and SASS (e.g. LTO IR, which the driver cannot load) are skipped.
// Anything malformed (a bad magic or version, a header or payload past its container, a
// container past the section, too many containers or entries) is INVALID_ARGUMENT or
// RESOURCE_EXHAUSTED naming `where` ("plugin library /x.so") and the byte offset.
//
// The format, as nvcc 13 writes it (little-endian): the section is a sequence of
// containers, one per translation unit (zeros between them are taken as padding); a
// container is a 16-byte header {u32 magic 0xBA55ED50, u16 version 1, u16 header size,
// u64 size of its entries} and its entries, each a header {u16 kind (1 PTX, 2 SASS
// cubin, 8 LTO IR), u16 version, u32 header size, u64 payload size, u32 compressed size,
// u32 options offset, u16 minor, u16 major (of the PTX ISA or cubin ABI), u32 SM, u32
// name offset, u32 name size, u64 flags (1 64-bit, 2 debug, 0x10 Linux, 0x8000
// zstd-compressed, 0x100000 arch-specific "a", 0x200000 family-specific "f"), ...}
// followed by its payload.
Result<CudaImages> parse_fatbin_section(std::string_view bytes, const std::string& where);

// Checks or narrows one implementation's CUDA capability windows against `images`:
// - every SM of a window is checked (the real SMs of kreg::is_real_sm);
// - when the claim came from the build (KREG_KERNEL_CAPS_FROM_BUILD, in spec.flags) the
//   windows are narrowed to the SMs that have an image (spec.capabilities rewritten;
//   an implementation left with no SM is an error);
// - otherwise an SM without an image is an error: "<op> (cuda) claims sm_75, but
//   <library> has no image that runs there (built sm_80, sm_90, compute_90)".
// Non-CUDA implementations are left alone.
Status check_arch_coverage(KernelSpec& spec, const CudaImages& images, const std::string& library);

// The selection reason for a device of SM `sm` that an implementation's windows exclude:
// "no image for sm_75 in libkreg_layernorm.so: built sm_80, sm_90, compute_90".
std::string no_image_reason(int32_t sm, const CudaImages& images, const std::string& library);

}  // namespace kreg
