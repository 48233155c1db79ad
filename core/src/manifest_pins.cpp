// Rewriting a manifest's sha256 pins in place (kreg validate --update-pins): line edits
// of the original text, so comments and layout survive, checked by parsing the result
// again (it must be the same manifest with only the pins changed).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/manifest.hpp"
#include "kreg/text.hpp"
#include "manifest_yaml.hpp"

namespace kreg {

namespace yml = manifest_yaml;

namespace {

// The parser's rules (manifest.cpp): a pin is 64 lowercase hex digits; a value quoted in
// a message is escaped and cut to a short excerpt.
bool is_sha256(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string quote_value(std::string_view s) { return "'" + excerpt(s, 80) + "'"; }

}  // namespace

namespace {

// The value of `key` in a map (the first, as YAML lookups do); a default Node when absent.
std::optional<yml::Node> lookup(const yml::Node& map, std::string_view key) {
  for (size_t i = 0; i < map.size(); ++i) {
    if (map.key(i).IsScalar() && map.key(i).Scalar() == key) return map.value(i);
  }
  return std::nullopt;
}

// Whether two trees are the same: kinds, tags, values and map keys in order.
bool same_tree(const yml::Node& a, const yml::Node& b) {
  if (a.kind() != b.kind() || a.Tag() != b.Tag() || a.Scalar() != b.Scalar() ||
      a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a.IsMap() ? !same_tree(a.key(i), b.key(i)) || !same_tree(a.value(i), b.value(i))
                  : !same_tree(a[i], b[i])) {
      return false;
    }
  }
  return true;
}

// Whether `edited` is `original` with only the pins of `pins` set: every other node the
// same, each pinned group holding exactly one sha256, its pin.
bool only_pins_changed(const yml::Node& original, const yml::Node& edited,
                       const std::map<std::string, std::string>& pins) {
  auto pinned = [&](const yml::Node& group) -> const std::string* {
    const std::optional<yml::Node> name = group.IsMap() ? lookup(group, "name") : std::nullopt;
    if (!name || !name->IsScalar()) return nullptr;
    auto it = pins.find(name->Scalar());
    return it == pins.end() ? nullptr : &it->second;
  };
  auto same_group = [&](const yml::Node& a, const yml::Node& b) {
    const std::string* pin = pinned(a);
    if (pin == nullptr) return same_tree(a, b);
    if (!b.IsMap() || a.Tag() != b.Tag()) return false;
    std::vector<std::pair<yml::Node, yml::Node>> rest_a, rest_b;
    size_t shas = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(a.key(i).IsScalar() && a.key(i).Scalar() == "sha256")) {
        rest_a.emplace_back(a.key(i), a.value(i));
      }
    }
    for (size_t i = 0; i < b.size(); ++i) {
      if (b.key(i).IsScalar() && b.key(i).Scalar() == "sha256") {
        if (++shas > 1 || !b.value(i).IsScalar() || b.value(i).Scalar() != *pin) return false;
      } else {
        rest_b.emplace_back(b.key(i), b.value(i));
      }
    }
    if (shas != 1 || rest_a.size() != rest_b.size()) return false;
    for (size_t i = 0; i < rest_a.size(); ++i) {
      if (!same_tree(rest_a[i].first, rest_b[i].first) ||
          !same_tree(rest_a[i].second, rest_b[i].second)) {
        return false;
      }
    }
    return true;
  };
  if (!original.IsMap() || !edited.IsMap() || original.size() != edited.size() ||
      original.Tag() != edited.Tag()) {
    return false;
  }
  for (size_t i = 0; i < original.size(); ++i) {
    const yml::Node key = original.key(i);
    if (!same_tree(key, edited.key(i))) return false;
    const yml::Node a = original.value(i);
    const yml::Node b = edited.value(i);
    if (!(key.IsScalar() && key.Scalar() == "groups" && a.IsSequence())) {
      if (!same_tree(a, b)) return false;
      continue;
    }
    if (!b.IsSequence() || a.size() != b.size() || a.Tag() != b.Tag()) return false;
    for (size_t g = 0; g < a.size(); ++g) {
      if (!same_group(a[g], b[g])) return false;
    }
  }
  return true;
}

}  // namespace

