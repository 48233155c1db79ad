// The JIT backend without a GPU (kreg/jit.hpp, docs/jit.md): a plugin's kreg_jit_desc read
// and checked against its signature, specializations and kernel expressions, the cache key
// (what changes it and what does not), and real NVRTC compiles into a cache: hits, a
// moved cache, an edited header, compile errors, and eight processes on one empty cache;
// validate's jit-sources rule, whose compiles run in kreg-probe (with real NVRTC, and with a
// stand-in that fails, crashes or hangs: tests/fixtures/plugins/fake_nvrtc.cpp).
// Tests that need NVRTC skip with the reason where it cannot be loaded.
#include "kreg/jit.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <array>
#include <fstream>

#include "kreg/abi.h"
#include "kreg/jit_cache.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/manifest.hpp"
#include "kreg/plugin_library.hpp"
#include "kreg/plugin_probe.hpp"
#include "kreg/registry.hpp"
#include "kreg/schema.hpp"
#include "kreg/validation.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
using kreg::JitSource;
using kreg::KernelSpec;
using kreg::jit::Cache;
using kreg::jit::Specialization;

constexpr const char* kSig = "scale(Tensor[T,H] x, Tensor(a!)[T,H] out, float alpha=1.0) -> ()";

// A small kernel with one header, specialized on H and the dtype.
constexpr const char* kHeader = "#pragma once\nnamespace t { constexpr int kTwo = 2; }\n";
constexpr const char* kSource =
    "#include \"kreg_jit/prelude.cuh\"\n#include \"two.h\"\n"
    "namespace t {\n"
    "template <int H, typename T>\n"
    "__global__ void scale(const T* x, T* out, long long rows, float alpha) {\n"
    "  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
    "  if (i < rows * H) out[i] = kreg_jit::from_float<T>(kTwo * alpha * "
    "kreg_jit::to_float(x[i]));\n"
    "}\n"
    "}\n";

