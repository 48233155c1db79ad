// The embedded metadata reader (kreg/plugin_metadata.hpp) over arbitrary bytes: as a bare
// blob (parse_plugin_metadata, the section's contents) and, when the input is an ELF file,
// through read_plugin_metadata on it; whatever parses is compared with itself and with a
// changed copy (compare_metadata). Whatever the bytes say, the reader must answer with a
// value or an error, never read outside the input, and allocate no more than the limits
// allow (run with -malloc_limit_mb). Seeds: testgrp's real section and hand-made blobs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kreg/elf_file.hpp"
#include "kreg/plugin_metadata.hpp"

namespace {
volatile uint64_t g_sink = 0;

void use(const kreg::PluginMetadata& m) {
  g_sink = g_sink + m.info.group.size() + m.kernels.size();
  g_sink = g_sink + kreg::compare_metadata(m, m.info, m.kernels).size();
  if (!m.kernels.empty()) {
    std::vector<kreg::KernelSpec> changed(m.kernels.begin() + 1, m.kernels.end());
    kreg::PluginInfo info = m.info;
    info.version += "x";
    g_sink = g_sink + kreg::compare_metadata(m, info, changed).size();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto m = kreg::parse_plugin_metadata(bytes, "fuzz input");
  if (m.ok()) {
    use(*m);
  } else {
    g_sink = g_sink + m.status().message().size();
  }
  if (size >= 4 && bytes.substr(0, 4) ==
                       "\x7f"
                       "ELF") {
    auto elf = kreg::ElfFile::from_memory(bytes, "fuzz input");
    if (elf.ok()) {
      auto r = kreg::read_plugin_metadata(*elf, "fuzz.so");
      if (r.ok()) use(*r);
    }
  }
  return 0;
}
