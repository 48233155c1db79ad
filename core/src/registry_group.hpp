// Private to the core: Registry::Group, shared by registry.cpp (loading, publishing,
// lookups) and reload.cpp (hot swapping).
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
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
  std::string error;
};

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
