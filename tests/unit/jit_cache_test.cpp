// The JIT cache (kreg/jit_cache.hpp): keys, hits, many processes on one empty cache,
// invalid entries, moved and read-only directories, listing and clearing.
#include "kreg/jit_cache.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
using kreg::Status;
using kreg::jit::Cache;
using kreg::jit::EntryMeta;
using kreg::jit::KeyBuilder;
using kreg::test::read_file;
using kreg::test::Scratch;

std::string key_of(std::string_view what) { return KeyBuilder().add("test", what).hex(); }

// An image with bytes a text-only path would lose.
std::string image_for(std::string_view what) {
  std::string s = "image of ";
  s += what;
  s += std::string("\0\xff\x01\n", 4);
  for (int i = 0; i < 64; ++i) s.push_back(static_cast<char>(i * 7));
  return s;
}

// A build that counts its calls and produces image_for(what).
struct CountingBuild {
  std::string what;
  int calls = 0;
  std::function<Status(std::string&)> fn() {
    return [this](std::string& image) {
      ++calls;
      image = image_for(what);
      return Status();
    };
  }
};

void write_file(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- keys ----

TEST(JitKey, KnownDigest) {
  // Computed independently: python3 -c "import hashlib,struct; print(hashlib.sha256(
  //   b''.join(struct.pack('<Q',len(s))+s for s in [b'op',b'add',b'arch',b'sm_90'])).hexdigest())"
  EXPECT_EQ(KeyBuilder().add("op", "add").add("arch", "sm_90").hex(),
            "a40c71069467355901c3d73bc32dff24da82d279769ba358905307ecb48f4ac2");
  EXPECT_EQ(KeyBuilder().hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(JitKey, OrderAndBoundarySensitiveAndStable) {
  auto k = [](std::vector<std::pair<std::string, std::string>> pairs) {
    KeyBuilder b;
    for (const auto& [f, v] : pairs) b.add(f, v);
    return b.hex();
  };
  const std::string base = k({{"ab", "c"}});
  EXPECT_EQ(base, k({{"ab", "c"}}));                                    // stable across builders
  EXPECT_NE(base, k({{"a", "bc"}}));                                    // the field/value boundary
  EXPECT_NE(k({{"a", "b"}, {"c", "d"}}), k({{"c", "d"}, {"a", "b"}}));  // order
  EXPECT_NE(k({{"a", "b"}}), k({{"b", "a"}}));                          // field vs value
  EXPECT_NE(k({{"a", "b"}, {"c", "d"}}), k({{"a", "bc"}, {"", "d"}}));  // pair boundaries
  EXPECT_NE(k({{"a", ""}}), k({}));
  EXPECT_NE(k({{"a", ""}}), k({{"a", ""}, {"", ""}}));
  EXPECT_NE(k({{"src", std::string("x\0y", 3)}}), k({{"src", "x"}}));  // NULs are data

  KeyBuilder b;
  b.add("source", "__global__ void k() {}");
  const std::string first = b.hex();
  EXPECT_EQ(first, b.hex());  // hex() leaves the builder as it was
  b.add("arch", "sm_90");
  EXPECT_NE(first, b.hex());
  EXPECT_EQ(b.hex(),
            KeyBuilder().add("source", "__global__ void k() {}").add("arch", "sm_90").hex());
  EXPECT_TRUE(kreg::jit::check_key(b.hex()).ok());
}

TEST(JitKey, InvalidKeysAreRefused) {
  Scratch tmp;
  Cache cache(tmp.root() / "cache");
  const std::string good = key_of("x");
  std::string upper = good;
  upper[0] = 'A';
  const std::vector<std::string> bad = {"",
                                        good.substr(0, 63),
                                        good + "0",
                                        upper,
                                        "../../../../etc/passwd" + good.substr(22),
                                        good.substr(0, 60) + ".lck",
                                        good.substr(0, 63) + std::string(1, '\0'),
                                        good.substr(0, 63) + "g"};
  for (const std::string& key : bad) {
    SCOPED_TRACE(key);
    const Status st = kreg::jit::check_key(key);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find("64 lowercase hex digits"), std::string::npos) << st.message();
    int calls = 0;
    auto r = cache.get_or_build(key, {}, [&](std::string&) {
      ++calls;
      return Status();
    });
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), KREG_INVALID_ARGUMENT);
    EXPECT_EQ(calls, 0);
    EXPECT_FALSE(cache.lookup(key).has_value());
    EXPECT_FALSE(cache.entry_path(key).ok());
  }
  // The message names the key, escaped.
  const Status st = kreg::jit::check_key(good.substr(0, 63) + std::string(1, '\0'));
  EXPECT_NE(st.message().find(good.substr(0, 63) + "\\0"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(tmp.root() / "cache"));  // nothing was created for a bad key
}

// ---- the default directory ----

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* v : kVars) {
      const char* s = std::getenv(v);
      saved_.push_back(s ? std::optional<std::string>(s) : std::nullopt);
    }
  }
  ~EnvGuard() {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        ::setenv(kVars[i], saved_[i]->c_str(), 1);
      } else {
        ::unsetenv(kVars[i]);
      }
    }
  }
  static constexpr const char* kVars[] = {"KREG_JIT_CACHE", "XDG_CACHE_HOME", "HOME"};

 private:
  std::vector<std::optional<std::string>> saved_;
};

