// Every shipped kernel: the CPU references against an independent double-precision
// oracle written here, every GPU implementation against its CPU reference over a shape
// sweep with awkward sizes and misaligned pointers (skipped without a GPU), and bad
// arguments rejected with clear messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;
using harness::SymbolMap;

using namespace test;  // kernel_test.hpp

// ---- The oracle: the ops' math in double, from the rounded inputs ----

using Oracle = std::function<void(const std::vector<std::vector<double>>& in,
                                  std::vector<std::vector<double>>& out, const SymbolMap& s)>;

Oracle norm_oracle(bool fused, bool gemma) {
  return [=](const auto& in, auto& out, const SymbolMap& s) {
    const int64_t T = s.at("T"), H = s.at("H");
    const double eps = 1e-6;
    const auto& w = fused ? in[2] : in[1];
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> row(static_cast<size_t>(H));
      double ss = 0;
      for (int64_t h = 0; h < H; ++h) {
        const size_t i = static_cast<size_t>(t * H + h);
        row[static_cast<size_t>(h)] = fused ? in[0][i] + in[1][i] : in[0][i];
        ss += row[static_cast<size_t>(h)] * row[static_cast<size_t>(h)];
      }
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
      for (int64_t h = 0; h < H; ++h) {
        const size_t i = static_cast<size_t>(t * H + h);
        const double wv = gemma ? 1.0 + w[static_cast<size_t>(h)] : w[static_cast<size_t>(h)];
        const double y = row[static_cast<size_t>(h)] * inv * wv;
        if (fused) {
          out[0][i] = y;                            // x
          out[1][i] = row[static_cast<size_t>(h)];  // residual
        } else {
          out[2][i] = y;
        }
      }
    }
  };
}

Oracle act_oracle(std::function<double(double)> act) {
  return [=](const auto& in, auto& out, const SymbolMap& s) {
    const int64_t T = s.at("T"), D = s.at("D");
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < D; ++d) {
        const double a = in[0][static_cast<size_t>(t * 2 * D + d)];
        const double b = in[0][static_cast<size_t>(t * 2 * D + D + d)];
        out[1][static_cast<size_t>(t * D + d)] = act(a) * b;
      }
    }
  };
}

struct OpCase {
  const char* op;
  bool norm;
  Oracle oracle;
};

std::vector<OpCase> op_cases() {
  const double k = std::sqrt(2.0 / M_PI);
  return {
      {"layernorm.rmsnorm", true, norm_oracle(false, false)},
      {"layernorm.gemma_rmsnorm", true, norm_oracle(false, true)},
      {"layernorm.fused_add_rmsnorm", true, norm_oracle(true, false)},
      {"layernorm.gemma_fused_add_rmsnorm", true, norm_oracle(true, true)},
      {"activation.silu_and_mul", false,
       act_oracle([](double a) { return a / (1 + std::exp(-a)); })},
      {"activation.gelu_and_mul", false,
       act_oracle([](double a) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); })},
      {"activation.gelu_tanh_and_mul", false, act_oracle([k](double a) {
         return 0.5 * a * (1 + std::tanh(k * (a + 0.044715 * a * a * a)));
       })},
  };
}

SymbolMap symbols_for(bool norm, int64_t rows, int64_t width) {
  return norm ? SymbolMap{{"T", rows}, {"H", width}} : SymbolMap{{"T", rows}, {"D", width}};
}

TEST(Kernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> covered;
  for (const auto& c : op_cases()) covered.push_back(c.op);
  std::sort(covered.begin(), covered.end());
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("layernorm.") || id.starts_with("activation.")) shipped.push_back(id);
  }
  EXPECT_EQ(shipped, covered) << "a new op needs an oracle in this file";
}

