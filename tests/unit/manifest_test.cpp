// The manifest parser: every bad fixture in tests/fixtures/manifests/bad carries its own
// expectations (`# expect: <substring>` lines and `# expect-count: N`), so adding a file there
// adds a test case. The good manifests and the resolution rules are tested directly below.
#include "kreg/manifest.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "time_budget.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kreg {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(KREG_TEST_FIXTURES) / "manifests";
const fs::path kFixtureLibs = (kFixtures / "libs").lexically_normal();

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

ManifestOptions no_file_checks() {
  ManifestOptions options;
  options.check_files = false;
  return options;
}

size_t count_lines(const std::string& s) {
  return s.empty() ? 0 : static_cast<size_t>(std::count(s.begin(), s.end(), '\n')) + 1;
}

// Sets an environment variable for one test and restores the previous value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// ---- Bad manifests, one test per fixture file ----

struct BadFixture {
  fs::path path;
  std::vector<std::string> expects;
  int expect_count = -1;
};

BadFixture read_fixture(const fs::path& path) {
  BadFixture fixture{path};
  std::istringstream lines(read_text(path));
  const std::string kExpect = "# expect: ";
  const std::string kCount = "# expect-count: ";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(kExpect, 0) == 0) fixture.expects.push_back(line.substr(kExpect.size()));
    if (line.rfind(kCount, 0) == 0) fixture.expect_count = std::stoi(line.substr(kCount.size()));
  }
  return fixture;
}

