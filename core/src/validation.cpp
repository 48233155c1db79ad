// The checks behind `kreg validate`. Per group they run from the outside in: the file
// (present, safe, pinned), its ELF symbol table, then a child process that loads it; every
// check after that works on what the child reported, so a broken plugin can crash only
// its child. docs/validation.md describes each check.
#include "kreg/validation.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <system_error>

#include "kreg/admission.hpp"
#include "kreg/dtype.hpp"
#include "kreg/elf_file.hpp"
#include "kreg/jit.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/plugin_library.hpp"
#include "kreg/plugin_probe.hpp"
#include "kreg/regular_file.hpp"
#include "kreg/sha256.hpp"
#include "kreg/source_tree.hpp"
#include "kreg/text.hpp"

namespace kreg {

namespace fs = std::filesystem;

const std::vector<std::string>& validation_checks() {
  static const std::vector<std::string> kChecks = {
      "manifest-schema", "library-present",   "path-safety",      "integrity",
      "library-loads",   "abi-version",       "group-name-match", "plugin-version",
      "metadata-match",  "op-naming",         "no-test-ops",      "schema",
      "no-empty-groups", "reference-present", "arch-coverage",    "sources-built",
      "unique-ops",      "aliases",           "groups-guard",     "jit-sources"};
  return kChecks;
}

namespace {

class Reporter {
 public:
  explicit Reporter(ValidationReport& r) : r_(r) {}
  void pass(const std::string& check, const std::string& group, std::string note = "") {
    r_.outcomes.push_back({check, group, true, false, std::move(note)});
  }
  void skip(const std::string& check, const std::string& group, std::string note) {
    r_.outcomes.push_back({check, group, true, true, std::move(note)});
  }
  void fail(const std::string& check, const std::string& group, const std::string& where,
            const std::string& message) {
    r_.outcomes.push_back({check, group, false});
    add({check, group, where, message});
  }
  // Records a failure for `check` without adding an outcome line (several findings, or
  // an outcome recorded separately).
  void also(const std::string& check, const std::string& group, const std::string& where,
            const std::string& message) {
    add({check, group, where, message});
  }
  void warn(const std::string& check, const std::string& group, const std::string& where,
            const std::string& message) {
    r_.warnings.push_back({check, group, where, message});
  }
  void outcome(const std::string& check, const std::string& group, bool passed) {
    r_.outcomes.push_back({check, group, passed});
  }
  // Findings recorded so far for `check` (and `group`, unless "*"), listed or not.
  size_t count(const std::string& check, const std::string& group) const {
    size_t n = 0;
    for (const auto& [key, k] : totals_) {
      if (key.first == check && (group == "*" || key.second == group)) n += k;
    }
    return n;
  }
  // One finding per check that found more than it lists: how many more.
  void finish() {
    for (const auto& [check, n] : per_check_) {
      if (n <= kMaxFindingsPerCheck) continue;
      r_.findings.push_back({check, "", "",
                             std::to_string(n - kMaxFindingsPerCheck) +
                                 " more findings of this check are not listed (the first " +
                                 std::to_string(kMaxFindingsPerCheck) + " are)"});
    }
  }

