/* kreg plugin ABI: the only thing that crosses a plugin's shared-object boundary.
 *
 * Versioning contract (what core/src/plugin_library.cpp does)
 * -----------------------------------------------------------
 * - A MAJOR change (KREG_ABI_MAJOR) removes, retypes or reorders a field of any struct
 *   below, changes a frozen struct, or changes the meaning of a value. The core refuses a
 *   plugin whose major differs from its own, with a message naming both versions.
 * - A MINOR change (KREG_ABI_MINOR) only appends fields at the end of a struct that
 *   starts with `struct_size`, or adds a meaning an older peer refuses cleanly (1.1:
 *   optional tensors; 1.2: the fields marked "ABI 1.2" below; 1.3: JIT implementations;
 *   1.4: resource types and resource arguments). Any minor
 * of the core's major is accepted, older or newer. Both directions work:
 *     * an older plugin in a newer core: the core copies min(struct_size, sizeof(its
 *       struct)) bytes of each struct into a zeroed one, reads a field only when the
 *       plugin's `struct_size >= offsetof(field) + sizeof(field)` (KREG_STRUCT_HAS) and
 *       uses the documented default otherwise. A struct shorter than ABI 1.0's is
 *       refused (the descriptor must reach `shutdown`, a kernel record `fn`); build info
 *       shorter than 1.0's is ignored as a whole;
 *     * a newer plugin in an older core: the core copies the first sizeof(its struct)
 *       bytes and never looks past them; a plugin fills the older fields too (the SDK
 *       fills `caps` and `capabilities` alike), so an older core sees a complete record.
 *       KREG_KERNEL_* flag bits the core does not know are ignored.
 * - Arrays of records are walked by the stride the PLUGIN declares: the first record's
 *   `struct_size`, the same for every record of that array (a newer minor's records are
 *   longer, an older one's shorter), a multiple of the struct's alignment, the whole
 *   array inside one readable segment of the library. Never by the reader's own sizeof.
 *   This holds for the kernel table and for the capability records of ABI 1.2. When a
 *   kernel record has capability records (num_capabilities > 0), a 1.2 core reads only
 *   them and never the frozen `caps`.
 * - Limits (kreg/plugin_library.hpp): any struct_size at most 4096 bytes, at most 4096
 *   kernels and 64 capability windows per kernel; a jit source and each of its (at most
 *   64) headers at most 1 MiB (kreg/jit.hpp).
 * - Structs without `struct_size` are FROZEN: kreg_attr, kreg_capability and
 *   kreg_jit_file. Each says why; changing one is a major change.
 * - The first three fields of kreg_plugin_desc (struct_size, abi_major, abi_minor) never
 *   move, in any major, so that any core can tell any plugin what is wrong with it.
 * - What the core hands a plugin (the call frame, the host services, the error buffer)
 *   follows the same rule in the other direction: a plugin reads a field only when the
 *   core's struct_size covers it (kreg::Context does this), so a 1.2 plugin runs in a
 *   1.1 core (no op id, no host services, no launch flags: their defaults apply).
 *
 * Rules for the boundary
 * ----------------------
 * Only C types cross it: no C++ exceptions, STL types or RTTI. Every pointer a plugin
 * hands out (strings, tables, the descriptor) is owned by the plugin and stays valid
 * while the library is loaded; the core copies what it must keep longer. Those pointers
 * must point into the library's own static storage (string literals, constant tables,
 * globals: what the SDK macros produce), and function pointers into its code: the core
 * checks each against the library's loaded segments before reading through it, and
 * refuses a descriptor, table or string elsewhere (the heap, another library). Strings
 * are NUL-terminated within bounds the core names (kreg/plugin_library.hpp). The entry
 * symbol must be an exported function (STT_FUNC).
 * Tensors are DLPack `DLTensor`s (dlpack/dlpack.h); the core checks every call against
 * the kernel's signature before the kernel runs, so a kernel may trust the frame.
 *
 * Metadata without running plugin code (ABI 1.2)
 * ----------------------------------------------
 * The SDK also writes the descriptor's content as data into the ELF section
 * KREG_METADATA_SECTION (format: kreg/plugin_metadata.hpp). The core reads it with its
 * own ELF reader, without dlopen, to list and describe lazy groups.
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
#define KREG_ABI_MINOR 4

/* The one symbol every plugin exports (a function returning its descriptor). */
#define KREG_PLUGIN_ENTRY_SYMBOL "kreg_plugin_entry"
/* The ELF section holding a plugin's registration metadata (ABI 1.2). */
#define KREG_METADATA_SECTION ".kreg_metadata"

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
  KREG_ATTR_INT = 1,    /* int64_t */
  KREG_ATTR_FLOAT = 2,  /* double  */
  KREG_ATTR_BOOL = 3,   /* int64_t, 0 or 1 */
  KREG_ATTR_STRING = 4, /* const char*, NUL-terminated, owned by the caller */
  /* ABI 1.4: a resource ('Resource<group.name>' in signatures), value.r. A core before
   * 1.4 refuses such a signature at load, so it never sends or receives one. */
  KREG_ATTR_RESOURCE = 5
} kreg_attr_type;

