// The fatbinary reader and the arch coverage check: see kreg/fatbin.hpp. The layout was
// read off nvcc 13 output (tests/fixtures/fatbin/make_dumps.sh): the entry header's SM
// agrees with the cubin's e_flags and the PTX's .target line, and the "a"/"f" flags with
// the .target suffix.
#include "kreg/fatbin.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>

namespace kreg {
namespace {

constexpr uint32_t kContainerMagic = 0xBA55ED50;
constexpr uint16_t kContainerVersion = 1;
constexpr uint64_t kContainerHeader = 16;
// The entry header fields read here end with the flags, at byte 48; nvcc writes 64 to 128.
constexpr uint64_t kEntryFields = 48;
constexpr uint16_t kKindPtx = 1;
constexpr uint16_t kKindSass = 2;
constexpr uint64_t kFlagArchSpecific = uint64_t{1} << 20;
constexpr uint64_t kFlagFamilySpecific = uint64_t{1} << 21;
// SMs are major*10+minor; anything past this is not an SM but a corrupt header.
constexpr uint32_t kMaxSmField = 9999;
// Where windows are walked: no real SM is above this (kreg::is_real_sm).
constexpr int32_t kSmWalkEnd = 1000;

std::string num(uint64_t v) { return std::to_string(v); }

template <typename T>
T load(std::string_view b, uint64_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);  // little-endian hosts only, like the ELF reader
  return v;
}

bool all_zero(std::string_view b) {
  return std::all_of(b.begin(), b.end(), [](char c) { return c == 0; });
}

Status bad(const std::string& where, const std::string& problem) {
  return Status(KREG_INVALID_ARGUMENT, where + ": .nv_fatbin: " + problem);
}

// Parses the entries [begin, end) of the container starting at `at`, adding the images.
Status parse_entries(std::string_view b, uint64_t at, uint64_t begin, uint64_t end,
                     const std::string& where, std::vector<CudaImage>& out) {
  const std::string container = "the container at byte " + num(at);
  uint64_t e = begin;
  uint64_t count = 0;
  while (e < end) {
    const uint64_t left = end - e;
    // Zeros to the end of the container are padding, not an entry.
    if (all_zero(b.substr(e, left))) break;
    const std::string entry = "entry " + num(count) + " (byte " + num(e) + ") of " + container;
    if (++count > kMaxFatbinEntries) {
      return Status(KREG_RESOURCE_EXHAUSTED, where + ": .nv_fatbin: " + container +
                                                 " has more than " + num(kMaxFatbinEntries) +
                                                 " entries");
    }
    if (left < kEntryFields) {
      return bad(where, entry + " is truncated: " + num(left) + " bytes left, its header needs " +
                            num(kEntryFields));
    }
    const uint16_t kind = load<uint16_t>(b, e);
    const uint32_t header = load<uint32_t>(b, e + 4);
    const uint64_t payload = load<uint64_t>(b, e + 8);
    if (header < kEntryFields) {
      return bad(where, entry + " has a header size of " + num(header) + " bytes, less than the " +
                            num(kEntryFields) + " of its fields");
    }
    if (header > left) {
      return bad(where, entry + " has a header size of " + num(header) +
                            " bytes, past the end of its container (" + num(left) + " left)");
    }
    if (payload > left - header) {
      return bad(where, entry + " has a payload of " + num(payload) +
                            " bytes, past the end of its container (" + num(left - header) +
                            " left)");
    }
    if (kind == kKindPtx || kind == kKindSass) {
      const uint32_t sm = load<uint32_t>(b, e + 28);
      const uint64_t flags = load<uint64_t>(b, e + 40);
      if (sm == 0 || sm > kMaxSmField) {
        return bad(where, entry + " (" + (kind == kKindPtx ? "PTX" : "SASS") + ") has SM " +
                              num(sm) + ", not a compute capability");
      }
      CudaImage img;
      img.kind = kind == kKindPtx ? CudaImage::Kind::kPtx : CudaImage::Kind::kSass;
      img.sm = static_cast<int32_t>(sm);
      img.arch_specific = (flags & kFlagArchSpecific) != 0;
      img.family_specific = !img.arch_specific && (flags & kFlagFamilySpecific) != 0;
      out.push_back(img);
    }
    // Other kinds (8: LTO IR for nvJitLink) hold nothing the driver can load.
    e += header + payload;
  }
  return OkStatus();
}

auto order_key(const CudaImage& i) {
  return std::make_tuple(i.kind != CudaImage::Kind::kSass, i.sm, i.family_specific,
                         i.arch_specific);
}

// The real SMs of `spec`'s windows, ascending.
std::vector<int32_t> claimed_sms(const KernelSpec& spec) {
  std::vector<int32_t> out;
  for (int32_t s = 0; s < kSmWalkEnd; ++s) {
    if (!is_real_sm(s)) continue;
    for (const Capability& c : spec.capabilities) {
      if (c.device_type == kDLCUDA && c.sm_min <= s && s <= c.sm_max) {
        out.push_back(s);
        break;
      }
    }
  }
  return out;
}

std::string sm_name(int32_t sm) { return "sm_" + std::to_string(sm); }

}  // namespace

