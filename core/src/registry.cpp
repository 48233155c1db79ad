// The registry's lookups: op ids and aliases to op entries, and introspection. Nothing
// here loads a library: a lazy group that is not loaded yet is described by its embedded
// metadata (read by open(), registry_loading.cpp). Loading, publishing and lazy loading
// are in registry_loading.cpp, selection in selection.cpp, hot swap in reload.cpp.
#include "kreg/registry.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kreg/text.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::Impl;
using detail::OpEntry;

const char* group_source_name(GroupSource s) {
  switch (s) {
    case GroupSource::kLoaded:
      return "loaded";
    case GroupSource::kMetadata:
      return "metadata";
    case GroupSource::kNone:
      break;
  }
  return "none";
}

Registry::Registry() : jit_(std::make_unique<detail::JitState>()) {
  const char* env = std::getenv("KREG_FORCE_BACKEND");
  if (env != nullptr && *env != '\0') force_ = detail::parse_forced_backends(env);
}

Registry::~Registry() {
  // Resources first, by the code that made them, before any shutdown hook runs.
  destroy_resources();
  // Drop op tables before libraries: nothing that points into a plugin outlives it.
  index_.store(nullptr);
  indexes_.clear();
  for (auto& [name, g] : groups_) {
    g->table.store(nullptr);
    g->tables.clear();
  }
  impls_.clear();
  for (auto& [name, g] : groups_) g->library.reset();
}

Registry::Group* Registry::find_group(std::string_view name) const {
  auto it = groups_.find(name);
  return it == groups_.end() ? nullptr : it->second.get();
}

const OpEntry* Registry::find_op(std::string_view op) const {
  if (const detail::OpIndex* index = index_.load(std::memory_order_acquire)) {
    if (const OpEntry* e = index->find(op)) return e;
  }
  return nullptr;
}

std::vector<const KernelSpec*> Registry::metadata_specs(std::string_view op) const {
  const size_t dot = op.find('.');
  const Group* g = dot == std::string_view::npos ? nullptr : find_group(op.substr(0, dot));
  // Once loaded, the loaded table is the truth (a reload may have added ops).
  if (g == nullptr || !g->has_metadata || g->table.load(std::memory_order_acquire) != nullptr) {
    return {};
  }
  auto it = g->metadata_ops.find(op);
  return it == g->metadata_ops.end() ? std::vector<const KernelSpec*>{} : it->second;
}

template <typename Lookup, typename Visit>
const OpEntry* Registry::follow_aliases(const Alias& from, Lookup&& lookup, Visit&& visit) const {
  std::string_view name = from.to;
  // add_alias and the manifest refuse cycles; the bound keeps a lookup finite regardless.
  for (size_t hops = 0; hops <= aliases_.size(); ++hops) {
    visit(name);
    if (const OpEntry* e = lookup(name)) return e;
    auto it = aliases_.find(name);
    if (it == aliases_.end()) return nullptr;
    name = it->second->to;
  }
  return nullptr;
}

const OpEntry* Registry::find_op_or_alias(std::string_view op, bool load) {
  if (const OpEntry* e = find_op(op, load)) return e;
  auto it = aliases_.find(op);
  if (it == aliases_.end()) return nullptr;
  const Alias& a = *it->second;
  auto lookup = [&](std::string_view name) { return find_op(name, load); };
  std::string_view last;
  const OpEntry* e = follow_aliases(a, lookup, [&](std::string_view name) { last = name; });
  // A chain to a missing op says so in the lookup's error instead.
  if (e != nullptr && !a.warned.exchange(true)) [[unlikely]] {
    // Once per alias, so the strings cost nothing on later calls. The names are checked
    // op ids; the message is the manifest's free text.
    std::string via;
    follow_aliases(a, lookup, [&](std::string_view name) {
      if (name != last) via += (via.empty() ? " (via " : " -> ") + std::string(name);
    });
    if (!via.empty()) via += ")";
    const std::string line = "kreg: warning: op '" + std::string(op) +
                             "' is a deprecated alias of '" + std::string(last) + "'" + via +
                             (a.message.empty() ? "" : ": " + escape_control(a.message)) + "\n";
    std::fputs(line.c_str(), stderr);
  }
  return e;
}

