// Registry validation (issue 3): SHA-256 against the NIST vectors, pin rewriting, the
// CMake source reader, path safety and pins in the host, and every broken registry the
// validator must survive and name: plugins that crash, abort, throw, exit or hang while
// loading, files that are not libraries, unsafe paths, wrong pins, orphan sources and
// group lists that disagree. A few run through the real `kreg validate` binary as well.
#include <elf.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "time_budget.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kreg/admission.hpp"
#include "kreg/elf_file.hpp"
#include "kreg/fatbin.hpp"
#include "kreg/manifest.hpp"
#include "kreg/plugin_probe.hpp"
#include "kreg/registry.hpp"
#include "kreg/sha256.hpp"
#include "kreg/source_tree.hpp"
#include "kreg/validation.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

// Short enough to keep the suite fast, long enough for a loaded 2-core machine to fork
// and load a small plugin.
constexpr double kHangTimeout = 0.5;

using test::read_file;
using test::Scratch;
using test::test_plugin;

struct GroupSpec {
  std::string name;
  std::string library;
  std::string extra;  // more keys, e.g. "    sha256: ...\n"
};

std::string manifest_text(const fs::path& plugin_dir, const std::vector<GroupSpec>& groups,
                          const std::string& tail = "") {
  std::string s = "kreg_manifest: 1\nplugin_dir: " + plugin_dir.string() + "\ngroups:\n";
  for (const GroupSpec& g : groups) {
    s += "  - name: " + g.name + "\n    library: " + g.library + "\n" + g.extra;
  }
  return s + tail;
}

ValidationReport validate(const fs::path& manifest, ValidateOptions options = {}) {
  if (options.timeout_s == 10) options.timeout_s = 5;
  return validate_registry(manifest, options);
}

std::string dump(const ValidationReport& r) {
  std::string s;
  for (const Finding& f : r.findings) {
    s += "  [" + f.check + "] " + f.group + " " + f.where + ": " + f.message + "\n";
  }
  return s.empty() ? "  (no findings)\n" : s;
}

// The report is a violation (what `kreg validate` exits 1 for), and has a finding of
// `check` for `group` that says where and whose location and message together contain
// every one of `texts`.
void expect_violation(const ValidationReport& r, const std::string& check, const std::string& group,
                      const std::vector<std::string>& texts) {
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.manifest_readable);
  bool found = false;
  for (const Finding& f : r.findings) {
    if (f.check != check || f.group != group) continue;
    bool all = !f.where.empty();
    const std::string both = f.where + " " + f.message;
    for (const std::string& t : texts) all = all && both.find(t) != std::string::npos;
    found = found || all;
  }
  EXPECT_TRUE(found) << "no [" << check << "] finding for '" << group << "' with all of the "
                     << "expected texts; findings:\n"
                     << dump(r);
  bool outcome_failed = false;
  for (const CheckOutcome& c : r.outcomes) {
    if (c.check == check && !c.passed && (c.group == group || c.group.empty())) {
      outcome_failed = true;
    }
  }
  EXPECT_TRUE(outcome_failed) << "no failed outcome line for " << check;
}

bool has_outcome(const ValidationReport& r, const std::string& check, const std::string& group) {
  for (const CheckOutcome& c : r.outcomes) {
    if (c.check == check && c.group == group) return true;
  }
  return false;
}

// ---- SHA-256 (FIPS 180-4 test vectors from NIST's examples) ----

TEST(Sha256, NistVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjkl"
                       "mnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PiecewiseEqualsWholeAtEveryPaddingBoundary) {
  std::string data;
  for (int i = 0; i < 300; ++i) data += static_cast<char>(i * 7 + 3);
  for (size_t len : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 300u}) {
    const std::string msg = data.substr(0, len);
    Sha256 h;
    for (size_t i = 0; i < msg.size(); i += 13) h.update(msg.substr(i, 13));
    EXPECT_EQ(Sha256::hex(h.finish()), sha256_hex(msg)) << len;
  }
}

TEST(Sha256, HashesFiles) {
  Scratch t;
  const fs::path f = t.write("a.bin", std::string(1000000, 'a'));
  auto sha = sha256_file(f);
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(*sha, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_file(t.root() / "missing").status().code(), KREG_NOT_FOUND);
}

// ---- Pin rewriting keeps the file as written ----

const std::string kPinA(64, 'a');
const std::string kPinB(64, 'b');

