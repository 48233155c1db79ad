#include "kreg/plugin_watcher.hpp"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <system_error>

namespace kreg {

namespace fs = std::filesystem;

PluginWatcher::PluginWatcher(Registry& registry, Callback callback, const WatchOptions& options)
    : registry_(registry), callback_(std::move(callback)), options_(options) {}

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
  // Wait for a stable size: the same across two stats settle_interval_ms apart.
  std::error_code ec;
  uintmax_t size = fs::file_size(file.library, ec);
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.settle_interval_ms));
    const uintmax_t now = fs::file_size(file.library, ec);
    if (!ec && now == size) break;
    size = now;
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
    ev.error = r.status();
  }
  if (callback_) callback_(ev);
}

}  // namespace kreg
