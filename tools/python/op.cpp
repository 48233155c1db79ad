// kreg.Op: see op.hpp. The call path, in order: count the positional tensors, read the
// keyword attributes into a prefilled kreg_attr array, view each tensor as a DLTensor and
// pick the stream, resolve or reuse the cached implementation, call it, release whatever
// the views hold. A tensor is viewed, fastest first, through its type's DLPack C exchange
// API (exchange_api.hpp: torch >= 2.10; no Python call, no allocation), through torch's
// own exporter (older torch), or through __dlpack__ per the DLPack Python spec; the first
// two only when the call runs on the framework's current stream (no stream= override).
#include "op.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "exchange_api.hpp"
#include "kreg/text.hpp"
#include "py_resource.hpp"

namespace kreg::python {
namespace {

// ---- Exceptions ----

Exceptions g_exceptions;

// The launch flags of every CUDA call (kreg.set_pdl): process-wide, set rarely.
uint64_t g_launch_flags = 0;

// ---- torch, when someone else has imported it ----

// torch is never imported from here: when it is in sys.modules, its exporter and its
// current-stream query are looked up once and kept.
struct TorchHooks {
  PyObject* tensor_type = nullptr;     // torch.Tensor
  PyObject* to_dlpack = nullptr;       // torch._C._to_dlpack: Tensor -> "dltensor" capsule
  PyObject* raw_stream = nullptr;      // torch._C._cuda_getCurrentRawStream(index) -> int
  PyObject* current_stream = nullptr;  // torch.cuda.current_stream (fallback)
};
TorchHooks* g_torch = nullptr;
PyObject* g_str_torch = nullptr;
PyObject* g_str_stream = nullptr;
PyObject* g_str_dlpack = nullptr;
PyObject* g_str_dlpack_device = nullptr;
PyObject* g_str_cuda_stream = nullptr;
PyObject* g_str_ndim = nullptr;

const TorchHooks* torch_hooks() {
  if (g_torch != nullptr) return g_torch;
  PyObject* torch = PyDict_GetItemWithError(PyImport_GetModuleDict(), g_str_torch);
  if (torch == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  // A torch still being imported lacks some of these: try again on a later call.
  PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
  PyObject* c = PyObject_GetAttrString(torch, "_C");
  PyObject* cuda = PyObject_GetAttrString(torch, "cuda");
  if (tensor == nullptr || c == nullptr || cuda == nullptr || !PyType_Check(tensor)) {
    PyErr_Clear();
    Py_XDECREF(tensor);
    Py_XDECREF(c);
    Py_XDECREF(cuda);
    return nullptr;
  }
  auto* hooks = new TorchHooks;  // lives as long as the interpreter
  hooks->tensor_type = tensor;
  hooks->to_dlpack = PyObject_GetAttrString(c, "_to_dlpack");
  if (hooks->to_dlpack == nullptr) PyErr_Clear();
  hooks->raw_stream = PyObject_GetAttrString(c, "_cuda_getCurrentRawStream");
  if (hooks->raw_stream == nullptr) PyErr_Clear();
  hooks->current_stream = PyObject_GetAttrString(cuda, "current_stream");
  if (hooks->current_stream == nullptr) PyErr_Clear();
  Py_DECREF(c);
  Py_DECREF(cuda);
  g_torch = hooks;
  return g_torch;
}

// The exchange API of a tensor type, looked up once per type. The few types a process
// passes (torch.Tensor, nn.Parameter, ...) are kept, with a reference so that a type's
// address cannot be reused by another; types past the table's size are looked up per call.
struct ExchangeCacheEntry {
  PyTypeObject* type;
  const ExchangeApi* api;
};
constexpr int kExchangeCacheSize = 16;
ExchangeCacheEntry g_exchange_cache[kExchangeCacheSize];
int g_exchange_cache_used = 0;

const ExchangeApi* exchange_api(PyTypeObject* type) {
  for (int i = 0; i < g_exchange_cache_used; ++i) {
    if (g_exchange_cache[i].type == type) return g_exchange_cache[i].api;
  }
  const ExchangeApi* api = find_exchange_api(type);
  if (g_exchange_cache_used < kExchangeCacheSize) {
    Py_INCREF(type);
    g_exchange_cache[g_exchange_cache_used++] = {type, api};
  }
  return api;
}

// Views `obj` through its type's exchange API into `view`; false (no exception) when the
// type has none or refuses the object, which then takes the other paths and their errors.
bool exchange_view(PyObject* obj, DLTensor* view, const ExchangeApi** api_out) {
  const ExchangeApi* api = exchange_api(Py_TYPE(obj));
  if (api == nullptr) return false;
  if (api->dltensor_from_py_object_no_sync(obj, view) != 0) {
    PyErr_Clear();
    return false;
  }
  *api_out = api;
  return true;
}

// torch's current stream on CUDA device `index`, as an integer handle. -1 with an
// exception set on failure.
int64_t torch_current_stream(const TorchHooks& t, int index) {
  PyObject* idx = PyLong_FromLong(index);
  if (idx == nullptr) return -1;
  PyObject* r = nullptr;
  if (t.raw_stream != nullptr) {
    r = PyObject_CallOneArg(t.raw_stream, idx);
  } else if (t.current_stream != nullptr) {
    PyObject* s = PyObject_CallOneArg(t.current_stream, idx);
    if (s != nullptr) {
      r = PyObject_GetAttr(s, g_str_cuda_stream);
      Py_DECREF(s);
    }
  } else {
    PyErr_SetString(PyExc_RuntimeError, "kreg: torch has no current-stream query");
  }
  Py_DECREF(idx);
  if (r == nullptr) return -1;
  const long long v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  if (v == -1 && PyErr_Occurred()) return -1;
  return v;
}

// ---- Workspace from torch's caching allocator ----

// kreg_host_services for calls whose tensors came from torch: a kernel's scratch memory
// (kreg::device::Workspace) comes from torch.cuda.caching_allocator_alloc on the call's
// stream and goes back through caching_allocator_delete, so it is accounted and reused by
// torch rather than allocated behind its back. The functions are looked up on every use
// (a module attribute each), so a hook installed on torch.cuda is honoured. Python errors
// become kreg_error messages: nothing is thrown or left pending across the C ABI.
PyObject* g_torch_cuda = nullptr;  // torch.cuda, imported on the first allocation

void set_error(kreg_error* err, const std::string& text) {
  if (err != nullptr && err->message != nullptr && err->capacity > 0) {
    std::snprintf(err->message, err->capacity, "%s", text.c_str());
  }
}

// The pending Python exception as text (and cleared).
std::string take_python_error() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);  // PyErr_GetRaisedException needs Python 3.12
  PyErr_NormalizeException(&type, &value, &trace);
  std::string text = value != nullptr ? Py_TYPE(value)->tp_name : "unknown error";
  if (value != nullptr) {
    if (PyObject* str = PyObject_Str(value)) {
      if (const char* utf8 = PyUnicode_AsUTF8(str)) text += std::string(": ") + utf8;
      Py_DECREF(str);
    }
  }
  PyErr_Clear();  // a failed str() above
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return text;
}

PyObject* torch_cuda_function(const char* name) {
  if (g_torch_cuda == nullptr) {
    g_torch_cuda = PyImport_ImportModule("torch.cuda");
    if (g_torch_cuda == nullptr) return nullptr;
  }
  return PyObject_GetAttrString(g_torch_cuda, name);
}

void* torch_workspace_alloc(void* /*self*/, size_t bytes, DLDevice device, void* stream,
                            kreg_error* err) {
  const PyGILState_STATE gil = PyGILState_Ensure();  // held already, except in odd hosts
  void* ptr = nullptr;
  PyObject* fn = torch_cuda_function("caching_allocator_alloc");
  PyObject* r = nullptr;
  if (fn != nullptr) {
    r = PyObject_CallFunction(fn, "nin", static_cast<Py_ssize_t>(bytes), device.device_id,
                              static_cast<Py_ssize_t>(reinterpret_cast<intptr_t>(stream)));
    Py_DECREF(fn);
  }
  if (r != nullptr) {
    ptr = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
  }
  if (PyErr_Occurred()) {
    set_error(err, "torch.cuda.caching_allocator_alloc(" + std::to_string(bytes) + ", " +
                       std::to_string(device.device_id) + ") failed: " + take_python_error());
    ptr = nullptr;
  } else if (ptr == nullptr) {
    set_error(err, "torch.cuda.caching_allocator_alloc(" + std::to_string(bytes) +
                       ") returned a null pointer");
  }
  PyGILState_Release(gil);
  return ptr;
}

void torch_workspace_free(void* /*self*/, void* ptr, size_t /*bytes*/, DLDevice /*device*/,
                          void* /*stream*/) {
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* fn = torch_cuda_function("caching_allocator_delete");
  PyObject* r = nullptr;
  if (fn != nullptr) {
    PyObject* p = PyLong_FromVoidPtr(ptr);
    if (p != nullptr) {
      r = PyObject_CallOneArg(fn, p);
      Py_DECREF(p);
    }
    Py_DECREF(fn);
  }
  Py_XDECREF(r);
  // A free has nobody to report to: say so on stderr rather than leave an exception set.
  if (PyErr_Occurred()) PyErr_WriteUnraisable(nullptr);
  PyGILState_Release(gil);
}

const kreg_host_services kTorchServices{sizeof(kreg_host_services), nullptr, &torch_workspace_alloc,
                                        &torch_workspace_free};

// ---- The Op object ----

struct AttrSpec {
  PyObject* name = nullptr;  // interned, owned
  int32_t type = 0;          // KREG_ATTR_*
  bool required = false;
  std::string default_string;  // storage behind defaults[i].value.s
  std::string resource_type;   // KREG_ATTR_RESOURCE: "<group>.<name>"
};

struct OpState {
  std::string requested;  // as asked for: an op id or an alias
  std::string id;         // the op it names
  std::optional<std::string> backend;
  int num_tensors = 0;
  std::string tensor_list;  // "x, weight, out", for messages
  std::vector<std::string> tensor_names;
  std::vector<AttrSpec> attrs;
  kreg_attr defaults[kMaxAttrs] = {};
  // Resource<...> attributes: how many lead the attribute list (those may also be passed
  // positionally, after the tensors: all_reduce(x, comm)), and whether there are any.
  int num_leading_resources = 0;
  bool has_resources = false;
  std::string leading_resource_list;  // "comm", for messages
  // The resolution cache: the last (device, dtype of the first tensor) and its handle.
  bool cached = false;
  uint64_t cached_device = 0;
  uint32_t cached_dtype = 0;
  KernelHandle handle;
  // Other jit specializations of the op seen on this (device, dtype) (kreg/jit.hpp): a
  // width the handle was not compiled for swaps in the one that was, without a resolve.
  static constexpr int kMaxAlternates = 4;
  KernelHandle alternates[kMaxAlternates];
  int num_alternates = 0;
  int next_alternate = 0;
};

struct OpObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* owner;  // the Python registry object: the Registry must outlive the handle
  Registry* registry;
  OpState* state;
};

