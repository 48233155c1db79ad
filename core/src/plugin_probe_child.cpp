// The child side of probe_plugin: kreg-probe's main (a fresh process image the parent
// starts with posix_spawn) and the body it shares with the fork fallback: the load, and with
// --compile-jit the NVRTC compiles of validate's jit-sources rule. Everything it learns goes
// to the data pipe; whatever the plugin (or NVRTC) prints goes to stdout and stderr, which
// the parent captures, so a plugin cannot corrupt the parent's output (--json on stdout).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/dtype.hpp"
#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "kreg/parse_number.hpp"
#include "kreg/plugin_probe.hpp"
#include "kreg/text.hpp"
#include "plugin_probe_wire.hpp"

namespace kreg {
namespace probe {

namespace fs = std::filesystem;

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

namespace {

std::string encode_snapshot(const PluginLibrary& lib) {
  Writer w;
  const PluginInfo& info = lib.info();
  w.str(info.group);
  w.str(info.version);
  w.u32(info.abi_major);
  w.u32(info.abi_minor);
  w.str(info.compiler);
  w.i32(info.cuda_version);
  w.str(info.cuda_archs);
  w.u32(static_cast<uint32_t>(lib.kernels().size()));
  for (const KernelSpec& k : lib.kernels()) {
    w.str(k.op);
    w.str(k.backend);
    w.str(k.signature.text);
    w.str(dtype_set_name(k.dtypes));
    w.u32(static_cast<uint32_t>(k.capabilities.size()));
    for (const Capability& c : k.capabilities) {
      w.i32(c.device_type);
      w.i32(c.sm_min);
      w.i32(c.sm_max);
    }
    w.u32(k.traits);
    w.i32(k.priority);
    w.u32(k.flags);
    w.str(k.description);
    w.str(k.provenance.source_file);
  }
  return w.message(kSnapshot);
}

// The architectures a plugin was built for ("80-real,90a" -> 80, 90: each entry's leading
// digits), else Hopper's.
std::vector<int> build_sms(std::string_view archs) {
  std::vector<int> out;
  while (!archs.empty()) {
    const size_t end = archs.find_first_of(",;");
    std::string_view item = archs.substr(0, end);
    int v = 0;
    size_t i = 0;
    for (; i < item.size() && i < 4 && item[i] >= '0' && item[i] <= '9'; ++i)
      v = v * 10 + (item[i] - '0');
    if (i > 0 && v >= 50 && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    if (end == std::string_view::npos) break;
    archs.remove_prefix(end + 1);
  }
  if (out.empty()) out.push_back(90);
  return out;
}

// The most compile errors reported, in bytes (each carries NVRTC's log, itself cut at 4000
// characters); the rest are counted.
constexpr size_t kMaxJitFailureBytes = size_t{1} << 20;

// jit-sources: every jit implementation compiled for each architecture the plugin was built
// for, in every dtype it takes, at a representative specialization (every dimension
// parameter 128), into the process's JIT cache (a second run is fast).
std::string compile_jit_sources(const PluginLibrary& lib) {
  std::vector<const KernelSpec*> jits;
  for (const KernelSpec& k : lib.kernels()) {
    if (k.jit) jits.push_back(&k);
  }
  uint32_t builds = 0;
  std::vector<std::string> failures;
  size_t bytes = 0, dropped = 0;
  auto failed = [&](std::string message) {
    if (bytes + message.size() > kMaxJitFailureBytes) {
      ++dropped;
      return;
    }
    bytes += message.size();
    failures.push_back(std::move(message));
  };
  if (!jits.empty()) {
    auto cache = jit::process_cache();
    if (!cache) {
      failed("no JIT cache: " + cache.status().message());
    } else {
      const std::vector<int> sms = build_sms(lib.info().cuda_archs);
      for (const KernelSpec* k : jits) {
        std::map<std::string, int64_t> dims;
        for (const std::string& p : k->jit->params) dims[p] = 128;
        for (int sm : sms) {
          for (int d = 0; d < static_cast<int>(DType::kCount); ++d) {
            if (!(k->dtypes & mask_of(static_cast<DType>(d)))) continue;
            auto values = jit::specialize(*k, dims, static_cast<DType>(d));
            Status st = values.status();
            if (values) {
              st = jit::build(*k, *k->jit, *values, jit::arch_name(sm), **cache).status();
              if (st.ok()) ++builds;
            }
            if (!st.ok()) failed(st.message());
          }
        }
      }
    }
  }
  if (dropped > 0) {
    failures.push_back("... and " + std::to_string(dropped) + " more compile errors");
  }
  Writer w;
  w.u32(static_cast<uint32_t>(jits.size()));
  w.u32(builds);
  w.u32(static_cast<uint32_t>(failures.size()));
  for (const std::string& f : failures) w.str(f);
  return w.message(kJitReport);
}

}  // namespace

void prepare_child(pid_t parent) {
  // Die with the parent: a validator killed by CI must not leave a hung plugin behind.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  // Expected crashes should not leave core files (or wait for a crash reporter).
  ::prctl(PR_SET_DUMPABLE, 0);
  struct rlimit no_core {
    0, 0
  };
  ::setrlimit(RLIMIT_CORE, &no_core);
  // No handler may run here (the host's crash reporter in a fork, a sanitizer's in
  // kreg-probe): the parent reads the plain signal from the exit status.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // A plugin that calls exit() ends the child with its own status, and nothing else
  // registered at exit runs: glibc runs on_exit handlers last-registered first, so this one
  // precedes a sanitizer's leak check (registered at start-up: it would report what the
  // half-loaded plugin holds and exit with its own status instead) and, in a fork, the
  // host's atexit handlers (which would flush the host's stdio buffers into the pipe a
  // second time, and report the memory of the host's other threads, absent in a fork).
  ::on_exit([](int status, void*) { ::_exit(status); }, nullptr);
}

void load_and_report(const fs::path& file, const PluginLibrary::Expect& expect, const Task& task,
                     Progress* progress, int data_fd) {
  {
    Writer w;
    w.u32(kProtocol);
    write_all(data_fd, w.message(kHello));
  }
  progress->phase = Phase::kOpening;
  auto lib = PluginLibrary::open(file, expect, const_cast<Stage*>(&progress->stage));
  const Stage stage = progress->stage;
  if (!lib) {
    Writer w;
    w.u32(static_cast<uint32_t>(stage));
    w.u32(static_cast<uint32_t>(lib.status().code()));
    w.str(lib.status().message());
    write_all(data_fd, w.message(kRefused));
    ::_exit(0);
  }
  if (task.run_init) {
    progress->phase = Phase::kInit;
    if (Status st = (*lib)->init(); !st.ok()) {
      Writer w;
      w.u32(static_cast<uint32_t>(st.code()));
      w.str(st.message());
      write_all(data_fd, w.message(kInitFailed));
      ::_exit(0);
    }
  }
  progress->phase = Phase::kReporting;
  std::unique_ptr<PluginLibrary> loaded = std::move(lib).value();
  write_all(data_fd, encode_snapshot(*loaded));
  if (task.compile_jit) {
    progress->phase = Phase::kCompiling;
    write_all(data_fd, compile_jit_sources(*loaded));
    // The library stays loaded: its unloading is the plain probe's check (library-loads),
    // not the compile's.
    progress->phase = Phase::kDone;
    Writer w;
    write_all(data_fd, w.message(kDone));
    ::_exit(0);
  }
  // Unloading is part of the check: a host unloads groups on reload and at exit.
  progress->phase = Phase::kShutdown;
  loaded.reset();
  progress->phase = Phase::kDone;
  Writer w;
  write_all(data_fd, w.message(kDone));
  // Not exit(): the verdict is sent, and no leak check or destructor may change the status.
  ::_exit(0);
}

namespace {

// kreg-probe's command line: every option takes the next element as its value, verbatim
// (a path or group may start with '-', hold spaces, newlines or any byte but NUL).
struct Arguments {
  uint32_t protocol = 0;
  pid_t parent = 0;
  int data_fd = -1;
  int progress_fd = -1;
  Task task;
  std::string group;
  std::optional<std::string> version;
  fs::path file;
};

constexpr const char* kOptions[] = {"--protocol",    "--parent",  "--data-fd",
                                    "--progress-fd", "--init",    "--compile-jit",
                                    "--group",       "--version", "--file"};

bool is_option(std::string_view s) {
  for (const char* o : kOptions) {
    if (s == o) return true;
  }
  return false;
}

Result<int> parse_fd(const std::map<std::string, std::string>& values, const char* name) {
  const std::string& text = values.at(name);
  auto n = parse_int(text, name, 3, 1 << 20);
  if (!n) return n.status();
  const int fd = static_cast<int>(*n);
  if (::fcntl(fd, F_GETFD) < 0) {
    return Status(KREG_INVALID_ARGUMENT,
                  std::string(name) + " " + text + ": not an open descriptor in this process");
  }
  return fd;
}

// Parses argv into `out`; `out->data_fd` is set as soon as it is known to be usable, so
// that an error about a later argument can still be reported through it.
Status parse_arguments(int argc, char** argv, Arguments* out) {
  std::map<std::string, std::string> values;
  Status malformed;
  for (int i = 1; i < argc && malformed.ok(); i += 2) {
    const std::string_view opt = argv[i];
    if (!is_option(opt)) {
      std::string known;
      for (const char* o : kOptions) known += std::string(known.empty() ? "" : ", ") + o;
      malformed = Status(KREG_INVALID_ARGUMENT, "argument " + std::to_string(i) + " ('" +
                                                    excerpt(opt) + "') is no option (expected " +
                                                    known + ", each followed by its value)");
    } else if (i + 1 >= argc) {
      malformed = Status(KREG_INVALID_ARGUMENT, std::string(opt) + " is missing its value");
    } else if (!values.emplace(std::string(opt), argv[i + 1]).second) {
      malformed = Status(KREG_INVALID_ARGUMENT, std::string(opt) + " is given twice");
    }
  }
  // The data pipe first: what is wrong with the rest is reported through it, wherever
  // the parse stopped.
  if (!values.count("--data-fd")) {
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::string_view(argv[i]) == "--data-fd") {
        values.emplace("--data-fd", argv[i + 1]);
        break;
      }
    }
  }
  if (!values.count("--data-fd")) {
    return malformed.ok() ? Status(KREG_INVALID_ARGUMENT, "--data-fd is required") : malformed;
  }
  auto data = parse_fd(values, "--data-fd");
  if (!data) return malformed.ok() ? data.status() : malformed;
  out->data_fd = *data;
  if (!malformed.ok()) return malformed;
  for (const char* required : {"--protocol", "--parent", "--progress-fd", "--init", "--compile-jit",
                               "--group", "--file"}) {
    if (!values.count(required)) {
      return Status(KREG_INVALID_ARGUMENT, std::string(required) + " is required");
    }
  }

