// The bounds-checked ELF reader (kreg/elf_file.hpp) and the checks built on it
// (check_entry_symbol, PluginLibrary::open before dlopen): a real plugin read through a
// descriptor and from memory, the stripped and section-less forms that must still work,
// and hostile files made here by patching a real plugin's bytes — each must be refused
// with a message naming the problem and the file, never crash, and never make the
// reader allocate more than a few megabytes, whatever sizes the file claims.
#include <elf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <new>
#include <string>

#include "kreg/elf_file.hpp"
#include "kreg/plugin_library.hpp"
#include "test_support.hpp"

// The largest single allocation since the last reset: the reader must never size a
// buffer from what a file claims.
namespace {
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

void* operator new(size_t n) {
  size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n)) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::contains;
using test::read_file;
using test::Scratch;
using test::test_plugin;

constexpr size_t kAllocationBudget = 8 << 20;

// A real plugin's bytes, with helpers to find and patch its structures.
struct Patchable {
  std::string b;

  template <typename T>
  T get(uint64_t off) const {
    T v;
    std::memcpy(&v, b.data() + off, sizeof v);
    return v;
  }
  template <typename T>
  void set(uint64_t off, const T& v) {
    std::memcpy(b.data() + off, &v, sizeof v);
  }
  Elf64_Ehdr eh() const { return get<Elf64_Ehdr>(0); }
  void set_eh(const Elf64_Ehdr& h) { set(0, h); }
  uint64_t sh_at(int i) const { return eh().e_shoff + uint64_t(i) * sizeof(Elf64_Shdr); }
  Elf64_Shdr sh(int i) const { return get<Elf64_Shdr>(sh_at(i)); }
  void set_sh(int i, const Elf64_Shdr& s) { set(sh_at(i), s); }
  uint64_t ph_at(int i) const { return eh().e_phoff + uint64_t(i) * sizeof(Elf64_Phdr); }
  Elf64_Phdr ph(int i) const { return get<Elf64_Phdr>(ph_at(i)); }
  void set_ph(int i, const Elf64_Phdr& p) { set(ph_at(i), p); }

  int section(const std::string& name) const {
    const Elf64_Shdr names = sh(eh().e_shstrndx);
    for (int i = 1; i < eh().e_shnum; ++i) {
      if (std::strcmp(b.data() + names.sh_offset + sh(i).sh_name, name.c_str()) == 0) return i;
    }
    ADD_FAILURE() << "no section " << name;
    return 0;
  }
  // The file offset of symbol `name`'s entry in the symbol table section `table`.
  uint64_t symbol(int table, const std::string& name) const {
    const Elf64_Shdr t = sh(table);
    const Elf64_Shdr str = sh(t.sh_link);
    for (uint64_t at = t.sh_offset; at < t.sh_offset + t.sh_size; at += sizeof(Elf64_Sym)) {
      const auto s = get<Elf64_Sym>(at);
      if (std::strcmp(b.data() + str.sh_offset + s.st_name, name.c_str()) == 0) return at;
    }
    ADD_FAILURE() << "no symbol " << name;
    return 0;
  }
  int segment(uint32_t type) const {
    for (int i = 0; i < eh().e_phnum; ++i) {
      if (ph(i).p_type == type) return i;
    }
    ADD_FAILURE() << "no segment of type " << type;
    return 0;
  }
  // The file offset of the dynamic entry with `tag`, or 0.
  uint64_t dynamic_entry(int64_t tag) const {
    const Elf64_Phdr d = ph(segment(PT_DYNAMIC));
    for (uint64_t at = d.p_offset; at < d.p_offset + d.p_filesz; at += sizeof(Elf64_Dyn)) {
      if (get<Elf64_Dyn>(at).d_tag == tag) return at;
    }
    return 0;
  }
  // No section headers at all: what the loader needs is all in the program headers.
  void drop_sections() {
    Elf64_Ehdr h = eh();
    h.e_shoff = 0;
    h.e_shnum = 0;
    h.e_shstrndx = 0;
    set_eh(h);
  }
};

