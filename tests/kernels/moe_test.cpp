// The moe group: every CPU reference against an independent double-precision oracle
// written here, every CUDA implementation against its CPU reference over shape sweeps with
// awkward sizes (skipped without a GPU), and bad arguments rejected with clear messages.
//
// Routing inputs are distinct multiples of 1/64 (exact in bf16, f16 and f32), so the
// expert ids have one right answer and are compared exactly. Index inputs
// (align_block_size's topk_ids) are generated valid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/numeric.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

// One tensor argument: values to upload, or none for an output (poisoned: NaN for
// floats, -77 for integers, so unwritten elements show up).
struct Arg {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;
  bool absent = false;  // an omitted optional tensor (null)
};

using Values = std::vector<std::vector<double>>;

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool is_float_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// Runs `op` on `backend` and returns every tensor's values afterwards.
Result<Values> run_op(const std::string& op, const std::string& backend,
                      const std::vector<Arg>& args, const std::vector<NamedAttr>& attrs) {
  const DLDevice dev = backend == "cuda" ? kGpu : kCpu;
  auto h = registry().resolve(op, Target{dev, args[0].dtype}, {backend});
  if (!h) return h.status();
  std::vector<Buffer> bufs;
  std::vector<DLTensor*> ptrs;
  for (const Arg& a : args) {
    auto b = Buffer::make(dev, a.dtype, a.shape);
    if (!b) return b.status();
    std::vector<double> v = a.values;
    if (v.empty() && count(a.shape) > 0) {
      v.assign(static_cast<size_t>(count(a.shape)), is_float_dtype(a.dtype) ? std::nan("") : -77.0);
    }
    if (Status st = b->from_doubles(v); !st.ok()) return st;
    bufs.push_back(std::move(b).value());
  }
  for (size_t i = 0; i < bufs.size(); ++i)
    ptrs.push_back(args[i].absent ? nullptr : bufs[i].tensor());
  auto al = h->attrs(attrs);
  if (!al) return al.status();
  if (Status st = h->call(ptrs, al->view()); !st.ok()) return st;
  if (Status st = harness::device_synchronize(); !st.ok()) return st;
  Values out;
  for (const Buffer& b : bufs) {
    auto v = b.to_doubles();
    if (!v) return v.status();
    out.push_back(std::move(v).value());
  }
  return out;
}

// Whether a routing configuration passes correction_bias (else it is omitted: null).
bool passes_bias(const std::string& method, bool use_bias) {
  return method == "grouped" || method == "DeepSeekV3" || method == "MiniMax2" ||
         (method == "topk_softmax" && use_bias);
}

std::vector<double> rounded(std::vector<double> v, DType dt) {
  for (double& x : v) {
    if (dt == DType::kBF16) x = to_float(to_bf16(static_cast<float>(x)));
    if (dt == DType::kF16) x = to_float(to_f16(static_cast<float>(x)));
    if (dt == DType::kF32) x = static_cast<float>(x);
  }
  return v;
}

void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, harness::Tolerance tol) {
  auto cmp = harness::compare_values(what, got, want, tol);
  EXPECT_TRUE(cmp.ok()) << what << ": " << cmp.mismatches << "/" << cmp.count
                        << " mismatches, max_abs " << cmp.max_abs << ", max_rel " << cmp.max_rel;
}

void expect_equal(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << "/" << got.size() << " differ; first at " << first
                     << ": got " << (first < got.size() ? got[first] : 0) << ", want "
                     << (first < got.size() ? want[first] : 0);
}

const harness::Tolerance kWeightTol{1e-5, 1e-4};  // f32 weights, fp32 math

// ---- moe.sum ----

std::vector<double> sum_oracle(const std::vector<double>& x, int64_t T, int64_t K, int64_t H,
                               double scale) {
  std::vector<double> out(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += x[static_cast<size_t>((t * K + j) * H + h)];
      out[static_cast<size_t>(t * H + h)] = acc * scale;
    }
  }
  return out;
}

std::vector<double> random_nonzero(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> mag(0.05, 2.0);
  std::vector<double> v(n);
  for (double& x : v) x = (rng() & 1 ? 1 : -1) * mag(rng);
  return v;
}

// ---- routing oracles (double) ----

// Distinct logits: E different multiples of 1/64 in [-4, 4), exact in every float dtype.
std::vector<double> distinct_logits(int64_t T, int64_t E, std::mt19937_64& rng) {
  std::vector<double> g;
  std::vector<int> pool(512);
  std::iota(pool.begin(), pool.end(), -256);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t e = 0; e < E; ++e) g.push_back(pool[static_cast<size_t>(e)] / 64.0);
  }
  return g;
}

