// The kvcache group: CPU references against independent oracles written here (exact
// copies, and FP8 E4M3 by nearest-value search over the 127 finite magnitudes), every
// CUDA implementation against its CPU reference over a shape sweep with padding slots,
// out-of-range slots, odd widths and misaligned views (skipped without a GPU), and bad
// arguments rejected with messages naming the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <optional>
#include <random>

#include "../../plugins/kvcache/fp8_e4m3.hpp"
#include "harness.hpp"
#include "kreg/registry.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using harness::Buffer;

Registry& registry() {
  static std::unique_ptr<Registry> reg = [] {
    auto m = load_manifest(fs::path(KREG_SOURCE_DIR) / "registry.yaml",
                           ManifestOptions{fs::path(KREG_PLUGIN_DIR), true});
    EXPECT_TRUE(m.ok()) << m.status().message();
    auto r = Registry::open(*m);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }();
  return *reg;
}

constexpr DLDevice kCpuDev{kDLCPU, 0};
constexpr DLDevice kGpuDev{kDLCUDA, 0};

kreg_attr float_attr(double v) {
  kreg_attr a{};
  a.type = KREG_ATTR_FLOAT;
  a.value.f = v;
  return a;
}

// A tensor argument: an owning buffer and the DLTensor the op sees. FP8 tensors are
// held in a u8 buffer (the harness reads and writes their bytes as numbers) and viewed
// as f8e4m3; `offset` elements at the front misalign the view.
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

// Values (already representable in `dt`, or bytes for fp8) on `device`.
Arg make_arg(DLDevice device, DType dt, std::vector<int64_t> shape, std::vector<double> vals,
             int64_t offset = 0) {
  const DType storage = dt == DType::kF8E4M3 ? DType::kU8 : dt;
  vals.insert(vals.begin(), static_cast<size_t>(offset), 0.0);
  auto b = Buffer::make(device, storage, {static_cast<int64_t>(vals.size())});
  EXPECT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(b->from_doubles(vals).ok());
  return Arg{std::move(b).value(), dt, std::move(shape), offset};
}

// Random values exactly representable in dt (bf16 has 8 significant bits): non-zero,
// magnitudes in [0.05, 2]; fp8: any byte.
std::vector<double> random_values(std::mt19937_64& rng, DType dt, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  std::uniform_real_distribution<double> mag(0.05, 2.0);
  for (double& x : v) {
    if (dt == DType::kF8E4M3) {
      x = static_cast<double>(rng() & 0xff);
      continue;
    }
    const double m = std::ldexp(std::round(std::ldexp(mag(rng), 6)), -6);  // 7 bits
    x = (rng() & 1) ? m : -m;
  }
  return v;
}

// Slots: distinct, in range, with -1 pads and (when there is room) one out-of-range slot.
std::vector<double> random_slots(std::mt19937_64& rng, int64_t tokens, int64_t num_slots) {
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> s(static_cast<size_t>(tokens));
  size_t next = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    if (tokens > 2 && t == tokens / 2) {
      s[static_cast<size_t>(t)] = static_cast<double>(num_slots + (t % 3));  // out of range
    } else if (next == perm.size() || rng() % 7 == 0) {
      s[static_cast<size_t>(t)] = -1;
    } else {
      s[static_cast<size_t>(t)] = static_cast<double>(perm[next++]);
    }
  }
  return s;
}

// ---- The FP8 oracle: the nearest of the finite E4M3 values, ties to the even code ----

double e4m3_magnitude(int code) {  // code in [0, 126]
  const int exp = code >> 3, man = code & 7;
  return exp == 0 ? man / 512.0 : (1.0 + man / 8.0) * std::pow(2.0, exp - 7);
}

// The 127 finite magnitudes, ascending with the code.
const std::vector<double>& e4m3_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (int c = 0; c <= 126; ++c) v.push_back(e4m3_magnitude(c));
    return v;
  }();
  return t;
}

uint8_t oracle_e4m3(float q) {
  if (std::isnan(q)) return 0x7f;
  const double a = std::fabs(static_cast<double>(q));
  const auto& t = e4m3_table();
  // The two neighbours of a; the nearer wins, a tie goes to the even code.
  const auto hi = std::lower_bound(t.begin(), t.end(), a);
  int best;
  if (hi == t.end()) {
    best = 126;
  } else if (hi == t.begin()) {
    best = 0;
  } else {
    const int c = static_cast<int>(hi - t.begin());
    const double dl = a - t[static_cast<size_t>(c - 1)], dh = t[static_cast<size_t>(c)] - a;
    best = dl < dh ? c - 1 : dh < dl ? c : ((c & 1) == 0 ? c : c - 1);
  }
  return static_cast<uint8_t>((std::signbit(q) ? 0x80 : 0) | best);
}

