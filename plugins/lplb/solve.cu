// CUDA interior-point LP solver for the lplb group: the CPU reference's Mehrotra
// predictor-corrector (reference.cpp) in one thread block, in double precision.
//
// Launch shape: one block of kThreads threads; everything lives in dynamic shared memory.
//   1. A (dense f32 in global memory) is read twice, flat and coalesced (16-byte vectors
//      when aligned): once to count nonzeros per warp chunk, once to compact them in
//      row-major order (ballot + prefix), which gives A by rows (CSR) directly. A by
//      columns (CSC) is filled from it and each column sorted by row, so every sum below
//      runs in a fixed order (bitwise deterministic).
//   2. Rows 0..k-1 that share no column form a diagonal block of A D A'; the other
//      r = m - k rows are eliminated densely: coupling W (k x r), Schur complement S
//      (r x r), Cholesky of S by warp 0. For build_lp's LP, k = L experts, r = G GPUs.
//   3. Each iteration: residuals, one factorisation, two solves (predictor, corrector),
//      step lengths by block reductions. About 20 barriers per iteration.
// Doubles cost little here: the work is a few thousand multiply-adds per phase and the
// time goes to barriers and reductions.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "args.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/warp.cuh"
#include "lplb.hpp"

namespace kreg::lplb {
namespace {

using device::kFullWarpMask;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / device::kWarpSize;
constexpr int kGroupLanes = 16;  // lanes that share one (row, row) sum in the dense parts
constexpr int kRedValues = 5;    // values reduced together at most
constexpr int kUnroll = 4;       // 16-byte loads in flight per lane while reading A

// Shared-memory layout, in bytes from the start, for an m x n LP. Doubles first.
struct Layout {
  size_t x, s, dx, ds, d, rd, t, cs;  // n doubles each
  size_t y, dy, rp, rhs, bs, diag;    // m doubles each
  size_t w, chol, z, red;
  size_t csr_val, csc_val;            // kMaxNnz floats
  size_t csr_col, csc_row, coo_row;   // kMaxNnz uint16
  size_t row_ptr, col_ptr, col_fill;  // m + 1, n + 1, n ints
  size_t misc;                        // kMiscInts ints
  size_t total;
};

constexpr int kMiscInts = kWarps + 8;
// misc slots after the kWarps per-warp counts:
constexpr int kMiscNnz = kWarps + 0;
constexpr int kMiscK = kWarps + 1;
constexpr int kMiscTooLarge = kWarps + 2;

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
  l.d = take(nd), l.rd = take(nd), l.t = take(nd), l.cs = take(nd);
  l.y = take(md), l.dy = take(md), l.rp = take(md), l.rhs = take(md), l.bs = take(md);
  l.diag = take(md);
  l.w = take(sizeof(double) * kMaxCoupling);
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

// Block-wide reductions of up to kRedValues doubles: the first NS summed, the next NM
// maxed, the rest minned; every thread gets the same bits (butterfly within warps, then
// each thread adds the warp results in warp order). `buf` alternates between two scratch
// halves so one barrier per reduction suffices: a half is rewritten only after a later
// reduction's barrier, which every reader of it has passed.
struct Reducer {
  double* red;
  int half = 0;

