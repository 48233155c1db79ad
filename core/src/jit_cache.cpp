#include "kreg/jit_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <system_error>

#include "kreg/regular_file.hpp"
#include "kreg/text.hpp"

namespace kreg::jit {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'R', 'E', 'G', 'J', 'I', 'T', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr std::string_view kFormatDir = "v1";
constexpr std::string_view kEntrySuffix = ".kjit";
constexpr std::string_view kLockSuffix = ".lock";
constexpr std::string_view kTempSuffix = ".tmp";
constexpr size_t kKeyChars = 64;
// Magic, version, four length-prefixed fields (the key's and three meta fields), payload
// size, checksum: the most a valid entry holds besides its payload.
constexpr uint64_t kMaxHeaderBytes = 8 + 4 + 4 * (4 + kMaxMetaBytes) + 8 + 32;
constexpr uint64_t kMaxEntryBytes = kMaxHeaderBytes + kMaxImageBytes;

std::string quoted(const fs::path& p) { return escape_control(p.string()); }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_field(std::string& out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

// Reads back what put_* wrote; every read checks that the bytes are there.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : b_(bytes) {}
  bool u32(uint32_t& v) {
    if (b_.size() - pos_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(b_[pos_ + i])} << (8 * i);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t& v) {
    if (b_.size() - pos_ < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(b_[pos_ + i])} << (8 * i);
    pos_ += 8;
    return true;
  }
  bool bytes(uint64_t n, std::string_view& out) {
    if (b_.size() - pos_ < n) return false;
    out = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

// The entry file's bytes for `image` (see the header comment for the format).
std::string encode_entry(std::string_view key, const EntryMeta& meta, std::string_view image) {
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kFormatVersion);
  put_field(out, key);
  put_field(out, meta.op);
  put_field(out, meta.specialization);
  put_field(out, meta.arch);
  put_u64(out, image.size());
  Sha256 sha;
  sha.update(out);
  sha.update(image);
  const Sha256::Digest digest = sha.finish();
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  out.append(image);
  return out;
}

// An entry read from its file: valid (image and meta set), missing, or invalid (`problem`
// says what is wrong and names the file).
struct ReadEntry {
  enum Kind { kValid, kMissing, kInvalid } kind = kMissing;
  std::string image;
  EntryMeta meta;
  std::string problem;
};

// Why `bytes` is not a valid entry for `key`, or "" when it is (then meta and the
// payload's offset are set).
std::string check_entry(std::string_view bytes, std::string_view key, EntryMeta& meta,
                        size_t& payload_at) {
  Reader r(bytes);
  std::string_view magic;
  if (!r.bytes(sizeof kMagic, magic) || magic != std::string_view(kMagic, sizeof kMagic)) {
    return "not a kreg JIT cache entry (bad magic)";
  }
  uint32_t version = 0;
  if (!r.u32(version)) return "truncated in its header";
  if (version != kFormatVersion) {
    return "entry format version " + std::to_string(version) + ", expected " +
           std::to_string(kFormatVersion);
  }
  const char* names[4] = {"key", "op", "specialization", "arch"};
  std::string_view fields[4];
  for (int i = 0; i < 4; ++i) {
    uint32_t n = 0;
    if (!r.u32(n)) return "truncated in its header";
    if (n > kMaxMetaBytes) {
      return std::string("its ") + names[i] + " field is " + std::to_string(n) +
             " bytes; the limit is " + std::to_string(kMaxMetaBytes);
    }
    if (!r.bytes(n, fields[i])) return "truncated in its header";
  }
  if (fields[0] != key) {
    return "it holds the entry for key \"" + excerpt(fields[0]) + "\", not its file name's";
  }
  uint64_t size = 0;
  std::string_view stored;
  if (!r.u64(size) || !r.bytes(32, stored)) return "truncated in its header";
  if (size > kMaxImageBytes) {
    return "its payload size is " + std::to_string(size) + " bytes; the limit is " +
           std::to_string(kMaxImageBytes);
  }
  const size_t header = r.pos();
  if (bytes.size() - header != size) {
    return (bytes.size() - header < size ? "truncated: " : "longer than its header says: ") +
           std::to_string(bytes.size()) + " bytes, the header says " +
           std::to_string(header + size);
  }
  Sha256 sha;
  sha.update(bytes.substr(0, header - 32));
  sha.update(bytes.substr(header));
  const Sha256::Digest digest = sha.finish();
  if (stored != std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size())) {
    return "checksum mismatch (its bytes changed after they were written)";
  }
  meta.op = fields[1];
  meta.specialization = fields[2];
  meta.arch = fields[3];
  payload_at = header;
  return "";
}

ReadEntry read_entry(const fs::path& path, std::string_view key) {
  ReadEntry out;
  // One descriptor, fstat-checked: a FIFO, a device, a directory or a huge file there is
  // refused without blocking or reading it.
  auto bytes = read_regular_file(path, "JIT cache entry", kMaxEntryBytes);
  if (!bytes) {
    if (bytes.status().code() == KREG_NOT_FOUND) return out;  // a miss
    out.kind = ReadEntry::kInvalid;
    out.problem = bytes.status().message();
    return out;
  }
  size_t payload_at = 0;
  const std::string why = check_entry(*bytes, key, out.meta, payload_at);
  if (!why.empty()) {
    out.kind = ReadEntry::kInvalid;
    out.meta = {};
    out.problem = "the JIT cache entry " + quoted(path) + " is invalid: " + why;
    return out;
  }
  out.kind = ReadEntry::kValid;
  out.image = std::move(bytes.value());
  out.image.erase(0, payload_at);
  return out;
}

// A descriptor closed when it goes out of scope (the lock is released with it).
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens (creating it) and flocks the lock file at `path`: 0 and `out` set, or the errno
// (EWOULDBLOCK when `wait` is false and another holds it). When the file was unlinked or
// replaced (clear()) between our open and our flock, the lock we got protects nothing:
// lock the file now at the path instead, so that two holders never hold different files.
int lock_exclusive(const fs::path& path, bool wait, Fd& out) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0644));
    if (fd.fd < 0) return errno;
    int r;
    do {
      r = ::flock(fd.fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB);
    } while (r != 0 && errno == EINTR);
    if (r != 0) return errno;
    struct stat held {
    }, now{};
    if (::fstat(fd.fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 &&
        held.st_dev == now.st_dev && held.st_ino == now.st_ino) {
      std::swap(out.fd, fd.fd);
      return 0;
    }
  }
  return EAGAIN;
}

