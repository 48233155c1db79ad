// The child process of probe_plugin (kreg/plugin_probe.hpp): a fresh kreg-probe started with
// posix_spawn, never a fork of the caller. Probes from a process whose other threads hold a
// lock and allocate; kreg-probe's command line (paths and names that a shell or a parser
// would mangle, malformed arguments, another protocol); the jit-sources compile mode (its
// option on the command line, no fork); explicit executables that are
// missing or not kreg-probe; and, from a copy of this test and of kreg without kreg-probe,
// the documented fallback: a fork of a single-threaded process only.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kreg/plugin_probe.hpp"
#include "test_support.hpp"
#include "time_budget.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::contains;
using test::read_file;
using test::Scratch;
using test::test_plugin;

// Sets an environment variable for a scope (this suite runs on one thread while it does).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// ---- fork detection: pthread_atfork handlers run on fork(), never on posix_spawn ----

std::atomic<int> g_fork_prepares{0};
std::atomic<bool> g_prepare_takes_lock{false};
std::mutex g_held;  // held by another thread while the test probes

void on_fork_prepare() {
  ++g_fork_prepares;
  // What a library with fork handlers does (malloc, a runtime): take its lock, which
  // another thread holds. A fork would wait here; a spawn never comes here.
  if (g_prepare_takes_lock.load()) std::lock_guard lock(g_held);
}

void install_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] { ::pthread_atfork(on_fork_prepare, nullptr, nullptr); });
}

// The children of this process: pid and comm (/proc/<pid>/stat), which exec sets to the
// new program's name and a fork keeps.
std::vector<std::pair<pid_t, std::string>> children() {
  std::vector<std::pair<pid_t, std::string>> out;
  const pid_t self = ::getpid();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path() / "stat");
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == self) {
      out.emplace_back(std::stoi(name), stat.substr(open + 1, close - open - 1));
    }
  }
  return out;
}

std::vector<std::string> cmdline(pid_t pid) {
  const std::string raw = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\0') {
      args.push_back(raw.substr(start, i - start));
      start = i + 1;
    }
  }
  return args;
}

// Another thread holding g_held, and threads allocating, for the scope: the state in which
// a fork copies a lock held (the holder does not exist in the child) or an allocator's
// lock mid-operation.
class BusyProcess {
 public:
  BusyProcess() {
    std::promise<void> locked;
    holder_ = std::thread([this, &locked] {
      std::unique_lock lock(g_held);
      locked.set_value();
      std::unique_lock wait(mu_);
      // Released after a while in any case: a forking implementation fails this test
      // instead of hanging it.
      cv_.wait_for(wait, std::chrono::duration<double>(test::budget(10)), [this] { return stop_; });
    });
    locked.get_future().wait();
    for (int t = 0; t < 2; ++t) {
      churn_.emplace_back([this] {
        while (!churning_stop_.load(std::memory_order_relaxed)) {
          std::vector<std::string> v;
          for (int i = 0; i < 64; ++i) v.emplace_back(100 + i, 'x');
        }
      });
    }
  }
  ~BusyProcess() {
    churning_stop_ = true;
    for (std::thread& t : churn_) t.join();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    holder_.join();
  }

 private:
  std::thread holder_;
  std::vector<std::thread> churn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> churning_stop_{false};
};