TEST(RewritePins, AddsAMissingPinUnderTheLibraryLine) {
  const std::string text =
      "# Our manifest. Comments stay: é 日本\n"
      "kreg_manifest: 1\n"
      "groups:\n"
      "  - name: layernorm   # the norms\n"
      "    library: libkreg_layernorm.so  # built by CMake\n"
      "    version: \"0.1.0\"\n"
      "  - name: activation\n"
      "    library: libkreg_activation.so";
  auto out = rewrite_manifest_pins(text, {{"layernorm", kPinA}, {"activation", kPinB}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out,
            "# Our manifest. Comments stay: é 日本\n"
            "kreg_manifest: 1\n"
            "groups:\n"
            "  - name: layernorm   # the norms\n"
            "    library: libkreg_layernorm.so  # built by CMake\n"
            "    sha256: " +
                kPinA +
                "\n"
                "    version: \"0.1.0\"\n"
                "  - name: activation\n"
                "    library: libkreg_activation.so\n"
                "    sha256: " +
                kPinB);
}

TEST(RewritePins, ReplacesPinsWhereTheyStandKeepingQuotesAndComments) {
  const std::string text =
      "kreg_manifest: 1  # é\n"
      "groups:\n"
      "  - name: a\n"
      "    library: liba.so\n"
      "    sha256: \"" +
      kPinA +
      "\"  # pinned by CI\n"
      "  - name: b\n"
      "    sha256: " +
      kPinA +
      "\n"
      "    library: libb.so\n"
      "  - name: c\n"
      "    library: libc.so\n"
      "    sha256:\n";
  auto out = rewrite_manifest_pins(text, {{"a", kPinB}, {"b", kPinB}, {"c", kPinB}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out,
            "kreg_manifest: 1  # é\n"
            "groups:\n"
            "  - name: a\n"
            "    library: liba.so\n"
            "    sha256: \"" +
                kPinB +
                "\"  # pinned by CI\n"
                "  - name: b\n"
                "    sha256: " +
                kPinB +
                "\n"
                "    library: libb.so\n"
                "  - name: c\n"
                "    library: libc.so\n"
                "    sha256: " +
                kPinB + "\n");
}

TEST(RewritePins, RefusesWhatItCannotEditSafely) {
  auto flow = rewrite_manifest_pins("kreg_manifest: 1\ngroups:\n  - {name: a, library: a.so}\n",
                                    {{"a", kPinA}});
  ASSERT_FALSE(flow.ok());
  EXPECT_NE(flow.status().message().find("flow map"), std::string::npos);
  auto unknown = rewrite_manifest_pins("kreg_manifest: 1\ngroups: []\n", {{"a", kPinA}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no group named 'a'"), std::string::npos);
  EXPECT_FALSE(rewrite_manifest_pins("groups: [\n", {{"a", kPinA}}).ok());
}

// ---- The CMake reader behind sources-built and groups-guard ----

TEST(SourceTree, ReadsKregAddPlugin) {
  auto b = parse_plugin_build(
      "# kreg_add_plugin(commented SOURCES no.cpp)\n"
      "kreg_add_plugin(layernorm\n"
      "  SOURCES register.cpp \"reference.cpp\"  # the CPU side\n"
      "          ./sub/../helpers.cpp\n"
      "  CUDA_SOURCES rmsnorm.cu)\n");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->group, "layernorm");
  EXPECT_EQ(b->line, 2);
  EXPECT_EQ(b->sources,
            (std::set<std::string>{"register.cpp", "reference.cpp", "helpers.cpp", "rmsnorm.cu"}));
  EXPECT_TRUE(b->unresolved.empty());

  auto v = parse_plugin_build("KREG_ADD_PLUGIN(x SOURCES ${MY_SOURCES} a.cpp)");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->unresolved, std::vector<std::string>{"${MY_SOURCES}"});
  EXPECT_FALSE(parse_plugin_build("add_library(x MODULE a.cpp)").has_value());
  EXPECT_EQ(parse_subdirectories("add_subdirectory(layernorm)\n# add_subdirectory(no)\n"
                                 "add_subdirectory(activation)\n"),
            (std::set<std::string>{"activation", "layernorm"}));
}

TEST(SourceTree, TheShippedTreeIsConsistent) {
  const fs::path src = fs::path(KREG_SOURCE_DIR) / "plugins";
  for (const std::string& g : group_folders(src)) {
    auto text = read_text_file(src / g / "CMakeLists.txt");
    ASSERT_TRUE(text.ok());
    auto b = parse_plugin_build(*text);
    ASSERT_TRUE(b.has_value()) << g;
    EXPECT_EQ(b->group, g);
    for (const std::string& f : kernel_sources(src / g)) EXPECT_TRUE(b->sources.count(f)) << f;
  }
}

// ---- Path safety and pins, on their own ----

TEST(Admission, PathSafety) {
  Scratch t;
  const fs::path dir = t.dir("plugins");
  const fs::path lib = t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  EXPECT_TRUE(check_path_safety(lib, dir).ok());
  fs::create_symlink(lib, dir / "libkreg_alias.so");
  EXPECT_TRUE(check_path_safety(dir / "libkreg_alias.so", dir).ok()) << "a link inside is fine";

  const fs::path outside = t.plugin("testgrp", "elsewhere/libkreg_testgrp.so");
  fs::create_symlink(outside, dir / "libkreg_escape.so");
  Status escape = check_path_safety(dir / "libkreg_escape.so", dir);
  EXPECT_EQ(escape.code(), KREG_PERMISSION_DENIED);
  EXPECT_NE(escape.message().find("resolves to " + outside.string() +
                                  ", outside the plugin folder " + dir.string()),
            std::string::npos)
      << escape.message();
  EXPECT_EQ(check_path_safety(dir / ".." / "elsewhere" / "libkreg_testgrp.so", dir).code(),
            KREG_PERMISSION_DENIED);

  fs::permissions(lib, fs::perms(0757));
  Status writable = check_path_safety(lib, dir);
  EXPECT_EQ(writable.code(), KREG_PERMISSION_DENIED);
  EXPECT_NE(writable.message().find("is writable by all users (mode 0757)"), std::string::npos)
      << writable.message();
  fs::permissions(lib, fs::perms(0755));
  fs::permissions(dir, fs::perms(0775));
  Status folder = check_path_safety(lib, dir);
  EXPECT_NE(folder.message().find("folder " + dir.string() + " holding library"), std::string::npos)
      << folder.message();
  EXPECT_NE(folder.message().find("writable by its group (mode 0775)"), std::string::npos);
  fs::permissions(dir, fs::perms(0755));
  EXPECT_EQ(check_path_safety(dir / "missing.so", dir).code(), KREG_NOT_FOUND);
}

TEST(Admission, PinMismatchNamesBothHashes) {
  Scratch t;
  const fs::path f = t.write("lib.so", "abc", 0755);
  EXPECT_TRUE(check_pin(f, sha256_hex("abc")).ok());
  Status st = check_pin(f, kPinA);
  EXPECT_EQ(st.code(), KREG_FAILED_PRECONDITION);
  EXPECT_NE(st.message().find("expected " + kPinA + ", actual " + sha256_hex("abc")),
            std::string::npos)
      << st.message();
}

// ---- The child-process load ----

TEST(Probe, ReadsAGoodPluginWithoutLoadingItHere) {
  const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")});
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.snapshot.info.group, "testgrp");
  EXPECT_EQ(r.snapshot.info.abi_major, KREG_ABI_MAJOR);
  ASSERT_GE(r.snapshot.kernels.size(), 2u);
  EXPECT_EQ(r.snapshot.kernels[0].op, "testgrp.scale");
  EXPECT_EQ(r.snapshot.kernels[0].source_file, "testgrp.cpp");
  EXPECT_EQ(r.snapshot.kernels[0].dtypes, "f32");
  EXPECT_EQ(r.snapshot.kernels[0].capabilities.size(), 1u);
  // The parent never mapped it.
  const std::string maps = read_file("/proc/self/maps");
  EXPECT_EQ(maps.find(test_plugin("testgrp").string()), std::string::npos);
}

TEST(Probe, ReportsEachWayOfDying) {
  ProbeOptions o;
  o.timeout_s = kHangTimeout;
  auto segv = probe_plugin(test_plugin("crash_segv_static"), {"testgrp", std::nullopt}, o);
  EXPECT_EQ(segv.end, ProbeEnd::kSignaled);
  EXPECT_EQ(signal_name(segv.signal), "SIGSEGV");
  auto exit3 = probe_plugin(test_plugin("crash_exit_init"), {"testgrp", std::nullopt}, o);
  EXPECT_EQ(exit3.end, ProbeEnd::kExited);
  EXPECT_EQ(exit3.exit_status, 3);
  const auto start = std::chrono::steady_clock::now();
  auto hang = probe_plugin(test_plugin("crash_hang_static"), {"testgrp", std::nullopt}, o);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(hang.end, ProbeEnd::kTimedOut);
  EXPECT_LT(took, kHangTimeout + test::budget(2.0));
  auto refused = probe_plugin(test_plugin("abi_major2"), {"testgrp", std::nullopt}, o);
  EXPECT_EQ(refused.end, ProbeEnd::kRefused);
  EXPECT_EQ(refused.stage, PluginLibrary::Stage::kAbi);
  auto init = probe_plugin(test_plugin("init_fails"), {"testgrp", std::nullopt}, o);
  EXPECT_EQ(init.end, ProbeEnd::kInitFailed);
  EXPECT_EQ(init.code, KREG_RESOURCE_EXHAUSTED);
}

// ---- Broken plugins: each names its check, says what and where ----

struct PluginCase {
  const char* plugin;
  const char* check;
  std::vector<std::string> texts;
};

void PrintTo(const PluginCase& c, std::ostream* os) { *os << c.plugin << " -> " << c.check; }

class BrokenPlugin : public ::testing::TestWithParam<PluginCase> {};

TEST_P(BrokenPlugin, IsReportedAndValidationCarriesOn) {
  const PluginCase& c = GetParam();
  Scratch t;
  // A good group after the broken one: validation must reach it.
  const fs::path m = t.write(
      "registry.yaml", manifest_text(KREG_TEST_PLUGIN_DIR,
                                     {{"testgrp", "libkreg_" + std::string(c.plugin) + ".so", ""},
                                      {"other", "libkreg_wrong_group.so", ""}}));
  ValidateOptions o;
  o.timeout_s = kHangTimeout;
  const ValidationReport r = validate(m, o);
  std::vector<std::string> texts = c.texts;
  texts.push_back(test_plugin(c.plugin).string());
  expect_violation(r, c.check, "testgrp", texts);
  EXPECT_TRUE(has_outcome(r, "library-loads", "other")) << "validation stopped early";
  EXPECT_TRUE(has_outcome(r, "groups-guard", ""));
}

// Pinned with the right hash: the child loads the private copy whose bytes were hashed,
// and the verdict is the same, naming the library, never the copy.
TEST_P(BrokenPlugin, PinnedIsLoadedFromTheHashedCopyAndNamedByItsPath) {
  const PluginCase& c = GetParam();
  Scratch t;
  auto sha = sha256_file(test_plugin(c.plugin));
  ASSERT_TRUE(sha.ok()) << sha.status().message();
  const fs::path m = t.write(
      "registry.yaml",
      manifest_text(KREG_TEST_PLUGIN_DIR, {{"testgrp", "libkreg_" + std::string(c.plugin) + ".so",
                                            "    sha256: " + *sha + "\n"}}));
  ValidateOptions o;
  o.timeout_s = kHangTimeout;
  const ValidationReport r = validate(m, o);
  EXPECT_TRUE(has_outcome(r, "integrity", "testgrp"));
  std::vector<std::string> texts = c.texts;
  texts.push_back(test_plugin(c.plugin).string());
  expect_violation(r, c.check, "testgrp", texts);
  for (const Finding& f : r.findings) {
    EXPECT_EQ(f.message.find("/kreg-"), std::string::npos)
        << "names the private copy: " << f.message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, BrokenPlugin,
    ::testing::Values(
        PluginCase{"crash_segv_static",
                   "library-loads",
                   {"killed by SIGSEGV", "while loading the library", "static initializers"}},
        PluginCase{"crash_segv_init", "library-loads", {"killed by SIGSEGV", "in its init hook"}},
        PluginCase{"crash_abort_init", "library-loads", {"killed by SIGABRT", "in its init hook"}},
        PluginCase{"crash_throw_static",
                   "library-loads",
                   // Where the plugin's libstdc++ is not the core's, the child's
                   // terminate handler does not see the throw: a plain SIGABRT then.
                   // (what the child printed last varies with the toolchain).
                   {"static initializer"}},
        PluginCase{
            "crash_exit_init", "library-loads", {"exited with status 3", "in its init hook"}},
        PluginCase{"crash_hang_static",
                   "library-loads",
                   {"timed out after 0.5 s", "static initializers", "was killed"}},
        PluginCase{"crash_hang_init", "library-loads", {"timed out after 0.5 s", "init hook"}},
        PluginCase{"init_fails",
                   "library-loads",
                   {"init hook failed: no device memory for the lookup table"}},
        PluginCase{"test_op",
                   "no-test-ops",
                   {"testgrp.test_noop", "test registration in a shipped plugin"}},
        PluginCase{"abi_major2", "abi-version", {"this core speaks ABI"}},
        PluginCase{"no_entry", "library-loads", {"does not export 'kreg_plugin_entry'"}},
        PluginCase{"entry_data",
                   "library-loads",
                   {"its entry symbol 'kreg_plugin_entry' is STT_OBJECT (a data object), not a "
                    "function"}}),
    [](const auto& info) { return std::string(info.param.plugin); });

// ---- Broken files, written by the tests ----

void write_elf_header(const fs::path& p, unsigned char elf_class, uint16_t machine) {
  std::string bytes(4096, '\0');
  if (elf_class == ELFCLASS64) {
    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_type = ET_DYN;
    eh.e_machine = machine;
    eh.e_version = EV_CURRENT;
    eh.e_ehsize = sizeof eh;
    std::memcpy(bytes.data(), &eh, sizeof eh);
  } else {
    Elf32_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS32;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_type = ET_DYN;
    eh.e_machine = machine;
    eh.e_version = EV_CURRENT;
    eh.e_ehsize = sizeof eh;
    std::memcpy(bytes.data(), &eh, sizeof eh);
  }
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  fs::permissions(p, fs::perms(0755));
}

// One group "testgrp" whose library is plugins/libkreg_testgrp.so in a fresh tree.
class BrokenFile : public ::testing::Test {
 protected:
  fs::path lib() const { return t.root() / "plugins" / "libkreg_testgrp.so"; }
  fs::path manifest(const std::string& extra = "") {
    t.dir("plugins");
    return t.write("registry.yaml",
                   manifest_text(t.root() / "plugins", {{"testgrp", "libkreg_testgrp.so", extra}}));
  }
  Scratch t;
};

TEST_F(BrokenFile, Truncated) {
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  fs::resize_file(lib(), fs::file_size(lib()) / 3);
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string() + " is truncated"});
}

