// The kv_canary group: the CPU references against an oracle written here (the documented
// hash functions, re-implemented, and the records and violations each plan must
// produce), planted corruptions (a flipped bit in K/V, a slot overwritten by another
// request, a stale slot reused, shuffled pages, out-of-range slots) each detected with
// the right reason, thousands of clean runs reporting nothing, the ring buffer's
// capacity, CUDA against the CPU reference on the same scenarios (skipped without a
// GPU), and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

// ---- The oracle: docs/ops/kv_canary.md, written again ----

uint64_t splitmix_finaliser(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}
constexpr uint64_t kSeed = 0x4b5643414e415259ull;  // "KVCANARY"
constexpr uint64_t kPhi = 0x9e3779b97f4a7c15ull;

uint64_t chain_of(uint64_t prev, int64_t token, int64_t position) {
  return splitmix_finaliser(splitmix_finaliser(prev ^ static_cast<uint64_t>(token)) +
                            static_cast<uint64_t>(position) + kPhi);
}

uint64_t hash_of_row(const uint8_t* row, int64_t bytes) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < bytes / 8; ++i) {
    uint64_t w = 0;
    for (int b = 7; b >= 0; --b) w = (w << 8) | row[8 * i + b];  // little-endian words
    sum += splitmix_finaliser(w + static_cast<uint64_t>(i + 1) * kPhi);
  }
  return splitmix_finaliser(static_cast<uint64_t>(bytes) + sum);
}

struct PlanRow {
  int64_t slot, token, position, prev;
};
using Plan = std::vector<PlanRow>;
struct Violation {
  int64_t slot, reason, expected, found;
  auto operator<=>(const Violation&) const = default;
};

// The world the tests run in: S slots of R bytes of K/V, their records, and requests.
struct World {
  int64_t S = 0, R = 0;
  std::vector<int64_t> records;  // S x 4
  std::vector<uint8_t> kv;       // S x R
};

bool valid(const PlanRow& r, int64_t S) {
  return r.slot >= 0 && r.slot < S && r.prev >= -1 && r.prev < S;
}

void oracle_stamp(World& w, const Plan& plan, bool hash) {
  std::map<size_t, uint64_t> fresh;  // plan row -> its chain
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlanRow& r = plan[i];
    if (!valid(r, w.S)) continue;
    uint64_t prev = kSeed;
    if (i > 0 && valid(plan[i - 1], w.S) && r.prev == plan[i - 1].slot) {
      prev = fresh.at(i - 1);
    } else if (r.prev >= 0) {
      prev = static_cast<uint64_t>(w.records[static_cast<size_t>(4 * r.prev + 2)]);
    }
    fresh[i] = chain_of(prev, r.token, r.position);
    int64_t* rec = &w.records[static_cast<size_t>(4 * r.slot)];
    rec[0] = r.token;
    rec[1] = r.position;
    rec[2] = static_cast<int64_t>(fresh[i]);
    rec[3] =
        hash ? static_cast<int64_t>(hash_of_row(&w.kv[static_cast<size_t>(r.slot * w.R)], w.R)) : 0;
  }
}

std::vector<Violation> oracle_verify(const World& w, const Plan& plan, bool hash) {
  std::vector<Violation> out;
  for (const PlanRow& r : plan) {
    if (!valid(r, w.S)) {
      out.push_back({r.slot, 16, w.S, (r.slot >= 0 && r.slot < w.S) ? r.prev : r.slot});
      continue;
    }
    const int64_t* rec = &w.records[static_cast<size_t>(4 * r.slot)];
    const uint64_t prev =
        r.prev < 0 ? kSeed : static_cast<uint64_t>(w.records[static_cast<size_t>(4 * r.prev + 2)]);
    const auto chain = static_cast<int64_t>(chain_of(prev, r.token, r.position));
    const auto data =
        static_cast<int64_t>(hash_of_row(&w.kv[static_cast<size_t>(r.slot * w.R)], w.R));
    std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> bad;
    if (rec[0] != r.token) bad.push_back({1, {r.token, rec[0]}});
    if (rec[1] != r.position) bad.push_back({2, {r.position, rec[1]}});
    if (rec[2] != chain) bad.push_back({4, {chain, rec[2]}});
    if (hash && rec[3] != data) bad.push_back({8, {data, rec[3]}});
    if (bad.empty()) continue;
    int64_t reason = 0;
    for (const auto& b : bad) reason |= b.first;
    out.push_back({r.slot, reason, bad[0].second.first, bad[0].second.second});
  }
  return out;
}

