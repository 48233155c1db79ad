// Stub (being implemented): see kreg/plugin_metadata.hpp.
#include "kreg/plugin_metadata.hpp"

namespace kreg {

Result<PluginMetadata> parse_plugin_metadata(std::string_view, const std::string& where) {
  return Status(KREG_UNIMPLEMENTED, where + ": metadata reader not implemented yet");
}

Result<PluginMetadata> read_plugin_metadata(const ElfFile& elf, const std::filesystem::path&) {
  return Status(KREG_UNIMPLEMENTED, elf.what() + ": metadata reader not implemented yet");
}

Result<PluginMetadata> read_plugin_metadata(const std::filesystem::path& file) {
  return Status(KREG_UNIMPLEMENTED, file.string() + ": metadata reader not implemented yet");
}

std::vector<std::string> compare_metadata(const PluginMetadata&, const PluginInfo&,
                                          const std::vector<KernelSpec>&) {
  return {};
}

}  // namespace kreg
