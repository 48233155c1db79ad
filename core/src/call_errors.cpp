// Why a call failed, in words: KernelHandle::explain turns a CheckPlan::diagnose result
// into a message naming the op, the argument and what was expected; kernel_error turns a
// kernel's status and message buffer into a Status. Both run only off the fast path. Also
// KernelHandle::attrs (named_attrs.cpp fills the slots).
#include <cstring>

#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::CheckFailure;
using detail::CheckPlan;
using detail::Impl;

namespace detail {

const char* attr_type_name(int32_t type) {
  switch (type) {
    case KREG_ATTR_INT:
      return "int";
    case KREG_ATTR_FLOAT:
      return "float";
    case KREG_ATTR_BOOL:
      return "bool";
    case KREG_ATTR_STRING:
      return "str";
    case KREG_ATTR_RESOURCE:
      return "Resource";
    default:
      return "unknown";
  }
}

}  // namespace detail

using detail::attr_type_name;

namespace {

std::string shape_string(const DLTensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) {
    if (i) s += ",";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

}  // namespace

namespace detail {

std::string device_string(const DLDevice& d) {
  return device_type_name(d.device_type) + ":" + std::to_string(d.device_id);
}

Status kernel_error(const Impl& impl, int32_t rc, const char* message, size_t capacity) {
  auto code = static_cast<kreg_status_code>(rc);
  if (rc < 0 || rc > KREG_UNAUTHENTICATED) code = KREG_UNKNOWN;
  const std::string_view text(message, ::strnlen(message, capacity));
  return Status(
      code, impl.spec.op + " (" + impl.spec.backend +
                "): " + (text.empty() ? "kernel failed without a message" : escape_control(text)) +
                (code == KREG_UNKNOWN && rc != KREG_UNKNOWN
                     ? " (non-canonical status " + std::to_string(rc) + ")"
                     : ""));
}

}  // namespace detail

using detail::device_string;

Status KernelHandle::explain(const detail::CheckResult& r, std::span<DLTensor* const> tensors,
                             std::span<const kreg_attr> attrs) const {
  const KernelSpec& spec = impl_->spec;
  const Signature& sig = spec.signature;
  const CheckPlan& plan = impl_->plan;
  const std::string head = spec.op + " (" + spec.backend + "): ";
  auto tensor_names = [&] {
    std::string s;
    for (int i = 0; i < sig.num_tensors; ++i) s += (i ? ", " : "") + sig.tensor(i).name;
    return s;
  };
  auto arg_name = [&](int i) {
    return "argument '" + sig.tensor(i).name + "' (tensor " + std::to_string(i + 1) + " of " +
           std::to_string(sig.num_tensors) + ")";
  };
  auto fail = [&](const std::string& what) {
    return Status(KREG_INVALID_ARGUMENT, head + what + "; signature: " + escape_control(sig.text));
  };
  const int i = r.arg;
  switch (r.why) {
    case CheckFailure::kNone:
      break;
    case CheckFailure::kTensorCount:
      return fail("expected " + std::to_string(sig.num_tensors) + " tensors (" + tensor_names() +
                  "), got " + std::to_string(tensors.size()));
    case CheckFailure::kAttrCount: {
      std::string names;
      for (int a = 0; a < sig.num_attrs; ++a) names += (a ? ", " : "") + sig.attr(a).name;
      return fail("expected " + std::to_string(plan.num_required_attrs) + " to " +
                  std::to_string(sig.num_attrs) + " attributes (" + names + "), got " +
                  std::to_string(attrs.size()));
    }
    case CheckFailure::kNullTensor:
      return fail(arg_name(i) + " is null");
    case CheckFailure::kDevice:
      return fail(arg_name(i) + " is on " + device_string(tensors[i]->device) + ", but backend " +
                  spec.backend + " runs on " + device_type_name(plan.device_type) + " tensors");
    case CheckFailure::kDeviceMismatch:
      return fail(arg_name(i) + " is on " + device_string(tensors[i]->device) + ", but '" +
                  sig.tensor(0).name + "' is on " + device_string(tensors[0]->device));
    case CheckFailure::kDType: {
      const DTypeMask allowed =
          plan.tensors[i].dtypes ? plan.tensors[i].dtypes : plan.shared_dtypes;
      return fail(arg_name(i) + " has dtype " + describe_dl(tensors[i]->dtype) + ", expected " +
                  dtype_set_name(allowed));
    }
    case CheckFailure::kSharedDType: {
      int first = 0;
      while (plan.tensors[first].dtypes != 0) ++first;
      return fail(arg_name(i) + " has dtype " + describe_dl(tensors[i]->dtype) + ", but '" +
                  sig.tensor(first).name + "' has " + describe_dl(tensors[first]->dtype) +
                  " (these tensors share one dtype)");
    }
    case CheckFailure::kRank:
      return fail(arg_name(i) + " has rank " + std::to_string(tensors[i]->ndim) + " " +
                  shape_string(*tensors[i]) + ", expected rank " +
                  std::to_string(plan.tensors[i].ndim) + " " + sig.shape_name(sig.tensor(i)));
    case CheckFailure::kBadShape:
      return fail(arg_name(i) +
                  (tensors[i]->ndim > 0 && tensors[i]->shape == nullptr
                       ? " has ndim " + std::to_string(tensors[i]->ndim) + " but a null shape"
                       : " has ndim " + std::to_string(tensors[i]->ndim) + ", outside [0, " +
                             std::to_string(detail::kMaxCallNdim) + "]"));
    case CheckFailure::kNegativeDim:
      return fail(arg_name(i) + " has shape " + shape_string(*tensors[i]) + ": dim " +
                  std::to_string(r.dim) + " is negative");
    case CheckFailure::kTooLarge:
      return fail(arg_name(i) + " has shape " + shape_string(*tensors[i]) + " of " +
                  describe_dl(tensors[i]->dtype) +
                  ": its size in bytes overflows int64 (at most 9223372036854775807 bytes)");
    case CheckFailure::kDimDivisible: {
      const DimExpr& e = plan.tensors[i].dims[r.dim];
      return fail(arg_name(i) + " dim " + std::to_string(r.dim) + " (" + sig.dim_name(e) + ") is " +
                  std::to_string(tensors[i]->shape[r.dim]) + ", not a multiple of " +
                  std::to_string(e.coef));
    }
    case CheckFailure::kDim: {
      const DimExpr& e = plan.tensors[i].dims[r.dim];
      const int64_t got = tensors[i]->shape[r.dim];
      if (e.symbol < 0) {
        return fail(arg_name(i) + " dim " + std::to_string(r.dim) + " is " + std::to_string(got) +
                    ", expected " + std::to_string(e.literal));
      }
      // Find where the symbol was bound first, to name both sides.
      for (int j = 0; j <= i; ++j) {
        if (tensors[j] == nullptr) continue;  // an omitted optional tensor binds nothing
        for (int k = 0; k < plan.tensors[j].ndim; ++k) {
          const DimExpr& f = plan.tensors[j].dims[k];
          if (f.symbol != e.symbol) continue;
          const int64_t value = tensors[j]->shape[k] / f.coef;
          return fail(arg_name(i) + " has shape " + shape_string(*tensors[i]) + ", expected " +
                      sig.shape_name(sig.tensor(i)) + ": dim " + std::to_string(r.dim) + " (" +
                      sig.dim_name(e) + ") is " + std::to_string(got) + ", but " +
                      sig.symbols[static_cast<size_t>(e.symbol)] + " = " + std::to_string(value) +
                      " from '" + sig.tensor(j).name + "' dim " + std::to_string(k));
        }
      }
      break;
    }
    case CheckFailure::kContiguous: {
      std::string strides = "[";
      for (int k = 0; k < tensors[i]->ndim; ++k) {
        strides += (k ? "," : "") + std::to_string(tensors[i]->strides[k]);
      }
      return fail(arg_name(i) + " is not contiguous (shape " + shape_string(*tensors[i]) +
                  ", strides " + strides + "]); kreg kernels take row-major contiguous tensors");
    }
    case CheckFailure::kAttrType:
      return fail("attribute '" + sig.attr(i).name + "' (attribute " + std::to_string(i + 1) +
                  ") must be " +
                  (plan.attr_types[i] == KREG_ATTR_RESOURCE
                       ? "Resource<" + sig.attr(i).resource_type + ">"
                       : std::string(attr_type_name(plan.attr_types[i]))) +
                  ", got " + attr_type_name(attrs[static_cast<size_t>(i)].type));
    case CheckFailure::kResourceNull:
      return fail("attribute '" + sig.attr(i).name + "' must be a Resource<" +
                  sig.attr(i).resource_type + ">, got no resource");
    case CheckFailure::kResourceType: {
      const kreg_resource& r = *attrs[static_cast<size_t>(i)].value.r;
      return fail("attribute '" + sig.attr(i).name + "' is resource " + std::to_string(r.id) +
                  " of type " + detail::slot_of(&r)->type + ", expected Resource<" +
                  sig.attr(i).resource_type + ">");
    }
    case CheckFailure::kResourceDestroyed: {
      const kreg_resource& r = *attrs[static_cast<size_t>(i)].value.r;
      return Status(KREG_FAILED_PRECONDITION, head + "attribute '" + sig.attr(i).name +
                                                  "': resource " + std::to_string(r.id) + " (" +
                                                  detail::slot_of(&r)->type + ") was destroyed");
    }
  }
  return fail("argument check failed");
}

Result<AttrList> KernelHandle::attrs(const std::vector<NamedAttr>& named) const {
  const CheckPlan& plan = impl_->plan;
  AttrList list;
  list.attrs_.assign(plan.defaults, plan.defaults + plan.num_attrs);
  const detail::AttrSlots slots{impl_->spec.op,
                                "attribute",
                                impl_->spec.signature,
                                {plan.attr_types, static_cast<size_t>(plan.num_attrs)},
                                true,
                                [&list](const std::string& v) {
                                  list.strings_.push_back(std::make_unique<std::string>(v));
                                  return list.strings_.back()->c_str();
                                }};
  if (Status st = detail::fill_named_attrs(slots, named, list.attrs_); !st.ok()) return st;
  return list;
}

}  // namespace kreg
