// Human output of the tools (kreg, kreg-host, lplb_demo). A line is built from kreg's own
// words, written as string literals and printed as they are, and data: every other string
// (group names, versions, op ids, signatures, descriptions, paths, messages from plugins,
// manifests and the command line), which goes out through kreg::terminal_safe so it cannot
// end a line, move the cursor or recolour the terminal. A string held in a variable is data
// unless wrapped in raw(); a Status message goes through message() (kreg/text.hpp says why).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "kreg/text.hpp"

namespace kreg::cli {

// kreg's own text held in a variable (colour codes): printed as it is.
struct Raw {
  std::string_view text;
};
inline Raw raw(std::string_view s) { return {s}; }

// A message kreg built (a Status message, joined diagnostics): its own newlines kept, every
// line made safe, continuation lines indented (kreg::terminal_message).
struct Message {
  std::string_view text;
};
inline Message message(std::string_view s) { return {s}; }

// Data left-aligned in a column of `width` bytes, like printf's %-*s, escaped first.
struct Padded {
  std::string_view text;
  size_t width;
};
inline Padded pad(std::string_view s, size_t width) { return {s, width}; }

// A number through a printf format of kreg's own ("%.3g"): numbers only, so no %s can slip
// data past the escaping.
template <typename... Args>
requires((std::is_arithmetic_v<Args> && !std::is_same_v<Args, char>)&&...) std::string
    fmt(const char* format, Args... args) {
  char buf[128];
  const int n = std::snprintf(buf, sizeof buf, format, args...);
  return std::string(buf, n < 0 ? 0 : std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
}
struct Formatted {
  std::string text;
};
template <typename... Args>
requires((std::is_arithmetic_v<Args> && !std::is_same_v<Args, char>)&&...) Formatted
    num(const char* format, Args... args) {
  return {fmt(format, args...)};
}

class Printer {
 public:
  explicit Printer(FILE* f) : f_(f) {}

  // A string literal: kreg's own words.
  template <size_t N>
  Printer& operator<<(const char (&literal)[N]) {
    return put(std::string_view(literal, ::strnlen(literal, N)));
  }
  // A writable char array is a buffer filled at run time, not a literal: say which it is.
  template <size_t N>
  Printer& operator<<(char (&)[N]) = delete;
  // Everything else that is text is data. A `const char*` needs a template of its own: a
  // plain overload would beat the literal template above, and without one a pointer would
  // convert to bool before it converted to string_view.
  template <typename T>
  requires std::is_same_v < std::decay_t<T>,
  const char* > || std::is_same_v<std::decay_t<T>, char*> Printer& operator<<(T&& data) {
    return put(terminal_safe(data != nullptr ? std::string_view(data) : "(null)"));
  }
  Printer& operator<<(std::string_view data) { return put(terminal_safe(data)); }
  Printer& operator<<(Raw r) { return put(r.text); }
  Printer& operator<<(Message m) { return put(terminal_message(m.text)); }
  Printer& operator<<(const Formatted& f) { return put(f.text); }
  Printer& operator<<(Padded p) {
    const std::string s = terminal_safe(p.text);
    put(s);
    if (s.size() < p.width) put(std::string(p.width - s.size(), ' '));
    return *this;
  }
  Printer& operator<<(char c) = delete;  // a char is ambiguous (byte or number): use a literal
  Printer& operator<<(bool) = delete;
  template <std::integral I>
  Printer& operator<<(I v) {
    return put(std::to_string(v));
  }
  Printer& operator<<(double v) { return put(fmt("%g", v)); }

  void flush() { std::fflush(f_); }

 private:
  Printer& put(std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), f_);
    return *this;
  }
  FILE* f_;
};

}  // namespace kreg::cli
