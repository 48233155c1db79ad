// Lazy groups (issue 13): Registry::open describes a lazy group from its library's
// embedded metadata without loading it; introspection never loads; resolving one op loads
// exactly that op's group. Proven two ways: no plugin library in /proc/self/maps, and the
// init-marker fixture (group "marker"), whose static initializer and init hook append to
// $KREG_TEST_INIT_MARKER, staying silent through `kreg list` and `kreg info`.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kreg/manifest.hpp"
#include "kreg/registry.hpp"
#include "test_support.hpp"

namespace kreg {
namespace {

namespace fs = std::filesystem;

using test::read_file;
using test::Scratch;

// registry.yaml with every group lazy and `extra` appended to its group list.
std::string all_lazy_manifest(const std::string& plugin_dir, const std::string& extra = "") {
  std::string text = read_file(fs::path(KREG_SOURCE_DIR) / "registry.yaml");
  EXPECT_FALSE(text.empty());
  size_t n = 0;
  for (size_t at = text.find("load: eager"); at != std::string::npos;
       at = text.find("load: eager", at)) {
    text.replace(at, 11, "load: lazy");
    ++n;
  }
  EXPECT_GT(n, 0u);
  const size_t dir = text.find("\nplugin_dir:");
  EXPECT_NE(dir, std::string::npos);
  text.replace(dir + 1, text.find('\n', dir + 1) - dir - 1, "plugin_dir: " + plugin_dir);
  if (!extra.empty()) {
    const size_t aliases = text.find("\naliases:");
    EXPECT_NE(aliases, std::string::npos);
    text.insert(aliases + 1, extra);
  }
  return text;
}

// The library file names of the manifest's groups that /proc/self/maps shows mapped.
std::vector<std::string> mapped_libraries(const Manifest& m) {
  const std::string maps = read_file("/proc/self/maps");
  std::vector<std::string> out;
  for (const GroupEntry& g : m.groups) {
    const std::string file = g.library.filename().string();
    if (maps.find("/" + file + "\n") != std::string::npos ||
        maps.find("/" + file + " (deleted)") != std::string::npos) {
      out.push_back(file);
    }
  }
  return out;
}

std::vector<std::string> only(const std::string& s) { return {s}; }

// Runs the CLI with the marker variable set; returns stdout, sets *code.
std::string cli(const std::vector<std::string>& argv, const fs::path& marker, int* code) {
  Scratch s;
  const fs::path out = s.root() / "out", err = s.root() / "err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0) ::_exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::unsetenv("KREG_PLUGIN_DIR");
    ::unsetenv("KREG_MANIFEST");
    ::unsetenv("KREG_FORCE_BACKEND");
    ::setenv("KREG_TEST_INIT_MARKER", marker.c_str(), 1);
    std::vector<char*> args{const_cast<char*>(KREG_CLI)};
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  *code =
      pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return read_file(out) + read_file(err);
}

// First in this file, and nothing before it in this process loads a shipped plugin.
TEST(Lazy, EveryShippedGroupListedFromMetadataAndOnlyTheResolvedOneMapped) {
  Scratch s;
  const fs::path file = s.write("lazy.yaml", all_lazy_manifest(KREG_PLUGIN_DIR));
  auto m = load_manifest(file, ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_GE(m->groups.size(), 2u);
  for (const GroupEntry& g : m->groups) ASSERT_EQ(g.load, LoadMode::kLazy) << g.name;
  ASSERT_EQ(mapped_libraries(*m), std::vector<std::string>{}) << "mapped before the test";

  auto reg = Registry::open(*m);
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  Registry& r = **reg;
  const auto groups = r.groups();
  ASSERT_EQ(groups.size(), m->groups.size());
  size_t ops = 0;
  for (const GroupInfo& g : groups) {
    EXPECT_FALSE(g.loaded) << g.name;
    EXPECT_EQ(g.source, GroupSource::kMetadata) << g.name << ": " << g.metadata_note;
    ASSERT_TRUE(g.plugin.has_value()) << g.name;
    EXPECT_EQ(g.plugin->group, g.name);
    EXPECT_EQ(g.plugin->version, "0.1.0") << g.name;
    EXPECT_FALSE(g.ops.empty()) << g.name;
    for (const std::string& op : g.ops) {
      EXPECT_TRUE(op.starts_with(g.name + ".")) << op;
      const auto impls = r.implementations(op);
      ASSERT_FALSE(impls.empty()) << op;
      EXPECT_EQ(impls.front()->op, op);
      EXPECT_EQ(impls.front()->fn, nullptr) << op << ": metadata has no code";
    }
    ops += g.ops.size();
  }
  EXPECT_EQ(r.op_ids().size(), ops);
  // The manifest's alias leads to an op the metadata knows: found, nothing loaded.
  const auto chain = r.resolve_alias("activation.silu_mul");
  ASSERT_TRUE(chain.has_value());
  EXPECT_TRUE(chain->found) << chain->text();
  EXPECT_FALSE(r.resolve_alias("layernorm.rmsnorm").has_value()) << "a real op, not an alias";
  EXPECT_FALSE(r.implementations("layernorm.nosuch").size());
  EXPECT_EQ(mapped_libraries(*m), std::vector<std::string>{}) << "introspection loaded a plugin";

  // An unknown op of a lazy group: the metadata answers, nothing loads.
  EXPECT_EQ(r.resolve("layernorm.nosuch", Target{}).status().code(), KREG_NOT_FOUND);
  EXPECT_EQ(mapped_libraries(*m), std::vector<std::string>{});

  // Resolving one op maps exactly its group.
  auto h = r.resolve("layernorm.rmsnorm", Target{DLDevice{kDLCPU, 0}, DType::kF32});
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_NE(h->spec().fn, nullptr);
  EXPECT_EQ(mapped_libraries(*m), only("libkreg_layernorm.so"));
  for (const GroupInfo& g : r.groups()) {
    EXPECT_EQ(g.loaded, g.name == "layernorm") << g.name;
    EXPECT_EQ(g.source, g.name == "layernorm" ? GroupSource::kLoaded : GroupSource::kMetadata)
        << g.name;
  }
  // Through an alias: its end's group loads, and still no other.
  auto via = r.resolve("activation.silu_mul", Target{DLDevice{kDLCPU, 0}, DType::kF32});
  ASSERT_TRUE(via.ok()) << via.status().message();
  EXPECT_EQ(via->op(), "activation.silu_and_mul");
  const auto mapped = mapped_libraries(*m);
  EXPECT_EQ(mapped.size(), 2u);
  EXPECT_NE(std::find(mapped.begin(), mapped.end(), "libkreg_activation.so"), mapped.end());
}

// A library without metadata (kreg_abi_1_1, built against the ABI 1.1 headers, before
// SDK 1.2): listed with its ops unknown and a note, loaded on the first resolve of one of
// its ops.
TEST(Lazy, GroupWithoutMetadataLoadsOnFirstResolve) {
  Scratch s;
  s.plugin("abi_1_1", "libkreg_abi_1_1.so");
  const fs::path file = s.write("m.yaml", "kreg_manifest: 1\nplugin_dir: " + s.root().string() +
                                              "\ngroups:\n  - name: testgrp\n    library: "
                                              "libkreg_abi_1_1.so\n    load: lazy\n");
  auto m = load_manifest(file, ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto reg = Registry::open(*m);
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  auto groups = (*reg)->groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_FALSE(groups[0].loaded);
  EXPECT_EQ(groups[0].source, GroupSource::kNone);
  EXPECT_TRUE(groups[0].ops.empty());
  EXPECT_NE(groups[0].metadata_note.find("metadata unavailable"), std::string::npos)
      << groups[0].metadata_note;
  EXPECT_TRUE((*reg)->op_ids().empty());
  EXPECT_EQ(mapped_libraries(*m), std::vector<std::string>{});
  // The op id names the group: resolving loads it.
  const auto ids_before = (*reg)->implementations("testgrp.scale");
  EXPECT_TRUE(ids_before.empty());
  (void)(*reg)->resolve("testgrp.scale", Target{});
  groups = (*reg)->groups();
  EXPECT_TRUE(groups[0].loaded) << groups[0].error;
  EXPECT_EQ(groups[0].source, GroupSource::kLoaded);
  EXPECT_FALSE(groups[0].ops.empty());
  EXPECT_EQ(mapped_libraries(*m), only("libkreg_abi_1_1.so"));
}

// Through the CLI: `kreg list` and `kreg info` run no plugin code (the marker stays
// empty); the ops of the marker group are listed from its metadata.
TEST(Lazy, CliListAndInfoRunNoPluginCode) {
  Scratch s;
  s.plugin("init_marker", "libkreg_init_marker.so");
  for (const fs::directory_entry& e : fs::directory_iterator(KREG_PLUGIN_DIR)) {
    if (e.path().extension() == ".so") s.copy(e.path(), e.path().filename());
  }
  const fs::path m =
      s.write("lazy.yaml", all_lazy_manifest(s.root().string(),
                                             "  - name: marker\n    library: "
                                             "libkreg_init_marker.so\n    load: lazy\n"));
  const fs::path marker = s.root() / "marker.txt";
  int code = -1;
  const std::string list = cli({"list", "--manifest", m.string()}, marker, &code);
  EXPECT_EQ(code, 0) << list;
  EXPECT_NE(list.find("marker.touch"), std::string::npos) << list;
  EXPECT_NE(list.find("layernorm.rmsnorm"), std::string::npos) << list;
  EXPECT_EQ(read_file(marker), "") << "kreg list ran plugin code";

  const std::string json = cli({"list", "--json", "--manifest", m.string()}, marker, &code);
  EXPECT_EQ(code, 0) << json;
  EXPECT_NE(json.find("\"source\":\"metadata\""), std::string::npos) << json;
  EXPECT_EQ(read_file(marker), "");

  const std::string info =
      cli({"info", "layernorm.rmsnorm", "--manifest", m.string()}, marker, &code);
  EXPECT_EQ(code, 0) << info;
  EXPECT_NE(info.find("signature  rmsnorm("), std::string::npos) << info;
  EXPECT_NE(info.find("not loaded"), std::string::npos) << info;
  const std::string info_marker =
      cli({"info", "marker.touch", "--manifest", m.string()}, marker, &code);
  EXPECT_EQ(code, 0) << info_marker;
  EXPECT_NE(info_marker.find("touch(Tensor(a!)[N] x)"), std::string::npos) << info_marker;
  EXPECT_EQ(read_file(marker), "") << "kreg info ran plugin code";

  // Running the op does load it: the marker proves the fixture works.
  const std::string run = cli({"run", "marker.touch", "--shape", "N=4", "--dtype", "f32",
                               "--backend", "cpu", "--manifest", m.string()},
                              marker, &code);
  EXPECT_EQ(code, 0) << run;
  EXPECT_NE(read_file(marker).find("init"), std::string::npos) << run;
}

// In process: open and introspection leave the marker empty; resolving, then calling,
// marker.touch loads the group (static initializer, then init hook).
TEST(Lazy, ResolvingMarkerTouchRunsItsInitializers) {
  Scratch s;
  s.plugin("init_marker", "libkreg_init_marker.so");
  const fs::path marker = s.root() / "marker.txt";
  ::setenv("KREG_TEST_INIT_MARKER", marker.c_str(), 1);
  const fs::path file = s.write("m.yaml", "kreg_manifest: 1\nplugin_dir: " + s.root().string() +
                                              "\ngroups:\n  - name: marker\n    library: "
                                              "libkreg_init_marker.so\n    load: lazy\n");
  auto m = load_manifest(file, ManifestOptions{});
  ASSERT_TRUE(m.ok()) << m.status().message();
  {
    auto reg = Registry::open(*m);
    ASSERT_TRUE(reg.ok()) << reg.status().message();
    Registry& r = **reg;
    const auto groups = r.groups();
    ASSERT_EQ(groups.size(), 1u);
    EXPECT_EQ(groups[0].source, GroupSource::kMetadata) << groups[0].metadata_note;
    EXPECT_EQ(groups[0].ops, only("marker.touch"));
    EXPECT_EQ(r.implementations("marker.touch").size(), 1u);
    EXPECT_FALSE(r.resolve_alias("marker.touch").has_value());
    EXPECT_EQ(read_file(marker), "") << "open or introspection ran plugin code";

    float data[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    DLTensor x{};
    x.data = data;
    x.device = {kDLCPU, 0};
    x.ndim = 1;
    x.dtype = {kDLFloat, 32, 1};
    x.shape = shape;
    DLTensor* args[] = {&x};
    // The by-name call loads the group on its first use.
    ASSERT_TRUE(r.call("marker.touch", args).ok());
    EXPECT_EQ(read_file(marker), "static\ninit\n");
    EXPECT_EQ(data[0], 2.0f);
    EXPECT_TRUE(r.groups()[0].loaded);
    ASSERT_TRUE(r.call("marker.touch", args).ok());
    EXPECT_EQ(read_file(marker), "static\ninit\n") << "loaded once";
  }
  ::unsetenv("KREG_TEST_INIT_MARKER");
}

}  // namespace
}  // namespace kreg
