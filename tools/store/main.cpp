// kreg-store: the communication group's bootstrap store from the command line.
//   kreg-store serve [--host 127.0.0.1] [--port 0] [--port-file PATH]
//   kreg-store set --store URL KEY VALUE
//   kreg-store get --store URL KEY [--timeout S]
//   kreg-store add --store URL KEY DELTA
// Exit codes as kreg's: 0 done, 1 the store failed (refused, timed out, an error from the
// server, a port that cannot be bound), 2 a usage error (bad option, host or URL).
// get prints the value and a newline: raw bytes into a pipe or file, escaped on a terminal.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_numbers.hpp"
#include "store.hpp"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

using kreg::comm::detail::escape;

int fail(int code, const std::string& line) {
  std::fprintf(stderr, "kreg-store: %s\n", line.c_str());
  return code;
}

// A URL the parser refuses is the user's to fix (2); a store that does not answer is 1.
bool is_url_error(const std::string& error) { return error.rfind("store URL '", 0) == 0; }

// The port file as written: its device and inode, so that only this file is removed at the
// stop (not one another process has put there since).
struct PortFile {
  dev_t dev = 0;
  ino_t ino = 0;
};

// Writes the port to path through a temporary file and rename(), so a launcher polling for
// the file reads a whole number or nothing. Only a regular file (or nothing) is replaced:
// a FIFO, device, socket or directory at the path is refused, not renamed over and later
// removed; the temporary name is created exclusively and never followed as a link.
bool write_port_file(const std::string& path, int port, PortFile* written, std::string* error) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    *error = "the port file " + escape(path, 4096) + " exists and is not a regular file";
    return false;
  }
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write the port file " + escape(tmp, 4096) + ": " + std::strerror(errno);
    return false;
  }
  const std::string text = std::to_string(port) + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fstat(fd, &st) == 0;
  const int e = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(tmp.c_str());
    *error =
        "cannot write the port file " + escape(tmp, 4096) + ": " + std::strerror(ok ? errno : e);
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int re = errno;
    ::unlink(tmp.c_str());
    *error = "cannot rename " + escape(tmp, 4096) + " to " + escape(path, 4096) + ": " +
             std::strerror(re);
    return false;
  }
  *written = PortFile{st.st_dev, st.st_ino};
  return true;
}

// Removes the port file if it is still the one written.
void remove_port_file(const std::string& path, const PortFile& written) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && st.st_dev == written.dev && st.st_ino == written.ino) {
    ::unlink(path.c_str());
  }
}