/* ABI 1.4: what a kernel receives for a 'Resource<group.name>' argument: a live resource
 * the core created with the type's `create` and checked (type, not destroyed) for this
 * call. Owned by the core; valid during the call. */
typedef struct kreg_resource {
  size_t struct_size;
  const char* type;    /* "<group>.<name>" */
  void* state;         /* what `create` returned */
  uint64_t id;         /* unique in its registry, never reused */
  uint64_t generation; /* of the group library whose `create` made it */
} kreg_resource;

/* FROZEN (no struct_size): one element of the call frame's attribute array, 16 bytes,
 * indexed by position on every call; a size field per attribute would cost every call
 * for nothing a minor version could use. Changing it is a major change. */
typedef struct kreg_attr {
  int32_t type; /* kreg_attr_type */
  int32_t reserved;
  union {
    int64_t i;
    double f;
    const char* s;
    const struct kreg_resource* r; /* ABI 1.4; a pointer, as s: the layout is unchanged */
  } value;
} kreg_attr;

/* What the host provides to kernels during a call (ABI 1.2). Every function may be NULL:
 * the SDK then falls back to its own default (kreg/device/workspace.cuh: cudaMallocAsync
 * and cudaFreeAsync on the call's stream). The Python extension passes torch's caching
 * allocator when the call's tensors are torch's. */
typedef struct kreg_host_services {
  size_t struct_size;
  void* self; /* the host's state, passed back to each function */
  /* Device memory of at least `bytes` on `device`, usable by work enqueued on `stream`
   * (the call's stream) from now on. Stream-ordered: it may be handed to later work on
   * that stream once freed. NULL, with a message in err, when it cannot be had. */
  void* (*workspace_alloc)(void* self, size_t bytes, DLDevice device, void* stream,
                           kreg_error* err);
  /* Returns memory from workspace_alloc, after the work using it was enqueued on `stream`. */
  void (*workspace_free)(void* self, void* ptr, size_t bytes, DLDevice device, void* stream);
} kreg_host_services;

/* Launch flags (a bitset in kreg_call_frame.launch_flags, ABI 1.2). A kernel that cannot
 * honour a flag ignores it. */
enum {
  /* The caller asks for programmatic dependent launch (sm90+): the kernel may start
   * before the previous kernel on the stream finishes and must wait for it
   * (griddepcontrol.wait) before reading its outputs. */
  KREG_LAUNCH_PDL = 1u << 0,
  /* With KREG_LAUNCH_PDL (ABI 1.4; ignored without it): the inputs an op documents as
   * stable (weights, tables, sequence lengths, a cache's older rows) were written before
   * the previous kernel on the stream started, so the kernel may read them before
   * griddepcontrol.wait and overlap those reads with the previous kernel's tail. The
   * caller promises it; a kernel that reads nothing early ignores the flag. */
  KREG_LAUNCH_STABLE_INPUTS = 1u << 1
};

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
  /* ABI 1.2. Defaults when a 1.1 core sends a shorter frame: "", NULL, 0. */
  const char* op;                     /* the op being called, "<group>.<name>" */
  const kreg_host_services* services; /* may be NULL */
  uint64_t launch_flags;              /* KREG_LAUNCH_* */
  /* ABI 1.3. For an implementation of backend "jit": the kernel compiled for this call's
   * specialization, a CUkernel (cuLibraryGetKernel) the plugin launches with
   * cuLaunchKernel(Ex) cast to CUfunction. NULL for every other backend. */
  const void* jit_kernel;
} kreg_call_frame;

/* The one signature of every kernel. Returns KREG_OK or a code, with a message in err. */
typedef int32_t (*kreg_kernel_fn)(const kreg_call_frame* frame, kreg_error* err);

/* Execution traits (a bitset). */
enum {
  KREG_TRAIT_MUTATES = 1u << 0,      /* writes an input in place (see Tensor(a!)) */
  KREG_TRAIT_GRAPH_SAFE = 1u << 1,   /* safe to capture in a CUDA graph */
  KREG_TRAIT_DETERMINISTIC = 1u << 2 /* bitwise identical results run to run */
};

