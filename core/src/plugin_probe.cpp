// The parent side of the child process behind `kreg validate` (its load and its jit-sources
// compiles) and the host's pre-check: finds kreg-probe, starts it with posix_spawn (or,
// without one, forks a single-threaded process), reads its report and output within the
// timeout, and says how the child ended. The child reports through a pipe in a small
// length-prefixed format; its progress (which phase, and PluginLibrary::open's stage) is
// kept in a shared page so the parent can say where a child that died without reporting
// was (plugin_probe_wire.hpp).
#include "kreg/plugin_probe.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "kreg/text.hpp"
#include "plugin_probe_wire.hpp"

extern char** environ;

namespace kreg {

namespace fs = std::filesystem;

std::string_view KernelRecord::name() const {
  const size_t dot = op.find('.');
  return dot == std::string::npos ? std::string_view(op) : std::string_view(op).substr(dot + 1);
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGSYS:
      return "SIGSYS";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGHUP:
      return "SIGHUP";
    case SIGALRM:
      return "SIGALRM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    default:
      return "signal " + std::to_string(sig);
  }
}

namespace {

using probe::Phase;
using probe::Progress;
using probe::Reader;
using probe::Stage;
using probe::Tag;

constexpr size_t kOutputKeep = 4096;

bool decode_snapshot(std::string_view payload, const fs::path& file, PluginSnapshot* out) {
  Reader r(payload);
  PluginInfo& info = out->info;
  uint32_t major = 0, minor = 0, count = 0;
  r.str(&info.group);
  r.str(&info.version);
  r.u32(&major);
  r.u32(&minor);
  r.str(&info.compiler);
  r.i32(&info.cuda_version);
  r.str(&info.cuda_archs);
  r.u32(&count);
  info.abi_major = static_cast<uint16_t>(major);
  info.abi_minor = static_cast<uint16_t>(minor);
  info.path = file;
  for (uint32_t i = 0; i < count && r.ok(); ++i) {
    KernelRecord k;
    uint32_t caps = 0;
    r.str(&k.op);
    r.str(&k.backend);
    r.str(&k.signature);
    r.str(&k.dtypes);
    r.u32(&caps);
    for (uint32_t c = 0; c < caps && r.ok(); ++c) {
      Capability cap;
      r.i32(&cap.device_type);
      r.i32(&cap.sm_min);
      r.i32(&cap.sm_max);
      k.capabilities.push_back(cap);
    }
    r.u32(&k.traits);
    r.i32(&k.priority);
    r.u32(&k.flags);
    r.str(&k.description);
    r.str(&k.source_file);
    out->kernels.push_back(std::move(k));
  }
  return r.done();
}

bool decode_jit_report(std::string_view payload, JitCompileReport* out) {
  Reader r(payload);
  uint32_t count = 0;
  r.u32(&out->implementations);
  r.u32(&out->builds);
  r.u32(&count);
  for (uint32_t i = 0; i < count && r.ok(); ++i) {
    std::string failure;
    if (r.str(&failure)) out->failures.push_back(std::move(failure));
  }
  return r.done();
}

std::string phase_text(Phase phase, Stage stage) {
  switch (phase) {
    case Phase::kStarting:
      return "while kreg-probe was starting (before it loaded the library)";
    case Phase::kOpening:
      switch (stage) {
        case Stage::kFile:
        case Stage::kLoad:
          return "while loading the library (dlopen, running its static initializers)";
        case Stage::kEntry:
          return "in its entry function " KREG_PLUGIN_ENTRY_SYMBOL;
        default:
          return "while its descriptor was read";
      }
    case Phase::kInit:
      return "in its init hook";
    case Phase::kReporting:
      return "while reporting its descriptor";
    case Phase::kCompiling:
      return "while compiling its jit sources (NVRTC)";
    case Phase::kShutdown:
      return "while unloading (its shutdown hook or static destructors)";
    case Phase::kDone:
      break;
  }
  return "after unloading";
}

// The last line or two the child printed, e.g. "terminate called after throwing ...".
std::string output_hint(const std::string& output) {
  std::string s = output;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  if (s.empty()) return "";
  size_t start = s.rfind('\n');
  if (start != std::string::npos && s.size() - start < 60) {
    const size_t prev = start > 0 ? s.rfind('\n', start - 1) : std::string::npos;
    start = prev;
  }
  std::string tail = start == std::string::npos ? s : s.substr(start + 1);
  for (char& c : tail) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  if (tail.size() > 300) tail = "..." + tail.substr(tail.size() - 300);
  // Whatever the plugin printed (escape sequences, invalid UTF-8) is quoted, not replayed.
  return "; its last output: \"" + escape_control(tail) + "\"";
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

// ---- which kreg-probe ----

// Why `p` cannot be started; "" when it can.
std::string unusable(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) {
    return errno == ENOENT ? "does not exist"
                           : std::string("cannot be read: ") + std::strerror(errno);
  }
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (::access(p.c_str(), X_OK) != 0) return "is not executable";
  return "";
}

// The folder libkreg (this code) was loaded from; empty when unknown.
fs::path core_library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&find_probe_executable), &info) == 0 ||
      info.dli_fname == nullptr || info.dli_fname[0] == '\0') {
    return {};
  }
  std::error_code ec;
  const fs::path lib = fs::absolute(info.dli_fname, ec);
  return ec ? fs::path() : lib.parent_path();
}

