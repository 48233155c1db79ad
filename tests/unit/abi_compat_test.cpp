// ABI compatibility in both directions (abi.h's versioning contract), against real plugin
// files: a plugin built against the ABI 1.1 headers (tests/fixtures/abi_1_1), a synthetic
// "1.5" plugin whose structs are longer than 1.4's and full of nonsense past 1.4's fields,
// an ABI 2 plugin, and a 1.2 kernel called with a 1.1-sized frame and through the core.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "kreg/elf_file.hpp"
#include "kreg/plugin_library.hpp"
#include "kreg/registry.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::test_plugin;

Manifest manifest_for(const std::string& group, const fs::path& lib) {
  Manifest m;
  m.file = "abi_compat_test.yaml";
  GroupEntry e;
  e.name = group;
  e.library = lib;
  e.library_spec = lib.string();
  m.groups.push_back(e);
  return m;
}

bool has_metadata_section(const fs::path& lib) {
  auto elf = ElfFile::open(lib, "plugin library", kMaxPluginLibraryBytes);
  EXPECT_TRUE(elf.ok()) << elf.status().message();
  if (!elf.ok()) return false;
  for (const ElfSection& s : elf->sections()) {
    if (s.name == KREG_METADATA_SECTION) return true;
  }
  return false;
}

struct F32 {
  float data[4];
  int64_t shape[1] = {4};
  DLTensor t;
  explicit F32(float a, float b, float c, float d)
      : data{a, b, c, d}, t{data, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0} {}
};

struct I64 {
  int64_t data[4] = {-7, -7, -7, -7};
  int64_t shape[1];
  DLTensor t;
  explicit I64(int64_t n) : shape{n}, t{data, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0} {}
};

// Host services the core passes through untouched (no kernel here allocates).
void* no_alloc(void*, size_t, DLDevice, void*, kreg_error*) { return nullptr; }
void no_free(void*, void*, size_t, DLDevice, void*) {}
const kreg_host_services kServices{sizeof(kreg_host_services), nullptr, &no_alloc, &no_free};

// ---- an older plugin in this core ----

TEST(AbiCompat, Abi11PluginLoadsListsAndRuns) {
  const fs::path lib = test_plugin("abi_1_1");
  EXPECT_FALSE(has_metadata_section(lib)) << "the 1.1 SDK wrote no metadata section";

  auto p = PluginLibrary::open(lib, {"testgrp", std::string("1.1.0")});
  ASSERT_TRUE(p.ok()) << p.status().message();
  const PluginInfo& info = (*p)->info();
  EXPECT_EQ(info.abi_major, 1);
  EXPECT_EQ(info.abi_minor, 1);
  EXPECT_EQ(info.abi_string(), "1.1");
  EXPECT_FALSE(info.compiler.empty());
  EXPECT_EQ(info.cuda_images, "") << "a CPU-only library's fatbinary is not read";
  ASSERT_EQ((*p)->kernels().size(), 2u);
  const KernelSpec& scale = (*p)->kernels()[0];
  EXPECT_EQ(scale.op, "testgrp.scale");
  EXPECT_EQ(scale.description, "out = alpha * x (built against ABI 1.1)");
  EXPECT_EQ(scale.provenance.source_file, "abi_1_1.cpp");
  ASSERT_EQ(scale.capabilities.size(), 1u);
  EXPECT_EQ(scale.capabilities[0].device_type, kDLCPU);
  EXPECT_EQ(scale.flags, 0u) << "a 1.1 record has no flags";
  EXPECT_EQ(scale.traits, uint32_t{KREG_TRAIT_DETERMINISTIC});

  auto reg = Registry::open(manifest_for("testgrp", lib));
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  auto groups = (*reg)->groups();
  ASSERT_EQ(groups.size(), 1u);
  ASSERT_TRUE(groups[0].plugin.has_value());
  EXPECT_EQ(groups[0].plugin->abi_string(), "1.1");
  EXPECT_EQ(groups[0].ops, (std::vector<std::string>{"testgrp.fail", "testgrp.scale"}));

  // It gets a 1.2 frame (longer than the one it was built for) and host services it
  // does not know about: it reads its own fields and works.
  F32 x(1, 2, 3, 4), out(0, 0, 0, 0);
  DLTensor* args[] = {&x.t, &out.t};
  kreg_attr alpha{KREG_ATTR_FLOAT, 0, {.f = 3.0}};
  ASSERT_TRUE((*reg)
                  ->call("testgrp.scale", args, {&alpha, 1},
                         CallOptions{nullptr, &kServices, KREG_LAUNCH_PDL})
                  .ok());
  EXPECT_FLOAT_EQ(out.data[0], 3.0f);
  EXPECT_FLOAT_EQ(out.data[3], 12.0f);
  kreg_attr code{KREG_ATTR_INT, 0, {.i = KREG_OUT_OF_RANGE}};
  DLTensor* one[] = {&x.t};
  Status st = (*reg)->call("testgrp.fail", one, {&code, 1});
  EXPECT_EQ(st.code(), KREG_OUT_OF_RANGE);
  EXPECT_EQ(st.message(), "testgrp.fail (cpu): asked to fail with code 11");
}

