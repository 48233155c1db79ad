#include "kreg/plugin_library.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <system_error>
#include <tuple>

#include <boost/dll/shared_library.hpp>

#include "dll_error.hpp"
#include "kreg/elf_file.hpp"
#include "kreg/fatbin.hpp"
#include "kreg/jit.hpp"
#include "kreg/text.hpp"

namespace kreg {

namespace fs = std::filesystem;

struct PluginLibrary::Impl {
  boost::dll::shared_library lib;
  // Copied from the descriptor once checked: the plugin's descriptor is not read again.
  int32_t (*init)(kreg_error*) = nullptr;
  void (*shutdown)() = nullptr;
};

std::string PluginInfo::abi_string() const {
  return std::to_string(abi_major) + "." + std::to_string(abi_minor);
}

std::string PluginInfo::cuda_string() const {
  if (cuda_version == 0) return "none";
  return std::to_string(cuda_version / 1000) + "." + std::to_string(cuda_version % 1000 / 10) +
         " (" + cuda_archs + ")";
}

PluginLibrary::PluginLibrary(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PluginLibrary::~PluginLibrary() {
  if (initialized_ && impl_->shutdown != nullptr) impl_->shutdown();
}

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

std::string hex(uintptr_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// The address of a function pointer, without a function-to-object pointer cast.
template <typename F>
uintptr_t address_of(F* f) {
  static_assert(sizeof(F*) == sizeof(uintptr_t));
  uintptr_t a;
  std::memcpy(&a, &f, sizeof a);
  return a;
}

uintptr_t address_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

Status file_problem(const fs::path& file) {
  std::error_code ec;
  auto st = fs::status(file, ec);
  if (ec || !fs::exists(st)) {
    return Status(KREG_NOT_FOUND, "plugin library " + file.string() + " does not exist");
  }
  if (fs::is_directory(st)) {
    return Status(KREG_INVALID_ARGUMENT,
                  "plugin library " + file.string() + " is a directory, not a shared object");
  }
  if (!fs::is_regular_file(st)) {
    return Status(KREG_INVALID_ARGUMENT,
                  "plugin library " + file.string() + " is not a regular file");
  }
  return OkStatus();
}

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#else
constexpr uint16_t kHostMachine = EM_NONE;
#endif

// Reads the file before dlopen sees it, through the bounds-checked reader: dlopen maps a
// truncated library without complaint and the process dies of SIGBUS on first touch, a
// foreign architecture gets a vaguer message from the loader, and a corrupt file must get
// a message rather than whatever the loader or a tool makes of it.
Result<ElfFile> check_elf(const fs::path& file) {
  auto elf = ElfFile::open(file, "plugin library", kMaxPluginLibraryBytes);
  if (!elf) return elf.status();
  if (kHostMachine != EM_NONE && elf->machine() != kHostMachine) {
    return Status(KREG_INVALID_ARGUMENT,
                  elf->what() + " is built for another architecture (ELF machine " +
                      num(elf->machine()) + ", this host is " + num(kHostMachine) + ")");
  }
  if (Status st = elf->verify(); !st.ok()) return st;
  return elf;
}

// The entry symbol as the loader will see it: in the dynamic symbol table, defined here,
// a plain function (the core calls it), exported, and inside an executable segment.
// `missing` is the whole message for a library that does not export it at all.
Status check_entry(const ElfFile& elf, const std::string& missing) {
  auto sym = elf.find_dynamic_symbol(KREG_PLUGIN_ENTRY_SYMBOL);
  if (!sym) {
    return sym.status().code() == KREG_NOT_FOUND ? Status(KREG_NOT_FOUND, missing) : sym.status();
  }
  const std::string head = elf.what() + ": its entry symbol '" KREG_PLUGIN_ENTRY_SYMBOL "'";
  if (!sym->defined()) {
    return Status(KREG_NOT_FOUND, missing +
                                      " (it only references the symbol, which is "
                                      "undefined in this library)");
  }
  if (sym->type != STT_FUNC) {
    // STT_GNU_IFUNC too: dlsym would run its resolver and return whatever that picks,
    // which nothing here could check; KREG_PLUGIN never makes one.
    return Status(KREG_INVALID_ARGUMENT,
                  head + " is " + elf_symbol_type_name(sym->type) +
                      ", not a function (STT_FUNC); the core calls it, so it must be the "
                      "function KREG_PLUGIN defines");
  }
  if (sym->binding != STB_GLOBAL && sym->binding != STB_WEAK) {
    return Status(KREG_INVALID_ARGUMENT, head + " has binding " + elf_binding_name(sym->binding) +
                                             "; it must be STB_GLOBAL or STB_WEAK");
  }
  if (sym->visibility != STV_DEFAULT && sym->visibility != STV_PROTECTED) {
    return Status(KREG_INVALID_ARGUMENT,
                  head + " has visibility " + elf_visibility_name(sym->visibility) +
                      ", so it is not exported; it must be STV_DEFAULT or STV_PROTECTED");
  }
  for (const ElfSegment& s : elf.segments()) {
    if (s.type == PT_LOAD && (s.flags & PF_X) && sym->value >= s.vaddr &&
        sym->value - s.vaddr < s.memsz) {
      return OkStatus();
    }
  }
  return Status(KREG_INVALID_ARGUMENT, head + " is at address " + hex(sym->value) +
                                           ", which is in no executable segment of the library");
}

// Whether `s` may stand where a name is expected: printable ASCII without spaces. Returns
// the first offending byte's index.
std::optional<size_t> bad_identifier_byte(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c <= 0x20 || c >= 0x7f) return i;
  }
  return std::nullopt;
}

// Where the loaded library lies in memory, from the loader's own program headers: every
// pointer the plugin hands over is checked against it before it is read.
class LoadedImage {
 public:
  static Result<LoadedImage> of(void* handle, const std::string& where) {
    LoadedImage image;
    if (::dlinfo(handle, RTLD_DI_LINKMAP, &image.map_) != 0 || image.map_ == nullptr) {
      const char* e = ::dlerror();
      return Status(KREG_INTERNAL, where + ": the loader does not describe the loaded library: " +
                                       (e ? e : "dlinfo(RTLD_DI_LINKMAP) failed"));
    }
    Search search{image.map_, &image.ranges_, false};
    ::dl_iterate_phdr(&LoadedImage::collect, &search);
    if (!search.found || image.ranges_.empty()) {
      return Status(KREG_INTERNAL, where + ": the loaded library's segments cannot be found");
    }
    return image;
  }