  auto protocol = parse_uint(values.at("--protocol"), "--protocol", UINT32_MAX);
  if (!protocol) return protocol.status();
  out->protocol = static_cast<uint32_t>(*protocol);
  if (out->protocol != kProtocol) {
    return Status(KREG_FAILED_PRECONDITION,
                  "--protocol " + values.at("--protocol") + ": this kreg-probe speaks protocol " +
                      std::to_string(kProtocol) +
                      " (a kreg-probe of another kreg build? set KREG_PROBE to the caller's)");
  }
  auto parent = parse_int(values.at("--parent"), "--parent", 1, INT32_MAX);
  if (!parent) return parent.status();
  out->parent = static_cast<pid_t>(*parent);
  auto progress = parse_fd(values, "--progress-fd");
  if (!progress) return progress.status();
  out->progress_fd = *progress;
  if (out->progress_fd == out->data_fd) {
    return Status(KREG_INVALID_ARGUMENT, "--data-fd and --progress-fd are the same descriptor");
  }
  auto init = parse_bool(values.at("--init"), "--init");
  if (!init) return init.status();
  out->task.run_init = *init;
  auto compile_jit = parse_bool(values.at("--compile-jit"), "--compile-jit");
  if (!compile_jit) return compile_jit.status();
  out->task.compile_jit = *compile_jit;
  out->group = values.at("--group");
  if (auto v = values.find("--version"); v != values.end()) out->version = v->second;
  out->file = values.at("--file");
  if (out->file.empty()) return Status(KREG_INVALID_ARGUMENT, "--file is empty");
  return {};
}

[[noreturn]] void refuse(const Arguments& args, const Status& st) {
  const std::string text = st.message();
  if (args.data_fd >= 0) {
    Writer w;
    w.str(text);
    write_all(args.data_fd, w.message(kBadArguments));
  }
  const std::string line =
      "kreg-probe: " + text +
      "\nkreg-probe loads one plugin for probe_plugin (kreg/plugin_probe.hpp), "
      "which starts it; it is not a command to run by hand\n";
  write_all(STDERR_FILENO, line);
  ::_exit(2);
}

}  // namespace
}  // namespace probe

int probe_child_main(int argc, char** argv) {
  using namespace probe;
  Arguments args;
  if (Status st = parse_arguments(argc, argv, &args); !st.ok()) refuse(args, st);
  struct stat sb {};
  if (::fstat(args.progress_fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
      sb.st_size < static_cast<off_t>(sizeof(Progress))) {
    refuse(args, Status(KREG_INVALID_ARGUMENT, "--progress-fd " + std::to_string(args.progress_fd) +
                                                   ": not a file of at least " +
                                                   std::to_string(sizeof(Progress)) +
                                                   " bytes (the parent's progress page)"));
  }
  void* page =
      ::mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED, args.progress_fd, 0);
  if (page == MAP_FAILED) {
    refuse(args, Status(KREG_INVALID_ARGUMENT, "--progress-fd " + std::to_string(args.progress_fd) +
                                                   ": cannot map it: " + std::strerror(errno)));
  }
  ::close(args.progress_fd);
  prepare_child(args.parent);
  load_and_report(args.file, {args.group, args.version}, args.task, static_cast<Progress*>(page),
                  args.data_fd);
}

}  // namespace kreg
