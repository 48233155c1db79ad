// CUDA interior-point LP solver for the lplb group: the CPU reference's Mehrotra
// predictor-corrector (reference.cpp) in one thread block, in double precision.
//
// Launch shape: one block of kThreads threads; everything lives in dynamic shared memory.
// On sm_90, when A is 16-byte aligned and longer than one round of the block's loads, the
// block is the leader of a cluster of kReaders blocks that only help read A (step 1) and
// then exit (H100, the 256/288/8 demo LP: 131.0 -> 123.8 us a solve).
//   1. A (dense f32 in global memory) is read once when 16-byte aligned: chunks of 2048
//      floats (16 float4 a lane in flight, behind a call so they do not share a register
//      allocation with the iterations' values), chunk c to warp c % (kWarps * readers) of
//      the cluster; a chunk's nonzeros are staged (flat index, value) in the leader's
//      shared memory (distributed shared memory for the other blocks) with one atomic a
//      chunk, then placed in row-major order by a scan of the chunk counts: A by rows
//      (CSR). One SM alone reads the 314 KB of the demo LP at ~18 GB/s. Unaligned, A is
//      read twice (count per warp range, then compact). A by columns (CSC) is filled from
//      the CSR and each column sorted by row, so every sum below runs in a fixed order
//      (bitwise deterministic).
//   2. Rows 0..k-1 that share no column form a diagonal block of A D A'; the other
//      r = m - k rows are eliminated densely: coupling W (stored transposed, r x k), Schur
//      complement S (r x r), Cholesky of S by warp 0. For build_lp's LP, k = L experts,
//      r = G GPUs. Every column has at most one entry in rows < k (its "diagonal row" e(j),
//      by the definition of k).
//   3. S = A_G D A_G' - W' Dinv W without column searches: once per solve (r <= 32, when
//      they fit in chol's unused tail) two lists per pair (g >= h) of S: the columns where
//      rows k+g and k+h are both nonzero, with both values, and the rows i < k whose W row
//      is structurally nonzero at g and at h (W's pattern: a 64-bit mask a row). An S entry
//      then sums its own short lists, z_g the rows of its diagonal pair; 8 lanes an item.
//      Otherwise (r > 32, or lists too long) an entry searches a column of row k+h for
//      each entry of row k+g and sums over all i < k.
//   4. r <= 8: warp 0 factors and solves entirely in registers (a row a lane, the pivot and
//      l_j by shuffles, 1 / L_pp by rsqrt kept on the diagonal so the solves multiply);
//      r = 9..48: a row (two for r > 32) a lane in shared memory, z in registers.
//   5. The starting point's two solves (b and A c) share one factor and one pass of each
//      phase. Each iteration: 7 barriers. The time is the latency of the phases between
//      them, not flops or bytes, so each phase keeps its serial chain short: rows >= k
//      (long: a GPU's replicas) are summed by a warp each, rows < k by a thread each.
//      - The step is folded into the residual phase: x, s and y are double-buffered (the
//        second buffers in rc's, rd's and rp's regions), the pending step x + ap dx,
//        s + ad ds, y + ad dy is taken where it is read (explicit fma: the same bits
//        everywhere) and stored to the other buffer; the pointers swap. (x, s) and (dx, ds)
//        are 16-byte pairs.
//      - The factor's rows < k (dinv, W) and the predictor's rhs = rp + A(x + d rd) ride in
//        the same pass: a row's thread recomputes d_j and rd_j of its columns from the
//        (pending) iterate, the same expressions as the column's owner.
//      - rd is recomputed with A' dy in the affine step's column pass (the same sum, the
//        same bits) and kept in the old x buffer for the corrector; mu_aff comes from three
//        sums taken in that step's reduction; rc is recomputed where it is used.
//      - The corrector's rhs = rhs_pred + A((dx ds - sigma mu) / s) in place; warp 0 sums
//        its z from the lists (or all i < k) itself before its solve.
//      - A column's thread recomputes dy of its diagonal row (the same expression as the
//        row's own: the same bits) instead of waiting for it.
//      - Reductions: maxima and minima of values >= 0 exactly by two 32-bit redux (hi word,
//        then lo word) instead of five double shuffles; beta, the norms and tol are kept in
//        shared memory through the iterations (128 registers, no spills).
// tools/bench/variants/lplb_solve_bench.cu holds the earlier kernels (V0, V1, V2) and this
// one (V3), their per-phase profiles and the check of each against the CPU solve.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "args.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/warp.cuh"
#include "lplb.hpp"

namespace kreg::lplb {
namespace {

using device::kFullWarpMask;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / device::kWarpSize;
constexpr int kRedValues = 5;
constexpr int kUnroll = 8;  // the unaligned path: V1's two passes, 8 loads a lane in flight
// The aligned path reads A once in chunks of 32 lanes x kReadUnroll float4 (2048 floats),
// chunk c to warp c % kWarps; one more chunk holds the < 4 trailing floats.
constexpr int kReadUnroll = 16;
constexpr int kChunkVecs = 32 * kReadUnroll;
constexpr int kMaxChunks = (kMaxRows * kMaxCols / 4 + kChunkVecs - 1) / kChunkVecs + 1;

struct Layout {
  size_t x, s, dx, ds, d, rd, rc, cs;  // n doubles each
  size_t y, dy, rp, rhs, bs, dinv;     // m doubles each
  size_t wt, chol, z, red;
  size_t csr_val, csc_val;
  size_t csr_col, csc_row, coo_row;
  size_t row_ptr, col_ptr, col_fill;
  size_t misc;
  size_t total;
};

constexpr int kMiscInts = kWarps + 8;
constexpr int kMiscNnz = kWarps + 0;
constexpr int kMiscK = kWarps + 1;
constexpr int kMiscTooLarge = kWarps + 2;
constexpr int kMiscStage = kWarps + 3;  // the one-pass read's staging counter
constexpr int kMiscLists = kWarps + 4;  // the lists fit (1) or not (0)
constexpr int kGroup = 8;               // lanes a Schur item
constexpr int kItemsPerWarp = 32 / kGroup;
constexpr int kListMaxR = 32;  // lists only for r <= 32: W's pattern in a 64-bit mask, short build
constexpr int kListMaxPairs = kListMaxR * (kListMaxR + 1) / 2;

// Regions reused before they are live (V1's layout, region for region: the same limits):
//  - the one-pass read stages (flat index, value) of each nonzero in wt (free until the
//    start point) and keeps its chunk table (staging offset, count, CSR offset) in chol;
//  - during the list build wt holds W's pattern (k uint64) and the two count arrays;
//  - the lists live in chol past the factor's r * ld doubles: int2 offsets[P + 1], then
//    list 1's int4 entries and list 2's int rows;
//  - rc's region is x's second buffer (as (x, s) pairs over rd's and rc's), rp's is y's;
//    the start point's second z lives in rp's region (free until the first residual);
//  - beta, the norms' denominators and tol live in coo_row (free after the build).
static_assert(sizeof(uint32_t) * kMaxNnz + sizeof(float) * kMaxNnz <= sizeof(double) * kMaxCoupling,
              "staging must fit in wt");
static_assert(sizeof(int) * (3 * kMaxChunks + 1) <= sizeof(double) * kMaxDense * kMaxDense,
              "the chunk table must fit in chol");
static_assert(sizeof(uint64_t) * kMaxRows + 2 * sizeof(int) * kListMaxPairs <=
                  sizeof(double) * kMaxCoupling,
              "W's pattern and the counts must fit in wt");
static_assert(sizeof(double) * kListMaxR * (kListMaxR + 1) + 16 +
                      2 * sizeof(int) * (kListMaxPairs + 1) <=
                  sizeof(double) * kMaxDense * kMaxDense,
              "the offsets must fit in chol's tail");
static_assert(sizeof(double) * 5 <= sizeof(uint16_t) * kMaxNnz,
              "the kept values must fit in coo_row");
static_assert(kWarps == 16, "the reducer's pairwise tree");
static_assert(kMaxRows * kMaxCols < (1 << 30), "flat indices in 32 bits");

__host__ __device__ inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

__host__ __device__ inline Layout make_layout(int m, int n) {
  Layout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + bytes, 16);
    return at;
  };
  const size_t nd = sizeof(double) * static_cast<size_t>(n);
  const size_t md = sizeof(double) * static_cast<size_t>(m);
  l.x = take(nd), l.s = take(nd), l.dx = take(nd), l.ds = take(nd);
  l.d = take(nd), l.rd = take(nd), l.rc = take(nd), l.cs = take(nd);
  l.y = take(md), l.dy = take(md), l.rp = take(md), l.rhs = take(md), l.bs = take(md);
  l.dinv = take(md);
  l.wt = take(sizeof(double) * kMaxCoupling);
  l.chol = take(sizeof(double) * kMaxDense * kMaxDense);
  l.z = take(sizeof(double) * kMaxDense);
  l.red = take(sizeof(double) * 2 * kRedValues * kWarps);
  l.csr_val = take(sizeof(float) * kMaxNnz);
  l.csc_val = take(sizeof(float) * kMaxNnz);
  l.csr_col = take(sizeof(uint16_t) * kMaxNnz);
  l.csc_row = take(sizeof(uint16_t) * kMaxNnz);
  l.coo_row = take(sizeof(uint16_t) * kMaxNnz);
  l.row_ptr = take(sizeof(int) * static_cast<size_t>(m + 1));
  l.col_ptr = take(sizeof(int) * static_cast<size_t>(n + 1));
  l.col_fill = take(sizeof(int) * static_cast<size_t>(n));
  l.misc = take(sizeof(int) * kMiscInts);
  l.total = off;
  return l;
}

