#include "kreg/text.hpp"

#include <cstdint>
#include <cstdio>

namespace kreg {

Utf8Char utf8_decode(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t n;
  uint32_t cp;
  if (b0 < 0x80) return {b0, 1};
  if ((b0 & 0xe0) == 0xc0) {
    n = 2;
    cp = b0 & 0x1f;
  } else if ((b0 & 0xf0) == 0xe0) {
    n = 3;
    cp = b0 & 0x0f;
  } else if ((b0 & 0xf8) == 0xf0) {
    n = 4;
    cp = b0 & 0x07;
  } else
    return {};
  if (i + n > s.size()) return {};
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xc0) != 0x80) return {};
    cp = (cp << 6) | (b & 0x3f);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
    return {};
  }
  return {cp, n};
}

namespace {

// Characters that change what a reader sees rather than showing as themselves: C0
// controls and DEL; C1 controls (U+0080-U+009F, e.g. the 8-bit CSI, which some terminals
// act on); the bidirectional marks, embeddings, overrides and isolates, which reorder a
// line; and the line/paragraph separators, which split one.
bool is_hidden(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x061c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 ||
         cp == 0x2029;
}

void append_hex_bytes(std::string& out, std::string_view bytes) {
  for (char c : bytes) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
    out += buf;
  }
}

// Appends the character at s[i], escaped for a terminal, and returns how many bytes it used.
size_t append_escaped(std::string& out, std::string_view s, size_t i, bool escape_backslash) {
  const Utf8Char c = utf8_decode(s, i);
  if (c.n == 0) {
    append_hex_bytes(out, s.substr(i, 1));
    return 1;
  }
  switch (c.cp) {
    case '\n':
      out += "\\n";
      return 1;
    case '\r':
      out += "\\r";
      return 1;
    case '\t':
      out += "\\t";
      return 1;
    case '\0':
      out += "\\0";
      return 1;
    case '\\':
      out += escape_backslash ? "\\\\" : "\\";
      return 1;
    default:
      break;
  }
  if (is_hidden(c.cp)) {
    append_hex_bytes(out, s.substr(i, c.n));
  } else {
    out.append(s.substr(i, c.n));
  }
  return c.n;
}

std::string escape(std::string_view s, bool escape_backslash) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) i += append_escaped(out, s, i, escape_backslash);
  return out;
}

}  // namespace

std::string escape_control(std::string_view s) { return escape(s, true); }

std::string terminal_safe(std::string_view s) { return escape(s, false); }

std::string excerpt(std::string_view s, size_t max_chars) {
  std::string out;
  size_t i = 0;
  while (i < s.size() && out.size() < max_chars) i += append_escaped(out, s, i, true);
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string terminal_message(std::string_view s, std::string_view indent) {
  if (s.ends_with('\n')) s.remove_suffix(1);
  std::string out;
  out.reserve(s.size());
  bool first = true;
  while (true) {
    const size_t eol = s.find('\n');
    const std::string_view line = s.substr(0, eol);
    if (!first) {
      out += '\n';
      if (!line.empty() && line.front() != ' ') out += indent;
    }
    out += terminal_safe(line);
    first = false;
    if (eol == std::string_view::npos) break;
    s.remove_prefix(eol + 1);
  }
  return out;
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = utf8_decode(s, i);
    if (c.n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    switch (c.cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (is_hidden(c.cp)) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c.cp));
          out += buf;
        } else {
          out.append(s.substr(i, c.n));
        }
    }
    i += c.n;
  }
  return out;
}

}  // namespace kreg
