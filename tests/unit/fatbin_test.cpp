// The fatbinary reader and the arch coverage check (kreg/fatbin.hpp): real nvcc 13
// sections (the dumps of tests/fixtures/fatbin, made by make_dumps.sh, in every build; the
// fixture libraries built here with explicit CUDA_ARCHITECTURES when CUDA is on; a CPU
// plugin with a dump added as its .nv_fatbin by objcopy), malformed sections made by
// patching or building containers by hand (each a clear error, never a crash or hang),
// and the coverage rules on hand-built image sets.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kreg/elf_file.hpp"
#include "kreg/fatbin.hpp"
#include "kreg/plugin.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::read_file;
using test::test_plugin;

std::string dump(const std::string& name) {
  const fs::path p = fs::path(KREG_SOURCE_DIR) / "tests/fixtures/fatbin" / (name + ".nv_fatbin");
  std::string b = read_file(p);
  EXPECT_FALSE(b.empty()) << p;
  return b;
}

template <typename T>
void put(std::string& b, size_t at, T v) {
  ASSERT_LE(at + sizeof v, b.size());
  std::memcpy(b.data() + at, &v, sizeof v);
}

template <typename T>
T get(const std::string& b, size_t at) {
  T v{};
  if (at + sizeof v <= b.size()) std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

// A container header: magic, version 1, header size 16, `size` bytes of entries.
std::string container(uint64_t size) {
  std::string b(16, '\0');
  put<uint32_t>(b, 0, 0xBA55ED50);
  put<uint16_t>(b, 4, 1);
  put<uint16_t>(b, 6, 16);
  put<uint64_t>(b, 8, size);
  return b;
}

// An entry header of 64 bytes and `payload` zero bytes of payload.
std::string entry(uint16_t kind, uint32_t sm, uint64_t flags, uint64_t payload = 0) {
  std::string b(64, '\0');
  put<uint16_t>(b, 0, kind);
  put<uint16_t>(b, 2, 0x0101);
  put<uint32_t>(b, 4, 64);
  put<uint64_t>(b, 8, payload);
  put<uint32_t>(b, 28, sm);
  put<uint64_t>(b, 40, flags | 0x11);
  return b + std::string(payload, '\0');
}

std::string section_of(const std::vector<std::string>& entries) {
  std::string body;
  for (const std::string& e : entries) body += e;
  return container(body.size()) + body;
}

std::string error_of(std::string_view bytes) {
  auto r = parse_fatbin_section(bytes, "plugin library /x.so");
  EXPECT_FALSE(r.ok()) << "parsed: " << (r.ok() ? r->summary() : "");
  return r.ok() ? "" : r.status().message();
}

CudaImage sass(int32_t sm, bool a = false, bool f = false) {
  return {CudaImage::Kind::kSass, sm, a, f};
}
CudaImage ptx(int32_t sm, bool a = false, bool f = false) {
  return {CudaImage::Kind::kPtx, sm, a, f};
}
CudaImages images(std::vector<CudaImage> v) { return CudaImages{true, std::move(v)}; }

KernelSpec cuda_spec(std::vector<Capability> caps, bool from_build) {
  KernelSpec s;
  s.op = "test.op";
  s.backend = "cuda";
  s.capabilities = std::move(caps);
  s.flags = from_build ? KREG_KERNEL_CAPS_FROM_BUILD : 0;
  return s;
}

std::string windows(const KernelSpec& s) {
  std::string out;
  for (const Capability& c : s.capabilities) out += (out.empty() ? "" : " ") + c.to_string();
  return out;
}

// ---- Real nvcc 13 sections ----

TEST(FatbinDumps, OneUnitDefaultCompression) {
  auto r = parse_fatbin_section(dump("sm_80-sm_90-compute_90"), "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->has_fatbin);
  ASSERT_EQ(r->images.size(), 3u);
  EXPECT_EQ(r->images[0], sass(80));
  EXPECT_EQ(r->images[1], sass(90));
  EXPECT_EQ(r->images[2], ptx(90));
  EXPECT_EQ(r->summary(), "sm_80, sm_90, compute_90");
}

TEST(FatbinDumps, TwoUnitsCompressedArchAndFamilySpecific) {
  auto r = parse_fatbin_section(dump("two-units-compressed"), "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "sm_80, sm_90a, sm_100f, sm_120, compute_100f");
  ASSERT_EQ(r->images.size(), 5u);
  EXPECT_TRUE(r->images[1].arch_specific);
  EXPECT_TRUE(r->images[2].family_specific);
  EXPECT_FALSE(r->images[2].arch_specific);
  // sm_80 covers the 8.x parts, sm_90a the sm_90, sm_100f and compute_100f the 10.x ones,
  // sm_120 the 12.x ones; nothing runs on sm_75 or sm_110 (compute_100f is family-only).
  for (int32_t sm : {80, 86, 87, 89, 90, 100, 101, 103, 120, 121}) {
    EXPECT_TRUE(r->runs_on(sm)) << sm;
  }
  for (int32_t sm : {70, 75, 110}) EXPECT_FALSE(r->runs_on(sm)) << sm;
}

TEST(FatbinDumps, PtxOnlyUncompressedArchSpecific) {
  auto r = parse_fatbin_section(dump("compute_90a-uncompressed"), "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "compute_90a");
  EXPECT_TRUE(r->runs_on(90));
  EXPECT_FALSE(r->runs_on(89));
  EXPECT_FALSE(r->runs_on(100));
}

TEST(FatbinDumps, ACutAtAContainerBoundaryParsesTheFirstUnit) {
  // The first container (kernel_a.cu, sm_80) ends where its header says.
  const std::string b = dump("two-units-compressed");
  const uint64_t first = 16 + get<uint64_t>(b, 8);
  ASSERT_LT(first, b.size());
  auto r = parse_fatbin_section(std::string_view(b).substr(0, first), "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "sm_80");
}

TEST(FatbinDumps, EveryOtherCutIsAnErrorNamingThePlace) {
  const std::string b = dump("two-units-compressed");
  const uint64_t first = 16 + get<uint64_t>(b, 8);
  for (size_t n = 1; n < b.size(); ++n) {
    auto r = parse_fatbin_section(std::string_view(b).substr(0, n), "plugin library /x.so");
    if (n == first) continue;
    ASSERT_FALSE(r.ok()) << "cut at " << n;
    EXPECT_NE(r.status().message().find("plugin library /x.so: .nv_fatbin: "), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("byte "), std::string::npos) << r.status().message();
  }
}

TEST(FatbinDumps, ZeroPaddingBetweenAndAfterContainersIsSkipped) {
  const std::string b = dump("sm_80-sm_90-compute_90") + std::string(8, '\0') +
                        dump("compute_90a-uncompressed") + std::string(5, '\0');
  auto r = parse_fatbin_section(b, "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "sm_80, sm_90, compute_90, compute_90a");
}

TEST(FatbinDumps, DuplicatesAcrossUnitsAreMerged) {
  const std::string one = dump("sm_80-sm_90-compute_90");
  auto r = parse_fatbin_section(one + one, "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "sm_80, sm_90, compute_90");
}

// ---- Malformed sections ----

TEST(FatbinMalformed, EmptySectionHasNoImages) {
  auto r = parse_fatbin_section("", "dump");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->has_fatbin);
  EXPECT_TRUE(r->images.empty());
  EXPECT_EQ(r->summary(), "none");
  EXPECT_FALSE(r->runs_on(90));
}

TEST(FatbinMalformed, BadMagic) {
  std::string b = dump("sm_80-sm_90-compute_90");
  b[0] = 0x51;
  EXPECT_EQ(error_of(b),
            "plugin library /x.so: .nv_fatbin: the container at byte 0 has magic 0xBA55ED51, "
            "not 0xBA55ED50 (not a fatbinary)");
}

TEST(FatbinMalformed, BadVersionAndHeaderSize) {
  std::string b = dump("sm_80-sm_90-compute_90");
  put<uint16_t>(b, 4, 2);
  EXPECT_NE(error_of(b).find("has version 2; this reader knows version 1"), std::string::npos);
  b = dump("sm_80-sm_90-compute_90");
  put<uint16_t>(b, 6, 8);
  EXPECT_NE(error_of(b).find("has a header size of 8 bytes"), std::string::npos);
}

TEST(FatbinMalformed, TruncatedContainerHeader) {
  EXPECT_EQ(error_of(container(0).substr(0, 10)),
            "plugin library /x.so: .nv_fatbin: the container at byte 0 is truncated: 10 bytes "
            "left, its header needs 16");
}

TEST(FatbinMalformed, FatSizePastTheEnd) {
  std::string b = dump("sm_80-sm_90-compute_90");
  put<uint64_t>(b, 8, b.size() - 16 + 1);
  EXPECT_NE(error_of(b).find("claims " + std::to_string(b.size() - 15) +
                             " bytes of entries, past the end of the section"),
            std::string::npos);
  put<uint64_t>(b, 8, ~uint64_t{0});  // no overflow in the bounds arithmetic
  EXPECT_NE(error_of(b).find("past the end of the section"), std::string::npos);
}

TEST(FatbinMalformed, EntryHeaderSizeZeroOrPastTheEnd) {
  std::string b = dump("sm_80-sm_90-compute_90");
  put<uint32_t>(b, 16 + 4, 0);
  EXPECT_EQ(error_of(b),
            "plugin library /x.so: .nv_fatbin: entry 0 (byte 16) of the container at byte 0 has "
            "a header size of 0 bytes, less than the 48 of its fields");
  put<uint32_t>(b, 16 + 4, 0xFFFFFFFF);
  EXPECT_NE(error_of(b).find("has a header size of 4294967295 bytes, past the end of its "
                             "container"),
            std::string::npos);
}

TEST(FatbinMalformed, EntryPayloadPastTheEnd) {
  std::string b = dump("sm_80-sm_90-compute_90");
  put<uint64_t>(b, 16 + 8, ~uint64_t{0} - 8);  // header + payload would wrap around
  EXPECT_NE(error_of(b).find("entry 0 (byte 16) of the container at byte 0 has a payload of "),
            std::string::npos);
}

TEST(FatbinMalformed, TruncatedEntryHeader) {
  std::string b = container(20) + std::string("\x02\x00\x01\x01", 4) + std::string(16, 'x');
  EXPECT_NE(error_of(b).find("entry 0 (byte 16) of the container at byte 0 is truncated: 20 "
                             "bytes left, its header needs 48"),
            std::string::npos);
}

TEST(FatbinMalformed, SmOutOfRange) {
  EXPECT_NE(
      error_of(section_of({entry(2, 0, 0)})).find("(SASS) has SM 0, not a compute capability"),
      std::string::npos);
  EXPECT_NE(error_of(section_of({entry(1, 100000, 0)})).find("(PTX) has SM 100000"),
            std::string::npos);
}

TEST(FatbinMalformed, OtherKindsAreSkipped) {
  // 8: LTO IR (nvcc -dlto), which the driver cannot load; 0: no image at all.
  auto r = parse_fatbin_section(
      section_of({entry(8, 90, 0, 24), entry(2, 86, 0, 8), entry(0, 0, 0)}), "dump");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "sm_86");
}

TEST(FatbinMalformed, TooManyContainers) {
  std::string b;
  for (uint64_t i = 0; i <= kMaxFatbinContainers; ++i) b += container(0);
  auto r = parse_fatbin_section(b, "plugin library /x.so");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.status().message(), "plugin library /x.so: .nv_fatbin has more than 4096 containers");
  b.resize(kMaxFatbinContainers * 16);
  EXPECT_TRUE(parse_fatbin_section(b, "dump").ok());
}

TEST(FatbinMalformed, TooManyEntries) {
  std::vector<std::string> many(kMaxFatbinEntries + 1, entry(8, 90, 0));
  auto r = parse_fatbin_section(section_of(many), "plugin library /x.so");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.status().message(),
            "plugin library /x.so: .nv_fatbin: the container at byte 0 has more than 4096 "
            "entries");
  many.pop_back();
  EXPECT_TRUE(parse_fatbin_section(section_of(many), "dump").ok());
}

TEST(FatbinMalformed, EveryByteFlippedGivesAnAnswer) {
  // Not a fuzzer (tests/fuzz/fatbin_fuzz.cpp is), but every header byte of a real section
  // set to 0xFF must give images or an error, and never a crash.
  const std::string b = dump("two-units-compressed");
  for (size_t i = 0; i < b.size(); ++i) {
    std::string c = b;
    c[i] = static_cast<char>(0xFF);
    auto r = parse_fatbin_section(c, "dump");
    if (r.ok()) {
      EXPECT_LE(r->images.size(), 6u);
    }
  }
}

// ---- The image rules ----

TEST(CudaImage, Names) {
  EXPECT_EQ(sass(90).name(), "sm_90");
  EXPECT_EQ(sass(90, true).name(), "sm_90a");
  EXPECT_EQ(sass(100, false, true).name(), "sm_100f");
  EXPECT_EQ(ptx(90).name(), "compute_90");
  EXPECT_EQ(ptx(120, true).name(), "compute_120a");
  EXPECT_EQ(CudaImages{}.summary(), "no .nv_fatbin section");
}

TEST(CudaImage, RunsOn) {
  EXPECT_TRUE(sass(86).runs_on(89));
  EXPECT_TRUE(sass(86).runs_on(86));
  EXPECT_FALSE(sass(86).runs_on(80));
  EXPECT_FALSE(sass(86).runs_on(90));
  EXPECT_FALSE(sass(90).runs_on(100));
  EXPECT_TRUE(sass(100).runs_on(103));
  EXPECT_TRUE(sass(120).runs_on(121));
  EXPECT_FALSE(sass(90, true).runs_on(91));
  EXPECT_TRUE(sass(90, true).runs_on(90));
  EXPECT_TRUE(sass(100, false, true).runs_on(103));
  EXPECT_FALSE(sass(100, false, true).runs_on(110));
  EXPECT_TRUE(ptx(75).runs_on(121));
  EXPECT_FALSE(ptx(90).runs_on(89));
  EXPECT_TRUE(ptx(90, true).runs_on(90));
  EXPECT_FALSE(ptx(90, true).runs_on(100));
  EXPECT_TRUE(ptx(100, false, true).runs_on(103));
  EXPECT_FALSE(ptx(100, false, true).runs_on(120));
  EXPECT_FALSE(CudaImages{}.runs_on(90));
}

// ---- Coverage ----

TEST(ArchCoverage, HandClaimWithoutAnImageIsAnError) {
  KernelSpec s = cuda_spec({{kDLCUDA, 75, 121}}, false);
  Status st = check_arch_coverage(s, images({sass(80), sass(90), ptx(90)}), "libkreg_x.so");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "test.op (cuda) claims sm_75, but libkreg_x.so has no image that runs there (built "
            "sm_80, sm_90, compute_90)");
  EXPECT_EQ(windows(s), "cuda sm75-sm121");  // not rewritten
}

TEST(ArchCoverage, HandClaimNamesTheFirstUncoveredSm) {
  // sm_80 SASS and sm_100 SASS: sm_90 is the gap.
  KernelSpec s = cuda_spec({{kDLCUDA, 86, 89}, {kDLCUDA, 80, 103}}, false);
  Status st = check_arch_coverage(s, images({sass(80), sass(100)}), "lib.so");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("claims sm_90, but lib.so"), std::string::npos) << st.message();
}

TEST(ArchCoverage, HandClaimCoveredIsLeftAlone) {
  KernelSpec s = cuda_spec({{kDLCUDA, 80, 121}}, false);
  EXPECT_TRUE(check_arch_coverage(s, images({sass(80), sass(90), ptx(90)}), "lib.so").ok());
  EXPECT_EQ(windows(s), "cuda sm80-sm121");
  KernelSpec t = cuda_spec({{kDLCUDA, 75, 75}, {kDLCUDA, 90, 121}}, false);
  EXPECT_TRUE(check_arch_coverage(t, images({sass(75), ptx(90)}), "lib.so").ok());
}

TEST(ArchCoverage, FromBuildIsNarrowed) {
  KernelSpec s = cuda_spec({{kDLCUDA, 75, 121}}, true);
  ASSERT_TRUE(check_arch_coverage(s, images({sass(80), sass(90), ptx(90)}), "lib.so").ok());
  EXPECT_EQ(windows(s), "cuda sm80-sm121");
  // SASS only: each major's window, split where a real SM has no image.
  KernelSpec t = cuda_spec({{kDLCUDA, 75, 121}}, true);
  ASSERT_TRUE(check_arch_coverage(t, images({sass(75), sass(86), sass(90)}), "lib.so").ok());
  EXPECT_EQ(windows(t), "cuda sm75-sm75 cuda sm86-sm90");
  EXPECT_EQ(t.flags, KREG_KERNEL_CAPS_FROM_BUILD);
}

TEST(ArchCoverage, FromBuildWindowsMergeAcrossNonRealSms) {
  // Two claimed windows with no real SM between sm_89 and sm_90 become one.
  KernelSpec s = cuda_spec({{kDLCUDA, 80, 89}, {kDLCUDA, 90, 90}}, true);
  ASSERT_TRUE(check_arch_coverage(s, images({sass(80), sass(90)}), "lib.so").ok());
  EXPECT_EQ(windows(s), "cuda sm80-sm90");
  // A window never grows past what was claimed, even where an image runs.
  KernelSpec t = cuda_spec({{kDLCUDA, 86, 86}}, true);
  ASSERT_TRUE(check_arch_coverage(t, images({ptx(75)}), "lib.so").ok());
  EXPECT_EQ(windows(t), "cuda sm86-sm86");
}

TEST(ArchCoverage, ArchSpecific) {
  KernelSpec s = cuda_spec({{kDLCUDA, 75, 121}}, true);
  ASSERT_TRUE(check_arch_coverage(s, images({sass(90, true)}), "lib.so").ok());
  EXPECT_EQ(windows(s), "cuda sm90-sm90");
  KernelSpec hand = cuda_spec({{kDLCUDA, 90, 100}}, false);
  Status st = check_arch_coverage(hand, images({sass(90, true)}), "lib.so");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "test.op (cuda) claims sm_100, but lib.so has no image that runs there (built "
            "sm_90a)");
  KernelSpec exact = cuda_spec({{kDLCUDA, 90, 90}}, false);
  EXPECT_TRUE(check_arch_coverage(exact, images({sass(90, true)}), "lib.so").ok());
}

