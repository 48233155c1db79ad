// The DLPack C exchange API (DLPack >= 1.2): a table of C functions a tensor library
// publishes on its tensor type as `__dlpack_c_exchange_api__`, so that a consumer can view
// a tensor as a DLTensor and query the framework's current stream without going through
// Python (no capsule, no allocation, no reference counting). PyTorch >= 2.10 publishes it.
//
// Declared here rather than taken from <dlpack/dlpack.h> because the distributions' DLPack
// headers (Debian 12: 0.6) predate it; the layout is fixed by the DLPack ABI (a version
// header, then six function pointers) and checked against the version at run time.
#pragma once

#include <Python.h>
#include <dlpack/dlpack.h>

#include <cstdint>

namespace kreg::python {

struct ExchangeVersion {
  uint32_t major;
  uint32_t minor;
};

struct ExchangeApiHeader {
  ExchangeVersion version;
  ExchangeApiHeader* prev_api;  // an older table, for consumers of an older major version
};

// Only the two entries the call path uses are typed; the others keep their slots.
struct ExchangeApi {
  ExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  // Fills a caller-owned DLTensor that views `py_object` (shape and strides owned by the
  // producer) until control returns to Python. 0, or -1 with a Python exception set.
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  // The framework's current stream on a device (torch.cuda.current_stream()).
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

// The table `type` publishes (major version 1, with both entries above), or nullptr.
// Never raises: a missing or unusable table just means the generic __dlpack__ path.
inline const ExchangeApi* find_exchange_api(PyTypeObject* type) {
  PyObject* attr =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (attr == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const void* table = nullptr;
  if (PyCapsule_CheckExact(attr)) {
    table = PyCapsule_GetPointer(attr, "dlpack_exchange_api");
  } else if (PyLong_Check(attr)) {  // early producers published the address as an int
    table = PyLong_AsVoidPtr(attr);
  }
  Py_DECREF(attr);
  PyErr_Clear();
  // A newer major version links to the older tables it still supports.
  const auto* header = static_cast<const ExchangeApiHeader*>(table);
  while (header != nullptr && header->version.major > 1) header = header->prev_api;
  // 1.2 introduced the table with this layout.
  if (header == nullptr || header->version.major != 1 || header->version.minor < 2) return nullptr;
  const auto* api = reinterpret_cast<const ExchangeApi*>(header);
  if (api->dltensor_from_py_object_no_sync == nullptr || api->current_work_stream == nullptr) {
    return nullptr;
  }
  return api;
}

}  // namespace kreg::python