std::vector<double> random_bias(int64_t E, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(-300, 300);
  std::vector<double> b(static_cast<size_t>(E));
  for (double& x : b) x = d(rng) / 1024.0;
  return b;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The k indices with the largest keys among `allowed`, descending, ties to the lower index.
std::vector<int> top_indices(const std::vector<double>& key, const std::vector<bool>& allowed,
                             int k) {
  std::vector<int> idx;
  for (int e = 0; e < static_cast<int>(key.size()); ++e) {
    if (allowed[static_cast<size_t>(e)]) idx.push_back(e);
  }
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key[a] > key[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

struct RouteSpec {
  std::string method;  // a moe.route method, or "topk_softmax"
  bool renormalize = false;
  double softcap = 0;
  bool use_bias = false;
  int n_group = 1, topk_group = 1;
  double scale = 1.0;
};

// Weights and ids ([T*K] each) of one routing call, in double from the rounded inputs.
std::pair<std::vector<double>, std::vector<double>> route_oracle(const std::vector<double>& g,
                                                                 const std::vector<double>& bias,
                                                                 int64_t T, int64_t E, int K,
                                                                 const RouteSpec& s) {
  std::vector<double> w, ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> l(g.begin() + t * E, g.begin() + (t + 1) * E);
    if (s.softcap > 0) {
      for (double& x : l) x = s.softcap * std::tanh(x / s.softcap);
    }
    std::vector<double> soft(l.size()), sig(l.size());
    const double m = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (double x : l) z += std::exp(x - m);
    for (size_t e = 0; e < l.size(); ++e) {
      soft[e] = std::exp(l[e] - m) / z;
      sig[e] = sigmoid(l[e]);
    }
    std::vector<bool> allowed(l.size(), true);
    std::vector<double> key = l;
    std::vector<double> weight;  // per expert, before post-processing
    bool renorm = false;
    const std::string& M = s.method;
    if (M == "topk_softmax") {
      if (s.use_bias) {
        for (size_t e = 0; e < l.size(); ++e) key[e] = l[e] + bias[e];
      }
      weight = soft;
      renorm = s.renormalize;
    } else if (M == "grouped" || M == "DeepSeekV3") {
      for (size_t e = 0; e < l.size(); ++e) key[e] = sig[e] + bias[e];
      const int64_t gsize = E / s.n_group;
      std::vector<double> gscore(static_cast<size_t>(s.n_group));
      for (int grp = 0; grp < s.n_group; ++grp) {
        std::vector<double> v(key.begin() + grp * gsize, key.begin() + (grp + 1) * gsize);
        std::sort(v.rbegin(), v.rend());
        gscore[static_cast<size_t>(grp)] = v[0] + (gsize >= 2 ? v[1] : 0.0);
      }
      std::vector<int> kept =
          top_indices(gscore, std::vector<bool>(gscore.size(), true), s.topk_group);
      std::fill(allowed.begin(), allowed.end(), false);
      for (int grp : kept) {
        for (int64_t i = 0; i < gsize; ++i) allowed[static_cast<size_t>(grp * gsize + i)] = true;
      }
      weight = sig;
      renorm = M == "DeepSeekV3" || s.renormalize;
    } else if (M == "Default") {
      weight = soft;
    } else if (M == "Renormalize") {
      weight = l;  // softmax over the picks below
    } else if (M == "Llama4" || M == "Sigmoid") {
      weight = sig;
    } else if (M == "RenormalizeNaive") {
      weight = soft;
      renorm = true;
    } else if (M == "TopK") {
      weight = l;
    } else if (M == "SigmoidRenorm") {
      weight = sig;
      renorm = true;
    } else if (M == "MiniMax2") {
      for (size_t e = 0; e < l.size(); ++e) key[e] = sig[e] + bias[e];
      weight = sig;
      renorm = true;
    } else {
      ADD_FAILURE() << "no oracle for method " << M;
    }
    const std::vector<int> picks = top_indices(key, allowed, K);
    std::vector<double> pw;
    for (int e : picks) pw.push_back(weight[static_cast<size_t>(e)]);
    if (M == "Renormalize") {
      const double top = pw[0];
      for (double& x : pw) x = std::exp(x - top);
      renorm = true;
    }
    double sum = 0;
    for (double x : pw) sum += x;
    for (size_t j = 0; j < pw.size(); ++j) {
      w.push_back((renorm ? pw[j] / sum : pw[j]) * s.scale);
      ids.push_back(picks[j]);
    }
  }
  return {w, ids};
}

// The op and attributes for a RouteSpec.
std::pair<std::string, std::vector<NamedAttr>> route_call(const RouteSpec& s) {
  if (s.method == "topk_softmax") {
    return {"moe.topk_softmax", {{"renormalize", s.renormalize}, {"softcapping", s.softcap}}};
  }
  if (s.method == "grouped") {
    return {"moe.grouped_topk",
            {{"n_group", int64_t{s.n_group}},
             {"topk_group", int64_t{s.topk_group}},
             {"renormalize", s.renormalize},
             {"routed_scaling_factor", s.scale}}};
  }
  return {"moe.route",
          {{"method", s.method},
           {"n_group", int64_t{s.n_group}},
           {"topk_group", int64_t{s.topk_group}},
           {"routed_scaling_factor", s.scale}}};
}

struct RouteShape {
  int64_t T, E;
  int K;
  int n_group = 1, topk_group = 1;
};

// Every routing configuration the sweeps run, with shapes that fit it.
std::vector<std::pair<RouteSpec, std::vector<RouteShape>>> route_sweep() {
  const std::vector<RouteShape> plain = {{1, 1, 1},     {3, 7, 2},   {5, 64, 6},   {2, 100, 8},
                                         {17, 256, 8},  {4, 384, 5}, {3, 512, 16}, {2, 96, 40},
                                         {1, 512, 512}, {9, 160, 1}, {0, 64, 4}};
  const std::vector<RouteShape> grouped = {
      {1, 256, 8, 8, 4},  {33, 256, 8, 8, 4}, {3, 16, 3, 4, 2},    {5, 64, 6, 8, 3},
      {2, 12, 4, 3, 2},   {2, 8, 3, 8, 3},    {4, 160, 10, 32, 5}, {7, 512, 8, 16, 4},
      {2, 128, 40, 4, 2}, {3, 60, 6, 1, 1},   {0, 256, 8, 8, 4}};
  std::vector<RouteShape> top1;
  for (const RouteShape& s : plain) top1.push_back({s.T, s.E, 1});
  std::vector<std::pair<RouteSpec, std::vector<RouteShape>>> out;
  for (bool renorm : {false, true}) {
    for (double cap : {0.0, 3.0}) {
      for (bool bias : {false, true}) out.push_back({{"topk_softmax", renorm, cap, bias}, plain});
    }
  }
  out.push_back({{"grouped", true, 0, true, 0, 0, 2.5}, grouped});
  out.push_back({{"grouped", false, 0, true, 0, 0, 1.0}, grouped});
  for (const char* m : {"Default", "Renormalize", "RenormalizeNaive", "TopK", "SigmoidRenorm",
                        "MiniMax2", "Sigmoid"}) {
    out.push_back({{m, false, 0, false, 1, 1, 1.5}, plain});
  }
  out.push_back({{"Llama4", false, 0, false, 1, 1, 1.0}, top1});
  out.push_back({{"DeepSeekV3", false, 0, true, 0, 0, 2.5}, grouped});
  return out;
}

// Runs one routing case on `backend`; returns (weights, ids).
Result<std::pair<std::vector<double>, std::vector<double>>> run_route(
    const std::string& backend, RouteSpec spec, const RouteShape& sh, DType dt,
    const std::vector<double>& g, const std::vector<double>& bias) {
  if (spec.n_group == 0) {
    spec.n_group = sh.n_group;
    spec.topk_group = sh.topk_group;
  }
  auto [op, attrs] = route_call(spec);
  auto r = run_op(op, backend,
                  {{dt, {sh.T, sh.E}, g},
                   {DType::kF32, {sh.E}, bias, !passes_bias(spec.method, spec.use_bias)},
                   {DType::kF32, {sh.T, sh.K}, {}},
                   {DType::kI32, {sh.T, sh.K}, {}}},
                  attrs);
  if (!r) return r.status();
  return std::make_pair((*r)[2], (*r)[3]);
}

// ---- align_block_size oracle ----

struct AlignResult {
  std::vector<double> sorted, blocks, total;
};

AlignResult align_oracle(const std::vector<double>& ids, int64_t E, int64_t bs, int64_t P,
                         int64_t B) {
  const auto n = static_cast<int64_t>(ids.size());
  AlignResult r;
  r.sorted.assign(static_cast<size_t>(P), static_cast<double>(n));
  r.blocks.assign(static_cast<size_t>(B), -1.0);
  int64_t pos = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (ids[static_cast<size_t>(i)] == static_cast<double>(e)) {
        r.sorted[static_cast<size_t>(pos + c++)] = static_cast<double>(i);
      }
    }
    const int64_t nblocks = (c + bs - 1) / bs;
    for (int64_t b = 0; b < nblocks; ++b) r.blocks[static_cast<size_t>(pos / bs + b)] = e;
    pos += nblocks * bs;
  }
  r.total = {static_cast<double>(pos)};
  return r;
}

