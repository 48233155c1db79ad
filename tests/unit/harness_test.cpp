// The harness's example builder on ops with an optional rank-free tensor ('Tensor?' with no
// named shape): make_example leaves it absent (a null DLTensor*, no buffer), and every walk
// over the parameters (copy_example, bytes_moved, check_against_reference) skips it and
// still finds the right buffer for the tensors after it. A required rank-free tensor stays
// an error. Ops registered in-process. The graph timing's tests need a GPU (skipped
// without one) except for its argument check.
#include "harness.hpp"
#include "cublas_matmul.hpp"
#include "example_values.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "kreg/plugin.hpp"
#include "kreg/registry.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace kreg {
namespace {

// What the last kernel call received, so a test sees what the harness passed.
thread_local bool g_saw_rows = true;
thread_local bool g_saw_scale = true;

// x[r, :] = -x[r, :] for the listed rows, every row without `rows`.
KernelStatus negate_rows(Context& ctx, DLTensor& x, const DLTensor* rows) {
  g_saw_rows = rows != nullptr;
  if (rows != nullptr && rows->ndim != 1) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "rows must be one-dimensional");
  }
  const int64_t n = x.shape[0], width = x.shape[1];
  const int64_t count = rows ? rows->shape[0] : n;
  float* base = data_ptr<float>(x);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t row = rows ? data_ptr<const int32_t>(*rows)[r] : r;
    if (row < 0 || row >= n) return ctx.fail(KREG_INVALID_ARGUMENT, "row %lld", (long long)row);
    for (int64_t v = 0; v < width; ++v) base[row * width + v] = -base[row * width + v];
  }
  return kOk;
}

// out = x * (scale ? scale[0] : 3): the absent tensor sits between two built ones.
KernelStatus scaled(Context&, const DLTensor& x, const DLTensor* scale, DLTensor& out) {
  g_saw_scale = scale != nullptr;
  const float s = scale ? data_ptr<const float>(*scale)[0] : 3.0f;
  for (int64_t i = 0; i < numel(x); ++i) data_ptr<float>(out)[i] = s * data_ptr<const float>(x)[i];
  return kOk;
}

KernelStatus needs_y(Context&, const DLTensor&, const DLTensor&, DLTensor&) { return kOk; }

KernelSpec spec(const char* op, const char* sig, Binding b) {
  kreg_kernel_desc d{};
  d.struct_size = sizeof d;
  d.op = op;
  d.backend = "cpu";
  d.caps = kCpu;
  d.num_caps = 1;
  d.signature = sig;
  d.dtypes = "f32";
  d.arg_kinds = b.arg_kinds;
  d.description = "test";
  d.source_file = "harness_test.cpp";
  d.fn = b.fn;
  // The group is the op's prefix, as a plugin of that group would declare it.
  const std::string op_id = op;
  auto s = make_kernel_spec(d, Provenance{op_id.substr(0, op_id.find('.')), "0.1.0", "", ""});
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

const char* kMaskSig = "negate_rows(Tensor(a!)[B,V] x, Tensor?<i32> rows) -> ()";
const char* kScaledSig = "scaled(Tensor[N] x, Tensor? scale, Tensor(a!)[N] out) -> ()";
const DLDevice kCpuDev{kDLCPU, 0};

TEST(Harness, OptionalRankFreeTensorIsLeftAbsent) {
  const KernelSpec s = spec("h.negate_rows", kMaskSig, bind<&negate_rows>);
  EXPECT_EQ(harness::absent_tensors(s), std::vector<std::string>{"rows"});
  auto a = harness::make_example(s, {{"B", 3}, {"V", 5}}, DType::kF32, kCpuDev, 1);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->tensors.size(), 2u);
  ASSERT_EQ(a->buffers.size(), 1u);
  EXPECT_EQ(a->tensors[0], a->buffers[0].tensor());
  EXPECT_EQ(a->tensors[1], nullptr);
  EXPECT_EQ(a->buffer(0), &a->buffers[0]);
  EXPECT_EQ(a->buffer(1), nullptr);
  EXPECT_EQ(a->buffer(2), nullptr);
  EXPECT_EQ(a->buffers[0].shape(), (std::vector<int64_t>{3, 5}));
  // x is read and written in place: 2 * 15 floats; the absent rows move nothing.
  EXPECT_EQ(harness::bytes_moved(s, *a), 2u * 15 * sizeof(float));

  auto c = harness::copy_example(*a, kCpuDev);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->tensors.size(), 2u);
  ASSERT_EQ(c->buffers.size(), 1u);
  EXPECT_EQ(c->tensors[0], c->buffers[0].tensor());
  EXPECT_NE(c->tensors[0], a->tensors[0]);
  EXPECT_EQ(c->tensors[1], nullptr);
  EXPECT_EQ(*c->buffers[0].to_doubles(), *a->buffers[0].to_doubles());
}

