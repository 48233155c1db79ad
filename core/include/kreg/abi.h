/* kreg plugin ABI: the only thing that crosses a plugin's shared-object boundary.
 *
 * Versioning contract
 * -------------------
 * - A MAJOR change (KREG_ABI_MAJOR) removes, retypes or reorders a field of any struct
 *   below, or changes the meaning of a value. The core refuses a plugin whose major
 *   differs from its own, with a message naming both.
 * - A MINOR change (KREG_ABI_MINOR) only appends fields at the end of a struct, or adds
 *   a meaning an older peer refuses cleanly (1.1: optional tensors, arg kind 'O'). Every
 *   struct starts with `struct_size`; a reader uses a field only when
 *   `struct_size >= offsetof(field) + sizeof(field)` (see KREG_STRUCT_HAS), so a newer
 *   core reads an older plugin and the reverse.
 * - The first three fields of kreg_plugin_desc (struct_size, abi_major, abi_minor) never
 *   move, in any major, so that any core can tell any plugin what is wrong with it.
 *
 * Rules for the boundary
 * ----------------------
 * Only C types cross it: no C++ exceptions, STL types or RTTI. Every pointer a plugin
 * hands out (strings, tables, the descriptor) is owned by the plugin and stays valid
 * while the library is loaded; the core copies what it must keep longer. Those pointers
 * must point into the library's own static storage (string literals, constant tables,
 * globals: what KREG_PLUGIN produces), and function pointers into its code: the core
 * checks each against the library's loaded segments before reading through it, and
 * refuses a descriptor, table or string elsewhere (the heap, another library). Strings
 * are NUL-terminated within bounds the core names (kreg/plugin_library.hpp). An array of
 * structs (the kernel table) has the stride of its first record's struct_size, the same
 * for every record. The entry symbol must be an exported function (STT_FUNC).
 * Tensors are DLPack `DLTensor`s (dlpack/dlpack.h); the core checks every call against
 * the kernel's signature before the kernel runs, so a kernel may trust the frame.
 */
#ifndef KREG_ABI_H_
#define KREG_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KREG_ABI_MAJOR 1
#define KREG_ABI_MINOR 1

/* The one symbol every plugin exports (a function returning its descriptor). */
#define KREG_PLUGIN_ENTRY_SYMBOL "kreg_plugin_entry"

#define KREG_STRUCT_HAS(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Status codes: the abseil / gRPC canonical set. */
typedef enum kreg_status_code {
  KREG_OK = 0,
  KREG_CANCELLED = 1,
  KREG_UNKNOWN = 2,
  KREG_INVALID_ARGUMENT = 3,
  KREG_DEADLINE_EXCEEDED = 4,
  KREG_NOT_FOUND = 5,
  KREG_ALREADY_EXISTS = 6,
  KREG_PERMISSION_DENIED = 7,
  KREG_RESOURCE_EXHAUSTED = 8,
  KREG_FAILED_PRECONDITION = 9,
  KREG_ABORTED = 10,
  KREG_OUT_OF_RANGE = 11,
  KREG_UNIMPLEMENTED = 12,
  KREG_INTERNAL = 13,
  KREG_UNAVAILABLE = 14,
  KREG_DATA_LOSS = 15,
  KREG_UNAUTHENTICATED = 16
} kreg_status_code;

/* Where a callee writes a human-readable message. The buffer is owned by the caller;
 * the callee writes at most `capacity` bytes including the terminating NUL. */
typedef struct kreg_error {
  size_t struct_size;
  char* message;
  size_t capacity;
} kreg_error;

/* Attribute (non-tensor argument) types, as named in signatures. */
typedef enum kreg_attr_type {
  KREG_ATTR_INT = 1,   /* int64_t */
  KREG_ATTR_FLOAT = 2, /* double  */
  KREG_ATTR_BOOL = 3,  /* int64_t, 0 or 1 */
  KREG_ATTR_STRING = 4 /* const char*, NUL-terminated, owned by the caller */
} kreg_attr_type;

typedef struct kreg_attr {
  int32_t type; /* kreg_attr_type */
  int32_t reserved;
  union {
    int64_t i;
    double f;
    const char* s;
  } value;
} kreg_attr;

/* One call. Tensors and attributes appear in the order of the signature; every
 * attribute is present (the core fills in defaults). `stream` is the device stream the
 * kernel enqueues on (cudaStream_t for CUDA; NULL means the legacy default stream) and
 * is ignored by CPU kernels, which run synchronously. A tensor the signature marks
 * optional ('Tensor?', ABI 1.1) is NULL when the caller omitted it. */
typedef struct kreg_call_frame {
  size_t struct_size;
  DLTensor* const* tensors;
  int32_t num_tensors;
  int32_t num_attrs;
  const kreg_attr* attrs;
  void* stream;
} kreg_call_frame;

/* The one signature of every kernel. Returns KREG_OK or a code, with a message in err. */
typedef int32_t (*kreg_kernel_fn)(const kreg_call_frame* frame, kreg_error* err);

/* Execution traits (a bitset). */
enum {
  KREG_TRAIT_MUTATES = 1u << 0,      /* writes an input in place (see Tensor(a!)) */
  KREG_TRAIT_GRAPH_SAFE = 1u << 1,   /* safe to capture in a CUDA graph */
  KREG_TRAIT_DETERMINISTIC = 1u << 2 /* bitwise identical results run to run */
};

/* A device kind with an inclusive SM window, e.g. {kDLCUDA, 80, 90}. SM numbers are
 * major*10+minor. For kDLCPU both bounds are 0. An implementation lists an OR-set. */
typedef struct kreg_capability {
  int32_t device_type; /* DLDeviceType */
  int32_t sm_min;
  int32_t sm_max;
} kreg_capability;

/* One implementation of one op. */
typedef struct kreg_kernel_desc {
  size_t struct_size;
  const char* op;      /* "<group>.<name>", snake_case */
  const char* backend; /* provenance / runtime: "cpu", "cuda", ... */
  const kreg_capability* caps;
  uint32_t num_caps;
  uint32_t traits;       /* KREG_TRAIT_* */
  const char* signature; /* schema, e.g. "rmsnorm(Tensor[T,H] x, ...) -> ()" */
  const char* dtypes;    /* the set of the shared dtype variable, e.g. "bf16|f16|f32" */
  const char* arg_kinds; /* what the C++ binding decodes: 'T' tensor, 'i','f','b','s' */
  int32_t priority;      /* higher wins when several implementations fit */
  int32_t reserved;
  const char* description;
  const char* source_file;
  kreg_kernel_fn fn;
} kreg_kernel_desc;

typedef struct kreg_build_info {
  size_t struct_size;
  const char* compiler; /* e.g. "GNU 12.2.0" */
  int32_t cuda_version; /* CUDART_VERSION, e.g. 13000; 0 when built without CUDA */
  int32_t reserved;
  const char* cuda_archs; /* e.g. "80;90"; "" when built without CUDA */
} kreg_build_info;

typedef struct kreg_plugin_desc {
  size_t struct_size; /* these three fields never move */
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* group;   /* must equal the manifest's group name */
  const char* version; /* the plugin's own version, e.g. "0.1.0" */
  const kreg_build_info* build;
  const kreg_kernel_desc* kernels;
  uint32_t num_kernels;
  uint32_t reserved;
  /* Optional hooks. init runs once after the descriptor is accepted, before any kernel
   * is called; shutdown runs once before the library is unloaded. */
  int32_t (*init)(kreg_error* err);
  void (*shutdown)(void);
} kreg_plugin_desc;

typedef const kreg_plugin_desc* (*kreg_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KREG_ABI_H_ */
