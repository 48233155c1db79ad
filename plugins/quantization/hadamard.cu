// CUDA quantization.hadamard_transform: out = scale * x * H_N (Sylvester, natural order) for
// N = 2^n, 2 <= N <= 32768, fp32 butterflies, one rounding at the store.
//
// H_N = H_2 (x) ... (x) H_2, one factor per index bit: the transform is n butterfly stages,
// stage b turning every pair (i, i | 2^b) with bit b of i clear into (u + v, u - v). The
// stages commute, so any order gives the natural-order matrix as long as each stage works on
// a real index bit; what matters is only who holds which index bits.
//
// One kernel template per n (the "plan" below), 2^L threads per row, each holding E = N / 2^L
// elements in registers:
//   - load layout P: thread t holds chunks of 2^a = min(8, N) contiguous elements (one
//     16-byte load in 16-bit types, two in f32), chunk c at element (c << (a + L)) | (t << a):
//     a warp's loads are contiguous. Index bits [0, a) and [a + L, n) are private to the
//     thread, bits [a, a + L) are the thread's;
//   - the private bits' stages in registers;
//   - the first K thread bits (lanes 0..K-1 of the row) by __shfl_xor_sync butterflies;
//   - the other L - K thread bits through one exchange in shared memory (fp32): every thread
//     writes its values, reads them back in layout X where those bits are private, does
//     their stages in registers, writes them, and reads its layout-P values back for 16-byte
//     stores. The shared-memory rows are padded (33 floats for every 32) and the index bits
//     placed so that the 32 lanes of every access hit 32 banks in both layouts, and each
//     address is a per-thread base plus a compile-time offset (Plan::w).
// Rows of at most 512 elements (L < 5) skip the exchange (K = L): several rows share a warp.
// Shuffles and shared memory share a pipe, which the rows of 1024..8192 elements would
// saturate with Dao-AILab's five shuffle stages per element; one exchange does all L thread
// bits for half the traffic.
//
// Every row is read whole before any of it is written, by the block that writes it: out may
// alias x (neither pointer is __restrict__).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "hadamard.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/device/warp.cuh"
#include "kreg/dtype.hpp"

namespace kreg::quantization {
namespace {

using device::vec_t;

// f(std::integral_constant<int, I>{}) for I = 0 .. kCount-1: the index is a constant
// expression in f, so offsets computed from the plan are folded by the front end rather
// than left to the optimizer to unroll.
template <typename F, int... Is>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, Is...>) {
  (f(std::integral_constant<int, Is>{}), ...);
}
template <int kCount, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, kCount>{});
}

constexpr int kMaxBits = 16;
constexpr int kBankBits = 5;  // 32 banks of 4 bytes
constexpr int kBanks = 1 << kBankBits;

// Who holds which index bit, for N = 2^log_n. Positions are bits of the element index in
// the row; "slot" bits index a thread's registers.
struct Plan {
  int log_n = 0;
  int a = 0;              // bits of one contiguous chunk: min(3, log_n)
  int l = 0;              // 2^l threads per row
  int k = 0;              // thread bits done by shuffles (the lowest k)
  int p = 0;              // private bits, log_n - l: E = 2^p registers per thread
  int rows = 0;           // rows per block
  int xt[kMaxBits] = {};  // layout X: position of thread bit j
  int xs[kMaxBits] = {};  // layout X: position of slot bit s
  // Shared memory: element i lives at sum over its set bits of w[bit] floats. The five P lane
  // positions (a..a+4) form the column c (weights 1..16), every other position a bit of the
  // row r (weights 33 << beta): index c + 33 r, rows padded to 33 floats. The bank is
  // (c + r) mod 32: P's lanes cover the column bits and X's lanes the column bits of the kept
  // ones plus row bits 0..4 for the others, so both layouts reach 32 banks. The index is a
  // sum of a thread part and a slot part, the slot part a compile-time immediate.
  int w[kMaxBits] = {};

  __host__ __device__ constexpr bool exchange() const { return l > k; }
  __host__ __device__ constexpr int threads() const { return rows << l; }
  // Floats of shared memory per row.
  __host__ __device__ constexpr int row_floats() const {
    return exchange() ? (kBanks + 1) * ((1 << log_n) / kBanks) : 0;
  }
};