  const link_map* map() const { return map_; }

  // The readable segment holding all of [p, p + n), or null.
  const std::pair<uintptr_t, uintptr_t>* readable(uintptr_t p, size_t n) const {
    for (const Range& r : ranges_) {
      if ((r.flags & PF_R) && p >= r.begin && p < r.end && n <= r.end - p) return &r.span;
    }
    return nullptr;
  }
  bool executable(uintptr_t p) const {
    for (const Range& r : ranges_) {
      if ((r.flags & PF_X) && p >= r.begin && p < r.end) return true;
    }
    return false;
  }

  // A NUL-terminated string inside a readable segment, at most `cap` bytes. `field` names
  // it in messages ("the descriptor's group").
  Result<std::string_view> string(const char* p, size_t cap, const std::string& field) const {
    const uintptr_t a = address_of(p);
    const auto* seg = readable(a, 1);
    if (seg == nullptr) {
      return Status(KREG_INVALID_ARGUMENT,
                    field + " points to " + hex(a) + ", outside the library's loaded segments");
    }
    const size_t room = std::min<uintptr_t>(cap + 1, seg->second - a);
    const size_t len = ::strnlen(p, room);
    if (len > cap) {
      return Status(KREG_INVALID_ARGUMENT, field + " is longer than " + num(cap) + " bytes");
    }
    if (len == room) {
      return Status(KREG_INVALID_ARGUMENT,
                    field + " runs to the end of the library's segment without a NUL");
    }
    return std::string_view(p, len);
  }

 private:
  struct Range {
    uintptr_t begin = 0, end = 0;
    uint32_t flags = 0;
    std::pair<uintptr_t, uintptr_t> span;
  };
  struct Search {
    const link_map* map;
    std::vector<Range>* out;
    bool found;
  };
  static int collect(dl_phdr_info* info, size_t, void* data) {
    auto* s = static_cast<Search*>(data);
    if (info->dlpi_addr != s->map->l_addr || info->dlpi_name == nullptr ||
        s->map->l_name == nullptr || std::strcmp(info->dlpi_name, s->map->l_name) != 0) {
      return 0;
    }
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      if (p.p_type != PT_LOAD || p.p_memsz == 0) continue;
      Range r;
      r.begin = info->dlpi_addr + p.p_vaddr;
      r.end = r.begin + p.p_memsz;
      r.flags = p.p_flags;
      r.span = {r.begin, r.end};
      s->out->push_back(r);
    }
    s->found = true;
    return 1;
  }
  link_map* map_ = nullptr;
  std::vector<Range> ranges_;
};

