// The grammar group: apply_token_bitmask's CPU reference against a bit-loop oracle
// written here (random masks of several densities and word patterns, V not a multiple of
// 32, bitmasks wider than needed, with and without indices, every float dtype), the CUDA
// kernel byte for byte against the CPU reference (awkward and large vocabularies,
// misaligned logits, out-of-range indices skipped, PDL chains; skipped without a GPU),
// and bad arguments refused with messages naming the op and the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
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

constexpr const char* kOp = "grammar.apply_token_bitmask";
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// How a random mask's words are drawn: each word is all-allowed with probability
// `all_allowed`, all-banned with `all_banned`, else random bits each set (allowed) with
// probability `density`.
struct MaskStyle {
  const char* name;
  double all_allowed;
  double all_banned;
  double density;
};

const MaskStyle kStyles[] = {
    {"sparse", 0.0, 0.0, 0.01}, {"half", 0.0, 0.0, 0.5},        {"dense", 0.0, 0.0, 0.99},
    {"words", 0.4, 0.4, 0.5},   {"all allowed", 1.0, 0.0, 1.0}, {"all banned", 0.0, 1.0, 0.0},
};

std::vector<int32_t> random_mask(int64_t rows, int64_t words, const MaskStyle& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int32_t> m(at(rows * words));
  for (int32_t& w : m) {
    const double pick = u(rng);
    uint32_t bits = 0;
    if (pick < s.all_allowed) {
      bits = 0xffffffffu;
    } else if (pick >= s.all_allowed + s.all_banned) {
      for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>(u(rng) < s.density) << j;
    }
    w = static_cast<int32_t>(bits);
  }
  return m;
}

std::vector<double> random_logits(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0, 3);
  std::vector<double> v(at(n));
  for (double& e : v) {
    e = g(rng);
    if (e == 0) e = 0.5;
  }
  return v;
}

Buffer float_buffer(DLDevice dev, DType dt, std::vector<int64_t> shape,
                    const std::vector<double>& v) {
  auto b = Buffer::make(dev, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return Buffer{};
  EXPECT_TRUE(b->from_doubles(v).ok());
  return std::move(b).value();
}

Buffer i32_buffer(DLDevice dev, std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  return exact_buffer(dev, DType::kI32, std::move(shape), v.data());
}

KernelHandle resolve(const std::string& backend, DType dt) {
  auto h = registry().resolve(kOp, Target{backend == "cpu" ? kCpu : kGpu, dt}, {backend});
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : KernelHandle{};
}

// One call: logits [B,V], bitmask [B,W], optional indices [R], all on `dev`.
struct Call {
  Buffer logits, bitmask;
  std::optional<Buffer> indices;
  Status run(const KernelHandle& h, uint64_t flags = 0) {
    DLTensor* t[] = {logits.tensor(), bitmask.tensor(), indices ? indices->tensor() : nullptr};
    return h.call(t, {}, CallOptions{nullptr, nullptr, flags});
  }
};

Call make_call(DLDevice dev, DType dt, int64_t b, int64_t v, int64_t w, const MaskStyle& s,
               const std::optional<std::vector<int32_t>>& idx, uint64_t seed) {
  Call c{float_buffer(dev, dt, {b, v}, random_logits(b * v, seed)),
         i32_buffer(dev, {b, w}, random_mask(b, w, s, seed + 1)), std::nullopt};
  if (idx) c.indices = i32_buffer(dev, {static_cast<int64_t>(idx->size())}, *idx);
  return c;
}

// The oracle: the bit loop, row by row, on the logits as they were before the call.
std::vector<double> oracle(const std::vector<double>& logits, const std::vector<int32_t>& mask,
                           int64_t b, int64_t v, int64_t w,
                           const std::optional<std::vector<int32_t>>& idx) {
  std::vector<double> want = logits;
  std::vector<int64_t> rows;
  if (idx) {
    for (int32_t r : *idx) rows.push_back(r);
  } else {
    for (int64_t r = 0; r < b; ++r) rows.push_back(r);
  }
  for (int64_t row : rows) {
    for (int64_t t = 0; t < v; ++t) {
      const uint32_t word = static_cast<uint32_t>(mask[at(row * w + t / 32)]);
      if (!((word >> (t % 32)) & 1u)) want[at(row * v + t)] = kNegInf;
    }
  }
  return want;
}

std::vector<int32_t> mask_of(const Buffer& b) {
  const std::vector<uint8_t> bytes = bytes_of(b);
  std::vector<int32_t> m(bytes.size() / 4);
  if (!bytes.empty()) std::memcpy(m.data(), bytes.data(), bytes.size());  // never null pointers
  return m;
}

const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

struct Shape {
  int64_t b, v, w;
};
// V a multiple of 32 or not, W exactly ceil(V/32) or wider, one row, no rows, no tokens.
const Shape kShapes[] = {{1, 1, 1},     {3, 37, 2}, {2, 64, 2}, {4, 100, 5}, {1, 4097, 129},
                         {5, 1000, 40}, {2, 32, 1}, {0, 64, 2}, {2, 0, 1},   {3, 257, 9}};

std::vector<std::optional<std::vector<int32_t>>> index_sets(int64_t b) {
  std::vector<std::optional<std::vector<int32_t>>> sets = {std::nullopt, std::vector<int32_t>{}};
  if (b >= 1) sets.push_back(std::vector<int32_t>{static_cast<int32_t>(b - 1)});
  if (b >= 3) sets.push_back(std::vector<int32_t>{2, 0, 2});  // a subset, out of order, repeated
  return sets;
}

std::string label(DType dt, const Shape& s, const MaskStyle& st,
                  const std::optional<std::vector<int32_t>>& idx) {
  std::string l = std::string(dtype_name(dt)) + " B=" + std::to_string(s.b) +
                  " V=" + std::to_string(s.v) + " W=" + std::to_string(s.w) + " " + st.name;
  if (idx) l += " indices[" + std::to_string(idx->size()) + "]";
  return l;
}

TEST(Grammar, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("grammar.")) shipped.push_back(id);
  }
  EXPECT_EQ(shipped, std::vector<std::string>{kOp}) << "a new op needs an oracle in this file";
}

