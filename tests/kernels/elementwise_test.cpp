// The elementwise group: every CPU reference against an independent double-precision
// oracle written here (random inputs, awkward sizes, saturating and infinite values),
// every CUDA kernel against its CPU reference over a shape sweep with misaligned views,
// in-place calls and PDL chains (skipped without a GPU), and bad arguments rejected with
// messages that name the op and the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- The ops: inputs, attribute and the oracle (double, from the rounded inputs) ----

struct OpCase {
  const char* op;
  int inputs;         // 1: (x, out); 2: (x, gate, out)
  const char* attr;   // the float attribute's name, or null
  double attr_value;  // its value in the sweeps
  double scale;       // inputs uniform in +-scale (softcap: past the cap, to saturate)
  std::function<double(double x, double y)> oracle;
};

std::vector<OpCase> op_cases() {
  return {
      {"elementwise.softcap", 1, "cap", 5.0, 40.0,
       [](double x, double) { return 5.0 * std::tanh(x / 5.0); }},
      {"elementwise.sigmoid_gate_mul", 2, nullptr, 0, 12.0,
       [](double x, double g) { return x / (1.0 + std::exp(-g)); }},
      {"elementwise.add_constant", 1, "c", -1.375, 4.0,
       [](double x, double) { return x + -1.375; }},
  };
}

// `n` values uniform in +-[scale / 64, scale] (never zero), with a fixed seed.
std::vector<double> random_values(int64_t n, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(scale / 64, scale);
  std::vector<double> v(at(n));
  for (double& e : v) e = (rng() & 1) ? mag(rng) : -mag(rng);
  return v;
}

Buffer make_buffer(DLDevice dev, DType dt, std::vector<int64_t> shape,
                   const std::vector<double>& v) {
  auto b = Buffer::make(dev, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return Buffer{};
  EXPECT_TRUE(b->from_doubles(v).ok());
  return std::move(b).value();
}

Buffer poisoned(DLDevice dev, DType dt, std::vector<int64_t> shape) {
  auto b = Buffer::make(dev, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return Buffer{};
  EXPECT_TRUE(b->poison().ok());
  return std::move(b).value();
}

// The handle of `op` on `backend` for `dt`.
KernelHandle resolve(const char* op, const std::string& backend, DType dt) {
  auto h = registry().resolve(op, Target{backend == "cpu" ? kCpu : kGpu, dt}, {backend});
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : KernelHandle{};
}

Status call(const KernelHandle& h, const OpCase& c, std::vector<DLTensor*> tensors, double attr,
            uint64_t flags = 0) {
  std::vector<kreg_attr> attrs;
  if (c.attr) attrs.push_back(float_attr(attr));
  return h.call(tensors, attrs, CallOptions{nullptr, nullptr, flags});
}

// One call's buffers, on `dev`: x (and gate), then a poisoned out.
struct Args {
  std::vector<Buffer> buffers;
  std::vector<DLTensor*> tensors() {
    std::vector<DLTensor*> t;
    for (Buffer& b : buffers) t.push_back(b.tensor());
    return t;
  }
};

Args make_args(const OpCase& c, DLDevice dev, DType dt, int64_t rows, int64_t width,
               uint64_t seed) {
  Args a;
  const int64_t n = rows * width;
  a.buffers.push_back(make_buffer(dev, dt, {rows, width}, random_values(n, c.scale, seed)));
  if (c.inputs == 2) {
    a.buffers.push_back(make_buffer(dev, dt, {rows, width}, random_values(n, c.scale, seed + 1)));
  }
  a.buffers.push_back(poisoned(dev, dt, {rows, width}));
  return a;
}

// The oracle's output for the (rounded) inputs of `a`.
std::vector<double> expected(const OpCase& c, Args& a) {
  const std::vector<double> x = values(a.buffers[0]);
  const std::vector<double> y = c.inputs == 2 ? values(a.buffers[1]) : std::vector<double>{};
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = c.oracle(x[i], y.empty() ? 0.0 : y[i]);
  return want;
}

void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, DType dt) {
  auto cmp = harness::compare_values("out", got, want, harness::tolerance_for(dt));
  EXPECT_TRUE(cmp.ok()) << what << ": " << cmp.mismatches << "/" << cmp.count
                        << " mismatches, max_abs " << cmp.max_abs << ", max_rel " << cmp.max_rel;
}

const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
const std::pair<int64_t, int64_t> kShapes[] = {{1, 1},    {3, 7},    {2, 64},
                                               {5, 1000}, {1, 4097}, {7, 33}};

TEST(Elementwise, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> covered;
  for (const auto& c : op_cases()) covered.push_back(c.op);
  std::sort(covered.begin(), covered.end());
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("elementwise.")) shipped.push_back(id);
  }
  EXPECT_EQ(shipped, covered) << "a new op needs an oracle in this file";
}

