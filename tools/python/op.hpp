// kreg.Op: a callable handle for one op, written against the CPython C API (not pybind11)
// because its call is the hot path: vectorcall, no argument tuple or dict, tensors taken
// through DLPack, the implementation resolved once per (device, dtype) and cached.
#pragma once

#include <Python.h>

#include <optional>
#include <string>

#include "kreg/registry.hpp"

namespace kreg::python {

// The exception classes (created by the module at import): kreg.Error (RuntimeError),
// kreg.InvalidArgument (Error, ValueError) and kreg.NotFound (Error, LookupError).
struct Exceptions {
  PyObject* error = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
};
Exceptions& exceptions();
// Creates the exception classes and the Op type and adds them to `module`. -1 on error.
int init_op_module(PyObject* module);

// Sets the Python exception for a failed Status (the class follows the code; the instance
// carries `code`, e.g. "INVALID_ARGUMENT") and returns nullptr.
PyObject* raise_status(const Status& status);

// The launch flags (KREG_LAUNCH_*) every CUDA call of a kreg.Op passes (kreg.set_pdl).
void set_launch_flags(uint64_t flags);
uint64_t launch_flags();

// A new kreg.Op for `requested` (an op id or alias) on `registry`, owned by the Python
// object `owner` (kept alive by the Op). `backend` forces a backend ("cpu", "cuda").
// nullptr with an exception set when the op is unknown.
PyObject* make_op(PyObject* owner, Registry* registry, const std::string& requested,
                  const std::optional<std::string>& backend);

}  // namespace kreg::python
