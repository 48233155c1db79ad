// Registry::reload: hot swapping one group's library (docs/hot-swap.md).
//
// The new generation is loaded from a private copy of the library file at a unique path
// (dlopen caches by path, and the build overwrites the original), checked against the
// running generation, initialized, and only then made reachable: every existing
// implementation's function pointer is swapped with one atomic store, new ops are
// published through the copy-on-write op tables. The old generation is never unloaded
// while the registry lives: a call that loaded the old pointer may still be running it,
// and GPU work it enqueued may still be pending on a stream.
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>

#include "kreg/admission.hpp"
#include "kreg/plugin_probe.hpp"
#include "kreg/registry.hpp"
#include "registry_group.hpp"

namespace kreg {

namespace fs = std::filesystem;

namespace {

std::string registration_string(const KernelSpec& s) {
  std::string caps;
  for (const Capability& c : s.capabilities) caps += (caps.empty() ? "" : " or ") + c.to_string();
  return "'" + s.signature.text + "' [" + dtype_set_name(s.dtypes) + ", " + caps + ", traits " +
         (s.traits ? s.traits_string() : std::string("none")) + ", priority " +
         std::to_string(s.priority) + "]";
}

// A folder only this process can write: $TMPDIR/kreg-<pid>-XXXXXX (mkdtemp, mode 0700),
// created on first use, removed at exit (it is empty then: every copy is unlinked as soon
// as it is mapped).
struct PrivateDir {
  std::mutex mu;
  fs::path path;
  ~PrivateDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
};

Result<fs::path> private_dir() {
  static PrivateDir dir;
  std::lock_guard lock(dir.mu);
  if (!dir.path.empty()) return dir.path;
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string templ = (base / ("kreg-" + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(templ.data()) == nullptr) {
    return Status(KREG_UNAVAILABLE, "cannot create a private folder for plugin copies in " +
                                        base.string() + ": " + std::strerror(errno));
  }
  dir.path = templ;
  return dir.path;
}

// <private dir>/<group>.<generation>.<counter>.so: a path dlopen has never seen.
Result<fs::path> private_copy(const fs::path& from, const std::string& group, uint64_t generation) {
  static std::atomic<uint64_t> counter{0};
  auto dir = private_dir();
  if (!dir) return dir.status();
  fs::path to = *dir / (group + "." + std::to_string(generation) + "." +
                        std::to_string(counter.fetch_add(1)) + ".so");
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    fs::remove(to, ec);
    return Status(KREG_UNAVAILABLE,
                  "cannot copy " + from.string() + " to " + to.string() + ": " + ec.message());
  }
  return to;
}

}  // namespace

Result<ReloadReport> Registry::reload(std::string_view group_name, const ReloadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  Group* found = find_group(group_name);
  if (found == nullptr) {
    return Status(KREG_NOT_FOUND, "reload: unknown group '" + std::string(group_name) + "'");
  }
  Group& g = *found;
  if (!g.entry && options.library.empty()) {
    return Status(KREG_FAILED_PRECONDITION,
                  "reload of group '" + g.name + "': the group has no manifest entry");
  }
  const fs::path source = options.library.empty() ? g.entry->library : options.library;
  const std::string where = "reload of group '" + g.name + "' from " + source.string();
  const Group::OpMap* old = g.table.load(std::memory_order_acquire);
  if (g.library == nullptr || old == nullptr) {
    return Status(KREG_FAILED_PRECONDITION,
                  where + ": the group is not loaded from a library (load it first)");
  }

  // The manifest's admission rules (path safety, sha256 pin) hold for the new file too.
  if (g.entry) {
    GroupEntry candidate = *g.entry;
    candidate.library = source;
    if (Status st = admit_library(candidate); !st.ok()) {
      return Status(st.code(), where + ": " + st.message());
    }
  }
  auto copy = private_copy(source, g.name, g.generation + 1);
  if (!copy) return Status(copy.status().code(), where + ": " + copy.status().message());
  std::error_code ec;
  if (options.precheck_in_child) {
    // The child probes the private copy: under the original path, the forked child's
    // dlopen would find the running generation (loaded from that path) and probe it.
    ProbeResult probe = probe_plugin(*copy, {g.name, std::nullopt});
    if (!probe.ok()) {
      fs::remove(*copy, ec);
      return Status(probe.end == ProbeEnd::kRefused ? probe.code : KREG_ABORTED,
                    where + ": child-process precheck failed: " + probe.message);
    }
  }
  auto lib = PluginLibrary::open(*copy, {g.name, std::nullopt});
  fs::remove(*copy, ec);  // the mapping stays; nothing else needs the file
  if (!lib) return Status(lib.status().code(), where + ": " + lib.status().message());
  const std::vector<KernelSpec>& kernels = (*lib)->kernels();

  // Admission: every implementation the group has must be in the new library with the same
  // registration, so the compiled argument checks (and callers' assumptions) stay valid.
  std::vector<std::pair<detail::Impl*, kreg_kernel_fn>> swaps;
  std::vector<std::string> removed;
  std::string changed;
  for (const auto& [id, op] : *old) {
    for (detail::Impl* impl : op.impls) {
      const KernelSpec* next = nullptr;
      for (const KernelSpec& k : kernels) {
        if (k.op == impl->spec.op && k.backend == impl->spec.backend) next = &k;
      }
      if (next == nullptr) {
        removed.push_back(impl->spec.op + " (" + impl->spec.backend + ")");
      } else if (!impl->spec.same_registration(*next)) {
        changed += "\n  - " + impl->spec.op + " (" + impl->spec.backend + "): running " +
                   registration_string(impl->spec) + ", new " + registration_string(*next);
      } else {
        swaps.emplace_back(impl, next->fn);
      }
    }
  }
  if (!removed.empty()) {
    std::sort(removed.begin(), removed.end());
    std::string list;
    for (const std::string& r : removed) list += (list.empty() ? "" : ", ") + r;
    return Status(KREG_FAILED_PRECONDITION, where +
                                                ": the library lacks implementations the running "
                                                "generation has (handles may use them): " +
                                                list);
  }
  if (!changed.empty()) {
    return Status(KREG_FAILED_PRECONDITION,
                  where +
                      ": the library changes registrations (restart to take "
                      "a new signature):" +
                      changed);
  }
  std::vector<KernelSpec> added;
  for (const KernelSpec& k : kernels) {
    auto it = old->find(k.op);
    bool known = false;
    if (it != old->end()) {
      for (const detail::Impl* impl : it->second.impls) known |= impl->spec.backend == k.backend;
    }
    if (known) continue;
    added.push_back(k);
    added.back().provenance.library = source.string();
  }

  // Nothing can reach the new code before its init hook has run.
  if (Status st = (*lib)->init(); !st.ok()) return Status(st.code(), where + ": " + st.message());
  // From here on this generation may run: pin its mapping for the life of the process
  // (RTLD_NODELETE on the already-loaded copy, found by name although the file is gone).
  // Destroying the Registry runs its shutdown hook but never unmaps it: GPU work it
  // enqueued may still be pending, and the CUDA runtime keys registered kernels by host
  // addresses that a later load could otherwise reuse.
  if (void* pin = ::dlopen(copy->c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
    (void)pin;  // deliberately never closed
  }
  if (!added.empty()) {
    if (Status st = publish_locked(g, added); !st.ok()) {
      return Status(st.code(), where + ": " + st.message());
    }
  }
  // From here nothing fails. Each store makes the next call through that implementation
  // (handles and Registry::call alike) run the new code.
  for (auto& [impl, fn] : swaps) impl->fn.store(fn, std::memory_order_release);
  g.retired.push_back(std::move(g.library));
  g.library = std::move(lib).value();
  g.loaded_from = source;
  ++g.generation;

  ReloadReport report;
  report.group = g.name;
  report.generation = g.generation;
  report.version = g.library->info().version;
  for (const KernelSpec& k : added) report.added_ops.push_back(k.op);
  std::sort(report.added_ops.begin(), report.added_ops.end());
  report.added_ops.erase(std::unique(report.added_ops.begin(), report.added_ops.end()),
                         report.added_ops.end());
  report.latency_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace kreg
