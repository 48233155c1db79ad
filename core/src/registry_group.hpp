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
  // The current generation's library. After a reload it was loaded from a private copy
  // (already unlinked); `loaded_from` then names the file it was copied from.
  std::unique_ptr<PluginLibrary> library;
  std::filesystem::path loaded_from;
  // Earlier generations, replaced by reload(): never unloaded while the registry lives
  // (calls in flight, or GPU work enqueued by their code, may still run them).
  std::vector<std::unique_ptr<PluginLibrary>> retired;
  uint64_t generation = 0;
  std::string error;
};

}  // namespace kreg
