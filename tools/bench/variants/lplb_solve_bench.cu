// Scratch benchmark (not part of kreg): lplb.solve, the Mehrotra interior-point LP solver
// in double in one thread block, on the H200 (sm_90). Issue 17: 247 us for the 256
// experts / 288 replicas / 8 GPUs LP (A 264 x 297, 6 iterations), goal <= 100 us.
// nvcc -O3 -arch=sm_90 -std=c++17 lplb_solve_bench.cu -o lsb && ./lsb [reps]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                             \
  do {                                                                    \
    cudaError_t err_ = (x);                                               \
    if (err_ != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

// ---- plugins/lplb/lplb.hpp: status slots, reasons, the method's constants and limits ----
enum StatusSlot : int {
  kStatusConverged = 0,
  kStatusPrimalRes = 1,
  kStatusDualRes = 2,
  kStatusGap = 3,
  kStatusIterations = 4,
  kStatusObjective = 5,
  kStatusReason = 6,
  kStatusDiagRows = 7,
  kStatusSize = 8,
};
enum SolveReason : int {
  kReasonConverged = 0,
  kReasonIterationLimit = 1,
  kReasonBreakdown = 2,
  kReasonTooLarge = 3,
};
constexpr double kStepFactor = 0.99;
constexpr double kStartFloor = 1e-3;
constexpr double kTinyDiag = 1e-30;
constexpr double kRelPivotTol = 1e-14;
constexpr double kSkippedPivot = 1e128;
constexpr int kMaxNnz = 3072;
constexpr int kMaxDense = 48;
constexpr int kMaxCoupling = 4096;
constexpr int kMaxRows = 1024;
constexpr int kMaxCols = 2048;

// ---- core/include/kreg/device/warp.cuh ----
constexpr unsigned kFullMask = 0xffffffffu;
__device__ __forceinline__ int lane_id() {
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return static_cast<int>(lane);
}
template <typename T>
__device__ __forceinline__ T warp_sum(T v, int width = 32) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int width = 32) {
  const int sub = lane_id() & (width - 1);
  for (int offset = 1; offset < width; offset *= 2) {
    const T other = __shfl_up_sync(kFullMask, v, offset, width);
    if (sub >= offset) v += other;
  }
  return v;
}
template <typename T>
__device__ __forceinline__ T serial_exclusive_scan(const T* in, T* out, int begin, int end, T run) {
  for (int i = begin; i < end; ++i) {
    const T v = in[i];
    out[i] = run;
    run += v;
  }
  return run;
}
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* warp_totals, T* total) {
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int nwarps = static_cast<int>(blockDim.x) / 32;
  const T inclusive = warp_inclusive_scan(v);
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  T before = inclusive - v;
  T sum = T{};
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) before += warp_totals[w];
    sum += warp_totals[w];
  }
  *total = sum;
  return before;
}
// ---------------------------------------------------------------------------------------
// CPU reference: plugins/lplb/reference.cpp's solve_cpu (the same method in double),
// on plain arrays.
// ---------------------------------------------------------------------------------------
namespace cpu {

struct SparseLp {
  int64_t m = 0, n = 0, k = 0, r = 0;
  std::vector<int64_t> col_ptr, row_ptr, col_rows, row_cols;
  std::vector<double> col_vals, row_vals;
};

SparseLp make_sparse(const float* a, int64_t m, int64_t n) {
  SparseLp s;
  s.m = m;
  s.n = n;
  s.col_ptr.assign(n + 1, 0);
  s.row_ptr.assign(m + 1, 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float v = a[i * n + j];
      if (v != 0.0f) {
        s.col_rows.push_back(i);
        s.col_vals.push_back(v);
      }
    }
    s.col_ptr[j + 1] = static_cast<int64_t>(s.col_rows.size());
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = a[i * n + j];
      if (v != 0.0f) {
        s.row_cols.push_back(j);
        s.row_vals.push_back(v);
      }
    }
    s.row_ptr[i + 1] = static_cast<int64_t>(s.row_cols.size());
  }
  s.k = m;
  for (int64_t j = 0; j < n; ++j) {
    if (s.col_ptr[j + 1] - s.col_ptr[j] >= 2) s.k = std::min(s.k, s.col_rows[s.col_ptr[j] + 1]);
  }
  s.r = m - s.k;
  return s;
}

void mul_a(const SparseLp& s, const std::vector<double>& v, std::vector<double>& out) {
  for (int64_t i = 0; i < s.m; ++i) {
    double acc = 0;
    for (int64_t p = s.row_ptr[i]; p < s.row_ptr[i + 1]; ++p)
      acc += s.row_vals[p] * v[s.row_cols[p]];
    out[i] = acc;
  }
}
void mul_at(const SparseLp& s, const std::vector<double>& v, std::vector<double>& out) {
  for (int64_t j = 0; j < s.n; ++j) {
    double acc = 0;
    for (int64_t p = s.col_ptr[j]; p < s.col_ptr[j + 1]; ++p)
      acc += s.col_vals[p] * v[s.col_rows[p]];
    out[j] = acc;
  }
}

class NormalEquations {
 public:
  explicit NormalEquations(const SparseLp& s)
      : s_(s), diag_(s.k), w_(s.k * s.r), chol_(s.r * s.r) {}

  void factor(const std::vector<double>& d) {
    const int64_t k = s_.k, r = s_.r;
    for (int64_t i = 0; i < k; ++i) {
      double acc = 0;
      double* wi = w_.data() + i * r;
      std::fill(wi, wi + r, 0.0);
      for (int64_t p = s_.row_ptr[i]; p < s_.row_ptr[i + 1]; ++p) {
        const int64_t j = s_.row_cols[p];
        const double dav = d[j] * s_.row_vals[p];
        acc += dav * s_.row_vals[p];
        for (int64_t q = s_.col_ptr[j]; q < s_.col_ptr[j + 1]; ++q) {
          const int64_t row = s_.col_rows[q];
          if (row >= k) wi[row - k] += dav * s_.col_vals[q];
        }
      }
      diag_[i] = acc > kTinyDiag ? acc : kSkippedPivot;
    }
    for (int64_t g = 0; g < r; ++g) {
      for (int64_t h = 0; h <= g; ++h) {
        double acc = 0;
        for (int64_t p = s_.row_ptr[k + g]; p < s_.row_ptr[k + g + 1]; ++p) {
          const int64_t j = s_.row_cols[p];
          acc += d[j] * s_.row_vals[p] * entry(k + h, j);
        }
        double corr = 0;
        for (int64_t i = 0; i < k; ++i) corr += w_[i * r + g] * w_[i * r + h] / diag_[i];
        chol_[g * r + h] = acc - corr;
      }
    }
    double max_diag = 0;
    for (int64_t g = 0; g < r; ++g) max_diag = std::max(max_diag, chol_[g * r + g]);
    for (int64_t p = 0; p < r; ++p) {
      const double piv = chol_[p * r + p];
      const double lpp = piv > kRelPivotTol * max_diag && piv > 0 ? std::sqrt(piv) : kSkippedPivot;
      chol_[p * r + p] = lpp;
      for (int64_t i = p + 1; i < r; ++i) chol_[i * r + p] /= lpp;
      for (int64_t i = p + 1; i < r; ++i) {
        for (int64_t j = p + 1; j <= i; ++j)
          chol_[i * r + j] -= chol_[i * r + p] * chol_[j * r + p];
      }
    }
  }

  void solve(const std::vector<double>& rhs, std::vector<double>& dy) const {
    const int64_t k = s_.k, r = s_.r;
    std::vector<double> z(r);
    for (int64_t g = 0; g < r; ++g) {
      double acc = rhs[k + g];
      for (int64_t i = 0; i < k; ++i) acc -= w_[i * r + g] * rhs[i] / diag_[i];
      z[g] = acc;
    }
    for (int64_t p = 0; p < r; ++p) {
      double acc = z[p];
      for (int64_t q = 0; q < p; ++q) acc -= chol_[p * r + q] * z[q];
      z[p] = acc / chol_[p * r + p];
    }
    for (int64_t p = r - 1; p >= 0; --p) {
      double acc = z[p];
      for (int64_t q = p + 1; q < r; ++q) acc -= chol_[q * r + p] * z[q];
      z[p] = acc / chol_[p * r + p];
    }
    for (int64_t g = 0; g < r; ++g) dy[k + g] = z[g];
    for (int64_t i = 0; i < k; ++i) {
      double acc = rhs[i];
      for (int64_t g = 0; g < r; ++g) acc -= w_[i * r + g] * z[g];
      dy[i] = acc / diag_[i];
    }
  }

 private:
  double entry(int64_t row, int64_t j) const {
    for (int64_t q = s_.col_ptr[j]; q < s_.col_ptr[j + 1]; ++q) {
      if (s_.col_rows[q] == row) return s_.col_vals[q];
    }
    return 0;
  }
  const SparseLp& s_;
  std::vector<double> diag_, w_, chol_;
};

double ratio_to_boundary(const std::vector<double>& v, const std::vector<double>& dv) {
  double alpha = INFINITY;
  for (size_t j = 0; j < v.size(); ++j) {
    if (dv[j] < 0) alpha = std::min(alpha, -v[j] / dv[j]);
  }
  return alpha;
}
double inf_norm(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}
double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

void solve(const float* A, const float* bf, const float* cf, int64_t m, int64_t n, int64_t max_iter,
           double tol, float* xout, float* status) {
  double beta = 0, gamma = 0;
  for (int64_t i = 0; i < m; ++i) beta = std::max(beta, std::fabs(static_cast<double>(bf[i])));
  for (int64_t j = 0; j < n; ++j) gamma = std::max(gamma, std::fabs(static_cast<double>(cf[j])));
  if (!(beta > 0) || !std::isfinite(beta)) beta = 1;
  if (!(gamma > 0) || !std::isfinite(gamma)) gamma = 1;
  std::vector<double> bs(m), cs(n);
  for (int64_t i = 0; i < m; ++i) bs[i] = bf[i] / beta;
  for (int64_t j = 0; j < n; ++j) cs[j] = cf[j] / gamma;
  const SparseLp s = make_sparse(A, m, n);
  NormalEquations ne(s);
  const size_t M = m, N = n;
  std::vector<double> x(N), sv(N), y(M), d(N, 1.0), t(N), rhs(M), dy(M), dx(N), ds(N), rp(M), rd(N),
      rc(N), tmp_m(M), tmp_n(N);
  ne.factor(d);
  ne.solve(bs, tmp_m);
  mul_at(s, tmp_m, x);
  mul_a(s, cs, tmp_m);
  ne.solve(tmp_m, y);
  mul_at(s, y, tmp_n);
  for (size_t j = 0; j < N; ++j) sv[j] = cs[j] - tmp_n[j];
  if (n > 0) {
    const double dxs = std::max(-1.5 * *std::min_element(x.begin(), x.end()), 0.0);
    const double dss = std::max(-1.5 * *std::min_element(sv.begin(), sv.end()), 0.0);
    double xs = 0, sum_x = 0, sum_s = 0;
    for (size_t j = 0; j < N; ++j) {
      x[j] += dxs;
      sv[j] += dss;
      xs += x[j] * sv[j];
      sum_x += x[j];
      sum_s += sv[j];
    }
    const double shift_x = sum_s > 0 ? 0.5 * xs / sum_s : 0;
    const double shift_s = sum_x > 0 ? 0.5 * xs / sum_x : 0;
    for (size_t j = 0; j < N; ++j) {
      x[j] = std::max(x[j] + shift_x, kStartFloor);
      sv[j] = std::max(sv[j] + shift_s, kStartFloor);
    }
  }
  const double b_norm = inf_norm(bs), c_norm = inf_norm(cs);
  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  int64_t it = 0;
  for (;; ++it) {
    mul_a(s, x, tmp_m);
    for (size_t i = 0; i < M; ++i) rp[i] = bs[i] - tmp_m[i];
    mul_at(s, y, tmp_n);
    for (size_t j = 0; j < N; ++j) rd[j] = cs[j] - tmp_n[j] - sv[j];
    const double pobj = dot(cs, x), dobj = dot(bs, y), xs = dot(x, sv);
    prel = inf_norm(rp) / (1 + b_norm);
    drel = inf_norm(rd) / (1 + c_norm);
    gap = std::fabs(pobj - dobj) / (1 + std::fabs(pobj));
    if (!std::isfinite(prel + drel + gap + xs)) {
      reason = kReasonBreakdown;
      break;
    }
    if (prel <= tol && drel <= tol && gap <= tol) {
      reason = kReasonConverged;
      break;
    }
    if (it == max_iter) break;
    const double mu = xs / static_cast<double>(n);
    for (size_t j = 0; j < N; ++j) d[j] = x[j] / sv[j];
    ne.factor(d);
    for (size_t j = 0; j < N; ++j) t[j] = x[j] + d[j] * rd[j];
    mul_a(s, t, rhs);
    for (size_t i = 0; i < M; ++i) rhs[i] += rp[i];
    ne.solve(rhs, dy);
    mul_at(s, dy, tmp_n);
    for (size_t j = 0; j < N; ++j) {
      ds[j] = rd[j] - tmp_n[j];
      dx[j] = -x[j] - d[j] * ds[j];
    }
    const double ap_aff = std::min(1.0, ratio_to_boundary(x, dx));
    const double ad_aff = std::min(1.0, ratio_to_boundary(sv, ds));
    double mu_aff = 0;
    for (size_t j = 0; j < N; ++j) mu_aff += (x[j] + ap_aff * dx[j]) * (sv[j] + ad_aff * ds[j]);
    mu_aff /= static_cast<double>(n);
    const double ratio = mu_aff / mu;
    const double sigma = std::clamp(ratio * ratio * ratio, 0.0, 1.0);
    for (size_t j = 0; j < N; ++j) {
      rc[j] = sigma * mu - x[j] * sv[j] - dx[j] * ds[j];
      t[j] = -rc[j] / sv[j] + d[j] * rd[j];
    }
    mul_a(s, t, rhs);
    for (size_t i = 0; i < M; ++i) rhs[i] += rp[i];
    ne.solve(rhs, dy);
    mul_at(s, dy, tmp_n);
    for (size_t j = 0; j < N; ++j) {
      ds[j] = rd[j] - tmp_n[j];
      dx[j] = rc[j] / sv[j] - d[j] * ds[j];
    }
    const double ap = std::min(1.0, kStepFactor * ratio_to_boundary(x, dx));
    const double ad = std::min(1.0, kStepFactor * ratio_to_boundary(sv, ds));
    for (size_t j = 0; j < N; ++j) {
      x[j] += ap * dx[j];
      sv[j] += ad * ds[j];
    }
    for (size_t i = 0; i < M; ++i) y[i] += ad * dy[i];
  }
  double objective = 0;
  for (int64_t j = 0; j < n; ++j) {
    xout[j] = static_cast<float>(x[j] * beta);
    objective += static_cast<double>(cf[j]) * x[j] * beta;
  }
  status[kStatusConverged] = reason == kReasonConverged ? 1.0f : 0.0f;
  status[kStatusPrimalRes] = static_cast<float>(prel);
  status[kStatusDualRes] = static_cast<float>(drel);
  status[kStatusGap] = static_cast<float>(gap);
  status[kStatusIterations] = static_cast<float>(it);
  status[kStatusObjective] = static_cast<float>(objective);
  status[kStatusReason] = static_cast<float>(reason);
  status[kStatusDiagRows] = static_cast<float>(s.k);
}

}  // namespace cpu