TEST(ProbeProcess, TheChildIsKregProbeNotAForkOfTheBusyCaller) {
  const ProbeExecutable exe = find_probe_executable();
  ASSERT_FALSE(exe.path.empty()) << exe.problem;
  EXPECT_FALSE(exe.explicit_choice);
  EXPECT_EQ(exe.path.filename(), kProbeExecutableName);

  install_fork_handlers();
  const int prepares_before = g_fork_prepares.load();
  BusyProcess busy;
  g_prepare_takes_lock = true;

  // A plugin that hangs in a static initializer keeps its child alive to be looked at; the
  // probe is cancelled once it has been.
  std::atomic<bool> cancel{false};
  ProbeOptions o;
  o.timeout_s = 60;
  o.cancel = &cancel;
  ProbeResult hang;
  std::thread prober([&] {
    hang = probe_plugin(test_plugin("crash_hang_static"), {"testgrp", std::nullopt}, o);
  });
  pid_t child = 0;
  std::string comm;
  std::vector<std::string> args;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(test::budget(5)));
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& [pid, name] : children()) {
      child = pid;
      comm = name;
    }
    // execve names the task (comm) before it sets up the new image's argument area, so
    // for a moment the child is kreg-probe with an empty /proc/<pid>/cmdline: wait for both.
    if (comm == kProbeExecutableName) {
      args = cmdline(child);
      if (!args.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::error_code ec;
  const fs::path exe_link = fs::read_symlink("/proc/" + std::to_string(child) + "/exe", ec);
  cancel = true;
  prober.join();

  ASSERT_GT(child, 0) << "no child process appeared";
  EXPECT_EQ(comm, kProbeExecutableName) << "the child runs the caller's program: a fork";
  ASSERT_FALSE(args.empty());
  EXPECT_EQ(args[0], kProbeExecutableName);
  EXPECT_EQ(args.back(), test_plugin("crash_hang_static").string());
  // The child makes itself non-dumpable, which hides /proc/<pid>/exe from unprivileged
  // readers; where it can be read, it is kreg-probe itself.
  if (!ec) {
    EXPECT_EQ(fs::canonical(exe_link), fs::canonical(exe.path));
  }
  EXPECT_EQ(hang.end, ProbeEnd::kCancelled) << hang.message;
  EXPECT_EQ(hang.executable, exe.path);
  EXPECT_TRUE(hang.forked.empty()) << hang.forked;

  // Loads, crashes and exits are reported as before, while the lock is held and the
  // other threads allocate.
  for (int i = 0; i < 5; ++i) {
    const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")});
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.snapshot.info.group, "testgrp");
  }
  ProbeOptions quick;
  quick.timeout_s = test::budget(2);
  const ProbeResult segv =
      probe_plugin(test_plugin("crash_segv_static"), {"testgrp", std::nullopt}, quick);
  EXPECT_EQ(segv.end, ProbeEnd::kSignaled) << segv.message;
  EXPECT_EQ(signal_name(segv.signal), "SIGSEGV");
  EXPECT_TRUE(contains(segv.message,
                       "while loading the library (dlopen, running its static "
                       "initializers)"))
      << segv.message;
  const ProbeResult exit3 =
      probe_plugin(test_plugin("crash_exit_init"), {"testgrp", std::nullopt}, quick);
  EXPECT_EQ(exit3.end, ProbeEnd::kExited) << exit3.message;
  EXPECT_EQ(exit3.exit_status, 3);
  EXPECT_TRUE(contains(exit3.message, "in its init hook")) << exit3.message;

  g_prepare_takes_lock = false;
  EXPECT_EQ(g_fork_prepares.load(), prepares_before) << "probe_plugin forked this process";
}

// A file under a relative path that starts with '-' and holds a space, a newline and a
// byte that is not UTF-8; a group and a version that a shell or an option parser would
// split or take for options. They reach the child as they are.
TEST(ProbeProcess, PathsAndNamesCrossIntoTheChildAsTheyAre) {
  Scratch s;
  const fs::path rel = fs::path("-dir x\n") / "-lib \n\xff.so";
  s.copy(test_plugin("testgrp"), rel);
  const fs::path cwd = fs::current_path();
  fs::current_path(s.root());
  const ProbeResult good = probe_plugin(rel, {"testgrp", std::string("0.1.0")});
  const std::string odd_group = "--group\n x;$(true)'\"";
  const ProbeResult group = probe_plugin(rel, {odd_group, std::nullopt});
  const ProbeResult version = probe_plugin(rel, {"testgrp", std::string("-v \n2")});
  const ProbeResult empty_version = probe_plugin(rel, {"testgrp", std::string()});
  fs::current_path(cwd);

  ASSERT_TRUE(good.ok()) << good.message;
  EXPECT_EQ(good.snapshot.info.path, rel);
  EXPECT_EQ(good.snapshot.info.group, "testgrp");
  EXPECT_EQ(group.end, ProbeEnd::kRefused) << group.message;
  EXPECT_EQ(group.stage, PluginLibrary::Stage::kGroup);
  EXPECT_TRUE(contains(group.message, "lists it as group '" + odd_group + "'")) << group.message;
  EXPECT_EQ(version.end, ProbeEnd::kRefused) << version.message;
  EXPECT_EQ(version.stage, PluginLibrary::Stage::kVersion);
  EXPECT_TRUE(contains(version.message, "does not match the expected -v \n2")) << version.message;
  // An expected version that is empty is still an expectation (not "any version").
  EXPECT_EQ(empty_version.end, ProbeEnd::kRefused) << empty_version.message;
  EXPECT_EQ(empty_version.stage, PluginLibrary::Stage::kVersion);

  // A NUL cannot cross a command line: refused here, before any child.
  const ProbeResult nul = probe_plugin(test_plugin("testgrp"), {std::string("test\0grp", 8)});
  EXPECT_EQ(nul.end, ProbeEnd::kSpawnFailed);
  EXPECT_TRUE(contains(nul.message, "its group holds a NUL byte")) << nul.message;
}