std::vector<fs::path> bad_fixture_paths() {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(kFixtures / "bad")) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") {
      paths.push_back(entry.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

class BadManifestTest : public testing::TestWithParam<fs::path> {};

TEST_P(BadManifestTest, ReportsExpectedDiagnostics) {
  const BadFixture fixture = read_fixture(GetParam());
  ASSERT_FALSE(fixture.expects.empty()) << fixture.path << " has no '# expect: ' line";
  ASSERT_GT(fixture.expect_count, 0) << fixture.path << " has no '# expect-count: ' line";

  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> result = load_manifest(fixture.path, ManifestOptions{}, &diagnostics);
  ASSERT_FALSE(result.ok()) << fixture.path << " was accepted";
  EXPECT_EQ(result.status().code(), KREG_INVALID_ARGUMENT);
  const std::string& message = result.status().message();
  for (const std::string& expected : fixture.expects) {
    EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in:\n"
                                                         << message;
  }
  EXPECT_EQ(diagnostics.size(), static_cast<size_t>(fixture.expect_count)) << message;
  EXPECT_EQ(count_lines(message), diagnostics.size()) << message;
  for (const ManifestDiagnostic& d : diagnostics) {
    EXPECT_EQ(d.where.file, fixture.path.string());
    EXPECT_GT(d.where.line, 0) << d.to_string();
    EXPECT_GT(d.where.column, 0) << d.to_string();
    EXPECT_NE(message.find(d.to_string()), std::string::npos) << d.to_string();
  }

  // Parsing the same text under the same name must report exactly the same.
  Result<Manifest> from_text =
      parse_manifest(read_text(fixture.path), fixture.path, ManifestOptions{});
  ASSERT_FALSE(from_text.ok());
  EXPECT_EQ(from_text.status().message(), message);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BadManifestTest, testing::ValuesIn(bad_fixture_paths()),
                         [](const testing::TestParamInfo<fs::path>& info) {
                           return info.param.stem().string();
                         });

TEST(BadManifestFixtures, CoverAtLeastTwentyCases) {
  // Guards against the parameterised suite silently running nothing (wrong fixture path).
  EXPECT_GE(bad_fixture_paths().size(), 20u);
}

// ---- Good manifests ----

TEST(Manifest, DefaultRegistryParses) {
  const fs::path file = fs::path(KREG_SOURCE_DIR) / "registry.yaml";
  Result<Manifest> m = load_manifest(file, no_file_checks());
  ASSERT_TRUE(m.ok()) << m.status().message();

  const fs::path source = fs::path(KREG_SOURCE_DIR).lexically_normal();
  EXPECT_EQ(m->file, file.lexically_normal());
  EXPECT_EQ(m->plugin_dir, source / "build" / "plugins");
  // One entry per plugin folder (the groups guard of kreg validate checks the rest).
  std::vector<std::string> folders;
  for (const auto& d : fs::directory_iterator(source / "plugins")) {
    if (d.is_directory()) folders.push_back(d.path().filename().string());
  }
  ASSERT_EQ(m->groups.size(), folders.size());
  for (size_t i = 0; i < m->groups.size(); ++i) {
    const GroupEntry& g = m->groups[i];
    const std::string library = "libkreg_" + g.name + ".so";
    EXPECT_NE(std::find(folders.begin(), folders.end(), g.name), folders.end()) << g.name;
    EXPECT_EQ(g.library_spec, library);
    EXPECT_EQ(g.library, source / "build" / "plugins" / library);
    EXPECT_TRUE(g.enabled);
    EXPECT_EQ(g.version, "0.1.0");
    EXPECT_EQ(g.load, LoadMode::kEager);
    EXPECT_FALSE(g.sha256.has_value());
    EXPECT_GT(g.where.line, 0);
    EXPECT_GT(g.library_where.line, g.where.line);
  }
  ASSERT_EQ(m->aliases.size(), 1u);
  EXPECT_EQ(m->aliases[0].from, "activation.silu_mul");
  EXPECT_EQ(m->aliases[0].to, "activation.silu_and_mul");
  EXPECT_NE(m->aliases[0].message.find("activation.silu_and_mul"), std::string::npos);

  ASSERT_NE(m->find_group("activation"), nullptr);
  EXPECT_EQ(m->find_group("activation")->name, "activation");
  EXPECT_EQ(m->find_group("softmax"), nullptr);
}

TEST(Manifest, FullManifestWithFileChecks) {
  Result<Manifest> m = load_manifest(kFixtures / "good" / "full.yaml", ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->plugin_dir, kFixtureLibs);
  ASSERT_EQ(m->groups.size(), 2u);

  const GroupEntry* layernorm = m->find_group("layernorm");
  ASSERT_NE(layernorm, nullptr);
  EXPECT_EQ(layernorm->load, LoadMode::kEager);
  EXPECT_EQ(layernorm->sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(layernorm->where.line, 5);
  EXPECT_EQ(layernorm->where.column, 5);
  EXPECT_EQ(layernorm->library_where.line, 6);
  EXPECT_EQ(layernorm->library_where.column, 14);

  const GroupEntry* activation = m->find_group("activation");
  ASSERT_NE(activation, nullptr);
  EXPECT_EQ(activation->load, LoadMode::kLazy);
  EXPECT_TRUE(activation->enabled);
  EXPECT_EQ(activation->version, "0.2.0-rc1");
  EXPECT_FALSE(activation->sha256.has_value());
  EXPECT_EQ(activation->library_spec, "./libfixture_b.so");
  EXPECT_EQ(activation->library, kFixtureLibs / "libfixture_b.so");

  ASSERT_EQ(m->aliases.size(), 2u);
  EXPECT_EQ(m->aliases[0].message, "renamed; use layernorm.rmsnorm");
  EXPECT_EQ(m->aliases[1].message, "");
  EXPECT_EQ(m->aliases[1].where.line, 19);
}

TEST(Manifest, MinimalManifestUsesDefaults) {
  Result<Manifest> m = load_manifest(kFixtures / "good" / "minimal.yaml", ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->plugin_dir, (kFixtures / "good" / "build" / "plugins").lexically_normal());
  EXPECT_TRUE(m->groups.empty());
  EXPECT_TRUE(m->aliases.empty());
}

TEST(Manifest, DisabledGroupWithMissingLibraryIsKeptAndNotChecked) {
  Result<Manifest> m =
      load_manifest(kFixtures / "good" / "disabled_missing.yaml", ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->groups.size(), 2u);
  const GroupEntry* experimental = m->find_group("experimental");
  ASSERT_NE(experimental, nullptr);
  EXPECT_FALSE(experimental->enabled);
  EXPECT_FALSE(fs::exists(experimental->library));

  // The same group enabled is an error: the check really looks at the file.
  std::string text = read_text(kFixtures / "good" / "disabled_missing.yaml");
  const std::string disabled = "    enabled: false\n";
  text.replace(text.find(disabled), disabled.size(), "    enabled: true\n");
  Result<Manifest> enabled =
      parse_manifest(text, kFixtures / "good" / "disabled_missing.yaml", ManifestOptions{});
  ASSERT_FALSE(enabled.ok());
  EXPECT_NE(enabled.status().message().find("groups[1].library: library file not found: " +
                                            (kFixtureLibs / "libkreg_experimental.so").string()),
            std::string::npos)
      << enabled.status().message();
}

TEST(Manifest, RelativePathsResolveFromTheManifestDirectory) {
  const std::string text =
      "kreg_manifest: 1\n"
      "plugin_dir: ../out/./plugins/\n"
      "groups:\n"
      "  - name: a\n"
      "    library: sub/../liba.so\n"
      "  - name: b\n"
      "    library: /opt/kreg/libb.so\n";
  Result<Manifest> m = parse_manifest(text, "/srv/kreg/conf/registry.yaml", no_file_checks());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->file, fs::path("/srv/kreg/conf/registry.yaml"));
  EXPECT_EQ(m->plugin_dir, fs::path("/srv/kreg/out/plugins"));
  EXPECT_EQ(m->groups[0].library_spec, "sub/../liba.so");
  EXPECT_EQ(m->groups[0].library, fs::path("/srv/kreg/out/plugins/liba.so"));
  EXPECT_EQ(m->groups[1].library, fs::path("/opt/kreg/libb.so"));

  // A manifest named by a relative path resolves against the working directory.
  Result<Manifest> rel = parse_manifest(text, "conf/registry.yaml", no_file_checks());
  ASSERT_TRUE(rel.ok()) << rel.status().message();
  EXPECT_EQ(rel->file, fs::current_path() / "conf" / "registry.yaml");
  EXPECT_EQ(rel->plugin_dir, fs::current_path() / "out" / "plugins");
  EXPECT_TRUE(rel->plugin_dir.is_absolute());
}

TEST(Manifest, AbsolutePluginDirIsKept) {
  Result<Manifest> m = parse_manifest(
      "kreg_manifest: 1\nplugin_dir: /usr/lib/kreg\ngroups:\n  - name: a\n    library: liba.so\n",
      "/srv/registry.yaml", no_file_checks());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->plugin_dir, fs::path("/usr/lib/kreg"));
  EXPECT_EQ(m->groups[0].library, fs::path("/usr/lib/kreg/liba.so"));
}

