#include "kreg/kernel_spec.hpp"

#include <cstring>
#include <optional>
#include <tuple>

#include "kreg/backend.hpp"
#include "kreg/text.hpp"

namespace kreg {

namespace {
// Longest accepted value of each string field of a kernel record. A record's strings are
// read at most this far (plus one byte, to tell "too long" from "ends here"), so a string
// without a NUL costs a bounded read; PluginLibrary has checked that a plugin's strings
// end inside its own segments.
constexpr size_t kMaxOpBytes = 128;
constexpr size_t kMaxBackendBytes = 32;
constexpr size_t kMaxDtypesBytes = 256;
constexpr size_t kMaxArgKindsBytes = 64;
constexpr size_t kMaxDescriptionBytes = 4096;
constexpr size_t kMaxSourceFileBytes = 1024;
// The KREG_KERNEL_* flags this core knows (abi.h).
constexpr uint32_t kKnownKernelFlags = KREG_KERNEL_CAPS_FROM_BUILD;

std::string_view bounded(const char* p, size_t cap) {
  return p == nullptr ? std::string_view() : std::string_view(p, ::strnlen(p, cap + 1));
}

// The first control byte (C0 or DEL) in `s`, for fields a person or a tool reads as a name.
std::optional<size_t> control_byte(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return i;
  }
  return std::nullopt;
}

bool is_snake(std::string_view s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}
}  // namespace

bool is_real_sm(int32_t sm) {
  // NVIDIA's compute capabilities, Maxwell to Blackwell (major*10+minor).
  static constexpr int32_t kReal[] = {50, 52, 53, 60, 61,  62,  70,  72,  75,  80,
                                      86, 87, 89, 90, 100, 101, 103, 110, 120, 121};
  for (int32_t r : kReal) {
    if (r == sm) return true;
  }
  return false;
}

bool is_valid_op_id(std::string_view op) {
  size_t dot = op.find('.');
  if (dot == std::string_view::npos) return false;
  return is_snake(op.substr(0, dot)) && is_snake(op.substr(dot + 1));
}

std::string device_type_name(int32_t device_type) {
  switch (device_type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLCUDAManaged:
      return "cuda_managed";
    case kDLROCM:
      return "rocm";
    default:
      return "device" + std::to_string(device_type);
  }
}

std::string Capability::to_string() const {
  std::string s = device_type_name(device_type);
  if (device_type != kDLCPU) {
    s += " sm" + std::to_string(sm_min) + "-sm" + std::to_string(sm_max);
  }
  return s;
}

std::string_view KernelSpec::name() const {
  size_t dot = op.find('.');
  return dot == std::string::npos ? std::string_view(op) : std::string_view(op).substr(dot + 1);
}

std::string KernelSpec::traits_string() const {
  std::string s;
  auto add = [&](const char* t) {
    if (!s.empty()) s += ",";
    s += t;
  };
  if (mutates()) add("mutates");
  if (graph_safe()) add("graph_safe");
  if (deterministic()) add("deterministic");
  return s.empty() ? "-" : s;
}

std::string KernelSpec::source() const {
  std::string lib = provenance.library.empty() ? "<in-process>" : provenance.library;
  return provenance.source_file.empty() ? lib : lib + " (" + provenance.source_file + ")";
}

bool KernelSpec::same_registration(const KernelSpec& o) const {
  if (op != o.op || backend != o.backend || signature.text != o.signature.text ||
      dtypes != o.dtypes || traits != o.traits || priority != o.priority ||
      capabilities.size() != o.capabilities.size()) {
    return false;
  }
  for (size_t i = 0; i < capabilities.size(); ++i) {
    const Capability& a = capabilities[i];
    const Capability& b = o.capabilities[i];
    if (a.device_type != b.device_type || a.sm_min != b.sm_min || a.sm_max != b.sm_max) {
      return false;
    }
  }
  return true;
}

Result<KernelSpec> make_kernel_spec(const kreg_kernel_desc& d, const Provenance& prov) {
  // The frozen ABI 1.0 array. PluginLibrary reads a plugin's capabilities itself (bounded,
  // inside the library) and calls the span form; this one serves callers in the process.
  std::vector<Capability> caps;
  if (d.caps != nullptr) {
    for (uint32_t i = 0; i < d.num_caps; ++i) {
      caps.push_back({d.caps[i].device_type, d.caps[i].sm_min, d.caps[i].sm_max});
    }
  }
  return make_kernel_spec(d, caps, prov);
}