TEST(JitCache, DefaultDir) {
  EnvGuard guard;
  ::setenv("KREG_JIT_CACHE", "/a/jit", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  ::setenv("HOME", "/home/u", 1);
  auto d = Cache::default_dir();
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*d, fs::path("/a/jit"));

  ::setenv("KREG_JIT_CACHE", "", 1);  // empty counts as unset
  d = Cache::default_dir();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, fs::path("/xdg/kreg/jit"));

  ::unsetenv("XDG_CACHE_HOME");
  d = Cache::default_dir();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, fs::path("/home/u/.cache/kreg/jit"));

  ::unsetenv("HOME");
  d = Cache::default_dir();
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), KREG_FAILED_PRECONDITION);
  EXPECT_NE(d.status().message().find("KREG_JIT_CACHE"), std::string::npos);

  for (const char* var : EnvGuard::kVars) {
    SCOPED_TRACE(var);
    ::unsetenv("KREG_JIT_CACHE");
    ::unsetenv("XDG_CACHE_HOME");
    ::unsetenv("HOME");
    ::setenv(var, "relative/dir", 1);
    d = Cache::default_dir();
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(d.status().message().find(var), std::string::npos) << d.status().message();
    EXPECT_NE(d.status().message().find("relative/dir"), std::string::npos);
  }
}

// ---- hits ----

TEST(JitCache, BuildsOnceThenHits) {
  Scratch tmp;
  const fs::path dir = tmp.root() / "a" / "b" / "cache";  // three folders to create
  Cache cache(dir);
  const std::string key = key_of("add");
  CountingBuild build{"add"};
  auto first = cache.get_or_build(key, {"add", "N=4", "sm_90"}, build.fn());
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_TRUE(first->compiled);
  EXPECT_EQ(first->note, "");
  EXPECT_EQ(first->image, image_for("add"));
  EXPECT_EQ(build.calls, 1);

  auto second = cache.get_or_build(key, {"add", "N=4", "sm_90"}, build.fn());
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->compiled);
  EXPECT_EQ(second->note, "");
  EXPECT_EQ(second->image, image_for("add"));
  EXPECT_EQ(build.calls, 1);

  // Another Cache object (another process, in effect) hits too.
  Cache other(dir);
  auto third = other.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->compiled);
  EXPECT_EQ(third->image, image_for("add"));
  EXPECT_EQ(build.calls, 1);
  EXPECT_EQ(other.lookup(key), image_for("add"));
  EXPECT_FALSE(other.lookup(key_of("other")).has_value());

  // The documented layout: the entry and its lock file, no temporary left; every folder
  // kreg created is private.
  EXPECT_EQ(names_in(dir / "v1"), (std::vector<std::string>{key + ".kjit", key + ".lock"}));
  EXPECT_EQ(*cache.entry_path(key), dir / "v1" / (key + ".kjit"));
  for (const fs::path& p : {tmp.root() / "a", tmp.root() / "a" / "b", dir, dir / "v1"}) {
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << p;
  }
  // No absolute path is stored: the entry does not contain the directory's name.
  EXPECT_EQ(read_file(dir / "v1" / (key + ".kjit")).find(tmp.root().filename().string()),
            std::string::npos);
}

