// NVRTC, loaded at run time (no link dependency), and one specialization's build: the
// cache key, then the cache or a compile. NVRTC gets the source and its headers in memory
// and no include path, so the files it can open are exactly the ones hashed into the key
// (NVRTC has no dependency output to read them back from; by construction there is nothing
// else it could have read). Its built-in headers are covered by its version in the key.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "kreg/abi.h"
#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/text.hpp"

namespace kreg::jit {
namespace {

using Program = void*;  // nvrtcProgram
struct Nvrtc {
  int (*version)(int*, int*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*create)(Program*, const char*, const char*, int, const char* const*,
                const char* const*) = nullptr;
  int (*add_name)(Program, const char*) = nullptr;
  int (*compile)(Program, int, const char* const*) = nullptr;
  int (*log_size)(Program, size_t*) = nullptr;
  int (*log)(Program, char*) = nullptr;
  int (*cubin_size)(Program, size_t*) = nullptr;
  int (*cubin)(Program, char*) = nullptr;
  int (*lowered)(Program, const char*, const char**) = nullptr;
  int (*destroy)(Program*) = nullptr;
  std::string version_text;
  std::vector<int> archs;  // the SM numbers it compiles for (empty: it cannot say)
};

// Where libnvrtc may be: $KREG_NVRTC (a file), the loader's path, then the toolkit's
// usual folders ($CUDA_HOME, /usr/local/cuda), which are often not on the loader's path.
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* e = std::getenv("KREG_NVRTC"); e != nullptr && *e != '\0') out.emplace_back(e);
  for (const char* n : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) out.emplace_back(n);
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* e = std::getenv(var); e != nullptr && *e == '/') roots.emplace_back(e);
  }
  roots.emplace_back("/usr/local/cuda");
  for (const std::string& r : roots) {
    for (const char* n : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
      out.push_back(r + "/lib64/" + n);
    }
  }
  return out;
}

const Nvrtc* load_nvrtc(std::string* why) {
  static std::once_flag once;
  static Nvrtc* lib = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    void* h = nullptr;
    std::string tried;
    for (const std::string& c : candidates()) {
      h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) break;
      tried += (tried.empty() ? "" : ", ") + c;
    }
    if (h == nullptr) {
      reason = "NVRTC not found (tried " + tried + "; set KREG_NVRTC to libnvrtc.so's path)";
      return;
    }
    auto* n = new Nvrtc();  // for the process's life, like the library itself
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (fn == nullptr) {
        ok = false;
        reason = std::string("NVRTC lacks ") + name;
      }
    };
    sym(n->version, "nvrtcVersion");
    sym(n->error_string, "nvrtcGetErrorString");
    sym(n->create, "nvrtcCreateProgram");
    sym(n->add_name, "nvrtcAddNameExpression");
    sym(n->compile, "nvrtcCompileProgram");
    sym(n->log_size, "nvrtcGetProgramLogSize");
    sym(n->log, "nvrtcGetProgramLog");
    sym(n->cubin_size, "nvrtcGetCUBINSize");
    sym(n->cubin, "nvrtcGetCUBIN");
    sym(n->lowered, "nvrtcGetLoweredName");
    sym(n->destroy, "nvrtcDestroyProgram");
    if (!ok) return;
    int major = 0, minor = 0;
    if (n->version(&major, &minor) != 0) {
      reason = "nvrtcVersion failed";
      return;
    }
    n->version_text = std::to_string(major) + "." + std::to_string(minor);
    // Optional (NVRTC 11.2+): the architectures it compiles for, so that an architecture it
    // does not know is refused before a compile, once, with the list.
    using CountFn = int (*)(int*);
    using ListFn = int (*)(int*);
    auto count = reinterpret_cast<CountFn>(::dlsym(h, "nvrtcGetNumSupportedArchs"));
    auto list = reinterpret_cast<ListFn>(::dlsym(h, "nvrtcGetSupportedArchs"));
    int num = 0;
    if (count != nullptr && list != nullptr && count(&num) == 0 && num > 0 && num < 1024) {
      n->archs.resize(static_cast<size_t>(num));
      if (list(n->archs.data()) != 0) n->archs.clear();
    }
    lib = n;
  });
  if (lib == nullptr && why != nullptr) *why = reason;
  return lib;
}

