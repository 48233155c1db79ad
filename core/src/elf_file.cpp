#include "kreg/elf_file.hpp"

#include <elf.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "kreg/regular_file.hpp"
#include "kreg/text.hpp"

namespace kreg {

// The structures are read in place with memcpy.
static_assert(std::endian::native == std::endian::little,
              "the ELF reader reads little-endian ELF structures in place");

namespace {

// Is [off, off + len) inside [0, size)? Never overflows.
bool within(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

// a * b, or nullopt on overflow.
std::optional<uint64_t> mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::string num(uint64_t v) { return std::to_string(v); }

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string type_name(uint16_t t) {
  switch (t) {
    case ET_NONE:
      return "no file type (ET_NONE)";
    case ET_REL:
      return "a relocatable object file (ET_REL, a .o)";
    case ET_EXEC:
      return "an executable (ET_EXEC)";
    case ET_CORE:
      return "a core dump (ET_CORE)";
    default:
      return "ELF file type " + num(t);
  }
}

std::string section_type_name(uint32_t t) {
  switch (t) {
    case SHT_PROGBITS:
      return "SHT_PROGBITS";
    case SHT_SYMTAB:
      return "SHT_SYMTAB";
    case SHT_STRTAB:
      return "SHT_STRTAB";
    case SHT_DYNSYM:
      return "SHT_DYNSYM";
    case SHT_DYNAMIC:
      return "SHT_DYNAMIC";
    case SHT_NOTE:
      return "SHT_NOTE";
    case SHT_RELA:
      return "SHT_RELA";
    case SHT_HASH:
      return "SHT_HASH";
    case SHT_GNU_HASH:
      return "SHT_GNU_HASH";
    default:
      return "type " + num(t);
  }
}

std::string section_label(const ElfSection& s) {
  std::string name = s.name.empty() ? "" : ", " + excerpt(s.name, 60);
  return "section " + num(s.index) + " (" + section_type_name(s.type) + name + ")";
}

}  // namespace

std::string elf_symbol_type_name(uint8_t type) {
  switch (type) {
    case STT_NOTYPE:
      return "STT_NOTYPE (a symbol without a type)";
    case STT_OBJECT:
      return "STT_OBJECT (a data object)";
    case STT_FUNC:
      return "STT_FUNC (a function)";
    case STT_SECTION:
      return "STT_SECTION (a section)";
    case STT_FILE:
      return "STT_FILE (a source file name)";
    case STT_COMMON:
      return "STT_COMMON (a common data object)";
    case STT_TLS:
      return "STT_TLS (a thread-local variable)";
    case STT_GNU_IFUNC:
      return "STT_GNU_IFUNC (an indirect function, resolved when loaded)";
    default:
      return "symbol type " + num(type);
  }
}

std::string elf_binding_name(uint8_t binding) {
  switch (binding) {
    case STB_LOCAL:
      return "STB_LOCAL";
    case STB_GLOBAL:
      return "STB_GLOBAL";
    case STB_WEAK:
      return "STB_WEAK";
    case STB_GNU_UNIQUE:
      return "STB_GNU_UNIQUE";
    default:
      return "binding " + num(binding);
  }
}

std::string elf_visibility_name(uint8_t visibility) {
  switch (visibility) {
    case STV_DEFAULT:
      return "STV_DEFAULT";
    case STV_INTERNAL:
      return "STV_INTERNAL";
    case STV_HIDDEN:
      return "STV_HIDDEN";
    case STV_PROTECTED:
      return "STV_PROTECTED";
    default:
      return "visibility " + num(visibility);
  }
}

// ---- where the bytes come from ----

class ElfFile::Source {
 public:
  virtual ~Source() = default;
  // Exactly `n` bytes at `off`; the caller has checked the range against the file size.
  virtual Status read(uint64_t off, void* dst, size_t n) const = 0;
};

namespace {

class MemorySource final : public ElfFile::Source {
 public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
  Status read(uint64_t off, void* dst, size_t n) const override {
    if (n > 0) std::memcpy(dst, bytes_.data() + off, n);
    return OkStatus();
  }

 private:
  std::string_view bytes_;
};

// pread, with one cached block for the many small reads a symbol scan makes (a name, a
// hash bucket): they mostly fall into the same few kilobytes.
class FdSource final : public ElfFile::Source {
 public:
  FdSource(int fd, uint64_t size, std::string what, std::optional<RegularFile> owned)
      : fd_(fd), size_(size), what_(std::move(what)), owned_(std::move(owned)) {}

