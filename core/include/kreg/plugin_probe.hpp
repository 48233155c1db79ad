// Loading a plugin in a child process: the crash-isolated first look at a library.
//
// probe_plugin starts the kreg-probe executable (posix_spawn: a fresh process image, never
// a fork of the caller) with the library's path, the expected group and version, whether to
// run the init hook and whether to compile its jit sources as separate argv elements (no
// shell: a path may hold spaces, newlines, any byte but NUL, or start with '-'). The child
// loads the library with PluginLibrary::open (which runs its static initializers and entry
// function), runs its init hook, sends what it read (descriptor and kernel records, or
// where and why opening failed) back through an inherited pipe, then runs the shutdown hook
// and unloads it; its progress is kept in a shared page (an inherited memfd it maps). The
// parent never maps the library. A plugin that segfaults, aborts, throws, calls exit() or
// hangs anywhere on that path is reported with the signal, the exit status or the timeout,
// and the phase it was in.
//
// With ProbeOptions::compile_jit (kreg validate's jit-sources rule) the same child, once it
// has sent the descriptor, compiles every jit implementation with NVRTC into the process's
// JIT cache (for each architecture the plugin was built for, in each dtype it takes, every
// dimension parameter 128) and reports the compile errors in ProbeResult::jit; it then
// exits without unloading the library (unloading is the plain probe's check). A compile that
// crashes or hangs ends the probe like a crashing plugin, in the phase "while compiling its
// jit sources".
//
// Because the child is a new program, probe_plugin is safe in a running, multithreaded host
// (a watcher thread, CUDA initialized, Python with torch): no lock another thread holds is
// copied into it, and the child initializes CUDA for itself if its init hook needs the GPU.
// The child inherits the environment (KREG_*, CUDA_VISIBLE_DEVICES, sanitizer options), the
// working directory, stdin from /dev/null, stdout and stderr into a pipe the parent reads,
// and no other descriptor; it is in a process group of its own (killed whole on a timeout),
// gets SIGKILL when the thread that started it dies, writes no core file, and runs every
// signal's default action.
//
// Which kreg-probe (find_probe_executable): ProbeOptions::executable when set, else the
// KREG_PROBE environment variable when set; either is used as given, and if it is not an
// executable file the probe fails naming it (an explicit choice is never replaced). Else the
// first that exists of: kreg-probe in the running program's folder (/proc/self/exe); in the
// folder libkreg was loaded from; and the installed layout's libexec folder relative to that
// (<prefix>/libexec/kreg/kreg-probe beside <prefix>/lib/libkreg.so, as `cmake --install`
// lays it out; the Python package installs it beside its libkreg). In a build tree kreg-probe
// is built beside libkreg (build/core), so tests, the Python module and the tools find it
// with no setup.
//
// When none is found, probe_plugin forks instead only if this process has a single thread
// (`kreg validate` from an install that lacks kreg-probe keeps working; a one-thread process
// holds no lock another thread could hold in the fork), and says so in ProbeResult::forked.
// A multithreaded process is never forked: the probe fails (kSpawnFailed) naming every place
// looked at. A forked child cannot use the parent's CUDA context either; install kreg-probe.
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
  // The child's work on the plugin: load, init, shutdown, counted from when the child is
  // ready to load it. Starting kreg-probe before that has max(timeout_s, 10 s) of its own.
  double timeout_s = 10;
  bool run_init = true;  // run the init hook (and then the shutdown hook)
  // Compile the plugin's jit implementations after loading it (see above); the results are
  // in ProbeResult::jit. Compiles are slow: give timeout_s room for them.
  bool compile_jit = false;
  // When set and it becomes true, the child is killed within ~50 ms and the probe ends
  // kCancelled (a watcher being stopped need not wait out a hanging plugin's timeout).
  const std::atomic<bool>* cancel = nullptr;
  // The kreg-probe executable to start; empty: $KREG_PROBE, else the search above.
  std::filesystem::path executable;
};

inline constexpr const char* kProbeExecutableName = "kreg-probe";
inline constexpr const char* kProbeExecutableEnv = "KREG_PROBE";

struct ProbeExecutable {
  std::filesystem::path path;    // the kreg-probe to start; empty when none is usable
  bool explicit_choice = false;  // from ProbeOptions::executable or $KREG_PROBE
  // `path` empty: what was asked for or looked at, and why each cannot be used.
  std::string problem;
};

// The kreg-probe probe_plugin starts (the order above): `requested` is
// ProbeOptions::executable. Only stats files; runs nothing.
ProbeExecutable find_probe_executable(const std::filesystem::path& requested = {});

// The most a child may report through its data pipe (descriptor and kernel records): more
// is a plugin writing where it should not, and the child is killed.
inline constexpr size_t kMaxProbeReportBytes = size_t{64} << 20;

// What the child's compile of the jit implementations found (ProbeOptions::compile_jit).
struct JitCompileReport {
  uint32_t implementations = 0;  // jit implementations the loaded library has
  uint32_t builds = 0;           // specializations compiled or found in the cache
  // One per compile that failed (NVRTC's log in it, naming op, specialization and arch),
  // or why nothing could be compiled ("no JIT cache: ..."); at most about 1 MiB of them.
  std::vector<std::string> failures;
};

enum class ProbeEnd {
  // Loaded, initialized and unloaded cleanly; compile_jit: loaded and the compiles ran
  // (their errors are in ProbeResult::jit, not here).
  kOk,
  kRefused,     // PluginLibrary::open refused it (`stage` says where)
  kInitFailed,  // the init hook returned an error
  kSignaled,    // the child was killed by a signal
  kExited,      // the child exited before reporting (the plugin called exit)
  kTimedOut,    // the child did not finish in time and was killed
  kCancelled,   // ProbeOptions::cancel was set; the child was killed
  // The child's report did not decode (an unknown message, a payload of the wrong size, a
  // message cut short): something in the plugin wrote to the probe's report pipe, so
  // nothing it says can be trusted.
  kBadReport,
  // No child could be started (pipe, memfd, posix_spawn or fork failed; no kreg-probe in a
  // multithreaded process; the executable refused its arguments or was not kreg-probe).
  kSpawnFailed,
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
  JitCompileReport jit;     // kOk with compile_jit
  std::string output;       // the last few KB the child wrote to stdout and stderr
  // How the child was started: the kreg-probe that ran, or (empty) `forked` says why the
  // child was a fork of this process (no kreg-probe found, single-threaded process).
  std::filesystem::path executable;
  std::string forked;

  bool ok() const { return end == ProbeEnd::kOk; }
};

ProbeResult probe_plugin(const std::filesystem::path& file, const PluginLibrary::Expect& expect,
                         const ProbeOptions& options = {});

// "SIGSEGV", "SIGABRT", ...; "signal N" for others.
std::string signal_name(int sig);

// kreg-probe's main (core/probe/main.cpp): the child side of probe_plugin. Its command line
// is probe_plugin's business (every option followed by its value, verbatim); a malformed
// one, or one of another protocol version, is refused with exit status 2 and a message that
// probe_plugin reports. Does not return once the arguments are accepted.
int probe_child_main(int argc, char** argv);

}  // namespace kreg