__host__ __device__ constexpr Plan make_plan(int log_n) {
  Plan pl;
  pl.log_n = log_n;
  pl.a = log_n < 3 ? log_n : 3;
  // Up to 32 elements in one thread; up to 512 (16 threads), shuffles alone; above, one row
  // per 32 lanes or more with E = 32 or 64 registers.
  pl.l = log_n <= 5 ? 0 : log_n <= 9 ? log_n - 5 : log_n <= 11 ? 5 : log_n - 6;
  pl.p = log_n - pl.l;
  pl.k = pl.l < kBankBits ? pl.l : (pl.l - pl.p > 0 ? pl.l - pl.p : 0);
  // 256 threads for short rows; 33 KiB of shared memory for the exchanged ones (N <= 8192).
  pl.rows = pl.l < kBankBits ? 256 >> pl.l : (log_n <= 13 ? 8192 >> log_n : 1);
  if (!pl.exchange()) return pl;
  // Layout X. The private positions of layout P, in order.
  int priv[kMaxBits] = {};
  int np = 0;
  for (int b = 0; b < pl.a; ++b) priv[np++] = b;
  for (int b = pl.a + pl.l; b < log_n; ++b) priv[np++] = b;
  // Thread bits: the K shuffled ones stay; the others take private positions of P.
  for (int j = 0; j < pl.l; ++j) pl.xt[j] = j < pl.k ? pl.a + j : priv[j - pl.k];
  // Slots: first the thread positions of P that become private, then the rest of P's.
  for (int s = 0; s < pl.p; ++s) pl.xs[s] = s < pl.l - pl.k ? pl.a + pl.k + s : priv[s];
  // Weights: P lane j is column bit j; X lane j >= K is row bit j; the other positions take
  // the remaining row bits in increasing order.
  int beta[kMaxBits] = {};
  bool taken[kMaxBits] = {};
  bool placed[kMaxBits] = {};
  for (int j = 0; j < kBankBits; ++j) placed[pl.a + j] = true;
  for (int j = pl.k; j < kBankBits; ++j) {
    beta[pl.xt[j]] = j;
    taken[j] = true;
    placed[pl.xt[j]] = true;
  }
  int next = 0;
  for (int b = 0; b < log_n; ++b) {
    if (placed[b]) continue;
    while (taken[next]) ++next;
    beta[b] = next;
    taken[next] = true;
  }
  for (int b = 0; b < log_n; ++b) {
    const bool column = b >= pl.a && b < pl.a + kBankBits;
    pl.w[b] = column ? 1 << (b - pl.a) : (kBanks + 1) << beta[b];
  }
  return pl;
}

// The shared-memory index of the element whose set bits are those of `i`.
__host__ __device__ constexpr int smem_index(const Plan& pl, int i) {
  int s = 0;
  for (int b = 0; b < pl.log_n; ++b) {
    if ((i >> b) & 1) s += pl.w[b];
  }
  return s;
}

// Layout P: the element of thread t's slot k is (t << a) | p_slot(k).
__host__ __device__ constexpr int p_slot(const Plan& pl, int k) {
  return (k & ((1 << pl.a) - 1)) | ((k >> pl.a) << (pl.a + pl.l));
}

// Layout X: thread t's slot k is x_thread(t) | x_slot(k).
__host__ __device__ constexpr int x_slot(const Plan& pl, int k) {
  int i = 0;
  for (int s = 0; s < pl.p; ++s) i |= ((k >> s) & 1) << pl.xs[s];
  return i;
}

__host__ __device__ constexpr int x_thread(const Plan& pl, int t) {
  int i = 0;
  for (int j = 0; j < pl.l; ++j) i |= ((t >> j) & 1) << pl.xt[j];
  return i;
}

// Whether the 32 lanes of a warp reach 32 banks in both layouts (checked at compile time;
// the other bits add the same offset to every lane).
__host__ __device__ constexpr bool conflict_free(const Plan& pl) {
  if (!pl.exchange()) return true;
  for (int layout = 0; layout < 2; ++layout) {
    bool hit[kBanks] = {};
    for (int lane = 0; lane < kBanks; ++lane) {
      const int i = layout == 0 ? lane << pl.a : x_thread(pl, lane);
      const int bank = smem_index(pl, i) % kBanks;
      if (hit[bank]) return false;
      hit[bank] = true;
    }
  }
  return true;
}