PyTypeObject g_op_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

const char* attr_type_name(int32_t t) {
  switch (t) {
    case KREG_ATTR_INT:
      return "int";
    case KREG_ATTR_FLOAT:
      return "float";
    case KREG_ATTR_BOOL:
      return "bool";
    case KREG_ATTR_STRING:
      return "str";
    case KREG_ATTR_RESOURCE:
      return "kreg.Resource";
    default:
      return "?";
  }
}

// A value of the right type but outside what the attribute can hold: kreg.InvalidArgument
// naming the op, the attribute and the range (the Python exception it replaces, if any,
// is dropped: OverflowError's text names neither).
bool attr_range_error(const OpState& s, const AttrSpec& spec, const char* problem) {
  PyErr_Clear();
  const char* name = PyUnicode_AsUTF8(spec.name);
  (void)raise_status(Status(KREG_INVALID_ARGUMENT, s.requested + "(): attribute '" +
                                                       (name ? name : "?") + "' " + problem));
  return false;
}

// Whether `v` is an array of one or more dimensions (an object whose .ndim is not 0): a
// one-element array has __float__ too, but it is not a scalar. -1 with an error set.
int is_nonscalar_array(PyObject* v) {
  PyObject* ndim = PyObject_GetAttr(v, g_str_ndim);
  if (ndim == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
  }
  const int zero = PyLong_Check(ndim) && PyLong_AsLongLong(ndim) == 0;
  Py_DECREF(ndim);
  if (PyErr_Occurred()) PyErr_Clear();
  return zero ? 0 : 1;
}