// ---- Running the ops on a backend ----

Buffer i64_buffer(DLDevice dev, std::vector<int64_t> shape, const int64_t* src) {
  return test::exact_buffer(dev, DType::kI64, std::move(shape), src);
}

Buffer u8_buffer(DLDevice dev, std::vector<int64_t> shape, const uint8_t* src) {
  return test::exact_buffer(dev, DType::kU8, std::move(shape), src);
}

// Exact int64 contents (Buffer::to_doubles would round 64-bit hashes).
std::vector<int64_t> read_i64(const Buffer& b) {
  const std::vector<uint8_t> bytes = test::bytes_of(b);
  std::vector<int64_t> v(bytes.size() / sizeof(int64_t));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(int64_t));
  return v;
}

std::vector<int64_t> flatten(const Plan& plan) {
  std::vector<int64_t> v;
  for (const PlanRow& r : plan) v.insert(v.end(), {r.slot, r.token, r.position, r.prev});
  return v;
}

// Runs kv_canary.stamp on `dev`, updating w.records.
void run_stamp(DLDevice dev, World& w, const Plan& plan, bool hash) {
  const KernelHandle h = handle("kv_canary.stamp", dev.device_type == kDLCPU ? "cpu" : "cuda");
  Buffer rec = i64_buffer(dev, {w.S, 4}, w.records.data());
  auto flat = flatten(plan);
  Buffer p = i64_buffer(dev, {static_cast<int64_t>(plan.size()), 4}, flat.data());
  Buffer kv = u8_buffer(dev, {w.S, w.R}, w.kv.data());
  DLTensor* args[] = {rec.tensor(), p.tensor(), hash ? kv.tensor() : nullptr};
  Status st = h.call(args);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok());
  w.records = read_i64(rec);
}

struct VerifyResult {
  int64_t count = 0;
  std::vector<Violation> stored;  // sorted
  std::vector<int64_t> raw;       // the whole ring buffer
};

VerifyResult run_verify(DLDevice dev, const World& w, const Plan& plan, bool hash,
                        int64_t cap = 4096, int64_t count0 = 0) {
  VerifyResult out;
  const KernelHandle h = handle("kv_canary.verify", dev.device_type == kDLCPU ? "cpu" : "cuda");
  Buffer rec = i64_buffer(dev, {w.S, 4}, w.records.data());
  auto flat = flatten(plan);
  Buffer p = i64_buffer(dev, {static_cast<int64_t>(plan.size()), 4}, flat.data());
  Buffer kv = u8_buffer(dev, {w.S, w.R}, w.kv.data());
  std::vector<int64_t> ring(static_cast<size_t>(4 * cap), -7);  // -7: never written
  Buffer viol = i64_buffer(dev, {cap, 4}, ring.data());
  Buffer count = i64_buffer(dev, {1}, &count0);
  DLTensor* args[] = {rec.tensor(), p.tensor(), viol.tensor(), count.tensor(),
                      hash ? kv.tensor() : nullptr};
  Status st = h.call(args);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(harness::device_synchronize().ok());
  out.count = read_i64(count)[0];
  out.raw = read_i64(viol);
  const int64_t stored = std::clamp<int64_t>(out.count - count0, 0, cap - count0);
  for (int64_t i = count0; i < count0 + stored; ++i) {
    const int64_t* v = &out.raw[static_cast<size_t>(4 * i)];
    out.stored.push_back({v[0], v[1], v[2], v[3]});
  }
  std::sort(out.stored.begin(), out.stored.end());
  EXPECT_EQ(read_i64(rec), w.records) << "verify must not write the records";
  return out;
}

// ---- Scenarios: requests allocating slots, prefilling and decoding ----

struct Request {
  std::vector<int64_t> slots, tokens;  // position = index
};

struct Scenario {
  World w;
  std::vector<Request> reqs;
  std::vector<int64_t> free_slots;
  std::mt19937_64 rng;

  Scenario(int64_t S, int64_t R, uint64_t seed) : rng(seed) {
    w.S = S;
    w.R = R;
    w.records.assign(static_cast<size_t>(4 * S), 0);
    w.kv.resize(static_cast<size_t>(S * R));
    for (uint8_t& b : w.kv) b = static_cast<uint8_t>(rng());
    for (int64_t s = 0; s < S; ++s) free_slots.push_back(s);
    std::shuffle(free_slots.begin(), free_slots.end(), rng);
  }

