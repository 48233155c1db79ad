// What every kernel test shares: the registry of the shipped manifest (registry.yaml at
// the source root) with this build's plugin libraries, opened once per test binary, and
// the small helpers the group tests all need (devices, buffers with exact contents, a
// buffer's values, attributes, handles, the fixture that skips the GPU tests).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "kreg/registry.hpp"

namespace kreg::test {

inline Registry& registry() {
  static std::unique_ptr<Registry> reg = [] {
    auto m = load_manifest(std::filesystem::path(KREG_SOURCE_DIR) / "registry.yaml",
                           ManifestOptions{std::filesystem::path(KREG_PLUGIN_DIR), true});
    EXPECT_TRUE(m.ok()) << m.status().message();
    auto r = Registry::open(*m);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }();
  return *reg;
}

inline constexpr DLDevice kCpu{kDLCPU, 0};
inline constexpr DLDevice kGpu{kDLCUDA, 0};

// A size_t index from an int64_t one (the tests' sizes are never negative).
inline size_t at(int64_t i) { return static_cast<size_t>(i); }

// A buffer's elements as doubles (copied back from the device when needed); empty, with
// a failure recorded, when they cannot be read.
inline std::vector<double> values(const harness::Buffer& b) {
  auto v = b.to_doubles();
  EXPECT_TRUE(v.ok()) << v.status().message();
  return v.ok() ? *v : std::vector<double>{};
}

// A buffer of `dtype` on `device` holding exactly the bytes of `src` (numel(shape)
// elements of dtype's size): 64-bit integers and raw bytes do not go through doubles.
inline harness::Buffer exact_buffer(DLDevice device, DType dtype, std::vector<int64_t> shape,
                                    const void* src) {
  auto host = harness::Buffer::make(kCpu, dtype, shape);
  EXPECT_TRUE(host.ok()) << host.status().message();
  if (!host.ok()) return harness::Buffer{};
  if (host->bytes() > 0) std::memcpy(host->tensor()->data, src, host->bytes());
  if (device.device_type == kDLCPU) return std::move(host).value();
  auto b = harness::Buffer::make(device, dtype, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return harness::Buffer{};
  EXPECT_TRUE(b->copy_from(*host).ok());
  return std::move(b).value();
}

// The bytes of any buffer (copied back from the device when needed).
inline std::vector<uint8_t> bytes_of(const harness::Buffer& b) {
  auto host = harness::Buffer::make(kCpu, b.dtype(), b.shape());
  EXPECT_TRUE(host.ok()) << host.status().message();
  if (!host.ok()) return {};
  EXPECT_TRUE(host->copy_from(b).ok());
  const auto* p = static_cast<const uint8_t*>(host->tensor()->data);
  return std::vector<uint8_t>(p, p + host->bytes());
}

inline kreg_attr int_attr(int64_t v) {
  kreg_attr a{};
  a.type = KREG_ATTR_INT;
  a.value.i = v;
  return a;
}

inline kreg_attr float_attr(double v) {
  kreg_attr a{};
  a.type = KREG_ATTR_FLOAT;
  a.value.f = v;
  return a;
}

// `op`'s implementation for `backend` ("cpu" or "cuda"), any dtype; an empty handle, with
// a failure recorded, when there is none.
inline KernelHandle handle(const char* op, const std::string& backend) {
  auto h = registry().resolve(op, Target{backend == "cpu" ? kCpu : kGpu, std::nullopt}, {backend});
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : KernelHandle{};
}

// The fixture of every GPU test: skipped, saying why, on a machine without a CUDA device.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!harness::gpu_available()) {
      GTEST_SKIP() << "no CUDA device on this machine: GPU kernel tests skipped "
                      "(run ctest on a GPU machine to exercise them)";
    }
  }
};

// A chain of launches run once plainly, then `reps` times with programmatic dependent
// launch (run_chain(flags) returns the bytes of every result): each PDL run must give
// the plain run's bytes, result for result.
// `flags`: the launch flags of the PDL runs (KREG_LAUNCH_STABLE_INPUTS may join).
template <typename Chain>
void expect_pdl_chain_matches_plain(Chain&& run_chain, int reps,
                                    uint64_t flags = uint64_t{KREG_LAUNCH_PDL}) {
  const std::vector<std::vector<uint8_t>> want = run_chain(uint64_t{0});
  for (int rep = 0; rep < reps; ++rep) {
    const std::vector<std::vector<uint8_t>> got = run_chain(flags);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i] == want[i])
          << "result " << i << " differs with PDL (repetition " << rep << ")";
    }
  }
}

// KREG_JIT_CACHE -> a private temporary folder for this process, set before any test
// resolves (the process's cache is opened on first use). Register it once per test binary:
//   ::testing::AddGlobalTestEnvironment(new JitCacheDir("kreg-norm-jit"));
class JitCacheDir : public ::testing::Environment {
 public:
  explicit JitCacheDir(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix_ + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << " failed: the JIT cache folder";
      return;
    }
    dir_ = pattern;
    ::setenv("KREG_JIT_CACHE", (dir_ / "cache").c_str(), 1);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string prefix_;
  std::filesystem::path dir_;
};

}  // namespace kreg::test