// ---- a newer plugin in this core ----

TEST(AbiCompat, Abi15PluginWithLongerStructsLoadsThroughThe14Fields) {
  const fs::path lib = test_plugin("abi_1_5");
  auto p = PluginLibrary::open(lib, {"future", std::string("1.5.0")});
  ASSERT_TRUE(p.ok()) << p.status().message();
  const PluginInfo& info = (*p)->info();
  EXPECT_EQ(info.abi_major, 1);
  EXPECT_EQ(info.abi_minor, 5);
  EXPECT_EQ(info.abi_string(), "1.5");
  EXPECT_EQ(info.compiler, "hand-written 1.5") << "its longer build info is read as 1.4's";
  ASSERT_EQ((*p)->kernels().size(), 2u);
  for (const KernelSpec& k : (*p)->kernels()) {
    // The frozen caps say cuda sm80-sm90, which a cpu implementation may not claim: had
    // the core read them instead of the 1.4 records, the load would have failed.
    ASSERT_EQ(k.capabilities.size(), 1u) << k.op;
    EXPECT_EQ(k.capabilities[0].device_type, kDLCPU) << k.op;
    EXPECT_EQ(k.capabilities[0].sm_min, 0) << k.op;
    EXPECT_EQ(k.capabilities[0].sm_max, 0) << k.op;
  }
  const KernelSpec& scale = (*p)->kernels()[0];
  const KernelSpec& seen = (*p)->kernels()[1];
  EXPECT_EQ(scale.op, "future.scale");
  EXPECT_EQ(seen.op, "future.seen");
  EXPECT_EQ(scale.description, "out = alpha * x (a 1.5 record)");
  // The flags are read; the bits 1.4 does not know are dropped.
  EXPECT_EQ(scale.flags, 0u);
  EXPECT_EQ(seen.flags, uint32_t{KREG_KERNEL_CAPS_FROM_BUILD});

  auto reg = Registry::open(manifest_for("future", lib));
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  auto groups = (*reg)->groups();
  ASSERT_EQ(groups.size(), 1u);
  ASSERT_TRUE(groups[0].plugin.has_value());
  EXPECT_EQ(groups[0].plugin->abi_string(), "1.5");
  EXPECT_EQ(groups[0].ops, (std::vector<std::string>{"future.scale", "future.seen"}));

  F32 x(1, 2, 3, 4), out(0, 0, 0, 0);
  DLTensor* args[] = {&x.t, &out.t};
  ASSERT_TRUE((*reg)->call("future.scale", args).ok());  // alpha defaults to 2
  EXPECT_FLOAT_EQ(out.data[0], 2.0f);
  EXPECT_FLOAT_EQ(out.data[3], 8.0f);

  // Its kernels get this core's frame: 1.4's size and fields.
  I64 r(4);
  DLTensor* rargs[] = {&r.t};
  ASSERT_TRUE(
      (*reg)
          ->call("future.seen", rargs, {}, CallOptions{nullptr, &kServices, KREG_LAUNCH_PDL})
          .ok());
  EXPECT_EQ(r.data[0], static_cast<int64_t>(sizeof(kreg_call_frame)));
  EXPECT_EQ(r.data[1], static_cast<int64_t>(std::strlen("future.seen")));
  EXPECT_EQ(r.data[2], 1);
  EXPECT_EQ(r.data[3], KREG_LAUNCH_PDL);
}

