// See torch_schema.hpp.
#include "torch_schema.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kreg/text.hpp"

namespace kreg::python {
namespace {

bool is_identifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// An attribute's default as torch's schema parser reads it.
Result<std::string> default_literal(const Param& p) {
  switch (p.kind) {
    case ArgKind::kInt:
      return std::to_string(p.default_value.value.i);
    case ArgKind::kBool:
      return std::string(p.default_value.value.i != 0 ? "True" : "False");
    case ArgKind::kFloat: {
      const double v = p.default_value.value.f;
      if (!std::isfinite(v)) {
        return Status(KREG_INVALID_ARGUMENT, "attribute '" + p.name + "': default " +
                                                 p.default_text +
                                                 " is not finite (torch schemas cannot hold it)");
      }
      // The shortest text that reads back as the same double.
      char buf[64];
      for (int digits = 6; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (std::strtod(buf, nullptr) == v) break;
      }
      std::string s = buf;
      // Round-trip exact, and always a float literal ("1" would read as an int).
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    case ArgKind::kString: {
      std::string s = "\"";
      for (char c : p.default_text) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          return Status(KREG_INVALID_ARGUMENT,
                        "attribute '" + p.name + "': default has a control character");
        }
        if (c == '"' || c == '\\') s += '\\';
        s += c;
      }
      return s + "\"";
    }
    case ArgKind::kTensor:
    case ArgKind::kResource:
      break;
  }
  return Status(KREG_INTERNAL, "parameter '" + p.name + "' of kind " +
                                   std::string(arg_kind_name(p.kind)) + " has a default");
}

// "int eps=1" etc.: one attribute as a torch schema argument. A resource is its registry
// id (Resource::id), a plain int, so that compiled graphs carry it like any other int; the
// kernel maps it back (Registry::find_resource).
Result<std::string> attr_arg(const Param& p) {
  if (p.kind == ArgKind::kResource) return "int " + p.name;
  std::string s = std::string(arg_kind_name(p.kind)) + " " + p.name;
  if (p.has_default) {
    auto lit = default_literal(p);
    if (!lit) return lit.status();
    s += "=" + *lit;
  }
  return s;
}

bool write_only(const Param& p) { return p.written() && !p.read(); }

}  // namespace

std::string torch_namespace(std::string_view group) { return "kreg_" + std::string(group); }

