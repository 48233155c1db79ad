// The TCP store's server: one thread, poll() over the listening socket, a wake-up pipe and
// at most kMaxStoreClients connections, the map in memory. Every client is untrusted: a
// frame is checked against the limits as soon as its header is in, a body buffer grows
// only with the bytes that arrive, and whatever goes wrong with one connection (garbage,
// a bad length, a frame cut short, a client that stops mid-frame) drops that connection
// only. A GET for a missing key parks its connection until a SET of the key or its
// deadline; poll() sleeps until the nearest deadline, so nothing spins.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <vector>

#include "store.hpp"

namespace kreg::comm {
namespace {

using Clock = std::chrono::steady_clock;

// A connection in the middle of a frame (or of sending an answer) that moves no byte for
// this long is dropped, so stalled clients cannot hold their slots forever.
constexpr auto kStall = std::chrono::seconds(30);

std::string errno_text(int e) { return std::strerror(e); }

struct Conn {
  int fd = -1;
  bool dead = false;
  Clock::time_point last_progress;
  // The request being read: its header, then its body (key and payload).
  char hdr[detail::kRequestHeaderBytes];
  size_t hdr_got = 0;
  bool in_body = false;
  uint8_t op = 0;
  size_t key_len = 0;
  uint64_t body_len = 0;
  uint64_t body_got = 0;
  std::string body;
  bool discard = false;   // a refused SET: its body is read and dropped
  uint64_t reserved = 0;  // bytes this SET holds against the total while it arrives
  // A GET waiting for its key.
  bool waiting = false;
  std::string wait_key;
  Clock::time_point wait_deadline;
  // The answer being sent: header and small payloads, then a shared value (GET).
  std::string out;
  std::shared_ptr<const std::string> out_value;
  size_t out_off = 0;
  bool close_after_send = false;

  bool has_output() const { return !out.empty(); }
  bool mid_frame() const { return hdr_got > 0 || in_body; }
  bool can_read() const {
    return !dead && !close_after_send && !waiting && (!has_output() || discard);
  }
};

}  // namespace

struct TcpStoreServer::Impl {
  std::string host;
  int port = 0;
  int listen_fd = -1;
  int wake_r = -1;
  int wake_w = -1;
  std::atomic<bool> stopping{false};
  std::thread thread;
  // Bytes of every value string alive (in the map, or held by an answer being sent) plus
  // the map's keys; declared before the map, whose values' deleters count it down.
  uint64_t live_bytes = 0;
  uint64_t inflight_bytes = 0;  // bodies of SETs being received (reserved at their header)
  std::unordered_map<std::string, std::shared_ptr<const std::string>> map;
  std::vector<std::unique_ptr<Conn>> conns;
  Clock::time_point accept_resume;  // accept() ran out of descriptors: wait until then

  ~Impl() {
    for (auto& c : conns) ::close(c->fd);
    conns.clear();
    map.clear();
    for (int fd : {listen_fd, wake_r, wake_w}) {
      if (fd >= 0) ::close(fd);
    }
  }

  std::shared_ptr<const std::string> make_value(std::string&& v) {
    live_bytes += v.size();
    uint64_t* counter = &live_bytes;
    return std::shared_ptr<const std::string>(new std::string(std::move(v)),
                                              [counter](const std::string* s) {
                                                *counter -= s->size();
                                                delete s;
                                              });
  }

  void put(const std::string& key, std::shared_ptr<const std::string> value) {
    auto [it, inserted] = map.try_emplace(key, nullptr);
    if (inserted) live_bytes += key.size();
    it->second = std::move(value);
  }

  bool over_budget(uint64_t need) const {
    return live_bytes + inflight_bytes + need > kMaxStoreTotalBytes;
  }

  // Queues an answer (the connection sends it as the socket takes it).
  void answer(Conn& c, uint8_t status, std::string_view payload,
              std::shared_ptr<const std::string> value = nullptr) {
    const uint64_t len = value ? value->size() : payload.size();
    c.out.assign(detail::kResponseHeaderBytes, '\0');
    c.out[0] = static_cast<char>(status);
    detail::put_le(c.out.data() + 1, len, 8);
    c.out.append(payload);
    c.out_value = std::move(value);
    c.out_off = 0;
    c.last_progress = Clock::now();
    flush(c);
  }

  void error(Conn& c, std::string msg) {
    if (msg.size() > kMaxStoreErrorBytes) msg.resize(kMaxStoreErrorBytes);
    answer(c, detail::kStatusError, msg);
  }