struct AlignShape {
  int64_t T, K, E, bs;
  int64_t extra = 0;  // output elements beyond the minimum
};

std::vector<AlignShape> align_shapes() {
  return {{1, 1, 1, 1},
          {1, 8, 256, 16},
          {3, 2, 5, 4, 7},
          {7, 3, 16, 3},
          {64, 8, 256, 64},
          {100, 6, 60, 16},
          {0, 8, 32, 16},
          {257, 8, 256, 128, 3},
          {4096, 8, 256, 64},
          {1000, 4, 2048, 32},
          {33, 5, 700, 1},
          {2048, 2, 8, 256},
          // The CUDA multi-block path (>= 9 chunks of >= 512 slots): smallest chunk count,
          // one expert, odd sizes, the most experts, the most chunks.
          {576, 8, 256, 64},
          {5000, 1, 1, 4},
          {700, 7, 3, 5, 11},
          {20000, 8, 2048, 16},
          {32768, 8, 256, 64},
          // The launch shapes' edges: the single block's largest N (8 chunks, every warp's
          // piece full), the multi-block path's smallest (4097 slots: 9 chunks), E not a
          // multiple of 4 (padded workspace rows), E = 2048 on one block (4 warps).
          {512, 8, 256, 64},
          {4097, 1, 256, 64},
          {1024, 8, 1000, 8},
          {300, 8, 2048, 64, 9},
          // The one-block tiny kernel's edges (N <= 1024, E <= 1024, (warps + 1) * E <=
          // 11776 ints): its largest N, one slot more (the general single block), and
          // E = 1024 at N = 1024, whose histogram rows do not fit (the general block).
          {128, 8, 256, 64},
          {129, 8, 256, 64},
          {128, 8, 1024, 16},
          {1, 1, 1024, 1}};
}

// topk_ids for an align case: each token's k experts distinct when k <= E (as routing
// produces), skewed so some experts get many slots and others none.
std::vector<double> align_ids(const AlignShape& s, std::mt19937_64& rng) {
  std::vector<double> ids;
  std::vector<int64_t> pool(static_cast<size_t>(s.E));
  std::iota(pool.begin(), pool.end(), 0);
  for (int64_t t = 0; t < s.T; ++t) {
    std::shuffle(pool.begin(), pool.begin() + std::min<int64_t>(s.E, 4 * s.K + 3), rng);
    for (int64_t j = 0; j < s.K; ++j) ids.push_back(static_cast<double>(pool[j % s.E]));
  }
  return ids;
}

std::pair<int64_t, int64_t> align_sizes(const AlignShape& s) {
  const int64_t P = s.T * s.K + s.E * (s.bs - 1);
  return {P + s.extra, (P + s.bs - 1) / s.bs + s.extra};
}

Result<Values> run_align(const std::string& backend, const AlignShape& s,
                         const std::vector<double>& ids, bool ignore_invalid) {
  auto [P, B] = align_sizes(s);
  return run_op("moe.align_block_size", backend,
                {{DType::kI32, {s.T, s.K}, ids},
                 {DType::kI32, {P}, {}},
                 {DType::kI32, {B}, {}},
                 {DType::kI32, {1}, {}}},
                {{"num_experts", s.E}, {"block_size", s.bs}, {"ignore_invalid", ignore_invalid}});
}

// ---- Tests ----

TEST(MoeKernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> covered = {"moe.align_block_size", "moe.grouped_topk", "moe.route",
                                      "moe.sum", "moe.topk_softmax"};
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("moe.")) shipped.push_back(id);
  }
  std::sort(shipped.begin(), shipped.end());
  EXPECT_EQ(shipped, covered) << "a new moe op needs an oracle in this file";
}

const DType kFloatDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(MoeKernels, SumReferenceMatchesTheOracle) {
  std::mt19937_64 rng(5);
  const int64_t shapes[][3] = {{1, 1, 1},    {3, 2, 7},    {2, 8, 64},
                               {5, 3, 1000}, {1, 9, 4097}, {0, 8, 16}};
  for (DType dt : kFloatDtypes) {
    for (auto& s : shapes) {
      for (double scale : {1.0, 2.5}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(s[0]) +
                     " K=" + std::to_string(s[1]) + " H=" + std::to_string(s[2]));
        auto x = rounded(random_nonzero(static_cast<size_t>(s[0] * s[1] * s[2]), rng), dt);
        auto r = run_op("moe.sum", "cpu", {{dt, {s[0], s[1], s[2]}, x}, {dt, {s[0], s[2]}, {}}},
                        {{"routed_scaling_factor", scale}});
        ASSERT_TRUE(r.ok()) << r.status().message();
        expect_close("out", (*r)[1], sum_oracle(x, s[0], s[1], s[2], scale),
                     harness::tolerance_for(dt));
      }
    }
  }
}

// A routing case, for failure messages.
std::string route_label(const RouteSpec& spec, DType dt, const RouteShape& sh) {
  return spec.method + " renorm=" + std::to_string(spec.renormalize) +
         " cap=" + std::to_string(spec.softcap) + " bias=" + std::to_string(spec.use_bias) + " " +
         std::string(dtype_name(dt)) + " T=" + std::to_string(sh.T) + " E=" + std::to_string(sh.E) +
         " K=" + std::to_string(sh.K) + " groups=" + std::to_string(sh.n_group) + "/" +
         std::to_string(sh.topk_group);
}