  Status read(uint64_t off, void* dst, size_t n) const override {
    constexpr uint64_t kBlock = 64 * 1024;
    if (n > 4096) return pread_all(off, static_cast<char*>(dst), n);
    if (!(block_len_ > 0 && off >= block_off_ && off - block_off_ + n <= block_len_)) {
      uint64_t start = off - off % kBlock;
      if (off + n > start + kBlock) start = off;
      const uint64_t len = std::min<uint64_t>(kBlock, size_ - start);
      block_.resize(len);
      block_len_ = 0;
      if (Status st = pread_all(start, block_.data(), len); !st.ok()) return st;
      block_off_ = start;
      block_len_ = len;
    }
    std::memcpy(dst, block_.data() + (off - block_off_), n);
    return OkStatus();
  }

 private:
  Status pread_all(uint64_t off, char* dst, size_t n) const {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(off + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return Status(KREG_DATA_LOSS, what_ + ": read error at offset " + num(off + done) + ": " +
                                          std::strerror(errno));
      }
      if (got == 0) {
        return Status(KREG_DATA_LOSS, what_ + " shrank while being read (nothing at offset " +
                                          num(off + done) + " of the " + num(size_) +
                                          " bytes it had; is something still writing it?)");
      }
      done += static_cast<size_t>(got);
    }
    return OkStatus();
  }

