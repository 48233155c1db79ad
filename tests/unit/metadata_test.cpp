// The embedded metadata (kreg/plugin_metadata.hpp): the sections of the real built plugins
// read without loading them and compared with what PluginLibrary::open reads from their
// descriptors; every malformed form of a blob refused with a message naming the byte
// offset and the key; a plugin file patched inside its section reported by
// compare_metadata; a library without the section is NOT_FOUND.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kreg/elf_file.hpp"
#include "kreg/plugin_library.hpp"
#include "kreg/plugin_metadata.hpp"
#include "test_support.hpp"
#include "time_budget.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::contains;
using test::plugin;
using test::read_file;
using test::Scratch;
using test::test_plugin;

// ---- The real plugins ----

struct Loaded {
  std::unique_ptr<PluginLibrary> lib;
  PluginMetadata meta;
};

Loaded read_both(const fs::path& file, const std::string& group) {
  Loaded out;
  auto meta = read_plugin_metadata(file);
  EXPECT_TRUE(meta.ok()) << meta.status().message();
  if (meta.ok()) out.meta = std::move(meta).value();
  auto lib = PluginLibrary::open(file, {group, std::nullopt});
  EXPECT_TRUE(lib.ok()) << lib.status().message();
  if (lib.ok()) out.lib = std::move(lib).value();
  return out;
}

void expect_agree(const fs::path& file, const std::string& group) {
  SCOPED_TRACE(file.string());
  Loaded both = read_both(file, group);
  ASSERT_TRUE(both.lib);
  const PluginMetadata& m = both.meta;
  EXPECT_EQ(m.info.group, group);
  EXPECT_EQ(m.info.path, file);
  EXPECT_EQ(m.info.abi_major, KREG_ABI_MAJOR);
  EXPECT_EQ(m.info.abi_minor, KREG_ABI_MINOR);
  ASSERT_EQ(m.kernels.size(), both.lib->kernels().size());
  EXPECT_FALSE(m.kernels.empty());
  for (const KernelSpec& k : m.kernels) {
    EXPECT_EQ(k.fn, nullptr) << k.op;
    EXPECT_EQ(k.provenance.library, file.string()) << k.op;
    EXPECT_EQ(k.provenance.group, group) << k.op;
    EXPECT_EQ(k.provenance.plugin_version, m.info.version) << k.op;
  }
  const auto diff = compare_metadata(m, both.lib->info(), both.lib->kernels());
  EXPECT_TRUE(diff.empty()) << diff.front();
}

TEST(Metadata, RealPluginsAgreeWithTheirDescriptors) {
  expect_agree(test_plugin("testgrp"), "testgrp");
  expect_agree(plugin("layernorm"), "layernorm");
  expect_agree(plugin("activation"), "activation");
}

