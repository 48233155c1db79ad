// The sampling group: Philox4x32-10 against Random123's known answers; the CPU references
// against sort-based oracles written here (the kept set exactly, values within a few ulps
// of p / sum) and, for the sampling ops, chi-square tests of 10^6 draws against the
// filtered distribution; edge cases (ties, top_k = 1, top_p = 1, one non-zero entry, NaN
// rows); the rng offset; bad arguments; and every CUDA op against the CPU reference
// (identical kept sets and ids; skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../../plugins/sampling/philox.hpp"
#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;
using namespace test;  // kernel_test.hpp

constexpr const char* kTopK = "sampling.top_k_renorm_probs";
constexpr const char* kTopP = "sampling.top_p_renorm_probs";
constexpr const char* kTopKTopP = "sampling.top_k_top_p_sampling_from_probs";
constexpr const char* kMinP = "sampling.min_p_sampling_from_probs";

// ---- Philox ----

TEST(Sampling, PhiloxMatchesRandom123KnownAnswers) {
  using sampling::Philox4x32;
  struct Kat {
    Philox4x32 ctr;
    uint32_t k0, k1;
    Philox4x32 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 got = sampling::philox4x32_10(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], k.want.v[i]) << "word " << i;
  }
}

// ---- Running the ops ----

struct Arg {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;  // empty: an output, poisoned
};

using Values = std::vector<std::vector<double>>;

// Buffers of one call, kept so that a test can call the op many times.
struct Call {
  KernelHandle h;
  std::vector<Buffer> bufs;
  std::vector<DLTensor*> ptrs;
};

Result<Call> prepare(const std::string& op, const std::string& backend,
                     const std::vector<Arg>& args) {
  const DLDevice dev = backend == "cuda" ? kGpu : kCpu;
  auto h = registry().resolve(op, Target{dev, args[0].dtype}, {backend});
  if (!h) return h.status();
  Call c{*h, {}, {}};
  for (const Arg& a : args) {
    auto b = Buffer::make(dev, a.dtype, a.shape);
    if (!b) return b.status();
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    std::vector<double> v = a.values;
    if (v.empty() && n > 0) v.assign(static_cast<size_t>(n), a.dtype == DType::kF32 ? NAN : -77.0);
    if (Status st = b->from_doubles(v); !st.ok()) return st;
    c.bufs.push_back(std::move(b).value());
  }
  for (Buffer& b : c.bufs) c.ptrs.push_back(b.tensor());
  return c;
}

Result<Values> results(const Call& c) {
  if (Status st = harness::device_synchronize(); !st.ok()) return st;
  Values out;
  for (const Buffer& b : c.bufs) {
    auto v = b.to_doubles();
    if (!v) return v.status();
    out.push_back(std::move(v).value());
  }
  return out;
}

Result<Values> run_op(const std::string& op, const std::string& backend,
                      const std::vector<Arg>& args) {
  auto c = prepare(op, backend, args);
  if (!c) return c.status();
  if (Status st = c->h.call(c->ptrs); !st.ok()) return st;
  return results(*c);
}

// ---- Inputs ----

// A random row of V probabilities summing to ~1 (f32-rounded), with some exact ties, a
// few zeros and a wide spread of magnitudes (softmax of scaled normals).
std::vector<double> random_probs(int64_t B, int64_t V, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 3.0);
  std::vector<double> p(static_cast<size_t>(B * V));
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> l(static_cast<size_t>(V));
    for (double& x : l) x = nd(rng);
    for (int64_t i = 0; i + 1 < V; i += 7)
      l[static_cast<size_t>(i + 1)] = l[static_cast<size_t>(i)];
    const double m = *std::max_element(l.begin(), l.end());
    double s = 0;
    for (double& x : l) s += (x = std::exp(x - m));
    for (int64_t i = 0; i < V; ++i) {
      double v = static_cast<float>(l[static_cast<size_t>(i)] / s);
      if (V > 20 && i % 13 == 5) v = 0;
      p[static_cast<size_t>(b * V + i)] = v;
    }
  }
  return p;
}

// ---- The oracles: stable sort by descending value ----

std::vector<int64_t> sorted_desc(const std::vector<double>& p, int64_t b, int64_t V) {
  std::vector<int64_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) {
    return p[static_cast<size_t>(b * V + x)] > p[static_cast<size_t>(b * V + y)];
  });
  return idx;
}

