// The manifest parser: every bad fixture in tests/fixtures/manifests/bad carries its own
// expectations (`# expect: <substring>` lines and `# expect-count: N`), so adding a file there
// adds a test case. The good manifests and the resolution rules are tested directly below.
#include "kreg/manifest.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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

TEST(Manifest, ToStringFormats) {
  EXPECT_EQ((SourceLocation{"registry.yaml", 3, 7}).to_string(), "registry.yaml:3:7");
  EXPECT_EQ((SourceLocation{"registry.yaml", 0, 0}).to_string(), "registry.yaml");
  EXPECT_EQ((ManifestDiagnostic{{"r.yaml", 2, 5}, "groups[0].name", "bad"}).to_string(),
            "r.yaml:2:5: groups[0].name: bad");
  EXPECT_EQ((ManifestDiagnostic{{"r.yaml", 1, 1}, "", "empty"}).to_string(), "r.yaml:1:1: empty");
}

}  // namespace
}  // namespace kreg
