// The embeddings group: the CPU references against a byte-level oracle written here
// (out row t is table row ids[t] - start, or zero bytes, and the counter counts the zero
// rows), the sum over a 4-way vocabulary split equal to the full lookup, the CUDA kernels
// byte for byte against the CPU references over a sweep of dtypes, id types, awkward H,
// hostile ids and misaligned views (skipped without a GPU), a table past 2^31 elements,
// and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

constexpr const char* kLookup = "embeddings.lookup";
constexpr const char* kVocabParallel = "embeddings.vocab_parallel_lookup";

// Ids of a case: mostly valid (with deliberate repeats), the rest out of range in every way
// an id can be: negative, = V, just past V, and for i64 values past int32 whose low 32 bits
// are a valid id (a kernel that truncates to 32 bits reads a real row instead of zeros).
std::vector<int64_t> make_ids(std::mt19937_64& rng, int64_t tokens, int64_t rows, bool i64) {
  std::vector<int64_t> bad = {-1, rows, rows + 1, std::numeric_limits<int32_t>::min(),
                              std::numeric_limits<int32_t>::max()};
  if (i64) {
    const int64_t k32 = int64_t{1} << 32;
    bad.insert(bad.end(), {k32, k32 + 1, k32 + rows / 2, -k32 + 1, int64_t{1} << 31,
                           std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max() - rows / 2});
  }
  std::vector<int64_t> ids(at(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    const uint64_t r = rng() % 10;
    if (r < 2 && t > 0) {
      ids[at(t)] = ids[at(t - 1 - static_cast<int64_t>(rng() % static_cast<uint64_t>(t)))];
    } else if (r < 4 || rows == 0) {
      ids[at(t)] = bad[rng() % bad.size()];
    } else {
      ids[at(t)] = static_cast<int64_t>(rng() % static_cast<uint64_t>(rows));
    }
  }
  return ids;
}

Buffer ids_buffer(DLDevice dev, DType dt, const std::vector<int64_t>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  if (dt == DType::kI64) return exact_buffer(dev, dt, {n}, ids.data());
  std::vector<int32_t> narrow(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) narrow[i] = static_cast<int32_t>(ids[i]);
  return exact_buffer(dev, dt, {n}, narrow.data());
}

// Random bytes, never all zero per element: bf16/f16/f32 bit patterns of every kind
// (NaNs with payloads, infinities, -0.0 among them), which a copy must carry unchanged.
std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (uint8_t& v : b) v = static_cast<uint8_t>(1 + rng() % 255);
  return b;
}

struct Oracle {
  std::vector<uint8_t> out;
  int64_t outside = 0;
};

// out row t = table row ids[t] - start when start <= ids[t] < start + rows, zero bytes
// otherwise; `outside` counts the zero rows.
Oracle gather_oracle(const std::vector<int64_t>& ids, const std::vector<uint8_t>& table,
                     int64_t rows, size_t row_bytes, int64_t start) {
  Oracle o;
  o.out.assign(ids.size() * row_bytes, 0);
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t id = ids[t];
    // start >= 0 in every case here; in unsigned arithmetic id - start is exact once
    // id >= start.
    const bool inside = id >= start && static_cast<uint64_t>(id) - static_cast<uint64_t>(start) <
                                           static_cast<uint64_t>(rows);
    const uint64_t local = static_cast<uint64_t>(id) - static_cast<uint64_t>(start);
    if (inside) {
      // H = 0: empty rows, whose buffers may have null data (memcpy's pointers may not).
      if (row_bytes > 0) {
        std::memcpy(o.out.data() + t * row_bytes, table.data() + local * row_bytes, row_bytes);
      }
    } else {
      ++o.outside;
    }
  }
  return o;
}

Result<KernelHandle> resolve(const char* op, DLDevice dev, DType dt) {
  return registry().resolve(op, Target{dev, dt},
                            {std::string(dev.device_type == kDLCPU ? "cpu" : "cuda")});
}

struct Case {
  DType dtype;
  DType id_dtype;
  int64_t tokens, rows, h;
  bool counter;
  int64_t shift = 0;  // elements of byte_offset on table and out (GPU: narrower words)
  std::string label() const {
    return std::string(dtype_name(dtype)) + "/" + std::string(dtype_name(id_dtype)) +
           " T=" + std::to_string(tokens) + " V=" + std::to_string(rows) +
           " H=" + std::to_string(h) + (counter ? " counter" : "") +
           (shift ? " shift " + std::to_string(shift) : "");
  }
};

