// A small reader for the two CMake idioms the plugin tree uses: add_subdirectory(<group>)
// and kreg_add_plugin(<group> SOURCES ... CUDA_SOURCES ...). It tokenizes CMake's argument
// syntax (comments, quoted and bracket arguments) but evaluates nothing: sources must be
// listed literally for sources-built to vouch for them, and anything else is reported as
// unresolved rather than guessed.
#include "kreg/source_tree.hpp"

#include "kreg/regular_file.hpp"

#include <algorithm>
#include <cctype>
#include <system_error>

namespace kreg {

namespace fs = std::filesystem;

namespace {

struct Command {
  std::string name;  // lowercased: CMake command names are case-insensitive
  std::vector<std::string> args;
  int line = 0;
};

// Splits CMake text into commands with their arguments.
std::vector<Command> parse_commands(const std::string& text) {
  std::vector<Command> out;
  size_t i = 0;
  int line = 1;
  const size_t n = text.size();
  auto skip_bracket = [&](size_t at, std::string* content) -> bool {
    // [[...]], [=[...]=], ...: at points at the first '['.
    size_t j = at + 1;
    size_t eq = 0;
    while (j < n && text[j] == '=') ++j, ++eq;
    if (j >= n || text[j] != '[') return false;
    const std::string close = "]" + std::string(eq, '=') + "]";
    const size_t end = text.find(close, j + 1);
    const size_t stop = end == std::string::npos ? n : end;
    if (content) *content = text.substr(j + 1, stop - j - 1);
    line += static_cast<int>(std::count(text.begin() + static_cast<long>(at),
                                        text.begin() + static_cast<long>(stop), '\n'));
    i = end == std::string::npos ? n : end + close.size();
    return true;
  };
  while (i < n) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (c == '#') {
      if (i + 1 < n && text[i + 1] == '[' && skip_bracket(i + 1, nullptr)) continue;
      while (i < n && text[i] != '\n') ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      Command cmd;
      cmd.line = line;
      while (i < n && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_')) {
        cmd.name += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
        ++i;
      }
      while (i < n && (text[i] == ' ' || text[i] == '\t')) ++i;
      if (i >= n || text[i] != '(') continue;
      ++i;
      int depth = 1;
      std::string arg;
      bool in_arg = false;
      auto flush = [&] {
        if (in_arg) cmd.args.push_back(arg);
        arg.clear();
        in_arg = false;
      };
      while (i < n && depth > 0) {
        const char d = text[i];
        if (d == '\n') {
          ++line;
          flush();
          ++i;
        } else if (d == ' ' || d == '\t' || d == '\r') {
          flush();
          ++i;
        } else if (d == '#') {
          flush();
          if (i + 1 < n && text[i + 1] == '[' && skip_bracket(i + 1, nullptr)) continue;
          while (i < n && text[i] != '\n') ++i;
        } else if (d == '"') {
          ++i;
          while (i < n && text[i] != '"') {
            if (text[i] == '\\' && i + 1 < n) ++i;
            if (text[i] == '\n') ++line;
            arg += text[i++];
          }
          ++i;
          in_arg = true;
        } else if (d == '[' && !in_arg && i + 1 < n && (text[i + 1] == '[' || text[i + 1] == '=')) {
          std::string content;
          if (skip_bracket(i, &content)) {
            cmd.args.push_back(content);
          } else {
            arg += text[i++];
            in_arg = true;
          }
        } else if (d == '(') {
          ++depth;
          arg += text[i++];
          in_arg = true;
        } else if (d == ')') {
          if (--depth == 0) {
            flush();
            ++i;
            break;
          }
          arg += text[i++];
          in_arg = true;
        } else {
          arg += text[i++];
          in_arg = true;
        }
      }
      out.push_back(std::move(cmd));
    } else {
      ++i;
    }
  }
  return out;
}

bool is_keyword(const std::string& arg) {
  if (arg.empty()) return false;
  return std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isupper(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

Result<std::string> read_text_file(const fs::path& file, uint64_t max_bytes) {
  return read_regular_file(file, "file", max_bytes);
}

std::optional<PluginBuild> parse_plugin_build(const std::string& cmake_text) {
  for (const Command& cmd : parse_commands(cmake_text)) {
    if (cmd.name != "kreg_add_plugin" || cmd.args.empty()) continue;
    PluginBuild build;
    build.group = cmd.args[0];
    build.line = cmd.line;
    bool in_sources = false;
    for (size_t i = 1; i < cmd.args.size(); ++i) {
      const std::string& a = cmd.args[i];
      if (is_keyword(a)) {
        in_sources = a == "SOURCES" || a == "CUDA_SOURCES";
        continue;
      }
      if (!in_sources) continue;
      if (a.find("${") != std::string::npos || a.find("$<") != std::string::npos ||
          a.find('*') != std::string::npos) {
        build.unresolved.push_back(a);
        continue;
      }
      build.sources.insert(fs::path(a).lexically_normal().generic_string());
    }
    return build;
  }
  return std::nullopt;
}

std::set<std::string> parse_subdirectories(const std::string& cmake_text) {
  std::set<std::string> out;
  for (const Command& cmd : parse_commands(cmake_text)) {
    if (cmd.name == "add_subdirectory" && !cmd.args.empty()) {
      out.insert(fs::path(cmd.args[0]).lexically_normal().generic_string());
    }
  }
  return out;
}

std::vector<std::string> group_folders(const fs::path& plugins_src) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(plugins_src, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".") || !entry.is_directory(ec)) continue;
    if (fs::is_regular_file(entry.path() / "CMakeLists.txt", ec)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> kernel_sources(const fs::path& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(folder, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.filename().string().starts_with(".")) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    const std::string ext = p.extension().string();
    if (ext == ".cu" || ext == ".cpp") {
      out.push_back(p.lexically_relative(folder).generic_string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kreg
