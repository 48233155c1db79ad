// The quantization group (the ops of plugins/quantization/ but hadamard_transform, which
// has its own test): the CPU references against independent oracles written here (scales
// from a double-precision max, FP8 rounding by a brute-force nearest of the 254 finite
// E4M3 codes with ties to the even code, int8 by nearest with ties to even, UE8M0 by a
// search over the powers of two), every CUDA implementation against its CPU reference byte
// for byte over awkward shapes, misaligned views, T = 131072 and all three float dtypes
// (skipped without a GPU), and bad arguments rejected with messages naming the op and the
// argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/device/fp8_e4m3.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

constexpr const char* kGroupFp8 = "quantization.per_token_group_quant_fp8";
constexpr const char* kGroupFp8Col = "quantization.per_token_group_quant_fp8_col_major";
constexpr const char* kSiluFp8 = "quantization.silu_and_mul_per_token_group_quant_fp8";
constexpr const char* kSiluFp8Col = "quantization.silu_and_mul_per_token_group_quant_fp8_col_major";
constexpr const char* kGroupInt8 = "quantization.per_token_group_quant_int8";
constexpr const char* kTokenFp8 = "quantization.per_token_quant_fp8";
constexpr const char* kTensorFp8 = "quantization.per_tensor_quant_fp8";

const DType kFloatDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

kreg_attr bool_attr(bool v) {
  kreg_attr a{};
  a.type = KREG_ATTR_BOOL;
  a.value.i = v ? 1 : 0;
  return a;
}

// ---- Tensors: an owning buffer and the view the op sees ----

// FP8 tensors live in a u8 buffer (read back as bytes) viewed as f8e4m3; `offset` elements
// at the front misalign the view.
struct Arg {
  Buffer buf;
  DType view_dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  DLTensor view() {
    DLTensor t = *buf.tensor();
    t.dtype = to_dl(view_dtype);
    t.ndim = static_cast<int32_t>(shape.size());
    t.shape = shape.data();
    t.byte_offset = static_cast<uint64_t>(offset) * dtype_size(buf.dtype());
    return t;
  }
  std::vector<double> values() const {
    auto v = buf.to_doubles();
    EXPECT_TRUE(v.ok()) << v.status().message();
    if (!v.ok()) return {};
    return std::vector<double>(v->begin() + offset, v->end());
  }
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Arg make_arg(DLDevice device, DType dt, std::vector<int64_t> shape, std::vector<double> vals,
             int64_t offset = 0) {
  const DType storage = dt == DType::kF8E4M3 ? DType::kU8 : dt;
  vals.insert(vals.begin(), static_cast<size_t>(offset), 0.0);
  auto b = Buffer::make(device, storage, {static_cast<int64_t>(vals.size())});
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return Arg{Buffer{}, dt, std::move(shape), offset};
  EXPECT_TRUE(b->from_doubles(vals).ok());
  return Arg{std::move(b).value(), dt, std::move(shape), offset};
}

// An output filled with `fill` (a poison the op must overwrite, or a canary it must keep).
Arg make_out(DLDevice device, DType dt, std::vector<int64_t> shape, double fill,
             int64_t offset = 0) {
  const int64_t n = numel_of(shape);
  return make_arg(device, dt, std::move(shape), std::vector<double>(static_cast<size_t>(n), fill),
                  offset);
}

// Random values exactly representable in every float dtype (8 significant bits, exponents
// in [-12, 6]), never zero; each group gets its own magnitude range, so the scales differ.
std::vector<double> random_values(std::mt19937_64& rng, int64_t n, int64_t run) {
  std::vector<double> v(static_cast<size_t>(n));
  std::uniform_int_distribution<int> man(128, 255), ex(-12, 4), spread(0, 3);
  int base = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (run > 0 && i % run == 0) base = ex(rng);
    const double m = std::ldexp(static_cast<double>(man(rng)), base - spread(rng) - 7);
    v[static_cast<size_t>(i)] = (rng() & 1) ? m : -m;
  }
  return v;
}

// ---- The oracles ----

// E4M3 ("fn") code -> value, from the format's definition.
double e4m3_value(int code) {
  const int exp = (code >> 3) & 0xf, man = code & 7;
  const double mag = exp == 0 ? man * std::ldexp(1.0, -9) : (8 + man) * std::ldexp(1.0, exp - 10);
  return (code & 0x80) ? -mag : mag;
}