Patchable testgrp() { return Patchable{read_file(test_plugin("testgrp"))}; }

// ---- a real plugin ----

TEST(ElfReader, ReadsARealPlugin) {
  auto elf = ElfFile::open(test_plugin("testgrp"), "plugin library", 1 << 30);
  ASSERT_TRUE(elf.ok()) << elf.status().message();
#if defined(__x86_64__)
  EXPECT_EQ(elf->machine(), EM_X86_64);
#endif
  EXPECT_EQ(elf->size(), fs::file_size(test_plugin("testgrp")));
  bool load = false, dynamic = false;
  for (const ElfSegment& s : elf->segments()) {
    load |= s.type == PT_LOAD;
    dynamic |= s.type == PT_DYNAMIC;
  }
  EXPECT_TRUE(load && dynamic);
  EXPECT_TRUE(elf->verify().ok()) << elf->verify().message();

  auto entry = elf->find_dynamic_symbol("kreg_plugin_entry");
  ASSERT_TRUE(entry.ok()) << entry.status().message();
  EXPECT_EQ(entry->type, STT_FUNC);
  EXPECT_EQ(entry->binding, STB_GLOBAL);
  EXPECT_EQ(entry->visibility, STV_DEFAULT);
  EXPECT_TRUE(entry->defined());
  auto at = elf->file_offset(entry->value, 1);
  ASSERT_TRUE(at.ok()) << at.status().message();
  auto text = elf->find_section(".text");
  ASSERT_TRUE(text.ok());
  EXPECT_GE(*at, text->offset);
  EXPECT_LT(*at, text->offset + text->size);

  auto missing = elf->find_dynamic_symbol("kreg_plugin_entry_");
  EXPECT_EQ(missing.status().code(), KREG_NOT_FOUND);
  EXPECT_TRUE(contains(missing.status().message(), "no dynamic symbol named 'kreg_plugin_entry_'"));

  auto syms = elf->dynamic_symbols(1000);
  ASSERT_TRUE(syms.ok()) << syms.status().message();
  bool listed = false;
  for (const ElfSymbol& s : *syms) listed |= s.name == "kreg_plugin_entry";
  EXPECT_TRUE(listed);

  auto dynstr = elf->section_bytes(".dynstr", 1 << 20);
  ASSERT_TRUE(dynstr.ok()) << dynstr.status().message();
  EXPECT_TRUE(contains(*dynstr, std::string("kreg_plugin_entry") + '\0'));
  EXPECT_EQ(elf->section_bytes(".dynstr", 4).status().code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_EQ(elf->section_bytes(".no_such_section", 4).status().code(), KREG_NOT_FOUND);
  if (elf->find_section(".bss").ok()) {
    EXPECT_EQ(elf->section_bytes(".bss", 1 << 20).status().code(), KREG_FAILED_PRECONDITION);
  }
  EXPECT_EQ(elf->read(elf->size() - 4, 8, 1 << 20).status().code(), KREG_INVALID_ARGUMENT);
  EXPECT_EQ(elf->read(0, 8, 4).status().code(), KREG_RESOURCE_EXHAUSTED);
}

TEST(ElfReader, MemoryAndDescriptorAgree) {
  const std::string bytes = read_file(test_plugin("testgrp"));
  auto a = ElfFile::from_memory(bytes, "buffer");
  auto b = ElfFile::open(test_plugin("testgrp"), "plugin library", 1 << 30);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->sections().size(), b->sections().size());
  for (size_t i = 0; i < a->sections().size(); ++i) {
    EXPECT_EQ(a->sections()[i].name, b->sections()[i].name);
    EXPECT_EQ(a->sections()[i].offset, b->sections()[i].offset);
  }
  EXPECT_EQ(a->find_dynamic_symbol("kreg_plugin_entry")->value,
            b->find_dynamic_symbol("kreg_plugin_entry")->value);
}

