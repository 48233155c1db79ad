// kreg.Resource: a Python handle on one resource (kreg/resource.hpp) that a registry
// created (kreg.Registry.create_resource). Written against the CPython C API, like
// kreg.Op, because op calls read it on their call path: a type check and one load.
#pragma once

#include <Python.h>

#include <string>
#include <vector>

#include "kreg/registry.hpp"

namespace kreg::python {

struct ResourceObject {
  PyObject_HEAD PyObject* owner;  // the Python registry object: the Registry must outlive it
  Resource resource;              // owning; empty after reset()
  // The registry's record, kept after reset() (the registry keeps every slot for its life),
  // so that a call with a destroyed resource is refused as "destroyed", not as "null".
  const kreg_resource* pub;
  uint64_t id;
  uint64_t generation;
  // kreg.Op calls that pass this resource and run with the GIL released: reset() refuses
  // to destroy it under them (a destroyed state would be read after free).
  int calls;
};

extern PyTypeObject g_resource_type;

inline bool is_resource(PyObject* o) { return Py_IS_TYPE(o, &g_resource_type); }

// Creates the Resource type and adds it to `module`. -1 on error.
int init_resource_type(PyObject* module);

// A new kreg.Resource of `type` on `registry` (owned by `owner`), the parameters from a
// dict of keyword arguments (may be null). nullptr with an exception set on failure.
PyObject* create_resource(PyObject* owner, Registry* registry, const std::string& type,
                          PyObject* params);

}  // namespace kreg::python