std::vector<Case> sweep(bool gpu) {
  std::vector<Case> out;
  const std::vector<int64_t> hs = gpu ? std::vector<int64_t>{0, 1, 7, 8, 61, 64, 130, 1000, 7168}
                                      : std::vector<int64_t>{0, 1, 3, 7, 8, 64, 130};
  const std::pair<int64_t, int64_t> tv[] = {{0, 5}, {1, 1}, {1, 100}, {5, 0}, {37, 17}, {300, 50}};
  int i = 0;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType it : {DType::kI32, DType::kI64}) {
      for (int64_t h : hs) {
        for (auto [t, v] : tv) {
          out.push_back(Case{dt, it, t, v, h, (i++ % 3) != 0});
        }
      }
    }
  }
  if (gpu) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      for (int64_t shift : {1, 2, 3}) {
        out.push_back(Case{dt, DType::kI64, 64, 33, 4096, true, shift});
        out.push_back(Case{dt, DType::kI32, 9, 33, 1001, true, shift});
      }
    }
    out.push_back(Case{DType::kBF16, DType::kI64, 4096, 1000, 7168, true});
  }
  return out;
}

// The tensors of one lookup call on `dev`: table and out are views `shift` elements into
// their allocations; out is poisoned; the counter starts at a non-zero value (it
// accumulates).
struct Call {
  Buffer ids, table_mem, out_mem, counter;
  DLTensor table{}, out{};
  int64_t table_shape[2]{}, out_shape[2]{};
  std::vector<DLTensor*> tensors(bool with_counter) {
    return {ids.tensor(), &table, &out, with_counter ? counter.tensor() : nullptr};
  }
  std::vector<uint8_t> out_bytes(const Case& c) const {
    auto all = bytes_of(out_mem);
    const size_t skip = at(c.shift) * dtype_size(c.dtype);
    return std::vector<uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(skip), all.end());
  }
  int32_t count() const {
    auto b = bytes_of(counter);
    int32_t v = 0;
    if (b.size() == sizeof v) std::memcpy(&v, b.data(), sizeof v);
    return v;
  }
};

constexpr int32_t kCounterStart = 1000;

void make_view(DLTensor& view, int64_t* shape, const Buffer& mem, int64_t rows, int64_t h,
               const Case& c) {
  view = *mem.tensor();
  shape[0] = rows;
  shape[1] = h;
  view.ndim = 2;
  view.shape = shape;
  view.strides = nullptr;
  view.byte_offset = static_cast<uint64_t>(c.shift) * dtype_size(c.dtype);
}

void make_call(Call& k, const Case& c, DLDevice dev, const std::vector<int64_t>& ids,
               const std::vector<uint8_t>& table) {
  const size_t esize = dtype_size(c.dtype);
  k.ids = ids_buffer(dev, c.id_dtype, ids);
  std::vector<uint8_t> table_mem(at(c.shift) * esize, 0x5a);
  table_mem.insert(table_mem.end(), table.begin(), table.end());
  k.table_mem = exact_buffer(dev, c.dtype, {static_cast<int64_t>(table_mem.size() / esize)},
                             table_mem.data());
  k.out_mem = std::move(Buffer::make(dev, c.dtype, {c.shift + c.tokens * c.h})).value();
  EXPECT_TRUE(k.out_mem.poison().ok());
  const int32_t start = kCounterStart;
  k.counter = exact_buffer(dev, DType::kI32, {1}, &start);
  make_view(k.table, k.table_shape, k.table_mem, c.rows, c.h, c);
  make_view(k.out, k.out_shape, k.out_mem, c.tokens, c.h, c);
}

TEST(EmbeddingsKernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("embeddings.")) shipped.push_back(id);
  }
  std::sort(shipped.begin(), shipped.end());
  EXPECT_EQ(shipped, (std::vector<std::string>{kLookup, kVocabParallel}))
      << "a new embeddings op needs an oracle in this file";
}