TEST(ElfReader, RefusesAFileLargerThanTheCap) {
  auto elf = ElfFile::open(test_plugin("testgrp"), "plugin library", 1024);
  ASSERT_FALSE(elf.ok());
  EXPECT_EQ(elf.status().code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_TRUE(contains(elf.status().message(), "the limit for a plugin library is 1024 bytes"))
      << elf.status().message();
}

TEST(ElfReader, StrippedPluginExportsTheEntryAndLoads) {
  const fs::path stripped = test_plugin("testgrp_stripped");
  auto elf = ElfFile::open(stripped, "plugin library", 1 << 30);
  ASSERT_TRUE(elf.ok()) << elf.status().message();
  EXPECT_EQ(elf->find_section(".symtab").status().code(), KREG_NOT_FOUND) << "not stripped?";
  EXPECT_TRUE(elf->find_section(".dynsym").ok());
  EXPECT_TRUE(check_entry_symbol(stripped).ok()) << check_entry_symbol(stripped).message();
  auto lib = PluginLibrary::open(stripped, {"testgrp", std::string("0.1.0")});
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  EXPECT_EQ((*lib)->kernels().size(), 2u);
}

TEST(ElfReader, WithoutSectionHeadersTheDynamicSegmentIsRead) {
  Patchable p = testgrp();
  p.drop_sections();
  auto elf = ElfFile::from_memory(p.b, "buffer");
  ASSERT_TRUE(elf.ok()) << elf.status().message();
  EXPECT_TRUE(elf->sections().empty());
  auto entry = elf->find_dynamic_symbol("kreg_plugin_entry");
  ASSERT_TRUE(entry.ok()) << entry.status().message();
  EXPECT_EQ(entry->type, STT_FUNC);
  EXPECT_TRUE(entry->defined());
  EXPECT_TRUE(elf->verify().ok()) << elf->verify().message();

  // The loader needs no section headers, so neither does the check, nor the load.
  Scratch s;
  const fs::path f = s.write("libkreg_nosections.so", p.b, 0755);
  EXPECT_TRUE(check_entry_symbol(f).ok()) << check_entry_symbol(f).message();
  auto lib = PluginLibrary::open(f, {"testgrp", std::nullopt});
  EXPECT_TRUE(lib.ok()) << lib.status().message();
}

// ---- hostile files ----

struct Hostile {
  const char* name;
  std::function<void(Patchable&)> patch;
  std::string expect;
};

void PrintTo(const Hostile& h, std::ostream* os) { *os << h.name; }

class HostileFile : public ::testing::TestWithParam<Hostile> {};

TEST_P(HostileFile, IsRefusedWithAMessageNamingTheProblem) {
  Patchable p = testgrp();
  GetParam().patch(p);
  Scratch s;
  const fs::path f = s.write("libkreg_hostile.so", p.b, 0755);

  g_largest_allocation = 0;
  const Status st = check_entry_symbol(f);
  EXPECT_LT(g_largest_allocation.load(), kAllocationBudget);
  ASSERT_FALSE(st.ok()) << "accepted";
  EXPECT_TRUE(contains(st.message(), f.string())) << st.message();
  EXPECT_TRUE(contains(st.message(), GetParam().expect)) << st.message();

  // open() runs the same checks, before any dlopen.
  g_largest_allocation = 0;
  auto lib = PluginLibrary::open(f, {"testgrp", std::nullopt});
  EXPECT_LT(g_largest_allocation.load(), kAllocationBudget);
  ASSERT_FALSE(lib.ok());
  EXPECT_TRUE(contains(lib.status().message(), GetParam().expect)) << lib.status().message();
}

Elf64_Shdr with_size(Elf64_Shdr s, uint64_t size) {
  s.sh_size = size;
  return s;
}

const uint64_t k6GB = uint64_t{6} << 30;

INSTANTIATE_TEST_SUITE_P(
    Patched, HostileFile,
    ::testing::Values(
        Hostile{"symtab_wild_name",
                [](Patchable& p) {
                  const Elf64_Shdr t = p.sh(p.section(".symtab"));
                  p.set<uint32_t>(t.sh_offset + sizeof(Elf64_Sym), 0x7fffff00u);
                },
                "symbol 1 of section"},
        Hostile{"symtab_wild_name_says_table",
                [](Patchable& p) {
                  const Elf64_Shdr t = p.sh(p.section(".symtab"));
                  p.set<uint32_t>(t.sh_offset + 2 * sizeof(Elf64_Sym), 0x7fffff00u);
                },
                "(SHT_SYMTAB, .symtab) has name offset 2147483392, past the end of its string "
                "table"},
        Hostile{"dynsym_wild_name",
                [](Patchable& p) {
                  p.set<uint32_t>(p.symbol(p.section(".dynsym"), "kreg_plugin_entry"),
                                  0xfffffff0u);
                },
                "(SHT_DYNSYM, .dynsym) has name offset 4294967280"},
        Hostile{"strtab_6gb",
                [](Patchable& p) {
                  const int i = p.section(".strtab");
                  p.set_sh(i, with_size(p.sh(i), k6GB));
                },
                "(SHT_STRTAB, .strtab) claims 6442450944 bytes"},
        Hostile{"dynstr_6gb",
                [](Patchable& p) {
                  const int i = p.section(".dynstr");
                  p.set_sh(i, with_size(p.sh(i), k6GB));
                },
                "(SHT_STRTAB, .dynstr) claims 6442450944 bytes"},
        Hostile{"symtab_size_wraps",
                [](Patchable& p) {
                  const int i = p.section(".symtab");
                  p.set_sh(i, with_size(p.sh(i), ~uint64_t{0} - 8));
                },
                "(SHT_SYMTAB, .symtab) claims"},
        Hostile{"shnum_huge",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_shnum = 0xfeff;
                  p.set_eh(h);
                },
                "is truncated: its section header table (65279 entries"},
        Hostile{"phnum_huge",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_phnum = 0xfeff;
                  p.set_eh(h);
                },
                "is truncated: its program header table (65279 entries"},
        Hostile{"shoff_past_eof",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_shoff = p.b.size() + 4096;
                  p.set_eh(h);
                },
                "is truncated: its section header table"},
        Hostile{"shoff_wraps",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_shoff = ~uint64_t{0} - 100;
                  p.set_eh(h);
                },
                "is truncated: its section header table"},
        Hostile{"extended_shnum_huge",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_shnum = 0;
                  p.set_eh(h);
                  p.set_sh(0, with_size(p.sh(0), uint64_t{1} << 40));
                },
                "is truncated: its section header table (1099511627776 entries"},
        Hostile{"shentsize_wrong",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_shentsize = 40;
                  p.set_eh(h);
                },
                "section header entries are 40 bytes"},
        Hostile{"phentsize_wrong",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_phentsize = 32;
                  p.set_eh(h);
                },
                "program header entries are 32 bytes"},
        Hostile{"sections_overlap",
                [](Patchable& p) {
                  const int a = p.section(".dynsym"), b = p.section(".dynstr");
                  Elf64_Shdr s = p.sh(b);
                  s.sh_offset = p.sh(a).sh_offset + 8;
                  p.set_sh(b, s);
                },
                "overlaps section"},
        Hostile{"section_over_header_table",
                [](Patchable& p) {
                  const int a = p.section(".comment");
                  Elf64_Shdr s = p.sh(a);
                  s.sh_offset = p.eh().e_shoff;
                  s.sh_size = 16;
                  p.set_sh(a, s);
                },
                "the section header table"},
        Hostile{"shstrndx_out_of_range",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_shstrndx = 0xfeff;
                  p.set_eh(h);
                },
                "section-name table index 65279"},
        Hostile{"section_name_wild",
                [](Patchable& p) {
                  Elf64_Shdr s = p.sh(3);
                  s.sh_name = 0x7ffffff0;
                  p.set_sh(3, s);
                },
                "section 3's name offset 2147483632 is past the end of its section-name table"},
        Hostile{"dynsym_entsize",
                [](Patchable& p) {
                  const int i = p.section(".dynsym");
                  Elf64_Shdr s = p.sh(i);
                  s.sh_entsize = 0;
                  p.set_sh(i, s);
                },
                "has entries of 0 bytes"},
        Hostile{"dynsym_link",
                [](Patchable& p) {
                  const int i = p.section(".dynsym");
                  Elf64_Shdr s = p.sh(i);
                  s.sh_link = p.section(".text");
                  p.set_sh(i, s);
                },
                "which is not a string table"},
        Hostile{"dynstr_unterminated",
                [](Patchable& p) {
                  const Elf64_Shdr s = p.sh(p.section(".dynstr"));
                  p.b[s.sh_offset + s.sh_size - 1] = 'x';
                },
                "does not end with a NUL"},
        Hostile{"load_past_eof",
                [](Patchable& p) {
                  const int i = p.segment(PT_LOAD);
                  Elf64_Phdr ph = p.ph(i);
                  ph.p_filesz = ph.p_memsz = p.b.size() * 2;
                  p.set_ph(i, ph);
                },
                "is truncated: its segment"},
        Hostile{"load_offset_wraps",
                [](Patchable& p) {
                  const int i = p.segment(PT_LOAD);
                  Elf64_Phdr ph = p.ph(i);
                  ph.p_offset = ~uint64_t{0} - 10;
                  p.set_ph(i, ph);
                },
                "is truncated: its segment"},
        Hostile{"dt_symtab_elsewhere",
                [](Patchable& p) {
                  const uint64_t sym = p.dynamic_entry(DT_SYMTAB);
                  const uint64_t str = p.dynamic_entry(DT_STRTAB);
                  p.set<uint64_t>(sym + 8, p.get<uint64_t>(str + 8));
                },
                "is not the table its dynamic segment names"},
        Hostile{"dt_syment",
                [](Patchable& p) {
                  uint64_t at = p.dynamic_entry(DT_SYMENT);
                  if (at == 0) at = p.dynamic_entry(DT_STRSZ);
                  p.set<Elf64_Dyn>(at, Elf64_Dyn{DT_SYMENT, {16}});
                },
                "(DT_SYMENT)"},
        Hostile{"no_sections_strsz_huge",
                [](Patchable& p) {
                  p.drop_sections();
                  p.set<uint64_t>(p.dynamic_entry(DT_STRSZ) + 8, uint64_t{1} << 40);
                },
                "dynamic string table (DT_STRTAB, 1099511627776 bytes"},
        Hostile{"no_sections_no_hash",
                [](Patchable& p) {
                  p.drop_sections();
                  for (int64_t tag : {int64_t{DT_GNU_HASH}, int64_t{DT_HASH}}) {
                    if (uint64_t at = p.dynamic_entry(tag)) p.set<int64_t>(at, DT_DEBUG);
                  }
                },
                "has neither DT_GNU_HASH nor DT_HASH"},
        Hostile{"no_sections_gnu_hash_wild",
                [](Patchable& p) {
                  p.drop_sections();
                  const uint64_t at = p.dynamic_entry(DT_GNU_HASH);
                  p.set<uint64_t>((at != 0 ? at : p.dynamic_entry(DT_HASH)) + 8, uint64_t{1} << 50);
                },
                "is not in the file"},
        Hostile{"no_sections_no_dynamic",
                [](Patchable& p) {
                  p.drop_sections();
                  const int i = p.segment(PT_DYNAMIC);
                  Elf64_Phdr ph = p.ph(i);
                  ph.p_type = PT_NULL;
                  p.set_ph(i, ph);
                },
                "has no dynamic symbol table"},
        Hostile{"no_sections_unterminated_dynamic",
                [](Patchable& p) {
                  p.drop_sections();
                  const Elf64_Phdr d = p.ph(p.segment(PT_DYNAMIC));
                  for (uint64_t at = d.p_offset; at < d.p_offset + d.p_filesz; at += 16) {
                    if (p.get<int64_t>(at) == DT_NULL) p.set<int64_t>(at, DT_DEBUG);
                  }
                },
                "has no DT_NULL entry"},
        Hostile{"entry_is_object",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint8_t>(at + 4, ELF64_ST_INFO(STB_GLOBAL, STT_OBJECT));
                },
                "its entry symbol 'kreg_plugin_entry' is STT_OBJECT (a data object), not a "
                "function"},
        Hostile{"entry_is_tls",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint8_t>(at + 4, ELF64_ST_INFO(STB_GLOBAL, STT_TLS));
                },
                "is STT_TLS (a thread-local variable), not a function"},
        Hostile{"entry_is_notype",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint8_t>(at + 4, ELF64_ST_INFO(STB_GLOBAL, STT_NOTYPE));
                },
                "is STT_NOTYPE"},
        Hostile{"entry_is_ifunc",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint8_t>(at + 4, ELF64_ST_INFO(STB_GLOBAL, STT_GNU_IFUNC));
                },
                "is STT_GNU_IFUNC"},
        Hostile{"entry_is_local",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint8_t>(at + 4, ELF64_ST_INFO(STB_LOCAL, STT_FUNC));
                },
                "has binding STB_LOCAL"},
        Hostile{"entry_is_hidden",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint8_t>(at + 5, STV_HIDDEN);
                },
                "has visibility STV_HIDDEN"},
        Hostile{"entry_is_undefined",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint16_t>(at + 6, SHN_UNDEF);
                },
                "(it only references the symbol, which is undefined in this library)"},
        Hostile{"entry_outside_code",
                [](Patchable& p) {
                  const uint64_t at = p.symbol(p.section(".dynsym"), "kreg_plugin_entry");
                  p.set<uint64_t>(at + 8, 0x10);  // inside the ELF header's segment
                },
                "which is in no executable segment"},
        Hostile{"elf32",
                [](Patchable& p) { p.b[EI_CLASS] = ELFCLASS32; },
                "is a 32-bit ELF object"},
        Hostile{"bad_class", [](Patchable& p) { p.b[EI_CLASS] = 7; }, "invalid ELF class 7"},
        Hostile{"big_endian",
                [](Patchable& p) { p.b[EI_DATA] = ELFDATA2MSB; },
                "is a big-endian ELF object; this host is little-endian"},
        Hostile{"bad_encoding", [](Patchable& p) { p.b[EI_DATA] = 0; }, "ELF data encoding 0"},
        Hostile{"bad_version", [](Patchable& p) { p.b[EI_VERSION] = 9; }, "ELF version 9"},
        Hostile{"executable",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_type = ET_EXEC;
                  p.set_eh(h);
                },
                "is an ELF object but not a shared library: it is an executable (ET_EXEC)"},
        Hostile{"relocatable",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_type = ET_REL;
                  p.set_eh(h);
                },
                "relocatable object file (ET_REL"},
        Hostile{"foreign_machine",
                [](Patchable& p) {
                  Elf64_Ehdr h = p.eh();
                  h.e_machine = EM_RISCV;
                  p.set_eh(h);
                },
                "is built for another architecture (ELF machine 243"},
        Hostile{"bad_magic", [](Patchable& p) { p.b[1] = 'X'; }, "(bad magic)"},
        Hostile{"empty", [](Patchable& p) { p.b.clear(); }, "(an empty file)"},
        Hostile{"ten_bytes", [](Patchable& p) { p.b.resize(10); }, "(too short: 10 bytes"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ElfReader, EveryTruncationIsRefused) {
  const std::string full = read_file(test_plugin("testgrp"));
  g_largest_allocation = 0;
  for (size_t n = 0; n < full.size(); ++n) {
    auto elf = ElfFile::from_memory(std::string_view(full).substr(0, n), "buffer");
    if (elf.ok()) {
      // The section headers sit at the end, so only a cut inside them could parse at all.
      ADD_FAILURE() << "a copy cut to " << n << " of " << full.size() << " bytes parsed";
      break;
    }
    ASSERT_FALSE(elf.status().message().empty());
  }
  EXPECT_LT(g_largest_allocation.load(), kAllocationBudget);

  // On disk, through both checks, at a spread of cuts.
  Scratch s;
  for (size_t n : {size_t{0}, size_t{3}, size_t{63}, size_t{64}, size_t{100}, size_t{1000},
                   full.size() / 3, full.size() / 2, full.size() - 64, full.size() - 1}) {
    const fs::path f = s.write("libkreg_cut.so", full.substr(0, n), 0755);
    const Status st = check_entry_symbol(f);
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_TRUE(contains(st.message(), f.string())) << st.message();
    if (n >= 64) {
      EXPECT_TRUE(contains(st.message(), " is truncated")) << n << ": " << st.message();
    }
    auto lib = PluginLibrary::open(f, {"testgrp", std::nullopt});
    ASSERT_FALSE(lib.ok()) << n;
    if (n >= 64) {
      EXPECT_EQ(lib.status().code(), KREG_DATA_LOSS) << lib.status().message();
    }
  }
}

