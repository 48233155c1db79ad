// The memory group: copy_rows' CPU reference against an oracle written here (row by row,
// from the rule "a destination row is written iff both its rows exist and it is within
// count"), the CUDA kernel against the reference over a sweep of dtypes, row sizes,
// alignments and hostile offsets/counts (skipped without a GPU), and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

// Distinct, exactly representable values in every dtype tested (|v| <= 124, halves for
// floats): source and destination never share a value, so a wrong or missing row shows.
double source_value(DType dt, int64_t k) {
  const double v = static_cast<double>((k * 7) % 100);  // 0..99
  if (dt == DType::kU8) return v;
  if (dt == DType::kI8 || dt == DType::kI16 || dt == DType::kI32 || dt == DType::kI64) return v;
  return v + 0.5;
}
double dest_value(DType dt, int64_t k) {
  const double v = static_cast<double>(100 + k % 20);  // 100..119
  return dt == DType::kU8 ? v : -v;
}

struct CopyCase {
  DType dtype;
  DType index_dtype;
  int64_t src_rows;
  int64_t dst_rows;
  std::vector<int64_t> trailing;
  int64_t offset;
  int64_t count;
  bool offset_on_src;
  std::string label() const {
    std::string t;
    for (int64_t d : trailing) t += "x" + std::to_string(d);
    return std::string(dtype_name(dtype)) + "/" + std::string(dtype_name(index_dtype)) + " src " +
           std::to_string(src_rows) + t + " dst " + std::to_string(dst_rows) + t + " offset " +
           std::to_string(offset) + " count " + std::to_string(count) +
           (offset_on_src ? " on src" : " on dst");
  }
};

struct CopyBuffers {
  Buffer src, dst, offset, count;
  std::vector<DLTensor*> tensors() {
    return {src.tensor(), dst.tensor(), offset.tensor(), count.tensor()};
  }
};

CopyBuffers make_buffers(const CopyCase& c, DLDevice dev) {
  auto shape = [&](int64_t rows) {
    std::vector<int64_t> s{rows};
    s.insert(s.end(), c.trailing.begin(), c.trailing.end());
    return s;
  };
  CopyBuffers b;
  b.src = std::move(Buffer::make(dev, c.dtype, shape(c.src_rows))).value();
  b.dst = std::move(Buffer::make(dev, c.dtype, shape(c.dst_rows))).value();
  b.offset = std::move(Buffer::make(dev, c.index_dtype, {1})).value();
  b.count = std::move(Buffer::make(dev, c.index_dtype, {1})).value();
  std::vector<double> s(static_cast<size_t>(b.src.numel())), d(static_cast<size_t>(b.dst.numel()));
  for (size_t k = 0; k < s.size(); ++k) s[k] = source_value(c.dtype, static_cast<int64_t>(k));
  for (size_t k = 0; k < d.size(); ++k) d[k] = dest_value(c.dtype, static_cast<int64_t>(k));
  EXPECT_TRUE(b.src.from_doubles(s).ok());
  EXPECT_TRUE(b.dst.from_doubles(d).ok());
  EXPECT_TRUE(b.offset.from_doubles({static_cast<double>(c.offset)}).ok());
  EXPECT_TRUE(b.count.from_doubles({static_cast<double>(c.count)}).ok());
  return b;
}

// The oracle, row by row: destination row j receives source row j + offset (offset on
// src) or j - offset (offset on dst) iff that source row exists and j - (offset on dst ?
// offset : 0) is in [0, count).
std::vector<double> oracle(const CopyCase& c, const std::vector<double>& src,
                           const std::vector<double>& dst) {
  int64_t row = 1;
  for (int64_t d : c.trailing) row *= d;
  std::vector<double> out = dst;
  for (int64_t j = 0; j < c.dst_rows; ++j) {
    const int64_t k = c.offset_on_src ? j : j - c.offset;  // position within the copied range
    const int64_t s = c.offset_on_src ? j + c.offset : j - c.offset;
    if (c.offset < 0 || k < 0 || k >= c.count || s < 0 || s >= c.src_rows) continue;
    for (int64_t e = 0; e < row; ++e) {
      out[static_cast<size_t>(j * row + e)] = src[static_cast<size_t>(s * row + e)];
    }
  }
  return out;
}

