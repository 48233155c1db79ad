// kreg._torch: kreg ops as torch operators (kreg/torch.py defines the schemas and the fake
// implementations; this module registers the CPU and CUDA kernels behind them).
//
// Each op's kernel is a boxed torch kernel: torch hands it the argument stack, it views
// each at::Tensor as a DLTensor in place (no DLPack export, no allocation), runs the
// kreg handle resolved for the call's (device, dtype) on torch's current stream with
// workspaces from torch's caching allocator, and leaves the results on the stack. Only
// the handle's own check stands between torch and the kernel, so a torch op call costs
// the dispatcher's boxing and this, nothing in Python.
#include <Python.h>
#include <torch/library.h>
#include <torch/version.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(KREG_TORCH_C10_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include "kreg/checked_math.hpp"
#include "kreg/registry.hpp"
#include "torch_schema.hpp"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
#define KREG_TORCH_NATIVE_STREAM 1  // c10::Stream::native_handle (torch 2.11)
#endif

namespace kreg::python {
namespace {

[[noreturn]] void fail(const Status& st) {
  // torch-style: a bad argument is a ValueError, anything else a RuntimeError; the text is
  // the core's (op, argument, what was expected).
  if (st.code() == KREG_INVALID_ARGUMENT) TORCH_CHECK_VALUE(false, st.message());
  TORCH_CHECK(false, st.message());
  __builtin_unreachable();
}

// kreg's dtypes and torch's, one table for both directions.
struct DTypePair {
  DType kreg;
  at::ScalarType torch;
};
constexpr DTypePair kDTypes[] = {
    {DType::kF32, at::kFloat},
    {DType::kF16, at::kHalf},
    {DType::kBF16, at::kBFloat16},
    {DType::kF64, at::kDouble},
    {DType::kI8, at::kChar},
    {DType::kI16, at::kShort},
    {DType::kI32, at::kInt},
    {DType::kI64, at::kLong},
    {DType::kU8, at::kByte},
    {DType::kBool, at::kBool},
#if TORCH_VERSION_MAJOR >= 2
    {DType::kF8E4M3, at::ScalarType::Float8_e4m3fn},
    {DType::kF8E5M2, at::ScalarType::Float8_e5m2},
#endif
};

std::optional<DType> dtype_of(at::ScalarType t) {
  for (const DTypePair& d : kDTypes) {
    if (d.torch == t) return d.kreg;
  }
  return std::nullopt;
}

at::ScalarType scalar_type_of(DType k) {
  for (const DTypePair& d : kDTypes) {
    if (d.kreg == k) return d.torch;
  }
  TORCH_CHECK(false, "kreg.torch: dtype ", std::string(dtype_name(k)), " has no torch dtype");
}

// The launch flags of every CUDA call (kreg.set_pdl): process-wide.
std::atomic<uint64_t> g_launch_flags{0};

// ---- workspaces from torch's caching allocator ----

// One call's scratch blocks: byte tensors, so that freeing one hands its memory back to
// the caching allocator, stream-ordered on the current stream (the call's).
struct Scratch {
  std::vector<at::Tensor> blocks;
};

void set_error(kreg_error* err, const char* text) {
  if (err != nullptr && err->message != nullptr && err->capacity > 0) {
    std::snprintf(err->message, err->capacity, "%s", text);
  }
}

void* scratch_alloc(void* self, size_t bytes, DLDevice device, void* /*stream*/, kreg_error* err) {
  auto* s = static_cast<Scratch*>(self);
  try {
    TORCH_CHECK(device.device_type == kDLCUDA, "workspace requested on a non-CUDA device");
    at::Tensor t = at::empty({static_cast<int64_t>(bytes)},
                             at::TensorOptions().dtype(at::kByte).device(
                                 at::Device(at::kCUDA, static_cast<int8_t>(device.device_id))));
    void* p = t.data_ptr();
    s->blocks.push_back(std::move(t));
    return p;
  } catch (const std::exception& e) {
    // Nothing may be thrown across the plugin's C ABI.
    const std::string text = "torch's caching allocator could not provide " +
                             std::to_string(bytes) + " bytes: " + e.what();
    set_error(err, text.c_str());
    return nullptr;
  }
}

void scratch_free(void* self, void* ptr, size_t, DLDevice, void*) {
  auto* s = static_cast<Scratch*>(self);
  for (auto& t : s->blocks) {
    if (t.defined() && t.data_ptr() == ptr) {
      t.reset();
      return;
    }
  }
}

// ---- one op ----

struct Entry {
  std::string op;
  Registry* registry = nullptr;
  Signature sig;
  TorchOpPlan plan;
  std::vector<int> tensor_index;  // params index -> position among the tensors (or -1)
  std::vector<int> attr_index;    // params index -> position among the attributes (or -1)

