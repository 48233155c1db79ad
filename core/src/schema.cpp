#include "kreg/schema.hpp"

#include <cctype>

#include "kreg/parse_number.hpp"
#include "kreg/text.hpp"

namespace kreg {

std::string_view arg_kind_name(ArgKind k) {
  switch (k) {
    case ArgKind::kTensor:
      return "Tensor";
    case ArgKind::kInt:
      return "int";
    case ArgKind::kFloat:
      return "float";
    case ArgKind::kBool:
      return "bool";
    case ArgKind::kString:
      return "str";
    case ArgKind::kResource:
      return "Resource";
  }
  return "?";
}

char arg_kind_code(ArgKind k) {
  switch (k) {
    case ArgKind::kTensor:
      return 'T';
    case ArgKind::kInt:
      return 'i';
    case ArgKind::kFloat:
      return 'f';
    case ArgKind::kBool:
      return 'b';
    case ArgKind::kString:
      return 's';
    case ArgKind::kResource:
      return 'r';
  }
  return '?';
}

std::string Signature::arg_kinds() const {
  std::string s;
  for (const Param& p : params) s += p.optional ? 'O' : arg_kind_code(p.kind);
  return s;
}

const Param* Signature::find(std::string_view n) const {
  for (const Param& p : params) {
    if (p.name == n) return &p;
  }
  return nullptr;
}

const Param& Signature::tensor(int n) const {
  for (const Param& p : params) {
    if (p.kind == ArgKind::kTensor && n-- == 0) return p;
  }
  return params.front();
}

const Param& Signature::attr(int n) const {
  for (const Param& p : params) {
    if (p.kind != ArgKind::kTensor && n-- == 0) return p;
  }
  return params.front();
}

std::string Signature::dim_name(const DimExpr& d) const {
  if (d.symbol < 0) return std::to_string(d.literal);
  std::string s = d.coef != 1 ? std::to_string(d.coef) + "*" : "";
  return s + symbols[static_cast<size_t>(d.symbol)];
}

std::string Signature::shape_name(const Param& p) const {
  if (!p.ranked) return "[*]";
  std::string s = "[";
  for (size_t i = 0; i < p.dims.size(); ++i) {
    if (i) s += ",";
    s += dim_name(p.dims[i]);
  }
  return s + "]";
}

namespace {

class SchemaParser {
 public:
  explicit SchemaParser(std::string_view text) : t_(text) {}

  Result<Signature> parse() {
    Signature sig;
    if (t_.size() > kMaxSignatureBytes) {
      return fail("longer than " + std::to_string(kMaxSignatureBytes) + " bytes (" +
                  std::to_string(t_.size()) + ")");
    }
    sig.text = std::string(t_);
    if (!ident(&sig.name)) return error("an op name");
    if (!expect('(')) return error("'(' after the op name");
    skip_ws();
    std::vector<bool> bound;  // per symbol: used by a required tensor
    if (!peek(')')) {
      do {
        Param p;
        Status st = param(sig, &p);
        if (!st.ok()) return st;
        for (const Param& q : sig.params) {
          if (q.name == p.name) return fail("duplicate parameter name '" + p.name + "'");
        }
        if (p.kind == ArgKind::kTensor) {
          if (sig.num_tensors == kMaxTensors) {
            return fail("more than " + std::to_string(kMaxTensors) + " tensors (the core's limit)");
          }
          if (!p.optional) {
            bound.resize(sig.symbols.size());
            for (const DimExpr& d : p.dims) {
              if (d.symbol >= 0) bound[static_cast<size_t>(d.symbol)] = true;
            }
          }
          ++sig.num_tensors;
        } else {
          if (sig.num_attrs == kMaxAttrs) {
            return fail("more than " + std::to_string(kMaxAttrs) +
                        " attributes (the core's limit)");
          }
          ++sig.num_attrs;
        }
        sig.params.push_back(std::move(p));
      } while (accept(','));
    }
    if (!expect(')')) return error("',' or ')'");
    for (const Param& q : sig.params) {
      if (!q.optional) continue;
      for (const DimExpr& d : q.dims) {
        const auto s = static_cast<size_t>(d.symbol);
        if (d.symbol >= 0 && (s >= bound.size() || !bound[s])) {
          return fail("dimension '" + sig.symbols[static_cast<size_t>(d.symbol)] +
                      "' of optional tensor '" + q.name + "' is not used by any required tensor");
        }
      }
    }
    if (!expect('-') || !expect('>')) return error("'->' after the parameter list");
    if (!expect('(') || !expect(')')) {
      return error("'()' as the return (outputs are passed as Tensor(a!) parameters)");
    }
    skip_ws();
    if (pos_ != t_.size()) return error("the end of the signature");
    return sig;
  }