std::string prelude() {
  // The real prelude, as plugins embed it.
  const fs::path p = fs::path(KREG_SOURCE_DIR) / "core/include/kreg/jit/prelude.cuh";
  FILE* f = std::fopen(p.c_str(), "rb");
  std::string s;
  if (f == nullptr) return s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

struct Desc {
  std::string prelude_text = prelude();
  std::string header = kHeader;
  std::string source = kSource;
  std::string kernel = "t::scale<{H}, kreg_jit::{dtype}>";
  std::string params = "H,dtype";
  std::string options;
  kreg_jit_file files[2] = {};
  kreg_jit_desc d{};
  const kreg_jit_desc* get() {
    files[0] = {"kreg_jit/prelude.cuh", prelude_text.c_str()};
    files[1] = {"two.h", header.c_str()};
    d = {sizeof(kreg_jit_desc), "scale.cu.jit", source.c_str(), files, 2, 0,
         kernel.c_str(),        params.c_str(), options.c_str()};
    return &d;
  }
};

kreg::Signature signature() { return kreg::parse_signature(kSig).value(); }

KernelSpec spec_of(Desc& desc) {
  KernelSpec s;
  s.op = "test.scale";
  s.backend = "jit";
  s.signature = signature();
  s.dtypes = kreg::mask_of(kreg::DType::kBF16) | kreg::mask_of(kreg::DType::kF32);
  auto src = kreg::read_jit_source(desc.get(), s.signature);
  EXPECT_TRUE(src) << src.status().message();
  if (src) s.jit = *src;
  return s;
}

bool have_nvrtc(std::string* why) {
  auto v = kreg::jit::nvrtc_version();
  if (!v) *why = v.status().message();
  return v.ok();
}

#define SKIP_WITHOUT_NVRTC()                                         \
  do {                                                               \
    std::string why;                                                 \
    if (!have_nvrtc(&why)) GTEST_SKIP() << "no NVRTC here: " << why; \
  } while (0)

TEST(JitSource, ReadsTheDescriptor) {
  Desc desc;
  auto src = kreg::read_jit_source(desc.get(), signature());
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_EQ((*src)->source_name, "scale.cu.jit");
  EXPECT_EQ((*src)->params, (std::vector<std::string>{"H", "dtype"}));
  ASSERT_EQ((*src)->headers.size(), 2u);
  EXPECT_EQ((*src)->headers[1].first, "two.h");
  EXPECT_EQ((*src)->headers[1].second, kHeader);
}

TEST(JitSource, RefusesWhatCannotBeSpecialized) {
  struct Case {
    const char* what;
    void (*edit)(Desc&);
    const char* expect;
  };
  const Case cases[] = {
      {"unknown param", [](Desc& d) { d.params = "H,D"; },
       "'D' is neither 'dtype' nor a dimension"},
      {"missing placeholder", [](Desc& d) { d.kernel = "t::scale<{H}, float>"; },
       "no placeholder {dtype}"},
      {"bad option", [](Desc& d) { d.options = "-O3 rm"; }, "\"rm\" is not an option"},
      {"control byte", [](Desc& d) { d.kernel = "t::scale<{H},\x1b[31m{dtype}>"; },
       "control character"},
      {"empty kernel",
       [](Desc& d) {
         d.kernel = "";
         d.params = "";
       },
       "must not be empty"},
  };
  for (const Case& c : cases) {
    Desc desc;
    c.edit(desc);
    auto src = kreg::read_jit_source(desc.get(), signature());
    ASSERT_FALSE(src) << c.what;
    EXPECT_NE(src.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << src.status().message();
  }
  Desc nulls;
  nulls.get();
  nulls.d.source = nullptr;
  auto src = kreg::read_jit_source(&nulls.d, signature());
  ASSERT_FALSE(src);
  EXPECT_NE(src.status().message().find("source is NULL"), std::string::npos);
  Desc many;
  many.get();
  many.d.num_headers = kreg::kMaxJitHeaders + 1;
  EXPECT_FALSE(kreg::read_jit_source(&many.d, signature()));
}

TEST(JitSpecialization, FromDimensionsAndDtype) {
  Desc desc;
  const KernelSpec spec = spec_of(desc);
  auto s = kreg::jit::specialize(spec, {{"H", 4097}, {"T", 3}}, kreg::DType::kBF16);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->text(), "H=4097,dtype=bf16");
  EXPECT_EQ(kreg::jit::kernel_expression(*spec.jit, *s), "t::scale<4097, kreg_jit::bf16>");
  auto no_h = kreg::jit::specialize(spec, {{"T", 3}}, kreg::DType::kBF16);
  ASSERT_FALSE(no_h);
  EXPECT_NE(no_h.status().message().find("--shape H=N"), std::string::npos);
  auto f16 = kreg::jit::specialize(spec, {{"H", 8}}, kreg::DType::kF16);
  ASSERT_FALSE(f16) << "f16 is not in the implementation's dtypes";
  EXPECT_NE(f16.status().message().find("does not take dtype f16"), std::string::npos);
}

TEST(JitSpecialization, FromTensors) {
  Desc desc;
  const KernelSpec spec = spec_of(desc);
  int64_t shape[2] = {5, 4099};
  DLTensor x{};
  x.ndim = 2;
  x.shape = shape;
  x.dtype = kreg::to_dl(kreg::DType::kF32);
  x.device = {kDLCUDA, 0};
  DLTensor* args[2] = {&x, &x};
  auto s = kreg::jit::specialize(spec, args);
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->text(), "H=4099,dtype=f32");
}

TEST(JitSpecialization, ArchitectureNames) {
  EXPECT_EQ(kreg::jit::arch_name(90), "sm_90a");
  EXPECT_EQ(kreg::jit::arch_name(100), "sm_100a");
  EXPECT_EQ(kreg::jit::arch_name(89), "sm_89");
  EXPECT_EQ(kreg::jit::arch_name(80), "sm_80");
}