static_assert([] {
  for (int n = 1; n <= 15; ++n) {
    if (!conflict_free(make_plan(n))) return false;
  }
  return true;
}());
static_assert(make_plan(15).threads() <= 1024 && make_plan(1).threads() == 256);

// In-register butterflies over slot bits [kFirst, kLast) of v.
template <int kFirst, int kLast, int kE>
__device__ __forceinline__ void butterflies(float (&v)[kE]) {
#pragma unroll
  for (int s = kFirst; s < kLast; ++s) {
    const int bit = 1 << s;
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      if ((k & bit) == 0) {
        const float u = v[k];
        const float w = v[k | bit];
        v[k] = u + w;
        v[k | bit] = u - w;
      }
    }
  }
}

// Thread t's shared-memory bases in layouts P and X: smem_index is a sum over the set bits,
// so each is a sum over t's bits of compile-time weights. (Calling smem_index with a runtime
// t put the whole Plan, 216 bytes, in local memory and walked it per thread.)
template <int kLogN>
__device__ __forceinline__ void smem_bases(int t, int& p_base, int& x_base) {
  p_base = 0;
  x_base = 0;
  static_for<make_plan(kLogN).l>([&](auto j) {
    constexpr Plan kPl = make_plan(kLogN);
    constexpr int kP = smem_index(kPl, 1 << (kPl.a + j));
    constexpr int kX = smem_index(kPl, x_thread(kPl, 1 << j));
    if ((t >> j) & 1) {
      p_base += kP;
      x_base += kX;
    }
  });
}

// Loads row `row` of thread t's layout-P chunks, raw (not yet converted).
template <typename T, int kLogN, int kVec, int kLoads>
__device__ __forceinline__ void load_raw(vec_t<T, kVec> (&raw)[kLoads], const T* x, int64_t row,
                                         int t) {
  constexpr Plan kPlan = make_plan(kLogN);
  constexpr int kChunk = 1 << kPlan.a;
  const T* src = x + row * (int64_t{1} << kLogN) + (t << kPlan.a);
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int c = i * kVec / kChunk;
    const int j = i * kVec % kChunk;
    raw[i].load_stream(src + (c << (kPlan.a + kPlan.l)) + j);
  }
}

// The transform of the values a thread holds in layout P (v), in place: private bits in
// registers, K thread bits by shuffles, the others through the shared-memory exchange (s: the
// row's shared memory; p_base, x_base from smem_bases).
template <int kLogN, int kE>
__device__ __forceinline__ void transform(float (&v)[kE], int t, float* s, int p_base, int x_base) {
  constexpr Plan kPlan = make_plan(kLogN);
  butterflies<0, kPlan.p>(v);
  // Thread bits 0..K-1: the partner lane holds the other half of each pair; the lower lane
  // keeps u + v, the upper one u - v, i.e. v * (+-1) + partner.
#pragma unroll
  for (int j = 0; j < kPlan.k; ++j) {
    const float sign = ((t >> j) & 1) ? -1.0f : 1.0f;
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      v[k] = fmaf(v[k], sign, __shfl_xor_sync(device::kFullWarpMask, v[k], 1 << j));
    }
  }
  if constexpr (kPlan.exchange()) {
    // Each thread first writes the layout-P places it read last (for the previous group of a
    // pipelined block), so no barrier is needed before.
    static_for<kE>([&](auto k) {
      constexpr int kOff = smem_index(make_plan(kLogN), p_slot(make_plan(kLogN), k));
      s[p_base + kOff] = v[k];
    });
    __syncthreads();
    static_for<kE>([&](auto k) {
      constexpr int kOff = smem_index(make_plan(kLogN), x_slot(make_plan(kLogN), k));
      v[k] = s[x_base + kOff];
    });
    // Slot bits 0..L-K-1 of X are thread bits K..L-1 of P.
    butterflies<0, kPlan.l - kPlan.k>(v);
    // Each thread rewrites what it read: no barrier needed before.
    static_for<kE>([&](auto k) {
      constexpr int kOff = smem_index(make_plan(kLogN), x_slot(make_plan(kLogN), k));
      s[x_base + kOff] = v[k];
    });
    __syncthreads();
    static_for<kE>([&](auto k) {
      constexpr int kOff = smem_index(make_plan(kLogN), p_slot(make_plan(kLogN), k));
      v[k] = s[p_base + kOff];
    });
  }
}

