// quantization.hadamard_transform: the CPU reference against the dense product with H_N
// built from its recursive definition (in double), the transform's algebra (H_N H_N = N I),
// every CUDA size against the CPU reference (all three dtypes, awkward row counts, scales,
// misaligned views, in place, PDL; skipped without a GPU), and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;
using namespace test;  // kernel_test.hpp

constexpr const char* kOp = "quantization.hadamard_transform";

// H_N from H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]], row-major N x N.
std::vector<double> sylvester(int64_t n) {
  std::vector<double> h{1.0};
  for (int64_t m = 1; m < n; m *= 2) {
    std::vector<double> next(at(4 * m * m));
    for (int64_t i = 0; i < 2 * m; ++i) {
      for (int64_t j = 0; j < 2 * m; ++j) {
        const double sign = (i >= m && j >= m) ? -1.0 : 1.0;
        next[at(i * 2 * m + j)] = sign * h[at((i % m) * m + j % m)];
      }
    }
    h = std::move(next);
  }
  return h;
}

Buffer random_buffer(DLDevice device, DType dt, int64_t rows, int64_t n, uint64_t seed) {
  auto b = Buffer::make(device, dt, {rows, n});
  EXPECT_TRUE(b.ok()) << b.status().message();
  std::mt19937_64 rng(seed);
  EXPECT_TRUE(b->fill_random(rng).ok());
  return std::move(b).value();
}

Buffer poisoned(DLDevice device, DType dt, int64_t rows, int64_t n) {
  auto b = Buffer::make(device, dt, {rows, n});
  EXPECT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(b->poison().ok());
  return std::move(b).value();
}

// Relative size of one ulp of the output type (an upper bound for normal values).
double ulp_rel(DType dt) {
  switch (dt) {
    case DType::kBF16:
      return 0x1p-7;
    case DType::kF16:
      return 0x1p-10;
    default:
      return 0x1p-23;
  }
}

// Counts the elements of `got` farther from `want` than `rel` ulps of the output plus
// `acc_ulps` fp32 ulps of each row's scale * ||x_row||_2 (the size of the transform's
// values; fp32 butterflies err by a few of those per stage). NaN never matches.
size_t mismatches(const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& x, int64_t n, double scale, DType dt, double rel,
                  double acc_ulps, std::string* first) {
  size_t bad = 0;
  if (got.size() != want.size() || x.size() != want.size()) return want.size() + 1;
  for (size_t r = 0; r * at(n) < want.size(); ++r) {
    double norm2 = 0;
    for (int64_t i = 0; i < n; ++i) norm2 += x[r * at(n) + at(i)] * x[r * at(n) + at(i)];
    const double acc = acc_ulps * 0x1p-24 * std::fabs(scale) * std::sqrt(norm2) + 0x1p-24;
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = r * at(n) + at(i);
      const double tol = rel * ulp_rel(dt) * std::fabs(want[k]) + acc;
      if (!(std::fabs(got[k] - want[k]) <= tol)) {
        if (bad++ == 0 && first != nullptr) {
          *first = "row " + std::to_string(r) + " col " + std::to_string(i) + ": got " +
                   std::to_string(got[k]) + ", want " + std::to_string(want[k]);
        }
      }
    }
  }
  return bad;
}

Status call(const KernelHandle& h, Buffer& x, Buffer& out, double scale,
            uint64_t launch_flags = 0) {
  DLTensor* t[] = {x.tensor(), out.tensor()};
  const kreg_attr a[] = {float_attr(scale)};
  return h.call(t, a, CallOptions{nullptr, nullptr, launch_flags});
}

std::vector<int64_t> powers_of_two(int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t n = 2; n <= hi; n *= 2) v.push_back(n);
  return v;
}

TEST(Hadamard, CpuReferenceMatchesTheDenseProductWithTheRecursiveMatrix) {
  auto h = handle(kOp, "cpu");
  uint64_t seed = 1;
  for (int64_t n : powers_of_two(1024)) {
    const std::vector<double> hm = sylvester(n);
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (double scale : {1.0, -0.3, 1.0 / std::sqrt(static_cast<double>(n))}) {
        SCOPED_TRACE("N=" + std::to_string(n) + " " + std::string(dtype_name(dt)) +
                     " scale=" + std::to_string(scale));
        const int64_t rows = 3;
        Buffer x = random_buffer(kCpu, dt, rows, n, seed++);
        Buffer out = poisoned(kCpu, dt, rows, n);
        ASSERT_TRUE(call(h, x, out, scale).ok());
        const std::vector<double> xv = values(x);
        std::vector<double> want(xv.size(), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t i = 0; i < n; ++i) s += xv[at(r * n + i)] * hm[at(i * n + j)];
            want[at(r * n + j)] = scale * s;
          }
        }
        // One rounding of the exact value: within half an ulp (plus the fp32 scale product).
        std::string first;
        EXPECT_EQ(mismatches(values(out), want, xv, n, scale, dt, 0.5 + 0x1p-20, 1e-6, &first), 0u)
            << first;
      }
    }
  }
}