// This process's threads (/proc/self/task); -1 when it cannot tell.
int thread_count() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n;
}

// An owned descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Moves `fd` above the child's fixed descriptors (0-4), so that setting those up in the
// child cannot overwrite one of its sources (a host that closed stdout gets pipe fd 1).
bool raise_fd(Fd& fd) {
  constexpr int kFirstFree = probe::kChildProgressFd + 1;
  if (fd.get() >= kFirstFree) return true;
  const int high = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, kFirstFree);
  if (high < 0) return false;
  fd.reset(high);
  return true;
}

// Starts `exe` as the child: its descriptors 0-4 as probe::kChild* says, nothing else
// inherited, its own process group, default signal dispositions, an empty signal mask.
// Returns 0 or an errno value.
int spawn_probe(const fs::path& exe, const fs::path& file, const PluginLibrary::Expect& expect,
                const probe::Task& task, pid_t parent, int data_fd, int out_fd, int page_fd,
                pid_t* pid) {
  std::vector<std::string> args = {kProbeExecutableName,
                                   "--protocol",
                                   std::to_string(probe::kProtocol),
                                   "--parent",
                                   std::to_string(parent),
                                   "--data-fd",
                                   std::to_string(probe::kChildDataFd),
                                   "--progress-fd",
                                   std::to_string(probe::kChildProgressFd),
                                   "--init",
                                   task.run_init ? "1" : "0",
                                   "--compile-jit",
                                   task.compile_jit ? "1" : "0",
                                   "--group",
                                   expect.group};
  if (expect.version) {
    args.push_back("--version");
    args.push_back(*expect.version);
  }
  args.push_back("--file");
  args.push_back(file.native());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  if (int rc = ::posix_spawn_file_actions_init(&actions); rc != 0) return rc;
  posix_spawnattr_t attr;
  if (int rc = ::posix_spawnattr_init(&attr); rc != 0) {
    ::posix_spawn_file_actions_destroy(&actions);
    return rc;
  }
  int rc = ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(&actions, data_fd, probe::kChildDataFd);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(&actions, page_fd, probe::kChildProgressFd);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Descriptors a host opened without O_CLOEXEC (a listening socket, a lock file) stay
  // with the host. Older glibc: only O_CLOEXEC ones are closed (ours all are).
  if (rc == 0)
    rc = ::posix_spawn_file_actions_addclosefrom_np(&actions, probe::kChildProgressFd + 1);
#endif
  sigset_t defaults, mask;
  sigfillset(&defaults);
  sigemptyset(&mask);
  if (rc == 0) {
    rc = ::posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  }
  if (rc == 0) rc = ::posix_spawnattr_setpgroup(&attr, 0);
  if (rc == 0) rc = ::posix_spawnattr_setsigdefault(&attr, &defaults);
  if (rc == 0) rc = ::posix_spawnattr_setsigmask(&attr, &mask);
  if (rc == 0) rc = ::posix_spawn(pid, exe.c_str(), &actions, &attr, argv.data(), environ);
  ::posix_spawnattr_destroy(&attr);
  ::posix_spawn_file_actions_destroy(&actions);
  return rc;
}

}  // namespace