  int fd_;
  uint64_t size_;
  std::string what_;
  std::optional<RegularFile> owned_;
  mutable std::vector<char> block_;
  mutable uint64_t block_off_ = 0;
  mutable uint64_t block_len_ = 0;
};

}  // namespace

// ---- opening ----

ElfFile::ElfFile(std::shared_ptr<const Source> source, std::string what)
    : src_(std::move(source)), what_(std::move(what)) {}
ElfFile::ElfFile(ElfFile&&) noexcept = default;
ElfFile& ElfFile::operator=(ElfFile&&) noexcept = default;
ElfFile::~ElfFile() = default;

Result<ElfFile> ElfFile::open(const std::filesystem::path& path, std::string_view kind,
                              uint64_t max_bytes) {
  auto file = RegularFile::open(path, kind, max_bytes);
  if (!file) return file.status();
  std::string what = std::string(kind) + " " + path.string();
  const int fd = file->fd();
  const uint64_t size = file->size();
  ElfFile elf(std::make_shared<FdSource>(fd, size, what, std::move(file).value()), what);
  elf.size_ = size;
  if (Status st = elf.parse(); !st.ok()) return st;
  return elf;
}

Result<ElfFile> ElfFile::from_fd(int fd, uint64_t size, std::string what) {
  ElfFile elf(std::make_shared<FdSource>(fd, size, what, std::nullopt), what);
  elf.size_ = size;
  if (Status st = elf.parse(); !st.ok()) return st;
  return elf;
}

Result<ElfFile> ElfFile::from_memory(std::string_view bytes, std::string what) {
  ElfFile elf(std::make_shared<MemorySource>(bytes), std::move(what));
  elf.size_ = bytes.size();
  if (Status st = elf.parse(); !st.ok()) return st;
  return elf;
}

Status ElfFile::read_into(uint64_t offset, void* dst, uint64_t n) const {
  if (n == 0) return OkStatus();
  if (!within(offset, n, size_)) {
    return corrupt("asks for " + num(n) + " bytes at offset " + num(offset) +
                   ", past the end of the file (" + num(size_) + " bytes)");
  }
  return src_->read(offset, dst, static_cast<size_t>(n));
}

Status ElfFile::truncated(const std::string& part) const {
  return Status(KREG_DATA_LOSS, what_ + " is truncated: " + part + " ends past the file's " +
                                    num(size_) + " bytes (a build still writing it?)");
}

Status ElfFile::corrupt(const std::string& problem) const {
  return Status(KREG_INVALID_ARGUMENT, what_ + " is not a valid ELF shared object: " + problem);
}

Status ElfFile::parse() {
  const std::string not_elf = what_ + " is not an ELF shared object";
  if (size_ >= SELFMAG) {
    unsigned char magic[SELFMAG];
    if (Status st = read_into(0, magic, SELFMAG); !st.ok()) return st;
    if (std::memcmp(magic, ELFMAG, SELFMAG) != 0) {
      return Status(KREG_INVALID_ARGUMENT, not_elf + " (bad magic)");
    }
  }
  if (size_ < sizeof(Elf64_Ehdr)) {
    return Status(KREG_INVALID_ARGUMENT,
                  not_elf + (size_ == 0 ? " (an empty file)"
                                        : " (too short: " + num(size_) + " bytes, the ELF " +
                                              "header alone is " + num(sizeof(Elf64_Ehdr)) + ")"));
  }
  unsigned char ident[EI_NIDENT];
  if (Status st = read_into(0, ident, EI_NIDENT); !st.ok()) return st;
  if (ident[EI_CLASS] == ELFCLASS32) {
    return Status(KREG_INVALID_ARGUMENT, what_ + " is a 32-bit ELF object; this host needs 64-bit");
  }
  if (ident[EI_CLASS] != ELFCLASS64) {
    return Status(KREG_INVALID_ARGUMENT,
                  not_elf + " (invalid ELF class " + num(ident[EI_CLASS]) + ")");
  }
  if (ident[EI_DATA] == ELFDATA2MSB) {
    return Status(KREG_INVALID_ARGUMENT,
                  what_ + " is a big-endian ELF object; this host is little-endian");
  }
  if (ident[EI_DATA] != ELFDATA2LSB) {
    return Status(KREG_INVALID_ARGUMENT,
                  not_elf + " (invalid ELF data encoding " + num(ident[EI_DATA]) + ")");
  }
  if (ident[EI_VERSION] != EV_CURRENT) {
    return Status(KREG_INVALID_ARGUMENT, not_elf + " (ELF version " + num(ident[EI_VERSION]) +
                                             ", expected " + num(EV_CURRENT) + ")");
  }
  Elf64_Ehdr eh;
  if (Status st = read_into(0, &eh, sizeof eh); !st.ok()) return st;
  if (eh.e_type != ET_DYN) {
    return Status(
        KREG_INVALID_ARGUMENT,
        what_ + " is an ELF object but not a shared library: it is " + type_name(eh.e_type));
  }
  machine_ = eh.e_machine;

  // Section 0 holds the real counts when they do not fit the header's 16-bit fields.
  uint64_t shnum = eh.e_shnum;
  uint64_t shstrndx = eh.e_shstrndx;
  uint64_t phnum = eh.e_phnum;
  const bool has_sections = eh.e_shoff != 0;
  if (has_sections) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr)) {
      return corrupt("its section header entries are " + num(eh.e_shentsize) +
                     " bytes (e_shentsize), not " + num(sizeof(Elf64_Shdr)));
    }
    if (!within(eh.e_shoff, sizeof(Elf64_Shdr), size_)) {
      return truncated("its section header table (at offset " + num(eh.e_shoff) + ")");
    }
    Elf64_Shdr sh0;
    if (Status st = read_into(eh.e_shoff, &sh0, sizeof sh0); !st.ok()) return st;
    if (shnum == 0) shnum = sh0.sh_size;
    if (shstrndx == SHN_XINDEX) shstrndx = sh0.sh_link;
    if (phnum == PN_XNUM) phnum = sh0.sh_info;
  } else if (eh.e_shnum != 0) {
    return corrupt("the header lists " + num(eh.e_shnum) + " section headers at offset 0");
  }

  // Program headers.
  if (phnum > 0) {
    if (eh.e_phentsize != sizeof(Elf64_Phdr)) {
      return corrupt("its program header entries are " + num(eh.e_phentsize) +
                     " bytes (e_phentsize), not " + num(sizeof(Elf64_Phdr)));
    }
    const auto bytes = mul(phnum, sizeof(Elf64_Phdr));
    if (!bytes || !within(eh.e_phoff, *bytes, size_)) {
      return truncated("its program header table (" + num(phnum) + " entries of " +
                       num(sizeof(Elf64_Phdr)) + " bytes at offset " + num(eh.e_phoff) + ")");
    }
    if (phnum > kMaxSegments) {
      return corrupt("it has " + num(phnum) + " program headers; the limit is " +
                     num(kMaxSegments));
    }
    std::vector<Elf64_Phdr> ph(phnum);
    if (Status st = read_into(eh.e_phoff, ph.data(), *bytes); !st.ok()) return st;
    segments_.reserve(phnum);
    for (uint64_t i = 0; i < phnum; ++i) {
      const Elf64_Phdr& p = ph[i];
      ElfSegment s{static_cast<uint32_t>(i),
                   p.p_type,
                   p.p_flags,
                   p.p_offset,
                   p.p_vaddr,
                   p.p_filesz,
                   p.p_memsz,
                   p.p_align};
      if (p.p_filesz > 0 && !within(p.p_offset, p.p_filesz, size_)) {
        return truncated("its segment " + num(i) + (p.p_type == PT_LOAD ? " (PT_LOAD, " : " (") +
                         num(p.p_filesz) + " bytes at offset " + num(p.p_offset) + ")");
      }
      if (p.p_type == PT_LOAD) {
        if (p.p_filesz > p.p_memsz) {
          return corrupt("segment " + num(i) + " (PT_LOAD) has " + num(p.p_filesz) +
                         " bytes in the file but only " + num(p.p_memsz) + " in memory");
        }
        if (!within(p.p_vaddr, p.p_memsz, UINT64_MAX)) {
          return corrupt("segment " + num(i) + " (PT_LOAD) wraps around the address space");
        }
      }
      segments_.push_back(s);
    }
  }

  if (!has_sections || shnum == 0) return OkStatus();
  const auto sh_bytes = mul(shnum, sizeof(Elf64_Shdr));
  if (!sh_bytes || !within(eh.e_shoff, *sh_bytes, size_)) {
    return truncated("its section header table (" + num(shnum) + " entries of " +
                     num(sizeof(Elf64_Shdr)) + " bytes at offset " + num(eh.e_shoff) + ")");
  }
  if (shnum > kMaxSections) {
    return corrupt("it has " + num(shnum) + " sections; the limit is " + num(kMaxSections));
  }
  std::vector<Elf64_Shdr> sh(shnum);
  if (Status st = read_into(eh.e_shoff, sh.data(), *sh_bytes); !st.ok()) return st;
  sections_.reserve(shnum);
  for (uint64_t i = 0; i < shnum; ++i) {
    const Elf64_Shdr& h = sh[i];
    ElfSection s;
    s.index = static_cast<uint32_t>(i);
    s.type = h.sh_type;
    s.flags = h.sh_flags;
    s.addr = h.sh_addr;
    s.offset = h.sh_offset;
    s.size = h.sh_size;
    s.link = h.sh_link;
    s.info = h.sh_info;
    s.entsize = h.sh_entsize;
    sections_.push_back(std::move(s));
  }

  // Section names: one bounded read of the name table, which must end in NUL so that
  // every name in it is terminated.
  if (shstrndx != SHN_UNDEF) {
    if (shstrndx >= shnum) {
      return corrupt("its section-name table index " + num(shstrndx) + " (e_shstrndx) is not " +
                     "one of its " + num(shnum) + " sections");
    }
    const ElfSection& names = sections_[shstrndx];
    if (names.type != SHT_STRTAB) {
      return corrupt("its section-name table, " + section_label(names) + ", is not a string table");
    }
    if (names.size > kMaxSectionNameTable) {
      return corrupt("its section-name table is " + num(names.size) + " bytes; the limit is " +
                     num(kMaxSectionNameTable));
    }
    if (!within(names.offset, names.size, size_)) {
      return corrupt("its section-name table, " + section_label(names) + ", claims " +
                     num(names.size) + " bytes at offset " + num(names.offset) +
                     ", past the end of the file (" + num(size_) + " bytes)");
    }
    std::string table(names.size, '\0');
    if (Status st = read_into(names.offset, table.data(), names.size); !st.ok()) return st;
    if (!table.empty() && table.back() != '\0') {
      return corrupt("its section-name table (" + section_label(names) +
                     ") does not end with a NUL byte");
    }
    for (ElfSection& s : sections_) {
      const uint32_t off = sh[s.index].sh_name;
      if (off == 0 && table.empty()) continue;
      if (off >= table.size()) {
        return corrupt("section " + num(s.index) + "'s name offset " + num(off) +
                       " is past the end of its section-name table (" + num(table.size()) +
                       " bytes)");
      }
      const size_t len = ::strnlen(table.data() + off, table.size() - off);
      if (len > kMaxNameLength) {
        return corrupt("section " + num(s.index) + "'s name is " + num(len) +
                       " bytes; the limit is " + num(kMaxNameLength));
      }
      s.name.assign(table.data() + off, len);
    }
  }

  // Section 0 is the null section; in extended numbering its fields hold counts.
  for (size_t i = 1; i < sections_.size(); ++i) {
    const ElfSection& s = sections_[i];
    if (s.has_bytes() && !within(s.offset, s.size, size_)) {
      return corrupt(section_label(s) + " claims " + num(s.size) + " bytes at offset " +
                     num(s.offset) + ", past the end of the file (" + num(size_) + " bytes)");
    }
  }

  // No two pieces of the file may share bytes: a section inside another, or over a header
  // table, means the headers are garbage (no linker or strip writes that).
  struct Region {
    uint64_t begin, end;
    std::string label;
  };
  std::vector<Region> regions;
  regions.reserve(sections_.size() + 2);
  regions.push_back({0, sizeof(Elf64_Ehdr), "the ELF header"});
  regions.push_back({eh.e_shoff, eh.e_shoff + *sh_bytes, "the section header table"});
  if (phnum > 0) {
    regions.push_back(
        {eh.e_phoff, eh.e_phoff + phnum * sizeof(Elf64_Phdr), "the program header table"});
  }
  for (size_t i = 1; i < sections_.size(); ++i) {
    const ElfSection& s = sections_[i];
    if (s.has_bytes()) regions.push_back({s.offset, s.offset + s.size, section_label(s)});
  }
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < regions.size(); ++i) {
    // The header tables may touch the ELF header's end; any real overlap is an error.
    const Region& a = regions[i - 1];
    const Region& b = regions[i];
    if (b.begin < a.end) {
      return corrupt(b.label + " (bytes " + num(b.begin) + "-" + num(b.end) + ") overlaps " +
                     a.label + " (bytes " + num(a.begin) + "-" + num(a.end) + ")");
    }
  }
  return OkStatus();
}