TEST(Grammar, CpuReferenceMatchesTheBitLoop) {
  uint64_t seed = 1;
  for (DType dt : kDtypes) {
    const KernelHandle h = resolve("cpu", dt);
    ASSERT_TRUE(h.valid());
    for (const Shape& s : kShapes) {
      for (const MaskStyle& st : kStyles) {
        for (const auto& idx : index_sets(s.b)) {
          const std::string what = label(dt, s, st, idx);
          Call c = make_call(kCpu, dt, s.b, s.v, s.w, st, idx, seed += 2);
          const std::vector<double> before = values(c.logits);
          const std::vector<double> want = oracle(before, mask_of(c.bitmask), s.b, s.v, s.w, idx);
          ASSERT_TRUE(c.run(h).ok()) << what;
          EXPECT_EQ(values(c.logits), want) << what;
        }
      }
    }
  }
}

// Allowed logits are not rewritten at all: their bytes (a NaN payload included) survive.
TEST(Grammar, AllowedLogitsKeepTheirBytes) {
  const KernelHandle h = resolve("cpu", DType::kF32);
  const std::vector<float> logits = {std::numeric_limits<float>::quiet_NaN(), 1.0f, -0.0f, 2.0f};
  Call c{exact_buffer(kCpu, DType::kF32, {1, 4}, logits.data()), i32_buffer(kCpu, {1, 1}, {0b0101}),
         std::nullopt};
  ASSERT_TRUE(c.run(h).ok());
  const auto* got = static_cast<const float*>(c.logits.tensor()->data);
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(got[2]) && got[2] == 0.0f);
  EXPECT_EQ(got[3], -std::numeric_limits<float>::infinity());
}

// ---- Bad arguments ----

