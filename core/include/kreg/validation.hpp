// Registry validation: the checks CI runs on a manifest and its plugins (`kreg validate`).
// Each finding names its check, the group (if any), where, and what is wrong.
// docs/validation.md lists every check and how to fix a failure.
//
// No plugin code runs in the validating process: a library is checked for path safety
// and against its pin, its ELF headers and symbol table are read, and only then is it
// loaded, in a child process (plugin_probe.hpp). Everything later checks use what the
// child reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/fatbin.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/manifest.hpp"
#include "kreg/plugin_metadata.hpp"
#include "kreg/plugin_probe.hpp"

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
  bool skipped = false;  // not run (e.g. no source tree); `note` says why
  std::string note;
};

struct ValidationReport {
  std::vector<Finding> findings;  // violations
  // Worth a look but not violations (ok() ignores them): a plugin without embedded
  // metadata (metadata-match). The check's outcome passes with a note saying so.
  std::vector<Finding> warnings;
  std::vector<CheckOutcome> outcomes;  // every check run, passed or not
  std::vector<std::string> groups;     // groups examined
  size_t ops = 0;                      // ops seen across loaded groups
  bool manifest_readable = true;       // false: exit 2 territory
  std::filesystem::path plugins_src;   // the source tree compared, "" when none
  bool ok() const { return findings.empty() && manifest_readable; }
};

struct ValidateOptions {
  ManifestOptions manifest;
  bool forbid_aliases = false;
  // A plugin's child process (load, init hook, unload) is killed after this long.
  double timeout_s = 10;
  // The plugin source tree; default: the `plugins` folder next to the manifest, and the
  // source checks are skipped with a note when that does not exist.
  std::optional<std::filesystem::path> plugins_src;
  // The exact set of groups the manifest must list, and where it came from (for
  // messages); replaces the manifest's own `expect_groups` when set.
  std::optional<std::vector<std::string>> expect_groups;
  std::string expect_groups_source;
  // Called before each group is checked (a progress line on a terminal).
  std::function<void(std::string_view group, size_t index, size_t count)> progress;
};

// The checks in the order they run: manifest-schema; per enabled group library-present,
// path-safety, integrity, library-loads, abi-version, group-name-match, plugin-version,
// metadata-match, op-naming, no-test-ops, schema, no-empty-groups, reference-present,
// arch-coverage, sources-built; then unique-ops, aliases and groups-guard across groups.
// The record checks (op-naming ... arch-coverage, sources-built) read the library's
// embedded metadata when it has a well-formed one, so they run even when loading fails;
// otherwise they use what the child process reported.
ValidationReport validate_registry(const std::filesystem::path& manifest,
                                   const ValidateOptions& options);

// metadata-match's core: where a library's embedded metadata and what its child process
// reported from the loaded descriptor disagree (compare_metadata). Empty when they agree.
// The child's report carries no kernel flags: each loaded record is given the flags of its
// embedded counterpart, so flags are not compared here.
std::vector<std::string> metadata_differences(const PluginMetadata& embedded,
                                              const PluginSnapshot& loaded);

// arch-coverage's core: check_arch_coverage on a copy of every CUDA implementation of
// `kernels` against the library's images; one message per implementation that claims an
// SM no image runs on (naming the op, the SM and the images). Empty when all are covered.
std::vector<std::string> arch_coverage_problems(const std::vector<KernelSpec>& kernels,
                                                const CudaImages& images,
                                                const std::string& library);

// The names of all checks, for docs and --json consumers.
const std::vector<std::string>& validation_checks();

// Reads an expected-groups file: one group name per line; blank lines and `#` comments
// are ignored. INVALID_ARGUMENT (naming file:line) for a name that is not snake_case or
// is listed twice; the file is read as a RegularFile (kreg/regular_file.hpp): NOT_FOUND
// when missing, INVALID_ARGUMENT naming its kind when it is not a regular file (a FIFO is
// never waited on), RESOURCE_EXHAUSTED above kMaxExpectGroupsBytes.
inline constexpr uint64_t kMaxExpectGroupsBytes = uint64_t{1} << 20;
// A report lists at most this many findings of one check, then one finding saying how many
// more there were (the exit status is the same).
inline constexpr size_t kMaxFindingsPerCheck = 100;
Result<std::vector<std::string>> read_expect_groups(const std::filesystem::path& file);

struct PinUpdate {
  std::string group;
  std::filesystem::path library;
  std::optional<std::string> old_sha256;
  std::string sha256;
};

// `kreg validate --update-pins`: hashes the library of every group whose library exists
// and rewrites the manifest's sha256 values in place (rewrite_manifest_pins: comments and
// formatting kept). Returns the pins that changed; groups whose library is missing keep
// their pin. Fails without touching the file when the manifest does not parse.
Result<std::vector<PinUpdate>> update_pins(const std::filesystem::path& manifest,
                                           const ManifestOptions& options);

}  // namespace kreg