  // A protocol violation: a best-effort ERROR, then the connection goes.
  void reject(Conn& c, std::string msg) {
    c.close_after_send = true;
    error(c, std::move(msg));
  }

  void flush(Conn& c) {
    while (!c.dead && c.has_output()) {
      const size_t vlen = c.out_value ? c.out_value->size() : 0;
      const size_t total = c.out.size() + vlen;
      iovec iov[2];
      int n = 0;
      if (c.out_off < c.out.size()) {
        iov[n++] = {c.out.data() + c.out_off, c.out.size() - c.out_off};
        if (vlen > 0) iov[n++] = {const_cast<char*>(c.out_value->data()), vlen};
      } else {
        iov[n++] = {const_cast<char*>(c.out_value->data()) + (c.out_off - c.out.size()),
                    total - c.out_off};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      const ssize_t sent = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
        return;
      }
      c.out_off += static_cast<size_t>(sent);
      c.last_progress = Clock::now();
      if (c.out_off == total) {
        c.out.clear();
        c.out_value.reset();
        c.out_off = 0;
        if (c.close_after_send) c.dead = true;
      }
    }
  }

  // Checks a complete header; starts the body or rejects the connection.
  void start_body(Conn& c) {
    const uint32_t magic = static_cast<uint32_t>(detail::get_le(c.hdr, 4));
    c.op = static_cast<uint8_t>(c.hdr[4]);
    const uint64_t key_len = detail::get_le(c.hdr + 5, 4);
    const uint64_t payload_len = detail::get_le(c.hdr + 9, 8);
    if (magic != detail::kProtoMagic) return reject(c, "not a kreg store request (bad magic)");
    if (c.op < detail::kOpSet || c.op > detail::kOpErase) {
      return reject(c, "unknown request " + std::to_string(c.op));
    }
    if (key_len == 0 || key_len > kMaxStoreKeyBytes) {
      return reject(c, "key length " + std::to_string(key_len) + " is outside 1.." +
                           std::to_string(kMaxStoreKeyBytes));
    }
    const uint64_t want = c.op == detail::kOpSet                               ? payload_len
                          : (c.op == detail::kOpGet || c.op == detail::kOpAdd) ? 8
                                                                               : 0;
    if (c.op == detail::kOpSet ? payload_len > kMaxStoreValueBytes : payload_len != want) {
      return reject(c, "payload length " + std::to_string(payload_len) + " is wrong for request " +
                           std::to_string(c.op) + " (at most " +
                           std::to_string(kMaxStoreValueBytes) + " for a set)");
    }
    c.key_len = static_cast<size_t>(key_len);
    c.body_len = key_len + payload_len;
    c.body_got = 0;
    c.body.clear();
    c.in_body = true;
    if (c.op == detail::kOpSet) {
      if (over_budget(c.body_len)) {
        // Answered now; the body is read and dropped, and the connection stays usable.
        c.discard = true;
        error(c, "store full: a set of " + std::to_string(payload_len) +
                     " bytes would take it past " + std::to_string(kMaxStoreTotalBytes) + " bytes");
      } else {
        c.reserved = c.body_len;
        inflight_bytes += c.reserved;
      }
    }
  }

  void release(Conn& c) {
    inflight_bytes -= c.reserved;
    c.reserved = 0;
  }

  // Reads what the socket has, up to the end of one frame, and handles a complete frame.
  void read_some(Conn& c) {
    while (c.can_read()) {
      ssize_t r;
      char scratch[64 * 1024];
      if (!c.in_body) {
        r = ::recv(c.fd, c.hdr + c.hdr_got, sizeof c.hdr - c.hdr_got, MSG_DONTWAIT);
      } else if (c.discard) {
        r = ::recv(c.fd, scratch,
                   static_cast<size_t>(std::min<uint64_t>(sizeof scratch, c.body_len - c.body_got)),
                   MSG_DONTWAIT);
      } else {
        if (c.body_got == c.body.size()) {
          const uint64_t grown = std::max<uint64_t>(64 * 1024, 2 * c.body.size());
          c.body.resize(static_cast<size_t>(std::min(c.body_len, grown)));
        }
        r = ::recv(c.fd, c.body.data() + c.body_got, c.body.size() - c.body_got, MSG_DONTWAIT);
      }
      if (r == 0) {  // the client is gone (mid-frame or not: nothing of it takes effect)
        c.dead = true;
        return;
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
        return;
      }
      c.last_progress = Clock::now();
      if (!c.in_body) {
        c.hdr_got += static_cast<size_t>(r);
        if (c.hdr_got == sizeof c.hdr) start_body(c);
        continue;
      }
      c.body_got += static_cast<uint64_t>(r);
      if (c.body_got < c.body_len) continue;
      c.in_body = false;
      c.hdr_got = 0;
      if (c.discard) {
        c.discard = false;
        c.body_got = 0;
        continue;
      }
      handle(c);
    }
  }