// Creates `dir` and its missing parents, each with mode 0700 (a cache holds code this user
// will run: nobody else should write it). "" or why not, naming the folder.
std::string make_dirs(const fs::path& dir) {
  fs::path cur;
  for (const fs::path& part : dir) {
    cur /= part;
    if (part.empty()) continue;  // a trailing separator
    struct stat st {};
    if (::stat(cur.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      return quoted(cur) + " is " + file_kind(st.st_mode) + ", not a directory";
    }
    if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST) {
      return "cannot create " + quoted(cur) + ": " + std::strerror(errno);
    }
  }
  return "";
}

std::string random_hex() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    static std::atomic<uint64_t> counter{0};
    r = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (counter.fetch_add(1) << 48);
  }
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) s.push_back(digits[(r >> (4 * i)) & 0xf]);
  return s;
}

Status write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status(KREG_UNAVAILABLE, std::strerror(w < 0 ? errno : EIO));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

// Writes `bytes` to a fresh temporary in `folder`, fsyncs it and renames it over `final`:
// a reader sees the old entry or the new one, never part of one. "" or why not.
std::string publish(const fs::path& folder, std::string_view key, std::string_view bytes,
                    const fs::path& final_path) {
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    tmp = folder / ("." + std::string(key) + "." + std::to_string(::getpid()) + "." + random_hex() +
                    std::string(kTempSuffix));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return "cannot create " + quoted(tmp) + ": " + std::strerror(errno);
  struct Unlink {
    const fs::path& p;
    bool armed = true;
    ~Unlink() {
      if (armed) ::unlink(p.c_str());
    }
  } cleanup{tmp};
  Status st = write_all(fd, bytes);
  if (st.ok() && ::fsync(fd) != 0) st = Status(KREG_UNAVAILABLE, std::strerror(errno));
  if (::close(fd) != 0 && st.ok()) st = Status(KREG_UNAVAILABLE, std::strerror(errno));
  if (!st.ok()) return "cannot write " + quoted(tmp) + ": " + st.message();
  // rename replaces any file but a directory; an invalid entry may be one.
  struct stat old {};
  if (::lstat(final_path.c_str(), &old) == 0 && S_ISDIR(old.st_mode)) {
    std::error_code ec;
    fs::remove_all(final_path, ec);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return "cannot rename " + quoted(tmp) + " to " + quoted(final_path) + ": " +
           std::strerror(errno);
  }
  cleanup.armed = false;
  // The rename itself is durable once the folder is synced; a failure here loses nothing
  // but durability, so it is not reported.
  const int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return "";
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += "; ";
    out += p;
  }
  return out;
}

kreg_status_code errno_code(int err) {
  return err == EACCES || err == EPERM || err == EROFS ? KREG_PERMISSION_DENIED : KREG_UNAVAILABLE;
}

}  // namespace

// ---- keys ----