std::string err_text(const Nvrtc& n, int rc) {
  const char* s = n.error_string(rc);
  return s != nullptr ? s : "NVRTC error " + std::to_string(rc);
}

// The options NVRTC compiles with: the architecture first, then kreg's, then the
// plugin's own.
std::vector<std::string> options_for(const JitSource& src, std::string_view arch) {
  std::vector<std::string> o = {"--gpu-architecture=" + std::string(arch), "-std=c++17",
                                "-default-device", "-DKREG_JIT=1"};
  o.insert(o.end(), src.options.begin(), src.options.end());
  return o;
}

// The SM number of a well-formed architecture name ("sm_90a" -> 90).
int arch_number(std::string_view arch) {
  int sm = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) {
    sm = sm * 10 + (arch[i] - '0');
  }
  return sm;
}

bool valid_arch(std::string_view arch) {
  if (!arch.starts_with("sm_") || arch.size() < 5 || arch.size() > 7) return false;
  for (size_t i = 3; i < arch.size(); ++i) {
    const char c = arch[i];
    if (!((c >= '0' && c <= '9') || (i == arch.size() - 1 && (c == 'a' || c == 'f')))) return false;
  }
  return true;
}

// The stored entry: the lowered name, a NUL, the cubin.
std::string pack(const std::string& lowered, const std::string& cubin) {
  std::string out = lowered;
  out.push_back('\0');
  out += cubin;
  return out;
}

}  // namespace

Result<std::string> nvrtc_version() {
  std::string why;
  const Nvrtc* n = load_nvrtc(&why);
  if (n == nullptr) return Status(KREG_UNAVAILABLE, why);
  return n->version_text;
}

Result<std::string> cache_key(const JitSource& src, const Specialization& s,
                              std::string_view arch) {
  auto version = nvrtc_version();
  if (!version) return version.status();
  KeyBuilder k;
  k.add("kreg-jit-key", "1");
  k.add("abi", std::to_string(KREG_ABI_MAJOR) + "." + std::to_string(KREG_ABI_MINOR));
  k.add("nvrtc", *version);
  k.add("arch", arch);
  k.add("source", src.source);
  for (const auto& [name, text] : src.headers) {
    k.add("header", name);
    k.add("text", text);
  }
  k.add("kernel", kernel_expression(src, s));
  for (const std::string& o : options_for(src, arch)) k.add("option", o);
  return k.hex();
}