TEST(MoeKernels, RoutingReferencesMatchTheOracle) {
  std::mt19937_64 rng(9);
  for (const auto& [spec, shapes] : route_sweep()) {
    for (DType dt : kFloatDtypes) {
      for (const RouteShape& sh : shapes) {
        SCOPED_TRACE(route_label(spec, dt, sh));
        const auto g = distinct_logits(sh.T, sh.E, rng);
        const auto bias = random_bias(sh.E, rng);
        RouteSpec full = spec;
        if (full.n_group == 0) {
          full.n_group = sh.n_group;
          full.topk_group = sh.topk_group;
        }
        auto got = run_route("cpu", spec, sh, dt, g, bias);
        ASSERT_TRUE(got.ok()) << got.status().message();
        auto [w, ids] = route_oracle(g, bias, sh.T, sh.E, sh.K, full);
        expect_equal("out_ids", got->second, ids);
        expect_close("out_weights", got->first, w, kWeightTol);
      }
    }
  }
}

TEST(MoeKernels, AlignReferenceMatchesTheOracle) {
  std::mt19937_64 rng(3);
  for (const AlignShape& s : align_shapes()) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " K=" + std::to_string(s.K) +
                 " E=" + std::to_string(s.E) + " bs=" + std::to_string(s.bs));
    const auto ids = align_ids(s, rng);
    auto r = run_align("cpu", s, ids, false);
    ASSERT_TRUE(r.ok()) << r.status().message();
    auto [P, B] = align_sizes(s);
    const AlignResult want = align_oracle(ids, s.E, s.bs, P, B);
    expect_equal("out_sorted_token_ids", (*r)[1], want.sorted);
    expect_equal("out_expert_ids", (*r)[2], want.blocks);
    expect_equal("out_num_tokens_post_pad", (*r)[3], want.total);
  }
  // Invalid ids: skipped with ignore_invalid, an error naming the slot without.
  const AlignShape s{2, 3, 4, 2};
  const std::vector<double> ids = {0, 4, 1, -1, 3, 0};
  auto r = run_align("cpu", s, ids, true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto [P, B] = align_sizes(s);
  const AlignResult want = align_oracle(ids, s.E, s.bs, P, B);
  expect_equal("out_sorted_token_ids", (*r)[1], want.sorted);
  expect_equal("out_expert_ids", (*r)[2], want.blocks);
  auto bad = run_align("cpu", s, ids, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("holds expert 4 at slot 1"), std::string::npos)
      << bad.status().message();
}

// The selection keys (and, with a group limit, the group scores) of one row, in double:
// where the GPU and the CPU reference pick differently, the test accepts it only when
// these say the two picks were tied to within fp32 rounding of a transcendental function
// (CUDA's expf/tanhf and the host libm's may differ by an ulp or two).
struct RowKeys {
  std::vector<double> key;
  bool group_boundary_tie = false;
};

RowKeys row_keys(const RouteSpec& s, const std::vector<double>& g, int64_t t, int64_t E,
                 const std::vector<double>& bias) {
  RowKeys rk;
  for (int64_t e = 0; e < E; ++e) {
    double l = g[static_cast<size_t>(t * E + e)];
    if (s.softcap > 0) l = s.softcap * std::tanh(l / s.softcap);
    const bool on_sigmoid =
        s.method == "grouped" || s.method == "DeepSeekV3" || s.method == "MiniMax2";
    double k = on_sigmoid ? sigmoid(l) : l;
    if (passes_bias(s.method, s.use_bias)) k += bias[static_cast<size_t>(e)];
    rk.key.push_back(k);
  }
  if (s.n_group > 1) {
    const int64_t gsize = E / s.n_group;
    std::vector<double> gs;
    for (int grp = 0; grp < s.n_group; ++grp) {
      std::vector<double> v(rk.key.begin() + grp * gsize, rk.key.begin() + (grp + 1) * gsize);
      std::sort(v.rbegin(), v.rend());
      gs.push_back(v[0] + (gsize >= 2 ? v[1] : 0.0));
    }
    std::sort(gs.rbegin(), gs.rend());
    if (s.topk_group < s.n_group) {
      rk.group_boundary_tie = std::abs(gs[static_cast<size_t>(s.topk_group - 1)] -
                                       gs[static_cast<size_t>(s.topk_group)]) < 1e-5;
    }
  }
  return rk;
}

// GPU vs CPU routing results: ids equal, except rows whose differences are all near ties
// (reported, and left out of the weight comparison); weights within fp32 tolerance.
void expect_same_routing(RouteSpec spec, const RouteShape& sh, const std::vector<double>& g,
                         const std::vector<double>& bias,
                         const std::pair<std::vector<double>, std::vector<double>>& gpu,
                         const std::pair<std::vector<double>, std::vector<double>>& cpu) {
  if (spec.n_group == 0) {
    spec.n_group = sh.n_group;
    spec.topk_group = sh.topk_group;
  }
  ASSERT_EQ(gpu.second.size(), cpu.second.size());
  std::vector<double> gw, cw;
  size_t tie_rows = 0, bad_rows = 0;
  std::string first_bad;
  for (int64_t t = 0; t < sh.T; ++t) {
    const size_t row = static_cast<size_t>(t * sh.K);
    bool same = true;
    for (int j = 0; j < sh.K; ++j) same = same && gpu.second[row + j] == cpu.second[row + j];
    if (same) {
      gw.insert(gw.end(), gpu.first.begin() + row, gpu.first.begin() + row + sh.K);
      cw.insert(cw.end(), cpu.first.begin() + row, cpu.first.begin() + row + sh.K);
      continue;
    }
    const RowKeys rk = row_keys(spec, g, t, sh.E, bias);
    bool explained = true;
    for (int j = 0; j < sh.K && explained; ++j) {
      const double a = gpu.second[row + j], b = cpu.second[row + j];
      if (a == b) continue;
      if (!(a >= 0 && a < sh.E)) {
        explained = false;
        break;
      }
      const double ka = rk.key[static_cast<size_t>(a)], kb = rk.key[static_cast<size_t>(b)];
      explained = std::abs(ka - kb) <= 1e-5 * std::max(1.0, std::abs(kb)) || rk.group_boundary_tie;
    }
    if (explained) {
      ++tie_rows;
    } else if (bad_rows++ == 0) {
      first_bad = "token " + std::to_string(t) + ": gpu ids";
      for (int j = 0; j < sh.K; ++j)
        first_bad += " " + std::to_string(static_cast<int64_t>(gpu.second[row + j]));
      first_bad += ", cpu ids";
      for (int j = 0; j < sh.K; ++j)
        first_bad += " " + std::to_string(static_cast<int64_t>(cpu.second[row + j]));
    }
  }
  EXPECT_EQ(bad_rows, 0u) << "out_ids differ beyond near ties in " << bad_rows << " of " << sh.T
                          << " tokens; first: " << first_bad;
  EXPECT_LE(tie_rows, static_cast<size_t>(std::max<int64_t>(2, sh.T / 100)))
      << "too many near-tie rows";
  if (tie_rows > 0) {
    std::printf("note: %zu of %lld tokens differ only at near ties (fp32 exp/tanh rounding)\n",
                tie_rows, static_cast<long long>(sh.T));
  }
  expect_close("out_weights", gw, cw, kWeightTol);
}