  // Writes `n` new tokens of request q into fresh slots (new K/V bytes) and returns the
  // plan rows that stamp them (a run: each row's prev_slot is the row before's slot).
  Plan extend(size_t q, int64_t n) {
    Plan plan;
    Request& r = reqs[q];
    for (int64_t i = 0; i < n && !free_slots.empty(); ++i) {
      const int64_t slot = free_slots.back();
      free_slots.pop_back();
      const int64_t pos = static_cast<int64_t>(r.slots.size());
      const int64_t token = static_cast<int64_t>(1000 * q + pos * 7 + (rng() % 5)) + 1;
      plan.push_back({slot, token, pos, r.slots.empty() ? -1 : r.slots.back()});
      r.slots.push_back(slot);
      r.tokens.push_back(token);
      for (int64_t b = 0; b < w.R; ++b) w.kv[static_cast<size_t>(slot * w.R + b)] = uint8_t(rng());
    }
    return plan;
  }

  Plan verify_plan(size_t q) const {
    Plan plan;
    const Request& r = reqs[q];
    for (size_t i = 0; i < r.slots.size(); ++i) {
      plan.push_back(
          {r.slots[i], r.tokens[i], static_cast<int64_t>(i), i == 0 ? -1 : r.slots[i - 1]});
    }
    return plan;
  }

  Plan verify_all() const {
    Plan plan;
    for (size_t q = 0; q < reqs.size(); ++q) {
      Plan p = verify_plan(q);
      plan.insert(plan.end(), p.begin(), p.end());
    }
    return plan;
  }

  // A prefill call for `k` new requests (runs back to back in one plan), then `steps`
  // decode calls, each one token for every request; stamps each call on `dev` and on
  // the oracle, and checks they agree.
  void grow(DLDevice dev, World& oracle, int k, int64_t max_len, int steps, bool hash) {
    Plan prefill;
    for (int i = 0; i < k; ++i) {
      reqs.push_back({});
      Plan p = extend(reqs.size() - 1, 1 + static_cast<int64_t>(rng() % max_len));
      prefill.insert(prefill.end(), p.begin(), p.end());
    }
    stamp_both(dev, oracle, prefill, hash);
    for (int s = 0; s < steps; ++s) {
      Plan decode;
      for (size_t q = 0; q < reqs.size(); ++q) {
        Plan p = extend(q, 1);
        decode.insert(decode.end(), p.begin(), p.end());
      }
      std::shuffle(decode.begin(), decode.end(), rng);  // order must not matter here
      stamp_both(dev, oracle, decode, hash);
    }
  }

  void stamp_both(DLDevice dev, World& oracle, const Plan& plan, bool hash) {
    oracle.kv = w.kv;
    oracle_stamp(oracle, plan, hash);
    run_stamp(dev, w, plan, hash);
    ASSERT_EQ(w.records, oracle.records) << "stamp differs from the oracle";
  }
};

// ---- Tests ----

TEST(KvCanary, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("kv_canary.")) shipped.push_back(id);
  }
  EXPECT_EQ(shipped, (std::vector<std::string>{"kv_canary.stamp", "kv_canary.verify"}))
      << "a new kv_canary op needs an oracle in this file";
}

TEST(KvCanary, HashFunctionsAreTheDocumentedOnes) {
  // Pinned values: a change to the mixer or the data hash breaks records already stamped.
  EXPECT_EQ(splitmix_finaliser(0), 0u);
  EXPECT_EQ(splitmix_finaliser(1), 0x5692161d100b05e5ull);
  const uint8_t zeros[16] = {};
  EXPECT_EQ(hash_of_row(zeros, 16),
            splitmix_finaliser(16 + splitmix_finaliser(kPhi) + splitmix_finaliser(2 * kPhi)));
}

void expect_clean_history(DLDevice dev, int runs, int64_t S, uint64_t seed0) {
  for (int run = 0; run < runs; ++run) {
    const uint64_t seed = seed0 + static_cast<uint64_t>(run);
    std::mt19937_64 pick(seed);
    const int64_t R = 8 * static_cast<int64_t>(1 + pick() % 20);  // 8..160 bytes
    const bool hash = pick() % 4 != 0;
    Scenario sc(S, R, seed);
    World oracle = sc.w;
    sc.grow(dev, oracle, 1 + static_cast<int>(pick() % 5), 1 + static_cast<int64_t>(pick() % 9),
            static_cast<int>(pick() % 4), hash);
    if (::testing::Test::HasFatalFailure()) return;
    const Plan all = sc.verify_all();
    VerifyResult v = run_verify(dev, sc.w, all, hash);
    ASSERT_EQ(v.count, 0) << "clean run " << run << " (seed " << seed << ", R " << R
                          << ") reported " << v.count << " violations; first slot "
                          << (v.stored.empty() ? -1 : v.stored[0].slot) << " reason "
                          << (v.stored.empty() ? -1 : v.stored[0].reason);
    for (int64_t x : v.raw) ASSERT_EQ(x, -7) << "a clean verify wrote the ring buffer";
  }
}