TEST(Manifest, PluginDirOverrideReplacesTheManifestsDirectory) {
  const std::string text =
      "kreg_manifest: 1\n"
      "plugin_dir: does/not/exist\n"
      "groups:\n"
      "  - name: layernorm\n"
      "    library: libfixture_a.so\n";
  const fs::path file = kFixtures / "good" / "inline.yaml";
  ASSERT_FALSE(parse_manifest(text, file, ManifestOptions{}).ok());

  ManifestOptions options;
  options.plugin_dir_override = kFixtureLibs;
  Result<Manifest> m = parse_manifest(text, file, options);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->plugin_dir, kFixtureLibs);
  EXPECT_EQ(m->groups[0].library, kFixtureLibs / "libfixture_a.so");

  // A relative override is the user's, so it resolves from the working directory.
  ManifestOptions relative = no_file_checks();
  relative.plugin_dir_override = fs::path("my/plugins");
  Result<Manifest> r = parse_manifest(text, "/elsewhere/registry.yaml", relative);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->plugin_dir, fs::current_path() / "my" / "plugins");
  EXPECT_EQ(r->groups[0].library, fs::current_path() / "my" / "plugins" / "libfixture_a.so");
}

TEST(Manifest, OptionsFromEnvironment) {
  {
    ScopedEnv env("KREG_PLUGIN_DIR", nullptr);
    ManifestOptions options = manifest_options_from_env();
    EXPECT_FALSE(options.plugin_dir_override.has_value());
    EXPECT_TRUE(options.check_files);
  }
  {
    ScopedEnv env("KREG_PLUGIN_DIR", "");
    EXPECT_FALSE(manifest_options_from_env().plugin_dir_override.has_value());
  }
  {
    ScopedEnv env("KREG_PLUGIN_DIR", kFixtureLibs.c_str());
    ManifestOptions options = manifest_options_from_env();
    ASSERT_TRUE(options.plugin_dir_override.has_value());
    EXPECT_EQ(*options.plugin_dir_override, kFixtureLibs);

    // End to end: the default registry's groups resolve into the overriding folder.
    Result<Manifest> m = load_manifest(fs::path(KREG_SOURCE_DIR) / "registry.yaml",
                                       ManifestOptions{options.plugin_dir_override, false});
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->plugin_dir, kFixtureLibs);
    EXPECT_EQ(m->groups[0].library, kFixtureLibs / "libkreg_layernorm.so");
  }
}

TEST(Manifest, AliasChainsWithoutCyclesAreAccepted) {
  Result<Manifest> m = parse_manifest(
      "kreg_manifest: 1\ngroups: []\naliases:\n"
      "  - {from: a.x, to: a.y}\n"
      "  - {from: a.y, to: a.z}\n",
      "/srv/registry.yaml", no_file_checks());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->aliases.size(), 2u);
}

TEST(Manifest, LongerAliasCycleIsReportedOnce) {
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = parse_manifest(
      "kreg_manifest: 1\ngroups: []\naliases:\n"
      "  - {from: a.x, to: a.y}\n"
      "  - {from: a.y, to: a.z}\n"
      "  - {from: a.z, to: a.x}\n",
      "/srv/registry.yaml", no_file_checks(), &diagnostics);
  ASSERT_FALSE(m.ok());
  ASSERT_EQ(diagnostics.size(), 1u) << m.status().message();
  EXPECT_EQ(diagnostics[0].key, "aliases[0]");
  EXPECT_EQ(diagnostics[0].message, "alias cycle: a.x -> a.y -> a.z -> a.x");
}

// ---- Diagnostics ----

TEST(Manifest, CollectsEveryDiagnosticInFileOrder) {
  const std::string text =
      "kreg_manifest: 1\n"
      "groups:\n"
      "  - name: layernorm\n"
      "    library: liba.so\n"
      "    load: sometimes\n"  // 1: bad load mode
      "  - name: layernorm\n"  // 2: duplicate group
      "    library: libb.so\n"
      "aliases:\n"
      "  - from: rmsnorm\n"  // 3: not group.name
      "    to: layernorm.rmsnorm\n";
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = parse_manifest(text, "reg.yaml", no_file_checks(), &diagnostics);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), KREG_INVALID_ARGUMENT);
  ASSERT_EQ(diagnostics.size(), 3u) << m.status().message();
  EXPECT_EQ(diagnostics[0].key, "groups[0].load");
  EXPECT_EQ(diagnostics[0].where.line, 5);
  EXPECT_EQ(diagnostics[0].where.column, 11);
  EXPECT_EQ(diagnostics[1].key, "groups[1].name");
  EXPECT_EQ(diagnostics[1].where.line, 6);
  EXPECT_NE(diagnostics[1].message.find("reg.yaml:3:5"), std::string::npos);
  EXPECT_NE(diagnostics[1].message.find("reg.yaml:6:5"), std::string::npos);
  EXPECT_EQ(diagnostics[2].key, "aliases[0].from");
  EXPECT_EQ(diagnostics[2].where.line, 9);
  EXPECT_EQ(m.status().message(), diagnostics[0].to_string() + "\n" + diagnostics[1].to_string() +
                                      "\n" + diagnostics[2].to_string());
}

TEST(Manifest, DiagnosticsAreAppendedNotReplaced) {
  std::vector<ManifestDiagnostic> diagnostics(1);
  ASSERT_FALSE(
      parse_manifest("kreg_manifest: 3\ngroups: []\n", "x.yaml", no_file_checks(), &diagnostics)
          .ok());
  EXPECT_EQ(diagnostics.size(), 2u);
  EXPECT_EQ(diagnostics[1].key, "kreg_manifest");
}

