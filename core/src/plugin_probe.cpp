// The child-process load behind `kreg validate` and the host's pre-check. The child
// reports through a pipe in a small length-prefixed format; its progress (which phase,
// and PluginLibrary::open's stage) is kept in a shared page so the parent can say where a
// child that died without reporting was.
#include "kreg/plugin_probe.hpp"

#include "kreg/text.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>

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

using Stage = PluginLibrary::Stage;

enum class Phase : int32_t { kOpening, kInit, kReporting, kShutdown, kDone };

// Lives in a MAP_SHARED page: the child writes, the parent reads after the child ended.
struct Progress {
  volatile Stage stage;
  volatile Phase phase;
};

enum Tag : uint8_t { kRefused = 1, kInitFailed = 2, kSnapshot = 3, kDone = 4 };

constexpr size_t kOutputKeep = 4096;

// ---- wire format: integers little-endian as in memory (same machine), strings with a
// 32-bit length ----

class Writer {
 public:
  void u32(uint32_t v) { buf_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  // Frames the buffer as one message and clears it.
  std::string message(Tag tag) {
    std::string out(1, static_cast<char>(tag));
    const auto n = static_cast<uint32_t>(buf_.size());
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += buf_;
    buf_.clear();
    return out;
  }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool u32(uint32_t* v) {
    if (data_.size() < sizeof *v) return fail();
    std::memcpy(v, data_.data(), sizeof *v);
    data_.remove_prefix(sizeof *v);
    return true;
  }
  bool i32(int32_t* v) {
    uint32_t u;
    if (!u32(&u)) return false;
    *v = static_cast<int32_t>(u);
    return true;
  }
  bool str(std::string* s) {
    uint32_t n;
    if (!u32(&n) || data_.size() < n) return fail();
    s->assign(data_.substr(0, n));
    data_.remove_prefix(n);
    return true;
  }
  bool ok() const { return ok_; }

 private:
  bool fail() {
    ok_ = false;
    return false;
  }
  std::string_view data_;
  bool ok_ = true;
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

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
  return r.ok();
}

// The child: never returns. Everything it learns goes to `data_fd`; whatever the plugin
// prints goes to `out_fd`, so it cannot corrupt the parent's output (--json on stdout).
[[noreturn]] void run_child(const fs::path& file, const PluginLibrary::Expect& expect,
                            const ProbeOptions& options, Progress* progress, int data_fd,
                            int out_fd, pid_t parent) {
  // Die with the parent: a validator killed by CI must not leave a hung plugin behind.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  ::setpgid(0, 0);
  // Expected crashes should not leave core files (or wait for a crash reporter).
  ::prctl(PR_SET_DUMPABLE, 0);
  struct rlimit no_core {
    0, 0
  };
  ::setrlimit(RLIMIT_CORE, &no_core);
  // The parent's handlers (a host's crash reporter, a test framework's) must not run here:
  // the parent reads the plain signal from the exit status.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // A plugin that calls exit() ends the child with its own status, and nothing the host
  // registered at exit runs here: glibc runs on_exit handlers last-registered first, so
  // this one precedes the host's atexit handlers (which would flush the host's stdio
  // buffers into the pipe a second time) and a sanitizer's leak check (which reports the
  // memory of the host's other threads, absent in a fork, and changes the exit status).
  ::on_exit([](int status, void*) { ::_exit(status); }, nullptr);
  if (int null = ::open("/dev/null", O_RDONLY); null >= 0) ::dup2(null, STDIN_FILENO);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(out_fd, STDERR_FILENO);

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
  if (options.run_init) {
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
  // Unloading is part of the check: a host unloads groups on reload and at exit.
  progress->phase = Phase::kShutdown;
  loaded.reset();
  progress->phase = Phase::kDone;
  Writer w;
  write_all(data_fd, w.message(kDone));
  ::_exit(0);
}

std::string phase_text(Phase phase, Stage stage) {
  switch (phase) {
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

}  // namespace

ProbeResult probe_plugin(const fs::path& file, const PluginLibrary::Expect& expect,
                         const ProbeOptions& options) {
  ProbeResult result;
  const std::string head = "plugin '" + expect.group + "' (" + file.string() + ")";
  auto spawn_failed = [&](const char* what) {
    result.end = ProbeEnd::kSpawnFailed;
    result.message =
        head + ": cannot start a child process to load it: " + what + ": " + std::strerror(errno);
    return result;
  };

  void* page =
      ::mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return spawn_failed("mmap");
  auto* progress = new (page) Progress{Stage::kFile, Phase::kOpening};
  struct Unmap {
    void* p;
    ~Unmap() { ::munmap(p, sizeof(Progress)); }
  } unmap{page};

  int data[2], out[2];
  if (::pipe2(data, O_CLOEXEC) != 0) return spawn_failed("pipe");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(data[0]);
    ::close(data[1]);
    return spawn_failed("pipe");
  }
  // Whatever sits in our stdio buffers would otherwise be written twice if the plugin
  // calls exit() in the child.
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {data[0], data[1], out[0], out[1]}) ::close(fd);
    return spawn_failed("fork");
  }
  if (pid == 0) {
    ::close(data[0]);
    ::close(out[0]);
    run_child(file, expect, options, progress, data[1], out[1], parent);
  }
  ::close(data[1]);
  ::close(out[1]);
  // Also here: the child's setpgid may not have run yet when we kill its group.
  ::setpgid(pid, pid);