// ---- sections and addresses ----

Result<ElfSection> ElfFile::find_section(std::string_view name) const {
  for (const ElfSection& s : sections_) {
    if (s.index > 0 && s.name == name) return s;
  }
  return Status(KREG_NOT_FOUND, what_ + " has no section named '" + excerpt(name) + "'");
}

Result<std::string> ElfFile::section_bytes(std::string_view name, uint64_t max_bytes) const {
  auto s = find_section(name);
  if (!s) return s.status();
  if (s->type == SHT_NOBITS) {
    return Status(KREG_FAILED_PRECONDITION,
                  what_ + ": " + section_label(*s) + " has no bytes in the file (SHT_NOBITS)");
  }
  if (s->size > max_bytes) {
    return Status(KREG_RESOURCE_EXHAUSTED, what_ + ": " + section_label(*s) + " is " +
                                               num(s->size) + " bytes; the limit here is " +
                                               num(max_bytes));
  }
  return read(s->offset, s->size, max_bytes);
}

Result<std::string> ElfFile::read(uint64_t offset, uint64_t size, uint64_t max_bytes) const {
  if (size > max_bytes) {
    return Status(KREG_RESOURCE_EXHAUSTED, what_ + ": a read of " + num(size) +
                                               " bytes; the limit here is " + num(max_bytes));
  }
  if (!within(offset, size, size_)) {
    return corrupt(num(size) + " bytes at offset " + num(offset) +
                   " are past the end of the file (" + num(size_) + " bytes)");
  }
  std::string out(size, '\0');
  if (Status st = read_into(offset, out.data(), size); !st.ok()) return st;
  return out;
}