// A single patched byte anywhere in the headers, symbol tables and string tables: whatever
// the reader answers, it answers without crashing or allocating much (the fuzzer goes
// further; this runs everywhere).
TEST(ElfReader, SingleBytePatchesNeverCrash) {
  const Patchable clean = testgrp();
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, sizeof(Elf64_Ehdr) + clean.eh().e_phnum * sizeof(Elf64_Phdr)},
      {clean.eh().e_shoff, clean.b.size()}};
  for (const char* name : {".dynsym", ".dynstr", ".gnu.hash", ".dynamic"}) {
    const Elf64_Shdr s = clean.sh(clean.section(name));
    ranges.emplace_back(s.sh_offset, s.sh_offset + s.sh_size);
  }
  g_largest_allocation = 0;
  size_t accepted = 0, tried = 0;
  for (const auto& [begin, end] : ranges) {
    for (uint64_t at = begin; at < end; ++at) {
      for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}}) {
        Patchable p = clean;
        if (static_cast<uint8_t>(p.b[at]) == v) continue;
        p.b[at] = static_cast<char>(v);
        ++tried;
        auto elf = ElfFile::from_memory(p.b, "buffer");
        if (!elf.ok()) continue;
        const bool ok = elf->verify().ok();
        auto sym = elf->find_dynamic_symbol("kreg_plugin_entry");
        (void)elf->dynamic_symbols(64);
        (void)elf->section_bytes(".nv_fatbin", 1 << 20);
        accepted += ok && sym.ok();
      }
    }
  }
  EXPECT_GT(tried, 1000u);
  EXPECT_LT(accepted, tried);
  EXPECT_LT(g_largest_allocation.load(), kAllocationBudget);
}

