// The manifest's bytes, checked before yaml-cpp sees them. yaml-cpp silently drops some
// control bytes (0x04 is its end-of-stream marker), transcodes UTF-16/32 it guesses from NUL
// patterns, and scans a run of '[' to the end before its depth guard fires, holding a token
// per bracket. One linear pass rejects all of that with the exact line and column.
#include <cstdint>
#include <cstdio>
#include <string>

#include "kreg/text.hpp"
#include "manifest_yaml.hpp"

namespace kreg::manifest_yaml {

namespace {

// Deeper flow nesting than this is refused before parsing; the tree's own depth limit
// (Limits::max_depth, lower) is the exact one. This count is a heuristic (brackets inside
// plain scalars may count), so it is set well above the exact limit.
constexpr int kMaxFlowBrackets = 128;
// yaml-cpp cannot hand out the first token of a flow collection that might be a mapping key
// (`{a: b, ...}: c`) before it has scanned to the collection's end, so one long flow
// collection is scanned and held whole, however early the node limit would stop the tree.
// Counting the entries (commas inside brackets) bounds that; the node limit is the same.
constexpr size_t kMaxFlowEntries = 50000;

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  return buf;
}

// One report per kind of bad byte (the first, with the total), so a file of a million
// NULs gives one line, not a million.
struct Finding {
  Mark first;
  std::string what;
  std::string hint;
  size_t count = 0;
};

}  // namespace