TEST_F(BrokenFile, NotElf) {
  t.write("plugins/libkreg_testgrp.so",
          "#!/bin/sh\n# A script where the library should be, long enough to have a header.\n"
          "echo not a library\n",
          0755);
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string() + " is not an ELF shared object (bad magic)"});
}

TEST_F(BrokenFile, DirectoryWhereTheLibraryShouldBe) {
  t.dir("plugins/libkreg_testgrp.so");
  expect_violation(validate(manifest()), "library-present", "testgrp",
                   {"library " + lib().string() + " is a directory"});
}

TEST_F(BrokenFile, DanglingSymlink) {
  t.dir("plugins");
  fs::create_symlink(t.root() / "gone.so", lib());
  expect_violation(validate(manifest()), "library-present", "testgrp",
                   {lib().string() + " does not exist (a symbolic link to a missing file)"});
}

TEST_F(BrokenFile, SymlinkEscapingThePluginFolder) {
  const fs::path outside = t.plugin("testgrp", "elsewhere/libkreg_testgrp.so");
  t.dir("plugins");
  fs::create_symlink(outside, lib());
  const ValidationReport r = validate(manifest());
  expect_violation(r, "path-safety", "testgrp",
                   {"resolves to " + outside.string(), "outside the plugin folder"});
  EXPECT_FALSE(has_outcome(r, "library-loads", "testgrp")) << "refused, not loaded";
}

TEST_F(BrokenFile, WorldWritableLibrary) {
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  fs::permissions(lib(), fs::perms(0777));
  const ValidationReport r = validate(manifest());
  expect_violation(r, "path-safety", "testgrp",
                   {lib().string(), "writable by its group and all users (mode 0777)"});
  EXPECT_FALSE(has_outcome(r, "library-loads", "testgrp"));
}

TEST_F(BrokenFile, GroupWritablePluginFolder) {
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const fs::path m = manifest();
  fs::permissions(t.root() / "plugins", fs::perms(0775));
  expect_violation(validate(m), "path-safety", "testgrp",
                   {"folder " + (t.root() / "plugins").string(), "writable by its group"});
}

TEST_F(BrokenFile, WrongArchitecture) {
  t.dir("plugins");
  write_elf_header(lib(), ELFCLASS64, EM_AARCH64);
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string() + " is built for another architecture (ELF machine " +
                    std::to_string(EM_AARCH64)});
}

TEST_F(BrokenFile, ThirtyTwoBitObject) {
  t.dir("plugins");
  write_elf_header(lib(), ELFCLASS32, EM_386);
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string() + " is a 32-bit ELF object"});
}

// A real plugin with bytes patched where the validator's own symbol scan reads: a wild
// symbol name offset, a string table claiming 6 GB, a section count far past the file.
// Each is a finding of library-loads naming the problem; none may crash the validator.
void patch_testgrp(const fs::path& lib, const std::function<void(std::string&)>& patch) {
  std::string b = read_file(test_plugin("testgrp"));
  patch(b);
  std::ofstream(lib, std::ios::binary | std::ios::trunc) << b;
  fs::permissions(lib, fs::perms(0755));
}

