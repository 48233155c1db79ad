// The lplb group: build_lp against an LP written here; the interior-point solve (CPU
// reference and CUDA) against an exact combinatorial optimum on many random instances;
// replica_probabilities and dispatch against double-precision oracles; every CUDA
// implementation against its CPU reference (skipped without a GPU); bad arguments.
//
// The exact optimum: route counts[l] tokens of expert l to the GPUs holding its replicas,
// minimising the largest GPU load z. By max-flow/min-cut (Hall), z is feasible iff every
// set S of GPUs can absorb the experts whose replicas all lie in S:
//     z* = max over nonempty S of  sum{ counts[l] : gpus(l) subset of S } / |S|.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

Buffer make(DLDevice dev, DType dt, std::vector<int64_t> shape, const std::vector<double>& v) {
  auto b = Buffer::make(dev, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!v.empty())
    EXPECT_TRUE(b->from_doubles(v).ok());
  else
    EXPECT_TRUE(b->poison().ok());
  return std::move(b).value();
}

KernelHandle handle(const char* op, DLDevice dev, DType shared) {
  auto h = registry().resolve(op, Target{dev, shared},
                              {std::string(dev.device_type == kDLCPU ? "cpu" : "cuda")});
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : KernelHandle{};
}

AttrList attrs(const KernelHandle& h, const std::vector<NamedAttr>& named) {
  auto a = h.attrs(named);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return std::move(a).value();
}

// ---- Instances ----

struct Instance {
  int64_t L = 0, C = 0, R = 0, G = 0;
  std::vector<double> log2phy;  // [L, C], -1 padding
  std::vector<double> phy2gpu;  // [R]
  std::vector<double> counts;   // [L]
  int64_t M() const { return L + G; }
  int64_t N() const { return R + 1 + G; }
};

// Every expert gets one replica, `extra` more go to random experts (at most C each, the
// hot ones first when `skewed`); replica ids are shuffled; a replica goes to a random GPU.
// `orphans` replicas belong to no expert. Counts: random, some zero, or Zipf-like.
Instance random_instance(std::mt19937_64& rng, int64_t L, int64_t G, int64_t C, int64_t extra,
                         int64_t orphans, bool skewed) {
  Instance in;
  in.L = L;
  in.C = C;
  in.G = G;
  std::vector<int64_t> per(static_cast<size_t>(L), 1);
  std::uniform_int_distribution<int64_t> pick(0, L - 1);
  for (int64_t e = 0, tries = 0; e < extra && tries < 100 * (extra + 1); ++tries) {
    const int64_t l = skewed ? std::min<int64_t>(pick(rng), pick(rng)) : pick(rng);
    if (per[static_cast<size_t>(l)] < C) {
      ++per[static_cast<size_t>(l)];
      ++e;
    }
  }
  in.R = std::accumulate(per.begin(), per.end(), int64_t{0}) + orphans;
  std::vector<int64_t> ids(static_cast<size_t>(in.R));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  in.log2phy.assign(static_cast<size_t>(L * C), -1.0);
  size_t next = 0;
  for (int64_t l = 0; l < L; ++l) {
    // Padding may sit anywhere in the row.
    std::vector<int64_t> slots(static_cast<size_t>(C));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int64_t k = 0; k < per[static_cast<size_t>(l)]; ++k) {
      in.log2phy[static_cast<size_t>(l * C + slots[static_cast<size_t>(k)])] =
          static_cast<double>(ids[next++]);
    }
  }
  std::uniform_int_distribution<int64_t> gpu(0, G - 1);
  in.phy2gpu.resize(static_cast<size_t>(in.R));
  for (auto& g : in.phy2gpu) g = static_cast<double>(gpu(rng));
  std::uniform_int_distribution<int> cnt(0, 1000), zero(0, 5);
  in.counts.resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    double v = zero(rng) == 0 ? 0 : cnt(rng);
    if (skewed) v = std::floor(20000.0 / static_cast<double>(l + 1));
    in.counts[static_cast<size_t>(l)] = v;
  }
  if (skewed) std::shuffle(in.counts.begin(), in.counts.end(), rng);
  return in;
}

// The target size of the issue: 256 experts, 32 redundant replicas (288), 8 GPUs, Zipf.
Instance large_instance(uint64_t seed) {
  std::mt19937_64 rng(seed);
  return random_instance(rng, 256, 8, 4, 32, 0, true);
}

std::vector<int64_t> gpus_of(const Instance& in, int64_t l) {
  std::vector<int64_t> g;
  for (int64_t c = 0; c < in.C; ++c) {
    const double id = in.log2phy[static_cast<size_t>(l * in.C + c)];
    if (id >= 0) g.push_back(static_cast<int64_t>(in.phy2gpu[static_cast<size_t>(id)]));
  }
  return g;
}

// z* by the Hall / min-cut formula over all GPU subsets (G <= 16).
double exact_max_load(const Instance& in) {
  std::vector<uint32_t> mask(static_cast<size_t>(in.L), 0);
  for (int64_t l = 0; l < in.L; ++l) {
    for (int64_t g : gpus_of(in, l)) mask[static_cast<size_t>(l)] |= 1u << g;
  }
  double best = 0;
  for (uint32_t s = 1; s < (1u << in.G); ++s) {
    double sum = 0;
    for (int64_t l = 0; l < in.L; ++l) {
      const uint32_t ml = mask[static_cast<size_t>(l)];
      if (ml != 0 && (ml & ~s) == 0) sum += in.counts[static_cast<size_t>(l)];
    }
    best = std::max(best, sum / std::popcount(s));
  }
  return best;
}

// The LP as build_lp must write it, built here independently.
void oracle_lp(const Instance& in, std::vector<double>& A, std::vector<double>& b,
               std::vector<double>& c) {
  const int64_t m = in.M(), n = in.N();
  A.assign(static_cast<size_t>(m * n), 0.0);
  b.assign(static_cast<size_t>(m), 0.0);
  c.assign(static_cast<size_t>(n), 0.0);
  for (int64_t l = 0; l < in.L; ++l) {
    for (int64_t k = 0; k < in.C; ++k) {
      const double id = in.log2phy[static_cast<size_t>(l * in.C + k)];
      if (id >= 0) A[static_cast<size_t>(l * n + static_cast<int64_t>(id))] = 1;
    }
    b[static_cast<size_t>(l)] = in.counts[static_cast<size_t>(l)];
  }
  for (int64_t r = 0; r < in.R; ++r) {
    const int64_t g = static_cast<int64_t>(in.phy2gpu[static_cast<size_t>(r)]);
    A[static_cast<size_t>((in.L + g) * n + r)] = 1;
  }
  for (int64_t g = 0; g < in.G; ++g) {
    A[static_cast<size_t>((in.L + g) * n + in.R)] = -1;
    A[static_cast<size_t>((in.L + g) * n + in.R + 1 + g)] = 1;
  }
  c[static_cast<size_t>(in.R)] = 1;
}

