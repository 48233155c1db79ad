// kreg signatures as torch.library schemas (kreg.torch, docs/python.md). Torch-free, so
// that the translation is unit-tested where no torch is installed.
//
// Every op gets two torch ops in the namespace `kreg_<group>`:
//   <name>             kreg's own signature: writes into the tensors it is given ("(a!)"),
//                      returns nothing. torch.ops.kreg_layernorm.rmsnorm(x, w, out, eps=1e-6)
//   <name>_functional  allocates what the kreg op writes and returns it:
//                      torch.ops.kreg_layernorm.rmsnorm_functional(x, w, eps=1e-6) -> out.
//                      A write-only output ("out..." names) is allocated from the named
//                      dimensions of the inputs; a tensor the op updates in place is an
//                      input that is copied first, and the copy is returned. Ops whose
//                      outputs the inputs do not determine (unranked, a dimension no input
//                      binds, several possible dtypes) have no functional form; `reason`
//                      says why.
// A 'Resource<group.name> comm' parameter is 'int comm' in both: the resource's registry
// id (kreg.Resource.id), which the kernel maps back to the resource.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/dtype.hpp"
#include "kreg/schema.hpp"
#include "kreg/status.hpp"

namespace kreg::python {

// One dimension of an allocated result: `literal`, or inputs[input].size(axis) / divisor
// * coef (the input's dimension is divisor*S for the symbol S, the result's coef*S).
struct TorchDim {
  int64_t literal = -1;
  int input = -1;  // index into TorchOpPlan::inputs
  int axis = -1;
  int64_t divisor = 1;
  int64_t coef = 1;
};

// One result of the functional form, in signature order of the written tensors.
struct TorchResult {
  int param = -1;              // index into Signature::params
  int clone_of = -1;           // updated in place: the input (index into inputs) it copies; else -1
  std::vector<TorchDim> dims;  // allocated: its shape
  int dtype_input = -1;        // allocated with the shared dtype: this input's dtype
  DType dtype = DType::kF32;   // allocated with a fixed dtype (dtype_input < 0)
};

struct TorchOpPlan {
  std::string op;      // kreg op id, "layernorm.rmsnorm"
  std::string ns;      // "kreg_layernorm"
  std::string name;    // "rmsnorm"
  std::string schema;  // "rmsnorm(Tensor x, Tensor weight, Tensor(a!) out, float eps=1e-06) -> ()"
  std::string functional_name;    // "rmsnorm_functional"
  std::string functional_schema;  // empty when the op has no functional form
  std::string reason;             // why not (functional_schema empty)
  std::vector<int> inputs;        // the functional form's parameters: indices into params
  std::vector<TorchResult> results;
};

// "kreg_" + group; the group name must be a valid identifier (kreg's are).
std::string torch_namespace(std::string_view group);

// The two schemas of `op_id` ("group.name"). An error only when the signature cannot be
// written as a torch schema at all (a default torch cannot parse); a missing functional
// form is not an error.
Result<TorchOpPlan> plan_torch_op(std::string_view op_id, const Signature& sig);

}  // namespace kreg::python
