#include "kreg/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kreg {

std::string file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
  }
  return "not a regular file";
}

Result<RegularFile> RegularFile::open(const std::filesystem::path& path, std::string_view what,
                                      uint64_t max_bytes) {
  const std::string name = std::string(what) + " " + path.string();
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
  // does not affect reads of a regular file, the only kind accepted below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
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
    return Status(KREG_INVALID_ARGUMENT, "the " + name + " is " + file_kind(st.st_mode) +
                                             ", not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return Status(KREG_RESOURCE_EXHAUSTED, "the " + name + " is " + std::to_string(size) +
                                               " bytes; the limit for a " + std::string(what) +
                                               " is " + std::to_string(max_bytes) + " bytes");
  }
  return RegularFile(fd, size, path, std::string(what));
}

RegularFile::RegularFile(RegularFile&& o) noexcept
    : fd_(o.fd_), size_(o.size_), path_(std::move(o.path_)), what_(std::move(o.what_)) {
  o.fd_ = -1;
}

RegularFile& RegularFile::operator=(RegularFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    o.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::string> RegularFile::read_all() const {
  const std::string name = what_ + " " + path_.string();
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

}  // namespace kreg