bool prescan(std::string_view text, std::vector<LoadError>& errors) {
  const size_t errors_before = errors.size();
  // A byte-order mark or NUL pattern of UTF-16/32: yaml-cpp would transcode it, and the
  // positions it reports would then not match the file's bytes.
  const auto u = [&](size_t i) { return i < text.size() ? static_cast<uint8_t>(text[i]) : 0x100; };
  if ((u(0) == 0xfe && u(1) == 0xff) || (u(0) == 0xff && u(1) == 0xfe) ||
      (u(0) == 0 && u(1) == 0 && u(2) == 0xfe && u(3) == 0xff) ||
      (text.size() >= 2 && (u(0) == 0 || u(1) == 0) && u(0) != u(1))) {
    errors.push_back({Mark{0, 0, 0},
                      "the manifest looks like UTF-16 or UTF-32 text; kreg reads UTF-8 only "
                      "(convert it, e.g. iconv -t UTF-8)"});
    return false;
  }

  const std::string text_only =
      "a manifest is UTF-8 text without control characters other than tab and line breaks";
  Finding nul{{}, "a NUL byte (\\0)", text_only};
  Finding control{{}, "", text_only};
  Finding bad_utf8{{}, "", "a manifest is UTF-8 text"};
  Finding bom{
      {}, "a byte-order mark (U+FEFF) after the start of the file", "it is invisible; delete it"};
  Finding lone_cr{
      {}, "a carriage return (\\r) not followed by a line feed", "end lines with \\n or \\r\\n"};
  auto note = [](Finding& f, const Mark& m, std::string what = {}) {
    if (f.count++ == 0) {
      f.first = m;
      if (!what.empty()) f.what = std::move(what);
    }
  };

  // The flow-bracket heuristic: quoted scalars and comments are skipped, and a bracket
  // counts as an opener only where a node may start (after whitespace or another flow
  // indicator), so brackets inside ordinary plain text rarely count.
  enum class In { kText, kDouble, kSingle, kComment } in = In::kText;
  int brackets = 0;
  bool too_deep = false;
  size_t flow_entries = 0;
  char prev = '\n';  // the previous byte, '\n' at a line start

  int line = 0;
  size_t line_start = 0;
  size_t i = 0;
  if (text.substr(0, 3) == "\xef\xbb\xbf") {
    i = 3;  // a leading UTF-8 BOM is allowed and yaml-cpp does not count it as a column
    line_start = 3;
  }
  for (; i < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    const Mark here{line, static_cast<int>(i - line_start), static_cast<int>(i)};
    if (b == '\n') {
      ++line;
      line_start = i + 1;
      if (in == In::kComment) in = In::kText;
      prev = '\n';
      continue;
    }
    if (b == '\r') {
      if (i + 1 >= text.size() || text[i + 1] != '\n') note(lone_cr, here);
      continue;
    }
    if (b == 0) {
      note(nul, here);
      prev = '\0';
      continue;
    }
    if ((b < 0x20 && b != '\t') || b == 0x7f) {
      note(control, here, "a control character (" + hex_byte(b) + ")");
      prev = static_cast<char>(b);
      continue;
    }
    if (b >= 0x80) {
      const auto [cp, n] = utf8_decode(text, i);
      if (n == 0) {
        note(bad_utf8, here, "a byte that is not valid UTF-8 (" + hex_byte(b) + ")");
      } else if (cp >= 0x80 && cp <= 0x9f) {
        note(control, here,
             "a control character (U+00" + hex_byte(static_cast<uint8_t>(cp)).substr(2) + ")");
      } else if (cp == 0xfeff) {
        note(bom, here);
      }
      if (n > 1) i += n - 1;
      prev = 'a';  // ordinary text for the bracket heuristic
      continue;
    }
    const char c = static_cast<char>(b);
    const bool token_start =
        prev == '\n' || prev == ' ' || prev == '\t' || prev == '[' || prev == '{' || prev == ',';
    switch (in) {
      case In::kComment:
        break;
      case In::kDouble:
        if (c == '\\') {
          // The escaped byte is skipped unless it ends the line (a line continuation).
          if (i + 1 < text.size() && text[i + 1] != '\n' && text[i + 1] != '\r') ++i;
        } else if (c == '"') {
          in = In::kText;
        }
        break;
      case In::kSingle:
        if (c == '\'') {
          if (i + 1 < text.size() && text[i + 1] == '\'') {
            ++i;  // '' is a quote inside the scalar
          } else {
            in = In::kText;
          }
        }
        break;
      case In::kText:
        if (c == '#' && (prev == '\n' || prev == ' ' || prev == '\t')) {
          in = In::kComment;
        } else if (c == '"' && (token_start || prev == ':')) {
          in = In::kDouble;
        } else if (c == '\'' && (token_start || prev == ':')) {
          in = In::kSingle;
        } else if ((c == '[' || c == '{') && token_start && !too_deep) {
          if (++brackets > kMaxFlowBrackets) {
            too_deep = true;
            errors.push_back({here, "flow collections ('[' or '{') nested more than " +
                                        std::to_string(kMaxFlowBrackets) +
                                        " deep; a manifest needs a few levels"});
          }
        } else if ((c == ']' || c == '}') && brackets > 0) {
          --brackets;
        } else if (c == ',' && brackets > 0 && ++flow_entries == kMaxFlowEntries + 1) {
          errors.push_back({here, "more than " + std::to_string(kMaxFlowEntries) +
                                      " entries in flow collections ([a, b, ...]); a manifest "
                                      "needs a few"});
        }
        break;
    }
    prev = c;
  }

  for (Finding* f : {&nul, &control, &bad_utf8, &bom, &lone_cr}) {
    if (f->count == 0) continue;
    std::string message = f->what + " in the manifest";
    if (f->count > 1) message += " (" + std::to_string(f->count) + " in all; this is the first)";
    errors.push_back({f->first, message + "; " + f->hint});
  }
  return errors.size() == errors_before;
}

size_t quoted_end(std::string_view text, size_t pos) {
  const char quote = text[pos];
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') {
      ++i;
    } else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;
      } else {
        return i;
      }
    }
  }
  return std::string_view::npos;
}

size_t find_unprintable(std::string_view s, bool text) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b == '\t' || b == '\n') {
      if (!text) return i;
      continue;
    }
    if (b < 0x20 || b == 0x7f) return i;
    if (b < 0x80) continue;
    const auto [cp, n] = utf8_decode(s, i);
    if (n == 0 || (cp >= 0x80 && cp <= 0x9f) || cp == 0xfeff) return i;
    i += n - 1;
  }
  return std::string_view::npos;
}

}  // namespace kreg::manifest_yaml