// The absent tensor in the middle: the tensors after it find their own buffers.
TEST(Harness, TensorsAfterAnAbsentOneKeepTheirBuffers) {
  const KernelSpec s = spec("h.scaled", kScaledSig, bind<&scaled>);
  auto a = harness::make_example(s, {{"N", 7}}, DType::kF32, kCpuDev, 2);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->tensors.size(), 3u);
  ASSERT_EQ(a->buffers.size(), 2u);
  EXPECT_EQ(a->tensors[1], nullptr);
  EXPECT_EQ(a->buffer(0), &a->buffers[0]);
  EXPECT_EQ(a->buffer(1), nullptr);
  EXPECT_EQ(a->buffer(2), &a->buffers[1]);
  EXPECT_EQ(a->tensors[2], a->buffers[1].tensor());
  // x read (7 floats), out written only (7 floats).
  EXPECT_EQ(harness::bytes_moved(s, *a), 14u * sizeof(float));
  // out is poisoned (write-only), x random: the builder treated each by its own param.
  const std::vector<double> out0 = *a->buffers[1].to_doubles(), x0 = *a->buffers[0].to_doubles();
  for (double v : out0) EXPECT_TRUE(std::isnan(v));
  for (double v : x0) EXPECT_FALSE(std::isnan(v));

  Registry reg;
  ASSERT_TRUE(reg.add(s).ok());
  auto h = reg.resolve("h.scaled", Target{kCpuDev, DType::kF32});
  ASSERT_TRUE(h.ok()) << h.status().message();
  g_saw_scale = true;
  auto cmp = harness::check_against_reference(reg, *h, {{"N", 7}}, DType::kF32, {}, 3);
  ASSERT_TRUE(cmp.ok()) << cmp.status().message();
  EXPECT_FALSE(g_saw_scale) << "the kernel was given a scale tensor";
  ASSERT_EQ(cmp->size(), 1u);
  EXPECT_EQ((*cmp)[0].tensor, "out");
  EXPECT_EQ((*cmp)[0].count, 7u);
  EXPECT_TRUE((*cmp)[0].ok());
}

TEST(Harness, CheckAgainstReferenceRunsWithTheTensorAbsent) {
  Registry reg;
  ASSERT_TRUE(reg.add(spec("h.negate_rows", kMaskSig, bind<&negate_rows>)).ok());
  auto h = reg.resolve("h.negate_rows", Target{kCpuDev, DType::kF32});
  ASSERT_TRUE(h.ok()) << h.status().message();
  g_saw_rows = true;
  auto cmp = harness::check_against_reference(reg, *h, {{"B", 4}, {"V", 9}}, DType::kF32, {}, 5);
  ASSERT_TRUE(cmp.ok()) << cmp.status().message();
  EXPECT_FALSE(g_saw_rows);
  ASSERT_EQ(cmp->size(), 1u);
  EXPECT_EQ((*cmp)[0].tensor, "x");
  EXPECT_EQ((*cmp)[0].count, 36u);
  EXPECT_TRUE((*cmp)[0].ok());
  // The kernel ran on every row: x built from the same seed, negated.
  auto before = harness::make_example(h->spec(), {{"B", 4}, {"V", 9}}, DType::kF32, kCpuDev, 5);
  ASSERT_TRUE(before.ok());
  const std::vector<double> x0 = *before->buffers[0].to_doubles();
  ASSERT_TRUE(h->call(before->tensors).ok());
  const std::vector<double> x1 = *before->buffers[0].to_doubles();
  for (size_t i = 0; i < x0.size(); ++i) EXPECT_EQ(x1[i], -x0[i]) << i;
}

// A ranked optional tensor is still built (it has a shape to build from).
TEST(Harness, RankedOptionalTensorIsStillBuilt) {
  const KernelSpec s =
      spec("h.scaled2", "scaled2(Tensor[N] x, Tensor?[1] scale, Tensor(a!)[N] out) -> ()",
           bind<&scaled>);
  EXPECT_TRUE(harness::absent_tensors(s).empty());
  auto a = harness::make_example(s, {{"N", 4}}, DType::kF32, kCpuDev, 1);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->buffers.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a->tensors[i], a->buffers[i].tensor()) << i;
  EXPECT_EQ(harness::bytes_moved(s, *a), (4u + 1u + 4u) * sizeof(float));
}