// Files that are no plugin, through the child: each ends refused (never a hang on the FIFO
// or a read of /dev/zero, never a crash), within a bound, naming the file; what the file
// holds (NUL bytes, escape codes) reaches the message escaped or not at all.
TEST(ProbeProcess, FilesThatAreNoPluginAreRefusedInTheChild) {
  Scratch s;
  const fs::path fifo = s.root() / "fifo.so";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const fs::path empty = s.write("empty.so", "", 0755);
  const fs::path nuls = s.write("nuls.so", std::string(4096, '\0'), 0755);
  const fs::path escapes = s.write("escapes.so",
                                   "\x7f"
                                   "ELF\x1b[2J\x1b]0;owned\x07" +
                                       std::string(200, 'A'),
                                   0755);
  const fs::path huge = s.write("huge.so", "", 0755);
  fs::resize_file(huge, uintmax_t{1} << 40);  // 1 TiB, sparse: nothing is written
  const fs::path named_oddly = s.plugin("testgrp", "\x1b[31mred\x1b[0m.so");
  for (const fs::path& f : {fs::path("/dev/zero"), fifo, empty, nuls, escapes, huge}) {
    SCOPED_TRACE(f.string());
    const auto start = std::chrono::steady_clock::now();
    const ProbeResult r = probe_plugin(f, {"testgrp", std::nullopt});
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(took, test::budget(5.0));
    EXPECT_EQ(r.end, ProbeEnd::kRefused) << r.message;
    // The file checks (kind, size) or the ELF reader's, before any dlopen.
    EXPECT_TRUE(r.stage == PluginLibrary::Stage::kFile || r.stage == PluginLibrary::Stage::kLoad)
        << r.message;
    EXPECT_TRUE(contains(r.message, "is not a regular file") ||
                contains(r.message, "is not an ELF shared object") ||
                contains(r.message, "the limit for a plugin library is"))
        << r.message;
    EXPECT_TRUE(contains(r.message, f.filename().string())) << r.message;
    EXPECT_FALSE(contains(r.message, "\x1b")) << "raw escape code in: " << r.message;
  }
  // A real plugin whose file name holds escape codes loads; the name is data, not output.
  const ProbeResult odd = probe_plugin(named_oddly, {"testgrp", std::nullopt});
  EXPECT_TRUE(odd.ok()) << odd.message;
}

// A plugin that writes junk (a length word of 2^32 - 1, NUL bytes, escape codes) to every
// low descriptor, the child's report pipe among them, in a static initializer: the report
// cannot be trusted, and the probe says so, within a bound, without a raw escape code.
TEST(ProbeProcess, JunkOnTheReportPipeIsAMalformedReport) {
  ProbeOptions o;
  o.timeout_s = test::budget(5.0);
  const auto start = std::chrono::steady_clock::now();
  const ProbeResult r =
      probe_plugin(test_plugin("crash_junk_static"), {"testgrp", std::nullopt}, o);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, test::budget(5.0));
  EXPECT_EQ(r.end, ProbeEnd::kBadReport) << r.message;
  EXPECT_TRUE(contains(r.message, "crash_junk_static")) << r.message;
  EXPECT_TRUE(contains(r.message,
                       "its report to kreg does not decode (an unknown message (tag "
                       "255) at byte 9)"))
      << r.message;
  EXPECT_TRUE(contains(r.message, "wrote to the probe's report pipe")) << r.message;
  EXPECT_FALSE(contains(r.message, "\x1b")) << "raw escape code in: " << r.message;
}