// Converts one keyword value to the attribute's type; false with TypeError set for a wrong
// type, kreg.InvalidArgument for a value out of range (ints past int64, floats past
// double or not finite, strings with a NUL).
bool convert_attr(const OpState& s, const AttrSpec& spec, PyObject* v, kreg_attr* out) {
  out->type = spec.type;
  const bool is_bool = PyBool_Check(v);
  switch (spec.type) {
    case KREG_ATTR_FLOAT:
      if (PyFloat_Check(v)) {
        out->value.f = PyFloat_AS_DOUBLE(v);
      } else if (!is_bool && Py_TYPE(v)->tp_as_number != nullptr &&
                 (Py_TYPE(v)->tp_as_number->nb_float != nullptr || PyLong_Check(v))) {
        // ints, numpy scalars: anything with __float__ that is not a bool, a string or an
        // array (0-d arrays are scalars).
        const int array = PyLong_Check(v) ? 0 : is_nonscalar_array(v);
        if (array < 0) return false;
        if (array > 0) {
          PyErr_Format(PyExc_TypeError,
                       "%s(): attribute '%U' must be float, not %s (an array; pass a scalar)",
                       s.requested.c_str(), spec.name, Py_TYPE(v)->tp_name);
          return false;
        }
        out->value.f = PyFloat_AsDouble(v);
        if (out->value.f == -1.0 && PyErr_Occurred()) {
          if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return false;
          return attr_range_error(s, spec, "is too large for a float (a double: about 1.8e308)");
        }
      } else {
        break;
      }
      if (!std::isfinite(out->value.f)) {
        return attr_range_error(s, spec, "must be a finite float, not inf or nan");
      }
      return true;
    case KREG_ATTR_INT:
      if (!is_bool && (PyLong_Check(v) || PyIndex_Check(v))) {
        PyObject* i = PyNumber_Index(v);
        if (i == nullptr) return false;
        out->value.i = PyLong_AsLongLong(i);
        Py_DECREF(i);
        if (out->value.i == -1 && PyErr_Occurred()) {
          if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return false;
          return attr_range_error(
              s, spec, "is out of range [-9223372036854775808, 9223372036854775807] (int64)");
        }
        return true;
      }
      break;
    case KREG_ATTR_BOOL:
      if (is_bool) {
        out->value.i = v == Py_True ? 1 : 0;
        return true;
      }
      break;
    case KREG_ATTR_RESOURCE:
      // The core checks the type and that it is live on every call (with its message).
      if (is_resource(v)) {
        out->value.r = reinterpret_cast<ResourceObject*>(v)->pub;
        return true;
      }
      PyErr_Format(PyExc_TypeError, "%s(): %U must be a kreg.Resource of type %s, got %s",
                   s.requested.c_str(), spec.name, spec.resource_type.c_str(), Py_TYPE(v)->tp_name);
      return false;
    case KREG_ATTR_STRING:
      if (PyUnicode_Check(v)) {
        // The UTF-8 form is cached in the str object, which the caller keeps alive.
        Py_ssize_t n = 0;
        out->value.s = PyUnicode_AsUTF8AndSize(v, &n);
        if (out->value.s == nullptr) return false;
        // The kernel gets a C string: a NUL would silently cut the value short.
        if (std::strlen(out->value.s) != static_cast<size_t>(n)) {
          return attr_range_error(s, spec, "contains a NUL character");
        }
        return true;
      }
      break;
  }
  PyErr_Format(PyExc_TypeError, "%s(): attribute '%U' must be %s, not %s", s.requested.c_str(),
               spec.name, attr_type_name(spec.type), Py_TYPE(v)->tp_name);
  return false;
}