Result<uint64_t> ElfFile::file_offset(uint64_t vaddr, uint64_t size) const {
  for (const ElfSegment& s : segments_) {
    if (s.type != PT_LOAD || vaddr < s.vaddr) continue;
    const uint64_t rel = vaddr - s.vaddr;
    if (within(rel, size, s.filesz)) return s.offset + rel;
  }
  return Status(KREG_NOT_FOUND, what_ + ": addresses " + hex(vaddr) + " (" + num(size) +
                                    " bytes) are not in the file bytes of any PT_LOAD segment");
}

// ---- symbol tables ----

struct ElfFile::SymbolTable {
  std::string label;  // ".dynsym (section 3)", "the dynamic segment's DT_SYMTAB"
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t str_offset = 0;
  uint64_t str_size = 0;
};

namespace {
// Reads symbols [first, first + n) of a table in one piece.
constexpr uint64_t kSymbolChunk = 1024;
}  // namespace

Result<ElfFile::SymbolTable> ElfFile::table_of_section(const ElfSection& s) const {
  SymbolTable t;
  t.label = section_label(s);
  if (s.entsize != sizeof(Elf64_Sym) || s.size % sizeof(Elf64_Sym) != 0) {
    return corrupt(t.label + " has entries of " + num(s.entsize) + " bytes and a size of " +
                   num(s.size) + "; symbol entries are " + num(sizeof(Elf64_Sym)) + " bytes");
  }
  if (s.link == 0 || s.link >= sections_.size() || sections_[s.link].type != SHT_STRTAB) {
    return corrupt(t.label + " links to section " + num(s.link) + ", which is not a string table");
  }
  const ElfSection& str = sections_[s.link];
  t.offset = s.offset;
  t.count = s.size / sizeof(Elf64_Sym);
  t.str_offset = str.offset;
  t.str_size = str.type == SHT_NOBITS ? 0 : str.size;
  return t;
}