std::vector<CopyCase> sweep(bool big) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                          DType::kI8,  DType::kI32,  DType::kI64, DType::kU8};
  const std::vector<std::vector<int64_t>> trailings =
      big ? std::vector<std::vector<int64_t>>{{}, {3}, {2, 5}, {64}, {4096}, {3, 1000}}
          : std::vector<std::vector<int64_t>>{{}, {3}, {2, 5}, {64}};
  const std::pair<int64_t, int64_t> rows[] = {{0, 4}, {1, 1}, {5, 17}, {17, 5}, {33, 33}};
  // The GPU sweep (bigger rows) keeps fewer range values: each case allocates buffers.
  const std::vector<int64_t> offsets =
      big ? std::vector<int64_t>{-1, 0, 1, 16} : std::vector<int64_t>{-1, 0, 1, 4, 16, 40};
  const std::vector<int64_t> counts =
      big ? std::vector<int64_t>{0, 3, 100} : std::vector<int64_t>{-3, 0, 1, 3, 100};
  std::vector<CopyCase> out;
  int i = 0;
  for (DType dt : dtypes) {
    for (const auto& tr : trailings) {
      for (auto [ns, nd] : rows) {
        for (int64_t off : offsets) {
          for (int64_t cnt : counts) {
            for (bool on_src : {true, false}) {
              out.push_back(CopyCase{dt, (i++ % 2) ? DType::kI64 : DType::kI32, ns, nd, tr, off,
                                     cnt, on_src});
            }
          }
        }
      }
    }
  }
  return out;
}

Result<KernelHandle> copy_rows(DLDevice dev, DType dt) {
  return registry().resolve("memory.copy_rows", Target{dev, dt},
                            {std::string(dev.device_type == kDLCPU ? "cpu" : "cuda")});
}

AttrList attrs_for(const KernelHandle& h, bool offset_on_src) {
  auto a = h.attrs({{"offset_on_src", offset_on_src}});
  EXPECT_TRUE(a.ok()) << a.status().message();
  return std::move(a).value();
}

TEST(MemoryKernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("memory.")) shipped.push_back(id);
  }
  EXPECT_EQ(shipped, std::vector<std::string>{"memory.copy_rows"})
      << "a new memory op needs an oracle in this file";
}

TEST(MemoryKernels, CpuReferenceMatchesTheOracle) {
  for (const CopyCase& c : sweep(false)) {
    SCOPED_TRACE(c.label());
    auto h = copy_rows(kCpu, c.dtype);
    ASSERT_TRUE(h.ok()) << h.status().message();
    CopyBuffers b = make_buffers(c, kCpu);
    const auto want = oracle(c, values(b.src), values(b.dst));
    const auto src_before = values(b.src);
    ASSERT_TRUE(h->call(b.tensors(), attrs_for(*h, c.offset_on_src).view()).ok());
    EXPECT_EQ(values(b.dst), want);
    EXPECT_EQ(values(b.src), src_before);
  }
}

class GpuMemoryKernels : public test::GpuTest {};