__device__ inline size_t align16(size_t v) { return (v + 15) / 16 * 16; }

// Exact warp maxima / minima of doubles >= 0 (their bit patterns order as the values: +inf
// above every finite value; a NaN is above +inf, so a max keeps it and a min drops it).
__device__ inline double warp_max_pos(double v) {
  const unsigned hi = static_cast<unsigned>(__double2hiint(v));
  const unsigned lo = static_cast<unsigned>(__double2loint(v));
  const unsigned mh = __reduce_max_sync(kFullWarpMask, hi);
  const unsigned ml = __reduce_max_sync(kFullWarpMask, hi == mh ? lo : 0u);
  return __hiloint2double(static_cast<int>(mh), static_cast<int>(ml));
}
__device__ inline double warp_min_pos(double v) {
  const unsigned hi = static_cast<unsigned>(__double2hiint(v));
  const unsigned lo = static_cast<unsigned>(__double2loint(v));
  const unsigned mh = __reduce_min_sync(kFullWarpMask, hi);
  const unsigned ml = __reduce_min_sync(kFullWarpMask, hi == mh ? lo : 0xffffffffu);
  return __hiloint2double(static_cast<int>(mh), static_cast<int>(ml));
}

struct Reducer {
  double* red;
  int half = 0;

  // NS sums, NM maxima, NN minima, every thread gets the block's values. kPos: the maxima
  // and minima are of values >= 0 (warp_max_pos / warp_min_pos instead of 5 shuffles).
  // The warps' partials are stored value-major and read as pairs (16-byte loads).
  template <int NS, int NM, int NN, bool kPos = false>
  __device__ void run(double (&v)[NS + NM + NN]) {
    constexpr int N = NS + NM + NN;
    static_assert(N <= kRedValues);
    static_assert(kWarps == 16, "the pairwise tree below");
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double* buf = red + half * kRedValues * kWarps;
    half ^= 1;
    auto op = [](int i, double a, double b) {
      return i < NS ? a + b : i < NS + NM ? fmax(a, b) : fmin(a, b);
    };
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (kPos && i >= NS) {
        v[i] = i < NS + NM ? warp_max_pos(v[i]) : warp_min_pos(v[i]);
      } else {
        for (int off = 16; off > 0; off /= 2)
          v[i] = op(i, v[i], __shfl_xor_sync(kFullWarpMask, v[i], off));
      }
      if (lane == 0) buf[i * kWarps + warp] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const double2* b = reinterpret_cast<const double2*>(buf + i * kWarps);
      double2 q[8];
#pragma unroll
      for (int w = 0; w < 8; ++w) q[w] = b[w];
      double a[4];
#pragma unroll
      for (int w = 0; w < 4; ++w)
        a[w] = op(i, op(i, q[w].x, q[w].y), op(i, q[w + 4].x, q[w + 4].y));
      v[i] = op(i, op(i, a[0], a[1]), op(i, a[2], a[3]));
    }
  }
};

struct Lp {
  int m, n, k, r, ld;
  const float *csr_val, *csc_val;
  const uint16_t *csr_col, *csc_row;
  const int *row_ptr, *col_ptr;
};

// The column's row in the diagonal block, if any: its first (at most one is < k).
__device__ inline int diag_row_of(const Lp& lp, int j) {
  const int q = lp.col_ptr[j];
  return q < lp.col_ptr[j + 1] && lp.csc_row[q] < lp.k ? lp.csc_row[q] : -1;
}

__device__ inline double entry(const Lp& lp, int row, int j) {
  for (int q = lp.col_ptr[j]; q < lp.col_ptr[j + 1]; ++q) {
    if (lp.csc_row[q] == row) return lp.csc_val[q];
  }
  return 0;
}

// sum_p a[row, p] * val(col p) over a row by thread (rows < k: short) ...
template <typename F>
__device__ inline double row_sum(const Lp& lp, int i, F val) {
  double acc = 0;
  for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) acc += lp.csr_val[p] * val(lp.csr_col[p]);
  return acc;
}
// ... or by warp (rows >= k: long), lane-strided then a butterfly: every lane gets it.
template <typename F>
__device__ inline double row_sum_warp(const Lp& lp, int i, F val) {
  double acc = 0;
  for (int p = lp.row_ptr[i] + device::lane_id(); p < lp.row_ptr[i + 1]; p += 32)
    acc += lp.csr_val[p] * val(lp.csr_col[p]);
  return device::warp_sum(acc);
}
// (A' v)_j with v[e] replaced by ve for the column's diagonal row e (if any): CSC order.
__device__ inline double col_sum(const Lp& lp, int j, const double* v, int e, double ve) {
  double acc = 0;
  int q = lp.col_ptr[j];
  if (e >= 0) acc += lp.csc_val[q++] * ve;
  for (; q < lp.col_ptr[j + 1]; ++q) acc += lp.csc_val[q] * v[lp.csc_row[q]];
  return acc;
}

// Rows 0..k-1 of the factor at the starting point (d = 1): dinv_i = 1 / sum_j a_ij^2 and
// W'[g][i] = sum_j a_ij a_gj (column j's entries past its first are all in rows >= k).
__device__ inline void diag_w_row_unit(const Lp& lp, int i, double* dinv, double* wt) {
  const int k = lp.k, r = lp.r;
  for (int g = 0; g < r; ++g) wt[g * k + i] = 0;
  double acc = 0;
  for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) {
    const int j = lp.csr_col[p];
    const double dav = static_cast<double>(lp.csr_val[p]);
    acc += dav * lp.csr_val[p];
    for (int q = lp.col_ptr[j] + 1; q < lp.col_ptr[j + 1]; ++q)
      wt[(lp.csc_row[q] - k) * k + i] += dav * lp.csc_val[q];
  }
  dinv[i] = 1.0 / (acc > kTinyDiag ? acc : kSkippedPivot);
}

// dy_i for a row i < k once dy[k..m) holds the dense part: the same expression wherever it
// is evaluated (the row's thread, or the thread of one of its columns), so the same bits.
__device__ inline double dy_row(const Lp& lp, int i, const double* rhs, const double* dinv,
                                const double* wt, const double* dy) {
  double acc = rhs[i];
  for (int g = 0; g < lp.r; ++g) acc -= wt[g * lp.k + i] * dy[lp.k + g];
  return acc * dinv[i];
}

// The Schur lists (see the top: 3.), from one base (the start of chol's tail, 16-byte aligned):
// int2 off[P + 1] (list 1's and list 2's offsets of pair e), then list 1's entries
// {a[k+g][j], a[k+h][j], j} (int4, in row k+g's column order), then list 2's rows i < k
// (int, in order). One pointer and a flag live through the iterations.
struct Lists {
  bool on;
  const int* base;
  __device__ const int2* off() const { return reinterpret_cast<const int2*>(base); }
  __device__ static int entries_at(int pairs) { return (2 * (pairs + 1) + 3) / 4 * 4; }
  __device__ const int4* list1(int pairs) const {
    return reinterpret_cast<const int4*>(base + entries_at(pairs));
  }
  __device__ const int* list2(int pairs) const {
    return reinterpret_cast<const int*>(list1(pairs) + off()[pairs].x);
  }
};

// Pair e = g (g + 1) / 2 + h of S's lower triangle (g >= h).
__device__ inline void pair_of(int e, int& g, int& h) {
  g = static_cast<int>((sqrtf(8.0f * e + 1.0f) - 1.0f) * 0.5f);
  while (g * (g + 1) / 2 > e) --g;
  while ((g + 1) * (g + 2) / 2 <= e) ++g;
  h = e - g * (g + 1) / 2;
}

