// Registry::reload: hot swapping one group's library (docs/hot-swap.md).
//
// load_generation (also behind the first load) admits the library file, copies it into a
// private file and loads that; a reload always copies (dlopen caches by path, and the
// build overwrites the original). The new generation is checked against the
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
#include "kreg/regular_file.hpp"
#include "kreg/text.hpp"
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

// `message` with every mention of the private copy replaced by the user's file: the copy
// is an implementation detail (and already gone when the user reads the message).
std::string user_path_in(std::string message, const fs::path& copy, const fs::path& user) {
  const std::string from = copy.string(), to = escape_control(user.string());
  if (from.empty()) return message;
  for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at)) {
    message.replace(at, from.size(), to);
    at += to.size();
  }
  return message;
}

}  // namespace

Result<LoadedGeneration> load_generation(const GenerationRequest& req) {
  std::optional<AdmittedLibrary> admitted;
  AdmitOptions admit;
  admit.private_copy = req.private_copy;
  admit.copy_name = req.group + "." + std::to_string(req.generation);
  if (req.entry != nullptr) {
    GroupEntry candidate = *req.entry;
    candidate.library = req.library;
    auto a = admit_library(candidate, admit);
    if (!a) return a.status();
    admitted = std::move(a).value();
  } else {
    // No manifest entry, so no admission rules; still one descriptor, checked and copied.
    auto file = open_library_file(req.library);
    if (!file) return file.status();
    admitted = AdmittedLibrary{std::move(file).value(), std::nullopt, ""};
    if (req.private_copy) {
      auto copy = copy_to_private(admitted->file, admit.copy_name, false);
      if (!copy) return copy.status();
      admitted->copy = std::move(copy).value();
    }
  }
  const fs::path load = admitted->load_path();
  const fs::path copy = admitted->copy ? admitted->copy->path() : fs::path();
  if (req.precheck_in_child) {
    // The child loads the admitted bytes too (the private copy when there is one): the
    // bytes checked there are the bytes loaded here, whatever rewrites the original since.
    ProbeOptions probe_options;
    probe_options.timeout_s = req.precheck_timeout_s;
    probe_options.cancel = req.cancel;
    const ProbeResult probe = probe_plugin(load, {req.group, req.version}, probe_options);
    if (!probe.ok()) {
      const kreg_status_code code =
          probe.end == ProbeEnd::kRefused || probe.end == ProbeEnd::kInitFailed ? probe.code
          : probe.end == ProbeEnd::kCancelled                                   ? KREG_CANCELLED
                                                                                : KREG_ABORTED;
      return Status(code == KREG_OK ? KREG_UNKNOWN : code,
                    req.precheck_failed + user_path_in(probe.message, copy, req.library));
    }
  }
  auto lib = PluginLibrary::open(load, {req.group, req.version});
  if (!lib) {
    std::string message = user_path_in(lib.status().message(), copy, req.library);
    // dlopen maps the copy executable: a noexec $TMPDIR refuses that with EPERM.
    if (!copy.empty() && message.find("failed to map segment") != std::string::npos) {
      message += " (it was loaded from a private copy in " +
                 escape_control(copy.parent_path().string()) +
                 ": is that folder on a noexec mount? set TMPDIR to one that allows executing)";
    }
    return Status(lib.status().code(), message);
  }
  LoadedGeneration out;
  out.library = std::move(lib).value();
  out.kernels = out.library->kernels();
  out.private_copy = admitted->copy.has_value();
  out.copy_path = copy;
  if (out.private_copy) {
    for (KernelSpec& k : out.kernels) k.provenance.library = req.library.string();
  }
  return out;  // the copy is unlinked here; the mapping stays
}

