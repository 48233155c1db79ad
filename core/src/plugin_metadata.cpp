// The embedded metadata reader (kreg/plugin_metadata.hpp). The blob comes from a file
// anybody may have written: every pair is found by a bounded scan, every key is checked
// against the one the format expects at that point, every number goes through the strict
// parser with its field's range, and each kernel through make_kernel_spec, so a record
// read here is held to exactly the rules of a record read from a loaded descriptor.
#include "kreg/plugin_metadata.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "kreg/dtype.hpp"
#include "kreg/parse_number.hpp"
#include "kreg/text.hpp"

namespace kreg {

namespace {

constexpr int64_t kFormatVersion = 1;

// Stands in for the kernel function make_kernel_spec requires; never called (the spec's fn
// is reset to null: metadata describes code that is not loaded).
int32_t not_loaded(const kreg_call_frame*, kreg_error*) { return KREG_UNIMPLEMENTED; }

std::string num(uint64_t v) { return std::to_string(v); }

bool is_key_byte(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

// Every key the format knows, to tell an unknown key from one in the wrong place.
bool is_known_key(std::string_view k) {
  static const std::set<std::string_view> kKeys = {
      "kreg_metadata", "abi",      "group", "version", "compiler",    "cuda_version", "cuda_archs",
      "kernels",       "kernel",   "op",    "backend", "signature",   "dtypes",       "arg_kinds",
      "traits",        "priority", "flags", "caps",    "description", "source",       "end"};
  return kKeys.count(k) != 0;
}

struct Pair {
  std::string_view key;
  std::string_view value;  // followed by the pair's NUL in the blob
  size_t offset = 0;       // of the key
  size_t value_offset = 0;
};

class Reader {
 public:
  Reader(std::string_view blob, const std::string& where) : blob_(blob), where_(where) {}

  Status error(size_t offset, std::string_view key, const std::string& what) const {
    return Status(KREG_INVALID_ARGUMENT,
                  where_ + ": metadata byte " + num(offset) +
                      (key.empty() ? "" : " (key '" + excerpt(key, 40) + "')") + ": " + what);
  }

  // The next pair, which must have key `want`. `scope` holds the keys seen in the current
  // part (the header, or the current kernel) with their offsets, for "repeated" errors.
  Result<Pair> expect(std::string_view want, std::map<std::string, size_t>& scope) {
    auto p = next(want);
    if (!p) return p.status();
    if (p->key != want) {
      if (auto it = scope.find(std::string(p->key)); it != scope.end()) {
        return error(p->offset, p->key,
                     "repeated key (first at byte " + num(it->second) + "); expected '" +
                         std::string(want) + "'");
      }
      if (is_known_key(p->key)) {
        return error(p->offset, p->key,
                     "key out of order: expected '" + std::string(want) + "' here");
      }
      return error(p->offset, p->key, "unknown key; expected '" + std::string(want) + "'");
    }
    scope.emplace(std::string(p->key), p->offset);
    return p;
  }

  // What follows end=: padding NULs only.
  Status rest_is_padding() const {
    for (size_t i = pos_; i < blob_.size(); ++i) {
      if (blob_[i] != '\0') {
        return error(i, "", "bytes after 'end' (only NUL padding may follow it)");
      }
    }
    return OkStatus();
  }

 private:
  Result<Pair> next(std::string_view want) {
    const size_t at = pos_;
    if (at >= blob_.size()) {
      return error(at, want, "the metadata ends here (truncated: " + num(blob_.size()) + " bytes)");
    }
    const size_t nul = blob_.find('\0', at);
    if (nul == std::string_view::npos) {
      return error(at, want,
                   "the pair runs to the end of the metadata without its NUL (truncated)");
    }
    const std::string_view text = blob_.substr(at, nul - at);
    if (text.empty()) {
      return error(at, want, "a NUL where a key was expected (an empty pair)");
    }
    const size_t eq = text.find('=');
    const std::string_view key = text.substr(0, std::min(eq, text.size()));
    for (size_t i = 0; i < key.size(); ++i) {
      if (!is_key_byte(key[i])) {
        return error(at + i, "",
                     "byte " + escape_control(std::string(1, key[i])) +
                         " in a key (keys are [a-z_]+, then '='; expected '" + std::string(want) +
                         "')");
      }
    }
    if (eq == std::string_view::npos) {
      return error(at, key, "no '=' after the key");
    }
    if (key.empty()) return error(at, "", "an empty key");
    pos_ = nul + 1;
    return Pair{key, text.substr(eq + 1), at, at + eq + 1};
  }

  std::string_view blob_;
  const std::string& where_;
  size_t pos_ = 0;
};

// A value's bytes: bounded, and no control byte (a value ends up in listings and
// messages, where an escape sequence could forge lines or recolour the terminal). Free
// text (the description) may hold tabs and newlines.
Status check_text(const Reader& r, const Pair& p, size_t max_bytes, bool free_text = false) {
  if (p.value.size() > max_bytes) {
    return r.error(p.offset, p.key,
                   "value of " + num(p.value.size()) + " bytes; the limit is " + num(max_bytes));
  }
  for (size_t i = 0; i < p.value.size(); ++i) {
    const auto c = static_cast<unsigned char>(p.value[i]);
    if (free_text && (c == '\t' || c == '\n')) continue;
    if (c < 0x20 || c == 0x7f) {
      return r.error(p.value_offset + i, p.key,
                     "control byte " + escape_control(std::string(1, static_cast<char>(c))) +
                         " in the value \"" + excerpt(p.value) + "\"");
    }
  }
  return OkStatus();
}

// A name the loader also requires to be one word of printable ASCII (group, version).
Status check_identifier(const Reader& r, const Pair& p) {
  if (Status st = check_text(r, p, kMaxPluginNameBytes); !st.ok()) return st;
  if (p.value.empty()) return r.error(p.value_offset, p.key, "empty value");
  for (size_t i = 0; i < p.value.size(); ++i) {
    const auto c = static_cast<unsigned char>(p.value[i]);
    if (c == ' ' || c >= 0x80) {
      return r.error(p.value_offset + i, p.key,
                     "a space or non-ASCII byte in \"" + excerpt(p.value) + "\"");
    }
  }
  return OkStatus();
}

Result<int64_t> integer(const Reader& r, const Pair& p, int64_t min, int64_t max) {
  auto v = parse_int(p.value, "the value", min, max);
  if (!v) return r.error(p.value_offset, p.key, v.status().message());
  return v;
}

// "<device_type>:<sm_min>-<sm_max>[,...]"; each number an int32 (which may be negative:
// the '-' between the bounds is the first one after the lower bound's first byte).
Result<std::vector<kreg_capability>> parse_caps(const Reader& r, const Pair& p) {
  std::vector<kreg_capability> caps;
  if (p.value.empty()) return caps;  // make_kernel_spec says "no capabilities"
  constexpr int64_t lo = std::numeric_limits<int32_t>::min();
  constexpr int64_t hi = std::numeric_limits<int32_t>::max();
  size_t start = 0;
  while (true) {
    if (caps.size() == kMaxPluginCapabilities) {
      return r.error(p.value_offset + start, p.key,
                     "more than " + num(kMaxPluginCapabilities) + " capability windows");
    }
    const size_t comma = p.value.find(',', start);
    const size_t stop = comma == std::string_view::npos ? p.value.size() : comma;
    const std::string_view item = p.value.substr(start, stop - start);
    const size_t at = p.value_offset + start;
    const size_t colon = item.find(':');
    const size_t dash = colon == std::string_view::npos || colon + 2 > item.size()
                            ? std::string_view::npos
                            : item.find('-', colon + 2);
    if (colon == std::string_view::npos || dash == std::string_view::npos) {
      return r.error(at, p.key,
                     "capability \"" + excerpt(item) + "\" is not <device_type>:<sm_min>-<sm_max>");
    }
    kreg_capability c{};
    for (const auto& [text, out] :
         {std::pair<std::string_view, int32_t*>{item.substr(0, colon), &c.device_type},
          {item.substr(colon + 1, dash - colon - 1), &c.sm_min},
          {item.substr(dash + 1), &c.sm_max}}) {
      auto v = parse_int(text, "a capability bound", lo, hi);
      if (!v) {
        return r.error(at, p.key, "capability \"" + excerpt(item) + "\": " + v.status().message());
      }
      *out = static_cast<int32_t>(*v);
    }
    caps.push_back(c);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return caps;
}

Result<PluginMetadata> parse(std::string_view blob, const std::string& where) {
  Reader r(blob, where);
  PluginMetadata m;
  std::map<std::string, size_t> scope;
  auto get = [&](std::string_view key) { return r.expect(key, scope); };

  auto fmt = get("kreg_metadata");
  if (!fmt) return fmt.status();
  auto fmt_v = integer(r, *fmt, 0, std::numeric_limits<int64_t>::max());
  if (!fmt_v) return fmt_v.status();
  if (*fmt_v != kFormatVersion) {
    return r.error(
        fmt->value_offset, fmt->key,
        "format " + num(*fmt_v) + " is not one this reader knows (" + num(kFormatVersion) + ")");
  }

  auto abi = get("abi");
  if (!abi) return abi.status();
  {
    const size_t dot = abi->value.find('.');
    if (dot == std::string_view::npos) {
      return r.error(abi->value_offset, abi->key,
                     "\"" + excerpt(abi->value) + "\" is not <major>.<minor>");
    }
    auto major = parse_int(abi->value.substr(0, dot), "the ABI major", 0, 65535);
    auto minor = parse_int(abi->value.substr(dot + 1), "the ABI minor", 0, 65535);
    if (!major || !minor) {
      return r.error(abi->value_offset, abi->key,
                     (!major ? major.status() : minor.status()).message());
    }
    m.info.abi_major = static_cast<uint16_t>(*major);
    m.info.abi_minor = static_cast<uint16_t>(*minor);
  }

  auto group = get("group");
  if (!group) return group.status();
  if (Status st = check_identifier(r, *group); !st.ok()) return st;
  m.info.group = group->value;

  auto version = get("version");
  if (!version) return version.status();
  if (Status st = check_identifier(r, *version); !st.ok()) return st;
  m.info.version = version->value;

  auto compiler = get("compiler");
  if (!compiler) return compiler.status();
  if (Status st = check_text(r, *compiler, kMaxPluginNameBytes); !st.ok()) return st;
  m.info.compiler = compiler->value;

  auto cuda_version = get("cuda_version");
  if (!cuda_version) return cuda_version.status();
  auto cv = integer(r, *cuda_version, std::numeric_limits<int32_t>::min(),
                    std::numeric_limits<int32_t>::max());
  if (!cv) return cv.status();
  m.info.cuda_version = static_cast<int32_t>(*cv);

  auto archs = get("cuda_archs");
  if (!archs) return archs.status();
  if (Status st = check_text(r, *archs, kMaxPluginNameBytes); !st.ok()) return st;
  m.info.cuda_archs = archs->value;

  auto kernels = get("kernels");
  if (!kernels) return kernels.status();
  auto count = integer(r, *kernels, 0, kMaxPluginKernels);
  if (!count) return count.status();

  const Provenance prov{m.info.group, m.info.version, "", ""};
  m.kernels.reserve(static_cast<size_t>(*count));
  for (int64_t i = 0; i < *count; ++i) {
    scope.clear();
    auto index = get("kernel");
    if (!index) return index.status();
    auto iv = integer(r, *index, 0, kMaxPluginKernels);
    if (!iv) return iv.status();
    if (*iv != i) {
      return r.error(index->value_offset, index->key,
                     "kernel " + num(static_cast<uint64_t>(*iv)) + " where kernel " +
                         num(static_cast<uint64_t>(i)) + " was expected");
    }
    // The string fields, in the format's order.
    Pair op, backend, signature, dtypes, arg_kinds;
    for (const auto& [key, out] : {std::pair<const char*, Pair*>{"op", &op},
                                   {"backend", &backend},
                                   {"signature", &signature},
                                   {"dtypes", &dtypes},
                                   {"arg_kinds", &arg_kinds}}) {
      auto p = get(key);
      if (!p) return p.status();
      if (Status st = check_text(r, *p, kMaxPluginStringBytes); !st.ok()) return st;
      *out = *p;
    }
    auto traits = get("traits");
    if (!traits) return traits.status();
    auto tv = integer(r, *traits, 0, std::numeric_limits<uint32_t>::max());
    if (!tv) return tv.status();
    auto priority = get("priority");
    if (!priority) return priority.status();
    auto pv = integer(r, *priority, std::numeric_limits<int32_t>::min(),
                      std::numeric_limits<int32_t>::max());
    if (!pv) return pv.status();
    auto flags = get("flags");
    if (!flags) return flags.status();
    auto fv = integer(r, *flags, 0, std::numeric_limits<uint32_t>::max());
    if (!fv) return fv.status();
    auto caps_pair = get("caps");
    if (!caps_pair) return caps_pair.status();
    auto caps = parse_caps(r, *caps_pair);
    if (!caps) return caps.status();
    auto description = get("description");
    if (!description) return description.status();
    if (Status st = check_text(r, *description, kMaxPluginStringBytes, true); !st.ok()) return st;
    auto source = get("source");
    if (!source) return source.status();
    if (Status st = check_text(r, *source, kMaxPluginStringBytes); !st.ok()) return st;

    // Every value view is followed by its pair's NUL in the blob: a C string as it is.
    kreg_kernel_desc d{};
    // A 1.2-sized record: the metadata lists implementations but does not carry a jit
    // one's source (it is read from the library when the group loads).
    d.struct_size = offsetof(kreg_kernel_desc, jit);
    d.op = op.value.data();
    d.backend = backend.value.data();
    d.caps = caps->empty() ? nullptr : caps->data();
    d.num_caps = static_cast<uint32_t>(caps->size());
    d.traits = static_cast<uint32_t>(*tv);
    d.signature = signature.value.data();
    d.dtypes = dtypes.value.data();
    d.arg_kinds = arg_kinds.value.data();
    d.priority = static_cast<int32_t>(*pv);
    d.description = description->value.data();
    d.source_file = source->value.data();
    d.fn = &not_loaded;
    d.capabilities = nullptr;
    d.num_capabilities = 0;
    d.flags = static_cast<uint32_t>(*fv);
    auto spec = make_kernel_spec(d, prov);
    if (!spec) {
      return r.error(index->offset, "kernel",
                     "kernel " + num(static_cast<uint64_t>(i)) + ": " + spec.status().message());
    }
    spec->fn = nullptr;
    spec->flags = static_cast<uint32_t>(*fv);
    m.kernels.push_back(std::move(spec).value());
  }

  scope.clear();
  auto end = get("end");
  if (!end) return end.status();
  auto ev = integer(r, *end, 0, kMaxPluginKernels);
  if (!ev) return ev.status();
  if (*ev != *count) {
    return r.error(end->value_offset, end->key,
                   "end=" + num(static_cast<uint64_t>(*ev)) + " after " +
                       num(static_cast<uint64_t>(*count)) +
                       " kernels (kernels=" + num(static_cast<uint64_t>(*count)) + ")");
  }
  if (Status st = r.rest_is_padding(); !st.ok()) return st;
  return m;
}

std::string caps_text(const std::vector<Capability>& caps) {
  std::string s;
  for (const Capability& c : caps) s += (s.empty() ? "" : ", ") + c.to_string();
  return s.empty() ? "none" : s;
}

// Whether every window of `narrow` lies inside some window of `wide`.
bool within(const std::vector<Capability>& narrow, const std::vector<Capability>& wide) {
  return std::all_of(narrow.begin(), narrow.end(), [&](const Capability& n) {
    return std::any_of(wide.begin(), wide.end(), [&](const Capability& w) {
      return n.device_type == w.device_type && n.sm_min >= w.sm_min && n.sm_max <= w.sm_max;
    });
  });
}

bool same_caps(const std::vector<Capability>& a, const std::vector<Capability>& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](const Capability& x, const Capability& y) {
           return x.device_type == y.device_type && x.sm_min == y.sm_min && x.sm_max == y.sm_max;
         });
}

std::string in_quotes(std::string_view s) { return "\"" + excerpt(s) + "\""; }

void compare_kernel(const KernelSpec& e, const KernelSpec& l, std::vector<std::string>& out) {
  const std::string id = e.op + " (" + e.backend + ")";
  auto differ = [&](const char* field, const std::string& embedded, const std::string& loaded) {
    if (embedded != loaded) {
      out.push_back(id + ": " + field + " differs: metadata " + embedded + ", library " + loaded);
    }
  };
  differ("signature", in_quotes(e.signature.text), in_quotes(l.signature.text));
  differ("dtypes", in_quotes(dtype_set_name(e.dtypes)), in_quotes(dtype_set_name(l.dtypes)));
  differ("arg kinds", in_quotes(e.signature.arg_kinds()), in_quotes(l.signature.arg_kinds()));
  differ("traits", num(e.traits) + " (" + e.traits_string() + ")",
         num(l.traits) + " (" + l.traits_string() + ")");
  differ("priority", std::to_string(e.priority), std::to_string(l.priority));
  differ("flags", num(e.flags), num(l.flags));
  // A claim derived from the build may have been narrowed to the library's images by the
  // time the library's records are read; a narrowing is not a disagreement.
  const bool narrowed = (e.flags & KREG_KERNEL_CAPS_FROM_BUILD) != 0 &&
                        within(l.capabilities, e.capabilities) && !l.capabilities.empty();
  if (!same_caps(e.capabilities, l.capabilities) && !narrowed) {
    out.push_back(id + ": capabilities differ: metadata " + caps_text(e.capabilities) +
                  ", library " + caps_text(l.capabilities));
  }
  differ("description", in_quotes(e.description), in_quotes(l.description));
  differ("source", in_quotes(e.provenance.source_file), in_quotes(l.provenance.source_file));
}

}  // namespace

Result<PluginMetadata> parse_plugin_metadata(std::string_view blob, const std::string& where) {
  if (blob.size() > kMaxMetadataBytes) {
    return Status(KREG_RESOURCE_EXHAUSTED, where + ": metadata of " + num(blob.size()) +
                                               " bytes; the limit is " + num(kMaxMetadataBytes));
  }
  return parse(blob, where);
}

Result<PluginMetadata> read_plugin_metadata(const ElfFile& elf, const std::filesystem::path& path) {
  auto bytes = elf.section_bytes(KREG_METADATA_SECTION, kMaxMetadataBytes);
  if (!bytes) {
    if (bytes.status().code() == KREG_NOT_FOUND) {
      return Status(KREG_NOT_FOUND, elf.what() + " has no " KREG_METADATA_SECTION
                                                 " section (built before SDK 1.2, or without "
                                                 "KREG_GROUP / KREG_PLUGIN)");
    }
    return bytes.status();
  }
  auto m = parse_plugin_metadata(*bytes, elf.what() + " section " KREG_METADATA_SECTION);
  if (!m) return m.status();
  m->info.path = path;
  for (KernelSpec& k : m->kernels) k.provenance.library = path.string();
  return m;
}

Result<PluginMetadata> read_plugin_metadata(const std::filesystem::path& file) {
  // Headers, the section table and its names, then the one section: no symbol tables
  // (verify()), nothing else of the file.
  auto elf = ElfFile::open(file, "plugin library", kMaxPluginLibraryBytes);
  if (!elf) return elf.status();
  return read_plugin_metadata(*elf, file);
}

std::vector<std::string> compare_metadata(const PluginMetadata& embedded,
                                          const PluginInfo& loaded_info,
                                          const std::vector<KernelSpec>& loaded_kernels) {
  std::vector<std::string> out;
  const PluginInfo& e = embedded.info;
  const PluginInfo& l = loaded_info;
  auto differ = [&](const char* field, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(std::string(field) + " differs: metadata " + a + ", library " + b);
  };
  differ("group", in_quotes(e.group), in_quotes(l.group));
  differ("version", in_quotes(e.version), in_quotes(l.version));
  differ("ABI", e.abi_string(), l.abi_string());
  differ("compiler", in_quotes(e.compiler), in_quotes(l.compiler));
  differ("CUDA version", std::to_string(e.cuda_version), std::to_string(l.cuda_version));
  differ("CUDA architectures", in_quotes(e.cuda_archs), in_quotes(l.cuda_archs));

  using Key = std::pair<std::string, std::string>;
  std::map<Key, std::vector<const KernelSpec*>> mine, theirs;
  std::vector<Key> order;  // the metadata's order, then the library's extra kernels
  for (const KernelSpec& k : embedded.kernels) {
    auto& v = mine[{k.op, k.backend}];
    if (v.empty()) order.push_back({k.op, k.backend});
    v.push_back(&k);
  }
  for (const KernelSpec& k : loaded_kernels) {
    auto& v = theirs[{k.op, k.backend}];
    if (v.empty() && !mine.count({k.op, k.backend})) order.push_back({k.op, k.backend});
    v.push_back(&k);
  }
  for (const Key& key : order) {
    const auto& a = mine[key];
    const auto& b = theirs[key];
    const std::string id = key.first + " (" + key.second + ")";
    if (b.empty()) {
      out.push_back(id + ": in the metadata but not registered by the library");
      continue;
    }
    if (a.empty()) {
      out.push_back(id + ": registered by the library but not in the metadata");
      continue;
    }
    if (a.size() != b.size()) {
      out.push_back(id + ": " + num(a.size()) + " records in the metadata, " + num(b.size()) +
                    " in the library");
    }
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) compare_kernel(*a[i], *b[i], out);
  }
  return out;
}

}  // namespace kreg