// What dlsym found must be the function the ELF check saw: a function symbol of this very
// library (dlsym on a handle also searches its dependencies).
Status check_resolved_entry(const LoadedImage& image, uintptr_t addr, const std::string& where) {
  const std::string head = where + ": its entry symbol '" KREG_PLUGIN_ENTRY_SYMBOL "'";
  if (!image.executable(addr)) {
    return Status(KREG_INVALID_ARGUMENT,
                  head + " resolves to " + hex(addr) + ", outside this library's code");
  }
  Dl_info info{};
  link_map* owner = nullptr;
  void* p = reinterpret_cast<void*>(addr);
  if (::dladdr1(p, &info, reinterpret_cast<void**>(&owner), RTLD_DL_LINKMAP) == 0 ||
      owner != image.map()) {
    return Status(KREG_INVALID_ARGUMENT, head + " resolves to a symbol of another library (" +
                                             excerpt(info.dli_fname ? info.dli_fname : "?") + ")");
  }
  void* found = nullptr;  // the loader's const ElfW(Sym)*
  const bool have = ::dladdr1(p, &info, &found, RTLD_DL_SYMENT) != 0;
  const auto* sym = static_cast<const ElfW(Sym)*>(found);
  if (!have || sym == nullptr || info.dli_saddr != p || ELF64_ST_TYPE(sym->st_info) != STT_FUNC) {
    return Status(KREG_INVALID_ARGUMENT,
                  head + " does not resolve to a function symbol of the library");
  }
  return OkStatus();
}

// A struct the plugin hands over: aligned, inside a readable segment, and (after its
// struct_size was read) wholly inside it. Returns its struct_size.
Result<size_t> check_struct(const LoadedImage& image, const void* p, size_t align, size_t min_size,
                            const std::string& what) {
  const uintptr_t a = address_of(p);
  if (a % align != 0) {
    return Status(KREG_INVALID_ARGUMENT,
                  what + " at " + hex(a) + " is not aligned to " + num(align) + " bytes");
  }
  if (image.readable(a, sizeof(size_t)) == nullptr) {
    return Status(KREG_INVALID_ARGUMENT,
                  what + " at " + hex(a) + " is outside the library's loaded segments");
  }
  size_t size;
  std::memcpy(&size, p, sizeof size);
  if (size < min_size) {
    return Status(KREG_INVALID_ARGUMENT, what + " too small (struct_size " + num(size) + ")");
  }
  if (size > kMaxPluginStructBytes) {
    return Status(KREG_INVALID_ARGUMENT, what + " has struct_size " + num(size) +
                                             ", above the limit of " + num(kMaxPluginStructBytes) +
                                             " bytes");
  }
  if (image.readable(a, size) == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, what + " (struct_size " + num(size) +
                                             ") extends past the library's data segment");
  }
  return size;
}

