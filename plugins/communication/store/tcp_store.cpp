// The TCP store's client and connect_store(): parses a store URL, connects (retrying until
// the timeout, for ranks that start before the server), and speaks the protocol of
// store.hpp on one connection, one request at a time.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "store.hpp"

namespace kreg::comm {
namespace detail {

bool parse_ipv4_host(std::string_view host, uint32_t* addr_be) {
  if (host == "localhost") {
    *addr_be = htonl(INADDR_LOOPBACK);
    return true;
  }
  // inet_pton takes exactly four decimal parts, no shorthand forms.
  if (host.empty() || host.size() > 15) return false;
  const std::string h(host);
  in_addr a{};
  if (::inet_pton(AF_INET, h.c_str(), &a) != 1) return false;
  *addr_be = a.s_addr;
  return true;
}

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;
using detail::escape;
using detail::quote_key;

// An I/O wait (connect, one send, the next bytes of an answer) that sees no progress for
// this long gives up: the server is gone or wedged.
constexpr double kStallSeconds = 60.0;

std::string errno_text(int e) {
  std::string s = std::strerror(e);
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z') s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

int ms_until(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

Clock::duration seconds(double s) {
  if (!(s > 0)) return Clock::duration::zero();
  s = std::min(s, 3.15e7);  // a year: forever, and in range
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

class TcpStore final : public Store {
 public:
  TcpStore(std::string url, uint32_t addr_be, int port, double connect_timeout_s)
      : url_(std::move(url)),
        addr_be_(addr_be),
        port_(port),
        connect_timeout_s_(connect_timeout_s) {}
  ~TcpStore() override { disconnect(); }

  // Connects, retrying refused or failed attempts with a backoff until timeout_s.
  bool connect(double timeout_s, std::string* error) {
    const auto deadline = Clock::now() + seconds(timeout_s);
    auto backoff = std::chrono::milliseconds(10);
    int last = 0;
    while (true) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        *error = url_ + ": cannot create a socket: " + errno_text(errno);
        return false;
      }
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<uint16_t>(port_));
      sa.sin_addr.s_addr = addr_be_;
      int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        // Wait at least a little even past the deadline: one attempt always gets its chance.
        rc = ::poll(&p, 1, std::max(ms_until(deadline), 100));
        int err = 0;
        socklen_t len = sizeof err;
        if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
          rc = 0;
        } else {
          errno = rc == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
          rc = -1;
        }
      }
      if (rc == 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = fd;
        return true;
      }
      last = errno;
      ::close(fd);
      const auto now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
    *error =
        url_ + ": " + errno_text(last) + " after " + detail::seconds_text(std::max(timeout_s, 0.0));
    return false;
  }

  bool set(std::string_view key, std::string_view value, std::string* error) override {
    if (!check(key, "set", error)) return false;
    if (value.size() > kMaxStoreValueBytes) {
      *error = where("set", key) + "value of " + std::to_string(value.size()) +
               " bytes is larger than " + std::to_string(kMaxStoreValueBytes);
      return false;
    }
    std::string reply;
    return call(detail::kOpSet, "set", key, value, 0, &reply, error);
  }

  bool get(std::string_view key, double timeout_s, std::string* value,
           std::string* error) override {
    if (!check(key, "get", error)) return false;
    if (!(timeout_s >= 0)) timeout_s = 0;
    timeout_s = std::min(timeout_s, 3.15e7);
    char payload[8];
    detail::put_le(payload, static_cast<uint64_t>(std::ceil(timeout_s * 1000)), 8);
    uint8_t status = 0;
    if (!call(detail::kOpGet, "get", key, {payload, 8}, timeout_s, value, error, &status)) {
      return false;
    }
    if (status == detail::kStatusTimeout) {
      *error = where("get", key) + "timed out after " + detail::seconds_text(timeout_s);
      return false;
    }
    return true;
  }

  bool add(std::string_view key, int64_t delta, int64_t* result, std::string* error) override {
    if (!check(key, "add", error)) return false;
    char payload[8];
    detail::put_le(payload, static_cast<uint64_t>(delta), 8);
    std::string reply;
    if (!call(detail::kOpAdd, "add", key, {payload, 8}, 0, &reply, error)) return false;
    *result = static_cast<int64_t>(detail::get_le(reply.data(), 8));
    return true;
  }