  void handle(Conn& c) {
    std::string key = c.body.substr(0, c.key_len);
    const std::string_view payload = std::string_view(c.body).substr(c.key_len);
    const uint64_t arg = payload.size() == 8 ? detail::get_le(payload.data(), 8) : 0;
    switch (c.op) {
      case detail::kOpSet: {
        release(c);
        std::string value = std::move(c.body);
        value.erase(0, c.key_len);
        put(key, make_value(std::move(value)));
        answer(c, detail::kStatusOk, {});
        wake_waiters(key);
        break;
      }
      case detail::kOpGet: {
        auto it = map.find(key);
        if (it != map.end()) {
          answer(c, detail::kStatusOk, {}, it->second);
        } else if (arg == 0) {
          answer(c, detail::kStatusTimeout, {});
        } else {
          c.waiting = true;
          c.wait_key = std::move(key);
          // A year is forever; it keeps the sum in range.
          const uint64_t ms = std::min<uint64_t>(arg, uint64_t{365} * 24 * 3600 * 1000);
          c.wait_deadline = Clock::now() + std::chrono::milliseconds(ms);
        }
        break;
      }
      case detail::kOpAdd: {
        const auto delta = static_cast<int64_t>(arg);
        int64_t v = 0;
        auto it = map.find(key);
        if (it != map.end() && !detail::parse_int64(*it->second, &v)) {
          // The client puts its URL, the op and the key in front.
          error(c, "value '" + detail::escape(*it->second, 32) + "' is not a decimal integer");
          break;
        }
        if (__builtin_add_overflow(v, delta, &v)) {
          error(c, "adding " + std::to_string(delta) + " overflows");
          break;
        }
        if (over_budget(key.size() + 20)) {
          error(c, "store full: add would take it past " + std::to_string(kMaxStoreTotalBytes) +
                       " bytes");
          break;
        }
        put(key, make_value(std::to_string(v)));
        char out[8];
        detail::put_le(out, static_cast<uint64_t>(v), 8);
        answer(c, detail::kStatusOk, {out, 8});
        wake_waiters(key);
        break;
      }
      case detail::kOpErase: {
        auto it = map.find(key);
        if (it != map.end()) {
          live_bytes -= it->first.size();
          map.erase(it);
        }
        answer(c, detail::kStatusOk, {});
        break;
      }
    }
    c.body.clear();
    c.body.shrink_to_fit();
  }

  void wake_waiters(const std::string& key) {
    auto it = map.find(key);
    if (it == map.end()) return;
    for (auto& w : conns) {
      if (w->waiting && !w->dead && w->wait_key == key) {
        w->waiting = false;
        w->wait_key.clear();
        answer(*w, detail::kStatusOk, {}, it->second);
      }
    }
  }

  void accept_all() {
    while (true) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors (or memory): the pending client stays queued and the listening
        // socket stays readable; leave it alone a while instead of polling it in a loop.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_resume = Clock::now() + std::chrono::milliseconds(100);
        }
        return;  // EAGAIN, or an error of that one client
      }
      if (conns.size() >= kMaxStoreClients) {
        static constexpr char kFull[] = "the store serves at most 1024 clients";
        char msg[detail::kResponseHeaderBytes + sizeof kFull - 1];
        msg[0] = static_cast<char>(detail::kStatusError);
        detail::put_le(msg + 1, sizeof kFull - 1, 8);
        std::memcpy(msg + detail::kResponseHeaderBytes, kFull, sizeof kFull - 1);
        (void)!::send(fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->last_progress = Clock::now();
      conns.push_back(std::move(c));
    }
  }

