// Loading plugins: the shipped groups through the default manifest, and the broken test
// plugins (ABI major mismatch, wrong group, bad signature, no entry, failing init, not a
// shared object, truncated), each refused with a message that names the problem.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <fstream>

#include "kreg/plugin_library.hpp"
#include "kreg/registry.hpp"
#include "kreg/resource.hpp"
#include "kreg/validation.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::contains;
using test::Scratch;
using test::test_plugin;

Manifest manifest_for(const std::vector<std::pair<std::string, fs::path>>& groups) {
  Manifest m;
  m.file = "test.yaml";
  for (const auto& [name, lib] : groups) {
    GroupEntry e;
    e.name = name;
    e.library = lib;
    e.library_spec = lib.string();
    m.groups.push_back(e);
  }
  return m;
}

TEST(Plugin, LoadsTheTestGroupAndCallsIt) {
  auto lib = PluginLibrary::open(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")});
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  const PluginInfo& info = (*lib)->info();
  EXPECT_EQ(info.group, "testgrp");
  EXPECT_EQ(info.version, "0.1.0");
  EXPECT_EQ(info.abi_major, KREG_ABI_MAJOR);
  EXPECT_FALSE(info.compiler.empty());
  ASSERT_EQ((*lib)->kernels().size(), 2u);
  EXPECT_EQ((*lib)->kernels()[0].op, "testgrp.scale");
  EXPECT_EQ((*lib)->kernels()[0].provenance.source_file, "testgrp.cpp");
}

TEST(Plugin, RegistryOpensTestGroupAndPropagatesKernelErrors) {
  auto reg = Registry::open(manifest_for({{"testgrp", test_plugin("testgrp")}}));
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  int64_t shape[1] = {4};
  DLTensor x{in, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor o{out, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&x, &o};
  ASSERT_TRUE((*reg)->call("testgrp.scale", args).ok());
  EXPECT_FLOAT_EQ(out[3], 8.0f);
  kreg_attr code{KREG_ATTR_INT, 0, {.i = KREG_OUT_OF_RANGE}};
  DLTensor* one[] = {&x};
  Status st = (*reg)->call("testgrp.fail", one, {&code, 1});
  EXPECT_EQ(st.code(), KREG_OUT_OF_RANGE);
  EXPECT_EQ(st.message(), "testgrp.fail (cpu): asked to fail with code 11");
  auto groups = (*reg)->groups();
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].generation, 1u);
  EXPECT_TRUE(groups[0].loaded);
}

TEST(Plugin, RefusesAnotherAbiMajor) {
  auto lib = PluginLibrary::open(test_plugin("abi_major2"), {"testgrp", std::nullopt});
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), KREG_FAILED_PRECONDITION);
  const std::string want = "built for kreg ABI " + std::to_string(KREG_ABI_MAJOR + 1) +
                           ".0, but this core speaks ABI " + std::to_string(KREG_ABI_MAJOR) + ".";
  EXPECT_NE(lib.status().message().find(want), std::string::npos) << lib.status().message();
  EXPECT_NE(lib.status().message().find("rebuild the plugin"), std::string::npos);
}

TEST(Plugin, RefusesWrongGroupVersionAndBadSignature) {
  auto wrong = PluginLibrary::open(test_plugin("wrong_group"), {"testgrp", std::nullopt});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find(
                "declares group 'other', but the manifest lists it as group 'testgrp'"),
            std::string::npos)
      << wrong.status().message();

  auto version = PluginLibrary::open(test_plugin("testgrp"), {"testgrp", std::string("9.9.9")});
  ASSERT_FALSE(version.ok());
  EXPECT_NE(version.status().message().find("version 0.1.0 does not match the expected 9.9.9"),
            std::string::npos);

  auto sig = PluginLibrary::open(test_plugin("bad_signature"), {"testgrp", std::nullopt});
  ASSERT_FALSE(sig.ok());
  EXPECT_NE(sig.status().message().find("kernel 'testgrp.three'"), std::string::npos);
  EXPECT_NE(sig.status().message().find("argument kinds 'TTT' but the bound function takes 'TT'"),
            std::string::npos)
      << sig.status().message();
}