  bool erase(std::string_view key, std::string* error) override {
    if (!check(key, "erase", error)) return false;
    std::string reply;
    return call(detail::kOpErase, "erase", key, {}, 0, &reply, error);
  }

  std::string url() const override { return url_; }

 private:
  std::string where(const char* op, std::string_view key) const {
    return url_ + ": " + op + " " + quote_key(key) + ": ";
  }

  bool check(std::string_view key, const char* op, std::string* error) const {
    std::string why;
    if (detail::check_key(key, &why)) return true;
    *error = url_ + ": " + op + ": " + why;
    return false;
  }

  void disconnect() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Waits for fd to be ready for `events` (at most ms); false + *why on a timeout or error.
  static bool wait(int fd, short events, int ms, std::string* why) {
    pollfd p{fd, events, 0};
    while (true) {
      const int rc = ::poll(&p, 1, ms);
      if (rc > 0) return true;
      if (rc == 0) {
        *why = "no answer from the server in " + detail::seconds_text(ms / 1000.0);
        return false;
      }
      if (errno != EINTR) {
        *why = "poll failed: " + errno_text(errno);
        return false;
      }
    }
  }

  bool send_all(std::string_view head, std::string_view body, std::string* why) {
    size_t off = 0;
    const size_t total = head.size() + body.size();
    while (off < total) {
      iovec iov[2];
      int n = 0;
      if (off < head.size()) {
        iov[n++] = {const_cast<char*>(head.data()) + off, head.size() - off};
        if (!body.empty()) iov[n++] = {const_cast<char*>(body.data()), body.size()};
      } else {
        iov[n++] = {const_cast<char*>(body.data()) + (off - head.size()), total - off};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      const ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (!wait(fd_, POLLOUT, static_cast<int>(kStallSeconds * 1000), why)) return false;
          continue;
        }
        *why = "cannot send: " + errno_text(errno);
        return false;
      }
      off += static_cast<size_t>(sent);
    }
    return true;
  }

  // Reads exactly n bytes into dst, waiting at most ms for each chunk.
  bool recv_all(char* dst, size_t n, int ms, std::string* why) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, dst + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) {
        *why = "the server closed the connection";
        return false;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait(fd_, POLLIN, ms, why)) return false;
        continue;
      }
      *why = "cannot receive: " + errno_text(errno);
      return false;
    }
    return true;
  }

  // One request and its answer. An OK answer's payload goes to *reply (and the status to
  // *status_out when given: GET's TIMEOUT is the caller's to word); ERROR becomes *error.
  // Anything wrong with the connection closes it: the next call connects again.
  bool call(uint8_t op, const char* op_name, std::string_view key, std::string_view payload,
            double wait_s, std::string* reply, std::string* error, uint8_t* status_out = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) {
      std::string why;
      if (!connect(connect_timeout_s_, &why)) {
        *error = where(op_name, key) + "not connected (" + why + ")";
        return false;
      }
    }
    std::string head(detail::kRequestHeaderBytes, '\0');
    detail::put_le(head.data(), detail::kProtoMagic, 4);
    head[4] = static_cast<char>(op);
    detail::put_le(head.data() + 5, key.size(), 4);
    detail::put_le(head.data() + 9, payload.size(), 8);
    head.append(key);
    std::string why;
    // The first answer byte may take the server's wait for the key plus a stall.
    const int first_ms = static_cast<int>(std::min((wait_s + kStallSeconds) * 1000, 1e9));
    char rh[detail::kResponseHeaderBytes];
    if (!send_all(head, payload, &why) || !recv_all(rh, sizeof rh, first_ms, &why)) {
      disconnect();
      *error = where(op_name, key) + why;
      return false;
    }
    const auto status = static_cast<uint8_t>(rh[0]);
    const uint64_t len = detail::get_le(rh + 1, 8);
    uint64_t max = 0;
    bool ok = true;
    if (status == detail::kStatusOk) {
      max = op == detail::kOpGet ? kMaxStoreValueBytes : op == detail::kOpAdd ? 8 : 0;
      ok = op == detail::kOpGet ? len <= max : len == max;
    } else if (status == detail::kStatusError) {
      max = kMaxStoreErrorBytes;
      ok = len <= max;
    } else if (status == detail::kStatusTimeout) {
      ok = op == detail::kOpGet && len == 0;
    } else {
      ok = false;
    }
    if (!ok) {
      disconnect();
      *error = where(op_name, key) + "bad answer from the server (status " +
               std::to_string(status) + ", " + std::to_string(len) + " bytes)";
      return false;
    }
    // Grow with the bytes that arrive, not with what the header claims.
    reply->clear();
    const int stall_ms = static_cast<int>(kStallSeconds * 1000);
    while (reply->size() < len) {
      const size_t have = reply->size();
      const size_t chunk = static_cast<size_t>(
          std::min<uint64_t>(len - have, std::max<size_t>(have, size_t{1} << 20)));
      reply->resize(have + chunk);
      if (!recv_all(reply->data() + have, chunk, stall_ms, &why)) {
        disconnect();
        *error = where(op_name, key) + why;
        return false;
      }
    }
    if (status == detail::kStatusError) {
      *error = where(op_name, key) + escape(*reply, kMaxStoreErrorBytes);
      return false;
    }
    if (status_out != nullptr) *status_out = status;
    return true;
  }

  const std::string url_;
  const uint32_t addr_be_;
  const int port_;
  const double connect_timeout_s_;
  std::mutex mu_;
  int fd_ = -1;
};