// The nearest finite E4M3 code of q (q within +-448: the contract clamps first), ties to
// the even code, by trying all codes of q's sign.
int oracle_e4m3(double q) {
  const int sign = std::signbit(q) ? 0x80 : 0;
  int best = -1;
  double best_d = 0;
  for (int c = sign; c < sign + 0x7f; ++c) {
    const double d = std::fabs(e4m3_value(c) - q);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

// Nearest integer, ties to even, from floor.
double oracle_rint(double q) {
  const double f = std::floor(q);
  const double d = q - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

// The smallest power of two >= s (s > 0), searched over every float exponent.
double oracle_pow2_at_least(double s) {
  for (int k = -149; k <= 127; ++k) {
    if (std::ldexp(1.0, k) >= s) return std::ldexp(1.0, k);
  }
  return INFINITY;
}

double silu_mul(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

struct GroupCase {
  const char* op;
  bool silu = false, col_major = false, int8 = false;
};

const GroupCase kGroupCases[] = {
    {kGroupFp8, false, false, false}, {kGroupFp8Col, false, true, false},
    {kSiluFp8, true, false, false},   {kSiluFp8Col, true, true, false},
    {kGroupInt8, false, false, true},
};

// The oracle's scales (as [T, G]) for one group call, and its check of the output codes.
struct GroupExpect {
  std::vector<double> scales;     // [T, G], exact (or, fused, the double-precision value)
  std::vector<double> unrounded;  // before UE8M0
  std::vector<double> y;          // the quantized values, [T, H]
};

GroupExpect group_oracle(const GroupCase& c, const std::vector<double>& x, int64_t T, int64_t H,
                         int64_t gs, double eps, bool ue8m0) {
  const int64_t G = H / gs, xc = c.silu ? 2 * H : H;
  const double qmax = c.int8 ? 127.0 : 448.0;
  const double eps_f = static_cast<float>(eps);
  GroupExpect e;
  e.y.resize(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double a = x[static_cast<size_t>(t * xc + h)];
      e.y[static_cast<size_t>(t * H + h)] =
          c.silu ? silu_mul(a, x[static_cast<size_t>(t * xc + H + h)]) : a;
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      double amax = 0;
      for (int64_t h = g * gs; h < (g + 1) * gs; ++h) {
        amax = std::max(amax, std::fabs(e.y[static_cast<size_t>(t * H + h)]));
      }
      // One fp32 division of fp32 operands, done in double and rounded once: exact.
      const double s = static_cast<float>(std::max(amax, eps_f) / qmax);
      e.unrounded.push_back(s);
      e.scales.push_back(ue8m0 ? oracle_pow2_at_least(s) : s);
    }
  }
  return e;
}

// The expected code (fp8: byte, int8: value) of y under scale s: the fp32 quotient (a
// double quotient of two floats rounded once to float is the fp32 quotient), clamped.
double expected_code(bool int8, double y, double s) {
  const double qmax = int8 ? 127.0 : 448.0;
  const double q = std::clamp(static_cast<double>(static_cast<float>(y / s)), -qmax, qmax);
  return int8 ? oracle_rint(q) : static_cast<double>(oracle_e4m3(q));
}

// Checks a group op's outputs (out as codes, scales as stored) against the oracle. Fused
// ops compute y in fp32 (about 1e-7 relative from the double y): their scales are checked
// to 2e-6 and their codes may be either neighbour of a rounding boundary.
void check_group(const GroupCase& c, const GroupExpect& e, const std::vector<double>& out,
                 const std::vector<double>& scales, int64_t T, int64_t H, int64_t gs, int64_t P,
                 bool ue8m0, const std::string& what) {
  const int64_t G = H / gs;
  int bad = 0;
  for (int64_t t = 0; t < T && bad < 10; ++t) {
    for (int64_t g = 0; g < G && bad < 10; ++g) {
      const double want = e.scales[static_cast<size_t>(t * G + g)];
      const double got = scales[static_cast<size_t>(c.col_major ? g * P + t : t * G + g)];
      bool ok = got == want;
      if (c.silu && !ok) {
        const double u = e.unrounded[static_cast<size_t>(t * G + g)];
        ok = ue8m0 ? (got == oracle_pow2_at_least(u * (1 - 2e-6)) ||
                      got == oracle_pow2_at_least(u * (1 + 2e-6)))
                   : std::fabs(got - want) <= 2e-6 * want;
      }
      if (ue8m0) {
        int e2 = 0;
        ok = ok && std::isfinite(got) && std::frexp(got, &e2) == 0.5;
      }
      if (!ok) {
        ++bad;
        ADD_FAILURE() << what << ": scale[t=" << t << ", g=" << g << "] = " << got << ", expected "
                      << want;
        continue;
      }
      for (int64_t h = g * gs; h < (g + 1) * gs; ++h) {
        const double y = e.y[static_cast<size_t>(t * H + h)];
        const double o = out[static_cast<size_t>(t * H + h)];
        bool hit = o == expected_code(c.int8, y, got);
        if (c.silu && !hit) {
          hit = o == expected_code(c.int8, y * (1 - 1e-5), got) ||
                o == expected_code(c.int8, y * (1 + 1e-5), got);
        }
        if (!hit) {
          ++bad;
          ADD_FAILURE() << what << ": out[t=" << t << ", h=" << h << "] = " << o << ", expected "
                        << expected_code(c.int8, y, got) << " (y = " << y << ", s = " << got << ")";
          break;
        }
      }
    }
  }
}

// One group call's tensors.
struct GroupCall {
  Arg x, out, scales;
  int64_t P = 0;
  Status call(const KernelHandle& h, int64_t gs, double eps, bool ue8m0, bool int8) {
    DLTensor v[] = {x.view(), out.view(), scales.view()};
    DLTensor* args[] = {&v[0], &v[1], &v[2]};
    if (int8) {
      const kreg_attr attrs[] = {int_attr(gs), float_attr(eps)};
      return h.call(args, attrs);
    }
    const kreg_attr attrs[] = {int_attr(gs), float_attr(eps), bool_attr(ue8m0)};
    return h.call(args, attrs);
  }
};

// x values, then the call's tensors on `device`. Col-major scales get P = T rounded up to
// 4 (SGLang's TMA alignment) with a canary in the padding; outputs are poisoned.
GroupCall make_group_call(const GroupCase& c, DLDevice device, DType dt,
                          const std::vector<double>& xv, int64_t T, int64_t H, int64_t gs,
                          int64_t offset = 0) {
  const int64_t G = H / gs;
  const int64_t P = (T + 3) / 4 * 4;
  GroupCall call{make_arg(device, dt, {T, c.silu ? 2 * H : H}, xv, offset),
                 make_out(device, c.int8 ? DType::kI8 : DType::kF8E4M3, {T, H},
                          c.int8 ? -128.0 : 0x7f, offset),
                 c.col_major ? make_out(device, DType::kF32, {G, P}, -7.0, offset)
                             : make_out(device, DType::kF32, {T, G}, NAN, offset),
                 P};
  return call;
}

struct GroupShape {
  int64_t T, H, gs;
};

// Awkward shapes: one row, odd T, group sizes from 8 to 512, groups that are not a power
// of two (40, 100: the scalar path), a width not a multiple of 8 (H = 40 with gs = 40,
// H = 200 with gs = 100).
const GroupShape kGroupShapes[] = {{1, 128, 128},  {5, 384, 128}, {3, 96, 32},   {7, 48, 16},
                                   {2, 24, 8},     {4, 40, 40},   {3, 200, 100}, {2, 512, 256},
                                   {3, 1024, 512}, {6, 64, 64}};

TEST(QuantizationKernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> covered = {kGroupFp8, kGroupFp8Col, kGroupInt8, kTensorFp8,
                                      kTokenFp8, kSiluFp8,     kSiluFp8Col};
  std::sort(covered.begin(), covered.end());
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    // hadamard_transform is tested in hadamard_test.cpp.
    if (id.starts_with("quantization.") && id != "quantization.hadamard_transform") {
      shipped.push_back(id);
    }
  }
  std::sort(shipped.begin(), shipped.end());
  EXPECT_EQ(shipped, covered) << "a new quantization op needs an oracle in this file";
}

TEST(QuantizationOracle, E4m3OracleAgreesWithTheSharedConversion) {
  // The oracle and kreg/device/fp8_e4m3.hpp (CUDA's SATFINITE conversion on the host) on
  // every midpoint, its neighbours and random values.
  std::vector<double> probes = {0.0, -0.0, 448.0, -448.0, 0x1p-10, 0x1p-9, 0x3p-11, 1.0625};
  for (int c = 0; c < 0x7e; ++c) {
    const double mid = (e4m3_value(c) + e4m3_value(c + 1)) / 2;
    for (double p : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9)}) {
      probes.push_back(p);
      probes.push_back(-p);
    }
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-448.0, 448.0);
  for (int i = 0; i < 20000; ++i) probes.push_back(u(rng) * (i % 2 ? 1.0 : 1.0 / 256));
  for (double p : probes) {
    const auto f = static_cast<float>(p);
    ASSERT_EQ(device::float_to_e4m3(f), oracle_e4m3(f)) << "q = " << f;
  }
}