// Groups of kGroup lanes: items < P the pairs (g >= h) of S, the r after them the sums
// z_g = rhs_g - sum_i W[i][g] rhs_i / diag_i, and r more for rhs2 (into z2) when given
// (the starting point's two solves). S goes to chol[g * ld + h]. With lists, an item sums
// its own; without, an entry searches a column of row k+h for each entry of row k+g, and
// sums over all i < k.
__device__ void schur_and_z(const Lp& lp, const Lists& ls, const double* d, const double* dinv,
                            const double* wt, const double* rhs, double* chol, double* z,
                            const double* rhs2 = nullptr, double* z2 = nullptr) {
  const int tid = threadIdx.x, k = lp.k, r = lp.r;
  const int warp = tid / 32, sub = (tid % 32) / kGroup, glane = tid % kGroup;
  const int pairs = r * (r + 1) / 2;
  const int items1 = pairs + r;
  const int items = items1 + (rhs2 != nullptr ? r : 0);
  for (int base = warp * kItemsPerWarp; base < items; base += kWarps * kItemsPerWarp) {
    const int item = base + sub;
    double acc = 0;
    int g = 0, h = 0;
    if (item < pairs) {
      pair_of(item, g, h);
      const double* wg = wt + g * k;
      const double* wh = wt + h * k;
      double corr = 0;
      if (ls.on) {
        const int2 o0 = ls.off()[item], o1 = ls.off()[item + 1];
        const int4* l1 = ls.list1(pairs);
        const int* l2 = ls.list2(pairs);
        for (int t = o0.x + glane; t < o1.x; t += kGroup) {
          const int4 e = l1[t];
          acc += d[e.z] * __int_as_float(e.x) * __int_as_float(e.y);
        }
        for (int t = o0.y + glane; t < o1.y; t += kGroup) {
          const int i = l2[t];
          corr += wg[i] * wh[i] * dinv[i];
        }
      } else {
        const int row = k + g;
        for (int p = lp.row_ptr[row] + glane; p < lp.row_ptr[row + 1]; p += kGroup) {
          const int j = lp.csr_col[p];
          acc += d[j] * lp.csr_val[p] * entry(lp, k + h, j);
        }
        for (int i = glane; i < k; i += kGroup) corr += wg[i] * wh[i] * dinv[i];
      }
      acc -= corr;
    } else if (item < items) {
      const double* rr = item < items1 ? rhs : rhs2;
      g = item < items1 ? item - pairs : item - items1;
      const double* wg = wt + g * k;
      if (ls.on) {
        const int e = g * (g + 3) / 2;  // the diagonal pair (g, g)
        const int* l2 = ls.list2(pairs);
        for (int t = ls.off()[e].y + glane; t < ls.off()[e + 1].y; t += kGroup) {
          const int i = l2[t];
          acc += wg[i] * rr[i] * dinv[i];
        }
      } else {
        for (int i = glane; i < k; i += kGroup) acc += wg[i] * rr[i] * dinv[i];
      }
    }
    acc = device::warp_sum(acc, kGroup);
    if (glane == 0) {
      if (item < pairs) {
        chol[g * lp.ld + h] = acc;
      } else if (item < items1) {
        z[g] = rhs[k + g] - acc;
      } else if (item < items) {
        z2[g] = rhs2[k + g] - acc;
      }
    }
  }
}

// Warp 0: z_g = rhs_g - sum_i W[i][g] rhs_i / diag_i for g < r (the corrector's), lanes
// sharing a g (4 for r <= 8, 2 for r <= 16) over its list-2 rows (or all i < k).
__device__ void z_warp(const Lp& lp, const Lists& ls, const double* dinv, const double* wt,
                       const double* rhs, double* z) {
  const int lane = threadIdx.x % 32, k = lp.k, r = lp.r;
  const int width = r <= 8 ? 4 : r <= 16 ? 2 : 1;
  const int per_round = 32 / width;
  for (int g0 = 0; g0 < r; g0 += per_round) {
    const int g = g0 + lane / width;
    double acc = 0;
    if (g < r) {
      const double* wg = wt + g * k;
      if (ls.on) {
        const int e = g * (g + 3) / 2;
        const int* l2 = ls.list2(r * (r + 1) / 2);
        for (int t = ls.off()[e].y + lane % width; t < ls.off()[e + 1].y; t += width) {
          const int i = l2[t];
          acc += wg[i] * rhs[i] * dinv[i];
        }
      } else {
        for (int i = lane % width; i < k; i += width) acc += wg[i] * rhs[i] * dinv[i];
      }
    }
    acc = device::warp_sum(acc, width);
    if (g < r && lane % width == 0) z[g] = rhs[k + g] - acc;
  }
}

// A row of S's pairs for the list build: whether row `row` has an entry in column j (its
// value, 0 when not), columns sorted by row so the search stops early.
__device__ inline float value_at(const Lp& lp, int row, int j) {
  for (int q = lp.col_ptr[j]; q < lp.col_ptr[j + 1]; ++q) {
    const int rq = lp.csc_row[q];
    if (rq >= row) return rq == row ? lp.csc_val[q] : 0.0f;
  }
  return 0.0f;
}

// Warp 0: Cholesky of S in place (lower triangle, row stride ld), rows lane and lane + 32.
__device__ void chol_warp(double* c, int r, int ld) {
  const int lane = threadIdx.x % 32;
  double md = 0;
  for (int g = lane; g < r; g += 32) md = fmax(md, c[g * ld + g]);
  for (int off = 16; off > 0; off /= 2) md = fmax(md, __shfl_xor_sync(kFullWarpMask, md, off));
  const int i0 = lane, i1 = lane + 32;
  for (int p = 0; p < r; ++p) {
    const double piv = c[p * ld + p];
    const double lpp = piv > kRelPivotTol * md && piv > 0 ? sqrt(piv) : kSkippedPivot;
    double l0 = 0, l1 = 0;
    if (i0 > p && i0 < r) {
      l0 = c[i0 * ld + p] / lpp;
      c[i0 * ld + p] = l0;
    }
    if (i1 > p && i1 < r) {
      l1 = c[i1 * ld + p] / lpp;
      c[i1 * ld + p] = l1;
    }
    __syncwarp();
    if (lane == 0) c[p * ld + p] = lpp;
    if (i0 > p && i0 < r) {
      for (int j = p + 1; j <= i0; ++j) c[i0 * ld + j] -= l0 * c[j * ld + p];
    }
    if (i1 > p && i1 < r) {
      for (int j = p + 1; j <= i1; ++j) c[i1 * ld + j] -= l1 * c[j * ld + p];
    }
    __syncwarp();
  }
}

// Warp 0: z <- (L L')^-1 z, z held a row a lane (two for r > 32); the result to out[0..r).
__device__ void tri_warp(const double* c, int r, int ld, const double* z, double* out) {
  const int lane = threadIdx.x % 32;
  double z0 = lane < r ? z[lane] : 0, z1 = lane + 32 < r ? z[lane + 32] : 0;
  for (int p = 0; p < r; ++p) {
    const double zp = __shfl_sync(kFullWarpMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane > p && lane < r) z0 -= c[lane * ld + p] * zp;
    if (lane + 32 > p && lane + 32 < r) z1 -= c[(lane + 32) * ld + p] * zp;
  }
  for (int p = r - 1; p >= 0; --p) {
    const double zp = __shfl_sync(kFullWarpMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane < p) z0 -= c[p * ld + lane] * zp;
    if (lane + 32 < p) z1 -= c[p * ld + lane + 32] * zp;
  }
  if (lane < r) out[lane] = z0;
  if (lane + 32 < r) out[lane + 32] = z1;
}
// Warp 0, r <= RM (8): Cholesky of S entirely in registers, row `lane` of the lower
// triangle in a[0..RM) (unrolled, so a[] stays in registers), no shared memory and no
// __syncwarp inside: step p broadcasts the pivot (a shuffle), every lane takes its
// reciprocal square root, scales its column entry and receives l_j from lane j (shuffles
// independent of each other) for its update. The diagonal keeps 1 / L_pp (LIPSOL's rule:
// 1 / 1e128 for a skipped pivot); only the solves use it, as a multiplier. L goes back to
// chol[] (row stride ld) for the solves.
template <int RM>
__device__ void chol_reg(double* c, int r, int ld) {
  const int lane = threadIdx.x % 32;
  double a[RM];
#pragma unroll
  for (int j = 0; j < RM; ++j) a[j] = lane < r && j <= lane ? c[lane * ld + j] : 0.0;
  double md = 0;
#pragma unroll
  for (int j = 0; j < RM; ++j) md = j == lane ? a[j] : md;
  for (int off = 16; off > 0; off /= 2) md = fmax(md, __shfl_xor_sync(kFullWarpMask, md, off));
#pragma unroll
  for (int p = 0; p < RM; ++p) {
    if (p >= r) break;
    const double piv = __shfl_sync(kFullWarpMask, a[p], p);
    const bool ok = piv > kRelPivotTol * md && piv > 0;
    const double inv = ok ? rsqrt(piv) : 1.0 / kSkippedPivot;
    a[p] = lane == p ? inv : a[p] * inv;
#pragma unroll
    for (int j = p + 1; j < RM; ++j) {
      const double lj = __shfl_sync(kFullWarpMask, a[p], j);
      if (lane >= j && lane < r) a[j] -= a[p] * lj;
    }
  }
  if (lane < r) {
#pragma unroll
    for (int j = 0; j < RM; ++j) {
      if (j <= lane) c[lane * ld + j] = a[j];
    }
  }
  __syncwarp();
}

