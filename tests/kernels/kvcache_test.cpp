// The kvcache group: CPU references against independent oracles written here (exact
// copies, and FP8 E4M3 by nearest-value search over the 127 finite magnitudes), every
// CUDA implementation against its CPU reference over a shape sweep with padding slots,
// out-of-range slots, odd widths and misaligned views (skipped without a GPU), and bad
// arguments rejected with messages naming the argument. The transfers are checked byte
// for byte in every direction between device and page-locked host memory, and pageable
// host memory must be refused before any kernel touches it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <span>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/device/fp8_e4m3.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

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
// magnitudes in [1/16, 2]; fp8: any byte.
std::vector<double> random_values(std::mt19937_64& rng, DType dt, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    const uint64_t bits = rng();
    if (dt == DType::kF8E4M3) {
      x = static_cast<double>(bits & 0xff);
      continue;
    }
    // k / 64 for k in [4, 128]: 7 significant bits, magnitudes in [1/16, 2]; integer
    // arithmetic only (the large GPU tests build tens of millions of these).
    const double m = static_cast<double>(4 + (bits >> 8) % 125) / 64.0;
    x = (bits & 1) ? m : -m;
  }
  return v;
}

// The same values on the GPU, `offset` elements into their allocation (a misaligned view
// when 1): a byte copy of a host argument, cheaper than building the case again.
Arg device_copy(const Arg& host, int64_t offset) {
  const DType dt = host.buf.dtype();
  const size_t esz = dtype_size(dt);
  const int64_t n = host.buf.numel() - host.offset;
  std::vector<char> bytes(static_cast<size_t>(n + offset) * esz);  // the offset's zeros first
  if (n > 0) {  // an empty tensor may have no storage: no null pointer goes to memcpy
    std::memcpy(
        bytes.data() + static_cast<size_t>(offset) * esz,
        static_cast<const char*>(host.buf.tensor()->data) + static_cast<size_t>(host.offset) * esz,
        static_cast<size_t>(n) * esz);
  }
  return Arg{exact_buffer(kGpu, dt, {n + offset}, bytes.data()), host.view_dtype, host.shape,
             offset};
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
    ASSERT_EQ(device::float_to_e4m3(p), oracle_e4m3(p)) << "x = " << p;
  }
  EXPECT_EQ(device::float_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(to_dl(DType::kF8E4M3).code, kDLFloat8E4M3FnCode);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(parse_dtype("f8e4m3"), DType::kF8E4M3);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(device::float_to_e4m3(device::e4m3_to_float(static_cast<uint8_t>(c))), c);
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
          StoreCase c = make_store(s, d.in, d.cache, idx, seed++, kCpu, false, ks, vs);
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
    StoreCase c = make_store(s, DType::kBF16, DType::kF16, DType::kI64, 1, kCpu);
    expect_error(c, "argument 'k_cache' has dtype f16; expected k's dtype (bf16) or f8e4m3");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpu);
    c.v_cache = make_arg(kCpu, DType::kF16, {2, 4, 2, 8}, std::vector<double>(128, 1.0));
    expect_error(c, "argument 'v_cache' has dtype f16, but 'k_cache' has bf16");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpu, false, 0.5);
    expect_error(c, "attribute 'k_scale' is 0.5, but the caches are bf16");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kF8E4M3, DType::kI64, 1, kCpu, false, 1, 0.0);
    expect_error(c, "attribute 'v_scale' is 0; an fp8 cache needs a positive, finite scale");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kF8E4M3, DType::kI64, 1, kCpu, false, NAN, 1);
    expect_error(c, "attribute 'k_scale' is nan");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpu);
    c.slots = make_arg(kCpu, DType::kF32, {4}, {0, 1, 2, 3});
    expect_error(c, "argument 'slot_mapping' (tensor 3 of 5) has dtype f32, expected i32|i64");
  }
  {
    StoreCase c = make_store(s, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpu);
    c.v_cache = make_arg(kCpu, DType::kBF16, {2, 4, 2, 4}, std::vector<double>(64, 1.0));
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
        MlaCase c = make_mla(s, dt, idx, seed++, kCpu);
        Status st = call_mla(h, c);
        ASSERT_TRUE(st.ok()) << st.message();
        expect_exact(c.kv_buffer.values(), c.expect, "kv_buffer");
      }
    }
  }
}

TEST(Kvcache, SetMlaBadArgumentsNameTheArgument) {
  const KernelHandle h = handle("kvcache.set_mla_kv_buffer", "cpu");
  MlaCase c = make_mla({3, 5, 8, 4}, DType::kBF16, DType::kI64, 1, kCpu);
  c.kv_buffer.shape = {4, 15};
  Status st = call_mla(h, c);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("argument 'kv_buffer' has rows of 15 elements, expected Dn + Dr = "
                              "8 + 4"),
            std::string::npos)
      << st.message();
  MlaCase d = make_mla({3, 5, 8, 4}, DType::kBF16, DType::kI64, 1, kCpu);
  d.k_rope.view_dtype = DType::kF16;
  st = call_mla(h, d);
  EXPECT_NE(st.message().find("argument 'k_rope' (tensor 4 of 4) has dtype f16, but 'kv_buffer' "
                              "has bf16"),
            std::string::npos)
      << st.message();
}

// ---- kvcache.transfer / kvcache.transfer_layers ----
//
// Rows are bytes: every buffer is u8, viewed as the op's dtype. Results are compared as
// raw bytes against an oracle that copies rows in index order (the CPU contract: with
// duplicate destinations the last row wins).

constexpr DLDevice kPinnedDev{kDLCUDAHost, 0};

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A u8 buffer on `device` holding `bytes`.
Buffer bytes_buffer(DLDevice device, const std::vector<uint8_t>& bytes) {
  return test::exact_buffer(device, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data());
}

// An i64 buffer on `device` holding `v` exactly (addresses do not go through doubles).
Buffer i64_buffer(DLDevice device, const std::vector<int64_t>& v) {
  return test::exact_buffer(device, DType::kI64, {static_cast<int64_t>(v.size())}, v.data());
}

