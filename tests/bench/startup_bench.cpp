// Start-up of a host: load the manifest and open the registry (Registry::open), with every
// shipped group lazy (described by its embedded metadata, nothing loaded) and with every
// group eager (each library checked, dlopened, its descriptor read, its init hook run).
// Without a GPU the eager case includes no CUDA context; with one, the CUDA backend's
// driver probe runs once per process and is excluded by a warm-up open.
//
//   ./build/tests/bench/kreg-bench-startup
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "kreg/manifest.hpp"
#include "kreg/registry.hpp"

namespace {

// registry.yaml with every `load:` set to `mode`, written next to the build's plugins.
std::filesystem::path manifest_with(const std::string& mode) {
  std::ifstream in(std::string(KREG_SOURCE_DIR) + "/registry.yaml");
  std::stringstream text;
  text << in.rdbuf();
  const std::string body =
      std::regex_replace(text.str(), std::regex("load: (eager|lazy)"), "load: " + mode);
  const auto path = std::filesystem::temp_directory_path() /
                    ("kreg-bench-startup-" + mode + "-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(path) << body;
  return path;
}

void open_registry(benchmark::State& state, const std::string& mode) {
  const auto path = manifest_with(mode);
  kreg::ManifestOptions options;
  options.plugin_dir_override = KREG_PLUGIN_DIR;
  {
    auto m = kreg::load_manifest(path, options);
    if (!m || !kreg::Registry::open(*m)) {
      state.SkipWithError("the shipped plugins are not built or do not load");
      return;
    }
  }
  size_t groups = 0;
  for (auto _ : state) {
    auto m = kreg::load_manifest(path, options);
    auto reg = kreg::Registry::open(*m);
    groups = (*reg)->groups().size();
    benchmark::DoNotOptimize(groups);
  }
  state.counters["groups"] = static_cast<double>(groups);
  std::filesystem::remove(path);
}

void BM_StartupAllLazy(benchmark::State& state) { open_registry(state, "lazy"); }
void BM_StartupAllEager(benchmark::State& state) { open_registry(state, "eager"); }

}  // namespace

BENCHMARK(BM_StartupAllLazy)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_StartupAllEager)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_MAIN();
