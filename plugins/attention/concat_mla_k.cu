// CUDA concat_mla_k: k[t, h] = concat(k_nope[t, h] (128), k_rope[t, 0] (64)), a pure copy.
//
// Launch shape: a block row of 192 / kVec threads copies one output row of 192 elements,
// one 16-byte vector per thread (the first 128 / kVec threads from k_nope, the rest from
// the token's k_rope row, which every head of the token re-reads from L1/L2); kVec rows
// (heads) per block, so blocks are 192 threads. Grid: (T, ceil(H / kVec)). k_nope and k
// are touched once (evict-first hints); k_rope is read with the default policy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention {
namespace {

using device::vec_t;

constexpr int kNope = 128;
constexpr int kRope = 64;
constexpr int kRow = kNope + kRope;

template <typename T, int kVec>
__global__ void __launch_bounds__(kRow)
    concat_mla_k_kernel(const T* __restrict__ k_nope, const T* __restrict__ k_rope,
                        T* __restrict__ out, int heads) {
  constexpr int kNopeVecs = kNope / kVec;
  const int c = static_cast<int>(threadIdx.x);  // vector within the row, < kRow / kVec
  const int h = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
  if (h >= heads) return;
  const int64_t t = blockIdx.x;
  const int64_t row = t * heads + h;
  vec_t<T, kVec> v;
  if (c < kNopeVecs) {
    v.load_stream(k_nope + row * kNope + c * kVec);
  } else {
    v.load(k_rope + t * kRope + (c - kNopeVecs) * kVec);
  }
  v.store_stream(out + row * kRow + c * kVec);
}

template <typename T, int kVec>
cudaError_t launch(const T* k_nope, const T* k_rope, T* out, int64_t tokens, int64_t heads,
                   cudaStream_t stream) {
  const int rows_per_block = static_cast<int>(std::min<int64_t>(kVec, heads));
  const dim3 block(kRow / kVec, static_cast<unsigned>(rows_per_block));
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((heads + rows_per_block - 1) / rows_per_block));
  concat_mla_k_kernel<T, kVec>
      <<<grid, block, 0, stream>>>(k_nope, k_rope, out, static_cast<int>(heads));
  return cudaGetLastError();
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
  return device::visit_float_dtype(ctx, op, out, [&](auto tag) {
    using T = decltype(tag);
    const T* nope = data_ptr<const T>(k_nope);
    const T* rope = data_ptr<const T>(k_rope);
    T* o = data_ptr<T>(out);
    // Every row length (128, 64, 192) is a multiple of 64 elements: the pointers decide.
    const int vec_elems = device::max_vec_elems<T>(kRope, nope, rope, o);
    const cudaError_t err = device::visit_vec_elems<T>(vec_elems, [&](auto vec) {
      return launch<T, decltype(vec)::value>(nope, rope, o, tokens, heads, stream);
    });
    return device::launch_status(ctx, op, err);
  });
}

}  // namespace kreg::attention
