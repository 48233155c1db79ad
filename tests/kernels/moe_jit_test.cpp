// The JIT moe.topk_softmax (plugins/moe/topk_softmax_jit.cpp, jit/topk_softmax.cu.jit):
// which shapes its launcher keeps (topk_config) and that NVRTC compiles its source for
// sm_90 (no GPU needed: these run wherever NVRTC is), then, on a GPU, the jit backend
// forced through the registry against the CPU reference (ids exactly; weights within
// fp32 rounding, the CPU's softmax sum runs in another order) and against the AOT CUDA
// kernel (ids and weights bit for bit: the same fp32 operations in the same order) over
// E in {64, 128, 256, 384 (handed to the AOT kernel), 512}, K in {1, 2, 8}, T in
// {1, 7, 4096}, bf16/f16/f32, with and without correction_bias and renormalize; then
// ties, signed zeros, NaN and infinities, softcapping, misaligned views, T = 0, bad
// arguments, and one handle serving every T of its specialization.
//
// Every process compiles into a fresh KREG_JIT_CACHE (a temporary folder, removed at
// exit), so the specializations are really built by NVRTC here, never read from a cache
// another build left.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../../plugins/moe/jit/topk_softmax_config.h"
#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

namespace fs = std::filesystem;
using harness::Buffer;
using namespace test;  // kernel_test.hpp

constexpr const char* kOp = "moe.topk_softmax";

// A private JIT cache folder for this process (kernel_test.hpp).
[[maybe_unused]] ::testing::Environment* const kJitCacheDir =
    ::testing::AddGlobalTestEnvironment(new JitCacheDir("kreg-moe-jit"));

// ---- Which shapes the JIT kernel takes (CPU) ----

TEST(MoeJitConfig, TakesPowerOfTwoExpertsOfWholeVectorsUpTo512AndKUpTo32) {
  using kreg_jit::topk_config;
  // E = 256 bf16 (the target): one 16-byte vector a lane, one token a warp.
  auto c = topk_config(256, 8, 2);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.vec, 8);
  EXPECT_EQ(c.lanes, 32);
  EXPECT_EQ(c.chunks, 1);
  EXPECT_EQ(c.rows, 4);
  // Fewer than 32 vectors a token: that many lanes, several tokens a warp.
  c = topk_config(64, 2, 2);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.lanes, 8);
  EXPECT_EQ(c.rows, 16);
  c = topk_config(8, 8, 2);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.lanes, 1);
  EXPECT_EQ(c.rows, 128);
  // More than 32: the AOT kernel's chunks (vector c * 32 + lane).
  c = topk_config(512, 32, 4);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.vec, 4);
  EXPECT_EQ(c.lanes, 32);
  EXPECT_EQ(c.chunks, 4);
  EXPECT_TRUE(topk_config(128, 1, 4).ok);
  EXPECT_TRUE(topk_config(4, 4, 4).ok);
  // Handed to the AOT kernel: not a power of two, below a vector, above 512, K > 32,
  // K > E, K < 1, and element sizes the op has not.
  for (long long e : {384LL, 160LL, 96LL, 100LL, 1024LL, 0LL, -256LL}) {
    EXPECT_FALSE(topk_config(e, 8, 2).ok) << "E = " << e;
  }
  EXPECT_FALSE(topk_config(4, 2, 2).ok) << "E below one bf16 vector";
  EXPECT_FALSE(topk_config(2, 2, 4).ok) << "E below one f32 vector";
  EXPECT_FALSE(topk_config(256, 33, 2).ok);
  EXPECT_FALSE(topk_config(16, 17, 2).ok);
  EXPECT_FALSE(topk_config(256, 0, 2).ok);
  EXPECT_FALSE(topk_config(256, 8, 8).ok);
  EXPECT_FALSE(topk_config(9223372036854775807LL, 9223372036854775807LL, 2).ok);
}

// ---- The source compiles through NVRTC (CPU: NVRTC needs no GPU) ----

const KernelSpec* jit_spec() {
  for (const KernelSpec* s : registry().implementations(kOp)) {
    if (s->backend == "jit") return s;
  }
  return nullptr;
}