TEST(Harness, RequiredRankFreeTensorIsAnError) {
  const KernelSpec s =
      spec("h.needs_y", "needs_y(Tensor[N] x, Tensor y, Tensor(a!)[N] out) -> ()", bind<&needs_y>);
  EXPECT_TRUE(harness::absent_tensors(s).empty());
  auto a = harness::make_example(s, {{"N", 4}}, DType::kF32, kCpuDev, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(a.status().message().find("h.needs_y: tensor 'y' has no named shape"),
            std::string::npos)
      << a.status().message();
  const Status fits = harness::check_example_fits(s, {{"N", 4}}, DType::kF32, kCpuDev, true);
  EXPECT_FALSE(fits.ok());
  EXPECT_NE(fits.message().find("tensor 'y'"), std::string::npos) << fits.message();
}

// FP8 buffers hold values, not raw bytes: written values come back exactly where they are
// representable, a poisoned FP8 output reads as NaN, and random FP8 inputs are finite.
TEST(Harness, Fp8BuffersRoundTripTheirValues) {
  const std::vector<double> e4m3 = {0.0, -0.0, 1.0, -1.75, 448.0, -448.0, 0.001953125, 0.25};
  const std::vector<double> e5m2 = {
      0.0, 1.0, -1.5, 57344.0, -0.0000152587890625, 0.75, std::numeric_limits<double>::infinity(),
      3.0};
  for (auto [dt, vals] : {std::pair{DType::kF8E4M3, e4m3}, std::pair{DType::kF8E5M2, e5m2}}) {
    auto b = harness::Buffer::make(kCpuDev, dt, {static_cast<int64_t>(vals.size())});
    ASSERT_TRUE(b.ok()) << b.status().message();
    ASSERT_TRUE(b->from_doubles(vals).ok());
    const std::vector<double> back = *b->to_doubles();
    for (size_t i = 0; i < vals.size(); ++i) {
      EXPECT_EQ(back[i], vals[i]) << dtype_name(dt) << " " << i;
      EXPECT_EQ(std::signbit(back[i]), std::signbit(vals[i])) << dtype_name(dt) << " " << i;
    }
    ASSERT_TRUE(b->poison().ok());
    const std::vector<double> poisoned = *b->to_doubles();
    for (double v : poisoned) EXPECT_TRUE(std::isnan(v)) << dtype_name(dt) << " " << v;
    std::mt19937_64 rng(7);
    ASSERT_TRUE(b->fill_random(rng).ok());
    const std::vector<double> random = *b->to_doubles();
    for (double v : random) {
      EXPECT_TRUE(std::isfinite(v)) << dtype_name(dt);
      EXPECT_GE(std::fabs(v), 0.04) << dtype_name(dt);
      EXPECT_LE(std::fabs(v), 2.0) << dtype_name(dt);
    }
  }
  // 448 * 1.1 saturates in E4M3 (the kernels' SATFINITE); 1.1 rounds to its nearest value.
  auto one = harness::Buffer::make(kCpuDev, DType::kF8E4M3, {2});
  ASSERT_TRUE(one->from_doubles({448.0 * 1.1, 1.1}).ok());
  EXPECT_EQ(*one->to_doubles(), (std::vector<double>{448.0, 1.125}));
}

// Equal infinities match (a masked logit is -inf in both); an infinity against anything
// else, or NaN anywhere, does not, however loose the tolerance.
TEST(Harness, CompareValuesTreatsInfinitiesExactly) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const harness::Tolerance tol{1e-5, 1e-4};
  auto same = harness::compare_values("x", {-inf, 1.0, inf}, {-inf, 1.0, inf}, tol);
  EXPECT_TRUE(same.ok());
  EXPECT_EQ(same.max_abs, 0.0);
  EXPECT_EQ(same.max_rel, 0.0);
  EXPECT_EQ(harness::compare_values("x", {1.0}, {-inf}, tol).mismatches, 1u);
  EXPECT_EQ(harness::compare_values("x", {-inf}, {1.0}, tol).mismatches, 1u);
  EXPECT_EQ(harness::compare_values("x", {inf}, {-inf}, tol).mismatches, 1u);
  auto n = harness::compare_values("x", {nan, 2.0}, {nan, 2.0}, tol);
  EXPECT_EQ(n.mismatches, 1u);
  EXPECT_TRUE(std::isnan(n.max_abs));
  // Finite values as before: within atol + rtol * |want| matches.
  auto close = harness::compare_values("x", {1.00005, 3.0}, {1.0, 3.1}, tol);
  EXPECT_EQ(close.mismatches, 1u);
  EXPECT_NEAR(close.max_abs, 0.1, 1e-12);
}

}  // namespace
}  // namespace kreg