// Row-index pairs of one transfer and the rows they address.
struct TransferShape {
  int64_t n, src_rows, dst_rows, row_bytes;
};

std::string label(const TransferShape& s) {
  return "N=" + std::to_string(s.n) + " src_rows=" + std::to_string(s.src_rows) +
         " dst_rows=" + std::to_string(s.dst_rows) + " row=" + std::to_string(s.row_bytes) + "B";
}

struct TransferIndices {
  std::vector<int64_t> src, dst;
};

// src: any valid row (repeats allowed) and a few out-of-range ones (-1, past the end, far
// past, far negative); dst: distinct rows unless `dup_dst`, with the same kinds of skips.
TransferIndices random_transfer_indices(std::mt19937_64& rng, const TransferShape& s,
                                        bool dup_dst = false) {
  const int64_t skips[] = {-1, s.src_rows, s.src_rows + 7, int64_t{1} << 40, -(int64_t{1} << 40)};
  const int64_t dskips[] = {-1, s.dst_rows, s.dst_rows + 3, int64_t{1} << 41, -2};
  std::vector<int64_t> perm(static_cast<size_t>(s.dst_rows));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  TransferIndices idx;
  size_t next = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const bool skip_src = s.src_rows == 0 || rng() % 11 == 0;
    idx.src.push_back(skip_src ? skips[rng() % 5] : static_cast<int64_t>(rng() % s.src_rows));
    int64_t d;
    if (dup_dst && s.dst_rows > 0 && rng() % 13 != 0) {
      d = static_cast<int64_t>(rng() % s.dst_rows);
    } else if (next == perm.size() || rng() % 9 == 0) {
      d = dskips[rng() % 5];
    } else {
      d = perm[next++];
    }
    idx.dst.push_back(d);
  }
  return idx;
}

// The oracle: rows copied in index order, skipped when either index is out of range.
std::vector<uint8_t> transfer_oracle(const TransferIndices& idx, const std::vector<uint8_t>& src,
                                     int64_t src_rows, int64_t src_stride, std::vector<uint8_t> dst,
                                     int64_t dst_rows, int64_t dst_stride, int64_t row_bytes) {
  for (size_t i = 0; i < idx.src.size(); ++i) {
    const int64_t s = idx.src[i], d = idx.dst[i];
    if (s < 0 || s >= src_rows || d < 0 || d >= dst_rows) continue;
    for (int64_t b = 0; b < row_bytes; ++b) {
      dst[static_cast<size_t>(d * dst_stride + b)] = src[static_cast<size_t>(s * src_stride + b)];
    }
  }
  return dst;
}

// A tensor view of `rows` rows of `row_bytes` bytes in `buf` (u8), as dtype `dt`, at byte
// `offset`; rank 2, or rank 3 with the row split in two when `rank3`. `claim` overrides
// the device type the view claims (PyTorch exports pinned tensors as kDLCPU).
struct RowsView {
  std::vector<int64_t> shape;
  DLTensor t;
};

RowsView rows_view(Buffer& buf, DType dt, int64_t rows, int64_t row_bytes, int64_t offset = 0,
                   bool rank3 = false, std::optional<DLDeviceType> claim = std::nullopt) {
  RowsView v;
  const auto elems = row_bytes / static_cast<int64_t>(dtype_size(dt));
  v.shape = rank3 && elems % 2 == 0 ? std::vector<int64_t>{rows, 2, elems / 2}
                                    : std::vector<int64_t>{rows, elems};
  v.t = *buf.tensor();
  v.t.dtype = to_dl(dt);
  v.t.ndim = static_cast<int32_t>(v.shape.size());
  v.t.byte_offset = static_cast<uint64_t>(offset);
  if (claim) v.t.device.device_type = *claim;
  return v;
}

Status call_transfer(const KernelHandle& h, Buffer& src_idx, Buffer& dst_idx, RowsView& src,
                     RowsView& dst) {
  for (RowsView* v : {&src, &dst}) {
    v->t.shape = v->shape.data();
    v->t.ndim = static_cast<int32_t>(v->shape.size());
  }
  DLTensor* args[] = {src_idx.tensor(), dst_idx.tensor(), &src.t, &dst.t};
  return h.call(args);
}

// One transfer's inputs on chosen devices, and the oracle's answer.
struct TransferCase {
  TransferShape shape;
  TransferIndices idx;
  Buffer src_idx, dst_idx, src, dst;
  std::vector<uint8_t> expect;  // dst's bytes (after `offset` leading bytes)
  int64_t offset;
};

TransferCase make_transfer(const TransferShape& s, uint64_t seed, DLDevice idx_dev,
                           DLDevice src_dev, DLDevice dst_dev, int64_t offset = 0,
                           bool dup_dst = false) {
  std::mt19937_64 rng(seed);
  TransferIndices idx = random_transfer_indices(rng, s, dup_dst);
  auto src = random_bytes(rng, offset + s.src_rows * s.row_bytes);
  auto dst = random_bytes(rng, offset + s.dst_rows * s.row_bytes);
  const std::vector<uint8_t> src_rows(src.begin() + offset, src.end());
  const std::vector<uint8_t> dst_rows(dst.begin() + offset, dst.end());
  TransferCase c{s,
                 idx,
                 i64_buffer(idx_dev, idx.src),
                 i64_buffer(idx_dev, idx.dst),
                 bytes_buffer(src_dev, src),
                 bytes_buffer(dst_dev, dst),
                 transfer_oracle(idx, src_rows, s.src_rows, s.row_bytes, dst_rows, s.dst_rows,
                                 s.row_bytes, s.row_bytes),
                 offset};
  return c;
}