TEST(QuantizationCpu, GroupOpsMatchTheOracle) {
  uint64_t seed = 1;
  for (const GroupCase& c : kGroupCases) {
    const KernelHandle h = handle(c.op, "cpu");
    for (DType dt : kFloatDtypes) {
      for (const GroupShape& s : kGroupShapes) {
        for (bool ue8m0 : {false, true}) {
          if (c.int8 && ue8m0) continue;
          std::mt19937_64 rng(seed++);
          const int64_t xc = c.silu ? 2 * s.H : s.H;
          auto xv = random_values(rng, s.T * xc, s.gs);
          const std::string what = std::string(c.op) + " " + std::string(dtype_name(dt)) +
                                   " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                                   " gs=" + std::to_string(s.gs) + (ue8m0 ? " ue8m0" : "");
          GroupCall call = make_group_call(c, kCpu, dt, xv, s.T, s.H, s.gs);
          ASSERT_TRUE(call.call(h, s.gs, 1e-10, ue8m0, c.int8).ok()) << what;
          const auto e = group_oracle(c, xv, s.T, s.H, s.gs, 1e-10, ue8m0);
          const auto scales = call.scales.values();
          check_group(c, e, call.out.values(), scales, s.T, s.H, s.gs, call.P, ue8m0, what);
          if (c.col_major) {
            // The TMA padding columns T..P-1 keep their canary.
            for (int64_t g = 0; g < s.H / s.gs; ++g) {
              for (int64_t t = s.T; t < call.P; ++t) {
                EXPECT_EQ(scales[static_cast<size_t>(g * call.P + t)], -7.0) << what;
              }
            }
          }
        }
      }
    }
  }
}