// ---- Example values (example_values.hpp) ----

#include <algorithm>
#include <vector>

namespace kreg {
namespace {

// What an in-process moe.align_block_size received; it writes zeros.
thread_local std::vector<int32_t> g_align_ids;

KernelStatus align_stub(Context&, const DLTensor& topk_ids, DLTensor& sorted, DLTensor& experts,
                        DLTensor& total, int64_t, int64_t, bool) {
  const int32_t* ids = data_ptr<const int32_t>(topk_ids);
  g_align_ids.assign(ids, ids + numel(topk_ids));
  for (DLTensor* t : {&sorted, &experts, &total}) {
    for (int64_t i = 0; i < numel(*t); ++i) data_ptr<int32_t>(*t)[i] = 0;
  }
  return kOk;
}

// kreg run / bench inputs for moe.align_block_size are routing ids: every row's K experts
// distinct, drawn over all num_experts (the attribute), not the random fill's [0, 16).
TEST(Harness, AlignBlockSizeExamplesAreRoutingIds) {
  const KernelSpec s =
      spec("moe.align_block_size",
           "align_block_size(Tensor<i32>[T,K] topk_ids, Tensor<i32>(a!)[P] out_sorted_token_ids, "
           "Tensor<i32>(b!)[B] out_expert_ids, Tensor<i32>(c!)[1] out_num_tokens_post_pad, int "
           "num_experts, int block_size, bool ignore_invalid=false) -> ()",
           bind<&align_stub>);
  Registry reg;
  ASSERT_TRUE(reg.add(s).ok());
  auto h = reg.resolve("moe.align_block_size", Target{kCpuDev, DType::kF32});
  ASSERT_TRUE(h.ok()) << h.status().message();
  const int64_t T = 512, K = 8, E = 256, bs = 64;
  const harness::SymbolMap sizes = {
      {"T", T}, {"K", K}, {"P", T * K + E * (bs - 1)}, {"B", (T * K + E * (bs - 1)) / bs + 1}};
  auto attrs = h->attrs({{"num_experts", E}, {"block_size", bs}});
  ASSERT_TRUE(attrs.ok()) << attrs.status().message();
  g_align_ids.clear();
  auto cmp = harness::check_against_reference(reg, *h, sizes, DType::kF32, *attrs, 11);
  ASSERT_TRUE(cmp.ok()) << cmp.status().message();
  ASSERT_EQ(g_align_ids.size(), static_cast<size_t>(T * K));
  std::vector<int> uses(E, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> row(g_align_ids.begin() + t * K, g_align_ids.begin() + (t + 1) * K);
    for (int32_t e : row) {
      ASSERT_TRUE(e >= 0 && e < E) << "token " << t << ": expert " << e;
      ++uses[static_cast<size_t>(e)];
    }
    std::sort(row.begin(), row.end());
    EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t;
  }
  // 4096 uniform picks over 256 experts: 16 each on average; every expert used, none
  // far above the mean (a fill over 16 experts would give 256 each).
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_GT(uses[static_cast<size_t>(e)], 0) << "expert " << e << " never picked";
    EXPECT_LT(uses[static_cast<size_t>(e)], 48) << "expert " << e;
  }
  // The same seed gives the same ids; without attributes (make_example alone) the random
  // fill stays: the table needs num_experts.
  const std::vector<int32_t> first = g_align_ids;
  ASSERT_TRUE(harness::check_against_reference(reg, *h, sizes, DType::kF32, *attrs, 11).ok());
  EXPECT_EQ(g_align_ids, first);
  auto plain = harness::make_example(h->spec(), sizes, DType::kF32, kCpuDev, 11);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const std::vector<double> random_ids = *plain->buffers[0].to_doubles();
  for (double v : random_ids) EXPECT_LT(v, 16.0);
}

KernelStatus decode_stub(Context&, const DLTensor&, const DLTensor&, const DLTensor&,
                         const DLTensor&, const DLTensor&, DLTensor&, double) {
  return kOk;
}

// kreg run / bench inputs for attention.decode are a decode step's: each sequence's pages
// distinct and scattered over the cache, every sequence as long as its table (M * P), not
// the random fill's lengths and page ids in [0, 16).
TEST(Harness, DecodeExamplesAreFullSequencesOnScatteredPages) {
  const KernelSpec s = spec("attention.decode",
                            "decode(Tensor[B,Hq,D] q, Tensor[N,P,Hk,D] k_cache, Tensor[N,P,Hk,D] "
                            "v_cache, Tensor<i32>[B,M] block_table, Tensor<i32>[B] seq_lens, "
                            "Tensor(a!)[B,Hq,D] out, float scale) -> ()",
                            bind<&decode_stub>);
  const int64_t B = 3, M = 40, N = 128, P = 16;
  const harness::SymbolMap sizes = {{"B", B}, {"Hq", 4}, {"D", 8}, {"N", N},
                                    {"P", P}, {"Hk", 2}, {"M", M}};
  auto ex = harness::make_example(s, sizes, DType::kF32, kCpuDev, 5);
  ASSERT_TRUE(ex.ok()) << ex.status().message();
  const std::vector<double> table = *ex->buffer(3)->to_doubles();
  const std::vector<double> lens = *ex->buffer(4)->to_doubles();
  for (double l : lens) EXPECT_EQ(l, static_cast<double>(M * P));
  std::vector<double> all = table;
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "B * M <= N: all distinct";
  EXPECT_GE(all.front(), 0.0);
  EXPECT_LT(all.back(), static_cast<double>(N));
  EXPECT_GT(all.back(), 16.0) << "pages spread over the cache, not the random fill's [0, 16)";
  // The same seed gives the same table.
  auto again = harness::make_example(s, sizes, DType::kF32, kCpuDev, 5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again->buffer(3)->to_doubles(), table);
}

// Routing ids over 2^31 experts take O(K) memory a row (a dense pool would be 16 GiB),
// stay distinct per row and inside int32.
TEST(Harness, RoutingIdsOverHugeExpertCountsNeedNoPool) {
  auto b = harness::Buffer::make(kCpuDev, DType::kI32, {64, 8});
  ASSERT_TRUE(b.ok()) << b.status().message();
  std::mt19937_64 rng(3);
  ASSERT_TRUE(harness::fill_routing_ids(*b, int64_t{1} << 31, rng).ok());
  const std::vector<double> ids = *b->to_doubles();
  for (int64_t t = 0; t < 64; ++t) {
    std::vector<double> row(ids.begin() + t * 8, ids.begin() + t * 8 + 8);
    for (double v : row) {
      EXPECT_GE(v, 0.0);
      EXPECT_LT(v, 2147483648.0);
    }
    std::sort(row.begin(), row.end());
    EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "row " << t;
  }
}

// An integer element outside its dtype (or NaN) is refused, not an undefined conversion.
TEST(Harness, FromDoublesRefusesIntegersOutsideTheirType) {
  auto b = harness::Buffer::make(kCpuDev, DType::kI32, {2});
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->from_doubles({-2147483648.0, 2147483647.0}).ok());
  for (double bad : {2147483648.0, -2147483649.0, std::nan(""), 1e300}) {
    const Status st = b->from_doubles({0.0, bad});
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("element 1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("does not fit i32"), std::string::npos) << st.message();
  }
  auto u = harness::Buffer::make(kCpuDev, DType::kU8, {1});
  EXPECT_FALSE(u->from_doubles({-1.0}).ok());
  EXPECT_TRUE(u->from_doubles({255.0}).ok());
}

TEST(Harness, GraphTimingRefusesCountsBelowOne) {
  int called = 0;
  auto count = [&](int) {
    ++called;
    return OkStatus();
  };
  for (auto [calls, reps] : {std::pair{0, 5}, std::pair{4, 0}, std::pair{-3, 5}}) {
    auto t = harness::time_graph_replays(nullptr, calls, reps, count);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(t.status().message().find("calls (" + std::to_string(calls) + ")"), std::string::npos)
        << t.status().message();
  }
  EXPECT_EQ(called, 0);
}

// The tools' matmul refuses buffers that are not all on one GPU or do not hold the shapes.
TEST(Harness, CublasMatmulRefusesBuffersItCannotMultiply) {
  auto a = harness::Buffer::make(kCpuDev, DType::kF32, {2, 3});
  auto b = harness::Buffer::make(kCpuDev, DType::kF32, {3, 4});
  auto c = harness::Buffer::make(kCpuDev, DType::kF32, {2, 4});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const Status st = harness::cublas_matmul(*a, *b, *c, 2, 4, 3);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("one GPU"), std::string::npos) << st.message();
}