// Runs `h` on the case's tensors viewed as `dt`; host buffers claim `claim` when given.
Status run_transfer(const KernelHandle& h, TransferCase& c, DType dt, bool rank3 = false,
                    std::optional<DLDeviceType> claim = std::nullopt) {
  RowsView src = rows_view(c.src, dt, c.shape.src_rows, c.shape.row_bytes, c.offset, rank3,
                           c.src.on_gpu() ? std::nullopt : claim);
  RowsView dst = rows_view(c.dst, dt, c.shape.dst_rows, c.shape.row_bytes, c.offset, rank3,
                           c.dst.on_gpu() ? std::nullopt : claim);
  return call_transfer(h, c.src_idx, c.dst_idx, src, dst);
}

std::vector<uint8_t> dst_bytes(const TransferCase& c) {
  auto all = bytes_of(c.dst);
  return std::vector<uint8_t>(all.begin() + c.offset, all.end());
}

// Row sizes: one word, an odd word count (3 lanes of 4), 256 B (two rows per warp), 1040 B
// (65 words: 3 per lane), 4 KiB (a warp, 8 words per lane), 4 KiB + 16 (a second round).
const int64_t kRowBytes[] = {16, 48, 256, 1040, 4096, 4112};
const DType kTransferDtypes[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF8E4M3,
                                 DType::kI64};

std::vector<TransferShape> transfer_shapes() {
  std::vector<TransferShape> out;
  for (int64_t row : kRowBytes) {
    for (auto [n, sr, dr] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                             {7, 5, 9},
                             {100, 37, 140},
                             {0, 4, 4},
                             {3, 0, 2},
                             {513, 700, 600}}) {
      out.push_back({n, sr, dr, row});
    }
  }
  return out;
}

TEST(Kvcache, TransferCpuReferenceMatchesTheOracle) {
  const KernelHandle h = handle("kvcache.transfer", "cpu");
  uint64_t seed = 300;
  int k = 0;
  for (const TransferShape& s : transfer_shapes()) {
    for (bool dup : {false, true}) {
      SCOPED_TRACE(label(s) + (dup ? " duplicate dst indices" : ""));
      const DType dt = kTransferDtypes[k++ % std::size(kTransferDtypes)];
      TransferCase c = make_transfer(s, seed++, kCpu, kCpu, kCpu, 0, dup);
      const auto src_before = bytes_of(c.src);
      Status st = run_transfer(h, c, dt, k % 3 == 0);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_TRUE(dst_bytes(c) == c.expect) << "dst differs from the oracle";
      EXPECT_TRUE(bytes_of(c.src) == src_before) << "src changed";
    }
  }
}

TEST(Kvcache, TransferSkipsOutOfRangeRowsAndKeepsTheLastDuplicate) {
  const KernelHandle h = handle("kvcache.transfer", "cpu");
  // 3 source rows of 16 bytes (row r filled with r + 1), 4 destination rows (0xee).
  std::vector<uint8_t> src(48), dst(64, 0xee);
  for (int r = 0; r < 3; ++r) std::fill_n(src.begin() + 16 * r, 16, static_cast<uint8_t>(r + 1));
  Buffer s = bytes_buffer(kCpu, src), d = bytes_buffer(kCpu, dst);
  Buffer si = i64_buffer(kCpu, {0, 2, -1, 3, 1, 1, 2});
  Buffer di = i64_buffer(kCpu, {3, 0, 1, 1, 4, 0, 0});
  RowsView sv = rows_view(s, DType::kU8, 3, 16), dv = rows_view(d, DType::kU8, 4, 16);
  ASSERT_TRUE(call_transfer(h, si, di, sv, dv).ok());
  const auto got = bytes_of(d);
  // Row 0: written by (2 -> 0), (1 -> 0) and last (2 -> 0); row 1: both writers skipped
  // (src -1, src 3 out of range); row 2: untouched; row 3: src row 0. (1 -> 4): dst out of
  // range.
  std::vector<uint8_t> want(64, 0xee);
  std::fill_n(want.begin(), 16, uint8_t{3});
  std::fill_n(want.begin() + 48, 16, uint8_t{1});
  EXPECT_TRUE(got == want);
}

TEST(Kvcache, TransferLayersCpuReferenceMatchesTheOracle) {
  const KernelHandle h = handle("kvcache.transfer_layers", "cpu");
  uint64_t seed = 400;
  for (int64_t row : kRowBytes) {
    for (bool strided : {false, true}) {
      const TransferShape s{57, 40, 50, row};
      SCOPED_TRACE(label(s) + (strided ? " page-first source (stride L * row)" : ""));
      constexpr int64_t kLayers = 4;
      std::mt19937_64 rng(seed++);
      TransferIndices idx = random_transfer_indices(rng, s);
      // Layer-first destinations; the source either layer-first or one page-first buffer
      // (token-major: row r of layer l at (r * L + l) * row).
      const int64_t ss = strided ? kLayers * row : row;
      auto page_first = random_bytes(rng, s.src_rows * kLayers * row);
      Buffer pf = bytes_buffer(kCpu, page_first);
      std::vector<Buffer> srcs, dsts;
      std::vector<std::vector<uint8_t>> src_bytes, dst_bytes_before;
      std::vector<int64_t> sp, dp;
      for (int64_t l = 0; l < kLayers; ++l) {
        src_bytes.push_back(random_bytes(rng, s.src_rows * row));
        dst_bytes_before.push_back(random_bytes(rng, s.dst_rows * row));
        srcs.push_back(bytes_buffer(kCpu, src_bytes.back()));
        dsts.push_back(bytes_buffer(kCpu, dst_bytes_before.back()));
        auto* base = strided ? static_cast<uint8_t*>(pf.tensor()->data) + l * row
                             : static_cast<uint8_t*>(srcs.back().tensor()->data);
        // Layer 2 is left out (a null source address).
        sp.push_back(l == 2 ? 0 : reinterpret_cast<int64_t>(base));
        dp.push_back(reinterpret_cast<int64_t>(dsts.back().tensor()->data));
      }
      Buffer si = i64_buffer(kCpu, idx.src), di = i64_buffer(kCpu, idx.dst);
      Buffer spb = i64_buffer(kCpu, sp), dpb = i64_buffer(kCpu, dp);
      DLTensor* args[] = {si.tensor(), di.tensor(), spb.tensor(), dpb.tensor()};
      const kreg_attr attrs[] = {int_attr(row), int_attr(s.src_rows), int_attr(s.dst_rows),
                                 int_attr(strided ? ss : 0), int_attr(0)};
      Status st = h.call(args, attrs);
      ASSERT_TRUE(st.ok()) << st.message();
      for (int64_t l = 0; l < kLayers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        std::vector<uint8_t> layer_src;
        if (strided) {
          layer_src.assign(page_first.begin() + l * row, page_first.end());
        } else {
          layer_src = src_bytes[static_cast<size_t>(l)];
        }
        const auto want = l == 2 ? dst_bytes_before[2]
                                 : transfer_oracle(idx, layer_src, s.src_rows, ss,
                                                   dst_bytes_before[static_cast<size_t>(l)],
                                                   s.dst_rows, row, row);
        EXPECT_TRUE(bytes_of(dsts[static_cast<size_t>(l)]) == want);
      }
    }
  }
}

