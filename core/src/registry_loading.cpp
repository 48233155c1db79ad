// Loading: Registry::open (eager groups loaded, lazy groups described by their embedded
// metadata), load_group, the lazy load on first use of an op, and publishing a group's
// kernels (the duplicate policy, copy-on-write op tables, the op index). Every load goes
// through load_generation (reload.cpp): admission, private copy, pre-check, dlopen.
#include <algorithm>

#include "kreg/admission.hpp"
#include "kreg/elf_file.hpp"
#include "kreg/plugin_metadata.hpp"
#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::Impl;
using detail::OpEntry;

namespace {

// A lazy group's metadata, read without loading anything: the same admission as a load
// (the file opened once, path safety, the pin where set), then the metadata section of
// that same descriptor.
Result<PluginMetadata> read_admitted_metadata(const GroupEntry& e) {
  auto file = open_library_file(e.library);
  if (!file) return file.status();
  std::filesystem::path dir = e.plugin_dir.empty() ? e.library.parent_path() : e.plugin_dir;
  if (dir.empty()) dir = ".";
  if (Status st = check_path_safety(*file, dir); !st.ok()) return st;
  // A pin is checked on the descriptor's bytes; unchanged_since_open below says they are
  // still the bytes the metadata was read from. (A load copies and hashes again.)
  if (e.sha256) {
    if (Status st = check_pin(*file, *e.sha256); !st.ok()) return st;
  }
  auto elf = ElfFile::from_fd(file->fd(), file->size(),
                              "plugin library " + escape_control(e.library.string()));
  if (!elf) return elf.status();
  auto meta = read_plugin_metadata(*elf, e.library);
  if (!meta) return meta.status();
  if (Status st = file->unchanged_since_open(); !st.ok()) return st;
  const std::string where = "plugin library " + escape_control(e.library.string());
  if (meta->info.group != e.name) {
    return Status(KREG_FAILED_PRECONDITION, where + ": its metadata names group '" +
                                                escape_control(meta->info.group) +
                                                "', the manifest '" + e.name + "'");
  }
  if (e.version && meta->info.version != *e.version) {
    return Status(KREG_FAILED_PRECONDITION, where + ": its metadata says version '" +
                                                escape_control(meta->info.version) +
                                                "', the manifest wants '" + *e.version + "'");
  }
  for (const KernelSpec& k : meta->kernels) {
    if (k.group() != e.name) {
      return Status(KREG_FAILED_PRECONDITION, where + ": its metadata lists op '" + excerpt(k.op) +
                                                  "' outside group '" + e.name + "'");
    }
  }
  return meta;
}

}  // namespace

Registry::Group& Registry::group_locked(const std::string& name) {
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    auto g = std::make_unique<Group>();
    g->name = name;
    it = groups_.emplace(name, std::move(g)).first;
  }
  return *it->second;
}

Result<std::unique_ptr<Registry>> Registry::open(const Manifest& manifest,
                                                 const OpenOptions& options) {
  auto reg = std::make_unique<Registry>();
  std::lock_guard lock(reg->mu_);
  reg->open_options_ = options;
  for (const GroupEntry& e : manifest.groups) {
    Group& g = reg->group_locked(e.name);
    g.entry = e;
  }
  for (const AliasEntry& a : manifest.aliases) {
    if (Status st = reg->add_alias_locked(a.from, a.to, a.message); !st.ok()) {
      return Status(st.code(), a.where.to_string() + ": " + st.message());
    }
  }
  for (const GroupEntry& e : manifest.groups) {
    if (!e.enabled) continue;
    Group& g = *reg->groups_.find(e.name)->second;
    if (e.load == LoadMode::kLazy && !options.load_lazy_groups) {
      reg->read_metadata_locked(g);
      continue;
    }
    if (Status st = reg->load_locked(g); !st.ok()) return st;
  }
  return reg;
}

void Registry::read_metadata_locked(Group& g) {
  auto meta = read_admitted_metadata(*g.entry);
  if (!meta) {
    // Not an error: the group is listed with its ops unknown and loads on first use
    // (where a real problem with the library is reported).
    g.metadata_note = "metadata unavailable: " + meta.status().message();
    return;
  }
  g.metadata_info = std::move(meta->info);
  g.metadata_kernels = std::move(meta->kernels);
  for (const KernelSpec& k : g.metadata_kernels) g.metadata_ops[k.op].push_back(&k);
  for (auto& [id, specs] : g.metadata_ops) {
    std::stable_sort(specs.begin(), specs.end(), [](const KernelSpec* a, const KernelSpec* b) {
      return a->priority > b->priority;
    });
  }
  g.has_metadata = true;
}

