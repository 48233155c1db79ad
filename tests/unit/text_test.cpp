// kreg/text.hpp: escaping outside text for terminals and JSON. Every byte value is tried,
// so a byte that slips through unescaped fails here rather than in a user's terminal.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

#include "kreg/text.hpp"

namespace kreg {
namespace {

// True when `s` holds no byte a terminal acts on: no C0 control, no DEL, and (as UTF-8)
// no C1 control, bidirectional control or line/paragraph separator.
bool terminal_clean(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x20 || b == 0x7f) return false;
    if (b >= 0x80) return false;  // callers below only pass ASCII-escaped output
  }
  return true;
}

// A strict JSON string check (RFC 8259): no raw control, valid escapes, valid UTF-8.
bool valid_json_string_body(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x20 || b == '"') return false;
    if (b == '\\') {
      if (i + 1 >= s.size()) return false;
      const char e = s[++i];
      if (e == 'u') {
        if (i + 4 >= s.size()) return false;
        for (int k = 1; k <= 4; ++k) {
          if (!std::isxdigit(static_cast<unsigned char>(s[i + k]))) return false;
        }
        i += 4;
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
        return false;
      }
      continue;
    }
    if (b >= 0x80) {
      size_t n = (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
      if (n == 0 || i + n > s.size()) return false;
      for (size_t k = 1; k < n; ++k) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
      }
      i += n - 1;
    }
  }
  return true;
}

// The one UTF-8 decoder behind the escapes and the manifest's byte pre-scan.
TEST(Text, Utf8DecodeAcceptsOnlyShortestFormScalarValues) {
  struct Case {
    std::string_view bytes;
    uint32_t cp;
    size_t n;  // 0: not a valid sequence at position 0
  };
  const Case cases[] = {
      {"A", 'A', 1},
      {"\x7f", 0x7f, 1},
      {"\xc3\xa9", 0xe9, 2},              // é
      {"\xe2\x80\xae", 0x202e, 3},        // RIGHT-TO-LEFT OVERRIDE (valid; escaped elsewhere)
      {"\xf0\x9f\x98\x80", 0x1f600, 4},   // an emoji
      {"\xf4\x8f\xbf\xbf", 0x10ffff, 4},  // the last code point
      {"\xc0\xaf", 0, 0},                 // overlong '/'
      {"\xe0\x80\xaf", 0, 0},             // overlong, 3 bytes
      {"\xf0\x80\x80\xaf", 0, 0},         // overlong, 4 bytes
      {"\xed\xa0\x80", 0, 0},             // a UTF-16 surrogate (U+D800)
      {"\xf4\x90\x80\x80", 0, 0},         // past U+10FFFF
      {"\x80", 0, 0},                     // a lone continuation byte
      {"\xe2\x80", 0, 0},                 // truncated at the end of the text
      {"\xe2(\xae", 0, 0},                // a continuation byte missing
      {"\xff", 0, 0},                     // never in UTF-8
  };
  for (const Case& c : cases) {
    const Utf8Char got = utf8_decode(c.bytes, 0);
    EXPECT_EQ(got.n, c.n) << escape_control(c.bytes);
    if (c.n != 0) EXPECT_EQ(got.cp, c.cp) << escape_control(c.bytes);
  }
  // Decoding starts at the given position and stops at the end of the view.
  const std::string_view text = "a\xc3\xa9";
  EXPECT_EQ(utf8_decode(text, 1).n, 2u);
  EXPECT_EQ(utf8_decode(text.substr(0, 2), 1).n, 0u);
}

TEST(Text, EveryByteValueIsEscapedOrPrintable) {
  for (int b = 0; b < 256; ++b) {
    const std::string in(1, static_cast<char>(b));
    const std::string esc = escape_control(in);
    const std::string safe = terminal_safe(in);
    if (b >= 0x20 && b < 0x7f && b != '\\') {
      EXPECT_EQ(esc, in) << b;
      EXPECT_EQ(safe, in) << b;
    } else {
      // A lone byte >= 0x80 is never valid UTF-8.
      EXPECT_TRUE(terminal_clean(esc)) << b << " -> " << esc;
      EXPECT_TRUE(terminal_clean(safe)) << b << " -> " << safe;
      EXPECT_NE(esc, in) << b;
    }
    const std::string json = json_escape(in);
    EXPECT_TRUE(valid_json_string_body(json)) << b << " -> " << json;
  }
}