TEST(Elementwise, CpuReferencesMatchTheOracle) {
  uint64_t seed = 11;
  for (const OpCase& c : op_cases()) {
    for (DType dt : kDtypes) {
      const KernelHandle h = resolve(c.op, "cpu", dt);
      ASSERT_TRUE(h.valid());
      for (auto [rows, width] : kShapes) {
        const std::string what = std::string(c.op) + " " + std::string(dtype_name(dt)) + " " +
                                 std::to_string(rows) + "x" + std::to_string(width);
        Args a = make_args(c, kCpu, dt, rows, width, seed += 2);
        ASSERT_TRUE(call(h, c, a.tensors(), c.attr_value).ok()) << what;
        expect_close(what, values(a.buffers.back()), expected(c, a), dt);
      }
    }
  }
}

TEST(Elementwise, ZeroTokensWriteNothing) {
  for (const OpCase& c : op_cases()) {
    Args a = make_args(c, kCpu, DType::kBF16, 0, 64, 1);
    EXPECT_TRUE(call(resolve(c.op, "cpu", DType::kBF16), c, a.tensors(), c.attr_value).ok())
        << c.op;
  }
}

// tanh(x / cap) saturates: huge and infinite x give exactly +-cap (never NaN), tiny x
// gives x (tanh(u) ~ u: no cancellation), NaN stays NaN.
TEST(Elementwise, SoftcapSaturatesAndKeepsSmallValues) {
  const OpCase c = op_cases()[0];
  const std::vector<double> x = {1e30, -1e30, kInf, -kInf, 3e4, -3e4, 1e-3, -2.5e-4, 0.0};
  for (DType dt : kDtypes) {
    Args a;
    a.buffers.push_back(make_buffer(kCpu, dt, {1, static_cast<int64_t>(x.size())}, x));
    a.buffers.push_back(poisoned(kCpu, dt, {1, static_cast<int64_t>(x.size())}));
    ASSERT_TRUE(call(resolve(c.op, "cpu", dt), c, a.tensors(), 30.0).ok());
    const std::vector<double> in = values(a.buffers[0]), got = values(a.buffers[1]);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(got[i], in[i] > 0 ? 30.0 : -30.0) << dtype_name(dt) << " x = " << in[i];
    }
    for (size_t i = 6; i < x.size(); ++i) {
      EXPECT_NEAR(got[i], in[i], std::fabs(in[i]) * 1e-2) << dtype_name(dt) << " x = " << in[i];
    }
  }
}

// sigmoid(g) at the ends: g = -inf (or very negative) gives 0, g = +inf gives x.
TEST(Elementwise, SigmoidGateMulAtInfiniteGates) {
  const OpCase c = op_cases()[1];
  const std::vector<double> x = {1.5, -2.0, 3.0, -0.75};
  const std::vector<double> g = {-kInf, -200.0, kInf, 200.0};
  for (DType dt : kDtypes) {
    Args a;
    a.buffers.push_back(make_buffer(kCpu, dt, {2, 2}, x));
    a.buffers.push_back(make_buffer(kCpu, dt, {2, 2}, g));
    a.buffers.push_back(poisoned(kCpu, dt, {2, 2}));
    ASSERT_TRUE(call(resolve(c.op, "cpu", dt), c, a.tensors(), 0).ok());
    const std::vector<double> got = values(a.buffers[2]);
    EXPECT_EQ(got, (std::vector<double>{0.0, -0.0, 3.0, -0.75})) << dtype_name(dt);
  }
}

// ---- Bad arguments ----

std::string message_of(const Status& st) { return st.message(); }