  template <int NS, int NM, int NN>
  __device__ void run(double (&v)[NS + NM + NN]) {
    constexpr int N = NS + NM + NN;
    static_assert(N <= kRedValues);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double* buf = red + half * kRedValues * kWarps;
    half ^= 1;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      for (int off = 16; off > 0; off /= 2) {
        const double o = __shfl_xor_sync(kFullWarpMask, v[i], off);
        v[i] = i < NS ? v[i] + o : i < NS + NM ? fmax(v[i], o) : fmin(v[i], o);
      }
      if (lane == 0) buf[i * kWarps + warp] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) {
      double acc = buf[i * kWarps];
      for (int w = 1; w < kWarps; ++w) {
        const double o = buf[i * kWarps + w];
        acc = i < NS ? acc + o : i < NS + NM ? fmax(acc, o) : fmin(acc, o);
      }
      v[i] = acc;
    }
  }
};

// Sum over the kGroupLanes lanes of a group (aligned half-warps); all 32 lanes call it.
__device__ inline double group_sum(double v) { return device::warp_sum(v, kGroupLanes); }

struct Lp {
  int m, n, k, r;
  const float *csr_val, *csc_val;
  const uint16_t *csr_col, *csc_row;
  const int *row_ptr, *col_ptr;
};

// (A v)_i and (A' v)_j.
__device__ inline double row_dot(const Lp& lp, int i, const double* v) {
  double acc = 0;
  for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) acc += lp.csr_val[p] * v[lp.csr_col[p]];
  return acc;
}
__device__ inline double col_dot(const Lp& lp, int j, const double* v) {
  double acc = 0;
  for (int q = lp.col_ptr[j]; q < lp.col_ptr[j + 1]; ++q) acc += lp.csc_val[q] * v[lp.csc_row[q]];
  return acc;
}
__device__ inline double entry(const Lp& lp, int row, int j) {
  for (int q = lp.col_ptr[j]; q < lp.col_ptr[j + 1]; ++q) {
    if (lp.csc_row[q] == row) return lp.csc_val[q];
  }
  return 0;
}

// M = A diag(d) A' factorised as in reference.cpp's NormalEquations::factor.
// Contains barriers: every thread calls it.
__device__ void factor(const Lp& lp, const double* d, double* diag, double* w, double* chol) {
  const int tid = threadIdx.x, k = lp.k, r = lp.r;
  for (int i = tid; i < k; i += kThreads) {
    double* wi = w + i * r;
    for (int g = 0; g < r; ++g) wi[g] = 0;
    double acc = 0;
    for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) {
      const int j = lp.csr_col[p];
      const double dav = d[j] * lp.csr_val[p];
      acc += dav * lp.csr_val[p];
      for (int q = lp.col_ptr[j]; q < lp.col_ptr[j + 1]; ++q) {
        const int row = lp.csc_row[q];
        if (row >= k) wi[row - k] += dav * lp.csc_val[q];
      }
    }
    // Stored as the reciprocal: the solves multiply by it.
    diag[i] = 1.0 / (acc > kTinyDiag ? acc : kSkippedPivot);
  }
  __syncthreads();
  // S[g][h], h <= g: a group of lanes per entry, lanes strided over the sums.
  const int glane = tid % kGroupLanes;
  const int warp = tid / 32, half = (tid % 32) / kGroupLanes;
  for (int base = warp * 2; base < r * r; base += kWarps * 2) {
    const int pair = base + half;
    const int g = pair / (r > 0 ? r : 1), h = pair % (r > 0 ? r : 1);
    const bool live = pair < r * r && h <= g;
    double acc = 0;
    if (live) {
      const int row = k + g;
      for (int p = lp.row_ptr[row] + glane; p < lp.row_ptr[row + 1]; p += kGroupLanes) {
        const int j = lp.csr_col[p];
        acc += d[j] * lp.csr_val[p] * entry(lp, k + h, j);
      }
      double corr = 0;
      for (int i = glane; i < k; i += kGroupLanes) corr += w[i * r + g] * w[i * r + h] * diag[i];
      acc -= corr;
    }
    acc = group_sum(acc);
    if (live && glane == 0) chol[g * r + h] = acc;
  }
  __syncthreads();
  if (warp == 0) {
    const int lane = tid % 32;
    double max_diag = 0;
    for (int g = lane; g < r; g += 32) max_diag = fmax(max_diag, chol[g * r + g]);
    for (int off = 16; off > 0; off /= 2)
      max_diag = fmax(max_diag, __shfl_xor_sync(kFullWarpMask, max_diag, off));
    for (int p = 0; p < r; ++p) {
      const double piv = chol[p * r + p];
      const double lpp = piv > kRelPivotTol * max_diag && piv > 0 ? sqrt(piv) : kSkippedPivot;
      __syncwarp();
      if (lane == 0) chol[p * r + p] = lpp;
      for (int i = p + 1 + lane; i < r; i += 32) chol[i * r + p] /= lpp;
      __syncwarp();
      for (int i = p + 1 + lane; i < r; i += 32) {
        for (int j = p + 1; j <= i; ++j) chol[i * r + j] -= chol[i * r + p] * chol[j * r + p];
      }
      __syncwarp();
    }
  }
  __syncthreads();
}

