// kreg.Resource: see py_resource.hpp.
#include "py_resource.hpp"

#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "kreg/text.hpp"
#include "op.hpp"

namespace kreg::python {

PyTypeObject g_resource_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

namespace {

ResourceObject* as_resource(PyObject* self) { return reinterpret_cast<ResourceObject*>(self); }

std::string describe(const ResourceObject& r) {
  return "resource " + std::to_string(r.id) + " (" + (r.pub ? r.pub->type : "?") + ")";
}

// Destroys the resource now. Runs with the GIL held throughout: no kreg.Op call can start
// meanwhile, and those running with the GIL released are counted in `calls`.
bool reset_resource(ResourceObject* r) {
  if (r->calls > 0) {
    raise_status(Status(KREG_FAILED_PRECONDITION,
                        describe(*r) + " is in use by a call running in another thread: reset() "
                                       "it after the call returns"));
    return false;
  }
  r->resource.reset();
  return true;
}

PyObject* resource_reset(PyObject* self, PyObject*) {
  if (!reset_resource(as_resource(self))) return nullptr;
  Py_RETURN_NONE;
}

PyObject* resource_enter(PyObject* self, PyObject*) { return Py_NewRef(self); }

PyObject* resource_exit(PyObject* self, PyObject*) {
  if (!reset_resource(as_resource(self))) return nullptr;
  Py_RETURN_FALSE;  // exceptions from the block propagate
}

PyObject* resource_get_id(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(as_resource(self)->id);
}

PyObject* resource_get_type(PyObject* self, void*) {
  const ResourceObject* r = as_resource(self);
  return PyUnicode_FromString(r->pub != nullptr ? r->pub->type : "");
}

PyObject* resource_get_generation(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(as_resource(self)->generation);
}

PyObject* resource_get_valid(PyObject* self, void*) {
  return PyBool_FromLong(as_resource(self)->resource.valid() ? 1 : 0);
}

PyObject* resource_repr(PyObject* self) {
  const ResourceObject* r = as_resource(self);
  const std::string text = "<kreg.Resource " + std::to_string(r->id) + " " +
                           (r->pub ? r->pub->type : "?") + " generation " +
                           std::to_string(r->generation) +
                           (r->resource.valid() ? "" : " destroyed") + ">";
  return PyUnicode_FromString(text.c_str());
}

int resource_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(as_resource(self)->owner);
  return 0;
}

int resource_clear(PyObject* self) {
  ResourceObject* r = as_resource(self);
  // Destroyed before the registry may go (the registry would destroy it too, but in
  // whatever order it tears down).
  r->resource.reset();
  Py_CLEAR(r->owner);
  return 0;
}

void resource_dealloc(PyObject* self) {
  ResourceObject* r = as_resource(self);
  PyObject_GC_UnTrack(self);
  r->resource.~Resource();  // destroys it if still live
  Py_CLEAR(r->owner);
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef g_resource_methods[] = {
    {"reset", resource_reset, METH_NOARGS,
     "Destroys the resource now (no-op if it is already destroyed). Later calls that pass it "
     "are refused as destroyed."},
    {"__enter__", resource_enter, METH_NOARGS, "Returns the resource."},
    {"__exit__", resource_exit, METH_VARARGS, "Destroys the resource (reset())."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef g_resource_getset[] = {
    {"id", resource_get_id, nullptr,
     "The registry-unique id (what kreg.torch's ops take for a Resource<...> parameter).", nullptr},
    {"type", resource_get_type, nullptr, "The resource type, e.g. 'communication.comm'.", nullptr},
    {"generation", resource_get_generation, nullptr,
     "The generation of the group library that created it (its code serves it).", nullptr},
    {"valid", resource_get_valid, nullptr, "Created and not yet destroyed.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

const char* kind_text(ArgKind k) {
  switch (k) {
    case ArgKind::kInt:
      return "int";
    case ArgKind::kFloat:
      return "float";
    case ArgKind::kBool:
      return "bool";
    case ArgKind::kString:
      return "str";
    default:
      return "?";
  }
}

// The creation parameters of `type` when its group is loaded (for type errors that name
// what was expected and what was given); nullopt otherwise, and the core's check decides.
std::optional<Signature> params_of(const Registry& registry, const std::string& type) {
  for (const ResourceTypeInfo& t : registry.resource_types()) {
    if (t.type != type) continue;
    auto sig = parse_signature(t.signature);
    if (sig) return std::move(sig).value();
  }
  return std::nullopt;
}

// One keyword value -> a NamedAttr value, by its Python type. false with an exception set.
bool convert_param(const std::string& type, const std::string& name, PyObject* v,
                   const Param* param, NamedAttr* out) {
  const std::string where = type + ": parameter '" + excerpt(name) + "'";
  std::optional<ArgKind> given;
  if (PyBool_Check(v)) {
    out->value = v == Py_True;
    given = ArgKind::kBool;
  } else if (PyLong_Check(v) || PyIndex_Check(v)) {
    PyObject* i = PyNumber_Index(v);
    if (i == nullptr) return false;
    const long long n = PyLong_AsLongLong(i);
    Py_DECREF(i);
    if (n == -1 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return false;
      PyErr_Clear();
      raise_status(Status(KREG_INVALID_ARGUMENT, where + " is out of range [-9223372036854775808, "
                                                         "9223372036854775807] (int64)"));
      return false;
    }
    out->value = static_cast<int64_t>(n);
    given = ArgKind::kInt;
  } else if (PyFloat_Check(v) ||
             (Py_TYPE(v)->tp_as_number != nullptr &&
              Py_TYPE(v)->tp_as_number->nb_float != nullptr && !PyUnicode_Check(v))) {
    const double d = PyFloat_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return false;
      PyErr_Clear();
      raise_status(Status(KREG_INVALID_ARGUMENT, where + " is too large for a float (a double)"));
      return false;
    }
    out->value = d;
    given = ArgKind::kFloat;
  } else if (PyUnicode_Check(v)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(v, &n);
    if (s == nullptr) return false;
    // Plugins get a C string: a NUL would silently cut the value short.
    if (std::memchr(s, '\0', static_cast<size_t>(n)) != nullptr) {
      raise_status(Status(KREG_INVALID_ARGUMENT, where + " contains a NUL character"));
      return false;
    }
    out->value = std::string(s, static_cast<size_t>(n));
    given = ArgKind::kString;
  }
  if (!given) {
    const std::string want = param ? kind_text(param->kind) : "an int, float, bool or str";
    PyErr_Format(PyExc_TypeError, "%s must be %s, got %s", where.c_str(), want.c_str(),
                 Py_TYPE(v)->tp_name);
    return false;
  }
  // An int where a float is wanted converts (as in the core); anything else must match.
  if (param != nullptr && param->kind != *given &&
      !(param->kind == ArgKind::kFloat && *given == ArgKind::kInt)) {
    PyErr_Format(PyExc_TypeError, "%s must be %s, got %s", where.c_str(), kind_text(param->kind),
                 Py_TYPE(v)->tp_name);
    return false;
  }
  return true;
}

}  // namespace

PyObject* create_resource(PyObject* owner, Registry* registry, const std::string& type,
                          PyObject* params) {
  if (type.find('\0') != std::string::npos) {
    return raise_status(
        Status(KREG_INVALID_ARGUMENT, "create_resource(): the type contains a NUL character"));
  }
  const std::optional<Signature> sig = params_of(*registry, type);
  std::vector<NamedAttr> named;
  if (params != nullptr) {
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(params, &pos, &key, &value)) {
      Py_ssize_t n = 0;
      const char* k = PyUnicode_AsUTF8AndSize(key, &n);
      if (k == nullptr) return nullptr;
      NamedAttr na;
      na.name.assign(k, static_cast<size_t>(n));
      if (na.name.find('\0') != std::string::npos) {
        return raise_status(
            Status(KREG_INVALID_ARGUMENT, type + ": a parameter name contains a NUL character"));
      }
      const Param* p = sig ? sig->find(na.name) : nullptr;
      if (!convert_param(type, na.name, value, p, &na)) return nullptr;
      named.push_back(std::move(na));
    }
  }
  Result<Resource> r = Status(KREG_INTERNAL, "unset");
  // A create may wait for other ranks (the bootstrap): let other threads run.
  Py_BEGIN_ALLOW_THREADS r = registry->create_resource(type, named);
  Py_END_ALLOW_THREADS if (!r) return raise_status(r.status());
  ResourceObject* obj = PyObject_GC_New(ResourceObject, &g_resource_type);
  if (obj == nullptr) return nullptr;  // r's destructor destroys the resource
  new (&obj->resource) Resource(std::move(r).value());
  obj->owner = Py_NewRef(owner);
  obj->pub = obj->resource.get();
  obj->id = obj->resource.id();
  obj->generation = obj->resource.generation();
  obj->calls = 0;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(obj));
  return reinterpret_cast<PyObject*>(obj);
}

int init_resource_type(PyObject* module) {
  g_resource_type.tp_name = "kreg.Resource";
  g_resource_type.tp_doc =
      "A resource (state that outlives a call, such as a communicator) created by "
      "kreg.Registry.create_resource. Ops take it for their Resource<...> parameters. "
      "Destroyed by reset(), at the end of a with block, or when it is garbage collected; "
      "it keeps its registry alive.";
  g_resource_type.tp_basicsize = sizeof(ResourceObject);
  g_resource_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  g_resource_type.tp_dealloc = resource_dealloc;
  g_resource_type.tp_traverse = resource_traverse;
  g_resource_type.tp_clear = resource_clear;
  g_resource_type.tp_repr = resource_repr;
  g_resource_type.tp_methods = g_resource_methods;
  g_resource_type.tp_getset = g_resource_getset;
  if (PyType_Ready(&g_resource_type) < 0) return -1;
  return PyModule_AddObjectRef(module, "Resource", reinterpret_cast<PyObject*>(&g_resource_type));
}

}  // namespace kreg::python