  const double timeout =
      std::isfinite(options.timeout_s) && options.timeout_s > 0 ? options.timeout_s : 10.0;
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(timeout));
  std::string received;
  std::string& output = result.output;
  int fds[2] = {data[0], out[0]};
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
      if (slot == data[0]) {
        received.append(buf, static_cast<size_t>(got));
        if (received.size() > kMaxProbeReportBytes) oversized = true;
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
  bool done = false, have_snapshot = false, have_failure = false;
  std::string_view rest(received);
  while (rest.size() >= 5) {
    const auto tag = static_cast<uint8_t>(rest[0]);
    uint32_t len;
    std::memcpy(&len, rest.data() + 1, sizeof len);
    if (rest.size() < 5 + size_t{len}) break;
    const std::string_view payload = rest.substr(5, len);
    rest.remove_prefix(5 + size_t{len});
    Reader r(payload);
    if (tag == kRefused) {
      uint32_t stage = 0, code = 0;
      r.u32(&stage);
      r.u32(&code);
      r.str(&result.message);
      result.stage = static_cast<Stage>(stage);
      result.code = static_cast<kreg_status_code>(code);
      result.end = ProbeEnd::kRefused;
      have_failure = r.ok();
    } else if (tag == kInitFailed) {
      uint32_t code = 0;
      r.u32(&code);
      r.str(&result.message);
      result.code = static_cast<kreg_status_code>(code);
      result.stage = Stage::kOk;
      result.end = ProbeEnd::kInitFailed;
      have_failure = r.ok();
      // PluginLibrary::init names the group only; say which file as well.
      const std::string group_only = "plugin '" + expect.group + "': ";
      if (result.message.starts_with(group_only)) {
        result.message = head + ": " + result.message.substr(group_only.size());
      }
    } else if (tag == kSnapshot) {
      have_snapshot = decode_snapshot(payload, file, &result.snapshot);
    } else if (tag == kDone) {
      done = true;
    }
  }
  if (have_failure) return result;

  const Phase phase = progress->phase;
  const Stage stage = progress->stage;
  result.stage = phase == Phase::kOpening ? stage : Stage::kOk;
  const std::string where = phase_text(phase, stage);
  if (timed_out) {
    result.end = ProbeEnd::kTimedOut;
    result.message = head + ": timed out after " + seconds_text(timeout) + " " + where +
                     "; the child process loading it was killed" + output_hint(output);
    return result;
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
  if (have_snapshot && done && reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
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
