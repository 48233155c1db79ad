// Parsing and checking registry.yaml. The parser never stops at the first problem: a
// manifest is edited by hand, and one run should show everything that needs fixing, each
// problem pointing at its file:line:col and key path like a compiler diagnostic. (Pin
// rewriting is in manifest_pins.cpp.)
#include "kreg/manifest.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include "kreg/regular_file.hpp"
#include "kreg/text.hpp"
#include "manifest_yaml.hpp"

namespace kreg {

std::string SourceLocation::to_string() const {
  // Without a line (e.g. the file could not be read) a column would mean nothing.
  // The path is outside text (a command line, an environment variable): escaped, so a
  // newline in it cannot start a line of its own in the message.
  if (line <= 0) return escape_control(file);
  std::string out = escape_control(file) + ":" + std::to_string(line);
  if (column > 0) out += ":" + std::to_string(column);
  return out;
}

std::string ManifestDiagnostic::to_string() const {
  std::string out = where.to_string() + ": ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}

const WaiverEntry* Manifest::find_waiver(std::string_view op, std::string_view check) const {
  for (const WaiverEntry& w : waivers) {
    if (w.op == op && w.check == check) return &w;
  }
  return nullptr;
}

const GroupEntry* Manifest::find_group(std::string_view name) const {
  for (const GroupEntry& group : groups) {
    if (group.name == name) return &group;
  }
  return nullptr;
}

ManifestOptions manifest_options_from_env() {
  ManifestOptions options;
  // An empty value counts as unset so `KREG_PLUGIN_DIR= cmd` can clear an inherited one.
  if (const char* dir = std::getenv("KREG_PLUGIN_DIR"); dir != nullptr && *dir != '\0') {
    options.plugin_dir_override = std::filesystem::path(dir);
  }
  return options;
}

namespace {

namespace fs = std::filesystem;
namespace yml = manifest_yaml;

constexpr int kFormatVersion = 1;
// The longest string value or key a manifest may hold: paths are at most PATH_MAX, and a
// longer value can only be a mistake or an attack (it would be copied and compared at
// every use, and an anchor can make it used thousands of times).
constexpr size_t kMaxValueBytes = 4096;
// Diagnostics shown; the rest are counted. One broken pattern repeated (or aliased) ten
// thousand times needs one screenful to be understood, not ten thousand lines.
constexpr size_t kMaxShownDiagnostics = 50;
// How much of a value a message quotes.
constexpr size_t kQuoteChars = 80;
constexpr std::string_view kDefaultPluginDir = "build/plugins";

const std::vector<std::string_view> kTopKeys = {"kreg_manifest", "plugin_dir",    "groups",
                                                "aliases",       "expect_groups", "waivers"};
const std::vector<std::string_view> kGroupKeys = {"name",    "library", "enabled",
                                                  "version", "load",    "sha256"};
const std::vector<std::string_view> kAliasKeys = {"from", "to", "message"};
const std::vector<std::string_view> kWaiverKeys = {"op", "check", "reason"};
// The checks a waiver may name.
const std::vector<std::string_view> kWaivableChecks = {"reference-present"};

bool is_snake_case(std::string_view s) {
  if (s.empty() || s.front() < 'a' || s.front() > 'z') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool is_op_id(std::string_view s) {
  const size_t dot = s.find('.');
  if (dot == std::string_view::npos) return false;
  return is_snake_case(s.substr(0, dot)) && is_snake_case(s.substr(dot + 1));
}

bool is_sha256(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// A value from the file inside a message: escaped, and cut to a short excerpt.
std::string quote_value(std::string_view s) { return "'" + excerpt(s, kQuoteChars) + "'"; }

// Plain (unquoted) scalars carry the non-specific tag "?"; quoted ones carry "!". Only a
// plain `true` is a boolean: `"true"` is a string the author chose to quote.
bool is_plain(const yml::Node& node) { return node.Tag() == "?"; }

// No value in a manifest needs a tag; the core schema's own tags for the type a key takes
// are accepted, anything else (`!!binary`, `!custom`) would be silently reinterpreted.
bool has_foreign_tag(const yml::Node& node, std::string_view allowed) {
  const std::string& tag = node.Tag();
  return !(tag.empty() || tag == "?" || tag == "!" || tag == allowed);
}

std::string describe(const yml::Node& node) {
  std::string out;
  switch (node.kind()) {
    case yml::Node::Kind::kMap:
      out = "a map";
      break;
    case yml::Node::Kind::kSequence:
      out = "a sequence";
      break;
    case yml::Node::Kind::kScalar:
      out = is_plain(node) || has_foreign_tag(node, "")
                ? quote_value(node.Scalar())
                : "the string \"" + excerpt(node.Scalar(), kQuoteChars) + "\"";
      break;
    case yml::Node::Kind::kNull:
      out = "nothing (null)";
      break;
  }
  if (has_foreign_tag(node, "")) out += " tagged " + quote_value(node.Tag());
  return out;
}

// Where a string value holds a character no manifest string may: NUL and other controls
// (an escape sequence in a double-quoted scalar can write any), or invalid UTF-8. Line
// breaks and tabs only where `text` allows them (a deprecation message, a waiver reason).
std::optional<std::string> bad_character(std::string_view value, bool text) {
  const size_t at = yml::find_unprintable(value, text);
  if (at == std::string_view::npos) return std::nullopt;
  const auto b = static_cast<unsigned char>(value[at]);
  const std::string what =
      b == 0 ? "a NUL byte (\\0)"
      : b < 0x20 || b == 0x7f
          ? "a control character (" + escape_control(value.substr(at, 1)) + ")"
          : "a character that is not printable UTF-8 (" + escape_control(value.substr(at, 1)) + ")";
  return "contains " + what + " at byte " + std::to_string(at) + " of the value";
}

std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

std::string child_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// Keys are kept beside their values so a problem with a value can point at its key.
struct Entry {
  yml::Node key;
  yml::Node value;
};

class ManifestParser {
 public:
  ManifestParser(std::string display_name, fs::path file, const ManifestOptions& options)
      : display_name_(std::move(display_name)), file_(std::move(file)), options_(options) {}

  Result<Manifest> parse(const std::string& text, std::vector<ManifestDiagnostic>* out);

 private:
  SourceLocation at(const yml::Mark& mark) const {
    // yaml-cpp's marks are 0-based and -1 when unknown (e.g. an empty document).
    SourceLocation loc{display_name_, 1, 1};
    if (mark.line >= 0) loc.line = mark.line + 1;
    if (mark.column >= 0) loc.column = mark.column + 1;
    return loc;
  }
  // A null value (`key:` with nothing after it) is marked where the next token starts,
  // often the following line, so such values are reported at their key instead.
  SourceLocation at_value(const Entry& entry) const {
    return entry.value.IsNull() && !entry.value.IsAlias() ? at(entry.key.GetMark())
                                                          : at(entry.value.GetMark());
  }

  void error(SourceLocation where, std::string key, std::string message);
  void sort_and_trim();  // file order; beyond kMaxShownDiagnostics only counted

  std::map<std::string, Entry> read_map(const yml::Node& map, const std::string& path,
                                        const std::vector<std::string_view>& allowed);
  // `text`: free text (a message, a reason) that may span lines.
  std::optional<std::string> read_string(const Entry& entry, const std::string& path,
                                         bool text = false);
  // A string-valued node's problem (not a scalar, a tag, too long, a bad character); empty
  // when it is usable as a string.
  std::string string_problem(const yml::Node& node, bool text) const;
  // Reports a collection's foreign tag; false when it has one.
  bool check_collection_tag(const yml::Node& node, const std::string& path, std::string_view tag);
  std::optional<bool> read_bool(const Entry& entry, const std::string& path);
  // Looks up `key` in `entries`; reports it missing (at `map`) when required.
  const Entry* find(const std::map<std::string, Entry>& entries, std::string_view key,
                    const yml::Node& map, const std::string& path, bool required);

  void parse_document(const yml::Node& root, Manifest& manifest);
  void parse_version(const Entry& entry);
  void parse_groups(const Entry& entry, Manifest& manifest);
  void parse_group(const yml::Node& node, const std::string& path, Manifest& manifest);
  void parse_aliases(const Entry& entry, Manifest& manifest);
  void parse_expect_groups(const Entry& entry, Manifest& manifest);
  void parse_waivers(const Entry& entry, Manifest& manifest);
  void parse_alias(const yml::Node& node, const std::string& path, Manifest& manifest);
  fs::path resolve_plugin_dir(const std::map<std::string, Entry>& top);
  void check_groups(const Manifest& manifest);
  void check_aliases(const Manifest& manifest);

  std::string display_name_;
  fs::path file_;  // absolute and normalised; empty when parsing text with no file name
  const ManifestOptions& options_;
  std::vector<ManifestDiagnostic> diagnostics_;
  size_t omitted_ = 0;  // diagnostics dropped beyond the shown ones
  SourceLocation first_omitted_;
  // Each accepted group's key path ("groups[2]"): indices in the file and in
  // manifest.groups differ once an invalid entry is skipped.
  std::vector<std::string> group_paths_;
};

void ManifestParser::error(SourceLocation where, std::string key, std::string message) {
  diagnostics_.push_back({std::move(where), std::move(key), std::move(message)});
  // Only the first (in file order) of what will be shown are kept, so memory stays bounded
  // however many times the file repeats a problem.
  if (diagnostics_.size() >= 8 * kMaxShownDiagnostics) sort_and_trim();
}

void ManifestParser::sort_and_trim() {
  std::stable_sort(diagnostics_.begin(), diagnostics_.end(),
                   [](const ManifestDiagnostic& a, const ManifestDiagnostic& b) {
                     return std::pair(a.where.line, a.where.column) <
                            std::pair(b.where.line, b.where.column);
                   });
  for (size_t i = kMaxShownDiagnostics; i < diagnostics_.size(); ++i) {
    const SourceLocation& w = diagnostics_[i].where;
    if (omitted_++ == 0 ||
        std::pair(w.line, w.column) < std::pair(first_omitted_.line, first_omitted_.column)) {
      first_omitted_ = w;
    }
  }
  if (diagnostics_.size() > kMaxShownDiagnostics) diagnostics_.resize(kMaxShownDiagnostics);
}

std::string ManifestParser::string_problem(const yml::Node& node, bool text) const {
  if (!node.IsScalar() || has_foreign_tag(node, "tag:yaml.org,2002:str")) {
    return "expected a string, got " + describe(node);
  }
  const std::string& value = node.Scalar();
  if (value.size() > kMaxValueBytes) {
    return "the value is " + std::to_string(value.size()) + " bytes; the limit is " +
           std::to_string(kMaxValueBytes) + " (" + quote_value(value) + ")";
  }
  if (auto bad = bad_character(value, text)) return *bad + " (" + quote_value(value) + ")";
  return {};
}

bool ManifestParser::check_collection_tag(const yml::Node& node, const std::string& path,
                                          std::string_view tag) {
  if (!has_foreign_tag(node, tag)) return true;
  error(at(node.GetMark()), path,
        "unsupported tag " + quote_value(node.Tag()) + " on " +
            (node.IsMap() ? "a map" : "a sequence") + "; a manifest uses no tags");
  return false;
}

std::map<std::string, Entry> ManifestParser::read_map(
    const yml::Node& map, const std::string& path, const std::vector<std::string_view>& allowed) {
  std::map<std::string, Entry> entries;
  for (size_t i = 0; i < map.size(); ++i) {
    const yml::Node key = map.key(i);
    if (!key.IsScalar() || has_foreign_tag(key, "tag:yaml.org,2002:str")) {
      error(at(key.GetMark()), path, "keys must be plain strings, got " + describe(key));
      continue;
    }
    if (std::string problem = string_problem(key, false); !problem.empty()) {
      error(at(key.GetMark()), path, "invalid key: " + problem);
      continue;
    }
    const std::string& name = key.Scalar();
    const std::string key_path = child_path(path, excerpt(name, kQuoteChars));
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string message = "unknown key " + quote_value(name);
      for (std::string_view candidate : allowed) {
        if (edit_distance(name, candidate) <= 2) {
          message += "; did you mean '" + std::string(candidate) + "'?";
          break;
        }
      }
      error(at(key.GetMark()), key_path, message + " (allowed: " + join(allowed) + ")");
      continue;
    }
    // YAML keeps both entries of a repeated key and a lookup would silently take the first.
    if (auto found = entries.find(name); found != entries.end()) {
      error(at(key.GetMark()), key_path,
            "duplicate key " + quote_value(name) + " (first given at " +
                at(found->second.key.GetMark()).to_string() + ")");
      continue;
    }
    entries.emplace(name, Entry{key, map.value(i)});
  }
  return entries;
}

std::optional<std::string> ManifestParser::read_string(const Entry& entry, const std::string& path,
                                                       bool text) {
  if (std::string problem = string_problem(entry.value, text); !problem.empty()) {
    error(at_value(entry), path, problem);
    return std::nullopt;
  }
  return entry.value.Scalar();
}

std::optional<bool> ManifestParser::read_bool(const Entry& entry, const std::string& path) {
  // YAML 1.2 booleans only: yaml-cpp would also take yes/no/on/off/y/n, which makes a
  // typo or a country code (`no`) silently change meaning.
  if (entry.value.IsScalar() &&
      (is_plain(entry.value) || entry.value.Tag() == "tag:yaml.org,2002:bool")) {
    const std::string& s = entry.value.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  error(at_value(entry), path, "expected a boolean (true or false), got " + describe(entry.value));
  return std::nullopt;
}

const Entry* ManifestParser::find(const std::map<std::string, Entry>& entries, std::string_view key,
                                  const yml::Node& map, const std::string& path, bool required) {
  if (auto it = entries.find(std::string(key)); it != entries.end()) return &it->second;
  if (required) {
    error(at(map.GetMark()), child_path(path, key),
          "missing required key '" + std::string(key) + "'");
  }
  return nullptr;
}

void ManifestParser::parse_version(const Entry& entry) {
  const std::string expected = "expected the format version " + std::to_string(kFormatVersion);
  if (!entry.value.IsScalar() || !is_plain(entry.value)) {
    error(at_value(entry), "kreg_manifest", expected + ", got " + describe(entry.value));
    return;
  }
  const std::string& text = entry.value.Scalar();
  const bool is_integer = !text.empty() && std::all_of(text.begin(), text.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
  if (!is_integer) {
    error(at_value(entry), "kreg_manifest",
          expected + " (an integer), got " + describe(entry.value));
  } else if (text != std::to_string(kFormatVersion)) {
    error(at_value(entry), "kreg_manifest",
          "unsupported format version " + excerpt(text, kQuoteChars) +
              "; this kreg reads version " + std::to_string(kFormatVersion));
  }
}

fs::path ManifestParser::resolve_plugin_dir(const std::map<std::string, Entry>& top) {
  fs::path spec{std::string(kDefaultPluginDir)};
  if (auto it = top.find("plugin_dir"); it != top.end()) {
    if (auto value = read_string(it->second, "plugin_dir")) {
      if (value->empty()) {
        error(
            at_value(it->second), "plugin_dir",
            "must not be empty (omit it for the default '" + std::string(kDefaultPluginDir) + "')");
      } else {
        spec = *value;
      }
    }
  }
  fs::path dir;
  std::error_code ec;
  if (options_.plugin_dir_override) {
    // An override comes from the command line or the environment, so it is relative to
    // where the user is, not to the manifest.
    dir = fs::absolute(*options_.plugin_dir_override, ec);
  } else if (spec.is_absolute()) {
    dir = spec;
  } else {
    const fs::path base = file_.empty() ? fs::current_path(ec) : file_.parent_path();
    dir = base / spec;
  }
  dir = dir.lexically_normal();
  // "a/b/" normalises to "a/b/"; drop the empty last component so the path prints cleanly.
  if (!dir.has_filename() && dir.has_parent_path() && dir != dir.root_path()) {
    dir = dir.parent_path();
  }
  return dir;
}

void ManifestParser::parse_group(const yml::Node& node, const std::string& path,
                                 Manifest& manifest) {
  if (!node.IsMap()) {
    error(at(node.GetMark()), path,
          "expected a group (a map with name and library), got " + describe(node));
    return;
  }
  if (!check_collection_tag(node, path, "tag:yaml.org,2002:map")) return;
  GroupEntry group;
  group.where = at(node.GetMark());
  bool valid = true;
  const auto entries = read_map(node, path, kGroupKeys);

  if (const Entry* e = find(entries, "name", node, path, true)) {
    const std::string key = child_path(path, "name");
    if (auto name = read_string(*e, key)) {
      if (is_snake_case(*name)) {
        group.name = *name;
      } else {
        error(
            at_value(*e), key,
            "invalid group name " + quote_value(*name) + ": expected snake_case ([a-z][a-z0-9_]*)");
        valid = false;
      }
    } else {
      valid = false;
    }
  } else {
    valid = false;
  }

  if (const Entry* e = find(entries, "library", node, path, true)) {
    const std::string key = child_path(path, "library");
    if (auto library = read_string(*e, key)) {
      if (library->empty()) {
        error(at_value(*e), key, "must not be empty");
        valid = false;
      } else {
        group.library_spec = *library;
        group.library_where = at_value(*e);
        group.plugin_dir = manifest.plugin_dir;
        const fs::path spec(*library);
        group.library = (spec.is_absolute() ? spec : manifest.plugin_dir / spec).lexically_normal();
      }
    } else {
      valid = false;
    }
  } else {
    valid = false;
  }

  if (const Entry* e = find(entries, "enabled", node, path, false)) {
    if (auto enabled = read_bool(*e, child_path(path, "enabled"))) group.enabled = *enabled;
  }
  if (const Entry* e = find(entries, "version", node, path, false)) {
    const std::string key = child_path(path, "version");
    if (auto version = read_string(*e, key)) {
      if (version->empty()) {
        error(at_value(*e), key, "must not be empty (omit it to accept any version)");
      } else {
        group.version = *version;
      }
    }
  }
  if (const Entry* e = find(entries, "load", node, path, false)) {
    const std::string key = child_path(path, "load");
    if (auto load = read_string(*e, key)) {
      if (*load == "eager") {
        group.load = LoadMode::kEager;
      } else if (*load == "lazy") {
        group.load = LoadMode::kLazy;
      } else {
        error(at_value(*e), key,
              "invalid load mode " + quote_value(*load) + ": expected eager or lazy");
      }
    }
  }
  if (const Entry* e = find(entries, "sha256", node, path, false)) {
    const std::string key = child_path(path, "sha256");
    if (auto sha = read_string(*e, key)) {
      if (is_sha256(*sha)) {
        group.sha256 = *sha;
        group.sha256_where = at_value(*e);
      } else {
        const std::string problem =
            sha->size() != 64 ? "got " + std::to_string(sha->size()) + " characters"
                              : "found a character outside 0-9a-f (uppercase is not accepted)";
        error(at_value(*e), key,
              "invalid sha256 " + quote_value(*sha) + ": expected 64 lowercase hex digits; " +
                  problem);
      }
    }
  }

  // Entries without a usable name or library would only cause follow-on noise in the
  // duplicate and file checks; their own diagnostics already say what is wrong.
  if (valid) {
    manifest.groups.push_back(std::move(group));
    group_paths_.push_back(path);
  }
}

void ManifestParser::parse_groups(const Entry& entry, Manifest& manifest) {
  if (!entry.value.IsSequence()) {
    error(at_value(entry), "groups",
          "expected a sequence of groups (`- name: ...`; `[]` for none), got " +
              describe(entry.value));
    return;
  }
  if (!check_collection_tag(entry.value, "groups", "tag:yaml.org,2002:seq")) return;
  for (size_t i = 0; i < entry.value.size(); ++i) {
    parse_group(entry.value[i], index_path("groups", i), manifest);
  }
}

void ManifestParser::parse_alias(const yml::Node& node, const std::string& path,
                                 Manifest& manifest) {
  if (!node.IsMap()) {
    error(at(node.GetMark()), path,
          "expected an alias (a map with from and to), got " + describe(node));
    return;
  }
  if (!check_collection_tag(node, path, "tag:yaml.org,2002:map")) return;
  AliasEntry alias;
  alias.where = at(node.GetMark());
  bool valid = true;
  const auto entries = read_map(node, path, kAliasKeys);
  SourceLocation to_where;
  for (std::string_view field : {"from", "to"}) {
    const Entry* e = find(entries, field, node, path, true);
    if (e == nullptr) {
      valid = false;
      continue;
    }
    const std::string key = child_path(path, field);
    auto id = read_string(*e, key);
    if (!id) {
      valid = false;
    } else if (!is_op_id(*id)) {
      error(at_value(*e), key,
            "invalid op id " + quote_value(*id) +
                ": expected '<group>.<name>', both snake_case (e.g. layernorm.rmsnorm)");
      valid = false;
    } else if (field == "from") {
      alias.from = *id;
    } else {
      alias.to = *id;
      to_where = at_value(*e);
    }
  }
  if (valid && alias.from == alias.to) {
    error(to_where, child_path(path, "to"), "alias maps '" + alias.from + "' to itself; remove it");
  }
  if (const Entry* e = find(entries, "message", node, path, false)) {
    if (auto message = read_string(*e, child_path(path, "message"), true)) {
      alias.message = *message;
    }
  }
  if (valid) manifest.aliases.push_back(std::move(alias));
}

void ManifestParser::parse_aliases(const Entry& entry, Manifest& manifest) {
  if (!entry.value.IsSequence()) {
    error(at_value(entry), "aliases",
          "expected a sequence of aliases (`- from: ...`; `[]` or omit for none), got " +
              describe(entry.value));
    return;
  }
  if (!check_collection_tag(entry.value, "aliases", "tag:yaml.org,2002:seq")) return;
  for (size_t i = 0; i < entry.value.size(); ++i) {
    parse_alias(entry.value[i], index_path("aliases", i), manifest);
  }
}

void ManifestParser::parse_waivers(const Entry& entry, Manifest& manifest) {
  if (!entry.value.IsSequence()) {
    error(at_value(entry), "waivers",
          "expected a sequence of waivers (`- op: ...`; `[]` or omit for none), got " +
              describe(entry.value));
    return;
  }
  if (!check_collection_tag(entry.value, "waivers", "tag:yaml.org,2002:seq")) return;
  for (size_t i = 0; i < entry.value.size(); ++i) {
    const yml::Node node = entry.value[i];
    const std::string path = index_path("waivers", i);
    if (!node.IsMap()) {
      error(at(node.GetMark()), path,
            "expected a waiver (a map with op, check and reason), got " + describe(node));
      continue;
    }
    if (!check_collection_tag(node, path, "tag:yaml.org,2002:map")) continue;
    WaiverEntry waiver;
    waiver.where = at(node.GetMark());
    bool valid = true;
    const auto entries = read_map(node, path, kWaiverKeys);
    for (std::string_view field : {"op", "check", "reason"}) {
      const Entry* e = find(entries, field, node, path, true);
      if (e == nullptr) {
        valid = false;
        continue;
      }
      const std::string key = child_path(path, field);
      auto value = read_string(*e, key, field == "reason");
      if (!value) {
        valid = false;
      } else if (field == "op" && !is_op_id(*value)) {
        error(at_value(*e), key,
              "invalid op id " + quote_value(*value) + ": expected '<group>.<name>'");
        valid = false;
      } else if (field == "check" && std::find(kWaivableChecks.begin(), kWaivableChecks.end(),
                                               *value) == kWaivableChecks.end()) {
        error(at_value(*e), key,
              "check " + quote_value(*value) + " cannot be waived (waivable: reference-present)");
        valid = false;
      } else if (field == "reason" && value->find_first_not_of(" \t") == std::string::npos) {
        error(at_value(*e), key, "a waiver needs a reason");
        valid = false;
      } else {
        (field == "op" ? waiver.op : field == "check" ? waiver.check : waiver.reason) = *value;
      }
    }
    if (valid && manifest.find_waiver(waiver.op, waiver.check) != nullptr) {
      error(waiver.where, path, "duplicate waiver of " + waiver.check + " for " + waiver.op);
      valid = false;
    }
    if (valid) manifest.waivers.push_back(std::move(waiver));
  }
}

void ManifestParser::parse_expect_groups(const Entry& entry, Manifest& manifest) {
  if (!entry.value.IsSequence()) {
    error(at_value(entry), "expect_groups",
          "expected a sequence of group names (`[layernorm, activation]`), got " +
              describe(entry.value));
    return;
  }
  if (!check_collection_tag(entry.value, "expect_groups", "tag:yaml.org,2002:seq")) return;
  std::vector<std::string> names;
  std::map<std::string, SourceLocation> seen;
  for (size_t i = 0; i < entry.value.size(); ++i) {
    const yml::Node node = entry.value[i];
    const std::string path = index_path("expect_groups", i);
    if (!node.IsScalar()) {
      error(at(node.GetMark()), path, "expected a group name, got " + describe(node));
      continue;
    }
    if (std::string problem = string_problem(node, false); !problem.empty()) {
      error(at(node.GetMark()), path, problem);
      continue;
    }
    const std::string& name = node.Scalar();
    if (!is_snake_case(name)) {
      error(at(node.GetMark()), path,
            "invalid group name " + quote_value(name) + ": expected snake_case ([a-z][a-z0-9_]*)");
      continue;
    }
    if (auto [it, fresh] = seen.emplace(name, at(node.GetMark())); !fresh) {
      error(at(node.GetMark()), path,
            "group '" + name + "' is listed twice (first at " + it->second.to_string() + ")");
      continue;
    }
    names.push_back(name);
  }
  manifest.expect_groups = std::move(names);
  manifest.expect_groups_where = at_value(entry);
}

void ManifestParser::check_groups(const Manifest& manifest) {
  std::map<std::string, size_t> by_name;
  std::map<fs::path, size_t> by_library;
  for (size_t i = 0; i < manifest.groups.size(); ++i) {
    const GroupEntry& group = manifest.groups[i];
    const std::string& path = group_paths_[i];
    if (auto [it, inserted] = by_name.emplace(group.name, i); !inserted) {
      const GroupEntry& first = manifest.groups[it->second];
      error(group.where, child_path(path, "name"),
            "duplicate group name '" + group.name + "' at " + group.where.to_string() +
                "; first defined at " + first.where.to_string());
    }
    if (auto [it, inserted] = by_library.emplace(group.library, i); !inserted) {
      const GroupEntry& first = manifest.groups[it->second];
      error(group.library_where, child_path(path, "library"),
            "duplicate library " + quote_value(group.library.string()) + " at " +
                group.library_where.to_string() + "; already used by group '" + first.name +
                "' at " + first.library_where.to_string());
    }
    // A disabled group is allowed to name a library that is not built (yet).
    if (!options_.check_files || !group.enabled) continue;
    std::error_code ec;
    const fs::file_status status = fs::status(group.library, ec);
    if (status.type() == fs::file_type::not_found) {
      error(group.library_where, child_path(path, "library"),
            "library file not found: " + excerpt(group.library.string(), 4 * kQuoteChars) +
                " (build the plugins, set KREG_PLUGIN_DIR, or set enabled: false)");
    } else if (ec) {
      error(group.library_where, child_path(path, "library"),
            "cannot access library " + excerpt(group.library.string(), 4 * kQuoteChars) + ": " +
                ec.message());
    } else if (status.type() == fs::file_type::directory) {
      error(group.library_where, child_path(path, "library"),
            "library path is a directory, not a file: " +
                excerpt(group.library.string(), 4 * kQuoteChars));
    }
  }
}

void ManifestParser::check_aliases(const Manifest& manifest) {
  std::map<std::string, size_t> by_from;
  for (size_t i = 0; i < manifest.aliases.size(); ++i) {
    const AliasEntry& alias = manifest.aliases[i];
    const std::string path = index_path("aliases", i);
    if (auto [it, inserted] = by_from.emplace(alias.from, i); !inserted) {
      error(alias.where, child_path(path, "from"),
            "duplicate alias from '" + alias.from + "' at " + alias.where.to_string() +
                "; first defined at " + manifest.aliases[it->second].where.to_string());
    }
  }
  // A chain a -> b -> a would make alias resolution loop. Each cycle is reported once, at
  // its member that comes first in the file; self-aliases are reported where they are parsed.
  for (size_t i = 0; i < manifest.aliases.size(); ++i) {
    const AliasEntry& start = manifest.aliases[i];
    if (start.from == start.to || by_from.at(start.from) != i) continue;
    std::string chain = start.from;
    std::string current = start.to;
    bool is_cycle = false;
    for (size_t step = 0; step < manifest.aliases.size(); ++step) {
      chain += " -> " + current;
      if (current == start.from) {
        is_cycle = true;
        break;
      }
      auto next = by_from.find(current);
      if (next == by_from.end() || next->second < i) break;
      current = manifest.aliases[next->second].to;
    }
    if (is_cycle) {
      error(start.where, index_path("aliases", i), "alias cycle: " + chain);
    }
  }
}

void ManifestParser::parse_document(const yml::Node& root, Manifest& manifest) {
  if (root.IsNull()) {
    error(at(root.GetMark()), "",
          "the manifest is empty; expected a map with 'kreg_manifest' and 'groups' (see "
          "docs/manifest.md)");
    return;
  }
  if (!root.IsMap()) {
    error(
        at(root.GetMark()), "",
        "expected a map with 'kreg_manifest' and 'groups' at the top level, got " + describe(root));
    return;
  }
  if (!check_collection_tag(root, "", "tag:yaml.org,2002:map")) return;
  const auto top = read_map(root, "", kTopKeys);
  if (const Entry* e = find(top, "kreg_manifest", root, "", true)) parse_version(*e);
  manifest.plugin_dir = resolve_plugin_dir(top);
  if (const Entry* e = find(top, "groups", root, "", true)) parse_groups(*e, manifest);
  if (const Entry* e = find(top, "aliases", root, "", false)) parse_aliases(*e, manifest);
  if (const Entry* e = find(top, "waivers", root, "", false)) parse_waivers(*e, manifest);
  if (const Entry* e = find(top, "expect_groups", root, "", false)) {
    parse_expect_groups(*e, manifest);
  }
  check_groups(manifest);
  check_aliases(manifest);
}

Result<Manifest> ManifestParser::parse(const std::string& text,
                                       std::vector<ManifestDiagnostic>* out) {
  Manifest manifest;
  manifest.file = file_;
  bool text_too_long = false;
  if (text.size() > kMaxManifestBytes) {
    // The same cap as for a file, so text handed over directly is bounded too.
    error(SourceLocation{display_name_, 1, 1}, "",
          "the manifest is " + std::to_string(text.size()) +
              " bytes; the limit for a manifest is " + std::to_string(kMaxManifestBytes) +
              " bytes");
    text_too_long = true;
  }
  try {
    const yml::Loaded loaded = text_too_long ? yml::Loaded{} : yml::load(text);
    for (const yml::LoadError& e : loaded.errors) error(at(e.mark), "", e.message);
    if (!text_too_long && loaded.errors.empty()) {
      parse_document(loaded.document.root(), manifest);
      if (loaded.second_document) {
        error(at(loaded.second_document_mark), "",
              "a manifest is a single YAML document; a second one starts here: remove it");
      }
    }
  } catch (const std::exception& e) {
    // Nothing above is expected to throw (bad_alloc at worst), but a manifest must never take
    // down a host process.
    error(SourceLocation{display_name_}, "", "internal error: " + excerpt(e.what(), 200));
  }

  if (diagnostics_.empty()) return manifest;
  sort_and_trim();
  if (omitted_ > 0) {
    diagnostics_.push_back({first_omitted_, "",
                            "... and " + std::to_string(omitted_) +
                                " more problems not shown (the first of them here); fix "
                                "these and run again"});
  }
  std::string message;
  for (const ManifestDiagnostic& d : diagnostics_) {
    if (!message.empty()) message += '\n';
    message += d.to_string();
  }
  if (out != nullptr) out->insert(out->end(), diagnostics_.begin(), diagnostics_.end());
  return Status(KREG_INVALID_ARGUMENT, std::move(message));
}

fs::path absolute_normal(const fs::path& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  return (ec ? path : abs).lexically_normal();
}

}  // namespace

Result<Manifest> parse_manifest(const std::string& text, const std::filesystem::path& file,
                                const ManifestOptions& options,
                                std::vector<ManifestDiagnostic>* diagnostics) {
  const std::string display = file.empty() ? std::string("<manifest>") : file.string();
  ManifestParser parser(display, file.empty() ? fs::path() : absolute_normal(file), options);
  return parser.parse(text, diagnostics);
}

Result<std::string> read_manifest_file(const std::filesystem::path& file) {
  const fs::path shown = absolute_normal(file);
  auto text = read_regular_file(shown, "manifest", kMaxManifestBytes);
  if (text) return text;
  // RegularFile names "the manifest <path>"; say it once, in this function's own words.
  std::string why = text.status().message();
  // RegularFile's messages carry the path escaped; so does this one.
  const std::string shown_text = escape_control(shown.string());
  for (const std::string& prefix :
       {"cannot open the manifest " + shown_text + ": ", "the manifest " + shown_text + " "}) {
    if (why.rfind(prefix, 0) == 0) {
      why = why.substr(prefix.size());
      if (why.rfind("is ", 0) == 0) why = "it " + why;
      break;
    }
  }
  // The path is the caller's value: a huge one is quoted as an excerpt, as every value is.
  return Status(KREG_NOT_FOUND,
                "cannot read the manifest " + excerpt(shown.string(), 256) + ": " + why);
}

Result<Manifest> load_manifest(const std::filesystem::path& file, const ManifestOptions& options,
                               std::vector<ManifestDiagnostic>* diagnostics) {
  auto text = read_manifest_file(file);
  if (!text) {
    ManifestDiagnostic d{SourceLocation{file.string()}, "", text.status().message()};
    if (diagnostics != nullptr) diagnostics->push_back(d);
    // The message already names the manifest; a location prefix would say it twice.
    return Status(KREG_NOT_FOUND, d.message);
  }
  return parse_manifest(*text, file, options, diagnostics);
}

}  // namespace kreg