template <typename T, int kVec, int kLoads, int kE>
__device__ __forceinline__ void convert(const vec_t<T, kVec> (&raw)[kLoads], float (&v)[kE]) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    vec_t<float, kVec> f;
    f.cast_from(raw[i]);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[i * kVec + e] = f[e];
  }
}

// Stores scale * v, thread t's layout-P values of row `row`, rounded once.
template <typename T, int kLogN, int kVec, int kE>
__device__ __forceinline__ void store_row(const float (&v)[kE], T* out, int64_t row, int t,
                                          float scale) {
  constexpr Plan kPlan = make_plan(kLogN);
  constexpr int kChunk = 1 << kPlan.a;
  T* dst = out + row * (int64_t{1} << kLogN) + (t << kPlan.a);
#pragma unroll
  for (int i = 0; i < kE / kVec; ++i) {
    const int c = i * kVec / kChunk;
    const int j = i * kVec % kChunk;
    vec_t<float, kVec> f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) f[e] = v[i * kVec + e] * scale;
    vec_t<T, kVec> r;
    r.cast_from(f);
    r.store_stream(dst + (c << (kPlan.a + kPlan.l)) + j);
  }
}

// Whether a block keeps the next group's loads in flight (hadamard_kernel): the exchanged
// sizes up to 8192 in 16-bit types with 16-byte vectors, where they cost 32 registers (128 in
// all: 4 blocks of 128 threads per SM). Not above 8192 (N = 32768 already has 128 registers
// per thread, 512 threads), nor for f32 or the one-element path, whose 64 more registers
// (168 in all) would leave 3 blocks per SM.
template <typename T, int kLogN, int kVec>
constexpr bool pipelined() {
  return make_plan(kLogN).exchange() && kLogN <= 13 && sizeof(T) == 2 && kVec * sizeof(T) == 16;
}

// One block per group of kPlan.rows rows, except for the pipelined sizes (pipelined():
// N = 1024..8192) at large T: there the grid is what the SMs hold at once and a block does
// the groups blockIdx.x, + gridDim.x, ..., keeping the next group's loads in flight, raw in
// registers, while it transforms and stores the current one. The exchanged rows need 33 KiB
// of shared memory each, which caps an SM at six of them, and with one row per block an SM's
// loads idled while its blocks computed (57-60% of copy at N = 4096, 8192).
template <typename T, int kLogN, int kVec>
__global__ void __launch_bounds__(make_plan(kLogN).threads())
    hadamard_kernel(const T* x, T* out, int64_t rows, float scale) {
  constexpr Plan kPlan = make_plan(kLogN);
  constexpr int kChunk = 1 << kPlan.a;
  constexpr int kE = 1 << kPlan.p;
  constexpr int kLoads = kE / kVec;
  static_assert(kVec <= kChunk && kChunk % kVec == 0);
  extern __shared__ float smem[];

  const int t = static_cast<int>(threadIdx.x) & ((1 << kPlan.l) - 1);
  const int row_in_block = static_cast<int>(threadIdx.x) >> kPlan.l;
  int p_base = 0;
  int x_base = 0;
  if constexpr (kPlan.exchange()) smem_bases<kLogN>(t, p_base, x_base);
  float* s = smem + row_in_block * kPlan.row_floats();

  // Rows past the end (in the last group) transform zeros, or a pipelined block's previous
  // values, and store nothing: their threads still shuffle and synchronize with the others.
  vec_t<T, kVec> raw[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) raw[i].fill(T{});
  float v[kE];
  int64_t row = static_cast<int64_t>(blockIdx.x) * kPlan.rows + row_in_block;
  // With PDL: x may be the previous kernel's output.
  device::pdl_wait();
  if (row < rows) load_raw<T, kLogN>(raw, x, row, t);
  device::pdl_launch_dependents();

  if constexpr (!pipelined<T, kLogN, kVec>()) {
    convert(raw, v);
    transform<kLogN>(v, t, s, p_base, x_base);
    if (row < rows) store_row<T, kLogN, kVec>(v, out, row, t, scale);
  } else {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * kPlan.rows;
    // The group loop's condition is the same for the whole block (row - row_in_block is).
    for (;;) {
      convert(raw, v);
      const int64_t next = row + stride;
      const bool more = next - row_in_block < rows;
      // Another row than the one this thread writes below (out may alias x), read whole by
      // this block before any of it is written.
      if (next < rows) load_raw<T, kLogN>(raw, x, next, t);
      transform<kLogN>(v, t, s, p_base, x_base);
      if (row < rows) store_row<T, kLogN, kVec>(v, out, row, t, scale);
      if (!more) break;
      row = next;
    }
  }
}