TEST(Plugin, RefusesLibrariesWithoutEntryOrWithFailingInit) {
  auto none = PluginLibrary::open(test_plugin("no_entry"), {"testgrp", std::nullopt});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("does not export the entry symbol 'kreg_plugin_entry'"),
            std::string::npos);
  EXPECT_FALSE(check_entry_symbol(test_plugin("no_entry")).ok());
  EXPECT_TRUE(check_entry_symbol(test_plugin("testgrp")).ok());

  auto reg = Registry::open(manifest_for({{"testgrp", test_plugin("init_fails")}}));
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_NE(reg.status().message().find("init hook failed: no device memory for the lookup table"),
            std::string::npos)
      << reg.status().message();
}

TEST(Plugin, RefusesFilesThatAreNotSharedObjects) {
  Scratch dir;
  const fs::path text = dir.root() / "libkreg_text.so";
  std::ofstream(text) << "not an ELF file\n";
  auto a = PluginLibrary::open(text, {"testgrp", std::nullopt});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("is not an ELF shared object"), std::string::npos)
      << a.status().message();
  EXPECT_NE(check_entry_symbol(text).message().find("not an ELF shared object"), std::string::npos);

  // A truncated copy of a real plugin.
  const fs::path truncated = dir.root() / "libkreg_truncated.so";
  fs::copy_file(test_plugin("testgrp"), truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 3);
  auto b = PluginLibrary::open(truncated, {"testgrp", std::nullopt});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), KREG_DATA_LOSS);
  EXPECT_NE(b.status().message().find(truncated.string() + " is truncated"), std::string::npos)
      << b.status().message();

  auto c = PluginLibrary::open(dir.root(), {"testgrp", std::nullopt});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is a directory, not a shared object"), std::string::npos);

  auto d = PluginLibrary::open(dir.root() / "missing.so", {"testgrp", std::nullopt});
  EXPECT_EQ(d.status().code(), KREG_NOT_FOUND);
}

// ---- Descriptors and hooks read defensively (fixtures/plugins/bad_descriptor.cpp) ----

std::string open_error(const std::string& fixture, PluginLibrary::Stage* stage = nullptr) {
  auto lib = PluginLibrary::open(test_plugin(fixture), {"testgrp", std::nullopt}, stage);
  EXPECT_FALSE(lib.ok()) << fixture << " was accepted";
  if (lib.ok()) return "";
  EXPECT_NE(lib.status().message().find(test_plugin(fixture).string()), std::string::npos)
      << lib.status().message();
  return lib.status().message();
}

TEST(PluginDescriptor, NullGroupAndNullVersionAreNamedApart) {
  PluginLibrary::Stage stage;
  std::string m = open_error("bad_null_group", &stage);
  EXPECT_TRUE(contains(m, ": the descriptor's group is NULL")) << m;
  EXPECT_EQ(stage, PluginLibrary::Stage::kGroup);
  m = open_error("bad_null_version", &stage);
  EXPECT_TRUE(contains(m, ": the descriptor's version is NULL")) << m;
  EXPECT_EQ(stage, PluginLibrary::Stage::kVersion);
}

TEST(PluginDescriptor, GroupWithControlCharactersIsRefusedEscaped) {
  const std::string m = open_error("bad_control_group");
  EXPECT_TRUE(contains(m,
                       "the descriptor's group \"testgrp\\n\\x1b[31mok\" has a space, control or "
                       "non-ASCII byte at 7"))
      << m;
  EXPECT_FALSE(contains(m, "\n")) << "a raw newline from the plugin";
  EXPECT_FALSE(contains(m, "\x1b")) << "a raw escape from the plugin";
}

TEST(PluginDescriptor, ShortKernelTableWithAHugeCountIsRefused) {
  const std::string m = open_error("bad_short_table");
  EXPECT_TRUE(contains(m, "kernel table of 1000 records (" +
                              std::to_string(1000 * sizeof(kreg_kernel_desc)) +
                              " bytes) extends past the library's data segment"))
      << m;
}

TEST(PluginDescriptor, PointersOutsideTheLibraryAreRefused) {
  std::string m = open_error("bad_heap_descriptor");
  EXPECT_TRUE(contains(m, ": descriptor at 0x")) << m;
  EXPECT_TRUE(contains(m, "is outside the library's loaded segments")) << m;
  m = open_error("bad_heap_string");
  EXPECT_TRUE(contains(m, ": kernel record 1: its description points to 0x")) << m;
  EXPECT_TRUE(contains(m, ", outside the library's loaded segments")) << m;
}

// ---- ABI 1.2 capability records read defensively (fixtures/plugins/bad_caps.cpp) ----