// Warp 0, r <= RM: zv[v] <- (L L')^-1 zv[v] for NV vectors at once (their chains
// interleave), component `lane` in a register. Row `lane` of L and column `lane` are loaded
// first (independent of the chain); a step is a multiply, a shuffle and a multiply-add.
template <int RM, int NV>
__device__ void tri_reg(const double* c, int r, int ld, double (&zv)[NV]) {
  const int lane = threadIdx.x % 32;
  double row[RM], col[RM];
#pragma unroll
  for (int j = 0; j < RM; ++j) {
    row[j] = lane < r && j <= lane ? c[lane * ld + j] : 0.0;  // L[lane][j], diagonal 1 / L_jj
    col[j] = lane < r && j < r && j > lane ? c[j * ld + lane] : 0.0;  // L[j][lane]
  }
#pragma unroll
  for (int p = 0; p < RM; ++p) {
    if (p >= r) break;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const double wp = __shfl_sync(kFullWarpMask, zv[v] * row[p], p);
      zv[v] = lane == p ? wp : lane > p ? zv[v] - row[p] * wp : zv[v];
    }
  }
#pragma unroll
  for (int p = RM - 1; p >= 0; --p) {
    if (p >= r) continue;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const double xp = __shfl_sync(kFullWarpMask, zv[v] * row[p], p);
      zv[v] = lane == p ? xp : lane < p ? zv[v] - col[p] * xp : zv[v];
    }
  }
}

template <int RM>
__device__ void dense_reg(double* c, int r, int ld, bool factor, const double* za, double* outa,
                          const double* zb, double* outb) {
  const int lane = threadIdx.x % 32;
  if (factor) chol_reg<RM>(c, r, ld);
  if (zb != nullptr) {
    double zz[2] = {lane < r ? za[lane] : 0.0, lane < r ? zb[lane] : 0.0};
    tri_reg<RM, 2>(c, r, ld, zz);
    if (lane < r) {
      outa[lane] = zz[0];
      outb[lane] = zz[1];
    }
  } else {
    double zz[1] = {lane < r ? za[lane] : 0.0};
    tri_reg<RM, 1>(c, r, ld, zz);
    if (lane < r) outa[lane] = zz[0];
  }
}

// Warp 0: factor S (when `factor`) and solve for za (and zb) into outa (outb). r <= 8 in
// registers; r = 9..48 V1's shared-memory factor and solve (a row, two for r > 32, a lane),
// whose diagonal keeps L_pp. Every call of one solve takes the same path. (A 16-row register
// instance spilled ~250 bytes at 128 registers: the kernel is at its 512-thread limit.)
__device__ void dense_solve(double* c, int r, int ld, bool factor, const double* za, double* outa,
                            const double* zb = nullptr, double* outb = nullptr) {
  if (r <= 8) {
    dense_reg<8>(c, r, ld, factor, za, outa, zb, outb);
  } else {
    if (factor) chol_warp(c, r, ld);
    __syncwarp();
    tri_warp(c, r, ld, za, outa);
    if (zb != nullptr) tri_warp(c, r, ld, zb, outb);
  }
}

__device__ void block_scan(const int* counts, int* out, int len, int* scratch) {
  const int tid = threadIdx.x;
  const int chunk = (len + kThreads - 1) / kThreads;
  const int begin = min(len, tid * chunk), end = min(len, begin + chunk);
  int local = 0;
  for (int i = begin; i < end; ++i) local += counts[i];
  int total = 0;
  const int run = device::block_exclusive_scan(local, scratch, &total);
  device::serial_exclusive_scan(counts, out, begin, end, run);
  if (tid == kThreads - 1) out[len] = total;
  __syncthreads();
}

template <int kVec>
__device__ inline void load_vec(const float* __restrict__ a, int64_t v, int64_t v1, float* out) {
  if (v < v1) {
    if constexpr (kVec == 4) {
      const float4 q = reinterpret_cast<const float4*>(a)[v];
      out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
    } else {
      out[0] = a[v];
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = 0.0f;
  }
}

// Pass 0: each warp counts the nonzeros of its range (per lane, one warp sum at the end).
template <int kVec>
__device__ void count_a(const float* __restrict__ a, int64_t total, int* count) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t vecs = total / kVec;
  const int64_t per_warp = (vecs + kWarps - 1) / kWarps;
  const int64_t v0 = min(vecs, warp * per_warp), v1 = min(vecs, v0 + per_warp);
  int found = 0;
  for (int64_t base = v0; base < v1; base += 32 * kUnroll) {
    float vals[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_vec<kVec>(a, base + u * 32 + lane, v1, vals[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) found += vals[u][e] != 0.0f ? 1 : 0;
    }
  }
  found = device::warp_sum(found);
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    found += __popc(__ballot_sync(kFullWarpMask, v != 0.0f));
  }
  if (lane == 0) count[warp] = found;
}

// Pass 1: compaction in row-major order from each warp's base (V0's, 8 vectors a lane).
template <int kVec>
__device__ void compact_a(const float* __restrict__ a, int64_t total, const int* warp_base,
                          float* csr_val, uint16_t* csr_col, uint16_t* coo_row, int n) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t vecs = total / kVec;
  const int64_t per_warp = (vecs + kWarps - 1) / kWarps;
  const int64_t v0 = min(vecs, warp * per_warp), v1 = min(vecs, v0 + per_warp);
  int pos = warp_base[warp];
  for (int64_t base = v0; base < v1; base += 32 * kUnroll) {
    float vals[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_vec<kVec>(a, base + u * 32 + lane, v1, vals[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int mine = 0;
#pragma unroll
      for (int e = 0; e < kVec; ++e) mine += vals[u][e] != 0.0f ? 1 : 0;
      const int inc = device::warp_inclusive_scan(mine);
      const int warp_total = __shfl_sync(kFullWarpMask, inc, 31);
      int at = pos + inc - mine;
      const int64_t flat0 = (base + u * 32 + lane) * kVec;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (vals[u][e] != 0.0f) {
          if (at < kMaxNnz) {
            const int64_t flat = flat0 + e;
            csr_val[at] = vals[u][e];
            csr_col[at] = static_cast<uint16_t>(flat % n);
            coo_row[at] = static_cast<uint16_t>(flat / n);
          }
          ++at;
        }
      }
      pos += warp_total;
    }
  }
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    const unsigned nz = __ballot_sync(kFullWarpMask, v != 0.0f);
    if (v != 0.0f) {
      const int at = pos + __popc(nz & ((1u << lane) - 1u));
      if (at < kMaxNnz) {
        csr_val[at] = v;
        csr_col[at] = static_cast<uint16_t>(flat % n);
        coo_row[at] = static_cast<uint16_t>(flat / n);
      }
    }
  }
}