TEST(QuantizationCpu, Ue8m0ScalesArePowersOfTwoAndZeroGroupsTakeEps) {
  // Zero groups (eps decides), tiny groups (subnormal scales with a tiny eps) and a
  // group just above a power of two: the UE8M0 scale is the smallest power of two >= s,
  // never NaN or infinite, and the codes are the oracle's.
  const int64_t T = 3, H = 64, gs = 16;
  std::vector<double> xv(static_cast<size_t>(T * H));
  std::mt19937_64 rng(77);
  auto r = random_values(rng, T * H, gs);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = r[i];
  for (int64_t h = 0; h < gs; ++h) xv[static_cast<size_t>(h)] = 0.0;                        // zero
  for (int64_t h = gs; h < 2 * gs; ++h) xv[static_cast<size_t>(h)] = std::ldexp(1.0, -24);  // tiny
  xv[static_cast<size_t>(2 * gs)] = 450.0;  // s = 450 / 448, just above 1: UE8M0 gives 2
  for (double eps : {1e-10, 1e-4, 1e-40}) {
    for (const GroupCase& c : {kGroupCases[0], kGroupCases[1]}) {
      const KernelHandle h = handle(c.op, "cpu");
      for (DType dt : kFloatDtypes) {
        const std::vector<double>& x = xv;
        GroupCall call = make_group_call(c, kCpu, dt, x, T, H, gs);
        ASSERT_TRUE(call.call(h, gs, eps, true, false).ok());
        const auto e = group_oracle(c, x, T, H, gs, eps, true);
        const auto scales = call.scales.values();
        check_group(c, e, call.out.values(), scales, T, H, gs, call.P, true,
                    std::string(c.op) + " eps=" + std::to_string(eps));
        const double zero_scale = scales[0];
        const double eps_scale =
            static_cast<float>(static_cast<double>(static_cast<float>(eps)) / 448.0);
        EXPECT_EQ(zero_scale, oracle_pow2_at_least(eps_scale)) << "eps = " << eps;
        EXPECT_EQ(scales[c.col_major ? static_cast<size_t>(call.P) * 2 : 2], 2.0)
            << "eps = " << eps;
        EXPECT_GE(zero_scale, static_cast<float>(eps) / 448.0);
      }
    }
  }
}

TEST(QuantizationCpu, PerTokenMatchesTheOracle) {
  const KernelHandle h = handle(kTokenFp8, "cpu");
  uint64_t seed = 100;
  for (DType dt : kFloatDtypes) {
    for (auto [T, H] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 7}, {5, 100}, {3, 4104}, {2, 1}, {0, 16}, {4, 9000}}) {
      std::mt19937_64 rng(seed++);
      auto xv = random_values(rng, T * H, H);
      Arg x = make_arg(kCpu, dt, {T, H}, xv);
      Arg out = make_out(kCpu, DType::kF8E4M3, {T, H}, 0x7f);
      Arg sc = make_out(kCpu, DType::kF32, {T}, NAN);
      DLTensor v[] = {x.view(), out.view(), sc.view()};
      DLTensor* args[] = {&v[0], &v[1], &v[2]};
      ASSERT_TRUE(h.call(args).ok());
      const auto o = out.values(), s = sc.values();
      for (int64_t t = 0; t < T; ++t) {
        double amax = 0;
        for (int64_t c = 0; c < H; ++c)
          amax = std::max(amax, std::fabs(xv[static_cast<size_t>(t * H + c)]));
        const double want = static_cast<float>(std::max(amax, static_cast<double>(1e-10f)) / 448.0);
        ASSERT_EQ(s[static_cast<size_t>(t)], want) << "row " << t;
        for (int64_t c = 0; c < H; ++c) {
          const size_t i = static_cast<size_t>(t * H + c);
          ASSERT_EQ(o[i], expected_code(false, xv[i], want)) << "row " << t << " col " << c;
        }
      }
    }
  }
}