KeyBuilder& KeyBuilder::add(std::string_view field, std::string_view value) {
  for (std::string_view s : {field, value}) {
    std::string len;
    put_u64(len, s.size());
    sha_.update(len);
    sha_.update(s);
  }
  return *this;
}

std::string KeyBuilder::hex() const {
  Sha256 copy = sha_;  // finish() consumes the state; the builder may be added to later
  return Sha256::hex(copy.finish());
}

Status check_key(std::string_view key) {
  const bool ok = key.size() == kKeyChars && std::all_of(key.begin(), key.end(), [](char c) {
                    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                  });
  if (ok) return OkStatus();
  return Status(KREG_INVALID_ARGUMENT,
                "invalid JIT cache key \"" + excerpt(key) + "\": a key is 64 lowercase hex digits");
}

// ---- the cache ----

Result<fs::path> Cache::default_dir() {
  struct Choice {
    const char* var;
    const char* suffix;
  };
  for (const Choice& c : {Choice{"KREG_JIT_CACHE", ""}, Choice{"XDG_CACHE_HOME", "kreg/jit"},
                          Choice{"HOME", ".cache/kreg/jit"}}) {
    const char* v = std::getenv(c.var);
    if (v == nullptr || *v == '\0') continue;
    const fs::path p(v);
    if (!p.is_absolute()) {
      return Status(KREG_INVALID_ARGUMENT, std::string(c.var) + " is a relative path (\"" +
                                               excerpt(v) +
                                               "\"); the JIT cache directory must be absolute");
    }
    return *c.suffix ? p / c.suffix : p;
  }
  return Status(KREG_FAILED_PRECONDITION,
                "no JIT cache directory: set KREG_JIT_CACHE, XDG_CACHE_HOME or HOME");
}

Cache::Cache(fs::path dir) : dir_(std::move(dir)), entries_(dir_ / kFormatDir) {}

Cache::Cache(Cache&& o) noexcept
    : dir_(std::move(o.dir_)),
      entries_(std::move(o.entries_)),
      noted_unwritable_(o.noted_unwritable_.load()) {}

Result<fs::path> Cache::entry_path(std::string_view key) const {
  if (Status st = check_key(key); !st.ok()) return st;
  return entries_ / (std::string(key) + std::string(kEntrySuffix));
}

std::optional<std::string> Cache::lookup(std::string_view key) const {
  auto path = entry_path(key);
  if (!path) return std::nullopt;
  ReadEntry e = read_entry(*path, key);
  if (e.kind != ReadEntry::kValid) return std::nullopt;
  return std::move(e.image);
}

Result<Fetched> Cache::get_or_build(std::string_view key, const EntryMeta& meta,
                                    const std::function<Status(std::string& image)>& build) {
  auto path = entry_path(key);
  if (!path) return path.status();
  const std::pair<const char*, const std::string*> fields[] = {
      {"op", &meta.op}, {"specialization", &meta.specialization}, {"arch", &meta.arch}};
  for (const auto& [name, value] : fields) {
    if (value->size() > kMaxMetaBytes) {
      return Status(KREG_INVALID_ARGUMENT, std::string("the JIT cache entry's ") + name + " is " +
                                               std::to_string(value->size()) +
                                               " bytes; the limit is " +
                                               std::to_string(kMaxMetaBytes));
    }
  }
  // The common case, without a lock: entries appear only by rename, whole.
  ReadEntry found = read_entry(*path, key);
  if (found.kind == ReadEntry::kValid) return Fetched{std::move(found.image), false, ""};

  std::string unwritable = make_dirs(entries_);
  Fd lock;
  if (unwritable.empty()) {
    const fs::path lock_path = entries_ / (std::string(key) + std::string(kLockSuffix));
    if (const int err = lock_exclusive(lock_path, /*wait=*/true, lock); err != 0) {
      unwritable = "cannot lock " + quoted(lock_path) + ": " + std::strerror(err);
    }
  }
  Fetched out;
  out.compiled = true;
  if (!unwritable.empty()) {
    // Said once per Cache: a read-only cache is a setting, not news on every compile. An
    // invalid entry that cannot be replaced is part of that one notice.
    if (!noted_unwritable_.exchange(true)) {
      out.note = join({found.kind == ReadEntry::kInvalid ? found.problem : "",
                       "the JIT cache directory " + quoted(dir_) + " is not writable (" +
                           unwritable + "): compiled in memory"});
    }
    if (Status st = build(out.image); !st.ok()) return st;
    return out;
  }
  // Another process may have published while we waited for the lock.
  ReadEntry again = read_entry(*path, key);
  if (again.kind == ReadEntry::kValid) return Fetched{std::move(again.image), false, ""};
  if (Status st = build(out.image); !st.ok()) return st;
  std::vector<std::string> notes;
  if (again.kind == ReadEntry::kInvalid) notes.push_back(again.problem + "; rebuilt it");
  if (out.image.size() > kMaxImageBytes) {
    notes.push_back("the compiled image is " + std::to_string(out.image.size()) +
                    " bytes, over the JIT cache's limit of " + std::to_string(kMaxImageBytes) +
                    ": not stored");
  } else if (std::string why = publish(entries_, key, encode_entry(key, meta, out.image), *path);
             !why.empty()) {
    notes.push_back("cannot store the JIT cache entry " + quoted(*path) + " (" + why +
                    "): compiled in memory");
  }
  out.note = join(notes);
  return out;
}

