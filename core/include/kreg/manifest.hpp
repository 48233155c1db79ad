// The manifest (registry.yaml): which groups exist, where their libraries are, and the
// compatibility aliases. Parsing reports every problem with file:line:col and the key.
// See docs/manifest.md for the format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kreg/status.hpp"

namespace kreg {

// A place in a file; line and column are 1-based (0 when unknown).
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;
  std::string to_string() const;  // "file:line:col"
};

// One problem found in a manifest. `key` is the YAML path of the offending node,
// e.g. "groups[1].library".
struct ManifestDiagnostic {
  SourceLocation where;
  std::string key;
  std::string message;
  std::string to_string() const;  // "file:line:col: key: message"
};

enum class LoadMode { kEager, kLazy };

struct GroupEntry {
  std::string name;
  std::string library_spec;       // as written in the manifest
  std::filesystem::path library;  // resolved: plugin_dir / library_spec
  bool enabled = true;
  std::optional<std::string> version;  // expected plugin version
  LoadMode load = LoadMode::kEager;
  std::optional<std::string> sha256;  // pin (lowercase hex), checked before loading
  SourceLocation where;               // of the group's entry
  SourceLocation library_where;       // of its `library` value
  SourceLocation sha256_where;        // of its `sha256` value, when pinned
  // The manifest's resolved plugin folder, kept with each entry so that an entry loaded on
  // its own (Registry::load_group) is still held to it by the path-safety check. Empty:
  // the library's own folder.
  std::filesystem::path plugin_dir;
};

struct AliasEntry {
  std::string from;  // old op id
  std::string to;    // new op id
  std::string message;
  SourceLocation where;
};

// A reasoned exception to one validation check for one op (today: reference-present,
// for an op that has no CPU equivalent, e.g. a collective).
struct WaiverEntry {
  std::string op;
  std::string check;
  std::string reason;
  SourceLocation where;
};

struct Manifest {
  std::filesystem::path file;        // the manifest's own path (absolute)
  std::filesystem::path plugin_dir;  // absolute; KREG_PLUGIN_DIR overrides the file's
  std::vector<GroupEntry> groups;
  std::vector<AliasEntry> aliases;
  std::vector<WaiverEntry> waivers;
  // `expect_groups`: the exact set of group names this manifest must list (validation's
  // groups-guard); unset when the key is absent.
  std::optional<std::vector<std::string>> expect_groups;
  SourceLocation expect_groups_where;

  const GroupEntry* find_group(std::string_view name) const;
  const WaiverEntry* find_waiver(std::string_view op, std::string_view check) const;
};

struct ManifestOptions {
  // Overrides the manifest's plugin_dir when set (tools pass $KREG_PLUGIN_DIR here).
  std::optional<std::filesystem::path> plugin_dir_override;
  // Report enabled groups whose library file does not exist (off for pure syntax checks).
  bool check_files = true;
};

// The largest manifest file read. registry.yaml is about 1 KB; a manifest of a thousand
// groups stays under 200 KB. The cap bounds the reading and the parse before either starts.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 20;

// A manifest file's text: opened without blocking, refused unless it is a regular file of
// at most kMaxManifestBytes (a FIFO, /dev/zero or a directory is named as such). NOT_FOUND,
// whatever the reason, with "cannot read the manifest <absolute path>: <why>".
Result<std::string> read_manifest_file(const std::filesystem::path& file);

// Parses and checks a manifest (read with read_manifest_file). On any problem returns
// INVALID_ARGUMENT (NOT_FOUND if the file itself cannot be read) whose message lists the
// diagnostics, one per line, in file order: at most 50, then one line counting the rest.
// The diagnostics are also appended to `diagnostics` when given (the same bounded list).
// Bounded on any input (docs/manifest.md, "Limits"): never throws, hangs or exhausts memory.
Result<Manifest> load_manifest(const std::filesystem::path& file, const ManifestOptions& options,
                               std::vector<ManifestDiagnostic>* diagnostics = nullptr);

// The same, from text (`file` names it in messages; relative paths resolve from its
// directory).
Result<Manifest> parse_manifest(const std::string& text, const std::filesystem::path& file,
                                const ManifestOptions& options,
                                std::vector<ManifestDiagnostic>* diagnostics = nullptr);

// Options from the environment: KREG_PLUGIN_DIR.
ManifestOptions manifest_options_from_env();

// Sets the sha256 pins of the named groups (group -> 64 lowercase hex digits) in a
// manifest's text and returns the new text. Everything else is kept byte for byte: an
// existing `sha256:` value is replaced where it stands (in the same quotes), and a group
// without one gets a `sha256:` line after its `library:` line, indented like its other
// keys. INVALID_ARGUMENT when the text does not parse, names a group that is not in it, or
// writes a group in flow style (`{name: a, ...}`), which cannot be edited line by line.
Result<std::string> rewrite_manifest_pins(const std::string& text,
                                          const std::map<std::string, std::string>& pins);

}  // namespace kreg