  struct Cached {
    uint64_t device;
    uint32_t dtype;
    KernelHandle handle;
  };
  std::mutex mu;
  std::vector<Cached> cache;

  KernelHandle resolve(std::span<DLTensor* const> tensors, bool again) {
    const uint64_t dev =
        tensors.empty() || tensors[0] == nullptr ? 0 : detail::device_word(tensors[0]->device);
    const uint32_t dt =
        tensors.empty() || tensors[0] == nullptr ? 0 : detail::pack_dtype(tensors[0]->dtype);
    std::lock_guard lock(mu);
    // A jit specialization serves only the shapes it was compiled for: one entry per
    // specialization, found by its own check, so alternating widths resolve once each.
    if (!again) {
      for (const Cached& c : cache) {
        if (c.device == dev && c.dtype == dt &&
            (!c.handle.specialized() || c.handle.accepts_tensors(tensors))) {
          return c.handle;
        }
      }
    }
    auto h = registry->resolve(op, tensors, ResolveOptions{});
    if (!h) fail(h.status());
    if (!h->specialized()) {
      for (Cached& c : cache) {
        if (c.device == dev && c.dtype == dt && !c.handle.specialized()) {
          c.handle = *h;
          return *h;
        }
      }
    }
    constexpr size_t kMaxCached = 64;  // bounded: a model has a few widths, not thousands
    if (cache.size() >= kMaxCached) cache.erase(cache.begin());
    cache.push_back({dev, dt, *h});
    return *h;
  }
};

// The DLTensor view of a tensor argument (its sizes and strides are borrowed).
void view(const Entry& e, const Param& p, const at::Tensor& t, DLTensor* out) {
  const auto dt = dtype_of(t.scalar_type());
  if (!dt) {
    fail(Status(KREG_INVALID_ARGUMENT, e.op + ": argument '" + p.name + "': torch dtype " +
                                           std::string(c10::toString(t.scalar_type())) +
                                           " has no kreg dtype"));
  }
  DLDevice dev{kDLCPU, 0};
  if (t.is_cuda()) {
    dev = {kDLCUDA, t.device().index()};
  } else if (!t.is_cpu()) {
    fail(Status(KREG_INVALID_ARGUMENT, e.op + ": argument '" + p.name + "' is on device " +
                                           t.device().str() + " (kreg takes CPU and CUDA)"));
  }
  out->data = t.numel() == 0 ? nullptr : t.data_ptr();
  out->device = dev;
  out->ndim = static_cast<int32_t>(t.dim());
  out->dtype = to_dl(*dt);
  out->shape = const_cast<int64_t*>(t.sizes().data());
  out->strides = const_cast<int64_t*>(t.strides().data());
  out->byte_offset = 0;
}

void* current_stream(const at::Device& d) {
  if (!d.is_cuda()) return nullptr;
#if defined(KREG_TORCH_NATIVE_STREAM)
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(d).native_handle();
#elif defined(KREG_TORCH_C10_CUDA)
  return c10::cuda::getCurrentCUDAStream(d.index()).stream();
#else
  TORCH_CHECK(false,
              "kreg.torch was built against a torch without CUDA streams (torch >= 2.11, "
              "or c10_cuda at build time): CUDA tensors cannot be used");
#endif
}

// The kernel behind both torch ops of one kreg op.
class Kernel final : public c10::OperatorKernel {
 public:
  Kernel(Entry* e, bool functional) : e_(e), functional_(functional) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const Signature& sig = e_->sig;
    const size_t nparams = sig.params.size();
    const size_t nargs = functional_ ? e_->plan.inputs.size() : nparams;
    auto args = torch::jit::last(*stack, nargs);