TEST(Manifest, UnreadableFileIsNotFound) {
  const fs::path missing = kFixtures / "no_such_manifest.yaml";
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = load_manifest(missing, ManifestOptions{}, &diagnostics);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(m.status().message().find(missing.string()), std::string::npos) << m.status().message();
  ASSERT_EQ(diagnostics.size(), 1u);
  EXPECT_EQ(diagnostics[0].where.line, 0);

  Result<Manifest> dir = load_manifest(kFixtures, ManifestOptions{});
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(dir.status().message().find("directory"), std::string::npos);
}

TEST(Manifest, EmptyTextIsAnError) {
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = parse_manifest("", "empty.yaml", ManifestOptions{}, &diagnostics);
  ASSERT_FALSE(m.ok());
  ASSERT_EQ(diagnostics.size(), 1u);
  EXPECT_EQ(m.status().message(),
            "empty.yaml:1:1: the manifest is empty; expected a map with 'kreg_manifest' and "
            "'groups' (see docs/manifest.md)");
}

TEST(Manifest, OnlyYaml12BooleansAreAccepted) {
  for (const char* value : {"yes", "no", "on", "off", "y", "1", "\"false\""}) {
    const std::string text = std::string("kreg_manifest: 1\ngroups:\n  - name: a\n") +
                             "    library: liba.so\n    enabled: " + value + "\n";
    Result<Manifest> m = parse_manifest(text, "b.yaml", no_file_checks());
    ASSERT_FALSE(m.ok()) << value;
    EXPECT_NE(m.status().message().find("b.yaml:5:14: groups[0].enabled: expected a boolean"),
              std::string::npos)
        << m.status().message();
  }
  for (const char* value : {"false", "False", "FALSE", "!!bool false"}) {
    const std::string text = std::string("kreg_manifest: 1\ngroups:\n  - name: a\n") +
                             "    library: liba.so\n    enabled: " + value + "\n";
    Result<Manifest> m = parse_manifest(text, "b.yaml", no_file_checks());
    ASSERT_TRUE(m.ok()) << value << ": " << m.status().message();
    EXPECT_FALSE(m->groups[0].enabled);
  }
}

TEST(Manifest, NeverThrows) {
  const std::vector<std::string> inputs = {
      std::string("\0\xff\xfe", 3),
      "{{{",
      "[",
      "kreg_manifest: 1\ngroups: *undefined_anchor\n",
      "kreg_manifest: 1\ngroups:\n  - ? [complex, key]\n    : 1\n",
      "kreg_manifest: !!binary AAAA\ngroups: []\n",
      "kreg_manifest: 1\ngroups: [" + std::string(5000, '[') + "\n",
      std::string(100000, '-'),
  };
  for (const std::string& input : inputs) {
    EXPECT_NO_THROW({
      Result<Manifest> m = parse_manifest(input, "fuzz.yaml", ManifestOptions{});
      EXPECT_FALSE(m.ok()) << input.substr(0, 40);
      EXPECT_FALSE(m.status().message().empty());
    });
  }
}

// ---- Hardening: files that are not manifests, and texts built to hurt the parser ----

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Parses `text` and checks it fails within a second (the parse of a hostile text must be
// bounded) with a message that contains `expected` (location and text).
void expect_rejected_quickly(const std::string& text, const std::string& expected,
                             const std::string& label) {
  SCOPED_TRACE(label);
  std::vector<ManifestDiagnostic> diagnostics;
  const auto t0 = Clock::now();
  Result<Manifest> m = parse_manifest(text, "h.yaml", no_file_checks(), &diagnostics);
  const double elapsed = seconds_since(t0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), KREG_INVALID_ARGUMENT);
  EXPECT_LT(elapsed, test::budget(1.0));
  EXPECT_NE(m.status().message().find(expected), std::string::npos)
      << "expected '" << expected << "' in:\n"
      << m.status().message().substr(0, 2000);
  EXPECT_LE(diagnostics.size(), 51u);
  EXPECT_LT(m.status().message().size(), 20000u);
}