// The stream= keyword: None, an int handle, or an object with .cuda_stream.
bool parse_stream(PyObject* v, std::optional<int64_t>* out) {
  if (v == Py_None) return true;
  PyObject* num = nullptr;
  if (PyLong_Check(v) && !PyBool_Check(v)) {
    num = Py_NewRef(v);
  } else {
    num = PyObject_GetAttr(v, g_str_cuda_stream);
    if (num == nullptr || !PyLong_Check(num)) {
      PyErr_Clear();
      Py_XDECREF(num);
      PyErr_Format(PyExc_TypeError,
                   "stream= must be None, an int (cudaStream_t) or an object with an int "
                   ".cuda_stream, not %s",
                   Py_TYPE(v)->tp_name);
      return false;
    }
  }
  const long long s = PyLong_AsLongLong(num);
  Py_DECREF(num);
  if (s == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return false;
    PyErr_Clear();
    PyErr_SetString(PyExc_OverflowError,
                    "stream= is out of range for a cudaStream_t handle: it must fit in int64");
    return false;
  }
  *out = s;
  return true;
}

// The resources of one call, marked in use while it runs (reset() refuses them meanwhile:
// a CPU call runs with the GIL released, so another thread could try).
struct ResourcesInUse {
  ResourceObject* items[kMaxAttrs];  // the first n are set (no clearing on the fast path)
  int n = 0;
  void add(PyObject* r) { items[n++] = reinterpret_cast<ResourceObject*>(r); }
  void enter() const {
    for (int i = 0; i < n; ++i) ++items[i]->calls;
  }
  void leave() const {
    for (int i = 0; i < n; ++i) --items[i]->calls;
  }
};

// The capsules of one call; released (and with them the producers' tensors) at the end.
struct Capsules {
  PyObject* items[kMaxTensors] = {};
  int n = 0;
  ~Capsules() {
    for (int i = 0; i < n; ++i) Py_XDECREF(items[i]);
  }
};

bool is_cuda_like(int32_t device_type) {
  return device_type == kDLCUDA || device_type == kDLCUDAManaged || device_type == kDLROCM;
}

// __dlpack_device__() -> (device_type, device_id).
bool dlpack_device(const OpState& s, int index, PyObject* obj, DLDevice* dev) {
  PyObject* r = PyObject_CallMethodNoArgs(obj, g_str_dlpack_device);
  if (r == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "%s(): argument %d (%s) must be a tensor with __dlpack__ and "
                   "__dlpack_device__, not %s",
                   s.requested.c_str(), index + 1, s.tensor_names[index].c_str(),
                   Py_TYPE(obj)->tp_name);
    }
    return false;
  }
  int type = 0, id = 0;
  const bool ok = PyTuple_Check(r) && PyArg_ParseTuple(r, "ii", &type, &id);
  Py_DECREF(r);
  if (!ok) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_TypeError,
                   "%s(): argument %d (%s): __dlpack_device__() must return "
                   "(device_type, device_id)",
                   s.requested.c_str(), index + 1, s.tensor_names[index].c_str());
    }
    return false;
  }
  dev->device_type = static_cast<DLDeviceType>(type);
  dev->device_id = id;
  return true;
}

// The DLTensor inside a "dltensor" capsule (not consumed: the capsule keeps ownership and
// its destructor calls the producer's deleter when we drop it).
DLTensor* capsule_tensor(const OpState& s, int index, PyObject* capsule) {
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m == nullptr) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s(): argument %d (%s): __dlpack__() did not return an unconsumed "
                 "'dltensor' capsule",
                 s.requested.c_str(), index + 1, s.tensor_names[index].c_str());
    return nullptr;
  }
  return &m->dl_tensor;
}

// The generic export: obj.__dlpack__() for host memory, obj.__dlpack__(stream=S) for
// device memory (S is the stream we will run on; the producer orders its work before it).
PyObject* export_generic(const OpState& s, int index, PyObject* obj, const DLDevice& dev,
                         int64_t dl_stream) {
  PyObject* r;
  if (is_cuda_like(dev.device_type)) {
    PyObject* stream = PyLong_FromLongLong(dl_stream);
    if (stream == nullptr) return nullptr;
    PyObject* call_args[2] = {obj, stream};
    PyObject* kwnames = PyTuple_Pack(1, g_str_stream);
    r = kwnames ? PyObject_VectorcallMethod(g_str_dlpack, call_args,
                                            1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames)
                : nullptr;
    Py_XDECREF(kwnames);
    Py_DECREF(stream);
  } else {
    r = PyObject_CallMethodNoArgs(obj, g_str_dlpack);
  }
  if (r == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s(): argument %d (%s) must be a tensor with __dlpack__, not %s",
                 s.requested.c_str(), index + 1, s.tensor_names[index].c_str(),
                 Py_TYPE(obj)->tp_name);
  }
  return r;
}