// dy = M^-1 rhs with the factors above (reference.cpp's NormalEquations::solve).
// Contains barriers: every thread calls it.
__device__ void solve_normal(const Lp& lp, const double* diag, const double* w, const double* chol,
                             double* z, const double* rhs, double* dy) {
  const int tid = threadIdx.x, k = lp.k, r = lp.r;
  const int warp = tid / 32, half = (tid % 32) / kGroupLanes, glane = tid % kGroupLanes;
  for (int base = warp * 2; base < r; base += kWarps * 2) {
    const int g = base + half;
    const bool live = g < r;
    double acc = 0;
    if (live) {
      for (int i = glane; i < k; i += kGroupLanes) acc += w[i * r + g] * rhs[i] * diag[i];
    }
    acc = group_sum(acc);
    if (live && glane == 0) z[g] = rhs[k + g] - acc;
  }
  __syncthreads();
  if (warp == 0) {
    const int lane = tid % 32;
    for (int p = 0; p < r; ++p) {
      __syncwarp();
      const double zp = z[p] / chol[p * r + p];
      __syncwarp();
      if (lane == 0) z[p] = zp;
      for (int i = p + 1 + lane; i < r; i += 32) z[i] -= chol[i * r + p] * zp;
    }
    for (int p = r - 1; p >= 0; --p) {
      __syncwarp();
      const double zp = z[p] / chol[p * r + p];
      __syncwarp();
      if (lane == 0) z[p] = zp;
      for (int i = lane; i < p; i += 32) z[i] -= chol[p * r + i] * zp;
    }
    __syncwarp();
    for (int g = lane; g < r; g += 32) dy[k + g] = z[g];
  }
  __syncthreads();
  for (int i = tid; i < k; i += kThreads) {
    double acc = rhs[i];
    for (int g = 0; g < r; ++g) acc -= w[i * r + g] * z[g];
    dy[i] = acc * diag[i];
  }
  __syncthreads();
}

// Exclusive prefix sum of counts[0..len) into out[0..len], out[len] = total; in place
// allowed. One thread per contiguous chunk, then a scan of the chunk sums.
__device__ void block_scan(const int* counts, int* out, int len, int* scratch) {
  const int tid = threadIdx.x;
  const int chunk = (len + kThreads - 1) / kThreads;
  const int begin = min(len, tid * chunk), end = min(len, begin + chunk);
  int local = 0;
  for (int i = begin; i < end; ++i) local += counts[i];
  int total = 0;
  const int run = device::block_exclusive_scan(local, scratch, &total);
  device::serial_exclusive_scan(counts, out, begin, end, run);  // counts and out may alias
  if (tid == kThreads - 1) out[len] = total;
  __syncthreads();
}

// Reads A flat in row-major order, each warp a contiguous range of it. kVec: 4 when A is
// 16-byte aligned, else 1. Pass 0 counts each warp's nonzeros, pass 1 compacts them.
template <int kVec>
__device__ void scan_a(const float* __restrict__ a, int64_t total, int pass, int* warp_base,
                       float* csr_val, uint16_t* csr_col, uint16_t* coo_row, int n, int* count) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t vecs = total / kVec;
  const int64_t per_warp = (vecs + kWarps - 1) / kWarps;
  const int64_t v0 = min(vecs, warp * per_warp), v1 = min(vecs, v0 + per_warp);
  int pos = pass == 1 ? warp_base[warp] : 0;
  int found = 0;
  for (int64_t base = v0; base < v1; base += 32 * kUnroll) {
    float vals[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + u * 32 + lane;
      if (v < v1) {
        if constexpr (kVec == 4) {
          const float4 q = reinterpret_cast<const float4*>(a)[v];
          vals[u][0] = q.x, vals[u][1] = q.y, vals[u][2] = q.z, vals[u][3] = q.w;
        } else {
          vals[u][0] = a[v];
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) vals[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int mine = 0;
#pragma unroll
      for (int e = 0; e < kVec; ++e) mine += vals[u][e] != 0.0f ? 1 : 0;
      const int inc = device::warp_inclusive_scan(mine);
      const int warp_total = __shfl_sync(kFullWarpMask, inc, 31);
      if (pass == 1) {
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
      }
      pos += warp_total;
      found += warp_total;
    }
  }
  // The tail that does not fill a vector (after every warp's range): the last warp, one
  // element per lane (kVec <= 32).
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    const unsigned nz = __ballot_sync(kFullWarpMask, v != 0.0f);
    if (pass == 1 && v != 0.0f) {
      const int at = pos + __popc(nz & ((1u << lane) - 1u));
      if (at < kMaxNnz) {
        csr_val[at] = v;
        csr_col[at] = static_cast<uint16_t>(flat % n);
        coo_row[at] = static_cast<uint16_t>(flat / n);
      }
    }
    found += __popc(nz);
  }
  if (lane == 0 && pass == 0) count[warp] = found;
}