TEST(JitCache, BuildErrorIsReturnedAndNothingStored) {
  Scratch tmp;
  Cache cache(tmp.root());
  const std::string key = key_of("bad");
  int calls = 0;
  auto failing = [&](std::string& image) {
    ++calls;
    image = "partial";
    return Status(KREG_INTERNAL, "nvrtc: error: expected a ';'");
  };
  for (int i = 1; i <= 2; ++i) {
    auto r = cache.get_or_build(key, {}, failing);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), KREG_INTERNAL);
    EXPECT_EQ(r.status().message(), "nvrtc: error: expected a ';'");
    EXPECT_EQ(calls, i);  // not cached: the next call tries again
    EXPECT_FALSE(cache.lookup(key).has_value());
  }
}

TEST(JitCache, MetaFieldOverLimitIsRefused) {
  Scratch tmp;
  Cache cache(tmp.root());
  CountingBuild build{"x"};
  EntryMeta meta{"op", std::string(kreg::jit::kMaxMetaBytes + 1, 's'), "sm_90"};
  auto r = cache.get_or_build(key_of("x"), meta, build.fn());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(r.status().message().find("specialization"), std::string::npos);
  EXPECT_EQ(build.calls, 0);
}

TEST(JitCache, ThreadsOfOneProcessBuildOnce) {
  Scratch tmp;
  Cache cache(tmp.root());
  const std::string key = key_of("threads");
  std::atomic<int> calls{0};
  std::vector<std::string> images(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto r = cache.get_or_build(key, {}, [&](std::string& image) {
        calls.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        image = image_for("threads");
        return Status();
      });
      if (r.ok()) images[i] = r->image;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), 1);
  for (const std::string& im : images) EXPECT_EQ(im, image_for("threads"));
}

// ---- many processes on one empty cache ----

// Forks one child per key in `keys`; all wait on one pipe and start when the parent closes
// it. Each child builds with a function that appends a line to <work>/<key>.count
// (O_APPEND), runs `during_build` and sleeps 100 ms; it writes the image it got to
// <work>/<i>.image and exits 10 when it compiled, 0 when it hit, 2 on error.
std::vector<int> run_children(const fs::path& cache_dir, const fs::path& work,
                              const std::vector<std::string>& keys,
                              const std::function<std::string(const std::string&)>& during_build) {
  int start[2];
  if (::pipe(start) != 0) return {};
  std::vector<pid_t> pids;
  for (size_t i = 0; i < keys.size(); ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(start[1]);
      char c;
      while (::read(start[0], &c, 1) < 0 && errno == EINTR) {
      }
      Cache cache(cache_dir);
      const std::string& key = keys[i];
      auto r = cache.get_or_build(key, {"op", "", "sm_90"}, [&](std::string& image) {
        const fs::path counter = work / (key + ".count");
        const int fd = ::open(counter.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
        const std::string line = std::to_string(::getpid()) + "\n";
        if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          return Status(KREG_INTERNAL, "counter");
        }
        ::close(fd);
        image = image_for(key) + during_build(key);
        ::usleep(100 * 1000);
        return Status();
      });
      if (!r.ok()) ::_exit(2);
      write_file(work / (std::to_string(i) + ".image"), r->image);
      ::_exit(r->compiled ? 10 : 0);
    }
    pids.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // every child's read returns: they all start now
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) {
      codes.push_back(-1);
      continue;
    }
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  return codes;
}

