// The communication group's bootstrap store (plugins/communication/store): both stores'
// operations, waiting and timing out, many processes adding at once, hostile clients of the
// TCP server, bad URLs, files planted in the file store, and large values.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "store.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using kreg::comm::connect_store;
using kreg::comm::Store;
using kreg::comm::TcpStoreServer;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string hex(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

// One store of each kind: a TCP server in this process, or a fresh directory.
class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    if (GetParam() == "tcp") {
      server_ = TcpStoreServer::start("127.0.0.1", 0, &error);
      ASSERT_NE(server_, nullptr) << error;
      ASSERT_GT(server_->port(), 0);
      url_ = "tcp://127.0.0.1:" + std::to_string(server_->port());
    } else {
      ASSERT_FALSE(dir_.root().empty());
      url_ = "file://" + (dir_.root() / "store").string();  // created by connect_store
    }
    store_ = open();
    ASSERT_NE(store_, nullptr);
  }

  std::unique_ptr<Store> open() {
    std::string error;
    auto s = connect_store(url_, 5.0, &error);
    EXPECT_NE(s, nullptr) << error;
    return s;
  }

  kreg::test::Scratch dir_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string url_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, SetGetAddErase) {
  std::string error, value;
  EXPECT_EQ(store_->url(), url_);
  ASSERT_TRUE(store_->set("a", "one", &error)) << error;
  ASSERT_TRUE(store_->get("a", 0, &value, &error)) << error;
  EXPECT_EQ(value, "one");
  ASSERT_TRUE(store_->set("a", "two", &error)) << error;
  ASSERT_TRUE(store_->get("a", 0, &value, &error)) << error;
  EXPECT_EQ(value, "two");
  // An empty value is a value.
  ASSERT_TRUE(store_->set("empty", "", &error)) << error;
  value = "x";
  ASSERT_TRUE(store_->get("empty", 0, &value, &error)) << error;
  EXPECT_EQ(value, "");

  // Keys are bytes: separators, dots, NULs and 0xff stay inside the store.
  const std::string odd("../../x/\0\xff", 10);
  ASSERT_TRUE(store_->set(odd, std::string("v\0w", 3), &error)) << error;
  ASSERT_TRUE(store_->get(odd, 0, &value, &error)) << error;
  EXPECT_EQ(value, std::string("v\0w", 3));
  EXPECT_FALSE(fs::exists(dir_.root() / "x"));

  int64_t n = 0;
  ASSERT_TRUE(store_->add("n", 5, &n, &error)) << error;
  EXPECT_EQ(n, 5);
  ASSERT_TRUE(store_->add("n", -7, &n, &error)) << error;
  EXPECT_EQ(n, -2);
  ASSERT_TRUE(store_->get("n", 0, &value, &error)) << error;
  EXPECT_EQ(value, "-2");
  ASSERT_TRUE(store_->set("big", std::to_string(INT64_MAX), &error)) << error;
  EXPECT_FALSE(store_->add("big", 1, &n, &error));
  EXPECT_NE(error.find("overflows"), std::string::npos) << error;
  EXPECT_FALSE(store_->add("a", 1, &n, &error));
  EXPECT_NE(error.find("add 'a': value 'two' is not a decimal integer"), std::string::npos)
      << error;

  ASSERT_TRUE(store_->erase("a", &error)) << error;
  ASSERT_TRUE(store_->erase("a", &error)) << error;  // absent: fine
  EXPECT_FALSE(store_->get("a", 0, &value, &error));
  EXPECT_NE(error.find("get 'a': timed out"), std::string::npos) << error;
  // An erased counter starts again from 0.
  ASSERT_TRUE(store_->erase("n", &error)) << error;
  ASSERT_TRUE(store_->add("n", 3, &n, &error)) << error;
  EXPECT_EQ(n, 3);

  // Keys past the limits, named in the error.
  EXPECT_FALSE(store_->set("", "v", &error));
  EXPECT_NE(error.find("empty key"), std::string::npos) << error;
  const std::string longest(kreg::comm::kMaxStoreKeyBytes, 'k');
  ASSERT_TRUE(store_->set(longest, "long", &error)) << error;
  ASSERT_TRUE(store_->get(longest, 0, &value, &error)) << error;
  EXPECT_EQ(value, "long");
  // Keys sharing the long key's first chunks stay apart from it.
  ASSERT_TRUE(store_->set(longest.substr(0, 64), "short", &error)) << error;
  ASSERT_TRUE(store_->set(longest.substr(0, 65), "65", &error)) << error;
  ASSERT_TRUE(store_->get(longest, 0, &value, &error)) << error;
  EXPECT_EQ(value, "long");
  ASSERT_TRUE(store_->get(longest.substr(0, 64), 0, &value, &error)) << error;
  EXPECT_EQ(value, "short");
  EXPECT_FALSE(store_->get(longest + "k", 0, &value, &error));
  EXPECT_NE(error.find("key of 1025 bytes is longer than 1024"), std::string::npos) << error;
}