TEST(MoeJitSource, CompilesThroughNvrtcForSm90) {
  const KernelSpec* spec = jit_spec();
  if (spec == nullptr) {
    GTEST_SKIP() << kOp << " has no jit implementation in this build (built without CUDA)";
  }
  ASSERT_TRUE(spec->jit) << "the loaded library carries the jit source";
  EXPECT_EQ(spec->jit->source_name, "topk_softmax.cu.jit");
  EXPECT_EQ(spec->jit->params, (std::vector<std::string>{"E", "K", "dtype"}));
  if (auto v = jit::nvrtc_version(); !v) GTEST_SKIP() << "no NVRTC here: " << v.status().message();
  std::string pattern = (fs::temp_directory_path() / "kreg-moe-nvrtc-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const fs::path dir = pattern;
  {
    jit::Cache cache(dir / "cache");
    struct Build {
      int64_t E, K;
      DType dtype;
      const char* arch;
    };
    // The target shape for sm_90 and sm_90a; other layouts (several tokens a warp, one
    // lane a token, four chunks); sm_75's shuffle path (no redux.sync); and E = 384,
    // which the launcher hands to the AOT kernel: it still compiles (to an empty kernel),
    // so resolving it prints no NVRTC error.
    const Build builds[] = {
        {256, 8, DType::kBF16, "sm_90"},  {256, 8, DType::kBF16, "sm_90a"},
        {64, 2, DType::kF16, "sm_90a"},   {8, 8, DType::kBF16, "sm_90a"},
        {512, 32, DType::kF32, "sm_90a"}, {256, 8, DType::kBF16, "sm_75"},
        {384, 8, DType::kBF16, "sm_90a"},
    };
    for (const Build& b : builds) {
      SCOPED_TRACE("E=" + std::to_string(b.E) + " K=" + std::to_string(b.K) + " " +
                   std::string(dtype_name(b.dtype)) + " " + b.arch);
      auto s = jit::specialize(*spec, {{"T", 4}, {"E", b.E}, {"K", b.K}}, b.dtype);
      ASSERT_TRUE(s.ok()) << s.status().message();
      auto built = jit::build(*spec, *spec->jit, *s, b.arch, cache);
      ASSERT_TRUE(built.ok()) << built.status().message();
      EXPECT_TRUE(built->compiled) << "a fresh cache: NVRTC ran";
      ASSERT_GT(built->cubin.size(), 4u);
      EXPECT_EQ(built->cubin.substr(0, 4), std::string("\x7f") + "ELF") << "a cubin";
      EXPECT_NE(built->lowered.find("topk_softmax"), std::string::npos) << built->lowered;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// ---- GPU: the jit backend through the registry ----

struct Routing {
  std::vector<double> w, ids;
};

// Output sentinels: neither a weight nor an id any backend writes (not NaN either, so a
// NaN weight that was written compares as written).
constexpr double kUnwrittenWeight = -1234.5;
constexpr double kUnwrittenId = -77;

// Runs kOp on `backend` ("cpu", "cuda" or "jit", resolved against these very tensors)
// with copies of the host inputs; `bias` may be null (omitted). A "jit" run checks it
// got a jit specialization.
Result<Routing> run_topk(const std::string& backend, const Buffer& gating, const Buffer* bias,
                         int64_t K, bool renormalize, double softcap) {
  const DLDevice dev = backend == "cpu" ? kCpu : kGpu;
  const int64_t T = gating.shape()[0];
  auto g = Buffer::make(dev, gating.dtype(), gating.shape());
  if (!g) return g.status();
  if (Status st = g->copy_from(gating); !st.ok()) return st;
  Buffer b;
  if (bias != nullptr) {
    auto bb = Buffer::make(dev, DType::kF32, bias->shape());
    if (!bb) return bb.status();
    if (Status st = bb->copy_from(*bias); !st.ok()) return st;
    b = std::move(bb).value();
  }
  auto w = Buffer::make(dev, DType::kF32, {T, K});
  auto ids = Buffer::make(dev, DType::kI32, {T, K});
  if (!w) return w.status();
  if (!ids) return ids.status();
  if (Status st = w->from_doubles(std::vector<double>(at(T * K), kUnwrittenWeight)); !st.ok())
    return st;
  if (Status st = ids->from_doubles(std::vector<double>(at(T * K), kUnwrittenId)); !st.ok())
    return st;
  DLTensor* args[] = {g->tensor(), bias != nullptr ? b.tensor() : nullptr, w->tensor(),
                      ids->tensor()};
  auto h = registry().resolve(kOp, args, {backend});
  if (!h) return h.status();
  if (h->backend() != backend) {
    return Status(KREG_INTERNAL, "resolved backend " + h->backend() + ", not " + backend);
  }
  if (backend == "jit" && !h->specialized()) {
    return Status(KREG_INTERNAL, "the jit handle is not a specialization");
  }
  auto al = h->attrs({{"renormalize", renormalize}, {"softcapping", softcap}});
  if (!al) return al.status();
  if (Status st = h->call(args, al->view()); !st.ok()) return st;
  if (Status st = harness::device_synchronize(); !st.ok()) return st;
  auto wv = w->to_doubles();
  auto iv = ids->to_doubles();
  if (!wv) return wv.status();
  if (!iv) return iv.status();
  return Routing{std::move(wv).value(), std::move(iv).value()};
}

// Equal element for element; NaN equals NaN (a NaN row's weights are NaN everywhere).
void expect_identical(const std::string& what, const std::vector<double>& got,
                      const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]));
    if (!same && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ; first at " << first
                     << ": got " << (bad ? got[first] : 0) << ", want " << (bad ? want[first] : 0);
}

const harness::Tolerance kWeightTol{1e-5, 1e-4};  // f32 weights, fp32 math in another order

// Within fp32 rounding of each other; NaN matches only NaN (a NaN row on both sides).
void expect_close_weights(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    const bool ok = std::isnan(a) || std::isnan(b)
                        ? std::isnan(a) && std::isnan(b)
                        : std::fabs(a - b) <= kWeightTol.atol + kWeightTol.rtol * std::fabs(b);
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "out_weights vs the CPU reference: " << bad << " of " << got.size()
                     << " beyond fp32 rounding; first at " << first << ": got "
                     << (bad ? got[first] : 0) << ", want " << (bad ? want[first] : 0);
}

Buffer host_buffer(DType dt, std::vector<int64_t> shape, const std::vector<double>& v) {
  auto b = Buffer::make(kCpu, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return Buffer{};
  EXPECT_TRUE(b->from_doubles(v).ok());
  return std::move(b).value();
}

// Random logits: uniform magnitudes in [0.05, 4], random signs (never 0). Rounded to
// bf16 (8 bits of mantissa) many rows hold equal values: ties, which every backend
// breaks to the lower expert.
std::vector<double> random_logits(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> mag(0.05, 4.0);
  std::vector<double> v(n);
  for (double& x : v) x = (rng() & 1 ? 1 : -1) * mag(rng);
  return v;
}

std::vector<double> random_bias(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> mag(0.001, 0.5);
  std::vector<double> v(n);
  for (double& x : v) x = (rng() & 1 ? 1 : -1) * mag(rng);
  return v;
}

const DType kDtypes[] = {DType::kBF16, DType::kF16, DType::kF32};

std::string label(DType dt, int64_t T, int64_t E, int64_t K, bool bias, bool renorm,
                  double cap = 0) {
  return std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " E=" + std::to_string(E) +
         " K=" + std::to_string(K) + (bias ? " bias" : "") + (renorm ? " renormalize" : "") +
         (cap > 0 ? " softcap=" + std::to_string(cap) : "");
}

// The three backends on one input: jit ids equal the CPU's and the AOT kernel's, jit
// weights equal the AOT kernel's bit for bit and the CPU's within fp32 rounding.
void expect_jit_matches(const Buffer& g, const Buffer* bias, int64_t K, bool renorm, double cap,
                        bool ids_vs_cpu = true) {
  auto jit = run_topk("jit", g, bias, K, renorm, cap);
  ASSERT_TRUE(jit.ok()) << jit.status().message();
  auto aot = run_topk("cuda", g, bias, K, renorm, cap);
  ASSERT_TRUE(aot.ok()) << aot.status().message();
  auto cpu = run_topk("cpu", g, bias, K, renorm, cap);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  expect_identical("out_ids vs the AOT kernel", jit->ids, aot->ids);
  expect_identical("out_weights vs the AOT kernel", jit->w, aot->w);
  if (ids_vs_cpu) expect_identical("out_ids vs the CPU reference", jit->ids, cpu->ids);
  expect_close_weights(jit->w, cpu->w);
}

class MoeJitGpu : public test::GpuTest {};

TEST_F(MoeJitGpu, MatchesTheCpuReferenceAndTheAotKernel) {
  std::mt19937_64 rng(41);
  const int64_t experts[] = {64, 128, 256, 384, 512};
  const int64_t ks[] = {1, 2, 8};
  const int64_t tokens[] = {1, 7, 4096};
  for (int64_t E : experts) {
    const Buffer bias = host_buffer(DType::kF32, {E}, random_bias(at(E), rng));
    for (int64_t T : tokens) {
      const auto logits = random_logits(at(T * E), rng);
      for (DType dt : kDtypes) {
        const Buffer g = host_buffer(dt, {T, E}, logits);
        for (int64_t K : ks) {
          for (bool with_bias : {false, true}) {
            for (bool renorm : {false, true}) {
              SCOPED_TRACE(label(dt, T, E, K, with_bias, renorm));
              expect_jit_matches(g, with_bias ? &bias : nullptr, K, renorm, 0.0);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST_F(MoeJitGpu, EveryLayoutAndTheLargestK) {
  // One lane a token (E = 8 bf16, E = 4 f32), two and four chunks a lane, K = 32 (the
  // most the JIT kernel takes), K = E, and K > 32 (AOT).
  std::mt19937_64 rng(43);
  const std::pair<int64_t, int64_t> shapes[] = {{8, 8},    {4, 4},    {16, 3},  {32, 32},
                                                {512, 32}, {256, 32}, {64, 64}, {128, 40}};
  for (auto [E, K] : shapes) {
    const Buffer bias = host_buffer(DType::kF32, {E}, random_bias(at(E), rng));
    for (DType dt : kDtypes) {
      const Buffer g = host_buffer(dt, {257, E}, random_logits(at(257 * E), rng));
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(label(dt, 257, E, K, with_bias, true));
        expect_jit_matches(g, with_bias ? &bias : nullptr, K, true, 0.0);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(MoeJitGpu, TiesAndSignedZerosGoToTheLowerExpert) {
  // Logits from 9 values, -0 and +0 among them (equal keys: -0 == +0), and a bias on a
  // grid, so that keys tie inside a lane, across lanes and across tokens of one warp.
  std::mt19937_64 rng(47);
  const double grid[] = {-0.0, 0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 0.25};
  for (int64_t E : {8, 64, 256, 512}) {
    std::vector<double> b(at(E));
    for (double& x : b) x = static_cast<double>(static_cast<int>(rng() % 5) - 2) / 4.0;
    const Buffer bias = host_buffer(DType::kF32, {E}, b);
    std::vector<double> logits(at(300 * E));
    for (double& x : logits) x = grid[rng() % 9];
    for (DType dt : kDtypes) {
      const Buffer g = host_buffer(dt, {300, E}, logits);
      for (int64_t K : {1, 8}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(label(dt, 300, E, K, with_bias, false));
          expect_jit_matches(g, with_bias ? &bias : nullptr, K, false, 0.0);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(MoeJitGpu, NanAndInfinitiesAsTheCpuReference) {
  // NaN keys count as -inf (picked after every other expert); a NaN or +inf logit makes
  // the row's softmax NaN; -inf logits weigh 0.
  const int64_t E = 64, K = 8, T = 4;
  std::mt19937_64 rng(53);
  auto v = random_logits(at(T * E), rng);
  v[3] = std::nan("");                                              // token 0: one NaN
  v[E + 5] = std::numeric_limits<double>::infinity();               // token 1: +inf
  for (int64_t e = 0; e < E; e += 2) v[at(2 * E + e)] = -INFINITY;  // token 2: half -inf
  for (int64_t e = 0; e < E; ++e) v[at(3 * E + e)] = std::nan("");  // token 3: all NaN
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Buffer g = host_buffer(dt, {T, E}, v);
    expect_jit_matches(g, nullptr, K, true, 0.0);
  }
}

TEST_F(MoeJitGpu, Softcapping) {
  // tanh on the GPU and on the CPU may differ by an ulp, so with a bias (keys off the
  // logit grid) a near tie may order differently on the CPU: there, ids are compared
  // with the AOT kernel only. Without a bias the keys are far apart or exactly equal.
  std::mt19937_64 rng(59);
  for (auto [E, K] : {std::pair<int64_t, int64_t>{256, 8}, {64, 2}, {512, 8}}) {
    const Buffer bias = host_buffer(DType::kF32, {E}, random_bias(at(E), rng));
    for (DType dt : kDtypes) {
      const Buffer g = host_buffer(dt, {1000, E}, random_logits(at(1000 * E), rng));
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(label(dt, 1000, E, K, with_bias, true, 3.0));
        expect_jit_matches(g, with_bias ? &bias : nullptr, K, true, 3.0, !with_bias);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// A [T, E] view `offset` elements into a larger device buffer.
struct View {
  Buffer storage;
  DLTensor t{};
  int64_t shape[2] = {0, 0};
};

TEST_F(MoeJitGpu, MisalignedViewsTakeTheAotKernel) {
  // gating one element into its allocation, or correction_bias one float into its: the
  // JIT kernel's 16-byte loads cannot read them; the launcher hands them to the AOT
  // kernel, and the results are still the reference's.
  const int64_t T = 500, E = 256, K = 8;
  std::mt19937_64 rng(61);
  const auto logits = random_logits(at(T * E), rng);
  const auto bias = random_bias(at(E), rng);
  for (DType dt : kDtypes) {
    for (bool shift_gating : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (shift_gating ? " gating" : " bias") +
                   " misaligned");
      const Buffer g_host = host_buffer(dt, {T, E}, logits);
      const Buffer b_host = host_buffer(DType::kF32, {E}, bias);
      auto cpu = run_topk("cpu", g_host, &b_host, K, true, 0.0);
      ASSERT_TRUE(cpu.ok()) << cpu.status().message();

      std::vector<double> gv = logits, bv = bias;
      if (shift_gating) gv.insert(gv.begin(), 0.5);
      if (!shift_gating) bv.insert(bv.begin(), 0.5);
      auto g = Buffer::make(kGpu, dt, {static_cast<int64_t>(gv.size())});
      auto b = Buffer::make(kGpu, DType::kF32, {static_cast<int64_t>(bv.size())});
      ASSERT_TRUE(g.ok() && b.ok());
      ASSERT_TRUE(g->from_doubles(gv).ok());
      ASSERT_TRUE(b->from_doubles(bv).ok());
      DLTensor gt = *g->tensor();
      int64_t gshape[2] = {T, E};
      gt.ndim = 2;
      gt.shape = gshape;
      gt.strides = nullptr;
      gt.byte_offset = shift_gating ? dtype_size(dt) : 0;
      DLTensor bt = *b->tensor();
      int64_t bshape[1] = {E};
      bt.shape = bshape;
      bt.byte_offset = shift_gating ? 0 : sizeof(float);
      auto w = Buffer::make(kGpu, DType::kF32, {T, K});
      auto ids = Buffer::make(kGpu, DType::kI32, {T, K});
      ASSERT_TRUE(w.ok() && ids.ok());
      ASSERT_TRUE(w->poison().ok());
      ASSERT_TRUE(ids->poison().ok());
      DLTensor* args[] = {&gt, &bt, w->tensor(), ids->tensor()};
      auto h = registry().resolve(kOp, args, {std::string("jit")});
      ASSERT_TRUE(h.ok()) << h.status().message();
      ASSERT_EQ(h->backend(), "jit");
      auto al = h->attrs({{"renormalize", true}});
      ASSERT_TRUE(al.ok());
      ASSERT_TRUE(h->call(args, al->view()).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      expect_identical("out_ids vs the CPU reference", *ids->to_doubles(), cpu->ids);
      expect_close_weights(*w->to_doubles(), cpu->w);
    }
  }
}

TEST_F(MoeJitGpu, OneHandleServesEveryTokenCountOfItsSpecialization) {
  // The specialization pins E, K and the dtype, not T: one handle runs T = 7 and T = 3000;
  // tensors of another E are refused by it.
  std::mt19937_64 rng(67);
  const int64_t E = 256, K = 8;
  auto make = [&](int64_t T, int64_t e) {
    auto g = Buffer::make(kGpu, DType::kBF16, {T, e});
    EXPECT_TRUE(g->from_doubles(random_logits(at(T * e), rng)).ok());
    auto w = Buffer::make(kGpu, DType::kF32, {T, K});
    auto ids = Buffer::make(kGpu, DType::kI32, {T, K});
    std::vector<Buffer> v;
    v.push_back(std::move(g).value());
    v.push_back(std::move(w).value());
    v.push_back(std::move(ids).value());
    return v;
  };
  auto small = make(7, E);
  DLTensor* sargs[] = {small[0].tensor(), nullptr, small[1].tensor(), small[2].tensor()};
  auto h = registry().resolve(kOp, sargs, {std::string("jit")});
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_TRUE(h->specialized());
  auto al = h->attrs({{"renormalize", true}});
  ASSERT_TRUE(al.ok());
  ASSERT_TRUE(h->call(sargs, al->view()).ok());
  auto big = make(3000, E);
  DLTensor* bargs[] = {big[0].tensor(), nullptr, big[1].tensor(), big[2].tensor()};
  ASSERT_TRUE(h->accepts_tensors(bargs));
  ASSERT_TRUE(h->call(bargs, al->view()).ok());
  ASSERT_TRUE(harness::device_synchronize().ok());
  // The big call's results are the reference's (the gating copied back to the host).
  auto g_host = Buffer::make(kCpu, DType::kBF16, {3000, E});
  ASSERT_TRUE(g_host->copy_from(big[0]).ok());
  auto cpu = run_topk("cpu", *g_host, nullptr, K, true, 0.0);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  expect_identical("out_ids vs the CPU reference", *big[2].to_doubles(), cpu->ids);
  expect_close_weights(*big[1].to_doubles(), cpu->w);
  auto other = make(7, 128);
  DLTensor* oargs[] = {other[0].tensor(), nullptr, other[1].tensor(), other[2].tensor()};
  EXPECT_FALSE(h->accepts_tensors(oargs));
  EXPECT_FALSE(h->call(oargs, al->view()).ok()) << "E = 128 through the E = 256 handle";
}

TEST_F(MoeJitGpu, ZeroTokensAndBadArguments) {
  std::mt19937_64 rng(71);
  // T = 0: nothing to do, no error.
  const Buffer empty = host_buffer(DType::kBF16, {0, 256}, {});
  auto none = run_topk("jit", empty, nullptr, 8, true, 0.0);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->w.empty());
  // A negative softcap at a shape the JIT kernel takes: the launcher's own check, the
  // same message as the AOT kernel's.
  const Buffer g = host_buffer(DType::kBF16, {4, 256}, random_logits(4 * 256, rng));
  auto neg = run_topk("jit", g, nullptr, 8, false, -1.0);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("softcapping"), std::string::npos)
      << neg.status().message();
  auto neg_aot = run_topk("cuda", g, nullptr, 8, false, -1.0);
  ASSERT_FALSE(neg_aot.ok());
  // "moe.topk_softmax (jit): <message>" and "... (cuda): <message>": the same message.
  const auto text = [](const std::string& m) {
    const size_t at = m.find("): ");
    return at == std::string::npos ? m : m.substr(at + 3);
  };
  EXPECT_EQ(text(neg.status().message()), text(neg_aot.status().message()));
  // K > E: the JIT kernel does not take it; the AOT kernel refuses it, naming the limit.
  const Buffer g8 = host_buffer(DType::kBF16, {4, 8}, random_logits(4 * 8, rng));
  auto big_k = run_topk("jit", g8, nullptr, 16, false, 0.0);
  ASSERT_FALSE(big_k.ok());
  EXPECT_NE(big_k.status().message().find("top-k = 16"), std::string::npos)
      << big_k.status().message();
  // E > 512.
  const Buffer g1024 = host_buffer(DType::kF32, {2, 1024}, random_logits(2 * 1024, rng));
  auto wide = run_topk("jit", g1024, nullptr, 8, false, 0.0);
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("E = 1024"), std::string::npos) << wide.status().message();
}

}  // namespace
}  // namespace kreg