  // Answers expired GETs, drops stalled connections, and returns poll()'s timeout: the
  // nearest deadline in ms, or -1.
  int expire() {
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (auto& c : conns) {
      if (c->dead) continue;
      if (c->waiting) {
        if (c->wait_deadline <= now) {
          c->waiting = false;
          c->wait_key.clear();
          answer(*c, detail::kStatusTimeout, {});
        } else {
          next = std::min(next, c->wait_deadline);
        }
      }
      if (!c->dead && (c->mid_frame() || c->has_output())) {
        if (c->last_progress + kStall <= now) {
          c->dead = true;
        } else {
          next = std::min(next, c->last_progress + kStall);
        }
      }
    }
    if (accept_resume > now) next = std::min(next, accept_resume);
    if (next == Clock::time_point::max()) return -1;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
  }

  void sweep() {
    std::erase_if(conns, [this](const std::unique_ptr<Conn>& c) {
      if (!c->dead) return false;
      release(*c);
      ::close(c->fd);
      return true;
    });
  }

  void serve() {
    std::vector<pollfd> fds;
    while (!stopping.load()) {
      const int timeout = expire();
      sweep();
      fds.clear();
      fds.push_back({wake_r, POLLIN, 0});
      fds.push_back({listen_fd, static_cast<short>(accept_resume > Clock::now() ? 0 : POLLIN), 0});
      for (auto& c : conns) {
        short ev = POLLRDHUP;
        if (c->can_read()) ev |= POLLIN;
        if (c->has_output()) ev |= POLLOUT;
        fds.push_back({c->fd, ev, 0});
      }
      const int rc = ::poll(fds.data(), fds.size(), timeout);
      if (rc < 0) {
        if (errno == EINTR) continue;
        break;  // cannot happen with valid descriptors; stop serving rather than spin
      }
      if (fds[0].revents != 0) break;
      // Connections first (their indices match fds), then new ones.
      const size_t n = conns.size();
      for (size_t i = 0; i < n; ++i) {
        Conn& c = *conns[i];
        const short re = fds[i + 2].revents;
        if (re == 0 || c.dead) continue;
        try {
          if (re & (POLLERR | POLLNVAL)) {
            c.dead = true;
            continue;
          }
          if (re & POLLOUT) flush(c);
          if (re & POLLIN) read_some(c);
          // Hung up with nothing left to read: a parked GET or a client gone mid-answer.
          if ((re & (POLLHUP | POLLRDHUP)) && !(re & POLLIN)) c.dead = true;
        } catch (const std::exception&) {
          c.dead = true;  // out of memory for this client's frame: drop it, keep serving
        }
      }
      if (fds[1].revents & POLLIN) accept_all();
    }
    // Stopped: clients see their connections close, new ones are refused.
    for (auto& c : conns) ::close(c->fd);
    conns.clear();
    ::close(listen_fd);
    listen_fd = -1;
  }
};

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

int TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->stopping.store(true);
  const char b = 1;
  (void)!::write(impl_->wake_w, &b, 1);
  impl_->thread.join();
}

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(const std::string& host, int port,
                                                      std::string* error) {
  const std::string where =
      "kreg store server " + detail::escape(host) + ":" + std::to_string(port);
  uint32_t addr = 0;
  if (!detail::parse_ipv4_host(host, &addr)) {
    *error = where + ": host is not an IPv4 address or localhost";
    return nullptr;
  }
  if (port < 0 || port > 65535) {
    *error = where + ": port is outside 0..65535";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl->listen_fd < 0) {
    *error = where + ": cannot create a socket: " + errno_text(errno);
    return nullptr;
  }
  const int one = 1;
  ::setsockopt(impl->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = addr;
  if (::bind(impl->listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    *error = where + ": cannot bind: " + errno_text(errno);
    return nullptr;
  }
  if (::listen(impl->listen_fd, SOMAXCONN) != 0) {
    *error = where + ": cannot listen: " + errno_text(errno);
    return nullptr;
  }
  socklen_t len = sizeof sa;
  if (::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    *error = where + ": cannot read the bound port: " + errno_text(errno);
    return nullptr;
  }
  impl->port = ntohs(sa.sin_port);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = where + ": cannot create a pipe: " + errno_text(errno);
    return nullptr;
  }
  impl->wake_r = pipefd[0];
  impl->wake_w = pipefd[1];
  Impl* raw = impl.get();
  try {
    raw->thread = std::thread([raw] { raw->serve(); });
  } catch (const std::exception& e) {
    *error = where + ": cannot start the server thread: " + e.what();
    return nullptr;
  }
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

}  // namespace kreg::comm
