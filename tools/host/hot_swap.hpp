// kreg-host's hot-swap mode (--watch, --stress N, --duration S): stress threads call the
// loaded ops continuously and check every result against a double-precision reference
// while a PluginWatcher swaps groups whose library changes. See docs/hot-swap.md.
#pragma once

#include "kreg/manifest.hpp"
#include "kreg/registry.hpp"

namespace kreg::host {

struct HotSwapOptions {
  bool watch = false;
  int stress_threads = 0;
  double duration_s = 10;
  DLDevice device{kDLCPU, 0};
};

// Prints one line per swap or rejection and `calls=.. failed=.. swaps=.. rejected=..` at
// the end. Returns the process exit code: 0 when no call failed.
int run_hot_swap(Registry& registry, const Manifest& manifest, const HotSwapOptions& options);

}  // namespace kreg::host