// ---------------------------------------------------------------------------------------
// LPs: build_lp's (Zipf counts, replica maps as lplb_demo places them or at random, as
// tests/kernels/lplb_test.cpp draws them) and dense LPs with a known optimum (the tests').
// ---------------------------------------------------------------------------------------
struct HostLp {
  std::string name;
  int m = 0, n = 0;
  std::vector<float> A, b, c;
};

// build_lp's LP (plugins/lplb/lplb.hpp) from counts[L], log2phy[L, C] (-1 padding) and
// phy2gpu[R].
HostLp build_lp(const std::string& name, const std::vector<double>& counts,
                const std::vector<int>& log2phy, int C, const std::vector<int>& phy2gpu, int G) {
  const int L = static_cast<int>(counts.size()), R = static_cast<int>(phy2gpu.size());
  HostLp lp;
  lp.name = name;
  lp.m = L + G;
  lp.n = R + 1 + G;
  lp.A.assign(static_cast<size_t>(lp.m) * lp.n, 0.0f);
  lp.b.assign(lp.m, 0.0f);
  lp.c.assign(lp.n, 0.0f);
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < C; ++k) {
      const int id = log2phy[l * C + k];
      if (id >= 0) lp.A[static_cast<size_t>(l) * lp.n + id] = 1.0f;
    }
    lp.b[l] = static_cast<float>(counts[l]);
  }
  for (int g = 0; g < G; ++g) {
    for (int r = 0; r < R; ++r) {
      if (phy2gpu[r] == g) lp.A[static_cast<size_t>(L + g) * lp.n + r] = 1.0f;
    }
    lp.A[static_cast<size_t>(L + g) * lp.n + R] = -1.0f;
    lp.A[static_cast<size_t>(L + g) * lp.n + R + 1 + g] = 1.0f;
  }
  lp.c[R] = 1.0f;
  return lp;
}

// lplb_demo's batch: tokens x top-k distinct experts by Zipf weight (ranks shuffled);
// E/G primaries per GPU, `extra` replicas of the hottest experts each on the GPU of least
// expected load that lacks it; replica ids numbered GPU by GPU.
HostLp demo_lp(uint64_t seed, int E, int G, int extra, int tokens, int topk, double zipf) {
  std::mt19937_64 rng(seed);
  std::vector<double> weight(E);
  std::vector<int> rank(E);
  std::iota(rank.begin(), rank.end(), 1);
  std::shuffle(rank.begin(), rank.end(), rng);
  for (int e = 0; e < E; ++e) weight[e] = 1.0 / std::pow(static_cast<double>(rank[e]), zipf);
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::vector<double> counts(E, 0.0);
  const int K = std::min(topk, E);
  std::vector<int> chosen;
  for (int t = 0; t < tokens; ++t) {
    chosen.clear();
    while (static_cast<int>(chosen.size()) < K) {
      const int e = pick(rng);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen) counts[e] += 1;
  }
  std::vector<std::vector<int>> gpus_of(E);
  for (int e = 0; e < E; ++e) gpus_of[e].push_back(static_cast<int>(int64_t{e} * G / E));
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
  for (int i = 0; i < extra; ++i) {
    const int e = order[i % E];
    auto& g = gpus_of[e];
    if (static_cast<int>(g.size()) >= G) continue;
    std::vector<double> load(G, 0.0);
    for (int x = 0; x < E; ++x) {
      for (int q : gpus_of[x]) load[q] += weight[x] / static_cast<double>(gpus_of[x].size());
    }
    int best = -1;
    for (int c = 0; c < G; ++c) {
      if (std::find(g.begin(), g.end(), c) != g.end()) continue;
      if (best < 0 || load[c] < load[best]) best = c;
    }
    g.push_back(best);
  }
  int C = 1;
  for (const auto& g : gpus_of) C = std::max(C, static_cast<int>(g.size()));
  std::vector<int> log2phy(static_cast<size_t>(E) * C, -1), phy2gpu, filled(E, 0);
  int R = 0;
  for (int gpu = 0; gpu < G; ++gpu) {
    for (int e = 0; e < E; ++e) {
      const auto& g = gpus_of[e];
      if (std::find(g.begin(), g.end(), gpu) == g.end()) continue;
      log2phy[static_cast<size_t>(e) * C + filled[e]++] = R++;
      phy2gpu.push_back(gpu);
    }
  }
  char name[96];
  std::snprintf(name, sizeof name, "demo E=%d G=%d +%d seed %llu", E, G, extra,
                static_cast<unsigned long long>(seed));
  return build_lp(name, counts, log2phy, C, phy2gpu, G);
}

// tests/kernels/lplb_test.cpp's random_instance: every expert one replica, `extra` more on
// random experts (at most C each, hot ones first when skewed), ids shuffled, random GPUs,
// `orphans` replicas of no expert; counts random with zeros, or 20000 / (l + 1) shuffled.
HostLp random_lp(std::mt19937_64& rng, int L, int G, int C, int extra, int orphans, bool skewed,
                 const std::string& name) {
  std::vector<int> per(L, 1);
  std::uniform_int_distribution<int> pick(0, L - 1);
  for (int e = 0, tries = 0; e < extra && tries < 100 * (extra + 1); ++tries) {
    const int l = skewed ? std::min(pick(rng), pick(rng)) : pick(rng);
    if (per[l] < C) {
      ++per[l];
      ++e;
    }
  }
  const int R = std::accumulate(per.begin(), per.end(), 0) + orphans;
  std::vector<int> ids(R);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int> log2phy(static_cast<size_t>(L) * C, -1);
  size_t next = 0;
  for (int l = 0; l < L; ++l) {
    std::vector<int> slots(C);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int k = 0; k < per[l]; ++k) log2phy[static_cast<size_t>(l) * C + slots[k]] = ids[next++];
  }
  std::uniform_int_distribution<int> gpu(0, G - 1);
  std::vector<int> phy2gpu(R);
  for (auto& g : phy2gpu) g = gpu(rng);
  std::uniform_int_distribution<int> cnt(0, 1000), zero(0, 5);
  std::vector<double> counts(L);
  for (int l = 0; l < L; ++l) {
    double v = zero(rng) == 0 ? 0 : cnt(rng);
    if (skewed) v = std::floor(20000.0 / static_cast<double>(l + 1));
    counts[l] = v;
  }
  if (skewed) std::shuffle(counts.begin(), counts.end(), rng);
  return build_lp(name, counts, log2phy, C, phy2gpu, G);
}