// ---- Running the ops ----

struct LpBuffers {
  Buffer counts, log2phy, phy2gpu, A, b, c;
};

LpBuffers run_build_lp(const Instance& in, DLDevice dev, DType count_dtype) {
  LpBuffers lp{
      make(dev, count_dtype, {in.L}, in.counts),  make(dev, DType::kI32, {in.L, in.C}, in.log2phy),
      make(dev, DType::kI32, {in.R}, in.phy2gpu), make(dev, DType::kF32, {in.M(), in.N()}, {}),
      make(dev, DType::kF32, {in.M()}, {}),       make(dev, DType::kF32, {in.N()}, {})};
  KernelHandle h = handle("lplb.build_lp", dev, count_dtype);
  DLTensor* args[] = {lp.counts.tensor(), lp.log2phy.tensor(), lp.phy2gpu.tensor(),
                      lp.A.tensor(),      lp.b.tensor(),       lp.c.tensor()};
  AttrList a = attrs(h, {{"num_gpus", in.G}});
  Status st = h.call(args, a.view());
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(harness::device_synchronize().ok());
  return lp;
}

struct Solution {
  std::vector<double> x, status;
};

Solution run_solve(LpBuffers& lp, const Instance& in, DLDevice dev, int64_t max_iter = 30) {
  Buffer x = make(dev, DType::kF32, {in.N()}, {});
  Buffer status = make(dev, DType::kF32, {8}, {});
  KernelHandle h = handle("lplb.solve", dev, DType::kF32);
  DLTensor* args[] = {lp.A.tensor(), lp.b.tensor(), lp.c.tensor(), x.tensor(), status.tensor()};
  AttrList a = attrs(h, {{"max_iter", max_iter}});
  Status st = h.call(args, a.view());
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(harness::device_synchronize().ok());
  return {values(x), values(status)};
}

// The largest GPU load of a solution, and its worst violation of expert conservation
// (relative to the largest count: solve's residuals are relative to ||b||inf).
struct Loads {
  double max_load = 0, worst_conservation = 0;
};
Loads loads_of(const Instance& in, const std::vector<double>& x) {
  Loads r;
  std::vector<double> load(static_cast<size_t>(in.G), 0.0);
  for (int64_t rep = 0; rep < in.R; ++rep) {
    load[static_cast<size_t>(in.phy2gpu[static_cast<size_t>(rep)])] += x[static_cast<size_t>(rep)];
  }
  r.max_load = *std::max_element(load.begin(), load.end());
  const double max_count = *std::max_element(in.counts.begin(), in.counts.end());
  for (int64_t l = 0; l < in.L; ++l) {
    double sum = 0;
    for (int64_t k = 0; k < in.C; ++k) {
      const double id = in.log2phy[static_cast<size_t>(l * in.C + k)];
      if (id >= 0) sum += x[static_cast<size_t>(id)];
    }
    const double cnt = in.counts[static_cast<size_t>(l)];
    r.worst_conservation = std::max(r.worst_conservation, std::fabs(sum - cnt) / (1 + max_count));
  }
  return r;
}

// Checks a converged solution against the exact optimum.
void expect_optimal(const Instance& in, const Solution& s, const std::string& what) {
  const double exact = exact_max_load(in);
  ASSERT_EQ(s.status.size(), 8u);
  EXPECT_EQ(s.status[0], 1.0) << what << ": not converged, reason " << s.status[6] << " after "
                              << s.status[4] << " iterations, residuals " << s.status[1] << " "
                              << s.status[2] << " " << s.status[3];
  const double z = s.x[static_cast<size_t>(in.R)];
  EXPECT_LE(std::fabs(z - exact), 1e-3 * std::max(1.0, exact))
      << what << ": z " << z << " vs exact " << exact;
  EXPECT_LE(std::fabs(s.status[5] - exact), 1e-3 * std::max(1.0, exact)) << what;
  const Loads ld = loads_of(in, s.x);
  EXPECT_LE(ld.max_load, exact * (1 + 1e-3) + 1e-3) << what;
  EXPECT_LE(ld.worst_conservation, 1e-5) << what;
  for (int64_t j = 0; j < in.N(); ++j) EXPECT_GE(s.x[static_cast<size_t>(j)], 0.0) << what;
}

// A dense LP with a known optimum, built from KKT conditions: a basis of m columns with
// x* > 0 there, s* > 0 elsewhere, any y*; b = A x*, c = A'y* + s*. Exercises the dense
// Cholesky path (k = 1, r = m - 1).
struct DenseLp {
  int64_t m = 0, n = 0;
  std::vector<double> A, b, c;
  double objective = 0;
};

DenseLp dense_lp(std::mt19937_64& rng, int64_t m, int64_t n) {
  DenseLp lp;
  lp.m = m;
  lp.n = n;
  std::uniform_real_distribution<double> ua(-1.0, 1.0), pos(0.5, 2.0);
  lp.A.resize(static_cast<size_t>(m * n));
  for (auto& a : lp.A) a = static_cast<float>(ua(rng));
  std::vector<int64_t> cols(static_cast<size_t>(n));
  std::iota(cols.begin(), cols.end(), 0);
  std::shuffle(cols.begin(), cols.end(), rng);
  std::vector<double> x(static_cast<size_t>(n), 0.0), s(static_cast<size_t>(n), 0.0),
      y(static_cast<size_t>(m));
  for (int64_t j = 0; j < n; ++j) {
    (j < m ? x : s)[static_cast<size_t>(cols[static_cast<size_t>(j)])] = pos(rng);
  }
  for (auto& v : y) v = ua(rng);
  lp.b.assign(static_cast<size_t>(m), 0.0);
  lp.c = s;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double a = lp.A[static_cast<size_t>(i * n + j)];
      lp.b[static_cast<size_t>(i)] += a * x[static_cast<size_t>(j)];
      lp.c[static_cast<size_t>(j)] += a * y[static_cast<size_t>(i)];
    }
  }
  for (auto& v : lp.b) v = static_cast<float>(v);
  for (auto& v : lp.c) v = static_cast<float>(v);
  for (int64_t j = 0; j < n; ++j)
    lp.objective += lp.c[static_cast<size_t>(j)] * x[static_cast<size_t>(j)];
  return lp;
}