    // Every parameter's value: from the stack, or (functional) allocated / copied.
    at::Tensor owned[kMaxTensors];  // results and copies (functional form)
    const at::Tensor* tensor_arg[kMaxTensors] = {};
    const c10::IValue* attr_arg[kMaxAttrs] = {};
    if (functional_) {
      for (size_t k = 0; k < nargs; ++k) {
        const int pi = e_->plan.inputs[k];
        const Param& p = sig.params[pi];
        if (p.is_tensor()) {
          if (!args[k].isNone()) tensor_arg[e_->tensor_index[pi]] = &args[k].toTensor();
        } else {
          attr_arg[e_->attr_index[pi]] = &args[k];
        }
      }
    } else {
      for (size_t k = 0; k < nparams; ++k) {
        const Param& p = sig.params[k];
        if (p.is_tensor()) {
          if (!args[k].isNone()) tensor_arg[e_->tensor_index[k]] = &args[k].toTensor();
        } else {
          attr_arg[e_->attr_index[k]] = &args[k];
        }
      }
    }
    const at::Tensor* first = nullptr;
    for (int i = 0; i < sig.num_tensors && first == nullptr; ++i) first = tensor_arg[i];
    TORCH_CHECK(first != nullptr, e_->op, ": no tensor argument");
    const at::Device device = first->device();
    c10::OptionalDeviceGuard guard;
    if (device.is_cuda()) guard.reset_device(device);

    if (functional_) allocate(args, device, owned, tensor_arg);

    DLTensor views[kMaxTensors];
    DLTensor* tensors[kMaxTensors];
    for (int i = 0; i < sig.num_tensors; ++i) {
      if (tensor_arg[i] == nullptr) {
        tensors[i] = nullptr;
        continue;
      }
      view(*e_, sig.tensor(i), *tensor_arg[i], &views[i]);
      tensors[i] = &views[i];
    }
    kreg_attr attrs[kMaxAttrs];
    for (int i = 0; i < sig.num_attrs; ++i) {
      const c10::IValue& v = *attr_arg[i];
      kreg_attr& a = attrs[i];
      a.reserved = 0;
      switch (sig.attr(i).kind) {
        case ArgKind::kInt:
          a.type = KREG_ATTR_INT;
          a.value.i = v.toInt();
          break;
        case ArgKind::kFloat:
          a.type = KREG_ATTR_FLOAT;
          a.value.f = v.toDouble();
          if (!std::isfinite(a.value.f)) {  // as kreg.Op refuses them
            fail(Status(KREG_INVALID_ARGUMENT, e_->op + ": attribute '" + sig.attr(i).name +
                                                   "' must be a finite float, not inf or nan"));
          }
          break;
        case ArgKind::kBool:
          a.type = KREG_ATTR_BOOL;
          a.value.i = v.toBool() ? 1 : 0;
          break;
        case ArgKind::kString: {
          // The kernel gets a C string: a NUL would silently cut it short.
          const std::string& s = v.toStringRef();
          if (s.find('\0') != std::string::npos) {
            fail(Status(KREG_INVALID_ARGUMENT, e_->op + ": attribute '" + sig.attr(i).name +
                                                   "' contains a NUL character"));
          }
          a.type = KREG_ATTR_STRING;
          a.value.s = s.c_str();
          break;
        }
        case ArgKind::kResource: {
          // The torch schema carries the resource's id; a destroyed or wrong-typed one is
          // refused by the call's own check, with its message.
          const int64_t id = v.toInt();
          const kreg_resource* r =
              id > 0 ? e_->registry->find_resource(static_cast<uint64_t>(id)) : nullptr;
          if (r == nullptr) {
            fail(Status(KREG_INVALID_ARGUMENT, e_->op + ": attribute '" + sig.attr(i).name +
                                                   "': no resource with id " + std::to_string(id) +
                                                   " in this registry"));
          }
          a.type = KREG_ATTR_RESOURCE;
          a.value.r = r;
          break;
        }
        case ArgKind::kTensor:
          break;
      }
    }
    const std::span<DLTensor* const> tspan(tensors, static_cast<size_t>(sig.num_tensors));
    const std::span<const kreg_attr> aspan(attrs, static_cast<size_t>(sig.num_attrs));