// The tests' dense LP with a known optimum (KKT: a basis of m columns with x* > 0, s* > 0
// elsewhere, any y*). k = 1 (or so), r = m - 1: the dense Schur path.
HostLp dense_lp(std::mt19937_64& rng, int m, int n, const std::string& name) {
  HostLp lp;
  lp.name = name;
  lp.m = m;
  lp.n = n;
  std::uniform_real_distribution<double> ua(-1.0, 1.0), pos(0.5, 2.0);
  lp.A.resize(static_cast<size_t>(m) * n);
  for (auto& a : lp.A) a = static_cast<float>(ua(rng));
  std::vector<int> cols(n);
  std::iota(cols.begin(), cols.end(), 0);
  std::shuffle(cols.begin(), cols.end(), rng);
  std::vector<double> x(n, 0.0), s(n, 0.0), y(m);
  for (int j = 0; j < n; ++j) (j < m ? x : s)[cols[j]] = pos(rng);
  for (auto& v : y) v = ua(rng);
  std::vector<double> b(m, 0.0), c = s;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      const double a = lp.A[static_cast<size_t>(i) * n + j];
      b[i] += a * x[j];
      c[j] += a * y[i];
    }
  }
  lp.b.assign(b.begin(), b.end());
  lp.c.assign(c.begin(), c.end());
  return lp;
}
// ---------------------------------------------------------------------------------------
// V0: kreg's kernel as it is (plugins/lplb/solve.cu at 590a428), copied with its helpers;
// kProf adds clock64() marks (thread 0, after barriers) per phase, for the breakdown.
// ---------------------------------------------------------------------------------------
namespace v0 {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupLanes = 16;
constexpr int kRedValues = 5;
constexpr int kUnroll = 4;

struct Layout {
  size_t x, s, dx, ds, d, rd, t, cs;
  size_t y, dy, rp, rhs, bs, diag;
  size_t w, chol, z, red;
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

// Phase marks of the profiled build: cycles accumulated per phase by thread 0.
enum Phase : int {
  kPhRead,      // scaling, A read twice (count, compact)
  kPhBuild,     // row pointers, CSC, k, column sort
  kPhStart,     // the starting point less its factor / solves
  kPhResid,     // residuals + reduction
  kPhDt,        // d, t
  kPhDiagW,     // factor: diagonal block and W
  kPhSchur,     // factor: S
  kPhChol,      // factor: Cholesky (warp 0)
  kPhRhs,       // rhs = rp + A t (both)
  kPhSolveZ,    // solve: z = rhs_G - W' diag^-1 rhs_K
  kPhSolveTri,  // solve: triangular solves (warp 0)
  kPhSolveDyK,  // solve: dy_K
  kPhStep,      // ds, dx, step lengths (both)
  kPhMuAff,     // mu_aff
  kPhCorrT,     // corrector rc, t
  kPhUpdate,    // x, s, y update
  kPhFinal,     // output
  kPhases
};
const char* const kPhaseNames[kPhases] = {"read A (2 passes)",
                                          "CSR/CSC/k/sort",
                                          "start point rest",
                                          "residuals+reduce",
                                          "d, t",
                                          "factor diag/W",
                                          "factor S",
                                          "factor Cholesky",
                                          "rhs = rp + A t",
                                          "solve z",
                                          "solve triangular",
                                          "solve dy_K",
                                          "steps (2 reduce)",
                                          "mu_aff reduce",
                                          "corrector t",
                                          "update",
                                          "output"};

template <bool kOn>
struct Prof {
  unsigned long long* acc;
  long long last;
  __device__ explicit Prof(unsigned long long* a) : acc(a), last(0) {
    if constexpr (kOn) last = clock64();
  }
  __device__ void mark(int phase) {
    if constexpr (kOn) {
      if (threadIdx.x == 0) {
        const long long now = clock64();
        acc[phase] += static_cast<unsigned long long>(now - last);
        last = now;
      }
    }
  }
};

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
        const double o = __shfl_xor_sync(kFullMask, v[i], off);
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

__device__ inline double group_sum(double v) { return warp_sum(v, kGroupLanes); }

struct Lp {
  int m, n, k, r;
  const float *csr_val, *csc_val;
  const uint16_t *csr_col, *csc_row;
  const int *row_ptr, *col_ptr;
};

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

template <bool kP>
__device__ void factor(const Lp& lp, const double* d, double* diag, double* w, double* chol,
                       Prof<kP>& prof) {
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
    diag[i] = 1.0 / (acc > kTinyDiag ? acc : kSkippedPivot);
  }
  __syncthreads();
  prof.mark(kPhDiagW);
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
  prof.mark(kPhSchur);
  if (warp == 0) {
    const int lane = tid % 32;
    double max_diag = 0;
    for (int g = lane; g < r; g += 32) max_diag = fmax(max_diag, chol[g * r + g]);
    for (int off = 16; off > 0; off /= 2)
      max_diag = fmax(max_diag, __shfl_xor_sync(kFullMask, max_diag, off));
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
  prof.mark(kPhChol);
}

template <bool kP>
__device__ void solve_normal(const Lp& lp, const double* diag, const double* w, const double* chol,
                             double* z, const double* rhs, double* dy, Prof<kP>& prof) {
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
  prof.mark(kPhSolveZ);
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
  prof.mark(kPhSolveTri);
  for (int i = tid; i < k; i += kThreads) {
    double acc = rhs[i];
    for (int g = 0; g < r; ++g) acc -= w[i * r + g] * z[g];
    dy[i] = acc * diag[i];
  }
  __syncthreads();
  prof.mark(kPhSolveDyK);
}

__device__ void block_scan(const int* counts, int* out, int len, int* scratch) {
  const int tid = threadIdx.x;
  const int chunk = (len + kThreads - 1) / kThreads;
  const int begin = min(len, tid * chunk), end = min(len, begin + chunk);
  int local = 0;
  for (int i = begin; i < end; ++i) local += counts[i];
  int total = 0;
  const int run = block_exclusive_scan(local, scratch, &total);
  serial_exclusive_scan(counts, out, begin, end, run);
  if (tid == kThreads - 1) out[len] = total;
  __syncthreads();
}

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
      const int inc = warp_inclusive_scan(mine);
      const int warp_total = __shfl_sync(kFullMask, inc, 31);
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
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    const unsigned nz = __ballot_sync(kFullMask, v != 0.0f);
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

template <bool kP>
__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4, unsigned long long* prof_acc) {
  extern __shared__ __align__(16) unsigned char smem[];
  Prof<kP> prof(prof_acc);
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
  prof.mark(kPhRead);
  if (!too_large) {
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
  prof.mark(kPhBuild);
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
  const Lp lp{m, n, k, r, csr_val, csc_val, csr_col, csc_row, row_ptr, col_ptr};

  for (int j = tid; j < n; j += kThreads) d[j] = 1.0;
  __syncthreads();
  factor(lp, d, diag, w, chol, prof);
  solve_normal(lp, diag, w, chol, z, bs, dy, prof);
  for (int j = tid; j < n; j += kThreads) x[j] = col_dot(lp, j, dy);
  for (int i = tid; i < m; i += kThreads) rhs[i] = row_dot(lp, i, cs);
  __syncthreads();
  solve_normal(lp, diag, w, chol, z, rhs, y, prof);
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
  prof.mark(kPhStart);

  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  int it = 0;
  for (;; ++it) {
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
    prof.mark(kPhResid);
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
    prof.mark(kPhDt);
    factor(lp, d, diag, w, chol, prof);
    for (int i = tid; i < m; i += kThreads) rhs[i] = rp[i] + row_dot(lp, i, t);
    __syncthreads();
    prof.mark(kPhRhs);
    solve_normal(lp, diag, w, chol, z, rhs, dy, prof);
    double steps[2] = {INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      ds[j] = rd[j] - col_dot(lp, j, dy);
      dx[j] = -x[j] - d[j] * ds[j];
      if (dx[j] < 0) steps[0] = fmin(steps[0], -x[j] / dx[j]);
      if (ds[j] < 0) steps[1] = fmin(steps[1], -s[j] / ds[j]);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhStep);
    const double ap_aff = fmin(1.0, steps[0]), ad_aff = fmin(1.0, steps[1]);
    double mu_aff[1] = {0};
    for (int j = tid; j < n; j += kThreads)
      mu_aff[0] += (x[j] + ap_aff * dx[j]) * (s[j] + ad_aff * ds[j]);
    red.run<1, 0, 0>(mu_aff);
    prof.mark(kPhMuAff);
    const double ratio = mu_aff[0] / n / mu;
    const double cube = ratio * ratio * ratio;
    const double sigma = cube < 0 ? 0.0 : (1.0 < cube ? 1.0 : cube);
    for (int j = tid; j < n; j += kThreads) {
      const double rc = sigma * mu - x[j] * s[j] - dx[j] * ds[j];
      dx[j] = rc;
      t[j] = -rc / s[j] + d[j] * rd[j];
    }
    __syncthreads();
    prof.mark(kPhCorrT);
    for (int i = tid; i < m; i += kThreads) rhs[i] = rp[i] + row_dot(lp, i, t);
    __syncthreads();
    prof.mark(kPhRhs);
    solve_normal(lp, diag, w, chol, z, rhs, dy, prof);
    steps[0] = steps[1] = INFINITY;
    for (int j = tid; j < n; j += kThreads) {
      ds[j] = rd[j] - col_dot(lp, j, dy);
      dx[j] = dx[j] / s[j] - d[j] * ds[j];
      if (dx[j] < 0) steps[0] = fmin(steps[0], -x[j] / dx[j]);
      if (ds[j] < 0) steps[1] = fmin(steps[1], -s[j] / ds[j]);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhStep);
    const double ap = fmin(1.0, kStepFactor * steps[0]);
    const double ad = fmin(1.0, kStepFactor * steps[1]);
    for (int j = tid; j < n; j += kThreads) {
      x[j] += ap * dx[j];
      s[j] += ad * ds[j];
    }
    for (int i = tid; i < m; i += kThreads) y[i] += ad * dy[i];
    __syncthreads();
    prof.mark(kPhUpdate);
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
  prof.mark(kPhFinal);
}

// Host side as solve_cuda: the layout's shared memory, vec4 when A is 16-byte aligned.
template <bool kP>
void launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
            int max_iter, double tol, cudaStream_t stream, unsigned long long* prof = nullptr) {
  const Layout layout = make_layout(m, n);
  static size_t set = 0;
  if (set < layout.total) {
    CK(cudaFuncSetAttribute(ipm_kernel<kP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(layout.total)));
    set = layout.total;
  }
  const bool vec4 = (reinterpret_cast<uintptr_t>(a) & 15) == 0;
  ipm_kernel<kP>
      <<<1, kThreads, layout.total, stream>>>(a, b, c, x, st, m, n, max_iter, tol, vec4, prof);
  CK(cudaGetLastError());
}

}  // namespace v0
// ---------------------------------------------------------------------------------------
// V1: the same method, limits and block elimination (rows 0..k-1 a diagonal block, an r x r
// Schur complement), with the serial chains V0's profile shows taken out:
//   - A read with 8 vectors a lane in flight; the count pass only counts (no shuffles).
//   - W stored transposed (r rows of k): the sums over i read consecutive doubles (V0's
//     W[i][g] with r = 8 puts a half-warp's lanes on 2 banks: S was 18% of the time).
//   - S: only the r(r+1)/2 live pairs are handed out (V0 strides r*r, half of them dead),
//     and the predictor's z sums ride in the same phase.
//   - Cholesky and the triangular solves in warp 0 with a row (two for r > 32) a lane:
//     one broadcast, one division and a multiply-add a step for a solve (V0: three
//     __syncwarp and a shared-memory round trip a step); the factor's rows padded to r + 1.
//   - Rows k..m-1 (the long GPU rows) a warp each; rows < k a thread each.
//   - d and t ride in the residual phase, rhs in the factor's first phase; dy_i of a
//     column's diagonal row is recomputed by the column's thread (the same expression, the
//     same bits as the row's own), so no phase waits for dy_K; the corrector's t is
//     recomputed where it is used. 11 barriers an iteration (V0: 18).
// ---------------------------------------------------------------------------------------
namespace v1 {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupLanes = 16;
constexpr int kRedValues = 5;
constexpr int kUnroll = 8;

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
        const double o = __shfl_xor_sync(kFullMask, v[i], off);
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

__device__ inline double group_sum(double v) { return warp_sum(v, kGroupLanes); }

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
  for (int p = lp.row_ptr[i] + lane_id(); p < lp.row_ptr[i + 1]; p += 32)
    acc += lp.csr_val[p] * val(lp.csr_col[p]);
  return warp_sum(acc);
}
// (A' v)_j with v[e] replaced by ve for the column's diagonal row e (if any): CSC order.
__device__ inline double col_sum(const Lp& lp, int j, const double* v, int e, double ve) {
  double acc = 0;
  int q = lp.col_ptr[j];
  if (e >= 0) acc += lp.csc_val[q++] * ve;
  for (; q < lp.col_ptr[j + 1]; ++q) acc += lp.csc_val[q] * v[lp.csc_row[q]];
  return acc;
}

// Rows 0..k-1 of the factor: dinv_i = 1 / sum_j d_j a_ij^2 and W'[g][i] = sum_j d_j a_ij a_gj
// (column j's entries past its first are all in rows >= k).
__device__ inline void diag_w_row(const Lp& lp, int i, const double* d, double* dinv, double* wt) {
  const int k = lp.k, r = lp.r;
  for (int g = 0; g < r; ++g) wt[g * k + i] = 0;
  double acc = 0;
  for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) {
    const int j = lp.csr_col[p];
    const double dav = d[j] * lp.csr_val[p];
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

// Half-warp items: items < P are the pairs (g >= h) of S, the r after them (when with_z)
// the sums z_g = rhs_g - sum_i W[i][g] rhs_i / diag_i. S is stored in chol[g * ld + h].
__device__ void schur_and_z(const Lp& lp, const double* d, const double* dinv, const double* wt,
                            const double* rhs, double* chol, double* z, bool with_s, bool with_z) {
  const int tid = threadIdx.x, k = lp.k, r = lp.r;
  const int warp = tid / 32, half = (tid % 32) / kGroupLanes, glane = tid % kGroupLanes;
  const int pairs = with_s ? r * (r + 1) / 2 : 0;
  const int items = pairs + (with_z ? r : 0);
  for (int base = warp * 2; base < items; base += kWarps * 2) {
    const int item = base + half;
    double acc = 0;
    int g = 0, h = 0;
    if (item < pairs) {
      g = static_cast<int>((sqrtf(8.0f * item + 1.0f) - 1.0f) * 0.5f);
      while (g * (g + 1) / 2 > item) --g;
      while ((g + 1) * (g + 2) / 2 <= item) ++g;
      h = item - g * (g + 1) / 2;
      const int row = k + g;
      for (int p = lp.row_ptr[row] + glane; p < lp.row_ptr[row + 1]; p += kGroupLanes) {
        const int j = lp.csr_col[p];
        acc += d[j] * lp.csr_val[p] * entry(lp, k + h, j);
      }
      double corr = 0;
      const double* wg = wt + g * k;
      const double* wh = wt + h * k;
      for (int i = glane; i < k; i += kGroupLanes) corr += wg[i] * wh[i] * dinv[i];
      acc -= corr;
    } else if (item < items) {
      g = item - pairs;
      const double* wg = wt + g * k;
      for (int i = glane; i < k; i += kGroupLanes) acc += wg[i] * rhs[i] * dinv[i];
    }
    acc = group_sum(acc);
    if (glane == 0) {
      if (item < pairs) {
        chol[g * lp.ld + h] = acc;
      } else if (item < items) {
        z[g] = rhs[k + g] - acc;
      }
    }
  }
}

// Warp 0: Cholesky of S in place (lower triangle, row stride ld), rows lane and lane + 32.
__device__ void chol_warp(double* c, int r, int ld) {
  const int lane = threadIdx.x % 32;
  double md = 0;
  for (int g = lane; g < r; g += 32) md = fmax(md, c[g * ld + g]);
  for (int off = 16; off > 0; off /= 2) md = fmax(md, __shfl_xor_sync(kFullMask, md, off));
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
    const double zp = __shfl_sync(kFullMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane > p && lane < r) z0 -= c[lane * ld + p] * zp;
    if (lane + 32 > p && lane + 32 < r) z1 -= c[(lane + 32) * ld + p] * zp;
  }
  for (int p = r - 1; p >= 0; --p) {
    const double zp = __shfl_sync(kFullMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane < p) z0 -= c[p * ld + lane] * zp;
    if (lane + 32 < p) z1 -= c[p * ld + lane + 32] * zp;
  }
  if (lane < r) out[lane] = z0;
  if (lane + 32 < r) out[lane + 32] = z1;
}

__device__ void block_scan(const int* counts, int* out, int len, int* scratch) {
  const int tid = threadIdx.x;
  const int chunk = (len + kThreads - 1) / kThreads;
  const int begin = min(len, tid * chunk), end = min(len, begin + chunk);
  int local = 0;
  for (int i = begin; i < end; ++i) local += counts[i];
  int total = 0;
  const int run = block_exclusive_scan(local, scratch, &total);
  serial_exclusive_scan(counts, out, begin, end, run);
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
  found = warp_sum(found);
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    found += __popc(__ballot_sync(kFullMask, v != 0.0f));
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
      const int inc = warp_inclusive_scan(mine);
      const int warp_total = __shfl_sync(kFullMask, inc, 31);
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
    const unsigned nz = __ballot_sync(kFullMask, v != 0.0f);
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

enum Phase : int {
  kPhRead,
  kPhBuild,
  kPhStart,
  kPhResid,
  kPhRows,
  kPhSchur,
  kPhCholTri,
  kPhStep,
  kPhMuAff,
  kPhCorrRhs,
  kPhCorrZ,
  kPhCorrTri,
  kPhCorrStep,
  kPhUpdate,
  kPhFinal,
  kPhases
};
const char* const kPhaseNames[kPhases] = {
    "read A (2 passes)", "CSR/CSC/k/sort", "start point",    "(1) resid, d", "(2) rows, rhs",
    "(3) S, z",          "(4) chol, tri",  "(5) steps",      "mu_aff",       "(6) corr rhs",
    "(7) corr z",        "(8) corr tri",   "(9) corr steps", "(10) update",  "output"};

template <bool kP>
__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4, unsigned long long* prof_acc) {
  extern __shared__ __align__(16) unsigned char smem[];
  v0::Prof<kP> prof(prof_acc);
  const Layout L = make_layout(m, n);
  auto dv = [&](size_t off) { return reinterpret_cast<double*>(smem + off); };
  double *x = dv(L.x), *s = dv(L.s), *dx = dv(L.dx), *ds = dv(L.ds), *d = dv(L.d), *rd = dv(L.rd),
         *rc = dv(L.rc), *cs = dv(L.cs);
  double *y = dv(L.y), *dy = dv(L.dy), *rp = dv(L.rp), *rhs = dv(L.rhs), *bs = dv(L.bs),
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
  Reducer red{dv(L.red)};
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
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

  // ---- A to CSR (row-major compaction) and CSC, as V0 ----
  if (vec4) {
    count_a<4>(a_g, total, misc);
  } else {
    count_a<1>(a_g, total, misc);
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
      compact_a<4>(a_g, total, misc, csr_val, csr_col, coo_row, n);
    } else {
      compact_a<1>(a_g, total, misc, csr_val, csr_col, coo_row, n);
    }
  }
  __syncthreads();
  prof.mark(kPhRead);
  if (!too_large) {
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
  prof.mark(kPhBuild);
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

  // ---- Mehrotra's starting point (once: the plain phases) ----
  for (int j = tid; j < n; j += kThreads) d[j] = 1.0;
  __syncthreads();
  for (int i = tid; i < k; i += kThreads) diag_w_row(lp, i, d, dinv, wt);
  __syncthreads();
  schur_and_z(lp, d, dinv, wt, rhs, chol, z, true, false);
  __syncthreads();
  if (warp == 0) chol_warp(chol, r, ld);
  __syncthreads();
  // dy = M^-1 v for v = bs (into dy), then v = A cs (into y).
  auto solve_plain = [&](const double* v, double* out) {
    schur_and_z(lp, d, dinv, wt, v, chol, z, false, true);
    __syncthreads();
    if (warp == 0) tri_warp(chol, r, ld, z, out + k);
    __syncthreads();
    for (int i = tid; i < k; i += kThreads) out[i] = dy_row(lp, i, v, dinv, wt, out);
    __syncthreads();
  };
  solve_plain(bs, dy);
  for (int j = tid; j < n; j += kThreads) {
    const int e = diag_row_of(lp, j);
    x[j] = col_sum(lp, j, dy, e, e >= 0 ? dy[e] : 0.0);
  }
  for (int i = tid; i < k; i += kThreads) rhs[i] = row_sum(lp, i, [&](int j) { return cs[j]; });
  for (int g = wrow0; g < r; g += kWarps) {
    const double v = row_sum_warp(lp, k + g, [&](int j) { return cs[j]; });
    if (lane == 0) rhs[k + g] = v;
  }
  __syncthreads();
  solve_plain(rhs, y);
  double mins[2] = {INFINITY, INFINITY};
  for (int j = tid; j < n; j += kThreads) {
    const int e = diag_row_of(lp, j);
    s[j] = cs[j] - col_sum(lp, j, y, e, e >= 0 ? y[e] : 0.0);
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
  prof.mark(kPhStart);

  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  int it = 0;
  for (;; ++it) {
    // (1) Residuals, objectives; d and t for the factor.
    double v[5] = {0, 0, 0, 0, 0};
    for (int i = tid; i < k; i += kThreads) {
      rp[i] = bs[i] - row_sum(lp, i, [&](int j) { return x[j]; });
      v[1] += bs[i] * y[i];
      v[3] = fmax(v[3], fabs(rp[i]));
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const int i = k + g;
      const double res = bs[i] - row_sum_warp(lp, i, [&](int j) { return x[j]; });
      if (lane == 0) {
        rp[i] = res;
        v[1] += bs[i] * y[i];
        v[3] = fmax(v[3], fabs(res));
      }
    }
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double rdj = cs[j] - col_sum(lp, j, y, e, e >= 0 ? y[e] : 0.0) - s[j];
      rd[j] = rdj;
      v[0] += cs[j] * x[j];
      v[2] += x[j] * s[j];
      v[4] = fmax(v[4], fabs(rdj));
      d[j] = x[j] / s[j];
    }
    red.run<3, 2, 0>(v);
    prof.mark(kPhResid);
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
    auto t_pred = [&](int j) { return x[j] + d[j] * rd[j]; };

    // (2) Factor rows < k; the predictor's rhs = rp + A t and u = diag^-1 rhs_K.
    for (int i = tid; i < k; i += kThreads) {
      diag_w_row(lp, i, d, dinv, wt);
      rhs[i] = rp[i] + row_sum(lp, i, t_pred);
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, t_pred);
      if (lane == 0) rhs[k + g] = rp[k + g] + sum;
    }
    __syncthreads();
    prof.mark(kPhRows);
    // (3) S and the predictor's z.
    schur_and_z(lp, d, dinv, wt, rhs, chol, z, true, true);
    __syncthreads();
    prof.mark(kPhSchur);
    // (4) Cholesky, the predictor's dy_G.
    if (warp == 0) {
      chol_warp(chol, r, ld);
      tri_warp(chol, r, ld, z, dy + k);
    }
    __syncthreads();
    prof.mark(kPhCholTri);
    // (5) dy_K, ds, dx, the affine step lengths.
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    double steps[2] = {INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rd[j] - col_sum(lp, j, dy, e, dye);
      const double dxj = -x[j] - d[j] * dsj;
      ds[j] = dsj;
      dx[j] = dxj;
      if (dxj < 0) steps[0] = fmin(steps[0], -x[j] / dxj);
      if (dsj < 0) steps[1] = fmin(steps[1], -s[j] / dsj);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhStep);
    const double ap_aff = fmin(1.0, steps[0]), ad_aff = fmin(1.0, steps[1]);
    double mu_aff[1] = {0};
    for (int j = tid; j < n; j += kThreads)
      mu_aff[0] += (x[j] + ap_aff * dx[j]) * (s[j] + ad_aff * ds[j]);
    red.run<1, 0, 0>(mu_aff);
    prof.mark(kPhMuAff);
    const double ratio = mu_aff[0] / n / mu;
    const double cube = ratio * ratio * ratio;
    const double sigma = cube < 0 ? 0.0 : (1.0 < cube ? 1.0 : cube);
    // (6) Corrector: rc, and rhs = rp + A t with t = -rc / s + d rd where it is used.
    auto rc_of = [&](int j) { return sigma * mu - x[j] * s[j] - dx[j] * ds[j]; };
    auto t_corr = [&](int j) { return -rc_of(j) / s[j] + d[j] * rd[j]; };
    for (int j = tid; j < n; j += kThreads) rc[j] = rc_of(j);
    for (int i = tid; i < k; i += kThreads) {
      rhs[i] = rp[i] + row_sum(lp, i, t_corr);
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, t_corr);
      if (lane == 0) rhs[k + g] = rp[k + g] + sum;
    }
    __syncthreads();
    prof.mark(kPhCorrRhs);
    // (7) The corrector's z, (8) its dy_G.
    schur_and_z(lp, d, dinv, wt, rhs, chol, z, false, true);
    __syncthreads();
    prof.mark(kPhCorrZ);
    if (warp == 0) tri_warp(chol, r, ld, z, dy + k);
    __syncthreads();
    prof.mark(kPhCorrTri);
    // (9) dy_K, ds, dx, the step lengths.
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    steps[0] = steps[1] = INFINITY;
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rd[j] - col_sum(lp, j, dy, e, dye);
      const double dxj = rc[j] / s[j] - d[j] * dsj;
      ds[j] = dsj;
      dx[j] = dxj;
      if (dxj < 0) steps[0] = fmin(steps[0], -x[j] / dxj);
      if (dsj < 0) steps[1] = fmin(steps[1], -s[j] / dsj);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhCorrStep);
    const double ap = fmin(1.0, kStepFactor * steps[0]);
    const double ad = fmin(1.0, kStepFactor * steps[1]);
    // (10) The step.
    for (int j = tid; j < n; j += kThreads) {
      x[j] += ap * dx[j];
      s[j] += ad * ds[j];
    }
    for (int i = tid; i < m; i += kThreads) y[i] += ad * dy[i];
    __syncthreads();
    prof.mark(kPhUpdate);
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
  prof.mark(kPhFinal);
}

