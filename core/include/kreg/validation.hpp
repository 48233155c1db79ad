// Registry validation: the checks CI runs on a manifest and its plugins (`kreg validate`).
// Each finding names its check, the group (if any), where, and what is wrong.
// docs/validation.md lists every check and how to fix a failure.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "kreg/manifest.hpp"

namespace kreg {

struct Finding {
  std::string check;    // e.g. "abi-version"
  std::string group;    // "" for manifest-wide findings
  std::string where;    // file:line:col or a library path
  std::string message;  // what is wrong, and what was expected
};

struct CheckOutcome {
  std::string check;
  std::string group;
  bool passed = true;
};

struct ValidationReport {
  std::vector<Finding> findings;       // violations
  std::vector<CheckOutcome> outcomes;  // every check run, passed or not
  std::vector<std::string> groups;     // groups examined
  size_t ops = 0;                      // ops seen across loaded groups
  bool manifest_readable = true;       // false: exit 2 territory
  bool ok() const { return findings.empty() && manifest_readable; }
};

struct ValidateOptions {
  ManifestOptions manifest;
  bool forbid_aliases = false;
};

// The checks in the order they run: manifest-schema; per group library-present,
// library-loads, abi-version, group-name-match, plugin-version, op-naming, schema,
// no-empty-groups, reference-present; then unique-ops and aliases across groups.
ValidationReport validate_registry(const std::filesystem::path& manifest,
                                   const ValidateOptions& options);

// The names of all checks, for docs and --json consumers.
const std::vector<std::string>& validation_checks();

}  // namespace kreg