/* FROZEN (no struct_size): ABI 1.0's capability record, 12 bytes, in arrays that a 1.0
 * reader walks by this size. Kept so that 1.0 and 1.1 cores read 1.2 plugins; ABI 1.2
 * readers use kreg_capability_record (below) when a kernel record has it.
 * A device kind with an inclusive SM window, e.g. {kDLCUDA, 80, 90}. SM numbers are
 * major*10+minor. For kDLCPU both bounds are 0. An implementation lists an OR-set. */
typedef struct kreg_capability {
  int32_t device_type; /* DLDeviceType */
  int32_t sm_min;
  int32_t sm_max;
} kreg_capability;

/* ABI 1.2: the same window as a record that can grow (walked by its struct_size). */
typedef struct kreg_capability_record {
  size_t struct_size;
  int32_t device_type; /* DLDeviceType */
  int32_t sm_min;      /* inclusive, major*10+minor; 0 for CPU */
  int32_t sm_max;
  int32_t reserved;
} kreg_capability_record;

/* Kernel record flags (kreg_kernel_desc.flags, ABI 1.2). */
enum {
  /* The CUDA capability windows were derived from the architectures the plugin was
   * compiled for (CMAKE_CUDA_ARCHITECTURES), not written by hand: the core narrows them
   * to the images the library's fatbinary really holds instead of refusing the claim. */
  KREG_KERNEL_CAPS_FROM_BUILD = 1u << 0
};

/* FROZEN (no struct_size): one in-memory file of a JIT source (ABI 1.3), two pointers in
 * arrays walked by this size; a header's name is what the source #includes. */
typedef struct kreg_jit_file {
  const char* name; /* e.g. "kreg_jit/prelude.cuh" */
  const char* text; /* the file's content, NUL-terminated */
} kreg_jit_file;

/* ABI 1.3: the CUDA source of an implementation of backend "jit", compiled by the core
 * with NVRTC for the device's exact architecture and the call's specialization (docs/
 * jit.md). `kernel` is the kernel's C++ name expression with one placeholder per entry of
 * `params`, e.g. "kreg_jit::rmsnorm<{H}, {dtype}>" with params "H,dtype": a dimension
 * symbol of the signature becomes its extent in the call, "dtype" the shared dtype's
 * name ("bf16", "f16", "f32"). The source may #include only `headers` (no include path is
 * given to NVRTC, so nothing outside them can be read). The record's `fn` is the
 * plugin's launcher: it reads kreg_call_frame.jit_kernel and launches it. */
typedef struct kreg_jit_desc {
  size_t struct_size;
  const char* source_name; /* e.g. "rmsnorm_jit.cu" (diagnostics, #line) */
  const char* source;
  const kreg_jit_file* headers;
  uint32_t num_headers;
  uint32_t reserved;
  const char* kernel;  /* name expression with {param} placeholders */
  const char* params;  /* comma-separated: dimension symbols and/or "dtype" */
  const char* options; /* extra NVRTC options, space-separated; may be "" */
} kreg_jit_desc;

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
  /* ABI 1.2. When num_capabilities > 0 these replace caps/num_caps (which a 1.2 plugin
   * fills too, for older cores). The array's stride is capabilities[0].struct_size. */
  const kreg_capability_record* capabilities;
  uint32_t num_capabilities;
  uint32_t flags; /* KREG_KERNEL_* */
  /* ABI 1.3: non-NULL exactly when backend is "jit". */
  const kreg_jit_desc* jit;
} kreg_kernel_desc;

/* ABI 1.4: a resource type: state that outlives a call (a communicator, registered
 * buffers), created and destroyed through the core (Registry::create_resource), passed
 * to ops whose signature takes 'Resource<type>'. `signature` declares the creation
 * parameters in the signature language, attributes only, e.g.
 * "comm(int rank, int world_size, str store=\"\") -> ()"; the type is "<group>.<name>".
 * `create` gets them positionally (defaults filled in) as the attrs of a call frame
 * with no tensors and frame->op = the type; it returns KREG_OK and *state, or a code
 * and a message. `destroy` frees a state `create` returned; the core calls the destroy of
 * the library generation that created it (that library stays loaded). */
typedef struct kreg_resource_type_desc {
  size_t struct_size;
  const char* type; /* "<group>.<name>" */
  const char* signature;
  const char* description;
  int32_t (*create)(const kreg_call_frame* params, void** state, kreg_error* err);
  void (*destroy)(void* state);
} kreg_resource_type_desc;

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
  /* ABI 1.4: resource types, walked by resource_types[0].struct_size. Defaults: none. */
  const kreg_resource_type_desc* resource_types;
  uint32_t num_resource_types;
  uint32_t reserved2;
} kreg_plugin_desc;

typedef const kreg_plugin_desc* (*kreg_plugin_entry_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KREG_ABI_H_ */