std::vector<bool> top_k_set(const std::vector<double>& p, int64_t b, int64_t V, int64_t k) {
  const std::vector<int64_t> idx = sorted_desc(p, b, V);
  const int64_t n = k <= 0 || k >= V ? V : k;
  std::vector<bool> kept(static_cast<size_t>(V), false);
  for (int64_t j = 0; j < n; ++j) kept[static_cast<size_t>(idx[static_cast<size_t>(j)])] = true;
  return kept;
}

// Top-p over the first `limit` of the order (the top-k set): the smallest prefix, at
// least one, whose sum reaches top_p times theirs, in long double.
std::vector<bool> top_p_set(const std::vector<double>& p, int64_t b, int64_t V, double top_p,
                            int64_t limit) {
  const std::vector<int64_t> idx = sorted_desc(p, b, V);
  long double total = 0;
  for (int64_t j = 0; j < limit; ++j)
    total += p[static_cast<size_t>(b * V + idx[static_cast<size_t>(j)])];
  int64_t n = limit;
  if (top_p < 1) {
    long double acc = 0;
    for (int64_t j = 0; j < limit; ++j) {
      acc += p[static_cast<size_t>(b * V + idx[static_cast<size_t>(j)])];
      if (acc >= top_p * total) {
        n = j + 1;
        break;
      }
    }
  }
  std::vector<bool> kept(static_cast<size_t>(V), false);
  for (int64_t j = 0; j < n; ++j) kept[static_cast<size_t>(idx[static_cast<size_t>(j)])] = true;
  return kept;
}

// out must be p / (sum of kept p) on the kept set and exactly 0 elsewhere.
void expect_renorm(const std::vector<double>& p, const std::vector<double>& out, int64_t b,
                   int64_t V, const std::vector<bool>& kept) {
  long double s = 0;
  for (int64_t i = 0; i < V; ++i)
    if (kept[static_cast<size_t>(i)]) s += p[static_cast<size_t>(b * V + i)];
  int bad = 0;
  for (int64_t i = 0; i < V && bad < 5; ++i) {
    const double got = out[static_cast<size_t>(b * V + i)];
    const double want = kept[static_cast<size_t>(i)]
                            ? static_cast<double>(p[static_cast<size_t>(b * V + i)] / s)
                            : 0.0;
    const bool ok = kept[static_cast<size_t>(i)] ? std::abs(got - want) <= 4e-7 * want : got == 0.0;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << "row " << b << " col " << i << ": got " << got << ", want " << want
                    << (kept[static_cast<size_t>(i)] ? " (kept)" : " (dropped)");
    }
  }
}

struct Shape {
  int64_t B, V;
};
const Shape kCpuShapes[] = {{1, 1}, {3, 7}, {2, 50}, {4, 1000}, {1, 4097}};

int32_t pick_k(int64_t b, int64_t V, std::mt19937_64& rng) {
  switch (b % 4) {
    case 0:
      return static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(V));
    case 1:
      return 1;
    case 2:
      return b % 8 == 2 ? 0 : static_cast<int32_t>(V);
    default:
      return static_cast<int32_t>(std::max<int64_t>(1, V / 3));
  }
}

float pick_p(int64_t b, std::mt19937_64& rng) {
  switch (b % 4) {
    case 0:
      return std::uniform_real_distribution<float>(0.05f, 0.99f)(rng);
    case 1:
      return 1.0f;
    case 2:
      return b % 8 == 2 ? 0.0f : 0.5f;  // top_p = 0: the first max only (GPU: the flat row)
    default:
      return std::uniform_real_distribution<float>(0.5f, 0.95f)(rng);
  }
}

TEST(Sampling, EveryShippedOpIsTestedHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids())
    if (id.starts_with("sampling.")) shipped.push_back(id);
  std::vector<std::string> covered = {kMinP, kTopKTopP, kTopK, kTopP};
  std::sort(covered.begin(), covered.end());
  EXPECT_EQ(shipped, covered) << "a new sampling op needs its tests here";
}