std::string CudaImage::name() const {
  return (kind == Kind::kPtx ? "compute_" : "sm_") + std::to_string(sm) +
         (arch_specific     ? "a"
          : family_specific ? "f"
                            : "");
}

bool CudaImage::runs_on(int32_t s) const {
  if (arch_specific) return sm == s;
  if (kind == Kind::kSass || family_specific) return sm / 10 == s / 10 && sm <= s;
  return sm <= s;  // PTX: the driver JIT-compiles it for any newer SM
}

bool CudaImages::runs_on(int32_t sm) const {
  return std::any_of(images.begin(), images.end(),
                     [sm](const CudaImage& i) { return i.runs_on(sm); });
}

std::string CudaImages::summary() const {
  if (!has_fatbin) return "no .nv_fatbin section";
  if (images.empty()) return "none";
  std::string out;
  for (const CudaImage& i : images) {
    if (!out.empty()) out += ", ";
    out += i.name();
  }
  return out;
}

Result<CudaImages> parse_fatbin_section(std::string_view b, const std::string& where) {
  if (b.size() > kMaxFatbinSection) {
    return Status(KREG_RESOURCE_EXHAUSTED, where + ": .nv_fatbin is " + num(b.size()) +
                                               " bytes; the limit is " + num(kMaxFatbinSection));
  }
  CudaImages out;
  out.has_fatbin = true;
  uint64_t off = 0;
  uint64_t count = 0;
  while (off < b.size()) {
    // The linker aligns each translation unit's container; zeros between them are padding.
    if (b[off] == 0) {
      ++off;
      continue;
    }
    const uint64_t left = b.size() - off;
    const std::string container = "the container at byte " + num(off);
    if (++count > kMaxFatbinContainers) {
      return Status(KREG_RESOURCE_EXHAUSTED, where + ": .nv_fatbin has more than " +
                                                 num(kMaxFatbinContainers) + " containers");
    }
    if (left < kContainerHeader) {
      return bad(where, container + " is truncated: " + num(left) +
                            " bytes left, its header needs " + num(kContainerHeader));
    }
    const uint32_t magic = load<uint32_t>(b, off);
    const uint16_t version = load<uint16_t>(b, off + 4);
    const uint16_t header = load<uint16_t>(b, off + 6);
    const uint64_t size = load<uint64_t>(b, off + 8);
    if (magic != kContainerMagic) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08X", magic);
      return bad(where, container + " has magic " + hex + ", not 0xBA55ED50 (not a fatbinary)");
    }
    if (version != kContainerVersion) {
      return bad(where,
                 container + " has version " + num(version) + "; this reader knows version 1");
    }
    if (header < kContainerHeader || header > left) {
      return bad(where, container + " has a header size of " + num(header) +
                            " bytes; it must be at least 16 and inside the section (" + num(left) +
                            " bytes left)");
    }
    if (size > left - header) {
      return bad(where, container + " claims " + num(size) +
                            " bytes of entries, past the end of the section (" +
                            num(left - header) + " left)");
    }
    if (Status st = parse_entries(b, off, off + header, off + header + size, where, out.images);
        !st.ok()) {
      return st;
    }
    off += header + size;
  }
  std::sort(out.images.begin(), out.images.end(),
            [](const CudaImage& a, const CudaImage& c) { return order_key(a) < order_key(c); });
  out.images.erase(std::unique(out.images.begin(), out.images.end()), out.images.end());
  return out;
}