TEST(ProbeProcess, AnExplicitExecutableThatCannotRunFailsNamingItAndNeverForks) {
  install_fork_handlers();
  const int prepares_before = g_fork_prepares.load();
  Scratch s;
  const fs::path missing = s.root() / "no-such-probe";
  const fs::path plain = s.write("not-executable", "#!/bin/sh\nexit 0\n", 0644);
  const fs::path folder = s.dir("a-folder");
  struct Case {
    fs::path path;
    const char* why;
  };
  for (const Case& c : {Case{missing, "does not exist"}, Case{plain, "is not executable"},
                        Case{folder, "is not a regular file"}}) {
    ProbeOptions o;
    o.executable = c.path;
    const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt}, o);
    EXPECT_EQ(r.end, ProbeEnd::kSpawnFailed) << r.message;
    EXPECT_TRUE(contains(r.message, "the probe executable (ProbeOptions::executable) " +
                                        c.path.string() + " " + c.why))
        << r.message;
    EXPECT_TRUE(r.forked.empty());
    // The same through KREG_PROBE, which names itself.
    ScopedEnv env(kProbeExecutableEnv, c.path.c_str());
    const ProbeResult e = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt});
    EXPECT_EQ(e.end, ProbeEnd::kSpawnFailed) << e.message;
    EXPECT_TRUE(
        contains(e.message, "the probe executable KREG_PROBE=" + c.path.string() + " " + c.why))
        << e.message;
  }
  // ProbeOptions::executable wins over KREG_PROBE; KREG_PROBE over the search.
  {
    ScopedEnv env(kProbeExecutableEnv, missing.c_str());
    ProbeOptions o;
    o.executable = KREG_PROBE_EXECUTABLE;
    const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt}, o);
    EXPECT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.executable, fs::path(KREG_PROBE_EXECUTABLE));
  }
  {
    ScopedEnv env(kProbeExecutableEnv, KREG_PROBE_EXECUTABLE);
    const ProbeExecutable e = find_probe_executable();
    EXPECT_TRUE(e.explicit_choice);
    EXPECT_EQ(e.path, fs::path(KREG_PROBE_EXECUTABLE));
  }
  EXPECT_EQ(g_fork_prepares.load(), prepares_before) << "probe_plugin forked this process";
}

TEST(ProbeProcess, AProgramThatIsNotKregProbeIsReportedAsSuch) {
  Scratch s;
  const fs::path impostor =
      s.write("impostor", "#!/bin/sh\necho 'I am not a probe' >&2\nexit 5\n", 0755);
  ProbeOptions o;
  o.executable = impostor;
  const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt}, o);
  EXPECT_EQ(r.end, ProbeEnd::kSpawnFailed) << r.message;
  EXPECT_TRUE(contains(r.message, impostor.string() + " did not start as kreg's plugin probe (it "
                                                      "exited with status 5 before its first "
                                                      "report"))
      << r.message;
  EXPECT_TRUE(contains(r.message, "its last output: \"I am not a probe\"")) << r.message;

  o.executable = "/bin/true";
  const ProbeResult t = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt}, o);
  EXPECT_EQ(t.end, ProbeEnd::kSpawnFailed) << t.message;
  EXPECT_TRUE(contains(t.message, "it exited with status 0 before its first report")) << t.message;
}

// kreg-probe wrapped by a script that changes its command line: the child refuses it and
// probe_plugin reports the child's words.
TEST(ProbeProcess, ArgumentsTheChildRefusesAreReportedByTheParent) {
  Scratch s;
  const std::string probe = KREG_PROBE_EXECUTABLE;
  struct Case {
    const char* script;  // after the #!/bin/sh line; PROBE is kreg-probe's path
    const char* says;
  };
  for (const Case& c : {
           // argv[1..2] are "--protocol 2"
           Case{"shift 2\nexec \"$PROBE\" --protocol 999 \"$@\"\n",
                "--protocol 999: this kreg-probe speaks protocol 2"},
           Case{"exec \"$PROBE\" \"$@\" --group again\n", "--group is given twice"},
           Case{"exec \"$PROBE\" \"$@\" --grup x\n", "('--grup') is no option"},
           Case{"exec \"$PROBE\" \"$@\" --version\n", "--version is missing its value"},
           Case{"shift 2\nexec \"$PROBE\" --protocol 1x \"$@\"\n", "--protocol"},
           Case{"exec \"$PROBE\" --parent 1 \"$@\"\n", "--parent is given twice"},
       }) {
    const fs::path wrapper =
        s.write("wrapper", std::string("#!/bin/sh\nPROBE='") + probe + "'\n" + c.script, 0755);
    ProbeOptions o;
    o.executable = wrapper;
    const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt}, o);
    EXPECT_EQ(r.end, ProbeEnd::kSpawnFailed) << c.script << r.message;
    EXPECT_TRUE(contains(r.message, wrapper.string() + " refused its arguments: ")) << r.message;
    EXPECT_TRUE(contains(r.message, c.says)) << c.says << " not in " << r.message;
  }
}