__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Layout L = make_layout(m, n);
  auto dv = [&](size_t off) { return reinterpret_cast<double*>(smem + off); };
  double *x = dv(L.x), *s = dv(L.s), *dx = dv(L.dx), *ds = dv(L.ds), *d = dv(L.d), *rd = dv(L.rd),
         *t = dv(L.t), *cs = dv(L.cs);
  double *y = dv(L.y), *dy = dv(L.dy), *rp = dv(L.rp), *rhs = dv(L.rhs), *bs = dv(L.bs),
         *diag = dv(L.diag);
  double *w = dv(L.w), *chol = dv(L.chol), *z = dv(L.z);
  float* csr_val = reinterpret_cast<float*>(smem + L.csr_val);
  float* csc_val = reinterpret_cast<float*>(smem + L.csc_val);
  uint16_t* csr_col = reinterpret_cast<uint16_t*>(smem + L.csr_col);
  uint16_t* csc_row = reinterpret_cast<uint16_t*>(smem + L.csc_row);
  uint16_t* coo_row = reinterpret_cast<uint16_t*>(smem + L.coo_row);
  int* row_ptr = reinterpret_cast<int*>(smem + L.row_ptr);
  int* col_ptr = reinterpret_cast<int*>(smem + L.col_ptr);
  int* col_fill = reinterpret_cast<int*>(smem + L.col_fill);
  int* misc = reinterpret_cast<int*>(smem + L.misc);
  Reducer red{dv(L.red)};
  const int tid = threadIdx.x;
  const int64_t total = static_cast<int64_t>(m) * n;

  // ---- Scaling: ||b||inf = ||c||inf = 1 ----
  double scale[2] = {0, 0};
  for (int i = tid; i < m; i += kThreads)
    scale[0] = fmax(scale[0], fabs(static_cast<double>(b_g[i])));
  for (int j = tid; j < n; j += kThreads)
    scale[1] = fmax(scale[1], fabs(static_cast<double>(c_g[j])));
  red.run<0, 2, 0>(scale);
  const double beta = scale[0] > 0 && isfinite(scale[0]) ? scale[0] : 1.0;
  const double gamma = scale[1] > 0 && isfinite(scale[1]) ? scale[1] : 1.0;
  for (int i = tid; i < m; i += kThreads) bs[i] = b_g[i] / beta;
  for (int j = tid; j < n; j += kThreads) cs[j] = c_g[j] / gamma;

  // ---- A to CSR (row-major compaction) and CSC ----
  if (vec4) {
    scan_a<4>(a_g, total, 0, misc, csr_val, csr_col, coo_row, n, misc);
  } else {
    scan_a<1>(a_g, total, 0, misc, csr_val, csr_col, coo_row, n, misc);
  }
  for (int j = tid; j < n; j += kThreads) col_fill[j] = 0;
  for (int i = tid; i <= m; i += kThreads) row_ptr[i] = 0;
  __syncthreads();
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
  const int nnz = misc[kMiscNnz];
  bool too_large = misc[kMiscTooLarge] != 0;
  if (!too_large) {
    if (vec4) {
      scan_a<4>(a_g, total, 1, misc, csr_val, csr_col, coo_row, n, nullptr);
    } else {
      scan_a<1>(a_g, total, 1, misc, csr_val, csr_col, coo_row, n, nullptr);
    }
  }
  __syncthreads();
  if (!too_large) {
    // Row pointers from the row-sorted COO rows; column counts.
    for (int p = tid; p < nnz; p += kThreads) {
      const int row = coo_row[p];
      const int prev = p == 0 ? -1 : coo_row[p - 1];
      for (int i = prev + 1; i <= row; ++i) row_ptr[i] = p;
      atomicAdd(&col_fill[csr_col[p]], 1);
    }
    if (tid == 0) {
      const int last = nnz == 0 ? -1 : coo_row[nnz - 1];
      for (int i = last + 1; i <= m; ++i) row_ptr[i] = nnz;
    }
  }
  __syncthreads();
  // block_scan's scratch: the per-warp slots of misc, free once pass 1 has read them.
  if (!too_large) block_scan(col_fill, col_ptr, n, misc);
  if (!too_large) {
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
  // k: the smallest second row over all columns (rows of a column are not sorted yet).
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
    // Columns now hold at most 1 + r entries: insertion sort by row.
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
    return;  // uniform: every thread read the same flags after the barrier
  }
  const Lp lp{m, n, k, r, csr_val, csc_val, csr_col, csc_row, row_ptr, col_ptr};

  // ---- Mehrotra's starting point ----
  for (int j = tid; j < n; j += kThreads) d[j] = 1.0;
  __syncthreads();
  factor(lp, d, diag, w, chol);
  solve_normal(lp, diag, w, chol, z, bs, dy);
  for (int j = tid; j < n; j += kThreads) x[j] = col_dot(lp, j, dy);
  for (int i = tid; i < m; i += kThreads) rhs[i] = row_dot(lp, i, cs);
  __syncthreads();
  solve_normal(lp, diag, w, chol, z, rhs, y);
  double mins[2] = {INFINITY, INFINITY};
  for (int j = tid; j < n; j += kThreads) {
    s[j] = cs[j] - col_dot(lp, j, y);
    mins[0] = fmin(mins[0], x[j]);
    mins[1] = fmin(mins[1], s[j]);
  }
  red.run<0, 0, 2>(mins);
  if (n > 0) {
    const double dxs = fmax(-1.5 * mins[0], 0.0), dss = fmax(-1.5 * mins[1], 0.0);
    double sums[3] = {0, 0, 0};
    for (int j = tid; j < n; j += kThreads) {
      x[j] += dxs;
      s[j] += dss;
      sums[0] += x[j] * s[j];
      sums[1] += x[j];
      sums[2] += s[j];
    }
    red.run<3, 0, 0>(sums);
    const double shift_x = sums[2] > 0 ? 0.5 * sums[0] / sums[2] : 0;
    const double shift_s = sums[1] > 0 ? 0.5 * sums[0] / sums[1] : 0;
    for (int j = tid; j < n; j += kThreads) {
      x[j] = fmax(x[j] + shift_x, kStartFloor);
      s[j] = fmax(s[j] + shift_s, kStartFloor);
    }
  }
  __syncthreads();

  double norms[2] = {0, 0};
  for (int i = tid; i < m; i += kThreads) norms[0] = fmax(norms[0], fabs(bs[i]));
  for (int j = tid; j < n; j += kThreads) norms[1] = fmax(norms[1], fabs(cs[j]));
  red.run<0, 2, 0>(norms);
  const double b_norm = norms[0], c_norm = norms[1];

  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  int it = 0;
  for (;; ++it) {
    // Residuals and objectives: [pobj, dobj, x's] summed, [|rp|, |rd|] maxed.
    double v[5] = {0, 0, 0, 0, 0};
    for (int i = tid; i < m; i += kThreads) {
      rp[i] = bs[i] - row_dot(lp, i, x);
      v[1] += bs[i] * y[i];
      v[3] = fmax(v[3], fabs(rp[i]));
    }
    for (int j = tid; j < n; j += kThreads) {
      rd[j] = cs[j] - col_dot(lp, j, y) - s[j];
      v[0] += cs[j] * x[j];
      v[2] += x[j] * s[j];
      v[4] = fmax(v[4], fabs(rd[j]));
    }
    red.run<3, 2, 0>(v);
    prel = v[3] / (1 + b_norm);
    drel = v[4] / (1 + c_norm);
    gap = fabs(v[0] - v[1]) / (1 + fabs(v[0]));
    if (!isfinite(prel + drel + gap + v[2])) {
      reason = kReasonBreakdown;
      break;
    }
    if (prel <= tol && drel <= tol && gap <= tol) {
      reason = kReasonConverged;
      break;
    }
    if (it == max_iter) break;
    const double mu = v[2] / n;

    for (int j = tid; j < n; j += kThreads) {
      d[j] = x[j] / s[j];
      t[j] = x[j] + d[j] * rd[j];
    }
    __syncthreads();
    factor(lp, d, diag, w, chol);
    // Predictor.
    for (int i = tid; i < m; i += kThreads) rhs[i] = rp[i] + row_dot(lp, i, t);
    __syncthreads();
    solve_normal(lp, diag, w, chol, z, rhs, dy);
    double steps[2] = {INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      ds[j] = rd[j] - col_dot(lp, j, dy);
      dx[j] = -x[j] - d[j] * ds[j];
      if (dx[j] < 0) steps[0] = fmin(steps[0], -x[j] / dx[j]);
      if (ds[j] < 0) steps[1] = fmin(steps[1], -s[j] / ds[j]);
    }
    red.run<0, 0, 2>(steps);
    const double ap_aff = fmin(1.0, steps[0]), ad_aff = fmin(1.0, steps[1]);
    double mu_aff[1] = {0};
    for (int j = tid; j < n; j += kThreads)
      mu_aff[0] += (x[j] + ap_aff * dx[j]) * (s[j] + ad_aff * ds[j]);
    red.run<1, 0, 0>(mu_aff);
    const double ratio = mu_aff[0] / n / mu;
    const double cube = ratio * ratio * ratio;
    const double sigma = cube < 0 ? 0.0 : (1.0 < cube ? 1.0 : cube);
    // Corrector: dx holds rc until the new direction replaces it.
    for (int j = tid; j < n; j += kThreads) {
      const double rc = sigma * mu - x[j] * s[j] - dx[j] * ds[j];
      dx[j] = rc;
      t[j] = -rc / s[j] + d[j] * rd[j];
    }
    __syncthreads();
    for (int i = tid; i < m; i += kThreads) rhs[i] = rp[i] + row_dot(lp, i, t);
    __syncthreads();
    solve_normal(lp, diag, w, chol, z, rhs, dy);
    steps[0] = steps[1] = INFINITY;
    for (int j = tid; j < n; j += kThreads) {
      ds[j] = rd[j] - col_dot(lp, j, dy);
      dx[j] = dx[j] / s[j] - d[j] * ds[j];
      if (dx[j] < 0) steps[0] = fmin(steps[0], -x[j] / dx[j]);
      if (ds[j] < 0) steps[1] = fmin(steps[1], -s[j] / ds[j]);
    }
    red.run<0, 0, 2>(steps);
    const double ap = fmin(1.0, kStepFactor * steps[0]);
    const double ad = fmin(1.0, kStepFactor * steps[1]);
    for (int j = tid; j < n; j += kThreads) {
      x[j] += ap * dx[j];
      s[j] += ad * ds[j];
    }
    for (int i = tid; i < m; i += kThreads) y[i] += ad * dy[i];
    __syncthreads();
  }

  double obj[1] = {0};
  for (int j = tid; j < n; j += kThreads) {
    x_out[j] = static_cast<float>(x[j] * beta);
    obj[0] += static_cast<double>(c_g[j]) * x[j] * beta;
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
  ipm_kernel<<<1, kThreads, layout.total, static_cast<cudaStream_t>(ctx.stream())>>>(
      a_ptr, data_ptr<const float>(b), data_ptr<const float>(c), data_ptr<float>(out_x),
      data_ptr<float>(out_status), static_cast<int>(m), static_cast<int>(n),
      static_cast<int>(max_iter), tol, vec4);
  return device::launch_status(ctx, "lplb.solve");
}

}  // namespace kreg::lplb