TEST(Metadata, TestgrpFacts) {
  auto m = read_plugin_metadata(test_plugin("testgrp"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->info.version, "0.1.0");
  EXPECT_EQ(m->info.cuda_version, 0);
  EXPECT_FALSE(m->info.compiler.empty());
  ASSERT_EQ(m->kernels.size(), 2u);
  const KernelSpec& scale = m->kernels[0];
  EXPECT_EQ(scale.op, "testgrp.scale");
  EXPECT_EQ(scale.backend, "cpu");
  EXPECT_EQ(scale.signature.text, "scale(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0) -> ()");
  EXPECT_EQ(scale.dtypes, mask_of(DType::kF32));
  EXPECT_EQ(scale.traits, uint32_t{KREG_TRAIT_DETERMINISTIC});
  EXPECT_EQ(scale.description, "out = alpha * x (+ a build-dependent offset)");
  EXPECT_EQ(scale.provenance.source_file, "testgrp.cpp");
  ASSERT_EQ(scale.capabilities.size(), 1u);
  EXPECT_EQ(scale.capabilities[0].device_type, kDLCPU);
  EXPECT_EQ(m->kernels[1].op, "testgrp.fail");
}

TEST(Metadata, LayernormFacts) {
  auto m = read_plugin_metadata(plugin("layernorm"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->info.version, "0.1.0");
  const std::map<std::string, std::string> want = {
      {"layernorm.rmsnorm",
       "rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, float eps=1e-6) -> ()"},
      {"layernorm.gemma_rmsnorm",
       "gemma_rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, float eps=1e-6) -> "
       "()"},
      {"layernorm.fused_add_rmsnorm",
       "fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, Tensor[H] weight, "
       "float eps=1e-6) -> ()"},
      {"layernorm.gemma_fused_add_rmsnorm",
       "gemma_fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, Tensor[H] weight, "
       "float eps=1e-6) -> ()"}};
  std::map<std::string, std::string> cpu;
  size_t cuda = 0, jit = 0;
  for (const KernelSpec& k : m->kernels) {
    if (k.backend == "cuda") {
      ++cuda;
      EXPECT_TRUE(k.flags & KREG_KERNEL_CAPS_FROM_BUILD) << k.op;
      continue;
    }
    if (k.backend == "jit") {
      // Listed from the metadata, which does not carry the source (the library does).
      ++jit;
      EXPECT_EQ(k.priority, 200) << k.op;
      EXPECT_EQ(k.provenance.source_file, "rmsnorm_jit.cpp") << k.op;
      EXPECT_EQ(k.flags, 0u) << k.op << ": a jit claim is not derived from the build";
      EXPECT_FALSE(k.jit) << k.op;
      continue;
    }
    ASSERT_EQ(k.backend, "cpu") << k.op;
    EXPECT_TRUE(cpu.emplace(k.op, k.signature.text).second) << k.op << " twice";
    EXPECT_EQ(k.provenance.source_file, "reference.cpp") << k.op;
    EXPECT_EQ(k.dtypes, mask_of(DType::kBF16) | mask_of(DType::kF16) | mask_of(DType::kF32));
    EXPECT_FALSE(k.graph_safe()) << k.op << ": a CPU implementation is never graph safe";
    EXPECT_TRUE(k.deterministic()) << k.op;
    EXPECT_TRUE(k.mutates()) << k.op;  // every signature writes an input
    EXPECT_EQ(k.flags, 0u) << k.op;
  }
  EXPECT_EQ(cpu, want);
  if (m->info.cuda_version == 0) {
    EXPECT_EQ(cuda, 0u) << "a CPU build has no CUDA kernels";
  }
  EXPECT_EQ(jit, cuda) << "every CUDA RMSNorm has a jit implementation beside it";
}

// The reader opens the file and reads its headers, section table and one section: cheap
// enough for start-up (the target: 2 ms for nine groups). The bound here only tells
// "reads the headers" from "reads or verifies the whole file".
TEST(Metadata, ReadingIsCheap) {
  const fs::path file = plugin("layernorm");
  ASSERT_TRUE(read_plugin_metadata(file).ok());  // warm the page cache
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 9; ++i) ASSERT_TRUE(read_plugin_metadata(file).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, test::budget(0.05)) << "nine reads took " << s * 1e3 << " ms";
}

TEST(Metadata, LibraryWithoutTheSectionIsNotFound) {
  const fs::path file = test_plugin("empty_group");
  auto m = read_plugin_metadata(file);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), KREG_NOT_FOUND);
  EXPECT_TRUE(contains(m.status().message(), file.string())) << m.status().message();
  EXPECT_TRUE(contains(m.status().message(), ".kreg_metadata")) << m.status().message();
}