TEST(Text, NamedEscapesAndHexForTheRest) {
  EXPECT_EQ(escape_control(std::string("a\nb\rc\td\0e", 9)), "a\\nb\\rc\\td\\0e");
  EXPECT_EQ(escape_control("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(escape_control("\x7f"), "\\x7f");
  EXPECT_EQ(escape_control("a\\b"), "a\\\\b");
  EXPECT_EQ(terminal_safe("a\\b"), "a\\b");
  EXPECT_EQ(terminal_safe("\n error [forged]"), "\\n error [forged]");
}

TEST(Text, Utf8IsKeptUnlessItHidesSomething) {
  EXPECT_EQ(escape_control("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80");
  // C1 CSI (U+009B) as UTF-8, and the raw 8-bit CSI byte.
  EXPECT_EQ(escape_control("\xc2\x9b"
                           "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(escape_control("\x9b"
                           "31m"),
            "\\x9b31m");
  // Bidi override (U+202E), isolate (U+2066), RLM (U+200F), line separator (U+2028).
  EXPECT_EQ(escape_control("a\xe2\x80\xae"
                           "b"),
            "a\\xe2\\x80\\xaeb");
  EXPECT_EQ(escape_control("\xe2\x81\xa6"), "\\xe2\\x81\\xa6");
  EXPECT_EQ(escape_control("\xe2\x80\x8f"), "\\xe2\\x80\\x8f");
  EXPECT_EQ(escape_control("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");
  // Invalid: overlong '/', a surrogate, past U+10FFFF, truncated, stray continuation.
  EXPECT_EQ(escape_control("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(escape_control("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(escape_control("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(escape_control("\xe2\x9c"), "\\xe2\\x9c");
  EXPECT_EQ(escape_control("\x80x"), "\\x80x");
}

TEST(Text, TerminalSafeIsIdempotent) {
  const std::string nasty = std::string("op\n error [forged]\x1b[2J\r\x9b\xff\0\\x", 28);
  const std::string once = terminal_safe(nasty);
  EXPECT_TRUE(terminal_clean(once)) << once;
  EXPECT_EQ(terminal_safe(once), once);
  EXPECT_EQ(terminal_safe(escape_control(nasty)), escape_control(nasty));
}

TEST(Text, MessagesKeepTheirLinesAndIndentContinuations) {
  EXPECT_EQ(terminal_message("no implementation accepts:\n  - cpu: dtype\n  - cuda: sm"),
            "no implementation accepts:\n  - cpu: dtype\n  - cuda: sm");
  EXPECT_EQ(terminal_message("a.yaml:1:1: bad\nb.yaml:2:2: worse\n"),
            "a.yaml:1:1: bad\n  b.yaml:2:2: worse");
  // A line that slipped in unescaped cannot start at column 0, nor carry an escape.
  EXPECT_EQ(terminal_message("x\nerror [forged] \x1b[31m"), "x\n  error [forged] \\x1b[31m");
  EXPECT_EQ(terminal_message(""), "");
  EXPECT_EQ(terminal_message("one\r"), "one\\r");
}

TEST(Text, ExcerptCutsLongValues) {
  EXPECT_EQ(excerpt("short"), "short");
  const std::string cut = excerpt(std::string(1000, 'a'), 10);
  EXPECT_EQ(cut, "aaaaaaaaaa... (1000 bytes)");
  EXPECT_EQ(excerpt(std::string(5, '\x1b'), 8), "\\x1b\\x1b... (5 bytes)");
}

TEST(Text, JsonEscapesControlsAndReplacesInvalidUtf8) {
  EXPECT_EQ(json_escape("a\"b\\c\nd\te\rf\bg\fh"), "a\\\"b\\\\c\\nd\\te\\rf\\bg\\fh");
  EXPECT_EQ(json_escape(std::string("\0\x1b\x7f", 3)), "\\u0000\\u001b\\u007f");
  EXPECT_EQ(json_escape("\xc2\x9b"), "\\u009b");
  EXPECT_EQ(json_escape("\xe2\x80\xae\xe2\x80\xa8"), "\\u202e\\u2028");
  EXPECT_EQ(json_escape("\xff\xc3"), "\\ufffd\\ufffd");
  EXPECT_EQ(json_escape("caf\xc3\xa9"), "caf\xc3\xa9");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_TRUE(valid_json_string_body(json_escape(all)));
  EXPECT_TRUE(valid_json_string_body(json_escape(all + all.substr(0x80))));
}

}  // namespace
}  // namespace kreg