TEST(Elementwise, BadAttributesAreRefusedNamingTheOpAndTheAttribute) {
  struct Bad {
    int op;
    double value;
    const char* text;
  };
  const Bad bad[] = {
      {0, 0.0, "elementwise.softcap: cap = 0 must be a finite number > 0"},
      {0, -2.0, "elementwise.softcap: cap = -2 must be a finite number > 0"},
      {0, std::nan(""), "elementwise.softcap: cap = nan must be"},
      {0, kInf, "elementwise.softcap: cap = inf must be"},
      {0, 1e300, "elementwise.softcap: cap = 1e+300 must be"},  // past fp32
      {0, 1e-50, "elementwise.softcap: cap = 1e-50 must be"},   // 0 as fp32
      {0, 1e-39, "elementwise.softcap: cap = 1e-39 must be"},   // 1/cap overflows
      {2, kInf, "elementwise.add_constant: c = inf must be finite (as fp32)"},
      {2, -1e300, "elementwise.add_constant: c = -1e+300 must be finite"},
      {2, std::nan(""), "elementwise.add_constant: c = nan must be finite"},
  };
  const auto cases = op_cases();
  std::vector<std::string> backends = {"cpu"};
  if (harness::gpu_available()) backends.push_back("cuda");
  for (const std::string& backend : backends) {
    const DLDevice dev = backend == "cpu" ? kCpu : kGpu;
    for (const Bad& b : bad) {
      const OpCase& c = cases[at(b.op)];
      Args a = make_args(c, dev, DType::kF32, 2, 8, 3);
      const Status st = call(resolve(c.op, backend, DType::kF32), c, a.tensors(), b.value);
      EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << backend << " " << b.text;
      EXPECT_NE(message_of(st).find(b.text), std::string::npos) << backend << ": " << st.message();
      for (double v : values(a.buffers.back())) ASSERT_TRUE(std::isnan(v)) << "out was written";
    }
  }
}

TEST(Elementwise, BadTensorsAreRefusedBeforeTheKernelRuns) {
  const auto cases = op_cases();
  const OpCase& gated = cases[1];
  const KernelHandle h = resolve(gated.op, "cpu", DType::kF32);
  Args a = make_args(gated, kCpu, DType::kF32, 2, 8, 5);
  // gate of another dtype than x
  Buffer bf = make_buffer(kCpu, DType::kBF16, {2, 8}, random_values(16, 1, 1));
  Status st = call(h, gated, {a.buffers[0].tensor(), bf.tensor(), a.buffers[2].tensor()}, 0);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("gate"), std::string::npos) << st.message();
  // gate of another shape
  Buffer wide = make_buffer(kCpu, DType::kF32, {2, 9}, random_values(18, 1, 1));
  st = call(h, gated, {a.buffers[0].tensor(), wide.tensor(), a.buffers[2].tensor()}, 0);
  EXPECT_NE(st.message().find("argument 'gate' (tensor 2 of 3) has shape [2,9], expected [T,H]"),
            std::string::npos)
      << st.message();
  // a dtype outside bf16|f16|f32
  const OpCase& softcap = cases[0];
  Buffer f64x = make_buffer(kCpu, DType::kF64, {2, 8}, random_values(16, 1, 1));
  Buffer f64o = poisoned(kCpu, DType::kF64, {2, 8});
  st = call(resolve(softcap.op, "cpu", DType::kF32), softcap, {f64x.tensor(), f64o.tensor()}, 1);
  EXPECT_NE(st.message().find("has dtype f64, expected f32|f16|bf16"), std::string::npos)
      << st.message();
  // wrong rank
  Buffer flat = make_buffer(kCpu, DType::kF32, {16}, random_values(16, 1, 1));
  st = call(resolve(softcap.op, "cpu", DType::kF32), softcap,
            {flat.tensor(), a.buffers[2].tensor()}, 1);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << st.message();
  for (double v : values(a.buffers[2])) ASSERT_TRUE(std::isnan(v)) << "out was written";
}

// ---- CUDA against the CPU reference ----

class GpuElementwise : public test::GpuTest {};

// Runs `c` on the GPU and on the CPU from the same inputs; `x_offset` > 0 starts every
// tensor that many elements into its allocation (no 16-byte vectors), `in_place` writes
// out into x.
void check_gpu(const OpCase& c, DType dt, int64_t rows, int64_t width, uint64_t seed,
               int64_t offset, bool in_place, double attr) {
  const std::string what = std::string(c.op) + " " + std::string(dtype_name(dt)) + " " +
                           std::to_string(rows) + "x" + std::to_string(width) +
                           (offset ? " offset " + std::to_string(offset) : "") +
                           (in_place ? " in place" : "");
  Args host = make_args(c, kCpu, dt, rows, width, seed);
  // The device copies, each inside a larger allocation at `offset` elements.
  std::vector<Buffer> dev;
  std::vector<DLTensor> views;
  for (Buffer& b : host.buffers) {
    std::vector<double> v = values(b);
    v.insert(v.begin(), at(offset), 0.5);
    dev.push_back(make_buffer(kGpu, dt, {b.numel() + offset}, v));
  }
  for (size_t i = 0; i < dev.size(); ++i) {
    DLTensor t = *host.buffers[i].tensor();
    t.device = kGpu;
    t.data = dev[i].tensor()->data;
    t.byte_offset = static_cast<uint64_t>(offset) * dtype_size(dt);
    views.push_back(t);
  }
  std::vector<DLTensor*> args;
  for (DLTensor& t : views) args.push_back(&t);
  if (in_place) args.back() = args[0];
  ASSERT_TRUE(call(resolve(c.op, "cuda", dt), c, args, attr).ok()) << what;
  ASSERT_TRUE(harness::device_synchronize().ok());
  ASSERT_TRUE(call(resolve(c.op, "cpu", dt), c, host.tensors(), attr).ok()) << what;
  std::vector<double> got = values(in_place ? dev[0] : dev.back());
  got.erase(got.begin(), got.begin() + offset);
  expect_close(what, got, values(host.buffers.back()), dt);
}

