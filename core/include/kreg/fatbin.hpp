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
#include <vector>

#include "kreg/elf_file.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/status.hpp"

namespace kreg {

struct CudaImage {
  enum class Kind : uint8_t { kSass, kPtx };
  Kind kind = Kind::kSass;
  int32_t sm = 0;         // major*10+minor: sm_90 -> 90
  bool arch_specific = false;  // sm_90a: runs on sm_90 only
  std::string name() const;    // "sm_90", "sm_90a", "compute_90"
};

struct CudaImages {
  bool has_fatbin = false;        // the library has a .nv_fatbin section
  std::vector<CudaImage> images;  // distinct, sorted: SASS by SM, then PTX by SM
  bool runs_on(int32_t sm) const;
  // "sm_80, sm_90, compute_90" (or "none" / "no .nv_fatbin section").
  std::string summary() const;
};

// Limits: the section (512 MiB), containers (4096), entries per container (4096).
Result<CudaImages> read_cuda_images(const ElfFile& elf);

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
