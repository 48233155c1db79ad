// CPU references of the lplb group. The interior-point method here is the algorithm the
// CUDA solver runs (same starting point, steps, pivot rules and stopping test, in double);
// only the order of some sums differs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "args.hpp"
#include "kreg/dtype.hpp"
#include "lplb.hpp"
#include "replica_math.hpp"

namespace kreg::lplb {
namespace {

// counts[l] as a double, from i32, i64 or f32.
double count_at(const DLTensor& counts, int64_t l) {
  switch (from_dl(counts.dtype).value_or(DType::kCount)) {
    case DType::kI32:
      return data_ptr<const int32_t>(counts)[l];
    case DType::kI64:
      return static_cast<double>(data_ptr<const int64_t>(counts)[l]);
    default:
      return data_ptr<const float>(counts)[l];
  }
}

// ---- The LP in sparse form, and the normal equations A D A' by block elimination ----

// A by columns and by rows. Rows 0..k-1 share no column (found from the pattern), so
// their block of A D A' is diagonal; the other r = m - k rows are dense.
struct SparseLp {
  int64_t m = 0, n = 0, k = 0, r = 0;
  std::vector<int64_t> col_ptr, row_ptr;
  std::vector<int64_t> col_rows, row_cols;
  std::vector<double> col_vals, row_vals;
};

SparseLp make_sparse(const float* a, int64_t m, int64_t n) {
  SparseLp s;
  s.m = m;
  s.n = n;
  s.col_ptr.assign(static_cast<size_t>(n + 1), 0);
  s.row_ptr.assign(static_cast<size_t>(m + 1), 0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      const float v = a[i * n + j];
      if (v != 0.0f) {
        s.col_rows.push_back(i);
        s.col_vals.push_back(v);
      }
    }
    s.col_ptr[static_cast<size_t>(j + 1)] = static_cast<int64_t>(s.col_rows.size());
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = a[i * n + j];
      if (v != 0.0f) {
        s.row_cols.push_back(j);
        s.row_vals.push_back(v);
      }
    }
    s.row_ptr[static_cast<size_t>(i + 1)] = static_cast<int64_t>(s.row_cols.size());
  }
  // k = the first row that meets an earlier row in some column: the smallest second
  // nonzero row over all columns (column rows are ascending).
  s.k = m;
  for (int64_t j = 0; j < n; ++j) {
    if (s.col_ptr[static_cast<size_t>(j + 1)] - s.col_ptr[static_cast<size_t>(j)] >= 2) {
      s.k = std::min(s.k, s.col_rows[static_cast<size_t>(s.col_ptr[static_cast<size_t>(j)] + 1)]);
    }
  }
  s.r = m - s.k;
  return s;
}

// A v (length m) and A' v (length n).
void mul_a(const SparseLp& s, const std::vector<double>& v, std::vector<double>& out) {
  for (int64_t i = 0; i < s.m; ++i) {
    double acc = 0;
    for (int64_t p = s.row_ptr[static_cast<size_t>(i)]; p < s.row_ptr[static_cast<size_t>(i + 1)];
         ++p) {
      acc += s.row_vals[static_cast<size_t>(p)] *
             v[static_cast<size_t>(s.row_cols[static_cast<size_t>(p)])];
    }
    out[static_cast<size_t>(i)] = acc;
  }
}

void mul_at(const SparseLp& s, const std::vector<double>& v, std::vector<double>& out) {
  for (int64_t j = 0; j < s.n; ++j) {
    double acc = 0;
    for (int64_t p = s.col_ptr[static_cast<size_t>(j)]; p < s.col_ptr[static_cast<size_t>(j + 1)];
         ++p) {
      acc += s.col_vals[static_cast<size_t>(p)] *
             v[static_cast<size_t>(s.col_rows[static_cast<size_t>(p)])];
    }
    out[static_cast<size_t>(j)] = acc;
  }
}

// Factorises M = A D A' as  [diag  W ; W'  S + W' diag^-1 W]:  diag (k), the coupling
// W (k x r) and the Cholesky factor of the Schur complement S (r x r).
class NormalEquations {
 public:
  explicit NormalEquations(const SparseLp& s)
      : s_(s),
        diag_(static_cast<size_t>(s.k)),
        w_(static_cast<size_t>(s.k * s.r)),
        chol_(static_cast<size_t>(s.r * s.r)) {}