TEST(Kernels, CpuReferencesMatchTheOracle) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 7}, {2, 64}, {5, 1000}, {1, 4097}};
  uint64_t seed = 11;
  for (const OpCase& c : op_cases()) {
    for (DType dt : dtypes) {
      for (auto [rows, width] : shapes) {
        SCOPED_TRACE(std::string(c.op) + " " + std::string(dtype_name(dt)) + " " +
                     std::to_string(rows) + "x" + std::to_string(width));
        const SymbolMap sym = symbols_for(c.norm, rows, width);
        auto h = registry().resolve(c.op, Target{DLDevice{kDLCPU, 0}, dt}, {std::string("cpu")});
        ASSERT_TRUE(h.ok()) << h.status().message();
        auto args = harness::make_example(h->spec(), sym, dt, DLDevice{kDLCPU, 0}, seed++);
        ASSERT_TRUE(args.ok()) << args.status().message();
        std::vector<std::vector<double>> in, out;
        for (const Buffer& b : args->buffers) in.push_back(values(b));
        out = in;
        c.oracle(in, out, sym);
        ASSERT_TRUE(h->call(args->tensors).ok());
        size_t i = 0;
        for (const Param& p : h->spec().signature.params) {
          if (!p.is_tensor()) continue;
          if (p.written()) {
            auto cmp = harness::compare_values(p.name, values(args->buffers[i]), out[i],
                                               harness::tolerance_for(dt));
            EXPECT_TRUE(cmp.ok()) << p.name << ": " << cmp.mismatches << " mismatches, max_abs "
                                  << cmp.max_abs << ", max_rel " << cmp.max_rel;
          }
          ++i;
        }
      }
    }
  }
}

class GpuKernels : public test::GpuTest {
 protected:
  // PdlChainsReadWhatTheKernelBeforeWrote at one shape.
  void pdl_chain_case(int64_t t, int64_t h);
};

TEST_F(GpuKernels, MatchTheCpuReferenceOverAShapeSweep) {
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  const int64_t rows[] = {1, 3, 64};
  const int64_t norm_widths[] = {1, 7, 8, 64, 100, 1024, 4096, 4097, 7168, 8192, 16384};
  const int64_t act_widths[] = {1, 3, 8, 100, 1024, 4097, 14336};
  uint64_t seed = 100;
  for (const OpCase& c : op_cases()) {
    for (DType dt : dtypes) {
      auto h = registry().resolve(c.op, Target{DLDevice{kDLCUDA, 0}, dt}, {std::string("cuda")});
      ASSERT_TRUE(h.ok()) << h.status().message();
      auto attrs_or = h->attrs({});
      ASSERT_TRUE(attrs_or.ok());
      AttrList no_attrs = std::move(attrs_or).value();
      for (int64_t r : rows) {
        for (int64_t w : c.norm
                             ? std::vector<int64_t>(std::begin(norm_widths), std::end(norm_widths))
                             : std::vector<int64_t>(std::begin(act_widths), std::end(act_widths))) {
          auto cmp = harness::check_against_reference(registry(), *h, symbols_for(c.norm, r, w), dt,
                                                      no_attrs, seed++);
          ASSERT_TRUE(cmp.ok()) << cmp.status().message();
          for (const auto& t : *cmp) {
            EXPECT_TRUE(t.ok()) << c.op << " " << dtype_name(dt) << " " << r << "x" << w << " '"
                                << t.tensor << "': " << t.mismatches << "/" << t.count
                                << " mismatches, max_abs " << t.max_abs;
          }
        }
      }
    }
  }
}

// The JIT norms (plugins/layernorm/rmsnorm_jit.cpp), specialized for each width through
// Target::dims as kreg run does: odd widths take the JIT kernel (every shift of a row
// against the 16-byte boundaries: row * H mod 8 takes every value; the head and tail
// scalars on their own lanes). Launch shapes (jit/rmsnorm_config.h, bf16; layernorm_jit_test
// checks them): short rows several to a block with a last block part empty (T not a
// multiple of 8, 4 or 2 rows a block), 4095 one vector a thread over 512 threads, 4097 and
// 4103 the longest body filling all 2 x 256 slots, 2047 one row of 256 threads, 16399
// three vectors a thread; f32 4097 fills 1024 threads, 4101 two vectors a thread.
TEST_F(GpuKernels, JitNormsMatchTheCpuReference) {
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  // Rows above 256 take the JIT kernel (decode sizes and widths a multiple of the vector
  // go to the AOT kernel through the same handle: the last two).
  const std::pair<int64_t, int64_t> shapes[] = {
      {257, 1},    {300, 7},     {1000, 33},   {640, 100},   {259, 500},  {300, 1001}, {301, 1001},
      {257, 2047}, {300, 4095},  {4099, 4097}, {1030, 4099}, {280, 4101}, {290, 4103}, {300, 5121},
      {260, 8191}, {260, 16399}, {20000, 33},  {64, 4097},   {5, 4096}};
  uint64_t seed = 900;
  int jit_calls = 0;
  for (const OpCase& c : op_cases()) {
    if (!c.norm) continue;
    for (DType dt : dtypes) {
      for (auto [rows, width] : shapes) {
        const SymbolMap sym = symbols_for(true, rows, width);
        Target target{DLDevice{kDLCUDA, 0}, dt};
        for (const auto& [k, v] : sym) target.dims[k] = v;
        auto h = registry().resolve(c.op, target, {std::string("jit")});
        if (!h.ok()) GTEST_SKIP() << "no jit implementation here: " << h.status().message();
        ASSERT_EQ(h->backend(), "jit") << c.op;
        ++jit_calls;
        auto attrs_or = h->attrs({});
        ASSERT_TRUE(attrs_or.ok());
        auto cmp = harness::check_against_reference(registry(), *h, sym, dt, *attrs_or, seed++);
        ASSERT_TRUE(cmp.ok()) << c.op << " " << rows << "x" << width << ": "
                              << cmp.status().message();
        for (const auto& t : *cmp) {
          EXPECT_TRUE(t.ok()) << c.op << " jit " << dtype_name(dt) << " " << rows << "x" << width
                              << " '" << t.tensor << "': " << t.mismatches << "/" << t.count
                              << " mismatches, max_abs " << t.max_abs;
        }
      }
    }
  }
  EXPECT_GT(jit_calls, 0);
}