std::optional<AliasChain> Registry::resolve_alias(std::string_view op) const {
  // An op is known when a loaded table has it or a not-yet-loaded group's metadata lists
  // it; the sentinel stands for "known, not loaded" (follow_aliases wants a pointer).
  static const OpEntry known_unloaded;
  auto known = [&](std::string_view name) -> const OpEntry* {
    if (const OpEntry* e = find_op(name)) return e;
    return metadata_specs(name).empty() ? nullptr : &known_unloaded;
  };
  if (known(op) != nullptr) return std::nullopt;
  auto it = aliases_.find(op);
  if (it == aliases_.end()) return std::nullopt;
  AliasChain chain;
  chain.names.emplace_back(op);
  chain.message = it->second->message;
  chain.found = follow_aliases(*it->second, known, [&](std::string_view name) {
                  chain.names.emplace_back(name);
                }) != nullptr;
  return chain;
}

std::string AliasChain::text() const {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " -> ") + n;
  return s;
}

std::optional<std::pair<std::string, std::string>> Registry::alias(std::string_view op) const {
  auto chain = resolve_alias(op);
  if (!chain) return std::nullopt;
  return std::make_pair(chain->op(), chain->message);
}

Status Registry::unknown_op(std::string_view op) const {
  // The caller's text, quoted as a short escaped excerpt: it may be anything.
  const std::string asked = "'" + excerpt(op) + "'";
  const auto chain = resolve_alias(op);  // outlives `end`, which may point into it
  std::string_view end = op;
  std::string via;
  if (chain) {
    end = chain->op();
    via = " (an alias: " + chain->text() + ", and no group registers " + chain->op() + ")";
  }
  const size_t dot = end.find('.');
  Group* g = dot == std::string_view::npos ? nullptr : find_group(end.substr(0, dot));
  std::string error;
  if (g != nullptr) {
    std::lock_guard lock(mu_);  // a lazy load may be writing it
    error = g->error;
  }
  if (!error.empty()) {
    return Status(KREG_UNAVAILABLE,
                  "op " + asked + via + ": group '" + g->name + "' failed to load: " + error);
  }
  return Status(KREG_NOT_FOUND, "unknown op " + asked + via);
}

// ---------------------------------------------------------------------------------------
// Introspection

std::vector<GroupInfo> Registry::groups() const {
  std::lock_guard lock(mu_);
  std::vector<GroupInfo> out;
  for (const auto& [name, g] : groups_) {
    GroupInfo info;
    info.name = name;
    const Group::OpMap* table = g->table.load(std::memory_order_acquire);
    info.loaded = table != nullptr;
    if (g->entry) {
      info.enabled = g->entry->enabled;
      info.load = g->entry->load;
    }
    if (g->library) {
      info.plugin = g->library->info();
      // A reloaded generation was mapped from a private copy: name the file it came from.
      if (!g->loaded_from.empty()) info.plugin->path = g->loaded_from;
      info.private_copy = g->private_copy;
    }
    info.generation = g->generation;
    info.error = g->error;
    info.metadata_note = g->metadata_note;
    if (table) {
      info.source = GroupSource::kLoaded;
      for (const auto& [id, op] : *table) info.ops.push_back(id);
    } else if (g->has_metadata) {
      info.source = GroupSource::kMetadata;
      info.plugin = g->metadata_info;
      for (const auto& [id, specs] : g->metadata_ops) info.ops.push_back(id);
    }
    std::sort(info.ops.begin(), info.ops.end());
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const GroupInfo& a, const GroupInfo& b) { return a.name < b.name; });
  return out;
}

std::vector<std::string> Registry::op_ids() const {
  std::vector<std::string> ids;
  for (const GroupInfo& g : groups()) ids.insert(ids.end(), g.ops.begin(), g.ops.end());
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<const KernelSpec*> Registry::implementations(std::string_view op) const {
  std::vector<const KernelSpec*> out;
  if (const OpEntry* e = find_op(op)) {
    for (const Impl* impl : e->impls) out.push_back(&impl->spec);
    return out;
  }
  return metadata_specs(op);
}

}  // namespace kreg
