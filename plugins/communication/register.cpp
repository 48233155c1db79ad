// The communication group (issue 18, docs/ops/communication.md): collectives over a
// `communication.comm` resource (comm.hpp). Two implementations of every op: "cpu" (CPU
// tensors, through the bootstrap store: slow, for machines without GPUs and for tests
// across processes) and "nccl" (CUDA tensors, NCCL on the call's stream). A world of one
// rank needs no NCCL communicator: tools create such a comm by default.
#include "comm.hpp"

namespace kreg::communication {
namespace {

KernelStatus create(Context& ctx, void** state, int64_t rank, int64_t world_size,
                    std::string_view store, int64_t device, std::string_view name,
                    double timeout_s) {
  std::string error;
  Comm* c = create_comm(rank, world_size, store, device, name, timeout_s, &error);
  if (c == nullptr) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "communication.comm: %s", error.c_str());
  }
  *state = c;
  return kOk;
}

void destroy(void* state) { destroy_comm(static_cast<Comm*>(state)); }

// The ops take the comm as a resource; the transports take the Comm.
template <KernelStatus (*F)(Context&, DLTensor&, Comm&, std::string_view)>
KernelStatus all_reduce(Context& ctx, DLTensor& x, ResourceRef comm, std::string_view op) {
  return F(ctx, x, comm.state<Comm>(), op);
}
template <KernelStatus (*F)(Context&, const DLTensor&, DLTensor&, Comm&)>
KernelStatus all_gather(Context& ctx, const DLTensor& x, DLTensor& out, ResourceRef comm) {
  return F(ctx, x, out, comm.state<Comm>());
}
template <KernelStatus (*F)(Context&, const DLTensor&, DLTensor&, Comm&, std::string_view)>
KernelStatus reduce_scatter(Context& ctx, const DLTensor& x, DLTensor& out, ResourceRef comm,
                            std::string_view op) {
  return F(ctx, x, out, comm.state<Comm>(), op);
}
template <KernelStatus (*F)(Context&, DLTensor&, DLTensor&, const DLTensor&, Comm&, double)>
KernelStatus add_rmsnorm(Context& ctx, DLTensor& x, DLTensor& residual, const DLTensor& weight,
                         ResourceRef comm, double eps) {
  return F(ctx, x, residual, weight, comm.state<Comm>(), eps);
}

constexpr uint32_t kTraits = KREG_TRAIT_GRAPH_SAFE;  // NCCL captures; results may depend
                                                     // on NCCL's algorithm choice

constexpr Op kOps[] = {
    {.signature = "all_reduce(Tensor(a!) x, Resource<communication.comm> comm, str op=\"sum\") -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "x = the reduction (sum, prod, max, min, avg) of every rank's x, in place",
     .traits = kTraits,
     .impls = {cpu(bind<&all_reduce<&all_reduce_cpu>>, "cpu_collectives.cpp"),
               KREG_IF_CUDA(nccl(bind<&all_reduce<&all_reduce_nccl>>, "nccl_collectives.cu"))}},
    {.signature = "all_gather(Tensor x, Tensor(a!) out, Resource<communication.comm> comm) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "out = every rank's x, in rank order (out holds world_size times x)",
     .traits = kTraits,
     .impls = {cpu(bind<&all_gather<&all_gather_cpu>>, "cpu_collectives.cpp"),
               KREG_IF_CUDA(nccl(bind<&all_gather<&all_gather_nccl>>, "nccl_collectives.cu"))}},
    {.signature = "reduce_scatter(Tensor x, Tensor(a!) out, Resource<communication.comm> comm, "
                  "str op=\"sum\") -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "out = block `rank` of the reduction of every rank's x (x holds world_size "
                    "times out)",
     .traits = kTraits,
     .impls = {cpu(bind<&reduce_scatter<&reduce_scatter_cpu>>, "cpu_collectives.cpp"),
               KREG_IF_CUDA(nccl(bind<&reduce_scatter<&reduce_scatter_nccl>>,
                                 "nccl_collectives.cu"))}},
    {.signature = "all_reduce_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, "
                  "Tensor[H] weight, Resource<communication.comm> comm, float eps=1e-6) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "the tensor-parallel block's tail: x = sum over ranks, then "
                    "layernorm.fused_add_rmsnorm (residual += x; x = rmsnorm(residual) * weight)",
     .traits = kTraits,
     .impls = {cpu(bind<&add_rmsnorm<&all_reduce_add_rmsnorm_cpu>>, "cpu_collectives.cpp"),
               KREG_IF_CUDA(nccl(bind<&add_rmsnorm<&all_reduce_add_rmsnorm_nccl>>,
                                 "nccl_collectives.cu"))}},
};

constexpr ResourceType kResources[] = {
    {.type = "communication.comm",
     .signature = "comm(int rank=0, int world_size=1, str store=\"\", int device=-1, "
                  "str name=\"default\", float timeout_s=60.0) -> ()",
     .description = "one rank of a communicator: the ranks meet through `store` "
                    "(tcp://HOST:PORT or file:///dir; not needed for world_size 1); device >= 0 "
                    "makes an NCCL communicator on that CUDA device (rank 0's NCCL id travels "
                    "through the store), device -1 a host-only one (CPU tensors)",
     .create = bind_create<&create>,
     .destroy = &destroy},
};

}  // namespace
}  // namespace kreg::communication

KREG_GROUP_WITH_RESOURCES("communication", kreg::communication::kOps,
                          kreg::communication::kResources, nullptr, nullptr)
