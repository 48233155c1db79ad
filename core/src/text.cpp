#include "kreg/text.hpp"

#include <cstdint>
#include <cstdio>

namespace kreg {

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 when it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t n;
  uint32_t cp;
  if (b0 < 0x80) return 1;
  if ((b0 & 0xe0) == 0xc0) { n = 2; cp = b0 & 0x1f; }
  else if ((b0 & 0xf0) == 0xe0) { n = 3; cp = b0 & 0x0f; }
  else if ((b0 & 0xf8) == 0xf0) { n = 4; cp = b0 & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3f);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
    return 0;
  }
  // C1 controls (U+0080-U+009F, e.g. the 8-bit CSI) act like escape codes on some
  // terminals; bidirectional overrides and line/paragraph separators reorder or split
  // what a reader sees.
  if ((cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
      (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 || cp == 0x2029) {
    return 0;
  }
  return n;
}

void append_escaped(std::string& out, std::string_view s, size_t i, size_t* used) {
  const auto b = static_cast<uint8_t>(s[i]);
  switch (b) {
    case '\n': out += "\\n"; *used = 1; return;
    case '\r': out += "\\r"; *used = 1; return;
    case '\t': out += "\\t"; *used = 1; return;
    case '\0': out += "\\0"; *used = 1; return;
    case '\\': out += "\\\\"; *used = 1; return;
    default: break;
  }
  if (b >= 0x20 && b < 0x7f) {
    out += static_cast<char>(b);
    *used = 1;
    return;
  }
  if (b >= 0x80) {
    if (const size_t n = utf8_length(s, i); n > 0) {
      out.append(s.substr(i, n));
      *used = n;
      return;
    }
  }
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  out += buf;
  *used = 1;
}

}  // namespace

std::string escape_control(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t used = 1;
    append_escaped(out, s, i, &used);
    i += used;
  }
  return out;
}

std::string excerpt(std::string_view s, size_t max_chars) {
  std::string out;
  size_t i = 0;
  while (i < s.size() && out.size() < max_chars) {
    size_t used = 1;
    append_escaped(out, s, i, &used);
    i += used;
  }
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace kreg
