// The harness shared by the kreg CLI, the host application and the tests: owning tensor
// buffers on the CPU or a CUDA device, example inputs built from an op's signature,
// comparison of an implementation against the CPU reference, and CUDA-event timing.
// Built with CUDA support when the toolkit exists; without it only CPU tensors work.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kreg/registry.hpp"

namespace kreg::harness {

// True when this build has CUDA support and a CUDA device is present.
bool gpu_available();
std::string gpu_name();

// An owning, contiguous tensor on the CPU (kDLCPU), a CUDA device (kDLCUDA) or in
// page-locked host memory (kDLCUDAHost: cudaHostAlloc; read and written directly, like
// CPU memory, and accessible to CUDA kernels).
class Buffer {
 public:
  // Refuses negative extents, sizes past int64 and (above 64 MB) sizes past the device's
  // free memory before allocating.
  static Result<Buffer> make(DLDevice device, DType dtype, std::vector<int64_t> shape);
  Buffer() = default;
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  ~Buffer();

  DLTensor* tensor() { return &t_; }
  const DLTensor* tensor() const { return &t_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t bytes() const;
  bool on_gpu() const { return t_.device.device_type == kDLCUDA; }  // else host-addressable

  // Host-side values as doubles (copied back from the device when needed).
  Result<std::vector<double>> to_doubles() const;
  // Sets the contents from doubles (rounded to the dtype), copying to the device as needed.
  Status from_doubles(const std::vector<double>& values);
  Status copy_from(const Buffer& other);  // same dtype and size; any devices
  // Random non-zero values: floats uniform in +-[0.05, 2]; integers in [0, 16).
  Status fill_random(std::mt19937_64& rng);
  // NaN for floats (0x7f.. bytes for integers): unwritten outputs show up in comparisons.
  Status poison();

 private:
  void release();
  DLTensor t_{};
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
};

// "T=64,H=4096" -> {T:64, H:4096}. Strict: NAME=SIZE items, names identifiers, each
// given once, sizes whole decimal integers in [0, INT64_MAX] (kreg/parse_number.hpp).
// Messages name `flag`, the option the text came from.
using SymbolMap = std::map<std::string, int64_t>;
Result<SymbolMap> parse_shape_spec(const std::string& text, const std::string& flag = "--shape");

// Every name in `symbols` is a dimension of the op's signature and every dimension has a
// size; the error names the stray or missing dimension and lists the op's.
Status check_shape_names(const KernelSpec& spec, const SymbolMap& symbols);

// One buffer per tensor parameter of `spec`, shaped from `symbols`: inputs random,
// write-only outputs poisoned. Tensors without an explicit dtype take `dtype`. An optional
// tensor without a named shape ('Tensor?' with no [...]: nothing to size it from) is left
// absent, passed as null, as a caller omitting it would; a required one is an error. Every
// extent (coef * size) and byte count is overflow-checked and the total compared with the
// device's free memory (memory.hpp) before anything is allocated; errors name the tensor,
// its dimensions and the limit.
struct ExampleArgs {
  std::vector<Buffer> buffers;     // the built tensors only, in signature order
  std::vector<DLTensor*> tensors;  // one per tensor parameter, in signature order; null: absent
  // The buffer behind tensor parameter `n` (its position among the signature's tensors),
  // null when that tensor is absent or there is no such tensor. Walk parameters with this,
  // never buffers[n]: an absent tensor has no buffer, so the two do not line up.
  Buffer* buffer(size_t n);
  const Buffer* buffer(size_t n) const;
};

// True for a tensor parameter make_example leaves absent: optional and rank-free.
bool left_absent(const Param& p);
// The names of `spec`'s tensors make_example leaves absent, in signature order (for a
// report to say what was not passed).
std::vector<std::string> absent_tensors(const KernelSpec& spec);

Result<ExampleArgs> make_example(const KernelSpec& spec, const SymbolMap& symbols, DType dtype,
                                 DLDevice device, uint64_t seed);
// A copy on `device`: every buffer copied, absent tensors absent.
Result<ExampleArgs> copy_example(const ExampleArgs& src, DLDevice device);

// The checks make_example (with_reference false) or check_against_reference (true: the
// host copies, the reference's and the comparison's memory too) make before allocating,
// alone: overflow-checked sizes and free memory. Nothing is allocated.
Status check_example_fits(const KernelSpec& spec, const SymbolMap& symbols, DType dtype,
                          DLDevice device, bool with_reference);

// Bytes a call moves at minimum: each read tensor once, each written tensor once (an
// absent tensor moves none).
size_t bytes_moved(const KernelSpec& spec, const ExampleArgs& args);

struct Tolerance {
  double atol;
  double rtol;
};
Tolerance tolerance_for(DType dtype);

struct Comparison {
  std::string tensor;
  double max_abs = 0;
  double max_rel = 0;
  size_t mismatches = 0;
  size_t count = 0;
  bool ok() const { return mismatches == 0; }
};

// Runs `handle` on example inputs and the op's CPU reference on copies of the same
// inputs, then compares every written tensor that is not absent. Synchronizes the device.
Result<std::vector<Comparison>> check_against_reference(Registry& registry,
                                                        const KernelHandle& handle,
                                                        const SymbolMap& symbols, DType dtype,
                                                        const AttrList& attrs, uint64_t seed);

// Element-wise comparison of two tensors' values under a tolerance.
Comparison compare_values(const std::string& name, const std::vector<double>& got,
                          const std::vector<double>& want, Tolerance tol);

struct Timing {
  double median_us = 0;
  double min_us = 0;
  size_t bytes = 0;
  double gbps = 0;  // bytes / median
  int buffer_sets = 0;
  bool graph = false;
};

// CUDA-event timing of `handle` on a CUDA device: rotating buffer sets whose total exceeds
// twice the L2, warm-up, `reps` timed calls, median. Small calls (under ~20 us) are timed
// as CUDA-graph replays of many calls back to back, each behind the one before it as in a
// model step. `launch_flags` go into every call (KREG_LAUNCH_PDL: programmatic dependent
// launch, for kernels that honour it).
// The kernel a timed op follows in a chain (kreg bench --after): each timed call is the
// producer's call, then the op's, both on the timing stream, as a model step runs them.
// Its inputs are built from its own signature and `symbols` and rotate with the op's sets;
// it gets the chain's KREG_LAUNCH_PDL bit (not the op's other flags).
struct Producer {
  const KernelHandle* handle = nullptr;
  SymbolMap symbols;
  DType dtype = DType::kBF16;
  const AttrList* attrs = nullptr;
};

Result<Timing> time_on_gpu(const KernelHandle& handle, const SymbolMap& symbols, DType dtype,
                           const AttrList& attrs, int reps, uint64_t seed,
                           uint64_t launch_flags = 0, const Producer* before = nullptr);

// CUDA-graph timing shared by time_on_gpu and the demos: `calls` calls of `call(i)`
// (i = 0..calls-1, each enqueuing its work on `stream`, a cudaStream_t) captured as one
// graph, one untimed replay, then `reps` replays between CUDA events; per call, in us. A
// failed call, capture or replay ends the capture it began, frees what it made and comes
// back as the error.
struct ReplayTiming {
  double median_us = 0;
  double min_us = 0;
};
Result<ReplayTiming> time_graph_replays(void* stream, int calls, int reps,
                                        const std::function<Status(int)>& call);

// Device-to-device copy bandwidth (bytes read + written per second), cudaMemcpyAsync of
// `bytes`, median of several runs.
Result<double> copy_bandwidth_gbps(size_t bytes);

// Synchronizes the current device (no-op without CUDA).
Status device_synchronize();

}  // namespace kreg::harness