// ---- another major ----

TEST(AbiCompat, AnotherMajorIsRefusedNamingBothVersions) {
  PluginLibrary::Stage stage{};
  auto p = PluginLibrary::open(test_plugin("abi_major2"), {"testgrp", std::nullopt}, &stage);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), KREG_FAILED_PRECONDITION);
  EXPECT_EQ(stage, PluginLibrary::Stage::kAbi);
  const std::string theirs = "built for kreg ABI " + std::to_string(KREG_ABI_MAJOR + 1) + ".0";
  const std::string ours = "this core speaks ABI " + std::to_string(KREG_ABI_MAJOR) + "." +
                           std::to_string(KREG_ABI_MINOR);
  EXPECT_NE(p.status().message().find(theirs), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find(ours), std::string::npos) << p.status().message();
}

// ---- this core's plugin, in an older core's frame and in this one's ----

TEST(AbiCompat, Plugin12SeesDefaultsInA11FrameAndTheCallersOptionsThroughTheCore) {
  const fs::path lib = test_plugin("frame_report");
  EXPECT_TRUE(has_metadata_section(lib));
  auto p = PluginLibrary::open(lib, {"frame", std::string("0.1.0")});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ((*p)->info().abi_string(),
            std::to_string(KREG_ABI_MAJOR) + "." + std::to_string(KREG_ABI_MINOR));
  ASSERT_EQ((*p)->kernels().size(), 1u);
  const KernelSpec& report = (*p)->kernels()[0];
  ASSERT_EQ(report.op, "frame.report");

  // What a 1.1 core sends: a frame that ends before `op`. The bytes past it are garbage
  // (the 1.2 fields of a larger struct here): the plugin must not read them.
  I64 r(3);
  DLTensor* args[] = {&r.t};
  char buf[256] = {};
  kreg_error err{sizeof err, buf, sizeof buf};
  kreg_call_frame old{};
  std::memset(&old, 0xA5, sizeof old);
  old.struct_size = offsetof(kreg_call_frame, op);
  old.tensors = args;
  old.num_tensors = 1;
  old.num_attrs = 0;
  old.attrs = nullptr;
  old.stream = nullptr;
  ASSERT_EQ(report.fn(&old, &err), KREG_OK) << buf;
  EXPECT_EQ(r.data[0], 0) << "ctx.op() is \"\" in a 1.1 frame";
  EXPECT_EQ(r.data[1], 0) << "no host services in a 1.1 frame";
  EXPECT_EQ(r.data[2], 0) << "no launch flags in a 1.1 frame";

  // Through the core: the op id, the services and the flags of the CallOptions.
  auto reg = Registry::open(manifest_for("frame", lib));
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  I64 s(3);
  DLTensor* sargs[] = {&s.t};
  ASSERT_TRUE(
      (*reg)
          ->call("frame.report", sargs, {}, CallOptions{nullptr, &kServices, KREG_LAUNCH_PDL})
          .ok());
  EXPECT_EQ(s.data[0], static_cast<int64_t>(std::strlen("frame.report")));
  EXPECT_EQ(s.data[1], 1);
  EXPECT_EQ(s.data[2], KREG_LAUNCH_PDL);
  // Without services or flags.
  I64 t(3);
  DLTensor* targs[] = {&t.t};
  ASSERT_TRUE((*reg)->call("frame.report", targs).ok());
  EXPECT_EQ(t.data[0], static_cast<int64_t>(std::strlen("frame.report")));
  EXPECT_EQ(t.data[1], 0);
  EXPECT_EQ(t.data[2], 0);
}

}  // namespace
}  // namespace kreg