Result<uint64_t> ElfFile::gnu_hash_count(uint64_t vaddr) const {
  // Header: nbuckets, symoffset, bloom words, bloom shift; then the bloom filter (64-bit
  // words), the buckets and the chains. The count is one past the last chain's end.
  uint32_t hdr[4];
  auto off = file_offset(vaddr, sizeof hdr);
  if (!off) return corrupt("its DT_GNU_HASH table at " + hex(vaddr) + " is not in the file");
  if (Status st = read_into(*off, hdr, sizeof hdr); !st.ok()) return st;
  const uint64_t nbuckets = hdr[0], symoffset = hdr[1], bloom = hdr[2];
  if (nbuckets > kMaxHashBuckets) {
    return corrupt("its DT_GNU_HASH table has " + num(nbuckets) + " buckets; the limit is " +
                   num(kMaxHashBuckets));
  }
  const uint64_t buckets_at = *off + sizeof hdr + bloom * 8;  // bloom < 2^32: no overflow
  if (!within(buckets_at, nbuckets * 4, size_)) {
    return corrupt("its DT_GNU_HASH table (" + num(nbuckets) + " buckets) runs past the file");
  }
  uint64_t last = 0;
  std::vector<uint32_t> chunk;
  for (uint64_t b = 0; b < nbuckets; b += kSymbolChunk) {
    const uint64_t n = std::min(kSymbolChunk, nbuckets - b);
    chunk.resize(n);
    if (Status st = read_into(buckets_at + b * 4, chunk.data(), n * 4); !st.ok()) return st;
    for (uint32_t v : chunk) last = std::max<uint64_t>(last, v);
  }
  if (last < symoffset) return symoffset;  // nothing hashed
  const uint64_t chains_at = buckets_at + nbuckets * 4;
  for (uint64_t i = last;; ++i) {
    if (i - symoffset >= kMaxSymbols) {
      return corrupt("its DT_GNU_HASH chain has more than " + num(kMaxSymbols) + " symbols");
    }
    uint32_t h;
    const uint64_t at = chains_at + (i - symoffset) * 4;
    if (!within(at, 4, size_)) return corrupt("its DT_GNU_HASH chains run past the file");
    if (Status st = read_into(at, &h, 4); !st.ok()) return st;
    if (h & 1) return i + 1;
  }
}

Result<ElfFile::SymbolTable> ElfFile::table_of_dynamic(const ElfSegment& dyn) const {
  const uint64_t entries = dyn.filesz / sizeof(Elf64_Dyn);
  if (entries > kMaxDynamicEntries) {
    return corrupt("its dynamic segment has " + num(entries) + " entries; the limit is " +
                   num(kMaxDynamicEntries));
  }
  std::vector<Elf64_Dyn> d(entries);
  if (Status st = read_into(dyn.offset, d.data(), entries * sizeof(Elf64_Dyn)); !st.ok()) return st;
  std::optional<uint64_t> symtab, strtab, strsz, syment, hash, gnu_hash;
  bool terminated = false;
  for (const Elf64_Dyn& e : d) {
    if (e.d_tag == DT_NULL) {
      terminated = true;
      break;
    }
    switch (e.d_tag) {
      case DT_SYMTAB:
        symtab = e.d_un.d_ptr;
        break;
      case DT_STRTAB:
        strtab = e.d_un.d_ptr;
        break;
      case DT_STRSZ:
        strsz = e.d_un.d_val;
        break;
      case DT_SYMENT:
        syment = e.d_un.d_val;
        break;
      case DT_HASH:
        hash = e.d_un.d_ptr;
        break;
      case DT_GNU_HASH:
        gnu_hash = e.d_un.d_ptr;
        break;
      default:
        break;
    }
  }
  const std::string seg = "its dynamic segment (segment " + num(dyn.index) + ")";
  if (!terminated) return corrupt(seg + " has no DT_NULL entry ending it");
  if (!symtab || !strtab || !strsz) {
    return corrupt(seg + " lacks " +
                   std::string(!symtab   ? "DT_SYMTAB"
                               : !strtab ? "DT_STRTAB"
                                         : "DT_STRSZ") +
                   ": it has no usable dynamic symbol table");
  }
  if (syment && *syment != sizeof(Elf64_Sym)) {
    return corrupt(seg + " says symbol entries are " + num(*syment) + " bytes (DT_SYMENT), not " +
                   num(sizeof(Elf64_Sym)));
  }
  SymbolTable t;
  t.label = "the dynamic symbol table (DT_SYMTAB)";
  if (gnu_hash) {
    auto n = gnu_hash_count(*gnu_hash);
    if (!n) return n.status();
    t.count = *n;
  } else if (hash) {
    uint32_t h[2];
    auto off = file_offset(*hash, sizeof h);
    if (!off) return corrupt(seg + ": its DT_HASH table at " + hex(*hash) + " is not in the file");
    if (Status st = read_into(*off, h, sizeof h); !st.ok()) return st;
    t.count = h[1];  // nchain: one entry per symbol
  } else {
    return corrupt(seg +
                   " has neither DT_GNU_HASH nor DT_HASH: the loader cannot look up its "
                   "symbols");
  }
  if (t.count > kMaxSymbols) {
    return corrupt(t.label + " has " + num(t.count) + " symbols; the limit is " + num(kMaxSymbols));
  }
  auto sym_off = file_offset(*symtab, t.count * sizeof(Elf64_Sym));
  if (!sym_off) {
    return corrupt(t.label + " (" + num(t.count) + " symbols at " + hex(*symtab) +
                   ") is not in the file bytes of a PT_LOAD segment");
  }
  auto str_off = file_offset(*strtab, *strsz);
  if (!str_off) {
    return corrupt("its dynamic string table (DT_STRTAB, " + num(*strsz) + " bytes at " +
                   hex(*strtab) + ") is not in the file bytes of a PT_LOAD segment");
  }
  t.offset = *sym_off;
  t.str_offset = *str_off;
  t.str_size = *strsz;
  return t;
}

