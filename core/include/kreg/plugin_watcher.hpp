// PluginWatcher: watch mode for hot swapping (docs/hot-swap.md). Watches the directories
// of the groups' library files with inotify (IN_CLOSE_WRITE | IN_MOVED_TO: a build that
// writes the library and closes it, or renames a finished file into place) and reloads
// the group whose file changed, reporting each swap or rejection through a callback.
//
// Every candidate is pre-checked in a child process first by default
// (WatchOptions::reload.precheck_in_child, with a timeout; kreg/plugin_probe.hpp): a build
// that crashes, hangs, exits or throws in a static initializer or its init hook is
// rejected with the child's account of it, and the running generation keeps serving. Every
// generation is loaded from a private copy (Registry::reload always copies); open the
// registry with OpenOptions::private_copy as well so that the first generation is not
// mapped from the build output, which a build rewriting it in place would truncate under
// the running code (SIGBUS). kreg-host --watch does both.
//
// Before reloading it waits until the file is stable: the same size, modification time and
// inode across two stats `settle_interval_ms` apart (bounded by `settle_timeout_ms`); stat
// never opens the file, so a FIFO put in its place cannot block the watcher (the reload then
// refuses it by its type). A file that is still incomplete is refused (ELF check on the
// copy, or the copy finding the file changed under it), reported, and retried on the file's
// next event. The callback runs on the watcher's thread; stop() (or the destructor) joins it.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kreg/manifest.hpp"
#include "kreg/registry.hpp"
#include "kreg/status.hpp"

namespace kreg {

struct WatchEvent {
  std::string group;
  std::filesystem::path file;
  bool swapped = false;
  ReloadReport report;  // when swapped
  Status error;         // when rejected
  // From reading the inotify event (the file was closed or renamed just before) to the
  // swap being visible, or to the rejection.
  double latency_ms = 0;
};

// ReloadOptions with the child-process pre-check on: watch mode's default.
inline ReloadOptions prechecked_reload_options() {
  ReloadOptions o;
  o.precheck_in_child = true;
  return o;
}

struct WatchOptions {
  // Pre-check in a child by default; precheck_in_child = false loads candidates in-process
  // directly (a crashing build then takes the host down).
  ReloadOptions reload = prechecked_reload_options();
  int poll_timeout_ms = 20;      // how often the thread checks for stop()
  int settle_interval_ms = 2;    // the size must be stable across this interval
  int settle_timeout_ms = 2000;  // give up waiting for a stable size after this long
};

class PluginWatcher {
 public:
  using Callback = std::function<void(const WatchEvent&)>;
  struct File {
    std::string group;
    std::filesystem::path library;
  };

  // Watches the library of every enabled group of the manifest (library paths resolved as
  // the manifest resolved them), reloading through `registry`, which must outlive it.
  static Result<std::unique_ptr<PluginWatcher>> start(Registry& registry, const Manifest& manifest,
                                                      Callback callback,
                                                      const WatchOptions& options = {});
  static Result<std::unique_ptr<PluginWatcher>> start(Registry& registry, std::vector<File> files,
                                                      Callback callback,
                                                      const WatchOptions& options = {});
  ~PluginWatcher();
  PluginWatcher(const PluginWatcher&) = delete;
  PluginWatcher& operator=(const PluginWatcher&) = delete;

  // Stops watching and joins the thread (prompt: within poll_timeout_ms plus a reload in
  // progress; a pre-check in progress is abandoned, its child killed). Idempotent.
  void stop();

 private:
  PluginWatcher(Registry& registry, Callback callback, const WatchOptions& options);
  void run();
  void handle(const File& file);

  Registry& registry_;
  Callback callback_;
  WatchOptions options_;
  int fd_ = -1;
  struct Watch {
    int wd;
    std::string name;  // the file name inside the watched directory
    File file;
  };
  std::vector<Watch> watches_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kreg