Result<std::vector<EntryInfo>> Cache::list() const {
  std::vector<EntryInfo> out;
  std::error_code ec;
  fs::directory_iterator it(entries_, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!ends_with(name, kEntrySuffix)) continue;
    const std::string key = name.substr(0, name.size() - kEntrySuffix.size());
    if (!check_key(key).ok()) continue;
    ReadEntry e = read_entry(it->path(), key);
    if (e.kind == ReadEntry::kMissing) continue;  // removed since the listing
    EntryInfo info;
    info.key = key;
    std::error_code time_ec;
    info.mtime = fs::last_write_time(it->path(), time_ec);
    if (e.kind == ReadEntry::kValid) {
      info.meta = std::move(e.meta);
      info.size = e.image.size();
    } else {
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) == 0) info.size = static_cast<uint64_t>(st.st_size);
      info.problem = std::move(e.problem);
    }
    out.push_back(std::move(info));
  }
  if (ec) {
    return Status(errno_code(ec.value()),
                  "cannot list the JIT cache directory " + quoted(entries_) + ": " + ec.message());
  }
  std::sort(out.begin(), out.end(),
            [](const EntryInfo& a, const EntryInfo& b) { return a.key < b.key; });
  return out;
}

Result<uint64_t> Cache::clear() {
  std::error_code ec;
  fs::directory_iterator it(entries_, ec);
  if (ec == std::errc::no_such_file_or_directory) return uint64_t{0};
  // Names first, removal after: removing while iterating may skip names.
  std::vector<std::string> names;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) {
    return Status(errno_code(ec.value()),
                  "cannot list the JIT cache directory " + quoted(entries_) + ": " + ec.message());
  }
  auto cannot_remove = [](const fs::path& p, int err) {
    return Status(errno_code(err), "cannot remove " + quoted(p) + ": " + std::strerror(err));
  };
  uint64_t removed = 0;
  std::set<std::string> lock_keys;
  std::map<std::string, std::vector<fs::path>> temps;
  for (const std::string& name : names) {
    const fs::path p = entries_ / name;
    if (ends_with(name, kEntrySuffix) &&
        check_key(name.substr(0, name.size() - kEntrySuffix.size())).ok()) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        std::error_code rec;
        fs::remove_all(p, rec);
        if (rec) return cannot_remove(p, rec.value());
      } else if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
        return cannot_remove(p, errno);
      }
      ++removed;
    } else if (ends_with(name, kLockSuffix) &&
               check_key(name.substr(0, name.size() - kLockSuffix.size())).ok()) {
      lock_keys.insert(name.substr(0, kKeyChars));
    } else if (name.size() > 1 + kKeyChars + 1 && name[0] == '.' && name[1 + kKeyChars] == '.' &&
               ends_with(name, kTempSuffix) && check_key(name.substr(1, kKeyChars)).ok()) {
      temps[name.substr(1, kKeyChars)].push_back(p);
    }
  }
  for (const auto& [key, paths] : temps) lock_keys.insert(key);
  for (const std::string& key : lock_keys) {
    // A temporary exists only while its key's lock is held, or after a crash: remove it,
    // and the lock file, only when nobody holds the lock.
    const fs::path lock_path = entries_ / (key + std::string(kLockSuffix));
    Fd lock;
    const int err = lock_exclusive(lock_path, /*wait=*/false, lock);
    if (err == EWOULDBLOCK) continue;
    if (err != 0) {
      return Status(errno_code(err),
                    "cannot lock " + quoted(lock_path) + ": " + std::strerror(err));
    }
    if (auto t = temps.find(key); t != temps.end()) {
      for (const fs::path& p : t->second) {
        if (::unlink(p.c_str()) != 0 && errno != ENOENT) return cannot_remove(p, errno);
      }
    }
    // Unlinked while held: a process waiting on this file sees it is gone once it gets the
    // lock, and locks a new one (lock_exclusive).
    if (::unlink(lock_path.c_str()) != 0 && errno != ENOENT) return cannot_remove(lock_path, errno);
  }
  return removed;
}

}  // namespace kreg::jit