size_t count_lines(const fs::path& p) {
  const std::string s = read_file(p);
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

TEST(JitCache, EightProcessesOnAnEmptyCacheBuildOnce) {
  Scratch tmp;
  const fs::path cache_dir = tmp.root() / "cache";  // not even created yet
  const std::string key = key_of("race");
  const std::vector<std::string> keys(8, key);
  const std::vector<int> codes =
      run_children(cache_dir, tmp.root(), keys, [](const std::string&) { return ""; });
  ASSERT_EQ(codes.size(), 8u);
  EXPECT_EQ(std::count(codes.begin(), codes.end(), 10), 1);  // one compiled
  EXPECT_EQ(std::count(codes.begin(), codes.end(), 0), 7);   // seven hit
  EXPECT_EQ(count_lines(tmp.root() / (key + ".count")), 1u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(read_file(tmp.root() / (std::to_string(i) + ".image")), image_for(key)) << i;
  }
  EXPECT_EQ(names_in(cache_dir / "v1"), (std::vector<std::string>{key + ".kjit", key + ".lock"}));
}

TEST(JitCache, DifferentKeysBuildInParallel) {
  Scratch tmp;
  const fs::path cache_dir = tmp.root() / "cache";
  const std::string a = key_of("a"), b = key_of("b");
  const std::vector<std::string> keys = {a, b, a, b, a, b, a, b};
  // Each key's builder marks that it started and waits (up to 20 s) for the other key's
  // builder: it sees it only if the two builds are not serialized by one lock.
  auto during = [&](const std::string& key) -> std::string {
    write_file(tmp.root() / (key + ".started"), "");
    const fs::path other = tmp.root() / ((key == a ? b : a) + ".started");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(other)) {
      if (std::chrono::steady_clock::now() > deadline) return "alone";
      ::usleep(5 * 1000);
    }
    return "together";
  };
  const std::vector<int> codes = run_children(cache_dir, tmp.root(), keys, during);
  ASSERT_EQ(codes.size(), 8u);
  EXPECT_EQ(std::count(codes.begin(), codes.end(), 10), 2);  // one build per key
  EXPECT_EQ(std::count(codes.begin(), codes.end(), 0), 6);
  EXPECT_EQ(count_lines(tmp.root() / (a + ".count")), 1u);
  EXPECT_EQ(count_lines(tmp.root() / (b + ".count")), 1u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(read_file(tmp.root() / (std::to_string(i) + ".image")),
              image_for(keys[i]) + "together")
        << i;
  }
}

// ---- invalid entries ----

struct Corruption {
  const char* name;
  const char* expected;  // in the note
  std::function<void(const fs::path& entry, const fs::path& other_entry)> apply;
};

class JitCorrupt : public ::testing::TestWithParam<Corruption> {};

TEST_P(JitCorrupt, IsNotedOnceAndRebuilt) {
  Scratch tmp;
  Cache cache(tmp.root());
  const std::string key = key_of("k"), other_key = key_of("other");
  CountingBuild build{"k"}, other_build{"other"};
  ASSERT_TRUE(cache.get_or_build(key, {"k", "", "sm_90"}, build.fn()).ok());
  ASSERT_TRUE(cache.get_or_build(other_key, {}, other_build.fn()).ok());
  const fs::path entry = *cache.entry_path(key);
  GetParam().apply(entry, *cache.entry_path(other_key));

  EXPECT_FALSE(cache.lookup(key).has_value());
  auto listed = cache.list();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  const auto& info = (*listed)[0].key == key ? (*listed)[0] : (*listed)[1];
  EXPECT_NE(info.problem.find(GetParam().expected), std::string::npos) << info.problem;

  ::alarm(30);  // a FIFO must not block the read: fail rather than hang
  auto r = cache.get_or_build(key, {"k", "", "sm_90"}, build.fn());
  ::alarm(0);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->compiled);
  EXPECT_EQ(r->image, image_for("k"));
  EXPECT_EQ(build.calls, 2);
  EXPECT_NE(r->note.find(entry.string()), std::string::npos) << r->note;
  EXPECT_NE(r->note.find(GetParam().expected), std::string::npos) << r->note;
  EXPECT_NE(r->note.find("rebuilt"), std::string::npos) << r->note;
  EXPECT_EQ(r->note.find('\n'), std::string::npos) << r->note;

  // Replaced: the next call hits, silently.
  auto again = cache.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->compiled);
  EXPECT_EQ(again->note, "");
  EXPECT_EQ(again->image, image_for("k"));
  EXPECT_EQ(build.calls, 2);
  EXPECT_EQ(cache.lookup(other_key), image_for("other"));
}