TEST_F(GpuMemoryKernels, MatchTheCpuReferenceOverASweep) {
  for (const CopyCase& c : sweep(true)) {
    SCOPED_TRACE(c.label());
    auto cuda = copy_rows(kGpu, c.dtype);
    ASSERT_TRUE(cuda.ok()) << cuda.status().message();
    auto cpu = copy_rows(kCpu, c.dtype);
    ASSERT_TRUE(cpu.ok());
    CopyBuffers g = make_buffers(c, kGpu);
    CopyBuffers r = make_buffers(c, kCpu);
    ASSERT_TRUE(g.dst.tensor()->device.device_type == kDLCUDA);
    ASSERT_TRUE(cuda->call(g.tensors(), attrs_for(*cuda, c.offset_on_src).view()).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    ASSERT_TRUE(cpu->call(r.tensors(), attrs_for(*cpu, c.offset_on_src).view()).ok());
    // Bytes are bytes: the results must be identical, untouched rows included.
    EXPECT_EQ(values(g.dst), values(r.dst));
  }
}

TEST_F(GpuMemoryKernels, LargeCopiesAndMisalignedViews) {
  // A copy bigger than one grid-stride step (32 MB) and views one element into their
  // allocation (no 16-byte words): both must still copy exactly the clamped range.
  struct Big {
    DType dt;
    int64_t src_rows, dst_rows, width, offset, count;
    bool on_src;
    int64_t view_shift;  // elements of byte_offset on both tensors
  };
  const Big cases[] = {
      {DType::kBF16, 9000, 8000, 4096, 500, 8100, true, 0},   // clamped to 8000 rows of 8 KB
      {DType::kF32, 3000, 5000, 4096, 4000, 4000, false, 0},  // clamped to 1000 rows
      {DType::kBF16, 100, 100, 4096, 3, 50, true, 1},         // 2-byte words
      {DType::kF32, 100, 100, 1023, 0, 99, false, 1},         // 4-byte words, odd rows
      {DType::kI8, 64, 64, 4095, 1, 63, true, 3},             // 1-byte words
      // Offset on dst, grids of at most 1 MiB of source words load before the range is
      // known: at the limit (64 rows of 16 KB) and one row past it, the vs_torch decode
      // shape, clamped and empty ranges with the speculative loads, a 2-byte-word view.
      {DType::kF32, 64, 200, 4096, 150, 64, false, 0},  // 1 MiB grid, clamped to 50 rows
      {DType::kF32, 65, 200, 4096, 10, 65, false, 0},   // 1 MiB + 16 KB: loads after
      {DType::kBF16, 8, 4096, 576, 100, 8, false, 0},
      {DType::kBF16, 40, 50, 576, 30, 40, false, 1},  // clamped to 20 rows, 2-byte words
      {DType::kBF16, 40, 50, 576, 60, 5, false, 0},   // offset past dst: nothing copied
      {DType::kBF16, 40, 50, 576, 3, -2, false, 0},   // negative count: nothing copied
  };
  for (const Big& c : cases) {
    const CopyCase cc{c.dt,      DType::kI64, c.src_rows, c.dst_rows,
                      {c.width}, c.offset,    c.count,    c.on_src};
    SCOPED_TRACE(cc.label() + " view shift " + std::to_string(c.view_shift));
    CopyBuffers host = make_buffers(cc, kCpu);
    const auto want = oracle(cc, values(host.src), values(host.dst));
    // Device copies with view_shift leading elements.
    auto shifted = [&](const Buffer& b) {
      auto p = Buffer::make(kGpu, b.dtype(), {b.numel() + c.view_shift});
      auto v = values(b);
      v.insert(v.begin(), static_cast<size_t>(c.view_shift), 1.0);
      EXPECT_TRUE(p->from_doubles(v).ok());
      return std::move(p).value();
    };
    Buffer src = shifted(host.src), dst = shifted(host.dst);
    auto offset = Buffer::make(kGpu, DType::kI64, {1});
    auto count = Buffer::make(kGpu, DType::kI64, {1});
    ASSERT_TRUE(offset->from_doubles({static_cast<double>(c.offset)}).ok());
    ASSERT_TRUE(count->from_doubles({static_cast<double>(c.count)}).ok());
    DLTensor sv = *host.src.tensor(), dv = *host.dst.tensor();
    sv.device = dv.device = kGpu;
    sv.data = src.tensor()->data;
    dv.data = dst.tensor()->data;
    sv.byte_offset = dv.byte_offset = static_cast<uint64_t>(c.view_shift) * dtype_size(c.dt);
    DLTensor* args[] = {&sv, &dv, offset->tensor(), count->tensor()};
    auto h = copy_rows(kGpu, c.dt);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->call(args, attrs_for(*h, c.on_src).view()).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    auto got = values(dst);
    got.erase(got.begin(), got.begin() + c.view_shift);
    EXPECT_TRUE(got == want) << "mismatch";
  }
}

// Programmatic dependent launch (KREG_LAUNCH_PDL): a kernel may start before the one it
// follows has finished, so copy_rows must wait before reading its source and its two
// scalars, any of which may be the previous call's output. Tables of i64 values in [0, 200]
// (4 KiB rows), so that any element can serve as an offset or a count: a large first copy
// (x -> y, 32 MiB, the offset an element of x), an early-load copy of y's first 64 rows
// into z (offset on dst, 256 KiB; the count an element of y), z -> w with both scalars read
// from the row of z that copy wrote first, then w back into x (offset on dst: 1.2 MB, the
// other kernel), over rows the next round's first copy reads. Every link reads rows the
// link before it wrote; each round reads its scalars from other columns. Bit for bit what
// the same chain gives with plain launches.
TEST_F(GpuMemoryKernels, PdlChainsReadWhatTheKernelBeforeWrote) {
  constexpr int64_t kWidth = 512;  // i64 elements a row
  const DLDevice dev = kGpu;
  auto h = copy_rows(dev, DType::kI64);
  ASSERT_TRUE(h.ok()) << h.status().message();
  const AttrList on_src = attrs_for(*h, true), on_dst = attrs_for(*h, false);
  std::mt19937_64 rng(23);
  auto table = [&](int64_t rows) {
    std::vector<int64_t> v(at(rows * kWidth));
    for (int64_t& e : v) e = static_cast<int64_t>(rng() % 201);
    return exact_buffer(kCpu, DType::kI64, {rows, kWidth}, v.data());
  };
  const Buffer x0 = table(9000), y0 = table(8192), z0 = table(300), w0 = table(300);
  const int32_t consts[] = {8192, 10, 300};  // x -> y's count, y -> z's offset, w -> x's count
  auto run_chain = [&](uint64_t flags) {
    auto copy = [&](const Buffer& b) {
      auto d = Buffer::make(dev, b.dtype(), b.shape());
      EXPECT_TRUE(d.ok()) << d.status().message();
      EXPECT_TRUE(d->copy_from(b).ok());
      return std::move(d).value();
    };
    Buffer x = copy(x0), y = copy(y0), z = copy(z0), w = copy(w0);
    Buffer c = exact_buffer(dev, DType::kI32, {3}, consts);
    int64_t one[1] = {1}, y64_shape[2] = {64, kWidth};
    // Element `i` of `b` as a one-element tensor: an offset or a count.
    auto scalar = [&](Buffer& b, int64_t i) {
      DLTensor t = *b.tensor();
      t.ndim = 1;
      t.shape = one;
      t.strides = nullptr;
      t.byte_offset = static_cast<uint64_t>(i) * dtype_size(b.dtype());
      return t;
    };
    DLTensor y64 = *y.tensor();  // y's first 64 rows
    y64.shape = y64_shape;
    const CallOptions opts{nullptr, nullptr, flags};
    auto call = [&](DLTensor* src, DLTensor* dst, DLTensor off, DLTensor cnt, const AttrList& a) {
      DLTensor* args[] = {src, dst, &off, &cnt};
      Status st = h->call(args, a.view(), opts);
      EXPECT_TRUE(st.ok()) << st.message();
    };
    for (int64_t r = 0; r < 4; ++r) {
      // x[o : o + 8192] -> y, o = x[250][r]: rows 200..299 of x are the last copy's.
      call(x.tensor(), y.tensor(), scalar(x, 250 * kWidth + r), scalar(c, 0), on_src);
      // y[0 : n] -> z[10 : 10 + n], n = min(y[0][r], 64): the early-load kernel.
      call(&y64, z.tensor(), scalar(c, 1), scalar(y, r), on_dst);
      // z[0 : n] -> w[o : o + n], o = z[10][2r], n = z[10][2r + 1]: row 10 is the last
      // copy's.
      call(z.tensor(), w.tensor(), scalar(z, 10 * kWidth + 2 * r),
           scalar(z, 10 * kWidth + 2 * r + 1), on_dst);
      // w -> x[o : o + 300], o = w[0][r].
      call(w.tensor(), x.tensor(), scalar(w, r), scalar(c, 2), on_dst);
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{bytes_of(x), bytes_of(y), bytes_of(z), bytes_of(w)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

TEST_F(GpuMemoryKernels, CpuTensorsToTheCudaPathAreRefused) {
  auto h = copy_rows(kGpu, DType::kF32);
  ASSERT_TRUE(h.ok());
  CopyBuffers b = make_buffers(CopyCase{DType::kF32, DType::kI32, 4, 4, {8}, 0, 2, true}, kCpu);
  Status st = h->call(b.tensors(), attrs_for(*h, true).view());
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("backend cuda runs on cuda tensors"), std::string::npos)
      << st.message();
}

TEST(MemoryKernels, BadArgumentsAreRejected) {
  auto h = copy_rows(kCpu, DType::kF32);
  ASSERT_TRUE(h.ok());
  const AttrList on_src = attrs_for(*h, true);
  auto call = [&](Buffer& src, Buffer& dst, Buffer& off, Buffer& cnt) {
    DLTensor* args[] = {src.tensor(), dst.tensor(), off.tensor(), cnt.tensor()};
    return h->call(args, on_src.view());
  };
  auto make = [](DType dt, std::vector<int64_t> shape) {
    auto b = Buffer::make(kCpu, dt, std::move(shape));
    EXPECT_TRUE(b.ok());
    std::vector<double> v(static_cast<size_t>(b->numel()), 1.0);
    EXPECT_TRUE(b->from_doubles(v).ok());
    return std::move(b).value();
  };
  Buffer src = make(DType::kF32, {4, 8}), off = make(DType::kI32, {1}),
         cnt = make(DType::kI64, {1});
  {
    Buffer dst = make(DType::kF32, {4, 9});
    Status st = call(src, dst, off, cnt);
    EXPECT_NE(st.message().find("argument 'dst' has size 9 in dimension 1, expected 8"),
              std::string::npos)
        << st.message();
  }
  {
    Buffer dst = make(DType::kF32, {4, 2, 4});
    Status st = call(src, dst, off, cnt);
    EXPECT_NE(st.message().find("argument 'dst' has rank 3, expected 2"), std::string::npos)
        << st.message();
  }
  {
    Buffer dst = make(DType::kBF16, {4, 8});
    Status st = call(src, dst, off, cnt);
    EXPECT_NE(st.message().find("'dst'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("dtype"), std::string::npos) << st.message();
  }
  {
    Buffer dst = make(DType::kF32, {4, 8}), bad_off = make(DType::kF32, {1});
    Status st = call(src, dst, bad_off, cnt);
    EXPECT_NE(st.message().find("'offset'"), std::string::npos) << st.message();
  }
  {
    Buffer dst = make(DType::kF32, {4, 8}), bad_cnt = make(DType::kI64, {2});
    Status st = call(src, dst, off, bad_cnt);
    EXPECT_NE(st.message().find("'count'"), std::string::npos) << st.message();
  }
  {
    Buffer scalar = make(DType::kF32, {}), dst = make(DType::kF32, {});
    Status st = call(scalar, dst, off, cnt);
    EXPECT_NE(st.message().find("argument 'src' must have rank >= 1"), std::string::npos)
        << st.message();
  }
}

}  // namespace
}  // namespace kreg