TEST(Metadata, MissingFileAndNonElf) {
  Scratch dir;
  auto missing = read_plugin_metadata(test_plugin("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), KREG_NOT_FOUND);
  auto text = read_plugin_metadata(dir.write("libkreg_text.so", "#!/bin/sh\necho hi\n", 0755));
  ASSERT_FALSE(text.ok());
  EXPECT_TRUE(contains(text.status().message(), "not an ELF")) << text.status().message();
}

// What start-up reads for every lazy group is any file at the library's path: a FIFO (no
// writer), /dev/zero, an empty file or a directory is refused by kind, at once.
TEST(Metadata, FilesThatAreNotLibrariesAreRefusedWithoutWaiting) {
  Scratch dir;
  const fs::path fifo = dir.write("placeholder", "", 0755).parent_path() / "libkreg_fifo.so";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const fs::path zero = fifo.parent_path() / "libkreg_zero.so";
  fs::create_symlink("/dev/zero", zero);
  const fs::path empty = dir.write("libkreg_empty.so", "", 0755);
  const fs::path folder = fifo.parent_path() / "libkreg_dir.so";
  fs::create_directory(folder);
  const std::pair<fs::path, const char*> cases[] = {
      {fifo, "FIFO"}, {zero, "character device"}, {empty, "empty"}, {folder, "directory"}};
  for (const auto& [path, word] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = read_plugin_metadata(path);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_TRUE(contains(r.status().message(), word)) << word << ": " << r.status().message();
    EXPECT_LT(s, kreg::test::budget(2.0)) << path;
  }
}

// A plugin file with one byte changed inside the section's first description: its
// metadata parses, and compare_metadata names the description as the one difference.
TEST(Metadata, PatchedDescriptionIsReported) {
  const fs::path original = test_plugin("testgrp");
  std::string bytes = read_file(original);
  auto elf = ElfFile::from_memory(bytes, "testgrp");
  ASSERT_TRUE(elf.ok()) << elf.status().message();
  auto section = elf->find_section(KREG_METADATA_SECTION);
  ASSERT_TRUE(section.ok()) << section.status().message();
  const std::string blob = bytes.substr(section->offset, section->size);
  const size_t at = blob.find(std::string("\0description=out", 16));
  ASSERT_NE(at, std::string::npos);
  const size_t byte = section->offset + at + 13;  // the 'o' of "out = alpha ..."
  ASSERT_EQ(bytes[byte], 'o');
  bytes[byte] = 'O';
  Scratch dir;
  const fs::path copy = dir.write("libkreg_testgrp.so", bytes, 0755);

  auto m = read_plugin_metadata(copy);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->kernels[0].description, "Out = alpha * x (+ a build-dependent offset)");
  // The descriptor's strings do not live in the section: the loaded copy still says "out".
  auto lib = PluginLibrary::open(copy, {"testgrp", std::nullopt});
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  const auto diff = compare_metadata(*m, (*lib)->info(), (*lib)->kernels());
  std::string all;
  for (const std::string& d : diff) all += d + "\n";
  ASSERT_EQ(diff.size(), 1u) << all;
  EXPECT_TRUE(contains(diff[0], "testgrp.scale (cpu)")) << diff[0];
  EXPECT_TRUE(contains(diff[0], "description")) << diff[0];
  EXPECT_TRUE(contains(diff[0], "\"Out = alpha")) << diff[0];
  EXPECT_TRUE(contains(diff[0], "\"out = alpha")) << diff[0];
}

// ---- compare_metadata on hand-built sides ----

TEST(Metadata, CompareNamesEveryKindOfDifference) {
  auto m = read_plugin_metadata(test_plugin("testgrp"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  PluginInfo info = m->info;
  std::vector<KernelSpec> loaded = m->kernels;
  EXPECT_TRUE(compare_metadata(*m, info, loaded).empty());

  info.version = "9.9.9";
  info.abi_minor = 7;
  info.compiler = "other";
  loaded[0].priority = 5;
  loaded[0].traits |= KREG_TRAIT_GRAPH_SAFE;
  loaded[0].flags = 4;
  loaded[0].capabilities[0].device_type = kDLCUDA;
  loaded[0].provenance.source_file = "other.cpp";
  loaded[0].dtypes = mask_of(DType::kF16);
  loaded.pop_back();  // testgrp.fail: only in the metadata
  KernelSpec extra = loaded[0];
  extra.op = "testgrp.extra";
  loaded.push_back(extra);  // only in the library
  const auto diff = compare_metadata(*m, info, loaded);
  std::string all;
  for (const std::string& d : diff) all += d + "\n";
  for (const char* want :
       {"version differs: metadata \"0.1.0\", library \"9.9.9\"", "ABI differs", "compiler differs",
        "testgrp.scale (cpu): priority differs: metadata 0, library 5",
        "testgrp.scale (cpu): traits differs", "testgrp.scale (cpu): flags differs",
        "testgrp.scale (cpu): capabilities differ", "testgrp.scale (cpu): source differs",
        "testgrp.scale (cpu): dtypes differs",
        "testgrp.fail (cpu): in the metadata but not registered by the library",
        "testgrp.extra (cpu): registered by the library but not in the metadata"}) {
    EXPECT_TRUE(contains(all, want)) << "missing: " << want << "\nin:\n" << all;
  }
  EXPECT_EQ(diff.size(), 11u) << all;
}

// ---- Malformed blobs ----

using Pairs = std::vector<std::pair<std::string, std::string>>;

Pairs valid_pairs() {
  return {{"kreg_metadata", "1"},
          {"abi", "1.2"},
          {"group", "testgrp"},
          {"version", "0.1.0"},
          {"compiler", "GNU 12"},
          {"cuda_version", "0"},
          {"cuda_archs", ""},
          {"kernels", "1"},
          {"kernel", "0"},
          {"op", "testgrp.scale"},
          {"backend", "cpu"},
          {"signature", "scale(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0) -> ()"},
          {"dtypes", "f32"},
          {"arg_kinds", "TTf"},
          {"traits", "5"},
          {"priority", "-3"},
          {"flags", "0"},
          {"caps", "1:0-0"},
          {"description", "out = alpha * x"},
          {"source", "testgrp.cpp"},
          {"end", "1"}};
}

std::string to_blob(const Pairs& pairs) {
  std::string s;
  for (const auto& [k, v] : pairs) {
    s += k;
    s += '=';
    s += v;
    s.push_back('\0');
  }
  return s;
}

// Where pair `index` starts in to_blob(pairs).
size_t offset_of(const Pairs& pairs, size_t index) {
  size_t at = 0;
  for (size_t i = 0; i < index; ++i) at += pairs[i].first.size() + pairs[i].second.size() + 2;
  return at;
}

size_t find_pair(const Pairs& pairs, const std::string& key) {
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (pairs[i].first == key) return i;
  }
  ADD_FAILURE() << "no pair " << key;
  return 0;
}

Pairs with(Pairs p, const std::string& key, const std::string& value) {
  p[find_pair(p, key)].second = value;
  return p;
}

TEST(MetadataParse, ValidBlob) {
  const std::string blob = to_blob(valid_pairs());
  auto m = parse_plugin_metadata(blob, "blob");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->info.group, "testgrp");
  EXPECT_EQ(m->info.abi_major, 1);
  EXPECT_EQ(m->info.abi_minor, 2);
  EXPECT_EQ(m->info.compiler, "GNU 12");
  ASSERT_EQ(m->kernels.size(), 1u);
  EXPECT_EQ(m->kernels[0].priority, -3);
  EXPECT_EQ(m->kernels[0].traits, 5u);
  EXPECT_EQ(m->kernels[0].fn, nullptr);
  // NUL padding after end= is allowed (sections are aligned).
  EXPECT_TRUE(parse_plugin_metadata(blob + std::string(16, '\0'), "blob").ok());
  // A CUDA window with several ranges, and flags.
  Pairs cuda = valid_pairs();
  cuda = with(cuda, "backend", "cuda");
  cuda = with(cuda, "caps", "2:75-75,2:80-90");
  cuda = with(cuda, "flags", "1");
  auto c = parse_plugin_metadata(to_blob(cuda), "blob");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->kernels[0].capabilities.size(), 2u);
  EXPECT_EQ(c->kernels[0].capabilities[1].sm_min, 80);
  EXPECT_EQ(c->kernels[0].capabilities[1].sm_max, 90);
  EXPECT_EQ(c->kernels[0].flags, 1u);
}