TEST(KvcacheFp8, RoundingMatchesTheNearestValueOracle) {
  std::vector<float> probes = {0.0f,    -0.0f,     448.0f,   449.0f,    463.9f,  464.0f,   480.0f,
                               1e9f,    -1e9f,     INFINITY, -INFINITY, 0x1p-9f, 0x1p-10f, 0x3p-11f,
                               0x1p-6f, 0x0.fp-6f, 1.0625f,  1.1875f,   240.0f,  -17.5f};
  // Every midpoint between neighbours and a value on each side of it.
  for (int c = 0; c < 126; ++c) {
    const float mid = static_cast<float>((e4m3_magnitude(c) + e4m3_magnitude(c + 1)) / 2);
    for (float p : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      probes.push_back(p);
      probes.push_back(-p);
    }
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-600.0f, 600.0f);
  for (int i = 0; i < 20000; ++i) probes.push_back(u(rng) * (i % 2 ? 1.0f : 1.0f / 512));
  for (float p : probes) {
    ASSERT_EQ(kvcache::float_to_e4m3(p), oracle_e4m3(p)) << "x = " << p;
  }
  EXPECT_EQ(kvcache::float_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(to_dl(DType::kF8E4M3).code, kDLFloat8E4M3FnCode);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(parse_dtype("f8e4m3"), DType::kF8E4M3);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(kvcache::float_to_e4m3(kvcache::e4m3_to_float(static_cast<uint8_t>(c))), c);
  }
}

// ---- kvcache.store ----

struct StoreShape {
  int64_t T, Hk, D, P, S;
};

struct StoreCase {
  Arg k, v, slots, k_cache, v_cache;
  double k_scale = 1, v_scale = 1;
  std::vector<double> expect_k, expect_v;  // the oracle's caches

  std::vector<DLTensor> views() {
    return {k.view(), v.view(), slots.view(), k_cache.view(), v_cache.view()};
  }
};

// Builds inputs on `device` and the oracle's answer. `misalign` offsets every view by one
// element.
StoreCase make_store(const StoreShape& s, DType in, DType cache, DType idx, uint64_t seed,
                     DLDevice device, bool misalign = false, double k_scale = 1,
                     double v_scale = 1) {
  std::mt19937_64 rng(seed);
  const int64_t row = s.Hk * s.D, slots_n = s.P * s.S;
  auto kv = random_values(rng, in, s.T * row), vv = random_values(rng, in, s.T * row);
  auto sv = random_slots(rng, s.T, slots_n);
  auto kc = random_values(rng, cache, slots_n * row), vc = random_values(rng, cache, slots_n * row);
  const int64_t off = misalign ? 1 : 0;
  StoreCase c{make_arg(device, in, {s.T, s.Hk, s.D}, kv, off),
              make_arg(device, in, {s.T, s.Hk, s.D}, vv, off),
              make_arg(device, idx, {s.T}, sv, off),
              make_arg(device, cache, {s.P, s.S, s.Hk, s.D}, kc, off),
              make_arg(device, cache, {s.P, s.S, s.Hk, s.D}, vc, off),
              k_scale,
              v_scale,
              kc,
              vc};
  for (int64_t t = 0; t < s.T; ++t) {
    const auto slot = static_cast<int64_t>(sv[static_cast<size_t>(t)]);
    if (slot < 0 || slot >= slots_n) continue;
    for (int64_t e = 0; e < row; ++e) {
      const auto src = static_cast<size_t>(t * row + e), dst = static_cast<size_t>(slot * row + e);
      if (cache == DType::kF8E4M3) {
        // The contract: one fp32 division, then E4M3 rounding.
        c.expect_k[dst] = oracle_e4m3(static_cast<float>(kv[src]) / static_cast<float>(k_scale));
        c.expect_v[dst] = oracle_e4m3(static_cast<float>(vv[src]) / static_cast<float>(v_scale));
      } else {
        c.expect_k[dst] = kv[src];
        c.expect_v[dst] = vv[src];
      }
    }
  }
  return c;
}

Status call_store(const KernelHandle& h, StoreCase& c) {
  auto views = c.views();
  std::vector<DLTensor*> args;
  for (DLTensor& t : views) args.push_back(&t);
  const kreg_attr attrs[] = {float_attr(c.k_scale), float_attr(c.v_scale)};
  return h.call(args, attrs);
}