template <typename T>
T at(const std::string& b, uint64_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

// Section `name`'s header offset in the ELF image `b`.
uint64_t section_header(const std::string& b, const char* name) {
  const auto eh = at<Elf64_Ehdr>(b, 0);
  const auto names = at<Elf64_Shdr>(b, eh.e_shoff + eh.e_shstrndx * sizeof(Elf64_Shdr));
  for (int i = 1; i < eh.e_shnum; ++i) {
    const uint64_t h = eh.e_shoff + i * sizeof(Elf64_Shdr);
    if (std::strcmp(b.data() + names.sh_offset + at<Elf64_Shdr>(b, h).sh_name, name) == 0) {
      return h;
    }
  }
  ADD_FAILURE() << "no section " << name;
  return 0;
}

TEST_F(BrokenFile, HostileSymbolTables) {
  t.dir("plugins");
  patch_testgrp(lib(), [](std::string& b) {
    const auto sym = at<Elf64_Shdr>(b, section_header(b, ".symtab"));
    const uint32_t wild = 0x7ffffff0;
    std::memcpy(b.data() + sym.sh_offset + sizeof(Elf64_Sym), &wild, sizeof wild);
  });
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string(), "(SHT_SYMTAB, .symtab) has name offset 2147483632"});

  patch_testgrp(lib(), [](std::string& b) {
    const uint64_t h = section_header(b, ".strtab");
    const uint64_t six_gb = uint64_t{6} << 30;
    std::memcpy(b.data() + h + offsetof(Elf64_Shdr, sh_size), &six_gb, sizeof six_gb);
  });
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string(), "(SHT_STRTAB, .strtab) claims 6442450944 bytes"});

  patch_testgrp(lib(), [](std::string& b) {
    const uint16_t many = 0xfeff;
    std::memcpy(b.data() + offsetof(Elf64_Ehdr, e_shnum), &many, sizeof many);
  });
  expect_violation(validate(manifest()), "library-loads", "testgrp",
                   {lib().string() + " is truncated: its section header table (65279 entries"});
}

TEST_F(BrokenFile, StrippedPluginPasses) {
  t.dir("plugins");
  fs::copy_file(test_plugin("testgrp_stripped"), lib());
  fs::permissions(lib(), fs::perms(0755));
  const ValidationReport r = validate(manifest());
  EXPECT_TRUE(r.ok()) << dump(r);
  EXPECT_TRUE(has_outcome(r, "library-loads", "testgrp"));
}

TEST_F(BrokenFile, WrongPin) {
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const ValidationReport r = validate(manifest("    sha256: " + kPinA + "\n"));
  expect_violation(r, "integrity", "testgrp",
                   {lib().string() + " does not match its sha256 pin", "expected " + kPinA,
                    "actual " + *sha256_file(lib())});
  for (const Finding& f : r.findings) {
    if (f.check == "integrity") {
      EXPECT_NE(f.where.find("registry.yaml:6:13"), std::string::npos) << f.where;
    }
  }
  EXPECT_FALSE(has_outcome(r, "library-loads", "testgrp")) << "checked before loading";
}

TEST_F(BrokenFile, RightPinPasses) {
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const ValidationReport r = validate(manifest("    sha256: " + *sha256_file(lib()) + "\n"));
  EXPECT_TRUE(r.ok()) << dump(r);
  EXPECT_TRUE(has_outcome(r, "library-loads", "testgrp"));
}

// ---- The source tree: orphans, missing sources, groups that disagree ----

// A registry laid out like the repository: registry.yaml, plugins/<group>/ sources and a
// plugin folder build/ with the libraries.
class SourceTreeCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    t.write("plugins/CMakeLists.txt", "add_subdirectory(testgrp)\n");
    t.write("plugins/testgrp/CMakeLists.txt", "kreg_add_plugin(testgrp\n  SOURCES testgrp.cpp)\n");
    t.write("plugins/testgrp/testgrp.cpp", "// the group's kernels\n");
    t.plugin("testgrp", "build/libkreg_testgrp.so");
  }
  fs::path manifest(const std::string& tail = "") {
    return t.write("registry.yaml", manifest_text(t.root() / "build",
                                                  {{"testgrp", "libkreg_testgrp.so", ""}}, tail));
  }
  Scratch t;
};

TEST_F(SourceTreeCheck, ConsistentTreePasses) {
  const ValidationReport r = validate(manifest());
  EXPECT_TRUE(r.ok()) << dump(r);
  EXPECT_EQ(r.plugins_src, t.root() / "plugins");
  for (const CheckOutcome& c : r.outcomes) EXPECT_FALSE(c.skipped) << c.check << ": " << c.note;
}

TEST_F(SourceTreeCheck, OrphanSource) {
  t.write("plugins/testgrp/kernels/extra.cu", "// never compiled\n");
  expect_violation(validate(manifest()), "sources-built", "testgrp",
                   {"plugins/testgrp/kernels/extra.cu is not listed in kreg_add_plugin(testgrp",
                    "plugins/testgrp/CMakeLists.txt:1", "orphan"});
}

TEST_F(SourceTreeCheck, KernelSourceThatDoesNotExist) {
  fs::remove(t.root() / "plugins/testgrp/testgrp.cpp");
  t.write("plugins/testgrp/CMakeLists.txt", "kreg_add_plugin(testgrp SOURCES register.cpp)\n");
  t.write("plugins/testgrp/register.cpp", "\n");
  expect_violation(validate(manifest()), "sources-built", "testgrp",
                   {"testgrp.scale (cpu) says it comes from 'testgrp.cpp', which does not exist "
                    "in plugins/testgrp/"});
}

TEST_F(SourceTreeCheck, FolderNotInTheManifest) {
  t.write("plugins/moe/CMakeLists.txt", "kreg_add_plugin(moe SOURCES register.cpp)\n");
  t.write("plugins/CMakeLists.txt", "add_subdirectory(testgrp)\nadd_subdirectory(moe)\n");
  expect_violation(validate(manifest()), "groups-guard", "moe",
                   {"folder plugins/moe is a plugin group", "does not list group 'moe'"});
}

TEST_F(SourceTreeCheck, ManifestGroupWithoutAFolder) {
  t.plugin("wrong_group", "build/libkreg_other.so");
  const fs::path m = t.write(
      "registry.yaml", manifest_text(t.root() / "build", {{"testgrp", "libkreg_testgrp.so", ""},
                                                          {"other", "libkreg_other.so", ""}}));
  const ValidationReport r = validate(m);
  expect_violation(r, "groups-guard", "other",
                   {"group 'other' is in the manifest but there is no folder plugins/other"});
}

TEST_F(SourceTreeCheck, FolderLeftOutOfTheBuild) {
  t.write("plugins/CMakeLists.txt", "# nothing added\n");
  expect_violation(validate(manifest()), "groups-guard", "testgrp",
                   {"folder plugins/testgrp is not built", "no add_subdirectory(testgrp)"});
}

TEST_F(SourceTreeCheck, StrayLibrary) {
  t.plugin("testgrp", "build/libkreg_removed.so");
  expect_violation(validate(manifest()), "groups-guard", "",
                   {(t.root() / "build/libkreg_removed.so").string(), "no manifest group"});
}