TEST(Hadamard, TwiceWithScaleOneOverSqrtNIsTheIdentity) {
  // H_N H_N = N I, so (x H / sqrt(N)) H / sqrt(N) = x; in f32 within a few ulps.
  auto h = handle(kOp, "cpu");
  for (int64_t n : powers_of_two(32768)) {
    SCOPED_TRACE("N=" + std::to_string(n));
    const double s = 1.0 / std::sqrt(static_cast<double>(n));
    Buffer x = random_buffer(kCpu, DType::kF32, 2, n, 100 + static_cast<uint64_t>(n));
    Buffer y = poisoned(kCpu, DType::kF32, 2, n);
    Buffer z = poisoned(kCpu, DType::kF32, 2, n);
    ASSERT_TRUE(call(h, x, y, s).ok());
    ASSERT_TRUE(call(h, y, z, s).ok());
    const auto xv = values(x), zv = values(z);
    ASSERT_EQ(xv.size(), zv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      ASSERT_NEAR(zv[i], xv[i], 1e-5 * std::fabs(xv[i]) + 1e-6) << "element " << i;
    }
    // And the first pass alone is not the identity.
    const auto yv = values(y);
    size_t same = 0;
    for (size_t i = 0; i < xv.size(); ++i) same += yv[i] == xv[i];
    EXPECT_LT(same, xv.size());
  }
}

TEST(Hadamard, CpuInPlaceEqualsOutOfPlace) {
  auto h = handle(kOp, "cpu");
  Buffer x = random_buffer(kCpu, DType::kBF16, 5, 256, 7);
  Buffer out = poisoned(kCpu, DType::kBF16, 5, 256);
  ASSERT_TRUE(call(h, x, out, 0.5).ok());
  DLTensor* t[] = {x.tensor(), x.tensor()};
  const kreg_attr a[] = {float_attr(0.5)};
  ASSERT_TRUE(h.call(t, a).ok());
  EXPECT_EQ(bytes_of(x), bytes_of(out));
}

TEST(Hadamard, ZeroRowsIsANoOp) {
  auto h = handle(kOp, "cpu");
  Buffer x = random_buffer(kCpu, DType::kF32, 0, 64, 1);
  Buffer out = poisoned(kCpu, DType::kF32, 0, 64);
  EXPECT_TRUE(call(h, x, out, 1.0).ok());
}

// Bad N, shape mismatch and dtype, on every backend present.
void expect_bad_arguments(const std::string& backend, DLDevice dev) {
  auto h = handle(kOp, backend);
  for (int64_t n : {1, 3, 6, 12, 24, 1000, 65536}) {
    Buffer x = random_buffer(dev, DType::kBF16, 2, n, 1);
    Buffer out = poisoned(dev, DType::kBF16, 2, n);
    const Status st = call(h, x, out, 1.0);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << backend << " N=" << n;
    const std::string want = "quantization.hadamard_transform: N = " + std::to_string(n) +
                             " (x's last dimension) must be a power of two from 2 to 32768";
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  }
  {
    Buffer x = random_buffer(dev, DType::kBF16, 2, 8, 1);
    Buffer out = poisoned(dev, DType::kBF16, 2, 16);
    const Status st = call(h, x, out, 1.0);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find("argument 'out' (tensor 2 of 2) has shape [2,16], expected [T,N]"),
              std::string::npos)
        << st.message();
    Buffer out_rows = poisoned(dev, DType::kBF16, 3, 8);
    EXPECT_EQ(call(h, x, out_rows, 1.0).code(), KREG_INVALID_ARGUMENT);
  }
  {
    Buffer x = random_buffer(dev, DType::kF64, 2, 8, 1);
    Buffer out = poisoned(dev, DType::kF64, 2, 8);
    const Status st = call(h, x, out, 1.0);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find("has dtype f64"), std::string::npos) << st.message();
    Buffer mixed = poisoned(dev, DType::kF16, 2, 8);
    Buffer xb = random_buffer(dev, DType::kBF16, 2, 8, 1);
    EXPECT_EQ(call(h, xb, mixed, 1.0).code(), KREG_INVALID_ARGUMENT);
  }
}