Result<CudaImages> read_cuda_images(const ElfFile& elf) {
  auto section = elf.find_section(".nv_fatbin");
  if (!section.ok()) {
    if (section.status().code() == KREG_NOT_FOUND) return CudaImages{};
    return section.status();
  }
  auto bytes = elf.section_bytes(".nv_fatbin", kMaxFatbinSection);
  if (!bytes.ok()) return bytes.status();
  return parse_fatbin_section(*bytes, elf.what());
}

Status check_arch_coverage(KernelSpec& spec, const CudaImages& images, const std::string& library) {
  if (spec.device_type() != kDLCUDA) return OkStatus();
  const std::string who = spec.op + " (" + spec.backend + ")";
  const std::vector<int32_t> claimed = claimed_sms(spec);
  if (claimed.empty()) {
    return Status(KREG_INVALID_ARGUMENT,
                  who + " claims no real SM (" +
                      (spec.capabilities.empty() ? std::string("no windows")
                                                 : spec.capabilities[0].to_string()) +
                      ")");
  }
  if (!images.has_fatbin) {
    return Status(KREG_INVALID_ARGUMENT, who + " claims " + sm_name(claimed.front()) + ", but " +
                                             library +
                                             " has no CUDA images (no .nv_fatbin section)");
  }
  if (!(spec.flags & KREG_KERNEL_CAPS_FROM_BUILD)) {
    for (int32_t s : claimed) {
      if (!images.runs_on(s)) {
        return Status(KREG_INVALID_ARGUMENT, who + " claims " + sm_name(s) + ", but " + library +
                                                 " has no image that runs there (built " +
                                                 images.summary() + ")");
      }
    }
    return OkStatus();
  }
  // From the build: keep the claimed SMs some image runs on, as windows that span no real
  // SM left out (so sm80-sm89 stays one window, and sm75 + sm90 stay two).
  std::vector<Capability> narrowed;
  bool open = false;
  for (int32_t s = 0; s < kSmWalkEnd; ++s) {
    if (!is_real_sm(s)) continue;
    const bool keep = std::binary_search(claimed.begin(), claimed.end(), s) && images.runs_on(s);
    if (keep && open) {
      narrowed.back().sm_max = s;
    } else if (keep) {
      narrowed.push_back(Capability{kDLCUDA, s, s});
    }
    open = keep;
  }
  if (narrowed.empty()) {
    return Status(KREG_INVALID_ARGUMENT,
                  who + " is built for " + spec.capabilities[0].to_string() +
                      (spec.capabilities.size() > 1 ? " and more" : "") + ", but " + library +
                      " has no image that runs on any of its SMs (built " + images.summary() + ")");
  }
  spec.capabilities = std::move(narrowed);
  return OkStatus();
}

std::string no_image_reason(int32_t sm, const CudaImages& images, const std::string& library) {
  if (!images.has_fatbin) {
    return "no image for " + sm_name(sm) + " in " + library + ": it has no .nv_fatbin section";
  }
  return "no image for " + sm_name(sm) + " in " + library + ": built " + images.summary();
}

}  // namespace kreg