TEST_F(SourceTreeCheck, ExpectedGroupsFromAFile) {
  const fs::path list = t.write("groups.txt", "# the groups we ship\ntestgrp\nmoe  # soon\n");
  auto names = read_expect_groups(list);
  ASSERT_TRUE(names.ok()) << names.status().message();
  ValidateOptions o;
  o.expect_groups = *names;
  o.expect_groups_source = list.string();
  expect_violation(validate(manifest(), o), "groups-guard", "moe",
                   {"group 'moe' is expected (" + list.string() + ")", "does not list it"});
  o.expect_groups = std::vector<std::string>{"testgrp"};
  EXPECT_TRUE(validate(manifest(), o).ok());

  EXPECT_EQ(read_expect_groups(t.write("bad.txt", "ok\nNot_Snake\n")).status().code(),
            KREG_INVALID_ARGUMENT);
  EXPECT_EQ(read_expect_groups(t.root() / "none.txt").status().code(), KREG_NOT_FOUND);
}

// A list of 100,000 expected groups (a 0.6 MB file, under the 1 MiB limit) made 100,015
// findings and 12.9 MB of output: a report lists at most kMaxFindingsPerCheck findings of a
// check, then says how many more there were; it still fails.
TEST_F(SourceTreeCheck, ExpectedGroupsBeyondTheListingLimitAreCounted) {
  std::string text = "testgrp\n";
  for (int i = 0; i < 5000; ++i) text += "g" + std::to_string(i) + "\n";
  auto names = read_expect_groups(t.write("many.txt", text));
  ASSERT_TRUE(names.ok()) << names.status().message();
  ValidateOptions o;
  o.expect_groups = *names;
  o.expect_groups_source = "many.txt";
  const ValidationReport r = validate(manifest(), o);
  EXPECT_FALSE(r.ok());
  size_t guard = 0;
  bool summary = false;
  for (const Finding& f : r.findings) {
    if (f.check != "groups-guard") continue;
    ++guard;
    summary |= f.message == std::to_string(5000 - kMaxFindingsPerCheck) +
                                " more findings of this check are not listed (the first " +
                                std::to_string(kMaxFindingsPerCheck) + " are)";
  }
  EXPECT_EQ(guard, kMaxFindingsPerCheck + 1);
  EXPECT_TRUE(summary) << dump(r);
}

TEST_F(SourceTreeCheck, ExpectedGroupsInTheManifest) {
  const ValidationReport r = validate(manifest("expect_groups: [layernorm]\n"));
  expect_violation(
      r, "groups-guard", "testgrp",
      {"group 'testgrp' is in the manifest but not in the expected groups", "expect_groups at "});
  expect_violation(r, "groups-guard", "layernorm", {"group 'layernorm' is expected"});
}

TEST_F(SourceTreeCheck, ExplicitSourceTree) {
  fs::rename(t.root() / "plugins", t.root() / "src");
  ValidationReport absent = validate(manifest());
  EXPECT_TRUE(absent.ok()) << dump(absent);
  bool skipped = false;
  for (const CheckOutcome& c : absent.outcomes) skipped |= c.check == "groups-guard" && c.skipped;
  EXPECT_TRUE(skipped) << "no source tree: groups-guard says it was skipped";
  ValidateOptions o;
  o.plugins_src = t.root() / "src";
  t.write("src/testgrp/orphan.cpp", "\n");
  expect_violation(validate(manifest(), o), "sources-built", "testgrp", {"src/testgrp/orphan.cpp"});
}

// ---- The default manifest, and --update-pins ----

TEST(Validate, ShippedRegistryPassesEveryCheck) {
  ValidateOptions opts;
  opts.manifest.plugin_dir_override = fs::path(KREG_PLUGIN_DIR);
  const ValidationReport r = validate_registry(fs::path(KREG_SOURCE_DIR) / "registry.yaml", opts);
  EXPECT_TRUE(r.ok()) << dump(r);
  EXPECT_EQ(r.plugins_src, fs::path(KREG_SOURCE_DIR) / "plugins");
  std::set<std::string> seen;
  for (const CheckOutcome& c : r.outcomes) {
    seen.insert(c.check);
    if (c.check != "integrity") {
      EXPECT_FALSE(c.skipped) << c.check << ": " << c.note;
    }
  }
  for (const std::string& check : validation_checks()) EXPECT_TRUE(seen.count(check)) << check;
}

TEST(Validate, UpdatePinsWritesThemAndKeepsTheFile) {
  Scratch t;
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const std::string original =
      "# A manifest with comments.\nkreg_manifest: 1\nplugin_dir: plugins  # here\ngroups:\n"
      "  - name: testgrp\n    library: libkreg_testgrp.so  # the test group\n"
      "    version: \"0.1.0\"\n";
  const fs::path m = t.write("registry.yaml", original);
  auto updates = update_pins(m, {});
  ASSERT_TRUE(updates.ok()) << updates.status().message();
  const std::string sha = *sha256_file(t.root() / "plugins/libkreg_testgrp.so");
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_EQ((*updates)[0].sha256, sha);
  EXPECT_FALSE((*updates)[0].old_sha256.has_value());
  EXPECT_EQ(read_file(m),
            "# A manifest with comments.\nkreg_manifest: 1\nplugin_dir: plugins  # "
            "here\ngroups:\n  - name: testgrp\n    library: libkreg_testgrp.so  # "
            "the test group\n    sha256: " +
                sha + "\n    version: \"0.1.0\"\n");
  EXPECT_EQ((fs::status(m).permissions() & fs::perms(0777)), fs::perms(0644));
  auto again = update_pins(m, {});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
  EXPECT_TRUE(validate(m).ok());
}

// ---- The host: Registry::open applies the same guards ----

TEST(HostGuards, PinMismatchRefusesTheLoad) {
  Scratch t;
  const fs::path lib = t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const fs::path m =
      t.write("registry.yaml",
              manifest_text(t.root() / "plugins",
                            {{"testgrp", "libkreg_testgrp.so", "    sha256: " + kPinA + "\n"}}));
  auto manifest = load_manifest(m, {});
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  auto reg = Registry::open(*manifest);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), KREG_FAILED_PRECONDITION);
  EXPECT_NE(reg.status().message().find("expected " + kPinA + ", actual " + *sha256_file(lib)),
            std::string::npos)
      << reg.status().message();
  EXPECT_NE(reg.status().message().find("pinned at " + m.string() + ":6:13"), std::string::npos)
      << reg.status().message();
}

TEST(HostGuards, UnsafePathsAreRefusedBeforeLoading) {
  Scratch t;
  const fs::path outside = t.plugin("testgrp", "elsewhere/libkreg_testgrp.so");
  t.dir("plugins");
  fs::create_symlink(outside, t.root() / "plugins/libkreg_testgrp.so");
  auto manifest = load_manifest(
      t.write("registry.yaml",
              manifest_text(t.root() / "plugins", {{"testgrp", "libkreg_testgrp.so", ""}})),
      {});
  ASSERT_TRUE(manifest.ok());
  auto reg = Registry::open(*manifest);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), KREG_PERMISSION_DENIED);
  EXPECT_NE(reg.status().message().find("outside the plugin folder"), std::string::npos);

  // load_group without a plugin folder holds the library to its own folder.
  Registry r;
  const fs::path lib = t.plugin("testgrp", "mine/libkreg_testgrp.so");
  fs::permissions(lib, fs::perms(0777));
  GroupEntry e{"testgrp", "", lib};
  Status st = r.load_group(e);
  EXPECT_EQ(st.code(), KREG_PERMISSION_DENIED) << st.message();
  EXPECT_NE(st.message().find("writable by its group and all users"), std::string::npos);
  fs::permissions(lib, fs::perms(0755));
  EXPECT_TRUE(r.load_group(e).ok());
}