void flip_byte(const fs::path& p, long from_end) {
  std::string s = read_file(p);
  s[s.size() - static_cast<size_t>(from_end)] ^= 0x20;
  write_file(p, s);
}

INSTANTIATE_TEST_SUITE_P(
    Corruptions, JitCorrupt,
    ::testing::Values(
        Corruption{"PayloadByte", "checksum mismatch",
                   [](const fs::path& e, const fs::path&) { flip_byte(e, 1); }},
        Corruption{"MetaByte", "checksum mismatch",
                   [](const fs::path& e, const fs::path&) {
                     // The op field's one byte: after magic, version, the key's length and
                     // the key, and the op's length.
                     std::string s = read_file(e);
                     s[8 + 4 + 4 + 64 + 4] ^= 0x20;
                     write_file(e, s);
                   }},
        Corruption{
            "Truncated", "truncated",
            [](const fs::path& e, const fs::path&) { fs::resize_file(e, fs::file_size(e) / 2); }},
        Corruption{"TruncatedHeader", "truncated in its header",
                   [](const fs::path& e, const fs::path&) { fs::resize_file(e, 20); }},
        Corruption{"Empty", "bad magic",
                   [](const fs::path& e, const fs::path&) { fs::resize_file(e, 0); }},
        Corruption{"TrailingBytes", "longer than its header says",
                   [](const fs::path& e, const fs::path&) { write_file(e, read_file(e) + "x"); }},
        Corruption{"BadMagic", "bad magic",
                   [](const fs::path& e, const fs::path&) {
                     std::string s = read_file(e);
                     s[0] = 'X';
                     write_file(e, s);
                   }},
        Corruption{"OtherVersion", "format version 2",
                   [](const fs::path& e, const fs::path&) {
                     std::string s = read_file(e);
                     s[8] = 2;
                     write_file(e, s);
                   }},
        Corruption{"AnotherKeysEntry", "holds the entry for key",
                   [](const fs::path& e, const fs::path& other) {
                     fs::copy_file(other, e, fs::copy_options::overwrite_existing);
                   }},
        Corruption{"Directory", "a directory",
                   [](const fs::path& e, const fs::path&) {
                     fs::remove(e);
                     fs::create_directories(e / "inside");
                   }},
        Corruption{"Fifo", "FIFO",
                   [](const fs::path& e, const fs::path&) {
                     fs::remove(e);
                     ASSERT_EQ(::mkfifo(e.c_str(), 0600), 0);
                   }},
        Corruption{"HugeSparseFile", "the limit",
                   [](const fs::path& e, const fs::path&) {
                     fs::resize_file(e, kreg::jit::kMaxImageBytes + (uint64_t{1} << 20));
                   }},
        Corruption{"SymlinkToDirectory", "a directory",
                   [](const fs::path& e, const fs::path&) {
                     fs::remove(e);
                     fs::create_symlink(e.parent_path(), e);
                   }}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

// ---- moving and read-only directories ----

TEST(JitCache, MovingTheDirectoryKeepsEveryHit) {
  Scratch tmp;
  const fs::path before = tmp.root() / "before", after = tmp.root() / "elsewhere" / "after";
  std::vector<std::string> keys;
  {
    Cache cache(before);
    for (const char* what : {"a", "b", "c"}) {
      keys.push_back(key_of(what));
      CountingBuild build{what};
      ASSERT_TRUE(cache.get_or_build(keys.back(), {what, "", "sm_90"}, build.fn()).ok());
    }
  }
  fs::create_directories(after.parent_path());
  fs::rename(before, after);
  Cache moved(after);
  const char* whats[] = {"a", "b", "c"};
  for (size_t i = 0; i < keys.size(); ++i) {
    int calls = 0;
    auto r = moved.get_or_build(keys[i], {}, [&](std::string&) {
      ++calls;
      return Status();
    });
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->compiled);
    EXPECT_EQ(calls, 0);
    EXPECT_EQ(r->image, image_for(whats[i]));
  }
  auto listed = moved.list();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 3u);
}

