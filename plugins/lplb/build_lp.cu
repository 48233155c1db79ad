// CUDA build_lp for the lplb group: the LP of lplb.hpp written element by element.
//
// Launch shape: one thread per element of A, then of b and c (grid-stride, enough
// blocks to cover the H200's SMs); each element is computed from the topology and
// written once, so A needs no separate zero fill. An expert row's element checks the
// expert's C replica ids (a few cached loads). Ids outside [0, R) act as padding and a
// replica whose GPU is outside [0, num_gpus) is on no GPU: the CPU reference refuses both.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL), as every lplb kernel: the next kernel
// may be scheduled at once, and this one waits (griddepcontrol.wait) before it touches
// global memory, since the kernel before it may still read A, b, c or write the topology.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "args.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/dtype.hpp"
#include "lplb.hpp"

namespace kreg::lplb {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 132 * 8;

template <typename Count>
__global__ void __launch_bounds__(kBlock)
    build_lp_kernel(const Count* __restrict__ counts, const int32_t* __restrict__ log2phy,
                    const int32_t* __restrict__ phy2gpu, float* __restrict__ a,
                    float* __restrict__ b, float* __restrict__ c, int64_t L, int64_t C, int64_t R,
                    int64_t G) {
  device::pdl_launch_dependents();
  device::pdl_wait();
  const int64_t m = L + G, n = R + 1 + G;
  const int64_t total = m * n + m + n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += step) {
    if (e < m * n) {
      const int64_t i = e / n, j = e % n;
      float v = 0.0f;
      if (i < L) {
        if (j < R) {
          for (int64_t k = 0; k < C; ++k) v = log2phy[i * C + k] == j ? 1.0f : v;
        }
      } else {
        const int64_t g = i - L;
        if (j < R) {
          v = phy2gpu[j] == g ? 1.0f : 0.0f;
        } else if (j == R) {
          v = -1.0f;
        } else {
          v = j == R + 1 + g ? 1.0f : 0.0f;
        }
      }
      a[e] = v;
    } else if (e < m * n + m) {
      const int64_t i = e - m * n;
      // Through double, as the CPU reference converts.
      b[i] = i < L ? static_cast<float>(static_cast<double>(counts[i])) : 0.0f;
    } else {
      const int64_t j = e - m * n - m;
      c[j] = j == R ? 1.0f : 0.0f;
    }
  }
}

}  // namespace

KernelStatus build_lp_cuda(Context& ctx, const DLTensor& counts, const DLTensor& log2phy,
                           const DLTensor& phy2gpu, DLTensor& out_a, DLTensor& out_b,
                           DLTensor& out_c, int64_t num_gpus) {
  const char* const kOp = ctx.op();
  if (KernelStatus st = check_build_lp(ctx, counts, phy2gpu, out_a, num_gpus); !st.ok()) return st;
  const int64_t L = counts.shape[0], C = log2phy.shape[1], R = phy2gpu.shape[0], G = num_gpus;
  const int64_t total = (L + G) * (R + 1 + G) + (L + G) + (R + 1 + G);
  const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, (total + kBlock - 1) / kBlock));
  const device::DeviceGuard guard(counts);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_dtype<int32_t, int64_t, float>(ctx, kOp, counts, [&](auto tag) {
    using Count = decltype(tag);
    const cudaError_t err =
        device::launch(build_lp_kernel<Count>, dim3(blocks), dim3(kBlock), 0, stream, ctx.pdl(),
                       data_ptr<const Count>(counts), data_ptr<const int32_t>(log2phy),
                       data_ptr<const int32_t>(phy2gpu), data_ptr<float>(out_a),
                       data_ptr<float>(out_b), data_ptr<float>(out_c), L, C, R, G);
    return device::launch_status(ctx, kOp, err);
  });
}

}  // namespace kreg::lplb