TEST(Grammar, BadArgumentsAreRefusedAndWriteNothing) {
  const KernelHandle h = resolve("cpu", DType::kF32);
  const MaskStyle& half = kStyles[1];
  auto expect_refused = [&](Call& c, const std::string& text) {
    const std::vector<double> before = values(c.logits);
    const Status st = c.run(h);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << text;
    EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
    EXPECT_EQ(values(c.logits), before) << "a refused call wrote logits: " << text;
  };
  // A bitmask too narrow for the vocabulary (xgrammar#694 left such tokens unmasked).
  Call narrow = make_call(kCpu, DType::kF32, 2, 65, 2, half, std::nullopt, 1);
  expect_refused(narrow,
                 "grammar.apply_token_bitmask: bitmask has W = 2 words per row, which cover 64 "
                 "tokens; V = 65 needs W >= 3");
  Call none = make_call(kCpu, DType::kF32, 2, 5, 0, half, std::nullopt, 1);
  expect_refused(none, "bitmask has W = 0 words per row");
  // An index outside [0, B): the CPU reference names it (CUDA skips it).
  Call out_of_range = make_call(kCpu, DType::kF32, 3, 40, 2, half, std::vector<int32_t>{1, 3}, 2);
  expect_refused(out_of_range, "grammar.apply_token_bitmask: indices[1] = 3 is outside [0, B = 3)");
  Call negative = make_call(kCpu, DType::kF32, 3, 40, 2, half, std::vector<int32_t>{-1}, 2);
  expect_refused(negative, "indices[0] = -1 is outside [0, B = 3)");
  // indices of rank 2.
  Call rank2 = make_call(kCpu, DType::kF32, 3, 40, 2, half, std::nullopt, 3);
  rank2.indices = i32_buffer(kCpu, {1, 2}, {0, 1});
  expect_refused(rank2,
                 "grammar.apply_token_bitmask: indices must be one-dimensional [R], got rank 2");
  // Wrong dtypes: i64 indices, an f32 bitmask, integer logits.
  Call i64_idx = make_call(kCpu, DType::kF32, 3, 40, 2, half, std::nullopt, 4);
  const std::vector<int64_t> idx64 = {0};
  i64_idx.indices = exact_buffer(kCpu, DType::kI64, {1}, idx64.data());
  expect_refused(i64_idx, "indices");
  Call f32_mask = make_call(kCpu, DType::kF32, 2, 40, 2, half, std::nullopt, 5);
  f32_mask.bitmask = float_buffer(kCpu, DType::kF32, {2, 2}, {1, 2, 3, 4});
  expect_refused(f32_mask, "bitmask");
  Call int_logits = make_call(kCpu, DType::kF32, 2, 40, 2, half, std::nullopt, 6);
  const std::vector<int32_t> ints(80, 7);
  int_logits.logits = i32_buffer(kCpu, {2, 40}, ints);
  expect_refused(int_logits, "logits");
  // A bitmask with another batch than the logits.
  Call batch = make_call(kCpu, DType::kF32, 2, 40, 2, half, std::nullopt, 7);
  batch.bitmask = i32_buffer(kCpu, {3, 2}, {1, 2, 3, 4, 5, 6});
  expect_refused(batch, "bitmask");
}

// ---- CUDA against the CPU reference, byte for byte ----

class GpuGrammar : public test::GpuTest {};

// Runs the same call on both backends from the same inputs; `offset` elements of padding
// in front of the device logits defeat 16-byte vectors.
void check_gpu(DType dt, const Shape& s, const MaskStyle& st,
               const std::optional<std::vector<int32_t>>& idx, uint64_t seed, int64_t offset = 0,
               uint64_t flags = 0) {
  const std::string what = label(dt, s, st, idx) + (offset ? " offset" : "");
  Call host = make_call(kCpu, dt, s.b, s.v, s.w, st, idx, seed);
  std::vector<double> padded = values(host.logits);
  padded.insert(padded.begin(), at(offset), 0.25);
  Buffer dev_logits = float_buffer(kGpu, dt, {s.b * s.v + offset}, padded);
  DLTensor view = *host.logits.tensor();
  view.device = kGpu;
  view.data = dev_logits.tensor()->data;
  view.byte_offset = static_cast<uint64_t>(offset) * dtype_size(dt);
  Buffer dev_mask = i32_buffer(kGpu, {s.b, s.w}, mask_of(host.bitmask));
  std::optional<Buffer> dev_idx;
  if (idx) dev_idx = i32_buffer(kGpu, {static_cast<int64_t>(idx->size())}, *idx);
  DLTensor* t[] = {&view, dev_mask.tensor(), dev_idx ? dev_idx->tensor() : nullptr};
  ASSERT_TRUE(resolve("cuda", dt).call(t, {}, CallOptions{nullptr, nullptr, flags}).ok()) << what;
  ASSERT_TRUE(harness::device_synchronize().ok());
  // The CPU reference on the in-range indices only (CUDA skips the others).
  std::optional<std::vector<int32_t>> valid;
  if (idx) {
    valid.emplace();
    for (int32_t r : *idx) {
      if (r >= 0 && r < s.b) valid->push_back(r);
    }
    host.indices = i32_buffer(kCpu, {static_cast<int64_t>(valid->size())}, *valid);
  }
  ASSERT_TRUE(host.run(resolve("cpu", dt)).ok()) << what;
  std::vector<uint8_t> got = bytes_of(dev_logits);
  got.erase(got.begin(), got.begin() + offset * static_cast<int64_t>(dtype_size(dt)));
  EXPECT_TRUE(got == bytes_of(host.logits)) << what << ": CUDA differs from the CPU reference";
}

TEST_F(GpuGrammar, MatchesTheCpuReferenceByteForByte) {
  uint64_t seed = 100;
  for (DType dt : kDtypes) {
    for (const Shape& s : kShapes) {
      for (const MaskStyle& st : kStyles) {
        for (const auto& idx : index_sets(s.b)) check_gpu(dt, s, st, idx, seed += 2);
      }
    }
  }
}