// validate's jit-sources compiles (ProbeOptions::compile_jit) run in the same kreg-probe,
// told so on its command line; a plugin without jit implementations compiles nothing.
TEST(ProbeProcess, TheJitCompileModeRunsInKregProbeToo) {
  install_fork_handlers();
  const int prepares_before = g_fork_prepares.load();
  Scratch s;
  const fs::path log = s.root() / "argv";
  const fs::path wrapper = s.write("wrapper",
                                   "#!/bin/sh\nprintf '%s\\n' \"$@\" > '" + log.string() +
                                       "'\nexec '" KREG_PROBE_EXECUTABLE "' \"$@\"\n",
                                   0755);
  ProbeOptions o;
  o.executable = wrapper;
  o.run_init = false;
  o.compile_jit = true;
  const ProbeResult r = probe_plugin(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")}, o);
  const std::string args = read_file(log);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.snapshot.info.group, "testgrp");
  EXPECT_EQ(r.jit.implementations, 0u);
  EXPECT_EQ(r.jit.builds, 0u);
  EXPECT_TRUE(r.jit.failures.empty());
  EXPECT_EQ(r.executable, wrapper);
  EXPECT_TRUE(r.forked.empty()) << r.forked;
  EXPECT_TRUE(contains(args, "\n--init\n0\n--compile-jit\n1\n")) << args;

  o.compile_jit = false;
  const ProbeResult plain =
      probe_plugin(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")}, o);
  ASSERT_TRUE(plain.ok()) << plain.message;
  EXPECT_TRUE(contains(read_file(log), "\n--compile-jit\n0\n")) << read_file(log);
  // A crash before the compiles is reported as for a plain load.
  ProbeOptions crash;
  crash.timeout_s = test::budget(2);
  crash.run_init = false;
  crash.compile_jit = true;
  const ProbeResult segv =
      probe_plugin(test_plugin("crash_segv_static"), {"testgrp", std::nullopt}, crash);
  EXPECT_EQ(segv.end, ProbeEnd::kSignaled) << segv.message;
  EXPECT_TRUE(contains(segv.message, "running its static initializers")) << segv.message;
  EXPECT_EQ(g_fork_prepares.load(), prepares_before) << "probe_plugin forked this process";
}

struct ChildRun {
  int exit_code = -1;
  std::string err;
};

// Runs kreg-probe by hand with `args` (no descriptors but 0-2, and `opens`: descriptor ->
// path, opened read-write for the child), stderr captured.
ChildRun run_probe_by_hand(const std::vector<std::string>& args,
                           const std::vector<std::pair<int, std::string>>& opens = {}) {
  ChildRun r;
  int err[2];
  if (::pipe(err) != 0) return r;
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  ::posix_spawn_file_actions_addclose(&fa, err[0]);
  for (const auto& [fd, path] : opens) {
    ::posix_spawn_file_actions_addopen(&fa, fd, path.c_str(), O_RDWR | O_NONBLOCK, 0);
  }
  std::vector<std::string> storage = {KREG_PROBE_EXECUTABLE};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, KREG_PROBE_EXECUTABLE, &fa, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::close(err[1]);
  if (rc != 0) {
    ::close(err[0]);
    return r;
  }
  char buf[4096];
  ssize_t n;
  while ((n = ::read(err[0], buf, sizeof buf)) > 0) r.err.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(ProbeProcess, KregProbeRunByHandRefusesAndSaysWhatItIs) {
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{}, "--data-fd is required"},
           {{"--data-fd", "1"}, "--data-fd: '1' is out of range [3, "},
           {{"--data-fd", "99"}, "--data-fd 99: not an open descriptor"},
           {{"--file", "x", "--data-fd"}, "--data-fd is missing its value"},
           {{"-h"}, "argument 1 ('-h') is no option"},
           {{"--data-fd", "99999999999999999999"}, "--data-fd: '99999999999999999999' is out of"},
           {{"--data-fd", "-9223372036854775809"}, "--data-fd: '-9223372036854775809' is out of"},
           {{"\x1b[2J\x1b]0;owned\x07"}, "argument 1 ('\\x1b[2J\\x1b]0;owned\\x07') is no option"},
       }) {
    const ChildRun r = run_probe_by_hand(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "kreg-probe: " + says)) << says << " not in " << r.err;
    EXPECT_TRUE(contains(r.err, "it is not a command to run by hand")) << r.err;
    EXPECT_FALSE(contains(r.err, "\x1b")) << "raw escape code in: " << r.err;
  }
  // A huge argument is quoted cut, with its size.
  const ChildRun big = run_probe_by_hand({std::string(100000, 'A')});
  EXPECT_EQ(big.exit_code, 2) << big.err;
  EXPECT_TRUE(contains(big.err, "A... (100000 bytes)') is no option")) << big.err;
  EXPECT_LT(big.err.size(), size_t{2000}) << "the argument was echoed whole";
}