int cmd_serve(const std::string& host, int port, const std::string& port_file) {
  // Block the stop signals before the server thread starts (it inherits the mask), then
  // wait for one here: a clean stop, never a handler racing the server.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  uint32_t addr = 0;
  if (!kreg::comm::detail::parse_ipv4_host(host, &addr)) {
    return fail(kExitUsage, "--host '" + escape(host) + "' is not an IPv4 address or localhost");
  }
  // Room for every client the server takes (the usual soft limit is 1024 descriptors).
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 4096 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = std::min<rlim_t>(4096, lim.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  std::string error;
  auto server = kreg::comm::TcpStoreServer::start(host, port, &error);
  if (!server) return fail(kExitFailed, error);
  PortFile written;
  if (!port_file.empty() && !write_port_file(port_file, server->port(), &written, &error)) {
    return fail(kExitFailed, error);
  }
  std::printf("kreg-store: serving on %s:%d\n", escape(host).c_str(), server->port());
  std::fflush(stdout);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  server->stop();
  if (!port_file.empty()) remove_port_file(port_file, written);
  std::fprintf(stderr, "kreg-store: stopped (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  return kExitOk;
}

std::unique_ptr<kreg::comm::Store> open_store(const std::string& url, double timeout_s, int* rc) {
  std::string error;
  auto store = kreg::comm::connect_store(url, timeout_s, &error);
  if (!store) *rc = fail(is_url_error(error) ? kExitUsage : kExitFailed, error);
  return store;
}

int cli_exit(const CLI::App& app, const CLI::Error& e, int code) {
  if (code != kExitOk) {
    return fail(code, escape(e.what(), 4096) + "\nRun with --help for more information.");
  }
  return app.exit(e);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kreg-store: the bootstrap key-value store of the communication group"};
  app.require_subcommand(1);

  std::string host = "127.0.0.1";
  int port = 0;
  std::string port_file;
  auto* serve = app.add_subcommand("serve", "serve a TCP store until SIGINT or SIGTERM");
  serve->add_option("--host", host, "IPv4 address or localhost to bind (default 127.0.0.1)");
  serve->add_option("--port", port, "port to bind (default 0: any free port)")
      ->check(CLI::Range(0, 65535));
  serve->add_option("--port-file", port_file,
                    "write the bound port here (atomically) once serving");

  std::string url, key, value;
  // Taken as text and parsed by the store's own int64 parser (detail::parse_int64, the one
  // add applies to the value at the key): a plain decimal, an optional '-', in int64's range.
  // CLI11's conversion clamped "99999999999999999999" to INT64_MAX and took "", "0x10",
  // " 5" and "+5".
  std::string delta_text;
  double timeout_s = 10;
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("--store", url, "store URL: tcp://HOST:PORT or file:///absolute/dir")
        ->required();
    sub->add_option("key", key, "key")->required();
  };
  auto* set = app.add_subcommand("set", "set KEY to VALUE");
  add_common(set);
  set->add_option("value", value, "value")->required();
  set->add_option("--timeout", timeout_s, "seconds to keep trying to connect (default 10)")
      ->check(kreg::cli::finite_range(0, 86400));
  auto* get = app.add_subcommand("get", "wait for KEY and print its value");
  add_common(get);
  get->add_option("--timeout", timeout_s,
                  "seconds to wait for the server and for the key (default 10)")
      ->check(kreg::cli::finite_range(0, 86400));
  auto* add = app.add_subcommand("add", "add DELTA to the integer at KEY, print the new value");
  add_common(add);
  add->add_option("delta", delta_text,
                  "a signed decimal integer in [-9223372036854775808, 9223372036854775807]")
      ->required();
  add->add_option("--timeout", timeout_s, "seconds to keep trying to connect (default 10)")
      ->check(kreg::cli::finite_range(0, 86400));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli_exit(app, e, kExitOk);
  } catch (const CLI::CallForAllHelp& e) {
    return cli_exit(app, e, kExitOk);
  } catch (const CLI::ParseError& e) {
    return cli_exit(app, e, kExitUsage);
  }

  if (*serve) return cmd_serve(host, port, port_file);
  // Every argument is checked before the store is opened.
  int64_t delta = 0;
  if (*add && !kreg::comm::detail::parse_int64(delta_text, &delta)) {
    return fail(kExitUsage, "DELTA '" + escape(delta_text) +
                                "' is not a decimal integer in [-9223372036854775808, "
                                "9223372036854775807] (digits, an optional leading '-')");
  }
  int rc = kExitOk;
  auto store = open_store(url, timeout_s, &rc);
  if (!store) return rc;
  std::string error;
  if (*set) {
    if (!store->set(key, value, &error)) return fail(kExitFailed, error);
    return kExitOk;
  }
  if (*get) {
    std::string v;
    if (!store->get(key, timeout_s, &v, &error)) return fail(kExitFailed, error);
    if (::isatty(STDOUT_FILENO)) v = escape(v, v.size());
    v += '\n';
    if (std::fwrite(v.data(), 1, v.size(), stdout) != v.size() || std::fflush(stdout) != 0) {
      return fail(kExitFailed, "cannot write the value to stdout");
    }
    return kExitOk;
  }
  if (*add) {
    int64_t result = 0;
    if (!store->add(key, delta, &result, &error)) return fail(kExitFailed, error);
    std::printf("%lld\n", static_cast<long long>(result));
    return kExitOk;
  }
  return kExitUsage;
}