TEST_F(GpuKernels, MisalignedPointersAndZeroTokens) {
  // Views that start one element into their allocation defeat 16-byte vectors.
  for (const char* op : {"layernorm.rmsnorm", "activation.silu_and_mul"}) {
    const bool norm = std::string(op).starts_with("layernorm");
    const SymbolMap sym = symbols_for(norm, 5, 4096);
    auto h = registry().resolve(op, Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
    ASSERT_TRUE(h.ok());
    auto host = harness::make_example(h->spec(), sym, DType::kBF16, DLDevice{kDLCPU, 0}, 7);
    ASSERT_TRUE(host.ok());
    std::vector<Buffer> padded;
    std::vector<DLTensor> views;
    for (const Buffer& b : host->buffers) {
      auto p = Buffer::make(DLDevice{kDLCUDA, 0}, b.dtype(), {b.numel() + 1});
      ASSERT_TRUE(p.ok());
      auto v = values(b);
      v.insert(v.begin(), 0.5);
      ASSERT_TRUE(p->from_doubles(v).ok());
      padded.push_back(std::move(p).value());
    }
    for (size_t i = 0; i < padded.size(); ++i) {
      DLTensor t = *host->buffers[i].tensor();
      t.device = DLDevice{kDLCUDA, 0};
      t.data = padded[i].tensor()->data;
      t.byte_offset = dtype_size(DType::kBF16);
      views.push_back(t);
    }
    std::vector<DLTensor*> args;
    for (DLTensor& t : views) args.push_back(&t);
    ASSERT_TRUE(h->call(args).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    auto ref =
        registry().resolve(op, Target{DLDevice{kDLCPU, 0}, DType::kBF16}, {std::string("cpu")});
    ASSERT_TRUE(ref->call(host->tensors).ok());
    const size_t out = norm ? 2 : 1;
    auto got = values(padded[out]);
    got.erase(got.begin());
    auto cmp = harness::compare_values("out", got, values(host->buffers[out]),
                                       harness::tolerance_for(DType::kBF16));
    EXPECT_TRUE(cmp.ok()) << op << ": " << cmp.mismatches << " mismatches with misaligned views";

    auto empty = harness::make_example(h->spec(), symbols_for(norm, 0, 64), DType::kBF16,
                                       DLDevice{kDLCUDA, 0}, 1);
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE(h->call(empty->tensors).ok()) << op << " with zero tokens";
    EXPECT_TRUE(harness::device_synchronize().ok());
  }
}

// Programmatic dependent launch (KREG_LAUNCH_PDL): a kernel may start before the one it
// follows has finished, and must wait before reading that kernel's output. A chain whose
// every link reads the previous link's output (behind a large first kernel, so that an
// early read would see stale memory) must give bit for bit what the same chain gives
// without PDL, repeated so that a race has chances to show.
// Two shapes: 8192 x 4096 (two vectors a thread, the signal at the start) and 64 x 7168
// (the decode-size launch: a vector a thread, the signal after the stores).
TEST_F(GpuKernels, PdlChainsReadWhatTheKernelBeforeWrote) {
  for (auto [t, h] : {std::pair<int64_t, int64_t>{8192, 4096}, {64, 7168}}) {
    SCOPED_TRACE("T=" + std::to_string(t) + " H=" + std::to_string(h));
    pdl_chain_case(t, h);
  }
}

void GpuKernels::pdl_chain_case(int64_t t, int64_t h) {
  auto make = [&](std::vector<int64_t> shape, uint64_t seed) {
    auto b = Buffer::make(kGpu, DType::kBF16, std::move(shape));
    EXPECT_TRUE(b.ok());
    std::mt19937_64 rng(seed);
    EXPECT_TRUE(b->fill_random(rng).ok());
    return std::move(b).value();
  };
  auto rms = handle("layernorm.rmsnorm", "cuda");
  auto fused = handle("layernorm.fused_add_rmsnorm", "cuda");
  auto silu = handle("activation.silu_and_mul", "cuda");
  Buffer x = make({t, h}, 1), w = make({h}, 2);
  auto run_chain = [&](uint64_t flags) {
    Buffer a = make({t, h}, 3), b = make({t, h}, 4), res = make({t, h}, 5);
    Buffer c = make({t, h / 2}, 6);
    const CallOptions first{nullptr, nullptr, 0};
    const CallOptions next{nullptr, nullptr, flags};
    for (int i = 0; i < 4; ++i) {
      DLTensor* s1[] = {x.tensor(), w.tensor(), a.tensor()};
      EXPECT_TRUE(rms.call(s1, {}, first).ok());
      DLTensor* s2[] = {a.tensor(), w.tensor(), b.tensor()};  // reads a
      EXPECT_TRUE(rms.call(s2, {}, next).ok());
      DLTensor* s3[] = {b.tensor(), c.tensor()};  // reads b (as [T, 2*D])
      EXPECT_TRUE(silu.call(s3, {}, next).ok());
      DLTensor* s4[] = {b.tensor(), res.tensor(), w.tensor()};  // rewrites b after s3 read it
      EXPECT_TRUE(fused.call(s4, {}, next).ok());
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{test::bytes_of(b), test::bytes_of(c),
                                             test::bytes_of(res)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 5);
  // KREG_LAUNCH_STABLE_INPUTS: the weight, which no link writes, may be read (rmsnorm:
  // prefetched into L1) before the wait; x and the residual still come after it.
  test::expect_pdl_chain_matches_plain(run_chain, 5,
                                       uint64_t{KREG_LAUNCH_PDL | KREG_LAUNCH_STABLE_INPUTS});
}

TEST_F(GpuKernels, CpuTensorsToTheCudaPathAreRefused) {
  auto h = registry().resolve("layernorm.rmsnorm", Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
  ASSERT_TRUE(h.ok());
  auto cpu_args =
      harness::make_example(h->spec(), {{"T", 2}, {"H", 64}}, DType::kBF16, DLDevice{kDLCPU, 0}, 1);
  Status st = h->call(cpu_args->tensors);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("is on cpu:0, but backend cuda runs on cuda tensors"),
            std::string::npos)
      << st.message();
}

TEST(Kernels, BadArgumentsAreRejectedBeforeTheKernelRuns) {
  auto h = registry().resolve("activation.silu_and_mul", Target{DLDevice{kDLCPU, 0}, DType::kF32},
                              {std::string("cpu")});
  ASSERT_TRUE(h.ok());
  auto args =
      harness::make_example(h->spec(), {{"T", 2}, {"D", 8}}, DType::kF32, DLDevice{kDLCPU, 0}, 1);
  ASSERT_TRUE(args.ok());
  auto wrong_out = Buffer::make(DLDevice{kDLCPU, 0}, DType::kF32, {2, 9});
  DLTensor* bad_shape[] = {args->tensors[0], wrong_out->tensor()};
  Status st = h->call(bad_shape);
  EXPECT_NE(st.message().find("argument 'out' (tensor 2 of 2) has shape [2,9], expected [T,D]"),
            std::string::npos)
      << st.message();
  auto f64 = Buffer::make(DLDevice{kDLCPU, 0}, DType::kF64, {2, 16});
  DLTensor* bad_dtype[] = {f64->tensor(), args->tensors[1]};
  st = h->call(bad_dtype);
  EXPECT_NE(st.message().find("has dtype f64, expected f32|f16|bf16"), std::string::npos)
      << st.message();
  // The output was poisoned and no call succeeded: it must still be all NaN.
  for (double v : values(args->buffers[1])) ASSERT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace kreg