std::vector<double> solve_dense(const DenseLp& lp, DLDevice dev, std::vector<double>* x_out) {
  Buffer A = make(dev, DType::kF32, {lp.m, lp.n}, lp.A), b = make(dev, DType::kF32, {lp.m}, lp.b),
         c = make(dev, DType::kF32, {lp.n}, lp.c), x = make(dev, DType::kF32, {lp.n}, {}),
         st = make(dev, DType::kF32, {8}, {});
  KernelHandle h = handle("lplb.solve", dev, DType::kF32);
  DLTensor* args[] = {A.tensor(), b.tensor(), c.tensor(), x.tensor(), st.tensor()};
  AttrList a = attrs(h, {{"max_iter", int64_t{60}}});
  Status status = h.call(args, a.view());
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(harness::device_synchronize().ok());
  if (x_out != nullptr) *x_out = values(x);
  return values(st);
}

void check_dense_lps(DLDevice dev) {
  std::mt19937_64 rng(31);
  for (int t = 0; t < 60; ++t) {
    const int64_t m = 1 + t % 20, n = m + 1 + (t * 7) % (m + 5);
    const DenseLp lp = dense_lp(rng, m, n);
    std::vector<double> x;
    const std::vector<double> st = solve_dense(lp, dev, &x);
    const std::string what =
        "dense LP " + std::to_string(t) + " (" + std::to_string(m) + "x" + std::to_string(n) + ")";
    EXPECT_EQ(st[0], 1.0) << what << ": reason " << st[6] << ", " << st[4] << " iterations";
    EXPECT_NEAR(st[5], lp.objective, 1e-4 * (1 + std::fabs(lp.objective))) << what;
    for (int64_t i = 0; i < m; ++i) {
      double ax = 0;
      for (int64_t j = 0; j < n; ++j)
        ax += lp.A[static_cast<size_t>(i * n + j)] * x[static_cast<size_t>(j)];
      EXPECT_NEAR(ax, lp.b[static_cast<size_t>(i)],
                  1e-4 * (1 + std::fabs(lp.b[static_cast<size_t>(i)])))
          << what << " row " << i;
    }
  }
}

// An LP whose every column has one nonzero (k = m, no dense rows: r = 0): row i takes its
// b_i from the column of least c_j / a_ij, so the optimum is sum_i b_i min_j c_j / a_ij.
void check_diagonal_lps(DLDevice dev) {
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> pos(0.5, 2.0), rhs(1.0, 5.0);
  for (int t = 0; t < 10; ++t) {
    const int64_t m = 1 + t, n = m + 3 * t + 1;
    std::vector<double> A(static_cast<size_t>(m * n), 0.0), b(static_cast<size_t>(m)),
        c(static_cast<size_t>(n));
    std::vector<double> best(static_cast<size_t>(m), INFINITY);
    std::uniform_int_distribution<int64_t> row(0, m - 1);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = j < m ? j : row(rng);
      const double a = static_cast<float>(pos(rng));
      c[static_cast<size_t>(j)] = static_cast<float>(pos(rng));
      A[static_cast<size_t>(i * n + j)] = a;
      best[static_cast<size_t>(i)] =
          std::min(best[static_cast<size_t>(i)], c[static_cast<size_t>(j)] / a);
    }
    double objective = 0;
    for (int64_t i = 0; i < m; ++i) {
      b[static_cast<size_t>(i)] = static_cast<float>(rhs(rng));
      objective += b[static_cast<size_t>(i)] * best[static_cast<size_t>(i)];
    }
    DenseLp lp;
    lp.m = m, lp.n = n, lp.A = A, lp.b = b, lp.c = c, lp.objective = objective;
    std::vector<double> x;
    const std::vector<double> st = solve_dense(lp, dev, &x);
    const std::string what = "diagonal LP " + std::to_string(t);
    EXPECT_EQ(st[0], 1.0) << what << ": reason " << st[6] << ", " << st[4] << " iterations";
    EXPECT_EQ(st[7], static_cast<double>(m)) << what << ": k";
    EXPECT_NEAR(st[5], objective, 1e-4 * (1 + objective)) << what;
  }
}

// ---- Oracles for replica_probabilities and dispatch ----

std::vector<double> oracle_probs(const Instance& in, const std::vector<double>& x, bool converged) {
  std::vector<double> p(static_cast<size_t>(in.L * in.C), 0.0);
  for (int64_t l = 0; l < in.L; ++l) {
    double sum = 0;
    int valid = 0;
    for (int64_t k = 0; k < in.C; ++k) {
      const double id = in.log2phy[static_cast<size_t>(l * in.C + k)];
      if (id >= 0) {
        ++valid;
        sum += std::max(0.0, x[static_cast<size_t>(id)]);
      }
    }
    const bool use_x = converged && in.counts[static_cast<size_t>(l)] > 0 && sum > 0;
    for (int64_t k = 0; k < in.C; ++k) {
      const double id = in.log2phy[static_cast<size_t>(l * in.C + k)];
      if (id < 0) continue;
      p[static_cast<size_t>(l * in.C + k)] =
          use_x ? std::max(0.0, x[static_cast<size_t>(id)]) / sum : 1.0 / valid;
    }
  }
  return p;
}

const char* const kOps[] = {"lplb.build_lp", "lplb.dispatch", "lplb.replica_probabilities",
                            "lplb.solve"};

TEST(Lplb, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("lplb.")) shipped.push_back(id);
  }
  std::sort(shipped.begin(), shipped.end());
  EXPECT_EQ(shipped, std::vector<std::string>(std::begin(kOps), std::end(kOps)))
      << "a new op needs an oracle in this file";
}

TEST(Lplb, ExactSolverAgreesWithHandWorkedCases) {
  // Two GPUs, expert 0 (10 tokens) on both, expert 1 (4) on GPU 0 only: 7 each.
  Instance in;
  in.L = 2, in.C = 2, in.R = 3, in.G = 2;
  in.log2phy = {0, 1, 2, -1};
  in.phy2gpu = {0, 1, 0};
  in.counts = {10, 4};
  EXPECT_DOUBLE_EQ(exact_max_load(in), 7.0);
  // Expert 1 heavy: GPU 0 must carry all 20 of it.
  in.counts = {10, 20};
  EXPECT_DOUBLE_EQ(exact_max_load(in), 20.0);
}