PyObject* op_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* op = reinterpret_cast<OpObject*>(self);
  OpState& s = *op->state;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  // Positional: the tensors, then optionally the leading resources.
  const Py_ssize_t num_positional_attrs = nargs - s.num_tensors;
  if (num_positional_attrs != 0) [[unlikely]] {
    if (num_positional_attrs < 0 || num_positional_attrs > s.num_leading_resources) {
      if (s.num_leading_resources > 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes %d tensor%s (%s) and then up to %d resource%s (%s) as "
                     "positional arguments, got %zd",
                     s.requested.c_str(), s.num_tensors, s.num_tensors == 1 ? "" : "s",
                     s.tensor_list.c_str(), s.num_leading_resources,
                     s.num_leading_resources == 1 ? "" : "s", s.leading_resource_list.c_str(),
                     nargs);
      } else {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes %d tensor%s (%s) as positional arguments, got %zd",
                     s.requested.c_str(), s.num_tensors, s.num_tensors == 1 ? "" : "s",
                     s.tensor_list.c_str(), nargs);
      }
      return nullptr;
    }
  }

  // Keyword attributes over the defaults.
  const int num_attrs = static_cast<int>(s.attrs.size());
  kreg_attr attrs[kMaxAttrs];
  if (num_attrs > 0) std::memcpy(attrs, s.defaults, sizeof(kreg_attr) * num_attrs);
  std::optional<int64_t> user_stream;
  ResourcesInUse resources;
  if (kwnames != nullptr || num_positional_attrs > 0) {
    bool given[kMaxAttrs] = {};
    for (Py_ssize_t k = 0; k < num_positional_attrs; ++k) {
      if (!convert_attr(s, s.attrs[k], args[s.num_tensors + k], &attrs[k])) return nullptr;
      resources.add(args[s.num_tensors + k]);  // the leading attributes are resources
      given[k] = true;
    }
    const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, k);
      PyObject* value = args[nargs + k];
      int idx = -1;
      for (int a = 0; a < num_attrs && idx < 0; ++a) {
        if (s.attrs[a].name == name) idx = a;
      }
      for (int a = 0; a < num_attrs && idx < 0; ++a) {
        if (PyUnicode_Compare(s.attrs[a].name, name) == 0) idx = a;
      }
      if (idx < 0) {
        if (PyUnicode_Compare(name, g_str_stream) == 0) {
          if (!parse_stream(value, &user_stream)) return nullptr;
          continue;
        }
        std::string names;
        for (const AttrSpec& a : s.attrs) {
          names += (names.empty() ? "" : ", ") + std::string(PyUnicode_AsUTF8(a.name));
        }
        PyErr_Format(PyExc_TypeError,
                     "%s() got an unexpected keyword argument '%U' (attributes: %s; and stream)",
                     s.requested.c_str(), name, names.empty() ? "none" : names.c_str());
        return nullptr;
      }
      if (given[idx]) {
        PyErr_Format(PyExc_TypeError, "%s() got multiple values for '%U'", s.requested.c_str(),
                     name);
        return nullptr;
      }
      if (!convert_attr(s, s.attrs[idx], value, &attrs[idx])) return nullptr;
      if (s.has_resources && s.attrs[idx].type == KREG_ATTR_RESOURCE) resources.add(value);
      given[idx] = true;
    }
    for (int a = 0; a < num_attrs; ++a) {
      if (s.attrs[a].required && !given[a]) {
        PyErr_Format(PyExc_TypeError, "%s() missing required attribute '%U'", s.requested.c_str(),
                     s.attrs[a].name);
        return nullptr;
      }
    }
  } else {
    for (int a = 0; a < num_attrs; ++a) {
      if (s.attrs[a].required) {
        PyErr_Format(PyExc_TypeError, "%s() missing required attribute '%U'", s.requested.c_str(),
                     s.attrs[a].name);
        return nullptr;
      }
    }
  }

  // Tensors. The first one decides the device and with it the stream.
  Capsules caps;
  DLTensor* tensors[kMaxTensors];
  DLTensor views[kMaxTensors];  // filled by exchange APIs; valid until we return
  const TorchHooks* torch = torch_hooks();
  // The fast paths skip the producer's stream ordering, which is only right when we run
  // on the framework's current stream, i.e. with no stream= override.
  const bool fast = !user_stream.has_value();
  const bool torch_fast = fast && torch != nullptr && torch->to_dlpack != nullptr;
  auto torch_export = [&](int i) -> bool {
    if (!torch_fast ||
        !PyObject_TypeCheck(args[i], reinterpret_cast<PyTypeObject*>(torch->tensor_type))) {
      return false;
    }
    PyObject* cap = PyObject_CallOneArg(torch->to_dlpack, args[i]);
    if (cap == nullptr) {
      // A tensor the exporter refuses (a subclass, a torch version we do not know): the
      // DLPack protocol decides, and reports its own error.
      PyErr_Clear();
      return false;
    }
    caps.items[caps.n++] = cap;
    tensors[i] = capsule_tensor(s, i, cap);
    return true;
  };
  bool exported[kMaxTensors] = {};
  DLDevice dev0{kDLCPU, 0};
  const ExchangeApi* stream_api = nullptr;  // the first tensor's, when it was viewed by one
  bool any_view = false;                    // views are valid only while we hold the GIL
  if (s.num_tensors > 0) {
    if (fast && args[0] != Py_None && exchange_view(args[0], &views[0], &stream_api)) {
      tensors[0] = &views[0];
      exported[0] = true;
      any_view = true;
      dev0 = views[0].device;
    } else if (torch_export(0)) {
      if (tensors[0] == nullptr) return nullptr;
      exported[0] = true;
      dev0 = tensors[0]->device;
    } else if (!dlpack_device(s, 0, args[0], &dev0)) {
      return nullptr;
    }
  }
  int64_t stream = 0;  // 0: the legacy default stream
  if (user_stream) {
    stream = *user_stream;
  } else if (is_cuda_like(dev0.device_type)) {
    if (stream_api != nullptr) {
      void* current = nullptr;
      if (stream_api->current_work_stream(dev0.device_type, dev0.device_id, &current) != 0) {
        return nullptr;
      }
      stream = reinterpret_cast<intptr_t>(current);
    } else if (torch != nullptr) {
      stream = torch_current_stream(*torch, dev0.device_id);
      if (stream == -1 && PyErr_Occurred()) return nullptr;
    }
  }
  // DLPack's stream argument: 1 is the legacy default stream, 0 is not allowed; 1 and 2
  // (per-thread default) are also the CUDA runtime's handles for those streams.
  const int64_t dl_stream = stream == 0 ? 1 : stream;
  for (int i = 0; i < s.num_tensors; ++i) {
    if (exported[i]) continue;
    PyObject* obj = args[i];
    if (obj == Py_None) {
      // An omitted optional tensor ('Tensor?'): the core checks that this one may be null.
      tensors[i] = nullptr;
      continue;
    }
    const ExchangeApi* unused = nullptr;
    if (fast && exchange_view(obj, &views[i], &unused)) {
      tensors[i] = &views[i];
      any_view = true;
      continue;
    }
    if (torch_export(i)) {
      if (tensors[i] == nullptr) return nullptr;
      continue;
    }
    DLDevice dev;
    if (!dlpack_device(s, i, obj, &dev)) return nullptr;
    PyObject* cap = export_generic(s, i, obj, dev, dl_stream);
    if (cap == nullptr) return nullptr;
    caps.items[caps.n++] = cap;
    tensors[i] = capsule_tensor(s, i, cap);
    if (tensors[i] == nullptr) return nullptr;
  }

  // Resolve once per (device, dtype of the first tensor); the handle's own check covers
  // everything else on every call.
  const std::span<DLTensor* const> tspan(tensors, static_cast<size_t>(s.num_tensors));
  const std::span<const kreg_attr> aspan(attrs, static_cast<size_t>(num_attrs));
  uint64_t dev_word = 0;
  uint32_t dtype_word = 0;
  if (s.num_tensors > 0) {
    dev_word = detail::device_word(tensors[0]->device);
    dtype_word = detail::pack_dtype(tensors[0]->dtype);
  }
  const ResolveOptions options{s.backend};
  if (!s.cached || s.cached_device != dev_word || s.cached_dtype != dtype_word) {
    auto h = op->registry->resolve(s.requested, tspan, options);
    if (!h) return raise_status(h.status());
    s.handle = *h;
    s.cached = true;
    s.cached_device = dev_word;
    s.cached_dtype = dtype_word;
    s.num_alternates = 0;
  } else if (s.handle.specialized() && !s.handle.accepts_tensors(tspan)) {
    // A jit specialization for other extents: one seen before, else a new resolve.
    int found = -1;
    for (int i = 0; i < s.num_alternates && found < 0; ++i) {
      if (s.alternates[i].accepts_tensors(tspan)) found = i;
    }
    if (found >= 0) {
      std::swap(s.handle, s.alternates[found]);
    } else {
      auto h = op->registry->resolve(s.requested, tspan, options);
      if (!h) return raise_status(h.status());
      if (s.num_alternates < OpState::kMaxAlternates) {
        s.alternates[s.num_alternates++] = s.handle;
      } else {
        s.alternates[s.next_alternate] = s.handle;
        s.next_alternate = (s.next_alternate + 1) % OpState::kMaxAlternates;
      }
      s.handle = *h;
    }
  }
  KernelHandle handle = s.handle;
  void* stream_ptr = reinterpret_cast<void*>(static_cast<intptr_t>(stream));
  // Tensors from torch on a CUDA device: scratch memory from torch's caching allocator.
  const kreg_host_services* services = nullptr;
  if (torch != nullptr && s.num_tensors > 0 && tensors[0]->device.device_type == kDLCUDA) {
    for (int i = 0; i < s.num_tensors && services == nullptr; ++i) {
      if (PyObject_TypeCheck(args[i], reinterpret_cast<PyTypeObject*>(torch->tensor_type))) {
        services = &kTorchServices;
      }
    }
  }
  // Launch flags (kreg.set_pdl) only for device calls: CPU kernels have none to honour.
  const uint64_t flags =
      s.num_tensors > 0 && tensors[0]->device.device_type == kDLCUDA ? g_launch_flags : 0;
  const CallOptions call_options{stream_ptr, services, flags};
  // Only calls that pass resources pay for marking them (n is 0 for every other op).
  struct Leave {
    const ResourcesInUse& r;
    ~Leave() {
      if (r.n > 0) [[unlikely]]
        r.leave();
    }
  } leave{resources};
  if (resources.n > 0) [[unlikely]]
    resources.enter();
  Status st;
  if (s.num_tensors > 0 && tensors[0]->device.device_type == kDLCPU && !any_view) {
    // CPU kernels run synchronously and may take a while: let other threads run. Not
    // with exchange-API views: another thread could resize a tensor they do not own.
    Py_BEGIN_ALLOW_THREADS st = handle.call(tspan, aspan, stream_ptr);
    Py_END_ALLOW_THREADS
  } else {
    st = handle.call(tspan, aspan, call_options);
  }
  if (!st.ok()) [[unlikely]] {
    if (st.code() != KREG_INVALID_ARGUMENT) return raise_status(st);
    // Another implementation for the same device and dtype may take these arguments
    // (shape-specialised kernels): resolve again against them.
    auto h = op->registry->resolve(s.requested, tspan, options);
    if (!h || &h->spec() == &handle.spec()) return raise_status(st);
    s.handle = *h;
    handle = *h;
    st = handle.call(tspan, aspan, call_options);
    if (!st.ok()) return raise_status(st);
  }
  Py_RETURN_NONE;
}