// The progress page must be a mapped file of the parent's: a FIFO, /dev/zero or an empty
// file in its place is refused with the descriptor named (never mapped, never blocked on),
// and so is a --parent past int32 or a number that is no number.
TEST(ProbeProcess, KregProbeRefusesAProgressPageThatIsNoFileAndBadNumbers) {
  Scratch s;
  const fs::path fifo = s.root() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const fs::path empty = s.write("empty", "", 0644);
  auto args = [](const std::string& parent) {
    return std::vector<std::string>{"--protocol",    "2", "--parent", parent, "--data-fd",     "3",
                                    "--progress-fd", "4", "--init",   "0",    "--compile-jit", "0",
                                    "--group",       "g", "--file",   "x.so"};
  };
  for (const std::string& page : {std::string("/dev/zero"), fifo.string(), empty.string()}) {
    SCOPED_TRACE(page);
    const ChildRun r = run_probe_by_hand(args("1"), {{3, "/dev/null"}, {4, page}});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--progress-fd 4: not a file of at least")) << r.err;
  }
  for (const auto& [parent, says] : std::vector<std::pair<std::string, std::string>>{
           {"2147483648", "--parent: '2147483648' is out of range"},
           {"18446744073709551616", "--parent: '18446744073709551616' is out of"},
           {"0x10", "--parent"},
           {"", "--parent"}}) {
    const ChildRun r = run_probe_by_hand(args(parent), {{3, "/dev/null"}, {4, empty.string()}});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "kreg-probe: " + says)) << says << " not in " << r.err;
  }
}

// ---- no kreg-probe at all ----

// Run by WithoutKregProbeOnlyASingleThreadedProcessForks in a copy of this test that
// finds no kreg-probe; skipped anywhere else.
TEST(ProbeInACopy, ForksOnlyASingleThreadedProcess) {
  if (std::getenv("KREG_PROBE_TEST_IN_COPY") == nullptr) {
    GTEST_SKIP() << "run from a copy of this test (ProbeProcess.WithoutKregProbe...)";
  }
  const ProbeExecutable none = find_probe_executable();
  ASSERT_TRUE(none.path.empty()) << "found " << none.path;
  EXPECT_FALSE(none.explicit_choice);
  const fs::path here = fs::read_symlink("/proc/self/exe").parent_path();
  EXPECT_TRUE(contains(none.problem, "no kreg-probe executable found (looked for " +
                                         (here / kProbeExecutableName).string() +
                                         " (does not exist)"))
      << none.problem;

  // One thread: the old fork, said so, with the same reports.
  const ProbeResult good = probe_plugin(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")});
  ASSERT_TRUE(good.ok()) << good.message;
  EXPECT_TRUE(good.executable.empty());
  EXPECT_TRUE(contains(good.forked, none.problem)) << good.forked;
  EXPECT_TRUE(contains(good.forked, "the child was a fork of this single-threaded process"))
      << good.forked;
  ProbeOptions quick;
  quick.timeout_s = test::budget(2);
  const ProbeResult exit3 =
      probe_plugin(test_plugin("crash_exit_init"), {"testgrp", std::nullopt}, quick);
  EXPECT_EQ(exit3.end, ProbeEnd::kExited) << exit3.message;
  EXPECT_EQ(exit3.exit_status, 3);
  const ProbeResult segv =
      probe_plugin(test_plugin("crash_segv_static"), {"testgrp", std::nullopt}, quick);
  EXPECT_EQ(segv.end, ProbeEnd::kSignaled) << segv.message;
  // The jit-sources compile mode takes the same fallback.
  ProbeOptions compile;
  compile.run_init = false;
  compile.compile_jit = true;
  const ProbeResult compiled =
      probe_plugin(test_plugin("testgrp"), {"testgrp", std::string("0.1.0")}, compile);
  ASSERT_TRUE(compiled.ok()) << compiled.message;
  EXPECT_EQ(compiled.jit.implementations, 0u);
  EXPECT_TRUE(contains(compiled.forked, "the child was a fork of this single-threaded process"))
      << compiled.forked;

  // Another thread: never a fork.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread other([&] {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  });
  const ProbeResult refused = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt});
  // KREG_PROBE names a real one: then threads do not matter.
  std::optional<ProbeResult> named;
  if (const char* real = std::getenv("KREG_PROBE_TEST_REAL")) {
    ScopedEnv env(kProbeExecutableEnv, real);
    named = probe_plugin(test_plugin("testgrp"), {"testgrp", std::nullopt});
  }
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  other.join();
  EXPECT_EQ(refused.end, ProbeEnd::kSpawnFailed) << refused.message;
  EXPECT_TRUE(contains(refused.message, none.problem)) << refused.message;
  // Two threads, or more where a sanitizer runtime starts one of its own.
  const std::string unsafe = "a fork of this process instead is unsafe: it runs ";
  const size_t at = refused.message.find(unsafe);
  ASSERT_NE(at, std::string::npos) << refused.message;
  const int threads = std::atoi(refused.message.c_str() + at + unsafe.size());
  EXPECT_GE(threads, 2) << refused.message;
  EXPECT_TRUE(contains(refused.message, unsafe + std::to_string(threads) +
                                            " threads, whose locks the child would inherit held"))
      << refused.message;
  EXPECT_TRUE(refused.forked.empty());
  ASSERT_TRUE(named.has_value());
  EXPECT_TRUE(named->ok()) << named->message;
  EXPECT_TRUE(named->forked.empty());
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