void expect_exact(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  auto cmp = harness::compare_values(what, got, want, {0, 0});
  EXPECT_TRUE(cmp.ok()) << what << ": " << cmp.mismatches << "/" << cmp.count << " elements differ";
}

const StoreShape kStoreShapes[] = {{1, 1, 1, 1, 1},     {3, 1, 7, 2, 3},     {5, 2, 64, 3, 4},
                                   {17, 8, 128, 5, 16}, {33, 3, 100, 4, 16}, {64, 8, 128, 16, 8},
                                   {9, 1, 576, 3, 5},   {0, 8, 128, 2, 4}};

struct DtypePair {
  DType in, cache;
};
const DtypePair kStoreDtypes[] = {{DType::kBF16, DType::kBF16},  {DType::kF16, DType::kF16},
                                  {DType::kF32, DType::kF32},    {DType::kBF16, DType::kF8E4M3},
                                  {DType::kF16, DType::kF8E4M3}, {DType::kF32, DType::kF8E4M3}};

std::string label(const StoreShape& s, DtypePair d, DType idx) {
  return "T=" + std::to_string(s.T) + " Hk=" + std::to_string(s.Hk) + " D=" + std::to_string(s.D) +
         " P=" + std::to_string(s.P) + " S=" + std::to_string(s.S) + " " +
         std::string(dtype_name(d.in)) + "->" + std::string(dtype_name(d.cache)) + " " +
         std::string(dtype_name(idx));
}

KernelHandle handle(const char* op, const std::string& backend) {
  auto h =
      registry().resolve(op, Target{backend == "cpu" ? kCpuDev : kGpuDev, std::nullopt}, {backend});
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : KernelHandle{};
}

TEST(Kvcache, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("kvcache.")) shipped.push_back(id);
  }
  const std::vector<std::string> covered = {"kvcache.set_mla_kv_buffer", "kvcache.store",
                                            "kvcache.transfer", "kvcache.transfer_layers"};
  std::vector<std::string> expected;
  for (const auto& op : covered) {
    if (std::find(shipped.begin(), shipped.end(), op) != shipped.end()) expected.push_back(op);
  }
  EXPECT_EQ(shipped, expected) << "a new kvcache op needs an oracle in this file";
  EXPECT_FALSE(shipped.empty());
}

TEST(Kvcache, StoreCpuReferenceMatchesTheOracle) {
  const KernelHandle h = handle("kvcache.store", "cpu");
  uint64_t seed = 1;
  for (const StoreShape& s : kStoreShapes) {
    for (DtypePair d : kStoreDtypes) {
      for (DType idx : {DType::kI32, DType::kI64}) {
        SCOPED_TRACE(label(s, d, idx));
        const bool fp8 = d.cache == DType::kF8E4M3;
        // Scales that send quotients into the subnormals (4) and past 448 (0.003).
        for (auto [ks, vs] : fp8 ? std::vector<std::pair<double, double>>{{1, 1}, {4, 0.003}}
                                 : std::vector<std::pair<double, double>>{{1, 1}}) {
          StoreCase c = make_store(s, d.in, d.cache, idx, seed++, kCpuDev, false, ks, vs);
          Status st = call_store(h, c);
          ASSERT_TRUE(st.ok()) << st.message();
          expect_exact(c.k_cache.values(), c.expect_k, "k_cache");
          expect_exact(c.v_cache.values(), c.expect_v, "v_cache");
        }
      }
    }
  }
}

TEST(Kvcache, StoreBadArgumentsNameTheArgument) {
  const KernelHandle h = handle("kvcache.store", "cpu");
  const StoreShape s{4, 2, 8, 2, 4};
  auto expect_error = [&](StoreCase& c, const std::string& needle) {
    const std::vector<double> before = c.k_cache.values();
    Status st = call_store(h, c);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    expect_exact(c.k_cache.values(), before, "k_cache untouched");
  };
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kF16, DType::kI64, 1, kCpuDev);
    expect_error(c, "argument 'k_cache' has dtype f16; expected k's dtype (bf16) or f8e4m3");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpuDev);
    c.v_cache = make_arg(kCpuDev, DType::kF16, {2, 4, 2, 8}, std::vector<double>(128, 1.0));
    expect_error(c, "argument 'v_cache' has dtype f16, but 'k_cache' has bf16");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpuDev, false, 0.5);
    expect_error(c, "attribute 'k_scale' is 0.5, but the caches are bf16");
  }
  {
    StoreCase c =
        make_store(s, DType::kBF16, DType::kF8E4M3, DType::kI64, 1, kCpuDev, false, 1, 0.0);
    expect_error(c, "attribute 'v_scale' is 0; an fp8 cache needs a positive, finite scale");
  }
  {
    StoreCase c =
        make_store(s, DType::kBF16, DType::kF8E4M3, DType::kI64, 1, kCpuDev, false, NAN, 1);
    expect_error(c, "attribute 'k_scale' is nan");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpuDev);
    c.slots = make_arg(kCpuDev, DType::kF32, {4}, {0, 1, 2, 3});
    expect_error(c, "argument 'slot_mapping' (tensor 3 of 5) has dtype f32, expected i32|i64");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpuDev);
    c.v_cache = make_arg(kCpuDev, DType::kBF16, {2, 4, 2, 4}, std::vector<double>(64, 1.0));
    expect_error(c, "argument 'v_cache' (tensor 5 of 5) has shape [2,4,2,4]");
  }
}