TEST(HostGuards, PrecheckInChildRefusesACrashingGroup) {
  // Without the pre-check, opening this manifest would kill the test process.
  Manifest m;
  GroupEntry crash{"testgrp", "", test_plugin("crash_segv_static")};
  m.groups.push_back(crash);
  OpenOptions o;
  o.precheck_in_child = true;
  auto reg = Registry::open(m, o);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), KREG_ABORTED);
  EXPECT_NE(reg.status().message().find("refused by the pre-check in a child process"),
            std::string::npos);
  EXPECT_NE(reg.status().message().find("killed by SIGSEGV"), std::string::npos)
      << reg.status().message();

  // A lazy group is pre-checked when first used, and a good group loads.
  Manifest lazy;
  GroupEntry hang{"testgrp", "", test_plugin("crash_hang_init")};
  hang.load = LoadMode::kLazy;
  lazy.groups.push_back(hang);
  o.precheck_timeout_s = kHangTimeout;
  auto lazy_reg = Registry::open(lazy, o);
  ASSERT_TRUE(lazy_reg.ok()) << lazy_reg.status().message();
  auto h = (*lazy_reg)->resolve("testgrp.noop", Target{DLDevice{kDLCPU, 0}, DType::kF32});
  ASSERT_FALSE(h.ok());
  const auto groups = (*lazy_reg)->groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_FALSE(groups[0].loaded);
  EXPECT_NE(groups[0].error.find("timed out after 0.5 s in its init hook"), std::string::npos)
      << groups[0].error;

  Manifest good;
  good.groups.push_back(GroupEntry{"testgrp", "", test_plugin("testgrp")});
  auto ok = Registry::open(good, o);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)->implementations("testgrp.scale").size(), 1u);
}

// ---- The real `kreg validate` ----

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `kreg validate ARGS` with KREG_PLUGIN_DIR set to `plugin_dir` (empty: unset).
CliRun kreg_validate(const std::vector<std::string>& args, const std::string& plugin_dir = "") {
  Scratch t;
  const fs::path err = t.root() / "stderr";
  std::string cmd = "KREG_PLUGIN_DIR=" + quote(plugin_dir) + " " + quote(KREG_CLI) + " validate";
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " 2>" + quote(err.string()) + " </dev/null";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err);
  return r;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The shipped manifest validates clean. The wall-time bound only tells finished from hung;
// how fast validate runs is measured by a benchmark (docs/validation.md: farm-bench), not
// asserted by a test.
TEST(Cli, ShippedRegistryExitsZero) {
  const std::string manifest = (fs::path(KREG_SOURCE_DIR) / "registry.yaml").string();
  const auto start = std::chrono::steady_clock::now();
  const CliRun human = kreg_validate({"--manifest", manifest}, KREG_PLUGIN_DIR);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(human.exit_code, 0) << human.out << human.err;
  EXPECT_TRUE(contains(human.out, "ok   library-loads      layernorm")) << human.out;
  EXPECT_TRUE(contains(human.out, " 0 failed")) << human.out;
  EXPECT_LT(took, test::budget(10.0))
      << "kreg validate on the default manifest took " << took << " s";

  const CliRun json = kreg_validate({"--manifest", manifest, "--json"}, KREG_PLUGIN_DIR);
  EXPECT_EQ(json.exit_code, 0) << json.out << json.err;
  for (const char* s : {"\"schema\":\"kreg.validate/1\"", "\"ok\":true", "\"exit_code\":0",
                        "\"violations\":[]", "\"pins_updated\":[]", "\"timeout_s\":10",
                        "{\"check\":\"groups-guard\",\"group\":\"\",\"passed\":true,"
                        "\"skipped\":false,\"note\":\"\"}",
                        "{\"check\":\"integrity\",\"group\":\"layernorm\",\"passed\":true,"
                        "\"skipped\":false,\"note\":\"not pinned\"}"}) {
    EXPECT_TRUE(contains(json.out, s)) << s << " not in " << json.out;
  }
}

// The real binary on files that crashed or exhausted the old symbol scan: it reports and
// exits 1, never dies of a signal.
TEST(Cli, HostileElfFilesExitOne) {
  Scratch t;
  t.dir("plugins");
  const fs::path wild = t.root() / "plugins" / "libkreg_wild.so";
  patch_testgrp(wild, [](std::string& b) {
    const auto sym = at<Elf64_Shdr>(b, section_header(b, ".symtab"));
    const uint32_t name = 0xfffffff0;
    for (uint64_t i = 1; i < sym.sh_size / sizeof(Elf64_Sym); ++i) {
      std::memcpy(b.data() + sym.sh_offset + i * sizeof(Elf64_Sym), &name, sizeof name);
    }
  });
  const fs::path huge = t.root() / "plugins" / "libkreg_huge.so";
  patch_testgrp(huge, [](std::string& b) {
    const uint64_t h = section_header(b, ".strtab");
    const uint64_t six_gb = uint64_t{6} << 30;
    std::memcpy(b.data() + h + offsetof(Elf64_Shdr, sh_size), &six_gb, sizeof six_gb);
  });
  const fs::path m = t.write(
      "registry.yaml", manifest_text(t.root() / "plugins", {{"alpha", "libkreg_wild.so", ""},
                                                            {"beta", "libkreg_huge.so", ""}}));
  const CliRun r = kreg_validate({"--manifest", m.string(), "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "has name offset 4294967280")) << r.out;
  EXPECT_TRUE(contains(r.out, "claims 6442450944 bytes")) << r.out;
}

TEST(Cli, CrashingAndHangingPluginsExitOne) {
  Scratch t;
  const fs::path m =
      t.write("registry.yaml",
              manifest_text(KREG_TEST_PLUGIN_DIR, {{"alpha", "libkreg_crash_segv_static.so", ""},
                                                   {"beta", "libkreg_crash_hang_static.so", ""},
                                                   {"testgrp", "libkreg_testgrp.so", ""}}));
  const CliRun r = kreg_validate({"--manifest", m.string(), "--json", "--timeout", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "\"exit_code\":1"));
  EXPECT_TRUE(contains(r.out, "{\"check\":\"library-loads\",\"group\":\"alpha\",\"where\":\"" +
                                  m.string() + ":5:14\",\"message\":\"plugin 'alpha' (" +
                                  test_plugin("crash_segv_static").string() +
                                  "): the child process loading it was killed by SIGSEGV"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "timed out after 1 s while loading the library")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"timeout_s\":1,"));
  // The good group after them was checked in full.
  EXPECT_TRUE(contains(r.out,
                       "{\"check\":\"reference-present\",\"group\":\"testgrp\","
                       "\"passed\":true"))
      << r.out;
}

TEST(Cli, UnsafeLibraryWrongPinAndUpdatePins) {
  Scratch t;
  const fs::path lib = t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const fs::path m = t.write("registry.yaml",
                             "# keep me\nkreg_manifest: 1\nplugin_dir: plugins\ngroups:\n"
                             "  - name: testgrp\n    library: libkreg_testgrp.so  # lib\n");
  fs::permissions(lib, fs::perms(0757));
  CliRun r = kreg_validate({"--manifest", m.string()});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "FAIL path-safety        testgrp")) << r.out;
  EXPECT_TRUE(contains(r.out, "error [path-safety] testgrp " + m.string() + ":6:14: library " +
                                  lib.string() + " is writable by all users (mode 0757)"))
      << r.out;
  fs::permissions(lib, fs::perms(0755));

  r = kreg_validate({"--manifest", m.string(), "--update-pins", "--json"});
  const std::string sha = *sha256_file(lib);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "pinned testgrp sha256 " + sha)) << r.err;
  EXPECT_TRUE(contains(r.out, "\"pins_updated\":[{\"group\":\"testgrp\",\"library\":\"" +
                                  lib.string() + "\",\"sha256\":\"" + sha + "\"}]"))
      << r.out;
  EXPECT_EQ(read_file(m),
            "# keep me\nkreg_manifest: 1\nplugin_dir: plugins\ngroups:\n"
            "  - name: testgrp\n    library: libkreg_testgrp.so  # lib\n"
            "    sha256: " +
                sha + "\n");

  t.write("registry.yaml",
          "kreg_manifest: 1\nplugin_dir: plugins\ngroups:\n  - name: testgrp\n"
          "    library: libkreg_testgrp.so\n    sha256: " +
              kPinA + "\n");
  r = kreg_validate({"--manifest", m.string(), "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "{\"check\":\"integrity\",\"group\":\"testgrp\",\"where\":\"" +
                                  m.string() + ":6:13\",\"message\":\"library " + lib.string() +
                                  " does not match its sha256 pin: expected " + kPinA +
                                  ", actual " + sha))
      << r.out;
}