// The aligned path's one pass over A: chunk c (kChunkVecs float4, flat order u, lane, e) to
// warp c % kWarps, kReadUnroll loads a lane in flight. A chunk's nonzeros go to a staging
// segment reserved with one shared atomic (any order of chunks), in the chunk's flat order
// (ballots give each lane's rank); the chunk table keeps (segment, count). The last chunk
// holds the < 4 trailing floats. The CSR offsets come from a scan of the counts in chunk
// order afterwards, so the compacted order is V1's row-major one. A call, not inlined: its
// 16 float4 a lane in flight then do not share one register allocation with the values that
// live through the iterations (inlined, the kernel spilled 52 bytes at 128 registers; as a
// call, none, and no stack frame).
//
// With a cluster of `readers` blocks (sm_90), block `rank` takes chunks rank * kWarps + warp,
// + readers * kWarps, ...: one SM keeps only so many bytes of loads in flight (~18 GB/s
// measured for the whole 314 KB on one SM), so the read is spread over the cluster's SMs;
// counter, staging and chunk table are the leader's (distributed shared memory), and the
// leader's block takes the trailing floats.
__device__ __noinline__ void read_a_once(const float* __restrict__ a, int64_t total, int nmain,
                                         int first, int step, bool tail, int* counter,
                                         uint32_t* stage_idx, float* stage_val, int* chunk_soff,
                                         int* chunk_cnt) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lt = (1u << lane) - 1u;
  const int64_t vecs = total / 4;
  const float4* a4 = reinterpret_cast<const float4*>(a);
  for (int c = first; c < nmain; c += step) {
    const int64_t base = static_cast<int64_t>(c) * kChunkVecs;
    float4 q[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) {
      const int64_t v = base + u * 32 + lane;
      q[u] = v < vecs ? a4[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    int mine = 0;
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) {
      mine += (q[u].x != 0.0f) + (q[u].y != 0.0f) + (q[u].z != 0.0f) + (q[u].w != 0.0f);
    }
    const int cnt = device::warp_sum(mine);
    int off = 0;
    if (lane == 0) off = atomicAdd(counter, cnt);
    off = __shfl_sync(kFullWarpMask, off, 0);
    if (lane == 0 && c < kMaxChunks) {
      chunk_soff[c] = off;
      chunk_cnt[c] = cnt;
    }
    int run = off;
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) {
      const float e4[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
      unsigned bal[4];
      int before = 0, all = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bal[e] = __ballot_sync(kFullWarpMask, e4[e] != 0.0f);
        before += __popc(bal[e] & lt);
        all += __popc(bal[e]);
      }
      int at = run + before;
      const uint32_t flat0 = static_cast<uint32_t>((base + u * 32 + lane) * 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (e4[e] != 0.0f) {
          if (at < kMaxNnz) {
            stage_idx[at] = flat0 + e;
            stage_val[at] = e4[e];
          }
          ++at;
        }
      }
      run += all;
    }
  }
  if (tail && warp == nmain % kWarps) {
    const int64_t flat = vecs * 4 + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    const unsigned nz = __ballot_sync(kFullWarpMask, v != 0.0f);
    int off = 0;
    if (lane == 0) off = atomicAdd(counter, __popc(nz));
    off = __shfl_sync(kFullWarpMask, off, 0);
    if (v != 0.0f) {
      const int at = off + __popc(nz & lt);
      if (at < kMaxNnz) {
        stage_idx[at] = static_cast<uint32_t>(flat);
        stage_val[at] = v;
      }
    }
    if (lane == 0 && nmain < kMaxChunks) {
      chunk_soff[nmain] = off;
      chunk_cnt[nmain] = __popc(nz);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4, int readers) {
  // PDL (KREG_LAUNCH_PDL): the next kernel may be scheduled at once; A, b and c may be the
  // previous kernel's output (build_lp), x and status may still be read by it.
  device::pdl_launch_dependents();
  device::pdl_wait();
  extern __shared__ __align__(16) unsigned char smem[];
  const Layout L = make_layout(m, n);
  auto dv = [&](size_t off) { return reinterpret_cast<double*>(smem + off); };
  // Column data in 16-byte pairs (one load, one pointer): xs[j] = (x_j, s_j) over x's and
  // s's regions, dxs[j] = (dx_j, ds_j) over dx's and ds's, xs2 the second buffer of xs over
  // rd's and rc's; y2 is y's second buffer (rp's region). The pending step is stored to the
  // second buffers, then the pointers swap.
  double2 *xs = reinterpret_cast<double2*>(smem + L.x),
          *dxs = reinterpret_cast<double2*>(smem + L.dx),
          *xs2 = reinterpret_cast<double2*>(smem + L.rd);
  double *d = dv(L.d), *cs = dv(L.cs);
  double *y = dv(L.y), *dy = dv(L.dy), *y2 = dv(L.rp), *rhs = dv(L.rhs), *bs = dv(L.bs),
         *dinv = dv(L.dinv);
  double *wt = dv(L.wt), *chol = dv(L.chol), *z = dv(L.z);
  float* csr_val = reinterpret_cast<float*>(smem + L.csr_val);
  float* csc_val = reinterpret_cast<float*>(smem + L.csc_val);
  uint16_t* csr_col = reinterpret_cast<uint16_t*>(smem + L.csr_col);
  uint16_t* csc_row = reinterpret_cast<uint16_t*>(smem + L.csc_row);
  uint16_t* coo_row = reinterpret_cast<uint16_t*>(smem + L.coo_row);
  int* row_ptr = reinterpret_cast<int*>(smem + L.row_ptr);
  int* col_ptr = reinterpret_cast<int*>(smem + L.col_ptr);
  int* col_fill = reinterpret_cast<int*>(smem + L.col_fill);
  int* misc = reinterpret_cast<int*>(smem + L.misc);
  // Reused regions (see the static_asserts at the top).
  uint32_t* stage_idx = reinterpret_cast<uint32_t*>(smem + L.wt);
  float* stage_val = reinterpret_cast<float*>(stage_idx + kMaxNnz);
  int* chunk_soff = reinterpret_cast<int*>(smem + L.chol);
  int* chunk_cnt = chunk_soff + kMaxChunks;
  int* chunk_coff = chunk_cnt + kMaxChunks;  // kMaxChunks + 1
  double* red_buf = dv(L.red);
  Reducer red{red_buf};
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t total = static_cast<int64_t>(m) * n;

  if (tid == 0) misc[kMiscStage] = 0;
  for (int j = tid; j < n; j += kThreads) col_fill[j] = 0;
  __syncthreads();
  const int64_t vecs = total / 4;
  const int nmain = static_cast<int>((vecs + kChunkVecs - 1) / kChunkVecs);
  // nchunks is defined here on sm_90 and below the read of A elsewhere: ptxas keeps 128
  // registers without spills only so (the other placement spills 40 bytes on sm_90, this
  // one 16 on sm_80); the value is the same.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int nchunks = nmain + 1;
  namespace cg = cooperative_groups;
  if (readers > 1) {
    // The cluster's blocks: every rank zeroed its counter above; the leader's is the one
    // used, and the barrier orders that zero before any remote add.
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());
    if (rank != 0) {
      if (vec4) {
        read_a_once(a_g, total, nmain, rank * kWarps + warp, readers * kWarps, false,
                    cluster.map_shared_rank(&misc[kMiscStage], 0),
                    cluster.map_shared_rank(stage_idx, 0), cluster.map_shared_rank(stage_val, 0),
                    cluster.map_shared_rank(chunk_soff, 0), cluster.map_shared_rank(chunk_cnt, 0));
      }
      cluster.sync();  // the leader reads the staging after this (release / acquire)
      return;
    }
  }
#endif

  // ---- One phase: the scales' partial maxima (b and c kept in registers) and A ----
  float bv[2], cv[4];
  double scale[2] = {0, 0};
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = tid + u * kThreads;
    bv[u] = i < m ? b_g[i] : 0.0f;
    scale[0] = fmax(scale[0], fabs(static_cast<double>(bv[u])));
  }
  for (int i = tid + 2 * kThreads; i < m; i += kThreads)
    scale[0] = fmax(scale[0], fabs(static_cast<double>(b_g[i])));
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int j = tid + u * kThreads;
    cv[u] = j < n ? c_g[j] : 0.0f;
    scale[1] = fmax(scale[1], fabs(static_cast<double>(cv[u])));
  }
  for (int j = tid + 4 * kThreads; j < n; j += kThreads)
    scale[1] = fmax(scale[1], fabs(static_cast<double>(c_g[j])));
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
  const int nchunks = nmain + 1;