// An error of parse_plugin_metadata: its message names `where`, the byte offset and the key.
void expect_error(const std::string& blob, size_t offset, const std::string& key,
                  const std::string& what) {
  auto m = parse_plugin_metadata(blob, "plugin library /x.so");
  ASSERT_FALSE(m.ok()) << "accepted; expected: " << what;
  const std::string& msg = m.status().message();
  EXPECT_EQ(m.status().code(), KREG_INVALID_ARGUMENT) << msg;
  EXPECT_TRUE(contains(msg, "plugin library /x.so")) << msg;
  const std::string at = "byte " + std::to_string(offset);
  EXPECT_TRUE(contains(msg, at + " ") || contains(msg, at + ":"))
      << "offset " << offset << ": " << msg;
  if (!key.empty()) {
    EXPECT_TRUE(contains(msg, "'" + key + "'")) << "key " << key << ": " << msg;
  }
  EXPECT_TRUE(contains(msg, what)) << msg;
}

TEST(MetadataParse, Truncated) {
  const Pairs p = valid_pairs();
  const std::string blob = to_blob(p);
  const size_t sig = find_pair(p, "signature");
  // Cut inside the signature's value: the pair has no NUL.
  expect_error(blob.substr(0, offset_of(p, sig) + 20), offset_of(p, sig), "signature", "truncated");
  // Cut at a pair boundary: the next key is missing.
  expect_error(blob.substr(0, offset_of(p, sig)), offset_of(p, sig), "signature", "truncated");
  // Empty.
  expect_error("", 0, "kreg_metadata", "truncated");
}