template <bool kP>
void launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
            int max_iter, double tol, cudaStream_t stream, unsigned long long* prof = nullptr) {
  const Layout layout = make_layout(m, n);
  static size_t set = 0;
  if (set < layout.total) {
    CK(cudaFuncSetAttribute(ipm_kernel<kP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(layout.total)));
    set = layout.total;
  }
  const bool vec4 = (reinterpret_cast<uintptr_t>(a) & 15) == 0;
  ipm_kernel<kP>
      <<<1, kThreads, layout.total, stream>>>(a, b, c, x, st, m, n, max_iter, tol, vec4, prof);
  CK(cudaGetLastError());
}

}  // namespace v1
// V1 with 256 threads (8 warps): cheaper reductions and barriers, fewer lanes a phase.
namespace v1_256 {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupLanes = 16;
constexpr int kRedValues = 5;
constexpr int kUnroll = 8;

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
        const double o = __shfl_xor_sync(kFullMask, v[i], off);
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

__device__ inline double group_sum(double v) { return warp_sum(v, kGroupLanes); }

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
  for (int p = lp.row_ptr[i] + lane_id(); p < lp.row_ptr[i + 1]; p += 32)
    acc += lp.csr_val[p] * val(lp.csr_col[p]);
  return warp_sum(acc);
}
// (A' v)_j with v[e] replaced by ve for the column's diagonal row e (if any): CSC order.
__device__ inline double col_sum(const Lp& lp, int j, const double* v, int e, double ve) {
  double acc = 0;
  int q = lp.col_ptr[j];
  if (e >= 0) acc += lp.csc_val[q++] * ve;
  for (; q < lp.col_ptr[j + 1]; ++q) acc += lp.csc_val[q] * v[lp.csc_row[q]];
  return acc;
}

// Rows 0..k-1 of the factor: dinv_i = 1 / sum_j d_j a_ij^2 and W'[g][i] = sum_j d_j a_ij a_gj
// (column j's entries past its first are all in rows >= k).
__device__ inline void diag_w_row(const Lp& lp, int i, const double* d, double* dinv, double* wt) {
  const int k = lp.k, r = lp.r;
  for (int g = 0; g < r; ++g) wt[g * k + i] = 0;
  double acc = 0;
  for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) {
    const int j = lp.csr_col[p];
    const double dav = d[j] * lp.csr_val[p];
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

// Half-warp items: items < P are the pairs (g >= h) of S, the r after them (when with_z)
// the sums z_g = rhs_g - sum_i W[i][g] rhs_i / diag_i. S is stored in chol[g * ld + h].
__device__ void schur_and_z(const Lp& lp, const double* d, const double* dinv, const double* wt,
                            const double* rhs, double* chol, double* z, bool with_s, bool with_z) {
  const int tid = threadIdx.x, k = lp.k, r = lp.r;
  const int warp = tid / 32, half = (tid % 32) / kGroupLanes, glane = tid % kGroupLanes;
  const int pairs = with_s ? r * (r + 1) / 2 : 0;
  const int items = pairs + (with_z ? r : 0);
  for (int base = warp * 2; base < items; base += kWarps * 2) {
    const int item = base + half;
    double acc = 0;
    int g = 0, h = 0;
    if (item < pairs) {
      g = static_cast<int>((sqrtf(8.0f * item + 1.0f) - 1.0f) * 0.5f);
      while (g * (g + 1) / 2 > item) --g;
      while ((g + 1) * (g + 2) / 2 <= item) ++g;
      h = item - g * (g + 1) / 2;
      const int row = k + g;
      for (int p = lp.row_ptr[row] + glane; p < lp.row_ptr[row + 1]; p += kGroupLanes) {
        const int j = lp.csr_col[p];
        acc += d[j] * lp.csr_val[p] * entry(lp, k + h, j);
      }
      double corr = 0;
      const double* wg = wt + g * k;
      const double* wh = wt + h * k;
      for (int i = glane; i < k; i += kGroupLanes) corr += wg[i] * wh[i] * dinv[i];
      acc -= corr;
    } else if (item < items) {
      g = item - pairs;
      const double* wg = wt + g * k;
      for (int i = glane; i < k; i += kGroupLanes) acc += wg[i] * rhs[i] * dinv[i];
    }
    acc = group_sum(acc);
    if (glane == 0) {
      if (item < pairs) {
        chol[g * lp.ld + h] = acc;
      } else if (item < items) {
        z[g] = rhs[k + g] - acc;
      }
    }
  }
}

// Warp 0: Cholesky of S in place (lower triangle, row stride ld), rows lane and lane + 32.
__device__ void chol_warp(double* c, int r, int ld) {
  const int lane = threadIdx.x % 32;
  double md = 0;
  for (int g = lane; g < r; g += 32) md = fmax(md, c[g * ld + g]);
  for (int off = 16; off > 0; off /= 2) md = fmax(md, __shfl_xor_sync(kFullMask, md, off));
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
    const double zp = __shfl_sync(kFullMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane > p && lane < r) z0 -= c[lane * ld + p] * zp;
    if (lane + 32 > p && lane + 32 < r) z1 -= c[(lane + 32) * ld + p] * zp;
  }
  for (int p = r - 1; p >= 0; --p) {
    const double zp = __shfl_sync(kFullMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane < p) z0 -= c[p * ld + lane] * zp;
    if (lane + 32 < p) z1 -= c[p * ld + lane + 32] * zp;
  }
  if (lane < r) out[lane] = z0;
  if (lane + 32 < r) out[lane + 32] = z1;
}

__device__ void block_scan(const int* counts, int* out, int len, int* scratch) {
  const int tid = threadIdx.x;
  const int chunk = (len + kThreads - 1) / kThreads;
  const int begin = min(len, tid * chunk), end = min(len, begin + chunk);
  int local = 0;
  for (int i = begin; i < end; ++i) local += counts[i];
  int total = 0;
  const int run = block_exclusive_scan(local, scratch, &total);
  serial_exclusive_scan(counts, out, begin, end, run);
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
  found = warp_sum(found);
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    found += __popc(__ballot_sync(kFullMask, v != 0.0f));
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
      const int inc = warp_inclusive_scan(mine);
      const int warp_total = __shfl_sync(kFullMask, inc, 31);
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
    const unsigned nz = __ballot_sync(kFullMask, v != 0.0f);
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

enum Phase : int {
  kPhRead,
  kPhBuild,
  kPhStart,
  kPhResid,
  kPhRows,
  kPhSchur,
  kPhCholTri,
  kPhStep,
  kPhMuAff,
  kPhCorrRhs,
  kPhCorrZ,
  kPhCorrTri,
  kPhCorrStep,
  kPhUpdate,
  kPhFinal,
  kPhases
};
const char* const kPhaseNames[kPhases] = {
    "read A (2 passes)", "CSR/CSC/k/sort", "start point",    "(1) resid, d", "(2) rows, rhs",
    "(3) S, z",          "(4) chol, tri",  "(5) steps",      "mu_aff",       "(6) corr rhs",
    "(7) corr z",        "(8) corr tri",   "(9) corr steps", "(10) update",  "output"};

template <bool kP>
__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4, unsigned long long* prof_acc) {
  extern __shared__ __align__(16) unsigned char smem[];
  v0::Prof<kP> prof(prof_acc);
  const Layout L = make_layout(m, n);
  auto dv = [&](size_t off) { return reinterpret_cast<double*>(smem + off); };
  double *x = dv(L.x), *s = dv(L.s), *dx = dv(L.dx), *ds = dv(L.ds), *d = dv(L.d), *rd = dv(L.rd),
         *rc = dv(L.rc), *cs = dv(L.cs);
  double *y = dv(L.y), *dy = dv(L.dy), *rp = dv(L.rp), *rhs = dv(L.rhs), *bs = dv(L.bs),
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
  Reducer red{dv(L.red)};
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
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

  // ---- A to CSR (row-major compaction) and CSC, as V0 ----
  if (vec4) {
    count_a<4>(a_g, total, misc);
  } else {
    count_a<1>(a_g, total, misc);
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
      compact_a<4>(a_g, total, misc, csr_val, csr_col, coo_row, n);
    } else {
      compact_a<1>(a_g, total, misc, csr_val, csr_col, coo_row, n);
    }
  }
  __syncthreads();
  prof.mark(kPhRead);
  if (!too_large) {
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
  prof.mark(kPhBuild);
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

  // ---- Mehrotra's starting point (once: the plain phases) ----
  for (int j = tid; j < n; j += kThreads) d[j] = 1.0;
  __syncthreads();
  for (int i = tid; i < k; i += kThreads) diag_w_row(lp, i, d, dinv, wt);
  __syncthreads();
  schur_and_z(lp, d, dinv, wt, rhs, chol, z, true, false);
  __syncthreads();
  if (warp == 0) chol_warp(chol, r, ld);
  __syncthreads();
  // dy = M^-1 v for v = bs (into dy), then v = A cs (into y).
  auto solve_plain = [&](const double* v, double* out) {
    schur_and_z(lp, d, dinv, wt, v, chol, z, false, true);
    __syncthreads();
    if (warp == 0) tri_warp(chol, r, ld, z, out + k);
    __syncthreads();
    for (int i = tid; i < k; i += kThreads) out[i] = dy_row(lp, i, v, dinv, wt, out);
    __syncthreads();
  };
  solve_plain(bs, dy);
  for (int j = tid; j < n; j += kThreads) {
    const int e = diag_row_of(lp, j);
    x[j] = col_sum(lp, j, dy, e, e >= 0 ? dy[e] : 0.0);
  }
  for (int i = tid; i < k; i += kThreads) rhs[i] = row_sum(lp, i, [&](int j) { return cs[j]; });
  for (int g = wrow0; g < r; g += kWarps) {
    const double v = row_sum_warp(lp, k + g, [&](int j) { return cs[j]; });
    if (lane == 0) rhs[k + g] = v;
  }
  __syncthreads();
  solve_plain(rhs, y);
  double mins[2] = {INFINITY, INFINITY};
  for (int j = tid; j < n; j += kThreads) {
    const int e = diag_row_of(lp, j);
    s[j] = cs[j] - col_sum(lp, j, y, e, e >= 0 ? y[e] : 0.0);
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
  prof.mark(kPhStart);

  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  int it = 0;
  for (;; ++it) {
    // (1) Residuals, objectives; d and t for the factor.
    double v[5] = {0, 0, 0, 0, 0};
    for (int i = tid; i < k; i += kThreads) {
      rp[i] = bs[i] - row_sum(lp, i, [&](int j) { return x[j]; });
      v[1] += bs[i] * y[i];
      v[3] = fmax(v[3], fabs(rp[i]));
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const int i = k + g;
      const double res = bs[i] - row_sum_warp(lp, i, [&](int j) { return x[j]; });
      if (lane == 0) {
        rp[i] = res;
        v[1] += bs[i] * y[i];
        v[3] = fmax(v[3], fabs(res));
      }
    }
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double rdj = cs[j] - col_sum(lp, j, y, e, e >= 0 ? y[e] : 0.0) - s[j];
      rd[j] = rdj;
      v[0] += cs[j] * x[j];
      v[2] += x[j] * s[j];
      v[4] = fmax(v[4], fabs(rdj));
      d[j] = x[j] / s[j];
    }
    red.run<3, 2, 0>(v);
    prof.mark(kPhResid);
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
    auto t_pred = [&](int j) { return x[j] + d[j] * rd[j]; };

    // (2) Factor rows < k; the predictor's rhs = rp + A t and u = diag^-1 rhs_K.
    for (int i = tid; i < k; i += kThreads) {
      diag_w_row(lp, i, d, dinv, wt);
      rhs[i] = rp[i] + row_sum(lp, i, t_pred);
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, t_pred);
      if (lane == 0) rhs[k + g] = rp[k + g] + sum;
    }
    __syncthreads();
    prof.mark(kPhRows);
    // (3) S and the predictor's z.
    schur_and_z(lp, d, dinv, wt, rhs, chol, z, true, true);
    __syncthreads();
    prof.mark(kPhSchur);
    // (4) Cholesky, the predictor's dy_G.
    if (warp == 0) {
      chol_warp(chol, r, ld);
      tri_warp(chol, r, ld, z, dy + k);
    }
    __syncthreads();
    prof.mark(kPhCholTri);
    // (5) dy_K, ds, dx, the affine step lengths.
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    double steps[2] = {INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rd[j] - col_sum(lp, j, dy, e, dye);
      const double dxj = -x[j] - d[j] * dsj;
      ds[j] = dsj;
      dx[j] = dxj;
      if (dxj < 0) steps[0] = fmin(steps[0], -x[j] / dxj);
      if (dsj < 0) steps[1] = fmin(steps[1], -s[j] / dsj);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhStep);
    const double ap_aff = fmin(1.0, steps[0]), ad_aff = fmin(1.0, steps[1]);
    double mu_aff[1] = {0};
    for (int j = tid; j < n; j += kThreads)
      mu_aff[0] += (x[j] + ap_aff * dx[j]) * (s[j] + ad_aff * ds[j]);
    red.run<1, 0, 0>(mu_aff);
    prof.mark(kPhMuAff);
    const double ratio = mu_aff[0] / n / mu;
    const double cube = ratio * ratio * ratio;
    const double sigma = cube < 0 ? 0.0 : (1.0 < cube ? 1.0 : cube);
    // (6) Corrector: rc, and rhs = rp + A t with t = -rc / s + d rd where it is used.
    auto rc_of = [&](int j) { return sigma * mu - x[j] * s[j] - dx[j] * ds[j]; };
    auto t_corr = [&](int j) { return -rc_of(j) / s[j] + d[j] * rd[j]; };
    for (int j = tid; j < n; j += kThreads) rc[j] = rc_of(j);
    for (int i = tid; i < k; i += kThreads) {
      rhs[i] = rp[i] + row_sum(lp, i, t_corr);
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, t_corr);
      if (lane == 0) rhs[k + g] = rp[k + g] + sum;
    }
    __syncthreads();
    prof.mark(kPhCorrRhs);
    // (7) The corrector's z, (8) its dy_G.
    schur_and_z(lp, d, dinv, wt, rhs, chol, z, false, true);
    __syncthreads();
    prof.mark(kPhCorrZ);
    if (warp == 0) tri_warp(chol, r, ld, z, dy + k);
    __syncthreads();
    prof.mark(kPhCorrTri);
    // (9) dy_K, ds, dx, the step lengths.
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    steps[0] = steps[1] = INFINITY;
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rd[j] - col_sum(lp, j, dy, e, dye);
      const double dxj = rc[j] / s[j] - d[j] * dsj;
      ds[j] = dsj;
      dx[j] = dxj;
      if (dxj < 0) steps[0] = fmin(steps[0], -x[j] / dxj);
      if (dsj < 0) steps[1] = fmin(steps[1], -s[j] / dsj);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhCorrStep);
    const double ap = fmin(1.0, kStepFactor * steps[0]);
    const double ad = fmin(1.0, kStepFactor * steps[1]);
    // (10) The step.
    for (int j = tid; j < n; j += kThreads) {
      x[j] += ap * dx[j];
      s[j] += ad * ds[j];
    }
    for (int i = tid; i < m; i += kThreads) y[i] += ad * dy[i];
    __syncthreads();
    prof.mark(kPhUpdate);
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
  prof.mark(kPhFinal);
}