    Scratch scratch;
    const kreg_host_services services{sizeof(kreg_host_services), &scratch, &scratch_alloc,
                                      &scratch_free};
    const CallOptions options{
        current_stream(device), device.is_cuda() ? &services : nullptr,
        device.is_cuda() ? g_launch_flags.load(std::memory_order_relaxed) : 0};
    KernelHandle h = e_->resolve(tspan, false);
    Status st = h.call(tspan, aspan, options);
    if (!st.ok()) [[unlikely]] {
      // Another implementation for this device and dtype may take these arguments
      // (shape-specialised kernels): resolve again against them, as kreg.Op does.
      if (st.code() != KREG_INVALID_ARGUMENT) fail(st);
      KernelHandle again = e_->resolve(tspan, true);
      if (&again.spec() == &h.spec()) fail(st);
      st = again.call(tspan, aspan, options);
      if (!st.ok()) fail(st);
    }

    torch::jit::drop(*stack, nargs);
    if (functional_) {
      for (const TorchResult& r : e_->plan.results) {
        stack->emplace_back(owned[e_->tensor_index[r.param]]);
      }
    }
  }

 private:
  // The functional form's results: copies of the tensors updated in place, new tensors
  // for the outputs (shapes from the inputs' named dimensions, torch_schema.hpp).
  void allocate(c10::ArrayRef<c10::IValue> args, const at::Device& device, at::Tensor* owned,
                const at::Tensor** tensor_arg) const {
    const Signature& sig = e_->sig;
    for (const TorchResult& r : e_->plan.results) {
      const int ti = e_->tensor_index[r.param];
      if (r.clone_of >= 0) {
        const at::Tensor& in = args[r.clone_of].toTensor();
        if (in.is_cpu() && in.is_pinned()) {
          // A page-locked host tensor ('Tensor@host') stays page-locked in its copy.
          owned[ti] = at::empty(in.sizes(), in.options().pinned_memory(true));
          owned[ti].copy_(in);
        } else {
          owned[ti] = in.clone(at::MemoryFormat::Contiguous);
        }
      } else {
        std::vector<int64_t> shape;
        for (const TorchDim& d : r.dims) {
          if (d.literal >= 0) {
            shape.push_back(d.literal);
            continue;
          }
          const at::Tensor& in = args[d.input].toTensor();
          const Param& ip = sig.params[e_->plan.inputs[d.input]];
          if (in.dim() <= d.axis) {
            fail(Status(KREG_INVALID_ARGUMENT, e_->op + ": argument '" + ip.name + "' must have " +
                                                   std::to_string(ip.dims.size()) +
                                                   " dimensions, got " + std::to_string(in.dim())));
          }
          const int64_t size = in.size(d.axis);
          if (size % d.divisor != 0) {
            fail(Status(KREG_INVALID_ARGUMENT,
                        e_->op + ": argument '" + ip.name + "' dimension " +
                            std::to_string(d.axis) + " (" + std::to_string(size) +
                            ") must be a multiple of " + std::to_string(d.divisor) + " (" +
                            sig.shape_name(ip) + ")"));
          }
          int64_t extent = 0;
          if (!checked_mul(size / d.divisor, d.coef, &extent)) {
            fail(Status(KREG_INVALID_ARGUMENT, e_->op + ": argument '" + ip.name + "' dimension " +
                                                   std::to_string(d.axis) + " (" +
                                                   std::to_string(size) +
                                                   ") makes an output dimension past int64"));
          }
          shape.push_back(extent);
        }
        const at::ScalarType st = r.dtype_input >= 0 ? args[r.dtype_input].toTensor().scalar_type()
                                                     : scalar_type_of(r.dtype);
        owned[ti] = at::empty(shape, at::TensorOptions().dtype(st).device(device));
      }
      tensor_arg[ti] = &owned[ti];
    }
  }

