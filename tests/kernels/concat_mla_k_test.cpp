// attention.concat_mla_k's CUDA kernel at large and awkward shapes against its CPU
// reference (attention_test.cpp checks the reference itself against an oracle and sweeps
// small shapes): T * H past 65536 rows, H ending inside a block's last group, H = 1, views
// 1-2 elements into their allocations. A pure copy: the results must be identical, element
// for element. (A 4-heads-a-thread launch these shapes were written for was slower on the
// H200 and reverted; the shapes still cover the kernel's grid edges.)
#include <gtest/gtest.h>

#include <cstdint>
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

class GpuConcatMlaK : public test::GpuTest {};

// A device copy of `b` behind `shift` leading elements, and its view.
struct Shifted {
  Buffer storage;
  DLTensor view;
};

Shifted shifted(const Buffer& b, int64_t shift) {
  auto p = Buffer::make(kGpu, b.dtype(), {b.numel() + shift});
  EXPECT_TRUE(p.ok()) << p.status().message();
  std::vector<double> v = values(b);
  v.insert(v.begin(), static_cast<size_t>(shift), 0.25);
  EXPECT_TRUE(p->from_doubles(v).ok());
  Shifted s{std::move(p).value(), *b.tensor()};
  s.view.device = kGpu;
  s.view.data = s.storage.tensor()->data;
  s.view.byte_offset = static_cast<uint64_t>(shift) * dtype_size(b.dtype());
  return s;
}

void check(DType dt, int64_t tokens, int64_t heads, int64_t shift, uint64_t seed) {
  SCOPED_TRACE("T=" + std::to_string(tokens) + " H=" + std::to_string(heads) + " " +
               std::string(dtype_name(dt)) + " shift " + std::to_string(shift));
  std::mt19937_64 rng(seed);
  auto nope = Buffer::make(kCpu, dt, {tokens, heads, 128});
  auto rope = Buffer::make(kCpu, dt, {tokens, 1, 64});
  auto out = Buffer::make(kCpu, dt, {tokens, heads, 192});
  ASSERT_TRUE(nope.ok() && rope.ok() && out.ok());
  ASSERT_TRUE(nope->fill_random(rng).ok());
  ASSERT_TRUE(rope->fill_random(rng).ok());
  ASSERT_TRUE(out->poison().ok());
  Shifted dn = shifted(*nope, shift), dr = shifted(*rope, shift), dout = shifted(*out, shift);

  auto gpu = registry().resolve("attention.concat_mla_k", Target{kGpu, dt}, {std::string("cuda")});
  auto cpu = registry().resolve("attention.concat_mla_k", Target{kCpu, dt}, {std::string("cpu")});
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  DLTensor* dargs[] = {&dn.view, &dr.view, &dout.view};
  Status st = gpu->call(dargs);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok());
  DLTensor* hargs[] = {nope->tensor(), rope->tensor(), out->tensor()};
  st = cpu->call(hargs);
  ASSERT_TRUE(st.ok()) << st.message();

  std::vector<double> got = values(dout.storage);
  got.erase(got.begin(), got.begin() + shift);
  const std::vector<double> want = values(*out);
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(got[i] == want[i]) && bad++ == 0) first = i;  // NaN (an unwritten poison) fails
  }
  EXPECT_EQ(bad, 0u) << bad << " mismatches; first at " << first << ": got " << got[first]
                     << ", want " << want[first];
}

TEST_F(GpuConcatMlaK, FourHeadsAThreadFromTheRowSwitch) {
  // The vs_torch head count; the row count either side of the switch; head counts that
  // end inside a block's last group of 4 heads; one head (never 4 a thread).
  const std::pair<int64_t, int64_t> shapes[] = {{600, 128}, {512, 128}, {511, 128},
                                                {2000, 40}, {1600, 41}, {70000, 1}};
  uint64_t seed = 1;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (auto [t, h] : shapes) check(dt, t, h, 0, seed++);
  }
}

TEST_F(GpuConcatMlaK, MisalignedViewsTakeNarrowVectors) {
  // One and two elements into the allocations: 1- and 2-element bf16 vectors, block rows
  // of 1 and 2 heads, 4 heads a thread all the same.
  for (int64_t shift : {1, 2}) check(DType::kBF16, 1000, 70, shift, 100 + shift);
  check(DType::kF32, 700, 100, 1, 200);
}

}  // namespace
}  // namespace kreg