 private:
  // At most kMaxFindingsPerCheck findings of one check are listed and the rest counted: a
  // hostile input (an expected-groups file of 100,000 names) cannot make the report
  // megabytes long.
  void add(Finding f) {
    ++totals_[{f.check, f.group}];
    if (++per_check_[f.check] <= kMaxFindingsPerCheck) r_.findings.push_back(std::move(f));
  }
  ValidationReport& r_;
  std::map<std::pair<std::string, std::string>, size_t> totals_;
  std::map<std::string, size_t> per_check_;
};

bool is_snake(std::string_view s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// A test registration shipped in a plugin: the name is `test`, or starts with `test_`
// or ends with `_test` (a group named like testgrp is fine: fixtures use one).
bool is_test_name(std::string_view name) {
  return name == "test" || name.starts_with("test_") || name.ends_with("_test");
}

// "plugins/layernorm" for messages: relative to the manifest's folder when inside it.
std::string display(const fs::path& p, const fs::path& base) {
  const fs::path rel = p.lexically_relative(base);
  if (!rel.empty() && *rel.begin() != "..") return rel.generic_string();
  return p.string();
}

struct Context {
  const Manifest& manifest;
  const ValidateOptions& options;
  Reporter& rep;
  ValidationReport& report;
  bool have_src = false;
  fs::path src;
  std::map<std::string, std::string> op_owner;  // op id -> "group (library)"
  std::set<std::string> all_ops;
};

// The library-loads family: the ELF/symbol check here, then the child-process load.
// Returns what the child read, or nothing when the group did not load.
// `file` is what is read and loaded: the library itself, or the private copy whose bytes
// were hashed for the pin; messages name the library either way.
struct LoadOutcome {
  std::optional<PluginSnapshot> snapshot;
  bool records_refused = false;  // the child refused a kernel record (op-naming / schema)
};

// A message about `file` (the private copy when pinned) that names the library instead.
std::string named(std::string msg, const fs::path& file, const fs::path& library) {
  if (file == library) return msg;
  const std::string copy = file.string(), lib = library.string();
  for (size_t at = msg.find(copy); at != std::string::npos; at = msg.find(copy, at + lib.size())) {
    msg.replace(at, copy.size(), lib);
  }
  return msg;
}

LoadOutcome load_in_child(Context& cx, const GroupEntry& g, const fs::path& file) {
  Reporter& rep = cx.rep;
  const std::string where = g.library_where.to_string();
  LoadOutcome out;
  if (Status st = check_entry_symbol(file); !st.ok()) {
    rep.fail("library-loads", g.name, where, named(st.message(), file, g.library));
    return out;
  }
  ProbeOptions popts;
  popts.timeout_s = cx.options.timeout_s;
  ProbeResult probe = probe_plugin(file, {g.name, g.version}, popts);
  probe.message = named(std::move(probe.message), file, g.library);
  // No kreg-probe: the load ran in a fork of this (single-threaded) validator; say so.
  if (!probe.forked.empty()) rep.warn("library-loads", g.name, where, probe.forked);
  if (probe.ok()) {
    for (const char* c : {"library-loads", "abi-version", "group-name-match", "plugin-version"}) {
      rep.pass(c, g.name);
    }
    out.snapshot = std::move(probe.snapshot);
    return out;
  }
  const std::string& msg = probe.message;
  if (probe.end != ProbeEnd::kRefused) {
    rep.fail("library-loads", g.name, where, msg);
    return out;
  }
  using Stage = PluginLibrary::Stage;
  switch (probe.stage) {
    case Stage::kAbi:
      rep.pass("library-loads", g.name);
      rep.fail("abi-version", g.name, where, msg);
      break;
    case Stage::kGroup:
      rep.pass("library-loads", g.name);
      rep.pass("abi-version", g.name);
      rep.fail("group-name-match", g.name, where, msg);
      break;
    case Stage::kVersion:
      rep.pass("library-loads", g.name);
      rep.pass("abi-version", g.name);
      rep.pass("group-name-match", g.name);
      rep.fail("plugin-version", g.name, where, msg);
      break;
    case Stage::kKernels:
      rep.pass("library-loads", g.name);
      rep.pass("abi-version", g.name);
      rep.pass("group-name-match", g.name);
      rep.pass("plugin-version", g.name);
      rep.fail(msg.find("op id") != std::string::npos ||
                       msg.find("belongs to group") != std::string::npos
                   ? "op-naming"
                   : "schema",
               g.name, where, msg);
      out.records_refused = true;
      break;
    default:
      rep.fail("library-loads", g.name, where, msg);
      break;
  }
  return out;
}

// jit-sources: every jit implementation's source compiles, with NVRTC, for each
// architecture the plugin was built for, in every dtype it takes, at a representative
// specialization (every dimension parameter 128). The compiles run in the probe's child
// (kreg-probe --compile-jit), with a timeout: a compile that hangs or crashes fails the
// rule, not the validator. Results land in the JIT cache, so a second run is fast.
void check_jit_sources(Context& cx, const GroupEntry& g, const fs::path& file,
                       const PluginSnapshot& snap) {
  Reporter& rep = cx.rep;
  const bool any = std::any_of(snap.kernels.begin(), snap.kernels.end(),
                               [](const KernelRecord& k) { return k.backend == "jit"; });
  if (!any) return rep.pass("jit-sources", g.name, "no jit implementations");
  if (auto v = jit::nvrtc_version(); !v) {
    return rep.skip("jit-sources", g.name, "NVRTC is not available here: " + v.status().message());
  }
  ProbeOptions popts;
  // Compiles take longer than loads: six times the load timeout, at least 30 s.
  popts.timeout_s = std::max(30.0, 6 * cx.options.timeout_s);
  popts.run_init = false;  // NVRTC needs no init hook (library-loads ran it)
  popts.compile_jit = true;
  const ProbeResult probe = probe_plugin(file, {g.name, g.version}, popts);
  const std::string where = g.library_where.to_string();
  if (!probe.forked.empty()) rep.warn("jit-sources", g.name, where, probe.forked);
  if (!probe.ok()) {
    std::string msg = named(probe.message, file, g.library);
    if (probe.end == ProbeEnd::kRefused) msg = "cannot load: " + msg;
    return rep.fail("jit-sources", g.name, where, msg);
  }
  if (!probe.jit.failures.empty()) {
    std::string report;
    for (const std::string& f : probe.jit.failures) report += (report.empty() ? "" : "\n") + f;
    return rep.fail("jit-sources", g.name, where, report);
  }
  rep.pass("jit-sources", g.name);
}

// What the library says without being loaded: its ELF structure (for the CUDA images)
// and its embedded metadata, read from `file` (the bytes the pin checked).
struct StaticView {
  std::optional<ElfFile> elf;  // unset: not readable as ELF (library-loads reports it)
  std::optional<Result<PluginMetadata>> metadata;
};

StaticView read_static(const GroupEntry& g, const fs::path& file) {
  StaticView v;
  auto elf = ElfFile::open(file, "plugin library", kMaxPluginLibraryBytes);
  if (!elf) return v;
  v.elf = std::move(elf).value();
  auto m = read_plugin_metadata(*v.elf, g.library);
  if (!m) {
    v.metadata = Status(m.status().code(), named(m.status().message(), file, g.library));
  } else {
    v.metadata = std::move(m);
  }
  return v;
}

KernelRecord record_of(const KernelSpec& k) {
  return KernelRecord{
      k.op,       k.backend, k.signature.text, dtype_set_name(k.dtypes), k.capabilities, k.traits,
      k.priority, k.flags,   k.description,    k.provenance.source_file};
}

// The child's records as specs (what compare_metadata and check_arch_coverage take). The
// child accepted each, so the signature and dtypes parse.
std::vector<KernelSpec> specs_of(const PluginSnapshot& snap) {
  std::vector<KernelSpec> out;
  for (const KernelRecord& k : snap.kernels) {
    KernelSpec s;
    s.op = k.op;
    s.backend = k.backend;
    s.capabilities = k.capabilities;
    if (auto sig = parse_signature(k.signature)) {
      s.signature = std::move(sig).value();
    } else {
      s.signature.text = k.signature;
    }
    s.dtypes = parse_dtype_set(k.dtypes).value_or(0);
    s.traits = k.traits;
    s.flags = k.flags;
    s.priority = k.priority;
    s.description = k.description;
    s.provenance = {snap.info.group, snap.info.version, snap.info.path.string(), k.source_file};
    out.push_back(std::move(s));
  }
  return out;
}

// metadata-match: the embedded metadata against the loaded descriptor (as the child read
// it). A library without metadata is a warning: it still works, but lists as "metadata
// unavailable" until loaded.
void check_metadata_match(Context& cx, const GroupEntry& g, const StaticView& view,
                          const LoadOutcome& load) {
  Reporter& rep = cx.rep;
  const std::string lib = g.library.string();
  if (!view.metadata) {
    rep.skip("metadata-match", g.name, "not readable as an ELF file (library-loads reports it)");
    return;
  }
  const Result<PluginMetadata>& meta = *view.metadata;
  if (!meta.ok()) {
    if (meta.status().code() == KREG_NOT_FOUND) {
      rep.pass("metadata-match", g.name,
               "no " KREG_METADATA_SECTION " section (built before SDK 1.2)");
      rep.warn("metadata-match", g.name, lib,
               lib + " has no embedded metadata (section " KREG_METADATA_SECTION
                     ", SDK 1.2): it was built before SDK 1.2 or without KREG_GROUP / "
                     "KREG_PLUGIN, so tools cannot list it without loading it; rebuild it");
    } else if (load.records_refused) {
      rep.skip("metadata-match", g.name,
               "the library's kernel records were refused (op-naming / schema report it)");
    } else {
      rep.fail("metadata-match", g.name, lib,
               "the embedded metadata cannot be read: " + meta.status().message());
    }
    return;
  }
  if (!load.snapshot) {
    rep.skip("metadata-match", g.name, "the library did not load: nothing to compare with");
    return;
  }
  const auto diff = metadata_differences(*meta, *load.snapshot);
  for (const std::string& d : diff) {
    rep.also("metadata-match", g.name, lib,
             "the embedded metadata and the loaded library disagree: " + d);
  }
  rep.outcome("metadata-match", g.name, diff.empty());
}

// arch-coverage: every CUDA implementation's claim against the CUDA images the library
// really holds (its fatbinary), read without loading it.
void check_arch(Context& cx, const GroupEntry& g, const StaticView& view,
                const std::vector<KernelSpec>* kernels) {
  Reporter& rep = cx.rep;
  const std::string lib = g.library.string();
  if (kernels == nullptr) {
    rep.skip("arch-coverage", g.name, "no kernel records (the library did not load)");
    return;
  }
  const bool any_cuda = std::any_of(kernels->begin(), kernels->end(), [](const KernelSpec& k) {
    return k.backend == "cuda" || k.backend == "nccl";
  });
  if (!any_cuda) {
    rep.pass("arch-coverage", g.name, "no CUDA implementations");
    return;
  }
  if (!view.elf) {
    rep.skip("arch-coverage", g.name, "not readable as an ELF file (library-loads reports it)");
    return;
  }
  auto images = read_cuda_images(*view.elf);
  if (!images) {
    rep.fail("arch-coverage", g.name, lib, images.status().message());
    return;
  }
  const auto problems = arch_coverage_problems(*kernels, *images, lib);
  for (const std::string& p : problems) rep.also("arch-coverage", g.name, lib, p);
  rep.outcome("arch-coverage", g.name, problems.empty());
}

// op-naming, no-test-ops, schema, no-empty-groups, reference-present and the in-group
// part of unique-ops, on the child's records.
void check_records(Context& cx, const GroupEntry& g, const PluginSnapshot& snap) {
  Reporter& rep = cx.rep;
  const std::string lib = g.library.string();
  const std::string where = g.library_where.to_string();
  bool naming_ok = true, tests_ok = true;
  std::set<std::string> ops;
  std::map<std::string, std::set<std::string>> backends;
  for (const KernelRecord& k : snap.kernels) {
    const std::string name(k.name());
    const std::string group = k.op.substr(0, k.op.find('.'));
    if (group != g.name) {
      rep.also("op-naming", g.name, lib,
               k.op + " (" + k.backend + "): op id prefix '" + group + "' is not the group '" +
                   g.name + "'");
      naming_ok = false;
    }
    if (name.starts_with("jit_") || name.ends_with("_jit")) {
      rep.also("op-naming", g.name, lib, k.op + ": no jit_/_jit prefixes in op names");
      naming_ok = false;
    }
    if (!is_snake(name)) {
      rep.also("op-naming", g.name, lib, k.op + ": op name is not snake_case");
      naming_ok = false;
    }
    if (is_test_name(name) && !ops.count(k.op)) {
      rep.also("no-test-ops", g.name, lib,
               k.op + " (" + k.backend + ", source " + k.source_file +
                   ") is a test registration in a shipped plugin; register test kernels "
                   "from the tests (Registry::add), not from the plugin");
      tests_ok = false;
    }
    if (!backends[k.op].insert(k.backend).second) {
      rep.also("unique-ops", g.name, lib,
               k.op + " (" + k.backend + ") is registered twice in the same plugin");
    }
    ops.insert(k.op);
  }
  rep.outcome("op-naming", g.name, naming_ok);
  rep.outcome("no-test-ops", g.name, tests_ok);
  rep.pass("schema", g.name);  // the child's make_kernel_spec parsed every record
  if (snap.kernels.empty()) {
    rep.fail("no-empty-groups", g.name, where, "group '" + g.name + "' registers no kernels");
  } else {
    rep.pass("no-empty-groups", g.name);
  }
  bool refs_ok = true;
  for (const std::string& op : ops) {
    const WaiverEntry* waiver = cx.manifest.find_waiver(op, "reference-present");
    if (!backends[op].count("cpu") && waiver == nullptr) {
      refs_ok = false;
      rep.also("reference-present", g.name, lib,
               op + " has no CPU reference implementation (backend 'cpu') and no waiver");
    } else if (backends[op].count("cpu") && waiver != nullptr) {
      refs_ok = false;  // a stale waiver hides nothing but misleads readers
      rep.also("reference-present", g.name, waiver->where.to_string(),
               "waiver for " + op + " is stale: it has a CPU reference; remove the waiver");
    }
    if (auto [it, fresh] = cx.op_owner.emplace(op, g.name + " (" + lib + ")"); !fresh) {
      rep.also("unique-ops", g.name, lib,
               op + " is registered by " + it->second + " and by " + g.name + " (" + lib + ")");
    }
    cx.all_ops.insert(op);
  }
  rep.outcome("reference-present", g.name, refs_ok);
  cx.report.ops += ops.size();
}

// sources-built: every .cu/.cpp in the group's folder is compiled into its library, and
// every kernel record names a source file that exists there.
void check_sources(Context& cx, const GroupEntry& g, const PluginSnapshot* snap) {
  Reporter& rep = cx.rep;
  const fs::path base = cx.manifest.file.parent_path();
  if (!cx.have_src) {
    rep.skip("sources-built", g.name,
             "no plugin source tree at " + cx.src.string() + "; name one with --plugins-src");
    return;
  }
  const fs::path folder = cx.src / g.name;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    rep.skip("sources-built", g.name,
             "no folder " + display(folder, base) + " (groups-guard reports it)");
    return;
  }
  const fs::path cmake = folder / "CMakeLists.txt";
  const std::string cmake_name = display(cmake, base);
  bool ok = true;
  auto text = read_text_file(cmake);
  std::optional<PluginBuild> build;
  if (text) build = parse_plugin_build(*text);
  if (!build) {
    rep.fail("sources-built", g.name, cmake_name,
             text ? cmake_name + " has no kreg_add_plugin(" + g.name +
                        " SOURCES ...) call: the group's sources are not built"
                  : "cannot read " + cmake_name + ": the group's sources are not built");
    return;
  }
  const std::string call = cmake_name + ":" + std::to_string(build->line);
  if (!build->unresolved.empty()) {
    std::string list;
    for (const std::string& u : build->unresolved) list += (list.empty() ? "" : ", ") + u;
    rep.skip("sources-built", g.name,
             "kreg_add_plugin at " + call + " lists sources kreg cannot evaluate (" + list +
                 "); list them literally to have them checked");
    return;
  }
  for (const std::string& file : kernel_sources(folder)) {
    if (build->sources.count(file)) continue;
    ok = false;
    rep.also("sources-built", g.name, display(folder / file, base),
             display(folder / file, base) + " is not listed in kreg_add_plugin(" + build->group +
                 " ...) at " + call +
                 ", so it is never compiled (an orphan); add it to SOURCES or CUDA_SOURCES, "
                 "or delete it");
  }
  if (snap != nullptr) {
    std::set<std::string> reported;
    for (const KernelRecord& k : snap->kernels) {
      const std::string id = k.op + " (" + k.backend + ")";
      if (k.source_file.empty()) {
        ok = false;
        rep.also("sources-built", g.name, g.library.string(),
                 id + " names no source file (.source in its KernelDef)");
        continue;
      }
      if (fs::is_regular_file(folder / k.source_file, ec) || !reported.insert(id).second) {
        continue;
      }
      ok = false;
      rep.also("sources-built", g.name, g.library.string(),
               id + " says it comes from '" + k.source_file + "', which does not exist in " +
                   display(folder, base) + "/");
    }
  }
  rep.outcome("sources-built", g.name, ok);
}

// A waiver must name an op that exists (the per-group pass flags waivers made stale by a
// new CPU reference). Skipped while a group failed to load: its ops are unknown then.
void check_waivers(Context& cx, bool all_groups_loaded) {
  if (!all_groups_loaded) return;
  for (const WaiverEntry& w : cx.manifest.waivers) {
    if (!cx.all_ops.count(w.op)) {
      cx.rep.fail("reference-present", "", w.where.to_string(),
                  "waiver for " + w.op + ": no loaded group registers this op; remove the waiver");
    }
  }
}

void check_aliases(Context& cx) {
  bool aliases_ok = true;
  std::map<std::string, std::string> alias_to;
  for (const AliasEntry& a : cx.manifest.aliases) alias_to[a.from] = a.to;
  for (const AliasEntry& a : cx.manifest.aliases) {
    const std::string where = a.where.to_string();
    auto bad = [&](const std::string& msg) {
      aliases_ok = false;
      cx.rep.also("aliases", "", where, msg);
    };
    if (cx.options.forbid_aliases) {
      bad("alias " + a.from + " -> " + a.to + " is not allowed (--no-aliases)");
      continue;
    }
    if (cx.all_ops.count(a.from)) bad("alias " + a.from + " shadows a real op of the same name");
    // Follow the chain: it must end at a real op without revisiting an alias.
    std::set<std::string> seen{a.from};
    std::string cur = a.to;
    while (alias_to.count(cur) && !seen.count(cur)) {
      seen.insert(cur);
      cur = alias_to[cur];
    }
    if (seen.count(cur) && alias_to.count(cur)) {
      bad("alias " + a.from + " is part of a cycle through " + cur);
    } else if (!cx.all_ops.count(cur)) {
      bad("alias " + a.from + " -> " + a.to + ": target op " + cur + " does not exist");
    }
  }
  cx.rep.outcome("aliases", "", aliases_ok);
}

// groups-guard: manifest groups == group folders == libraries, and == the expected list.
void check_groups_guard(Context& cx) {
  Reporter& rep = cx.rep;
  const Manifest& m = cx.manifest;
  const fs::path base = m.file.parent_path();
  const std::string manifest_name = m.file.string();
  std::set<std::string> in_manifest;
  for (const GroupEntry& g : m.groups) in_manifest.insert(g.name);
  std::vector<std::string> notes;

  std::optional<std::vector<std::string>> expected = cx.options.expect_groups;
  std::string expected_from = cx.options.expect_groups_source;
  if (!expected && m.expect_groups) {
    expected = m.expect_groups;
    expected_from = "expect_groups at " + m.expect_groups_where.to_string();
  }
  if (expected) {
    const std::set<std::string> want(expected->begin(), expected->end());
    for (const std::string& name : want) {
      if (!in_manifest.count(name)) {
        rep.also("groups-guard", name, manifest_name,
                 "group '" + name + "' is expected (" + expected_from +
                     ") but the manifest does not list it");
      }
    }
    for (const GroupEntry& g : m.groups) {
      if (!want.count(g.name)) {
        rep.also("groups-guard", g.name, g.where.to_string(),
                 "group '" + g.name + "' is in the manifest but not in the expected groups (" +
                     expected_from + ")");
      }
    }
  }

  if (cx.have_src) {
    const std::vector<std::string> folders = group_folders(cx.src);
    const std::set<std::string> folder_set(folders.begin(), folders.end());
    for (const GroupEntry& g : m.groups) {
      if (!folder_set.count(g.name)) {
        rep.also("groups-guard", g.name, g.where.to_string(),
                 "group '" + g.name + "' is in the manifest but there is no folder " +
                     display(cx.src / g.name, base) + " with a CMakeLists.txt");
      }
    }
    std::set<std::string> built;
    const fs::path top = cx.src / "CMakeLists.txt";
    const auto top_text = read_text_file(top);
    if (top_text) built = parse_subdirectories(*top_text);
    for (const std::string& f : folders) {
      const fs::path folder = cx.src / f;
      if (!in_manifest.count(f)) {
        rep.also("groups-guard", f, display(folder, base),
                 "folder " + display(folder, base) + " is a plugin group but the manifest " +
                     manifest_name + " does not list group '" + f + "'");
      }
      if (top_text && !built.count(f)) {
        rep.also("groups-guard", f, display(top, base),
                 "folder " + display(folder, base) + " is not built: " + display(top, base) +
                     " has no add_subdirectory(" + f + ")");
      }
      if (auto text = read_text_file(folder / "CMakeLists.txt")) {
        if (auto build = parse_plugin_build(*text); build && build->group != f) {
          rep.also("groups-guard", f,
                   display(folder / "CMakeLists.txt", base) + ":" + std::to_string(build->line),
                   "folder " + display(folder, base) + " builds group '" + build->group +
                       "' (kreg_add_plugin); a group's folder must carry its name");
        }
      }
    }
    // Libraries in the plugin folder that no group names: a removed or renamed group's
    // stale build, which a manifest edit could silently bring back.
    std::set<fs::path> named;
    for (const GroupEntry& g : m.groups) named.insert(g.library.lexically_normal());
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(m.plugin_dir, ec)) {
      const fs::path p = entry.path().lexically_normal();
      if (p.extension() != ".so" || !entry.is_regular_file(ec) || named.count(p)) continue;
      rep.also("groups-guard", "", p.string(),
               "library " + p.string() + " is in the plugin folder but no manifest group " +
                   "names it (a stale build of a removed group?); delete it or add its group");
    }
  } else {
    notes.push_back("no plugin source tree at " + cx.src.string() +
                    ": folders and libraries not compared");
  }
  std::string note;
  for (const std::string& n : notes) note += (note.empty() ? "" : "; ") + n;
  if (!cx.have_src && !expected) {
    rep.skip("groups-guard", "", note);
  } else {
    cx.report.outcomes.push_back(
        {"groups-guard", "", rep.count("groups-guard", "*") == 0, false, note});
  }
}

}  // namespace