TEST(KvCanary, ThousandsOfCleanRunsReportNothing) { expect_clean_history(kCpu, 2000, 96, 1); }

// One scenario with several requests, stamped and verified clean, then each corruption
// planted into a copy. `dev` runs the ops; the oracle and fixed expectations judge.
class Corruptions {
 public:
  explicit Corruptions(DLDevice dev) : dev_(dev), sc_(512, 128, 77), oracle_(sc_.w) {
    sc_.grow(dev_, oracle_, 6, 40, 3, true);
  }

  // Verifies `plan` in world `w` (on dev, with hashing) and checks the result against the
  // oracle and against `expected` (slot -> reason bits), which must be the whole set.
  void expect(const World& w, const Plan& plan, const std::map<int64_t, int64_t>& expected,
              bool hash = true) {
    VerifyResult got = run_verify(dev_, w, plan, hash);
    std::vector<Violation> want = oracle_verify(w, plan, hash);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got.stored, want);
    EXPECT_EQ(got.count, static_cast<int64_t>(want.size()));
    std::map<int64_t, int64_t> reasons;
    for (const Violation& v : got.stored) reasons[v.slot] |= v.reason;
    EXPECT_EQ(reasons, expected);
  }

  DLDevice dev_;
  Scenario sc_;
  World oracle_;
};

void run_corruptions(DLDevice dev) {
  Corruptions c(dev);
  Scenario& sc = c.sc_;
  const Plan all = sc.verify_all();
  c.expect(sc.w, all, {});  // clean
  c.expect(sc.w, all, {}, false);

  const Request& a = sc.reqs[0];
  const Request& b = sc.reqs[1];
  ASSERT_GE(a.slots.size(), 4u);

  {  // A flipped bit in K/V: only the data hash sees it.
    World w = sc.w;
    const int64_t slot = a.slots[2];
    w.kv[static_cast<size_t>(slot * w.R + 77)] ^= 0x10;
    c.expect(w, all, {{slot, 8}});
    c.expect(w, all, {}, false);  // records alone cannot see data corruption
  }
  {  // Slot overwritten by another request: b's next token lands in a's slot, stamped as
     // b's. Its record is consistent with its data, but a's token, position and chain
     // break there, and the chain of a's next token (whose prev is that slot) too.
    World w = sc.w;
    const int64_t slot = a.slots[1];
    const PlanRow row{slot, b.tokens.back() + 100000, static_cast<int64_t>(b.slots.size()),
                      b.slots.back()};
    for (int64_t i = 0; i < w.R; ++i) w.kv[static_cast<size_t>(slot * w.R + i)] = uint8_t(i);
    oracle_stamp(w, {row}, true);
    c.expect(w, all, {{slot, 1 | 2 | 4}, {a.slots[2], 4}});
  }
  {  // Stale slot reused: a finished, its slot 3 went to a new request c whose K/V landed
     // but whose stamp was lost. c's check finds a's stale record: every field wrong.
    World w = sc.w;
    const int64_t slot = a.slots[3];
    for (int64_t i = 0; i < w.R; ++i) w.kv[static_cast<size_t>(slot * w.R + i)] ^= 0x5a;
    const Plan c_plan = {{slot, 424242, 0, -1}};
    c.expect(w, c_plan, {{slot, 1 | 2 | 4 | 8}});
  }
  {  // Shuffled pages (page size 4 over slots): two pages' K/V bytes swapped, records
     // left in place: every slot of both pages owned by a request fails its data hash.
    World w = sc.w;
    const int64_t page = 4, p = 3, q = 11;
    for (int64_t i = 0; i < page * w.R; ++i) {
      std::swap(w.kv[static_cast<size_t>(p * page * w.R + i)],
                w.kv[static_cast<size_t>(q * page * w.R + i)]);
    }
    std::set<int64_t> owned;
    for (const Request& r : sc.reqs) owned.insert(r.slots.begin(), r.slots.end());
    std::map<int64_t, int64_t> expected;
    for (int64_t s = 0; s < page; ++s) {
      for (int64_t pg : {p, q}) {
        if (owned.count(pg * page + s)) expected[pg * page + s] = 8;
      }
    }
    ASSERT_FALSE(expected.empty());
    c.expect(w, all, expected);
  }
  {  // Shuffled pages, records moved with the bytes (a page copied to the wrong place):
     // data hashes still match, but tokens and chains do not.
    World w = sc.w;
    const auto sa = a.slots, sb = b.slots;
    for (size_t i = 0; i < 2; ++i) {
      const int64_t x = sa[i], y = sb[i + 1];
      for (int64_t k = 0; k < w.R; ++k) {
        std::swap(w.kv[static_cast<size_t>(x * w.R + k)], w.kv[static_cast<size_t>(y * w.R + k)]);
      }
      for (int k = 0; k < 4; ++k) {
        std::swap(w.records[static_cast<size_t>(4 * x + k)],
                  w.records[static_cast<size_t>(4 * y + k)]);
      }
    }
    // Positions differ by one (a's i, b's i + 1); each swapped slot's successor also
    // loses its chain (unless it was swapped itself).
    std::map<int64_t, int64_t> expected = {{sa[0], 7}, {sa[1], 7}, {sb[1], 7}, {sb[2], 7}};
    expected[sa[2]] |= 4;
    if (sb.size() > 3) expected[sb[3]] |= 4;
    c.expect(w, all, expected);
  }
  {  // Out-of-range slots and prev slots.
    const Plan bad = {{sc.w.S, 1, 0, -1}, {5, 1, 0, sc.w.S + 3}, {-2, 1, 0, -1}, {5, 1, 0, -2}};
    VerifyResult v = run_verify(dev, sc.w, bad, true);
    std::vector<Violation> want = {{-2, 16, sc.w.S, -2},
                                   {5, 16, sc.w.S, -2},
                                   {5, 16, sc.w.S, sc.w.S + 3},
                                   {sc.w.S, 16, sc.w.S, sc.w.S}};
    EXPECT_EQ(v.stored, want);
  }
}