  void factor(const std::vector<double>& d) {
    const int64_t k = s_.k, r = s_.r;
    for (int64_t i = 0; i < k; ++i) {
      double acc = 0;
      // data() + offset, not &w_[...]: with r == 0 the vector is empty.
      double* wi = w_.data() + static_cast<size_t>(i * r);
      std::fill(wi, wi + r, 0.0);
      for (int64_t p = s_.row_ptr[static_cast<size_t>(i)];
           p < s_.row_ptr[static_cast<size_t>(i + 1)]; ++p) {
        const int64_t j = s_.row_cols[static_cast<size_t>(p)];
        const double dav = d[static_cast<size_t>(j)] * s_.row_vals[static_cast<size_t>(p)];
        acc += dav * s_.row_vals[static_cast<size_t>(p)];
        // Column j's other nonzeros all lie in the dense rows (rows < k share no column).
        for (int64_t q = s_.col_ptr[static_cast<size_t>(j)];
             q < s_.col_ptr[static_cast<size_t>(j + 1)]; ++q) {
          const int64_t row = s_.col_rows[static_cast<size_t>(q)];
          if (row >= k) wi[row - k] += dav * s_.col_vals[static_cast<size_t>(q)];
        }
      }
      diag_[static_cast<size_t>(i)] = acc > kTinyDiag ? acc : kSkippedPivot;
    }
    // S = A_G D A_G' - W' diag^-1 W, lower triangle.
    for (int64_t g = 0; g < r; ++g) {
      for (int64_t h = 0; h <= g; ++h) {
        double acc = 0;
        for (int64_t p = s_.row_ptr[static_cast<size_t>(k + g)];
             p < s_.row_ptr[static_cast<size_t>(k + g + 1)]; ++p) {
          const int64_t j = s_.row_cols[static_cast<size_t>(p)];
          acc += d[static_cast<size_t>(j)] * s_.row_vals[static_cast<size_t>(p)] * entry(k + h, j);
        }
        double corr = 0;
        for (int64_t i = 0; i < k; ++i) {
          corr += w_[static_cast<size_t>(i * r + g)] * w_[static_cast<size_t>(i * r + h)] /
                  diag_[static_cast<size_t>(i)];
        }
        chol_[static_cast<size_t>(g * r + h)] = acc - corr;
      }
    }
    // Right-looking Cholesky; a pivot that is not clearly positive is skipped.
    double max_diag = 0;
    for (int64_t g = 0; g < r; ++g)
      max_diag = std::max(max_diag, chol_[static_cast<size_t>(g * r + g)]);
    for (int64_t p = 0; p < r; ++p) {
      const double piv = chol_[static_cast<size_t>(p * r + p)];
      const double lpp = piv > kRelPivotTol * max_diag && piv > 0 ? std::sqrt(piv) : kSkippedPivot;
      chol_[static_cast<size_t>(p * r + p)] = lpp;
      for (int64_t i = p + 1; i < r; ++i) chol_[static_cast<size_t>(i * r + p)] /= lpp;
      for (int64_t i = p + 1; i < r; ++i) {
        for (int64_t j = p + 1; j <= i; ++j) {
          chol_[static_cast<size_t>(i * r + j)] -=
              chol_[static_cast<size_t>(i * r + p)] * chol_[static_cast<size_t>(j * r + p)];
        }
      }
    }
  }

  // dy = M^-1 rhs.
  void solve(const std::vector<double>& rhs, std::vector<double>& dy) const {
    const int64_t k = s_.k, r = s_.r;
    std::vector<double> z(static_cast<size_t>(r));
    for (int64_t g = 0; g < r; ++g) {
      double acc = rhs[static_cast<size_t>(k + g)];
      for (int64_t i = 0; i < k; ++i) {
        acc -= w_[static_cast<size_t>(i * r + g)] * rhs[static_cast<size_t>(i)] /
               diag_[static_cast<size_t>(i)];
      }
      z[static_cast<size_t>(g)] = acc;
    }
    for (int64_t p = 0; p < r; ++p) {
      double acc = z[static_cast<size_t>(p)];
      for (int64_t q = 0; q < p; ++q)
        acc -= chol_[static_cast<size_t>(p * r + q)] * z[static_cast<size_t>(q)];
      z[static_cast<size_t>(p)] = acc / chol_[static_cast<size_t>(p * r + p)];
    }
    for (int64_t p = r - 1; p >= 0; --p) {
      double acc = z[static_cast<size_t>(p)];
      for (int64_t q = p + 1; q < r; ++q)
        acc -= chol_[static_cast<size_t>(q * r + p)] * z[static_cast<size_t>(q)];
      z[static_cast<size_t>(p)] = acc / chol_[static_cast<size_t>(p * r + p)];
    }
    for (int64_t g = 0; g < r; ++g) dy[static_cast<size_t>(k + g)] = z[static_cast<size_t>(g)];
    for (int64_t i = 0; i < k; ++i) {
      double acc = rhs[static_cast<size_t>(i)];
      for (int64_t g = 0; g < r; ++g)
        acc -= w_[static_cast<size_t>(i * r + g)] * z[static_cast<size_t>(g)];
      dy[static_cast<size_t>(i)] = acc / diag_[static_cast<size_t>(i)];
    }
  }