Status Registry::load_group(const GroupEntry& entry) {
  std::lock_guard lock(mu_);
  Group& g = group_locked(entry.name);
  g.entry = entry;
  return load_locked(g);
}

const OpEntry* Registry::find_op(std::string_view op, bool load) {
  if (const OpEntry* e = find_op(op)) [[likely]]
    return e;
  if (!load) return nullptr;
  // The op id's prefix names the group; only a manifest group not loaded yet can load.
  const size_t dot = op.find('.');
  Group* g = dot == std::string_view::npos ? nullptr : find_group(op.substr(0, dot));
  if (g == nullptr || g->table.load(std::memory_order_acquire) != nullptr) return nullptr;
  // The metadata answers "no such op" without loading (it is immutable after open()).
  if (g->has_metadata && !g->metadata_ops.contains(op)) return nullptr;
  if (!ensure_loaded(*g).ok()) return nullptr;  // unknown_op reports the group's error
  return find_op(op);
}

Status Registry::ensure_loaded(Group& g) {
  std::lock_guard lock(mu_);
  if (g.table.load(std::memory_order_acquire) != nullptr) return OkStatus();
  if (!g.entry || !g.entry->enabled) return OkStatus();
  return load_locked(g);
}

Status Registry::load_locked(Group& g) {
  if (!g.entry) {
    return Status(KREG_FAILED_PRECONDITION, "group '" + g.name + "' has no manifest entry");
  }
  if (!g.entry->enabled) {
    return Status(KREG_FAILED_PRECONDITION, "group '" + g.name + "' is disabled in the manifest (" +
                                                g.entry->where.to_string() + ")");
  }
  // Nothing of the library is mapped before it proves it is where it should be, that no
  // one else can change it, and that it is the build the manifest pinned; what is mapped
  // is exactly what was checked (load_generation, reload.cpp).
  GenerationRequest request;
  request.entry = &*g.entry;
  request.group = g.name;
  request.library = g.entry->library;
  request.version = g.entry->version;
  request.generation = g.generation + 1;
  request.private_copy = open_options_.private_copy;
  request.precheck_in_child = open_options_.precheck_in_child;
  request.precheck_timeout_s = open_options_.precheck_timeout_s;
  auto loaded = load_generation(request);
  if (!loaded) {
    g.error = loaded.status().message();
    return loaded.status();
  }
  std::unique_ptr<PluginLibrary> lib = std::move(loaded->library);
  // The init hook runs before the kernels become reachable: a lazily loaded group is
  // published while other threads may already be looking it up.
  if (Status st = lib->init(); !st.ok()) {
    g.error = st.message();
    return st;
  }
  if (Status st = publish_locked(g, loaded->kernels); !st.ok()) {
    g.error = st.message();
    return st;
  }
  g.resource_types = lib->resource_types();
  g.library = std::move(lib);
  g.private_copy = loaded->private_copy;
  g.loaded_from = loaded->private_copy ? g.entry->library : std::filesystem::path();
  ++g.generation;
  g.error.clear();
  return OkStatus();
}