// Every pointer of one kernel record, before make_kernel_spec reads through them (the
// capabilities: read_capabilities).
Status check_record(const LoadedImage& image, const kreg_kernel_desc& k, const std::string& rec) {
  const std::pair<const char*, const char*> strings[] = {{"op", k.op},
                                                         {"backend", k.backend},
                                                         {"signature", k.signature},
                                                         {"dtypes", k.dtypes},
                                                         {"arg_kinds", k.arg_kinds},
                                                         {"description", k.description},
                                                         {"source_file", k.source_file}};
  for (const auto& [field, p] : strings) {
    if (p == nullptr) continue;  // make_kernel_spec says which ones are required
    auto s = image.string(p, kMaxPluginStringBytes, rec + ": its " + field);
    if (!s) return s.status();
  }
  if (k.fn != nullptr && !image.executable(address_of(k.fn))) {
    return Status(KREG_INVALID_ARGUMENT, rec + ": its function pointer " + hex(address_of(k.fn)) +
                                             " is outside the library's code");
  }
  // ABI 1.3: a jit record's source, every pointer inside the library before
  // read_jit_source reads through them.
  if (KREG_STRUCT_HAS(&k, kreg_kernel_desc, jit) && k.jit != nullptr) {
    const std::string what = rec + ": its jit source";
    auto size = check_struct(image, k.jit, alignof(kreg_jit_desc),
                             offsetof(kreg_jit_desc, options) + sizeof(k.jit->options), what);
    if (!size) return size.status();
    kreg_jit_desc j{};
    std::memcpy(&j, k.jit, std::min(*size, sizeof j));
    for (const auto& [field, p, cap] :
         {std::tuple<const char*, const char*, size_t>{"source_name", j.source_name, 256},
          {"source", j.source, kMaxJitTextBytes},
          {"kernel", j.kernel, 1024},
          {"params", j.params, 256},
          {"options", j.options, 4096}}) {
      if (p == nullptr) continue;  // read_jit_source says which are required
      auto s = image.string(p, cap, what + " " + field);
      if (!s) return s.status();
    }
    if (j.num_headers > kMaxJitHeaders) {
      return Status(KREG_INVALID_ARGUMENT, what + " has " + num(j.num_headers) +
                                               " headers, above the limit of " +
                                               num(kMaxJitHeaders));
    }
    if (j.num_headers > 0) {
      const uint64_t bytes = uint64_t{j.num_headers} * sizeof(kreg_jit_file);
      if (j.headers == nullptr || image.readable(address_of(j.headers), bytes) == nullptr) {
        return Status(KREG_INVALID_ARGUMENT,
                      what + ": its header table is outside the library's data segment");
      }
      for (uint32_t i = 0; i < j.num_headers; ++i) {
        for (const char* p : {j.headers[i].name, j.headers[i].text}) {
          if (p == nullptr) continue;
          auto s = image.string(p, kMaxJitTextBytes, what + " header " + num(i));
          if (!s) return s.status();
        }
      }
    }
  }
  return OkStatus();
}

// One kernel record's capability windows, read and bounded here so that make_kernel_spec
// gets a checked list. ABI 1.2 records (kreg_capability_record) replace the frozen
// caps/num_caps when the record has them and num_capabilities > 0; the frozen array is
// then never read (a 1.2 plugin fills it only for older cores).
Result<std::vector<Capability>> read_capabilities(const LoadedImage& image,
                                                  const kreg_kernel_desc& k,
                                                  const std::string& rec) {
  std::vector<Capability> out;
  if (KREG_STRUCT_HAS(&k, kreg_kernel_desc, num_capabilities) && k.num_capabilities > 0) {
    const uint32_t n = k.num_capabilities;
    if (n > kMaxPluginCapabilities) {
      return Status(KREG_INVALID_ARGUMENT, rec + ": " + num(n) +
                                               " capability records, above the limit of " +
                                               num(kMaxPluginCapabilities));
    }
    if (k.capabilities == nullptr) {
      return Status(KREG_INVALID_ARGUMENT, rec + ": num_capabilities is " + num(n) +
                                               ", but its capability records are NULL");
    }
    // Walked by the plugin's stride (a newer minor's records are longer), as the kernel
    // table is: the first record's struct_size, the same for every record.
    auto stride = check_struct(image, k.capabilities, alignof(kreg_capability_record),
                               sizeof(kreg_capability_record), rec + ": capability record 0");
    if (!stride) return stride.status();
    if (*stride % alignof(kreg_capability_record) != 0) {
      return Status(KREG_INVALID_ARGUMENT, rec + ": capability record 0 has struct_size " +
                                               num(*stride) + ", not a multiple of " +
                                               num(alignof(kreg_capability_record)));
    }
    const uint64_t bytes = uint64_t{n} * *stride;  // both capped: no overflow
    if (image.readable(address_of(k.capabilities), bytes) == nullptr) {
      return Status(KREG_INVALID_ARGUMENT, rec + ": its " + num(n) + " capability records (" +
                                               num(bytes) +
                                               " bytes) extend past the library's data segment");
    }
    const char* base = reinterpret_cast<const char*>(k.capabilities);
    for (uint32_t i = 0; i < n; ++i) {
      kreg_capability_record c{};
      std::memcpy(&c, base + uint64_t{i} * *stride, std::min(*stride, sizeof c));
      if (c.struct_size != *stride) {
        return Status(KREG_INVALID_ARGUMENT, rec + ": capability record " + num(i) +
                                                 " has struct_size " + num(c.struct_size) +
                                                 ", but record 0 has " + num(*stride) +
                                                 " (one array has one record size)");
      }
      out.push_back({c.device_type, c.sm_min, c.sm_max});
    }
    return out;
  }
  if (k.caps == nullptr || k.num_caps == 0) return out;  // make_kernel_spec: "no capabilities"
  const uintptr_t a = address_of(k.caps);
  if (k.num_caps > kMaxPluginCapabilities) {
    return Status(KREG_INVALID_ARGUMENT, rec + ": " + num(k.num_caps) +
                                             " capabilities, above the limit of " +
                                             num(kMaxPluginCapabilities));
  }
  if (a % alignof(kreg_capability) != 0 ||
      image.readable(a, k.num_caps * sizeof(kreg_capability)) == nullptr) {
    return Status(KREG_INVALID_ARGUMENT,
                  rec + ": its capability array of " + num(k.num_caps) + " entries at " + hex(a) +
                      " is misaligned or extends past the library's data segment");
  }
  for (uint32_t i = 0; i < k.num_caps; ++i) {
    kreg_capability c;
    std::memcpy(&c, k.caps + i, sizeof c);
    out.push_back({c.device_type, c.sm_min, c.sm_max});
  }
  return out;
}

}  // namespace