TEST(ManifestFiles, DevZeroIsRefusedWithoutReading) {
  const auto t0 = Clock::now();
  Result<Manifest> m = load_manifest("/dev/zero", ManifestOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_LT(seconds_since(t0), test::budget(1.0));
  EXPECT_EQ(m.status().code(), KREG_NOT_FOUND);
  EXPECT_EQ(m.status().message(),
            "cannot read the manifest /dev/zero: it is a character device, not a regular file");
}

TEST(ManifestFiles, FifoIsRefusedWithoutBlocking) {
  test::Scratch dir;
  ASSERT_FALSE(dir.root().empty());
  const fs::path fifo = dir.root() / "registry.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = Clock::now();
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = load_manifest(fifo, ManifestOptions{}, &diagnostics);
  ASSERT_FALSE(m.ok());
  EXPECT_LT(seconds_since(t0), test::budget(1.0));
  EXPECT_EQ(m.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(m.status().message().find("cannot read the manifest " + fifo.string() +
                                      ": it is a FIFO (named pipe), not a regular file"),
            std::string::npos)
      << m.status().message();
  ASSERT_EQ(diagnostics.size(), 1u);
  EXPECT_EQ(diagnostics[0].where.file, fifo.string());
}

TEST(ManifestFiles, DirectoryIsNamedAsSuch) {
  Result<Manifest> m = load_manifest(kFixtures, ManifestOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(m.status().message().find("it is a directory, not a regular file"), std::string::npos)
      << m.status().message();
}

TEST(ManifestFiles, OversizedFileIsRefusedBeforeReading) {
  test::Scratch dir;
  const fs::path big = dir.root() / "big.yaml";
  { std::ofstream(big) << "kreg_manifest: 1\ngroups: []\n"; }
  // Sparse: a gigabyte costs nothing on disk and would cost a gigabyte to read.
  fs::resize_file(big, uint64_t{1} << 30);
  const auto t0 = Clock::now();
  Result<Manifest> m = load_manifest(big, ManifestOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_LT(seconds_since(t0), test::budget(1.0));
  EXPECT_NE(m.status().message().find("it is 1073741824 bytes; the limit for a manifest is " +
                                      std::to_string(kMaxManifestBytes) + " bytes"),
            std::string::npos)
      << m.status().message();
  fs::resize_file(big, kMaxManifestBytes + 1);
  EXPECT_FALSE(load_manifest(big, ManifestOptions{}).ok());
  // Text handed to the parser directly is held to the same cap.
  Result<Manifest> text =
      parse_manifest(std::string(kMaxManifestBytes + 1, '#'), "t.yaml", no_file_checks());
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(), "t.yaml:1:1: the manifest is " +
                                         std::to_string(kMaxManifestBytes + 1) +
                                         " bytes; the limit for a manifest is " +
                                         std::to_string(kMaxManifestBytes) + " bytes");
}

TEST(ManifestFiles, LargeButSaneFileIsRead) {
  // 340 KB of comments around a valid manifest: under the cap, parsed as usual.
  test::Scratch dir;
  const fs::path file = dir.root() / "registry.yaml";
  {
    std::ofstream out(file);
    out << "kreg_manifest: 1\ngroups: []\n";
    for (int i = 0; i < 3400; ++i) out << "# " << std::string(97, 'c') << "\n";
  }
  ASSERT_GT(fs::file_size(file), 340000u);
  Result<Manifest> m = load_manifest(file, ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
}

TEST(ManifestFiles, ReadManifestFileReadsRegularFiles) {
  Result<std::string> text = read_manifest_file(kFixtures / "good" / "minimal.yaml");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_NE(text->find("kreg_manifest"), std::string::npos);
  Result<std::string> missing = read_manifest_file(kFixtures / "nope.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(missing.status().message().find("nope.yaml: no such file"), std::string::npos)
      << missing.status().message();
}

// yaml-cpp's LoadAll spins forever (allocating) on a ',' no node consumes (yaml-cpp#1040).
TEST(ManifestParser, StrayCommaIsASyntaxErrorNotAHang) {
  const std::string msg = "YAML syntax error: ',' outside a flow collection";
  expect_rejected_quickly(",", "h.yaml:1:1: " + msg, "lone comma");
  expect_rejected_quickly(",\n", "h.yaml:1:1: " + msg, "comma line");
  expect_rejected_quickly(", , ,", "h.yaml:1:1: " + msg, "commas");
  expect_rejected_quickly("# c\n\n  ,", "h.yaml:3:3: " + msg, "after comments");
  // After a block map yaml-cpp itself reports the comma.
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n,\n", "h.yaml:3:1: YAML syntax error",
                          "after the document");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n, {a: [b}",
                          "h.yaml:3:1: YAML syntax error", "junk after the comma");
  expect_rejected_quickly("[a]\n,", "h.yaml:2:1: " + msg, "after a flow sequence");
  expect_rejected_quickly("\"quoted\"\n, ,", "h.yaml:2:1: " + msg, "after a scalar");
  expect_rejected_quickly("--- ,", "h.yaml:1:5: " + msg, "after a document marker");
  expect_rejected_quickly("!tag ,", "h.yaml:1:6: " + msg, "after a tag");
  expect_rejected_quickly("&a ,", "h.yaml:1:4: " + msg, "after an anchor");
  // The same texts through the pin rewriter, which reads the file before editing it.
  for (const char* text : {",", "kreg_manifest: 1\ngroups: []\n,\n"}) {
    Result<std::string> r = rewrite_manifest_pins(text, {{"a", std::string(64, 'a')}});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("does not parse"), std::string::npos)
        << r.status().message();
  }
}

TEST(ManifestParser, FlowSyntaxErrorsEndQuickly) {
  // The flow-context inputs that made older yaml-cpp loop, and their neighbours.
  for (const char* text : {"[:",
                           "{:",
                           "[",
                           "{",
                           "]",
                           "}",
                           "- !+(.,.)",
                           "[,",
                           "{,",
                           "[?",
                           "{? ,",
                           "[a,,]",
                           "{a: b,, c: d}",
                           "[{]",
                           "- [,\n- ,",
                           "? ,\n: ,",
                           ":,",
                           "-,",
                           "[!a ,]",
                           "{&x ,}",
                           "[*x]",
                           "{[: {[: ,"}) {
    expect_rejected_quickly(text, "h.yaml:", text);
  }
}

TEST(ManifestParser, AnchoredScalarUsedThousandsOfTimesGivesBoundedMessages) {
  // 200 KB scalar, anchored once and used 20 000 times: quoting it whole in each message
  // would build 4 GB of text.
  std::string text = "kreg_manifest: 1\nx: &big \"" + std::string(200000, 'a') + "\"\ngroups:\n";
  for (int i = 0; i < 20000; ++i) text += "- *big\n";
  ASSERT_GT(text.size(), 300000u);
  ASSERT_LT(text.size(), kMaxManifestBytes);
  std::vector<ManifestDiagnostic> diagnostics;
  const auto t0 = Clock::now();
  Result<Manifest> m = parse_manifest(text, "big.yaml", no_file_checks(), &diagnostics);
  EXPECT_LT(seconds_since(t0), test::budget(2.0));
  ASSERT_FALSE(m.ok());
  const std::string& message = m.status().message();
  EXPECT_LT(message.size(), 20000u);
  // 'x' is an unknown key, then one problem per alias: 50 shown, the rest counted.
  ASSERT_EQ(diagnostics.size(), 51u) << message.substr(0, 2000);
  EXPECT_NE(message.find("big.yaml:2:1: x: unknown key 'x'"), std::string::npos)
      << message.substr(0, 2000);
  // Each use is reported where the alias stands, the value cut to an excerpt.
  EXPECT_NE(message.find("big.yaml:4:3: groups[0]: expected a group (a map with name and "
                         "library), got the string \"" +
                         std::string(80, 'a') + "... (200000 bytes)\""),
            std::string::npos)
      << message.substr(0, 2000);
  EXPECT_NE(message.find("... and 19951 more problems not shown"), std::string::npos)
      << message.substr(message.size() - 500);
  EXPECT_EQ(diagnostics.back().where.line, 53);
  EXPECT_EQ(count_lines(message), diagnostics.size());
}

TEST(ManifestParser, ManyDistinctProblemsAreCountedBeyondFifty) {
  std::string text = "kreg_manifest: 1\ngroups: []\n";
  for (int i = 0; i < 200; ++i) text += "unknown_" + std::to_string(i) + ": 1\n";
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = parse_manifest(text, "u.yaml", no_file_checks(), &diagnostics);
  ASSERT_FALSE(m.ok());
  ASSERT_EQ(diagnostics.size(), 51u);
  EXPECT_EQ(diagnostics[0].key, "unknown_0");
  EXPECT_EQ(diagnostics[49].key, "unknown_49");
  EXPECT_EQ(diagnostics[50].to_string(),
            "u.yaml:53:1: ... and 150 more problems not shown (the first of them here); fix "
            "these and run again");
}

TEST(ManifestParser, LongValuesAreRefusedAndQuotedShort) {
  const std::string lib(5000, 'l');
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m =
      parse_manifest("kreg_manifest: 1\ngroups:\n  - name: a\n    library: " + lib + "\n? " +
                         std::string(5000, 'k') + "\n: 1\n",
                     "l.yaml", no_file_checks(), &diagnostics);
  ASSERT_FALSE(m.ok());
  ASSERT_EQ(diagnostics.size(), 2u) << m.status().message();
  EXPECT_EQ(diagnostics[0].to_string(),
            "l.yaml:4:14: groups[0].library: the value is 5000 bytes; the limit is 4096 ('" +
                std::string(80, 'l') + "... (5000 bytes)')");
  EXPECT_EQ(diagnostics[1].to_string(),
            "l.yaml:5:3: invalid key: the value is 5000 bytes; the limit is 4096 ('" +
                std::string(80, 'k') + "... (5000 bytes)')");
  // Lines themselves may be long: a 200 KB comment is no problem.
  Result<Manifest> ok =
      parse_manifest("# " + std::string(200000, 'c') + "\nkreg_manifest: 1\ngroups: []\n", "c.yaml",
                     no_file_checks());
  EXPECT_TRUE(ok.ok()) << ok.status().message().substr(0, 500);
}

TEST(ManifestParser, NulBytesAreNamedWithTheirPlace) {
  // A raw NUL anywhere in the file: named, not cut off at.
  std::string text =
      std::string("kreg_manifest: 1\ngroups:\n  - name: a\0b\n    library: x\0\0.so\n", 59);
  ASSERT_EQ(text.find('\0'), 36u);
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = parse_manifest(text, "n.yaml", no_file_checks(), &diagnostics);
  ASSERT_FALSE(m.ok());
  ASSERT_EQ(diagnostics.size(), 1u) << m.status().message();
  EXPECT_EQ(m.status().message(),
            "n.yaml:3:12: a NUL byte (\\0) in the manifest (3 in all; this is the first); a "
            "manifest is UTF-8 text without control characters other than tab and line breaks");
  // A NUL written as an escape in a double-quoted string reaches the value: refused there.
  Result<Manifest> escaped =
      parse_manifest("kreg_manifest: 1\ngroups:\n  - name: a\n    library: \"lib\\0a.so\"\n",
                     "e.yaml", no_file_checks());
  ASSERT_FALSE(escaped.ok());
  EXPECT_EQ(escaped.status().message(),
            "e.yaml:4:14: groups[0].library: contains a NUL byte (\\0) at byte 3 of the value "
            "('lib\\0a.so')");
}

TEST(ManifestParser, ControlCharactersAndBadUtf8AreRefused) {
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\nx: a\x04z\n",
                          "h.yaml:3:5: a control character (\\x04) in the manifest", "EOT");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: [\x1b[31m]\n",
                          "h.yaml:2:10: a control character (\\x1b)", "ESC");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n# \xff\xfe\n",
                          "h.yaml:3:3: a byte that is not valid UTF-8 (\\xff) in the manifest",
                          "bad UTF-8");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n# \xc2\x9b\n",
                          "h.yaml:3:3: a control character (U+009b)", "C1 CSI");
  expect_rejected_quickly("kreg_manifest: 1\n\xef\xbb\xbfgroups: []\n",
                          "h.yaml:2:1: a byte-order mark (U+FEFF) after the start", "inner BOM");
  expect_rejected_quickly("kreg_manifest: 1\rgroups: []\r",
                          "h.yaml:1:17: a carriage return (\\r) not followed by a line feed in the "
                          "manifest (2 in all; this is the first)",
                          "old Mac line ends");
  expect_rejected_quickly(std::string("\xff\xfek\0r\0", 6),
                          "h.yaml:1:1: the manifest looks like "
                          "UTF-16 or UTF-32",
                          "UTF-16LE");
  expect_rejected_quickly(std::string("\0k\0r", 4), "UTF-16 or UTF-32", "UTF-16BE, no BOM");
  // Escapes can write controls into a value: an alias message must not recolour a terminal.
  expect_rejected_quickly(
      "kreg_manifest: 1\ngroups: []\naliases:\n  - from: a.x\n    to: a.y\n    message: "
      "\"\\e[31mred\"\n",
      "h.yaml:6:14: aliases[0].message: contains a control character (\\x1b) at byte 0", "escape");
}