// ---- kvcache.set_mla_kv_buffer ----

struct MlaShape {
  int64_t n, P, Dn, Dr;
};

struct MlaCase {
  Arg kv_buffer, loc, k_nope, k_rope;
  std::vector<double> expect;
  std::vector<DLTensor> views() {
    return {kv_buffer.view(), loc.view(), k_nope.view(), k_rope.view()};
  }
};

MlaCase make_mla(const MlaShape& s, DType dt, DType idx, uint64_t seed, DLDevice device,
                 bool misalign = false) {
  std::mt19937_64 rng(seed);
  const int64_t w = s.Dn + s.Dr;
  auto buf = random_values(rng, dt, s.P * w);
  auto loc = random_slots(rng, s.n, s.P);
  auto nope = random_values(rng, dt, s.n * s.Dn), rope = random_values(rng, dt, s.n * s.Dr);
  const int64_t off = misalign ? 1 : 0;
  MlaCase c{make_arg(device, dt, {s.P, w}, buf, off), make_arg(device, idx, {s.n}, loc, off),
            make_arg(device, dt, {s.n, s.Dn}, nope, off),
            make_arg(device, dt, {s.n, s.Dr}, rope, off), buf};
  for (int64_t i = 0; i < s.n; ++i) {
    const auto l = static_cast<int64_t>(loc[static_cast<size_t>(i)]);
    if (l < 0 || l >= s.P) continue;
    for (int64_t j = 0; j < w; ++j) {
      c.expect[static_cast<size_t>(l * w + j)] =
          j < s.Dn ? nope[static_cast<size_t>(i * s.Dn + j)]
                   : rope[static_cast<size_t>(i * s.Dr + j - s.Dn)];
    }
  }
  return c;
}

Status call_mla(const KernelHandle& h, MlaCase& c) {
  auto views = c.views();
  std::vector<DLTensor*> args;
  for (DLTensor& t : views) args.push_back(&t);
  return h.call(args);
}

const MlaShape kMlaShapes[] = {{1, 1, 1, 1},      {3, 5, 7, 3},    {9, 20, 512, 64},
                               {16, 40, 128, 64}, {5, 7, 100, 28}, {70, 90, 512, 64},
                               {0, 4, 512, 64},   {4, 6, 8, 0}};
const DType kMlaDtypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3};

TEST(Kvcache, SetMlaCpuReferenceMatchesTheOracle) {
  const KernelHandle h = handle("kvcache.set_mla_kv_buffer", "cpu");
  uint64_t seed = 100;
  for (const MlaShape& s : kMlaShapes) {
    for (DType dt : kMlaDtypes) {
      for (DType idx : {DType::kI32, DType::kI64}) {
        SCOPED_TRACE("n=" + std::to_string(s.n) + " P=" + std::to_string(s.P) +
                     " Dn=" + std::to_string(s.Dn) + " Dr=" + std::to_string(s.Dr) + " " +
                     std::string(dtype_name(dt)) + " " + std::string(dtype_name(idx)));
        MlaCase c = make_mla(s, dt, idx, seed++, kCpuDev);
        Status st = call_mla(h, c);
        ASSERT_TRUE(st.ok()) << st.message();
        expect_exact(c.kv_buffer.values(), c.expect, "kv_buffer");
      }
    }
  }
}

