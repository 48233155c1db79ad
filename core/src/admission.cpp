#include "kreg/admission.hpp"

#include "kreg/elf_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

#include "kreg/elf_file.hpp"
#include "kreg/sha256.hpp"
#include "kreg/text.hpp"

namespace kreg {

namespace fs = std::filesystem;

namespace {

std::string quoted(const fs::path& p) { return escape_control(p.string()); }

std::string mode_string(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

// Who besides the owner may write a file of this mode, or "" when nobody.
std::string writable_by_others(unsigned mode) {
  const bool group = mode & S_IWGRP, other = mode & S_IWOTH;
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

Result<RegularFile> open_library_file(const fs::path& library) {
  return RegularFile::open(library, "plugin library", kMaxAdmittedLibraryBytes);
}

Status check_path_safety(const RegularFile& library, const fs::path& plugin_dir) {
  const fs::path& path = library.path();
  const std::string lib = quoted(path);
  std::error_code ec;
  const fs::path dir = fs::canonical(plugin_dir, ec);
  if (ec) {
    return Status(KREG_NOT_FOUND,
                  "plugin folder " + quoted(plugin_dir) + " cannot be resolved: " + ec.message());
  }
  const fs::path real = fs::canonical(path, ec);
  if (ec) {
    return Status(KREG_ABORTED, "library " + lib + " cannot be resolved any more (" + ec.message() +
                                    "): it was removed or renamed while being checked");
  }
  const std::string resolved = real == path ? "" : " (it resolves to " + quoted(real) + ")";
  if (!is_within(real, dir)) {
    return Status(KREG_PERMISSION_DENIED,
                  "library " + lib + " resolves to " + quoted(real) +
                      ", outside the plugin folder " + quoted(dir) +
                      "; kreg loads plugins only from inside the plugin folder (a symbolic "
                      "link pointing out of it, or a library path with '..'?)");
  }
  // The checks below are about the opened file; the path must still lead to it, or they
  // would vouch for another file than the one loaded.
  struct stat now {};
  if (::stat(real.c_str(), &now) != 0 || static_cast<uint64_t>(now.st_dev) != library.device() ||
      static_cast<uint64_t>(now.st_ino) != library.inode()) {
    return Status(KREG_ABORTED, "library " + lib + resolved +
                                    " was replaced while being checked (the path names another "
                                    "file than the one opened); try again once the build is done");
  }
  if (std::string who = writable_by_others(library.mode()); !who.empty()) {
    return Status(KREG_PERMISSION_DENIED,
                  "library " + lib + resolved + " is writable by " + who + " (mode " +
                      mode_string(library.mode()) +
                      "): someone else could replace the code kreg runs; run chmod go-w " +
                      quoted(real));
  }
  // Ownership is deliberately not checked: containers often run as root on files owned by
  // a host user, and the write bits above are what lets someone else replace the file.
  // Every folder from the plugin folder down to the file: whoever may write one of them
  // can rename another library into the library's place.
  for (fs::path d = real.parent_path();; d = d.parent_path()) {
    struct stat st {};
    if (::stat(d.c_str(), &st) == 0) {
      if (std::string who = writable_by_others(st.st_mode); !who.empty()) {
        return Status(KREG_PERMISSION_DENIED,
                      "folder " + quoted(d) + " holding library " + lib + resolved +
                          " is writable by " + who + " (mode " + mode_string(st.st_mode) +
                          "): someone else could swap the library; run chmod go-w " + quoted(d));
      }
    }
    if (d == dir || !d.has_relative_path()) break;
  }
  return OkStatus();
}

Status check_path_safety(const fs::path& library, const fs::path& plugin_dir) {
  auto file = open_library_file(library);
  if (!file) return file.status();
  return check_path_safety(*file, plugin_dir);
}

Status pin_mismatch(const fs::path& library, std::string_view expected, std::string_view actual) {
  return Status(KREG_FAILED_PRECONDITION,
                "library " + quoted(library) + " does not match its sha256 pin: expected " +
                    std::string(expected) + ", actual " + std::string(actual) +
                    " (a different build; if it is the intended one, run kreg validate "
                    "--update-pins)");
}

Status check_pin(const RegularFile& library, std::string_view expected) {
  auto actual = sha256_file(library);
  if (!actual) return actual.status();
  if (*actual != expected) return pin_mismatch(library.path(), expected, *actual);
  return OkStatus();
}

Status check_pin(const fs::path& library, std::string_view expected) {
  auto file = open_library_file(library);
  if (!file) return file.status();
  return check_pin(*file, expected);
}

// Before a library is hashed or copied (seconds for a file of gigabytes): that its ELF
// headers hold. A 4 GB file of zeros named like a library is refused at once ("bad magic");
// the full checks run later on the bytes that are loaded.
Status check_elf_headers(const RegularFile& library) {
  return ElfFile::from_fd(library.fd(), library.size(), "plugin library " + quoted(library.path()))
      .status();
}

Result<AdmittedLibrary> admit_library(const GroupEntry& entry, const AdmitOptions& options) {
  const std::string group = "group '" + entry.name + "': ";
  auto fail = [&](const Status& st, const std::string& head) {
    return Status(st.code(), head + st.message());
  };
  auto file = open_library_file(entry.library);
  if (!file) return fail(file.status(), group);
  fs::path dir = entry.plugin_dir.empty() ? entry.library.parent_path() : entry.plugin_dir;
  if (dir.empty()) dir = ".";
  if (Status st = check_path_safety(*file, dir); !st.ok()) return fail(st, group);

  const bool pinned = entry.sha256.has_value();
  if (options.private_copy || pinned) {
    if (Status st = check_elf_headers(*file); !st.ok()) return fail(st, group);
  }
  AdmittedLibrary admitted{std::move(file).value(), std::nullopt, ""};
  if (options.private_copy || pinned) {
    const std::string name = options.copy_name.empty() ? entry.name : options.copy_name;
    auto copy = copy_to_private(admitted.file, name, pinned);
    if (!copy) return fail(copy.status(), group);
    admitted.copy = std::move(copy).value();
  }
  if (pinned) {
    const std::string at =
        entry.sha256_where.line > 0 ? " (pinned at " + entry.sha256_where.to_string() + ")" : "";
    admitted.sha256 = admitted.copy->sha256();
    if (admitted.sha256 != *entry.sha256) {
      return fail(pin_mismatch(entry.library, *entry.sha256, admitted.sha256),
                  "group '" + entry.name + "'" + at + ": ");
    }
  }
  return Result<AdmittedLibrary>(std::move(admitted));
}

Status admit_library(const GroupEntry& entry) {
  const std::string group = "group '" + entry.name + "': ";
  auto file = open_library_file(entry.library);
  if (!file) return Status(file.status().code(), group + file.status().message());
  fs::path dir = entry.plugin_dir.empty() ? entry.library.parent_path() : entry.plugin_dir;
  if (dir.empty()) dir = ".";
  if (Status st = check_path_safety(*file, dir); !st.ok()) {
    return Status(st.code(), group + st.message());
  }
  if (entry.sha256) {
    if (Status st = check_elf_headers(*file); !st.ok()) {
      return Status(st.code(), group + st.message());
    }
    if (Status st = check_pin(*file, *entry.sha256); !st.ok()) {
      const std::string at =
          entry.sha256_where.line > 0 ? " (pinned at " + entry.sha256_where.to_string() + ")" : "";
      return Status(st.code(), "group '" + entry.name + "'" + at + ": " + st.message());
    }
  }
  return OkStatus();
}

}  // namespace kreg