TEST(Lplb, CpuBuildLpMatchesTheLpWrittenHere) {
  std::mt19937_64 rng(5);
  const DType dts[] = {DType::kI32, DType::kI64, DType::kF32};
  for (int t = 0; t < 30; ++t) {
    const Instance in = random_instance(rng, 1 + t % 9, 1 + t % 5, 1 + t % 4, t % 7, t % 3, false);
    LpBuffers lp = run_build_lp(in, kCpu, dts[t % 3]);
    std::vector<double> A, b, c;
    oracle_lp(in, A, b, c);
    EXPECT_EQ(values(lp.A), A) << "instance " << t;
    EXPECT_EQ(values(lp.b), b) << "instance " << t;
    EXPECT_EQ(values(lp.c), c) << "instance " << t;
  }
}

TEST(Lplb, CpuSolveReachesTheExactOptimumOnRandomInstances) {
  std::mt19937_64 rng(17);
  int iterations = 0, runs = 0;
  for (int t = 0; t < 200; ++t) {
    std::uniform_int_distribution<int64_t> L(1, 16), G(1, 6), C(1, 4), X(0, 12), O(0, 2);
    const int64_t c = C(rng);
    const Instance in = random_instance(rng, L(rng), G(rng), c, X(rng), O(rng), t % 4 == 0);
    LpBuffers lp = run_build_lp(in, kCpu, DType::kI32);
    const Solution s = run_solve(lp, in, kCpu);
    expect_optimal(in, s, "instance " + std::to_string(t));
    iterations += static_cast<int>(s.status[4]);
    ++runs;
  }
  std::printf("mean IPM iterations: %.1f\n", static_cast<double>(iterations) / runs);
}

TEST(Lplb, CpuSolveOfTheTargetSize) {
  for (uint64_t seed : {1, 2, 3}) {
    const Instance in = large_instance(seed);
    ASSERT_EQ(in.R, 288);
    LpBuffers lp = run_build_lp(in, kCpu, DType::kI32);
    const Solution s = run_solve(lp, in, kCpu);
    expect_optimal(in, s, "256/288/8 seed " + std::to_string(seed));
    EXPECT_EQ(s.status[7], 256.0) << "the expert rows are the diagonal block";
    std::printf("256/288/8 seed %llu: z %.2f, exact %.2f, %g iterations\n",
                static_cast<unsigned long long>(seed), s.x[288], exact_max_load(in), s.status[4]);
  }
}

TEST(Lplb, CpuSolveReachesTheKnownOptimumOfDenseLps) { check_dense_lps(kCpu); }

TEST(Lplb, CpuSolveOfLpsWithoutDenseRows) { check_diagonal_lps(kCpu); }

// Expert 1 has tokens and no replica: no feasible x, a solve must not claim success.
Instance infeasible_instance() {
  Instance in;
  in.L = 2, in.C = 2, in.R = 2, in.G = 2;
  in.log2phy = {0, 1, -1, -1};
  in.phy2gpu = {0, 1};
  in.counts = {10, 4};
  return in;
}

TEST(Lplb, CpuSolveReportsFailureWhenInfeasible) {
  const Instance in = infeasible_instance();
  LpBuffers lp = run_build_lp(in, kCpu, DType::kI32);
  const Solution s = run_solve(lp, in, kCpu);
  EXPECT_EQ(s.status[0], 0.0);
  EXPECT_NE(s.status[6], 0.0);
  // replica_probabilities falls back to uniform.
  Buffer probs = make(kCpu, DType::kF32, {2, 2}, {});
  Buffer x = make(kCpu, DType::kF32, {in.N()}, s.x);
  Buffer st = make(kCpu, DType::kF32, {8}, s.status);
  KernelHandle h = handle("lplb.replica_probabilities", kCpu, DType::kI32);
  DLTensor* args[] = {lp.counts.tensor(), lp.log2phy.tensor(), x.tensor(), st.tensor(),
                      probs.tensor()};
  ASSERT_TRUE(h.call(args).ok());
  EXPECT_EQ(values(probs), (std::vector<double>{0.5, 0.5, 0, 0}));
}

TEST(Lplb, CpuSolveStopsAtMaxIter) {
  const Instance in = large_instance(4);
  LpBuffers lp = run_build_lp(in, kCpu, DType::kI32);
  const Solution s = run_solve(lp, in, kCpu, 2);
  EXPECT_EQ(s.status[0], 0.0);
  EXPECT_EQ(s.status[4], 2.0);
  EXPECT_EQ(s.status[6], 1.0);
  const Solution none = run_solve(lp, in, kCpu, 0);
  EXPECT_EQ(none.status[4], 0.0);
  for (double v : none.x) EXPECT_TRUE(std::isfinite(v));
}

void check_probs_and_dispatch(DLDevice dev) {
  std::mt19937_64 rng(23);
  for (int t = 0; t < 40; ++t) {
    const Instance in = random_instance(rng, 1 + t % 13, 1 + t % 5, 1 + t % 4, t % 9, 0, t % 2);
    // A positive x with some zeros, and the converged flag on or off.
    std::vector<double> x(static_cast<size_t>(in.N()));
    std::uniform_real_distribution<double> xv(0.5, 100.0);
    for (size_t j = 0; j < x.size(); ++j) x[j] = (j % 5 == 3) ? 0.0 : std::round(xv(rng));
    const bool converged = t % 4 != 1;
    std::vector<double> status = {converged ? 1.0 : 0.0, 0, 0, 0, 10, 0, converged ? 0.0 : 1.0, 0};
    Buffer counts = make(dev, DType::kI32, {in.L}, in.counts);
    Buffer l2p = make(dev, DType::kI32, {in.L, in.C}, in.log2phy);
    Buffer xb = make(dev, DType::kF32, {in.N()}, x);
    Buffer sb = make(dev, DType::kF32, {8}, status);
    Buffer probs = make(dev, DType::kF32, {in.L, in.C}, {});
    KernelHandle hp = handle("lplb.replica_probabilities", dev, DType::kI32);
    DLTensor* pargs[] = {counts.tensor(), l2p.tensor(), xb.tensor(), sb.tensor(), probs.tensor()};
    ASSERT_TRUE(hp.call(pargs).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    const std::vector<double> want = oracle_probs(in, x, converged);
    const std::vector<double> got = values(probs);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6) << "instance " << t << " element " << i;
    }

    // dispatch: u chosen away from the CDF's steps so that fp32 rounding cannot move them.
    const int64_t T = 1 + t % 7, K = 1 + t % 3;
    std::vector<double> ids(static_cast<size_t>(T * K)), u(ids.size()), want_ids(ids.size());
    std::uniform_int_distribution<int64_t> e(-1, in.L);  // -1 and L are out of range
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<double>(e(rng));
      const int64_t l = static_cast<int64_t>(ids[i]);
      for (;;) {
        u[i] = static_cast<float>(ud(rng));
        want_ids[i] = -1;
        if (l < 0 || l >= in.L) break;
        double cdf = 0, margin = 1;
        for (int64_t k = 0; k < in.C; ++k) {
          const double id = in.log2phy[static_cast<size_t>(l * in.C + k)];
          const double p = got[static_cast<size_t>(l * in.C + k)];
          if (id < 0 || p <= 0) continue;
          cdf += p;
          margin = std::min(margin, std::fabs(u[i] - cdf));
          if (want_ids[i] < 0 && u[i] < cdf) want_ids[i] = id;
        }
        if (want_ids[i] < 0) {  // an expert whose probabilities are all 0 (padding only)
          break;
        }
        if (margin > 1e-4) break;
      }
    }
    Buffer idb = make(dev, DType::kI32, {T, K}, ids);
    Buffer ub = make(dev, DType::kF32, {T, K}, u);
    Buffer out = make(dev, DType::kI32, {T, K}, {});
    KernelHandle hd = handle("lplb.dispatch", dev, DType::kI32);
    DLTensor* dargs[] = {idb.tensor(), probs.tensor(), l2p.tensor(), ub.tensor(), out.tensor()};
    ASSERT_TRUE(hd.call(dargs).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    EXPECT_EQ(values(out), want_ids) << "instance " << t;
  }
}