Status check_entry_symbol(const fs::path& file) {
  if (Status st = file_problem(file); !st.ok()) return st;
  auto elf = check_elf(file);
  if (!elf) return elf.status();
  return check_entry(
      *elf, "plugin library " + file.string() + " does not export '" KREG_PLUGIN_ENTRY_SYMBOL "'");
}

Result<std::unique_ptr<PluginLibrary>> PluginLibrary::open(const fs::path& file,
                                                           const Expect& expect, Stage* failed_at) {
  Stage scratch;
  Stage& stage = failed_at ? *failed_at : scratch;
  stage = Stage::kFile;
  const std::string where = "plugin '" + expect.group + "' (" + file.string() + ")";
  if (Status st = file_problem(file); !st.ok()) return st;

  stage = Stage::kLoad;
  // Kept open past dlopen: the CUDA images are read from it once the kernels are known.
  auto elf = check_elf(file);
  if (!elf) return elf.status();
  if (Status st = check_entry(
          *elf, where + ": does not export the entry symbol '" KREG_PLUGIN_ENTRY_SYMBOL "'");
      !st.ok()) {
    stage = Stage::kEntry;
    return st;
  }
  auto impl = std::make_unique<Impl>();
  try {
    impl->lib.load(file, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
  } catch (const std::system_error& e) {
    // How Boost.DLL reports dlopen's own errors (missing dependencies, bad objects).
    return Status(KREG_INVALID_ARGUMENT, where + ": cannot load: " + detail::dll_error_text(e));
  } catch (const std::exception& e) {
    // Anything else came out of the plugin: a static initializer threw through dlopen. It
    // must not escape into the host (and a host should not load such a library in-process:
    // OpenOptions::precheck_in_child).
    return Status(KREG_INTERNAL,
                  where + ": cannot load: a static initializer threw an exception: " + e.what());
  } catch (...) {
    return Status(KREG_INTERNAL,
                  where + ": cannot load: a static initializer threw a non-standard exception");
  }
  stage = Stage::kEntry;
  auto image = LoadedImage::of(impl->lib.native(), where);
  if (!image) return image.status();
  void* sym = ::dlsym(impl->lib.native(), KREG_PLUGIN_ENTRY_SYMBOL);
  if (sym == nullptr) {
    return Status(KREG_NOT_FOUND,
                  where + ": does not export the entry symbol '" KREG_PLUGIN_ENTRY_SYMBOL "'");
  }
  if (Status st = check_resolved_entry(*image, address_of(sym), where); !st.ok()) return st;
  kreg_plugin_entry_fn entry;
  std::memcpy(&entry, &sym, sizeof entry);
  const kreg_plugin_desc* d = nullptr;
  try {
    d = entry();
  } catch (...) {
    return Status(KREG_INTERNAL,
                  where + ": " KREG_PLUGIN_ENTRY_SYMBOL " threw a C++ exception across the C ABI");
  }
  if (d == nullptr) return Status(KREG_INVALID_ARGUMENT, where + ": entry returned no descriptor");
  auto dsize = check_struct(*image, d, alignof(kreg_plugin_desc),
                            offsetof(kreg_plugin_desc, abi_minor) + sizeof(d->abi_minor),
                            where + ": descriptor");
  if (!dsize) return dsize.status();
  // From here on only this copy is read: the plugin cannot change it under the checks.
  kreg_plugin_desc desc{};
  std::memcpy(&desc, d, std::min(*dsize, sizeof desc));
  stage = Stage::kAbi;
  if (desc.abi_major != KREG_ABI_MAJOR) {
    return Status(KREG_FAILED_PRECONDITION,
                  where + ": built for kreg ABI " + num(desc.abi_major) + "." +
                      num(desc.abi_minor) + ", but this core speaks ABI " + num(KREG_ABI_MAJOR) +
                      "." + num(KREG_ABI_MINOR) +
                      " (majors must match); rebuild the plugin against this kreg");
  }
  if (!KREG_STRUCT_HAS(&desc, kreg_plugin_desc, shutdown)) {
    return Status(KREG_INVALID_ARGUMENT, where + ": descriptor struct_size " +
                                             num(desc.struct_size) + " is smaller than ABI 1.0's");
  }
  stage = Stage::kGroup;
  if (desc.group == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, where + ": the descriptor's group is NULL");
  }
  auto group = image->string(desc.group, kMaxPluginNameBytes, where + ": the descriptor's group");
  if (!group) return group.status();
  if (auto bad = bad_identifier_byte(*group)) {
    return Status(KREG_INVALID_ARGUMENT, where + ": the descriptor's group \"" + excerpt(*group) +
                                             "\" has a space, control or non-ASCII byte at " +
                                             num(*bad));
  }
  if (expect.group != *group) {
    return Status(KREG_FAILED_PRECONDITION, where + ": the library declares group '" +
                                                excerpt(*group) + "', but the manifest " +
                                                "lists it as group '" + expect.group + "'");
  }
  stage = Stage::kVersion;
  if (desc.version == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, where + ": the descriptor's version is NULL");
  }
  auto version =
      image->string(desc.version, kMaxPluginNameBytes, where + ": the descriptor's version");
  if (!version) return version.status();
  if (auto bad = bad_identifier_byte(*version); bad || version->empty()) {
    return Status(KREG_INVALID_ARGUMENT,
                  where + ": the descriptor's version \"" + excerpt(*version) + "\" " +
                      (bad ? "has a space, control or non-ASCII byte at " + num(*bad)
                           : std::string("is empty")));
  }
  if (expect.version && *expect.version != *version) {
    return Status(KREG_FAILED_PRECONDITION, where + ": version " + std::string(*version) +
                                                " does not match the expected " + *expect.version);
  }

  std::unique_ptr<PluginLibrary> p(new PluginLibrary(std::move(impl)));
  PluginInfo& info = p->info_;
  info.group = *group;
  info.version = *version;
  info.abi_major = desc.abi_major;
  info.abi_minor = desc.abi_minor;
  info.path = file;
  if (desc.build != nullptr) {
    auto bsize = check_struct(*image, desc.build, alignof(kreg_build_info), sizeof(size_t),
                              where + ": build info");
    if (!bsize) return bsize.status();
    kreg_build_info build{};
    std::memcpy(&build, desc.build, std::min(*bsize, sizeof build));
    if (KREG_STRUCT_HAS(&build, kreg_build_info, cuda_archs)) {
      if (build.compiler != nullptr) {
        auto s =
            image->string(build.compiler, kMaxPluginNameBytes, where + ": build info compiler");
        if (!s) return s.status();
        info.compiler = *s;
      }
      if (build.cuda_archs != nullptr) {
        auto s =
            image->string(build.cuda_archs, kMaxPluginNameBytes, where + ": build info cuda_archs");
        if (!s) return s.status();
        info.cuda_archs = *s;
      }
      info.cuda_version = build.cuda_version;
    }
  }
  stage = Stage::kKernels;
  const uint32_t n = desc.num_kernels;
  if (n > kMaxPluginKernels) {
    return Status(KREG_INVALID_ARGUMENT, where + ": num_kernels is " + num(n) +
                                             ", above the limit of " + num(kMaxPluginKernels) +
                                             " kernels per plugin");
  }
  if (n > 0 && desc.kernels == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, where + ": kernel table is null");
  }
  if (n > 0) {
    // One array of one record type: its stride is the first record's struct_size (a newer
    // minor's records are longer, an older one's shorter: ABI 1.0 and 1.1 end at `fn`),
    // the same for every record.
    auto stride =
        check_struct(*image, desc.kernels, alignof(kreg_kernel_desc),
                     offsetof(kreg_kernel_desc, capabilities), where + ": kernel record 0");
    if (!stride) return stride.status();
    if (*stride % alignof(kreg_kernel_desc) != 0) {
      return Status(KREG_INVALID_ARGUMENT, where + ": kernel record 0 has struct_size " +
                                               num(*stride) + ", not a multiple of " +
                                               num(alignof(kreg_kernel_desc)));
    }
    const uint64_t bytes = uint64_t{n} * *stride;  // both capped: no overflow
    if (image->readable(address_of(desc.kernels), bytes) == nullptr) {
      return Status(KREG_INVALID_ARGUMENT, where + ": kernel table of " + num(n) + " records (" +
                                               num(bytes) +
                                               " bytes) extends past the library's data segment");
    }
    Provenance prov{info.group, info.version, file.string(), ""};
    const char* base = reinterpret_cast<const char*>(desc.kernels);
    for (uint32_t i = 0; i < n; ++i) {
      // Only the plugin's own bytes: a shorter (older) record leaves the fields it lacks
      // zero, and KREG_STRUCT_HAS on its struct_size says which it has.
      kreg_kernel_desc k{};
      std::memcpy(&k, base + uint64_t{i} * *stride, std::min(*stride, sizeof k));
      const std::string rec = where + ": kernel record " + num(i);
      if (k.struct_size != *stride) {
        return Status(KREG_INVALID_ARGUMENT, rec + " has struct_size " + num(k.struct_size) +
                                                 ", but record 0 has " + num(*stride) +
                                                 " (one table has one record size)");
      }
      if (Status st = check_record(*image, k, rec); !st.ok()) return st;
      auto caps = read_capabilities(*image, k, rec);
      if (!caps) return caps.status();
      auto spec = make_kernel_spec(k, *caps, prov);
      if (!spec) return Status(spec.status().code(), where + ": " + spec.status().message());
      p->kernels_.push_back(std::move(spec).value());
    }
  }
  // ABI 1.4: resource types, read like the kernel table (stride = record 0's size, every
  // pointer inside the library), then every Resource<...> parameter must name one of them.
  if (KREG_STRUCT_HAS(&desc, kreg_plugin_desc, num_resource_types) && desc.num_resource_types > 0) {
    const uint32_t nr = desc.num_resource_types;
    if (nr > kMaxPluginResourceTypes) {
      return Status(KREG_INVALID_ARGUMENT, where + ": num_resource_types is " + num(nr) +
                                               ", above the limit of " +
                                               num(kMaxPluginResourceTypes));
    }
    if (desc.resource_types == nullptr) {
      return Status(KREG_INVALID_ARGUMENT, where + ": resource type table is null");
    }
    auto stride = check_struct(
        *image, desc.resource_types, alignof(kreg_resource_type_desc),
        offsetof(kreg_resource_type_desc, destroy) + sizeof(desc.resource_types->destroy),
        where + ": resource type record 0");
    if (!stride) return stride.status();
    if (*stride % alignof(kreg_resource_type_desc) != 0) {
      return Status(KREG_INVALID_ARGUMENT, where + ": resource type record 0 has struct_size " +
                                               num(*stride) + ", not a multiple of " +
                                               num(alignof(kreg_resource_type_desc)));
    }
    const uint64_t bytes = uint64_t{nr} * *stride;
    if (image->readable(address_of(desc.resource_types), bytes) == nullptr) {
      return Status(KREG_INVALID_ARGUMENT, where + ": resource type table of " + num(nr) +
                                               " records (" + num(bytes) +
                                               " bytes) extends past the library's data segment");
    }
    const char* base = reinterpret_cast<const char*>(desc.resource_types);
    for (uint32_t i = 0; i < nr; ++i) {
      kreg_resource_type_desc r{};
      std::memcpy(&r, base + uint64_t{i} * *stride, std::min(*stride, sizeof r));
      const std::string rec = where + ": resource type record " + num(i);
      if (r.struct_size != *stride) {
        return Status(KREG_INVALID_ARGUMENT, rec + " has struct_size " + num(r.struct_size) +
                                                 ", but record 0 has " + num(*stride));
      }
      for (const auto& [field, p] : {std::pair<const char*, const char*>{"type", r.type},
                                     {"signature", r.signature},
                                     {"description", r.description}}) {
        if (p == nullptr) continue;  // make_resource_type_spec says which are required
        auto str = image->string(p, kMaxPluginStringBytes, rec + ": its " + field);
        if (!str) return str.status();
      }
      for (const auto& [field, addr] :
           {std::pair<const char*, uintptr_t>{"create", address_of(r.create)},
            {"destroy", address_of(r.destroy)}}) {
        if (addr != 0 && !image->executable(addr)) {
          return Status(KREG_INVALID_ARGUMENT, rec + ": its " + field + " function " + hex(addr) +
                                                   " is outside the library's code");
        }
      }
      auto spec = make_resource_type_spec(r, info.group);
      if (!spec) return Status(spec.status().code(), rec + ": " + spec.status().message());
      for (const ResourceTypeSpec& earlier : p->resource_types_) {
        if (earlier.type == spec->type) {
          return Status(KREG_ALREADY_EXISTS,
                        rec + ": resource type " + spec->type + " is declared twice");
        }
      }
      p->resource_types_.push_back(std::move(spec).value());
    }
  }
  for (const KernelSpec& k : p->kernels_) {
    for (const Param& param : k.signature.params) {
      if (param.kind != ArgKind::kResource) continue;
      const bool declared =
          std::any_of(p->resource_types_.begin(), p->resource_types_.end(),
                      [&](const ResourceTypeSpec& r) { return r.type == param.resource_type; });
      if (!declared) {
        return Status(KREG_INVALID_ARGUMENT,
                      where + ": " + k.op + " (" + k.backend + ") takes 'Resource<" +
                          excerpt(param.resource_type) + "> " + param.name +
                          "', a resource type this library does not declare");
      }
    }
  }
  // What a CUDA implementation claims must be in the library's fatbinary (kreg/fatbin.hpp):
  // checked, or narrowed for claims derived from the build, before anything is published.
  const bool any_cuda =
      std::any_of(p->kernels_.begin(), p->kernels_.end(),
                  [](const KernelSpec& k) { return k.backend == "cuda" || k.backend == "nccl"; });
  if (any_cuda) {
    auto images = read_cuda_images(*elf);
    if (!images) return images.status();  // it names the library already
    info.cuda_images = images->summary();
    const std::string library = file.filename().string();
    for (KernelSpec& spec : p->kernels_) {
      if (spec.backend != "cuda" && spec.backend != "nccl") continue;
      if (Status st = check_arch_coverage(spec, *images, library); !st.ok()) {
        return Status(st.code(), where + ": " + st.message());
      }
      spec.provenance.cuda_images = info.cuda_images;
    }
  }
  for (const auto& [hook, addr] : {std::pair<const char*, uintptr_t>{"init", address_of(desc.init)},
                                   {"shutdown", address_of(desc.shutdown)}}) {
    if (addr != 0 && !image->executable(addr)) {
      return Status(KREG_INVALID_ARGUMENT, where + ": its " + hook + " hook " + hex(addr) +
                                               " is outside the library's code");
    }
  }
  p->impl_->init = desc.init;
  p->impl_->shutdown = desc.shutdown;
  stage = Stage::kOk;
  return p;
}

