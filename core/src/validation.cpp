#include "kreg/validation.hpp"

#include <map>
#include <set>

#include "kreg/kernel_spec.hpp"
#include "kreg/plugin_library.hpp"

namespace kreg {

namespace fs = std::filesystem;

const std::vector<std::string>& validation_checks() {
  static const std::vector<std::string> kChecks = {
      "manifest-schema", "library-present", "library-loads",     "abi-version",
      "group-name-match", "plugin-version", "op-naming",         "schema",
      "no-empty-groups",  "reference-present", "unique-ops",     "aliases"};
  return kChecks;
}

namespace {

class Reporter {
 public:
  explicit Reporter(ValidationReport& r) : r_(r) {}
  void pass(const std::string& check, const std::string& group) {
    r_.outcomes.push_back({check, group, true});
  }
  void fail(const std::string& check, const std::string& group, const std::string& where,
            const std::string& message) {
    r_.outcomes.push_back({check, group, false});
    r_.findings.push_back({check, group, where, message});
  }
  // Records a failure for `check` without repeating the outcome line.
  void also(const std::string& check, const std::string& group, const std::string& where,
            const std::string& message) {
    r_.findings.push_back({check, group, where, message});
  }

 private:
  ValidationReport& r_;
};

bool is_snake(std::string_view s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace

ValidationReport validate_registry(const fs::path& manifest_path, const ValidateOptions& options) {
  ValidationReport report;
  Reporter rep(report);

  std::vector<ManifestDiagnostic> diags;
  ManifestOptions mopts = options.manifest;
  mopts.check_files = false;  // library-present reports missing files per group
  auto manifest = load_manifest(manifest_path, mopts, &diags);
  if (!manifest) {
    if (manifest.status().code() == KREG_NOT_FOUND && diags.empty()) {
      report.manifest_readable = false;
      rep.fail("manifest-schema", "", manifest_path.string(), manifest.status().message());
      return report;
    }
    bool first = true;
    for (const ManifestDiagnostic& d : diags) {
      if (first) {
        rep.fail("manifest-schema", "", d.where.to_string(), d.key + ": " + d.message);
      } else {
        rep.also("manifest-schema", "", d.where.to_string(), d.key + ": " + d.message);
      }
      first = false;
    }
    if (diags.empty()) {
      rep.fail("manifest-schema", "", manifest_path.string(), manifest.status().message());
    }
    return report;
  }
  rep.pass("manifest-schema", "");

  // op id -> (group, library) of its first registration, for unique-ops.
  std::map<std::string, std::string> op_owner;
  std::set<std::string> all_ops;
  for (const GroupEntry& g : manifest->groups) {
    report.groups.push_back(g.name);
    if (!g.enabled) continue;
    const std::string lib = g.library.string();
    const std::string where = g.library_where.to_string();

    std::error_code ec;
    if (!fs::exists(g.library, ec)) {
      rep.fail("library-present", g.name, where, "library " + lib + " does not exist");
      continue;
    }
    if (!fs::is_regular_file(g.library, ec)) {
      rep.fail("library-present", g.name, where, "library " + lib + " is not a regular file");
      continue;
    }
    rep.pass("library-present", g.name);

    // Read the symbol table without running any plugin code first.
    if (Status st = check_entry_symbol(g.library); !st.ok()) {
      rep.fail("library-loads", g.name, where, st.message());
      continue;
    }
    PluginLibrary::Stage stage = PluginLibrary::Stage::kFile;
    auto plugin = PluginLibrary::open(g.library, {g.name, g.version}, &stage);
    if (!plugin) {
      const std::string& msg = plugin.status().message();
      switch (stage) {
        case PluginLibrary::Stage::kAbi:
          rep.pass("library-loads", g.name);
          rep.fail("abi-version", g.name, where, msg);
          break;
        case PluginLibrary::Stage::kGroup:
          rep.pass("library-loads", g.name);
          rep.pass("abi-version", g.name);
          rep.fail("group-name-match", g.name, where, msg);
          break;
        case PluginLibrary::Stage::kVersion:
          rep.pass("library-loads", g.name);
          rep.pass("abi-version", g.name);
          rep.pass("group-name-match", g.name);
          rep.fail("plugin-version", g.name, where, msg);
          break;
        case PluginLibrary::Stage::kKernels:
          rep.pass("library-loads", g.name);
          rep.pass("abi-version", g.name);
          rep.pass("group-name-match", g.name);
          rep.pass("plugin-version", g.name);
          rep.fail(msg.find("op id") != std::string::npos || msg.find("belongs to group") !=
                                                                  std::string::npos
                       ? "op-naming"
                       : "schema",
                   g.name, where, msg);
          break;
        default:
          rep.fail("library-loads", g.name, where, msg);
          break;
      }
      continue;
    }
    for (const char* c : {"library-loads", "abi-version", "group-name-match", "plugin-version"}) {
      rep.pass(c, g.name);
    }

    const auto& kernels = (*plugin)->kernels();
    bool naming_ok = true;
    std::set<std::string> ops;
    std::map<std::string, std::set<std::string>> backends;
    for (const KernelSpec& k : kernels) {
      const std::string name(k.name());
      if (name.starts_with("jit_") || name.ends_with("_jit")) {
        rep.also("op-naming", g.name, lib, k.op + ": no jit_/_jit prefixes in op names");
        naming_ok = false;
      }
      if (!is_snake(name)) naming_ok = false;
      if (!backends[k.op].insert(k.backend).second) {
        rep.also("unique-ops", g.name, lib,
                 k.op + " (" + k.backend + ") is registered twice in the same plugin");
      }
      ops.insert(k.op);
    }
    if (naming_ok) {
      rep.pass("op-naming", g.name);
    } else {
      report.outcomes.push_back({"op-naming", g.name, false});
    }
    rep.pass("schema", g.name);  // make_kernel_spec parsed every signature
    if (kernels.empty()) {
      rep.fail("no-empty-groups", g.name, where, "group '" + g.name + "' registers no kernels");
    } else {
      rep.pass("no-empty-groups", g.name);
    }
    bool refs_ok = true;
    for (const std::string& op : ops) {
      if (!backends[op].count("cpu")) {
        refs_ok = false;
        rep.also("reference-present", g.name, lib,
                 op + " has no CPU reference implementation (backend 'cpu')");
      }
      if (auto [it, fresh] = op_owner.emplace(op, g.name + " (" + lib + ")"); !fresh) {
        rep.also("unique-ops", g.name, lib,
                 op + " is registered by " + it->second + " and by " + g.name + " (" + lib + ")");
      }
      all_ops.insert(op);
    }
    report.outcomes.push_back({"reference-present", g.name, refs_ok});
    report.ops += ops.size();
  }

  // Cross-group checks.
  bool unique_ok = true;
  for (const Finding& f : report.findings) {
    if (f.check == "unique-ops") unique_ok = false;
  }
  report.outcomes.push_back({"unique-ops", "", unique_ok});

  bool aliases_ok = true;
  std::map<std::string, std::string> alias_to;
  for (const AliasEntry& a : manifest->aliases) alias_to[a.from] = a.to;
  for (const AliasEntry& a : manifest->aliases) {
    const std::string where = a.where.to_string();
    auto bad = [&](const std::string& msg) {
      aliases_ok = false;
      rep.also("aliases", "", where, msg);
    };
    if (options.forbid_aliases) {
      bad("alias " + a.from + " -> " + a.to + " is not allowed (--no-aliases)");
      continue;
    }
    if (all_ops.count(a.from)) bad("alias " + a.from + " shadows a real op of the same name");
    // Follow the chain: it must end at a real op without revisiting an alias.
    std::set<std::string> seen{a.from};
    std::string cur = a.to;
    while (alias_to.count(cur) && !seen.count(cur)) {
      seen.insert(cur);
      cur = alias_to[cur];
    }
    if (seen.count(cur) && alias_to.count(cur)) {
      bad("alias " + a.from + " is part of a cycle through " + cur);
    } else if (!all_ops.count(cur)) {
      bad("alias " + a.from + " -> " + a.to + ": target op " + cur + " does not exist");
    }
  }
  report.outcomes.push_back({"aliases", "", aliases_ok});
  return report;
}

}  // namespace kreg