Result<ReloadReport> Registry::reload(std::string_view group_name, const ReloadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  // A group name is a C string everywhere else (manifest, plugins): a NUL would name a
  // shorter group, so it is refused rather than cut; an unknown name is quoted as an excerpt.
  if (group_name.find('\0') != std::string_view::npos) {
    return Status(KREG_INVALID_ARGUMENT,
                  "reload: the group name '" + excerpt(group_name) + "' contains a NUL character");
  }
  std::lock_guard lock(mu_);
  Group* found = find_group(group_name);
  if (found == nullptr) {
    return Status(KREG_NOT_FOUND, "reload: unknown group '" + excerpt(group_name) + "'");
  }
  Group& g = *found;
  if (!g.entry && options.library.empty()) {
    return Status(KREG_FAILED_PRECONDITION,
                  "reload of group '" + g.name + "': the group has no manifest entry");
  }
  const fs::path source = options.library.empty() ? g.entry->library : options.library;
  const std::string where =
      "reload of group '" + g.name + "' from " + escape_control(source.string());
  const Group::OpMap* old = g.table.load(std::memory_order_acquire);
  if (g.library == nullptr || old == nullptr) {
    return Status(KREG_FAILED_PRECONDITION,
                  where + ": the group is not loaded from a library (load it first)");
  }

  // The manifest's admission rules (path safety, sha256 pin) hold for the new file too.
  GenerationRequest request;
  request.entry = g.entry ? &*g.entry : nullptr;
  request.group = g.name;
  request.library = source;
  request.generation = g.generation + 1;
  request.private_copy = true;  // the build overwrites the original; dlopen caches by path
  request.precheck_in_child = options.precheck_in_child;
  request.precheck_timeout_s = options.precheck_timeout_s;
  request.cancel = options.cancel;
  request.precheck_failed = "child-process precheck failed: ";
  auto loaded = load_generation(request);
  if (!loaded) return Status(loaded.status().code(), where + ": " + loaded.status().message());
  std::unique_ptr<PluginLibrary> lib = std::move(loaded->library);
  const fs::path copy = loaded->copy_path;
  const std::vector<KernelSpec>& kernels = loaded->kernels;

  // Admission: every implementation the group has must be in the new library with the same
  // registration, so the compiled argument checks (and callers' assumptions) stay valid.
  std::vector<std::pair<detail::Impl*, const KernelSpec*>> swaps;
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
        swaps.emplace_back(impl, next);
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
  // Resource types (resource.hpp): live resources keep the old generation's code, but new
  // ones must still be possible, with the parameters callers were written for.
  std::string lost_types;
  for (const ResourceTypeSpec& r : g.resource_types) {
    const auto& next_types = lib->resource_types();
    auto it = std::find_if(next_types.begin(), next_types.end(),
                           [&](const ResourceTypeSpec& n) { return n.type == r.type; });
    if (it == next_types.end()) {
      lost_types += "\n  - " + r.type + ": missing";
    } else if (!it->same_registration(r)) {
      lost_types += "\n  - " + r.type + ": running '" + r.params.text + "', new '" +
                    escape_control(it->params.text) + "'";
    }
  }
  if (!lost_types.empty()) {
    return Status(KREG_FAILED_PRECONDITION,
                  where + ": the library drops or changes resource types (restart to take them):" +
                      lost_types);
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
  }

  // Nothing can reach the new code before its init hook has run.
  if (Status st = lib->init(); !st.ok()) return Status(st.code(), where + ": " + st.message());
  // From here on this generation may run: pin its mapping for the life of the process
  // (RTLD_NODELETE on the already-loaded copy, found by name although the file is gone).
  // Destroying the Registry runs its shutdown hook but never unmaps it: GPU work it
  // enqueued may still be pending, and the CUDA runtime keys registered kernels by host
  // addresses that a later load could otherwise reuse.
  if (void* pin = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
    (void)pin;  // deliberately never closed
  }
  if (!added.empty()) {
    if (Status st = publish_locked(g, added); !st.ok()) {
      return Status(st.code(), where + ": " + st.message());
    }
  }
  // From here nothing fails. Each store makes the next call through that implementation
  // (handles and Registry::call alike) run the new code.
  // A jit implementation also takes the new generation's source: later resolves
  // specialize and compile from it (kreg/jit.hpp; handles already specialized keep theirs).
  for (auto& [impl, next] : swaps) {
    if (next->jit) {
      jit_->sources.push_back(next->jit);
      impl->jit.store(next->jit.get(), std::memory_order_release);
    }
    // Calls passing a resource of the running generation keep reaching its code
    // (fn_of_generation); the generation is stored before the function (registry.hpp).
    {
      std::lock_guard history(impl->history_mu);
      impl->history.emplace_back(impl->generation.load(std::memory_order_relaxed),
                                 impl->fn.load(std::memory_order_relaxed));
    }
    impl->generation.store(g.generation + 1, std::memory_order_release);
    impl->fn.store(next->fn, std::memory_order_release);
  }
  g.resource_types = lib->resource_types();
  g.retired.push_back(std::move(g.library));
  g.library = std::move(lib);
  g.loaded_from = source;
  g.private_copy = true;
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
