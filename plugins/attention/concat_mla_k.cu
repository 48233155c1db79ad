// CUDA concat_mla_k: k[t, h] = concat(k_nope[t, h] (128), k_rope[t, 0] (64)), a pure copy.
//
// Launch shape: a block row of 192 / kVec threads copies one output row of 192 elements,
// one 16-byte vector per thread (the first 128 / kVec threads from k_nope, the rest from
// the token's k_rope row, which every head of the token re-reads from L1/L2); kVec rows
// (heads) per block, so blocks are 192 threads. Grid: (T, ceil(H / kVec)). k_nope and k
// are touched once (evict-first hints); k_rope is read with the default policy.
//
// Large calls (T * H >= kManyRows, e.g. T = 8192, H = 128: 131072 blocks that each moved
// 3 KiB, 89% of copy) give each thread kHeads = 4 heads, kVec * 4 apart: a k_nope thread
// has 4 loads in flight before its 4 stores, a k_rope thread loads the token's rope vector
// once and stores it 4 times (a quarter of the L1/L2 rope reads), and the grid is a
// quarter as many blocks (32768 at that shape). The index math is shared by 4 vectors.
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

constexpr int64_t kManyRows = int64_t{1} << 16;  // T * H from which a thread takes 4 heads

// Heads h0 + k * blockDim.y (k < kHeads) of token blockIdx.x, vector threadIdx.x of each.
template <typename T, int kVec, int kHeads>
__global__ void __launch_bounds__(kRow)
    concat_mla_k_kernel(const T* __restrict__ k_nope, const T* __restrict__ k_rope,
                        T* __restrict__ out, int heads) {
  constexpr int kNopeVecs = kNope / kVec;
  const int c = static_cast<int>(threadIdx.x);  // vector within the row, < kRow / kVec
  const int h0 = static_cast<int>(blockIdx.y * blockDim.y * kHeads + threadIdx.y);
  if (h0 >= heads) return;
  const int64_t t = blockIdx.x;
  const bool from_nope = c < kNopeVecs;
  // All loads first, then the stores; a rope thread loads its vector once (k = 0).
  vec_t<T, kVec> v[kHeads];
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int h = h0 + k * static_cast<int>(blockDim.y);
    if (from_nope) {
      if (h < heads) v[k].load_stream(k_nope + (t * heads + h) * kNope + c * kVec);
    } else if (k == 0) {
      v[0].load(k_rope + t * kRope + (c - kNopeVecs) * kVec);
    }
  }
#pragma unroll
  for (int k = 0; k < kHeads; ++k) {
    const int h = h0 + k * static_cast<int>(blockDim.y);
    if (h < heads) v[from_nope ? k : 0].store_stream(out + (t * heads + h) * kRow + c * kVec);
  }
}

template <typename T, int kVec>
cudaError_t launch(const T* k_nope, const T* k_rope, T* out, int64_t tokens, int64_t heads,
                   cudaStream_t stream) {
  const int rows_per_block = static_cast<int>(std::min<int64_t>(kVec, heads));
  const dim3 block(kRow / kVec, static_cast<unsigned>(rows_per_block));
  const bool many = tokens * heads >= kManyRows && heads >= 4 * rows_per_block;
  const int heads_per_block = rows_per_block * (many ? 4 : 1);
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((heads + heads_per_block - 1) / heads_per_block));
  if (many) {
    concat_mla_k_kernel<T, kVec, 4>
        <<<grid, block, 0, stream>>>(k_nope, k_rope, out, static_cast<int>(heads));
  } else {
    concat_mla_k_kernel<T, kVec, 1>
        <<<grid, block, 0, stream>>>(k_nope, k_rope, out, static_cast<int>(heads));
  }
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