TEST(ArchCoverage, FromBuildWithNothingLeftIsAnError) {
  KernelSpec s = cuda_spec({{kDLCUDA, 75, 121}}, true);
  Status st = check_arch_coverage(s, images({sass(52)}), "lib.so");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "test.op (cuda) is built for cuda sm75-sm121, but lib.so has no image that runs on "
            "any of its SMs (built sm_52)");
}

TEST(ArchCoverage, NoFatbinIsAnError) {
  for (bool from_build : {false, true}) {
    KernelSpec s = cuda_spec({{kDLCUDA, 80, 90}}, from_build);
    Status st = check_arch_coverage(s, CudaImages{}, "libkreg_x.so");
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message(),
              "test.op (cuda) claims sm_80, but libkreg_x.so has no CUDA images (no .nv_fatbin "
              "section)");
  }
}

TEST(ArchCoverage, NonCudaSpecsAreUntouched) {
  KernelSpec s;
  s.op = "test.op";
  s.backend = "cpu";
  s.capabilities = {{kDLCPU, 0, 0}};
  s.flags = KREG_KERNEL_CAPS_FROM_BUILD;
  EXPECT_TRUE(check_arch_coverage(s, CudaImages{}, "lib.so").ok());
  EXPECT_EQ(windows(s), "cpu");
}

