// Helpers the unit tests share: where the built plugins are, substring and whole-file
// checks, and a scratch folder. Test-specific helpers stay in their test files.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace kreg::test {

#ifdef KREG_TEST_PLUGIN_DIR
// Test plugin `name` from tests/fixtures/plugins: KREG_TEST_PLUGIN_DIR/libkreg_<name>.so.
inline std::filesystem::path test_plugin(const std::string& name) {
  return std::filesystem::path(KREG_TEST_PLUGIN_DIR) / ("libkreg_" + name + ".so");
}
#endif

#ifdef KREG_PLUGIN_DIR
// Shipped plugin `name` from plugins/: KREG_PLUGIN_DIR/libkreg_<name>.so.
inline std::filesystem::path plugin(const std::string& name) {
  return std::filesystem::path(KREG_PLUGIN_DIR) / ("libkreg_" + name + ".so");
}
#endif

// Whether `part` occurs in `text`.
inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The bytes of file `p`, all of them; "" when it cannot be read.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh folder under the system temp folder, mode 0755 whatever the umask (kreg's path
// safety accepts it as a plugin folder), removed with all it holds on destruction, folders
// a test made read-only included. Paths given to it are relative to root().
class Scratch {
 public:
  Scratch() {
    std::string t = (std::filesystem::temp_directory_path() / "kreg_test_XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) {
      throw std::filesystem::filesystem_error("cannot create a scratch folder", t,
                                              std::error_code(errno, std::generic_category()));
    }
    root_ = t;
    std::filesystem::permissions(root_, std::filesystem::perms(0755));
  }
  ~Scratch() {
    // Write access back to every folder (not through links), so that remove_all can empty it.
    std::error_code ec;
    ::chmod(root_.c_str(), 0700);
    for (auto it = std::filesystem::recursive_directory_iterator(root_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->symlink_status(ec).type() == std::filesystem::file_type::directory) {
        ::chmod(it->path().c_str(), 0700);
      }
    }
    std::filesystem::remove_all(root_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path path(const std::filesystem::path& rel) const { return checked(rel); }

  // Folder `rel` and the missing ones above it, each mode 0755.
  std::filesystem::path dir(const std::filesystem::path& rel) const {
    std::filesystem::path p = root_;
    checked(rel);
    for (const std::filesystem::path& part : rel.lexically_normal()) {
      if (part.empty() || part == ".") continue;
      p /= part;
      std::filesystem::create_directory(p);
      std::filesystem::permissions(p, std::filesystem::perms(0755));
    }
    return p;
  }
  // File `rel` holding `bytes`, with mode `mode`; its folder is made as dir() does.
  std::filesystem::path write(const std::filesystem::path& rel, std::string_view bytes,
                              int mode = 0644) const {
    const std::filesystem::path p = checked(rel);
    dir(rel.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::filesystem::permissions(p, std::filesystem::perms(mode));
    return p;
  }
  // A copy of file `from` at `rel`, mode 0755 (not writable by group or others: path safety).
  std::filesystem::path copy(const std::filesystem::path& from,
                             const std::filesystem::path& rel) const {
    const std::filesystem::path p = checked(rel);
    dir(rel.parent_path());
    std::filesystem::copy_file(from, p, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::permissions(p, std::filesystem::perms(0755));
    return p;
  }
#ifdef KREG_TEST_PLUGIN_DIR
  // A copy of test_plugin(fixture) at `rel`, as copy() makes it.
  std::filesystem::path plugin(const std::string& fixture, const std::filesystem::path& rel) const {
    return copy(test_plugin(fixture), rel);
  }
#endif

 private:
  // root_ / rel, refusing a `rel` that would leave the folder.
  std::filesystem::path checked(const std::filesystem::path& rel) const {
    const std::filesystem::path normal = rel.lexically_normal();
    if (rel.is_absolute() || (!normal.empty() && *normal.begin() == "..")) {
      throw std::invalid_argument("scratch path '" + rel.string() + "' is not inside the folder");
    }
    return root_ / rel;
  }

  std::filesystem::path root_;
};

}  // namespace kreg::test