TEST(JitKey, ChangesWithEveryInputAndNothingElse) {
  SKIP_WITHOUT_NVRTC();
  Desc desc;
  const KernelSpec spec = spec_of(desc);
  const Specialization s{{{"H", "4096"}, {"dtype", "bf16"}}};
  const std::string base = kreg::jit::cache_key(*spec.jit, s, "sm_90a").value();
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(kreg::jit::cache_key(*spec.jit, s, "sm_90a").value(), base) << "stable";
  EXPECT_NE(kreg::jit::cache_key(*spec.jit, s, "sm_100a").value(), base) << "arch";
  const Specialization other{{{"H", "4097"}, {"dtype", "bf16"}}};
  EXPECT_NE(kreg::jit::cache_key(*spec.jit, other, "sm_90a").value(), base) << "values";
  // An edit of an included header, of the source and of the options each change it.
  Desc header_edit;
  header_edit.header += "// edited\n";
  EXPECT_NE(kreg::jit::cache_key(*spec_of(header_edit).jit, s, "sm_90a").value(), base);
  Desc source_edit;
  source_edit.source += "\n";
  EXPECT_NE(kreg::jit::cache_key(*spec_of(source_edit).jit, s, "sm_90a").value(), base);
  Desc option_edit;
  option_edit.options = "-DEXTRA=1";
  EXPECT_NE(kreg::jit::cache_key(*spec_of(option_edit).jit, s, "sm_90a").value(), base);
}

TEST(JitBuild, CompilesOnceThenHitsAndSurvivesAMove) {
  SKIP_WITHOUT_NVRTC();
  kreg::test::Scratch tmp;
  Desc desc;
  const KernelSpec spec = spec_of(desc);
  const Specialization s{{{"H", "4097"}, {"dtype", "bf16"}}};
  std::string key, cubin;
  {
    Cache cache(tmp.root() / "a");
    auto first = kreg::jit::build(spec, *spec.jit, s, "sm_90a", cache);
    ASSERT_TRUE(first) << first.status().message();
    EXPECT_TRUE(first->compiled);
    ASSERT_GT(first->cubin.size(), 4u);
    EXPECT_EQ(first->cubin.substr(0, 4),
              "\x7f"
              "ELF")
        << "a cubin is an ELF image";
    EXPECT_NE(first->lowered.find("scale"), std::string::npos) << first->lowered;
    auto again = kreg::jit::build(spec, *spec.jit, s, "sm_90a", cache);
    ASSERT_TRUE(again) << again.status().message();
    EXPECT_FALSE(again->compiled) << "the second build is a hit";
    EXPECT_EQ(again->cubin, first->cubin);
    EXPECT_EQ(again->lowered, first->lowered);
    key = first->key;
    cubin = first->cubin;
  }
  // The whole cache moved elsewhere: every entry still hits (no path in any key).
  fs::rename(tmp.root() / "a", tmp.root() / "moved");
  Cache moved(tmp.root() / "moved");
  auto hit = kreg::jit::build(spec, *spec.jit, s, "sm_90a", moved);
  ASSERT_TRUE(hit) << hit.status().message();
  EXPECT_FALSE(hit->compiled);
  EXPECT_EQ(hit->key, key);
  EXPECT_EQ(hit->cubin, cubin);
  // An edited header is another key: compiled again.
  Desc edited;
  edited.header = "#pragma once\nnamespace t { constexpr int kTwo = 3; }\n";
  const KernelSpec spec2 = spec_of(edited);
  auto rebuilt = kreg::jit::build(spec2, *spec2.jit, s, "sm_90a", moved);
  ASSERT_TRUE(rebuilt) << rebuilt.status().message();
  EXPECT_TRUE(rebuilt->compiled);
  EXPECT_NE(rebuilt->key, key);
}

