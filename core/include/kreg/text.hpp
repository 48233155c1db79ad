// Text that came from outside (plugins, manifests, command lines) on its way into a message
// a human reads. Control characters are escaped so a plugin cannot forge an output line or
// recolour a terminal, and a value is quoted only as a short excerpt so one huge scalar
// cannot make a message huge. JSON output has its own escaping and needs neither.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kreg {

// `s` with every byte that is not printable escaped: \n \r \t \0 as such, other C0/C1
// controls, DEL and bytes that are not valid UTF-8 as \xNN. Valid printable UTF-8 is kept.
std::string escape_control(std::string_view s);

// escape_control(s) cut to at most about `max_chars` output characters; a cut value ends
// with "... (N bytes)" so the reader knows it was longer.
std::string excerpt(std::string_view s, size_t max_chars = 80);

}  // namespace kreg