TEST(Lplb, CpuProbabilitiesAndDispatchMatchTheOracle) { check_probs_and_dispatch(kCpu); }

TEST(Lplb, DispatchFollowsTheProbabilities) {
  // Over many uniform u, each replica is picked with its probability.
  const std::vector<double> l2p = {0, 1, 2, -1};
  const std::vector<double> probs = {0.2, 0.5, 0.3, 0.0};
  const int64_t T = 20000;
  std::vector<double> ids(T, 0.0), u(T);
  for (int64_t i = 0; i < T; ++i) u[static_cast<size_t>(i)] = (static_cast<double>(i) + 0.5) / T;
  Buffer idb = make(kCpu, DType::kI32, {T, 1}, ids);
  Buffer pb = make(kCpu, DType::kF32, {1, 4}, probs);
  Buffer lb = make(kCpu, DType::kI32, {1, 4}, l2p);
  Buffer ub = make(kCpu, DType::kF32, {T, 1}, u);
  Buffer out = make(kCpu, DType::kI32, {T, 1}, {});
  KernelHandle hd = handle("lplb.dispatch", kCpu, DType::kI32);
  DLTensor* args[] = {idb.tensor(), pb.tensor(), lb.tensor(), ub.tensor(), out.tensor()};
  ASSERT_TRUE(hd.call(args).ok());
  std::vector<int64_t> hist(3, 0);
  for (double v : values(out)) ++hist[static_cast<size_t>(v)];
  EXPECT_NEAR(hist[0] / double(T), 0.2, 1e-3);
  EXPECT_NEAR(hist[1] / double(T), 0.5, 1e-3);
  EXPECT_NEAR(hist[2] / double(T), 0.3, 1e-3);
}

TEST(Lplb, BadArgumentsAreRejected) {
  Instance in;
  in.L = 2, in.C = 2, in.R = 3, in.G = 2;
  in.log2phy = {0, 1, 2, -1};
  in.phy2gpu = {0, 1, 0};
  in.counts = {10, 4};
  auto call_build = [&](const Instance& i, int64_t num_gpus, int64_t m, int64_t n) {
    Buffer counts = make(kCpu, DType::kI32, {i.L}, i.counts);
    Buffer l2p = make(kCpu, DType::kI32, {i.L, i.C}, i.log2phy);
    Buffer p2g = make(kCpu, DType::kI32, {i.R}, i.phy2gpu);
    Buffer A = make(kCpu, DType::kF32, {m, n}, {});
    Buffer b = make(kCpu, DType::kF32, {m}, {});
    Buffer c = make(kCpu, DType::kF32, {n}, {});
    KernelHandle h = handle("lplb.build_lp", kCpu, DType::kI32);
    DLTensor* args[] = {counts.tensor(), l2p.tensor(), p2g.tensor(),
                        A.tensor(),      b.tensor(),   c.tensor()};
    AttrList a = attrs(h, {{"num_gpus", num_gpus}});
    return h.call(args, a.view());
  };
  EXPECT_TRUE(call_build(in, 2, 4, 6).ok());
  Status st = call_build(in, 3, 4, 6);
  EXPECT_NE(st.message().find("argument 'out_a' has shape [4,6], expected [L+num_gpus"),
            std::string::npos)
      << st.message();
  st = call_build(in, 0, 2, 4);
  EXPECT_NE(st.message().find("attribute 'num_gpus' = 0"), std::string::npos) << st.message();
  Instance bad = in;
  bad.log2phy = {0, 3, 2, -1};
  st = call_build(bad, 2, 4, 6);
  EXPECT_NE(st.message().find("log2phy[0,1] = 3"), std::string::npos) << st.message();
  bad.log2phy = {0, 1, 1, -1};
  st = call_build(bad, 2, 4, 6);
  EXPECT_NE(st.message().find("lists replica 1 twice"), std::string::npos) << st.message();
  bad = in;
  bad.phy2gpu = {0, 2, 0};
  st = call_build(bad, 2, 4, 6);
  EXPECT_NE(st.message().find("phy2gpu[1] = 2"), std::string::npos) << st.message();
  bad = in;
  bad.counts = {10, -1};
  st = call_build(bad, 2, 4, 6);
  EXPECT_NE(st.message().find("counts[1] = -1"), std::string::npos) << st.message();

  // solve: attributes out of range, wrong dtype.
  LpBuffers lp = run_build_lp(in, kCpu, DType::kI32);
  Buffer x = make(kCpu, DType::kF32, {in.N()}, {});
  Buffer status = make(kCpu, DType::kF32, {8}, {});
  KernelHandle h = handle("lplb.solve", kCpu, DType::kF32);
  DLTensor* args[] = {lp.A.tensor(), lp.b.tensor(), lp.c.tensor(), x.tensor(), status.tensor()};
  AttrList a = attrs(h, {{"max_iter", int64_t{-1}}});
  st = h.call(args, a.view());
  EXPECT_NE(st.message().find("attribute 'max_iter' = -1"), std::string::npos) << st.message();
  a = attrs(h, {{"tol", 0.0}});
  st = h.call(args, a.view());
  EXPECT_NE(st.message().find("attribute 'tol' = 0"), std::string::npos) << st.message();
  Buffer b64 = make(kCpu, DType::kF64, {in.M()}, std::vector<double>(in.M(), 1.0));
  DLTensor* wrong[] = {lp.A.tensor(), b64.tensor(), lp.c.tensor(), x.tensor(), status.tensor()};
  st = h.call(wrong);
  EXPECT_NE(st.message().find("argument 'b'"), std::string::npos) << st.message();
  Buffer short_status = make(kCpu, DType::kF32, {4}, {});
  DLTensor* wrong2[] = {lp.A.tensor(), lp.b.tensor(), lp.c.tensor(), x.tensor(),
                        short_status.tensor()};
  st = h.call(wrong2);
  EXPECT_NE(st.message().find("argument 'out_status'"), std::string::npos) << st.message();
}