ProbeExecutable find_probe_executable(const fs::path& requested) {
  ProbeExecutable out;
  auto pick = [&](const fs::path& p, const std::string& named) {
    out.explicit_choice = true;
    if (const std::string why = unusable(p); !why.empty()) {
      out.problem = named + p.string() + " " + why;
    } else {
      out.path = p;
    }
    return out;
  };
  if (!requested.empty()) {
    return pick(requested, "the probe executable (ProbeOptions::executable) ");
  }
  if (const char* env = std::getenv(kProbeExecutableEnv); env != nullptr && env[0] != '\0') {
    return pick(env, std::string("the probe executable ") + kProbeExecutableEnv + "=");
  }
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (const fs::path self = fs::read_symlink("/proc/self/exe", ec); !ec) {
    candidates.push_back(self.parent_path() / kProbeExecutableName);
  }
  if (const fs::path lib = core_library_dir(); !lib.empty()) {
    candidates.push_back(lib / kProbeExecutableName);
#ifdef KREG_PROBE_FROM_LIBDIR
    candidates.push_back((lib / KREG_PROBE_FROM_LIBDIR).lexically_normal());
#endif
  }
  std::string looked;
  std::vector<fs::path> seen;
  for (const fs::path& c : candidates) {
    if (std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
    seen.push_back(c);
    const std::string why = unusable(c);
    if (why.empty()) {
      out.path = c;
      return out;
    }
    looked += (looked.empty() ? "" : ", ") + c.string() + " (" + why + ")";
  }
  out.problem = std::string("no ") + kProbeExecutableName + " executable found (looked for " +
                (looked.empty() ? std::string("nothing: neither /proc/self/exe nor libkreg's path "
                                              "could be read")
                                : looked) +
                "; set " + kProbeExecutableEnv + " to its path)";
  return out;
}

ProbeResult probe_plugin(const fs::path& file, const PluginLibrary::Expect& expect,
                         const ProbeOptions& options) {
  ProbeResult result;
  const std::string head = "plugin '" + expect.group + "' (" + file.string() + ")";
  auto spawn_failed = [&](const std::string& what) {
    result.end = ProbeEnd::kSpawnFailed;
    result.message = head + ": cannot start a child process to load it: " + what;
    return result;
  };
  auto call_failed = [&](const char* call, int err) {
    return spawn_failed(std::string(call) + ": " + std::strerror(err));
  };
  // argv elements end at a NUL; anything else crosses as it is.
  for (const auto& [what, text] :
       {std::pair<const char*, std::string_view>{"path", file.native()},
        {"group", expect.group},
        {"version", expect.version ? std::string_view(*expect.version) : std::string_view()}}) {
    if (text.find('\0') != std::string_view::npos) {
      return spawn_failed(std::string("its ") + what +
                          " holds a NUL byte, which no command line can carry");
    }
  }

  const ProbeExecutable exe = find_probe_executable(options.executable);
  const bool fork_child = exe.path.empty();
  if (fork_child) {
    if (exe.explicit_choice) return spawn_failed(exe.problem);
    // Only a process with one thread may be forked: no lock can be held by another thread.
    const int threads = thread_count();
    if (threads != 1) {
      return spawn_failed(
          exe.problem + "; a fork of this process instead is unsafe: it runs " +
          (threads < 0 ? std::string("an unknown number of") : std::to_string(threads)) +
          " threads, whose locks the child would inherit held");
    }
    result.forked = exe.problem + "; the child was a fork of this single-threaded process instead";
  }
  result.executable = exe.path;

  // The progress page: a memfd, mapped here and in the child (inherited, or mapped by
  // kreg-probe from its descriptor 4).
  Fd page_fd(::memfd_create("kreg-probe-progress", MFD_CLOEXEC));
  if (page_fd.get() < 0) return call_failed("memfd_create", errno);
  if (::ftruncate(page_fd.get(), sizeof(Progress)) != 0) return call_failed("ftruncate", errno);
  void* page =
      ::mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED, page_fd.get(), 0);
  if (page == MAP_FAILED) return call_failed("mmap", errno);
  auto* progress = new (page) Progress{Stage::kFile, Phase::kStarting};
  struct Unmap {
    void* p;
    ~Unmap() { ::munmap(p, sizeof(Progress)); }
  } unmap{page};

  int data[2], out[2];
  if (::pipe2(data, O_CLOEXEC) != 0) return call_failed("pipe", errno);
  Fd data_r(data[0]), data_w(data[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return call_failed("pipe", errno);
  Fd out_r(out[0]), out_w(out[1]);
  if (!raise_fd(data_w) || !raise_fd(out_w) || !raise_fd(page_fd)) {
    return call_failed("fcntl(F_DUPFD_CLOEXEC)", errno);
  }

  const probe::Task task{options.run_init, options.compile_jit};
  const pid_t parent = ::getpid();
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  if (fork_child) {
    // Whatever sits in our stdio buffers would otherwise be written twice if the plugin
    // calls exit() in the child.
    std::fflush(nullptr);
    pid = ::fork();
    if (pid < 0) return call_failed("fork", errno);
    if (pid == 0) {
      ::setpgid(0, 0);
      probe::prepare_child(parent);
      if (int null = ::open("/dev/null", O_RDONLY); null >= 0) ::dup2(null, STDIN_FILENO);
      ::dup2(out_w.get(), STDOUT_FILENO);
      ::dup2(out_w.get(), STDERR_FILENO);
      probe::load_and_report(file, expect, task, progress, data_w.get());
    }
    // Also here: the child's setpgid may not have run yet when we kill its group.
    ::setpgid(pid, pid);
  } else if (int rc = spawn_probe(exe.path, file, expect, task, parent, data_w.get(), out_w.get(),
                                  page_fd.get(), &pid);
             rc != 0) {
    return call_failed(("posix_spawn " + exe.path.string()).c_str(), rc);
  }
  data_w.reset();
  out_w.reset();
  page_fd.reset();

  const double timeout =
      std::isfinite(options.timeout_s) && options.timeout_s > 0 ? options.timeout_s : 10.0;
  // Until the child says hello it is starting (exec, dynamic linking, a sanitizer's set-up);
  // the plugin's timeout starts then.
  const double startup_limit = std::max(timeout, 10.0);
  auto after = [](std::chrono::steady_clock::time_point t, double s) {
    return t + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(s));
  };
  auto deadline = after(start, startup_limit);
  bool started = false;  // the hello arrived
  std::string received;
  std::string& output = result.output;
  int fds[2] = {data_r.release(), out_r.release()};
  const int data_fd = fds[0];
  bool timed_out = false, cancelled = false, oversized = false;
  auto stop_early = [&] {
    cancelled = options.cancel != nullptr && options.cancel->load(std::memory_order_acquire);
    return cancelled || oversized;
  };
  while (fds[0] >= 0 || fds[1] >= 0) {
    if (stop_early()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p[2];
    nfds_t n = 0;
    for (int fd : fds) {
      if (fd >= 0) p[n++] = pollfd{fd, POLLIN, 0};
    }
    // In slices, so that a cancel request is seen promptly.
    const int64_t slice = options.cancel != nullptr ? 50 : int64_t{1} << 30;
    const int ready = ::poll(
        p, n, static_cast<int>(std::min<int64_t>(std::min(left.count() + 1, slice), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) break;
    for (nfds_t i = 0; i < n; ++i) {
      if (p[i].revents == 0) continue;
      char buf[8192];
      const ssize_t got = ::read(p[i].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      int& slot = p[i].fd == fds[0] ? fds[0] : fds[1];
      if (got <= 0) {
        ::close(slot);
        slot = -1;
        continue;
      }
      if (p[i].fd == data_fd) {
        received.append(buf, static_cast<size_t>(got));
        if (received.size() > kMaxProbeReportBytes) oversized = true;
        if (!started && received.size() >= 5 &&
            static_cast<uint8_t>(received[0]) == probe::kHello) {
          started = true;
          deadline = after(std::chrono::steady_clock::now(), timeout);
        }
      } else {
        output.append(buf, static_cast<size_t>(got));
        if (output.size() > 2 * kOutputKeep) output.erase(0, output.size() - kOutputKeep);
      }
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  if (output.size() > kOutputKeep) output.erase(0, output.size() - kOutputKeep);

  // Both pipes closed means the child exited (or closed them); give it until the deadline
  // to be reapable, then kill its whole group, helpers it started included.
  int status = 0;
  bool reaped = false;
  while (!timed_out && !stop_early()) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      reaped = true;
      break;
    }
    if (r < 0 && errno != EINTR) break;  // ECHILD: SIGCHLD is ignored, no status
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    ::usleep(200);
  }
  if (!reaped) {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    ::kill(-pid, SIGKILL);  // stray grandchildren, if any; ESRCH otherwise
  }

  if (cancelled || oversized) {
    result.end = cancelled ? ProbeEnd::kCancelled : ProbeEnd::kSignaled;
    result.signal = cancelled ? 0 : SIGKILL;
    result.message = head + (cancelled ? ": the load in a child process was cancelled; the "
                                         "child was killed"
                                       : ": the child process loading it sent more than " +
                                             std::to_string(kMaxProbeReportBytes) +
                                             " bytes of report and was killed");
    return result;
  }

  // Decode what arrived.
  bool hello = false, done = false, have_snapshot = false, have_failure = false;
  bool have_jit = false;
  std::string refused_arguments;
  std::string malformed;  // what does not decode, and where
  std::string_view rest(received);
  while (rest.size() >= 5 && malformed.empty()) {
    const size_t at = received.size() - rest.size();
    const auto tag = static_cast<uint8_t>(rest[0]);
    uint32_t len;
    std::memcpy(&len, rest.data() + 1, sizeof len);
    if (tag < probe::kRefused || tag > probe::kJitReport) {
      malformed =
          "an unknown message (tag " + std::to_string(tag) + ") at byte " + std::to_string(at);
      break;
    }
    if (rest.size() < 5 + size_t{len}) break;  // cut short: judged below
    const std::string_view payload = rest.substr(5, len);
    rest.remove_prefix(5 + size_t{len});
    Reader r(payload);
    bool decoded = true;
    if (tag == probe::kHello) {
      uint32_t protocol = 0;
      hello = r.u32(&protocol) && protocol == probe::kProtocol;
      decoded = r.done();
    } else if (tag == probe::kBadArguments) {
      if (!r.str(&refused_arguments) || refused_arguments.empty()) refused_arguments = "?";
    } else if (tag == probe::kRefused) {
      uint32_t stage = 0, code = 0;
      r.u32(&stage);
      r.u32(&code);
      r.str(&result.message);
      result.stage = static_cast<Stage>(stage);
      result.code = static_cast<kreg_status_code>(code);
      result.end = ProbeEnd::kRefused;
      have_failure = decoded = r.done();
    } else if (tag == probe::kInitFailed) {
      uint32_t code = 0;
      r.u32(&code);
      r.str(&result.message);
      result.code = static_cast<kreg_status_code>(code);
      result.stage = Stage::kOk;
      result.end = ProbeEnd::kInitFailed;
      have_failure = decoded = r.done();
      // PluginLibrary::init names the group only; say which file as well.
      const std::string group_only = "plugin '" + expect.group + "': ";
      if (result.message.starts_with(group_only)) {
        result.message = head + ": " + result.message.substr(group_only.size());
      }
    } else if (tag == probe::kSnapshot) {
      have_snapshot = decoded = decode_snapshot(payload, file, &result.snapshot);
    } else if (tag == probe::kJitReport) {
      have_jit = decoded = decode_jit_report(payload, &result.jit);
    } else if (tag == probe::kDone) {
      done = true;
      decoded = payload.empty();
    }
    if (!decoded) {
      malformed = "a message (tag " + std::to_string(tag) + ", " + std::to_string(len) +
                  " bytes) at byte " + std::to_string(at) + " that does not decode";
    }
  }
  if (malformed.empty() && !rest.empty()) {
    malformed = "its last " + std::to_string(rest.size()) + " bytes are a message cut short";
  }
  const std::string runner = fork_child ? std::string("the forked child") : exe.path.string();
  if (!refused_arguments.empty()) {
    return spawn_failed(runner + " refused its arguments: " + refused_arguments);
  }
  if (have_failure && hello && malformed.empty()) return result;

  const Phase phase = progress->phase;
  const Stage stage = progress->stage;
  result.stage = phase == Phase::kOpening ? stage : Stage::kOk;
  const std::string where = phase_text(phase, stage);
  if (timed_out) {
    result.end = ProbeEnd::kTimedOut;
    result.message = head + ": timed out after " + seconds_text(started ? timeout : startup_limit) +
                     " " + where + "; the child process loading it was killed" +
                     output_hint(output);
    return result;
  }
  if (!hello) {
    // It ended before it ran any plugin code: not a kreg-probe, or one that could not start.
    std::string ended = "its exit status is unknown";
    if (reaped && WIFSIGNALED(status)) {
      ended = "it was killed by " + signal_name(WTERMSIG(status));
    } else if (reaped && WIFEXITED(status)) {
      ended = "it exited with status " + std::to_string(WEXITSTATUS(status));
    }
    return spawn_failed(runner + " did not start as kreg's plugin probe (" + ended +
                        " before its first report; is it the kreg-probe of this build?)" +
                        output_hint(output));
  }
  if (reaped && WIFSIGNALED(status)) {
    result.end = ProbeEnd::kSignaled;
    result.signal = WTERMSIG(status);
    const char* what = ::strsignal(result.signal);
    result.message = head + ": the child process loading it was killed by " +
                     signal_name(result.signal) + " (" + (what ? what : "?") + ") " + where +
                     output_hint(output);
    return result;
  }
  if (!malformed.empty()) {
    result.end = ProbeEnd::kBadReport;
    result.stage = Stage::kOk;
    result.message =
        head + ": its report to kreg does not decode (" + malformed +
        "): something in the plugin wrote to the probe's report pipe, so nothing the child "
        "said is used" +
        output_hint(output);
    return result;
  }
  if (have_snapshot && (have_jit || !options.compile_jit) && done && reaped && WIFEXITED(status) &&
      WEXITSTATUS(status) == 0) {
    result.end = ProbeEnd::kOk;
    result.stage = Stage::kOk;
    return result;
  }
  result.end = ProbeEnd::kExited;
  if (reaped && WIFEXITED(status)) {
    result.exit_status = WEXITSTATUS(status);
    result.message = head + ": the child process loading it exited with status " +
                     std::to_string(result.exit_status) + " " + where +
                     " (the plugin called exit?)" + output_hint(output);
  } else {
    result.message = head + ": the child process loading it ended " + where +
                     " without reporting, and its exit status is unknown" + output_hint(output);
  }
  return result;
}

}  // namespace kreg
