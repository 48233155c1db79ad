// CUDA apply_token_bitmask: logits[row, v] = -inf where the row's bitmask clears bit v.
//
// One thread per 32-bit mask word, i.e. per 32 logits of one row; the flat index over
// (masked row, word) is split with a multiply-high divider, and 128-thread blocks spread a
// single row (B = 1, V = 128000: 4000 words, 32 blocks) over many SMs. A thread loads its
// word and returns at once when all 32 tokens are allowed (the common case inside a JSON
// string, say): allowed logits are never read or written. Otherwise it walks its 32 logits
// in vectors of kVec elements (16 bytes when V and the pointer allow): a vector with every
// token disallowed is one -inf store (no read), a mixed one a read-modify-write of the
// vector, an allowed one is skipped. Vectors start at multiples of kVec and kVec divides
// V, so a vector is wholly inside or wholly past V: the bits past V (the last word's tail,
// words past ceil(V / 32)) are never looked at.
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
  if (i >= total) return;
  const uint32_t r = words_per_row.div(i);
  const uint32_t w = i - r * words_per_row.divisor;
  // With PDL, the logits (and the mask) may be the previous kernel's output.
  device::pdl_wait();
  int64_t row = first_row + r;
  if (indices != nullptr) {
    row = indices[row];
    if (row < 0 || row >= batch) return;
  }
  const auto allowed = static_cast<uint32_t>(bitmask[row * mask_stride + w]);
  // The next kernel (sampling, say) may be scheduled now; its griddepcontrol.wait still
  // waits for every store of this grid.
  device::pdl_launch_dependents();
  if (allowed == 0xffffffffu) return;
  const uint32_t banned = ~allowed;
  const int64_t start = static_cast<int64_t>(w) * 32;
  T* p = logits + row * vocab + start;
  const int64_t lanes = std::min<int64_t>(32, vocab - start);
  const T neg_inf = device::from_float<T>(-std::numeric_limits<float>::infinity());
  constexpr uint32_t kFull = kVec == 32 ? 0xffffffffu : (1u << kVec) - 1u;
#pragma unroll
  for (int c = 0; c < 32; c += kVec) {
    if (c >= lanes) break;
    const uint32_t bits = (banned >> c) & kFull;
    if (bits == 0) continue;
    vec_t<T, kVec> v;
    if (bits == kFull) {
      v.fill(neg_inf);
    } else {
      v.load(p + c);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if ((bits >> j) & 1u) v[j] = neg_inf;
      }
    }
    v.store(p + c);
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