TEST(Sampling, CpuRenormMatchesTheSortOracle) {
  std::mt19937_64 rng(5);
  for (Shape s : kCpuShapes) {
    for (int64_t rep = 0; rep < 3; ++rep) {
      const int64_t B = s.B * 4;  // every kind of k / p per shape
      SCOPED_TRACE("B=" + std::to_string(B) + " V=" + std::to_string(s.V));
      const std::vector<double> p = random_probs(B, s.V, rng);
      std::vector<double> ks, ps;
      for (int64_t b = 0; b < B; ++b) {
        ks.push_back(pick_k(b + rep, s.V, rng));
        ps.push_back(pick_p(b + rep, rng));
      }
      auto k_out =
          run_op(kTopK, "cpu",
                 {{DType::kF32, {B, s.V}, p}, {DType::kI32, {B}, ks}, {DType::kF32, {B, s.V}, {}}});
      ASSERT_TRUE(k_out.ok()) << k_out.status().message();
      auto p_out =
          run_op(kTopP, "cpu",
                 {{DType::kF32, {B, s.V}, p}, {DType::kF32, {B}, ps}, {DType::kF32, {B, s.V}, {}}});
      ASSERT_TRUE(p_out.ok()) << p_out.status().message();
      for (int64_t b = 0; b < B; ++b) {
        expect_renorm(p, (*k_out)[2], b, s.V,
                      top_k_set(p, b, s.V, static_cast<int64_t>(ks[static_cast<size_t>(b)])));
        expect_renorm(p, (*p_out)[2], b, s.V,
                      top_p_set(p, b, s.V, ps[static_cast<size_t>(b)], s.V));
      }
    }
  }
}

TEST(Sampling, CpuRenormTiesAreKeptInIndexOrder) {
  // Eight equal values: top_k = 4 keeps the 0.15 and the first three 0.1s; top_p = 0.25 of a flat
  // row of 10 keeps the first three too (0.25 reached at the third).
  std::vector<double> p = {0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.15};
  auto k = run_op(kTopK, "cpu",
                  {{DType::kF32, {1, 10}, p}, {DType::kI32, {1}, {4}}, {DType::kF32, {1, 10}, {}}});
  ASSERT_TRUE(k.ok()) << k.status().message();
  const std::vector<double> want_k = {0, 0.1 / 0.45, 0.1 / 0.45, 0.1 / 0.45, 0,
                                      0, 0,          0,          0,          0.15 / 0.45};
  for (int i = 0; i < 10; ++i)
    EXPECT_NEAR((*k)[2][static_cast<size_t>(i)], want_k[static_cast<size_t>(i)], 1e-6) << i;
  std::vector<double> flat(10, 0.1);
  auto t = run_op(
      kTopP, "cpu",
      {{DType::kF32, {1, 10}, flat}, {DType::kF32, {1}, {0.25}}, {DType::kF32, {1, 10}, {}}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int i = 0; i < 10; ++i)
    EXPECT_NEAR((*t)[2][static_cast<size_t>(i)], i < 3 ? 1.0 / 3 : 0.0, 1e-6) << i;
  auto z =
      run_op(kTopP, "cpu",
             {{DType::kF32, {1, 10}, flat}, {DType::kF32, {1}, {0.0}}, {DType::kF32, {1, 10}, {}}});
  ASSERT_TRUE(z.ok()) << z.status().message();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ((*z)[2][static_cast<size_t>(i)], i == 0 ? 1.0 : 0.0)
        << "top_p = 0 keeps the first max";
}

// ---- Sampling ----

// The Wilson-Hilferty upper quantile of chi-square with df degrees at z standard
// deviations (z = 5: p ~ 3e-7, so the test fails by chance essentially never).
double chi2_critical(double df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Counts against the expected probabilities: chi-square over the kept tokens, and no
// draw at all outside them.
void expect_frequencies(const std::vector<int64_t>& counts, const std::vector<double>& want,
                        int64_t draws) {
  double chi2 = 0;
  int df = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is filtered out but was drawn";
      continue;
    }
    const double e = want[i] * static_cast<double>(draws);
    chi2 += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++df;
  }
  ASSERT_GT(df, 0);
  EXPECT_LT(chi2, chi2_critical(df, 5.0)) << "df " << df;
}

std::vector<double> filtered(const std::vector<double>& p, const std::vector<bool>& kept) {
  std::vector<double> w(p.size(), 0.0);
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (kept[i]) s += p[i];
  for (size_t i = 0; i < p.size(); ++i)
    if (kept[i]) w[i] = p[i] / s;
  return w;
}