 private:
  double entry(int64_t row, int64_t j) const {
    for (int64_t q = s_.col_ptr[static_cast<size_t>(j)]; q < s_.col_ptr[static_cast<size_t>(j + 1)];
         ++q) {
      if (s_.col_rows[static_cast<size_t>(q)] == row) return s_.col_vals[static_cast<size_t>(q)];
    }
    return 0;
  }

  const SparseLp& s_;
  std::vector<double> diag_, w_, chol_;
};

// The step to the boundary: the largest alpha with v + alpha dv >= 0 (infinite if none).
double ratio_to_boundary(const std::vector<double>& v, const std::vector<double>& dv) {
  double alpha = std::numeric_limits<double>::infinity();
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

}  // namespace

// ---- build_lp ----

KernelStatus build_lp_cpu(Context& ctx, const DLTensor& counts, const DLTensor& log2phy,
                          const DLTensor& phy2gpu, DLTensor& out_a, DLTensor& out_b,
                          DLTensor& out_c, int64_t num_gpus) {
  if (KernelStatus st = check_build_lp(ctx, counts, phy2gpu, out_a, num_gpus); !st.ok()) return st;
  const int64_t L = counts.shape[0], C = log2phy.shape[1], R = phy2gpu.shape[0], G = num_gpus;
  const int64_t m = L + G, n = R + 1 + G;
  const int32_t* l2p = data_ptr<const int32_t>(log2phy);
  const int32_t* p2g = data_ptr<const int32_t>(phy2gpu);
  std::vector<int64_t> owner(static_cast<size_t>(R), -1);
  for (int64_t l = 0; l < L; ++l) {
    const double cnt = count_at(counts, l);
    if (!(cnt >= 0)) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: counts[%lld] = %g, expected >= 0", ctx.op(),
                      static_cast<long long>(l), cnt);
    }
    for (int64_t c = 0; c < C; ++c) {
      const int32_t id = l2p[l * C + c];
      if (id == -1) continue;
      if (id < 0 || id >= R) {
        return ctx.fail(KREG_INVALID_ARGUMENT,
                        "%s: log2phy[%lld,%lld] = %d, expected -1 or a replica id "
                        "in [0, R=%lld)",
                        ctx.op(), static_cast<long long>(l), static_cast<long long>(c), id,
                        static_cast<long long>(R));
      }
      if (owner[static_cast<size_t>(id)] >= 0) {
        return ctx.fail(KREG_INVALID_ARGUMENT,
                        "%s: log2phy lists replica %d twice (experts %lld and %lld)", ctx.op(), id,
                        static_cast<long long>(owner[static_cast<size_t>(id)]),
                        static_cast<long long>(l));
      }
      owner[static_cast<size_t>(id)] = l;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    if (p2g[r] < 0 || p2g[r] >= G) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: phy2gpu[%lld] = %d, expected a GPU in [0, num_gpus=%lld)", ctx.op(),
                      static_cast<long long>(r), p2g[r], static_cast<long long>(G));
    }
  }
  float* A = data_ptr<float>(out_a);
  float* b = data_ptr<float>(out_b);
  float* c = data_ptr<float>(out_c);
  std::fill(A, A + m * n, 0.0f);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t k = 0; k < C; ++k) {
      const int32_t id = l2p[l * C + k];
      if (id >= 0) A[l * n + id] = 1.0f;
    }
    b[l] = static_cast<float>(count_at(counts, l));
  }
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < R; ++r) {
      if (p2g[r] == g) A[(L + g) * n + r] = 1.0f;
    }
    A[(L + g) * n + R] = -1.0f;
    A[(L + g) * n + R + 1 + g] = 1.0f;
    b[L + g] = 0.0f;
  }
  std::fill(c, c + n, 0.0f);
  c[R] = 1.0f;
  return kOk;
}

// ---- solve: Mehrotra predictor-corrector ----