Result<TorchOpPlan> plan_torch_op(std::string_view op_id, const Signature& sig) {
  const size_t dot = op_id.find('.');
  if (dot == std::string_view::npos) {
    return Status(KREG_INVALID_ARGUMENT, "op id '" + excerpt(op_id) + "' has no group");
  }
  const std::string_view group = op_id.substr(0, dot);
  const std::string where = "kreg.torch: " + excerpt(op_id);
  if (!is_identifier(group) || !is_identifier(sig.name)) {
    return Status(KREG_INVALID_ARGUMENT, where + ": the group and op names must be identifiers");
  }
  TorchOpPlan plan;
  plan.op = std::string(op_id);
  plan.ns = torch_namespace(group);
  plan.name = sig.name;
  plan.functional_name = sig.name + "_functional";

  // kreg's own form. Alias sets are numbered here (kreg's letters are free-form).
  std::string args;
  int alias = 0;
  for (const Param& p : sig.params) {
    if (!args.empty()) args += ", ";
    if (p.is_tensor()) {
      args += "Tensor";
      if (p.mutated) {
        if (alias >= 26) return Status(KREG_INVALID_ARGUMENT, where + ": over 26 written tensors");
        args += std::string("(") + static_cast<char>('a' + alias++) + "!)";
      }
      if (p.optional) args += "?";
      args += " " + p.name;
    } else {
      auto a = attr_arg(p);
      if (!a) return Status(a.status().code(), where + ": " + a.status().message());
      args += *a;
    }
  }
  plan.schema = sig.name + "(" + args + ") -> ()";

  // The functional form: which parameters stay, what each written tensor becomes.
  auto no_functional = [&](std::string why) {
    plan.functional_schema.clear();
    plan.inputs.clear();
    plan.results.clear();
    plan.reason = std::move(why);
    return plan;
  };
  std::vector<int> input_of(sig.params.size(), -1);
  for (size_t i = 0; i < sig.params.size(); ++i) {
    if (write_only(sig.params[i])) continue;
    input_of[i] = static_cast<int>(plan.inputs.size());
    plan.inputs.push_back(static_cast<int>(i));
  }
  // Each symbol's first binding by a required, ranked input tensor.
  struct Binding {
    int input = -1, axis = -1;
    int64_t divisor = 1;
  };
  std::vector<Binding> bound(sig.symbols.size());
  int shared_input = -1;
  for (int in = 0; in < static_cast<int>(plan.inputs.size()); ++in) {
    const Param& p = sig.params[plan.inputs[in]];
    if (!p.is_tensor() || p.optional) continue;
    if (p.dtypes == 0 && shared_input < 0) shared_input = in;
    if (!p.ranked) continue;
    for (size_t ax = 0; ax < p.dims.size(); ++ax) {
      const DimExpr& d = p.dims[ax];
      if (d.literal >= 0 || d.symbol < 0) continue;
      Binding& b = bound[d.symbol];
      if (b.input < 0) b = {in, static_cast<int>(ax), d.coef};
    }
  }
  if (plan.inputs.empty() || !sig.params[plan.inputs.front()].is_tensor()) {
    return no_functional("no input tensor decides the device of the results");
  }
  for (size_t i = 0; i < sig.params.size(); ++i) {
    const Param& p = sig.params[i];
    if (!p.written()) continue;
    const std::string name = "'" + p.name + "'";
    if (p.optional) return no_functional("the written tensor " + name + " is optional");
    TorchResult r;
    r.param = static_cast<int>(i);
    if (!write_only(p)) {
      r.clone_of = input_of[i];
      plan.results.push_back(std::move(r));
      continue;
    }
    if (!p.ranked) return no_functional("the output " + name + " has no declared shape");
    for (const DimExpr& d : p.dims) {
      TorchDim td;
      if (d.literal >= 0) {
        td.literal = d.literal;
      } else {
        const Binding& b = bound[d.symbol];
        if (b.input < 0) {
          return no_functional("dimension " + sig.dim_name(d) + " of the output " + name +
                               " is not given by any input");
        }
        td.input = b.input;
        td.axis = b.axis;
        td.divisor = b.divisor;
        td.coef = d.coef;
      }
      r.dims.push_back(td);
    }
    if (p.dtypes == 0) {
      if (shared_input < 0) {
        return no_functional("no input carries the shared dtype of the output " + name);
      }
      r.dtype_input = shared_input;
    } else if (std::popcount(p.dtypes) == 1) {
      r.dtype = static_cast<DType>(std::countr_zero(p.dtypes));
    } else {
      return no_functional("the output " + name + " may have several dtypes (" +
                           dtype_set_name(p.dtypes) + ")");
    }
    plan.results.push_back(std::move(r));
  }
  if (plan.results.empty()) return no_functional("the op writes no tensor");

  std::string fargs;
  for (int pi : plan.inputs) {
    const Param& p = sig.params[pi];
    if (!fargs.empty()) fargs += ", ";
    if (p.is_tensor()) {
      fargs += std::string(p.optional ? "Tensor? " : "Tensor ") + p.name;
    } else {
      fargs += *attr_arg(p);  // checked above
    }
  }
  std::string rets;
  if (plan.results.size() == 1) {
    rets = "Tensor";
  } else {
    rets = "(";
    for (size_t i = 0; i < plan.results.size(); ++i) rets += i == 0 ? "Tensor" : ", Tensor";
    rets += ")";
  }
  plan.functional_schema = plan.functional_name + "(" + fargs + ") -> " + rets;
  return plan;
}

}  // namespace kreg::python