TEST(Kvcache, TransferBadArgumentsNameTheArgument) {
  const KernelHandle h = handle("kvcache.transfer", "cpu");
  TransferCase c = make_transfer({4, 4, 4, 32}, 1, kCpu, kCpu, kCpu);
  const auto before = bytes_of(c.dst);
  auto expect_error = [&](RowsView src, RowsView dst, const std::string& needle,
                          Buffer* si = nullptr) {
    Status st = call_transfer(h, si ? *si : c.src_idx, c.dst_idx, src, dst);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_TRUE(bytes_of(c.dst) == before) << "dst written by a refused call";
  };
  // Rows of 12 bytes (f32 [.,3]): not a multiple of 16.
  {
    RowsView src = rows_view(c.src, DType::kF32, 4, 32), dst = rows_view(c.dst, DType::kF32, 4, 32);
    src.shape = {8, 3};
    dst.shape = {8, 3};
    expect_error(src, dst,
                 "kvcache.transfer: the row size of 'src' and 'dst' is 12 bytes; rows must be a "
                 "positive multiple of 16 bytes");
  }
  {
    RowsView src = rows_view(c.src, DType::kU8, 4, 32), dst = rows_view(c.dst, DType::kU8, 4, 32);
    dst.shape = {8, 16};
    expect_error(src, dst, "argument 'dst' has rows of 16 bytes, but 'src' has rows of 32 bytes");
  }
  {
    RowsView src = rows_view(c.src, DType::kBF16, 4, 32);
    RowsView dst = rows_view(c.dst, DType::kF32, 4, 32);
    expect_error(src, dst, "argument 'dst' (tensor 4 of 4) has dtype f32, but 'src' has bf16");
  }
  {
    RowsView src = rows_view(c.src, DType::kU8, 4, 32), dst = rows_view(c.dst, DType::kU8, 4, 32);
    src.shape = {};
    expect_error(src, dst, "argument 'src' is a scalar");
  }
  {
    Buffer wrong = i64_buffer(kCpu, {0, 1, 2});
    expect_error(rows_view(c.src, DType::kU8, 4, 32), rows_view(c.dst, DType::kU8, 4, 32),
                 "argument 'dst_idx' (tensor 2 of 4) has shape [4]", &wrong);
  }
  {
    auto i32 = Buffer::make(kCpu, DType::kI32, {4});
    ASSERT_TRUE(i32.ok());
    ASSERT_TRUE(i32->from_doubles({0, 1, 2, 3}).ok());
    expect_error(rows_view(c.src, DType::kU8, 4, 32), rows_view(c.dst, DType::kU8, 4, 32),
                 "argument 'src_idx' (tensor 1 of 4) has dtype i32, expected i64", &*i32);
  }
}

TEST(Kvcache, TransferLayersBadAttributesNameTheAttribute) {
  const KernelHandle h = handle("kvcache.transfer_layers", "cpu");
  Buffer si = i64_buffer(kCpu, {0}), di = i64_buffer(kCpu, {0});
  std::vector<uint8_t> dst(64, 0xee);
  Buffer src = bytes_buffer(kCpu, std::vector<uint8_t>(64, 1)), d = bytes_buffer(kCpu, dst);
  Buffer sp = i64_buffer(kCpu, {reinterpret_cast<int64_t>(src.tensor()->data)});
  Buffer dp = i64_buffer(kCpu, {reinterpret_cast<int64_t>(d.tensor()->data)});
  auto expect_error = [&](std::vector<int64_t> a, const std::string& needle) {
    DLTensor* args[] = {si.tensor(), di.tensor(), sp.tensor(), dp.tensor()};
    const kreg_attr attrs[] = {int_attr(a[0]), int_attr(a[1]), int_attr(a[2]), int_attr(a[3]),
                               int_attr(a[4])};
    Status st = h.call(args, attrs);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_TRUE(bytes_of(d) == dst) << "dst written by a refused call";
  };
  expect_error({24, 4, 4, 0, 0},
               "kvcache.transfer_layers: attribute 'row_bytes' is 24 bytes; rows must be a "
               "positive multiple of 16 bytes");
  expect_error({0, 4, 4, 0, 0}, "attribute 'row_bytes' is 0 bytes");
  expect_error({16, -1, 4, 0, 0}, "attribute 'src_rows' is -1; expected >= 0");
  expect_error({16, 4, -3, 0, 0}, "attribute 'dst_rows' is -3; expected >= 0");
  expect_error({32, 2, 2, 16, 0}, "attribute 'src_stride' is 16 bytes; expected 0");
  expect_error({16, 4, 4, 0, -16}, "attribute 'dst_stride' is -16 bytes");
}

// ---- GPU: every CUDA implementation against its CPU reference ----

class KvcacheGpu : public test::GpuTest {};

