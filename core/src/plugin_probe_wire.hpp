// What probe_plugin (plugin_probe.cpp, the parent) and the child that loads the plugin
// (plugin_probe_child.cpp: the kreg-probe executable, or the fork fallback) share: the
// progress page, the report's wire format, kreg-probe's arguments and the child's body.
// Internal to libkreg; a kreg-probe from another build is refused by the protocol number.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "kreg/plugin_library.hpp"

namespace kreg::probe {

// Bump whenever anything below changes (tags, payloads, Progress, the arguments): a
// kreg-probe speaking another protocol refuses its arguments instead of misreporting.
inline constexpr uint32_t kProtocol = 2;

using Stage = PluginLibrary::Stage;

enum class Phase : int32_t {
  kStarting,
  kOpening,
  kInit,
  kReporting,
  kCompiling,  // --compile-jit: NVRTC compiling the jit implementations
  kShutdown,
  kDone
};

// Lives in a shared page (a memfd both processes map): the child writes, the parent reads
// after the child ended, so it can say where a child that died without reporting was.
struct Progress {
  volatile Stage stage;
  volatile Phase phase;
};

// Messages on the data pipe: a tag byte, a 32-bit payload length, the payload.
enum Tag : uint8_t {
  kRefused = 1,       // u32 stage, u32 code, str message
  kInitFailed = 2,    // u32 code, str message
  kSnapshot = 3,      // the descriptor and kernel records (plugin_probe.cpp)
  kDone = 4,          // (empty) unloaded cleanly; --compile-jit: the compile report is sent
  kHello = 5,         // u32 protocol: the child parsed its arguments and runs no plugin code yet
  kBadArguments = 6,  // str message: the child refused its command line
  // --compile-jit, after kSnapshot: u32 implementations, u32 builds, u32 n, n x str failure
  kJitReport = 7,  // the last tag: the parent refuses any other value
};

// Descriptors in a kreg-probe child: stdin is /dev/null, stdout and stderr the output pipe,
// these two the data pipe and the progress page; nothing else is inherited.
inline constexpr int kChildDataFd = 3;
inline constexpr int kChildProgressFd = 4;

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
  // Every byte read and nothing left over: the payload was exactly what was expected.
  bool done() const { return ok_ && data_.empty(); }

 private:
  bool fail() {
    ok_ = false;
    return false;
  }
  std::string_view data_;
  bool ok_ = true;
};

void write_all(int fd, const std::string& s);

// The child process's hygiene, before any plugin code runs: dies with `parent` (exits at
// once if it is already gone), no core dumps, default signal dispositions and an empty
// mask, and an exit() from the plugin ends the process with that status and nothing else
// (on_exit -> _exit). Does not touch descriptors or the process group.
void prepare_child(pid_t parent);

// What the child does once the library is open (kreg-probe's --init and --compile-jit).
struct Task {
  bool run_init = true;
  bool compile_jit = false;
};

// The child's work: says hello, loads `file` with PluginLibrary::open (progress in
// `progress`), runs the init hook if asked, reports on `data_fd`; then either compiles the
// jit implementations and reports that (compile_jit: the library stays loaded) or unloads.
// Never returns.
[[noreturn]] void load_and_report(const std::filesystem::path& file,
                                  const PluginLibrary::Expect& expect, const Task& task,
                                  Progress* progress, int data_fd);

}  // namespace kreg::probe