TEST(Cli, ExpectedGroupsAndUsageErrors) {
  Scratch t;
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const fs::path m =
      t.write("registry.yaml",
              manifest_text(t.root() / "plugins", {{"testgrp", "libkreg_testgrp.so", ""}}));
  const fs::path list = t.write("groups.txt", "testgrp\nmoe\n");
  CliRun r = kreg_validate({"--manifest", m.string(), "--expect-groups", list.string()});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error [groups-guard] moe " + m.string() +
                                  ": group 'moe' is "
                                  "expected (" +
                                  list.string() + ") but the manifest does not list it"))
      << r.out;

  EXPECT_EQ(kreg_validate({"--manifest", (t.root() / "none.yaml").string()}).exit_code, 2);
  r = kreg_validate({"--manifest", m.string(), "--expect-groups", (t.root() / "no").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "cannot read the expected-groups file")) << r.err;
  r = kreg_validate({"--manifest", m.string(), "--plugins-src", (t.root() / "no").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "is not a folder")) << r.err;
  EXPECT_EQ(kreg_validate({"--manifest", m.string(), "--timeout", "-1"}).exit_code, 2);
}

// A manifest path that names no file, or a text built to hang the parser: exit 2 (cannot
// read) or 1 (schema) with the reason, at once, never a hang or an out-of-memory death.
TEST(Cli, ManifestThatIsNotARegularFileOrHangsTheParser) {
  Scratch t;
  const fs::path fifo = t.root() / "registry.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path comma = t.write("comma.yaml", ",");
  struct Case {
    std::string manifest;
    int exit_code;
    std::string expect;
  };
  for (const Case& c :
       {Case{"/dev/zero", 2, "cannot read the manifest /dev/zero: it is a character device"},
        Case{fifo.string(), 2,
             "cannot read the manifest " + fifo.string() + ": it is a FIFO (named pipe)"},
        Case{comma.string(), 1,
             comma.string() + ":1:1: YAML syntax error: ',' outside a flow collection"}}) {
    const auto start = std::chrono::steady_clock::now();
    const CliRun r = kreg_validate({"--manifest", c.manifest});
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, c.exit_code) << c.manifest << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.out + r.err, c.expect)) << c.expect << " not in\n" << r.out << r.err;
    EXPECT_LT(took, test::budget(2.0)) << c.manifest;
  }
}

}  // namespace
}  // namespace kreg

// ---- reference-present and its waivers ----

namespace kreg {
namespace {

TEST(Waivers, AnOpWithoutReferenceNeedsAWaiver) {
  Scratch t;
  t.plugin("no_reference", "plugins/libkreg_testgrp.so");
  const fs::path dir = t.root() / "plugins";
  const fs::path bare =
      t.write("bare.yaml", manifest_text(dir, {{"testgrp", "libkreg_testgrp.so", ""}}));
  expect_violation(validate(bare), "reference-present", "testgrp",
                   {"testgrp.gpu_only has no CPU reference implementation", "and no waiver"});

  const fs::path waived =
      t.write("waived.yaml",
              manifest_text(dir, {{"testgrp", "libkreg_testgrp.so", ""}},
                            "waivers:\n  - op: testgrp.gpu_only\n    check: reference-present\n"
                            "    reason: \"a GPU-only collective\"\n"));
  const ValidationReport ok = validate(waived);
  for (const Finding& f : ok.findings) {
    EXPECT_NE(f.check, "reference-present") << f.message;
  }
}

TEST(Waivers, StaleWaiversAreViolations) {
  Scratch t;
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const fs::path dir = t.root() / "plugins";
  const fs::path m = t.write(
      "stale.yaml", manifest_text(dir, {{"testgrp", "libkreg_testgrp.so", ""}},
                                  "waivers:\n  - op: testgrp.scale\n    check: reference-present\n"
                                  "    reason: \"old\"\n  - op: testgrp.gone\n"
                                  "    check: reference-present\n    reason: \"older\"\n"));
  const ValidationReport r = validate(m);
  expect_violation(r, "reference-present", "testgrp",
                   {"waiver for testgrp.scale is stale: it has a CPU reference"});
  expect_violation(r, "reference-present", "",
                   {"waiver for testgrp.gone: no loaded group registers this op"});
}

// ---- metadata-match and arch-coverage (SDK 1.2) ----

// A built test plugin with `from` replaced by `to` (same length) inside its metadata
// section only: the loaded descriptor's strings live elsewhere and stay as built.
std::string patched_metadata(const std::string& plugin, const std::string& from,
                             const std::string& to) {
  std::string bytes = read_file(test_plugin(plugin));
  EXPECT_EQ(from.size(), to.size());
  auto elf = ElfFile::from_memory(bytes, plugin);
  EXPECT_TRUE(elf.ok()) << elf.status().message();
  if (!elf.ok()) return bytes;
  auto section = elf->find_section(KREG_METADATA_SECTION);
  EXPECT_TRUE(section.ok()) << section.status().message();
  if (!section.ok()) return bytes;
  const size_t at = bytes.substr(section->offset, section->size).find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) bytes.replace(section->offset + at, from.size(), to);
  return bytes;
}

const CheckOutcome* outcome_of(const ValidationReport& r, const std::string& check,
                               const std::string& group) {
  for (const CheckOutcome& c : r.outcomes) {
    if (c.check == check && c.group == group) return &c;
  }
  return nullptr;
}

TEST_F(BrokenFile, MetadataAgreeingWithTheLibraryPasses) {
  t.plugin("testgrp", "plugins/libkreg_testgrp.so");
  const ValidationReport r = validate(manifest());
  EXPECT_TRUE(r.ok()) << dump(r);
  const CheckOutcome* c = outcome_of(r, "metadata-match", "testgrp");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->passed && !c->skipped) << c->note;
  EXPECT_TRUE(r.warnings.empty());
}

// One byte of a description changed in the section: the embedded metadata and the
// loaded descriptor disagree, and the finding says on what.
TEST_F(BrokenFile, MetadataDifferingFromTheLibraryIsAnError) {
  t.dir("plugins");
  t.write("plugins/libkreg_testgrp.so",
          patched_metadata("testgrp", "description=out =", "description=Out ="), 0755);
  const ValidationReport r = validate(manifest());
  expect_violation(r, "metadata-match", "testgrp",
                   {lib().string(), "testgrp.scale (cpu): description differs",
                    "metadata \"Out = alpha", "library \"out = alpha"});
  // The rest still passes: the metadata parsed, and the record checks ran on it.
  for (const char* check : {"library-loads", "op-naming", "schema", "reference-present"}) {
    const CheckOutcome* c = outcome_of(r, check, "testgrp");
    ASSERT_NE(c, nullptr) << check;
    EXPECT_TRUE(c->passed) << check;
  }
  size_t n = 0;
  for (const Finding& f : r.findings) n += f.check == "metadata-match";
  EXPECT_EQ(n, 1u) << dump(r);
}