TEST(QuantizationCpu, PerTensorMatchesTheOracle) {
  const KernelHandle h = handle(kTensorFp8, "cpu");
  uint64_t seed = 200;
  for (DType dt : kFloatDtypes) {
    for (auto [T, H] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {5, 100}, {3, 1000}}) {
      for (bool is_static : {false, true}) {
        std::mt19937_64 rng(seed++);
        auto xv = random_values(rng, T * H, 0);
        Arg x = make_arg(kCpu, dt, {T, H}, xv);
        Arg out = make_out(kCpu, DType::kF8E4M3, {T, H}, 0x7f);
        const double given = 0.0078125 * 3;
        Arg sc = make_arg(kCpu, DType::kF32, {1}, {is_static ? given : NAN});
        DLTensor v[] = {x.view(), out.view(), sc.view()};
        DLTensor* args[] = {&v[0], &v[1], &v[2]};
        const kreg_attr attrs[] = {bool_attr(is_static)};
        ASSERT_TRUE(h.call(args, attrs).ok());
        double amax = 0;
        for (double a : xv) amax = std::max(amax, std::fabs(a));
        const double want =
            is_static ? given
                      : static_cast<float>(std::max(amax, static_cast<double>(1e-10f)) / 448.0);
        ASSERT_EQ(sc.values()[0], want);
        const auto o = out.values();
        for (size_t i = 0; i < xv.size(); ++i) {
          ASSERT_EQ(o[i], expected_code(false, xv[i], want)) << i;
        }
      }
    }
  }
}

TEST(QuantizationCpu, EmptyBatchesAreNoOps) {
  for (const GroupCase& c : kGroupCases) {
    const KernelHandle h = handle(c.op, "cpu");
    GroupCall call = make_group_call(c, kCpu, DType::kBF16, {}, 0, 256, 128);
    EXPECT_TRUE(call.call(h, 128, 1e-10, false, c.int8).ok()) << c.op;
  }
  const KernelHandle h = handle(kTensorFp8, "cpu");
  Arg x = make_arg(kCpu, DType::kBF16, {0, 16}, {});
  Arg out = make_out(kCpu, DType::kF8E4M3, {0, 16}, 0);
  Arg sc = make_arg(kCpu, DType::kF32, {1}, {5.0});
  DLTensor v[] = {x.view(), out.view(), sc.view()};
  DLTensor* args[] = {&v[0], &v[1], &v[2]};
  EXPECT_TRUE(h.call(args).ok());
  EXPECT_EQ(sc.values()[0], 5.0);  // an empty x leaves the scale as it is
}

// ---- Bad arguments ----

void expect_error(Status st, const std::string& a, const std::string& b) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(a), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(b), std::string::npos) << st.message();
}

TEST(QuantizationBadArgs, GroupAttributesAndShapes) {
  const KernelHandle h = handle(kGroupFp8, "cpu");
  const GroupCase c = kGroupCases[0];
  std::mt19937_64 rng(9);
  auto xv = random_values(rng, 2 * 256, 128);
  {
    GroupCall call = make_group_call(c, kCpu, DType::kBF16, xv, 2, 256, 128);
    expect_error(call.call(h, 0, 1e-10, false, false), kGroupFp8, "group_size");
    expect_error(call.call(h, -128, 1e-10, false, false), kGroupFp8, "group_size");
    expect_error(call.call(h, 96, 1e-10, false, false), kGroupFp8, "group_size");  // 256 % 96
    expect_error(call.call(h, 64, 1e-10, false, false), kGroupFp8, "out_scales");  // G = 4 != 2
    expect_error(call.call(h, 128, 0.0, false, false), kGroupFp8, "eps");
    expect_error(call.call(h, 128, -1.0, false, false), kGroupFp8, "eps");
    expect_error(call.call(h, 128, NAN, false, false), kGroupFp8, "eps");
    expect_error(call.call(h, 128, 1e-50, false, false), kGroupFp8, "eps");  // 0 in fp32
  }
  {
    // Col-major scales with P < T.
    const KernelHandle hc = handle(kGroupFp8Col, "cpu");
    GroupCall call = make_group_call(kGroupCases[1], kCpu, DType::kBF16, xv, 2, 256, 128);
    call.scales.shape = {2, 1};
    expect_error(call.call(hc, 128, 1e-10, false, false), kGroupFp8Col, "out_scales");
  }
  {
    // Wrong dtypes: an int x, a bf16 out, f16 scales; a wrong rank.
    GroupCall call = make_group_call(c, kCpu, DType::kBF16, xv, 2, 256, 128);
    call.out.view_dtype = DType::kBF16;
    EXPECT_FALSE(call.call(h, 128, 1e-10, false, false).ok());
    GroupCall call2 = make_group_call(c, kCpu, DType::kBF16, xv, 2, 256, 128);
    call2.scales.view_dtype = DType::kF16;
    expect_error(call2.call(h, 128, 1e-10, false, false), "quantization", "out_scales");
    GroupCall call3 = make_group_call(c, kCpu, DType::kI32, xv, 2, 256, 128);
    expect_error(call3.call(h, 128, 1e-10, false, false), "quantization", "x");
    GroupCall call4 = make_group_call(c, kCpu, DType::kBF16, xv, 2, 256, 128);
    call4.out.shape = {2, 128};
    expect_error(call4.call(h, 128, 1e-10, false, false), "quantization", "out");
  }
  {
    // The fused op's x must be [T, 2H].
    const KernelHandle hs = handle(kSiluFp8, "cpu");
    GroupCall call = make_group_call(kGroupCases[2], kCpu, DType::kBF16,
                                     random_values(rng, 2 * 512, 128), 2, 256, 128);
    call.x.shape = {2, 256};
    call.x.buf = make_arg(kCpu, DType::kBF16, {2 * 256}, random_values(rng, 512, 128)).buf;
    expect_error(call.call(hs, 128, 1e-10, false, false), "quantization", "x");
  }
}