// 10^6 draws of one V = 50 row, each a call advancing rng.
TEST(Sampling, CpuDrawsFollowTheFilteredDistribution) {
  std::mt19937_64 rng(9);
  const int64_t V = 50, kDraws = 1000000;
  const std::vector<double> p = random_probs(1, V, rng);
  struct Case {
    const char* op;
    std::vector<bool> kept;
    std::vector<Arg> args;
  };
  std::vector<bool> kp = top_p_set(p, 0, V, 0.9, 30);
  std::vector<bool> mp(static_cast<size_t>(V));
  const double mx = *std::max_element(p.begin(), p.end());
  for (int64_t i = 0; i < V; ++i)
    mp[static_cast<size_t>(i)] =
        p[static_cast<size_t>(i)] >= static_cast<float>(0.02f * static_cast<float>(mx));
  std::vector<Case> cases = {
      {kTopKTopP,
       kp,
       {{DType::kF32, {1, V}, p},
        {DType::kI32, {1}, {30}},
        {DType::kF32, {1}, {0.9}},
        {DType::kI32, {1}, {}},
        {DType::kI64, {2}, {1234, 0}}}},
      {kMinP,
       mp,
       {{DType::kF32, {1, V}, p},
        {DType::kF32, {1}, {0.02}},
        {DType::kI32, {1}, {}},
        {DType::kI64, {2}, {99, 7}}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    auto call = prepare(c.op, "cpu", c.args);
    ASSERT_TRUE(call.ok()) << call.status().message();
    const int32_t* id = static_cast<const int32_t*>(call->bufs[c.args.size() - 2].tensor()->data);
    const int64_t* state = static_cast<const int64_t*>(call->bufs.back().tensor()->data);
    const int64_t offset0 = state[1];
    std::vector<int64_t> counts(static_cast<size_t>(V), 0);
    for (int64_t d = 0; d < kDraws; ++d) {
      ASSERT_TRUE(call->h.call(call->ptrs).ok());
      ASSERT_GE(*id, 0);
      ASSERT_LT(*id, V);
      ++counts[static_cast<size_t>(*id)];
    }
    EXPECT_EQ(state[1], offset0 + kDraws) << "rng offset advances by 1 per call";
    expect_frequencies(counts, filtered(p, c.kept), kDraws);
  }
}

TEST(Sampling, CpuEdgeCases) {
  const int64_t V = 9;
  // Row 0: ties at the max (top_k = 1 picks the first); row 1: one non-zero entry;
  // row 2: top_p = 1 and top_k = 0 keep everything (every draw valid).
  std::vector<double> p = {0.1, 0.3, 0.0, 0.3, 0.1, 0.1, 0.05, 0.05, 0.0,  //
                           0,   0,   0,   0,   0,   0.7, 0,    0,    0,    //
                           0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1,  0.2,  0.1};
  for (int64_t seed = 0; seed < 50; ++seed) {
    auto r = run_op(kTopKTopP, "cpu",
                    {{DType::kF32, {3, V}, p},
                     {DType::kI32, {3}, {1, 5, 0}},
                     {DType::kF32, {3}, {0.5, 0.1, 1.0}},
                     {DType::kI32, {3}, {}},
                     {DType::kI64, {2}, {static_cast<double>(seed), 3}}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)[3][0], 1) << "top_k = 1 keeps the first of the tied maxima";
    EXPECT_EQ((*r)[3][1], 5) << "the only non-zero entry";
    EXPECT_GE((*r)[3][2], 0);
    EXPECT_EQ((*r)[4][1], 4) << "offset 3 + 1";
    auto m = run_op(kMinP, "cpu",
                    {{DType::kF32, {3, V}, p},
                     {DType::kF32, {3}, {1.0, 0.5, 0.0}},
                     {DType::kI32, {3}, {}},
                     {DType::kI64, {2}, {static_cast<double>(seed), 0}}});
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_TRUE((*m)[2][0] == 1 || (*m)[2][0] == 3) << "min_p = 1 keeps the maxima";
    EXPECT_EQ((*m)[2][1], 5);
  }
  // The same rng state draws the same ids; another offset draws others somewhere.
  std::mt19937_64 g(3);
  const std::vector<double> q = random_probs(64, 100, g);
  auto draw = [&](double offset) {
    auto r = run_op(kMinP, "cpu",
                    {{DType::kF32, {64, 100}, q},
                     {DType::kF32, {64}, std::vector<double>(64, 0.0)},
                     {DType::kI32, {64}, {}},
                     {DType::kI64, {2}, {5, offset}}});
    EXPECT_TRUE(r.ok());
    return r.ok() ? (*r)[2] : std::vector<double>{};
  };
  EXPECT_EQ(draw(10), draw(10));
  EXPECT_NE(draw(10), draw(11));
}

TEST(Sampling, CpuNanRowIsAnErrorNamingTheRow) {
  std::vector<double> p(2 * 8, 0.125);
  p[8 + 3] = NAN;
  auto r = run_op(kTopKTopP, "cpu",
                  {{DType::kF32, {2, 8}, p},
                   {DType::kI32, {2}, {0, 0}},
                   {DType::kF32, {2}, {1, 1}},
                   {DType::kI32, {2}, {}},
                   {DType::kI64, {2}, {1, 0}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("row 1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("NaN"), std::string::npos) << r.status().message();
  auto k =
      run_op(kTopK, "cpu",
             {{DType::kF32, {2, 8}, p}, {DType::kI32, {2}, {3, 3}}, {DType::kF32, {2, 8}, {}}});
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("sampling.top_k_renorm_probs: row 1"), std::string::npos)
      << k.status().message();
  std::vector<double> z(8, 0.0);
  auto m = run_op(kMinP, "cpu",
                  {{DType::kF32, {1, 8}, z},
                   {DType::kF32, {1}, {0.1}},
                   {DType::kI32, {1}, {}},
                   {DType::kI64, {2}, {1, 0}}});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("row 0 of probs has no positive"), std::string::npos)
      << m.status().message();
}

TEST(Sampling, EmptyBatchIsANoOp) {
  for (const char* backend : {"cpu"}) {
    auto r = run_op(kMinP, backend,
                    {{DType::kF32, {0, 16}, {}},
                     {DType::kF32, {0}, {}},
                     {DType::kI32, {0}, {}},
                     {DType::kI64, {2}, {1, 5}}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)[3][1], 5) << "an empty batch leaves rng alone";
  }
}

TEST(Sampling, BadArgumentsAreRefused) {
  const std::vector<double> p(2 * 8, 0.125);
  struct Bad {
    const char* op;
    std::vector<Arg> args;
    const char* what;
  };
  const std::vector<Bad> bad = {
      {kTopK,
       {{DType::kF32, {2, 8}, p}, {DType::kI32, {3}, {1, 1, 1}}, {DType::kF32, {2, 8}, {}}},
       "top_k"},
      {kTopK,
       {{DType::kF32, {2, 8}, p}, {DType::kF32, {2}, {1, 1}}, {DType::kF32, {2, 8}, {}}},
       "top_k"},
      {kTopP,
       {{DType::kF32, {2, 8}, p}, {DType::kF32, {2}, {1, 1}}, {DType::kF32, {2, 7}, {}}},
       "out"},
      {kTopKTopP,
       {{DType::kF32, {2, 8}, p},
        {DType::kI32, {2}, {1, 1}},
        {DType::kF32, {2}, {1, 1}},
        {DType::kI32, {2}, {}},
        {DType::kI64, {3}, {1, 2, 3}}},
       "rng"},
      {kMinP,
       {{DType::kF32, {2, 8}, p},
        {DType::kF32, {2}, {1, 1}},
        {DType::kI32, {2}, {}},
        {DType::kI32, {2}, {1, 2}}},
       "rng"},
      {kMinP,
       {{DType::kF32, {2, 8}, p},
        {DType::kF32, {2}, {1, 1}},
        {DType::kI64, {2}, {}},
        {DType::kI64, {2}, {1, 2}}},
       "out_ids"},
  };
  for (const Bad& b : bad) {
    auto r = run_op(b.op, "cpu", b.args);
    ASSERT_FALSE(r.ok()) << b.op << " " << b.what;
    EXPECT_NE(r.status().message().find(b.what), std::string::npos) << r.status().message();
  }
  // A dtype the group does not serve: no implementation for bf16 probs.
  auto h = registry().resolve(kTopK, Target{kCpu, DType::kBF16}, {std::string("cpu")});
  EXPECT_FALSE(h.ok());
}

// ---- GPU against the CPU reference ----

class GpuSampling : public test::GpuTest {};

// Renorm: identical kept sets, values within 2 ulps; sampling: identical ids; for rows
// of awkward widths up to the Llama-3 vocabulary and past the shared-memory limit.
TEST_F(GpuSampling, MatchTheCpuReference) {
  const Shape shapes[] = {{1, 1},      {3, 7},      {5, 50},      {8, 1000},  {4, 4097},
                          {64, 32000}, {1, 128256}, {16, 128256}, {2, 600000}};
  std::mt19937_64 rng(17);
  for (Shape s : shapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " V=" + std::to_string(s.V));
    const int64_t B = s.B;
    std::vector<double> p = random_probs(B, s.V, rng);
    if (B >= 4) {  // a flat row: every entry tied
      for (int64_t i = 0; i < s.V; ++i) p[static_cast<size_t>(2 * s.V + i)] = 1.0 / 64;
    }
    std::vector<double> ks, ps, ms;
    for (int64_t b = 0; b < B; ++b) {
      ks.push_back(pick_k(b, s.V, rng));
      ps.push_back(pick_p(b, rng));
      ms.push_back(b % 3 == 0 ? 0.0 : std::uniform_real_distribution<double>(0.001, 0.5)(rng));
    }
    const std::vector<std::pair<const char*, std::vector<Arg>>> cases = {
        {kTopK, {{DType::kF32, {B, s.V}, p}, {DType::kI32, {B}, ks}, {DType::kF32, {B, s.V}, {}}}},
        {kTopP, {{DType::kF32, {B, s.V}, p}, {DType::kF32, {B}, ps}, {DType::kF32, {B, s.V}, {}}}},
        {kTopKTopP,
         {{DType::kF32, {B, s.V}, p},
          {DType::kI32, {B}, ks},
          {DType::kF32, {B}, ps},
          {DType::kI32, {B}, {}},
          {DType::kI64, {2}, {77, 1000}}}},
        {kMinP,
         {{DType::kF32, {B, s.V}, p},
          {DType::kF32, {B}, ms},
          {DType::kI32, {B}, {}},
          {DType::kI64, {2}, {78, 5}}}},
    };
    for (const auto& [op, args] : cases) {
      SCOPED_TRACE(op);
      auto cpu = run_op(op, "cpu", args);
      ASSERT_TRUE(cpu.ok()) << cpu.status().message();
      auto gpu = run_op(op, "cuda", args);
      ASSERT_TRUE(gpu.ok()) << gpu.status().message();
      const size_t out = std::string(op).find("renorm") != std::string::npos ? 2 : args.size() - 2;
      const std::vector<double>& c = (*cpu)[out];
      const std::vector<double>& g = (*gpu)[out];
      ASSERT_EQ(c.size(), g.size());
      size_t bad = 0;
      for (size_t i = 0; i < c.size(); ++i) {
        const bool same =
            (c[i] == 0) == (g[i] == 0) && std::abs(c[i] - g[i]) <= 2.5e-7 * std::abs(c[i]);
        if (!same && bad++ < 5)
          ADD_FAILURE() << "element " << i << ": cpu " << c[i] << ", gpu " << g[i];
      }
      EXPECT_EQ(bad, 0u);
      if (out != 2) {
        EXPECT_EQ((*gpu).back(), (*cpu).back()) << "rng advanced alike (offset + 1)";
      }
    }
  }
}

// The GPU result of one call equals the CPU reference's: the same kept set and values
// within 2.5e-7 relative (renorm), the same ids and rng (sampling).
void expect_gpu_matches_cpu(const char* op, const std::vector<Arg>& args) {
  SCOPED_TRACE(op);
  auto cpu = run_op(op, "cpu", args);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  auto gpu = run_op(op, "cuda", args);
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  const bool renorm = std::string(op).find("renorm") != std::string::npos;
  const size_t out = renorm ? 2 : args.size() - 2;
  const std::vector<double>& c = (*cpu)[out];
  const std::vector<double>& g = (*gpu)[out];
  ASSERT_EQ(c.size(), g.size());
  size_t bad = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const bool same =
        (c[i] == 0) == (g[i] == 0) && std::abs(c[i] - g[i]) <= 2.5e-7 * std::abs(c[i]);
    if (!same && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": cpu " << c[i] << ", gpu " << g[i];
  }
  EXPECT_EQ(bad, 0u);
  if (!renorm) {
    EXPECT_EQ((*gpu).back(), (*cpu).back()) << "rng advanced alike (offset + 1)";
  }
}

// Rows whose cuts fall inside runs of tied values, at B = 1 .. 4 (long rows of few
// clusters: 16 blocks a row where the device runs them) and B = 16 (8 blocks a row): the
// top-p descent after a top-k cut counts only the keys at or above that cut, so the cases
// put the top-p cut at the top-k cut's key (part of its ties, or all), above it, in the
// ties of the max, and top-k cuts splitting a tie run; many draws each.
TEST_F(GpuSampling, TopKTopPWithTiesAtTheCuts) {
  std::mt19937_64 rng(31);
  for (int64_t B : {1, 3, 16}) {
    for (int64_t V : {int64_t{128256}, int64_t{40000}, int64_t{600000}}) {
      if (B == 16 && V == 600000) continue;  // ~10^7 entries: slow on the CPU side
      SCOPED_TRACE("B=" + std::to_string(B) + " V=" + std::to_string(V));
      // Values on a few levels: level j (j = 0..7) holds 2^j entries of weight 2^-j times
      // a base, the rest a small tail; positions shuffled, so every cut below the first
      // levels lands in a run of ties, spread over the blocks.
      std::vector<double> p(static_cast<size_t>(B * V));
      for (int64_t b = 0; b < B; ++b) {
        std::vector<double> row(static_cast<size_t>(V), 1e-7);
        int64_t at = 0;
        for (int j = 0; j < 8; ++j) {
          for (int64_t n = 0; n < (int64_t{1} << j) * (1 + b % 3); ++n) {
            row[static_cast<size_t>(at++)] = 0.01 / static_cast<double>(1 << j);
          }
        }
        std::shuffle(row.begin(), row.end(), rng);
        std::copy(row.begin(), row.end(), p.begin() + b * V);
      }
      const std::vector<std::pair<int, float>> kp = {
          {1, 0.5f},  {3, 0.9f},    {7, 0.3f},  {50, 0.9f},     {100, 0.99f},
          {5, 0.05f}, {200, 0.75f}, {20, 0.0f}, {1000, 0.999f}, {0, 0.9f}};
      for (const auto& [k, tp] : kp) {
        SCOPED_TRACE("top_k=" + std::to_string(k) + " top_p=" + std::to_string(tp));
        std::vector<double> ks, ps;
        for (int64_t b = 0; b < B; ++b) {
          ks.push_back(k + static_cast<int>(b % 2));
          ps.push_back(tp);
        }
        for (int64_t offset : {0, 12345}) {
          expect_gpu_matches_cpu(kTopKTopP,
                                 {{DType::kF32, {B, V}, p},
                                  {DType::kI32, {B}, ks},
                                  {DType::kF32, {B}, ps},
                                  {DType::kI32, {B}, {}},
                                  {DType::kI64, {2}, {99, static_cast<double>(offset)}}});
        }
        expect_gpu_matches_cpu(
            kTopK, {{DType::kF32, {B, V}, p}, {DType::kI32, {B}, ks}, {DType::kF32, {B, V}, {}}});
        expect_gpu_matches_cpu(
            kTopP, {{DType::kF32, {B, V}, p}, {DType::kF32, {B}, ps}, {DType::kF32, {B, V}, {}}});
      }
    }
  }
}

// A top-k cut inside a crowded binade: 1200 entries in [1/64, 1/32) (pairs of ties),
// the rest tiny. The keys of the cut's top digit are too many for the candidate list
// gathered after level 0, the keys >= the cut few enough for the one gathered after the
// whole descent (k up to 301), or not (k = 700: the radix top-p descent over the keys >=
// the cut).
TEST_F(GpuSampling, TopKTopPCutInACrowdedBinade) {
  std::mt19937_64 rng(41);
  for (int64_t B : {1, 5}) {
    for (int64_t V : {int64_t{5000}, int64_t{128256}}) {
      SCOPED_TRACE("B=" + std::to_string(B) + " V=" + std::to_string(V));
      std::vector<double> p(static_cast<size_t>(B * V));
      for (int64_t b = 0; b < B; ++b) {
        std::vector<double> row(static_cast<size_t>(V), 1e-9);
        for (int64_t i = 0; i < 1200; ++i) {
          row[static_cast<size_t>(i)] = (1.0 + static_cast<double>(i / 2) / 1200.0) / 64.0;
        }
        std::shuffle(row.begin(), row.end(), rng);
        std::copy(row.begin(), row.end(), p.begin() + b * V);
      }
      for (const auto& [k, tp] : std::vector<std::pair<int, float>>{
               {1, 0.9f}, {51, 0.9f}, {100, 0.3f}, {301, 0.999f}, {200, 0.0f}, {700, 0.8f}}) {
        SCOPED_TRACE("top_k=" + std::to_string(k) + " top_p=" + std::to_string(tp));
        for (int64_t offset : {3, 4}) {
          expect_gpu_matches_cpu(kTopKTopP, {{DType::kF32, {B, V}, p},
                                             {DType::kI32, {B}, std::vector<double>(B, k)},
                                             {DType::kF32, {B}, std::vector<double>(B, tp)},
                                             {DType::kI32, {B}, {}},
                                             {DType::kI64, {2}, {5, static_cast<double>(offset)}}});
        }
      }
    }
  }
}

// The benchmark's case: softmax rows of V = 128256, top_k = 50, top_p = 0.9, at B = 1 and
// 4 (16 blocks a row where the device runs them) and 64 (8), ids equal over many draws.
TEST_F(GpuSampling, DecodeCaseMatchesOverManyDraws) {
  std::mt19937_64 rng(37);
  const int64_t V = 128256;
  for (int64_t B : {1, 4, 64}) {
    SCOPED_TRACE("B=" + std::to_string(B));
    const std::vector<double> p = random_probs(B, V, rng);
    for (int64_t offset = 0; offset < (B > 4 ? 4 : 16); ++offset) {
      expect_gpu_matches_cpu(kTopKTopP, {{DType::kF32, {B, V}, p},
                                         {DType::kI32, {B}, std::vector<double>(B, 50)},
                                         {DType::kF32, {B}, std::vector<double>(B, 0.9)},
                                         {DType::kI32, {B}, {}},
                                         {DType::kI64, {2}, {2024, static_cast<double>(offset)}}});
    }
    expect_gpu_matches_cpu(kTopK, {{DType::kF32, {B, V}, p},
                                   {DType::kI32, {B}, std::vector<double>(B, 50)},
                                   {DType::kF32, {B, V}, {}}});
    expect_gpu_matches_cpu(kTopP, {{DType::kF32, {B, V}, p},
                                   {DType::kF32, {B}, std::vector<double>(B, 0.9)},
                                   {DType::kF32, {B, V}, {}}});
    expect_gpu_matches_cpu(kMinP, {{DType::kF32, {B, V}, p},
                                   {DType::kF32, {B}, std::vector<double>(B, 0.05)},
                                   {DType::kI32, {B}, {}},
                                   {DType::kI64, {2}, {7, 3}}});
  }
}

TEST_F(GpuSampling, BadRowsGiveMinusOneOrNaN) {
  std::vector<double> p(3 * 300, 1.0 / 300);
  p[300 + 17] = NAN;
  for (int64_t i = 600; i < 900; ++i) p[static_cast<size_t>(i)] = 0;
  auto r = run_op(kTopKTopP, "cuda",
                  {{DType::kF32, {3, 300}, p},
                   {DType::kI32, {3}, {0, 0, 0}},
                   {DType::kF32, {3}, {1, 1, 1}},
                   {DType::kI32, {3}, {}},
                   {DType::kI64, {2}, {1, 0}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GE((*r)[3][0], 0);
  EXPECT_EQ((*r)[3][1], -1) << "NaN row";
  EXPECT_EQ((*r)[3][2], -1) << "all-zero row";
  auto k = run_op(
      kTopK, "cuda",
      {{DType::kF32, {3, 300}, p}, {DType::kI32, {3}, {5, 5, 5}}, {DType::kF32, {3, 300}, {}}});
  ASSERT_TRUE(k.ok()) << k.status().message();
  for (int64_t i = 0; i < 300; ++i) {
    EXPECT_TRUE(std::isnan((*k)[2][static_cast<size_t>(300 + i)]));
    EXPECT_TRUE(std::isnan((*k)[2][static_cast<size_t>(600 + i)]));
  }
}

// 10^6 draws on the GPU: 4000 identical rows of V = 50 (each row its own Philox counter),
// 250 calls advancing the device-side offset.
TEST_F(GpuSampling, DrawsFollowTheFilteredDistribution) {
  std::mt19937_64 rng(23);
  const int64_t V = 50, B = 4000, kCalls = 250;
  const std::vector<double> row = random_probs(1, V, rng);
  std::vector<double> p;
  for (int64_t b = 0; b < B; ++b) p.insert(p.end(), row.begin(), row.end());
  auto call = prepare(kTopKTopP, "cuda",
                      {{DType::kF32, {B, V}, p},
                       {DType::kI32, {B}, std::vector<double>(B, 20)},
                       {DType::kF32, {B}, std::vector<double>(B, 0.85)},
                       {DType::kI32, {B}, {}},
                       {DType::kI64, {2}, {4242, 0}}});
  ASSERT_TRUE(call.ok()) << call.status().message();
  std::vector<int64_t> counts(static_cast<size_t>(V), 0);
  for (int64_t c = 0; c < kCalls; ++c) {
    ASSERT_TRUE(call->h.call(call->ptrs).ok());
    auto v = results(*call);
    ASSERT_TRUE(v.ok()) << v.status().message();
    for (double id : (*v)[3]) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, V);
      ++counts[static_cast<size_t>(id)];
    }
    if (c == kCalls - 1) {
      EXPECT_EQ((*v)[4][1], kCalls) << "offset advanced once per call, on the device";
    }
  }
  expect_frequencies(counts, filtered(row, top_p_set(row, 0, V, 0.85, 20)), B * kCalls);
}

}  // namespace
}  // namespace kreg
