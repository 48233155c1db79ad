// Private to the core: Registry::Group and the helpers the registry's files share:
// registry.cpp (lookups, aliases, introspection), registry_loading.cpp (open, loading,
// publishing, lazy groups), selection.cpp (resolve, call), check_plan.cpp (the compiled
// argument check), call_errors.cpp (messages), named_attrs.cpp (named values -> slots)
// and reload.cpp (hot swapping).
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kreg/registry.hpp"

namespace kreg {

// One ops group: where it comes from and its current op table. A table is immutable once
// published; a change publishes a new one and keeps the old alive, so a reader that loaded
// the old pointer can finish with it.
struct Registry::Group {
  using OpMap = std::unordered_map<std::string, detail::OpEntry, StringHash, std::equal_to<>>;
  std::string name;
  std::optional<GroupEntry> entry;  // from the manifest
  std::atomic<const OpMap*> table{nullptr};
  std::vector<std::unique_ptr<OpMap>> tables;
  // The current generation's library. When it was loaded from a private copy (after a
  // reload; with OpenOptions::private_copy or a pin, the first generation too; the copy is
  // already unlinked) `loaded_from` names the file it was copied from.
  std::unique_ptr<PluginLibrary> library;
  std::filesystem::path loaded_from;
  bool private_copy = false;
  // Earlier generations, replaced by reload(): never unloaded while the registry lives
  // (calls in flight, or GPU work enqueued by their code, may still run them).
  std::vector<std::unique_ptr<PluginLibrary>> retired;
  uint64_t generation = 0;
  // The resource types of the running generation (resource.hpp): new resources are made
  // by these; a reload must keep every one (same parameters) and may add more.
  std::vector<ResourceTypeSpec> resource_types;
  std::string error;
  // A lazy group before its first load: what its library's embedded metadata says (read
  // by open() before the registry is returned and never changed afterwards, so readers
  // take no lock). Kept after the load: pointers implementations() returned stay valid.
  bool has_metadata = false;
  std::optional<PluginInfo> metadata_info;
  std::vector<KernelSpec> metadata_kernels;  // fn == nullptr
  // op id -> its kernels in metadata_kernels, highest priority first
  std::unordered_map<std::string, std::vector<const KernelSpec*>, StringHash, std::equal_to<>>
      metadata_ops;
  std::string metadata_note;  // why there is no metadata, when read and absent
};

namespace detail {

// The checked plan and storage for one spec (check_plan.cpp).
std::unique_ptr<Impl> make_impl(const KernelSpec& spec);
// CheckPlan::match_shapes for a plan of num_tensors tensors: the compare specialized for
// that arity (check_plan.cpp).
ShapeMatchFn shape_matcher(int num_tensors);
// "int", "float", "bool", "str", "Resource" (call_errors.cpp).
const char* attr_type_name(int32_t type);
// Where named values go (named_attrs.cpp): the slots of `sig`'s attributes, of kreg_attr
// types `types`, owned by `owner` (an op or resource type, for messages), called `noun`s
// ("attribute", "parameter"); `keep` stores a string and returns its stable c_str().
struct AttrSlots {
  std::string owner;
  const char* noun;
  const Signature& sig;
  std::span<const int32_t> types;
  bool resources;  // may a slot take a resource
  std::function<const char*(const std::string&)> keep;
};
// Fills `out` (defaults already there, one slot per attribute of slots.sig) from `named`;
// an error names the owner and the value (unknown, given twice, wrong type, a NUL byte in
// a string, a required one missing).
Status fill_named_attrs(const AttrSlots& slots, const std::vector<NamedAttr>& named,
                        std::span<kreg_attr> out);
// "cuda:0"
std::string device_string(const DLDevice& d);
// Is `sm` inside one of spec's capability windows; "cuda sm75-sm90 or cuda sm100-sm121".
bool sm_in_caps(const KernelSpec& spec, int sm);
std::string caps_string(const KernelSpec& spec);
// KREG_FORCE_BACKEND's text -> (op pattern, backend) pairs (selection.cpp).
std::vector<std::pair<std::string, std::string>> parse_forced_backends(std::string_view text);

// JIT specializations (jit_specialize.cpp): one per (op record, source generation,
// launcher, architecture, values), built once, never freed while the registry lives
// (handles point at them). A failure is remembered too, so a call does not recompile.
struct JitState {
  struct Entry {
    std::unique_ptr<Impl> impl;  // null: failed
    std::string error;
  };
  std::mutex mu;
  std::unordered_map<std::string, Entry> entries;
  // Sources of hot-swapped generations, kept alive for the registry's life (Impl::jit
  // points at them).
  std::vector<std::shared_ptr<const JitSource>> sources;
};

}  // namespace detail

// How to load one generation of a group's library (load_generation, reload.cpp): shared
// by the first load (Registry::load_locked) and every reload.
struct GenerationRequest {
  const GroupEntry* entry = nullptr;  // its admission rules; null: none (reload of a group
                                      // registered without a manifest entry)
  std::string group;
  std::filesystem::path library;  // the user's file
  std::optional<std::string> version;
  uint64_t generation = 1;  // names the private copy
  bool private_copy = false;
  bool precheck_in_child = false;
  double precheck_timeout_s = 10;
  const std::atomic<bool>* cancel = nullptr;  // abandons a pre-check in progress
  std::string precheck_failed = "refused by the pre-check in a child process: ";
};

struct LoadedGeneration {
  std::unique_ptr<PluginLibrary> library;
  std::vector<KernelSpec> kernels;  // their provenance names the user's file
  bool private_copy = false;
  std::filesystem::path copy_path;  // the (already unlinked) copy's name, when copied
};

// Admission (open once, path safety, pin on the copied bytes), the private copy, the
// pre-check in a child, then PluginLibrary::open of exactly the admitted bytes. The init
// hook has not run. Messages name the user's file, never the private copy.
Result<LoadedGeneration> load_generation(const GenerationRequest& request);

}  // namespace kreg