TEST(ManifestParser, BomCrlfAndDocumentMarkersThatAreFine) {
  const std::string crlf =
      "\xef\xbb\xbf--- # doc\r\nkreg_manifest: 1\r\ngroups:\r\n  - name: a\r\n    library: "
      "liba.so\r\n    enabled: maybe\r\n...\r\n# trailing comment\r\n";
  std::vector<ManifestDiagnostic> diagnostics;
  Result<Manifest> m = parse_manifest(crlf, "w.yaml", no_file_checks(), &diagnostics);
  ASSERT_FALSE(m.ok());
  ASSERT_EQ(diagnostics.size(), 1u) << m.status().message();
  // Lines and columns as in an editor: CRLF is one line break, the BOM takes no column.
  EXPECT_EQ(m.status().message(),
            "w.yaml:6:14: groups[0].enabled: expected a boolean (true or false), got 'maybe'");
  std::string fixed = crlf;
  fixed.replace(fixed.find("maybe"), 5, "false");
  Result<Manifest> ok = parse_manifest(fixed, "w.yaml", no_file_checks());
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->groups[0].library_spec, "liba.so");
  EXPECT_EQ(ok->groups[0].library_where.line, 5);
  // Flow collections a manifest really uses.
  Result<Manifest> flow = parse_manifest(
      "kreg_manifest: 1\nexpect_groups: [a, b]\ngroups: [{name: a, library: a.so}, {name: b, "
      "library: b.so, enabled: false}]\naliases: []\nwaivers: []\n",
      "f.yaml", no_file_checks());
  ASSERT_TRUE(flow.ok()) << flow.status().message();
  EXPECT_EQ(flow->groups.size(), 2u);
}