#if defined(KREG_HAVE_CUDA)
// Row-major [5,7] @ [7,3] through cuBLAS against a double loop, f32 and bf16 (inputs exact
// in bf16, so the two differ only by the output's rounding); wrong shapes are refused.
TEST(Harness, CublasMatmulMatchesALoop) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no CUDA device: cuBLAS is not loaded";
  const int64_t m = 5, n = 3, k = 7;
  std::vector<double> av(m * k), bv(k * n);
  for (size_t i = 0; i < av.size(); ++i)
    av[i] = static_cast<double>(static_cast<int>(i % 9) - 4) / 4;
  for (size_t i = 0; i < bv.size(); ++i)
    bv[i] = static_cast<double>(static_cast<int>(i % 5) - 2) / 2;
  std::vector<double> want(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) want[i * n + j] += av[i * k + p] * bv[p * n + j];
  const DLDevice gpu{kDLCUDA, 0};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto a = harness::Buffer::make(gpu, dt, {m, k});
    auto b = harness::Buffer::make(gpu, dt, {k, n});
    auto c = harness::Buffer::make(gpu, dt, {m, n});
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    ASSERT_TRUE(a->from_doubles(av).ok());
    ASSERT_TRUE(b->from_doubles(bv).ok());
    const Status st = harness::cublas_matmul(*a, *b, *c, m, n, k);
    ASSERT_TRUE(st.ok()) << st.message();
    auto got = c->to_doubles();
    ASSERT_TRUE(got.ok());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR((*got)[i], want[i], dt == DType::kF32 ? 1e-6 : 0.02 * (1 + std::fabs(want[i])))
          << "element " << i;
    }
    EXPECT_EQ(harness::cublas_matmul(*a, *b, *c, m, n + 1, k).code(), KREG_INVALID_ARGUMENT);
  }
}

