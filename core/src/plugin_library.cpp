#include "kreg/plugin_library.hpp"

#include <elf.h>

#include <cstring>

#include <algorithm>
#include <fstream>
#include <system_error>

#include <boost/dll/library_info.hpp>
#include <boost/dll/shared_library.hpp>

namespace kreg {

namespace fs = std::filesystem;

struct PluginLibrary::Impl {
  boost::dll::shared_library lib;
  const kreg_plugin_desc* desc = nullptr;
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
  if (initialized_ && impl_->desc->shutdown != nullptr) impl_->desc->shutdown();
}

namespace {

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

// Reads the ELF headers before dlopen sees the file: dlopen maps a truncated library
// without complaint and the process dies of SIGBUS on first touch, and a foreign
// architecture gets a vaguer message from the loader.
Status check_elf(const fs::path& file) {
  const std::string what = "plugin library " + file.string();
  std::ifstream in(file, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!in.read(reinterpret_cast<char*>(&eh), sizeof eh)) {
    return Status(KREG_INVALID_ARGUMENT, what + " is not an ELF shared object (too short)");
  }
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    return Status(KREG_INVALID_ARGUMENT, what + " is not an ELF shared object (bad magic)");
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return Status(KREG_INVALID_ARGUMENT, what + " is a 32-bit ELF object; this host needs 64-bit");
  }
  if (eh.e_type != ET_DYN) {
    return Status(KREG_INVALID_ARGUMENT, what + " is an ELF object but not a shared library");
  }
  if (kHostMachine != EM_NONE && eh.e_machine != kHostMachine) {
    return Status(KREG_INVALID_ARGUMENT, what + " is built for another architecture (ELF machine " +
                                             std::to_string(eh.e_machine) + ", this host is " +
                                             std::to_string(kHostMachine) + ")");
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  auto truncated = [&](const std::string& part) {
    return Status(KREG_DATA_LOSS, what + " is truncated: its " + part + " ends past the file's " +
                                      std::to_string(size) + " bytes (a build still writing it?)");
  };
  if (eh.e_phoff + uint64_t{eh.e_phnum} * eh.e_phentsize > size)
    return truncated("program headers");
  if (eh.e_shoff + uint64_t{eh.e_shnum} * eh.e_shentsize > size)
    return truncated("section headers");
  in.seekg(static_cast<std::streamoff>(eh.e_phoff));
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) return truncated("program headers");
    if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > size)
      return truncated("segment " + std::to_string(i));
  }
  return OkStatus();
}

}  // namespace

Status check_entry_symbol(const fs::path& file) {
  if (Status st = file_problem(file); !st.ok()) return st;
  if (Status st = check_elf(file); !st.ok()) return st;
  try {
    boost::dll::library_info info(file);
    auto symbols = info.symbols();
    if (std::find(symbols.begin(), symbols.end(), KREG_PLUGIN_ENTRY_SYMBOL) == symbols.end()) {
      return Status(KREG_NOT_FOUND, "plugin library " + file.string() + " does not export '" +
                                        KREG_PLUGIN_ENTRY_SYMBOL + "'");
    }
  } catch (const std::exception& e) {
    return Status(KREG_INVALID_ARGUMENT, "plugin library " + file.string() +
                                             " is not a readable shared object: " + e.what());
  }
  return OkStatus();
}