TEST(QuantizationBadArgs, PerTokenAndPerTensorShapes) {
  std::mt19937_64 rng(10);
  auto xv = random_values(rng, 4 * 16, 0);
  Arg x = make_arg(kCpu, DType::kBF16, {4, 16}, xv);
  Arg out = make_out(kCpu, DType::kF8E4M3, {4, 16}, 0);
  Arg sc = make_out(kCpu, DType::kF32, {3}, 0);
  DLTensor v[] = {x.view(), out.view(), sc.view()};
  DLTensor* args[] = {&v[0], &v[1], &v[2]};
  expect_error(handle(kTokenFp8, "cpu").call(args), "quantization", "out_scales");
  Arg sc2 = make_out(kCpu, DType::kF32, {2}, 0);
  DLTensor v2[] = {x.view(), out.view(), sc2.view()};
  DLTensor* args2[] = {&v2[0], &v2[1], &v2[2]};
  expect_error(handle(kTensorFp8, "cpu").call(args2), "quantization", "scale");
}

// ---- GPU against the CPU reference, byte for byte ----

class QuantizationGpu : public GpuTest {};

void expect_same(const Arg& gpu, const Arg& cpu, const std::string& what) {
  const auto g = gpu.values(), c = cpu.values();
  ASSERT_EQ(g.size(), c.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i) {
    // Bit for bit: both NaN (never expected) or equal values; -0 and 0 told apart.
    const bool same = (std::isnan(g[i]) && std::isnan(c[i])) ||
                      (g[i] == c[i] && std::signbit(g[i]) == std::signbit(c[i]));
    if (!same) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << ": gpu " << g[i] << ", cpu " << c[i];
    }
  }
}

void run_group_gpu(const GroupCase& c, DType dt, int64_t T, int64_t H, int64_t gs, bool ue8m0,
                   uint64_t seed, int64_t offset) {
  std::mt19937_64 rng(seed);
  const int64_t xc = c.silu ? 2 * H : H;
  auto xv = random_values(rng, T * xc, gs);
  const std::string what = std::string(c.op) + " " + std::string(dtype_name(dt)) +
                           " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " gs=" + std::to_string(gs) + (ue8m0 ? " ue8m0" : "") +
                           (offset ? " misaligned" : "");
  GroupCall cpu = make_group_call(c, kCpu, dt, xv, T, H, gs, offset);
  GroupCall gpu = make_group_call(c, kGpu, dt, xv, T, H, gs, offset);
  ASSERT_TRUE(cpu.call(handle(c.op, "cpu"), gs, 1e-10, ue8m0, c.int8).ok()) << what;
  const Status st = gpu.call(handle(c.op, "cuda"), gs, 1e-10, ue8m0, c.int8);
  ASSERT_TRUE(st.ok()) << what << ": " << st.message();
  expect_same(gpu.out, cpu.out, what + " out");
  expect_same(gpu.scales, cpu.scales, what + " scales");
}

TEST_F(QuantizationGpu, GroupOpsEqualTheReference) {
  uint64_t seed = 1000;
  for (const GroupCase& c : kGroupCases) {
    for (DType dt : kFloatDtypes) {
      for (const GroupShape& s : kGroupShapes) {
        for (bool ue8m0 : {false, true}) {
          if (c.int8 && ue8m0) continue;
          run_group_gpu(c, dt, s.T, s.H, s.gs, ue8m0, seed++, 0);
        }
      }
      // Larger rows (DeepSeek's H = 7168, the fast path at 16 / 32 lanes), a misaligned
      // view (the scalar path), one row.
      run_group_gpu(c, dt, 37, 7168, 128, false, seed++, 0);
      run_group_gpu(c, dt, 33, 2048, 128, !c.int8, seed++, 0);
      run_group_gpu(c, dt, 9, 256, 128, false, seed++, 1);
      run_group_gpu(c, dt, 1, 7168, 128, false, seed++, 0);
    }
  }
}

TEST_F(QuantizationGpu, ManyTokens) {
  // T = 131072 > 61681 (vllm#53390's 32-bit overflow in a fused silu+quant kernel): the
  // last rows must be right too (the whole output is compared).
  for (const GroupCase& c : kGroupCases) {
    run_group_gpu(c, DType::kBF16, 131072, 128, 128, !c.int8, 4242, 0);
  }
}