TEST(MetadataParse, MissingKey) {
  Pairs p = valid_pairs();
  const size_t dtypes = find_pair(p, "dtypes");
  p.erase(p.begin() + static_cast<long>(dtypes));
  expect_error(to_blob(p), offset_of(p, dtypes), "arg_kinds", "expected 'dtypes'");
  Pairs no_end = valid_pairs();
  no_end.pop_back();
  expect_error(to_blob(no_end), to_blob(no_end).size(), "end", "truncated");
}

TEST(MetadataParse, OutOfOrder) {
  Pairs p = valid_pairs();
  const size_t traits = find_pair(p, "traits");
  std::swap(p[traits], p[traits + 1]);  // priority before traits
  expect_error(to_blob(p), offset_of(p, traits), "priority", "out of order: expected 'traits'");
}

TEST(MetadataParse, Repeated) {
  Pairs p = valid_pairs();
  const size_t backend = find_pair(p, "backend");
  p.insert(p.begin() + static_cast<long>(backend) + 1, {"op", "testgrp.scale"});
  expect_error(to_blob(p), offset_of(p, backend + 1), "op",
               "repeated key (first at byte " + std::to_string(offset_of(p, backend - 1)) + ")");
  Pairs header = valid_pairs();
  header.insert(header.begin() + 3, {"group", "other"});
  expect_error(to_blob(header), offset_of(header, 3), "group", "repeated key");
}

TEST(MetadataParse, UnknownKey) {
  Pairs p = valid_pairs();
  const size_t caps = find_pair(p, "caps");
  p.insert(p.begin() + static_cast<long>(caps), {"colour", "red"});
  expect_error(to_blob(p), offset_of(p, caps), "colour", "unknown key; expected 'caps'");
  // A key with a byte outside [a-z_], and a pair without '='.
  Pairs upper = valid_pairs();
  upper[find_pair(upper, "group")].first = "Group";
  expect_error(to_blob(upper), offset_of(upper, 2), "", "in a key");
  const Pairs all = valid_pairs();
  const std::string no_eq =
      to_blob({all[0]}) + std::string("abi\0", 4) + to_blob(Pairs(all.begin() + 2, all.end()));
  expect_error(no_eq, offset_of(all, 1), "abi", "no '='");
}

