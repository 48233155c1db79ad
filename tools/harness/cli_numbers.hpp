// Float options of the tools (kreg, kreg-host, kreg-store, kreg-tp-demo, lplb_demo).
// CLI::Range and CLI::PositiveNumber compare the parsed value with their bounds, and every
// comparison with NaN is false: "--timeout nan" passed them, as did "inf" where a check had
// no upper bound (a timeout that never ends). finite_range() refuses both, and any value
// outside [min, max]. Header only, CLI11 and the standard library: kreg-store, which links
// nothing of kreg's, uses it too.
#pragma once

#include <cmath>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

namespace kreg::cli {

inline CLI::Validator finite_range(double min, double max) {
  std::ostringstream desc;
  desc << "FLOAT in [" << min << " - " << max << "]";
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v)) {
          return "Value " + text + " is not a finite number";
        }
        if (v < min || v > max) {
          std::ostringstream range;
          range << "Value " << text << " not in range " << min << " to " << max;
          return range.str();
        }
        return std::string();
      },
      desc.str());
}

}  // namespace kreg::cli