 private:
  Status param(Signature& sig, Param* p) {
    std::string type;
    if (!ident(&type)) return error("a parameter type (Tensor, int, float, bool, str, Resource)");
    if (type == "Tensor") {
      p->kind = ArgKind::kTensor;
      p->optional = accept('?');
      if (p->optional && sig.num_tensors == 0) {
        return fail("the first tensor cannot be optional (it decides the call's device)");
      }
      if (accept('@')) {
        std::string where;
        if (!ident(&where) || where != "host") return error("'host' after '@'");
        if (sig.num_tensors == 0) {
          return fail("the first tensor cannot be Tensor@host (it decides the call's device)");
        }
        p->host_ok = true;
      }
      if (accept('<')) {
        do {
          std::string dt;
          if (!ident(&dt)) return error("a dtype name");
          auto d = parse_dtype(dt);
          if (!d) return fail("unknown dtype '" + dt + "'");
          p->dtypes |= mask_of(*d);
        } while (accept('|'));
        if (!expect('>')) return error("'|' or '>'");
      }
      if (accept('(')) {
        if (!ident(&p->alias)) return error("an alias name as in Tensor(a!)");
        p->mutated = accept('!');
        if (!expect(')')) return error("')' after the alias");
      }
      if (accept('[')) {
        p->ranked = true;
        do {
          if (p->dims.size() == static_cast<size_t>(kMaxRank)) {
            return fail("more than " + std::to_string(kMaxRank) +
                        " dimensions in one tensor (the core's limit)");
          }
          DimExpr d;
          Status st = dim(sig, &d);
          if (!st.ok()) return st;
          p->dims.push_back(d);
        } while (accept(','));
        if (!expect(']')) return error("',' or ']'");
      }
      if (!ident(&p->name)) return error("a parameter name");
      return OkStatus();
    }
    if (type == "int") {
      p->kind = ArgKind::kInt;
    } else if (type == "float") {
      p->kind = ArgKind::kFloat;
    } else if (type == "bool") {
      p->kind = ArgKind::kBool;
    } else if (type == "str") {
      p->kind = ArgKind::kString;
    } else if (type == "Resource") {
      // Resource<group.name>: a registry-created resource of that type (ABI 1.4). No
      // default: a resource is always passed.
      p->kind = ArgKind::kResource;
      if (!expect('<')) return error("'<' and a resource type after Resource");
      std::string group, name;
      if (!ident(&group) || !accept('.') || !ident(&name)) {
        return error("a resource type <group>.<name>");
      }
      if (!expect('>')) return error("'>' after the resource type");
      p->resource_type = group + "." + name;
      if (!ident(&p->name)) return error("a parameter name");
      if (accept('=')) return fail("resource '" + p->name + "' cannot have a default");
      return OkStatus();
    } else {
      return fail("unknown parameter type '" + type +
                  "' (expected Tensor, int, float, bool, str, Resource<group.name>)");
    }
    if (!ident(&p->name)) return error("a parameter name");
    if (accept('=')) return literal(p);
    return OkStatus();
  }

  Status dim(Signature& sig, DimExpr* d) {
    skip_ws();
    if (pos_ < t_.size() && t_[pos_] == '-') return fail("a dimension cannot be negative");
    const size_t start = pos_;
    std::string_view digits = number();
    if (!digits.empty() && !accept('*')) {
      auto n = parse_int(digits, "dimension", 0);
      if (!n) return fail_at(start, n.status().message());
      d->literal = *n;
      return OkStatus();
    }
    if (!digits.empty()) {
      auto n = parse_int(digits, "dimension coefficient", 1, INT32_MAX);
      if (!n) return fail_at(start, n.status().message());
      d->coef = static_cast<int32_t>(*n);
    }
    std::string name;
    if (!ident(&name)) return error("a dimension (a number, a name or N*name)");
    int idx = -1;
    for (size_t i = 0; i < sig.symbols.size(); ++i) {
      if (sig.symbols[i] == name) idx = static_cast<int>(i);
    }
    if (idx < 0) {
      if (sig.symbols.size() == static_cast<size_t>(kMaxSymbols)) {
        return fail("more than " + std::to_string(kMaxSymbols) +
                    " dimension names (the core's limit)");
      }
      idx = static_cast<int>(sig.symbols.size());
      sig.symbols.push_back(name);
    }
    d->symbol = idx;
    return OkStatus();
  }