Status PluginLibrary::init() {
  if (initialized_) return OkStatus();
  if (impl_->init != nullptr) {
    char buf[512];
    std::memset(buf, 0, sizeof buf);
    kreg_error err{sizeof(kreg_error), buf, sizeof buf};
    int32_t rc = KREG_OK;
    try {
      rc = impl_->init(&err);
    } catch (...) {
      return Status(KREG_INTERNAL, "plugin '" + info_.group +
                                       "': init hook threw a C++ exception across the C ABI");
    }
    if (rc != KREG_OK) {
      // Read the buffer, never past it: the plugin may have filled it without a NUL (and
      // may have repointed err.message, which is why `buf` is read, not err.message).
      const size_t len = ::strnlen(buf, sizeof buf);
      const bool canonical = rc > KREG_OK && rc <= KREG_UNAUTHENTICATED;
      const std::string code_text =
          canonical ? std::string(status_code_name(rc))
                    : "status " + std::to_string(rc) + ", which is not a canonical (abseil) code";
      std::string msg = "plugin '" + info_.group + "': init hook ";
      if (len == 0) {
        msg += "returned " + code_text + " without a message";
      } else {
        msg += "failed: " + escape_control(std::string_view(buf, len));
        if (!canonical) msg += " (it returned " + code_text + ")";
        if (len == sizeof buf) {
          msg += " [the message fills its " + std::to_string(sizeof buf) +
                 "-byte buffer without a terminating NUL]";
        }
      }
      return Status(canonical ? static_cast<kreg_status_code>(rc) : KREG_UNKNOWN, msg);
    }
  }
  initialized_ = true;
  return OkStatus();
}

}  // namespace kreg