class MoeGpu : public test::GpuTest {};

TEST_F(MoeGpu, SumMatchesTheCpuReference) {
  std::mt19937_64 rng(21);
  const int64_t tokens[] = {1, 3, 64, 257};
  const int64_t ks[] = {1, 2, 3, 8, 9};
  const int64_t widths[] = {1, 7, 8, 64, 100, 4096, 4097};
  for (DType dt : kFloatDtypes) {
    for (int64_t T : tokens) {
      for (int64_t K : ks) {
        for (int64_t H : widths) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(T) +
                       " K=" + std::to_string(K) + " H=" + std::to_string(H));
          auto x = rounded(random_nonzero(static_cast<size_t>(T * K * H), rng), dt);
          const std::vector<Arg> args = {{dt, {T, K, H}, x}, {dt, {T, H}, {}}};
          const std::vector<NamedAttr> attrs = {{"routed_scaling_factor", 2.5}};
          auto gpu = run_op("moe.sum", "cuda", args, attrs);
          auto cpu = run_op("moe.sum", "cpu", args, attrs);
          ASSERT_TRUE(gpu.ok()) << gpu.status().message();
          ASSERT_TRUE(cpu.ok()) << cpu.status().message();
          // Same fp32 operations in the same order: equal up to the final rounding.
          expect_close("out", (*gpu)[1], (*cpu)[1], harness::tolerance_for(dt));
        }
      }
    }
  }
}

TEST_F(MoeGpu, RoutingMatchesTheCpuReference) {
  std::mt19937_64 rng(23);
  for (const auto& [spec, shapes] : route_sweep()) {
    for (DType dt : kFloatDtypes) {
      for (const RouteShape& sh : shapes) {
        SCOPED_TRACE(route_label(spec, dt, sh));
        const auto g = distinct_logits(sh.T, sh.E, rng);
        const auto bias = random_bias(sh.E, rng);
        auto gpu = run_route("cuda", spec, sh, dt, g, bias);
        auto cpu = run_route("cpu", spec, sh, dt, g, bias);
        ASSERT_TRUE(gpu.ok()) << gpu.status().message();
        ASSERT_TRUE(cpu.ok()) << cpu.status().message();
        expect_same_routing(spec, sh, g, bias, *gpu, *cpu);
      }
    }
  }
}

TEST_F(MoeGpu, RoutingWithMisalignedGatingAndManyTokens) {
  // A view one element into its allocation defeats vector loads; 3000 tokens fill many
  // blocks. DeepSeek-V3 and Mixtral-like shapes.
  std::mt19937_64 rng(29);
  for (DType dt : kFloatDtypes) {
    for (const RouteShape& sh : {RouteShape{3000, 256, 8, 8, 4}, RouteShape{3000, 8, 2}}) {
      const auto g = distinct_logits(sh.T, sh.E, rng);
      const auto bias = random_bias(sh.E, rng);
      const RouteSpec spec = sh.n_group > 1 ? RouteSpec{"grouped", true, 0, true, 0, 0, 2.5}
                                            : RouteSpec{"topk_softmax", true};
      auto cpu = run_route("cpu", spec, sh, dt, g, bias);
      ASSERT_TRUE(cpu.ok()) << cpu.status().message();
      auto aligned = run_route("cuda", spec, sh, dt, g, bias);
      ASSERT_TRUE(aligned.ok()) << aligned.status().message();
      expect_same_routing(spec, sh, g, bias, *aligned, *cpu);

      auto [op, named] = route_call(RouteSpec{spec.method, spec.renormalize, 0, spec.use_bias,
                                              sh.n_group, sh.topk_group, spec.scale});
      auto h = registry().resolve(op, Target{kGpu, dt}, {std::string("cuda")});
      ASSERT_TRUE(h.ok());
      auto padded = Buffer::make(kGpu, dt, {sh.T * sh.E + 1});
      auto gv = g;
      gv.insert(gv.begin(), 0.5);
      ASSERT_TRUE(padded->from_doubles(gv).ok());
      DLTensor view = *padded->tensor();
      int64_t shape[2] = {sh.T, sh.E};
      view.ndim = 2;
      view.shape = shape;
      view.strides = nullptr;
      view.byte_offset = dtype_size(dt);
      auto b = Buffer::make(kGpu, DType::kF32, {sh.E});
      ASSERT_TRUE(b->from_doubles(bias).ok());
      auto w = Buffer::make(kGpu, DType::kF32, {sh.T, sh.K});
      auto ids = Buffer::make(kGpu, DType::kI32, {sh.T, sh.K});
      ASSERT_TRUE(w->poison().ok());
      ASSERT_TRUE(ids->poison().ok());
      DLTensor* args[] = {&view, passes_bias(spec.method, spec.use_bias) ? b->tensor() : nullptr,
                          w->tensor(), ids->tensor()};
      auto al = h->attrs(named);
      ASSERT_TRUE(al.ok()) << al.status().message();
      ASSERT_TRUE(h->call(args, al->view()).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      expect_same_routing(spec, sh, g, bias, {*w->to_doubles(), *ids->to_doubles()}, *cpu);
    }
  }
}

TEST_F(MoeGpu, AlignMatchesTheCpuReference) {
  std::mt19937_64 rng(31);
  for (const AlignShape& s : align_shapes()) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " K=" + std::to_string(s.K) +
                 " E=" + std::to_string(s.E) + " bs=" + std::to_string(s.bs));
    const auto ids = align_ids(s, rng);
    auto gpu = run_align("cuda", s, ids, false);
    auto cpu = run_align("cpu", s, ids, false);
    ASSERT_TRUE(gpu.ok()) << gpu.status().message();
    ASSERT_TRUE(cpu.ok()) << cpu.status().message();
    for (size_t i = 1; i < 4; ++i)
      expect_equal("output " + std::to_string(i), (*gpu)[i], (*cpu)[i]);
  }
  // Invalid ids are skipped on the GPU with or without ignore_invalid, by the single-block
  // kernel (6 slots) and the multi-block path (8000 slots, one in 7 out of range).
  const AlignShape small{2, 3, 4, 2};
  const AlignShape large{1000, 8, 64, 16};
  std::vector<double> many = align_ids(large, rng);
  for (size_t i = 0; i < many.size(); i += 7)
    many[i] = i % 2 ? -1.0 : 64.0 + static_cast<double>(i % 50);
  const std::pair<AlignShape, std::vector<double>> invalid[] = {{small, {0, 4, 1, -1, 3, 0}},
                                                                {large, many}};
  for (const auto& [s, ids] : invalid) {
    auto cpu = run_align("cpu", s, ids, true);
    ASSERT_TRUE(cpu.ok());
    for (bool ignore : {true, false}) {
      auto gpu = run_align("cuda", s, ids, ignore);
      ASSERT_TRUE(gpu.ok()) << gpu.status().message();
      for (size_t i = 1; i < 4; ++i)
        expect_equal("output " + std::to_string(i), (*gpu)[i], (*cpu)[i]);
    }
  }
}