  Status literal(Param* p) {
    skip_ws();
    size_t start = pos_;
    p->has_default = true;
    p->default_value.type = static_cast<int32_t>(p->kind == ArgKind::kInt     ? KREG_ATTR_INT
                                                 : p->kind == ArgKind::kFloat ? KREG_ATTR_FLOAT
                                                 : p->kind == ArgKind::kBool  ? KREG_ATTR_BOOL
                                                                              : KREG_ATTR_STRING);
    if (p->kind == ArgKind::kString) {
      if (!accept('"')) return error("a quoted string default");
      size_t end = t_.find('"', pos_);
      if (end == std::string_view::npos) return fail("unterminated string default");
      p->default_text = std::string(t_.substr(pos_, end - pos_));
      // The kernel gets a C string: a NUL would silently cut the default short.
      if (p->default_text.find('\0') != std::string::npos) {
        return fail("string default of '" + p->name + "' contains a NUL byte");
      }
      pos_ = end + 1;
      return OkStatus();
    }
    while (pos_ < t_.size() && t_[pos_] != ',' && t_[pos_] != ')' &&
           !std::isspace(static_cast<unsigned char>(t_[pos_]))) {
      ++pos_;
    }
    p->default_text = std::string(t_.substr(start, pos_ - start));
    const std::string& s = p->default_text;
    if (p->kind == ArgKind::kBool) {
      if (s == "true" || s == "True") {
        p->default_value.value.i = 1;
      } else if (s == "false" || s == "False") {
        p->default_value.value.i = 0;
      } else {
        return fail_at(start, "default of bool '" + p->name + "' must be true or false, got '" +
                                  excerpt(s, 40) + "'");
      }
    } else if (p->kind == ArgKind::kInt) {
      auto v = parse_int(s, "default of int '" + p->name + "'");
      if (!v) return fail_at(start, v.status().message());
      p->default_value.value.i = *v;
    } else {
      auto v = parse_float(s, "default of float '" + p->name + "'");
      if (!v) return fail_at(start, v.status().message());
      p->default_value.value.f = *v;
    }
    return OkStatus();
  }

  void skip_ws() {
    while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < t_.size() && t_[pos_] == c;
  }
  bool accept(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  bool expect(char c) { return accept(c); }
  bool ident(std::string* out) {
    skip_ws();
    size_t start = pos_;
    if (pos_ < t_.size() &&
        (std::isalpha(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_')) {
      ++pos_;
      while (pos_ < t_.size() &&
             (std::isalnum(static_cast<unsigned char>(t_[pos_])) || t_[pos_] == '_')) {
        ++pos_;
      }
    }
    *out = std::string(t_.substr(start, pos_ - start));
    return !out->empty();
  }
  // The digits at the cursor (consumed), or empty. Range and meaning: parse_int.
  std::string_view number() {
    skip_ws();
    const size_t start = pos_;
    while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    return t_.substr(start, pos_ - start);
  }

  Status fail(const std::string& what) const { return fail_at(pos_, what); }
  Status fail_at(size_t pos, const std::string& what) const {
    return Status(KREG_INVALID_ARGUMENT, "signature '" + excerpt(t_, 400) + "': column " +
                                             std::to_string(pos + 1) + ": " + what);
  }
  Status error(const std::string& expected) const {
    std::string found =
        pos_ < t_.size() ? "'" + escape_control(t_.substr(pos_, 1)) + "'" : "the end";
    return fail("expected " + expected + ", found " + found);
  }

  std::string_view t_;
  size_t pos_ = 0;
};

}  // namespace

Result<Signature> parse_signature(std::string_view text) { return SchemaParser(text).parse(); }

}  // namespace kreg
