// The file store: one file per key in a shared directory (layout in store.hpp). set writes
// a temporary file and rename()s it over the value file, so a reader sees the old value or
// the new one, never part of one; add holds an flock() on the key's lock file while it
// reads and replaces the value; get polls with a backoff of 1 ms growing to 50 ms.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "store.hpp"

namespace kreg::comm {
namespace detail {

std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

bool check_key(std::string_view key, std::string* error) {
  if (key.empty()) {
    *error = "empty key";
    return false;
  }
  if (key.size() > kMaxStoreKeyBytes) {
    *error = "key of " + std::to_string(key.size()) + " bytes is longer than " +
             std::to_string(kMaxStoreKeyBytes);
    return false;
  }
  return true;
}

bool parse_int64(std::string_view text, int64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  size_t i = 0;
  const bool negative = text[0] == '-';
  if (negative) i = 1;
  if (i == text.size()) return false;
  // Accumulate as a negative number: its range holds INT64_MIN.
  int64_t v = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return false;
    const int d = c - '0';
    if (v < (INT64_MIN + d) / 10) return false;
    v = v * 10 - d;
  }
  if (!negative) {
    if (v == INT64_MIN) return false;
    v = -v;
  }
  *out = v;
  return true;
}

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;
using detail::quote_key;

std::string errno_text(int e) { return std::strerror(e); }
// A path for a message.
std::string ep(const std::string& path) { return detail::escape(path, 4096); }

// Closes a descriptor on every path out.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  bool set(std::string_view key, std::string_view value, std::string* error) override {
    if (!check(key, "set", error)) return false;
    if (value.size() > kMaxStoreValueBytes) {
      return fail(error, "set", key,
                  "value of " + std::to_string(value.size()) + " bytes is larger than " +
                      std::to_string(kMaxStoreValueBytes));
    }
    Paths p;
    if (!paths(key, /*create_dirs=*/true, &p, error, "set")) return false;
    return replace(key, p, value, error, "set");
  }

  bool get(std::string_view key, double timeout_s, std::string* value,
           std::string* error) override {
    if (!check(key, "get", error)) return false;
    if (!(timeout_s >= 0)) timeout_s = 0;  // NaN and negatives: look once
    Paths p;
    if (!paths(key, /*create_dirs=*/false, &p, error, "get")) return false;
    const auto start = Clock::now();
    const auto deadline = start + to_duration(timeout_s);
    auto backoff = std::chrono::milliseconds(1);
    while (true) {
      bool found = false;
      if (!read_value(key, p.value, &found, value, error, "get")) return false;
      if (found) return true;
      const auto now = Clock::now();
      if (now >= deadline) {
        return fail(error, "get", key, "timed out after " + detail::seconds_text(timeout_s));
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
    }
  }

  bool add(std::string_view key, int64_t delta, int64_t* result, std::string* error) override {
    if (!check(key, "add", error)) return false;
    Paths p;
    if (!paths(key, /*create_dirs=*/true, &p, error, "add")) return false;
    Fd lock(::open(p.lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (lock.fd < 0)
      return fail(error, "add", key, "cannot open " + ep(p.lock) + ": " + errno_text(errno));
    while (::flock(lock.fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        return fail(error, "add", key, "cannot lock " + ep(p.lock) + ": " + errno_text(errno));
      }
    }
    bool found = false;
    std::string current;
    if (!read_value(key, p.value, &found, &current, error, "add")) return false;
    int64_t v = 0;
    if (found && !detail::parse_int64(current, &v)) {
      return fail(error, "add", key,
                  "value '" + detail::escape(current, 32) + "' is not a decimal integer");
    }
    if (__builtin_add_overflow(v, delta, &v)) {
      return fail(error, "add", key, "adding " + std::to_string(delta) + " overflows");
    }
    if (!replace(key, p, std::to_string(v), error, "add")) return false;
    *result = v;
    return true;  // the lock goes with the descriptor
  }

  bool erase(std::string_view key, std::string* error) override {
    if (!check(key, "erase", error)) return false;
    Paths p;
    if (!paths(key, /*create_dirs=*/false, &p, error, "erase")) return false;
    if (::unlink(p.value.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
      return fail(error, "erase", key, "cannot remove " + ep(p.value) + ": " + errno_text(errno));
    }
    return true;
  }

  std::string url() const override { return "file://" + dir_; }

 private:
  struct Paths {
    std::string dir;    // the directory the key's files are in
    std::string value;  // dir/v<last chunk>
    std::string lock;   // dir/l<last chunk>
  };

  static Clock::duration to_duration(double s) {
    // A year is forever for a bootstrap; it keeps the conversion in range.
    if (s > 3.15e7) s = 3.15e7;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  bool fail(std::string* error, const char* op, std::string_view key, const std::string& what) {
    *error =
        "file store " + detail::escape(dir_, 512) + ": " + op + " " + quote_key(key) + ": " + what;
    return false;
  }

  bool check(std::string_view key, const char* op, std::string* error) {
    std::string why;
    if (detail::check_key(key, &why)) return true;
    *error = "file store " + detail::escape(dir_, 512) + ": " + op + ": " + why;
    return false;
  }

  // The key's paths; with create_dirs, the chunk directories of a long key are made.
  bool paths(std::string_view key, bool create_dirs, Paths* p, std::string* error, const char* op) {
    static constexpr char kHex[] = "0123456789abcdef";
    static constexpr size_t kChunk = 128;
    std::string hex;
    hex.reserve(key.size() * 2);
    for (char ch : key) {
      const auto c = static_cast<unsigned char>(ch);
      hex += kHex[c >> 4];
      hex += kHex[c & 15];
    }
    p->dir = dir_;
    size_t pos = 0;
    while (hex.size() - pos > kChunk) {
      p->dir += "/d" + hex.substr(pos, kChunk);
      pos += kChunk;
      if (create_dirs && ::mkdir(p->dir.c_str(), 0755) != 0 && errno != EEXIST) {
        return fail(error, op, key, "cannot create " + ep(p->dir) + ": " + errno_text(errno));
      }
    }
    const std::string last = hex.substr(pos);
    p->value = p->dir + "/v" + last;
    p->lock = p->dir + "/l" + last;
    return true;
  }

  // Reads a value file: absent is found = false; a file that is not regular (a FIFO, a
  // device, a directory, a symbolic link) or over the limit is an error. O_NONBLOCK so that
  // opening a FIFO does not wait for a writer.
  bool read_value(std::string_view key, const std::string& path, bool* found, std::string* value,
                  std::string* error, const char* op) {
    *found = false;
    Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW));
    if (fd.fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) return true;
      if (errno == ELOOP) return fail(error, op, key, ep(path) + " is a symbolic link");
      return fail(error, op, key, "cannot open " + ep(path) + ": " + errno_text(errno));
    }
    struct stat st;
    if (::fstat(fd.fd, &st) != 0) {
      return fail(error, op, key, "cannot stat " + ep(path) + ": " + errno_text(errno));
    }
    if (!S_ISREG(st.st_mode)) return fail(error, op, key, ep(path) + " is not a regular file");
    if (static_cast<uint64_t>(st.st_size) > kMaxStoreValueBytes) {
      return fail(error, op, key,
                  path + " holds " + std::to_string(st.st_size) + " bytes, more than " +
                      std::to_string(kMaxStoreValueBytes));
    }
    // A value file is never written in place (set renames a new one over it), so its size
    // is final; read one byte past it to be sure.
    value->resize(static_cast<size_t>(st.st_size) + 1);
    size_t got = 0;
    while (got < value->size()) {
      const ssize_t n = ::read(fd.fd, value->data() + got, value->size() - got);
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail(error, op, key, "cannot read " + ep(path) + ": " + errno_text(errno));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != static_cast<size_t>(st.st_size)) {
      return fail(error, op, key, ep(path) + " changed size while being read");
    }
    value->resize(got);
    *found = true;
    return true;
  }

  // Writes value to a temporary file beside the value file and renames it over.
  bool replace(std::string_view key, const Paths& p, std::string_view value, std::string* error,
               const char* op) {
    static std::atomic<uint64_t> counter{0};
    const std::string tmp = p.dir + "/.t" + std::to_string(::getpid()) + "-" +
                            std::to_string(counter.fetch_add(1)) + "-" +
                            std::to_string(Clock::now().time_since_epoch().count());
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (fd.fd < 0)
      return fail(error, op, key, "cannot create " + ep(tmp) + ": " + errno_text(errno));
    if (!write_all(fd.fd, value)) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return fail(error, op, key, "cannot write " + ep(tmp) + ": " + errno_text(e));
    }
    if (::close(fd.fd) != 0) {
      fd.fd = -1;
      const int e = errno;
      ::unlink(tmp.c_str());
      return fail(error, op, key, "cannot write " + ep(tmp) + ": " + errno_text(e));
    }
    fd.fd = -1;
    if (::rename(tmp.c_str(), p.value.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return fail(error, op, key,
                  "cannot rename " + ep(tmp) + " to " + ep(p.value) + ": " + errno_text(e));
    }
    return true;
  }

  std::string dir_;
};

}  // namespace

namespace detail {

std::unique_ptr<Store> open_file_store(const std::string& dir, std::string* error) {
  if (dir.empty() || dir[0] != '/') {
    *error = "file store " + escape(dir, 512) + ": the directory must be an absolute path";
    return nullptr;
  }
  // Drop trailing slashes (but keep "/"), then make every missing component.
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  for (size_t pos = 1; pos <= d.size(); ++pos) {
    if (pos != d.size() && d[pos] != '/') continue;
    const std::string prefix = d.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "file store " + escape(d, 512) + ": cannot create " + escape(prefix, 512) + ": " +
               errno_text(errno);
      return nullptr;
    }
  }
  struct stat st;
  if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "file store " + escape(d, 512) + ": not a directory";
    return nullptr;
  }
  return std::make_unique<FileStore>(d);
}

}  // namespace detail
}  // namespace kreg::comm
