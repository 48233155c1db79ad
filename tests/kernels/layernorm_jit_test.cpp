// The JIT RMSNorms (plugins/layernorm/rmsnorm_jit.cpp, jit/rmsnorm.cu.jit), without a
// GPU: the launch shapes rms_config gives (every body vector a slot, whole warps, the
// launch bounds that let a full SM of blocks be resident), and that NVRTC compiles every
// form for sm_90 into a kernel that keeps its rows in registers: the plain forms in 32
// registers with no local memory at the odd widths (8 blocks of 256 threads an SM at
// H = 4097 bf16; 41 registers, 4 blocks, held them at 58% of copy bandwidth). The GPU
// test of their results is JitNormsMatchTheCpuReference (layernorm_activation_test.cpp).
//
// Every process compiles into a fresh KREG_JIT_CACHE (a temporary folder, removed at
// exit), so the specializations are really built by NVRTC here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../../plugins/layernorm/jit/rmsnorm_config.h"
#include "kernel_test.hpp"
#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

namespace fs = std::filesystem;
using kreg_jit::rms_config;
using kreg_jit::RmsConfig;
using namespace test;  // kernel_test.hpp

// A private JIT cache folder for this process (kernel_test.hpp).
[[maybe_unused]] ::testing::Environment* const kJitCacheDir =
    ::testing::AddGlobalTestEnvironment(new JitCacheDir("kreg-norm-jit"));

// ---- The launch shapes (CPU) ----

TEST(RmsJitConfig, PlainOddWidthsFillAnSm) {
  // H = 4097 bf16: 512 body vectors at most (a row on a boundary: 512 and a tail of 1),
  // two a thread over 256 threads, 8 blocks an SM (32 registers).
  RmsConfig c = rms_config(4097, 2, false);
  EXPECT_EQ(c.vec, 8);
  EXPECT_EQ(c.items, 2);
  EXPECT_EQ(c.threads, 256);
  EXPECT_EQ(c.rows, 1);
  EXPECT_EQ(c.max_threads, 256);
  EXPECT_EQ(c.min_blocks, 8);
  c = rms_config(5121, 2, false);  // 640 vectors: 320 threads, 6 blocks (60 warps)
  EXPECT_EQ(c.items, 2);
  EXPECT_EQ(c.threads, 320);
  EXPECT_EQ(c.min_blocks, 6);
  c = rms_config(4095, 2, false);  // 511 vectors: one a thread
  EXPECT_EQ(c.items, 1);
  EXPECT_EQ(c.threads, 512);
  EXPECT_EQ(c.min_blocks, 4);
  c = rms_config(4097, 4, false);  // f32: 1024 vectors of 4, one a thread
  EXPECT_EQ(c.vec, 4);
  EXPECT_EQ(c.items, 1);
  EXPECT_EQ(c.threads, 1024);
  EXPECT_EQ(c.min_blocks, 2);
  c = rms_config(33, 2, false);  // short rows: 8 rows of one warp a block
  EXPECT_EQ(c.threads, 32);
  EXPECT_EQ(c.rows, 8);
  EXPECT_EQ(c.min_blocks, 8);
  c = rms_config(16399, 2, false);  // past two vectors a thread: the compiler's registers
  EXPECT_EQ(c.items, 3);
  EXPECT_EQ(c.min_blocks, 1);
}

TEST(RmsJitConfig, FusedKeepsItsMeasuredShape) {
  // One thread per started vector (H200, H = 4097 bf16: 88.7% of copy), bounded as
  // before: 1024 threads, and 2 blocks of them (32 registers) for one vector a thread.
  RmsConfig c = rms_config(4097, 2, true);
  EXPECT_EQ(c.items, 1);
  EXPECT_EQ(c.threads, 544);
  EXPECT_EQ(c.rows, 1);
  EXPECT_EQ(c.max_threads, 1024);
  EXPECT_EQ(c.min_blocks, 2);
  c = rms_config(16399, 2, true);
  EXPECT_EQ(c.items, 3);
  EXPECT_EQ(c.min_blocks, 1);
}