// The fast path's wider threads (group_quant.cu: 4 vectors a thread from ~2.2M vectors,
// 2 from ~1.1M, 1 below): odd T at each width, f32's 4-element vectors, a lane per group
// (gs = 32 of bf16: 4 vectors, one thread), gs = 1024 (128 vectors: 4 a thread over 32
// lanes), T = 131072 at 4 a thread, UE8M0 and col-major scales with P > T.
TEST_F(QuantizationGpu, WideThreadPaths) {
  struct Wide {
    DType dt;
    int64_t T, H, gs;
  };
  const Wide shapes[] = {
      {DType::kBF16, 2501, 7168, 128},  // 2.24M vectors: 4 a thread
      {DType::kBF16, 1301, 7168, 128},  // 1.17M: 2 a thread
      {DType::kF32, 1301, 7168, 128},   // 2.33M 4-element vectors: 4 a thread
      {DType::kF16, 2501, 7168, 32},    // 4 a thread, one lane per group
      {DType::kBF16, 3, 8192, 1024},    // 1 wanted, 4 needed for 32 lanes
      {DType::kBF16, 131073, 256, 128}  // 4.19M: 4 a thread, T > 2^17
  };
  uint64_t seed = 7000;
  for (const GroupCase& c : kGroupCases) {
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Wide& w = shapes[i];
      run_group_gpu(c, w.dt, w.T, w.H, w.gs, !c.int8 && i % 2 == 1, seed++, 0);
    }
  }
}

// Values next to the e4m3 rounding boundaries of their scale: the kernels' codes come from
// a bracketed multiplication by 1/s, which must hand exactly these (about a third here) to
// the division. Each run of `run` values gets an amax A (first value, either sign), s =
// RN(A / 448), and values RN(m s) moved by up to 4 ulps, for midpoints and codes m; some
// runs get specials (NaN, +-inf, -0, subnormals, 3e38). f32 keeps them as made; bf16
// rounds them (then s = a power of two times 448 / 448 gives exact ties).
std::vector<double> boundary_values(std::mt19937_64& rng, int64_t n, int64_t run, bool specials) {
  std::vector<double> v(static_cast<size_t>(n));
  std::uniform_int_distribution<int> code(0, 0x7d), ulps(-4, 4), ex(-20, 20), man(0, 255);
  float s = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % run == 0) {
      const float a = std::ldexp(1.0f + static_cast<float>(man(rng)) / 256.0f, ex(rng));
      s = a / 448.0f;
      v[static_cast<size_t>(i)] = (rng() & 1) ? a : -a;
      continue;
    }
    if (specials && (i / run) % 7 == 3 && i % 11 == 0) {
      const double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 1e-40, -1e-40, 3e38, -3e38};
      v[static_cast<size_t>(i)] = sp[static_cast<size_t>(i / 11) % 9];
      continue;
    }
    const int k = code(rng);
    const double lo = device::e4m3_to_float(static_cast<uint8_t>(k));
    const double hi = device::e4m3_to_float(static_cast<uint8_t>(k + 1));
    auto x = static_cast<float>(((rng() & 1) ? (lo + hi) / 2 : hi) * s);
    for (int d = ulps(rng); d != 0; d += d > 0 ? -1 : 1) {
      x = std::nextafter(x, d > 0 ? INFINITY : -INFINITY);
    }
    v[static_cast<size_t>(i)] = (rng() & 1) ? x : -x;
  }
  return v;
}

TEST_F(QuantizationGpu, CodesNextToRoundingBoundariesEqualTheReference) {
  uint64_t seed = 8000;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const GroupCase& c : {kGroupCases[0], kGroupCases[1]}) {
      // T = 64 (1 vector a thread) and T = 2501 (4 a thread: f32 from 2.2M vectors too).
      for (int64_t T : {int64_t{64}, int64_t{2501}}) {
        for (bool ue8m0 : {false, true}) {
          const int64_t H = 7168, gs = 128;
          std::mt19937_64 rng(seed++);
          const auto xv = boundary_values(rng, T * H, gs, true);
          const std::string what = std::string(c.op) + " boundaries " +
                                   std::string(dtype_name(dt)) + " T=" + std::to_string(T) +
                                   (ue8m0 ? " ue8m0" : "");
          GroupCall cpu = make_group_call(c, kCpu, dt, xv, T, H, gs);
          GroupCall gpu = make_group_call(c, kGpu, dt, xv, T, H, gs);
          ASSERT_TRUE(cpu.call(handle(c.op, "cpu"), gs, 1e-10, ue8m0, false).ok()) << what;
          const Status st = gpu.call(handle(c.op, "cuda"), gs, 1e-10, ue8m0, false);
          ASSERT_TRUE(st.ok()) << what << ": " << st.message();
          expect_same(gpu.out, cpu.out, what + " out");
          expect_same(gpu.scales, cpu.scales, what + " scales");
        }
      }
    }
    // per_token_quant_fp8: one scale a row, so the runs are rows (no specials: an inf
    // would make the whole row's scale infinite).
    for (auto [T, H] : std::vector<std::pair<int64_t, int64_t>>{{64, 7168}, {33, 4096}}) {
      std::mt19937_64 rng(seed++);
      const auto xv = boundary_values(rng, T * H, H, false);
      Arg xs[2] = {make_arg(kCpu, dt, {T, H}, xv), make_arg(kGpu, dt, {T, H}, xv)};
      Arg outs[2] = {make_out(kCpu, DType::kF8E4M3, {T, H}, 0x7f),
                     make_out(kGpu, DType::kF8E4M3, {T, H}, 0x7f)};
      Arg scs[2] = {make_out(kCpu, DType::kF32, {T}, NAN), make_out(kGpu, DType::kF32, {T}, NAN)};
      for (int i = 0; i < 2; ++i) {
        DLTensor v[] = {xs[i].view(), outs[i].view(), scs[i].view()};
        DLTensor* args[] = {&v[0], &v[1], &v[2]};
        const Status st = handle(kTokenFp8, i == 0 ? "cpu" : "cuda").call(args);
        ASSERT_TRUE(st.ok()) << st.message();
      }
      const std::string what = "per_token boundaries " + std::string(dtype_name(dt)) +
                               " T=" + std::to_string(T) + " H=" + std::to_string(H);
      expect_same(outs[1], outs[0], what + " out");
      expect_same(scs[1], scs[0], what + " scales");
    }
  }
}