Status Registry::publish_locked(Group& g, const std::vector<KernelSpec>& specs) {
  // Check everything first: a group is admitted whole or not at all.
  const Group::OpMap* old = g.table.load(std::memory_order_acquire);
  std::vector<const KernelSpec*> fresh;
  for (const KernelSpec& s : specs) {
    if (s.group() != g.name) {
      return Status(KREG_INVALID_ARGUMENT,
                    "op '" + excerpt(s.op) + "' does not belong to group '" + g.name + "'");
    }
    const Impl* existing = nullptr;
    if (old != nullptr) {
      if (auto it = old->find(s.op); it != old->end()) {
        for (const Impl* impl : it->second.impls) {
          if (impl->spec.backend == s.backend) existing = impl;
        }
      }
    }
    for (const KernelSpec* f : fresh) {
      if (f->op == s.op && f->backend == s.backend) {
        return Status(KREG_ALREADY_EXISTS, "conflicting registration of " + s.op + " (" +
                                               s.backend + "): registered twice by " +
                                               escape_control(s.source()));
      }
    }
    if (existing != nullptr) {
      if (existing->spec.same_registration(s)) continue;  // identical: no-op
      return Status(KREG_ALREADY_EXISTS,
                    "conflicting registration of " + s.op + " (" + s.backend +
                        "): " + escape_control(existing->spec.source()) + " registered it as '" +
                        escape_control(existing->spec.signature.text) + "' [" +
                        dtype_set_name(existing->spec.dtypes) + ", " +
                        detail::caps_string(existing->spec) + "], " + escape_control(s.source()) +
                        " as '" + escape_control(s.signature.text) + "' [" +
                        dtype_set_name(s.dtypes) + ", " + detail::caps_string(s) + "]");
    }
    fresh.push_back(&s);
  }
  if (fresh.empty() && old != nullptr) return OkStatus();
  auto table = old ? std::make_unique<Group::OpMap>(*old) : std::make_unique<Group::OpMap>();
  for (const KernelSpec* s : fresh) {
    impls_.push_back(detail::make_impl(*s));
    Impl* impl = impls_.back().get();
    impl->generation.store(g.generation + 1, std::memory_order_relaxed);  // the one loading
    OpEntry& op = (*table)[s->op];
    op.id = s->op;
    op.impls.push_back(impl);
    std::stable_sort(op.impls.begin(), op.impls.end(), [](const Impl* a, const Impl* b) {
      return a->spec.priority > b->spec.priority;
    });
  }
  // Entries were copied: re-point each Impl at its entry in the new table.
  for (auto& [id, op] : *table) {
    for (Impl* impl : op.impls) impl->op = &op;
  }
  g.table.store(table.get(), std::memory_order_release);
  g.tables.push_back(std::move(table));
  std::vector<const OpEntry*> all;
  for (const auto& [name, group] : groups_) {
    if (const Group::OpMap* t = group->table.load(std::memory_order_acquire)) {
      for (const auto& [id, op] : *t) all.push_back(&op);
    }
  }
  auto index = std::make_unique<detail::OpIndex>(all);
  index_.store(index.get(), std::memory_order_release);
  indexes_.push_back(std::move(index));
  return OkStatus();
}

Status Registry::add(const KernelSpec& spec) {
  std::lock_guard lock(mu_);
  if (!is_valid_op_id(spec.op)) {
    return Status(KREG_INVALID_ARGUMENT,
                  "op id '" + excerpt(spec.op) + "' is not '<group>.<name>'");
  }
  if (spec.fn == nullptr || find_backend(spec.backend) == nullptr || spec.capabilities.empty()) {
    return Status(KREG_INVALID_ARGUMENT,
                  spec.op + ": a spec needs fn, a known backend and capabilities");
  }
  Group& g = group_locked(std::string(spec.group()));
  return publish_locked(g, {spec});
}

Status Registry::add_alias(const std::string& from, const std::string& to,
                           const std::string& message) {
  std::lock_guard lock(mu_);
  return add_alias_locked(from, to, message);
}

Status Registry::add_alias_locked(const std::string& from, const std::string& to,
                                  const std::string& message) {
  if (!is_valid_op_id(from) || !is_valid_op_id(to)) {
    return Status(KREG_INVALID_ARGUMENT, "alias " + excerpt(from) + " -> " + excerpt(to) +
                                             ": op ids must be '<group>.<name>'");
  }
  if (from == to) return Status(KREG_INVALID_ARGUMENT, "alias " + from + " points at itself");
  // The manifest parser refuses cycles; aliases added here must not close one either, or
  // a lookup through them would go round forever.
  std::string chain = from + " -> " + to;
  std::string_view next = to;
  for (size_t hops = 0; hops <= aliases_.size(); ++hops) {
    auto it = aliases_.find(next);
    if (it == aliases_.end()) break;
    next = it->second->to;
    chain += " -> " + std::string(next);
    if (next == from) {
      return Status(KREG_INVALID_ARGUMENT,
                    "alias " + from + " -> " + to + " would close an alias cycle: " + chain);
    }
  }
  auto a = std::make_unique<Alias>();
  a->to = to;
  a->message = message;
  if (!aliases_.emplace(from, std::move(a)).second) {
    return Status(KREG_ALREADY_EXISTS, "alias " + from + " is defined twice");
  }
  return OkStatus();
}

}  // namespace kreg