TEST_F(KvcacheGpu, StoreMatchesTheCpuReference) {
  const KernelHandle gpu = handle("kvcache.store", "cuda");
  const KernelHandle cpu = handle("kvcache.store", "cpu");
  // 4096 tokens of 8 x 128 (16 MiB of bf16 k and v, 32 MiB of f32): the flat kernel of
  // large calls; 4095: just below it in bf16.
  const StoreShape extra[] = {{1000, 8, 128, 80, 16},
                              {257, 1, 64, 300, 1},
                              {31, 4, 3, 11, 5},
                              {4096, 8, 128, 300, 16},
                              {4095, 8, 128, 300, 16}};
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
          StoreCase c = make_store(s, d.in, d.cache, idx, seed++, kCpu, false, ks, vs);
          const int64_t off = misalign ? 1 : 0;
          StoreCase g{device_copy(c.k, off),
                      device_copy(c.v, off),
                      device_copy(c.slots, off),
                      device_copy(c.k_cache, off),
                      device_copy(c.v_cache, off),
                      ks,
                      vs,
                      {},
                      {}};
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
  // One word a thread: blocks of 32-256 threads for calls below 33792 words (bf16 512+64
  // is 72 words a row: n = 469 the last small call, 470 the first 256-thread one), the
  // vs_torch shapes (n = 16, 64, 32768) and 9-word rows (64 + 8 bf16) that straddle warps.
  for (MlaShape s : std::initializer_list<MlaShape>{{16, 4096, 512, 64},
                                                    {64, 4096, 512, 64},
                                                    {469, 1000, 512, 64},
                                                    {470, 1000, 512, 64},
                                                    {32768, 65536, 512, 64},
                                                    {3001, 4000, 64, 8}}) {
    shapes.push_back(s);
  }
  uint64_t seed = 2000;
  for (const MlaShape& s : shapes) {
    for (DType dt : kMlaDtypes) {
      for (DType idx : {DType::kI32, DType::kI64}) {
        for (bool misalign : {false, true}) {
          SCOPED_TRACE("n=" + std::to_string(s.n) + " P=" + std::to_string(s.P) +
                       " Dn=" + std::to_string(s.Dn) + " Dr=" + std::to_string(s.Dr) + " " +
                       std::string(dtype_name(dt)) + (misalign ? " misaligned" : ""));
          MlaCase c = make_mla(s, dt, idx, seed++, kCpu);
          const int64_t off = misalign ? 1 : 0;
          MlaCase g{device_copy(c.kv_buffer, off),
                    device_copy(c.loc, off),
                    device_copy(c.k_nope, off),
                    device_copy(c.k_rope, off),
                    {}};
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
  StoreCase c = make_store({4, 2, 8, 2, 4}, DType::kBF16, DType::kBF16, DType::kI64, 1, kCpu);
  Status st = call_store(gpu, c);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("is on cpu:0, but backend cuda runs on cuda tensors"),
            std::string::npos)
      << st.message();
}

// Programmatic dependent launch (KREG_LAUNCH_PDL): a kernel may start before the one it
// follows has finished, so every store kernel must wait before it reads its rows or its
// indices. A chain whose links read the rows the link before wrote: a large store (16 MiB
// of bf16 k and v: the flat kernel) into caches C1, a second flat store of C1's first 4096
// slots into C2, a store of C2's first 1000 slots into C3 (the row kernel), an fp8 store of
// C3's first 512 slots into F4 (the fp8 kernel), and set_mla_kv_buffer of F4's rows
// (k_nope from F4's k, k_rope from its v) into an fp8 buffer (the one-word-a-thread kernel).
// Each round takes its indices from a window one element further into the same index
// arrays (padding and out-of-range entries included), so every round moves other rows and
// a stale read would show. Bit for bit what the same chain gives with plain launches.
// (set_mla's row kernel, taken from 2^31 words a call, is not in the chain.)
TEST_F(KvcacheGpu, PdlChainsReadWhatTheKernelBeforeWrote) {
  const DLDevice dev = kGpu;
  const KernelHandle store = handle("kvcache.store", "cuda");
  const KernelHandle mla = handle("kvcache.set_mla_kv_buffer", "cuda");
  constexpr int64_t kHk = 8, kD = 128, kRounds = 4;
  std::mt19937_64 rng(31);
  auto filled = [&](DType dt, std::vector<int64_t> shape) {
    auto b = Buffer::make(kCpu, dt, std::move(shape));
    EXPECT_TRUE(b.ok()) << b.status().message();
    EXPECT_TRUE(b->fill_random(rng).ok());
    return std::move(b).value();
  };
  auto fp8 = [&](std::vector<int64_t> shape) {  // random bytes, held as u8
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const std::vector<uint8_t> bytes = random_bytes(rng, n);
    return exact_buffer(kCpu, DType::kU8, std::move(shape), bytes.data());
  };
  // Indices for `tokens` tokens into `slots` slots, kRounds - 1 extra for the windows.
  auto indices = [&](DType dt, int64_t tokens, int64_t slots) {
    const std::vector<double> v = random_slots(rng, tokens + kRounds - 1, slots);
    const std::vector<int64_t> i64(v.begin(), v.end());
    const std::vector<int32_t> i32(v.begin(), v.end());
    const void* data = dt == DType::kI64 ? static_cast<const void*>(i64.data()) : i32.data();
    return exact_buffer(kCpu, dt, {static_cast<int64_t>(v.size())}, data);
  };
  const int64_t t0 = 4096, t2 = 1000, t3 = 512, n4 = 600, w4 = 576, p4 = 700;
  const std::vector<int64_t> c1_shape{300, 16, kHk, kD}, c3_shape{80, 16, kHk, kD},
      f4_shape{40, 16, kHk, kD};
  // The start state, copied to the device for every run.
  std::vector<Buffer> start;
  start.push_back(filled(DType::kBF16, {t0, kHk, kD}));  // 0, 1: k, v
  start.push_back(filled(DType::kBF16, {t0, kHk, kD}));
  for (int i = 0; i < 2; ++i) {  // 2-5: C1's and C2's k and v
    start.push_back(filled(DType::kBF16, c1_shape));
    start.push_back(filled(DType::kBF16, c1_shape));
  }
  start.push_back(filled(DType::kBF16, c3_shape));  // 6, 7: C3
  start.push_back(filled(DType::kBF16, c3_shape));
  start.push_back(fp8(f4_shape));  // 8, 9: F4 (fp8)
  start.push_back(fp8(f4_shape));
  start.push_back(fp8({p4, w4}));                   // 10: the MLA buffer (fp8)
  start.push_back(indices(DType::kI64, t0, 4800));  // 11-15: each link's indices
  start.push_back(indices(DType::kI32, t0, 4800));
  start.push_back(indices(DType::kI64, t2, 1280));
  start.push_back(indices(DType::kI32, t3, 640));
  start.push_back(indices(DType::kI64, n4, p4));
  const kreg_attr unscaled[] = {float_attr(1.0), float_attr(1.0)};
  const kreg_attr scaled[] = {float_attr(4.0), float_attr(0.003)};  // subnormals, saturation
  auto run_chain = [&](uint64_t flags) {
    std::vector<Buffer> b;
    for (const Buffer& s : start) {
      auto d = Buffer::make(dev, s.dtype(), s.shape());
      EXPECT_TRUE(d.ok()) << d.status().message();
      EXPECT_TRUE(d->copy_from(s).ok());
      b.push_back(std::move(d).value());
    }
    // The first `shape[0]` rows of buffer i as `dt` [shape], `skip` elements in.
    auto view = [&](size_t i, DType dt, std::vector<int64_t>& shape, int64_t skip = 0) {
      DLTensor t = *b[i].tensor();
      t.dtype = to_dl(dt);
      t.ndim = static_cast<int32_t>(shape.size());
      t.shape = shape.data();
      t.strides = nullptr;
      t.byte_offset = static_cast<uint64_t>(skip) * dtype_size(b[i].dtype());
      return t;
    };
    std::vector<int64_t> rows0{t0, kHk, kD}, rows2{t2, kHk, kD}, rows3{t3, kHk, kD};
    std::vector<int64_t> c1 = c1_shape, c3 = c3_shape, f4 = f4_shape, buf4{p4, w4};
    std::vector<int64_t> nope{n4, 512}, rope{n4, 64}, idx0{t0}, idx2{t2}, idx3{t3}, idx4{n4};
    const CallOptions opts{nullptr, nullptr, flags};
    auto run = [&](const KernelHandle& h, std::vector<DLTensor> t,
                   std::span<const kreg_attr> attrs) {
      std::vector<DLTensor*> args;
      for (DLTensor& x : t) args.push_back(&x);
      Status st = h.call(args, attrs, opts);
      EXPECT_TRUE(st.ok()) << h.spec().op << ": " << st.message();
    };
    for (int64_t r = 0; r < kRounds; ++r) {
      // k, v -> C1; C1 -> C2 (both flat); C2 -> C3 (row kernel); C3 -> F4 (fp8); F4 -> MLA.
      run(store,
          {view(0, DType::kBF16, rows0), view(1, DType::kBF16, rows0),
           view(11, DType::kI64, idx0, r), view(2, DType::kBF16, c1), view(3, DType::kBF16, c1)},
          unscaled);
      run(store,
          {view(2, DType::kBF16, rows0), view(3, DType::kBF16, rows0),
           view(12, DType::kI32, idx0, r), view(4, DType::kBF16, c1), view(5, DType::kBF16, c1)},
          unscaled);
      run(store,
          {view(4, DType::kBF16, rows2), view(5, DType::kBF16, rows2),
           view(13, DType::kI64, idx2, r), view(6, DType::kBF16, c3), view(7, DType::kBF16, c3)},
          unscaled);
      run(store,
          {view(6, DType::kBF16, rows3), view(7, DType::kBF16, rows3),
           view(14, DType::kI32, idx3, r), view(8, DType::kF8E4M3, f4),
           view(9, DType::kF8E4M3, f4)},
          scaled);
      run(mla,
          {view(10, DType::kF8E4M3, buf4), view(15, DType::kI64, idx4, r),
           view(8, DType::kF8E4M3, nope), view(9, DType::kF8E4M3, rope)},
          {});
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    std::vector<std::vector<uint8_t>> out;
    for (size_t i = 2; i <= 10; ++i) out.push_back(bytes_of(b[i]));
    return out;
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

// ---- GPU: the transfers, byte for byte against the CPU reference ----

TEST_F(KvcacheGpu, PinnedHarnessBuffersRoundTrip) {
  auto p = Buffer::make(kPinnedDev, DType::kBF16, {3, 5});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_FALSE(p->on_gpu());
  std::vector<double> v(15);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25 * static_cast<double>(i + 1);
  ASSERT_TRUE(p->from_doubles(v).ok());
  auto g = Buffer::make(kGpu, DType::kBF16, {3, 5});
  auto q = Buffer::make(kPinnedDev, DType::kBF16, {3, 5});
  ASSERT_TRUE(g.ok() && q.ok());
  ASSERT_TRUE(g->copy_from(*p).ok());
  ASSERT_TRUE(q->poison().ok());
  ASSERT_TRUE(q->copy_from(*g).ok());
  auto back = q->to_doubles();
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, v);
}

const char* place(DLDevice d) { return d.device_type == kDLCUDA ? "device" : "pinned"; }

TEST_F(KvcacheGpu, TransferMatchesTheCpuReferenceInEveryDirection) {
  const KernelHandle gpu = handle("kvcache.transfer", "cuda");
  const KernelHandle cpu = handle("kvcache.transfer", "cpu");
  uint64_t seed = 5000;
  int k = 0;
  for (DLDevice from : {kGpu, kPinnedDev}) {
    for (DLDevice to : {kGpu, kPinnedDev}) {
      for (const TransferShape& s : transfer_shapes()) {
        // 0: plain; 1: pinned tensors exported as kDLCPU (PyTorch); 2: 8-byte offset views
        // (not 16-byte aligned: the bytewise path).
        for (int variant = 0; variant < 3; ++variant) {
          SCOPED_TRACE(std::string(place(from)) + " -> " + place(to) + " " + label(s) +
                       (variant == 1   ? " pinned as kDLCPU"
                        : variant == 2 ? " offset 8"
                                       : ""));
          const DType dt =
              variant == 2 ? DType::kU8 : kTransferDtypes[k % std::size(kTransferDtypes)];
          const bool rank3 = k++ % 4 == 1;
          const int64_t offset = variant == 2 ? 8 : 0;
          const auto claim = variant == 1 ? std::optional<DLDeviceType>(kDLCPU) : std::nullopt;
          TransferCase g = make_transfer(s, seed, kGpu, from, to, offset);
          TransferCase c = make_transfer(s, seed++, kCpu, kCpu, kCpu, offset);
          Status st = run_transfer(gpu, g, dt, rank3, claim);
          ASSERT_TRUE(st.ok()) << st.message();
          ASSERT_TRUE(harness::device_synchronize().ok());
          ASSERT_TRUE(run_transfer(cpu, c, dt, rank3).ok());
          EXPECT_TRUE(dst_bytes(g) == dst_bytes(c)) << "dst differs from the CPU reference";
          EXPECT_TRUE(dst_bytes(c) == c.expect) << "the CPU reference differs from the oracle";
          EXPECT_TRUE(bytes_of(g.src) == bytes_of(c.src)) << "src changed";
        }
      }
    }
  }
}

// More rows than one pass of the grid covers (one wave of resident blocks: 2-3 blocks of
// 256 lanes per SM, 128 bytes each, ~13 MB on 132 SMs), so the grid-stride loop runs
// several rounds.
TEST_F(KvcacheGpu, TransferLargeCopiesTakeSeveralGridRounds) {
  const KernelHandle gpu = handle("kvcache.transfer", "cuda");
  const KernelHandle cpu = handle("kvcache.transfer", "cpu");
  uint64_t seed = 6000;
  for (int64_t row : {int64_t{4096}, int64_t{256}}) {
    const int64_t n = (int64_t{96} << 20) / row;
    const TransferShape s{n, n + 1000, n + 3000, row};
    for (auto [from, to] : {std::pair{kGpu, kPinnedDev}, std::pair{kPinnedDev, kGpu}}) {
      SCOPED_TRACE(std::string(place(from)) + " -> " + place(to) + " " + label(s));
      TransferCase g = make_transfer(s, seed, kGpu, from, to);
      TransferCase c = make_transfer(s, seed++, kCpu, kCpu, kCpu);
      Status st = run_transfer(gpu, g, DType::kBF16);
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_TRUE(harness::device_synchronize().ok());
      ASSERT_TRUE(run_transfer(cpu, c, DType::kBF16).ok());
      EXPECT_TRUE(dst_bytes(g) == dst_bytes(c)) << "dst differs from the CPU reference";
    }
  }
}

// One transfer_layers call whose layers go in different directions; the same layout on
// CPU buffers through the CPU reference. `skip` layers have a null destination address.
struct LayerPlan {
  DLDevice from, to;
  bool skip = false;
};

void check_layers(const KernelHandle& gpu, const KernelHandle& cpu,
                  const std::vector<LayerPlan>& plan, const TransferShape& s, bool page_first_src,
                  int64_t misalign, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const TransferIndices idx = random_transfer_indices(rng, s);
  const auto layers = static_cast<int64_t>(plan.size());
  const int64_t row = s.row_bytes;
  const int64_t src_stride = page_first_src ? layers * row : row;
  std::deque<Buffer> gbufs, cbufs;  // owners (deque: stable addresses)
  std::vector<int64_t> gsp, gdp, csp, cdp;
  std::vector<std::pair<Buffer*, Buffer*>> dsts;  // (gpu, cpu) destination of each layer
  auto addr = [](Buffer& b, int64_t off) {
    return reinterpret_cast<int64_t>(static_cast<uint8_t*>(b.tensor()->data) + off);
  };
  if (page_first_src) {  // every layer's source in one token-major buffer, where plan[0] says
    const auto bytes = random_bytes(rng, s.src_rows * layers * row);
    gbufs.push_back(bytes_buffer(plan[0].from, bytes));
    cbufs.push_back(bytes_buffer(kCpu, bytes));
  }
  Buffer* gpf = page_first_src ? &gbufs.front() : nullptr;
  Buffer* cpf = page_first_src ? &cbufs.front() : nullptr;
  for (int64_t l = 0; l < layers; ++l) {
    const LayerPlan& p = plan[static_cast<size_t>(l)];
    const int64_t off = l == 1 ? misalign : 0;  // layer 1's bases may be misaligned
    if (page_first_src) {
      gsp.push_back(addr(*gpf, l * row));
      csp.push_back(addr(*cpf, l * row));
    } else {
      const auto bytes = random_bytes(rng, off + s.src_rows * row);
      gbufs.push_back(bytes_buffer(p.from, bytes));
      cbufs.push_back(bytes_buffer(kCpu, bytes));
      gsp.push_back(addr(gbufs.back(), off));
      csp.push_back(addr(cbufs.back(), off));
    }
    const auto bytes = random_bytes(rng, off + s.dst_rows * row);
    gbufs.push_back(bytes_buffer(p.to, bytes));
    cbufs.push_back(bytes_buffer(kCpu, bytes));
    dsts.emplace_back(&gbufs.back(), &cbufs.back());
    gdp.push_back(p.skip ? 0 : addr(gbufs.back(), off));
    cdp.push_back(p.skip ? 0 : addr(cbufs.back(), off));
  }
  Buffer gsi = i64_buffer(kGpu, idx.src), gdi = i64_buffer(kGpu, idx.dst);
  Buffer gspb = i64_buffer(kGpu, gsp), gdpb = i64_buffer(kGpu, gdp);
  Buffer csi = i64_buffer(kCpu, idx.src), cdi = i64_buffer(kCpu, idx.dst);
  Buffer cspb = i64_buffer(kCpu, csp), cdpb = i64_buffer(kCpu, cdp);
  const kreg_attr attrs[] = {int_attr(row), int_attr(s.src_rows), int_attr(s.dst_rows),
                             int_attr(page_first_src ? src_stride : 0), int_attr(0)};
  DLTensor* gargs[] = {gsi.tensor(), gdi.tensor(), gspb.tensor(), gdpb.tensor()};
  DLTensor* cargs[] = {csi.tensor(), cdi.tensor(), cspb.tensor(), cdpb.tensor()};
  Status st = gpu.call(gargs, attrs);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok());
  st = cpu.call(cargs, attrs);
  ASSERT_TRUE(st.ok()) << st.message();
  for (int64_t l = 0; l < layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l) + ": " + place(plan[static_cast<size_t>(l)].from) +
                 " -> " + place(plan[static_cast<size_t>(l)].to));
    auto [g, c] = dsts[static_cast<size_t>(l)];
    EXPECT_TRUE(bytes_of(*g) == bytes_of(*c)) << "dst differs from the CPU reference";
  }
}

TEST_F(KvcacheGpu, TransferLayersMixesDirectionsInOneLaunch) {
  const KernelHandle gpu = handle("kvcache.transfer_layers", "cuda");
  const KernelHandle cpu = handle("kvcache.transfer_layers", "cpu");
  const std::vector<LayerPlan> mixed = {{kGpu, kPinnedDev},
                                        {kPinnedDev, kGpu},
                                        {kGpu, kGpu},
                                        {kPinnedDev, kPinnedDev},
                                        {kGpu, kPinnedDev, true}};
  const std::vector<LayerPlan> load = {{kPinnedDev, kGpu}, {kPinnedDev, kGpu}, {kPinnedDev, kGpu}};
  uint64_t seed = 7000;
  for (int64_t row : kRowBytes) {
    for (const TransferShape& s :
         {TransferShape{1, 1, 1, row}, TransferShape{7, 5, 9, row},
          TransferShape{300, 260, 310, row}, TransferShape{0, 3, 3, row}}) {
      SCOPED_TRACE(label(s));
      {
        SCOPED_TRACE("L=5 mixed directions, one layer left out");
        check_layers(gpu, cpu, mixed, s, false, 0, seed++);
      }
      {
        SCOPED_TRACE("L=5, layer 1 at 4-byte offsets (bytewise)");
        check_layers(gpu, cpu, mixed, s, false, 4, seed++);
      }
      {
        SCOPED_TRACE("L=3 from one page-first pinned buffer (src_stride = L * row)");
        check_layers(gpu, cpu, load, s, true, 0, seed++);
      }
    }
  }
  // 80 layers: the resident blocks are shared by 80 layers (a handful each), so each
  // layer's rows take several grid rounds.
  std::vector<LayerPlan> many(80, LayerPlan{kGpu, kPinnedDev});
  check_layers(gpu, cpu, many, TransferShape{2000, 2100, 2200, 256}, false, 0, seed++);
}

TEST_F(KvcacheGpu, TransferRefusesPageableHostMemory) {
  const KernelHandle gpu = handle("kvcache.transfer", "cuda");
  // dst in plain (pageable) CPU memory.
  TransferCase c = make_transfer({4, 4, 4, 64}, 1, kGpu, kGpu, kCpu);
  const auto before = bytes_of(c.dst);
  Status st = run_transfer(gpu, c, DType::kU8);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("kvcache.transfer: argument 'dst' is in pageable host memory: pin "
                              "it (cudaHostAlloc / tensor.pin_memory())"),
            std::string::npos)
      << st.message();
  // Pageable memory that claims to be page-locked (kDLCUDAHost) is refused the same way.
  TransferCase d = make_transfer({4, 4, 4, 64}, 2, kGpu, kCpu, kGpu);
  st = run_transfer(gpu, d, DType::kU8, false, kDLCUDAHost);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("argument 'src' is in pageable host memory"), std::string::npos)
      << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok()) << "a refused call must launch nothing";
  EXPECT_TRUE(bytes_of(c.dst) == before);
  // The device is fine afterwards: a pinned transfer works.
  TransferCase ok = make_transfer({4, 4, 4, 64}, 3, kGpu, kGpu, kPinnedDev);
  st = run_transfer(gpu, ok, DType::kU8);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok());
  EXPECT_TRUE(dst_bytes(ok) == ok.expect);
}