TEST(MetadataParse, BadNumbers) {
  const Pairs p = valid_pairs();
  const size_t traits = find_pair(p, "traits");
  const size_t tv = offset_of(p, traits) + 7;  // after "traits="
  expect_error(to_blob(with(p, "traits", "12x")), tv, "traits", "12x");
  expect_error(to_blob(with(p, "traits", "")), tv, "traits", "");
  expect_error(to_blob(with(p, "traits", "-1")), tv, "traits", "");
  expect_error(to_blob(with(p, "traits", "4294967296")), tv, "traits", "4294967296");
  expect_error(to_blob(with(p, "flags", "0x1")), offset_of(p, find_pair(p, "flags")) + 6, "flags",
               "0x1");
  const size_t prio = offset_of(p, find_pair(p, "priority")) + 9;
  expect_error(to_blob(with(p, "priority", "2147483648")), prio, "priority", "2147483648");
  expect_error(to_blob(with(p, "priority", "+1")), prio, "priority", "+1");
  const size_t caps = offset_of(p, find_pair(p, "caps")) + 5;
  expect_error(to_blob(with(p, "caps", "1:0-x")), caps, "caps", "1:0-x");
  expect_error(to_blob(with(p, "caps", "1:0")), caps, "caps", "<device_type>:<sm_min>-<sm_max>");
  expect_error(to_blob(with(p, "caps", "1:0-0,")), caps + 6, "caps", "");
  expect_error(to_blob(with(p, "caps", "2:2147483648-90")), caps, "caps", "2147483648");
  expect_error(to_blob(with(p, "abi", "1")), offset_of(p, 1) + 4, "abi", "<major>.<minor>");
  expect_error(to_blob(with(p, "abi", "1.70000")), offset_of(p, 1) + 4, "abi", "70000");
  expect_error(to_blob(with(p, "kreg_metadata", "2")), 14, "kreg_metadata", "format 2");
  expect_error(to_blob(with(p, "kernel", "1")), offset_of(p, find_pair(p, "kernel")) + 7, "kernel",
               "kernel 1 where kernel 0");
  expect_error(to_blob(with(p, "end", "2")), offset_of(p, find_pair(p, "end")) + 4, "end",
               "end=2 after 1 kernels");
}

TEST(MetadataParse, IntegerOverflowPastInt64) {
  const Pairs p = valid_pairs();
  for (const char* key : {"priority", "traits", "cuda_version", "kernels"}) {
    SCOPED_TRACE(key);
    const size_t i = find_pair(p, key);
    expect_error(to_blob(with(p, key, "99999999999999999999")),
                 offset_of(p, i) + std::string(key).size() + 1, key, "99999999999999999999");
    expect_error(to_blob(with(p, key, "-99999999999999999999")),
                 offset_of(p, i) + std::string(key).size() + 1, key, "");
  }
}

TEST(MetadataParse, HugeCounts) {
  const Pairs p = valid_pairs();
  const size_t kernels = offset_of(p, find_pair(p, "kernels")) + 8;
  expect_error(to_blob(with(p, "kernels", std::to_string(kMaxPluginKernels + 1))), kernels,
               "kernels", std::to_string(kMaxPluginKernels + 1));
  expect_error(to_blob(with(p, "kernels", "18446744073709551615")), kernels, "kernels", "");
  // A count within the limit but more kernels than the blob holds: truncated, not a hang.
  const Pairs many = with(p, "kernels", std::to_string(kMaxPluginKernels));
  expect_error(to_blob(many), offset_of(many, find_pair(many, "end")), "kernel",
               "expected 'kernel'");
  // More capability windows than a kernel may have.
  std::string caps;
  for (uint32_t i = 0; i <= kMaxPluginCapabilities; ++i)
    caps += (i ? "," : "") + std::string("1:0-0");
  auto m = parse_plugin_metadata(to_blob(with(p, "caps", caps)), "blob");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(contains(m.status().message(), "'caps'")) << m.status().message();
  // The whole blob past the limit.
  auto big = parse_plugin_metadata(std::string(kMaxMetadataBytes + 1, 'a'), "blob");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), KREG_RESOURCE_EXHAUSTED) << big.status().message();
  // A value past the string limit.
  const std::string longer(kMaxPluginStringBytes + 1, 'a');
  expect_error(to_blob(with(p, "description", longer)), offset_of(p, find_pair(p, "description")),
               "description", "the limit is " + std::to_string(kMaxPluginStringBytes));
}