// ---- GPU ----

class LplbGpu : public test::GpuTest {};

TEST_F(LplbGpu, BuildLpMatchesTheCpuReference) {
  std::mt19937_64 rng(7);
  const DType dts[] = {DType::kI32, DType::kI64, DType::kF32};
  for (int t = 0; t < 30; ++t) {
    const Instance in =
        t == 29 ? large_instance(1)
                : random_instance(rng, 1 + t % 9, 1 + t % 5, 1 + t % 4, t % 7, t % 3, false);
    LpBuffers gpu = run_build_lp(in, kGpu, dts[t % 3]);
    LpBuffers cpu = run_build_lp(in, kCpu, dts[t % 3]);
    EXPECT_EQ(values(gpu.A), values(cpu.A)) << "instance " << t;
    EXPECT_EQ(values(gpu.b), values(cpu.b)) << "instance " << t;
    EXPECT_EQ(values(gpu.c), values(cpu.c)) << "instance " << t;
  }
}

TEST_F(LplbGpu, SolveReachesTheExactOptimumLikeTheCpuReference) {
  std::mt19937_64 rng(17);
  for (int t = 0; t < 200; ++t) {
    std::uniform_int_distribution<int64_t> L(1, 16), G(1, 6), C(1, 4), X(0, 12), O(0, 2);
    const int64_t c = C(rng);
    const Instance in = t >= 197
                            ? large_instance(static_cast<uint64_t>(t))
                            : random_instance(rng, L(rng), G(rng), c, X(rng), O(rng), t % 4 == 0);
    LpBuffers lp = run_build_lp(in, kGpu, DType::kI32);
    const Solution gpu = run_solve(lp, in, kGpu);
    LpBuffers lpc = run_build_lp(in, kCpu, DType::kI32);
    const Solution cpu = run_solve(lpc, in, kCpu);
    const std::string what = "instance " + std::to_string(t);
    expect_optimal(in, gpu, what);
    // Same algorithm in double: same path up to the order of sums.
    EXPECT_EQ(gpu.status[7], cpu.status[7]) << what;
    EXPECT_NEAR(gpu.status[4], cpu.status[4], 1.0) << what << ": iterations";
    EXPECT_NEAR(gpu.status[5], cpu.status[5], 1e-4 * (1 + std::fabs(cpu.status[5]))) << what;
  }
}

TEST_F(LplbGpu, SolveReachesTheKnownOptimumOfDenseLps) { check_dense_lps(kGpu); }

TEST_F(LplbGpu, SolveOfLpsWithoutDenseRows) { check_diagonal_lps(kGpu); }

// r = 33..48 rows outside the diagonal block (the CUDA factor holds two rows a lane) and
// the largest dense LPs it takes: the same outcome as the CPU reference.
TEST_F(LplbGpu, SolveMatchesTheCpuReferenceWithManyDenseRows) {
  std::mt19937_64 rng(23);
  struct Shape {
    int64_t L, G, C, extra;
    bool skewed;
  };
  const Shape shapes[] = {
      {96, 33, 4, 40, true}, {64, 40, 3, 30, false}, {80, 48, 4, 20, true}, {40, 47, 2, 10, false}};
  for (const Shape& sh : shapes) {
    const Instance in = random_instance(rng, sh.L, sh.G, sh.C, sh.extra, 0, sh.skewed);
    LpBuffers lp = run_build_lp(in, kGpu, DType::kI32);
    const Solution gpu = run_solve(lp, in, kGpu);
    LpBuffers lpc = run_build_lp(in, kCpu, DType::kI32);
    const Solution cpu = run_solve(lpc, in, kCpu);
    const std::string what = "L=" + std::to_string(sh.L) + " G=" + std::to_string(sh.G);
    ASSERT_EQ(cpu.status[0], 1.0) << what;
    EXPECT_EQ(gpu.status[0], 1.0) << what << ": reason " << gpu.status[6];
    EXPECT_EQ(gpu.status[7], static_cast<double>(sh.L)) << what;
    EXPECT_NEAR(gpu.status[4], cpu.status[4], 1.0) << what << ": iterations";
    EXPECT_NEAR(gpu.status[5], cpu.status[5], 1e-4 * (1 + std::fabs(cpu.status[5]))) << what;
    const Loads ld = loads_of(in, gpu.x);
    EXPECT_LE(ld.max_load, cpu.status[5] * (1 + 1e-3) + 1e-3) << what;
    EXPECT_LE(ld.worst_conservation, 1e-5) << what;
  }
  for (const int64_t m : {34, 41, 49}) {  // k = 1: r = m - 1 = 33, 40, 48; nnz <= 3072
    const DenseLp lp = dense_lp(rng, m, m + 10);
    std::vector<double> x;
    const std::vector<double> st = solve_dense(lp, kGpu, &x);
    const std::string what = "dense LP " + std::to_string(m) + "x" + std::to_string(m + 10);
    EXPECT_EQ(st[0], 1.0) << what << ": reason " << st[6] << ", " << st[4] << " iterations";
    EXPECT_EQ(st[7], 1.0) << what;
    EXPECT_NEAR(st[5], lp.objective, 1e-4 * (1 + std::fabs(lp.objective))) << what;
  }
}

TEST_F(LplbGpu, SolveReportsInfeasibleAndIterationLimit) {
  const Instance in = infeasible_instance();
  LpBuffers lp = run_build_lp(in, kGpu, DType::kI32);
  Solution s = run_solve(lp, in, kGpu);
  EXPECT_EQ(s.status[0], 0.0);
  const Instance big = large_instance(4);
  LpBuffers lpb = run_build_lp(big, kGpu, DType::kI32);
  s = run_solve(lpb, big, kGpu, 2);
  EXPECT_EQ(s.status[0], 0.0);
  EXPECT_EQ(s.status[4], 2.0);
  EXPECT_EQ(s.status[6], 1.0);
  s = run_solve(lpb, big, kGpu, 0);
  for (double v : s.x) EXPECT_TRUE(std::isfinite(v));
  for (double v : s.status) EXPECT_TRUE(std::isfinite(v));
}

