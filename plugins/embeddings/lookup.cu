// CUDA row gathers for the embeddings group: out[t] = table[ids[t] - start], a zero row for
// ids outside [start, start + rows). lookup is start = 0 with the optional device-side
// counter of such ids; vocab_parallel_lookup is one rank's shard (start = vocab_start).
//
// The copy moves bytes: every row is row_bytes contiguous bytes on both sides, moved in
// words of 16 bytes when row_bytes and both base pointers allow it (8, 4 or 2 otherwise:
// every row start, base + row * row_bytes, is then aligned as well). The dtype plays no
// other part, so there is one instantiation per (id type, word size).
//
// Work split: a row is cut into chunks of kChunkWords words (32 lanes x kWordsPerLane);
// each warp copies one (token, chunk) task. The warp reads the token's id once (all lanes
// load the same address: one broadcast transaction), issues its kWordsPerLane loads before
// any store (the table row is random, so these are the DRAM round trips to overlap), and
// stores them with an evict-first hint (out is written once; table rows keep the default
// policy, so repeated tokens may hit L2). 64-bit offsets throughout: V * H and T * H may
// exceed 2^31. Decode shapes spread a row over several warps (T = 1, H = 7168 bf16: 7
// warps in one block, one round trip each), large ones give a thread 4 x 16 bytes in
// flight (T = 32768, H = 7168: 229376 warps in 28672 blocks of 256).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "embeddings.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::embeddings {
namespace {

using device::FastDivisor;
using device::word_t;

constexpr int kWarps = 8;  // warps (tasks) per block
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kWordsPerLane = 4;
constexpr int64_t kChunkWords = 32 * kWordsPerLane;
// Task indices are 32-bit (FastDivisor splits them into token and chunk); longer calls are
// cut into several launches of at most this many tasks.
constexpr int64_t kMaxTasksPerLaunch = INT32_MAX - kWarps;

template <typename I, typename Word>
__global__ void __launch_bounds__(kBlockThreads)
    gather_kernel(const I* __restrict__ ids, const Word* __restrict__ table, Word* __restrict__ out,
                  int64_t start, int64_t rows, int64_t row_words, FastDivisor chunks_per_row,
                  uint32_t tasks, int32_t* __restrict__ invalid) {
  const uint32_t task = blockIdx.x * kWarps + threadIdx.x / 32;
  if (task >= tasks) return;
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t t = chunks_per_row.div(task);
  const uint32_t chunk = task - t * chunks_per_row.divisor;
  // With PDL: ids (and the table) may be the previous kernel's output.
  device::pdl_wait();
  const auto id = static_cast<int64_t>(__ldg(ids + t));
  // id >= start >= 0 first, so id - start cannot overflow.
  const bool valid = id >= start && id - start < rows;
  const int64_t col0 = static_cast<int64_t>(chunk) * kChunkWords + lane;
  Word w[kWordsPerLane];
  if (valid) {
    const Word* src = table + (id - start) * row_words;
#pragma unroll
    for (int k = 0; k < kWordsPerLane; ++k) {
      const int64_t col = col0 + k * 32;
      w[k] = col < row_words ? __ldg(src + col) : Word{};
    }
  } else {
#pragma unroll
    for (int k = 0; k < kWordsPerLane; ++k) w[k] = Word{};
    // Once per token: the warp of its first chunk counts it.
    if (invalid != nullptr && chunk == 0 && lane == 0) atomicAdd(invalid, 1);
  }
  // Every load of this thread is issued; the next kernel may be scheduled (its
  // griddepcontrol.wait still waits for this grid to finish).
  device::pdl_launch_dependents();
  Word* dst = out + static_cast<int64_t>(t) * row_words;
#pragma unroll
  for (int k = 0; k < kWordsPerLane; ++k) {
    const int64_t col = col0 + k * 32;
    if (col < row_words) __stcs(dst + col, w[k]);
  }
}

template <typename I, typename Word>
cudaError_t launch(const DLTensor& ids, const DLTensor& table, DLTensor& out, int32_t* invalid,
                   const GatherPlan& p, cudaStream_t stream, bool pdl) {
  const int64_t row_words = p.row_bytes / static_cast<int64_t>(sizeof(Word));
  // At least one task per token, so that an empty row (H = 0) still counts its id.
  const int64_t chunks = std::max<int64_t>(1, (row_words + kChunkWords - 1) / kChunkWords);
  const int64_t tokens_per_launch = std::max<int64_t>(1, kMaxTasksPerLaunch / chunks);
  const FastDivisor divisor(static_cast<uint32_t>(chunks));
  const I* idp = data_ptr<const I>(ids);
  const Word* tp = data_ptr<const Word>(table);
  Word* op = data_ptr<Word>(out);
  for (int64_t t0 = 0; t0 < p.tokens; t0 += tokens_per_launch) {
    const int64_t n = std::min(tokens_per_launch, p.tokens - t0);
    const auto tasks = static_cast<uint32_t>(n * chunks);
    const auto blocks = static_cast<unsigned>((tasks + kWarps - 1) / kWarps);
    if (const cudaError_t err = device::launch(
            gather_kernel<I, Word>, dim3(blocks), dim3(kBlockThreads), 0, stream, pdl, idp + t0, tp,
            op + t0 * row_words, p.start, p.rows, row_words, divisor, tasks, invalid);
        err != cudaSuccess) {
      cudaGetLastError();  // returned, not left for a later check
      return err;
    }
  }
  return cudaSuccess;
}

template <typename I>
cudaError_t launch_words(const DLTensor& ids, const DLTensor& table, DLTensor& out,
                         int32_t* invalid, const GatherPlan& p, cudaStream_t stream, bool pdl) {
  // The widest word dividing a row and both base pointers; bf16/f16/f32 rows are whole
  // 2-byte words, so 2 is the narrowest needed.
  const uintptr_t bits = reinterpret_cast<uintptr_t>(data_ptr<const char>(table)) |
                         reinterpret_cast<uintptr_t>(data_ptr<const char>(out)) |
                         static_cast<uintptr_t>(p.row_bytes);
  if (bits % 16 == 0) return launch<I, word_t<16>>(ids, table, out, invalid, p, stream, pdl);
  if (bits % 8 == 0) return launch<I, word_t<8>>(ids, table, out, invalid, p, stream, pdl);
  if (bits % 4 == 0) return launch<I, word_t<4>>(ids, table, out, invalid, p, stream, pdl);
  return launch<I, word_t<2>>(ids, table, out, invalid, p, stream, pdl);
}

KernelStatus gather_cuda(Context& ctx, const DLTensor& ids, const DLTensor& table, DLTensor& out,
                         int64_t start, DLTensor* invalid) {
  const char* op = ctx.op();
  GatherPlan plan;
  if (KernelStatus st = gather_plan(ctx, ids, table, start, plan); !st.ok()) return st;
  if (plan.tokens == 0) return kOk;
  const int64_t h = table.shape[1];
  if (h > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: H = %lld is too large (at most %d)", op,
                    static_cast<long long>(h), INT32_MAX);
  }
  const device::DeviceGuard guard(ids);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  int32_t* counter = invalid != nullptr ? data_ptr<int32_t>(*invalid) : nullptr;
  const cudaError_t err =
      ids.dtype.bits == 64
          ? launch_words<int64_t>(ids, table, out, counter, plan, stream, ctx.pdl())
          : launch_words<int32_t>(ids, table, out, counter, plan, stream, ctx.pdl());
  return device::launch_status(ctx, op, err);
}

}  // namespace

KernelStatus lookup_cuda(Context& ctx, const DLTensor& ids, const DLTensor& table, DLTensor& out,
                         DLTensor* invalid) {
  return gather_cuda(ctx, ids, table, out, 0, invalid);
}

KernelStatus vocab_parallel_lookup_cuda(Context& ctx, const DLTensor& ids,
                                        const DLTensor& table_shard, DLTensor& out,
                                        int64_t vocab_start) {
  return gather_cuda(ctx, ids, table_shard, out, vocab_start, nullptr);
}

}  // namespace kreg::embeddings