TEST(JitBuild, ErrorsNameTheSourceAndShowTheLog) {
  SKIP_WITHOUT_NVRTC();
  kreg::test::Scratch tmp;
  Cache cache(tmp.root());
  Desc broken;
  broken.source += "this is not C++;\n";
  const KernelSpec spec = spec_of(broken);
  const Specialization s{{{"H", "8"}, {"dtype", "f32"}}};
  auto r = kreg::jit::build(spec, *spec.jit, s, "sm_90a", cache);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("NVRTC failed to compile scale.cu.jit"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("this"), std::string::npos) << "the log is in the message";
  // A failed compile leaves nothing in the cache.
  EXPECT_TRUE(cache.list().value().empty());
  // A header outside the in-memory set cannot be opened (no include path).
  Desc outside;
  outside.source = "#include <cuda_bf16.h>\n" + outside.source;
  const KernelSpec spec2 = spec_of(outside);
  auto r2 = kreg::jit::build(spec2, *spec2.jit, s, "sm_90a", cache);
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.status().message().find("cuda_bf16.h"), std::string::npos) << r2.status().message();
  EXPECT_FALSE(kreg::jit::build(spec, *spec.jit, s, "sm90", cache)) << "a malformed arch";
}

TEST(JitBuild, EightProcessesOnAnEmptyCacheCompileOnce) {
  SKIP_WITHOUT_NVRTC();
  kreg::test::Scratch tmp;
  Desc desc;
  const KernelSpec spec = spec_of(desc);
  const Specialization s{{{"H", "1000"}, {"dtype", "f32"}}};
  int start[2], report[2];
  ASSERT_EQ(::pipe(start), 0);
  ASSERT_EQ(::pipe(report), 0);
  constexpr int kProcs = 8;
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(start[1]);
      char c;
      (void)!::read(start[0], &c, 1);  // all start together when the parent closes the pipe
      Cache cache(tmp.root());
      auto r = kreg::jit::build(spec, *spec.jit, s, "sm_90a", cache);
      const char out = !r ? 'E' : r->compiled ? 'C' : 'H';
      (void)!::write(report[1], &out, 1);
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);
  ::close(report[1]);
  std::string got;
  char c;
  while (::read(report[0], &c, 1) == 1) got += c;
  ::close(report[0]);
  for (pid_t pid : kids) ::waitpid(pid, nullptr, 0);
  ASSERT_EQ(got.size(), static_cast<size_t>(kProcs)) << got;
  EXPECT_EQ(std::count(got.begin(), got.end(), 'C'), 1) << "compiled: C, hit: H, error: E: " << got;
  EXPECT_EQ(std::count(got.begin(), got.end(), 'H'), kProcs - 1) << got;
}

// ---- the jitgrp fixture: a plugin with a jit implementation, loaded for real ----

fs::path fixture(const std::string& name) {
  return fs::path(KREG_TEST_PLUGIN_DIR) / ("libkreg_" + name + ".so");
}

// A manifest of one group, jitgrp, from `library`.
fs::path write_manifest(const fs::path& dir, const std::string& library) {
  const fs::path m = dir / "registry.yaml";
  std::ofstream(m) << "kreg_manifest: 1\nplugin_dir: " << KREG_TEST_PLUGIN_DIR
                   << "\ngroups:\n  - name: jitgrp\n    library: " << library
                   << "\n    version: \"0.1.0\"\n";
  return m;
}