TEST(Hadamard, BadArgumentsAreRefusedNamingTheProblem) { expect_bad_arguments("cpu", kCpu); }

class GpuHadamard : public test::GpuTest {};

TEST_F(GpuHadamard, BadArgumentsAreRefusedNamingTheProblem) { expect_bad_arguments("cuda", kGpu); }

// GPU against the CPU reference for every N, the three dtypes, awkward row counts (more
// rows than one block takes, fewer, one) and several scales, on poisoned outputs.
TEST_F(GpuHadamard, EveryNMatchesTheCpuReference) {
  auto gpu = handle(kOp, "cuda");
  auto cpu = handle(kOp, "cpu");
  uint64_t seed = 1000;
  for (int64_t n : powers_of_two(32768)) {
    const double scales[] = {1.0, 1.0 / std::sqrt(static_cast<double>(n)), -0.37};
    int si = 0;
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (int64_t rows : {1, 3, 67, 300}) {
        if (rows == 300 && n > 1024) continue;  // keeps the CPU side fast
        const double scale = scales[si++ % 3];
        SCOPED_TRACE("N=" + std::to_string(n) + " T=" + std::to_string(rows) + " " +
                     std::string(dtype_name(dt)) + " scale=" + std::to_string(scale));
        Buffer x_host = random_buffer(kCpu, dt, rows, n, seed++);
        Buffer want = poisoned(kCpu, dt, rows, n);
        ASSERT_TRUE(call(cpu, x_host, want, scale).ok());
        auto x = Buffer::make(kGpu, dt, {rows, n});
        ASSERT_TRUE(x.ok());
        ASSERT_TRUE(x->copy_from(x_host).ok());
        Buffer out = poisoned(kGpu, dt, rows, n);
        const Status st = call(gpu, *x, out, scale);
        ASSERT_TRUE(st.ok()) << st.message();
        ASSERT_TRUE(harness::device_synchronize().ok());
        std::string first;
        const size_t bad =
            mismatches(values(out), values(want), values(x_host), n, scale, dt, 1.0, 64.0, &first);
        EXPECT_EQ(bad, 0u) << first;
        // The input is left alone.
        EXPECT_EQ(bytes_of(*x), bytes_of(x_host));
      }
    }
  }
}