TEST(PluginCapabilities, BadRecordStridesAreRefused) {
  PluginLibrary::Stage stage;
  std::string m = open_error("bad_caps_small_stride", &stage);
  EXPECT_TRUE(contains(m, ": kernel record 0: capability record 0 too small (struct_size 16)"))
      << m;
  EXPECT_EQ(stage, PluginLibrary::Stage::kKernels);
  m = open_error("bad_caps_odd_stride");
  EXPECT_TRUE(contains(m,
                       ": kernel record 0: capability record 0 has struct_size 28, not a multiple "
                       "of 8"))
      << m;
  m = open_error("bad_caps_mixed_stride");
  EXPECT_TRUE(contains(m,
                       ": kernel record 0: capability record 1 has struct_size 24, but record 0 "
                       "has 32 (one array has one record size)"))
      << m;
}

TEST(PluginCapabilities, CountsAndPointersAreChecked) {
  std::string m = open_error("bad_caps_too_many");
  EXPECT_TRUE(contains(m, ": kernel record 0: 65 capability records, above the limit of " +
                              std::to_string(kMaxPluginCapabilities)))
      << m;
  m = open_error("bad_caps_null_records");
  EXPECT_TRUE(contains(m,
                       ": kernel record 0: num_capabilities is 1, but its capability records are "
                       "NULL"))
      << m;
  m = open_error("bad_caps_heap_records");
  EXPECT_TRUE(contains(m, ": kernel record 0: capability record 0 at 0x")) << m;
  EXPECT_TRUE(contains(m, "is outside the library's loaded segments")) << m;
}

// ---- ABI 1.4 resource-type tables read defensively (fixtures/plugins/bad_resources.cpp) ----

TEST(PluginResourceTypes, BadRecordStridesAreRefused) {
  PluginLibrary::Stage stage;
  std::string m = open_error("bad_res_small_stride", &stage);
  EXPECT_TRUE(contains(m, ": resource type record 0 too small (struct_size 16)")) << m;
  m = open_error("bad_res_odd_stride");
  EXPECT_TRUE(contains(m, ": resource type record 0 has struct_size 52, not a multiple of 8")) << m;
  m = open_error("bad_res_mixed_stride");
  EXPECT_TRUE(contains(m, ": resource type record 1 has struct_size 56, but record 0 has 64")) << m;
}

TEST(PluginResourceTypes, CountsAndPointersAreChecked) {
  std::string m = open_error("bad_res_too_many");
  EXPECT_TRUE(contains(m, ": num_resource_types is 65, above the limit of " +
                              std::to_string(kMaxPluginResourceTypes)))
      << m;
  m = open_error("bad_res_null_table");
  EXPECT_TRUE(contains(m, ": resource type table is null")) << m;
  m = open_error("bad_res_heap_table");
  EXPECT_TRUE(contains(m, ": resource type record 0 at 0x")) << m;
  EXPECT_TRUE(contains(m, "is outside the library's loaded segments")) << m;
  m = open_error("bad_res_heap_name");
  EXPECT_TRUE(contains(m, ": resource type record 1: its type points to 0x")) << m;
  EXPECT_TRUE(contains(m, "outside the library's loaded segments")) << m;
  m = open_error("bad_res_create_in_data");
  EXPECT_TRUE(contains(m, ": resource type record 1: its create function 0x")) << m;
  EXPECT_TRUE(contains(m, " is outside the library's code")) << m;
}

TEST(PluginResourceTypes, DuplicateAndUndeclaredTypesAreRefused) {
  std::string m = open_error("bad_res_duplicate");
  EXPECT_TRUE(
      contains(m, ": resource type record 1: resource type testgrp.state is declared twice"))
      << m;
  m = open_error("bad_res_undeclared");
  EXPECT_TRUE(contains(m,
                       ": testgrp.noop (cpu) takes 'Resource<testgrp.missing> s', a resource type "
                       "this library does not declare"))
      << m;
}

TEST(PluginCapabilities, KernelRecordShorterThanAbi10IsRefused) {
  const std::string m = open_error("bad_caps_short_kernel");
  EXPECT_TRUE(contains(m, ": kernel record 0 too small (struct_size " +
                              std::to_string(offsetof(kreg_kernel_desc, fn)) + ")"))
      << m;
}