TEST(RmsJitConfig, EveryBodyVectorHasASlotAndNoWarpIsIdle) {
  for (int elem : {2, 4}) {
    for (bool fused : {false, true}) {
      for (int h = 1; h <= 20000; ++h) {
        const RmsConfig c = rms_config(h, elem, fused);
        if (c.items > 8) continue;  // the kernel refuses these (static_assert)
        SCOPED_TRACE("H = " + std::to_string(h) + ", " + std::to_string(elem) + "-byte, " +
                     (fused ? "fused" : "plain"));
        ASSERT_EQ(c.vec, 16 / elem);
        ASSERT_GE(c.items, 1);
        // The longest body: h / vec vectors (a row starting on a boundary).
        ASSERT_GE(c.threads * c.items, h / c.vec);
        ASSERT_EQ(c.threads % 32, 0);
        ASSERT_GE(c.threads, 32);
        // Head and tail (under a vector each) on distinct lanes.
        ASSERT_GE(c.threads, 2 * (c.vec - 1));
        // No warp without a body vector, beyond the first.
        const int needed = fused ? (h + c.vec - 1) / c.vec : h / c.vec;
        ASSERT_LT((c.threads - 32) * c.items, needed > 0 ? needed : 1);
        ASSERT_GE(c.rows, 1);
        ASSERT_LE(c.threads * c.rows, 1024);
        // The launch bounds admit the block, and ask for no more than an SM holds.
        ASSERT_GE(c.max_threads, c.threads * c.rows);
        ASSERT_LE(c.max_threads, 1024);
        ASSERT_GE(c.min_blocks, 1);
        ASSERT_LE(c.min_blocks * c.max_threads, 2048);
        // Plain rows of up to two vectors a thread: as many blocks as an SM has threads.
        if (!fused && c.items <= 2) {
          ASSERT_EQ(c.max_threads, c.threads * c.rows);
          ASSERT_EQ(c.min_blocks, 2048 / c.max_threads);
        }
      }
    }
  }
}

// ---- The source compiles through NVRTC, in registers (CPU: NVRTC needs no GPU) ----

struct Resources {
  int regs = -1;   // EIATTR_REGCOUNT
  int frame = -1;  // EIATTR_FRAME_SIZE: bytes of local memory (spills) a thread
};

template <typename U>
bool read_at(const std::string& img, uint64_t off, U* v) {
  if (off > img.size() || img.size() - off < sizeof(U)) return false;
  std::memcpy(v, img.data() + off, sizeof(U));
  return true;
}

// The register count and frame size of `symbol` in a cubin (ELF64, little-endian): its
// index in .symtab, then the EIATTR_REGCOUNT (0x2f) and EIATTR_FRAME_SIZE (0x11)
// attributes of the image's .nv.info, each "format 4, attribute, size, {symbol, value}".
Result<Resources> kernel_resources(const std::string& img, const std::string& symbol) {
  auto bad = [](const std::string& what) {
    return Status(KREG_INTERNAL, "cubin: " + what + " (not an ELF64 image read here)");
  };
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (img.compare(0, 4,
                  "\x7f"
                  "ELF") != 0 ||
      !read_at(img, 0x28, &shoff) || !read_at(img, 0x3a, &shentsize) ||
      !read_at(img, 0x3c, &shnum) || !read_at(img, 0x3e, &shstrndx) || shentsize < 64 ||
      shstrndx >= shnum) {
    return bad("no section table");
  }
  struct Section {
    uint32_t name = 0, type = 0, link = 0;
    uint64_t offset = 0, size = 0, entsize = 0;
  };
  std::vector<Section> secs(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint64_t at = shoff + uint64_t{i} * shentsize;
    Section& s = secs[i];
    if (!read_at(img, at, &s.name) || !read_at(img, at + 4, &s.type) ||
        !read_at(img, at + 24, &s.offset) || !read_at(img, at + 32, &s.size) ||
        !read_at(img, at + 40, &s.link) || !read_at(img, at + 56, &s.entsize) ||
        s.offset > img.size() || img.size() - s.offset < s.size) {
      return bad("section " + std::to_string(i) + " out of the image");
    }
  }
  auto str = [&](const Section& tab, uint32_t off) -> std::string {
    if (off >= tab.size) return "";
    const char* p = img.data() + tab.offset + off;
    return std::string(p, strnlen(p, tab.size - off));
  };
  int64_t sym = -1;
  const Section* info = nullptr;
  for (const Section& s : secs) {
    const std::string name = str(secs[shstrndx], s.name);
    if (name == ".nv.info") info = &s;
    if (s.type != 2 /* SHT_SYMTAB */ || s.entsize < 24 || s.link >= shnum) continue;
    for (uint64_t k = 0; k < s.size / s.entsize; ++k) {
      uint32_t n = 0;
      if (read_at(img, s.offset + k * s.entsize, &n) && str(secs[s.link], n) == symbol) {
        sym = static_cast<int64_t>(k);
      }
    }
  }
  if (sym < 0) return bad("no symbol " + symbol);
  if (info == nullptr) return bad("no .nv.info");
  Resources r;
  for (uint64_t off = info->offset; off + 4 <= info->offset + info->size;) {
    const auto format = static_cast<uint8_t>(img[off]);
    const auto attr = static_cast<uint8_t>(img[off + 1]);
    uint16_t size = 0;
    read_at(img, off + 2, &size);
    if (format != 4) {  // a value in the 2 bytes, no payload
      off += 4;
      continue;
    }
    uint32_t who = 0, value = 0;
    if (size == 8 && read_at(img, off + 4, &who) && read_at(img, off + 8, &value) && who == sym) {
      if (attr == 0x2f) r.regs = static_cast<int>(value);
      if (attr == 0x11) r.frame = static_cast<int>(value);
    }
    off += 4 + size;
  }
  if (r.regs < 0 || r.frame < 0) return bad("no register count or frame size for " + symbol);
  return r;
}