// The calls are captured once and replayed: the lambda runs `calls` times in all, the
// replays leave the last call's bytes, and the times are positive.
TEST(Harness, GraphTimingReplaysTheCapturedCalls) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no CUDA device: the graph timing is not run";
  auto buf = harness::Buffer::make(DLDevice{kDLCUDA, 0}, DType::kU8, {4096});
  ASSERT_TRUE(buf.ok()) << buf.status().message();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int called = 0;
  auto t = harness::time_graph_replays(stream, 5, 7, [&](int i) {
    ++called;
    const cudaError_t e = cudaMemsetAsync(buf->tensor()->data, 10 + i, 4096, stream);
    return e == cudaSuccess ? OkStatus() : Status(KREG_INTERNAL, cudaGetErrorString(e));
  });
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(called, 5);
  EXPECT_GT(t->min_us, 0.0);
  EXPECT_LE(t->min_us, t->median_us);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  auto bytes = buf->to_doubles();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->front(), 14.0);
  EXPECT_EQ(bytes->back(), 14.0);
  cudaStreamDestroy(stream);
}

// A call that fails during the capture comes back as the error, the capture is ended (the
// stream is no longer capturing) and the stream runs work again.
TEST(Harness, GraphTimingEndsTheCaptureOfAFailedCall) {
  if (!harness::gpu_available()) GTEST_SKIP() << "no CUDA device: the graph timing is not run";
  auto buf = harness::Buffer::make(DLDevice{kDLCUDA, 0}, DType::kU8, {256});
  ASSERT_TRUE(buf.ok()) << buf.status().message();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int called = 0;
  auto t = harness::time_graph_replays(stream, 6, 3, [&](int i) {
    ++called;
    if (i == 2) return Status(KREG_INVALID_ARGUMENT, "call 2 refused");
    cudaMemsetAsync(buf->tensor()->data, 1, 256, stream);
    return OkStatus();
  });
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "call 2 refused");
  EXPECT_EQ(called, 3);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(stream, &capturing), cudaSuccess);
  EXPECT_EQ(capturing, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaMemsetAsync(buf->tensor()->data, 3, 256, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(buf->to_doubles()->front(), 3.0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
}  // namespace kreg
