// CUDA concat_mla_k: k[t, h] = concat(k_nope[t, h] (128), k_rope[t, 0] (64)), a pure copy.
//
// Launch shape: flat, one thread per 16-byte vector of the output (kVec elements), 256
// threads a block. Vector i of the output is column c = i % (192 / kVec) of row i / (192 /
// kVec) = t * H + h: the first 128 / kVec columns come from k_nope's row, the rest from the
// token's k_rope row (re-read by every head from L1/L2). Loads and stores take the default
// cache policy: evict-first hints on k_nope and k were 0.5% slower at T = 8192 H = 128 (H100,
// 228.9 -> 227.7 us without them; docs/performance.md, "Thirteenth round"). A row a block
// row (24 threads of 8 heads, grid (T, H / 8)) ran 177.4 us at T = 8192 H = 128 bf16 on the
// H200 against 170.4 flat (torch.compile: 166.0; scratch benchmark, 2026-12-02): the flat
// grid keeps every warp's 32 stores on contiguous bytes. Indices are 32-bit: calls of 2^31
// vectors or more are cut into several launches of whole tokens.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL, device::launch; every launch of a cut
// call too): a thread waits (griddepcontrol.wait) before its one load, since k_nope and
// k_rope may be the previous kernel's output, and lets the next kernel be scheduled right
// after it, as act_and_mul does; threads past the end return before the wait.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kNope = 128;
constexpr int kRope = 64;
constexpr int kRow = kNope + kRope;
constexpr int kBlockThreads = 256;
constexpr int64_t kMaxVecsPerLaunch = INT32_MAX;

template <typename T, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    concat_mla_k_kernel(const T* __restrict__ k_nope, const T* __restrict__ k_rope,
                        T* __restrict__ out, FastDivisor heads, uint32_t total) {
  constexpr uint32_t kRowVecs = kRow / kVec;
  constexpr uint32_t kNopeVecs = kNope / kVec;
  const uint32_t i = blockIdx.x * kBlockThreads + threadIdx.x;
  if (i >= total) return;
  const uint32_t row = i / kRowVecs;  // t * H + h, local to this launch
  const uint32_t c = i - row * kRowVecs;
  vec_t<T, kVec> v;
  device::pdl_wait();
  if (c < kNopeVecs) {
    v.load(k_nope + static_cast<int64_t>(row) * kNope + c * kVec);
  } else {
    const uint32_t t = heads.div(row);
    v.load(k_rope + static_cast<int64_t>(t) * kRope + (c - kNopeVecs) * kVec);
  }
  device::pdl_launch_dependents();
  v.store(out + static_cast<int64_t>(i) * kVec);
}

template <typename T, int kVec>
cudaError_t launch(const T* k_nope, const T* k_rope, T* out, int64_t tokens, int64_t heads,
                   cudaStream_t stream, bool pdl) {
  const int64_t token_vecs = heads * (kRow / kVec);
  const int64_t tokens_per_launch = std::max<int64_t>(1, kMaxVecsPerLaunch / token_vecs);
  const FastDivisor head_div(static_cast<uint32_t>(heads));
  for (int64_t t = 0; t < tokens; t += tokens_per_launch) {
    const int64_t n = std::min(tokens_per_launch, tokens - t);
    const auto total = static_cast<uint32_t>(n * token_vecs);
    const auto blocks = static_cast<unsigned>((total + kBlockThreads - 1) / kBlockThreads);
    const cudaError_t err = device::launch(
        concat_mla_k_kernel<T, kVec>, dim3(blocks), dim3(kBlockThreads), 0, stream, pdl,
        k_nope + t * heads * kNope, k_rope + t * kRope, out + t * heads * kRow, head_div, total);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

KernelStatus concat_mla_k_cuda(Context& ctx, const DLTensor& k_nope, const DLTensor& k_rope,
                               DLTensor& out) {
  const char* op = ctx.op();
  const int64_t tokens = out.shape[0];
  const int64_t heads = out.shape[1];
  if (tokens == 0 || heads == 0) return kOk;
  if (tokens > INT32_MAX || heads > 65535) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: T = %lld, H = %lld is too large (T < 2^31, H < 2^16)", op,
                    static_cast<long long>(tokens), static_cast<long long>(heads));
  }
  const device::DeviceGuard guard(k_nope);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const bool pdl = ctx.pdl();
  return device::visit_float_dtype(ctx, op, out, [&](auto tag) {
    using T = decltype(tag);
    const T* nope = data_ptr<const T>(k_nope);
    const T* rope = data_ptr<const T>(k_rope);
    T* o = data_ptr<T>(out);
    // Every row length (128, 64, 192) is a multiple of 64 elements: the pointers decide.
    const int vec_elems = device::max_vec_elems<T>(kRope, nope, rope, o);
    const cudaError_t err = device::visit_vec_elems<T>(vec_elems, [&](auto vec) {
      return launch<T, decltype(vec)::value>(nope, rope, o, tokens, heads, stream, pdl);
    });
    return device::launch_status(ctx, op, err);
  });
}

}  // namespace kreg::attention