Result<ElfFile::SymbolTable> ElfFile::dynamic_table() const {
  const ElfSection* dynsym = nullptr;
  for (const ElfSection& s : sections_) {
    if (s.index == 0 || s.type != SHT_DYNSYM) continue;
    if (dynsym != nullptr) {
      return corrupt("it has two dynamic symbol tables, " + section_label(*dynsym) + " and " +
                     section_label(s));
    }
    dynsym = &s;
  }
  const ElfSegment* dynamic = nullptr;
  for (const ElfSegment& s : segments_) {
    if (s.type != PT_DYNAMIC) continue;
    if (dynamic != nullptr) {
      return corrupt("it has two PT_DYNAMIC segments (" + num(dynamic->index) + " and " +
                     num(s.index) + ")");
    }
    dynamic = &s;
  }
  std::optional<SymbolTable> from_section, from_dynamic;
  if (dynsym != nullptr) {
    auto t = table_of_section(*dynsym);
    if (!t) return t.status();
    from_section = std::move(t).value();
  }
  if (dynamic != nullptr) {
    auto t = table_of_dynamic(*dynamic);
    if (!t) return t.status();
    from_dynamic = std::move(t).value();
  }
  if (from_section && from_dynamic) {
    // The loader reads the dynamic segment, tools read the sections: both must be the same
    // table, or a check on one says nothing about the other.
    if (from_section->offset != from_dynamic->offset ||
        from_section->str_offset != from_dynamic->str_offset) {
      return corrupt(from_section->label + " (symbols at offset " + num(from_section->offset) +
                     ", names at offset " + num(from_section->str_offset) +
                     ") is not the table its dynamic segment names (symbols at offset " +
                     num(from_dynamic->offset) + ", names at offset " +
                     num(from_dynamic->str_offset) + ")");
    }
    if (from_dynamic->count > from_section->count) {
      return corrupt("its dynamic segment's hash table counts " + num(from_dynamic->count) +
                     " symbols, but " + from_section->label + " holds only " +
                     num(from_section->count));
    }
  }
  if (from_section) return *from_section;
  if (from_dynamic) return *from_dynamic;
  return Status(KREG_NOT_FOUND, what_ +
                                    " has no dynamic symbol table (no .dynsym section and no "
                                    "PT_DYNAMIC segment): it exports nothing");
}

Status ElfFile::check_names(const SymbolTable& t) const {
  if (t.count > kMaxSymbols) {
    return corrupt(t.label + " has " + num(t.count) + " symbols; the limit is " + num(kMaxSymbols));
  }
  if (t.str_size > 0) {
    char last;
    if (Status st = read_into(t.str_offset + t.str_size - 1, &last, 1); !st.ok()) return st;
    if (last != '\0') return corrupt("the string table of " + t.label + " does not end with a NUL");
  }
  std::vector<Elf64_Sym> chunk;
  for (uint64_t first = 0; first < t.count; first += kSymbolChunk) {
    const uint64_t n = std::min(kSymbolChunk, t.count - first);
    chunk.resize(n);
    if (Status st =
            read_into(t.offset + first * sizeof(Elf64_Sym), chunk.data(), n * sizeof(Elf64_Sym));
        !st.ok()) {
      return st;
    }
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t name = chunk[i].st_name;
      if (name != 0 && name >= t.str_size) {
        return corrupt("symbol " + num(first + i) + " of " + t.label + " has name offset " +
                       num(name) + ", past the end of its string table (" + num(t.str_size) +
                       " bytes)");
      }
    }
  }
  return OkStatus();
}

