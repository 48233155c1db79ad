// A bounds-checked reader of ELF64 shared objects: the plugin libraries, read before the
// dynamic loader ever sees them (and by `kreg validate`, which must survive any file).
// Every offset, size and count in the file is checked against the file's size with
// overflow-safe arithmetic before anything is read, every table and name has a hard cap,
// and nothing is read that a question does not need. It reads with pread (never mmap: a
// file truncated under us must not SIGBUS) or from a buffer in memory (the fuzzer).
//
// What it checks when it opens a file: the header (64-bit, little-endian, ET_DYN), the
// program header table and every segment's bytes inside the file (a file cut short is
// DATA_LOSS, "is truncated"), the section header table inside the file, every section's
// bytes inside the file, no two sections (or a section and a header table) sharing bytes,
// and the section names. verify() adds the symbol tables (.symtab and .dynsym: entry
// size, their string tables, every name offset) and the dynamic segment.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/status.hpp"

namespace kreg {

struct ElfSegment {
  uint32_t index = 0;
  uint32_t type = 0;   // PT_*
  uint32_t flags = 0;  // PF_X 1, PF_W 2, PF_R 4
  uint64_t offset = 0;
  uint64_t vaddr = 0;
  uint64_t filesz = 0;
  uint64_t memsz = 0;
  uint64_t align = 0;
};

struct ElfSection {
  uint32_t index = 0;
  std::string name;   // "" when the file has no section-name table
  uint32_t type = 0;  // SHT_*
  uint64_t flags = 0;
  uint64_t addr = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
  uint32_t info = 0;
  uint64_t entsize = 0;
  // Whether it occupies bytes of the file (SHT_NOBITS, e.g. .bss, does not).
  bool has_bytes() const { return type != 8 /* SHT_NOBITS */ && size > 0; }
};

struct ElfSymbol {
  std::string name;
  uint64_t index = 0;      // in its symbol table
  uint8_t type = 0;        // STT_*
  uint8_t binding = 0;     // STB_*
  uint8_t visibility = 0;  // STV_*
  uint16_t shndx = 0;      // SHN_UNDEF (0): referenced here, defined elsewhere
  uint64_t value = 0;      // its virtual address when defined in a shared object
  uint64_t size = 0;
  bool defined() const { return shndx != 0; }
};

// "STT_FUNC (a function)", "STT_OBJECT (a data object)", ... for messages.
std::string elf_symbol_type_name(uint8_t type);
std::string elf_binding_name(uint8_t binding);        // "STB_GLOBAL", ...
std::string elf_visibility_name(uint8_t visibility);  // "STV_HIDDEN", ...

class ElfFile {
 public:
  // Caps on what a file may make the reader do. Real shared objects have a dozen program
  // headers, about forty sections and a section-name table of a few hundred bytes.
  static constexpr uint64_t kMaxSegments = 4096;
  static constexpr uint64_t kMaxSections = 16384;
  static constexpr uint64_t kMaxSectionNameTable = 1 << 20;
  static constexpr uint64_t kMaxNameLength = 4096;  // a section or symbol name
  static constexpr uint64_t kMaxSymbols = uint64_t{1} << 22;
  static constexpr uint64_t kMaxDynamicEntries = 65536;
  static constexpr uint64_t kMaxHashBuckets = uint64_t{1} << 24;

  // Opens `path` (RegularFile: no blocking, regular files only, at most `max_bytes`) and
  // reads its headers. Messages name the file as "<kind> <path>" ("plugin library /x.so").
  static Result<ElfFile> open(const std::filesystem::path& path, std::string_view kind,
                              uint64_t max_bytes);
  // Reads from `fd`, `size` bytes long; the descriptor is borrowed and must outlive this.
  // `what` names the file in every message.
  static Result<ElfFile> from_fd(int fd, uint64_t size, std::string what);
  // Reads from `bytes`, which are borrowed and must outlive this.
  static Result<ElfFile> from_memory(std::string_view bytes, std::string what);

  ElfFile(ElfFile&&) noexcept;
  ElfFile& operator=(ElfFile&&) noexcept;
  ~ElfFile();

  uint64_t size() const { return size_; }
  uint16_t machine() const { return machine_; }  // EM_*
  const std::string& what() const { return what_; }
  const std::vector<ElfSegment>& segments() const { return segments_; }
  // Empty when the file has no section headers (allowed: the loader never reads them).
  const std::vector<ElfSection>& sections() const { return sections_; }

  // The first section called `name`, or NOT_FOUND.
  Result<ElfSection> find_section(std::string_view name) const;
  // That section's bytes: NOT_FOUND when absent, FAILED_PRECONDITION when it has none in
  // the file (SHT_NOBITS), RESOURCE_EXHAUSTED when larger than `max_bytes`.
  Result<std::string> section_bytes(std::string_view name, uint64_t max_bytes) const;
  // `size` bytes at `offset`, checked against the file and `max_bytes`.
  Result<std::string> read(uint64_t offset, uint64_t size, uint64_t max_bytes) const;
  // The file offset of virtual addresses [vaddr, vaddr + size), through the PT_LOAD
  // segment whose file bytes hold all of them; NOT_FOUND when none does.
  Result<uint64_t> file_offset(uint64_t vaddr, uint64_t size) const;

  // A symbol of the dynamic symbol table, the one the loader and dlsym use: found through
  // the .dynsym section, or through PT_DYNAMIC (DT_SYMTAB, DT_STRTAB, DT_STRSZ and
  // DT_GNU_HASH or DT_HASH for the count) when the file has no section headers. When
  // both exist they must describe the same table. NOT_FOUND when no symbol has the name.
  Result<ElfSymbol> find_dynamic_symbol(std::string_view name) const;
  // The first `max_count` dynamic symbols, names included.
  Result<std::vector<ElfSymbol>> dynamic_symbols(uint64_t max_count) const;

  // The deeper checks: every symbol table (.symtab too, which nothing here needs but
  // tools read) has 24-byte entries, a string table that ends in NUL and name offsets
  // inside it, and the dynamic symbol table can be found and agrees with PT_DYNAMIC.
  Status verify() const;

  class Source;

 private:
  struct SymbolTable;
  ElfFile(std::shared_ptr<const Source> source, std::string what);
  Status parse();
  Status read_into(uint64_t offset, void* dst, uint64_t n) const;
  Status truncated(const std::string& part) const;
  Status corrupt(const std::string& problem) const;
  Result<SymbolTable> dynamic_table() const;
  Result<SymbolTable> table_of_section(const ElfSection& s) const;
  Result<SymbolTable> table_of_dynamic(const ElfSegment& dyn) const;
  Result<uint64_t> gnu_hash_count(uint64_t vaddr) const;
  Status check_names(const SymbolTable& t) const;
  Result<std::string> symbol_name(const SymbolTable& t, uint32_t st_name) const;

  std::shared_ptr<const Source> src_;
  std::string what_;
  uint64_t size_ = 0;
  uint16_t machine_ = 0;
  std::vector<ElfSegment> segments_;
  std::vector<ElfSection> sections_;
};

}  // namespace kreg