// The outputs as views 1-3 elements into larger buffers (the sentinel fill's scalar head
// and tail around its 16-byte stores), with guard elements on both sides that must stay
// untouched; both launch shapes (one block; count + scatter).
TEST_F(MoeGpu, AlignWritesMisalignedViewsAndNothingOutsideThem) {
  std::mt19937_64 rng(37);
  auto h = handle("moe.align_block_size", "cuda");
  for (const AlignShape& s : {AlignShape{64, 8, 256, 64}, AlignShape{4096, 8, 256, 64, 5}}) {
    const auto ids = align_ids(s, rng);
    auto cpu = run_align("cpu", s, ids, false);
    ASSERT_TRUE(cpu.ok()) << cpu.status().message();
    auto al = h.attrs({{"num_experts", s.E}, {"block_size", s.bs}});
    ASSERT_TRUE(al.ok()) << al.status().message();
    auto [P, B] = align_sizes(s);
    for (int64_t offset : {1, 2, 3}) {
      SCOPED_TRACE("T=" + std::to_string(s.T) + " offset=" + std::to_string(offset));
      constexpr int64_t kGuard = 7;
      auto in = Buffer::make(kGpu, DType::kI32, {s.T, s.K});
      auto sorted = Buffer::make(kGpu, DType::kI32, {offset + P + kGuard});
      auto blocks = Buffer::make(kGpu, DType::kI32, {offset + B + kGuard});
      auto total = Buffer::make(kGpu, DType::kI32, {1});
      ASSERT_TRUE(in.ok() && sorted.ok() && blocks.ok() && total.ok());
      ASSERT_TRUE(in->from_doubles(ids).ok());
      ASSERT_TRUE(sorted->from_doubles(std::vector<double>(at(offset + P + kGuard), -77.0)).ok());
      ASSERT_TRUE(blocks->from_doubles(std::vector<double>(at(offset + B + kGuard), -77.0)).ok());
      DLTensor sv = *sorted->tensor(), bv = *blocks->tensor();
      int64_t s_shape[1] = {P}, b_shape[1] = {B};
      sv.shape = s_shape;
      sv.strides = nullptr;
      sv.byte_offset = static_cast<uint64_t>(offset) * 4;
      bv.shape = b_shape;
      bv.strides = nullptr;
      bv.byte_offset = static_cast<uint64_t>(offset) * 4;
      DLTensor* args[] = {in->tensor(), &sv, &bv, total->tensor()};
      ASSERT_TRUE(h.call(args, al->view()).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      auto check = [&](const Buffer& buf, int64_t len, const std::vector<double>& want,
                       const char* what) {
        auto got = buf.to_doubles();
        ASSERT_TRUE(got.ok());
        std::vector<double> inside(got->begin() + offset, got->begin() + offset + len);
        expect_equal(what, inside, want);
        for (int64_t i = 0; i < offset; ++i) EXPECT_EQ((*got)[at(i)], -77.0) << what << " " << i;
        for (int64_t i = offset + len; i < offset + len + kGuard; ++i)
          EXPECT_EQ((*got)[at(i)], -77.0) << what << " " << i;
      };
      check(*sorted, P, (*cpu)[1], "out_sorted_token_ids");
      check(*blocks, B, (*cpu)[2], "out_expert_ids");
      expect_equal("out_num_tokens_post_pad", *total->to_doubles(), (*cpu)[3]);
    }
  }
}

// Programmatic dependent launch (KREG_LAUNCH_PDL): a kernel may start before the one it
// follows has finished and must wait before reading that kernel's output. Routing writes
// topk_ids, align_block_size reads them (count + scatter at 32768 x 8, whose scatter also
// reads the count kernel's rows; the single block at 64 x 8), the next routing call
// rewrites the ids that align read; behind a large first routing call, so that an early
// read would see stale memory. Bit for bit what the same chain gives without PDL,
// repeated so that a race has chances to show.
TEST_F(MoeGpu, PdlChainsReadWhatTheKernelBeforeWrote) {
  const int64_t big = 32768, small = 64, E = 256, K = 8, bs = 64;
  // Random inputs (seed > 0), poisoned outputs (seed 0).
  auto make = [&](DType dt, std::vector<int64_t> shape, uint64_t seed) {
    auto b = Buffer::make(kGpu, dt, std::move(shape));
    EXPECT_TRUE(b.ok());
    std::mt19937_64 rng(seed);
    EXPECT_TRUE(seed == 0 ? b->poison().ok() : b->fill_random(rng).ok());
    return std::move(b).value();
  };
  auto topk = handle("moe.topk_softmax", "cuda");
  auto route = handle("moe.route", "cuda");
  auto align = handle("moe.align_block_size", "cuda");
  auto al = align.attrs({{"num_experts", E}, {"block_size", bs}});
  ASSERT_TRUE(al.ok()) << al.status().message();
  Buffer g1 = make(DType::kBF16, {big, E}, 1), g2 = make(DType::kBF16, {big, E}, 2);
  Buffer gs = make(DType::kBF16, {small, E}, 3);
  auto run_chain = [&](uint64_t flags) {
    std::vector<Buffer> out;  // w, ids (big, small), then (sorted, blocks, total) per align
    out.push_back(make(DType::kF32, {big, K}, 0));
    out.push_back(make(DType::kI32, {big, K}, 0));
    out.push_back(make(DType::kF32, {small, K}, 0));
    out.push_back(make(DType::kI32, {small, K}, 0));
    for (int64_t T : {big, big, small}) {
      const int64_t P = T * K + E * (bs - 1);
      out.push_back(make(DType::kI32, {P}, 0));
      out.push_back(make(DType::kI32, {(P + bs - 1) / bs}, 0));
      out.push_back(make(DType::kI32, {1}, 0));
    }
    auto aligned = [&](Buffer& ids, size_t first_out, const CallOptions& o) {
      DLTensor* a[] = {ids.tensor(), out[first_out].tensor(), out[first_out + 1].tensor(),
                       out[first_out + 2].tensor()};
      EXPECT_TRUE(align.call(a, al->view(), o).ok());
    };
    const CallOptions first{nullptr, nullptr, 0};
    const CallOptions next{nullptr, nullptr, flags};
    for (int i = 0; i < 3; ++i) {
      DLTensor* r1[] = {g1.tensor(), nullptr, out[0].tensor(), out[1].tensor()};
      EXPECT_TRUE(topk.call(r1, {}, first).ok());
      aligned(out[1], 4, next);  // reads the ids
      DLTensor* r2[] = {g2.tensor(), nullptr, out[0].tensor(), out[1].tensor()};
      EXPECT_TRUE(route.call(r2, {}, next).ok());  // rewrites them after align read them
      aligned(out[1], 7, next);
      DLTensor* r3[] = {gs.tensor(), nullptr, out[2].tensor(), out[3].tensor()};
      EXPECT_TRUE(topk.call(r3, {}, next).ok());
      aligned(out[3], 10, next);  // the single block
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    std::vector<std::vector<uint8_t>> bytes;
    for (const Buffer& b : out) bytes.push_back(test::bytes_of(b));
    return bytes;
  };
  test::expect_pdl_chain_matches_plain(run_chain, 5);
}

// moe.sum with PDL: each sum reads the previous one's output (viewed as [T, k, H]) behind
// a large first sum, and a last one writes the first one's input; bit for bit the plain
// chain's results.
TEST_F(MoeGpu, SumPdlChainsReadWhatTheSumBeforeWrote) {
  auto sum = handle("moe.sum", "cuda");
  auto attrs = sum.attrs({{"routed_scaling_factor", 0.75}});
  ASSERT_TRUE(attrs.ok()) << attrs.status().message();
  auto make = [&](std::vector<int64_t> shape, uint64_t seed) {
    auto b = Buffer::make(kGpu, DType::kBF16, std::move(shape));
    EXPECT_TRUE(b.ok());
    std::mt19937_64 rng(seed);
    EXPECT_TRUE(seed == 0 ? b->poison().ok() : b->fill_random(rng).ok());
    return std::move(b).value();
  };
  auto run_chain = [&](uint64_t flags) {
    // x [4096, 8, 512] -> a [4096, 512] = [512, 8, 512] -> b [512, 512] = [64, 8, 512]
    // -> c [64, 512]; then the sum of b again into x's first 64 x 512 values.
    Buffer x = make({4096, 8, 512}, 1), a = make({4096, 512}, 0), b = make({512, 512}, 0);
    Buffer c = make({64, 512}, 0);
    int64_t a3[3] = {512, 8, 512}, b3[3] = {64, 8, 512}, x2[2] = {64, 512};
    DLTensor av = *a.tensor(), bv = *b.tensor(), xv = *x.tensor();
    av.ndim = 3, av.shape = a3;
    bv.ndim = 3, bv.shape = b3;
    xv.ndim = 2, xv.shape = x2;
    const CallOptions o{nullptr, nullptr, flags};
    for (int i = 0; i < 4; ++i) {
      DLTensor* s1[] = {x.tensor(), a.tensor()};
      DLTensor* s2[] = {&av, b.tensor()};
      DLTensor* s3[] = {&bv, c.tensor()};
      DLTensor* s4[] = {&bv, &xv};  // rewrites x's first values for the next round
      for (DLTensor** t : {s1, s2, s3, s4}) {
        EXPECT_TRUE(sum.call(std::span<DLTensor* const>(t, 2), attrs->view(), o).ok());
      }
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{test::bytes_of(x), test::bytes_of(a),
                                             test::bytes_of(b), test::bytes_of(c)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

TEST_F(MoeGpu, CpuTensorsToTheCudaPathAreRefused) {
  auto h = registry().resolve("moe.sum", Target{kGpu, DType::kBF16}, {std::string("cuda")});
  ASSERT_TRUE(h.ok());
  auto x = Buffer::make(kCpu, DType::kBF16, {2, 2, 8});
  auto out = Buffer::make(kCpu, DType::kBF16, {2, 8});
  DLTensor* args[] = {x->tensor(), out->tensor()};
  Status st = h->call(args);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("backend cuda runs on cuda tensors"), std::string::npos)
      << st.message();
}

// ---- Bad arguments (CPU: the same host checks guard both backends) ----

Status route_status(const std::string& op, int64_t T, int64_t E, int64_t K,
                    const std::vector<NamedAttr>& attrs, DType gating = DType::kF32,
                    DType ids = DType::kI32) {
  std::mt19937_64 rng(1);
  auto r = run_op(op, "cpu",
                  {{gating, {T, E}, distinct_logits(T, std::min<int64_t>(E, 512), rng)},
                   {DType::kF32, {E}, std::vector<double>(static_cast<size_t>(E), 0.0)},
                   {DType::kF32, {T, K}, {}},
                   {ids, {T, K}, {}}},
                  attrs);
  return r.ok() ? OkStatus() : r.status();
}

void expect_error(const Status& st, const std::string& text) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
}

TEST(MoeKernels, BadArgumentsAreRejected) {
  // k > E, E > 512.
  expect_error(route_status("moe.topk_softmax", 2, 4, 5, {}), "top-k = 5");
  expect_error(route_status("moe.topk_softmax", 2, 4, 5, {}), "between 1 and E = 4");
  // (E > 512 needs more distinct logits than the generator makes: build by hand.)
  {
    auto r = run_op("moe.topk_softmax", "cpu",
                    {{DType::kF32, {1, 513}, std::vector<double>(513, 0.5)},
                     {DType::kF32, {513}, std::vector<double>(513, 0.0)},
                     {DType::kF32, {1, 2}, {}},
                     {DType::kI32, {1, 2}, {}}},
                    {});
    ASSERT_FALSE(r.ok());
    expect_error(r.status(), "argument 'gating' has E = 513 experts; supported: 1 to 512");
  }
  expect_error(route_status("moe.topk_softmax", 2, 8, 2, {{"softcapping", -1.0}}),
               "attribute 'softcapping'");
  // Wrong dtypes and shapes, named by the core.
  expect_error(route_status("moe.topk_softmax", 2, 8, 2, {}, DType::kF32, DType::kI64),
               "argument 'out_ids'");
  expect_error(route_status("moe.topk_softmax", 2, 8, 2, {}, DType::kF64),
               "dtype f64 not supported (f32|f16|bf16)");
  {
    auto r = run_op("moe.topk_softmax", "cpu",
                    {{DType::kF32, {2, 8}, std::vector<double>(16, 0.5)},
                     {DType::kF32, {7}, std::vector<double>(7, 0.0)},
                     {DType::kF32, {2, 2}, {}},
                     {DType::kI32, {2, 2}, {}}},
                    {});
    ASSERT_FALSE(r.ok());
    expect_error(r.status(), "argument 'correction_bias'");
  }
  // Groups.
  expect_error(route_status("moe.grouped_topk", 2, 256, 8,
                            {{"n_group", int64_t{7}}, {"topk_group", int64_t{4}}}),
               "attribute 'n_group' = 7");
  expect_error(route_status("moe.grouped_topk", 2, 256, 8,
                            {{"n_group", int64_t{8}}, {"topk_group", int64_t{9}}}),
               "attribute 'topk_group' = 9");
  expect_error(route_status("moe.grouped_topk", 2, 256, 40,
                            {{"n_group", int64_t{8}}, {"topk_group", int64_t{1}}}),
               "top-k = 40 exceeds the 32 experts");
  expect_error(route_status("moe.grouped_topk", 2, 64, 2,
                            {{"n_group", int64_t{64}}, {"topk_group", int64_t{1}}}),
               "attribute 'n_group' = 64");
  // Methods.
  expect_error(route_status("moe.route", 2, 8, 2, {{"method", std::string("Softmax")}}),
               "unknown method 'Softmax'; valid methods: Default, Renormalize, DeepSeekV3, Llama4, "
               "RenormalizeNaive, TopK, SigmoidRenorm, MiniMax2, Sigmoid");
  {
    std::mt19937_64 rng(2);
    auto r = run_op("moe.route", "cpu",
                    {{DType::kF32, {2, 8}, distinct_logits(2, 8, rng)},
                     {DType::kF32, {8}, {}, true},
                     {DType::kF32, {2, 2}, {}},
                     {DType::kI32, {2, 2}, {}}},
                    {{"method", std::string("DeepSeekV3")}});
    ASSERT_FALSE(r.ok());
    expect_error(r.status(),
                 "method 'DeepSeekV3' selects by score + correction_bias: argument "
                 "'correction_bias' is required");
  }
  expect_error(route_status("moe.route", 2, 8, 2, {{"method", std::string("Llama4")}}),
               "method 'Llama4' routes each token to one expert");
  expect_error(
      route_status("moe.route", 2, 8, 2,
                   {{"method", std::string("Default")}, {"routed_scaling_factor", std::nan("")}}),
      "attribute 'routed_scaling_factor'");
  // moe.sum.
  {
    auto r = run_op(
        "moe.sum", "cpu",
        {{DType::kF32, {2, 3, 8}, std::vector<double>(48, 1.0)}, {DType::kF32, {2, 9}, {}}}, {});
    ASSERT_FALSE(r.ok());
    expect_error(r.status(), "argument 'out'");
  }
  // align_block_size: sizes and attributes.
  {
    const AlignShape s{4, 2, 8, 4};
    const std::vector<double> ids(8, 1.0);
    auto [P, B] = align_sizes(s);
    auto small = run_op("moe.align_block_size", "cpu",
                        {{DType::kI32, {4, 2}, ids},
                         {DType::kI32, {P - 1}, {}},
                         {DType::kI32, {B}, {}},
                         {DType::kI32, {1}, {}}},
                        {{"num_experts", int64_t{8}}, {"block_size", int64_t{4}}});
    ASSERT_FALSE(small.ok());
    expect_error(small.status(),
                 "argument 'out_sorted_token_ids' has 31 elements; it needs at least");
    auto few_blocks = run_op("moe.align_block_size", "cpu",
                             {{DType::kI32, {4, 2}, ids},
                              {DType::kI32, {P}, {}},
                              {DType::kI32, {B - 1}, {}},
                              {DType::kI32, {1}, {}}},
                             {{"num_experts", int64_t{8}}, {"block_size", int64_t{4}}});
    ASSERT_FALSE(few_blocks.ok());
    expect_error(few_blocks.status(), "argument 'out_expert_ids'");
    auto zero_bs = run_op("moe.align_block_size", "cpu",
                          {{DType::kI32, {4, 2}, ids},
                           {DType::kI32, {P}, {}},
                           {DType::kI32, {B}, {}},
                           {DType::kI32, {1}, {}}},
                          {{"num_experts", int64_t{8}}, {"block_size", int64_t{0}}});
    ASSERT_FALSE(zero_bs.ok());
    expect_error(zero_bs.status(), "attribute 'block_size' = 0");
    auto many = run_op("moe.align_block_size", "cpu",
                       {{DType::kI32, {4, 2}, ids},
                        {DType::kI32, {P}, {}},
                        {DType::kI32, {B}, {}},
                        {DType::kI32, {1}, {}}},
                       {{"num_experts", int64_t{4096}}, {"block_size", int64_t{4}}});
    ASSERT_FALSE(many.ok());
    expect_error(many.status(), "attribute 'num_experts' = 4096");
  }
}

}  // namespace
}  // namespace kreg