Result<std::string> rewrite_manifest_pins(const std::string& text,
                                          const std::map<std::string, std::string>& pins) {
  // An edit replaces [begin, end) of the text; edits are applied from the back so earlier
  // offsets stay valid. yaml-cpp's marks count bytes of UTF-8 input.
  struct Edit {
    size_t begin;
    size_t end;
    std::string with;
  };
  std::vector<Edit> edits;
  std::set<std::string> done;
  auto fail = [](const std::string& why) -> Result<std::string> {
    return Status(KREG_INVALID_ARGUMENT, "cannot update the sha256 pins: " + why);
  };
  // The same bounded reading as the parser's: this runs on the file before it is rewritten.
  const yml::Loaded loaded = yml::load(text);
  if (!loaded.errors.empty()) {
    const yml::LoadError& e = loaded.errors.front();
    return fail("the manifest does not parse: line " + std::to_string(e.mark.line + 1) +
                ", column " + std::to_string(e.mark.column + 1) + ": " + e.message);
  }
  const yml::Node root = loaded.document.root();
  const std::optional<yml::Node> groups = root.IsMap() ? lookup(root, "groups") : std::nullopt;
  if (!groups || !groups->IsSequence()) return fail("the manifest has no sequence of groups");
  auto mark_pos = [&](const yml::Node& n) -> std::optional<size_t> {
    const int pos = n.GetMark().pos;
    if (pos < 0 || static_cast<size_t>(pos) >= text.size()) return std::nullopt;
    return static_cast<size_t>(pos);
  };
  for (size_t g = 0; g < groups->size(); ++g) {
    const yml::Node group = (*groups)[g];
    const std::optional<yml::Node> name_node = group.IsMap() ? lookup(group, "name") : std::nullopt;
    if (!name_node || !name_node->IsScalar()) continue;
    const std::string& name = name_node->Scalar();
    auto pin = pins.find(name);
    if (pin == pins.end()) continue;
    const std::string where =
        "group " + quote_value(name) + " (line " + std::to_string(group.GetMark().line + 1) + ")";
    if (group.IsAlias()) {
      return fail(where + " is an alias of another node; add its sha256 by hand");
    }
    if (group.IsFlow()) {
      return fail(where + " is written as a flow map; add its sha256 by hand");
    }
    std::optional<yml::Node> key_library, value_library, key_sha, value_sha;
    for (size_t i = 0; i < group.size(); ++i) {
      const yml::Node key = group.key(i);
      if (!key.IsScalar()) continue;
      if (key.Scalar() == "library" && !key_library) {
        key_library = key;
        value_library = group.value(i);
      } else if (key.Scalar() == "sha256" && !key_sha) {
        key_sha = key;
        value_sha = group.value(i);
      }
    }
    if (key_sha) {
      const std::optional<size_t> key_pos = mark_pos(*key_sha);
      const std::optional<size_t> value_pos = mark_pos(*value_sha);
      if (value_sha->IsAlias()) {
        return fail(where + ": its sha256 is an alias; fix it by hand");
      } else if (value_sha->IsScalar() && !value_sha->Scalar().empty() && value_pos) {
        const size_t begin = *value_pos;
        const char quote = text[begin];
        if (quote == '"' || quote == '\'') {
          const size_t end = yml::quoted_end(text, begin);
          if (end == std::string::npos) return fail(where + ": unterminated sha256 value");
          edits.push_back({begin + 1, end, pin->second});
        } else {
          // A plain scalar on one line is written exactly as yaml-cpp reads it.
          const size_t end = begin + value_sha->Scalar().size();
          if (end > text.size() || text.compare(begin, end - begin, value_sha->Scalar()) != 0) {
            return fail(where + ": its sha256 value spans lines or has a tag; fix it by hand");
          }
          edits.push_back({begin, end, pin->second});
        }
      } else if (value_sha->IsNull() && key_pos) {
        // `sha256:` with nothing after it: write the value after the colon.
        const size_t colon = text.find(':', *key_pos);
        if (colon == std::string::npos) return fail(where + ": cannot find its sha256 key");
        edits.push_back({colon + 1, colon + 1, " " + pin->second});
      } else {
        return fail(where + ": its sha256 is not a string; fix it by hand");
      }
    } else {
      if (!key_library || !value_library->IsScalar() || !mark_pos(*value_library)) {
        return fail(where + " has no library line to put the pin under");
      }
      // The pin goes on the line after the library value, which must end on its own line.
      const size_t value_begin = *mark_pos(*value_library);
      size_t value_end = std::string::npos;
      if (text[value_begin] == '"' || text[value_begin] == '\'') {
        value_end = yml::quoted_end(text, value_begin);
      } else if (text.compare(value_begin, value_library->Scalar().size(),
                              value_library->Scalar()) == 0) {
        value_end = value_begin + value_library->Scalar().size();
      }
      if (value_end == std::string::npos) {
        return fail(where + ": its library value spans lines or has a tag; add the pin by hand");
      }
      const size_t eol = text.find('\n', value_end);
      const auto column = static_cast<size_t>(std::max(0, key_library->GetMark().column));
      const std::string line = std::string(column, ' ') + "sha256: " + pin->second;
      // The new line ends like the one it follows, so a CRLF file stays CRLF.
      const std::string eol_text =
          eol != std::string::npos && eol > 0 && text[eol - 1] == '\r' ? "\r\n" : "\n";
      if (eol == std::string::npos) {
        edits.push_back({text.size(), text.size(), "\n" + line});
      } else {
        edits.push_back({eol + 1, eol + 1, line + eol_text});
      }
    }
    done.insert(name);
  }
  for (const auto& [name, sha] : pins) {
    if (!done.count(name)) return fail("no group named " + quote_value(name) + " in the manifest");
    if (!is_sha256(sha)) return fail(quote_value(sha) + " is not 64 lowercase hex digits");
  }
  std::sort(edits.begin(), edits.end(),
            [](const Edit& a, const Edit& b) { return a.begin > b.begin; });
  std::string out = text;
  for (const Edit& e : edits) out.replace(e.begin, e.end - e.begin, e.with);
  // Line edits of YAML can change what a neighbouring line means (a comment, a scalar
  // continued on the next line); the result must read as the same manifest with the pins.
  const yml::Loaded check = yml::load(out);
  if (!check.errors.empty() || check.second_document ||
      !only_pins_changed(root, check.document.root(), pins)) {
    return fail(
        "the edit would change more than the sha256 pins (the layout around a "
        "library line is unusual); add them by hand");
  }
  return out;
}

}  // namespace kreg