TEST(PluginCapabilities, SdkPluginsUseTheirCapabilityRecordsAndFlags) {
  // KREG_GROUP fills caps and capabilities alike; the 1.2 records are what is read, and
  // a CPU-only group's fatbinary is not read at all.
  auto lib = PluginLibrary::open(test_plugin("init_marker"), {"marker", std::string("0.1.0")});
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  ASSERT_EQ((*lib)->kernels().size(), 1u);
  const KernelSpec& k = (*lib)->kernels()[0];
  EXPECT_EQ(k.op, "marker.touch");
  ASSERT_EQ(k.capabilities.size(), 1u);
  EXPECT_EQ(k.capabilities[0].device_type, kDLCPU);
  EXPECT_EQ(k.flags, 0u);
  EXPECT_EQ(k.provenance.cuda_images, "");
  EXPECT_EQ((*lib)->info().cuda_images, "");
}

Status init_of(const std::string& fixture) {
  auto lib = PluginLibrary::open(test_plugin(fixture), {"testgrp", std::nullopt});
  EXPECT_TRUE(lib.ok()) << lib.status().message();
  if (!lib.ok()) return lib.status();
  return (*lib)->init();
}

TEST(PluginDescriptor, InitHookFailures) {
  Status st = init_of("bad_init_no_message");
  EXPECT_EQ(st.code(), KREG_UNAVAILABLE);
  EXPECT_EQ(st.message(), "plugin 'testgrp': init hook returned UNAVAILABLE without a message");

  st = init_of("bad_init_unterminated");
  EXPECT_EQ(st.code(), KREG_INTERNAL);
  EXPECT_EQ(st.message(), "plugin 'testgrp': init hook failed: " + std::string(512, 'x') +
                              " [the message fills its 512-byte buffer without a terminating "
                              "NUL]");

  st = init_of("bad_init_odd_code");
  EXPECT_EQ(st.code(), KREG_UNKNOWN);
  EXPECT_EQ(st.message(),
            "plugin 'testgrp': init hook failed: the table is odd (it returned status 77, which "
            "is not a canonical (abseil) code)");
}