TEST(ArchCoverage, NoImageReason) {
  EXPECT_EQ(no_image_reason(75, images({sass(80), sass(90), ptx(90)}), "libkreg_layernorm.so"),
            "no image for sm_75 in libkreg_layernorm.so: built sm_80, sm_90, compute_90");
  EXPECT_EQ(no_image_reason(75, CudaImages{}, "libkreg_x.so"),
            "no image for sm_75 in libkreg_x.so: it has no .nv_fatbin section");
}

// ---- Through the ELF reader ----

TEST(ReadCudaImages, CpuOnlyLibraryHasNoFatbin) {
  const fs::path lib = test_plugin("testgrp");
  auto elf = ElfFile::open(lib, "plugin library", 1 << 30);
  ASSERT_TRUE(elf.ok()) << elf.status().message();
  auto r = read_cuda_images(*elf);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->has_fatbin);
  EXPECT_TRUE(r->images.empty());
  EXPECT_EQ(r->summary(), "no .nv_fatbin section");
}

#ifdef KREG_FATBIN_OBJCOPY_LIB
// libkreg_testgrp.so with the sm_80-sm_90-compute_90 dump added as .nv_fatbin.
TEST(ReadCudaImages, SectionAddedToARealLibrary) {
  auto elf = ElfFile::open(KREG_FATBIN_OBJCOPY_LIB, "plugin library", 1 << 30);
  ASSERT_TRUE(elf.ok()) << elf.status().message();
  auto r = read_cuda_images(*elf);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->summary(), "sm_80, sm_90, compute_90");
}