// Views one element into their allocation defeat the 16-byte vectors (the scalar path);
// out aliasing x gives what a separate out gives.
TEST_F(GpuHadamard, MisalignedViewsAndInPlace) {
  auto gpu = handle(kOp, "cuda");
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (int64_t n : {8, 64, 4096, 32768}) {
      SCOPED_TRACE("N=" + std::to_string(n) + " " + std::string(dtype_name(dt)));
      const int64_t rows = 5;
      Buffer x = random_buffer(kGpu, dt, rows, n, 77);
      Buffer want = poisoned(kGpu, dt, rows, n);
      ASSERT_TRUE(call(gpu, x, want, 0.25).ok());
      // Misaligned copies of x and out.
      auto xp = Buffer::make(kGpu, dt, {rows * n + 1});
      auto op = Buffer::make(kGpu, dt, {rows * n + 1});
      ASSERT_TRUE(xp.ok() && op.ok());
      auto xv = values(x);
      xv.insert(xv.begin(), 0.5);
      ASSERT_TRUE(xp->from_doubles(xv).ok());
      ASSERT_TRUE(op->poison().ok());
      DLTensor xt = *x.tensor(), ot = *want.tensor();
      xt.data = xp->tensor()->data;
      ot.data = op->tensor()->data;
      xt.byte_offset = ot.byte_offset = dtype_size(dt);
      DLTensor* t[] = {&xt, &ot};
      const kreg_attr a[] = {float_attr(0.25)};
      ASSERT_TRUE(gpu.call(t, a).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      auto got = values(*op);
      got.erase(got.begin());
      EXPECT_EQ(got, values(want)) << "misaligned views differ from aligned ones";
      // In place.
      DLTensor* same[] = {x.tensor(), x.tensor()};
      ASSERT_TRUE(gpu.call(same, a).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      EXPECT_EQ(bytes_of(x), bytes_of(want)) << "in place differs from out of place";
    }
  }
  Buffer x = random_buffer(kGpu, DType::kBF16, 0, 4096, 1);
  Buffer out = poisoned(kGpu, DType::kBF16, 0, 4096);
  EXPECT_TRUE(call(gpu, x, out, 1.0).ok()) << "zero rows";
  EXPECT_TRUE(harness::device_synchronize().ok());
}

// At large T the 16-bit sizes of 1024..8192 with 16-byte vectors run a grid of what the SMs
// hold, each block doing group after group with the next one's loads in flight: row counts
// just past that threshold (more than 1024 groups of 8, 4, 2, 1 rows) and not a multiple of
// the group, so blocks do different numbers of groups and the last group is partial; bf16
// (pipelined) and f32 (one group per block) against the CPU reference, in place (a block
// reads its next rows while writing its own), and through the one-element path of a
// misaligned view (not pipelined: the same values).
TEST_F(GpuHadamard, PipelinedLargeTMatchesTheCpuReferenceInPlaceAndMisaligned) {
  auto gpu = handle(kOp, "cuda");
  auto cpu = handle(kOp, "cpu");
  const std::pair<int64_t, int64_t> sizes[] = {
      {1024, 8203}, {2048, 4099}, {4096, 2601}, {8192, 1500}};
  uint64_t seed = 3000;
  for (const auto& [n, rows] : sizes) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const double scale = 1.0 / std::sqrt(static_cast<double>(n));
      SCOPED_TRACE("N=" + std::to_string(n) + " T=" + std::to_string(rows) + " " +
                   std::string(dtype_name(dt)));
      Buffer x_host = random_buffer(kCpu, dt, rows, n, seed++);
      Buffer want = poisoned(kCpu, dt, rows, n);
      ASSERT_TRUE(call(cpu, x_host, want, scale).ok());
      auto x = Buffer::make(kGpu, dt, {rows, n});
      ASSERT_TRUE(x.ok());
      ASSERT_TRUE(x->copy_from(x_host).ok());
      Buffer out = poisoned(kGpu, dt, rows, n);
      const Status st = call(gpu, *x, out, scale);
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_TRUE(harness::device_synchronize().ok());
      const std::vector<double> xv = values(x_host);
      std::string first;
      EXPECT_EQ(mismatches(values(out), values(want), xv, n, scale, dt, 1.0, 64.0, &first), 0u)
          << first;
      EXPECT_EQ(bytes_of(*x), bytes_of(x_host)) << "the input is left alone";
      // Misaligned copies of x and out: the one-element loads and stores.
      auto xp = Buffer::make(kGpu, dt, {rows * n + 1});
      auto op = Buffer::make(kGpu, dt, {rows * n + 1});
      ASSERT_TRUE(xp.ok() && op.ok());
      std::vector<double> shifted = xv;
      shifted.insert(shifted.begin(), 0.5);
      ASSERT_TRUE(xp->from_doubles(shifted).ok());
      ASSERT_TRUE(op->poison().ok());
      DLTensor xt = *x->tensor(), ot = *out.tensor();
      xt.data = xp->tensor()->data;
      ot.data = op->tensor()->data;
      xt.byte_offset = ot.byte_offset = dtype_size(dt);
      DLTensor* t[] = {&xt, &ot};
      const kreg_attr a[] = {float_attr(scale)};
      ASSERT_TRUE(gpu.call(t, a).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      auto got = values(*op);
      got.erase(got.begin());
      EXPECT_TRUE(got == values(out)) << "misaligned views differ from aligned ones";
      // In place.
      DLTensor* same[] = {x->tensor(), x->tensor()};
      ASSERT_TRUE(gpu.call(same, a).ok());
      ASSERT_TRUE(harness::device_synchronize().ok());
      EXPECT_TRUE(bytes_of(*x) == bytes_of(out)) << "in place differs from out of place";
    }
  }
}

// With KREG_LAUNCH_PDL each transform may start before the one before it ends, and must
// wait before reading its output: a chain of transforms, each reading the previous one's
// output, gives bit for bit what it gives without PDL.
TEST_F(GpuHadamard, PdlChainsReadWhatTheTransformBeforeWrote) {
  auto gpu = handle(kOp, "cuda");
  const int64_t rows = 16384, n = 4096;
  Buffer x = random_buffer(kGpu, DType::kBF16, rows, n, 5);
  const double s = 1.0 / 64.0;
  auto run_chain = [&](uint64_t flags) {
    Buffer a = poisoned(kGpu, DType::kBF16, rows, n), b = poisoned(kGpu, DType::kBF16, rows, n);
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(call(gpu, i == 0 ? x : b, a, s, i == 0 ? 0 : flags).ok());
      EXPECT_TRUE(call(gpu, a, b, -s, flags).ok());
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return bytes_of(b);
  };
  const auto want = run_chain(0);
  for (int rep = 0; rep < 3; ++rep) {
    EXPECT_TRUE(run_chain(KREG_LAUNCH_PDL) == want) << "differs with PDL, repetition " << rep;
  }
}

}  // namespace
}  // namespace kreg