KernelStatus solve_cpu(Context& ctx, const DLTensor& a, const DLTensor& b, const DLTensor& c,
                       DLTensor& out_x, DLTensor& out_status, int64_t max_iter, double tol) {
  if (KernelStatus st = check_solve(ctx, max_iter, tol); !st.ok()) return st;
  const int64_t m = a.shape[0], n = a.shape[1];
  const float* bf = data_ptr<const float>(b);
  const float* cf = data_ptr<const float>(c);
  float* status = data_ptr<float>(out_status);
  float* xout = data_ptr<float>(out_x);

  // Scaled to ||b||inf = ||c||inf = 1 (a zero vector keeps scale 1).
  double beta = 0, gamma = 0;
  for (int64_t i = 0; i < m; ++i) beta = std::max(beta, std::fabs(static_cast<double>(bf[i])));
  for (int64_t j = 0; j < n; ++j) gamma = std::max(gamma, std::fabs(static_cast<double>(cf[j])));
  if (!(beta > 0) || !std::isfinite(beta)) beta = 1;
  if (!(gamma > 0) || !std::isfinite(gamma)) gamma = 1;
  std::vector<double> bs(static_cast<size_t>(m)), cs(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) bs[static_cast<size_t>(i)] = bf[i] / beta;
  for (int64_t j = 0; j < n; ++j) cs[static_cast<size_t>(j)] = cf[j] / gamma;

  const SparseLp s = make_sparse(data_ptr<const float>(a), m, n);
  NormalEquations ne(s);
  const size_t M = static_cast<size_t>(m), N = static_cast<size_t>(n);
  std::vector<double> x(N), sv(N), y(M), d(N, 1.0), t(N), rhs(M), dy(M), dx(N), ds(N), rp(M), rd(N),
      rc(N), tmp_m(M), tmp_n(N);

  // Mehrotra's starting point from the least-squares solutions of A x = b and A'y + s = c.
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
    // Predictor (affine scaling): rhs = rp + A (x + D rd).
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
    // Corrector: rc = sigma mu - x s - dx_aff ds_aff; rhs = rp + A (-rc / s + D rd).
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
    xout[j] = static_cast<float>(x[static_cast<size_t>(j)] * beta);
    objective += static_cast<double>(cf[j]) * x[static_cast<size_t>(j)] * beta;
  }
  status[kStatusConverged] = reason == kReasonConverged ? 1.0f : 0.0f;
  status[kStatusPrimalRes] = static_cast<float>(prel);
  status[kStatusDualRes] = static_cast<float>(drel);
  status[kStatusGap] = static_cast<float>(gap);
  status[kStatusIterations] = static_cast<float>(it);
  status[kStatusObjective] = static_cast<float>(objective);
  status[kStatusReason] = static_cast<float>(reason);
  status[kStatusDiagRows] = static_cast<float>(s.k);
  return kOk;
}

// ---- replica_probabilities ----

KernelStatus replica_probabilities_cpu(Context& ctx, const DLTensor& counts,
                                       const DLTensor& log2phy, const DLTensor& x,
                                       const DLTensor& status, DLTensor& out_probs) {
  (void)ctx;
  const int64_t L = log2phy.shape[0], C = log2phy.shape[1];
  const bool converged = data_ptr<const float>(status)[kStatusConverged] == 1.0f;
  for (int64_t l = 0; l < L; ++l) {
    expert_probabilities(data_ptr<const int32_t>(log2phy) + l * C, C, data_ptr<const float>(x),
                         x.shape[0], converged && count_at(counts, l) > 0,
                         data_ptr<float>(out_probs) + l * C);
  }
  return kOk;
}

// ---- dispatch ----

KernelStatus dispatch_cpu(Context& ctx, const DLTensor& topk_ids, const DLTensor& probs,
                          const DLTensor& log2phy, const DLTensor& u, DLTensor& out_phy_ids) {
  (void)ctx;
  const int64_t slots = numel(topk_ids), L = log2phy.shape[0], C = log2phy.shape[1];
  const int32_t* ids = data_ptr<const int32_t>(topk_ids);
  const float* uv = data_ptr<const float>(u);
  int32_t* out = data_ptr<int32_t>(out_phy_ids);
  for (int64_t i = 0; i < slots; ++i) {
    const int32_t e = ids[i];
    out[i] = e >= 0 && e < L ? pick_replica(data_ptr<const int32_t>(log2phy) + e * C,
                                            data_ptr<const float>(probs) + e * C, C, uv[i])
                             : -1;
  }
  return kOk;
}

}  // namespace kreg::lplb