void op_dealloc(PyObject* self) {
  auto* op = reinterpret_cast<OpObject*>(self);
  if (op->state != nullptr) {
    for (AttrSpec& a : op->state->attrs) Py_XDECREF(a.name);
    delete op->state;
  }
  Py_XDECREF(op->owner);
  Py_TYPE(self)->tp_free(self);
}

PyObject* op_repr(PyObject* self) {
  const OpState& s = *reinterpret_cast<OpObject*>(self)->state;
  std::string text = "<kreg.Op " + s.requested;
  if (s.id != s.requested) text += " -> " + s.id;
  if (s.backend) text += " backend=" + *s.backend;
  if (s.cached) text += " [" + s.handle.backend() + "]";
  return PyUnicode_FromString((text + ">").c_str());
}

PyObject* op_get_id(PyObject* self, void*) {
  return PyUnicode_FromString(reinterpret_cast<OpObject*>(self)->state->id.c_str());
}

// The backend the last call resolved to, or None before the first call.
PyObject* op_get_resolved(PyObject* self, void*) {
  const OpState& s = *reinterpret_cast<OpObject*>(self)->state;
  if (!s.cached) Py_RETURN_NONE;
  return PyUnicode_FromString(s.handle.backend().c_str());
}

PyObject* op_get_signature(PyObject* self, void*) {
  auto* op = reinterpret_cast<OpObject*>(self);
  const auto impls = op->registry->implementations(op->state->id);
  if (impls.empty()) Py_RETURN_NONE;
  return PyUnicode_FromString(impls.front()->signature.text.c_str());
}