bool bad_url(std::string_view url, const std::string& why, std::string* error) {
  *error = "store URL '" + escape(url, 512) + "': " + why;
  return false;
}

// "HOST:PORT" of a tcp:// URL.
bool parse_host_port(std::string_view url, std::string_view hp, std::string* host,
                     uint32_t* addr_be, int* port, std::string* error) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string_view::npos) return bad_url(url, "missing ':PORT'", error);
  const std::string_view h = hp.substr(0, colon);
  const std::string_view p = hp.substr(colon + 1);
  if (h.empty()) return bad_url(url, "empty host", error);
  if (!detail::parse_ipv4_host(h, addr_be)) {
    return bad_url(url, "host '" + escape(h) + "' is not an IPv4 address or localhost", error);
  }
  if (p.empty()) return bad_url(url, "empty port", error);
  size_t digits = 0;
  int64_t v = 0;
  while (digits < p.size() && p[digits] >= '0' && p[digits] <= '9') {
    if (v <= 65535) v = v * 10 + (p[digits] - '0');
    ++digits;
  }
  if (digits == 0) return bad_url(url, "port '" + escape(p) + "' is not a number", error);
  if (digits < p.size()) {
    return bad_url(url, "trailing characters '" + escape(p.substr(digits)) + "' after the port",
                   error);
  }
  if (v < 1 || v > 65535) {
    return bad_url(url, "port " + escape(p) + " is outside 1..65535", error);
  }
  *host = std::string(h);
  *port = static_cast<int>(v);
  return true;
}

}  // namespace

std::unique_ptr<Store> connect_store(std::string_view url, double timeout_s, std::string* error) {
  for (char ch : url) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      bad_url(url, "control characters (escape codes, NULs) are not allowed", error);
      return nullptr;
    }
  }
  if (!(timeout_s >= 0)) timeout_s = 0;
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kFile = "file://";
  if (url.starts_with(kTcp)) {
    std::string host;
    uint32_t addr = 0;
    int port = 0;
    if (!parse_host_port(url, url.substr(kTcp.size()), &host, &addr, &port, error)) {
      return nullptr;
    }
    auto store = std::make_unique<TcpStore>("tcp://" + host + ":" + std::to_string(port), addr,
                                            port, timeout_s);
    if (!store->connect(timeout_s, error)) return nullptr;
    return store;
  }
  if (url.starts_with(kFile)) {
    const std::string_view path = url.substr(kFile.size());
    if (path.empty() || path[0] != '/') {
      bad_url(url, "a file store needs an absolute path (file:///dir)", error);
      return nullptr;
    }
    return detail::open_file_store(std::string(path), error);
  }
  bad_url(url, "unknown scheme (expected tcp://HOST:PORT or file:///absolute/dir)", error);
  return nullptr;
}

}  // namespace kreg::comm