std::vector<std::string> metadata_differences(const PluginMetadata& embedded,
                                              const PluginSnapshot& loaded) {
  return compare_metadata(embedded, loaded.info, specs_of(loaded));
}

std::vector<std::string> arch_coverage_problems(const std::vector<KernelSpec>& kernels,
                                                const CudaImages& images,
                                                const std::string& library) {
  std::vector<std::string> out;
  for (const KernelSpec& k : kernels) {
    if (k.backend != "cuda" && k.backend != "nccl") continue;
    KernelSpec copy = k;  // check_arch_coverage may narrow the windows it is given
    if (Status st = check_arch_coverage(copy, images, library); !st.ok()) {
      out.push_back(st.message());
    }
  }
  return out;
}

ValidationReport validate_registry(const fs::path& manifest_path, const ValidateOptions& options) {
  ValidationReport report;
  Reporter rep(report);

  std::vector<ManifestDiagnostic> diags;
  ManifestOptions mopts = options.manifest;
  mopts.check_files = false;  // library-present reports missing files per group
  auto manifest = load_manifest(manifest_path, mopts, &diags);
  if (!manifest) {
    if (manifest.status().code() == KREG_NOT_FOUND) {
      report.manifest_readable = false;
      rep.fail("manifest-schema", "", manifest_path.string(), manifest.status().message());
      return report;
    }
    bool first = true;
    for (const ManifestDiagnostic& d : diags) {
      // A problem of the whole document (a syntax error, a second document) has no key.
      const std::string what = d.key.empty() ? d.message : d.key + ": " + d.message;
      if (first) {
        rep.fail("manifest-schema", "", d.where.to_string(), what);
      } else {
        rep.also("manifest-schema", "", d.where.to_string(), what);
      }
      first = false;
    }
    if (diags.empty()) {
      rep.fail("manifest-schema", "", manifest_path.string(), manifest.status().message());
    }
    return report;
  }
  rep.pass("manifest-schema", "");

  Context cx{*manifest, options, rep, report};
  // The default is the repository layout: plugins/CMakeLists.txt beside the manifest. A
  // `plugins` folder without one is more likely a deployment's folder of libraries.
  std::error_code ec;
  if (options.plugins_src) {
    cx.src = fs::absolute(*options.plugins_src).lexically_normal();
    cx.have_src = fs::is_directory(cx.src, ec);
  } else {
    cx.src = manifest->file.parent_path() / "plugins";
    cx.have_src = fs::is_regular_file(cx.src / "CMakeLists.txt", ec);
  }
  if (cx.have_src) report.plugins_src = cx.src;

  size_t index = 0;
  bool all_loaded = true;  // every enabled group's records were read
  for (const GroupEntry& g : manifest->groups) {
    report.groups.push_back(g.name);
    if (options.progress) options.progress(g.name, index, manifest->groups.size());
    ++index;
    if (!g.enabled) continue;
    const std::string lib = g.library.string();
    const std::string where = g.library_where.to_string();

    std::optional<PluginSnapshot> snap;
    [&] {
      // library-present: the file is opened once, without blocking (a FIFO or a device is
      // refused by its type, never read), and path safety and the pin check that descriptor.
      auto file = open_library_file(g.library);
      if (!file) {
        if (file.status().code() == KREG_NOT_FOUND) {
          const bool dangling = fs::is_symlink(fs::symlink_status(g.library, ec));
          rep.fail("library-present", g.name, where,
                   "library " + lib + " does not exist" +
                       (dangling ? " (a symbolic link to a missing file)" : "") +
                       "; build the group's target or fix library/plugin_dir");
        } else {
          rep.fail("library-present", g.name, where,
                   file.status().message() + "; a plugin library must be a shared object");
        }
        return;
      }
      rep.pass("library-present", g.name);
      // Refused before anything reads it as a library.
      if (Status st = check_path_safety(*file, g.plugin_dir); !st.ok()) {
        rep.fail("path-safety", g.name, where, st.message());
        return;
      }
      rep.pass("path-safety", g.name);
      // A pinned library is copied from the opened descriptor and hashed on the way; the
      // child loads that copy, so the bytes checked are the bytes that ran.
      std::optional<PrivateCopy> copy;
      if (g.sha256) {
        auto c = copy_to_private(*file, g.name, true);
        if (!c) {
          rep.fail("integrity", g.name, g.sha256_where.to_string(), c.status().message());
          return;
        }
        if (c->sha256() != *g.sha256) {
          rep.fail("integrity", g.name, g.sha256_where.to_string(),
                   pin_mismatch(g.library, *g.sha256, c->sha256()).message());
          return;
        }
        copy = std::move(*c);
        rep.pass("integrity", g.name);
      } else {
        rep.pass("integrity", g.name, "not pinned");
      }
      const fs::path load_path = copy ? copy->path() : g.library;
      const StaticView view = read_static(g, load_path);
      LoadOutcome load = load_in_child(cx, g, load_path);
      check_metadata_match(cx, g, view, load);
      // The record checks read the metadata when it is there (no loading needed, and they
      // run even when the load failed); metadata-match said whether it agrees.
      std::vector<KernelSpec> specs;
      if (load.records_refused) {
        // A record the load refused was reported (op-naming / schema): the group's ops
        // are unknown, as before the metadata existed.
      } else if (view.metadata && view.metadata->ok()) {
        specs = (*view.metadata)->kernels;
        PluginSnapshot from_meta{(*view.metadata)->info, {}};
        for (const KernelSpec& k : specs) from_meta.kernels.push_back(record_of(k));
        snap = std::move(from_meta);
      } else if (load.snapshot) {
        specs = specs_of(*load.snapshot);
        snap = std::move(load.snapshot);
      }
      if (snap) check_records(cx, g, *snap);
      check_arch(cx, g, view, snap ? &specs : nullptr);
      if (snap) check_jit_sources(cx, g, load_path, *snap);
    }();
    if (!snap) all_loaded = false;
    check_sources(cx, g, snap ? &*snap : nullptr);
  }

  rep.outcome("unique-ops", "", rep.count("unique-ops", "*") == 0);
  check_waivers(cx, all_loaded);
  check_aliases(cx);
  check_groups_guard(cx);
  rep.finish();
  return report;
}

