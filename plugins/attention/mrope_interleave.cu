// CUDA mrope_interleave: out[s, i] = x[stream(i), s, i], where stream(i) is 1 for
// i % 3 == 1 and i < 3 * section_h, 2 for i % 3 == 2 and i < 3 * section_w, else 0.
//
// Launch shape: each thread writes one vector of kVec output elements (16 bytes when D
// and the pointers allow). It always loads stream 0's vector and loads stream 1's or 2's
// only when the vector overlaps that stream's interleaved range, then picks per element:
// the three streams interleave element by element, so every 32-byte sector of each
// stream inside its range is needed anyway. A block is 256 threads: blockDim.x threads
// over the vectors of a row (looping when a row has more), blockDim.y rows.
//
// Programmatic dependent launch (KREG_LAUNCH_PDL, device::launch): a thread waits
// (griddepcontrol.wait) once, before the loop's first load (x may be the previous
// kernel's output), and lets the next kernel be scheduled after its first vector's loads
// (the loop's repeats are no-ops); rows past the end return before the wait.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention.hpp"
#include "checks.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention {
namespace {

using device::vec_t;

constexpr int kBlockThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kBlockThreads)
    mrope_interleave_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t seq_len, int dim,
                            int limit_h, int limit_w) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (s >= seq_len) return;
  const int64_t stream_stride = seq_len * dim;
  const T* x0 = x + s * dim;
  device::pdl_wait();
  for (int col = static_cast<int>(threadIdx.x) * kVec; col < dim;
       col += static_cast<int>(blockDim.x) * kVec) {
    vec_t<T, kVec> v0, v1, v2;
    v0.load_stream(x0 + col);
    const bool need_h = col < limit_h;
    const bool need_w = col < limit_w;
    if (need_h) v1.load_stream(x0 + stream_stride + col);
    if (need_w) v2.load_stream(x0 + 2 * stream_stride + col);
    device::pdl_launch_dependents();
    int r = col % 3;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int i = col + j;
      if (r == 1 && i < limit_h) v0[j] = v1[j];
      if (r == 2 && i < limit_w) v0[j] = v2[j];
      r = r == 2 ? 0 : r + 1;
    }
    v0.store_stream(out + s * dim + col);
  }
}

template <typename T, int kVec>
cudaError_t launch(const T* x, T* out, int64_t seq_len, int64_t dim, int limit_h, int limit_w,
                   cudaStream_t stream, bool pdl) {
  const int64_t vecs = dim / kVec;
  const int threads_x = static_cast<int>(std::min<int64_t>(
      kBlockThreads, int64_t{1} << (64 - __builtin_clzll(static_cast<uint64_t>(vecs)) - 1)));
  const int rows_per_block = kBlockThreads / threads_x;
  const int64_t blocks = (seq_len + rows_per_block - 1) / rows_per_block;
  return device::launch(mrope_interleave_kernel<T, kVec>, dim3(static_cast<unsigned>(blocks)),
                        dim3(threads_x, rows_per_block), 0, stream, pdl, x, out, seq_len,
                        static_cast<int>(dim), limit_h, limit_w);
}

}  // namespace

KernelStatus mrope_interleave_cuda(Context& ctx, const DLTensor& x, DLTensor& out,
                                   int64_t section_t, int64_t section_h, int64_t section_w) {
  const char* op = ctx.op();
  if (auto st = check_mrope_sections(ctx, op, section_t, section_h, section_w); !st.ok()) {
    return st;
  }
  const int64_t seq_len = out.shape[0];
  const int64_t dim = out.shape[1];
  if (seq_len == 0 || dim == 0) return kOk;
  if (dim > INT32_MAX / 2 || seq_len > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: S = %lld, D = %lld is too large", op,
                    static_cast<long long>(seq_len), static_cast<long long>(dim));
  }
  // Element i takes stream 1 (2) only below these limits; clamped to D so they fit an int.
  const int limit_h = static_cast<int>(std::min(dim, 3 * std::min(section_h, dim)));
  const int limit_w = static_cast<int>(std::min(dim, 3 * std::min(section_w, dim)));
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  const bool pdl = ctx.pdl();
  return device::visit_float_dtype(ctx, op, out, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = data_ptr<const T>(x);
    T* o = data_ptr<T>(out);
    const int vec_elems = device::max_vec_elems<T>(dim, xp, o);
    const cudaError_t err = device::visit_vec_elems<T>(vec_elems, [&](auto vec) {
      return launch<T, decltype(vec)::value>(xp, o, seq_len, dim, limit_h, limit_w, stream, pdl);
    });
    return device::launch_status(ctx, op, err);
  });
}

}  // namespace kreg::attention
