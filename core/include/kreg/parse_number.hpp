// The one strict parser for numbers and booleans written by people: signature defaults
// and dimensions, command-line options, shape specs. The whole text must be the number
// (no spaces, no '+', no suffix such as "4abc", no hex), it must fit the asked range, and
// floats must be finite. Errors are INVALID_ARGUMENT and name `what` (the option or
// argument, e.g. "--attr eps"), the value as a short escaped excerpt, and the range.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "kreg/status.hpp"

namespace kreg {

// Decimal integer: an optional '-', then digits.
Result<int64_t> parse_int(std::string_view text, std::string_view what,
                          int64_t min = std::numeric_limits<int64_t>::min(),
                          int64_t max = std::numeric_limits<int64_t>::max());

// Decimal integer without a sign ("-1" is an error, not 2^64-1).
Result<uint64_t> parse_uint(std::string_view text, std::string_view what,
                            uint64_t max = std::numeric_limits<uint64_t>::max());

// Decimal or scientific float ("1e-6", "-0.5", "3"). Values past the double range
// ("1e400"), inf and nan are errors.
Result<double> parse_float(std::string_view text, std::string_view what);

// Exactly "true" / "false", or "1" / "0". Anything else ("yes", "TRUE", "") is an error.
Result<bool> parse_bool(std::string_view text, std::string_view what);

// "[min, max]" as the messages print it.
std::string range_text(int64_t min, int64_t max);

}  // namespace kreg