TEST(EmbeddingsKernels, CpuLookupMatchesTheOracle) {
  std::mt19937_64 rng(16);
  for (const Case& c : sweep(false)) {
    SCOPED_TRACE(c.label());
    auto h = resolve(kLookup, kCpu, c.dtype);
    ASSERT_TRUE(h.ok()) << h.status().message();
    const size_t row_bytes = at(c.h) * dtype_size(c.dtype);
    const auto ids = make_ids(rng, c.tokens, c.rows, c.id_dtype == DType::kI64);
    const auto table = random_bytes(rng, at(c.rows) * row_bytes);
    const Oracle want = gather_oracle(ids, table, c.rows, row_bytes, 0);
    Call k;
    make_call(k, c, kCpu, ids, table);
    ASSERT_TRUE(h->call(k.tensors(c.counter)).ok());
    EXPECT_EQ(k.out_bytes(c), want.out);
    EXPECT_EQ(k.count(), kCounterStart + (c.counter ? want.outside : 0));
    EXPECT_EQ(bytes_of(k.table_mem).size(), table.size());  // untouched, by construction
  }
}

TEST(EmbeddingsKernels, CpuVocabParallelMatchesTheOracle) {
  std::mt19937_64 rng(17);
  const int64_t starts[] = {0,
                            1,
                            40,
                            int64_t{1} << 32,
                            std::numeric_limits<int64_t>::max() - 20,
                            std::numeric_limits<int64_t>::max() - 100};
  for (const Case& base : sweep(false)) {
    for (int64_t start : starts) {
      const Case c = base;
      SCOPED_TRACE(c.label() + " vocab_start " + std::to_string(start));
      auto h = resolve(kVocabParallel, kCpu, c.dtype);
      ASSERT_TRUE(h.ok()) << h.status().message();
      const size_t row_bytes = at(c.h) * dtype_size(c.dtype);
      // Ids around the shard: the sweep's ids shifted by start (wrapping is fine: they
      // are just values) plus the shard's edges.
      auto ids = make_ids(rng, c.tokens, c.rows, c.id_dtype == DType::kI64);
      for (int64_t& id : ids) {
        id = static_cast<int64_t>(static_cast<uint64_t>(id) + static_cast<uint64_t>(start));
      }
      if (!ids.empty()) ids.front() = start - 1;
      // The shard's last id; past INT64_MAX (start near it) it wraps, as a value.
      if (ids.size() > 1) {
        ids.back() =
            static_cast<int64_t>(static_cast<uint64_t>(start) + static_cast<uint64_t>(c.rows) - 1);
      }
      if (c.id_dtype == DType::kI32) {
        for (int64_t& id : ids) id = static_cast<int32_t>(id);
      }
      const auto table = random_bytes(rng, at(c.rows) * row_bytes);
      const Oracle want = gather_oracle(ids, table, c.rows, row_bytes, start);
      Call k;
      make_call(k, c, kCpu, ids, table);
      auto attrs = h->attrs({{"vocab_start", start}});
      ASSERT_TRUE(attrs.ok()) << attrs.status().message();
      DLTensor* args[] = {k.ids.tensor(), &k.table, &k.out};
      const Status st = h->call(args, attrs->view());
      if (start > std::numeric_limits<int64_t>::max() - c.rows) {
        // start + V past int64 (the largest start with the small tables only).
        EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << st.message();
        continue;
      }
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(k.out_bytes(c), want.out);
    }
  }
}

