#include "kreg/parse_number.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

#include "kreg/text.hpp"

namespace kreg {

namespace {

std::string quoted(std::string_view text) { return "'" + excerpt(text, 40) + "'"; }

Status bad(std::string_view what, std::string_view text, const std::string& expected) {
  return Status(KREG_INVALID_ARGUMENT,
                std::string(what) + ": " + quoted(text) + " is not " + expected);
}

Status out_of_range(std::string_view what, std::string_view text, const std::string& range) {
  return Status(KREG_INVALID_ARGUMENT,
                std::string(what) + ": " + quoted(text) + " is out of range " + range);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::string range_text(int64_t min, int64_t max) {
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

Result<int64_t> parse_int(std::string_view text, std::string_view what, int64_t min, int64_t max) {
  const std::string_view digits = !text.empty() && text[0] == '-' ? text.substr(1) : text;
  if (!all_digits(digits)) return bad(what, text, "an integer");
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && (v < min || v > max))) {
    return out_of_range(what, text, range_text(min, max));
  }
  if (ec != std::errc() || ptr != text.data() + text.size()) return bad(what, text, "an integer");
  return v;
}

Result<uint64_t> parse_uint(std::string_view text, std::string_view what, uint64_t max) {
  const std::string range = "[0, " + std::to_string(max) + "]";
  if (!text.empty() && text[0] == '-' && all_digits(text.substr(1))) {
    return out_of_range(what, text, range);
  }
  if (!all_digits(text)) return bad(what, text, "a non-negative integer");
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && v > max)) {
    return out_of_range(what, text, range);
  }
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return bad(what, text, "a non-negative integer");
  }
  return v;
}

Result<double> parse_float(std::string_view text, std::string_view what) {
  // from_chars alone would take "inf", "nan" and "infinity"; only digits, one '.', an
  // exponent and a leading '-' are numbers here.
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')) {
      return bad(what, text, "a finite number");
    }
  }
  if (text.empty() || text[0] == '+') return bad(what, text, "a finite number");
  double v = 0;
  const auto [ptr, ec] =
      std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    return Status(KREG_INVALID_ARGUMENT,
                  std::string(what) + ": " + quoted(text) + " is out of range for a double");
  }
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(v)) {
    return bad(what, text, "a finite number");
  }
  return v;
}

Result<bool> parse_bool(std::string_view text, std::string_view what) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  return bad(what, text, "a bool (true, false, 1 or 0)");
}

}  // namespace kreg