// Metadata that does not parse is an error naming the offset and key; the record checks
// fall back to what the child read.
TEST_F(BrokenFile, MalformedMetadataIsAnError) {
  t.dir("plugins");
  t.write("plugins/libkreg_testgrp.so", patched_metadata("testgrp", "traits=", "traitz="), 0755);
  const ValidationReport r = validate(manifest());
  expect_violation(
      r, "metadata-match", "testgrp",
      {"embedded metadata cannot be read", "metadata byte", "'traitz'", "expected 'traits'"});
  const CheckOutcome* c = outcome_of(r, "reference-present", "testgrp");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->passed);
}

// A library built without the SDK 1.2 macros: a warning, not a violation.
TEST(MetadataMatch, LibraryWithoutMetadataIsAWarning) {
  Scratch t;
  const fs::path m = t.write(
      "registry.yaml", manifest_text(KREG_TEST_PLUGIN_DIR, {{"testgrp", "libkreg_no_entry.so", ""},
                                                            {"other", "libkreg_testgrp.so", ""}}));
  const ValidationReport r = validate(m);
  ASSERT_EQ(r.warnings.size(), 1u) << dump(r);
  EXPECT_EQ(r.warnings[0].check, "metadata-match");
  EXPECT_EQ(r.warnings[0].group, "testgrp");
  EXPECT_NE(r.warnings[0].message.find("has no embedded metadata"), std::string::npos)
      << r.warnings[0].message;
  const CheckOutcome* c = outcome_of(r, "metadata-match", "testgrp");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->passed);
  EXPECT_NE(c->note.find("no .kreg_metadata section"), std::string::npos) << c->note;
  for (const Finding& f : r.findings) EXPECT_NE(f.check, "metadata-match") << f.message;
}

// The record checks read the metadata: a plugin whose load crashes still has its ops
// named, its references checked, its sources compared.
TEST(MetadataMatch, RecordChecksRunOnTheMetadataWhenTheLoadFails) {
  Scratch t;
  const fs::path m = t.write(
      "registry.yaml",
      manifest_text(KREG_TEST_PLUGIN_DIR, {{"testgrp", "libkreg_crash_segv_static.so", ""}}));
  const ValidationReport r = validate(m);
  expect_violation(r, "library-loads", "testgrp", {"killed by SIGSEGV"});
  for (const char* check : {"op-naming", "no-test-ops", "schema", "reference-present"}) {
    const CheckOutcome* c = outcome_of(r, check, "testgrp");
    ASSERT_NE(c, nullptr) << check << " did not run\n" << dump(r);
    EXPECT_TRUE(c->passed) << check;
  }
  const CheckOutcome* mm = outcome_of(r, "metadata-match", "testgrp");
  ASSERT_NE(mm, nullptr);
  EXPECT_TRUE(mm->skipped) << "nothing loaded to compare with";
  EXPECT_GT(r.ops, 0u);
}

TEST(MetadataMatch, DifferencesOfASnapshot) {
  auto meta = read_plugin_metadata(test_plugin("testgrp"));
  ASSERT_TRUE(meta.ok()) << meta.status().message();
  PluginSnapshot snap;
  snap.info = meta->info;
  for (const KernelSpec& k : meta->kernels) {
    snap.kernels.push_back({k.op, k.backend, k.signature.text, dtype_set_name(k.dtypes),
                            k.capabilities, k.traits, k.priority, k.flags, k.description,
                            k.provenance.source_file});
  }
  EXPECT_TRUE(metadata_differences(*meta, snap).empty());
  snap.kernels[1].signature = "fail(Tensor x, int code, int extra=0) -> ()";
  snap.kernels[0].dtypes = "f16";
  const auto diff = metadata_differences(*meta, snap);
  ASSERT_EQ(diff.size(), 3u);  // testgrp.scale's dtypes; fail's signature and arg kinds
  EXPECT_NE(diff[0].find("testgrp.scale (cpu): dtypes differs: metadata \"f32\", library \"f16\""),
            std::string::npos)
      << diff[0];
  EXPECT_NE(diff[1].find("testgrp.fail (cpu): signature differs"), std::string::npos) << diff[1];
  EXPECT_NE(diff[2].find("testgrp.fail (cpu): arg kinds differs: metadata \"Ti\", library \"Tii\""),
            std::string::npos)
      << diff[2];
}

// arch-coverage's core on in-process specs: a claim the images do not cover is an error
// naming the op, the SM and the images; a claim from the build is narrowed, not an error;
// CPU implementations are not looked at.
KernelSpec cuda_spec(const std::string& op, int32_t lo, int32_t hi, uint32_t flags) {
  KernelSpec s;
  s.op = op;
  s.backend = "cuda";
  s.capabilities = {Capability{kDLCUDA, lo, hi}};
  s.flags = flags;
  return s;
}

TEST(ArchCoverage, ClaimsAgainstImages) {
  CudaImages images;
  images.has_fatbin = true;
  images.images = {CudaImage{CudaImage::Kind::kSass, 80}, CudaImage{CudaImage::Kind::kSass, 90}};
  KernelSpec cpu;
  cpu.op = "grp.ref";
  cpu.backend = "cpu";
  cpu.capabilities = {Capability{kDLCPU, 0, 0}};
  const std::vector<KernelSpec> kernels = {
      cpu,
      cuda_spec("grp.covered", 80, 90, 0),
      cuda_spec("grp.too_old", 75, 90, 0),
      cuda_spec("grp.from_build", 75, 121, KREG_KERNEL_CAPS_FROM_BUILD),
  };
  const auto problems = arch_coverage_problems(kernels, images, "/x/libkreg_grp.so");
  ASSERT_EQ(problems.size(), 1u) << (problems.empty() ? "" : problems[0]);
  for (const char* want : {"grp.too_old (cuda)", "sm_75", "/x/libkreg_grp.so", "sm_80, sm_90"}) {
    EXPECT_NE(problems[0].find(want), std::string::npos) << want << " in " << problems[0];
  }
  // The caller's specs are not narrowed.
  EXPECT_EQ(kernels[3].capabilities[0].sm_min, 75);
  // No fatbinary at all: every CUDA claim is an error, CPU still ignored.
  const auto none = arch_coverage_problems(kernels, CudaImages{}, "/x/libkreg_grp.so");
  EXPECT_EQ(none.size(), 3u);
  EXPECT_TRUE(arch_coverage_problems({cpu}, CudaImages{}, "/x/libkreg_grp.so").empty());
}

TEST(ArchCoverage, CpuOnlyLibraryPassesWithANote) {
  Scratch t;
  const fs::path m =
      t.write("registry.yaml",
              manifest_text(KREG_TEST_PLUGIN_DIR, {{"testgrp", "libkreg_testgrp.so", ""}}));
  const ValidationReport r = validate(m);
  const CheckOutcome* c = outcome_of(r, "arch-coverage", "testgrp");
  ASSERT_NE(c, nullptr) << dump(r);
  EXPECT_TRUE(c->passed && !c->skipped);
  EXPECT_EQ(c->note, "no CUDA implementations");
}

}  // namespace
}  // namespace kreg
