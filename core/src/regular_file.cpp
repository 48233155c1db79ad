#include "kreg/regular_file.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>

#include "kreg/sha256.hpp"
#include "kreg/text.hpp"

namespace kreg {

namespace fs = std::filesystem;

namespace {

int64_t nanoseconds(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace

std::string file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a FIFO (named pipe)";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
  }
  return "not a regular file";
}

Result<RegularFile> RegularFile::open(const std::filesystem::path& path, std::string_view what,
                                      uint64_t max_bytes) {
  const std::string name = std::string(what) + " " + escape_control(path.string());
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
  // does not affect reads of a regular file, the only kind accepted below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    // A socket cannot be opened at all (ENXIO); say what it is rather than the errno.
    struct stat st {};
    if (err != ENOENT && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return Status(KREG_INVALID_ARGUMENT,
                    "the " + name + " is " + file_kind(st.st_mode) + ", not a regular file");
    }
    const kreg_status_code code = err == ENOENT || err == ENOTDIR ? KREG_NOT_FOUND
                                  : err == EACCES || err == EPERM ? KREG_PERMISSION_DENIED
                                                                  : KREG_INVALID_ARGUMENT;
    return Status(code, "cannot open the " + name + ": " +
                            (err == ENOENT ? std::string("no such file") : std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status(KREG_INVALID_ARGUMENT, "cannot stat the " + name + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(KREG_INVALID_ARGUMENT,
                  "the " + name + " is " + file_kind(st.st_mode) + ", not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return Status(KREG_RESOURCE_EXHAUSTED, "the " + name + " is " + std::to_string(size) +
                                               " bytes; the limit for a " + std::string(what) +
                                               " is " + std::to_string(max_bytes) + " bytes");
  }
  RegularFile file(fd, path, std::string(what));
  file.size_ = size;
  file.mode_ = st.st_mode;
  file.uid_ = st.st_uid;
  file.dev_ = st.st_dev;
  file.ino_ = st.st_ino;
  file.mtime_ns_ = nanoseconds(st.st_mtim);
  file.ctime_ns_ = nanoseconds(st.st_ctim);
  return file;
}

RegularFile::RegularFile(RegularFile&& o) noexcept
    : fd_(o.fd_),
      size_(o.size_),
      mode_(o.mode_),
      uid_(o.uid_),
      dev_(o.dev_),
      ino_(o.ino_),
      mtime_ns_(o.mtime_ns_),
      ctime_ns_(o.ctime_ns_),
      path_(std::move(o.path_)),
      what_(std::move(o.what_)) {
  o.fd_ = -1;
}

RegularFile& RegularFile::operator=(RegularFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    size_ = o.size_;
    mode_ = o.mode_;
    uid_ = o.uid_;
    dev_ = o.dev_;
    ino_ = o.ino_;
    mtime_ns_ = o.mtime_ns_;
    ctime_ns_ = o.ctime_ns_;
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    o.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RegularFile::unchanged_since_open() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    return Status(KREG_DATA_LOSS, "cannot stat the " + what_ + " " +
                                      escape_control(path_.string()) +
                                      " again: " + std::strerror(errno));
  }
  if (static_cast<uint64_t>(st.st_size) != size_ || nanoseconds(st.st_mtim) != mtime_ns_ ||
      nanoseconds(st.st_ctim) != ctime_ns_) {
    return Status(KREG_DATA_LOSS, "the " + what_ + " " + escape_control(path_.string()) +
                                      " changed while it was being read (" + std::to_string(size_) +
                                      " bytes when opened, " + std::to_string(st.st_size) +
                                      " now; is something still writing it?)");
  }
  return OkStatus();
}

Result<std::string> RegularFile::read_all() const {
  const std::string name = what_ + " " + escape_control(path_.string());
  std::string out(size_, '\0');
  uint64_t done = 0;
  while (done < size_) {
    const ssize_t n = ::pread(fd_, out.data() + done, size_ - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(KREG_DATA_LOSS, "read error in the " + name + ": " + std::strerror(errno));
    }
    if (n == 0) {
      return Status(KREG_DATA_LOSS, "the " + name + " shrank while being read (" +
                                        std::to_string(done) + " of " + std::to_string(size_) +
                                        " bytes; is something still writing it?)");
    }
    done += static_cast<uint64_t>(n);
  }
  char extra;
  ssize_t n;
  do {
    n = ::pread(fd_, &extra, 1, static_cast<off_t>(size_));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    return Status(KREG_DATA_LOSS, "the " + name + " grew while being read (past " +
                                      std::to_string(size_) +
                                      " bytes; is something still writing it?)");
  }
  return out;
}

Result<std::string> read_regular_file(const std::filesystem::path& path, std::string_view what,
                                      uint64_t max_bytes) {
  auto file = RegularFile::open(path, what, max_bytes);
  if (!file) return file.status();
  return file->read_all();
}

// ---- private copies ----

namespace {

// The folder of private copies. Its destructor runs at exit, when it is empty: every copy
// is unlinked as soon as it has been mapped (or refused).
struct PrivateDir {
  std::mutex mu;
  fs::path path;
  ~PrivateDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
};

Status write_all(int fd, const char* p, size_t n, const fs::path& to) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return Status(KREG_RESOURCE_EXHAUSTED, "cannot write the private copy " +
                                                 escape_control(to.string()) + ": " +
                                                 std::strerror(w < 0 ? errno : EIO));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

}  // namespace

Result<fs::path> private_folder() {
  static PrivateDir dir;
  std::lock_guard lock(dir.mu);
  if (!dir.path.empty()) return dir.path;
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string templ = (base / ("kreg-" + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) {
    return Status(KREG_UNAVAILABLE, "cannot create a private folder for plugin copies in " +
                                        escape_control(base.string()) + ": " +
                                        std::strerror(errno) + " (set TMPDIR to another folder)");
  }
  dir.path = templ;
  return dir.path;
}

PrivateCopy::PrivateCopy(PrivateCopy&& o) noexcept
    : path_(std::move(o.path_)), size_(o.size_), sha256_(std::move(o.sha256_)) {
  o.path_.clear();
}

PrivateCopy& PrivateCopy::operator=(PrivateCopy&& o) noexcept {
  if (this != &o) {
    if (!path_.empty()) ::unlink(path_.c_str());
    path_ = std::move(o.path_);
    size_ = o.size_;
    sha256_ = std::move(o.sha256_);
    o.path_.clear();
  }
  return *this;
}

PrivateCopy::~PrivateCopy() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

Result<PrivateCopy> copy_to_private(const RegularFile& src, std::string_view name, bool hash) {
  static std::atomic<uint64_t> counter{0};
  auto dir = private_folder();
  if (!dir) return dir.status();
  const fs::path to =
      *dir / (std::string(name) + "." + std::to_string(counter.fetch_add(1)) + ".so");
  const std::string from = "the " + src.what() + " " + escape_control(src.path().string());
  // O_EXCL in a folder only we can write: nothing else can be at this path, or be linked
  // there later. Executable, because dlopen maps it.
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0700);
  if (out < 0) {
    return Status(KREG_UNAVAILABLE, "cannot create a private copy of " + from + " at " +
                                        escape_control(to.string()) + ": " + std::strerror(errno));
  }
  PrivateCopy copy(to, src.size(), "");  // unlinks the file on every error below
  struct Close {
    int fd;
    ~Close() {
      if (fd >= 0) ::close(fd);
    }
  } closer{out};
  const uint64_t size = src.size();
  Sha256 h;
  // In-kernel copying when there is nothing to hash; the fallback (and the hashing path)
  // reads 1 MiB at a time.
  bool kernel_copy = !hash;
  std::unique_ptr<char[]> buf;
  constexpr size_t kChunk = size_t{1} << 20;
  uint64_t done = 0;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - done, kChunk));
    if (kernel_copy) {
      loff_t off = static_cast<loff_t>(done);
      const ssize_t n = ::copy_file_range(src.fd(), &off, out, nullptr, want, 0);
      if (n > 0) {
        done += static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP &&
          errno != EPERM) {
        return Status(KREG_DATA_LOSS,
                      "cannot copy " + from + " to a private copy: " + std::strerror(errno));
      }
      if (n == 0) {
        return Status(KREG_DATA_LOSS, from + " shrank while being copied (" + std::to_string(done) +
                                          " of " + std::to_string(size) +
                                          " bytes; is something still writing it?)");
      }
      kernel_copy = false;  // not supported here: copy through a buffer from `done` on
    }
    if (!buf) buf.reset(new char[kChunk]);
    const ssize_t n = ::pread(src.fd(), buf.get(), want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status(KREG_DATA_LOSS, "read error in " + from + ": " + std::strerror(errno));
    }
    if (n == 0) {
      return Status(KREG_DATA_LOSS, from + " shrank while being copied (" + std::to_string(done) +
                                        " of " + std::to_string(size) +
                                        " bytes; is something still writing it?)");
    }
    if (hash) h.update(buf.get(), static_cast<size_t>(n));
    if (Status st = write_all(out, buf.get(), static_cast<size_t>(n), to); !st.ok()) return st;
    done += static_cast<uint64_t>(n);
  }
  char extra;
  ssize_t n;
  do {
    n = ::pread(src.fd(), &extra, 1, static_cast<off_t>(size));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    return Status(KREG_DATA_LOSS, from + " grew while being copied (past " + std::to_string(size) +
                                      " bytes; is something still writing it?)");
  }
  // Same size but rewritten in place while we copied: the copy may mix two builds.
  if (Status st = src.unchanged_since_open(); !st.ok()) return st;
  closer.fd = -1;
  if (::close(out) != 0) {
    return Status(KREG_RESOURCE_EXHAUSTED, "cannot write the private copy " +
                                               escape_control(to.string()) + ": " +
                                               std::strerror(errno));
  }
  if (hash) copy.sha256_ = Sha256::hex(h.finish());
  return Result<PrivateCopy>(std::move(copy));
}

}  // namespace kreg
