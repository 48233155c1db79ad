// parse_signature on arbitrary text, then for whatever parses: the core's limits hold, a
// canonical rendering parses back to the same signature, and the compiled check plan
// takes consistent, perturbed and extreme shapes without crashing, overflowing (UBSan)
// or dividing by zero.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/registry.hpp"
#include "kreg/schema.hpp"

namespace {

int32_t nop_kernel(const kreg_call_frame*, kreg_error*) { return KREG_OK; }

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "signature_fuzz: %s\n", what);
  std::abort();
}

std::string render(const kreg::Signature& sig) {
  std::string s = sig.name + "(";
  for (size_t i = 0; i < sig.params.size(); ++i) {
    const kreg::Param& p = sig.params[i];
    if (i) s += ", ";
    if (p.is_tensor()) {
      s += "Tensor";
      if (p.optional) s += "?";
      if (p.host_ok) s += "@host";
      if (p.dtypes) s += "<" + kreg::dtype_set_name(p.dtypes) + ">";
      if (!p.alias.empty()) s += "(" + p.alias + (p.mutated ? "!" : "") + ")";
      if (p.ranked) s += sig.shape_name(p);
    } else {
      s += std::string(kreg::arg_kind_name(p.kind));
    }
    s += " " + p.name;
    if (p.has_default) {
      s += "=" + (p.kind == kreg::ArgKind::kString ? "\"" + p.default_text + "\"" : p.default_text);
    }
  }
  return s + ") -> ()";
}

bool same(const kreg::Signature& a, const kreg::Signature& b) {
  if (a.name != b.name || a.params.size() != b.params.size() || a.symbols != b.symbols ||
      a.num_tensors != b.num_tensors || a.num_attrs != b.num_attrs) {
    return false;
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    const kreg::Param& p = a.params[i];
    const kreg::Param& q = b.params[i];
    if (p.name != q.name || p.kind != q.kind || p.dtypes != q.dtypes || p.mutated != q.mutated ||
        p.optional != q.optional || p.host_ok != q.host_ok || p.ranked != q.ranked ||
        p.dims.size() != q.dims.size() || p.has_default != q.has_default ||
        p.default_text != q.default_text || p.default_value.type != q.default_value.type ||
        (p.kind != kreg::ArgKind::kString && p.default_value.value.i != q.default_value.value.i)) {
      return false;
    }
    for (size_t k = 0; k < p.dims.size(); ++k) {
      if (p.dims[k].literal != q.dims[k].literal || p.dims[k].coef != q.dims[k].coef ||
          p.dims[k].symbol != q.dims[k].symbol) {
        return false;
      }
    }
  }
  return true;
}

// Tensors shaped from the signature with every symbol = `value` (extents saturate at
// INT64_MAX), dims perturbed by `bump` at one place; never any data behind them.
struct Args {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DLTensor> tensors;
  std::vector<DLTensor*> ptrs;
};

void shape_args(const kreg::Signature& sig, int64_t value, int bump_at, Args* out) {
  out->shapes.clear();
  out->tensors.clear();
  out->ptrs.clear();
  int flat = 0;
  for (const kreg::Param& p : sig.params) {
    if (!p.is_tensor()) continue;
    std::vector<int64_t> shape;
    for (const kreg::DimExpr& d : p.dims) {
      int64_t e = d.literal;
      if (d.symbol >= 0 && __builtin_mul_overflow(int64_t{d.coef}, value, &e)) e = INT64_MAX;
      if (flat++ == bump_at) e = e == INT64_MAX ? -1 : e + 1;
      shape.push_back(e);
    }
    if (!p.ranked) shape = {value, 3};
    out->shapes.push_back(std::move(shape));
  }
  out->tensors.resize(out->shapes.size());
  for (size_t i = 0; i < out->shapes.size(); ++i) {
    DLTensor& t = out->tensors[i];
    t = DLTensor{};
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(out->shapes[i].size());
    t.shape = out->shapes[i].data();
    const kreg::Param& p = sig.tensor(static_cast<int>(i));
    kreg::DType dt = kreg::DType::kF32;
    for (int d = 0; d < static_cast<int>(kreg::DType::kCount) && p.dtypes; ++d) {
      if (p.dtypes & kreg::mask_of(static_cast<kreg::DType>(d))) {
        dt = static_cast<kreg::DType>(d);
        break;
      }
    }
    t.dtype = kreg::to_dl(dt);
    out->ptrs.push_back(&t);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto sig = kreg::parse_signature(text);
  if (!sig) {
    if (sig.status().message().empty()) die("an error without a message");
    if (sig.status().message().size() > 2000) die("an unbounded error message");
    return 0;
  }
  if (sig->num_tensors > kreg::kMaxTensors || sig->num_attrs > kreg::kMaxAttrs ||
      static_cast<int>(sig->symbols.size()) > kreg::kMaxSymbols) {
    die("a signature past the core's limits parsed");
  }
  for (const kreg::Param& p : sig->params) {
    if (static_cast<int>(p.dims.size()) > kreg::kMaxRank) die("a rank past kMaxRank parsed");
    for (const kreg::DimExpr& d : p.dims) {
      if (d.symbol < 0 ? d.literal < 0 : d.coef < 1) die("a bad dimension parsed");
    }
    if (p.kind == kreg::ArgKind::kFloat && p.has_default &&
        !std::isfinite(p.default_value.value.f)) {
      die("a non-finite float default parsed");
    }
  }
  const std::string canonical = render(*sig);
  auto again = kreg::parse_signature(canonical);
  if (!again || !same(*sig, *again)) die("the canonical rendering does not parse back the same");

  // Compile the check plan and call it.
  kreg::KernelSpec spec;
  spec.op = "fz.f";
  spec.backend = "cpu";
  spec.capabilities = {kreg::Capability{kDLCPU, 0, 0}};
  spec.signature = std::move(sig).value();
  spec.dtypes = kreg::mask_of(kreg::DType::kF32);
  spec.fn = &nop_kernel;
  kreg::Registry reg;
  if (!reg.add(spec).ok()) return 0;
  auto h = reg.resolve("fz.f", kreg::Target{DLDevice{kDLCPU, 0}, kreg::DType::kF32});
  if (!h) return 0;
  std::vector<kreg_attr> attrs;
  for (int a = 0; a < spec.signature.num_attrs; ++a) {
    const kreg::Param& p = spec.signature.attr(a);
    kreg_attr v{};
    v.type = p.kind == kreg::ArgKind::kInt     ? KREG_ATTR_INT
             : p.kind == kreg::ArgKind::kFloat ? KREG_ATTR_FLOAT
             : p.kind == kreg::ArgKind::kBool  ? KREG_ATTR_BOOL
                                               : KREG_ATTR_STRING;
    if (v.type == KREG_ATTR_STRING) v.value.s = "s";
    attrs.push_back(v);
  }
  Args args;
  const int64_t values[] = {0, 1, 3, int64_t{1} << 31, int64_t{1} << 40, INT64_MAX / 2, INT64_MAX};
  for (int64_t value : values) {
    for (int bump = -1; bump < 3; ++bump) {
      shape_args(spec.signature, value, bump, &args);
      (void)h->call(args.ptrs, attrs);
      (void)reg.resolve("fz.f", args.ptrs);
    }
  }
  return 0;
}