TEST_F(GpuGrammar, LargeVocabulariesMisalignedLogitsAndSkippedIndices) {
  uint64_t seed = 900;
  const Shape large[] = {
      {1, 128000, 4000}, {1, 151936, 4748}, {7, 50257, 1571}, {64, 32001, 1001}, {3, 128256, 4100}};
  for (DType dt : kDtypes) {
    for (const Shape& s : large) {
      for (const MaskStyle& st : kStyles) check_gpu(dt, s, st, std::nullopt, seed += 2);
      check_gpu(dt, s, kStyles[3], std::vector<int32_t>{0}, seed += 2);
    }
    for (int64_t offset : {1, 2, 3}) {
      check_gpu(dt, {3, 1000, 32}, kStyles[3], std::nullopt, seed += 2, offset);
      check_gpu(dt, {4, 4096, 128}, kStyles[1], std::vector<int32_t>{3, 1}, seed += 2, offset);
    }
    // Out-of-range indices are skipped on CUDA: the rest are masked as the CPU masks them.
    check_gpu(dt, {4, 300, 10}, kStyles[1], std::vector<int32_t>{-1, 2, 4, 1000000, 0}, seed += 2);
    check_gpu(dt, {4, 300, 10}, kStyles[1], std::vector<int32_t>{-5}, seed += 2);
  }
}

TEST_F(GpuGrammar, BadArgumentsAreRefusedOnCudaToo) {
  Call narrow = make_call(kGpu, DType::kBF16, 2, 65, 2, kStyles[1], std::nullopt, 1);
  const Status st = narrow.run(resolve("cuda", DType::kBF16));
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("V = 65 needs W >= 3"), std::string::npos) << st.message();
  Call rank2 = make_call(kGpu, DType::kBF16, 3, 40, 2, kStyles[1], std::nullopt, 3);
  rank2.indices = i32_buffer(kGpu, {1, 2}, {0, 1});
  EXPECT_NE(rank2.run(resolve("cuda", DType::kBF16)).message().find("one-dimensional"),
            std::string::npos);
  Call empty = make_call(kGpu, DType::kBF16, 0, 64, 2, kStyles[1], std::nullopt, 3);
  EXPECT_TRUE(empty.run(resolve("cuda", DType::kBF16)).ok());
  Call no_rows = make_call(kGpu, DType::kBF16, 3, 64, 2, kStyles[1], std::vector<int32_t>{}, 3);
  EXPECT_TRUE(no_rows.run(resolve("cuda", DType::kBF16)).ok());
  EXPECT_TRUE(harness::device_synchronize().ok());
}

// With KREG_LAUNCH_PDL the mask kernel may start before the kernel that wrote the logits
// (elementwise.add_constant here, over a large batch) has finished; it must mask what that
// kernel wrote, and the kernel after it must read the masked logits.
TEST_F(GpuGrammar, PdlChainsReadWhatTheKernelBeforeWrote) {
  const int64_t b = 256, v = 128000, w = 4000;
  const DType dt = DType::kBF16;
  auto add =
      registry().resolve("elementwise.add_constant", Target{kGpu, dt}, {std::string("cuda")});
  auto cap = registry().resolve("elementwise.softcap", Target{kGpu, dt}, {std::string("cuda")});
  ASSERT_TRUE(add.ok() && cap.ok());
  const KernelHandle mask = resolve("cuda", dt);
  Buffer x = float_buffer(kGpu, dt, {b, v}, random_logits(b * v, 1));
  Buffer bits = i32_buffer(kGpu, {b, w}, random_mask(b, w, kStyles[3], 2));
  auto run_chain = [&](uint64_t flags) {
    Buffer logits = float_buffer(kGpu, dt, {b, v}, random_logits(b * v, 3));
    Buffer out = float_buffer(kGpu, dt, {b, v}, random_logits(b * v, 4));
    const kreg_attr half = float_attr(0.5), thirty = float_attr(30.0);
    for (int i = 0; i < 3; ++i) {
      DLTensor* a[] = {x.tensor(), logits.tensor()};
      EXPECT_TRUE(add->call(a, {&half, 1}, CallOptions{nullptr, nullptr, 0}).ok());
      DLTensor* m[] = {logits.tensor(), bits.tensor(), nullptr};
      EXPECT_TRUE(mask.call(m, {}, CallOptions{nullptr, nullptr, flags}).ok());
      DLTensor* c[] = {logits.tensor(), out.tensor()};
      EXPECT_TRUE(cap->call(c, {&thirty, 1}, CallOptions{nullptr, nullptr, flags}).ok());
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{bytes_of(logits), bytes_of(out)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

}  // namespace
}  // namespace kreg
