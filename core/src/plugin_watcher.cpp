#include "kreg/plugin_watcher.hpp"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <system_error>

namespace kreg {

namespace fs = std::filesystem;

namespace {

// What stat says about a watched file; equal states mean nothing wrote it in between.
struct FileState {
  int err = 0;  // errno of a failed stat
  uint64_t dev = 0, ino = 0, size = 0;
  unsigned mode = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileState&) const = default;
};

FileState file_state(const fs::path& file) {
  FileState s;
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    s.err = errno;
    return s;
  }
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mode = st.st_mode;
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

}  // namespace

PluginWatcher::PluginWatcher(Registry& registry, Callback callback, const WatchOptions& options)
    : registry_(registry), callback_(std::move(callback)), options_(options) {
  // stop() abandons a pre-check in progress instead of waiting out its timeout.
  if (options_.reload.cancel == nullptr) options_.reload.cancel = &stop_;
}

PluginWatcher::~PluginWatcher() {
  stop();
  if (fd_ >= 0) ::close(fd_);
}

void PluginWatcher::stop() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

Result<std::unique_ptr<PluginWatcher>> PluginWatcher::start(Registry& registry,
                                                            const Manifest& manifest,
                                                            Callback callback,
                                                            const WatchOptions& options) {
  std::vector<File> files;
  for (const GroupEntry& e : manifest.groups) {
    if (e.enabled) files.push_back({e.name, e.library});
  }
  return start(registry, std::move(files), std::move(callback), options);
}

Result<std::unique_ptr<PluginWatcher>> PluginWatcher::start(Registry& registry,
                                                            std::vector<File> files,
                                                            Callback callback,
                                                            const WatchOptions& options) {
  if (files.empty()) return Status(KREG_INVALID_ARGUMENT, "watch: no plugin libraries to watch");
  std::unique_ptr<PluginWatcher> w(new PluginWatcher(registry, std::move(callback), options));
  w->fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd_ < 0) {
    return Status(KREG_UNAVAILABLE, std::string("watch: inotify_init1: ") + std::strerror(errno));
  }
  for (File& f : files) {
    fs::path dir = f.library.parent_path();
    if (dir.empty()) dir = ".";
    const int wd = ::inotify_add_watch(w->fd_, dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO);
    if (wd < 0) {
      return Status(KREG_UNAVAILABLE, "watch: cannot watch " + dir.string() + " (group '" +
                                          f.group + "'): " + std::strerror(errno));
    }
    w->watches_.push_back({wd, f.library.filename().string(), std::move(f)});
  }
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

void PluginWatcher::run() {
  alignas(inotify_event) char buf[16 * 1024];
  while (!stop_.load(std::memory_order_acquire)) {
    pollfd pfd{fd_, POLLIN, 0};
    const int n = ::poll(&pfd, 1, options_.poll_timeout_ms);
    if (n <= 0 || !(pfd.revents & POLLIN)) continue;
    // Drain everything pending, then reload each changed group once.
    std::vector<const Watch*> changed;
    for (;;) {
      const ssize_t len = ::read(fd_, buf, sizeof buf);
      if (len <= 0) break;
      for (ssize_t off = 0; off < len;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->len == 0) continue;
        const std::string name(ev->name);
        for (const Watch& w : watches_) {
          if (w.wd != ev->wd || w.name != name) continue;
          bool seen = false;
          for (const Watch* c : changed) seen |= c == &w;
          if (!seen) changed.push_back(&w);
        }
      }
    }
    for (const Watch* w : changed) {
      if (stop_.load(std::memory_order_acquire)) break;
      handle(w->file);
    }
  }
}

void PluginWatcher::handle(const File& file) {
  const auto t0 = std::chrono::steady_clock::now();
  WatchEvent ev;
  ev.group = file.group;
  ev.file = file.library;
  // Wait for a stable file: the same size, times and inode across two stats
  // settle_interval_ms apart. stat only: opening a FIFO or reading a device could block.
  FileState last = file_state(file.library);
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.settle_interval_ms));
    const FileState now = file_state(file.library);
    if (now == last) break;
    last = now;
    if (std::chrono::steady_clock::now() - t0 >
        std::chrono::milliseconds(options_.settle_timeout_ms)) {
      break;  // reload anyway: an incomplete file is refused and retried on its next event
    }
  }
  auto r = registry_.reload(file.group, options_.reload);
  ev.latency_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (r.ok()) {
    ev.swapped = true;
    ev.report = std::move(r).value();
  } else {
    // Stopped mid-way: nothing was decided about this build, so nothing to report.
    if (stop_.load(std::memory_order_acquire)) return;
    ev.error = r.status();
  }
  if (callback_) callback_(ev);
}

}  // namespace kreg