TEST(KvCanary, PlantedCorruptionsAreDetectedWithTheRightReason) { run_corruptions(kCpu); }

void run_ring_buffer(DLDevice dev) {
  Scenario sc(64, 16, 3);
  World oracle = sc.w;
  sc.grow(dev, oracle, 2, 8, 0, false);
  // Every row wrong token: 2 + 9 rows, capacity 3, counter starting at 1.
  Plan plan = sc.verify_all();
  for (PlanRow& r : plan) r.token += 1;
  const VerifyResult v = run_verify(dev, sc.w, plan, false, 3, 1);
  EXPECT_EQ(v.count, 1 + static_cast<int64_t>(plan.size()));
  EXPECT_EQ(v.stored.size(), 2u);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(v.raw[static_cast<size_t>(k)], -7) << "row 0 was written";
  for (const Violation& x : v.stored) EXPECT_EQ(x.reason, 1 | 4);
  // A full buffer still counts.
  const VerifyResult full = run_verify(dev, sc.w, plan, false, 3, 3);
  EXPECT_EQ(full.count, 3 + static_cast<int64_t>(plan.size()));
  for (int64_t x : full.raw) EXPECT_EQ(x, -7);
}

TEST(KvCanary, TheRingBufferNeverOverflowsAndKeepsCounting) { run_ring_buffer(kCpu); }

TEST(KvCanary, StampSkipsOutOfRangeRowsAndChainsRunsInOrder) {
  World w;
  w.S = 8;
  w.R = 8;
  w.records.assign(32, 0);
  w.kv.assign(64, 3);
  World oracle = w;
  // A run 2 -> 5 -> 7, an out-of-range row that breaks the next run, a row chained to a
  // slot stamped earlier (none here: slot 0's zero record).
  const Plan plan = {{2, 10, 0, -1}, {5, 11, 1, 2}, {7, 12, 2, 5},
                     {9, 13, 3, 7},  {1, 14, 4, 9}, {3, 15, 0, 0}};
  oracle_stamp(oracle, plan, true);
  run_stamp(kCpu, w, plan, true);
  EXPECT_EQ(w.records, oracle.records);
  EXPECT_EQ(w.records[4 * 1], 0) << "a row chained to an out-of-range prev is not stamped";
  EXPECT_EQ(static_cast<uint64_t>(w.records[4 * 7 + 2]),
            chain_of(chain_of(chain_of(kSeed, 10, 0), 11, 1), 12, 2));
}