TEST(ReadCudaImages, ACorruptSectionNamesTheLibrary) {
  std::string bytes = read_file(KREG_FATBIN_OBJCOPY_LIB);
  auto elf = ElfFile::from_memory(bytes, "plugin library /patched.so");
  ASSERT_TRUE(elf.ok()) << elf.status().message();
  auto s = elf->find_section(".nv_fatbin");
  ASSERT_TRUE(s.ok());
  bytes[s->offset + 3] = 0;  // the magic's top byte
  auto patched = ElfFile::from_memory(bytes, "plugin library /patched.so");
  ASSERT_TRUE(patched.ok());
  auto r = read_cuda_images(*patched);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "plugin library /patched.so: .nv_fatbin: the container at byte 0 has magic "
            "0x0055ED50, not 0xBA55ED50 (not a fatbinary)");
}
#endif

#ifdef KREG_FATBIN_FIXTURES
// The fixture libraries of tests/unit/CMakeLists.txt, built by CMake with explicit
// CUDA_ARCHITECTURES.
CudaImages fixture(const std::string& name) {
  const fs::path lib = fs::path(KREG_FATBIN_FIXTURES) / ("libkreg_fatbin_" + name + ".so");
  auto elf = ElfFile::open(lib, "plugin library", 1 << 30);
  EXPECT_TRUE(elf.ok()) << elf.status().message();
  if (!elf.ok()) return {};
  auto r = read_cuda_images(*elf);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : CudaImages{};
}