TEST(MetadataParse, BytesAfterEnd) {
  const std::string blob = to_blob(valid_pairs());
  expect_error(blob + "x", blob.size(), "", "bytes after 'end'");
  expect_error(blob + std::string(8, '\0') + "junk=1", blob.size() + 8, "", "bytes after 'end'");
}

TEST(MetadataParse, NulLaden) {
  const Pairs p = valid_pairs();
  const size_t op = find_pair(p, "op");
  // A NUL between pairs: an empty pair where 'op' was expected.
  std::string blob = to_blob(p);
  blob.insert(offset_of(p, op), 1, '\0');
  expect_error(blob, offset_of(p, op), "op", "empty pair");
  // A NUL inside a value: the rest of the value reads as a pair of its own.
  const size_t desc = find_pair(p, "description");
  std::string inside = to_blob(p);
  inside[offset_of(p, desc) + 12 + 3] = '\0';  // "description=out\0= alpha * x"
  expect_error(inside, offset_of(p, desc) + 16, "", "an empty key");
  inside = to_blob(p);
  inside[offset_of(p, desc) + 12 + 5] = '\0';                     // "description=out =\0alpha * x"
  expect_error(inside, offset_of(p, desc) + 23, "", "in a key");  // the space after "alpha"
  // Only NULs.
  expect_error(std::string(64, '\0'), 0, "kreg_metadata", "empty pair");
}

TEST(MetadataParse, EscapeCodesInValues) {
  const Pairs p = valid_pairs();
  const size_t desc = offset_of(p, find_pair(p, "description")) + 12;
  expect_error(to_blob(with(p, "description", "red \x1b[31mtext")), desc + 4, "description",
               "control byte \\x1b");
  expect_error(to_blob(with(p, "op", "testgrp.sc\rale")), offset_of(p, find_pair(p, "op")) + 13,
               "op", "control byte");
  expect_error(to_blob(with(p, "compiler", "GNU\x7f")), offset_of(p, 4) + 12, "compiler",
               "control byte");
  expect_error(to_blob(with(p, "group", "test grp")), offset_of(p, 2) + 10, "group", "a space");
  // Tabs and newlines are text in a description.
  EXPECT_TRUE(parse_plugin_metadata(to_blob(with(p, "description", "a\tb\nc")), "blob").ok());
}

// Each kernel goes through make_kernel_spec: its errors name the kernel's offset.
TEST(MetadataParse, KernelRecordsAreChecked) {
  const Pairs p = valid_pairs();
  const size_t kernel = offset_of(p, find_pair(p, "kernel"));
  expect_error(to_blob(with(p, "signature", "scale(Tensor[N] x) -> ()")), kernel, "kernel",
               "argument kinds");
  expect_error(to_blob(with(p, "op", "othergrp.scale")), kernel, "kernel", "belongs to group");
  expect_error(to_blob(with(p, "caps", "")), kernel, "kernel", "no capabilities");
  expect_error(to_blob(with(p, "caps", "1:0-0,2:75-80")), kernel, "kernel", "does not match");
  expect_error(to_blob(with(p, "dtypes", "f33")), kernel, "kernel", "unknown dtype");
}

}  // namespace
}  // namespace kreg