  Entry* e_;
  bool functional_;
};

// Everything installed lives as long as the process: torch keeps calling the kernels
// until it exits, and tearing the dispatcher's registrations down at interpreter exit
// would race torch's own teardown. The registry object is kept alive for the same reason.
struct Installed {
  std::deque<Entry> entries;
  std::vector<std::unique_ptr<torch::Library>> libraries;
  std::vector<PyObject*> owners;
};
Installed& installed() {
  static auto* i = new Installed;
  return *i;
}

Entry& make_entry(Registry* reg, const std::string& op) {
  auto impls = reg->implementations(op);
  TORCH_CHECK(!impls.empty(), "kreg.torch: unknown op '", op, "'");
  Entry& e = installed().entries.emplace_back();
  e.op = op;
  e.registry = reg;
  e.sig = impls.front()->signature;
  auto plan = plan_torch_op(op, e.sig);
  if (!plan) fail(plan.status());
  e.plan = std::move(plan).value();
  int nt = 0, na = 0;
  for (const Param& p : e.sig.params) {
    e.tensor_index.push_back(p.is_tensor() ? nt++ : -1);
    e.attr_index.push_back(p.is_tensor() ? -1 : na++);
  }
  return e;
}

// install(registry_capsule, owner, [op ids]): the CPU and CUDA kernels of both torch ops
// of each op (already defined from Python).
PyObject* install(PyObject*, PyObject* args) {
  PyObject* capsule = nullptr;
  PyObject* owner = nullptr;
  PyObject* ops = nullptr;
  if (!PyArg_ParseTuple(args, "OOO!", &capsule, &owner, &PyList_Type, &ops)) return nullptr;
  auto* reg = static_cast<Registry*>(PyCapsule_GetPointer(capsule, "kreg.Registry"));
  if (reg == nullptr) return nullptr;
  try {
    Py_INCREF(owner);
    installed().owners.push_back(owner);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); ++i) {
      const char* id = PyUnicode_AsUTF8(PyList_GET_ITEM(ops, i));
      if (id == nullptr) return nullptr;
      Entry& e = make_entry(reg, id);
      for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA}) {
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, e.plan.ns, key, __FILE__,
                                                    __LINE__);
        lib->impl(e.plan.name.c_str(),
                  torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(&e, false)));
        if (!e.plan.functional_schema.empty()) {
          lib->impl(e.plan.functional_name.c_str(),
                    torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(&e, true)));
        }
        installed().libraries.push_back(std::move(lib));
      }
    }
  } catch (const std::exception& ex) {
    PyErr_SetString(PyExc_RuntimeError, ex.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// ---- plans for Python (schemas and the fake implementations' recipe) ----

PyObject* dict_of(const TorchOpPlan& plan, const Signature& sig) {
  auto str = [](const std::string& s) { return PyUnicode_FromStringAndSize(s.data(), s.size()); };
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  bool ok = true;
  auto put = [&](const char* key, PyObject* v) {
    ok = ok && v != nullptr && PyDict_SetItemString(d, key, v) == 0;
    Py_XDECREF(v);
  };
  put("op", str(plan.op));
  put("ns", str(plan.ns));
  put("name", str(plan.name));
  put("schema", str(plan.schema));
  put("functional_name", str(plan.functional_name));
  put("functional_schema", str(plan.functional_schema));
  put("reason", str(plan.reason));
  PyObject* inputs = PyList_New(0);
  for (int pi : plan.inputs) {
    PyObject* n = str(sig.params[pi].name);
    if (inputs != nullptr && n != nullptr) PyList_Append(inputs, n);
    Py_XDECREF(n);
  }
  put("inputs", inputs);
  PyObject* results = PyList_New(0);
  for (const TorchResult& r : plan.results) {
    PyObject* dims = PyList_New(0);
    for (const TorchDim& t : r.dims) {
      PyObject* dim =
          Py_BuildValue("(LiiLL)", static_cast<long long>(t.literal), t.input, t.axis,
                        static_cast<long long>(t.divisor), static_cast<long long>(t.coef));
      if (dims != nullptr && dim != nullptr) PyList_Append(dims, dim);
      Py_XDECREF(dim);
    }
    PyObject* rd =
        Py_BuildValue("{s:s,s:i,s:O,s:i,s:s}", "name", sig.params[r.param].name.c_str(), "clone_of",
                      r.clone_of, "dims", dims ? dims : Py_None, "dtype_input", r.dtype_input,
                      "dtype", r.dtype_input >= 0 ? "" : std::string(dtype_name(r.dtype)).c_str());
    Py_XDECREF(dims);
    if (results != nullptr && rd != nullptr) PyList_Append(results, rd);
    Py_XDECREF(rd);
  }
  put("results", results);
  if (!ok || PyErr_Occurred()) {
    Py_DECREF(d);
    return nullptr;
  }
  return d;
}

// plan(registry_capsule, op) -> dict: the torch schemas of one kreg op and how its
// functional form's results are shaped (kreg/torch.py builds the fakes from it).
PyObject* plan(PyObject*, PyObject* args) {
  PyObject* capsule = nullptr;
  const char* op = nullptr;
  if (!PyArg_ParseTuple(args, "Os", &capsule, &op)) return nullptr;
  auto* reg = static_cast<Registry*>(PyCapsule_GetPointer(capsule, "kreg.Registry"));
  if (reg == nullptr) return nullptr;
  auto impls = reg->implementations(op);
  if (impls.empty()) {
    PyErr_Format(PyExc_LookupError, "kreg.torch: unknown op '%s'", op);
    return nullptr;
  }
  const Signature& sig = impls.front()->signature;
  auto p = plan_torch_op(op, sig);
  if (!p) {
    PyErr_SetString(PyExc_ValueError, p.status().message().c_str());
    return nullptr;
  }
  return dict_of(*p, sig);
}

PyObject* set_launch_flags(PyObject*, PyObject* arg) {
  const unsigned long long flags = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  g_launch_flags.store(flags, std::memory_order_relaxed);
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"set_launch_flags", set_launch_flags, METH_O,
     "set_launch_flags(flags): KREG_LAUNCH_* for every CUDA call (kreg.set_pdl sets it)."},
    {"plan", plan, METH_VARARGS,
     "plan(registry_capsule, op) -> dict: the op's torch schemas and functional results."},
    {"install", install, METH_VARARGS,
     "install(registry_capsule, owner, ops): registers the CPU and CUDA kernels of the torch "
     "ops of each kreg op (defined beforehand by kreg.torch)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_torch",
                       "kreg's kernels behind torch.library ops (used by kreg.torch).", -1,
                       kMethods};

}  // namespace
}  // namespace kreg::python

PyMODINIT_FUNC PyInit__torch() {
  PyObject* m = PyModule_Create(&kreg::python::kModule);
  if (m == nullptr) return nullptr;
  PyModule_AddStringConstant(m, "torch_version", TORCH_VERSION);
  return m;
}
