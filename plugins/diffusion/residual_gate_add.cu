// CUDA residual_gate_add: out = residual + gate * x on [B,S,H], gate [B,H] (broadcast over
// S) or [B,S,H].
//
// Launch shape (activation's act_and_mul, measured best for element-wise work on the
// H200): one thread per vector of kVec elements (16 bytes when H and every pointer allow),
// 256 threads a block, one block per 256 vectors. A broadcast gate splits the flat vector
// index into (row, column) and the row into (batch, token) with multiply-high dividers;
// the per-token form needs no division. residual and x are streamed (evict-first); a
// broadcast gate row is re-read by S rows and stays in L2 with normal loads. Indices are
// 32-bit: calls of 2^31 vectors or more are cut into several launches of whole rows.
// With programmatic dependent launch (KREG_LAUNCH_PDL) a thread waits before its loads and
// lets the next kernel be scheduled right after them, as act_and_mul does.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "diffusion.hpp"
#include "kreg/device/fast_divisor.cuh"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"

namespace kreg::diffusion {
namespace {

using device::FastDivisor;
using device::vec_t;

constexpr int kBlockThreads = 256;
constexpr int64_t kMaxVecsPerLaunch = INT32_MAX;

template <typename T, int kVec, bool kPerToken>
__global__ void __launch_bounds__(kBlockThreads)
    residual_gate_add_kernel(const T* residual, const T* x, const T* __restrict__ gate, T* out,
                             FastDivisor vecs_per_row, FastDivisor tokens, uint32_t first_row,
                             uint32_t total_vecs) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total_vecs) return;
  // out may alias residual or x: each element is read before it is written, by the same
  // thread, so no __restrict__ on those three.
  const int64_t at = static_cast<int64_t>(i) * kVec;
  int64_t gate_at = at;
  if constexpr (!kPerToken) {
    const uint32_t local_row = vecs_per_row.div(i);
    const uint32_t col = i - local_row * vecs_per_row.divisor;
    const uint32_t batch = tokens.div(first_row + local_row);
    gate_at = (static_cast<int64_t>(batch) * vecs_per_row.divisor + col) * kVec;
  }
  vec_t<T, kVec> r_raw, x_raw, g_raw;
  device::pdl_wait();
  r_raw.load_stream(residual + at);
  x_raw.load_stream(x + at);
  if constexpr (kPerToken) {
    g_raw.load_stream(gate + gate_at);
  } else {
    g_raw.load(gate + gate_at);
  }
  device::pdl_launch_dependents();
  vec_t<float, kVec> r, xv, g;
  r.cast_from(r_raw);
  xv.cast_from(x_raw);
  g.cast_from(g_raw);
#pragma unroll
  for (int j = 0; j < kVec; ++j) r[j] += g[j] * xv[j];
  vec_t<T, kVec> y;
  y.cast_from(r);
  y.store_stream(out + at);
}

struct GateArgs {
  const void* residual;
  const void* x;
  const void* gate;
  void* out;
  int64_t rows;  // B * S
  int64_t tokens;
  int64_t hidden;
  bool per_token;
  bool pdl;  // programmatic dependent launch (the caller's KREG_LAUNCH_PDL)
};

template <typename T, int kVec, bool kPerToken>
cudaError_t launch(const GateArgs& a, cudaStream_t stream) {
  const int64_t vecs_per_row = a.hidden / kVec;
  const int64_t rows_per_launch = std::max<int64_t>(1, kMaxVecsPerLaunch / vecs_per_row);
  const FastDivisor row_div(static_cast<uint32_t>(vecs_per_row));
  const FastDivisor token_div(static_cast<uint32_t>(a.tokens));
  const auto* residual = static_cast<const T*>(a.residual);
  const auto* x = static_cast<const T*>(a.x);
  const auto* gate = static_cast<const T*>(a.gate);
  auto* out = static_cast<T*>(a.out);
  for (int64_t row = 0; row < a.rows; row += rows_per_launch) {
    const int64_t n = std::min(rows_per_launch, a.rows - row);
    const auto total = static_cast<uint32_t>(n * vecs_per_row);
    const auto blocks = static_cast<unsigned>((total + kBlockThreads - 1) / kBlockThreads);
    const int64_t offset = row * a.hidden;
    // A broadcast gate is indexed by batch, from the absolute row: pass the base gate.
    if (const cudaError_t err = device::launch(
            residual_gate_add_kernel<T, kVec, kPerToken>, dim3(blocks), dim3(kBlockThreads), 0,
            stream, a.pdl, residual + offset, x + offset, kPerToken ? gate + offset : gate,
            out + offset, row_div, token_div, static_cast<uint32_t>(row), total);
        err != cudaSuccess) {
      return err;
    }
  }
  return cudaSuccess;
}

template <typename T, int kVec>
cudaError_t launch_layout(const GateArgs& a, cudaStream_t stream) {
  return a.per_token ? launch<T, kVec, true>(a, stream) : launch<T, kVec, false>(a, stream);
}

template <typename T>
cudaError_t launch_typed(const GateArgs& a, cudaStream_t stream) {
  return device::visit_vec_elems<T>(
      device::max_vec_elems<T>(a.hidden, static_cast<const T*>(a.residual),
                               static_cast<const T*>(a.x), static_cast<const T*>(a.gate),
                               static_cast<const T*>(a.out)),
      [&](auto vec) { return launch_layout<T, decltype(vec)::value>(a, stream); });
}

}  // namespace

KernelStatus residual_gate_add_cuda(Context& ctx, const DLTensor& residual, const DLTensor& x,
                                    const DLTensor& gate, DLTensor& out) {
  const char* const kOp = ctx.op();
  GateArgs a{.residual = data_ptr<const void>(residual),
             .x = data_ptr<const void>(x),
             .gate = data_ptr<const void>(gate),
             .out = data_ptr<void>(out),
             .rows = x.shape[0] * x.shape[1],
             .tokens = x.shape[1],
             .hidden = x.shape[2],
             .per_token = false,
             .pdl = ctx.pdl()};
  if (KernelStatus st = modulation_layout(ctx, kOp, "gate", gate, x, a.per_token); !st.ok())
    return st;
  if (a.rows == 0 || a.hidden == 0) return kOk;
  // 32-bit row and column indices (the FastDivisor range).
  if (a.hidden > INT32_MAX || a.rows > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: B*S = %lld rows of H = %lld are too many", kOp,
                    static_cast<long long>(a.rows), static_cast<long long>(a.hidden));
  }
  const device::DeviceGuard guard(residual);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    return device::launch_status(ctx, kOp, launch_typed<decltype(tag)>(a, stream));
  });
}

}  // namespace kreg::diffusion