TEST(JitPlugin, LoadsWithItsSourceAndFallsBackWhereJitCannotRun) {
  kreg::test::Scratch tmp;
  auto manifest = kreg::load_manifest(write_manifest(tmp.root(), "libkreg_jitgrp.so"), {});
  ASSERT_TRUE(manifest) << manifest.status().message();
  auto reg = kreg::Registry::open(*manifest);
  ASSERT_TRUE(reg) << reg.status().message();
  const auto impls = (*reg)->implementations("jitgrp.scale");
  ASSERT_EQ(impls.size(), 2u);
  EXPECT_EQ(impls[0]->backend, "jit") << "priority 200 first";
  ASSERT_TRUE(impls[0]->jit);
  EXPECT_EQ(impls[0]->jit->source_name, "scale.cu.jit");
  ASSERT_EQ(impls[0]->jit->headers.size(), 1u);
  EXPECT_EQ(impls[0]->jit->headers[0].first, "two.h");
  EXPECT_EQ(impls[0]->jit->params, std::vector<std::string>{"H"});
  // CPU tensors: the reference runs.
  float x[6] = {1, 2, 3, 4, 5, 6}, out[6] = {};
  int64_t shape[2] = {2, 3};
  DLTensor tx{x, {kDLCPU, 0}, 2, kreg::to_dl(kreg::DType::kF32), shape, nullptr, 0};
  DLTensor to{out, {kDLCPU, 0}, 2, kreg::to_dl(kreg::DType::kF32), shape, nullptr, 0};
  DLTensor* args[2] = {&tx, &to};
  const kreg_attr alpha{KREG_ATTR_FLOAT, 0, {.f = 0.5}};
  ASSERT_TRUE((*reg)->call("jitgrp.scale", args, {&alpha, 1}).ok());
  EXPECT_EQ(out[5], 6.0f);
  // Without a GPU the jit implementation is unavailable, and says why.
  const kreg::KernelBackend* jit = kreg::find_backend("jit");
  ASSERT_NE(jit, nullptr);
  if (!jit->available()) {
    kreg::Target t{{kDLCUDA, 0}, kreg::DType::kF32, {{"T", 2}, {"H", 64}}};
    auto h = (*reg)->resolve("jitgrp.scale", t);
    ASSERT_FALSE(h);
    EXPECT_NE(h.status().message().find("jit: backend unavailable"), std::string::npos)
        << h.status().message();
  }
}

TEST(JitPlugin, ASourceOutsideTheLibraryIsRefused) {
  auto p = kreg::PluginLibrary::open(fixture("jitgrp_heap"), {"jitgrp", std::string("0.1.0")});
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("its jit source source"), std::string::npos)
      << p.status().message();
  EXPECT_NE(p.status().message().find("outside the library"), std::string::npos)
      << p.status().message();
}

// fork() runs pthread_atfork handlers; posix_spawn does not.
std::atomic<int> g_forks{0};

int forks_so_far() {
  static const bool installed = ::pthread_atfork([] { ++g_forks; }, nullptr, nullptr) == 0;
  EXPECT_TRUE(installed);
  return g_forks.load();
}