TEST(ManifestParser, SecondDocumentsAreRefusedHoweverWritten) {
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n...\nkreg_manifest: 1\n",
                          "h.yaml:4:1: a manifest is a single YAML document", "after ...");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n--- !!binary AAAA\n",
                          "h.yaml:3:1: a manifest is a single YAML document", "---");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: []\n...\n%YAML 1.2\n---\n",
                          "h.yaml:5:1: a manifest is a single YAML document", "directive");
  expect_rejected_quickly("---\n---\n---\n---\n", "h.yaml:2:1: a manifest is a single YAML",
                          "empty documents");
}

TEST(ManifestParser, DeepNestingIsRefusedEarly) {
  for (const char open : {'[', '{'}) {
    const std::string deep(100000, open);
    expect_rejected_quickly(deep,
                            "h.yaml:1:129: flow collections ('[' or '{') nested more than "
                            "128 deep",
                            std::string("100k ") + open);
    expect_rejected_quickly("kreg_manifest: 1\ngroups: " + deep, "h.yaml:2:137: flow collections",
                            "under a key");
  }
  // Balanced and well-formed, but deeper than any manifest: the tree's own limit.
  const std::string balanced = std::string(100, '[') + std::string(100, ']');
  expect_rejected_quickly("groups: " + balanced,
                          "h.yaml:1:72: collections nested more than 64 levels deep", "balanced");
  std::string block;
  for (int i = 0; i < 100000; ++i) block += "- ";
  expect_rejected_quickly(block, "collections nested more than 64 levels deep", "block");
  std::string staircase;
  for (int i = 0; i < 300; ++i) staircase += std::string(i, ' ') + "k:\n";
  expect_rejected_quickly(staircase, "collections nested more than 64 levels deep", "staircase");
}

TEST(ManifestParser, AliasExpansionIsBounded) {
  // Billion laughs: each level ten aliases of the one below; 10^9 nodes expanded.
  std::string laughs =
      "kreg_manifest: 1\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i < 9; ++i) {
    const std::string below = "*l" + std::to_string(i - 1);
    laughs += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) laughs += (k ? ", " : "") + below;
    laughs += "]\n";
  }
  laughs += "groups: *l8\n";
  expect_rejected_quickly(laughs, "aliases expand the manifest to more than 100000 nodes",
                          "billion laughs");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: &g [*g]\n",
                          "h.yaml:2:13: an alias inside the node its anchor names",
                          "recursive alias");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: [*nowhere]\n", "h.yaml:2:", "unknown anchor");
  // Aliases of scalars, the way a person uses them, are fine.
  Result<Manifest> m = parse_manifest(
      "kreg_manifest: 1\ngroups:\n  - name: a\n    library: liba.so\n    version: &v \"1.0\"\n"
      "  - name: b\n    library: libb.so\n    version: *v\n",
      "a.yaml", no_file_checks());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->groups[1].version, "1.0");
}

