// A JIT implementation's source (kreg_jit_desc -> JitSource, checked against the op's
// signature) and its specializations: which compile-time values a call or a tool gives.
#include <cstring>

#include "kreg/abi.h"
#include "kreg/jit.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/schema.hpp"
#include "kreg/text.hpp"

namespace kreg {
namespace {

std::string_view bounded(const char* p, size_t cap) {
  return p == nullptr ? std::string_view() : std::string_view(p, ::strnlen(p, cap + 1));
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const size_t at = text.find(sep);
    std::string_view item = text.substr(0, at);
    if (!item.empty()) out.emplace_back(item);
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return out;
}

bool has_control(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

// Where a dimension symbol is read from: the first required tensor that has it alone
// (coefficient 1) as one of its dimensions.
std::optional<std::pair<int, int>> symbol_site(const Signature& sig, std::string_view symbol) {
  int t = 0;
  for (const Param& p : sig.params) {
    if (p.kind != ArgKind::kTensor) continue;
    if (!p.optional) {
      for (size_t k = 0; k < p.dims.size(); ++k) {
        const DimExpr& e = p.dims[k];
        if (e.symbol >= 0 && e.coef == 1 && sig.symbols[static_cast<size_t>(e.symbol)] == symbol) {
          return std::pair{t, static_cast<int>(k)};
        }
      }
    }
    ++t;
  }
  return std::nullopt;
}

// The first tensor that takes the shared dtype.
int shared_dtype_tensor(const Signature& sig) {
  int t = 0;
  for (const Param& p : sig.params) {
    if (p.kind != ArgKind::kTensor) continue;
    if (p.dtypes == 0 && !p.optional) return t;
    ++t;
  }
  return -1;
}

}  // namespace

Result<std::shared_ptr<const JitSource>> read_jit_source(const void* raw, const Signature& sig) {
  const auto* d = static_cast<const kreg_jit_desc*>(raw);
  if (d->struct_size < offsetof(kreg_jit_desc, options) + sizeof(d->options)) {
    return Status(KREG_INVALID_ARGUMENT,
                  "kreg_jit_desc too small (struct_size " + std::to_string(d->struct_size) + ")");
  }
  auto src = std::make_shared<JitSource>();
  auto text = [](const char* p, size_t cap, const char* field, std::string& out) -> Status {
    if (p == nullptr)
      return Status(KREG_INVALID_ARGUMENT, std::string("jit ") + field + " is NULL");
    std::string_view v = bounded(p, cap);
    if (v.size() > cap) {
      return Status(KREG_INVALID_ARGUMENT, std::string("jit ") + field + " is longer than " +
                                               std::to_string(cap) + " bytes");
    }
    out = v;
    return OkStatus();
  };
  constexpr size_t kNameCap = 256;
  if (Status st = text(d->source_name, kNameCap, "source_name", src->source_name); !st.ok())
    return st;
  if (Status st = text(d->source, kMaxJitTextBytes, "source", src->source); !st.ok()) return st;
  std::string kernel, params, options;
  if (Status st = text(d->kernel, 1024, "kernel", kernel); !st.ok()) return st;
  if (Status st = text(d->params, 256, "params", params); !st.ok()) return st;
  if (Status st = text(d->options, 4096, "options", options); !st.ok()) return st;
  for (const auto& [field, v] :
       {std::pair<const char*, const std::string&>{"source_name", src->source_name},
        {"kernel", kernel},
        {"params", params},
        {"options", options}}) {
    if (has_control(v)) {
      return Status(KREG_INVALID_ARGUMENT, std::string("jit ") + field + " \"" + excerpt(v) +
                                               "\" has a control character");
    }
  }
  if (src->source_name.empty() || kernel.empty()) {
    return Status(KREG_INVALID_ARGUMENT, "jit source_name and kernel must not be empty");
  }
  if (d->num_headers > kMaxJitHeaders) {
    return Status(KREG_INVALID_ARGUMENT, "jit source has " + std::to_string(d->num_headers) +
                                             " headers, above the limit of " +
                                             std::to_string(kMaxJitHeaders));
  }
  if (d->num_headers > 0 && d->headers == nullptr) {
    return Status(KREG_INVALID_ARGUMENT,
                  "jit headers is NULL with num_headers " + std::to_string(d->num_headers));
  }
  for (uint32_t i = 0; i < d->num_headers; ++i) {
    std::string name, body;
    if (Status st = text(d->headers[i].name, kNameCap, "header name", name); !st.ok()) return st;
    if (Status st = text(d->headers[i].text, kMaxJitTextBytes, "header text", body); !st.ok()) {
      return Status(st.code(), st.message() + " (" + excerpt(name) + ")");
    }
    if (name.empty() || has_control(name)) {
      return Status(KREG_INVALID_ARGUMENT, "jit header " + std::to_string(i) +
                                               " has a bad name \"" + excerpt(name) + "\"");
    }
    src->headers.emplace_back(std::move(name), std::move(body));
  }
  src->kernel = kernel;
  src->params = split(params, ',');
  src->options = split(options, ' ');
  if (src->params.size() > kMaxJitParams || src->options.size() > kMaxJitOptions) {
    return Status(KREG_INVALID_ARGUMENT, "jit params or options above the limit (" +
                                             std::to_string(kMaxJitParams) + " params, " +
                                             std::to_string(kMaxJitOptions) + " options)");
  }
  for (const std::string& p : src->params) {
    if (p == "dtype") {
      if (shared_dtype_tensor(sig) < 0) {
        return Status(KREG_INVALID_ARGUMENT,
                      "jit param 'dtype': the signature has no tensor of the shared dtype");
      }
    } else if (!symbol_site(sig, p)) {
      return Status(KREG_INVALID_ARGUMENT, "jit param '" + excerpt(p) +
                                               "' is neither 'dtype' nor a dimension of a "
                                               "required tensor of " +
                                               sig.text);
    }
    if (kernel.find("{" + p + "}") == std::string::npos) {
      return Status(KREG_INVALID_ARGUMENT, "jit kernel \"" + excerpt(kernel) +
                                               "\" has no placeholder {" + excerpt(p) + "}");
    }
  }
  for (const std::string& o : src->options) {
    if (o[0] != '-') {
      return Status(KREG_INVALID_ARGUMENT, "jit option \"" + excerpt(o) + "\" is not an option");
    }
  }
  return std::shared_ptr<const JitSource>(std::move(src));
}

namespace jit {

namespace {

// A specialized dimension becomes a template argument of the kernel (an int in kreg's
// kernels): 0 would compile a kernel for empty rows and a value past int32 one NVRTC
// refuses with a template error, so both are refused before any source is generated, on
// the command line (kreg jit build) and in a resolve alike.
constexpr int64_t kMaxSpecializedExtent = 2147483647;

Status check_extent(const KernelSpec& spec, const std::string& p, int64_t v) {
  if (v >= 1 && v <= kMaxSpecializedExtent) return OkStatus();
  return Status(KREG_INVALID_ARGUMENT, spec.op + " (jit): " + p + " = " + std::to_string(v) +
                                           " is out of range for a specialization: it must be "
                                           "1 to 2147483647");
}

}  // namespace

std::string Specialization::text() const {
  std::string s;
  for (const auto& [k, v] : values) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

Result<Specialization> specialize(const KernelSpec& spec, std::span<DLTensor* const> args) {
  if (!spec.jit)
    return Status(KREG_INVALID_ARGUMENT,
                  spec.op + " (" + spec.backend + ") is not a jit implementation");
  Specialization s;
  for (const std::string& p : spec.jit->params) {
    if (p == "dtype") {
      const int t = shared_dtype_tensor(spec.signature);
      if (t < 0 || static_cast<size_t>(t) >= args.size() || args[t] == nullptr) {
        return Status(KREG_INVALID_ARGUMENT,
                      spec.op + ": no tensor gives the dtype to specialize on");
      }
      auto d = from_dl(args[t]->dtype);
      if (!d) return Status(KREG_INVALID_ARGUMENT, spec.op + ": a dtype kreg cannot name");
      s.values.emplace_back(p, std::string(dtype_name(*d)));
      continue;
    }
    auto site = symbol_site(spec.signature, p);
    if (!site || static_cast<size_t>(site->first) >= args.size() || args[site->first] == nullptr ||
        args[site->first]->ndim <= site->second) {
      return Status(KREG_INVALID_ARGUMENT,
                    spec.op + ": no tensor gives " + p + " to specialize on");
    }
    const int64_t extent = args[site->first]->shape[site->second];
    if (Status st = check_extent(spec, p, extent); !st.ok()) return st;
    s.values.emplace_back(p, std::to_string(extent));
  }
  return s;
}

Result<Specialization> specialize(const KernelSpec& spec,
                                  const std::map<std::string, int64_t>& dims,
                                  std::optional<DType> dtype) {
  if (!spec.jit)
    return Status(KREG_INVALID_ARGUMENT,
                  spec.op + " (" + spec.backend + ") is not a jit implementation");
  Specialization s;
  for (const std::string& p : spec.jit->params) {
    if (p == "dtype") {
      if (!dtype)
        return Status(KREG_INVALID_ARGUMENT, spec.op + " specializes on the dtype: give --dtype");
      if (!(spec.dtypes & mask_of(*dtype))) {
        return Status(KREG_INVALID_ARGUMENT, spec.op + " does not take dtype " +
                                                 std::string(dtype_name(*dtype)) + " (" +
                                                 dtype_set_name(spec.dtypes) + ")");
      }
      s.values.emplace_back(p, std::string(dtype_name(*dtype)));
      continue;
    }
    auto it = dims.find(p);
    if (it == dims.end()) {
      return Status(KREG_INVALID_ARGUMENT,
                    spec.op + " specializes on " + p + ": give --shape " + p + "=N");
    }
    if (Status st = check_extent(spec, p, it->second); !st.ok()) return st;
    s.values.emplace_back(p, std::to_string(it->second));
  }
  return s;
}

std::string kernel_expression(const JitSource& src, const Specialization& s) {
  std::string out = src.kernel;
  for (const auto& [k, v] : s.values) {
    const std::string ph = "{" + k + "}";
    for (size_t at = out.find(ph); at != std::string::npos; at = out.find(ph, at + v.size())) {
      out.replace(at, ph.size(), v);
    }
  }
  return out;
}

std::string arch_name(int sm) {
  // The arch-specific ("a") targets: a cubin for the exact device may use their features
  // (wgmma, setmaxnreg on sm_90a).
  const bool specific = sm == 90 || sm == 100 || sm == 101 || sm == 103 || sm == 120 || sm == 121;
  return "sm_" + std::to_string(sm) + (specific ? "a" : "");
}

}  // namespace jit
}  // namespace kreg