Result<std::vector<std::string>> read_expect_groups(const fs::path& file) {
  // A list of names: a FIFO, a device or a huge file is refused, never waited on or read.
  auto text = read_regular_file(file, "expected-groups file", kMaxExpectGroupsBytes);
  if (!text && text.status().code() == KREG_NOT_FOUND) {
    return Status(KREG_NOT_FOUND, "cannot read the expected-groups file " +
                                      escape_control(file.string()) + ": no such file");
  }
  if (!text) return text.status();
  std::vector<std::string> names;
  std::map<std::string, int> seen;
  std::istringstream lines(*text);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const size_t e = line.find_last_not_of(" \t\r");
    const std::string name = line.substr(b, e - b + 1);
    const std::string at = escape_control(file.string()) + ":" + std::to_string(n);
    if (!is_snake(name)) {
      return Status(KREG_INVALID_ARGUMENT, at + ": invalid group name '" + excerpt(name) +
                                               "': expected snake_case ([a-z][a-z0-9_]*)");
    }
    if (auto [it, fresh] = seen.emplace(name, n); !fresh) {
      return Status(KREG_INVALID_ARGUMENT, at + ": group '" + name +
                                               "' is listed twice (first "
                                               "on line " +
                                               std::to_string(it->second) + ")");
    }
    names.push_back(name);
  }
  return names;
}

