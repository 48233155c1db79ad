// CUDA decode: paged decode attention with GQA, flash-decoding style; the entry point.
//
//   out[b, h] = softmax(scale * q[b, h] . K_j) V_j over the tokens j < seq_lens[b], where
//   token j of sequence b is row (block_table[b, j / P], j % P, h / (Hq / Hk)) of the caches.
//
// The split kernel runs on tensor cores (decode_mma.cu); the splits, the log-sum-exp merge
// of their partials and the workspace are in decode.cuh. A first design on CUDA cores (fp32
// FMA, lane groups of D / 8 lanes a row) was replaced after measuring it slower at every
// case (docs/performance.md, "Seventh round"); it is in git history before this comment.
//
// Empty sequences (seq_lens[b] == 0) give zeros. Lengths are clamped to [0, max_pages *
// page_size] and page ids outside [0, num_pages) contribute nothing: no read outside the
// caches or the table. The CPU reference reports both as errors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention.hpp"
#include "checks.hpp"
#include "decode.cuh"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"

namespace kreg::attention {
namespace {

using decode_detail::DecodeParams;
using device::FastDivisor;

template <typename T>
KernelStatus run(Context& ctx, const char* op, const DLTensor& q, const DLTensor& k_cache,
                 const DLTensor& v_cache, const DLTensor& block_table, const DLTensor& seq_lens,
                 DLTensor& out, double scale) {
  const int64_t batch = q.shape[0], heads_q = q.shape[1], dim = q.shape[2];
  const int64_t heads_k = k_cache.shape[2];
  DecodeParams<T> p{};
  p.q = data_ptr<const T>(q);
  p.k_cache = data_ptr<const T>(k_cache);
  p.v_cache = data_ptr<const T>(v_cache);
  p.block_table = data_ptr<const int32_t>(block_table);
  p.seq_lens = data_ptr<const int32_t>(seq_lens);
  p.out = data_ptr<T>(out);
  p.num_pages = k_cache.shape[0];
  p.heads_q = static_cast<int>(heads_q);
  p.heads_k = static_cast<int>(heads_k);
  p.group = static_cast<int>(heads_q / heads_k);
  p.page_size = static_cast<int>(k_cache.shape[1]);
  p.page_div = FastDivisor(static_cast<uint32_t>(p.page_size));
  p.max_pages = static_cast<int>(block_table.shape[1]);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  if (!device::aligned16(p.q) || !device::aligned16(p.k_cache) || !device::aligned16(p.v_cache)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: arguments 'q', 'k_cache' and 'v_cache' must be 16-byte aligned", op);
  }
  const auto b = static_cast<int>(batch);
  switch (dim) {
    case 64:
      return decode_detail::launch_mma<T, 64>(ctx, op, p, b, q.device);
    case 128:
      return decode_detail::launch_mma<T, 128>(ctx, op, p, b, q.device);
    default:
      return decode_detail::launch_mma<T, 256>(ctx, op, p, b, q.device);
  }
}

}  // namespace

KernelStatus decode_cuda(Context& ctx, const DLTensor& q, const DLTensor& k_cache,
                         const DLTensor& v_cache, const DLTensor& block_table,
                         const DLTensor& seq_lens, DLTensor& out, double scale) {
  const char* op = "attention.decode";
  if (auto st = check_decode(ctx, op, q, k_cache, scale); !st.ok()) return st;
  const int64_t batch = q.shape[0], heads_q = q.shape[1];
  if (batch == 0 || heads_q == 0) return kOk;
  if (batch > 65535 || heads_q > 65535 || block_table.shape[1] * k_cache.shape[1] > INT32_MAX / 2) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: B = %lld, Hq = %lld (each at most 65535) or max_pages * page_size = %lld "
                    "(below 2^30) is too large",
                    op, static_cast<long long>(batch), static_cast<long long>(heads_q),
                    static_cast<long long>(block_table.shape[1] * k_cache.shape[1]));
  }
  const device::DeviceGuard guard(q);
  if (!guard.ok()) return guard.fail(ctx, op);
  return device::visit_dtype<__nv_bfloat16, __half>(ctx, op, q, [&](auto tag) {
    return run<decltype(tag)>(ctx, op, q, k_cache, v_cache, block_table, seq_lens, out, scale);
  });
}

}  // namespace kreg::attention