#endif
  if (vec4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int step = readers * kWarps;
#else
    constexpr int step = kWarps;  // no cluster below sm_90 (and no register kept for one)
#endif
    read_a_once(a_g, total, nmain, warp, step, true, &misc[kMiscStage], stage_idx, stage_val,
                chunk_soff, chunk_cnt);
  } else {
    count_a<1>(a_g, total, misc);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (readers > 1) cooperative_groups::this_cluster().sync();  // the other ranks' chunks
#endif
  for (int off = 16; off > 0; off /= 2) {
    scale[0] = fmax(scale[0], __shfl_xor_sync(kFullWarpMask, scale[0], off));
    scale[1] = fmax(scale[1], __shfl_xor_sync(kFullWarpMask, scale[1], off));
  }
  // The scales' partials go to the reducer's second half (its first run uses the first).
  double* scale_part = red_buf + kRedValues * kWarps;
  if (lane == 0) {
    scale_part[warp] = scale[0];
    scale_part[kWarps + warp] = scale[1];
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    scale[0] = fmax(scale[0], scale_part[w]);
    scale[1] = fmax(scale[1], scale_part[kWarps + w]);
  }
  const double beta = scale[0] > 0 && isfinite(scale[0]) ? scale[0] : 1.0;
  const double gamma = scale[1] > 0 && isfinite(scale[1]) ? scale[1] : 1.0;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = tid + u * kThreads;
    if (i < m) bs[i] = bv[u] / beta;
  }
  for (int i = tid + 2 * kThreads; i < m; i += kThreads) bs[i] = b_g[i] / beta;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int j = tid + u * kThreads;
    if (j < n) cs[j] = cv[u] / gamma;
  }
  for (int j = tid + 4 * kThreads; j < n; j += kThreads) cs[j] = c_g[j] / gamma;

  int nnz = 0;
  bool too_large = false;
  if (vec4) {
    nnz = misc[kMiscStage];
    too_large = nnz > kMaxNnz || nchunks > kMaxChunks;
    if (!too_large) block_scan(chunk_cnt, chunk_coff, nchunks, misc);
    if (!too_large) {
      // Staging to CSR (row-major: chunks in order), counting each column's entries.
      for (int c = warp; c < nchunks; c += kWarps) {
        const int cnt = chunk_cnt[c], so = chunk_soff[c], co = chunk_coff[c];
        for (int t = lane; t < cnt; t += 32) {
          const uint32_t flat = stage_idx[so + t];
          const int col = static_cast<int>(flat % static_cast<uint32_t>(n));
          csr_val[co + t] = stage_val[so + t];
          csr_col[co + t] = static_cast<uint16_t>(col);
          coo_row[co + t] = static_cast<uint16_t>(flat / static_cast<uint32_t>(n));
          atomicAdd(&col_fill[col], 1);
        }
      }
    }
    if (tid == 0) misc[kMiscK] = m;
    __syncthreads();
  } else {
    // V1's two passes (count above, compact here), then the column counts.
    if (tid == 0) {
      int run = 0;
      for (int w2 = 0; w2 < kWarps; ++w2) {
        const int c = misc[w2];
        misc[w2] = run;
        run += c;
      }
      misc[kMiscNnz] = run;
      misc[kMiscK] = m;
      misc[kMiscTooLarge] = run > kMaxNnz ? 1 : 0;
    }
    __syncthreads();
    nnz = misc[kMiscNnz];
    too_large = misc[kMiscTooLarge] != 0;
    if (!too_large) compact_a<1>(a_g, total, misc, csr_val, csr_col, coo_row, n);
    __syncthreads();
    if (!too_large) {
      for (int p = tid; p < nnz; p += kThreads) atomicAdd(&col_fill[csr_col[p]], 1);
    }
    __syncthreads();
  }
  if (!too_large) {
    for (int p = tid; p < nnz; p += kThreads) {
      const int row = coo_row[p];
      const int prev = p == 0 ? -1 : coo_row[p - 1];
      for (int i = prev + 1; i <= row; ++i) row_ptr[i] = p;
    }
    if (tid == 0) {
      const int last = nnz == 0 ? -1 : coo_row[nnz - 1];
      for (int i = last + 1; i <= m; ++i) row_ptr[i] = nnz;
    }
    block_scan(col_fill, col_ptr, n, misc);
    for (int j = tid; j < n; j += kThreads) col_fill[j] = 0;
  }
  __syncthreads();
  if (!too_large) {
    for (int p = tid; p < nnz; p += kThreads) {
      const int j = csr_col[p];
      const int at = col_ptr[j] + atomicAdd(&col_fill[j], 1);
      csc_row[at] = coo_row[p];
      csc_val[at] = csr_val[p];
    }
  }
  __syncthreads();
  if (!too_large) {
    for (int j = tid; j < n; j += kThreads) {
      int lo = 1 << 30, second = 1 << 30;
      for (int q = col_ptr[j]; q < col_ptr[j + 1]; ++q) {
        const int row = csc_row[q];
        if (row < lo) {
          second = lo;
          lo = row;
        } else if (row < second) {
          second = row;
        }
      }
      if (second < m) atomicMin(&misc[kMiscK], second);
    }
  }
  __syncthreads();
  const int k = misc[kMiscK];
  const int r = m - k;
  too_large = too_large || r > kMaxDense || static_cast<int64_t>(k) * r > kMaxCoupling;
  if (!too_large) {
    for (int j = tid; j < n; j += kThreads) {
      for (int q = col_ptr[j] + 1; q < col_ptr[j + 1]; ++q) {
        const uint16_t row = csc_row[q];
        const float val = csc_val[q];
        int p = q - 1;
        while (p >= col_ptr[j] && csc_row[p] > row) {
          csc_row[p + 1] = csc_row[p];
          csc_val[p + 1] = csc_val[p];
          --p;
        }
        csc_row[p + 1] = row;
        csc_val[p + 1] = val;
      }
    }
  }
  __syncthreads();
  if (too_large) {
    for (int j = tid; j < n; j += kThreads) x_out[j] = 0.0f;
    if (tid == 0) {
      status[kStatusConverged] = 0.0f;
      status[kStatusPrimalRes] = -1.0f;
      status[kStatusDualRes] = -1.0f;
      status[kStatusGap] = -1.0f;
      status[kStatusIterations] = 0.0f;
      status[kStatusObjective] = 0.0f;
      status[kStatusReason] = static_cast<float>(kReasonTooLarge);
      status[kStatusDiagRows] = static_cast<float>(k);
    }
    return;
  }
  // Rows of the factor padded to r + 1 doubles (odd: a lane a bank pair) where that fits.
  const Lp lp{m,       n,       k,       r,      r < kMaxDense ? r + 1 : r, csr_val, csc_val,
              csr_col, csc_row, row_ptr, col_ptr};
  const int ld = lp.ld;
  // Rows >= k go to warps from the last one down (rows < k fill the first threads).
  const int wrow0 = kWarps - 1 - warp;

  // Kept in shared memory (coo_row's region, free after the build) rather than in registers
  // through the iterations: beta (0), the norms' denominators 1 + |b|, 1 + |c| (2, 3), tol (4).
  double* keep = dv(L.coo_row);
  if (tid == 0) {
    keep[0] = beta;
    keep[4] = tol;
  }

  // ---- The Schur lists (r <= 32): W's pattern, the counts (a warp a pair, ballots), the
  // offsets (warp 0's scans), then the lists in order when they fit in chol's tail ----
  const int pairs = r * (r + 1) / 2;
  int* lbase = reinterpret_cast<int*>(smem + L.chol + align16(sizeof(double) * r * ld));
  bool lists_on = false;
  if (r >= 1 && r <= kListMaxR) {
    uint64_t* wmask = reinterpret_cast<uint64_t*>(smem + L.wt);  // k, then the counts
    int* cnt1 = reinterpret_cast<int*>(wmask + k);
    int* cnt2 = cnt1 + pairs;
    int2* off = reinterpret_cast<int2*>(lbase);
    int4* l1 = reinterpret_cast<int4*>(lbase + Lists::entries_at(pairs));
    for (int i = tid; i < k; i += kThreads) {
      uint64_t mk = 0;
      for (int p = row_ptr[i]; p < row_ptr[i + 1]; ++p) {
        const int j = csr_col[p];
        for (int q = col_ptr[j] + 1; q < col_ptr[j + 1]; ++q) mk |= 1ull << (csc_row[q] - k);
      }
      wmask[i] = mk;
    }
    __syncthreads();
    // Pass 0 counts, pass 1 fills (list 1 in row k+g's order, list 2 in row order).
    const unsigned lt = (1u << lane) - 1u;
    for (int pass = 0; pass < 2; ++pass) {
      int* l2 = pass == 0 ? nullptr : reinterpret_cast<int*>(l1 + off[pairs].x);
      for (int e = warp; e < pairs; e += kWarps) {
        int g, h;
        pair_of(e, g, h);
        int at1 = pass == 0 ? 0 : off[e].x, at2 = pass == 0 ? 0 : off[e].y;
        const int end = row_ptr[k + g + 1];
        for (int p0 = row_ptr[k + g]; p0 < end; p0 += 32) {
          const int p = p0 + lane;
          const int j = p < end ? csr_col[p] : 0;
          const float ah = p < end ? value_at(lp, k + h, j) : 0.0f;
          const unsigned hit = __ballot_sync(kFullWarpMask, ah != 0.0f);
          if (pass == 1 && ah != 0.0f) {
            l1[at1 + __popc(hit & lt)] =
                make_int4(__float_as_int(csr_val[p]), __float_as_int(ah), j, 0);
          }
          at1 += __popc(hit);
        }
        const uint64_t both = (1ull << g) | (1ull << h);
        for (int i0 = 0; i0 < k; i0 += 32) {
          const int i = i0 + lane;
          const bool in = i < k && (wmask[i] & both) == both;
          const unsigned hit = __ballot_sync(kFullWarpMask, in);
          if (pass == 1 && in) l2[at2 + __popc(hit & lt)] = i;
          at2 += __popc(hit);
        }
        if (pass == 0 && lane == 0) {
          cnt1[e] = at1;
          cnt2[e] = at2;
        }
      }
      __syncthreads();
      if (pass == 0) {
        if (warp == 0) {
          int run1 = 0, run2 = 0;
          for (int e0 = 0; e0 < pairs; e0 += 32) {
            const int e = e0 + lane;
            const int c1 = e < pairs ? cnt1[e] : 0, c2 = e < pairs ? cnt2[e] : 0;
            const int i1 = device::warp_inclusive_scan(c1), i2 = device::warp_inclusive_scan(c2);
            if (e < pairs) off[e] = make_int2(run1 + i1 - c1, run2 + i2 - c2);
            run1 += __shfl_sync(kFullWarpMask, i1, 31);
            run2 += __shfl_sync(kFullWarpMask, i2, 31);
          }
          if (lane == 0) {
            off[pairs] = make_int2(run1, run2);
            const size_t need = reinterpret_cast<unsigned char*>(l1 + run1) - (smem + L.chol) +
                                sizeof(int) * static_cast<size_t>(run2);
            misc[kMiscLists] = need <= sizeof(double) * kMaxDense * kMaxDense ? 1 : 0;
          }
        }
        __syncthreads();
        lists_on = misc[kMiscLists] != 0;
        if (!lists_on) break;  // block-uniform
      }
    }
  }
  const Lists ls{lists_on, lbase};

  // ---- Mehrotra's starting point: both solves (b and A c) through one factor ----
  for (int j = tid; j < n; j += kThreads) d[j] = 1.0;
  for (int i = tid; i < k; i += kThreads) {
    diag_w_row_unit(lp, i, dinv, wt);
    rhs[i] = row_sum(lp, i, [&](int j) { return cs[j]; });
  }
  for (int g = wrow0; g < r; g += kWarps) {
    const double v = row_sum_warp(lp, k + g, [&](int j) { return cs[j]; });
    if (lane == 0) rhs[k + g] = v;
  }
  __syncthreads();
  double* z2 = y2;  // free until the first residual phase
  schur_and_z(lp, ls, d, dinv, wt, bs, chol, z, rhs, z2);
  __syncthreads();
  if (warp == 0) dense_solve(chol, r, ld, true, z, dy + k, z2, y + k);
  __syncthreads();
  for (int i = tid; i < k; i += kThreads) {
    dy[i] = dy_row(lp, i, bs, dinv, wt, dy);
    y[i] = dy_row(lp, i, rhs, dinv, wt, y);
  }
  double mm[4] = {0, 0, INFINITY, INFINITY};
  for (int i = tid; i < m; i += kThreads) mm[0] = fmax(mm[0], fabs(bs[i]));
  for (int j = tid; j < n; j += kThreads) {
    const int e = diag_row_of(lp, j);
    const double dye = e >= 0 ? dy_row(lp, e, bs, dinv, wt, dy) : 0.0;
    const double ye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, y) : 0.0;
    const double xj = col_sum(lp, j, dy, e, dye);
    const double sj = cs[j] - col_sum(lp, j, y, e, ye);
    xs[j] = make_double2(xj, sj);
    mm[1] = fmax(mm[1], fabs(cs[j]));
    mm[2] = fmin(mm[2], xj);
    mm[3] = fmin(mm[3], sj);
  }
  red.run<0, 2, 2>(mm);  // min x, min s may be negative: the general reduction
  if (tid == 0) {
    keep[2] = 1 + mm[0];
    keep[3] = 1 + mm[1];
  }
  // No step pending: zeros (the residual phase takes x + 0 * 0 = x, bit for bit).
  for (int i = tid; i < m; i += kThreads) dy[i] = 0.0;
  if (n > 0) {
    const double dxs0 = fmax(-1.5 * mm[2], 0.0), dss0 = fmax(-1.5 * mm[3], 0.0);
    double sums[3] = {0, 0, 0};
    for (int j = tid; j < n; j += kThreads) {
      const double xj = xs[j].x + dxs0, sj = xs[j].y + dss0;
      xs[j] = make_double2(xj, sj);
      sums[0] += xj * sj;
      sums[1] += xj;
      sums[2] += sj;
      dxs[j] = make_double2(0.0, 0.0);
    }
    red.run<3, 0, 0>(sums);
    const double shift_x = sums[2] > 0 ? 0.5 * sums[0] / sums[2] : 0;
    const double shift_s = sums[1] > 0 ? 0.5 * sums[0] / sums[1] : 0;
    for (int j = tid; j < n; j += kThreads) {
      xs[j] =
          make_double2(fmax(xs[j].x + shift_x, kStartFloor), fmax(xs[j].y + shift_s, kStartFloor));
    }
  }
  __syncthreads();

  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  double ap = 0, ad = 0;  // the pending step's lengths (dx, ds, dy are zero before the first)
  int it = 0;
  for (;; ++it) {
    // (1) The pending step, taken where it is read: x + ap dx, s + ad ds, y + ad dy (the
    // owners store them to the second buffers); residuals, objectives, d; rows < k: dinv,
    // W, and every row the predictor's rhs = rp + A t, t = x + d rd, with d_j and rd_j of
    // the row's columns recomputed from the same expressions (the same bits).
    auto xsn_of = [&](int j) {
      const double2 v0 = xs[j], dv0 = dxs[j];
      return make_double2(__fma_rn(ap, dv0.x, v0.x), __fma_rn(ad, dv0.y, v0.y));
    };
    auto yn_of = [&](int q) { return __fma_rn(ad, dy[q], y[q]); };
    double v[5] = {0, 0, 0, 0, 0};  // c'x, b'y, x's; max |rp|, max |rd|
    for (int j = tid; j < n; j += kThreads) {
      const double2 xsn = xsn_of(j);
      double aty = 0;
      for (int q = col_ptr[j]; q < col_ptr[j + 1]; ++q) aty += csc_val[q] * yn_of(csc_row[q]);
      const double rdj = cs[j] - aty - xsn.y;
      xs2[j] = xsn;
      d[j] = xsn.x / xsn.y;
      v[0] += cs[j] * xsn.x;
      v[2] += xsn.x * xsn.y;
      v[4] = fmax(v[4], fabs(rdj));
    }
    for (int i = tid; i < k; i += kThreads) {
      const double yi = yn_of(i);
      y2[i] = yi;
      v[1] += bs[i] * yi;
      for (int g = 0; g < r; ++g) wt[g * k + i] = 0;
      double ax = 0, at = 0, dd = 0;
      for (int p = row_ptr[i]; p < row_ptr[i + 1]; ++p) {
        const int j = csr_col[p];
        const double a = csr_val[p];
        const double2 xsn = xsn_of(j);
        const double dj = xsn.x / xsn.y;
        const double dav = dj * a;
        // Column j: A' y for rd_j (all its rows, in order) and W[i][g] += d_j a_ij a_gj
        // (its entries past the first: rows >= k).
        const int q0 = col_ptr[j];
        double aty = csc_val[q0] * yn_of(csc_row[q0]);
        for (int q = q0 + 1; q < col_ptr[j + 1]; ++q) {
          const int row = csc_row[q];
          aty += csc_val[q] * yn_of(row);
          wt[(row - k) * k + i] += dav * csc_val[q];
        }
        const double rdj = cs[j] - aty - xsn.y;
        ax += a * xsn.x;
        at += a * (xsn.x + dj * rdj);
        dd += dav * a;
      }
      const double rp = bs[i] - ax;
      rhs[i] = at + rp;
      dinv[i] = 1.0 / (dd > kTinyDiag ? dd : kSkippedPivot);
      v[3] = fmax(v[3], fabs(rp));
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const int i = k + g;
      double ax = 0, at = 0;
      for (int p = row_ptr[i] + lane; p < row_ptr[i + 1]; p += 32) {
        const int j = csr_col[p];
        const double a = csr_val[p];
        const double2 xsn = xsn_of(j);
        double aty = 0;
        for (int q = col_ptr[j]; q < col_ptr[j + 1]; ++q) aty += csc_val[q] * yn_of(csc_row[q]);
        const double rdj = cs[j] - aty - xsn.y;
        ax += a * xsn.x;
        at += a * (xsn.x + xsn.x / xsn.y * rdj);
      }
      ax = device::warp_sum(ax);
      at = device::warp_sum(at);
      if (lane == 0) {
        const double yi = yn_of(i);
        y2[i] = yi;
        v[1] += bs[i] * yi;
        const double rp = bs[i] - ax;
        rhs[i] = at + rp;
        v[3] = fmax(v[3], fabs(rp));
      }
    }
    red.run<3, 2, 0, true>(v);
    {
      double2* t2 = xs;
      xs = xs2, xs2 = t2;
      double* t = y;
      y = y2, y2 = t;
    }
    prel = v[3] / keep[2];
    drel = v[4] / keep[3];
    gap = fabs(v[0] - v[1]) / (1 + fabs(v[0]));
    if (!isfinite(prel + drel + gap + v[2])) {
      reason = kReasonBreakdown;
      break;
    }
    const double tol_ = keep[4];
    if (prel <= tol_ && drel <= tol_ && gap <= tol_) {
      reason = kReasonConverged;
      break;
    }
    if (it == max_iter) break;
    const double mu = v[2] / n;

    // (2) S and the predictor's z.
    schur_and_z(lp, ls, d, dinv, wt, rhs, chol, z);
    __syncthreads();
    // (3) Cholesky and the predictor's dy_G (warp 0, registers for r <= 8).
    if (warp == 0) dense_solve(chol, r, ld, true, z, dy + k);
    __syncthreads();
    // (4) dy_K; rd (kept in the old xs buffer for the corrector) and A' dy in one column
    // pass; ds, dx, the affine step lengths and the three sums that give mu_aff.
    double* rdv = reinterpret_cast<double*>(xs2);
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    double st[5] = {0, 0, 0, INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      int q = col_ptr[j];
      double aty = 0, atdy = 0;
      if (e >= 0) {
        aty += csc_val[q] * y[e];
        atdy += csc_val[q] * dy_row(lp, e, rhs, dinv, wt, dy);
        ++q;
      }
      for (; q < col_ptr[j + 1]; ++q) {
        const int row = csc_row[q];
        aty += csc_val[q] * y[row];
        atdy += csc_val[q] * dy[row];
      }
      const double2 xsj = xs[j];
      const double rdj = cs[j] - aty - xsj.y;
      const double dsj = rdj - atdy;
      const double dxj = -xsj.x - d[j] * dsj;
      rdv[j] = rdj;
      dxs[j] = make_double2(dxj, dsj);
      st[0] += dxj * xsj.y;
      st[1] += xsj.x * dsj;
      st[2] += dxj * dsj;
      if (dxj < 0) st[3] = fmin(st[3], -xsj.x / dxj);
      if (dsj < 0) st[4] = fmin(st[4], -xsj.y / dsj);
    }
    red.run<3, 0, 2, true>(st);
    const double ap_aff = fmin(1.0, st[3]), ad_aff = fmin(1.0, st[4]);
    const double mu_aff = v[2] + ap_aff * st[0] + ad_aff * st[1] + ap_aff * ad_aff * st[2];
    const double ratio = mu_aff / n / mu;
    const double cube = ratio * ratio * ratio;
    const double sigma = cube < 0 ? 0.0 : (1.0 < cube ? 1.0 : cube);
    const double smu = sigma * mu;
    // (5) The corrector's rhs = rhs_pred + A u, u = t_corr - t_pred = (dx ds - sigma mu) / s
    // (affine dx, ds), in place by the row's owner.
    auto u_of = [&](int j) {
      const double2 dv0 = dxs[j];
      return (dv0.x * dv0.y - smu) / xs[j].y;
    };
    for (int i = tid; i < k; i += kThreads) rhs[i] += row_sum(lp, i, u_of);
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, u_of);
      if (lane == 0) rhs[k + g] += sum;
    }
    __syncthreads();
    // (6) Warp 0: the corrector's z (its own sums) and dy_G.
    if (warp == 0) {
      z_warp(lp, ls, dinv, wt, rhs, z);
      __syncwarp();
      dense_solve(chol, r, ld, false, z, dy + k);
    }
    __syncthreads();
    // (7) dy_K, ds = rd - A' dy, dx = rc / s - d ds (rc from the affine dx, ds, read before
    // they are overwritten), the step lengths: the step is taken in (1).
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    double steps[2] = {INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rdv[j] - col_sum(lp, j, dy, e, dye);
      const double2 xsj = xs[j], aff = dxs[j];
      const double rcj = smu - xsj.x * xsj.y - aff.x * aff.y;
      const double dxj = rcj / xsj.y - d[j] * dsj;
      dxs[j] = make_double2(dxj, dsj);
      if (dxj < 0) steps[0] = fmin(steps[0], -xsj.x / dxj);
      if (dsj < 0) steps[1] = fmin(steps[1], -xsj.y / dsj);
    }
    red.run<0, 0, 2, true>(steps);
    ap = fmin(1.0, kStepFactor * steps[0]);
    ad = fmin(1.0, kStepFactor * steps[1]);
  }

  const double beta_out = keep[0];
  double obj[1] = {0};
  for (int j = tid; j < n; j += kThreads) {
    const double xj = xs[j].x;
    x_out[j] = static_cast<float>(xj * beta_out);
    obj[0] += static_cast<double>(c_g[j]) * xj * beta_out;
  }
  red.run<1, 0, 0>(obj);
  if (tid == 0) {
    status[kStatusConverged] = reason == kReasonConverged ? 1.0f : 0.0f;
    status[kStatusPrimalRes] = static_cast<float>(prel);
    status[kStatusDualRes] = static_cast<float>(drel);
    status[kStatusGap] = static_cast<float>(gap);
    status[kStatusIterations] = static_cast<float>(it);
    status[kStatusObjective] = static_cast<float>(obj[0]);
    status[kStatusReason] = static_cast<float>(reason);
    status[kStatusDiagRows] = static_cast<float>(k);
  }
}