// The windows plugin.hpp derives at compile time from the same architecture list pass the
// hand check against the images CMake really built, and narrowing changes nothing.
void expect_claims_match(const CudaImages& imgs, const char* archs) {
  const detail::CapList caps = detail::caps_from_archs(archs);
  ASSERT_TRUE(caps.parsed) << archs;
  std::vector<Capability> claim;
  for (uint32_t i = 0; i < caps.size; ++i) {
    claim.push_back({caps.items[i].device_type, caps.items[i].sm_min, caps.items[i].sm_max});
  }
  KernelSpec hand = cuda_spec(claim, false);
  Status st = check_arch_coverage(hand, imgs, "fixture");
  EXPECT_TRUE(st.ok()) << archs << ": " << st.message();
  KernelSpec build = cuda_spec(claim, true);
  ASSERT_TRUE(check_arch_coverage(build, imgs, "fixture").ok());
  EXPECT_EQ(windows(build), windows(hand)) << archs;
}

TEST(FatbinFixtures, SassAndPtx) {
  CudaImages r = fixture("default");
  EXPECT_EQ(r.summary(), "sm_80, sm_90, compute_90");
  expect_claims_match(r, "80-real,90");
}

TEST(FatbinFixtures, ArchSpecific) {
  CudaImages r = fixture("sm90a");
  EXPECT_EQ(r.summary(), "sm_90a");
  expect_claims_match(r, "90a-real");
}

TEST(FatbinFixtures, PtxOnly) {
  CudaImages r = fixture("ptx");
  EXPECT_EQ(r.summary(), "compute_75");
  expect_claims_match(r, "75-virtual");
}

TEST(FatbinFixtures, TwoUnitsWithDifferentSets) {
  CudaImages r = fixture("two");
  EXPECT_EQ(r.summary(), "sm_80, sm_90a, sm_120, compute_120");
  for (int32_t sm : {80, 86, 89, 90, 120, 121}) EXPECT_TRUE(r.runs_on(sm)) << sm;
  // sm_90a runs on sm_90 only, compute_120 from 12.0 on.
  for (int32_t sm : {75, 100, 103, 110}) EXPECT_FALSE(r.runs_on(sm)) << sm;
}
#endif

}  // namespace
}  // namespace kreg