TEST(KvCanary, BadArgumentsNameTheArgument) {
  const KernelHandle h = handle("kv_canary.verify", "cpu");
  std::vector<int64_t> rec(32, 0), plan = {0, 1, 0, -1}, ring(16, 0), count = {0};
  std::vector<uint8_t> kv(8 * 12, 0);
  Buffer r = i64_buffer(kCpu, {8, 4}, rec.data());
  Buffer p = i64_buffer(kCpu, {1, 4}, plan.data());
  Buffer v = i64_buffer(kCpu, {4, 4}, ring.data());
  Buffer c = i64_buffer(kCpu, {1}, count.data());
  Buffer k12 = u8_buffer(kCpu, {8, 12}, kv.data());  // 12-byte rows
  DLTensor* args[] = {r.tensor(), p.tensor(), v.tensor(), c.tensor(), k12.tensor()};
  Status st = h.call(args);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("argument 'kv' has rows of 12 bytes"), std::string::npos)
      << st.message();
  DLTensor* no_kv[] = {r.tensor(), p.tensor(), v.tensor(), c.tensor(), nullptr};
  EXPECT_TRUE(h.call(no_kv).ok()) << "without kv, only the records are checked";
  Buffer k7 = u8_buffer(kCpu, {7, 8}, kv.data());
  DLTensor* wrong_slots[] = {r.tensor(), p.tensor(), v.tensor(), c.tensor(), k7.tensor()};
  st = h.call(wrong_slots);
  EXPECT_NE(st.message().find("argument 'kv' must be [num_slots = 8, ...]"), std::string::npos)
      << st.message();
  auto f32 = Buffer::make(kCpu, DType::kF32, {1, 4});
  DLTensor* bad_plan[] = {r.tensor(), f32->tensor(), v.tensor(), c.tensor(), nullptr};
  st = h.call(bad_plan);
  EXPECT_NE(st.message().find("argument 'plan' (tensor 2 of 5) has dtype f32, expected i64"),
            std::string::npos)
      << st.message();
  Buffer c2 = i64_buffer(kCpu, {1, 4}, ring.data());
  DLTensor* bad_count[] = {r.tensor(), p.tensor(), v.tensor(), c2.tensor(), nullptr};
  st = h.call(bad_count);
  EXPECT_NE(st.message().find("argument 'count' (tensor 4 of 5) has rank 2"), std::string::npos)
      << st.message();
}

// ---- GPU: the same scenarios through the CUDA implementations ----

class KvCanaryGpu : public test::GpuTest {};

TEST_F(KvCanaryGpu, CleanRunsReportNothing) { expect_clean_history(kGpu, 300, 2048, 5000); }
TEST_F(KvCanaryGpu, PlantedCorruptionsAreDetectedWithTheRightReason) { run_corruptions(kGpu); }
TEST_F(KvCanaryGpu, TheRingBufferNeverOverflowsAndKeepsCounting) { run_ring_buffer(kGpu); }

TEST_F(KvCanaryGpu, LargePlansMatchTheCpuReference) {
  // Long prefill runs (one thread walks each) and many rows per call; rows of 128 bytes
  // (16-byte loads, 8 lanes) and 24 bytes (8-byte loads).
  for (int64_t R : {128, 24, 4096}) {
    Scenario gpu(1 << 15, R, 9), cpu(1 << 15, R, 9);
    World og = gpu.w, oc = cpu.w;
    gpu.grow(kGpu, og, 40, 600, 2, true);
    cpu.grow(kCpu, oc, 40, 600, 2, true);
    ASSERT_EQ(gpu.w.records, cpu.w.records);
    Plan all = gpu.verify_all();
    // Corrupt every 97th row's expectation and every 89th slot's data.
    for (size_t i = 0; i < all.size(); i += 97) all[i].position += 1;
    for (size_t i = 0; i < all.size(); i += 89) {
      gpu.w.kv[static_cast<size_t>(all[i].slot * R)] ^= 1;
      cpu.w.kv[static_cast<size_t>(all[i].slot * R)] ^= 1;
    }
    const VerifyResult g = run_verify(kGpu, gpu.w, all, true, 1 << 16);
    const VerifyResult c = run_verify(kCpu, cpu.w, all, true, 1 << 16);
    EXPECT_GT(c.count, 0);
    EXPECT_EQ(g.count, c.count);
    EXPECT_EQ(g.stored, c.stored);
  }
}

}  // namespace
}  // namespace kreg
