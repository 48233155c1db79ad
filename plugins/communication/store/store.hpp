// The bootstrap store of the communication group: a small key-value store that the ranks of
// a communicator share before and during setup (rank 0 publishes NCCL's ncclUniqueId, the
// others wait for it) and that the CPU collectives use as a slow transport (values of tens
// of MB). Two implementations behind one interface:
//
//   tcp://HOST:PORT      a TcpStoreServer (kreg-store serve, or one started in-process);
//                        HOST is an IPv4 literal or "localhost".
//   file:///abs/dir      a directory on a file system all ranks see (one host, or NFS with
//                        rename() and flock() working).
//
// Plain C++ (bool + std::string* error): plugins link this library, never the kreg core.
// Keys are arbitrary bytes, 1..kMaxStoreKeyBytes long; values 0..kMaxStoreValueBytes.
//
// ---- TCP protocol (all integers little-endian) ----
// Request:  u32 magic 'KRS1' (0x3153524b), u8 op, u32 key_len, u64 payload_len, key, payload
//   op 1 SET    payload = the value
//   op 2 GET    payload = u64 timeout in milliseconds (payload_len 8); the server answers
//               when the key exists or the timeout passes (no polling by the client)
//   op 3 ADD    payload = i64 delta (payload_len 8); the stored value is a decimal integer
//   op 4 ERASE  payload empty
// Response: u8 status, u64 payload_len, payload
//   status 0 OK       GET: the value; ADD: i64 new value (8 bytes); SET, ERASE: empty
//   status 1 ERROR    payload = a message (at most kMaxStoreErrorBytes)
//   status 2 TIMEOUT  GET only, empty payload
// One request at a time per connection: the server reads the next request once the answer
// to the previous one is sent. It checks key_len and payload_len against the limits (and a
// SET against the 4 GiB total) as soon as the header is in, before it buffers a byte of the
// body, and grows a body buffer only as bytes arrive. A bad magic, op or length drops the
// connection (after a best-effort ERROR); a SET that would exceed the total is answered
// with ERROR and its body is read and discarded, so the connection stays usable.
//
// ---- File store layout ----
// A key becomes hex (two lowercase digits a byte), cut into chunks of 128 digits: every
// chunk but the last is a directory "d<chunk>", the last names the value file "v<chunk>"
// and its lock file "l<chunk>" (for add). Temporary files start with ".t". So key "ab" is
// <dir>/v6162, and '/' or ".." in a key never leaves the directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kreg::comm {

inline constexpr size_t kMaxStoreKeyBytes = 1024;
inline constexpr size_t kMaxStoreValueBytes = size_t{1} << 30;  // 1 GiB
// The TCP server refuses a set that would take its keys and values past this.
inline constexpr uint64_t kMaxStoreTotalBytes = uint64_t{4} << 30;  // 4 GiB
inline constexpr size_t kMaxStoreErrorBytes = 4096;
// The most clients a TcpStoreServer serves at once; more are answered ERROR and closed.
inline constexpr size_t kMaxStoreClients = 1024;

class Store {
 public:
  virtual ~Store() = default;
  // Sets key (overwrites). Returns false with *error filled on failure.
  virtual bool set(std::string_view key, std::string_view value, std::string* error) = 0;
  // Waits up to timeout_s for key to exist, then returns its value.
  virtual bool get(std::string_view key, double timeout_s, std::string* value,
                   std::string* error) = 0;
  // Atomically adds delta to the decimal integer stored at key (absent: 0); *result = new value.
  virtual bool add(std::string_view key, int64_t delta, int64_t* result, std::string* error) = 0;
  // Removes key (absent: not an error).
  virtual bool erase(std::string_view key, std::string* error) = 0;
  virtual std::string url() const = 0;
};

// "tcp://HOST:PORT" (IPv4 literal or "localhost"; retries connecting until timeout_s) or
// "file:///absolute/dir" (the directory is created if missing). nullptr + *error otherwise.
// A TCP store serializes its calls on one connection (safe to share between threads).
std::unique_ptr<Store> connect_store(std::string_view url, double timeout_s, std::string* error);

class TcpStoreServer {
 public:
  // Binds host:port (port 0: an ephemeral port) and serves on a background thread.
  static std::unique_ptr<TcpStoreServer> start(const std::string& host, int port,
                                               std::string* error);
  ~TcpStoreServer();  // stops and joins
  int port() const;
  void stop();

  struct Impl;  // tcp_server.cpp

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace detail {

// Bytes for an error message: printable ASCII as it is, anything else (control characters,
// escape codes, NULs, bytes >= 0x80) and '\\' as \xNN; cut after max_bytes of input
// with "..." and the full length.
inline std::string escape(std::string_view s, size_t max_bytes = 128) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = s.size() < max_bytes ? s.size() : max_bytes;
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

// "'key'" escaped, for messages.
inline std::string quote_key(std::string_view key) { return "'" + escape(key) + "'"; }

// A "%.1f s" duration for messages.
std::string seconds_text(double s);

// Checks a key against the limits: false + *error ("empty key", "key of N bytes is longer
// than 1024") otherwise.
bool check_key(std::string_view key, std::string* error);

// Parses the decimal integer an add works on ("" or absent is the caller's 0).
bool parse_int64(std::string_view text, int64_t* out);

// "localhost" or a dotted-quad IPv4 literal, as a network-order address.
bool parse_ipv4_host(std::string_view host, uint32_t* addr_be);

// The TCP protocol's constants and little-endian integers (layout at the top).
inline constexpr uint32_t kProtoMagic = 0x3153524b;  // "KRS1"
enum : uint8_t { kOpSet = 1, kOpGet = 2, kOpAdd = 3, kOpErase = 4 };
enum : uint8_t { kStatusOk = 0, kStatusError = 1, kStatusTimeout = 2 };
inline constexpr size_t kRequestHeaderBytes = 4 + 1 + 4 + 8;
inline constexpr size_t kResponseHeaderBytes = 1 + 8;
inline void put_le(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// The file store over an absolute directory (created if missing).
std::unique_ptr<Store> open_file_store(const std::string& dir, std::string* error);

}  // namespace detail
}  // namespace kreg::comm