TEST_P(StoreTest, GetWaitsForASetFromAnotherThread) {
  auto other = open();
  ASSERT_NE(other, nullptr);
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    std::string error;
    EXPECT_TRUE(other->set("nccl/id", std::string(128, '\x7f'), &error)) << error;
  });
  std::string error, value;
  const bool ok = store_->get("nccl/id", 5.0, &value, &error);
  setter.join();
  ASSERT_TRUE(ok) << error;
  EXPECT_EQ(value, std::string(128, '\x7f'));
  EXPECT_GE(since(start), 0.14);
  EXPECT_LT(since(start), 2.0);
}

TEST_P(StoreTest, GetTimesOut) {
  std::string error, value;
  const auto start = Clock::now();
  EXPECT_FALSE(store_->get("nccl/id", 0.3, &value, &error));
  const double took = since(start);
  EXPECT_EQ(error, (GetParam() == "tcp" ? url_ : "file store " + url_.substr(7)) +
                       ": get 'nccl/id': timed out after 0.3 s");
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 1.5);
  // The store still answers afterwards (the TCP connection is in a clean state).
  ASSERT_TRUE(store_->set("nccl/id", "x", &error)) << error;
  ASSERT_TRUE(store_->get("nccl/id", 0, &value, &error)) << error;
  EXPECT_EQ(value, "x");
}