PyGetSetDef g_op_getset[] = {
    {"id", op_get_id, nullptr, "The op id (an alias resolved to the op it names).", nullptr},
    {"resolved_backend", op_get_resolved, nullptr,
     "The backend the last call ran on (None before the first call).", nullptr},
    {"signature", op_get_signature, nullptr, "The op's schema string.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

const char* code_name(kreg_status_code c) { return status_code_name(c); }

}  // namespace

Exceptions& exceptions() { return g_exceptions; }

PyObject* raise_status(const Status& status) {
  PyObject* type = g_exceptions.error;
  if (status.code() == KREG_INVALID_ARGUMENT || status.code() == KREG_OUT_OF_RANGE) {
    type = g_exceptions.invalid_argument;
  } else if (status.code() == KREG_NOT_FOUND) {
    type = g_exceptions.not_found;
  }
  PyObject* exc = PyObject_CallFunction(type, "s", status.message().c_str());
  if (exc == nullptr) return nullptr;
  PyObject* code = PyUnicode_FromString(code_name(status.code()));
  if (code == nullptr || PyObject_SetAttrString(exc, "code", code) < 0) {
    Py_XDECREF(code);
    Py_DECREF(exc);
    return nullptr;
  }
  Py_DECREF(code);
  PyErr_SetObject(type, exc);
  Py_DECREF(exc);
  return nullptr;
}

void set_launch_flags(uint64_t flags) { g_launch_flags = flags; }
uint64_t launch_flags() { return g_launch_flags; }

int init_op_module(PyObject* module) {
  g_str_torch = PyUnicode_InternFromString("torch");
  g_str_stream = PyUnicode_InternFromString("stream");
  g_str_dlpack = PyUnicode_InternFromString("__dlpack__");
  g_str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
  g_str_cuda_stream = PyUnicode_InternFromString("cuda_stream");
  g_str_ndim = PyUnicode_InternFromString("ndim");
  if (!g_str_torch || !g_str_stream || !g_str_dlpack || !g_str_dlpack_device ||
      !g_str_cuda_stream || !g_str_ndim) {
    return -1;
  }

  g_exceptions.error = PyErr_NewExceptionWithDoc(
      "kreg.Error", "An error from the kreg core; .code is its status code name.",
      PyExc_RuntimeError, nullptr);
  if (g_exceptions.error == nullptr) return -1;
  PyObject* bases = PyTuple_Pack(2, g_exceptions.error, PyExc_ValueError);
  g_exceptions.invalid_argument = PyErr_NewExceptionWithDoc(
      "kreg.InvalidArgument", "Arguments the op does not accept (dtype, shape, device, ...).",
      bases, nullptr);
  Py_XDECREF(bases);
  bases = PyTuple_Pack(2, g_exceptions.error, PyExc_LookupError);
  g_exceptions.not_found = PyErr_NewExceptionWithDoc(
      "kreg.NotFound", "An unknown op, group or backend.", bases, nullptr);
  Py_XDECREF(bases);
  if (g_exceptions.invalid_argument == nullptr || g_exceptions.not_found == nullptr) return -1;
  if (PyModule_AddObjectRef(module, "Error", g_exceptions.error) < 0 ||
      PyModule_AddObjectRef(module, "InvalidArgument", g_exceptions.invalid_argument) < 0 ||
      PyModule_AddObjectRef(module, "NotFound", g_exceptions.not_found) < 0) {
    return -1;
  }

  g_op_type.tp_name = "kreg.Op";
  g_op_type.tp_doc =
      "A callable kreg op: op(*tensors, stream=None, **attributes). Tensors are any objects "
      "with __dlpack__, positional in signature order; attributes are keywords.";
  g_op_type.tp_basicsize = sizeof(OpObject);
  g_op_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  g_op_type.tp_vectorcall_offset = offsetof(OpObject, vectorcall);
  g_op_type.tp_call = PyVectorcall_Call;
  g_op_type.tp_dealloc = op_dealloc;
  g_op_type.tp_repr = op_repr;
  g_op_type.tp_getset = g_op_getset;
  if (PyType_Ready(&g_op_type) < 0) return -1;
  return PyModule_AddObjectRef(module, "Op", reinterpret_cast<PyObject*>(&g_op_type));
}

PyObject* make_op(PyObject* owner, Registry* registry, const std::string& requested,
                  const std::optional<std::string>& backend) {
  std::string id = requested;
  // An alias chain leads to its op, as in every other lookup (Registry::resolve_alias).
  if (auto chain = registry->resolve_alias(requested)) id = chain->op();
  auto impls = registry->implementations(id);
  if (impls.empty()) {
    // A lazy group loads on its first resolve: try one, then look again.
    (void)registry->resolve(requested, Target{});
    impls = registry->implementations(id);
  }
  if (impls.empty()) {
    auto h = registry->resolve(requested, Target{});
    return raise_status(h ? Status(KREG_NOT_FOUND, "unknown op '" + excerpt(requested) + "'")
                          : h.status());
  }
  if (backend) {
    bool found = false;
    for (const KernelSpec* k : impls) found = found || k->backend == *backend;
    if (!found) {
      std::string have;
      for (const KernelSpec* k : impls) have += (have.empty() ? "" : ", ") + k->backend;
      return raise_status(Status(KREG_NOT_FOUND, "op '" + id + "' has no '" + excerpt(*backend) +
                                                     "' implementation (it has: " + have + ")"));
    }
  }
  const Signature& sig = impls.front()->signature;
  auto state = std::make_unique<OpState>();
  state->requested = requested;
  state->id = id;
  state->backend = backend;
  state->num_tensors = sig.num_tensors;
  state->attrs.reserve(static_cast<size_t>(sig.num_attrs));
  for (const Param& p : sig.params) {
    if (p.is_tensor()) {
      state->tensor_names.push_back(p.name);
      state->tensor_list += (state->tensor_list.empty() ? "" : ", ") + p.name;
    }
  }
  bool failed = false;
  for (int a = 0; a < sig.num_attrs; ++a) {
    const Param& p = sig.attr(a);
    AttrSpec spec;
    spec.name = PyUnicode_InternFromString(p.name.c_str());
    failed = failed || spec.name == nullptr;
    spec.type = p.kind == ArgKind::kInt        ? KREG_ATTR_INT
                : p.kind == ArgKind::kFloat    ? KREG_ATTR_FLOAT
                : p.kind == ArgKind::kBool     ? KREG_ATTR_BOOL
                : p.kind == ArgKind::kResource ? KREG_ATTR_RESOURCE
                                               : KREG_ATTR_STRING;
    spec.required = !p.has_default;
    spec.default_string = p.default_text;
    spec.resource_type = p.resource_type;
    if (p.kind == ArgKind::kResource) {
      state->has_resources = true;
      if (state->num_leading_resources == a) {
        ++state->num_leading_resources;
        state->leading_resource_list += (a == 0 ? "" : ", ") + p.name;
      }
    }
    state->attrs.push_back(std::move(spec));
  }
  // Pointers into default_string are taken only once the vector stops growing.
  for (int a = 0; a < sig.num_attrs; ++a) {
    const Param& p = sig.attr(a);
    kreg_attr& d = state->defaults[a];
    d = p.default_value;
    d.type = state->attrs[a].type;
    if (d.type == KREG_ATTR_STRING) d.value.s = state->attrs[a].default_string.c_str();
  }
  auto* op = PyObject_New(OpObject, &g_op_type);
  if (op == nullptr || failed) {
    for (AttrSpec& a : state->attrs) Py_XDECREF(a.name);
    if (op != nullptr) {
      op->state = nullptr;
      op->owner = nullptr;
      Py_DECREF(op);
    }
    return nullptr;
  }
  op->vectorcall = op_vectorcall;
  op->owner = Py_NewRef(owner);
  op->registry = registry;
  op->state = state.release();
  return reinterpret_cast<PyObject*>(op);
}

}  // namespace kreg::python