TEST(ManifestParser, NodeCountIsBounded) {
  std::string keys = "kreg_manifest: 1\ngroups: []\n";
  for (int i = 0; i < 30000; ++i) keys += "k" + std::to_string(i) + ": v\n";
  expect_rejected_quickly(keys, "the manifest has more than 50000 YAML nodes", "many keys");
  std::string entries = "kreg_manifest: 1\ngroups: [";
  for (int i = 0; i < 60000; ++i) entries += "a,";
  expect_rejected_quickly(entries + "]\n",
                          "h.yaml:2:100011: more than 50000 entries in flow "
                          "collections",
                          "many entries");
  // A flow map over the whole file: refused by the prescan before yaml-cpp scans it all.
  std::string pairs = "{";
  for (int i = 0; i < 150000; ++i) pairs += "a: b, ";
  expect_rejected_quickly(pairs + "}", "h.yaml:1:300006: more than 50000 entries", "flow map");
  std::string block = "kreg_manifest: 1\ngroups:\n";
  for (int i = 0; i < 60000; ++i) block += "- a\n";
  expect_rejected_quickly(block, "h.yaml:49998:3: the manifest has more than 50000 YAML nodes",
                          "block entries");
}

TEST(ManifestParser, TagsOtherThanTheCoreSchemasAreRefused) {
  expect_rejected_quickly(
      "kreg_manifest: 1\ngroups:\n  - name: a\n    library: !!binary bGliYS5zbw==\n",
      "h.yaml:4:14: groups[0].library: expected a string, got 'bGliYS5zbw==' tagged "
      "'tag:yaml.org,2002:binary'",
      "binary");
  expect_rejected_quickly("kreg_manifest: 1\ngroups: !custom []\n",
                          "h.yaml:2:9: groups: unsupported tag '!custom' on a sequence", "custom");
  expect_rejected_quickly("kreg_manifest: 1\ngroups:\n  - !group {name: a, library: a.so}\n",
                          "h.yaml:3:5: groups[0]: unsupported tag '!group' on a map", "group");
  expect_rejected_quickly("kreg_manifest: 1\n!k groups: []\n",
                          "h.yaml:2:1: keys must be plain strings, got 'groups' tagged '!k'",
                          "key");
  Result<Manifest> m = parse_manifest(
      "kreg_manifest: 1\ngroups: !!seq\n  - !!map {name: !!str a, library: !!str liba.so, "
      "enabled: !!bool true}\n",
      "t.yaml", no_file_checks());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->groups[0].library_spec, "liba.so");
}

TEST(ManifestPins, EditsThatWouldChangeMoreThanThePinAreRefused) {
  const std::string pin(64, 'c');
  // A library value continued on the next line: a line after its first would split it.
  Result<std::string> continued = rewrite_manifest_pins(
      "kreg_manifest: 1\ngroups:\n  - name: a\n    library: lib\n      a.so\n", {{"a", pin}});
  ASSERT_FALSE(continued.ok());
  EXPECT_NE(continued.status().message().find("group 'a' (line 3): its library value spans lines"),
            std::string::npos)
      << continued.status().message();
  // An explicit key: the new line would not belong to the group.
  Result<std::string> explicit_key = rewrite_manifest_pins(
      "kreg_manifest: 1\ngroups:\n  - name: a\n    ? library\n    : a.so\n", {{"a", pin}});
  ASSERT_FALSE(explicit_key.ok());
  EXPECT_NE(explicit_key.status().message().find("the edit would change more than the sha256 "
                                                 "pins"),
            std::string::npos)
      << explicit_key.status().message();
  // A quoted value with an escaped quote is replaced whole.
  Result<std::string> escaped = rewrite_manifest_pins(
      "kreg_manifest: 1\ngroups:\n  - name: a\n    library: a.so\n    sha256: \"x\\\"y\"\n",
      {{"a", pin}});
  ASSERT_TRUE(escaped.ok()) << escaped.status().message();
  EXPECT_EQ(*escaped, "kreg_manifest: 1\ngroups:\n  - name: a\n    library: a.so\n    sha256: \"" +
                          pin + "\"\n");
}

TEST(ManifestPins, CrlfFileStaysCrlf) {
  const std::string text =
      "kreg_manifest: 1\r\ngroups:\r\n  - name: a\r\n    library: liba.so\r\n    load: lazy\r\n";
  Result<std::string> r = rewrite_manifest_pins(text, {{"a", std::string(64, 'b')}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r,
            "kreg_manifest: 1\r\ngroups:\r\n  - name: a\r\n    library: liba.so\r\n    sha256: " +
                std::string(64, 'b') + "\r\n    load: lazy\r\n");
  Result<std::string> aliased =
      rewrite_manifest_pins("kreg_manifest: 1\ng: &g {name: a, library: a.so}\ngroups:\n  - *g\n",
                            {{"a", std::string(64, 'b')}});
  ASSERT_FALSE(aliased.ok());
  EXPECT_NE(aliased.status().message().find("group 'a' (line 4) is an alias"), std::string::npos)
      << aliased.status().message();
}

TEST(Manifest, ToStringFormats) {
  EXPECT_EQ((SourceLocation{"registry.yaml", 3, 7}).to_string(), "registry.yaml:3:7");
  EXPECT_EQ((SourceLocation{"registry.yaml", 0, 0}).to_string(), "registry.yaml");
  EXPECT_EQ((ManifestDiagnostic{{"r.yaml", 2, 5}, "groups[0].name", "bad"}).to_string(),
            "r.yaml:2:5: groups[0].name: bad");
  EXPECT_EQ((ManifestDiagnostic{{"r.yaml", 1, 1}, "", "empty"}).to_string(), "r.yaml:1:1: empty");
}

}  // namespace
}  // namespace kreg
