#include "kreg/admission.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <system_error>

#include "kreg/sha256.hpp"

namespace kreg {

namespace fs = std::filesystem;

namespace {

std::string mode_string(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Who besides the owner may write `path`, or "" when nobody.
std::string writable_by_others(const fs::path& path, mode_t* mode) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  *mode = st.st_mode;
  const bool group = st.st_mode & S_IWGRP, other = st.st_mode & S_IWOTH;
  if (group && other) return "its group and all users";
  if (other) return "all users";
  if (group) return "its group";
  return "";
}

bool is_within(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

}  // namespace

Status check_path_safety(const fs::path& library, const fs::path& plugin_dir) {
  std::error_code ec;
  const fs::path dir = fs::canonical(plugin_dir, ec);
  if (ec) {
    return Status(KREG_NOT_FOUND,
                  "plugin folder " + plugin_dir.string() + " cannot be resolved: " + ec.message());
  }
  const fs::path real = fs::canonical(library, ec);
  if (ec) {
    return Status(KREG_NOT_FOUND,
                  "library " + library.string() + " cannot be resolved: " + ec.message());
  }
  const std::string resolved = real == library ? "" : " (it resolves to " + real.string() + ")";
  if (!is_within(real, dir)) {
    return Status(KREG_PERMISSION_DENIED,
                  "library " + library.string() + " resolves to " + real.string() +
                      ", outside the plugin folder " + dir.string() +
                      "; kreg loads plugins only from inside the plugin folder (a symbolic "
                      "link pointing out of it, or a library path with '..'?)");
  }
  mode_t mode = 0;
  if (std::string who = writable_by_others(real, &mode); !who.empty()) {
    return Status(KREG_PERMISSION_DENIED,
                  "library " + library.string() + resolved + " is writable by " + who + " (mode " +
                      mode_string(mode) +
                      "): someone else could replace the code kreg runs; run chmod go-w " +
                      real.string());
  }
  // Every folder from the plugin folder down to the file: whoever may write one of them
  // can rename another library into the library's place.
  for (fs::path d = real.parent_path();; d = d.parent_path()) {
    if (std::string who = writable_by_others(d, &mode); !who.empty()) {
      return Status(KREG_PERMISSION_DENIED,
                    "folder " + d.string() + " holding library " + library.string() + resolved +
                        " is writable by " + who + " (mode " + mode_string(mode) +
                        "): someone else could swap the library; run chmod go-w " + d.string());
    }
    if (d == dir || !d.has_relative_path()) break;
  }
  return OkStatus();
}

Status check_pin(const fs::path& library, std::string_view expected) {
  auto actual = sha256_file(library);
  if (!actual) return actual.status();
  if (*actual != expected) {
    return Status(KREG_FAILED_PRECONDITION,
                  "library " + library.string() + " does not match its sha256 pin: expected " +
                      std::string(expected) + ", actual " + *actual +
                      " (a different build; if it is the intended one, run kreg validate "
                      "--update-pins)");
  }
  return OkStatus();
}

Status admit_library(const GroupEntry& entry) {
  fs::path dir = entry.plugin_dir.empty() ? entry.library.parent_path() : entry.plugin_dir;
  if (dir.empty()) dir = ".";
  if (Status st = check_path_safety(entry.library, dir); !st.ok()) {
    return Status(st.code(), "group '" + entry.name + "': " + st.message());
  }
  if (entry.sha256) {
    if (Status st = check_pin(entry.library, *entry.sha256); !st.ok()) {
      const std::string at =
          entry.sha256_where.line > 0 ? " (pinned at " + entry.sha256_where.to_string() + ")" : "";
      return Status(st.code(), "group '" + entry.name + "'" + at + ": " + st.message());
    }
  }
  return OkStatus();
}

}  // namespace kreg