ChildRun shell(const std::string& cmd, std::string* out) {
  ChildRun r;
  FILE* p = ::popen((cmd + " 2>&1 </dev/null").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// This test binary and kreg, copied with libkreg into a folder without kreg-probe (and run
// with that libkreg first on the library path): the search finds nothing.
TEST(ProbeProcess, WithoutKregProbeOnlyASingleThreadedProcessForks) {
  Scratch s;
  const fs::path bin = s.dir("bin");
  const fs::path self = s.copy(fs::read_symlink("/proc/self/exe"), "bin/probe_test");
  s.copy(KREG_CORE_LIBRARY, fs::path("bin") / KREG_CORE_SONAME);
  const fs::path kreg = s.copy(KREG_CLI, "bin/kreg");
  const std::string env = "env -u KREG_PROBE LD_LIBRARY_PATH=" + quote(bin.string()) + " ";

  std::string out;
  const ChildRun inner = shell(
      env + "KREG_PROBE_TEST_IN_COPY=1 KREG_PROBE_TEST_REAL=" + quote(KREG_PROBE_EXECUTABLE) + " " +
          quote(self.string()) + " --gtest_filter=ProbeInACopy.ForksOnlyASingleThreadedProcess",
      &out);
  EXPECT_EQ(inner.exit_code, 0) << out;
  EXPECT_TRUE(contains(out, "[       OK ] ProbeInACopy.ForksOnlyASingleThreadedProcess")) << out;

  // The installed `kreg validate` that lost its kreg-probe keeps working, and says how.
  const fs::path m = s.write("registry.yaml",
                             "kreg_manifest: 1\nplugin_dir: " + std::string(KREG_TEST_PLUGIN_DIR) +
                                 "\ngroups:\n  - name: testgrp\n    library: libkreg_testgrp.so\n",
                             0644);
  std::string validate;
  const ChildRun v =
      shell(env + quote(kreg.string()) + " validate --manifest " + quote(m.string()), &validate);
  EXPECT_EQ(v.exit_code, 0) << validate;
  EXPECT_TRUE(contains(validate, "ok   library-loads      testgrp")) << validate;
  EXPECT_TRUE(contains(validate, "warning [library-loads] testgrp")) << validate;
  EXPECT_TRUE(contains(validate, "no kreg-probe executable found")) << validate;
  EXPECT_TRUE(contains(validate, "the child was a fork of this single-threaded process"))
      << validate;
}

}  // namespace
}  // namespace kreg