TEST(Kvcache, SetMlaBadArgumentsNameTheArgument) {
  const KernelHandle h = handle("kvcache.set_mla_kv_buffer", "cpu");
  MlaCase c = make_mla({3, 5, 8, 4}, DType::kBF16, DType::kI64, 1, kCpuDev);
  c.kv_buffer.shape = {4, 15};
  Status st = call_mla(h, c);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("argument 'kv_buffer' has rows of 15 elements, expected Dn + Dr = "
                              "8 + 4"),
            std::string::npos)
      << st.message();
  MlaCase d = make_mla({3, 5, 8, 4}, DType::kBF16, DType::kI64, 1, kCpuDev);
  d.k_rope.view_dtype = DType::kF16;
  st = call_mla(h, d);
  EXPECT_NE(st.message().find("argument 'k_rope' (tensor 4 of 4) has dtype f16, but 'kv_buffer' "
                              "has bf16"),
            std::string::npos)
      << st.message();
}

// ---- GPU: every CUDA implementation against its CPU reference ----

class KvcacheGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!harness::gpu_available()) {
      GTEST_SKIP() << "no CUDA device on this machine: GPU kernel tests skipped "
                      "(run ctest on a GPU machine to exercise them)";
    }
  }
};

TEST_F(KvcacheGpu, StoreMatchesTheCpuReference) {
  const KernelHandle gpu = handle("kvcache.store", "cuda");
  const KernelHandle cpu = handle("kvcache.store", "cpu");
  const StoreShape extra[] = {{1000, 8, 128, 80, 16}, {257, 1, 64, 300, 1}, {31, 4, 3, 11, 5}};
  std::vector<StoreShape> shapes(std::begin(kStoreShapes), std::end(kStoreShapes));
  shapes.insert(shapes.end(), std::begin(extra), std::end(extra));
  uint64_t seed = 1000;
  for (const StoreShape& s : shapes) {
    for (DtypePair d : kStoreDtypes) {
      for (DType idx : {DType::kI32, DType::kI64}) {
        for (bool misalign : {false, true}) {
          SCOPED_TRACE(label(s, d, idx) + (misalign ? " misaligned" : ""));
          const bool fp8 = d.cache == DType::kF8E4M3;
          const double ks = fp8 ? 4.0 : 1.0, vs = fp8 ? 0.003 : 1.0;
          StoreCase g = make_store(s, d.in, d.cache, idx, seed, kGpuDev, misalign, ks, vs);
          StoreCase c = make_store(s, d.in, d.cache, idx, seed++, kCpuDev, false, ks, vs);
          Status st = call_store(gpu, g);
          ASSERT_TRUE(st.ok()) << st.message();
          ASSERT_TRUE(harness::device_synchronize().ok());
          ASSERT_TRUE(call_store(cpu, c).ok());
          expect_exact(g.k_cache.values(), c.k_cache.values(), "k_cache");
          expect_exact(g.v_cache.values(), c.v_cache.values(), "v_cache");
        }
      }
    }
  }
}

TEST_F(KvcacheGpu, SetMlaMatchesTheCpuReference) {
  const KernelHandle gpu = handle("kvcache.set_mla_kv_buffer", "cuda");
  const KernelHandle cpu = handle("kvcache.set_mla_kv_buffer", "cpu");
  std::vector<MlaShape> shapes(std::begin(kMlaShapes), std::end(kMlaShapes));
  shapes.push_back({2000, 4096, 512, 64});
  uint64_t seed = 2000;
  for (const MlaShape& s : shapes) {
    for (DType dt : kMlaDtypes) {
      for (DType idx : {DType::kI32, DType::kI64}) {
        for (bool misalign : {false, true}) {
          SCOPED_TRACE("n=" + std::to_string(s.n) + " P=" + std::to_string(s.P) +
                       " Dn=" + std::to_string(s.Dn) + " Dr=" + std::to_string(s.Dr) + " " +
                       std::string(dtype_name(dt)) + (misalign ? " misaligned" : ""));
          MlaCase g = make_mla(s, dt, idx, seed, kGpuDev, misalign);
          MlaCase c = make_mla(s, dt, idx, seed++, kCpuDev);
          Status st = call_mla(gpu, g);
          ASSERT_TRUE(st.ok()) << st.message();
          ASSERT_TRUE(harness::device_synchronize().ok());
          ASSERT_TRUE(call_mla(cpu, c).ok());
          expect_exact(g.kv_buffer.values(), c.kv_buffer.values(), "kv_buffer");
        }
      }
    }
  }
}

TEST_F(KvcacheGpu, CpuTensorsToTheCudaPathAreRefused) {
  const KernelHandle gpu = handle("kvcache.store", "cuda");
  StoreCase c = make_store({4, 2, 8, 2, 4}, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpuDev);
  Status st = call_store(gpu, c);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("is on cpu:0, but backend cuda runs on cuda tensors"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace kreg