// ---- fixtures whose entry symbol is not a function ----

TEST(EntrySymbol, DataObjectOrThreadLocalIsRefusedBeforeItIsCalled) {
  for (const auto& [fixture, kind] :
       {std::pair<const char*, const char*>{"entry_data", "STT_OBJECT (a data object)"},
        {"entry_tls", "STT_TLS (a thread-local variable)"}}) {
    const Status st = check_entry_symbol(test_plugin(fixture));
    ASSERT_FALSE(st.ok()) << fixture;
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(st.message(), test_plugin(fixture).string() +
                                           ": its entry symbol 'kreg_plugin_entry' is " + kind +
                                           ", not a function"))
        << st.message();
    PluginLibrary::Stage stage = PluginLibrary::Stage::kOk;
    auto lib = PluginLibrary::open(test_plugin(fixture), {"testgrp", std::nullopt}, &stage);
    ASSERT_FALSE(lib.ok());
    EXPECT_EQ(stage, PluginLibrary::Stage::kEntry);
    EXPECT_TRUE(contains(lib.status().message(), kind)) << lib.status().message();
  }
  const Status none = check_entry_symbol(test_plugin("no_entry"));
  EXPECT_EQ(none.code(), KREG_NOT_FOUND);
  EXPECT_TRUE(contains(none.message(), "does not export 'kreg_plugin_entry'")) << none.message();
}

}  // namespace
}  // namespace kreg
