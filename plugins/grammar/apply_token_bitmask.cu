// CUDA apply_token_bitmask: logits[row, v] = -inf where the row's bitmask clears bit v.
//
// One thread per 32-bit mask word, i.e. per 32 logits of one row; the flat index over
// (masked row, word) is split with a multiply-high divider, and 128-thread blocks spread a
// single row (B = 1, V = 128000: 4000 words, 32 blocks) over many SMs. A warp whose 32
// words allow every token (the common case inside a JSON string, say) returns at once:
// allowed logits are never read or written. Otherwise the warp walks its 32 x 32 logits in
// vectors of kVec elements (16 bytes when V and the pointer allow), lane l taking vector
// j * 32 + l at step j so that the warp's accesses are consecutive (one word per lane put
// the lanes 128 bytes apart: 522 us at B = 512 with 120000 of 128000 tokens banned on an
// H200, against torch.compile's 256). A vector with every token disallowed is one -inf
// store (no read), a mixed one a read-modify-write, an allowed one is skipped. Vectors
// start at multiples of kVec and kVec divides V, so a vector is wholly inside or wholly
// past V: the bits past V (the last word's tail, words past ceil(V / 32)) are never used.
//
// With indices, thread (r, w) masks row indices[r] of logits with row indices[r] of the
// bitmask (xgrammar's CUDA kernel), and skips an index outside [0, B). Duplicate indices
// write the same -inf twice: the result does not depend on the order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "grammar.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::grammar {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kBlockThreads = 128;
// Thread indices are 32-bit (the divider's range); longer calls are cut into launches of
// at most this many threads, whole rows each.
constexpr int64_t kMaxThreadsPerLaunch = INT32_MAX;

template <typename T, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    bitmask_kernel(T* logits, const int32_t* __restrict__ bitmask,
                   const int32_t* __restrict__ indices, int64_t first_row, int64_t batch,
                   int64_t vocab, int64_t mask_stride, FastDivisor words_per_row, uint32_t total) {
  const uint32_t i = blockIdx.x * kBlockThreads + threadIdx.x;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  // Every lane stays to the end: the warp's lanes exchange their words below.
  uint32_t banned = 0;
  int64_t base = 0;  // element offset of this lane's word's first logit
  uint32_t w = 0;
  // With PDL, the logits (and the mask) may be the previous kernel's output.
  device::pdl_wait();
  if (i < total) {
    const uint32_t r = words_per_row.div(i);
    w = i - r * words_per_row.divisor;
    int64_t row = first_row + r;
    if (indices != nullptr) row = indices[row];
    if (row >= 0 && row < batch) {
      banned = ~static_cast<uint32_t>(bitmask[row * mask_stride + w]);
      base = row * vocab + static_cast<int64_t>(w) * 32;
    }
  }
  // The next kernel (sampling, say) may be scheduled now; its griddepcontrol.wait still
  // waits for every store of this grid.
  device::pdl_launch_dependents();
  // Everything allowed in the warp's 32 words (the common case): nothing to touch.
  if (__all_sync(0xffffffffu, banned == 0)) return;
  // The warp's 32 words cover 32 x 32 logits; step j gives lane l the vector j * 32 + l of
  // them, so a warp's loads and stores are consecutive 16-byte vectors (one word per lane
  // would put the lanes 128 bytes apart). The vector's word, offset and column come from
  // the lane that owns the word.
  constexpr int kPerWord = 32 / kVec;  // vectors per mask word
  constexpr uint32_t kFull = kVec == 32 ? 0xffffffffu : (1u << kVec) - 1u;
  const T neg_inf = device::from_float<T>(-std::numeric_limits<float>::infinity());
#pragma unroll
  for (int j = 0; j < kPerWord; ++j) {
    const int vi = j * 32 + lane;
    const int src = vi / kPerWord;
    const int c = (vi % kPerWord) * kVec;  // first token of the vector within its word
    const uint32_t src_banned = __shfl_sync(0xffffffffu, banned, src);
    const int64_t src_base = __shfl_sync(0xffffffffu, base, src);
    const uint32_t src_w = __shfl_sync(0xffffffffu, w, src);
    const uint32_t bits = (src_banned >> c) & kFull;
    // kVec divides V, so a vector is wholly inside or wholly past V.
    if (bits == 0 || static_cast<int64_t>(src_w) * 32 + c >= vocab) continue;
    T* p = logits + src_base + c;
    vec_t<T, kVec> v;
    if (bits == kFull) {
      v.fill(neg_inf);  // every token of the vector banned: no read
    } else {
      v.load(p);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if ((bits >> e) & 1u) v[e] = neg_inf;
      }
    }
    v.store(p);
  }
}

template <typename T, int kVec>
cudaError_t launch(T* logits, const int32_t* bitmask, const int32_t* indices, int64_t rows,
                   int64_t batch, int64_t vocab, int64_t mask_stride, cudaStream_t stream,
                   bool pdl) {
  const int64_t words = words_for(vocab);
  const int64_t rows_per_launch = std::max<int64_t>(1, kMaxThreadsPerLaunch / words);
  const FastDivisor divisor(static_cast<uint32_t>(words));
  for (int64_t row = 0; row < rows; row += rows_per_launch) {
    const int64_t n = std::min(rows_per_launch, rows - row);
    const auto total = static_cast<uint32_t>(n * words);
    const auto blocks = static_cast<unsigned>((total + kBlockThreads - 1) / kBlockThreads);
    if (const cudaError_t err = device::launch(
            bitmask_kernel<T, kVec>, dim3(blocks), dim3(kBlockThreads), 0, stream, pdl, logits,
            bitmask, indices, row, batch, vocab, mask_stride, divisor, total);
        err != cudaSuccess) {
      cudaGetLastError();  // returned, not left for a later check
      return err;
    }
  }
  return cudaSuccess;
}

}  // namespace

KernelStatus apply_token_bitmask_cuda(Context& ctx, DLTensor& logits, const DLTensor& bitmask,
                                      const DLTensor* indices) {
  const char* op = ctx.op();
  if (KernelStatus st = check_args(ctx, logits, bitmask, indices); !st.ok()) return st;
  const int64_t batch = logits.shape[0];
  const int64_t vocab = logits.shape[1];
  const int64_t rows = indices ? indices->shape[0] : batch;
  if (rows == 0 || vocab == 0) return kOk;
  // One row's words must fit the 32-bit thread index (V < 2^36 tokens).
  if (words_for(vocab) > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: V = %lld is too large", op,
                    static_cast<long long>(vocab));
  }
  const device::DeviceGuard guard(logits);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const int32_t* mask = data_ptr<const int32_t>(bitmask);
  const int32_t* rows_ptr = indices ? data_ptr<const int32_t>(*indices) : nullptr;
  return device::visit_float_dtype(ctx, op, logits, [&](auto tag) {
    using T = decltype(tag);
    T* p = data_ptr<T>(logits);
    const int width = device::max_vec_elems<T>(vocab, p);
    return device::launch_status(ctx, op, device::visit_vec_elems<T>(width, [&](auto vec) {
                                   return launch<T, decltype(vec)::value>(
                                       p, mask, rows_ptr, rows, batch, vocab, bitmask.shape[1],
                                       stream, ctx.pdl());
                                 }));
  });
}

}  // namespace kreg::grammar