// A only 4-byte aligned (a view one float into its buffer) takes the kernel's two-pass
// scalar read instead of the one-pass float4 read: both give the same CSR, so the same bits.
TEST_F(LplbGpu, SolveOfAnUnalignedAMatchesTheAlignedOne) {
  std::mt19937_64 rng(29);
  for (int t = 0; t < 12; ++t) {
    const Instance in = t == 11 ? large_instance(3)
                                : random_instance(rng, 2 + t, 1 + t % 6, 3, t, t % 2, t % 3 == 0);
    const std::string what = "instance " + std::to_string(t);
    LpBuffers lp = run_build_lp(in, kGpu, DType::kI32);
    std::vector<double> shifted = values(lp.A);
    shifted.insert(shifted.begin(), 0.0);
    Buffer big = make(kGpu, DType::kF32, {static_cast<int64_t>(shifted.size())}, shifted);
    DLTensor view = *lp.A.tensor();
    view.data = big.tensor()->data;
    view.byte_offset = sizeof(float);
    Buffer x = make(kGpu, DType::kF32, {in.N()}, {});
    Buffer status = make(kGpu, DType::kF32, {8}, {});
    KernelHandle h = handle("lplb.solve", kGpu, DType::kF32);
    DLTensor* args[] = {&view, lp.b.tensor(), lp.c.tensor(), x.tensor(), status.tensor()};
    AttrList a = attrs(h, {{"max_iter", int64_t{30}}});
    const Status st = h.call(args, a.view());
    ASSERT_TRUE(st.ok()) << what << ": " << st.message();
    ASSERT_TRUE(harness::device_synchronize().ok());
    const Solution unaligned{values(x), values(status)};
    const Solution aligned = run_solve(lp, in, kGpu);
    expect_optimal(in, unaligned, what);
    EXPECT_EQ(unaligned.x, aligned.x) << what;
    EXPECT_EQ(unaligned.status, aligned.status) << what;
  }
}

TEST_F(LplbGpu, SolveRefusesWhatOneBlockCannotHold) {
  // A dense 60 x 100 LP: more than 48 rows outside the diagonal block -> reason 3.
  const int64_t m = 60, n = 100;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> v(0.1, 1.0);
  std::vector<double> A(static_cast<size_t>(m * n)), b(static_cast<size_t>(m), 1.0),
      c(static_cast<size_t>(n), 1.0);
  for (auto& a : A) a = v(rng);
  Buffer Ab = make(kGpu, DType::kF32, {m, n}, A), bb = make(kGpu, DType::kF32, {m}, b),
         cb = make(kGpu, DType::kF32, {n}, c), x = make(kGpu, DType::kF32, {n}, {}),
         st = make(kGpu, DType::kF32, {8}, {});
  KernelHandle h = handle("lplb.solve", kGpu, DType::kF32);
  DLTensor* args[] = {Ab.tensor(), bb.tensor(), cb.tensor(), x.tensor(), st.tensor()};
  ASSERT_TRUE(h.call(args).ok());
  ASSERT_TRUE(harness::device_synchronize().ok());
  const auto s = values(st);
  EXPECT_EQ(s[0], 0.0);
  EXPECT_EQ(s[6], 3.0);
  for (double xv : values(x)) EXPECT_EQ(xv, 0.0);
  // Too many rows for the shared-memory layout: refused on the host.
  Buffer big_a = make(kGpu, DType::kF32, {2000, 3}, std::vector<double>(6000, 1.0));
  Buffer big_b = make(kGpu, DType::kF32, {2000}, std::vector<double>(2000, 1.0));
  Buffer c3 = make(kGpu, DType::kF32, {3}, {1, 1, 1});
  Buffer x3 = make(kGpu, DType::kF32, {3}, {});
  DLTensor* big[] = {big_a.tensor(), big_b.tensor(), c3.tensor(), x3.tensor(), st.tensor()};
  Status r = h.call(big);
  EXPECT_EQ(r.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(r.message().find("argument 'a'"), std::string::npos) << r.message();
}

TEST_F(LplbGpu, ProbabilitiesAndDispatchMatchTheOracle) { check_probs_and_dispatch(kGpu); }

// `slots` routing choices: expert ids uniform in [0, L) and dispatch's u uniform in [0, 1).
std::pair<std::vector<double>, std::vector<double>> random_routing(std::mt19937_64& rng,
                                                                   int64_t slots, int64_t L) {
  std::vector<double> ids(static_cast<size_t>(slots)), u(ids.size());
  std::uniform_int_distribution<int64_t> e(0, L - 1);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<double>(e(rng));
    u[i] = ud(rng);
  }
  return {std::move(ids), std::move(u)};
}