Result<std::unique_ptr<PluginLibrary>> PluginLibrary::open(const fs::path& file,
                                                           const Expect& expect, Stage* failed_at) {
  Stage scratch;
  Stage& stage = failed_at ? *failed_at : scratch;
  stage = Stage::kFile;
  const std::string where = "plugin '" + expect.group + "' (" + file.string() + ")";
  if (Status st = file_problem(file); !st.ok()) return st;

  stage = Stage::kLoad;
  if (Status st = check_elf(file); !st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  try {
    impl->lib.load(file, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
  } catch (const std::system_error& e) {
    // How Boost.DLL reports dlopen's own errors (missing dependencies, bad objects).
    return Status(KREG_INVALID_ARGUMENT, where + ": cannot load: " + e.what());
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
  if (!impl->lib.has(KREG_PLUGIN_ENTRY_SYMBOL)) {
    return Status(KREG_NOT_FOUND,
                  where + ": does not export the entry symbol '" KREG_PLUGIN_ENTRY_SYMBOL "'");
  }
  auto entry = impl->lib.get<const kreg_plugin_desc*()>(KREG_PLUGIN_ENTRY_SYMBOL);
  const kreg_plugin_desc* d = nullptr;
  try {
    d = entry();
  } catch (...) {
    return Status(KREG_INTERNAL,
                  where + ": " KREG_PLUGIN_ENTRY_SYMBOL " threw a C++ exception across the C ABI");
  }
  if (d == nullptr) return Status(KREG_INVALID_ARGUMENT, where + ": entry returned no descriptor");
  if (d->struct_size < offsetof(kreg_plugin_desc, abi_minor) + sizeof(d->abi_minor)) {
    return Status(KREG_INVALID_ARGUMENT, where + ": descriptor too small (struct_size " +
                                             std::to_string(d->struct_size) + ")");
  }
  stage = Stage::kAbi;
  if (d->abi_major != KREG_ABI_MAJOR) {
    return Status(KREG_FAILED_PRECONDITION,
                  where + ": built for kreg ABI " + std::to_string(d->abi_major) + "." +
                      std::to_string(d->abi_minor) + ", but this core speaks ABI " +
                      std::to_string(KREG_ABI_MAJOR) + "." + std::to_string(KREG_ABI_MINOR) +
                      " (majors must match); rebuild the plugin against this kreg");
  }
  if (!KREG_STRUCT_HAS(d, kreg_plugin_desc, shutdown)) {
    return Status(KREG_INVALID_ARGUMENT, where + ": descriptor struct_size " +
                                             std::to_string(d->struct_size) +
                                             " is smaller than ABI 1.0's");
  }
  if (d->group == nullptr || d->version == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, where + ": descriptor lacks group or version");
  }
  stage = Stage::kGroup;
  if (expect.group != d->group) {
    return Status(KREG_FAILED_PRECONDITION, where + ": the library declares group '" +
                                                std::string(d->group) + "', but the manifest " +
                                                "lists it as group '" + expect.group + "'");
  }
  stage = Stage::kVersion;
  if (expect.version && *expect.version != d->version) {
    return Status(KREG_FAILED_PRECONDITION, where + ": version " + d->version +
                                                " does not match the expected " + *expect.version);
  }

  std::unique_ptr<PluginLibrary> p(new PluginLibrary(std::move(impl)));
  PluginInfo& info = p->info_;
  info.group = d->group;
  info.version = d->version;
  info.abi_major = d->abi_major;
  info.abi_minor = d->abi_minor;
  info.path = file;
  if (d->build != nullptr && KREG_STRUCT_HAS(d->build, kreg_build_info, cuda_archs)) {
    info.compiler = d->build->compiler ? d->build->compiler : "";
    info.cuda_version = d->build->cuda_version;
    info.cuda_archs = d->build->cuda_archs ? d->build->cuda_archs : "";
  }
  stage = Stage::kKernels;
  if (d->num_kernels > 0 && d->kernels == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, where + ": kernel table is null");
  }
  Provenance prov{info.group, info.version, file.string(), ""};
  for (uint32_t i = 0; i < d->num_kernels; ++i) {
    auto spec = make_kernel_spec(d->kernels[i], prov);
    if (!spec) return Status(spec.status().code(), where + ": " + spec.status().message());
    p->kernels_.push_back(std::move(spec).value());
  }
  p->impl_->desc = d;
  stage = Stage::kOk;
  return p;
}

Status PluginLibrary::init() {
  if (initialized_) return OkStatus();
  const kreg_plugin_desc* d = impl_->desc;
  if (d->init != nullptr) {
    char buf[512] = {0};
    kreg_error err{sizeof(kreg_error), buf, sizeof buf};
    int32_t rc = KREG_OK;
    try {
      rc = d->init(&err);
    } catch (...) {
      return Status(KREG_INTERNAL, "plugin '" + info_.group +
                                       "': init hook threw a C++ exception across the C ABI");
    }
    if (rc != KREG_OK) {
      return Status(static_cast<kreg_status_code>(rc),
                    "plugin '" + info_.group + "': init hook failed: " + buf);
    }
  }
  initialized_ = true;
  return OkStatus();
}

}  // namespace kreg