const KernelSpec* jit_spec(const char* op) {
  for (const KernelSpec* s : registry().implementations(op)) {
    if (s->backend == "jit") return s;
  }
  return nullptr;
}

TEST(RmsJitSource, CompilesThroughNvrtcIntoRegisters) {
  const char* const ops[] = {"layernorm.rmsnorm", "layernorm.gemma_rmsnorm",
                             "layernorm.fused_add_rmsnorm", "layernorm.gemma_fused_add_rmsnorm"};
  if (jit_spec(ops[0]) == nullptr) {
    GTEST_SKIP() << "layernorm has no jit implementation in this build (built without CUDA)";
  }
  if (auto v = jit::nvrtc_version(); !v) GTEST_SKIP() << "no NVRTC here: " << v.status().message();
  std::string pattern = (fs::temp_directory_path() / "kreg-norm-nvrtc-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const fs::path dir = pattern;
  {
    jit::Cache cache(dir / "cache");
    struct Build {
      int64_t H;
      DType dtype;
      const char* arch;
    };
    // The odd widths the launcher takes (bf16 at H = 4097 the target, 4099, 5121, 8191,
    // short rows of several a block, a row under one vector), f16 and f32, the window
    // of three vectors a thread, and sm_90 next to sm_90a.
    const Build builds[] = {
        {4097, DType::kBF16, "sm_90a"}, {4099, DType::kBF16, "sm_90a"},
        {5121, DType::kBF16, "sm_90a"}, {8191, DType::kBF16, "sm_90a"},
        {4095, DType::kBF16, "sm_90a"}, {33, DType::kBF16, "sm_90a"},
        {7, DType::kBF16, "sm_90a"},    {4097, DType::kF16, "sm_90a"},
        {4097, DType::kF32, "sm_90a"},  {16399, DType::kBF16, "sm_90a"},
        {4097, DType::kBF16, "sm_90"},
    };
    int compiled = 0;
    for (const char* op : ops) {
      const KernelSpec* spec = jit_spec(op);
      ASSERT_NE(spec, nullptr) << op;
      ASSERT_TRUE(spec->jit) << "the loaded library carries the jit source";
      EXPECT_EQ(spec->jit->source_name, "rmsnorm.cu.jit");
      EXPECT_EQ(spec->jit->params, (std::vector<std::string>{"H", "dtype"}));
      const bool fused = std::string(op).find("fused") != std::string::npos;
      for (const Build& b : builds) {
        SCOPED_TRACE(std::string(op) + " H=" + std::to_string(b.H) + " " +
                     std::string(dtype_name(b.dtype)) + " " + b.arch);
        auto s = jit::specialize(*spec, {{"T", 4}, {"H", b.H}}, b.dtype);
        ASSERT_TRUE(s.ok()) << s.status().message();
        auto built = jit::build(*spec, *spec->jit, *s, b.arch, cache);
        ASSERT_TRUE(built.ok()) << built.status().message();
        EXPECT_TRUE(built->compiled) << "a fresh cache: NVRTC ran";
        ++compiled;
        auto res = kernel_resources(built->cubin, built->lowered);
        ASSERT_TRUE(res.ok()) << res.status().message();
        const RmsConfig c =
            rms_config(static_cast<int>(b.H), static_cast<int>(dtype_size(b.dtype)), fused);
        // No spills anywhere; and where the bounds ask for blocks filling an SM, the
        // registers that allow it (65536 a SM).
        EXPECT_EQ(res->frame, 0) << res->regs << " registers";
        EXPECT_LE(res->regs * c.max_threads * c.min_blocks, 65536);
        if (!fused && c.items <= 2) {
          EXPECT_LE(res->regs, 32) << "plain rows of up to two vectors a thread";
        }
      }
    }
    EXPECT_EQ(compiled, 4 * static_cast<int>(std::size(builds)));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace kreg