TEST(JitPlugin, ValidateCompilesEveryJitSource) {
  SKIP_WITHOUT_NVRTC();
  kreg::test::Scratch tmp;
  ::setenv("KREG_JIT_CACHE", (tmp.root() / "cache").c_str(), 1);
  kreg::ValidateOptions opts;
  opts.timeout_s = 5;
  const fs::path good = write_manifest(tmp.root(), "libkreg_jitgrp.so");
  const int forks_before = forks_so_far();
  auto ok = kreg::validate_registry(good, opts);
  // The load and the compiles ran in kreg-probe, started with posix_spawn.
  EXPECT_EQ(g_forks.load(), forks_before) << "validate forked the test process";
  bool passed = false;
  for (const auto& o : ok.outcomes) {
    if (o.check == "jit-sources" && o.group == "jitgrp") passed = o.passed && !o.skipped;
  }
  EXPECT_TRUE(passed) << "jit-sources passes for a source that compiles";
  fs::remove(good);
  auto bad = kreg::validate_registry(write_manifest(tmp.root(), "libkreg_jitgrp_broken.so"), opts);
  EXPECT_FALSE(bad.ok());
  bool found = false;
  for (const auto& f : bad.findings) {
    if (f.check != "jit-sources") continue;
    found = true;
    EXPECT_NE(f.message.find("NVRTC failed to compile scale.cu.jit"), std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find("this_is_not_cuda"), std::string::npos)
        << "NVRTC's log: " << f.message;
  }
  EXPECT_TRUE(found) << "a jit-sources finding for the broken source";
  ::unsetenv("KREG_JIT_CACHE");
}

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// `kreg args` with the JIT cache at `cache` and the environment assignments `env`.
Outcome cli(const std::string& args, const fs::path& cache, const std::string& env = "") {
  const std::string cmd =
      "KREG_JIT_CACHE=" + cache.string() + " " + env + " " KREG_CLI " " + args + " 2>&1";
  Outcome r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(JitCli, BuildListInfoClear) {
  kreg::test::Scratch tmp;
  const fs::path cache = tmp.root() / "cache";
  const std::string m = "--manifest " + write_manifest(tmp.root(), "libkreg_jitgrp.so").string();
  // Usage errors first: they need no NVRTC.
  Outcome no_shape = cli(m + " jit build --op jitgrp.scale --arch sm_90a", cache);
  EXPECT_EQ(no_shape.exit_code, 2) << no_shape.output;
  EXPECT_NE(no_shape.output.find("specializes on H"), std::string::npos) << no_shape.output;
  Outcome unknown = cli(m + " jit build --op jitgrp.nosuch --arch sm_90a --shape H=8", cache);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  Outcome empty = cli("jit ls", cache);
  EXPECT_EQ(empty.exit_code, 0) << empty.output;
  EXPECT_NE(empty.output.find("0 entries"), std::string::npos) << empty.output;
  std::string why;
  if (!have_nvrtc(&why)) GTEST_SKIP() << "no NVRTC here: " << why;
  const std::string build =
      m + " jit build --op jitgrp.scale --arch sm_90a --shape H=64 --shape H=65";
  Outcome first = cli(build, cache);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("compiled"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("H=65 "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("2 of 2 specializations"), std::string::npos) << first.output;
  Outcome second = cli(build, cache);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.output.find("compiled"), std::string::npos) << "all hits: " << second.output;
  EXPECT_NE(second.output.find("cached"), std::string::npos) << second.output;
  Outcome ls = cli("jit ls", cache);
  EXPECT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_NE(ls.output.find("jitgrp.scale"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("2 entries"), std::string::npos) << ls.output;
  Outcome info = cli(m + " info jitgrp.scale", cache);
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("specializes on H; cached: "), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("H=64 sm_90a"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("H=65 sm_90a"), std::string::npos) << info.output;
  Outcome clear = cli("jit clear", cache);
  EXPECT_EQ(clear.exit_code, 0) << clear.output;
  EXPECT_NE(clear.output.find("removed 2 entries"), std::string::npos) << clear.output;
  EXPECT_NE(cli("jit ls", cache).output.find("0 entries"), std::string::npos);
}

// ---- jit-sources with a stand-in NVRTC: no NVRTC or GPU needed ----

std::string fake_nvrtc_env(const std::string& compile, const fs::path& mark) {
  return "KREG_NVRTC='" KREG_FAKE_NVRTC "' KREG_FAKE_NVRTC_COMPILE=" + compile +
         " KREG_FAKE_NVRTC_MARK='" + mark.string() + "'";
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(JitSources, TheCompilesRunInKregProbeAndTheirErrorsFailTheRule) {
  kreg::test::Scratch tmp;
  const fs::path mark = tmp.root() / "compiled-by";
  const std::string m = "--manifest " + write_manifest(tmp.root(), "libkreg_jitgrp.so").string();
  const Outcome r = cli(m + " validate", tmp.root() / "cache", fake_nvrtc_env("fail", mark));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("ok   library-loads      jitgrp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error [jit-sources] jitgrp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("jitgrp.scale (jit, H=128, sm_90a): NVRTC failed to compile "
                          "scale.cu.jit: NVRTC_ERROR_COMPILATION"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("fake-nvrtc: refused --gpu-architecture=sm_90a"), std::string::npos)
      << "NVRTC's log: " << r.output;
  // Every compile ran in kreg-probe: a fork of the validator would be named kreg.
  const std::vector<std::string> compilers = lines_of(mark);
  ASSERT_FALSE(compilers.empty()) << "nothing compiled: " << r.output;
  for (const std::string& c : compilers) EXPECT_EQ(c, kreg::kProbeExecutableName);
}

TEST(JitSources, ACompilerThatCrashesFailsTheRuleNotTheValidator) {
  kreg::test::Scratch tmp;
  const fs::path mark = tmp.root() / "compiled-by";
  const std::string m = "--manifest " + write_manifest(tmp.root(), "libkreg_jitgrp.so").string();
  const Outcome r = cli(m + " validate", tmp.root() / "cache", fake_nvrtc_env("segv", mark));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error [jit-sources] jitgrp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plugin 'jitgrp' ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("killed by SIGSEGV"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("while compiling its jit sources (NVRTC)"), std::string::npos)
      << r.output;
  EXPECT_EQ(lines_of(mark), std::vector<std::string>{kreg::kProbeExecutableName});
  // The checks after it still ran.
  EXPECT_NE(r.output.find("groups-guard"), std::string::npos) << r.output;
}

// Sets an environment variable for a scope, the old value back after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// probe_plugin's compile mode directly (validate's limit is 30 s at least): the child gets
// the stand-in through its environment; nothing here loads NVRTC in this process.
TEST(JitSources, ACompilerThatHangsIsKilledAtTheTimeout) {
  kreg::test::Scratch tmp;
  ScopedEnv nvrtc("KREG_NVRTC", KREG_FAKE_NVRTC);
  ScopedEnv how("KREG_FAKE_NVRTC_COMPILE", "hang");
  ScopedEnv cache("KREG_JIT_CACHE", (tmp.root() / "cache").string());
  kreg::ProbeOptions o;
  o.timeout_s = 1;
  o.run_init = false;
  o.compile_jit = true;
  const auto t0 = std::chrono::steady_clock::now();
  const kreg::ProbeResult r =
      kreg::probe_plugin(fixture("jitgrp"), {"jitgrp", std::string("0.1.0")}, o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.end, kreg::ProbeEnd::kTimedOut) << r.message;
  EXPECT_NE(r.message.find("plugin 'jitgrp' (" + fixture("jitgrp").string() +
                           "): timed out after 1 s while compiling its jit sources (NVRTC)"),
            std::string::npos)
      << r.message;
  EXPECT_LT(took, 30) << "killed at its timeout";
}

// The compile mode reports what it compiled: one jit implementation, f32 only, built for
// Hopper (jitgrp has no CUDA architectures); with the stand-in, one failure.
TEST(JitSources, TheProbeReportsTheCompiles) {
  kreg::test::Scratch tmp;
  ScopedEnv nvrtc("KREG_NVRTC", KREG_FAKE_NVRTC);
  ScopedEnv how("KREG_FAKE_NVRTC_COMPILE", "fail");
  ScopedEnv cache("KREG_JIT_CACHE", (tmp.root() / "cache").string());
  kreg::ProbeOptions o;
  o.run_init = false;
  o.compile_jit = true;
  const kreg::ProbeResult r =
      kreg::probe_plugin(fixture("jitgrp"), {"jitgrp", std::string("0.1.0")}, o);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.snapshot.info.group, "jitgrp");
  EXPECT_EQ(r.jit.implementations, 1u);
  EXPECT_EQ(r.jit.builds, 0u);
  ASSERT_EQ(r.jit.failures.size(), 1u);
  EXPECT_NE(r.jit.failures[0].find("fake-nvrtc: refused --gpu-architecture=sm_90a"),
            std::string::npos)
      << r.jit.failures[0];
  EXPECT_TRUE(r.forked.empty()) << r.forked;
}

}  // namespace
