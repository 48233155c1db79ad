// Text that came from outside (plugins, manifests, command lines) on its way to a reader.
// Control characters are escaped so a plugin cannot forge an output line or recolour a
// terminal, and a value is quoted only as a short excerpt so one huge scalar cannot make a
// message huge.
//
// Who escapes what: the core escapes each outside piece when it builds a message
// (escape_control / excerpt), so a Status message is kreg's own text, possibly several
// lines joined with '\n', with escaped fields in it. The tools print a message with
// terminal_message (its own newlines kept, every line made safe again, which changes nothing
// in a message the core built correctly) and a single field with terminal_safe. JSON output
// uses json_escape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kreg {

// One UTF-8 character of outside text: its code point and byte length (1-4), or n == 0
// when the bytes at the position are not a valid UTF-8 sequence (a stray continuation
// byte, a truncated sequence, an overlong form, a surrogate or a value past U+10FFFF).
struct Utf8Char {
  uint32_t cp = 0;
  size_t n = 0;
};
// The character starting at s[i] (i < s.size()).
Utf8Char utf8_decode(std::string_view s, size_t i);

// `s` with every byte that is not printable escaped: \n \r \t \0 as such, other C0/C1
// controls, DEL, bidirectional overrides, line/paragraph separators and bytes that are not
// valid UTF-8 as \xNN; a backslash becomes \\ so the escaped text reads back unambiguously.
// Valid printable UTF-8 is kept.
std::string escape_control(std::string_view s);

// escape_control(s) cut to at most about `max_chars` output characters; a cut value ends
// with "... (N bytes)" so the reader knows it was longer.
std::string excerpt(std::string_view s, size_t max_chars = 80);

// One field for a terminal line: escaped as escape_control does, except that a backslash
// stays a backslash. The result never contains a control character, so applying it twice
// changes nothing: text the core already escaped is printed as it is.
std::string terminal_safe(std::string_view s);

// A message of one or more lines joined with '\n' (kreg's own line structure): every line
// through terminal_safe, and every line after the first that does not already start with a
// space indented by `indent`, so no part of a message can pass for a line of its own
// (`error [...]` at the start of a line is always one kreg printed). A trailing newline is
// dropped.
std::string terminal_message(std::string_view s, std::string_view indent = "  ");

// The inside of a JSON string literal for `s`: " and \ escaped, every C0 control, DEL, C1
// control, bidirectional override and U+2028/U+2029 as \uXXXX, and each byte that is not
// valid UTF-8 as \ufffd (JSON text must be UTF-8; the replacement character says a byte
// was lost). The result is always valid JSON and valid UTF-8.
std::string json_escape(std::string_view s);

}  // namespace kreg