Result<std::vector<PinUpdate>> update_pins(const fs::path& manifest_path,
                                           const ManifestOptions& options) {
  ManifestOptions mopts = options;
  mopts.check_files = false;
  auto manifest = load_manifest(manifest_path, mopts);
  if (!manifest) return manifest.status();
  std::vector<PinUpdate> updates;
  std::map<std::string, std::string> pins;
  std::error_code ec;
  for (const GroupEntry& g : manifest->groups) {
    if (!fs::is_regular_file(g.library, ec)) continue;
    auto sha = sha256_file(g.library);
    if (!sha) return sha.status();
    if (g.sha256 == *sha) continue;
    pins[g.name] = *sha;
    updates.push_back({g.name, g.library, g.sha256, *sha});
  }
  if (pins.empty()) return updates;

  // Edit the file the manifest path finally names, so a symlinked manifest stays one.
  const fs::path target = fs::canonical(manifest_path, ec);
  if (ec) return Status(KREG_NOT_FOUND, "cannot resolve " + manifest_path.string());
  // Read with the manifest's own limits: the file may have changed since it was parsed.
  auto text = read_manifest_file(target);
  if (!text) return text.status();
  auto edited = rewrite_manifest_pins(*text, pins);
  if (!edited) return edited.status();
  // The edit must parse to exactly the pins intended before it replaces the file.
  auto check = parse_manifest(*edited, manifest_path, mopts);
  if (!check) {
    return Status(KREG_INTERNAL, "updating the pins would break the manifest; not written:\n" +
                                     check.status().message());
  }
  for (const GroupEntry& g : check->groups) {
    if (auto it = pins.find(g.name); it != pins.end() && g.sha256 != it->second) {
      return Status(KREG_INTERNAL, "updating the pin of group '" + g.name +
                                       "' did not take; the manifest was not written");
    }
  }
  const fs::path tmp = target.parent_path() /
                       ("." + target.filename().string() + ".kreg-" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << *edited;
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return Status(KREG_PERMISSION_DENIED, "cannot write " + tmp.string());
    }
  }
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) ::chmod(tmp.c_str(), st.st_mode & 07777);
  fs::rename(tmp, target, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    return Status(KREG_PERMISSION_DENIED, "cannot replace " + target.string() + ": " + why);
  }
  return updates;
}

}  // namespace kreg
