// The command-line parse of the tools built on the harness (kreg-host, kreg-tp-demo,
// lplb_demo): --help prints the help and the tool exits 0; a usage error prints
// "<tool>: <message>" and the hint on stderr, escaped (CLI11's messages quote the command
// line, escape codes included), and the tool exits 2, as kreg does.
#pragma once

#include <cstdio>
#include <optional>

#include <CLI/CLI.hpp>

#include "kreg/text.hpp"

namespace kreg::cli {

// The exit code when the tool should stop here, nothing when it should run.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                             const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", tool,
                 kreg::terminal_message(e.what()).c_str());
    return 2;
  }
  return std::nullopt;
}

}  // namespace kreg::cli