TEST_F(QuantizationGpu, PerTokenAndPerTensorEqualTheReference) {
  uint64_t seed = 5000;
  for (DType dt : kFloatDtypes) {
    for (auto [T, H] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 7},
             {5, 100},
             {3, 4104},
             {64, 7168},
             {2, 1},
             {4, 70000},
             {7, 2048},
             {1, 128},
             {3, 65536}}) {  // 8192 vectors: 1024 threads holding 8 each (bf16, f16)
      for (int64_t offset : {int64_t{0}, int64_t{1}}) {
        std::mt19937_64 rng(seed++);
        auto xv = random_values(rng, T * H, 64);
        const std::string what = std::string(dtype_name(dt)) + " T=" + std::to_string(T) +
                                 " H=" + std::to_string(H) + (offset ? " misaligned" : "");
        {
          Arg xs[2] = {make_arg(kCpu, dt, {T, H}, xv, offset),
                       make_arg(kGpu, dt, {T, H}, xv, offset)};
          Arg outs[2] = {make_out(kCpu, DType::kF8E4M3, {T, H}, 0x7f, offset),
                         make_out(kGpu, DType::kF8E4M3, {T, H}, 0x7f, offset)};
          Arg scs[2] = {make_out(kCpu, DType::kF32, {T}, NAN, offset),
                        make_out(kGpu, DType::kF32, {T}, NAN, offset)};
          for (int i = 0; i < 2; ++i) {
            DLTensor v[] = {xs[i].view(), outs[i].view(), scs[i].view()};
            DLTensor* args[] = {&v[0], &v[1], &v[2]};
            const Status st = handle(kTokenFp8, i == 0 ? "cpu" : "cuda").call(args);
            ASSERT_TRUE(st.ok()) << what << ": " << st.message();
          }
          expect_same(outs[1], outs[0], "per_token out " + what);
          expect_same(scs[1], scs[0], "per_token scales " + what);
        }
        for (bool is_static : {false, true}) {
          Arg xs[2] = {make_arg(kCpu, dt, {T, H}, xv, offset),
                       make_arg(kGpu, dt, {T, H}, xv, offset)};
          Arg outs[2] = {make_out(kCpu, DType::kF8E4M3, {T, H}, 0x7f, offset),
                         make_out(kGpu, DType::kF8E4M3, {T, H}, 0x7f, offset)};
          // Dynamic: a stale scale the op must replace; static: the scale to use.
          Arg scs[2] = {make_arg(kCpu, DType::kF32, {1}, {is_static ? 0.01171875 : 1e30}, offset),
                        make_arg(kGpu, DType::kF32, {1}, {is_static ? 0.01171875 : 1e30}, offset)};
          for (int i = 0; i < 2; ++i) {
            DLTensor v[] = {xs[i].view(), outs[i].view(), scs[i].view()};
            DLTensor* args[] = {&v[0], &v[1], &v[2]};
            const kreg_attr attrs[] = {bool_attr(is_static)};
            const Status st = handle(kTensorFp8, i == 0 ? "cpu" : "cuda").call(args, attrs);
            ASSERT_TRUE(st.ok()) << what << ": " << st.message();
          }
          expect_same(outs[1], outs[0], "per_tensor out " + what);
          expect_same(scs[1], scs[0], "per_tensor scale " + what);
        }
      }
    }
  }
}

TEST_F(QuantizationGpu, EmptyBatchesAreNoOps) {
  for (const GroupCase& c : kGroupCases) {
    GroupCall call = make_group_call(c, kGpu, DType::kBF16, {}, 0, 256, 128);
    EXPECT_TRUE(call.call(handle(c.op, "cuda"), 128, 1e-10, false, c.int8).ok()) << c.op;
  }
}

}  // namespace
}  // namespace kreg
