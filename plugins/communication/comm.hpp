// The communication group's state and collectives (issue 18; docs/design/resources.md).
//
// A Comm is one rank's membership in a group of world_size ranks: the bootstrap store the
// ranks share (plugins/communication/store), and, when it was created for a CUDA device,
// an NCCL communicator. It is the state of a `communication.comm` resource
// (register.cpp): create_comm / destroy_comm are the resource type's create and destroy.
//
// Two transports serve the ops:
// - CPU (cpu_collectives.cpp): CPU tensors, through the store. Every rank publishes its
//   bytes under "<name>/<seq>/<rank>", reads all the others', and computes the result
//   from the ranks' bytes in rank order, so all ranks get bitwise the same result. Slow
//   (every byte goes through the store) but correct on machines without GPUs. A rank
//   whose own arguments are wrong still publishes (an error record), so that the others
//   fail at once with its message instead of timing out, and the ranks' sequence numbers
//   stay in step.
// - NCCL (nccl_collectives.cu): CUDA tensors on the comm's device, on the call's stream,
//   graph-capturable, no host synchronisation.
//
// Ranks must call the collectives of one comm in the same order (as with NCCL). A store
// shared by runs should see a fresh comm name per run: a run that dies mid-call leaves its
// keys behind.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "kreg/plugin.hpp"
#include "store/store.hpp"

namespace kreg::communication {

inline constexpr int64_t kMaxWorldSize = 4096;
inline constexpr double kMaxTimeoutSeconds = 3600.0;
inline constexpr size_t kMaxCommNameBytes = 200;

struct Nccl;

struct Comm {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t device = -1;  // the CUDA device of the NCCL communicator; -1: host only
  std::string name;
  double timeout_s = 0;
  std::unique_ptr<comm::Store> store;  // null only when world_size == 1 and no store was given
  const Nccl* nccl = nullptr;          // set with nccl_comm
  void* nccl_comm = nullptr;           // ncclComm_t, when device >= 0

  // The CPU transport: one collective at a time per comm, numbered in call order.
  std::mutex mutex;
  uint64_t seq = 0;
  // Set when a CPU collective failed in the store (a timeout, a lost connection): the
  // ranks may no longer agree on the sequence, so later calls are refused with it.
  std::string broken;

  // "rank 1 of 2" for messages.
  std::string where() const;
};

// Validates the arguments (0 <= rank < world_size <= 4096; device -1 or a CUDA device;
// a store URL when world_size > 1; timeout_s in (0, 3600]; name 1..200 bytes of
// [A-Za-z0-9._:/-]), connects the store and, for world_size > 1, meets the other ranks
// there: rank 0 waits for every rank's "<name>/join/<r>", then publishes
// "<name>/join/ready" (with the NCCL unique id when device >= 0), which the others wait
// for; all check that they agree on world_size and the device mode. With device >= 0:
// NCCL (nccl()) and CUDA are needed; cudaSetDevice(device), then ncclCommInitRank.
// Null + *error naming the rank and the step on failure ("rank 1 of 2: waiting for rank
// 0's NCCL id in tcp://127.0.0.1:29500: timed out after 5.0 s").
Comm* create_comm(int64_t rank, int64_t world_size, std::string_view store_url, int64_t device,
                  std::string_view name, double timeout_s, std::string* error);

// Destroys the NCCL communicator (aborts it after an asynchronous error) and closes the
// store. Safe on null and on a partly built comm.
void destroy_comm(Comm* comm);

enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
// "sum", "prod", "max", "min", "avg"; nullopt otherwise.
std::optional<ReduceOp> parse_reduce_op(std::string_view op);
const char* reduce_op_name(ReduceOp op);

// ---- CPU transport (cpu_collectives.cpp) ----
// Contiguous CPU tensors of one dtype (f32, f16 or bf16). Reductions are computed in fp32
// over the ranks in rank order and rounded once to the dtype (avg: the fp32 sum divided by
// world_size). max/min of NaN are not specified.

// x = reduce(x over ranks), in place.
KernelStatus all_reduce_cpu(Context& ctx, DLTensor& x, Comm& comm, std::string_view op);
// out (world_size * numel(x) elements) = the ranks' x in rank order.
KernelStatus all_gather_cpu(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm);
// x holds world_size * numel(out) elements; rank r gets block r of reduce(x over ranks).
KernelStatus reduce_scatter_cpu(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm,
                                std::string_view op);
// x [T, H] = all_reduce_sum(x) (rounded to the dtype), then exactly
// layernorm.fused_add_rmsnorm: s = x + residual in fp32, residual = s rounded,
// x = s * rsqrt(mean(s^2) + eps) * weight rounded (the norm of the unrounded fp32 sum).
KernelStatus all_reduce_add_rmsnorm_cpu(Context& ctx, DLTensor& x, DLTensor& residual,
                                        const DLTensor& weight, Comm& comm, double eps);

#if defined(KREG_PLUGIN_HAS_CUDA)
// ---- NCCL transport (nccl_collectives.cu) ----
// CUDA tensors on the comm's device, enqueued on ctx.stream(); no host synchronisation, so
// they can be captured in a CUDA graph. The same contracts as the CPU versions, except
// that NCCL's reductions of 16-bit types round as NCCL does (per step of its algorithm).
KernelStatus all_reduce_nccl(Context& ctx, DLTensor& x, Comm& comm, std::string_view op);
KernelStatus all_gather_nccl(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm);
KernelStatus reduce_scatter_nccl(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm,
                                 std::string_view op);
// ncclAllReduce(sum) in place, then one kernel: residual = x + residual, x = rmsnorm.
KernelStatus all_reduce_add_rmsnorm_nccl(Context& ctx, DLTensor& x, DLTensor& residual,
                                         const DLTensor& weight, Comm& comm, double eps);
#endif

// ---- Shared by both transports ----
namespace detail {
// Row-major compact (strides null, or each dimension of extent > 1 with the compact stride).
bool is_contiguous(const DLTensor& t);
}  // namespace detail

}  // namespace kreg::communication
