// CUDA replica_probabilities and dispatch for the lplb group. Both run the arithmetic of
// replica_math.hpp, which the CPU references share, so results are bitwise identical.
//
// replica_probabilities: one thread per expert (a few hundred): its C replica ids, C
// gathers from x, C stores. dispatch: one thread per (token, slot), grid-stride; the
// expert's row of probabilities and ids (C values each) is read through the cache, the
// tables being tiny (L x C) and shared by every token.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL): both let the next kernel be scheduled
// at once and wait (griddepcontrol.wait) before their first global access: x and status
// come from solve, probs from replica_probabilities, topk_ids from the router.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/dtype.hpp"
#include "lplb.hpp"
#include "replica_math.hpp"

namespace kreg::lplb {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 132 * 16;

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (items + kBlock - 1) / kBlock)));
}

template <typename Count>
__global__ void __launch_bounds__(kBlock)
    probabilities_kernel(const Count* __restrict__ counts, const int32_t* __restrict__ log2phy,
                         const float* __restrict__ x, const float* __restrict__ status,
                         float* __restrict__ probs, int64_t L, int64_t C, int64_t n_x) {
  device::pdl_launch_dependents();
  device::pdl_wait();
  const bool converged = status[kStatusConverged] == 1.0f;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t l = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; l < L; l += step) {
    expert_probabilities(log2phy + l * C, C, x, n_x,
                         converged && static_cast<double>(counts[l]) > 0, probs + l * C);
  }
}

__global__ void __launch_bounds__(kBlock)
    dispatch_kernel(const int32_t* __restrict__ topk_ids, const float* __restrict__ probs,
                    const int32_t* __restrict__ log2phy, const float* __restrict__ u,
                    int32_t* __restrict__ out, int64_t slots, int64_t L, int64_t C) {
  device::pdl_launch_dependents();
  device::pdl_wait();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < slots;
       i += step) {
    const int32_t e = topk_ids[i];
    out[i] = e >= 0 && e < L ? pick_replica(log2phy + e * C, probs + e * C, C, u[i]) : -1;
  }
}

}  // namespace

KernelStatus replica_probabilities_cuda(Context& ctx, const DLTensor& counts,
                                        const DLTensor& log2phy, const DLTensor& x,
                                        const DLTensor& status, DLTensor& out_probs) {
  const char* const kOp = ctx.op();
  const int64_t L = log2phy.shape[0], C = log2phy.shape[1];
  if (L == 0 || C == 0) return kOk;
  const device::DeviceGuard guard(counts);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_dtype<int32_t, int64_t, float>(ctx, kOp, counts, [&](auto tag) {
    using Count = decltype(tag);
    const cudaError_t err = device::launch(
        probabilities_kernel<Count>, dim3(blocks_for(L)), dim3(kBlock), 0, stream, ctx.pdl(),
        data_ptr<const Count>(counts), data_ptr<const int32_t>(log2phy), data_ptr<const float>(x),
        data_ptr<const float>(status), data_ptr<float>(out_probs), L, C, x.shape[0]);
    return device::launch_status(ctx, kOp, err);
  });
}

KernelStatus dispatch_cuda(Context& ctx, const DLTensor& topk_ids, const DLTensor& probs,
                           const DLTensor& log2phy, const DLTensor& u, DLTensor& out_phy_ids) {
  const char* const kOp = ctx.op();
  const int64_t slots = numel(topk_ids), L = log2phy.shape[0], C = log2phy.shape[1];
  if (slots == 0) return kOk;
  const device::DeviceGuard guard(topk_ids);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const cudaError_t err = device::launch(
      dispatch_kernel, dim3(blocks_for(slots)), dim3(kBlock), 0,
      static_cast<cudaStream_t>(ctx.stream()), ctx.pdl(), data_ptr<const int32_t>(topk_ids),
      data_ptr<const float>(probs), data_ptr<const int32_t>(log2phy), data_ptr<const float>(u),
      data_ptr<int32_t>(out_phy_ids), slots, L, C);
  return device::launch_status(ctx, kOp, err);
}

}  // namespace kreg::lplb