TEST_P(StoreTest, ProcessesAddConcurrently) {
  constexpr int kChildren = 8, kAdds = 25;
  std::vector<pid_t> pids;
  for (int i = 0; i < kChildren; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string error;
      auto s = connect_store(url_, 5.0, &error);
      if (!s) _exit(2);
      for (int k = 0; k < kAdds; ++k) {
        int64_t v = 0;
        if (!s->add("count", 1, &v, &error) || v < 1 || v > kChildren * kAdds) _exit(3);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  std::string error, value;
  ASSERT_TRUE(store_->get("count", 0, &value, &error)) << error;
  EXPECT_EQ(value, std::to_string(kChildren * kAdds));
}

TEST_P(StoreTest, SixteenMebibyteValue) {
  std::string big(16 << 20, '\0');
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= big.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(big.data() + i, &r, 8);
  }
  auto other = open();
  ASSERT_NE(other, nullptr);
  std::string error, value;
  ASSERT_TRUE(store_->set("rank0/buf", big, &error)) << error;
  ASSERT_TRUE(other->get("rank0/buf", 1.0, &value, &error)) << error;
  EXPECT_TRUE(value == big) << "got " << value.size() << " bytes";
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("tcp", "file"),
                         [](const auto& info) { return info.param; });

// ---- the TCP server against raw sockets ----

int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string header(uint32_t magic, uint8_t op, uint64_t key_len, uint64_t payload_len) {
  std::string h(kreg::comm::detail::kRequestHeaderBytes, '\0');
  kreg::comm::detail::put_le(h.data(), magic, 4);
  h[4] = static_cast<char>(op);
  kreg::comm::detail::put_le(h.data() + 5, key_len, 4);
  kreg::comm::detail::put_le(h.data() + 9, payload_len, 8);
  return h;
}

// Everything the server sends until it closes (or until timeout_s: then *closed is false).
std::string read_until_close(int fd, double timeout_s, bool* closed) {
  std::string got;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  *closed = false;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// Whether the server sent anything within ms (without consuming it).
bool has_answer(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

std::string error_text(const std::string& answer) {
  if (answer.size() < kreg::comm::detail::kResponseHeaderBytes ||
      answer[0] != kreg::comm::detail::kStatusError) {
    return "";
  }
  return answer.substr(kreg::comm::detail::kResponseHeaderBytes);
}

TEST(TcpStoreServer, DropsHostileClientsAndKeepsServing) {
  std::string error, value;
  auto server = TcpStoreServer::start("127.0.0.1", 0, &error);
  ASSERT_NE(server, nullptr) << error;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(server->port());
  auto good = connect_store(url, 5.0, &error);
  ASSERT_NE(good, nullptr) << error;
  ASSERT_TRUE(good->set("before", "1", &error)) << error;
  // A client parked in a get while the others misbehave.
  std::string waited;
  std::thread waiter([&] {
    std::string e;
    auto s = connect_store(url, 5.0, &e);
    ASSERT_NE(s, nullptr) << e;
    EXPECT_TRUE(s->get("after", 5.0, &waited, &e)) << e;
  });

  const uint32_t magic = kreg::comm::detail::kProtoMagic;
  struct Case {
    std::string bytes;
    std::string expect;  // in the ERROR the server sends before closing
  };
  const std::vector<Case> cases = {
      {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad magic"},
      {header(magic, 9, 1, 0) + "k", "unknown request 9"},
      {header(magic, kreg::comm::detail::kOpSet, 1u << 20, 1), "key length 1048576"},
      {header(magic, kreg::comm::detail::kOpSet, 0, 1), "key length 0"},
      {header(magic, kreg::comm::detail::kOpSet, 1, uint64_t{1} << 40), "payload length"},
      {header(magic, kreg::comm::detail::kOpGet, 1, 9) + "k", "payload length 9"},
  };
  for (const Case& c : cases) {
    const int fd = raw_connect(server->port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(c.bytes.size()));
    bool closed = false;
    const std::string answer = read_until_close(fd, 2.0, &closed);
    EXPECT_TRUE(closed) << c.expect;
    EXPECT_NE(error_text(answer).find(c.expect), std::string::npos)
        << "wanted '" << c.expect << "', got '" << error_text(answer) << "'";
    ::close(fd);
  }
  // Frames cut short: a header alone, a set whose key and value stop half-way, then gone.
  for (const std::string& partial :
       {header(magic, kreg::comm::detail::kOpSet, 3, 10).substr(0, 7),
        header(magic, kreg::comm::detail::kOpSet, 5, 10) + "trunc" + "val"}) {
    const int fd = raw_connect(server->port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(partial.size()));
    ::close(fd);
  }
  // Random bytes.
  {
    std::mt19937 rng(7);
    std::string junk(4096, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    const int fd = raw_connect(server->port());
    ASSERT_GE(fd, 0);
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    bool closed = false;
    read_until_close(fd, 2.0, &closed);
    EXPECT_TRUE(closed);
    ::close(fd);
  }

  // The well-behaved clients never noticed.
  ASSERT_TRUE(good->get("before", 0, &value, &error)) << error;
  EXPECT_EQ(value, "1");
  EXPECT_FALSE(good->get("trunc", 0, &value, &error)) << "a cut-short set took effect";
  ASSERT_TRUE(good->set("after", "2", &error)) << error;
  waiter.join();
  EXPECT_EQ(waited, "2");
  auto fresh = connect_store(url, 5.0, &error);
  ASSERT_NE(fresh, nullptr) << error;
  ASSERT_TRUE(fresh->get("after", 0, &value, &error)) << error;
  EXPECT_EQ(value, "2");
}

TEST(TcpStoreServer, RefusesSetsPastTheTotalWithoutAllocatingThem) {
  std::string error, value;
  auto server = TcpStoreServer::start("127.0.0.1", 0, &error);
  ASSERT_NE(server, nullptr) << error;
  auto good = connect_store("tcp://127.0.0.1:" + std::to_string(server->port()), 5.0, &error);
  ASSERT_NE(good, nullptr) << error;
  // Each announces a 1 GiB set and sends nothing more: three fit in 4 GiB, the fourth does
  // not. The server holds none of it in memory (a buffer grows with bytes received).
  const std::string h = header(kreg::comm::detail::kProtoMagic, kreg::comm::detail::kOpSet, 1,
                               kreg::comm::kMaxStoreValueBytes);
  for (int round = 0; round < 2; ++round) {
    std::vector<int> fds;
    for (int i = 0; i < 4; ++i) {
      const int fd = raw_connect(server->port());
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::send(fd, h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
      // The server reads connections in the order it accepted them: the fourth is last.
      fds.push_back(fd);
    }
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(has_answer(fds[i], 100)) << "round " << round;
    ASSERT_TRUE(has_answer(fds[3], 2000)) << "round " << round;
    char buf[512];
    const ssize_t n = ::recv(fds[3], buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    EXPECT_NE(error_text(std::string(buf, static_cast<size_t>(n))).find("store full"),
              std::string::npos);
    // Small sets still fit; closing the three gives their reservations back (round 2).
    ASSERT_TRUE(good->set("small", "v", &error)) << error;
    for (int fd : fds) ::close(fd);
    ASSERT_TRUE(good->get("small", 0, &value, &error)) << error;
  }
}

TEST(TcpStoreServer, StoppedServerGivesAClearError) {
  std::string error, value;
  auto server = TcpStoreServer::start("127.0.0.1", 0, &error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  auto s = connect_store("tcp://localhost:" + std::to_string(port), 5.0, &error);
  ASSERT_NE(s, nullptr) << error;
  EXPECT_EQ(s->url(), "tcp://localhost:" + std::to_string(port));
  ASSERT_TRUE(s->set("k", "v", &error)) << error;
  server->stop();
  server->stop();  // twice is fine
  const auto start = Clock::now();
  EXPECT_FALSE(s->get("k", 5.0, &value, &error));
  EXPECT_LT(since(start), 3.0);
  EXPECT_NE(error.find("tcp://localhost:" + std::to_string(port) + ": get 'k': "),
            std::string::npos)
      << error;
  server.reset();
  // Nobody listens there now.
  const auto t = Clock::now();
  EXPECT_EQ(connect_store("tcp://127.0.0.1:" + std::to_string(port), 0.3, &error), nullptr);
  EXPECT_EQ(error, "tcp://127.0.0.1:" + std::to_string(port) + ": connection refused after 0.3 s");
  EXPECT_GE(since(t), 0.25);
  EXPECT_LT(since(t), 1.5);

  EXPECT_EQ(TcpStoreServer::start("example.com", 0, &error), nullptr);
  EXPECT_NE(error.find("not an IPv4 address"), std::string::npos) << error;
  EXPECT_EQ(TcpStoreServer::start("127.0.0.1", 70000, &error), nullptr);
  EXPECT_NE(error.find("outside 0..65535"), std::string::npos) << error;
}

TEST(ConnectStore, RejectsBadUrls) {
  kreg::test::Scratch tmp;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "unknown scheme"},
      {"http://127.0.0.1:80", "unknown scheme"},
      {"tcp://", "missing ':PORT'"},
      {"tcp://127.0.0.1", "missing ':PORT'"},
      {"tcp://:80", "empty host"},
      {"tcp://127.0.0.1:", "empty port"},
      {"tcp://127.0.0.1:http", "port 'http' is not a number"},
      {"tcp://127.0.0.1:-1", "is not a number"},
      {"tcp://127.0.0.1:0", "port 0 is outside 1..65535"},
      {"tcp://127.0.0.1:65536", "outside 1..65535"},
      {"tcp://127.0.0.1:99999999999999999999999", "outside 1..65535"},
      {"tcp://127.0.0.1:80/path", "trailing characters '/path' after the port"},
      {"tcp://127.0.0.1:80 ", "trailing characters"},
      {"tcp://example.com:80", "host 'example.com' is not an IPv4 address or localhost"},
      {"tcp://127.1:80", "is not an IPv4 address"},
      {"tcp://[::1]:80", "is not an IPv4 address"},
      {"file://relative/dir", "needs an absolute path"},
      {"file://", "needs an absolute path"},
      {"tcp://127.0.0.1:80\x1b[31m", "control characters"},
      {std::string("tcp://127.0.0.1:8\0", 18), "control characters"},
      {"file://" + tmp.root().string() + "/a\nb", "control characters"},
  };
  const auto start = Clock::now();
  for (const auto& [url, expect] : cases) {
    std::string error;
    EXPECT_EQ(connect_store(url, 5.0, &error), nullptr) << url;
    EXPECT_NE(error.find(expect), std::string::npos)
        << "wanted '" << expect << "', got '" << error << "'";
    EXPECT_EQ(error.rfind("store URL '", 0), 0u) << error;
    for (char c : error) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unescaped byte in: " << error;
  }
  // None of them tried to connect.
  EXPECT_LT(since(start), 1.0);
  std::string error;
  connect_store("tcp://127.0.0.1:80\x1b[31m", 0, &error);
  EXPECT_NE(error.find("\\x1b[31m"), std::string::npos) << error;
  // A file store's path that is a file, not a directory.
  const std::string file = (tmp.root() / "f").string();
  ASSERT_TRUE(std::fopen(file.c_str(), "w") != nullptr);
  EXPECT_EQ(connect_store("file://" + file, 0, &error), nullptr);
  EXPECT_NE(error.find("not a directory"), std::string::npos) << error;
}

// ---- files planted in a file store's directory ----

TEST(FileStore, RefusesFifosAndOversizedFiles) {
  kreg::test::Scratch tmp;
  std::string error, value;
  auto s = connect_store("file://" + tmp.root().string(), 0, &error);
  ASSERT_NE(s, nullptr) << error;
  const std::string fifo = (tmp.root() / ("v" + hex("fifo"))).string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto start = Clock::now();
  EXPECT_FALSE(s->get("fifo", 5.0, &value, &error));
  EXPECT_LT(since(start), 1.0) << "waited on the FIFO";
  EXPECT_NE(error.find("get 'fifo': " + fifo + " is not a regular file"), std::string::npos)
      << error;
  int64_t n = 0;
  EXPECT_FALSE(s->add("fifo", 1, &n, &error));
  EXPECT_NE(error.find("not a regular file"), std::string::npos) << error;

  // A sparse file one byte over the limit: refused from its size, never read.
  const std::string huge = (tmp.root() / ("v" + hex("huge"))).string();
  {
    FILE* f = std::fopen(huge.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  ASSERT_EQ(::truncate(huge.c_str(), static_cast<off_t>(kreg::comm::kMaxStoreValueBytes) + 1), 0);
  start = Clock::now();
  EXPECT_FALSE(s->get("huge", 0, &value, &error));
  EXPECT_LT(since(start), 1.0);
  EXPECT_NE(error.find("more than 1073741824"), std::string::npos) << error;

  // A symbolic link planted as a value.
  const std::string link = (tmp.root() / ("v" + hex("link"))).string();
  ASSERT_EQ(::symlink("/etc/passwd", link.c_str()), 0);
  EXPECT_FALSE(s->get("link", 0, &value, &error));
  EXPECT_NE(error.find("is a symbolic link"), std::string::npos) << error;
  // A set replaces a planted file with a real value.
  ASSERT_TRUE(s->set("fifo", "now a value", &error)) << error;
  ASSERT_TRUE(s->get("fifo", 0, &value, &error)) << error;
  EXPECT_EQ(value, "now a value");
}

// ---- kreg-store ----

// Runs a shell command line; returns its exit code and stdout.
int run(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `kreg-store serve --port-file port_file` in a child, its stdout to `log`; -1 if the fork
// failed.
pid_t start_server(const std::string& port_file, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(log.c_str(), "w", stdout)) _exit(127);
    ::execl(KREG_STORE_CLI, KREG_STORE_CLI, "serve", "--port-file", port_file.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// The port the server wrote, once the file holds it (empty after 5 s).
std::string wait_for_port(const std::string& port_file) {
  std::string port;
  for (int i = 0; i < 500 && port.empty(); ++i) {
    std::ifstream(port_file) >> port;
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return port;
}

TEST(KregStoreCli, ServesUntilSigterm) {
  kreg::test::Scratch tmp;
  const std::string port_file = (tmp.root() / "port").string();
  const std::string log = (tmp.root() / "log").string();
  const pid_t pid = start_server(port_file, log);
  ASSERT_GE(pid, 0);
  const std::string port = wait_for_port(port_file);
  ASSERT_FALSE(port.empty()) << "no port file";
  const std::string cli = std::string(KREG_STORE_CLI) + " ";
  const std::string url = "--store tcp://127.0.0.1:" + port + " ";
  std::string out;
  EXPECT_EQ(run(cli + "set " + url + "nccl/id abc", &out), 0);
  EXPECT_EQ(run(cli + "get " + url + "nccl/id --timeout 1", &out), 0);
  EXPECT_EQ(out, "abc\n");
  EXPECT_EQ(run(cli + "add " + url + "n 5", &out), 0);
  EXPECT_EQ(run(cli + "add " + url + "n -- -7", &out), 0);
  EXPECT_EQ(out, "-2\n");
  EXPECT_EQ(run(cli + "get " + url + "missing --timeout 0.2 2>&1", &out), 1);
  EXPECT_EQ(out,
            "kreg-store: tcp://127.0.0.1:" + port + ": get 'missing': timed out after 0.2 s\n");
  EXPECT_EQ(run(cli + "get --store tcp://127.0.0.1:0 k 2>&1", &out), 2);
  EXPECT_NE(out.find("outside 1..65535"), std::string::npos) << out;
  EXPECT_EQ(run(cli + "get " + url + "2>&1", &out), 2);  // no key
  EXPECT_NE(out.find("Run with --help"), std::string::npos) << out;

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "kreg-store: serving on 127.0.0.1:" + port);
  EXPECT_FALSE(fs::exists(port_file)) << "the port file outlived the server";
}

// add's DELTA is a plain decimal int64 (digits, an optional '-'), the grammar the store
// parses its counters with: past int64 it was clamped, and "", "0x10", " 5" and "+5" were
// taken; now each is a usage error (exit 2) naming DELTA and the escaped value, and the
// counter is left as it was.
TEST(KregStoreCli, AddTakesOnlyADecimalInt64) {
  kreg::test::Scratch tmp;
  const std::string cli = std::string(KREG_STORE_CLI) + " add --store file://" +
                          (tmp.root() / "fs").string() + " -- c ";
  std::string out;
  ASSERT_EQ(run(cli + "5", &out), 0);
  EXPECT_EQ(out, "5\n");
  for (const std::string& bad :
       {"99999999999999999999", "-99999999999999999999", "9223372036854775808", "", "0x10", " 5",
        "+5", "5 ", "-", "1e3", "\x1b[31m"}) {
    EXPECT_EQ(run(cli + "'" + bad + "' 2>&1", &out), 2) << bad;
    std::string shown = bad == "\x1b[31m" ? "\\x1b[31m" : bad;
    EXPECT_NE(out.find("kreg-store: DELTA '" + shown +
                       "' is not a decimal integer in "
                       "[-9223372036854775808, 9223372036854775807]"),
              std::string::npos)
        << out;
  }
  // The extremes are taken, and the counter was not touched by the refusals.
  ASSERT_EQ(run(cli + "-9223372036854775808", &out), 0);
  EXPECT_EQ(out, "-9223372036854775803\n");
  ASSERT_EQ(run(cli + "9223372036854775807", &out), 0);
  EXPECT_EQ(out, "4\n");
  ASSERT_EQ(run(cli + "-0004", &out), 0);
  EXPECT_EQ(out, "0\n");
}

// The port file is only ever a regular file: a FIFO, a link or a directory at the path is
// refused (exit 1, left as it was) instead of being renamed over and removed at the stop;
// and a port file replaced while the server runs (another server's) is left at the stop.
TEST(KregStoreCli, PortFileReplacesOnlyARegularFile) {
  kreg::test::Scratch tmp;
  const std::string fifo = (tmp.root() / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = (tmp.root() / "link").string();
  fs::create_symlink(tmp.root() / "elsewhere", link);
  // Bounded: a server that took the path would serve until killed.
  const std::string cli = "timeout 10 " + std::string(KREG_STORE_CLI) + " serve --port-file ";
  std::string out;
  for (const std::string& path : {fifo, link, tmp.root().string()}) {
    EXPECT_EQ(run(cli + path + " 2>&1", &out), 1) << path;
    EXPECT_NE(out.find("is not a regular file"), std::string::npos) << out;
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FALSE(fs::exists(tmp.root() / "elsewhere"));

  const std::string port_file = (tmp.root() / "port").string();
  const pid_t pid = start_server(port_file, "/dev/null");
  ASSERT_GE(pid, 0);
  ASSERT_FALSE(wait_for_port(port_file).empty()) << "no port file";
  // Another writer's file now holds the path (a rename, as a second server would).
  const std::string other = port_file + ".other";
  std::ofstream(other) << "12345\n";
  ASSERT_EQ(::rename(other.c_str(), port_file.c_str()), 0);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::string kept;
  std::ifstream(port_file) >> kept;
  EXPECT_EQ(kept, "12345") << "the server removed a port file it had not written";
}

}  // namespace