Result<Compiled> build(const KernelSpec& spec, const JitSource& src, const Specialization& s,
                       std::string_view arch, Cache& cache) {
  if (!valid_arch(arch)) {
    return Status(KREG_INVALID_ARGUMENT,
                  "architecture '" + excerpt(arch) + "' is not of the form sm_90 or sm_90a");
  }
  std::string why;
  const Nvrtc* n = load_nvrtc(&why);
  if (n == nullptr) return Status(KREG_UNAVAILABLE, why);
  if (!n->archs.empty() &&
      std::find(n->archs.begin(), n->archs.end(), arch_number(arch)) == n->archs.end()) {
    std::string known;
    for (int a : n->archs) known += (known.empty() ? "sm_" : ", sm_") + std::to_string(a);
    return Status(KREG_INVALID_ARGUMENT, "architecture '" + excerpt(arch) + "' is not one NVRTC " +
                                             n->version_text + " compiles for (" + known + ")");
  }
  auto key = cache_key(src, s, arch);
  if (!key) return key.status();
  const std::string expr = kernel_expression(src, s);
  const std::string where = spec.op + " (jit, " + s.text() + ", " + std::string(arch) + ")";
  const auto t0 = std::chrono::steady_clock::now();
  auto compile = [&](std::string& image) -> Status {
    std::vector<const char*> names, texts;
    for (const auto& [name, text] : src.headers) {
      names.push_back(name.c_str());
      texts.push_back(text.c_str());
    }
    Program prog = nullptr;
    int rc = n->create(&prog, src.source.c_str(), src.source_name.c_str(),
                       static_cast<int>(names.size()), texts.data(), names.data());
    if (rc != 0) return Status(KREG_INTERNAL, where + ": nvrtcCreateProgram: " + err_text(*n, rc));
    struct Destroy {
      const Nvrtc* n;
      Program* p;
      ~Destroy() { n->destroy(p); }
    } destroy{n, &prog};
    if ((rc = n->add_name(prog, expr.c_str())) != 0) {
      return Status(KREG_INTERNAL, where + ": nvrtcAddNameExpression: " + err_text(*n, rc));
    }
    const std::vector<std::string> opts = options_for(src, arch);
    std::vector<const char*> argv;
    for (const std::string& o : opts) argv.push_back(o.c_str());
    rc = n->compile(prog, static_cast<int>(argv.size()), argv.data());
    if (rc != 0) {
      size_t size = 0;
      std::string log;
      if (n->log_size(prog, &size) == 0 && size > 1) {
        log.resize(size);
        n->log(prog, log.data());
        log.resize(size - 1);
      }
      constexpr size_t kLogShown = 4000;
      if (log.size() > kLogShown) log = log.substr(0, kLogShown) + "\n... (log truncated)";
      return Status(KREG_INTERNAL, where + ": NVRTC failed to compile " + src.source_name + ": " +
                                       err_text(*n, rc) + "\n" + escape_control(log));
    }
    const char* lowered = nullptr;
    if ((rc = n->lowered(prog, expr.c_str(), &lowered)) != 0 || lowered == nullptr) {
      return Status(KREG_INTERNAL, where + ": no kernel named " + expr + " in " + src.source_name);
    }
    size_t size = 0;
    if ((rc = n->cubin_size(prog, &size)) != 0 || size == 0) {
      return Status(KREG_INTERNAL, where + ": no cubin: " + err_text(*n, rc));
    }
    std::string cubin(size, '\0');
    if ((rc = n->cubin(prog, cubin.data())) != 0) {
      return Status(KREG_INTERNAL, where + ": nvrtcGetCUBIN: " + err_text(*n, rc));
    }
    image = pack(lowered, cubin);
    return OkStatus();
  };
  auto fetched = cache.get_or_build(*key, EntryMeta{spec.op, s.text(), std::string(arch)}, compile);
  if (!fetched) return fetched.status();
  Compiled c;
  c.key = *key;
  c.compiled = fetched->compiled;
  c.note = fetched->note;
  const std::string& image = fetched->image;
  const size_t nul = image.find('\0');
  if (nul == std::string::npos || nul == 0 || nul + 1 >= image.size()) {
    return Status(KREG_DATA_LOSS, where + ": cache entry " + *key + " is not a kreg JIT image");
  }
  c.lowered = image.substr(0, nul);
  c.cubin = image.substr(nul + 1);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

Result<Cache*> process_cache() {
  static std::once_flag once;
  static Cache* cache = nullptr;
  static Status error;
  std::call_once(once, [] {
    auto dir = Cache::default_dir();
    if (dir) {
      cache = new Cache(*dir);  // for the process's life: handles outlive registries
      return;
    }
    if (dir.status().code() != KREG_FAILED_PRECONDITION) {
      error = dir.status();  // a variable set wrong (relative): the user's to fix
      return;
    }
    // No variable to place it (no HOME, no XDG_CACHE_HOME): a fresh private folder for
    // this process (mkdtemp: ours, mode 0700; a shared, guessable /tmp path could hold
    // another user's images), said once, rather than no JIT at all.
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    std::string pattern = (tmp / "kreg-jit-XXXXXX").string();
    const bool made = ::mkdtemp(pattern.data()) != nullptr;
    std::fprintf(
        stderr, "kreg: jit: %s; %s\n", dir.status().message().c_str(),
        made ? ("caching in " + pattern + " for this process").c_str() : "compiling in memory");
    cache = new Cache(made ? std::filesystem::path(pattern) : tmp / "kreg-jit-unwritable/none");
  });
  if (cache == nullptr) return error;
  return cache;
}

}  // namespace kreg::jit
