// kreg.torch's schema translation (tools/python/torch_schema.cpp) on whatever
// parse_signature accepts: never a crash or overflow, and the invariants kreg._torch and
// kreg/torch.py rely on hold — parentheses balance outside string literals, the kreg form
// has one argument per parameter, a functional form exists exactly when no reason is
// given, every result and dimension refers to a real parameter, input and axis, and a
// float default reads back as the same double.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/schema.hpp"
#include "torch_schema.hpp"

namespace {

[[noreturn]] void die(const char* what, const std::string& text) {
  std::fprintf(stderr, "torch_schema_fuzz: %s: %s\n", what, text.c_str());
  std::abort();
}

// The top-level arguments of "name(a, b, ...) -> ...", split outside "..." literals (with
// \\ escapes); parentheses must balance and literals must end.
std::vector<std::string> top_level_args(const std::string& s) {
  std::vector<std::string> args;
  std::string cur;
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) < 0x20) die("control character in a schema", s);
    if (depth >= 1 && !(depth == 1 && !in_str && (c == ',' || c == ')'))) cur += c;
    if (in_str) {
      if (c == '\\' && i + 1 < s.size())
        cur += s[++i];
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      if (--depth < 0) die("unbalanced ')'", s);
      if (depth == 0) {
        if (!cur.empty() || !args.empty()) args.push_back(cur);
        return args;
      }
    } else if (c == ',' && depth == 1) {
      args.push_back(cur);
      cur.clear();
    }
  }
  die(in_str ? "unterminated string literal" : "no end of the argument list", s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto sig = kreg::parse_signature(text);
  if (!sig.ok()) return 0;
  auto plan = kreg::python::plan_torch_op("g." + sig->name, *sig);
  if (!plan.ok()) {
    if (plan.status().message().empty()) die("an error without a message", sig->text);
    return 0;
  }
  const auto& p = *plan;
  if (p.ns != "kreg_g" || p.name != sig->name) die("names", p.schema);
  if (p.schema.rfind(sig->name + "(", 0) != 0 || !p.schema.ends_with(") -> ()")) {
    die("kreg form shape", p.schema);
  }
  const std::vector<std::string> args = top_level_args(p.schema);
  if (args.size() != sig->params.size()) die("kreg form argument count", p.schema);
  if (p.functional_schema.empty() == p.reason.empty()) die("functional form xor reason", p.schema);
  if (p.functional_schema.empty()) {
    if (!p.inputs.empty() || !p.results.empty())
      die("leftovers without a functional form", p.schema);
    return 0;
  }
  if (top_level_args(p.functional_schema).size() != p.inputs.size()) {
    die("functional argument count", p.functional_schema);
  }
  for (int pi : p.inputs) {
    if (pi < 0 || pi >= static_cast<int>(sig->params.size()))
      die("input index", p.functional_schema);
  }
  if (p.results.empty()) die("a functional form without results", p.functional_schema);
  for (const auto& r : p.results) {
    if (r.param < 0 || r.param >= static_cast<int>(sig->params.size()) ||
        !sig->params[r.param].written()) {
      die("result parameter", p.functional_schema);
    }
    if (r.clone_of >= 0) {
      if (r.clone_of >= static_cast<int>(p.inputs.size()) || p.inputs[r.clone_of] != r.param) {
        die("clone source", p.functional_schema);
      }
      continue;
    }
    if (r.dims.size() != sig->params[r.param].dims.size()) die("result rank", p.functional_schema);
    for (const auto& d : r.dims) {
      if (d.literal >= 0) continue;
      if (d.input < 0 || d.input >= static_cast<int>(p.inputs.size()))
        die("dim input", p.functional_schema);
      const kreg::Param& in = sig->params[p.inputs[d.input]];
      if (!in.is_tensor() || in.optional || d.axis < 0 ||
          d.axis >= static_cast<int>(in.dims.size())) {
        die("dim axis", p.functional_schema);
      }
      if (d.divisor < 1 || d.coef < 1) die("dim coefficients", p.functional_schema);
    }
    if (r.dtype_input >= static_cast<int>(p.inputs.size())) die("dtype input", p.functional_schema);
  }
  // Float defaults read back exactly (argument i is parameter i).
  for (size_t i = 0; i < sig->params.size(); ++i) {
    const kreg::Param& q = sig->params[i];
    if (q.kind != kreg::ArgKind::kFloat || !q.has_default) continue;
    const size_t eq = args[i].find('=');
    if (eq == std::string::npos) die("float default missing", p.schema);
    const double v = std::strtod(args[i].c_str() + eq + 1, nullptr);
    if (v != q.default_value.value.f) die("float default does not round-trip", p.schema);
  }
  return 0;
}