// The vocabulary split into 4 shards of uneven sizes (one of them empty when V is small):
// every id falls in at most one shard, so the sum of the 4 partial outputs (zeros
// elsewhere) is the full lookup exactly, out-of-range ids giving zero rows everywhere.
void check_shard_sum(DLDevice dev) {
  std::mt19937_64 rng(18);
  const std::pair<int64_t, int64_t> shapes[] = {{37, 3}, {300, 103}, {1, 7}, {64, 1000}, {0, 8}};
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType it : {DType::kI32, DType::kI64}) {
      for (auto [tokens, rows] : shapes) {
        for (int64_t hidden : {int64_t{5}, int64_t{64}, int64_t{1030}}) {
          const Case c{dt, it, tokens, rows, hidden, false};
          SCOPED_TRACE(c.label());
          auto full = resolve(kLookup, dev, dt);
          auto part = resolve(kVocabParallel, dev, dt);
          ASSERT_TRUE(full.ok() && part.ok());
          auto table = Buffer::make(dev, dt, {rows, hidden});
          ASSERT_TRUE(table->fill_random(rng).ok());
          const auto ids = make_ids(rng, tokens, rows, it == DType::kI64);
          Buffer idb = ids_buffer(dev, it, ids);
          auto want = Buffer::make(dev, dt, {tokens, hidden});
          ASSERT_TRUE(want->poison().ok());
          DLTensor* fargs[] = {idb.tensor(), table->tensor(), want->tensor(), nullptr};
          ASSERT_TRUE(full->call(fargs).ok());
          // Shard edges: a quarter each, rounded so that shard sizes differ.
          const int64_t edges[] = {0, rows / 4, rows / 2 + 1, std::max(rows / 2 + 1, rows - 2),
                                   rows};
          std::vector<double> sum(at(tokens * hidden), 0.0);
          for (int r = 0; r < 4; ++r) {
            const int64_t start = std::min(edges[r], rows);
            const int64_t vs = std::min(edges[r + 1], rows) - start;
            DLTensor shard = *table->tensor();
            int64_t shape[2] = {vs, hidden};
            shard.shape = shape;
            shard.byte_offset = static_cast<uint64_t>(start * hidden) * dtype_size(dt);
            auto out = Buffer::make(dev, dt, {tokens, hidden});
            ASSERT_TRUE(out->poison().ok());
            auto attrs = part->attrs({{"vocab_start", start}});
            ASSERT_TRUE(attrs.ok());
            DLTensor* pargs[] = {idb.tensor(), &shard, out->tensor()};
            ASSERT_TRUE(part->call(pargs, attrs->view()).ok()) << "rank " << r;
            const auto v = values(*out);
            ASSERT_EQ(v.size(), sum.size());
            for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
          }
          ASSERT_TRUE(harness::device_synchronize().ok());
          EXPECT_EQ(sum, values(*want));
        }
      }
    }
  }
}

TEST(EmbeddingsKernels, CpuShardSumIsTheFullLookup) { check_shard_sum(kCpu); }

class GpuEmbeddingsKernels : public test::GpuTest {};

TEST_F(GpuEmbeddingsKernels, ShardSumIsTheFullLookup) { check_shard_sum(kGpu); }

TEST_F(GpuEmbeddingsKernels, LookupMatchesTheCpuReferenceExactly) {
  std::mt19937_64 rng(19);
  for (const Case& c : sweep(true)) {
    SCOPED_TRACE(c.label());
    auto cuda = resolve(kLookup, kGpu, c.dtype);
    auto cpu = resolve(kLookup, kCpu, c.dtype);
    ASSERT_TRUE(cuda.ok() && cpu.ok());
    ASSERT_EQ(cuda->spec().backend, "cuda");
    const size_t row_bytes = at(c.h) * dtype_size(c.dtype);
    const auto ids = make_ids(rng, c.tokens, c.rows, c.id_dtype == DType::kI64);
    const auto table = random_bytes(rng, at(c.rows) * row_bytes);
    Call g, r;
    make_call(g, c, kGpu, ids, table);
    make_call(r, c, kCpu, ids, table);
    ASSERT_TRUE(cuda->call(g.tensors(c.counter)).ok());
    // A second call accumulates into the same counter and rewrites the same rows.
    if (c.counter) {
      ASSERT_TRUE(cuda->call(g.tensors(true)).ok());
    }
    ASSERT_TRUE(harness::device_synchronize().ok());
    ASSERT_TRUE(cpu->call(r.tensors(c.counter)).ok());
    if (c.counter) {
      ASSERT_TRUE(cpu->call(r.tensors(true)).ok());
    }
    EXPECT_TRUE(g.out_bytes(c) == r.out_bytes(c)) << "output bytes differ";
    EXPECT_EQ(g.count(), r.count());
  }
}

