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
  // Load every candidate build in a child process first, with this timeout: one that
  // crashes, hangs or exits there is rejected and the running generation keeps serving.
  bool precheck = true;
  double precheck_timeout_s = 10;
};

// Prints one line per swap or rejection ("rejected group=<name>: <why>") and
// `calls=.. failed=.. swaps=.. rejected=..` at the end. Returns the process exit code: 0
// when no call failed (a rejected build is not a failure: the running one kept serving).
int run_hot_swap(Registry& registry, const Manifest& manifest, const HotSwapOptions& options);

}  // namespace kreg::host