template <bool kP>
void launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
            int max_iter, double tol, cudaStream_t stream, unsigned long long* prof = nullptr) {
  const Layout layout = make_layout(m, n);
  static size_t set = 0;
  if (set < layout.total) {
    CK(cudaFuncSetAttribute(ipm_kernel<kP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(layout.total)));
    set = layout.total;
  }
  const bool vec4 = (reinterpret_cast<uintptr_t>(a) & 15) == 0;
  ipm_kernel<kP>
      <<<1, kThreads, layout.total, stream>>>(a, b, c, x, st, m, n, max_iter, tol, vec4, prof);
  CK(cudaGetLastError());
}

}  // namespace v1_256
// ---------------------------------------------------------------------------------------
// V2: V1's method, limits, layout size and status, with the cold start and the per-iteration
// chains cut further (the V1 profile on an H100: read A 12.8%, start point 11.8%, Cholesky
// + triangular solves 19.4%, S 10.7%, residuals 9.3%):
//   - A read once when 16-byte aligned: chunks of 2048 floats (16 float4 a lane in flight)
//     staged in wt with one shared atomic a chunk, then placed in row-major order by a scan
//     of the chunk counts (the same CSR as V1); the column counts ride in that placement.
//     The scales' maxima ride in the read phase (b and c kept in registers).
//   - The starting point's two solves (b and A c) share one factor, one S/z phase, one
//     warp-0 phase and one dy phase; the norms ride in its min reduction (6 barriers, V1 14).
//   - r <= 8: Cholesky and triangular solves by warp 0 entirely in registers (a row a lane,
//     the pivot and l_j by shuffles, no shared memory or __syncwarp inside; 1 / L_pp by
//     rsqrt, kept on the diagonal so the solves multiply); r = 9..48: V1's code.
//   - mu_aff from sums taken in the affine step reduction (one reduction less).
//   - The corrector's z: rows < k add W[i][g] rhs_i / diag_i into per-warp partials in the
//     rhs phase; warp 0 sums them and solves in the next (one phase less).
//   - Reductions combine the warps' values by a 4-way tree.
// 9 barriers an iteration (V1: 11).
// ---------------------------------------------------------------------------------------
namespace v2 {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupLanes = 16;
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

// Regions reused before they are live (no region added: V2's layout is V1's):
//  - the one-pass read stages (flat index, value) of each nonzero in wt (free until the
//    start point) and keeps its chunk table (staging offset, count, CSR offset) in chol;
//  - the corrector's per-warp partial sums of z live in coo_row (free after the build);
//  - the start point's second z in rp (m >= r doubles, free until the first residual).
static_assert(sizeof(uint32_t) * kMaxNnz + sizeof(float) * kMaxNnz <= sizeof(double) * kMaxCoupling,
              "staging must fit in wt");
static_assert(sizeof(int) * (3 * kMaxChunks + 1) <= sizeof(double) * kMaxDense * kMaxDense,
              "the chunk table must fit in chol");
static_assert(sizeof(double) * kWarps * kMaxDense <= sizeof(uint16_t) * kMaxNnz,
              "z partials must fit in coo_row");
static_assert(kMaxRows <= 2 * kThreads, "rows < k: at most two a thread in the corrector");
static_assert(kWarps % 4 == 0, "the reducer's tree");
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

struct Reducer {
  double* red;
  int half = 0;

  // V1's, with the per-warp values combined by a 4-way tree (chain 7 instead of 15).
  template <int NS, int NM, int NN>
  __device__ void run(double (&v)[NS + NM + NN]) {
    constexpr int N = NS + NM + NN;
    static_assert(N <= kRedValues);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double* buf = red + half * kRedValues * kWarps;
    half ^= 1;
    auto op = [](int i, double a, double b) {
      return i < NS ? a + b : i < NS + NM ? fmax(a, b) : fmin(a, b);
    };
#pragma unroll
    for (int i = 0; i < N; ++i) {
      for (int off = 16; off > 0; off /= 2)
        v[i] = op(i, v[i], __shfl_xor_sync(kFullMask, v[i], off));
      if (lane == 0) buf[i * kWarps + warp] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const double* b = buf + i * kWarps;
      double a0 = b[0], a1 = b[1], a2 = b[2], a3 = b[3];
#pragma unroll
      for (int w = 4; w < kWarps; w += 4) {
        a0 = op(i, a0, b[w]);
        a1 = op(i, a1, b[w + 1]);
        a2 = op(i, a2, b[w + 2]);
        a3 = op(i, a3, b[w + 3]);
      }
      v[i] = op(i, op(i, a0, a1), op(i, a2, a3));
    }
  }
};

__device__ inline double group_sum(double v) { return warp_sum(v, kGroupLanes); }

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
  for (int p = lp.row_ptr[i] + lane_id(); p < lp.row_ptr[i + 1]; p += 32)
    acc += lp.csr_val[p] * val(lp.csr_col[p]);
  return warp_sum(acc);
}
// (A' v)_j with v[e] replaced by ve for the column's diagonal row e (if any): CSC order.
__device__ inline double col_sum(const Lp& lp, int j, const double* v, int e, double ve) {
  double acc = 0;
  int q = lp.col_ptr[j];
  if (e >= 0) acc += lp.csc_val[q++] * ve;
  for (; q < lp.col_ptr[j + 1]; ++q) acc += lp.csc_val[q] * v[lp.csc_row[q]];
  return acc;
}

// Rows 0..k-1 of the factor: dinv_i = 1 / sum_j d_j a_ij^2 and W'[g][i] = sum_j d_j a_ij a_gj
// (column j's entries past its first are all in rows >= k).
__device__ inline void diag_w_row(const Lp& lp, int i, const double* d, double* dinv, double* wt) {
  const int k = lp.k, r = lp.r;
  for (int g = 0; g < r; ++g) wt[g * k + i] = 0;
  double acc = 0;
  for (int p = lp.row_ptr[i]; p < lp.row_ptr[i + 1]; ++p) {
    const int j = lp.csr_col[p];
    const double dav = d[j] * lp.csr_val[p];
    acc += dav * lp.csr_val[p];
    for (int q = lp.col_ptr[j] + 1; q < lp.col_ptr[j + 1]; ++q)
      wt[(lp.csc_row[q] - k) * k + i] += dav * lp.csc_val[q];
  }
  dinv[i] = 1.0 / (acc > kTinyDiag ? acc : kSkippedPivot);
}
// The same with d = 1 (the starting point): d_j a_ij = a_ij, the same bits.
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

