// The message of a failed Boost.DLL load, for the core's own errors.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace kreg::detail {

// Boost.DLL reports a failed dlopen as "boost::dll::shared_library::load() failed (dlerror
// system message: <dlerror's text>): <the text of an unrelated errno, e.g. Bad file
// descriptor>". The dlerror text is what happened; anything else is returned whole.
inline std::string dll_error_text(const std::exception& e) {
  const std::string_view what = e.what();
  constexpr std::string_view kHead = "(dlerror system message: ";
  const size_t a = what.find(kHead);
  const size_t b = what.rfind("):");
  if (a == std::string_view::npos || b == std::string_view::npos || b < a + kHead.size()) {
    return std::string(what);
  }
  return "dlopen: " + std::string(what.substr(a + kHead.size(), b - a - kHead.size()));
}

}  // namespace kreg::detail