TEST_F(KvcacheGpu, TransferRefusesBadRowsAndCpuIndices) {
  const KernelHandle gpu = handle("kvcache.transfer", "cuda");
  TransferCase c = make_transfer({4, 4, 4, 32}, 1, kGpu, kGpu, kPinnedDev);
  RowsView src = rows_view(c.src, DType::kF32, 4, 32), dst = rows_view(c.dst, DType::kF32, 4, 32);
  src.shape = {8, 3};
  dst.shape = {8, 3};
  Status st = call_transfer(gpu, c.src_idx, c.dst_idx, src, dst);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("the row size of 'src' and 'dst' is 12 bytes; rows must be a "
                              "positive multiple of 16 bytes"),
            std::string::npos)
      << st.message();
  // Indices must live on the device (the first tensor decides the call's device).
  TransferCase h = make_transfer({4, 4, 4, 32}, 1, kCpu, kGpu, kPinnedDev);
  st = run_transfer(gpu, h, DType::kU8);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("is on cpu:0, but backend cuda runs on cuda tensors"),
            std::string::npos)
      << st.message();
  // transfer_layers: the attributes are checked before anything is read.
  const KernelHandle layers = handle("kvcache.transfer_layers", "cuda");
  Buffer si = i64_buffer(kGpu, {0}), di = i64_buffer(kGpu, {0});
  Buffer sp = i64_buffer(kGpu, {0}), dp = i64_buffer(kGpu, {0});
  DLTensor* args[] = {si.tensor(), di.tensor(), sp.tensor(), dp.tensor()};
  const kreg_attr attrs[] = {int_attr(40), int_attr(1), int_attr(1), int_attr(0), int_attr(0)};
  st = layers.call(args, attrs);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("attribute 'row_bytes' is 40 bytes"), std::string::npos)
      << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok());
}

}  // namespace
}  // namespace kreg