TEST(JitCache, ReadOnlyDirectoryCompilesInMemory) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which ignores directory permissions: a read-only "
                    "cache cannot be made (run this test as another user)";
  }
  Scratch tmp;
  const fs::path dir = tmp.root() / "ro";
  fs::create_directories(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0500), 0);
  Cache cache(dir);
  const std::string key = key_of("ro");
  CountingBuild build{"ro"};
  auto r = cache.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->compiled);
  EXPECT_EQ(r->image, image_for("ro"));
  EXPECT_NE(r->note.find("cache directory " + dir.string() + " is not writable ("),
            std::string::npos)
      << r->note;
  EXPECT_NE(r->note.find("compiled in memory"), std::string::npos) << r->note;
  // Once per Cache object; nothing is stored, so every call compiles.
  auto r2 = cache.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->compiled);
  EXPECT_EQ(r2->note, "");
  EXPECT_EQ(build.calls, 2);
  EXPECT_TRUE(names_in(dir).empty());
  // A fresh Cache says it again.
  Cache fresh(dir);
  auto r3 = fresh.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(r3.ok());
  EXPECT_NE(r3->note.find("not writable"), std::string::npos);

  // A directory that cannot be created (its parent is read-only) works the same way.
  Cache uncreatable(dir / "sub" / "cache");
  auto r4 = uncreatable.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(r4.ok());
  EXPECT_NE(r4->note.find("cannot create " + (dir / "sub").string()), std::string::npos)
      << r4->note;
}

TEST(JitCache, ReadOnlyPopulatedCacheStillHits) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which ignores directory permissions: a read-only "
                    "cache cannot be made (run this test as another user)";
  }
  Scratch tmp;
  const fs::path dir = tmp.root() / "cache";
  const std::string key = key_of("hit"), miss = key_of("miss");
  CountingBuild build{"hit"};
  ASSERT_TRUE(Cache(dir).get_or_build(key, {}, build.fn()).ok());
  ASSERT_EQ(::chmod((dir / "v1").c_str(), 0500), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0500), 0);
  Cache cache(dir);
  auto r = cache.get_or_build(key, {}, build.fn());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->compiled);
  EXPECT_EQ(r->image, image_for("hit"));
  EXPECT_EQ(build.calls, 1);
  // A miss there cannot take a lock: compiled in memory, with the note.
  CountingBuild miss_build{"miss"};
  auto m = cache.get_or_build(miss, {}, miss_build.fn());
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->compiled);
  EXPECT_NE(m->note.find("compiled in memory"), std::string::npos) << m->note;
  EXPECT_EQ(names_in(dir / "v1"), (std::vector<std::string>{key + ".kjit", key + ".lock"}));
}

// ---- listing and clearing ----