TEST_F(GpuEmbeddingsKernels, VocabParallelMatchesTheCpuReferenceExactly) {
  std::mt19937_64 rng(20);
  const int64_t starts[] = {0, 3, int64_t{1} << 32};
  for (const Case& c : sweep(true)) {
    for (int64_t start : starts) {
      SCOPED_TRACE(c.label() + " vocab_start " + std::to_string(start));
      auto cuda = resolve(kVocabParallel, kGpu, c.dtype);
      auto cpu = resolve(kVocabParallel, kCpu, c.dtype);
      ASSERT_TRUE(cuda.ok() && cpu.ok());
      const size_t row_bytes = at(c.h) * dtype_size(c.dtype);
      auto ids = make_ids(rng, c.tokens, c.rows, c.id_dtype == DType::kI64);
      for (int64_t& id : ids) {
        id = static_cast<int64_t>(static_cast<uint64_t>(id) + static_cast<uint64_t>(start));
        if (c.id_dtype == DType::kI32) id = static_cast<int32_t>(id);
      }
      const auto table = random_bytes(rng, at(c.rows) * row_bytes);
      Call g, r;
      make_call(g, c, kGpu, ids, table);
      make_call(r, c, kCpu, ids, table);
      auto ga = cuda->attrs({{"vocab_start", start}});
      auto ra = cpu->attrs({{"vocab_start", start}});
      ASSERT_TRUE(ga.ok() && ra.ok());
      DLTensor* gargs[] = {g.ids.tensor(), &g.table, &g.out};
      DLTensor* rargs[] = {r.ids.tensor(), &r.table, &r.out};
      ASSERT_TRUE(cuda->call(gargs, ga->view()).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      ASSERT_TRUE(cpu->call(rargs, ra->view()).ok());
      EXPECT_TRUE(g.out_bytes(c) == r.out_bytes(c)) << "output bytes differ";
    }
  }
}

TEST_F(GpuEmbeddingsKernels, TablesAndOutputsPastTwoToThe31Elements) {
  // H = 16383 bf16: rows of 32766 bytes, moved as 2-byte words, so a word index past
  // 2^31 is an element index past 2^31 (a 32-bit offset would wrap). First a lookup
  // writes a [135168, H] output (4.4 GB) from a small table: its rows past 131080 lie
  // past 2^31 elements. Then that output serves as the table of a second lookup, which
  // reads rows from both sides of 2^31.
  const int64_t hidden = 16383, big = 135168, small_rows = 61;
  std::mt19937_64 rng(21);
  auto small = Buffer::make(kGpu, DType::kBF16, {small_rows, hidden});
  ASSERT_TRUE(small.ok() && small->fill_random(rng).ok());
  std::vector<int64_t> ids(at(big));
  for (int64_t t = 0; t < big; ++t) ids[at(t)] = (t * 7 + 3) % small_rows;
  Buffer idb = ids_buffer(kGpu, DType::kI32, ids);
  auto big_out = Buffer::make(kGpu, DType::kBF16, {big, hidden});
  ASSERT_TRUE(big_out.ok()) << big_out.status().message();
  auto h = resolve(kLookup, kGpu, DType::kBF16);
  ASSERT_TRUE(h.ok());
  DLTensor* first[] = {idb.tensor(), small->tensor(), big_out->tensor(), nullptr};
  ASSERT_TRUE(h->call(first).ok());
  const std::vector<int64_t> probe = {0, 131071, 131080, 131081, 135000, big - 1, big, -5};
  Buffer probe_ids = ids_buffer(kGpu, DType::kI64, probe);
  auto out = Buffer::make(kGpu, DType::kBF16, {static_cast<int64_t>(probe.size()), hidden});
  ASSERT_TRUE(out->poison().ok());
  auto counter = Buffer::make(kGpu, DType::kI32, {1});
  ASSERT_TRUE(counter->from_doubles({0}).ok());
  DLTensor* second[] = {probe_ids.tensor(), big_out->tensor(), out->tensor(), counter->tensor()};
  ASSERT_TRUE(h->call(second).ok());
  ASSERT_TRUE(harness::device_synchronize().ok());
  const auto sv = values(*small);
  const auto got = values(*out);
  for (size_t j = 0; j < probe.size(); ++j) {
    const int64_t p = probe[j];
    const bool valid = p >= 0 && p < big;
    const int64_t src = valid ? ids[at(p)] : -1;
    for (int64_t e = 0; e < hidden; ++e) {
      const double want = valid ? sv[at(src * hidden + e)] : 0.0;
      ASSERT_EQ(got[j * at(hidden) + at(e)], want) << "probe row " << p << " element " << e;
    }
  }
  EXPECT_EQ(values(*counter), std::vector<double>{2});
}

TEST_F(GpuEmbeddingsKernels, PdlChainsReadWhatTheKernelBeforeWrote) {
  // Under PDL a lookup may start before the kernel it follows has finished, and must wait
  // before reading ids or the table. A plain lookup fills a large table A (so that an
  // early read would see poison); two PDL lookups then gather from A into B and from B
  // into C. C must be exactly what the ids say, repeated so that a race has chances.
  auto h = resolve(kLookup, kGpu, DType::kBF16);
  ASSERT_TRUE(h.ok());
  std::mt19937_64 rng(22);
  const int64_t small_rows = 64, rows = 8192, picked = 256, hidden = 7168;
  auto s = Buffer::make(kGpu, DType::kBF16, {small_rows, hidden});
  ASSERT_TRUE(s->fill_random(rng).ok());
  std::vector<int64_t> ids_a(at(rows)), ids_b(at(picked)), ids_c(at(picked));
  for (int64_t i = 0; i < rows; ++i) ids_a[at(i)] = (i * 5 + 1) % small_rows;
  for (int64_t i = 0; i < picked; ++i) {
    ids_b[at(i)] = rows - 1 - (i * 3) % rows;  // the rows A's last blocks write
    ids_c[at(i)] = (i * 7 + 2) % picked;
  }
  Buffer a_ids = ids_buffer(kGpu, DType::kI32, ids_a);
  Buffer b_ids = ids_buffer(kGpu, DType::kI64, ids_b);
  Buffer c_ids = ids_buffer(kGpu, DType::kI32, ids_c);
  const auto sv = values(*s);
  const CallOptions plain{nullptr, nullptr, 0};
  const CallOptions pdl{nullptr, nullptr, KREG_LAUNCH_PDL};
  for (int rep = 0; rep < 5; ++rep) {
    auto a = Buffer::make(kGpu, DType::kBF16, {rows, hidden});
    auto b = Buffer::make(kGpu, DType::kBF16, {picked, hidden});
    auto c = Buffer::make(kGpu, DType::kBF16, {picked, hidden});
    ASSERT_TRUE(a->poison().ok() && b->poison().ok() && c->poison().ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    DLTensor* s1[] = {a_ids.tensor(), s->tensor(), a->tensor(), nullptr};
    DLTensor* s2[] = {b_ids.tensor(), a->tensor(), b->tensor(), nullptr};
    DLTensor* s3[] = {c_ids.tensor(), b->tensor(), c->tensor(), nullptr};
    ASSERT_TRUE(h->call(s1, {}, plain).ok());
    ASSERT_TRUE(h->call(s2, {}, pdl).ok());
    ASSERT_TRUE(h->call(s3, {}, pdl).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    const auto got = values(*c);
    for (int64_t r = 0; r < picked; ++r) {
      const int64_t src = ids_a[at(ids_b[at(ids_c[at(r)])])];
      for (int64_t e = 0; e < hidden; ++e) {
        ASSERT_EQ(got[at(r * hidden + e)], sv[at(src * hidden + e)])
            << "row " << r << " element " << e << " (repetition " << rep << ")";
      }
    }
  }
}

// ---- Bad arguments ----

Status call_lookup(DLDevice dev, DType table_dt, DType id_dt, std::vector<int64_t> id_shape,
                   std::vector<int64_t> table_shape, DType out_dt, std::vector<int64_t> out_shape,
                   std::optional<std::pair<DType, std::vector<int64_t>>> counter) {
  auto h = resolve(kLookup, dev, table_dt);
  if (!h.ok()) return h.status();
  auto ids = Buffer::make(dev, id_dt, id_shape);
  auto table = Buffer::make(dev, table_dt, table_shape);
  auto out = Buffer::make(dev, out_dt, out_shape);
  if (!ids.ok() || !table.ok() || !out.ok()) return Status(KREG_INTERNAL, "test buffers");
  EXPECT_TRUE(ids->from_doubles(std::vector<double>(at(ids->numel()), 0.0)).ok());
  Buffer c;
  if (counter) c = std::move(Buffer::make(dev, counter->first, counter->second)).value();
  DLTensor* args[] = {ids->tensor(), table->tensor(), out->tensor(),
                      counter ? c.tensor() : nullptr};
  return h->call(args);
}

void expect_error(const Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

void check_bad_arguments(DLDevice dev) {
  using D = DType;
  const auto none = std::nullopt;
  // A valid call first, so that the failures below are the arguments' own.
  EXPECT_TRUE(call_lookup(dev, D::kBF16, D::kI32, {4}, {10, 8}, D::kBF16, {4, 8},
                          std::pair{D::kI32, std::vector<int64_t>{1}})
                  .ok());
  expect_error(call_lookup(dev, D::kBF16, D::kF32, {4}, {10, 8}, D::kBF16, {4, 8}, none),
               "argument 'ids' (tensor 1 of 4) has dtype f32, expected i32|i64");
  expect_error(call_lookup(dev, D::kBF16, D::kI16, {4}, {10, 8}, D::kBF16, {4, 8}, none), "'ids'");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4, 1}, {10, 8}, D::kBF16, {4, 8}, none),
               "argument 'ids' (tensor 1 of 4) has rank 2");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4}, {10, 8}, D::kF16, {4, 8}, none),
               "argument 'out' (tensor 3 of 4) has dtype f16, but 'table' has bf16");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4}, {10, 8}, D::kBF16, {4, 9}, none),
               "argument 'out' (tensor 3 of 4) has shape [4,9], expected [T,H]");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4}, {10, 8}, D::kBF16, {5, 8}, none),
               "argument 'out' (tensor 3 of 4) has shape [5,8], expected [T,H]");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4}, {10}, D::kBF16, {4, 8}, none),
               "argument 'table' (tensor 2 of 4) has rank 1");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4}, {10, 8}, D::kBF16, {4, 8},
                           std::pair{D::kI64, std::vector<int64_t>{1}}),
               "argument 'invalid' (tensor 4 of 4) has dtype i64, expected i32");
  expect_error(call_lookup(dev, D::kBF16, D::kI32, {4}, {10, 8}, D::kBF16, {4, 8},
                           std::pair{D::kI32, std::vector<int64_t>{2}}),
               "argument 'invalid' (tensor 4 of 4) dim 0 is 2, expected 1");
  // An integer table is not an embedding table here.
  auto h = resolve(kLookup, dev, D::kBF16);
  ASSERT_TRUE(h.ok());
  auto ids = Buffer::make(dev, D::kI32, {2});
  auto table = Buffer::make(dev, D::kI32, {3, 4});
  auto out = Buffer::make(dev, D::kI32, {2, 4});
  DLTensor* args[] = {ids->tensor(), table->tensor(), out->tensor(), nullptr};
  expect_error(h->call(args), "argument 'table' (tensor 2 of 4) has dtype i32, expected");

  // vocab_start out of contract: negative, or start + Vs past int64.
  auto vp = resolve(kVocabParallel, dev, D::kF32);
  ASSERT_TRUE(vp.ok());
  auto vids = Buffer::make(dev, D::kI64, {3});
  ASSERT_TRUE(vids->from_doubles({0, 1, 2}).ok());
  auto shard = Buffer::make(dev, D::kF32, {5, 4});
  std::mt19937_64 rng(23);
  ASSERT_TRUE(shard->fill_random(rng).ok());
  auto vout = Buffer::make(dev, D::kF32, {3, 4});
  ASSERT_TRUE(vout->poison().ok());
  DLTensor* vargs[] = {vids->tensor(), shard->tensor(), vout->tensor()};
  auto with = [&](int64_t start) {
    auto a = vp->attrs({{"vocab_start", start}});
    EXPECT_TRUE(a.ok());
    return vp->call(vargs, a->view());
  };
  Status st = with(-1);
  expect_error(st, "embeddings.vocab_parallel_lookup: argument 'vocab_start' = -1 must be >= 0");
  st = with(std::numeric_limits<int64_t>::max() - 4);
  expect_error(st,
               "embeddings.vocab_parallel_lookup: argument 'vocab_start' = "
               "9223372036854775803 plus the shard's 5 rows overflows int64");
  // No failed call wrote anything.
  for (double v : values(*vout)) ASSERT_TRUE(std::isnan(v));
  // The largest start that fits: every id is outside the shard, so zero rows.
  ASSERT_TRUE(with(std::numeric_limits<int64_t>::max() - 5).ok());
  ASSERT_TRUE(harness::device_synchronize().ok());
  for (double v : values(*vout)) ASSERT_EQ(v, 0.0);
  // A missing attribute.
  EXPECT_FALSE(vp->call(vargs).ok());
}

TEST(EmbeddingsKernels, BadArgumentsAreRejected) { check_bad_arguments(kCpu); }

TEST_F(GpuEmbeddingsKernels, BadArgumentsAreRejected) { check_bad_arguments(kGpu); }

}  // namespace
}  // namespace kreg
