// Kernel signatures: a schema string parsed once, at registration, into the facts a call
// is checked against.
//
//   rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, float eps=1e-6) -> ()
//
// Grammar (whitespace is free):
//   signature := NAME '(' [param (',' param)*] ')' '->' '(' ')'
//   param     := tensor | attr
//   tensor    := 'Tensor' ['?'] ['@' 'host'] ['<' DTYPE ('|' DTYPE)* '>'] ['(' ALIAS ['!'] ')']
//                ['[' dim (',' dim)* ']'] NAME
//   dim       := INT | [INT '*'] SYMBOL          e.g. 4096, H, 2*D
//   attr      := ('int' | 'float' | 'bool' | 'str') NAME ['=' LITERAL]
//              | 'Resource' '<' GROUP '.' NAME '>' NAME       (ABI 1.4, no default)
// A tensor without '<...>' takes the implementation's shared dtype (KernelSpec::dtypes):
// all such tensors of one call must have the same dtype. A tensor without '[...]' may
// have any rank. '!' marks a tensor the kernel writes; a written tensor whose name starts
// with "out" is write-only (PyTorch's out= convention), any other is read and written in
// place (tools count bytes and build inputs from this). Attributes with a default may be
// omitted by callers; all attributes follow all tensors they relate to in any order.
// 'Tensor?' is an optional tensor: callers pass a null DLTensor* to omit it, and the
// kernel's typed parameter is a pointer (`const DLTensor*`, null when absent). An
// optional tensor is never the first tensor, and its named dimensions must be bound by a
// required tensor (so a call's shape check never depends on what was omitted).
// 'Resource<group.name>' is an attribute holding a resource the registry created
// (Registry::create_resource; docs/design/resources.md): the call checks its type and that
// it was not destroyed, and the kernel receives its state.
// 'Tensor@host' may also live in host memory while the call runs on a device: page-locked
// memory the device reads directly (DLPack kDLCUDAHost, or kDLCPU as PyTorch exports
// pinned tensors; the kernel must check that the pointer is really page-locked). Never
// the first tensor, which decides the call's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/abi.h"
#include "kreg/dtype.hpp"
#include "kreg/status.hpp"

namespace kreg {

// The core's limits, enforced by parse_signature (every Signature it returns fits the
// check plan's fixed arrays). Dimension literals are at most INT64_MAX, coefficients in
// [1, INT32_MAX].
inline constexpr int kMaxTensors = 16;
inline constexpr int kMaxAttrs = 16;
inline constexpr int kMaxRank = 8;
inline constexpr int kMaxSymbols = 16;
inline constexpr size_t kMaxSignatureBytes = 4096;

enum class ArgKind : uint8_t { kTensor, kInt, kFloat, kBool, kString, kResource };
std::string_view arg_kind_name(ArgKind k);  // "Tensor", "int", "float", "bool", "str", "Resource"
char arg_kind_code(ArgKind k);              // 'T', 'i', 'f', 'b', 's', 'r' (see plugin.hpp)

// One dimension: a literal size, or coef * symbol.
struct DimExpr {
  int64_t literal = -1;  // >= 0 for a literal dimension
  int32_t coef = 1;
  int32_t symbol = -1;  // index into Signature::symbols
};

struct Param {
  std::string name;
  ArgKind kind = ArgKind::kTensor;
  // Tensors.
  DTypeMask dtypes = 0;   // 0: the implementation's shared dtype
  std::string alias;      // "a" in Tensor(a!)
  bool mutated = false;   // '!'
  bool optional = false;  // 'Tensor?': may be passed as null
  bool host_ok = false;   // 'Tensor@host': may be in (page-locked) host memory
  bool ranked = false;    // dims given
  std::vector<DimExpr> dims;
  // Attributes.
  bool has_default = false;
  kreg_attr default_value{};  // for strings, value.s is unset: see default_text
  std::string default_text;   // the literal as written (string defaults unquoted)
  std::string resource_type;  // kResource: "<group>.<name>"

  bool is_tensor() const { return kind == ArgKind::kTensor; }
  bool written() const { return is_tensor() && mutated; }
  bool read() const { return is_tensor() && !(mutated && name.rfind("out", 0) == 0); }
};

struct Signature {
  std::string name;  // the op's short name, e.g. "rmsnorm"
  std::vector<Param> params;
  std::vector<std::string> symbols;  // dimension names, in first-use order
  int num_tensors = 0;
  int num_attrs = 0;
  std::string text;  // as registered

  std::string arg_kinds() const;  // e.g. "TTTf"; an optional tensor is 'O'
  const Param* find(std::string_view name) const;
  // Index of the n-th tensor / attribute parameter in params.
  const Param& tensor(int n) const;
  const Param& attr(int n) const;
  // Canonical rendering of one dimension, e.g. "2*D".
  std::string dim_name(const DimExpr& d) const;
  std::string shape_name(const Param& p) const;  // "[T,2*D]" or "[*]"
};

// Parses a schema string; the error names the column and what was expected.
Result<Signature> parse_signature(std::string_view text);

}  // namespace kreg