TEST_F(GpuElementwise, MatchTheCpuReferenceOverAShapeSweep) {
  const int64_t rows[] = {1, 3, 64};
  const int64_t widths[] = {1, 3, 8, 100, 1024, 4097, 8192};
  uint64_t seed = 100;
  for (const OpCase& c : op_cases()) {
    for (DType dt : kDtypes) {
      for (int64_t r : rows) {
        for (int64_t w : widths) check_gpu(c, dt, r, w, seed += 2, 0, false, c.attr_value);
      }
    }
  }
}

TEST_F(GpuElementwise, MisalignedInPlaceAndEmptyCalls) {
  uint64_t seed = 500;
  for (const OpCase& c : op_cases()) {
    for (DType dt : kDtypes) {
      for (int64_t offset : {1, 2, 3})
        check_gpu(c, dt, 5, 4096, seed += 2, offset, false, c.attr_value);
      check_gpu(c, dt, 7, 1000, seed += 2, 0, true, c.attr_value);
      check_gpu(c, dt, 2, 77, seed += 2, 1, true, c.attr_value);
      Args empty = make_args(c, kGpu, dt, 0, 64, 1);
      EXPECT_TRUE(call(resolve(c.op, "cuda", dt), c, empty.tensors(), c.attr_value).ok()) << c.op;
    }
  }
  EXPECT_TRUE(harness::device_synchronize().ok());
}

TEST_F(GpuElementwise, SoftcapSaturatesLikeTheReference) {
  const OpCase c = op_cases()[0];
  const std::vector<double> x = {1e30, -1e30, kInf,  -kInf, 3e4,  -3e4, 1e-3,  -2.5e-4,
                                 0.0,  29.0,  -31.0, 45.0,  60.0, 90.0, 150.0, 300.0};
  for (DType dt : kDtypes) {
    const int64_t n = static_cast<int64_t>(x.size());
    Buffer xd = make_buffer(kGpu, dt, {2, n / 2}, x), od = poisoned(kGpu, dt, {2, n / 2});
    ASSERT_TRUE(call(resolve(c.op, "cuda", dt), c, {xd.tensor(), od.tensor()}, 30.0).ok());
    const std::vector<double> in = values(xd), got = values(od);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(got[i], in[i] > 0 ? 30.0 : -30.0) << dtype_name(dt) << " x = " << in[i];
    }
    std::vector<double> want(in.size());
    for (size_t i = 0; i < in.size(); ++i) want[i] = 30.0 * std::tanh(in[i] / 30.0);
    expect_close(std::string("softcap specials ") + std::string(dtype_name(dt)), got, want, dt);
  }
}

// With KREG_LAUNCH_PDL a kernel may start before the one it follows has finished; a chain
// whose links read the previous link's output (behind a large first kernel) must give bit
// for bit what it gives with plain launches.
TEST_F(GpuElementwise, PdlChainsReadWhatTheKernelBeforeWrote) {
  const auto cases = op_cases();
  const int64_t t = 8192, h = 4096;
  const DType dt = DType::kBF16;
  auto fresh = [&](uint64_t seed) {
    return make_buffer(kGpu, dt, {t, h}, random_values(t * h, 4.0, seed));
  };
  const KernelHandle add = resolve(cases[2].op, "cuda", dt);
  const KernelHandle cap = resolve(cases[0].op, "cuda", dt);
  const KernelHandle gate = resolve(cases[1].op, "cuda", dt);
  Buffer x = fresh(1);
  auto run_chain = [&](uint64_t flags) {
    Buffer a = fresh(2), b = fresh(3), out = fresh(4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(call(add, cases[2], {x.tensor(), a.tensor()}, 0.5).ok());
      EXPECT_TRUE(call(cap, cases[0], {a.tensor(), b.tensor()}, 3.0, flags).ok());
      EXPECT_TRUE(call(gate, cases[1], {b.tensor(), a.tensor(), out.tensor()}, 0, flags).ok());
      EXPECT_TRUE(call(add, cases[2], {out.tensor(), a.tensor()}, -0.25, flags).ok());
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{bytes_of(a), bytes_of(b), bytes_of(out)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

}  // namespace
}  // namespace kreg