// The kernel's dynamic shared-memory limit, raised once per device to what a call needs.
constexpr int kMaxDevices = 64;
std::atomic<int> g_smem_set[kMaxDevices];

// Blocks of the cluster that reads A (sm_90): kReaders where a cluster of kReaders blocks
// with `smem` bytes each can be resident, else 1. Cached per device and size (the answer
// depends on both; the size changes rarely). 4 rather than 8 (H100, demo LP: 123.8 against
// 124.7 us; one block 131.0).
constexpr int kReaders = 4;
std::atomic<int64_t> g_readers[kMaxDevices];  // (smem << 8) | readers, 0 = not asked

int cluster_readers(int dev, size_t smem) {
  const int64_t key = static_cast<int64_t>(smem) << 8;
  if (dev >= 0 && dev < kMaxDevices) {
    const int64_t known = g_readers[dev].load(std::memory_order_relaxed);
    if (known != 0 && (known & ~int64_t{0xff}) == key) return static_cast<int>(known & 0xff);
  }
  // Below sm_90 the query fails and max_active_clusters answers 0 (its error cleared).
  const int readers =
      device::max_active_clusters(ipm_kernel, kReaders, dim3(kThreads), smem) > 0 ? kReaders : 1;
  if (dev >= 0 && dev < kMaxDevices) g_readers[dev].store(key | readers, std::memory_order_relaxed);
  return readers;
}

}  // namespace