// Half-warp items: items < P are the pairs (g >= h) of S, the r after them (when with_z)
// the sums z_g = rhs_g - sum_i W[i][g] rhs_i / diag_i, and r more for rhs2 (into z2) when
// it is given (the starting point's two solves at once). S is stored in chol[g * ld + h].
__device__ void schur_and_z(const Lp& lp, const double* d, const double* dinv, const double* wt,
                            const double* rhs, double* chol, double* z, bool with_s, bool with_z,
                            const double* rhs2 = nullptr, double* z2 = nullptr) {
  const int tid = threadIdx.x, k = lp.k, r = lp.r;
  const int warp = tid / 32, half = (tid % 32) / kGroupLanes, glane = tid % kGroupLanes;
  const int pairs = with_s ? r * (r + 1) / 2 : 0;
  const int items1 = pairs + (with_z ? r : 0);
  const int items = items1 + (rhs2 != nullptr ? r : 0);
  for (int base = warp * 2; base < items; base += kWarps * 2) {
    const int item = base + half;
    double acc = 0;
    int g = 0, h = 0;
    if (item < pairs) {
      g = static_cast<int>((sqrtf(8.0f * item + 1.0f) - 1.0f) * 0.5f);
      while (g * (g + 1) / 2 > item) --g;
      while ((g + 1) * (g + 2) / 2 <= item) ++g;
      h = item - g * (g + 1) / 2;
      const int row = k + g;
      for (int p = lp.row_ptr[row] + glane; p < lp.row_ptr[row + 1]; p += kGroupLanes) {
        const int j = lp.csr_col[p];
        acc += d[j] * lp.csr_val[p] * entry(lp, k + h, j);
      }
      double corr = 0;
      const double* wg = wt + g * k;
      const double* wh = wt + h * k;
      for (int i = glane; i < k; i += kGroupLanes) corr += wg[i] * wh[i] * dinv[i];
      acc -= corr;
    } else if (item < items1) {
      g = item - pairs;
      const double* wg = wt + g * k;
      for (int i = glane; i < k; i += kGroupLanes) acc += wg[i] * rhs[i] * dinv[i];
    } else if (item < items) {
      g = item - items1;
      const double* wg = wt + g * k;
      for (int i = glane; i < k; i += kGroupLanes) acc += wg[i] * rhs2[i] * dinv[i];
    }
    acc = group_sum(acc);
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

// Warp 0: Cholesky of S in place (lower triangle, row stride ld), rows lane and lane + 32.
__device__ void chol_warp(double* c, int r, int ld) {
  const int lane = threadIdx.x % 32;
  double md = 0;
  for (int g = lane; g < r; g += 32) md = fmax(md, c[g * ld + g]);
  for (int off = 16; off > 0; off /= 2) md = fmax(md, __shfl_xor_sync(kFullMask, md, off));
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
    const double zp = __shfl_sync(kFullMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
    if (lane == (p & 31)) (p < 32 ? z0 : z1) = zp;
    if (lane > p && lane < r) z0 -= c[lane * ld + p] * zp;
    if (lane + 32 > p && lane + 32 < r) z1 -= c[(lane + 32) * ld + p] * zp;
  }
  for (int p = r - 1; p >= 0; --p) {
    const double zp = __shfl_sync(kFullMask, p < 32 ? z0 : z1, p & 31) / c[p * ld + p];
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
  for (int off = 16; off > 0; off /= 2) md = fmax(md, __shfl_xor_sync(kFullMask, md, off));
#pragma unroll
  for (int p = 0; p < RM; ++p) {
    if (p >= r) break;
    const double piv = __shfl_sync(kFullMask, a[p], p);
    const bool ok = piv > kRelPivotTol * md && piv > 0;
    const double inv = ok ? rsqrt(piv) : 1.0 / kSkippedPivot;
    a[p] = lane == p ? inv : a[p] * inv;
#pragma unroll
    for (int j = p + 1; j < RM; ++j) {
      const double lj = __shfl_sync(kFullMask, a[p], j);
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
      const double wp = __shfl_sync(kFullMask, zv[v] * row[p], p);
      zv[v] = lane == p ? wp : lane > p ? zv[v] - row[p] * wp : zv[v];
    }
  }
#pragma unroll
  for (int p = RM - 1; p >= 0; --p) {
    if (p >= r) continue;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const double xp = __shfl_sync(kFullMask, zv[v] * row[p], p);
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
  const int run = block_exclusive_scan(local, scratch, &total);
  serial_exclusive_scan(counts, out, begin, end, run);
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
  found = warp_sum(found);
  if (warp == kWarps - 1) {
    const int64_t flat = vecs * kVec + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    found += __popc(__ballot_sync(kFullMask, v != 0.0f));
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
      const int inc = warp_inclusive_scan(mine);
      const int warp_total = __shfl_sync(kFullMask, inc, 31);
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
    const unsigned nz = __ballot_sync(kFullMask, v != 0.0f);
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
// order afterwards, so the compacted order is V1's row-major one.
__device__ void read_a_once(const float* __restrict__ a, int64_t total, int nmain, int* counter,
                            uint32_t* stage_idx, float* stage_val, int* chunk_soff,
                            int* chunk_cnt) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lt = (1u << lane) - 1u;
  const int64_t vecs = total / 4;
  const float4* a4 = reinterpret_cast<const float4*>(a);
  for (int c = warp; c < nmain; c += kWarps) {
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
    const int cnt = warp_sum(mine);
    int off = 0;
    if (lane == 0) off = atomicAdd(counter, cnt);
    off = __shfl_sync(kFullMask, off, 0);
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
        bal[e] = __ballot_sync(kFullMask, e4[e] != 0.0f);
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
  if (warp == nmain % kWarps) {
    const int64_t flat = vecs * 4 + lane;
    const float v = flat < total ? a[flat] : 0.0f;
    const unsigned nz = __ballot_sync(kFullMask, v != 0.0f);
    int off = 0;
    if (lane == 0) off = atomicAdd(counter, __popc(nz));
    off = __shfl_sync(kFullMask, off, 0);
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

enum Phase : int {
  kPhRead,
  kPhBuild,
  kPhStart,
  kPhResid,
  kPhRows,
  kPhSchur,
  kPhCholTri,
  kPhStep,
  kPhCorrRhs,
  kPhCorrTri,
  kPhCorrStep,
  kPhUpdate,
  kPhFinal,
  kPhases
};
const char* const kPhaseNames[kPhases] = {"read A (1 pass)",
                                          "CSR/CSC/k/sort",
                                          "start point",
                                          "(1) resid, d",
                                          "(2) rows, rhs",
                                          "(3) S, z",
                                          "(4) chol, tri (reg)",
                                          "(5) steps+mu_aff",
                                          "(6) corr rhs, z parts",
                                          "(7) corr z, tri",
                                          "(8) corr steps",
                                          "(9) update",
                                          "output"};

template <bool kP>
__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4, unsigned long long* prof_acc) {
  extern __shared__ __align__(16) unsigned char smem[];
  v0::Prof<kP> prof(prof_acc);
  const Layout L = make_layout(m, n);
  auto dv = [&](size_t off) { return reinterpret_cast<double*>(smem + off); };
  double *x = dv(L.x), *s = dv(L.s), *dx = dv(L.dx), *ds = dv(L.ds), *d = dv(L.d), *rd = dv(L.rd),
         *rc = dv(L.rc), *cs = dv(L.cs);
  double *y = dv(L.y), *dy = dv(L.dy), *rp = dv(L.rp), *rhs = dv(L.rhs), *bs = dv(L.bs),
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
  double* zpart = dv(L.coo_row);             // kWarps x kMaxDense, after the build
  double* red_buf = dv(L.red);
  Reducer red{red_buf};
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t total = static_cast<int64_t>(m) * n;

  if (tid == 0) misc[kMiscStage] = 0;
  for (int j = tid; j < n; j += kThreads) col_fill[j] = 0;
  __syncthreads();

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
  const int64_t vecs = total / 4;
  const int nmain = static_cast<int>((vecs + kChunkVecs - 1) / kChunkVecs);
  const int nchunks = nmain + 1;
  if (vec4) {
    read_a_once(a_g, total, nmain, &misc[kMiscStage], stage_idx, stage_val, chunk_soff, chunk_cnt);
  } else {
    count_a<1>(a_g, total, misc);
  }
  for (int off = 16; off > 0; off /= 2) {
    scale[0] = fmax(scale[0], __shfl_xor_sync(kFullMask, scale[0], off));
    scale[1] = fmax(scale[1], __shfl_xor_sync(kFullMask, scale[1], off));
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
  prof.mark(kPhRead);
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
  prof.mark(kPhBuild);
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
  // Warps holding rows < k (a thread each: tid and tid + kThreads).
  const int zwarps = min(kWarps, (k + 31) / 32);

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
  double* z2 = rp;  // free until the first residual
  schur_and_z(lp, d, dinv, wt, bs, chol, z, true, true, rhs, z2);
  __syncthreads();
  if (warp == 0) dense_solve(chol, r, ld, true, z, dy + k, z2, y + k);
  __syncthreads();
  for (int i = tid; i < k; i += kThreads) {
    dy[i] = dy_row(lp, i, bs, dinv, wt, dy);
    y[i] = dy_row(lp, i, rhs, dinv, wt, y);
  }
  // max |bs|, max |cs| (the norms), min x, min s.
  double mm[4] = {0, 0, INFINITY, INFINITY};
  for (int i = tid; i < m; i += kThreads) mm[0] = fmax(mm[0], fabs(bs[i]));
  for (int j = tid; j < n; j += kThreads) {
    const int e = diag_row_of(lp, j);
    const double dye = e >= 0 ? dy_row(lp, e, bs, dinv, wt, dy) : 0.0;
    const double ye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, y) : 0.0;
    const double xj = col_sum(lp, j, dy, e, dye);
    const double sj = cs[j] - col_sum(lp, j, y, e, ye);
    x[j] = xj;
    s[j] = sj;
    mm[1] = fmax(mm[1], fabs(cs[j]));
    mm[2] = fmin(mm[2], xj);
    mm[3] = fmin(mm[3], sj);
  }
  red.run<0, 2, 2>(mm);
  const double b_norm = mm[0], c_norm = mm[1];
  if (n > 0) {
    const double dxs = fmax(-1.5 * mm[2], 0.0), dss = fmax(-1.5 * mm[3], 0.0);
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
  prof.mark(kPhStart);

  int reason = kReasonIterationLimit;
  double prel = 0, drel = 0, gap = 0;
  int it = 0;
  for (;; ++it) {
    // (1) Residuals, objectives; d for the factor.
    double v[5] = {0, 0, 0, 0, 0};
    for (int i = tid; i < k; i += kThreads) {
      rp[i] = bs[i] - row_sum(lp, i, [&](int j) { return x[j]; });
      v[1] += bs[i] * y[i];
      v[3] = fmax(v[3], fabs(rp[i]));
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const int i = k + g;
      const double res = bs[i] - row_sum_warp(lp, i, [&](int j) { return x[j]; });
      if (lane == 0) {
        rp[i] = res;
        v[1] += bs[i] * y[i];
        v[3] = fmax(v[3], fabs(res));
      }
    }
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double rdj = cs[j] - col_sum(lp, j, y, e, e >= 0 ? y[e] : 0.0) - s[j];
      rd[j] = rdj;
      v[0] += cs[j] * x[j];
      v[2] += x[j] * s[j];
      v[4] = fmax(v[4], fabs(rdj));
      d[j] = x[j] / s[j];
    }
    red.run<3, 2, 0>(v);
    prof.mark(kPhResid);
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
    auto t_pred = [&](int j) { return x[j] + d[j] * rd[j]; };

    // (2) Factor rows < k; the predictor's rhs = rp + A t.
    for (int i = tid; i < k; i += kThreads) {
      diag_w_row(lp, i, d, dinv, wt);
      rhs[i] = rp[i] + row_sum(lp, i, t_pred);
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, t_pred);
      if (lane == 0) rhs[k + g] = rp[k + g] + sum;
    }
    __syncthreads();
    prof.mark(kPhRows);
    // (3) S and the predictor's z.
    schur_and_z(lp, d, dinv, wt, rhs, chol, z, true, true);
    __syncthreads();
    prof.mark(kPhSchur);
    // (4) Cholesky and the predictor's dy_G (warp 0, registers for r <= 8).
    if (warp == 0) dense_solve(chol, r, ld, true, z, dy + k);
    __syncthreads();
    prof.mark(kPhCholTri);
    // (5) dy_K, ds, dx, the affine step lengths and, in the same reduction, the three sums
    // that give mu_aff = sum (x + ap dx)(s + ad ds) once ap, ad are known.
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    double st[5] = {0, 0, 0, INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rd[j] - col_sum(lp, j, dy, e, dye);
      const double dxj = -x[j] - d[j] * dsj;
      ds[j] = dsj;
      dx[j] = dxj;
      st[0] += dxj * s[j];
      st[1] += x[j] * dsj;
      st[2] += dxj * dsj;
      if (dxj < 0) st[3] = fmin(st[3], -x[j] / dxj);
      if (dsj < 0) st[4] = fmin(st[4], -s[j] / dsj);
    }
    red.run<3, 0, 2>(st);
    prof.mark(kPhStep);
    const double ap_aff = fmin(1.0, st[3]), ad_aff = fmin(1.0, st[4]);
    const double mu_aff = v[2] + ap_aff * st[0] + ad_aff * st[1] + ap_aff * ad_aff * st[2];
    const double ratio = mu_aff / n / mu;
    const double cube = ratio * ratio * ratio;
    const double sigma = cube < 0 ? 0.0 : (1.0 < cube ? 1.0 : cube);
    // (6) Corrector: rc, rhs = rp + A t (t = -rc / s + d rd where it is used) and each
    // warp's partial sums of z_g's correction sum_i W[i][g] rhs_i / diag_i (rows < k a
    // thread: tid and tid + kThreads).
    auto rc_of = [&](int j) { return sigma * mu - x[j] * s[j] - dx[j] * ds[j]; };
    auto t_corr = [&](int j) { return -rc_of(j) / s[j] + d[j] * rd[j]; };
    for (int j = tid; j < n; j += kThreads) rc[j] = rc_of(j);
    double u0 = 0, u1 = 0;
    if (tid < k) {
      const double h = rp[tid] + row_sum(lp, tid, t_corr);
      rhs[tid] = h;
      u0 = h * dinv[tid];
    }
    if (tid + kThreads < k) {
      const int i = tid + kThreads;
      const double h = rp[i] + row_sum(lp, i, t_corr);
      rhs[i] = h;
      u1 = h * dinv[i];
    }
    for (int g = wrow0; g < r; g += kWarps) {
      const double sum = row_sum_warp(lp, k + g, t_corr);
      if (lane == 0) rhs[k + g] = rp[k + g] + sum;
    }
    if (warp < zwarps) {
      for (int g0 = 0; g0 < r; g0 += 8) {
        double acc[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int g = g0 + q;
          double a = 0;
          if (g < r) {
            if (tid < k) a += wt[g * k + tid] * u0;
            if (tid + kThreads < k) a += wt[g * k + tid + kThreads] * u1;
          }
          acc[q] = a;
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[q] += __shfl_xor_sync(kFullMask, acc[q], off);
        }
        if (lane == 0) {
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            if (g0 + q < r) zpart[warp * kMaxDense + g0 + q] = acc[q];
          }
        }
      }
    }
    __syncthreads();
    prof.mark(kPhCorrRhs);
    // (7) Warp 0: z_g = rhs_g - the partials' sum (4-way tree), then the corrector's dy_G.
    if (warp == 0) {
      for (int g = lane; g < r; g += 32) {
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int w = 0;
        for (; w + 4 <= zwarps; w += 4) {
          a0 += zpart[w * kMaxDense + g];
          a1 += zpart[(w + 1) * kMaxDense + g];
          a2 += zpart[(w + 2) * kMaxDense + g];
          a3 += zpart[(w + 3) * kMaxDense + g];
        }
        for (; w < zwarps; ++w) a0 += zpart[w * kMaxDense + g];
        z[g] = rhs[k + g] - ((a0 + a1) + (a2 + a3));
      }
      __syncwarp();
      dense_solve(chol, r, ld, false, z, dy + k);
    }
    __syncthreads();
    prof.mark(kPhCorrTri);
    // (8) dy_K, ds, dx, the step lengths.
    for (int i = tid; i < k; i += kThreads) dy[i] = dy_row(lp, i, rhs, dinv, wt, dy);
    double steps[2] = {INFINITY, INFINITY};
    for (int j = tid; j < n; j += kThreads) {
      const int e = diag_row_of(lp, j);
      const double dye = e >= 0 ? dy_row(lp, e, rhs, dinv, wt, dy) : 0.0;
      const double dsj = rd[j] - col_sum(lp, j, dy, e, dye);
      const double dxj = rc[j] / s[j] - d[j] * dsj;
      ds[j] = dsj;
      dx[j] = dxj;
      if (dxj < 0) steps[0] = fmin(steps[0], -x[j] / dxj);
      if (dsj < 0) steps[1] = fmin(steps[1], -s[j] / dsj);
    }
    red.run<0, 0, 2>(steps);
    prof.mark(kPhCorrStep);
    const double ap = fmin(1.0, kStepFactor * steps[0]);
    const double ad = fmin(1.0, kStepFactor * steps[1]);
    // (9) The step.
    for (int j = tid; j < n; j += kThreads) {
      x[j] += ap * dx[j];
      s[j] += ad * ds[j];
    }
    for (int i = tid; i < m; i += kThreads) y[i] += ad * dy[i];
    __syncthreads();
    prof.mark(kPhUpdate);
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
  prof.mark(kPhFinal);
}

template <bool kP>
void launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
            int max_iter, double tol, cudaStream_t stream, unsigned long long* prof = nullptr) {
  if (m > kMaxRows || n > kMaxCols) {  // solve_cuda refuses these before the launch
    std::printf("v2::launch: %dx%d is past the limits\n", m, n);
    std::exit(1);
  }
  const Layout layout = make_layout(m, n);
  static size_t set = 0;
  if (set < layout.total) {
    CK(cudaFuncSetAttribute(ipm_kernel<kP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(layout.total)));
    set = layout.total;
  }
  const bool vec4 = (reinterpret_cast<uintptr_t>(a) & 15) == 0;
  ipm_kernel<kP>
      <<<1, kThreads, layout.total, stream>>>(a, b, c, x, st, m, n, max_iter, tol, vec4, prof);
  CK(cudaGetLastError());
}

}  // namespace v2
// ---------------------------------------------------------------------------------------
// V3: V2's method, limits, layout (the same regions, the same size) and status, with fewer
// barriers and shorter phases per iteration (V2's H100 profile: residuals 13%, S 13%,
// register Cholesky + solves 11%, step lengths 11%, reading A 10%):
//   - S = A_G D A_G' - W' Dinv W without column searches: once per solve (r <= 32, when
//     they fit in chol's unused tail) two lists per pair (g >= h) of S: the columns where
//     rows k+g and k+h are both nonzero, with both values, and the rows i < k whose W row
//     is structurally nonzero at g and at h (W's pattern: a 64-bit mask a row). An S entry
//     then sums its own short lists (demo: <= 37 and <= 36 terms, 1-2 off the diagonal),
//     and z_g the rows of its diagonal pair; 8 lanes an item, so r <= 8 is one round.
//     Otherwise (r > 32, or lists too long) V2's sums: an entry search a column, all i < k.
//   - The step is folded into the residual phase: x, s and y are double-buffered (the
//     second buffers in rc's, rd's and rp's regions, which V3 no longer needs), the
//     pending step x + ap dx, s + ad ds, y + ad dy is taken where it is read (explicit
//     fma: the same bits everywhere) and stored to the other buffer; the pointers swap.
//   - The factor's rows < k (dinv, W) and the predictor's rhs = rp + A(x + d rd) ride in
//     the same pass: a row's thread recomputes d_j and rd_j of its columns from the
//     (pending) iterate, the same expressions as the column's owner.
//   - rd is not kept across the residual phase: the affine step recomputes it with A' dy
//     in one column pass (the same sum, the same bits) and keeps it in the old x buffer
//     for the corrector; rc is recomputed where it is used (column-local).
//   - The corrector's rhs = rhs_pred + A((dx ds - sigma mu) / s) (t_corr - t_pred, no rp
//     needed) in place; warp 0 sums z_g from the lists (or all i < k) itself: no per-warp
//     partials (V2: 8-value butterflies in every warp holding rows < k).
//   - Reductions: maxima and minima of values >= 0 exactly by two 32-bit redux (hi word,
//     then lo word among the lanes with the max hi) instead of five double shuffles;
//     the warps' partials read two at a time (128-bit loads: half the broadcast loads).
//   - Registers: (x, s), (dx, ds) and their second buffer as 16-byte pairs (one load, one
//     pointer), the lists behind one pointer, beta / the norms / tol in shared memory, and
//     the one-pass read of A behind a call: 128 registers, no spills (V2: 104 bytes).
// 7 barriers an iteration (V2: 9); the start point keeps V2's 6, the list build adds 4
// (once).
// ---------------------------------------------------------------------------------------
namespace v3 {

using v2::col_sum;
using v2::diag_row_of;
using v2::dy_row;
using v2::entry;
using v2::kChunkVecs;
using v2::kMaxChunks;
using v2::kMiscK;
using v2::kMiscNnz;
using v2::kMiscStage;
using v2::kMiscTooLarge;
using v2::kRedValues;
using v2::kThreads;
using v2::kWarps;
using v2::Lp;
using v2::row_sum;
using v2::row_sum_warp;
constexpr int kMiscLists = kWarps + 4;  // the lists fit (1) or not (0)
constexpr int kGroup = 8;               // lanes a Schur item
constexpr int kItemsPerWarp = 32 / kGroup;
constexpr int kListMaxR = 32;  // lists only for r <= 32: W's pattern in a 64-bit mask, short build
constexpr int kListMaxPairs = kListMaxR * (kListMaxR + 1) / 2;

// V2's layout, region for region (so the same limits). V3 uses rc's region as x's second
// buffer, rd's as s's and rp's as y's. Reused besides (see V2's notes):
//  - during the list build wt holds W's pattern (k uint64) and the two count arrays;
//  - the lists live in chol past the factor's r * ld doubles: off1[P + 1], off2[P + 1],
//    then (float2 values, uint16 column) of list 1 and the uint16 rows of list 2.
using Layout = v2::Layout;
using v2::make_layout;
static_assert(sizeof(uint64_t) * kMaxRows + 2 * sizeof(int) * kListMaxPairs <=
                  sizeof(double) * kMaxCoupling,
              "W's pattern and the counts must fit in wt");
static_assert(sizeof(double) * kListMaxR * (kListMaxR + 1) + 16 +
                      2 * sizeof(int) * (kListMaxPairs + 1) <=
                  sizeof(double) * kMaxDense * kMaxDense,
              "the offsets must fit in chol's tail");

__device__ inline size_t align16(size_t v) { return (v + 15) / 16 * 16; }

// Exact warp maxima / minima of doubles >= 0 (their bit patterns order as the values: +inf
// above every finite value; a NaN is above +inf, so a max keeps it and a min drops it).
__device__ inline double warp_max_pos(double v) {
  const unsigned hi = static_cast<unsigned>(__double2hiint(v));
  const unsigned lo = static_cast<unsigned>(__double2loint(v));
  const unsigned mh = __reduce_max_sync(kFullMask, hi);
  const unsigned ml = __reduce_max_sync(kFullMask, hi == mh ? lo : 0u);
  return __hiloint2double(static_cast<int>(mh), static_cast<int>(ml));
}
__device__ inline double warp_min_pos(double v) {
  const unsigned hi = static_cast<unsigned>(__double2hiint(v));
  const unsigned lo = static_cast<unsigned>(__double2loint(v));
  const unsigned mh = __reduce_min_sync(kFullMask, hi);
  const unsigned ml = __reduce_min_sync(kFullMask, hi == mh ? lo : 0xffffffffu);
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
          v[i] = op(i, v[i], __shfl_xor_sync(kFullMask, v[i], off));
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

// The Schur lists (see the top), from one base (the start of chol's tail, 16-byte aligned):
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
// its own; without, V2's sums (an entry search a column of row k+g, all i < k).
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
    acc = warp_sum(acc, kGroup);
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
    acc = warp_sum(acc, width);
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

// V2's one-pass read behind a call: its 16 float4 a lane in flight then do not share one
// register allocation with the values that live through the iterations (inlined, the
// kernel spilled 52 bytes at 128 registers; as a call, none, and no stack frame).
__device__ __noinline__ void read_a_once(const float* __restrict__ a, int64_t total, int nmain,
                                         int* counter, uint32_t* stage_idx, float* stage_val,
                                         int* chunk_soff, int* chunk_cnt) {
  v2::read_a_once(a, total, nmain, counter, stage_idx, stage_val, chunk_soff, chunk_cnt);
}

enum Phase : int {
  kPhRead,
  kPhBuild,
  kPhLists,
  kPhStart,
  kPhResid,
  kPhSchur,
  kPhCholTri,
  kPhStep,
  kPhCorrRhs,
  kPhCorrTri,
  kPhCorrStep,
  kPhFinal,
  kPhases
};
const char* const kPhaseNames[kPhases] = {
    "read A (1 pass)",     "CSR/CSC/k/sort",   "Schur lists",         "start point",
    "(1) step,resid,rows", "(2) S, z (lists)", "(3) chol, tri (reg)", "(4) rd,steps+mu_aff",
    "(5) corr rhs",        "(6) corr z, tri",  "(7) corr steps",      "output"};

template <bool kP>
__global__ void __launch_bounds__(kThreads, 1)
    ipm_kernel(const float* __restrict__ a_g, const float* __restrict__ b_g,
               const float* __restrict__ c_g, float* __restrict__ x_out, float* __restrict__ status,
               int m, int n, int max_iter, double tol, bool vec4, unsigned long long* prof_acc) {
  extern __shared__ __align__(16) unsigned char smem[];
  v0::Prof<kP> prof(prof_acc);
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
  // Reused regions (see V2's static_asserts and V3's above).
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

  // ---- V2's read and build, unchanged: the scales' partial maxima and A (one pass when
  // 16-byte aligned), CSR, CSC sorted by row, k, the limits ----
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
  const int64_t vecs = total / 4;
  const int nmain = static_cast<int>((vecs + kChunkVecs - 1) / kChunkVecs);
  const int nchunks = nmain + 1;
  if (vec4) {
    read_a_once(a_g, total, nmain, &misc[kMiscStage], stage_idx, stage_val, chunk_soff, chunk_cnt);
  } else {
    v2::count_a<1>(a_g, total, misc);
  }
  for (int off = 16; off > 0; off /= 2) {
    scale[0] = fmax(scale[0], __shfl_xor_sync(kFullMask, scale[0], off));
    scale[1] = fmax(scale[1], __shfl_xor_sync(kFullMask, scale[1], off));
  }
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
    if (!too_large) v2::block_scan(chunk_cnt, chunk_coff, nchunks, misc);
    if (!too_large) {
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
    if (!too_large) v2::compact_a<1>(a_g, total, misc, csr_val, csr_col, coo_row, n);
    __syncthreads();
    if (!too_large) {
      for (int p = tid; p < nnz; p += kThreads) atomicAdd(&col_fill[csr_col[p]], 1);
    }
    __syncthreads();
  }
  prof.mark(kPhRead);
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
    v2::block_scan(col_fill, col_ptr, n, misc);
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
  prof.mark(kPhBuild);
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
  const Lp lp{m,       n,       k,       r,      r < kMaxDense ? r + 1 : r, csr_val, csc_val,
              csr_col, csc_row, row_ptr, col_ptr};
  const int ld = lp.ld;
  const int wrow0 = kWarps - 1 - warp;  // rows >= k: a warp each, from the last warp down

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
          const unsigned hit = __ballot_sync(kFullMask, ah != 0.0f);
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
          const unsigned hit = __ballot_sync(kFullMask, in);
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
            const int i1 = warp_inclusive_scan(c1), i2 = warp_inclusive_scan(c2);
            if (e < pairs) off[e] = make_int2(run1 + i1 - c1, run2 + i2 - c2);
            run1 += __shfl_sync(kFullMask, i1, 31);
            run2 += __shfl_sync(kFullMask, i2, 31);
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
  prof.mark(kPhLists);

  // ---- Mehrotra's starting point (V2's): both solves (b and A c) through one factor ----
  for (int j = tid; j < n; j += kThreads) d[j] = 1.0;
  for (int i = tid; i < k; i += kThreads) {
    v2::diag_w_row_unit(lp, i, dinv, wt);
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
  if (warp == 0) v2::dense_solve(chol, r, ld, true, z, dy + k, z2, y + k);
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
  prof.mark(kPhStart);

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
      ax = warp_sum(ax);
      at = warp_sum(at);
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
    prof.mark(kPhResid);
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
    prof.mark(kPhSchur);
    // (3) Cholesky and the predictor's dy_G (warp 0, registers for r <= 8).
    if (warp == 0) v2::dense_solve(chol, r, ld, true, z, dy + k);
    __syncthreads();
    prof.mark(kPhCholTri);
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
    prof.mark(kPhStep);
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
    prof.mark(kPhCorrRhs);
    // (6) Warp 0: the corrector's z (its own sums) and dy_G.
    if (warp == 0) {
      z_warp(lp, ls, dinv, wt, rhs, z);
      __syncwarp();
      v2::dense_solve(chol, r, ld, false, z, dy + k);
    }
    __syncthreads();
    prof.mark(kPhCorrTri);
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
    prof.mark(kPhCorrStep);
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
  prof.mark(kPhFinal);
}

template <bool kP>
void launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
            int max_iter, double tol, cudaStream_t stream, unsigned long long* prof = nullptr) {
  if (m > kMaxRows || n > kMaxCols) {  // solve_cuda refuses these before the launch
    std::printf("v3::launch: %dx%d is past the limits\n", m, n);
    std::exit(1);
  }
  const Layout layout = make_layout(m, n);
  static size_t set = 0;
  if (set < layout.total) {
    CK(cudaFuncSetAttribute(ipm_kernel<kP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(layout.total)));
    set = layout.total;
  }
  const bool vec4 = (reinterpret_cast<uintptr_t>(a) & 15) == 0;
  ipm_kernel<kP>
      <<<1, kThreads, layout.total, stream>>>(a, b, c, x, st, m, n, max_iter, tol, vec4, prof);
  CK(cudaGetLastError());
}

}  // namespace v3
#define VARIANTS                                                                               \
  {                                                                                            \
    {"V0 kreg", v0_launch}, {"V1", v1_launch}, {"V1/256", v1_256_launch}, {"V2", v2_launch}, { \
      "V3", v3_launch                                                                          \
    }                                                                                          \
  }
// ---------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------
cudaStream_t g_stream;
constexpr int kGraphCalls = 20;

using LaunchFn = void (*)(const float*, const float*, const float*, float*, float*, int, int, int,
                          double, cudaStream_t);
struct Variant {
  const char* name;
  LaunchFn launch;
};
void v1_launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
               int max_iter, double tol, cudaStream_t s) {
  v1::launch<false>(a, b, c, x, st, m, n, max_iter, tol, s);
}
void v1_256_launch(const float* a, const float* b, const float* c, float* x, float* st, int m,
                   int n, int max_iter, double tol, cudaStream_t s) {
  v1_256::launch<false>(a, b, c, x, st, m, n, max_iter, tol, s);
}
void v2_launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
               int max_iter, double tol, cudaStream_t s) {
  v2::launch<false>(a, b, c, x, st, m, n, max_iter, tol, s);
}
void v3_launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
               int max_iter, double tol, cudaStream_t s) {
  v3::launch<false>(a, b, c, x, st, m, n, max_iter, tol, s);
}
void v0_launch(const float* a, const float* b, const float* c, float* x, float* st, int m, int n,
               int max_iter, double tol, cudaStream_t s) {
  v0::launch<false>(a, b, c, x, st, m, n, max_iter, tol, s);
}

struct DevLp {
  int m = 0, n = 0;
  float *A = nullptr, *b = nullptr, *c = nullptr, *x = nullptr, *st = nullptr;
  float* a_base = nullptr;
  // a_offset floats before A: 1 makes A 4-byte aligned only (the kernels' scalar read path).
  explicit DevLp(const HostLp& h, int a_offset = 0) : m(h.m), n(h.n) {
    CK(cudaMalloc(&a_base, sizeof(float) * (h.A.size() + a_offset)));
    A = a_base + a_offset;
    CK(cudaMalloc(&b, sizeof(float) * h.m));
    CK(cudaMalloc(&c, sizeof(float) * h.n));
    CK(cudaMalloc(&x, sizeof(float) * h.n));
    CK(cudaMalloc(&st, sizeof(float) * 8));
    CK(cudaMemcpy(A, h.A.data(), sizeof(float) * h.A.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, h.b.data(), sizeof(float) * h.m, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c, h.c.data(), sizeof(float) * h.n, cudaMemcpyHostToDevice));
  }
  ~DevLp() { cudaFree(a_base), cudaFree(b), cudaFree(c), cudaFree(x), cudaFree(st); }
  DevLp(const DevLp&) = delete;
  DevLp& operator=(const DevLp&) = delete;
};

struct Result {
  std::vector<float> x, st;
};
Result run_gpu(const Variant& v, DevLp& d, int max_iter, double tol) {
  CK(cudaMemset(d.x, 0xff, sizeof(float) * d.n));  // NaN: every element must be written
  CK(cudaMemset(d.st, 0xff, sizeof(float) * 8));
  v.launch(d.A, d.b, d.c, d.x, d.st, d.m, d.n, max_iter, tol, g_stream);
  CK(cudaStreamSynchronize(g_stream));
  Result r{std::vector<float>(d.n), std::vector<float>(8)};
  CK(cudaMemcpy(r.x.data(), d.x, sizeof(float) * d.n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.st.data(), d.st, sizeof(float) * 8, cudaMemcpyDeviceToHost));
  return r;
}
Result run_cpu(const HostLp& h, int max_iter, double tol) {
  Result r{std::vector<float>(h.n), std::vector<float>(8)};
  cpu::solve(h.A.data(), h.b.data(), h.c.data(), h.m, h.n, max_iter, tol, r.x.data(), r.st.data());
  return r;
}

// Agreement of a GPU result with the CPU's: same outcome (converged, reason, k, iterations
// within 1), and when converged the objective (relative) and x (relative to 1 + max |x|).
struct Agreement {
  double x_err = 0, obj_err = 0;
  int iters = 0;
  bool ok = true;
  std::string why;
};
// A refusal (reason 3, too large for one block) is right where V0 refuses too (`v0`), and
// then x must be all zeros.
Agreement compare(const Result& g, const Result& c, const Result* v0 = nullptr) {
  Agreement a;
  if (g.st[kStatusReason] == kReasonTooLarge) {
    a.why = "too large";
    a.ok = v0 != nullptr && v0->st[kStatusReason] == kReasonTooLarge && g.st[0] == 0.0f &&
           g.st[kStatusDiagRows] == c.st[kStatusDiagRows];
    for (float v : g.x) a.ok = a.ok && v == 0.0f;
    if (!a.ok) a.why = "refused (too large) where V0 is not";
    return a;
  }
  a.iters = static_cast<int>(g.st[kStatusIterations]);
  double xmax = 0;
  for (float v : c.x) xmax = std::max(xmax, std::fabs(static_cast<double>(v)));
  for (size_t j = 0; j < c.x.size(); ++j) {
    const double e = std::fabs(static_cast<double>(g.x[j]) - c.x[j]) / (1 + xmax);
    a.x_err = std::isnan(e) ? INFINITY : std::max(a.x_err, e);
  }
  const double oe =
      std::fabs(static_cast<double>(g.st[kStatusObjective]) - c.st[kStatusObjective]) /
      (1 + std::fabs(static_cast<double>(c.st[kStatusObjective])));
  a.obj_err = std::isnan(oe) ? INFINITY : oe;
  auto fail = [&](const char* w) {
    a.ok = false;
    if (a.why.empty()) a.why = w;
  };
  if (g.st[kStatusConverged] != c.st[kStatusConverged]) fail("converged differs");
  if (g.st[kStatusReason] != c.st[kStatusReason]) fail("reason differs");
  if (g.st[kStatusDiagRows] != c.st[kStatusDiagRows]) fail("k differs");
  if (std::fabs(g.st[kStatusIterations] - c.st[kStatusIterations]) > 1) fail("iterations differ");
  if (c.st[kStatusConverged] == 1.0f) {
    if (!(a.obj_err <= 1e-5)) fail("objective");
    if (!(a.x_err <= 1e-4)) fail("x");
  }
  return a;
}

// Median microseconds of one call. Events: each call between its own pair of events, back
// to back. Graph: kGraphCalls calls captured in one graph, per replay / kGraphCalls.
float time_us(const Variant& v, DevLp& d, int reps, bool graph) {
  auto call = [&] { v.launch(d.A, d.b, d.c, d.x, d.st, d.m, d.n, 30, 1e-6, g_stream); };
  std::vector<float> t(reps);
  for (int i = 0; i < 3; ++i) call();
  CK(cudaStreamSynchronize(g_stream));
  if (!graph) {
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventRecord(ev[2 * i], g_stream));
      call();
      CK(cudaEventRecord(ev[2 * i + 1], g_stream));
    }
    CK(cudaStreamSynchronize(g_stream));
    for (int i = 0; i < reps; ++i) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
      t[i] = ms * 1000.0f;
    }
    for (auto& e : ev) CK(cudaEventDestroy(e));
  } else {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < kGraphCalls; ++c) call();
    CK(cudaStreamEndCapture(g_stream, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventRecord(a, g_stream));
      CK(cudaGraphLaunch(ge, g_stream));
      CK(cudaEventRecord(b, g_stream));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      t[i] = ms * 1000.0f / kGraphCalls;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 200;
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  int dev = 0, clock_khz = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  std::printf("lplb_solve_bench on %s (%d SMs, %.2f GHz), %d reps\n", prop.name,
              prop.multiProcessorCount, clock_khz * 1e-6, reps);

  const std::vector<Variant> variants = VARIANTS;
  // V1 must take every LP V0 takes: its layout is no larger.
  for (int m : {1, 7, 264, 528, 1024}) {
    for (int n : {1, 9, 297, 1057, 2048}) {
      if (v1::make_layout(m, n).total > v0::make_layout(m, n).total) {
        std::printf("V1's layout for %dx%d is larger than V0's (%zu > %zu)\n", m, n,
                    v1::make_layout(m, n).total, v0::make_layout(m, n).total);
        return 1;
      }
      if (v2::make_layout(m, n).total > v0::make_layout(m, n).total) {
        std::printf("V2's layout for %dx%d is larger than V0's (%zu > %zu)\n", m, n,
                    v2::make_layout(m, n).total, v0::make_layout(m, n).total);
        return 1;
      }
    }
  }

  // ---- Correctness: every variant against the CPU solve, on many LPs ----
  struct Group {
    const char* name;
    std::vector<HostLp> lps;
  };
  std::vector<Group> groups;
  {
    Group g{"demo 256/288/8 Zipf (seeds 1-6)", {}};
    for (uint64_t s = 1; s <= 6; ++s) g.lps.push_back(demo_lp(s, 256, 8, 32, 4096, 8, 1.0));
    g.lps.push_back(demo_lp(7, 256, 8, 32, 4096, 8, 1.5));
    g.lps.push_back(demo_lp(8, 256, 8, 32, 512, 8, 0.0));
    groups.push_back(std::move(g));
  }
  {
    Group g{"random 256/+32/8 skewed (tests' large)", {}};
    for (uint64_t s = 1; s <= 6; ++s) {
      std::mt19937_64 rng(s);
      g.lps.push_back(random_lp(rng, 256, 8, 4, 32, 0, true, "large " + std::to_string(s)));
    }
    groups.push_back(std::move(g));
  }
  {
    Group g{"random small build_lp (L 1-16, G 1-6)", {}};
    std::mt19937_64 rng(17);
    for (int t = 0; t < 120; ++t) {
      std::uniform_int_distribution<int> L(1, 16), G(1, 6), C(1, 4), X(0, 12), O(0, 2);
      const int c = C(rng);
      const int l = L(rng), gg = G(rng), x = X(rng), o = O(rng);
      g.lps.push_back(random_lp(rng, l, gg, c, x, o, t % 4 == 0, "small " + std::to_string(t)));
    }
    groups.push_back(std::move(g));
  }
  {
    Group g{"dense LPs m 1-20 (k ~ 1, r ~ m - 1)", {}};
    std::mt19937_64 rng(31);
    for (int t = 0; t < 60; ++t) {
      const int m = 1 + t % 20, n = m + 1 + (t * 7) % (m + 5);
      g.lps.push_back(dense_lp(rng, m, n, "dense " + std::to_string(t)));
    }
    groups.push_back(std::move(g));
  }
  {
    Group g{"r = 33..48 (general path)", {}};
    std::mt19937_64 rng(5);
    g.lps.push_back(random_lp(rng, 96, 40, 4, 40, 0, true, "G=40"));
    g.lps.push_back(random_lp(rng, 64, 48, 3, 30, 1, false, "G=48"));
    g.lps.push_back(random_lp(rng, 200, 33, 4, 60, 0, true, "G=33"));
    g.lps.push_back(dense_lp(rng, 40, 70, "dense 40x70"));
    groups.push_back(std::move(g));
  }
  {
    Group g{"larger: 512/+64/16, 256/+32/16, 1000/+24/8", {}};
    g.lps.push_back(demo_lp(3, 512, 16, 64, 8192, 8, 1.0));
    g.lps.push_back(demo_lp(4, 256, 16, 32, 4096, 8, 1.0));
    std::mt19937_64 rng(9);
    g.lps.push_back(random_lp(rng, 1000, 8, 2, 24, 0, true, "1000/+24/8"));
    groups.push_back(std::move(g));
  }
  std::printf("\n== correctness vs the CPU solve (max_iter 30, tol 1e-6) ==\n");
  std::printf("%-10s %-42s %5s %9s %9s %6s %s\n", "variant", "group", "LPs", "max dx", "max dobj",
              "iters", "ok");
  bool all_ok = true;
  for (const Group& g : groups) {
    std::vector<Result> refs;
    for (const HostLp& h : g.lps) refs.push_back(run_cpu(h, 30, 1e-6));
    std::vector<Result> v0s;
    for (const HostLp& h : g.lps) {
      DevLp d(h);
      v0s.push_back(run_gpu(variants[0], d, 30, 1e-6));
    }
    for (const Variant& v : variants) {
      double xe = 0, oe = 0;
      int fails = 0, it_lo = 1 << 30, it_hi = 0, refused = 0;
      std::string first;
      for (size_t i = 0; i < g.lps.size(); ++i) {
        DevLp d(g.lps[i]);
        const Result r = run_gpu(v, d, 30, 1e-6);
        const Agreement a = compare(r, refs[i], &v0s[i]);
        if (a.ok && a.why == "too large") {
          ++refused;
          continue;
        }
        xe = std::max(xe, a.x_err);
        oe = std::max(oe, a.obj_err);
        it_lo = std::min(it_lo, a.iters);
        it_hi = std::max(it_hi, a.iters);
        if (!a.ok) {
          ++fails;
          if (first.empty()) {
            char buf[256];
            std::snprintf(buf, sizeof buf,
                          "%s: %s (gpu conv %g reason %g it %g k %g; cpu %g %g %g %g)",
                          g.lps[i].name.c_str(), a.why.c_str(), r.st[0], r.st[6], r.st[4], r.st[7],
                          refs[i].st[0], refs[i].st[6], refs[i].st[4], refs[i].st[7]);
            first = buf;
          }
        }
      }
      all_ok = all_ok && fails == 0;
      if (it_lo > it_hi) it_lo = it_hi = 0;
      std::printf("%-10s %-42s %5zu %9.2e %9.2e %2d-%-3d %s%s %s\n", v.name, g.name, g.lps.size(),
                  xe, oe, it_lo, it_hi, fails == 0 ? "ok" : "FAIL",
                  refused ? (" (" + std::to_string(refused) + " too large, as V0)").c_str() : "",
                  first.c_str());
    }
  }
  // A not 16-byte aligned (the scalar read path of every variant): same checks.
  {
    std::vector<HostLp> lps;
    lps.push_back(demo_lp(1, 256, 8, 32, 4096, 8, 1.0));
    lps.push_back(demo_lp(2, 256, 8, 32, 4096, 8, 1.0));
    std::mt19937_64 rng(77);
    for (int t = 0; t < 6; ++t) {
      lps.push_back(random_lp(rng, 3 + 2 * t, 1 + t, 3, 4, t % 2, t % 2 == 0, "unaligned small"));
    }
    lps.push_back(dense_lp(rng, 13, 29, "unaligned dense 13x29"));
    for (const Variant& v : variants) {
      int fails = 0;
      double xe = 0;
      std::string first;
      for (const HostLp& h : lps) {
        const Result c = run_cpu(h, 30, 1e-6);
        DevLp d0(h);
        const Result r0 = run_gpu(variants[0], d0, 30, 1e-6);
        DevLp d(h, 1);
        const Result r = run_gpu(v, d, 30, 1e-6);
        const Agreement a = compare(r, c, &r0);
        xe = std::max(xe, a.x_err);
        if (!a.ok) {
          ++fails;
          if (first.empty()) first = h.name + ": " + a.why;
        }
      }
      all_ok = all_ok && fails == 0;
      std::printf("%-10s %-42s %5zu %9.2e %9s %6s %s %s\n", v.name,
                  "A unaligned (scalar read path)", lps.size(), xe, "", "",
                  fails == 0 ? "ok" : "FAIL", first.c_str());
    }
  }
  // Iteration limit and max_iter = 0 on the target LP: same status as the CPU.
  {
    const HostLp h = demo_lp(1, 256, 8, 32, 4096, 8, 1.0);
    for (int mi : {0, 2}) {
      const Result c = run_cpu(h, mi, 1e-6);
      for (const Variant& v : variants) {
        DevLp d(h);
        const Result r = run_gpu(v, d, mi, 1e-6);
        bool same =
            r.st[0] == c.st[0] && r.st[4] == c.st[4] && r.st[6] == c.st[6] && r.st[7] == c.st[7];
        double xe = 0, xmax = 0;
        for (float q : c.x) xmax = std::max(xmax, std::fabs(static_cast<double>(q)));
        for (int j = 0; j < h.n; ++j)
          xe = std::max(xe, std::fabs(double(r.x[j]) - c.x[j]) / (1 + xmax));
        same = same && xe <= 1e-6;
        all_ok = all_ok && same;
        std::printf("%-10s max_iter=%d on demo seed 1: status %s, max dx %.2e\n", v.name, mi,
                    same ? "as the CPU's" : "DIFFERS", xe);
      }
    }
  }

  // ---- Where the time goes: clock64 per phase (thread 0, after each barrier) ----
  {
    const HostLp h = demo_lp(1, 256, 8, 32, 4096, 8, 1.0);
    DevLp d(h);
    unsigned long long* prof;
    constexpr int kMaxPh = 32, kProfCalls = 20;
    CK(cudaMalloc(&prof, sizeof(unsigned long long) * kMaxPh));
    auto show = [&](const char* name, int phases, const char* const* names,
                    const std::function<void()>& call) {
      CK(cudaMemset(prof, 0, sizeof(unsigned long long) * kMaxPh));
      for (int i = 0; i < kProfCalls; ++i) call();
      CK(cudaStreamSynchronize(g_stream));
      std::vector<unsigned long long> cyc(kMaxPh);
      CK(cudaMemcpy(cyc.data(), prof, sizeof(unsigned long long) * kMaxPh, cudaMemcpyDeviceToHost));
      double total = 0;
      for (int p = 0; p < phases; ++p) total += static_cast<double>(cyc[p]) / kProfCalls;
      std::printf(
          "\n== %s phases on demo seed 1 (thread 0's clock64, per call; %.0f cycles = %.1f us "
          "at %.2f GHz) ==\n",
          name, total, total / (clock_khz * 1e-3), clock_khz * 1e-6);
      for (int p = 0; p < phases; ++p) {
        const double c = static_cast<double>(cyc[p]) / kProfCalls;
        std::printf("  %-20s %8.0f cycles %7.2f us %5.1f%%\n", names[p], c, c / (clock_khz * 1e-3),
                    100.0 * c / total);
      }
    };
    show("V0", v0::kPhases, v0::kPhaseNames,
         [&] { v0::launch<true>(d.A, d.b, d.c, d.x, d.st, d.m, d.n, 30, 1e-6, g_stream, prof); });
    show("V1", v1::kPhases, v1::kPhaseNames,
         [&] { v1::launch<true>(d.A, d.b, d.c, d.x, d.st, d.m, d.n, 30, 1e-6, g_stream, prof); });
    show("V1/256", v1_256::kPhases, v1_256::kPhaseNames, [&] {
      v1_256::launch<true>(d.A, d.b, d.c, d.x, d.st, d.m, d.n, 30, 1e-6, g_stream, prof);
    });
    show("V2", v2::kPhases, v2::kPhaseNames,
         [&] { v2::launch<true>(d.A, d.b, d.c, d.x, d.st, d.m, d.n, 30, 1e-6, g_stream, prof); });
    show("V3", v3::kPhases, v3::kPhaseNames,
         [&] { v3::launch<true>(d.A, d.b, d.c, d.x, d.st, d.m, d.n, 30, 1e-6, g_stream, prof); });
    CK(cudaFree(prof));
  }

  // ---- Timing ----
  struct TimeCase {
    HostLp lp;
  };
  std::vector<HostLp> tcases;
  tcases.push_back(demo_lp(1, 256, 8, 32, 4096, 8, 1.0));
  {
    std::mt19937_64 rng(4);
    tcases.push_back(random_lp(rng, 256, 8, 4, 32, 0, true, "tests' large_instance(4)"));
  }
  tcases.push_back(demo_lp(3, 256, 16, 32, 4096, 8, 1.0));
  {
    std::mt19937_64 rng(9);
    tcases.push_back(random_lp(rng, 400, 8, 2, 24, 0, true, "400/+24/8 skewed"));
  }
  {
    std::mt19937_64 rng(5);
    tcases.push_back(random_lp(rng, 96, 40, 4, 40, 0, true, "G=40 (r=40: general path)"));
    std::mt19937_64 rng2(31);
    tcases.push_back(dense_lp(rng2, 20, 44, "dense 20x44"));
  }
  std::printf(
      "\n== time per call: median of %d (events around each call) and of %d replays of a "
      "%d-call CUDA graph ==\n",
      reps, reps, kGraphCalls);
  std::printf("%-10s %-34s %9s %9s %6s %10s %10s %s\n", "variant", "case", "us", "us graph",
              "iters", "max dx", "obj err", "check");
  for (const HostLp& h : tcases) {
    const Result c = run_cpu(h, 30, 1e-6);
    DevLp d(h);
    const Result r0 = run_gpu(variants[0], d, 30, 1e-6);
    for (const Variant& v : variants) {
      const Result r = run_gpu(v, d, 30, 1e-6);
      const Agreement a = compare(r, c, &r0);
      all_ok = all_ok && a.ok;
      const float te = time_us(v, d, reps, false);
      const float tg = time_us(v, d, std::max(5, reps / 4), true);
      std::printf("%-10s %-34s %9.1f %9.1f %6d %10.2e %10.2e %s\n", v.name, h.name.c_str(), te, tg,
                  a.iters, a.x_err, a.obj_err, a.ok ? "ok" : ("FAIL " + a.why).c_str());
    }
  }
  std::printf("\n%s\n", all_ok ? "ALL OK" : "SOME CHECKS FAILED");
  return all_ok ? 0 : 1;
}
