// KernelSpec: the core's record of one implementation of one op, built from a plugin's
// kreg_kernel_desc (copied, so it outlives nothing it points into except `fn`).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/abi.h"
#include "kreg/dtype.hpp"
#include "kreg/jit.hpp"
#include "kreg/schema.hpp"
#include "kreg/status.hpp"

namespace kreg {

struct Capability {
  int32_t device_type = kDLCPU;  // DLDeviceType
  int32_t sm_min = 0;            // inclusive, major*10+minor; 0 for CPU
  int32_t sm_max = 0;
  std::string to_string() const;  // "cpu", "cuda sm75-sm121"
};

struct Provenance {
  std::string group;           // the plugin's group
  std::string plugin_version;  // the plugin's version
  std::string library;         // path of the shared object ("" when registered in-process)
  std::string source_file;     // the kernel's source file
  // The CUDA images the library holds (CudaImages::summary(), kreg/fatbin.hpp), for
  // selection reasons; "" when not read (CPU builds, in-process registrations).
  std::string cuda_images;
};

struct KernelSpec {
  std::string op;       // "<group>.<name>"
  std::string backend;  // "cpu", "cuda", ...
  std::vector<Capability> capabilities;
  Signature signature;
  DTypeMask dtypes = 0;  // the shared dtype variable's set
  uint32_t traits = 0;   // KREG_TRAIT_*
  int32_t priority = 0;
  uint32_t flags = 0;  // KREG_KERNEL_* (ABI 1.2): KREG_KERNEL_CAPS_FROM_BUILD
  std::string description;
  Provenance provenance;
  kreg_kernel_fn fn = nullptr;
  // Backend "jit" only (ABI 1.3): the CUDA source the core compiles (kreg/jit.hpp).
  std::shared_ptr<const JitSource> jit;

  std::string_view group() const { return std::string_view(op).substr(0, op.find('.')); }
  std::string_view name() const;
  int32_t device_type() const { return capabilities.empty() ? -1 : capabilities[0].device_type; }
  bool mutates() const { return traits & KREG_TRAIT_MUTATES; }
  bool graph_safe() const { return traits & KREG_TRAIT_GRAPH_SAFE; }
  bool deterministic() const { return traits & KREG_TRAIT_DETERMINISTIC; }
  std::string traits_string() const;  // "mutates,graph_safe,deterministic"
  std::string source() const;         // "libkreg_x.so (rmsnorm.cu)"

  // Same op, backend, capabilities, signature, dtypes and traits: re-registering it is a
  // no-op. Anything else under the same (op, backend) is a conflict.
  bool same_registration(const KernelSpec& other) const;
};

// Is `op` a well-formed op id: "<group>.<name>", both snake_case?
bool is_valid_op_id(std::string_view op);
// Is `sm` (major*10+minor) a real NVIDIA compute capability?
bool is_real_sm(int32_t sm);
std::string device_type_name(int32_t device_type);  // "cpu", "cuda", ...

// Builds and checks a KernelSpec from a plugin's descriptor: the op id, that the
// signature parses and agrees with the binding's arg_kinds, dtypes, capabilities (one
// device kind, min <= max), and the core's limits (at most kMaxTensors tensors ...).
// This form reads the frozen caps/num_caps array (ABI 1.0) through the record's pointer;
// the span form takes capabilities the caller has already read and bounded (PluginLibrary:
// the ABI 1.2 capability records when a record has them) and ignores caps/capabilities.
Result<KernelSpec> make_kernel_spec(const kreg_kernel_desc& desc, const Provenance& provenance);
Result<KernelSpec> make_kernel_spec(const kreg_kernel_desc& desc,
                                    std::span<const Capability> capabilities,
                                    const Provenance& provenance);

// kMaxTensors, kMaxAttrs, kMaxRank, kMaxSymbols: schema.hpp (the parser enforces them).

}  // namespace kreg
