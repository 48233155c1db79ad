// Loading a plugin in a child process: the crash-isolated first look at a library.
//
// probe_plugin forks; the child loads the library with PluginLibrary::open (which runs its
// static initializers and entry function), runs its init hook, serializes what it read
// (descriptor and kernel records, or where and why opening failed) back through a pipe,
// then runs the shutdown hook and unloads it. The parent never maps the library. A plugin
// that segfaults, aborts, throws, calls exit() or hangs anywhere on that path is reported
// with the signal, the exit status or the timeout, and the phase it was in.
//
// The child is a fork of the caller: call it before the process initializes CUDA (a forked
// child cannot use its parent's CUDA context, so a plugin whose init hook needs the GPU
// would fail there), and preferably before starting threads (glibc makes malloc and the
// loader safe after fork, but locks held by other threads in other libraries are not).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kreg/kernel_spec.hpp"
#include "kreg/plugin_library.hpp"

namespace kreg {

// One kernel record as the child read it (after make_kernel_spec accepted it).
struct KernelRecord {
  std::string op;
  std::string backend;
  std::string signature;
  std::string dtypes;  // e.g. "f32|f16|bf16"
  std::vector<Capability> capabilities;
  uint32_t traits = 0;
  int32_t priority = 0;
  uint32_t flags = 0;  // KREG_KERNEL_* (ABI 1.2)
  std::string description;
  std::string source_file;

  std::string_view name() const;  // the part after "<group>."
};

struct PluginSnapshot {
  PluginInfo info;
  std::vector<KernelRecord> kernels;
};

struct ProbeOptions {
  double timeout_s = 10;  // the whole child: load, init, shutdown
  bool run_init = true;   // run the init hook (and then the shutdown hook)
  // When set and it becomes true, the child is killed within ~50 ms and the probe ends
  // kCancelled (a watcher being stopped need not wait out a hanging plugin's timeout).
  const std::atomic<bool>* cancel = nullptr;
};

// The most a child may report through its data pipe (descriptor and kernel records): more
// is a plugin writing where it should not, and the child is killed.
inline constexpr size_t kMaxProbeReportBytes = size_t{64} << 20;

enum class ProbeEnd {
  kOk,           // loaded, initialized and unloaded cleanly
  kRefused,      // PluginLibrary::open refused it (`stage` says where)
  kInitFailed,   // the init hook returned an error
  kSignaled,     // the child was killed by a signal
  kExited,       // the child exited before reporting (the plugin called exit)
  kTimedOut,     // the child did not finish in time and was killed
  kCancelled,    // ProbeOptions::cancel was set; the child was killed
  kSpawnFailed,  // no child could be started (pipe, mmap or fork failed)
};

struct ProbeResult {
  ProbeEnd end = ProbeEnd::kSpawnFailed;
  PluginLibrary::Stage stage = PluginLibrary::Stage::kFile;  // kRefused: where
  kreg_status_code code = KREG_UNKNOWN;  // kRefused / kInitFailed: the child's status code
  int signal = 0;                        // kSignaled
  int exit_status = 0;                   // kExited
  // What happened, naming the plugin, its library and, for a crash, the phase it was in
  // ("while loading the library (static initializers)", "in its init hook", ...).
  std::string message;
  PluginSnapshot snapshot;  // kOk
  std::string output;       // the last few KB the child wrote to stdout and stderr

  bool ok() const { return end == ProbeEnd::kOk; }
};

ProbeResult probe_plugin(const std::filesystem::path& file, const PluginLibrary::Expect& expect,
                         const ProbeOptions& options = {});

// "SIGSEGV", "SIGABRT", ...; "signal N" for others.
std::string signal_name(int sig);

}  // namespace kreg