TEST_F(LplbGpu, DispatchMatchesTheCpuReferenceAtScale) {
  // 32768 tokens x top-8 over the target topology, random u: exact equality with the CPU.
  const Instance in = large_instance(9);
  std::mt19937_64 rng(1);
  std::vector<double> x(static_cast<size_t>(in.N()));
  std::uniform_real_distribution<double> xv(0.0, 50.0);
  for (auto& v : x) v = xv(rng);
  const std::vector<double> status = {1, 0, 0, 0, 10, 0, 0, 256};
  const int64_t T = 32768, K = 8;
  const auto [ids, u] = random_routing(rng, T * K, in.L);
  std::vector<std::vector<double>> outs;
  for (DLDevice dev : {kCpu, kGpu}) {
    Buffer counts = make(dev, DType::kI32, {in.L}, in.counts);
    Buffer l2p = make(dev, DType::kI32, {in.L, in.C}, in.log2phy);
    Buffer xb = make(dev, DType::kF32, {in.N()}, x);
    Buffer sb = make(dev, DType::kF32, {8}, status);
    Buffer probs = make(dev, DType::kF32, {in.L, in.C}, {});
    KernelHandle hp = handle("lplb.replica_probabilities", dev, DType::kI32);
    DLTensor* pargs[] = {counts.tensor(), l2p.tensor(), xb.tensor(), sb.tensor(), probs.tensor()};
    ASSERT_TRUE(hp.call(pargs).ok());
    Buffer idb = make(dev, DType::kI32, {T, K}, ids);
    Buffer ub = make(dev, DType::kF32, {T, K}, u);
    Buffer out = make(dev, DType::kI32, {T, K}, {});
    KernelHandle hd = handle("lplb.dispatch", dev, DType::kI32);
    DLTensor* dargs[] = {idb.tensor(), probs.tensor(), l2p.tensor(), ub.tensor(), out.tensor()};
    ASSERT_TRUE(hd.call(dargs).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    outs.push_back(values(probs));
    outs.push_back(values(out));
  }
  EXPECT_EQ(outs[0], outs[2]) << "probabilities differ";
  EXPECT_EQ(outs[1], outs[3]) << "dispatch differs";
  // Zero tokens: nothing to do, no error.
  Buffer l2p = make(kGpu, DType::kI32, {in.L, in.C}, in.log2phy);
  Buffer probs = make(kGpu, DType::kF32, {in.L, in.C}, std::vector<double>(in.L * in.C, 0.5));
  Buffer idb = make(kGpu, DType::kI32, {0, K}, {});
  Buffer ub = make(kGpu, DType::kF32, {0, K}, {});
  Buffer out = make(kGpu, DType::kI32, {0, K}, {});
  KernelHandle hd = handle("lplb.dispatch", kGpu, DType::kI32);
  DLTensor* dargs[] = {idb.tensor(), probs.tensor(), l2p.tensor(), ub.tensor(), out.tensor()};
  EXPECT_TRUE(hd.call(dargs).ok());
  EXPECT_TRUE(harness::device_synchronize().ok());
}

// Programmatic dependent launch (KREG_LAUNCH_PDL) through the group's four kernels, as a
// model step chains them: build_lp -> solve -> (the next batch's build_lp, rewriting the A,
// b and c that solve reads) -> replica_probabilities (reading solve's x and status, two
// kernels back) -> dispatch, then the second batch's solve, probabilities and dispatch.
// Bit for bit what the same chain gives without PDL, repeated so that a race has chances
// to show.
TEST_F(LplbGpu, PdlChainsReadWhatTheKernelBeforeWrote) {
  const Instance in = large_instance(5);
  Instance in2 = in;
  std::mt19937_64 rng(3);
  std::shuffle(in2.counts.begin(), in2.counts.end(), rng);
  const int64_t T = 4096, K = 8;
  const auto [ids, u] = random_routing(rng, T * K, in.L);
  KernelHandle build = handle("lplb.build_lp", kGpu, DType::kI32);
  KernelHandle solve = handle("lplb.solve", kGpu, DType::kF32);
  KernelHandle prob = handle("lplb.replica_probabilities", kGpu, DType::kI32);
  KernelHandle disp = handle("lplb.dispatch", kGpu, DType::kI32);
  const AttrList build_attrs = attrs(build, {{"num_gpus", in.G}});
  const AttrList solve_attrs = attrs(solve, {{"max_iter", int64_t{30}}});
  Buffer counts1 = make(kGpu, DType::kI32, {in.L}, in.counts);
  Buffer counts2 = make(kGpu, DType::kI32, {in.L}, in2.counts);
  Buffer l2p = make(kGpu, DType::kI32, {in.L, in.C}, in.log2phy);
  Buffer p2g = make(kGpu, DType::kI32, {in.R}, in.phy2gpu);
  Buffer idb = make(kGpu, DType::kI32, {T, K}, ids);
  Buffer ub = make(kGpu, DType::kF32, {T, K}, u);
  auto run_chain = [&](uint64_t flags) {
    // A, b, c; then x, status, probs, phy_ids per batch; poisoned (make without values).
    std::vector<Buffer> out;
    out.push_back(make(kGpu, DType::kF32, {in.M(), in.N()}, {}));
    out.push_back(make(kGpu, DType::kF32, {in.M()}, {}));
    out.push_back(make(kGpu, DType::kF32, {in.N()}, {}));
    for (int batch = 0; batch < 2; ++batch) {
      out.push_back(make(kGpu, DType::kF32, {in.N()}, {}));
      out.push_back(make(kGpu, DType::kF32, {8}, {}));
      out.push_back(make(kGpu, DType::kF32, {in.L, in.C}, {}));
      out.push_back(make(kGpu, DType::kI32, {T, K}, {}));
    }
    const CallOptions first{nullptr, nullptr, 0};
    const CallOptions next{nullptr, nullptr, flags};
    auto run_build = [&](Buffer& counts, const CallOptions& o) {
      DLTensor* a[] = {counts.tensor(), l2p.tensor(),    p2g.tensor(),
                       out[0].tensor(), out[1].tensor(), out[2].tensor()};
      EXPECT_TRUE(build.call(a, build_attrs.view(), o).ok());
    };
    auto run_solve = [&](size_t at) {
      DLTensor* a[] = {out[0].tensor(), out[1].tensor(), out[2].tensor(), out[at].tensor(),
                       out[at + 1].tensor()};
      EXPECT_TRUE(solve.call(a, solve_attrs.view(), next).ok());
    };
    auto run_rest = [&](Buffer& counts, size_t at) {
      DLTensor* p[] = {counts.tensor(), l2p.tensor(), out[at].tensor(), out[at + 1].tensor(),
                       out[at + 2].tensor()};
      EXPECT_TRUE(prob.call(p, {}, next).ok());
      DLTensor* d[] = {idb.tensor(), out[at + 2].tensor(), l2p.tensor(), ub.tensor(),
                       out[at + 3].tensor()};
      EXPECT_TRUE(disp.call(d, {}, next).ok());
    };
    run_build(counts1, first);
    run_solve(3);
    run_build(counts2, next);  // rewrites A, b while the solve before it may read them
    run_rest(counts1, 3);
    run_solve(7);
    run_rest(counts2, 7);
    EXPECT_TRUE(harness::device_synchronize().ok());
    std::vector<std::vector<uint8_t>> bytes;
    for (const Buffer& b : out) bytes.push_back(test::bytes_of(b));
    return bytes;
  };
  // The two batches must differ, or a solve reading the wrong b would go unseen.
  const std::vector<std::vector<uint8_t>> plain = run_chain(0);
  ASSERT_NE(plain[3], plain[7]) << "the two batches' solutions are equal";
  test::expect_pdl_chain_matches_plain(run_chain, 5);
}

TEST_F(LplbGpu, CpuTensorsToTheCudaPathAreRefused) {
  Instance in;
  in.L = 2, in.C = 2, in.R = 3, in.G = 2;
  in.log2phy = {0, 1, 2, -1};
  in.phy2gpu = {0, 1, 0};
  in.counts = {10, 4};
  LpBuffers lp = run_build_lp(in, kCpu, DType::kI32);
  Buffer x = make(kCpu, DType::kF32, {in.N()}, {});
  Buffer status = make(kCpu, DType::kF32, {8}, {});
  KernelHandle h = handle("lplb.solve", kGpu, DType::kF32);
  DLTensor* args[] = {lp.A.tensor(), lp.b.tensor(), lp.c.tensor(), x.tensor(), status.tensor()};
  Status st = h.call(args);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("but backend cuda runs on cuda tensors"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace kreg