TEST(JitCache, ListShowsEntriesWithMetaAndSizes) {
  Scratch tmp;
  Cache cache(tmp.root() / "cache");
  auto empty = cache.list();  // the directory does not exist yet
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  struct Want {
    std::string what;
    EntryMeta meta;
  };
  const std::vector<Want> wants = {{"rmsnorm", {"rmsnorm", "D=4096 dtype=bf16", "sm_90"}},
                                   {"silu", {"silu_and_mul", "", "sm_90a"}},
                                   {"topk", {"topk", "K=8", "sm_80"}}};
  for (const Want& w : wants) {
    CountingBuild build{w.what};
    ASSERT_TRUE(cache.get_or_build(key_of(w.what), w.meta, build.fn()).ok());
  }
  // Not entries: ignored.
  write_file(cache.dir() / "v1" / "README", "x");
  write_file(cache.dir() / "v1" / "notakey.kjit", "x");
  // An invalid entry: listed with its problem.
  const std::string broken = key_of("broken");
  write_file(*cache.entry_path(broken), "garbage");

  auto listed = cache.list();
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  ASSERT_EQ(listed->size(), 4u);
  for (size_t i = 1; i < listed->size(); ++i) {
    EXPECT_LT((*listed)[i - 1].key, (*listed)[i].key);
  }
  for (const Want& w : wants) {
    const std::string key = key_of(w.what);
    auto it = std::find_if(listed->begin(), listed->end(),
                           [&](const kreg::jit::EntryInfo& e) { return e.key == key; });
    ASSERT_NE(it, listed->end()) << w.what;
    EXPECT_EQ(it->problem, "");
    EXPECT_EQ(it->meta.op, w.meta.op);
    EXPECT_EQ(it->meta.specialization, w.meta.specialization);
    EXPECT_EQ(it->meta.arch, w.meta.arch);
    EXPECT_EQ(it->size, image_for(w.what).size());
    EXPECT_EQ(it->mtime, fs::last_write_time(*cache.entry_path(key)));
  }
  auto bad = std::find_if(listed->begin(), listed->end(),
                          [&](const kreg::jit::EntryInfo& e) { return e.key == broken; });
  ASSERT_NE(bad, listed->end());
  EXPECT_NE(bad->problem.find("bad magic"), std::string::npos) << bad->problem;
  EXPECT_EQ(bad->size, 7u);
  EXPECT_EQ(bad->meta.op, "");
}

TEST(JitCache, ClearEmptiesIt) {
  Scratch tmp;
  Cache cache(tmp.root() / "cache");
  EXPECT_EQ(cache.clear().value(), 0u);  // nothing there yet
  const fs::path v1 = cache.dir() / "v1";
  for (const char* what : {"a", "b", "c"}) {
    CountingBuild build{what};
    ASSERT_TRUE(cache.get_or_build(key_of(what), {}, build.fn()).ok());
  }
  write_file(*cache.entry_path(key_of("broken")), "garbage");
  // A crashed writer's temporary, and one of a build in progress (its lock is held).
  const std::string crashed = "." + key_of("a") + ".12345.00112233aabbccdd.tmp";
  write_file(v1 / crashed, "partial");
  const std::string busy = key_of("busy");
  const std::string busy_tmp = "." + busy + ".999.0123456789abcdef.tmp";
  write_file(v1 / busy_tmp, "in progress");
  const int held = ::open((v1 / (busy + ".lock")).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  write_file(v1 / "unrelated.txt", "kept");

  auto removed = cache.clear();
  ASSERT_TRUE(removed.ok()) << removed.status().to_string();
  EXPECT_EQ(*removed, 4u);
  EXPECT_EQ(names_in(v1), (std::vector<std::string>{busy_tmp, busy + ".lock", "unrelated.txt"}));
  EXPECT_TRUE(cache.list()->empty());
  EXPECT_FALSE(cache.lookup(key_of("a")).has_value());

  // Once the lock is free, clear takes the rest.
  ::close(held);
  EXPECT_EQ(cache.clear().value(), 0u);
  EXPECT_EQ(names_in(v1), (std::vector<std::string>{"unrelated.txt"}));

  // And the cache builds again.
  CountingBuild build{"a"};
  auto r = cache.get_or_build(key_of("a"), {}, build.fn());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->compiled);
  EXPECT_EQ(build.calls, 1);
}

}  // namespace