TEST(PluginDescriptor, KernelMessageWithoutANulIsReadOnlyToItsBuffer) {
  auto reg = Registry::open(manifest_for({{"testgrp", test_plugin("bad_kernel_unterminated")}}));
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  float in[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor x{in, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&x};
  const Status st = (*reg)->call("testgrp.blurt", args);
  EXPECT_EQ(st.code(), KREG_INTERNAL);
  EXPECT_EQ(st.message().substr(0, 21), "testgrp.blurt (cpu): ");
  EXPECT_EQ(st.message().substr(21, 256), std::string(256, 'x'));
  EXPECT_LT(st.message().size(), 21u + 256u + 100u) << st.message();
}

TEST(PluginDescriptor, StrippedPluginLoads) {
  auto lib =
      PluginLibrary::open(test_plugin("testgrp_stripped"), {"testgrp", std::string("0.1.0")});
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  EXPECT_EQ((*lib)->kernels().size(), 2u);
  EXPECT_TRUE(check_entry_symbol(test_plugin("testgrp_stripped")).ok());
}

TEST(Plugin, AFailedGroupLeavesTheRegistryUsable) {
  Registry reg;
  GroupEntry good{"testgrp", "", test_plugin("testgrp")};
  GroupEntry bad{"testgrp", "", test_plugin("abi_major2")};
  ASSERT_FALSE(reg.load_group(bad).ok());
  EXPECT_TRUE(reg.implementations("testgrp.scale").empty());
  ASSERT_TRUE(reg.load_group(good).ok());
  EXPECT_EQ(reg.implementations("testgrp.scale").size(), 1u);
}

TEST(Plugin, DefaultManifestLoadsTheShippedGroups) {
  auto m = load_manifest(fs::path(KREG_SOURCE_DIR) / "registry.yaml",
                         ManifestOptions{fs::path(KREG_PLUGIN_DIR), true});
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto reg = Registry::open(*m);
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  // Every manifest group loaded, with its ops (the kernel tests pin each group's op list).
  std::vector<std::string> ops = (*reg)->op_ids();
  for (const auto& g : (*reg)->groups()) {
    EXPECT_TRUE(g.loaded) << g.name;
    EXPECT_FALSE(g.ops.empty()) << g.name;
  }
  EXPECT_EQ((*reg)->groups().size(), m->groups.size());
  const std::vector<std::string> first_groups = {"activation.gelu_and_mul",
                                                 "activation.gelu_tanh_and_mul",
                                                 "activation.silu_and_mul",
                                                 "layernorm.fused_add_rmsnorm",
                                                 "layernorm.gemma_fused_add_rmsnorm",
                                                 "layernorm.gemma_rmsnorm",
                                                 "layernorm.rmsnorm"};
  for (const std::string& op : first_groups) {
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
  }
  for (const std::string& op : ops) {
    bool has_cpu = false;
    for (const KernelSpec* s : (*reg)->implementations(op)) has_cpu |= s->backend == "cpu";
    EXPECT_TRUE(has_cpu) << op << " lacks a CPU reference";
  }
  auto alias = (*reg)->alias("activation.silu_mul");
  ASSERT_TRUE(alias.has_value());
  EXPECT_EQ(alias->first, "activation.silu_and_mul");
}

TEST(Plugin, LazyGroupLoadsOnFirstUse) {
  Manifest m = manifest_for({{"testgrp", test_plugin("testgrp")}});
  m.groups[0].load = LoadMode::kLazy;
  auto reg = Registry::open(m);
  ASSERT_TRUE(reg.ok());
  EXPECT_FALSE((*reg)->groups()[0].loaded);
  auto h = (*reg)->resolve("testgrp.scale", Target{DLDevice{kDLCPU, 0}, DType::kF32});
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_TRUE((*reg)->groups()[0].loaded);
}

// ---- kreg validate's checks on broken registries ----

struct ValidateCase {
  const char* plugin;
  const char* check;
  const char* expect;
};

class ValidateBroken : public ::testing::TestWithParam<ValidateCase> {};

TEST_P(ValidateBroken, NamesTheCheck) {
  Scratch dir;
  const fs::path manifest = dir.root() / "registry.yaml";
  std::ofstream(manifest) << "kreg_manifest: 1\nplugin_dir: " << KREG_TEST_PLUGIN_DIR
                          << "\ngroups:\n  - name: testgrp\n    library: libkreg_"
                          << GetParam().plugin << ".so\n    version: \"0.1.0\"\n";
  auto report = validate_registry(manifest, {});
  EXPECT_FALSE(report.ok());
  bool found = false;
  for (const Finding& f : report.findings) {
    if (f.check == GetParam().check) {
      found = true;
      EXPECT_NE(f.message.find(GetParam().expect), std::string::npos) << f.message;
      EXPECT_EQ(f.group, "testgrp");
    }
  }
  EXPECT_TRUE(found) << "no finding for check " << GetParam().check;
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, ValidateBroken,
    ::testing::Values(
        ValidateCase{"abi_major2", "abi-version", "this core speaks ABI"},
        ValidateCase{"wrong_group", "group-name-match", "declares group 'other'"},
        ValidateCase{"bad_signature", "schema", "argument kinds"},
        ValidateCase{"no_entry", "library-loads", "does not export 'kreg_plugin_entry'"},
        ValidateCase{"testgrp_v2", "plugin-version", "version 0.2.0 does not match"},
        ValidateCase{"empty_group", "no-empty-groups", "registers no kernels"},
        ValidateCase{"entry_data", "library-loads",
                     "is STT_OBJECT (a data object), not a function"},
        ValidateCase{"bad_null_version", "plugin-version", "the descriptor's version is NULL"},
        ValidateCase{"bad_short_table", "schema", "kernel table of 1000 records"},
        ValidateCase{"missing", "library-present", "does not exist"}),
    [](const auto& info) { return std::string(info.param.plugin); });

TEST(Validate, DefaultManifestPasses) {
  ValidateOptions opts;
  opts.manifest.plugin_dir_override = fs::path(KREG_PLUGIN_DIR);
  auto report = validate_registry(fs::path(KREG_SOURCE_DIR) / "registry.yaml", opts);
  for (const Finding& f : report.findings) ADD_FAILURE() << f.check << ": " << f.message;
  EXPECT_TRUE(report.ok());
  auto m = load_manifest(fs::path(KREG_SOURCE_DIR) / "registry.yaml",
                         ManifestOptions{fs::path(KREG_PLUGIN_DIR), true});
  ASSERT_TRUE(m.ok());
  auto reg = Registry::open(*m);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(report.ops, (*reg)->op_ids().size());
  EXPECT_GE(report.ops, 7u);
  opts.forbid_aliases = true;
  auto strict = validate_registry(fs::path(KREG_SOURCE_DIR) / "registry.yaml", opts);
  ASSERT_EQ(strict.findings.size(), 1u);
  EXPECT_EQ(strict.findings[0].check, "aliases");
}

}  // namespace
}  // namespace kreg