Result<KernelSpec> make_kernel_spec(const kreg_kernel_desc& d, std::span<const Capability> caps,
                                    const Provenance& prov) {
  const std::string_view op_text = bounded(d.op, kMaxOpBytes);
  const std::string_view backend_text = bounded(d.backend, kMaxBackendBytes);
  auto fail = [&](const std::string& what) {
    std::string op = d.op ? excerpt(op_text) : "<null op>";
    std::string backend = d.backend ? excerpt(backend_text, 40) : "?";
    return Status(KREG_INVALID_ARGUMENT, "kernel '" + op + "' (backend " + backend + ", group " +
                                             prov.group + "): " + what);
  };
  if (d.struct_size < offsetof(kreg_kernel_desc, fn) + sizeof(d.fn)) {
    return fail("kernel descriptor too small (struct_size " + std::to_string(d.struct_size) + ")");
  }
  if (d.op == nullptr || d.backend == nullptr || d.signature == nullptr || d.fn == nullptr) {
    std::string missing;
    for (const auto& [name, null] : {std::pair<const char*, bool>{"op", d.op == nullptr},
                                     {"backend", d.backend == nullptr},
                                     {"signature", d.signature == nullptr},
                                     {"fn", d.fn == nullptr}}) {
      if (null) missing += (missing.empty() ? "" : ", ") + std::string(name);
    }
    return fail("op, backend, signature and fn are required (NULL: " + missing + ")");
  }
  const std::string_view sig_text = bounded(d.signature, kMaxSignatureBytes);
  const std::string_view dtypes_text = bounded(d.dtypes, kMaxDtypesBytes);
  const std::string_view kinds_text = bounded(d.arg_kinds, kMaxArgKindsBytes);
  const std::string_view desc_text = bounded(d.description, kMaxDescriptionBytes);
  const std::string_view source_text = bounded(d.source_file, kMaxSourceFileBytes);
  for (const auto& [field, text, cap] :
       {std::tuple<const char*, std::string_view, size_t>{"op", op_text, kMaxOpBytes},
        {"backend", backend_text, kMaxBackendBytes},
        {"signature", sig_text, kMaxSignatureBytes},
        {"dtypes", dtypes_text, kMaxDtypesBytes},
        {"arg_kinds", kinds_text, kMaxArgKindsBytes},
        {"description", desc_text, kMaxDescriptionBytes},
        {"source_file", source_text, kMaxSourceFileBytes}}) {
    if (text.size() > cap) {
      return fail(std::string(field) + " is longer than " + std::to_string(cap) + " bytes");
    }
    // Free text (the description) may hold anything printable; a name may not hold a
    // control character, which would forge or break the lines that show it.
    if (std::string_view(field) == "description") continue;
    if (auto at = control_byte(text)) {
      return fail(std::string(field) + " \"" + excerpt(text) +
                  "\" has a control character at byte " + std::to_string(*at));
    }
  }
  KernelSpec s;
  s.op = op_text;
  s.backend = backend_text;
  if (!is_valid_op_id(s.op)) return fail("op id must be '<group>.<name>' in snake_case");
  if (s.group() != prov.group) {
    return fail("op belongs to group '" + std::string(s.group()) + "', but the plugin is group '" +
                prov.group + "'");
  }
  const KernelBackend* backend = find_backend(s.backend);
  if (backend == nullptr) {
    return fail("unknown backend '" + excerpt(s.backend, 40) + "' (known: cpu, cuda, jit, nccl)");
  }
  if (caps.empty()) return fail("no capabilities");
  for (const Capability& c : caps) {
    if (c.device_type != backend->device_type()) {
      return fail("capability " + c.to_string() + " does not match backend " + s.backend +
                  ", which runs on " + device_type_name(backend->device_type()));
    }
    if (c.device_type != kDLCPU &&
        (c.sm_min > c.sm_max || !is_real_sm(c.sm_min) || !is_real_sm(c.sm_max))) {
      return fail(
          "invalid SM window " + c.to_string() +
          ": bounds must be real compute capabilities (e.g. sm75, sm90, sm121), min <= max");
    }
    s.capabilities.push_back(c);
  }
  auto sig = parse_signature(sig_text);
  if (!sig) return fail(sig.status().message());
  s.signature = std::move(sig).value();
  std::string want = s.signature.arg_kinds();
  std::string have(kinds_text);
  if (want != have) {
    return fail("signature declares argument kinds '" + want + "' but the bound function takes '" +
                excerpt(have) +
                "' (T tensor, O optional tensor as a pointer, i int, f float, b bool, s str)");
  }
  if (s.signature.name != s.name()) {
    return fail("signature names the op '" + s.signature.name + "', expected '" +
                std::string(s.name()) + "'");
  }
  if (s.signature.num_tensors > kMaxTensors || s.signature.num_attrs > kMaxAttrs ||
      static_cast<int>(s.signature.symbols.size()) > kMaxSymbols) {
    return fail("too many tensors, attributes or dimension names for the core's limits");
  }
  bool uses_shared = false;
  for (const Param& p : s.signature.params) {
    if (p.kind == ArgKind::kTensor && static_cast<int>(p.dims.size()) > kMaxRank) {
      return fail("tensor '" + p.name + "' has rank above " + std::to_string(kMaxRank));
    }
    if (p.kind == ArgKind::kTensor && p.dtypes == 0) uses_shared = true;
  }
  std::string bad;
  auto dtypes = parse_dtype_set(dtypes_text, &bad);
  if (!dtypes) return fail("unknown dtype '" + excerpt(bad, 40) + "' in dtypes");
  s.dtypes = *dtypes;
  if (uses_shared && s.dtypes == 0) {
    return fail("tensors without an explicit <dtype> need the implementation's dtypes set");
  }
  s.traits = d.traits;
  s.priority = d.priority;
  // ABI 1.2; a shorter record has no flags. Bits this core does not know are hints from a
  // newer minor and are dropped, so nothing downstream acts on a meaning it never had.
  if (KREG_STRUCT_HAS(&d, kreg_kernel_desc, flags)) s.flags = d.flags & kKnownKernelFlags;
  s.description = desc_text;
  s.provenance = prov;
  s.provenance.source_file = source_text;
  s.fn = d.fn;
  // ABI 1.3: a "jit" implementation carries its source, and only it does.
  // A record without the field (older, or listed from metadata) carries no source.
  const bool has_field = KREG_STRUCT_HAS(&d, kreg_kernel_desc, jit);
  const kreg_jit_desc* jit = has_field ? d.jit : nullptr;
  if (has_field && (s.backend == "jit") != (jit != nullptr)) {
    return fail(jit == nullptr ? "a jit implementation needs its source (kreg_jit_desc)"
                               : "only a jit implementation may carry a kreg_jit_desc");
  }
  if (jit != nullptr) {
    auto src = read_jit_source(jit, s.signature);
    if (!src) return fail(src.status().message());
    s.jit = std::move(src).value();
  }
  return s;
}

}  // namespace kreg