template <typename T, int kLogN, int kVec>
cudaError_t launch(const T* x, T* out, int64_t rows, float scale, cudaStream_t stream, bool pdl) {
  constexpr Plan kPlan = make_plan(kLogN);
  const auto kernel = hadamard_kernel<T, kLogN, kVec>;
  // The exchange's rows are padded (row_floats(): 33 floats for every 32), so a block needs
  // rows * row_floats() floats, not rows * N: sizing it by N made every N >= 1024 write past
  // the allocation (the illegal address GpuHadamard saw on the H200).
  const size_t smem = static_cast<size_t>(kPlan.rows) * kPlan.row_floats() * sizeof(float);
  if (smem > 48 * 1024) {
    // Above the default dynamic limit (N >= 16384: 66 or 132 KiB for the one row).
    if (const cudaError_t err = cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        err != cudaSuccess) {
      cudaGetLastError();
      return err;
    }
  }
  const int64_t groups = (rows + kPlan.rows - 1) / kPlan.rows;
  int64_t blocks = groups;
  // The exchanged sizes pipeline groups in a block: a grid of what the SMs hold at once, when
  // there are more groups than that (decode sizes keep one group per block).
  if (pipelined<T, kLogN, kVec>() && groups > 1024) {
    int dev = 0;
    int sms = 0;
    int per_sm = 0;
    // The blocks live for the whole launch, so the grid must not exceed what is resident:
    // the most shared memory per SM (the kernel does not use L1) so that registers alone
    // limit it, as the occupancy query assumes, rather than a carveout the driver picks.
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared) == cudaSuccess &&
        cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kPlan.threads(), smem) ==
            cudaSuccess &&
        sms > 0 && per_sm > 0) {
      blocks = std::min<int64_t>(groups, int64_t{sms} * per_sm);
    } else {
      cudaGetLastError();  // one group per block still works
    }
  }
  const cudaError_t err =
      device::launch(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kPlan.threads()), smem,
                     stream, pdl, x, out, rows, scale);
  if (err != cudaSuccess) cudaGetLastError();  // returned, not left for a later check
  return err;
}

// 16-byte vectors (or the whole chunk when it is shorter) where both pointers allow them,
// else one element at a time: two instantiations per (dtype, N).
template <typename T, int kLogN>
cudaError_t launch_n(const T* x, T* out, int64_t rows, float scale, cudaStream_t stream, bool pdl) {
  constexpr int kChunk = 1 << make_plan(kLogN).a;
  constexpr int kWide =
      16 / static_cast<int>(sizeof(T)) < kChunk ? 16 / static_cast<int>(sizeof(T)) : kChunk;
  if (device::max_vec_elems<T>(int64_t{1} << kLogN, x, out) >= kWide) {
    return launch<T, kLogN, kWide>(x, out, rows, scale, stream, pdl);
  }
  return launch<T, kLogN, 1>(x, out, rows, scale, stream, pdl);
}

template <typename T, int kLogN = 1>
cudaError_t launch_log_n(int log_n, const T* x, T* out, int64_t rows, float scale,
                         cudaStream_t stream, bool pdl) {
  if constexpr (kLogN < 15) {
    if (log_n != kLogN) {
      return launch_log_n<T, kLogN + 1>(log_n, x, out, rows, scale, stream, pdl);
    }
  }
  return launch_n<T, kLogN>(x, out, rows, scale, stream, pdl);
}

}  // namespace

KernelStatus hadamard_transform_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double scale) {
  const char* op = ctx.op();
  const int64_t rows = x.shape[0];
  const int64_t n = x.shape[1];
  if (const KernelStatus st = check_hadamard_n(ctx, n); !st.ok()) return st;
  if (rows == 0) return kOk;
  if (rows > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: T = %lld rows is more than one launch takes", op,
                    static_cast<long long>(rows));
  }
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, x, [&](auto tag) {
    using T = decltype(tag);
    return device::launch_status(
        ctx, op,
        launch_log_n<T>(hadamard_log2(n), data_ptr<const T>(x), data_ptr<T>(out), rows,
                        static_cast<float>(scale), stream, ctx.pdl()));
  });
}

}  // namespace kreg::quantization