KernelStatus solve_cuda(Context& ctx, const DLTensor& a, const DLTensor& b, const DLTensor& c,
                        DLTensor& out_x, DLTensor& out_status, int64_t max_iter, double tol) {
  if (KernelStatus st = check_solve(ctx, max_iter, tol); !st.ok()) return st;
  const int64_t m = a.shape[0], n = a.shape[1];
  if (m > kMaxRows || n > kMaxCols) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "lplb.solve: argument 'a' is [%lld,%lld]; the CUDA solver takes at most "
                    "[%d,%d] (one block's shared memory)",
                    static_cast<long long>(m), static_cast<long long>(n), kMaxRows, kMaxCols);
  }
  const Layout layout = make_layout(static_cast<int>(m), static_cast<int>(n));
  // The shared-memory limit and attribute below are the current device's: a's.
  const device::DeviceGuard guard(a);
  if (!guard.ok()) return guard.fail(ctx, "lplb.solve");
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    return ctx.fail(KREG_INTERNAL, "lplb.solve: no current CUDA device");
  }
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (layout.total > static_cast<size_t>(optin)) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "lplb.solve: argument 'a' is [%lld,%lld]: the solver needs %zu bytes of "
                    "shared memory, this device has %d per block",
                    static_cast<long long>(m), static_cast<long long>(n), layout.total, optin);
  }
  if (dev < kMaxDevices) {
    std::atomic<int>& set = g_smem_set[dev];
    if (set.load(std::memory_order_relaxed) < static_cast<int>(layout.total)) {
      const cudaError_t err = cudaFuncSetAttribute(
          ipm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(layout.total));
      if (err != cudaSuccess) {
        return ctx.fail(KREG_INTERNAL, "lplb.solve: cannot reserve %zu bytes of shared memory: %s",
                        layout.total, cudaGetErrorString(err));
      }
      set.store(static_cast<int>(layout.total), std::memory_order_relaxed);
    }
  } else {
    cudaFuncSetAttribute(ipm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(layout.total));
  }
  const float* a_ptr = data_ptr<const float>(a);
  const bool vec4 = device::aligned16(a_ptr);
  // A of more than one round of the block's loads (kWarps chunks) is read by a cluster of
  // kReaders blocks on sm_90, where kReaders SMs of one GPC can each hold the solver's
  // shared memory (asked once per device); one block elsewhere.
  const int64_t nmain = (m * n / 4 + kChunkVecs - 1) / kChunkVecs;
  auto launch = [&](int readers) {
    return device::launch_clusters(
        ipm_kernel, dim3(static_cast<unsigned>(readers)), dim3(kThreads), layout.total,
        static_cast<cudaStream_t>(ctx.stream()), ctx.pdl(), static_cast<unsigned>(readers), a_ptr,
        data_ptr<const float>(b), data_ptr<const float>(c), data_ptr<float>(out_x),
        data_ptr<float>(out_status), static_cast<int>(m), static_cast<int>(n),
        static_cast<int>(max_iter), tol, vec4, readers);
  };
  const int readers = vec4 && nmain > kWarps ? cluster_readers(dev, layout.total) : 1;
  cudaError_t err = launch(readers);
  if (err != cudaSuccess && readers > 1) {
    // The cluster refused after all (the occupancy query does not see every limit, e.g. a
    // partitioned GPU): one block reads A alone, as below sm_90.
    cudaGetLastError();
    err = launch(1);
  }
  return device::launch_status(ctx, "lplb.solve", err);
}

}  // namespace kreg::lplb