Result<std::string> ElfFile::symbol_name(const SymbolTable& t, uint32_t st_name) const {
  if (st_name == 0 || st_name >= t.str_size) return std::string();
  const uint64_t room = std::min<uint64_t>(t.str_size - st_name, kMaxNameLength + 1);
  std::string buf(room, '\0');
  if (Status st = read_into(t.str_offset + st_name, buf.data(), room); !st.ok()) return st;
  const size_t len = ::strnlen(buf.data(), buf.size());
  if (len > kMaxNameLength) {
    return corrupt("a symbol name in " + t.label + " is longer than " + num(kMaxNameLength) +
                   " bytes");
  }
  buf.resize(len);
  return buf;
}

namespace {
ElfSymbol to_symbol(const Elf64_Sym& s, uint64_t index, std::string name) {
  ElfSymbol out;
  out.name = std::move(name);
  out.index = index;
  out.type = ELF64_ST_TYPE(s.st_info);
  out.binding = ELF64_ST_BIND(s.st_info);
  out.visibility = ELF64_ST_VISIBILITY(s.st_other);
  out.shndx = s.st_shndx;
  out.value = s.st_value;
  out.size = s.st_size;
  return out;
}
}  // namespace

Result<ElfSymbol> ElfFile::find_dynamic_symbol(std::string_view name) const {
  auto t = dynamic_table();
  if (!t) return t.status();
  if (Status st = check_names(*t); !st.ok()) return st;
  const uint64_t want = name.size() + 1;  // the name and its NUL
  std::optional<ElfSymbol> undefined;
  std::vector<Elf64_Sym> chunk;
  std::string buf(want, '\0');
  for (uint64_t first = 0; first < t->count; first += kSymbolChunk) {
    const uint64_t n = std::min(kSymbolChunk, t->count - first);
    chunk.resize(n);
    if (Status st =
            read_into(t->offset + first * sizeof(Elf64_Sym), chunk.data(), n * sizeof(Elf64_Sym));
        !st.ok()) {
      return st;
    }
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t at = chunk[i].st_name;
      if (at == 0 || !within(at, want, t->str_size)) continue;
      if (Status st = read_into(t->str_offset + at, buf.data(), want); !st.ok()) return st;
      if (buf.compare(0, name.size(), name) != 0 || buf[name.size()] != '\0') continue;
      ElfSymbol sym = to_symbol(chunk[i], first + i, std::string(name));
      // Versioned libraries may hold a reference and a definition of one name.
      if (sym.defined()) return sym;
      if (!undefined) undefined = std::move(sym);
    }
  }
  if (undefined) return *undefined;
  return Status(KREG_NOT_FOUND, what_ + " has no dynamic symbol named '" + excerpt(name) + "'");
}

Result<std::vector<ElfSymbol>> ElfFile::dynamic_symbols(uint64_t max_count) const {
  auto t = dynamic_table();
  if (!t) return t.status();
  if (Status st = check_names(*t); !st.ok()) return st;
  std::vector<ElfSymbol> out;
  const uint64_t count = std::min(t->count, max_count);
  std::vector<Elf64_Sym> chunk;
  for (uint64_t first = 0; first < count; first += kSymbolChunk) {
    const uint64_t n = std::min(kSymbolChunk, count - first);
    chunk.resize(n);
    if (Status st =
            read_into(t->offset + first * sizeof(Elf64_Sym), chunk.data(), n * sizeof(Elf64_Sym));
        !st.ok()) {
      return st;
    }
    for (uint64_t i = 0; i < n; ++i) {
      auto name = symbol_name(*t, chunk[i].st_name);
      if (!name) return name.status();
      out.push_back(to_symbol(chunk[i], first + i, std::move(name).value()));
    }
  }
  return out;
}

Status ElfFile::verify() const {
  for (const ElfSection& s : sections_) {
    if (s.index == 0 || (s.type != SHT_SYMTAB && s.type != SHT_DYNSYM)) continue;
    auto t = table_of_section(s);
    if (!t) return t.status();
    if (Status st = check_names(*t); !st.ok()) return st;
  }
  auto t = dynamic_table();
  if (!t) return t.status();
  return check_names(*t);
}

}  // namespace kreg
