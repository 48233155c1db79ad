// The bounds-checked ELF reader (kreg/elf_file.hpp) over arbitrary bytes, every query it
// answers: headers, segments, sections by name and their bytes, address mapping, the
// dynamic symbol table through the sections or PT_DYNAMIC, the symbol listing and the
// deeper verify(). Whatever the bytes claim, the reader must answer with a value or an
// error, read nothing outside the buffer and allocate no more than a few megabytes
// (run with -malloc_limit_mb). Seeds: small real and stripped plugins, and cut copies.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kreg/elf_file.hpp"

namespace {
volatile uint64_t g_sink = 0;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto elf = kreg::ElfFile::from_memory(bytes, "fuzz input");
  if (!elf.ok()) return 0;
  for (const kreg::ElfSegment& s : elf->segments()) {
    auto off = elf->file_offset(s.vaddr, s.filesz);
    if (off.ok()) g_sink = g_sink + *off;
  }
  for (const kreg::ElfSection& s : elf->sections()) g_sink = g_sink + s.name.size() + s.size;
  for (const char* name : {".dynsym", ".nv_fatbin", ".kreg", ".text", ".dynstr"}) {
    auto b = elf->section_bytes(name, 1 << 20);
    if (b.ok()) g_sink = g_sink + b->size();
  }
  auto entry = elf->find_dynamic_symbol("kreg_plugin_entry");
  if (entry.ok()) g_sink = g_sink + entry->value + entry->type;
  auto syms = elf->dynamic_symbols(4096);
  if (syms.ok()) {
    for (const kreg::ElfSymbol& s : *syms) g_sink = g_sink + s.name.size();
  }
  g_sink = g_sink + elf->verify().ok();
  return 0;
}
