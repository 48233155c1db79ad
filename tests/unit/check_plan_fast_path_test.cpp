// KernelHandle::call's fast path (detail::ExactShapeCache in kreg/registry.hpp): a call
// whose tensor words equal the last accepted call's skips the symbolic check. These tests
// hold it to its promise: it never accepts what the full check refuses (every mutation of
// an accepted call, a differential run against Registry::call's uncached check, torn reads
// under concurrent stores), resources and attributes are checked on every call, hot swap
// still reaches the new code, and neither hits nor misses allocate.
#include <gtest/gtest.h>

#include <algorithm>

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "kreg/plugin.hpp"
#include "kreg/registry.hpp"
#include "kreg/resource.hpp"

// Counts heap allocations in this test binary (the array and nothrow forms too: a
// sanitizer runtime replaces each form separately).
static std::atomic<long> g_allocations{0};
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return ::operator new(n, t);
}
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace fs = std::filesystem;

namespace kreg {
namespace {

using detail::ExactShapeCache;

// Counts the calls that reached the kernel; touches no data (so that a call with a null
// data pointer, which no check looks at, is harmless here).
std::atomic<long> g_runs{0};
KernelStatus count_pair(Context&, const DLTensor&, DLTensor&) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  return kOk;
}
KernelStatus count_pair_alpha(Context&, const DLTensor&, DLTensor&, double) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  return kOk;
}
KernelStatus count_opt(Context&, const DLTensor&, const DLTensor*, DLTensor&) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  return kOk;
}

KernelSpec spec(const char* op, const char* sig, Binding b, const char* dtypes = "f32|bf16") {
  kreg_kernel_desc d{};
  d.struct_size = sizeof d;
  d.op = op;
  d.backend = "cpu";
  d.caps = kCpu;
  d.num_caps = 1;
  d.signature = sig;
  d.dtypes = dtypes;
  d.arg_kinds = b.arg_kinds;
  d.description = "test";
  d.source_file = "check_plan_fast_path_test.cpp";
  d.fn = b.fn;
  auto s = make_kernel_spec(d, Provenance{"fp", "0.1.0", "", ""});
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

// A tensor whose every field the test may change; shape and strides have room for any
// rank up to 10.
struct T {
  T(std::initializer_list<int64_t> dims, DLDataType dt = {kDLFloat, 32, 1}) { reset(dims, dt); }
  T(const T&) = delete;  // t points into this object
  T& operator=(const T&) = delete;
  void reset(std::initializer_list<int64_t> dims, DLDataType dt = {kDLFloat, 32, 1}) {
    int k = 0;
    for (int64_t d : dims) shape[k++] = d;
    t = DLTensor{};
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = k;
    t.dtype = dt;
    t.shape = shape;
    t.strides = nullptr;
  }
  // Row-major strides for the current shape, made explicit.
  void explicit_strides() {
    int64_t s = 1;
    for (int k = t.ndim - 1; k >= 0; --k) {
      strides[k] = s;
      s *= shape[k];
    }
    t.strides = strides;
  }
  DLTensor t{};
  int64_t shape[10] = {};
  int64_t strides[10] = {};
  float data[4] = {};
};

// ---- The cache alone, word by word ----

TEST(ExactShapeCacheTest, MatchesOnlyWhatWasStored) {
  ExactShapeCache c;
  T x({3, 8}), out({3, 4});
  x.explicit_strides();
  DLTensor* args[] = {&x.t, &out.t};
  EXPECT_FALSE(c.matches(args)) << "an empty cache matched";
  c.remember(args);
  EXPECT_TRUE(c.matches(args));
  // Other tensors with the same words match: the words are compared, not the pointers.
  T x2({3, 8}), out2({3, 4});
  x2.explicit_strides();
  DLTensor* copies[] = {&x2.t, &out2.t};
  EXPECT_TRUE(c.matches(copies));
  // Data and byte_offset are not read by the full check, so not by the cache either (the
  // kernel owns what the data pointer points at).
  x2.t.data = nullptr;
  out2.t.byte_offset = 64;
  EXPECT_TRUE(c.matches(copies));
}

TEST(ExactShapeCacheTest, EveryMutatedWordMisses) {
  using Mutation = void (*)(T & x, T & out, DLTensor * *args);
  const std::vector<std::pair<const char*, Mutation>> mutations = {
      {"shape[0]", [](T& x, T&, DLTensor**) { x.shape[0] = 4; }},
      {"shape[1]", [](T&, T& out, DLTensor**) { out.shape[1] = 5; }},
      {"stride", [](T& x, T&, DLTensor**) { x.strides[0] = 9; }},
      {"strides added, not row-major",
       [](T&, T& out, DLTensor**) {
         out.explicit_strides();
         out.strides[0] = 5;
       }},
      {"dtype code", [](T& x, T&, DLTensor**) { x.t.dtype.code = kDLInt; }},
      {"dtype bits", [](T& x, T&, DLTensor**) { x.t.dtype.bits = 64; }},
      {"dtype lanes", [](T&, T& out, DLTensor**) { out.t.dtype.lanes = 2; }},
      {"device type", [](T& x, T&, DLTensor**) { x.t.device.device_type = kDLCUDA; }},
      {"device id", [](T&, T& out, DLTensor**) { out.t.device.device_id = 1; }},
      {"rank down", [](T& x, T&, DLTensor**) { x.t.ndim = 1; }},
      {"rank up", [](T&, T& out, DLTensor**) { out.t.ndim = 3; }},
      {"negative rank", [](T& x, T&, DLTensor**) { x.t.ndim = -1; }},
      {"huge rank", [](T& x, T&, DLTensor**) { x.t.ndim = 1 << 30; }},
      {"null tensor", [](T&, T&, DLTensor** a) { a[1] = nullptr; }},
      {"null shape", [](T& x, T&, DLTensor**) { x.t.shape = nullptr; }},
  };
  for (const auto& [what, mutate] : mutations) {
    ExactShapeCache c;
    T x({3, 8}), out({3, 4});
    x.explicit_strides();
    DLTensor* args[] = {&x.t, &out.t};
    c.remember(args);
    ASSERT_TRUE(c.matches(args)) << what;
    mutate(x, out, args);
    EXPECT_FALSE(c.matches(args)) << what << ": a mutated call matched";
  }
}

// Strides enter the full check only as "absent, or row-major for the shape": a slot holds
// the call's strides or, for a call without, the row-major ones, and a caller's strides
// are compared only when it has some.
TEST(ExactShapeCacheTest, StridesAreComparedOnlyWhenTheCallHasSome) {
  ExactShapeCache c;
  T x({3, 8}), out({3, 4});
  DLTensor* args[] = {&x.t, &out.t};
  c.remember(args);  // no strides: the slots hold [8, 1] and [4, 1]
  x.explicit_strides();
  EXPECT_TRUE(c.matches(args)) << "row-major strides given";
  EXPECT_EQ(c.compare_n<2>(args), ExactShapeCache::Verdict::kEqual);
  x.strides[1] = 2;
  EXPECT_FALSE(c.matches(args)) << "other strides given";
  EXPECT_EQ(c.compare_n<2>(args), ExactShapeCache::Verdict::kDiffers);
  x.strides[1] = 1;
  x.strides[0] = 9;
  EXPECT_FALSE(c.matches(args));
  EXPECT_EQ(c.compare_n<2>(args), ExactShapeCache::Verdict::kDiffers);

  // Stored with strides the full check accepts that are not the row-major ones (a
  // dimension of extent 1 may have any stride): the same strides match, the row-major
  // ones do not (the full check decides them), no strides do.
  T y({1, 4});
  y.explicit_strides();
  y.strides[0] = 7;
  DLTensor* one[] = {&y.t};
  c.remember(one);
  EXPECT_TRUE(c.matches(one));
  y.strides[0] = 4;
  EXPECT_FALSE(c.matches(one));
  EXPECT_EQ(c.compare_n<1>(one), ExactShapeCache::Verdict::kDiffers);
  y.t.strides = nullptr;
  EXPECT_TRUE(c.matches(one)) << "strides dropped";
  EXPECT_EQ(c.compare_n<1>(one), ExactShapeCache::Verdict::kEqual);

  // A zero extent: the row-major strides stored are those strides_row_major accepts.
  T z({2, 0, 3});
  DLTensor* empty[] = {&z.t};
  c.remember(empty);
  z.explicit_strides();
  EXPECT_TRUE(detail::strides_row_major(z.t));
  EXPECT_TRUE(c.matches(empty));
  EXPECT_EQ(c.compare_n<1>(empty), ExactShapeCache::Verdict::kEqual);
}

TEST(ExactShapeCacheTest, NullTensorsAreRememberedAsNull) {
  ExactShapeCache c;
  T x({4}), bias({4}), out({4});
  DLTensor* without[] = {&x.t, nullptr, &out.t};
  DLTensor* with[] = {&x.t, &bias.t, &out.t};
  c.remember(without);
  EXPECT_TRUE(c.matches(without));
  EXPECT_FALSE(c.matches(with));
  c.remember(with);
  EXPECT_TRUE(c.matches(with));
  EXPECT_FALSE(c.matches(without));
}

TEST(ExactShapeCacheTest, ARankAboveTheSlotIsNotStoredAndKeepsThePreviousWords) {
  ExactShapeCache c;
  T small({2, 2}), big({1, 1, 1, 1, 1, 1, 1, 1, 2});  // rank 9 > kMaxRank
  DLTensor* a[] = {&small.t};
  DLTensor* b[] = {&big.t};
  c.remember(a);
  c.remember(b);
  EXPECT_FALSE(c.matches(b));
  EXPECT_TRUE(c.matches(a));
}

// Writers store two calls A and B in turn; readers ask for C, A's first tensor with B's
// second, which was never stored. A read that mixed the two stores would match C.
TEST(ExactShapeCacheTest, ConcurrentStoresNeverMatchAMixOfTwoCalls) {
  ExactShapeCache c;
  T a0({2, 6}), a1({2, 3}), b0({5, 10}), b1({5, 5});
  DLTensor* a[] = {&a0.t, &a1.t};
  DLTensor* b[] = {&b0.t, &b1.t};
  DLTensor* mix[] = {&a0.t, &b1.t};
  c.remember(a);
  std::atomic<bool> stop{false};
  std::atomic<long> mixed{0}, hits{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 20000; ++i) c.remember((i + w) % 2 ? a : b);
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        if (c.matches(mix)) mixed.fetch_add(1, std::memory_order_relaxed);
        if (c.matches(a) || c.matches(b)) hits.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  threads[0].join();
  threads[1].join();
  stop.store(true);
  threads[2].join();
  threads[3].join();
  EXPECT_EQ(mixed.load(), 0) << "a torn read matched a call never stored";
  // Quiet again: the last store is whole and matches.
  EXPECT_TRUE(c.matches(a) || c.matches(b));
}

// The arity-specialized compare (CheckPlan::match_shapes) says kEqual only where matches()
// says true, and hands what it does not handle (no shape, rank 0 or above 4) to matches().
TEST(ExactShapeCacheTest, CompareNAgreesWithMatches) {
  using V = ExactShapeCache::Verdict;
  ExactShapeCache c;
  T x({3, 8}), bias({8}), out({2, 3, 4, 5});
  out.explicit_strides();
  DLTensor* args[] = {&x.t, &bias.t, &out.t};
  DLTensor* no_bias[] = {&x.t, nullptr, &out.t};
  EXPECT_EQ(c.compare_n<3>(args), V::kDiffers) << "an empty cache matched";
  c.remember(args);
  EXPECT_EQ(c.compare_n<3>(args), V::kEqual);
  EXPECT_EQ(c.compare_n<3>(no_bias), V::kDiffers);
  c.remember(no_bias);
  EXPECT_EQ(c.compare_n<3>(no_bias), V::kEqual);
  EXPECT_TRUE(c.matches(no_bias));
  EXPECT_EQ(c.compare_n<3>(args), V::kDiffers);
  c.remember(args);
  // Every word of every tensor, changed one at a time, differs; then restored, equal.
  for (T* t : {&x, &bias, &out}) {
    for (int k = 0; k < t->t.ndim; ++k) {
      ++t->shape[k];
      EXPECT_EQ(c.compare_n<3>(args), V::kDiffers) << "shape " << k;
      EXPECT_FALSE(c.matches(args));
      --t->shape[k];
      if (t->t.strides != nullptr) {
        ++t->strides[k];
        EXPECT_EQ(c.compare_n<3>(args), V::kDiffers) << "stride " << k;
        EXPECT_FALSE(c.matches(args));
        --t->strides[k];
      }
    }
    t->t.dtype.bits = 16;
    EXPECT_EQ(c.compare_n<3>(args), V::kDiffers);
    t->t.dtype.bits = 32;
    t->t.device.device_id = 1;
    EXPECT_EQ(c.compare_n<3>(args), V::kDiffers);
    t->t.device.device_id = 0;
    // Strides are compared when the call has some (the slot holds the call's, or the
    // row-major ones): dropped or row-major, the same tensor for the full check.
    int64_t* st = t->t.strides;
    if (st != nullptr) {
      t->t.strides = nullptr;
      EXPECT_EQ(c.compare_n<3>(args), V::kEqual) << "strides dropped";
      EXPECT_TRUE(c.matches(args));
    } else {
      t->explicit_strides();
      EXPECT_EQ(c.compare_n<3>(args), V::kEqual) << "row-major strides given";
      EXPECT_TRUE(c.matches(args));
      t->strides[0] += 1;  // dimension 0 has an extent above 1 in each of these tensors
      EXPECT_EQ(c.compare_n<3>(args), V::kDiffers) << "other strides given";
      EXPECT_FALSE(c.matches(args));
    }
    t->t.strides = st;
    ASSERT_EQ(c.compare_n<3>(args), V::kEqual);
  }
  // Ranks outside 1..4 and a null shape are left to matches().
  for (int32_t nd : {0, 5, 8, 9, -1, 1 << 30}) {
    const int32_t keep = out.t.ndim;
    out.t.ndim = nd;
    EXPECT_EQ(c.compare_n<3>(args), V::kUnusual) << nd;
    EXPECT_FALSE(c.matches(args)) << nd;
    out.t.ndim = keep;
  }
  x.t.shape = nullptr;
  EXPECT_EQ(c.compare_n<3>(args), V::kUnusual);
  EXPECT_FALSE(c.matches(args));
  x.t.shape = x.shape;
  EXPECT_EQ(c.compare_n<3>(args), V::kEqual);
  // A rank-5 call stored is matched by matches() (compare_n hands it over).
  T big({1, 2, 1, 2, 3});
  DLTensor* five[] = {&x.t, &bias.t, &big.t};
  c.remember(five);
  EXPECT_EQ(c.compare_n<3>(five), V::kUnusual);
  EXPECT_TRUE(c.matches(five));
}

// ---- Through handles: the full check's verdict on every call ----

class FastPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("KREG_FORCE_BACKEND");
    ASSERT_TRUE(reg.add(spec("fp.pair", "pair(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()",
                             bind<&count_pair>))
                    .ok());
  }
  Registry reg;
};

TEST_F(FastPathTest, EveryMutationOfAnAcceptedCallIsRefused) {
  T x({3, 8}), out({3, 4});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("fp.pair", args);
  ASSERT_TRUE(h.ok()) << h.status().message();
  struct Case {
    const char* what;
    void (*mutate)(T& x, T& out);
    const char* message;  // part of the full check's message
  };
  const Case cases[] = {
      {"T differs", [](T&, T& out) { out.shape[0] = 2; }, "'out'"},
      {"D differs", [](T&, T& out) { out.shape[1] = 5; }, "'out'"},
      {"2*D is odd", [](T& x, T&) { x.shape[1] = 7; }, "'x'"},
      {"negative extent", [](T& x, T& out) { x.shape[0] = out.shape[0] = -3; }, "'x'"},
      {"not contiguous",
       [](T& x, T&) {
         x.explicit_strides();
         x.strides[1] = 2;
       },
       "'x'"},
      {"dtype outside the set",
       [](T& x, T& out) {
         x.t.dtype = out.t.dtype = {kDLFloat, 64, 1};
       },
       "'x'"},
      {"dtypes disagree",
       [](T&, T& out) {
         out.t.dtype = {kDLBfloat, 16, 1};
       },
       "'out'"},
      {"device type",
       [](T& x, T& out) {
         x.t.device = out.t.device = {kDLCUDA, 0};
       },
       "'x'"},
      {"devices disagree", [](T&, T& out) { out.t.device.device_id = 1; }, "'out'"},
      {"rank", [](T&, T& out) { out.t.ndim = 3; }, "'out'"},
      {"null shape", [](T& x, T&) { x.t.shape = nullptr; }, "'x'"},
  };
  for (const Case& c : cases) {
    x.reset({3, 8});
    out.reset({3, 4});
    const long before = g_runs.load();
    ASSERT_TRUE(h->call(args).ok()) << c.what << ": the accepted call";
    ASSERT_TRUE(h->call(args).ok()) << c.what << ": the accepted call, again";
    c.mutate(x, out);
    Status st = h->call(args);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << c.what << ": " << st.message();
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.what << ": " << st.message();
    EXPECT_EQ(g_runs.load(), before + 2) << c.what << ": the kernel ran on a refused call";
  }
  // Strides: an accepted call with explicit row-major strides, then one stride changed.
  x.reset({3, 8});
  out.reset({3, 4});
  x.explicit_strides();
  ASSERT_TRUE(h->call(args).ok());
  ASSERT_TRUE(h->call(args).ok());
  x.strides[0] = 9;
  EXPECT_EQ(h->call(args).code(), KREG_INVALID_ARGUMENT);
  // A null tensor, and other tensor counts, after an accepted call.
  x.reset({3, 8});
  out.reset({3, 4});
  ASSERT_TRUE(h->call(args).ok());
  const long before = g_runs.load();
  DLTensor* null_out[] = {&x.t, nullptr};
  EXPECT_EQ(h->call(null_out).code(), KREG_INVALID_ARGUMENT);
  DLTensor* one[] = {&x.t};
  EXPECT_EQ(h->call(one).code(), KREG_INVALID_ARGUMENT);
  DLTensor* three[] = {&x.t, &out.t, &out.t};
  EXPECT_EQ(h->call(three).code(), KREG_INVALID_ARGUMENT);
  EXPECT_EQ(h->call(std::span<DLTensor* const>{}).code(), KREG_INVALID_ARGUMENT);
  EXPECT_EQ(g_runs.load(), before);
  // The refusals did not disturb the accepted call.
  EXPECT_TRUE(h->call(args).ok());
  EXPECT_EQ(g_runs.load(), before + 1);
}

TEST_F(FastPathTest, NewAcceptedShapesAreAcceptedAndTheOldOnesStillAre) {
  T x({3, 8}), out({3, 4}), x2({5, 2}), out2({5, 1});
  DLTensor* args[] = {&x.t, &out.t};
  DLTensor* args2[] = {&x2.t, &out2.t};
  auto h = reg.resolve("fp.pair", args);
  ASSERT_TRUE(h.ok());
  const long before = g_runs.load();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(h->call(args).ok());
    ASSERT_TRUE(h->call(args2).ok());
  }
  // Explicit row-major strides and a zero extent are accepted as the full check says; a
  // call whose every tensor is empty moves nothing and does not reach the kernel, the
  // second time either (it is not remembered for the inline path).
  x.explicit_strides();
  ASSERT_TRUE(h->call(args).ok());
  x.shape[0] = out.shape[0] = 0;
  ASSERT_TRUE(h->call(args).ok());
  ASSERT_TRUE(h->call(args).ok());
  EXPECT_EQ(g_runs.load(), before + 9);
}

// Random mutations of an accepted call, each checked twice: through a handle whose cache
// holds the accepted call, and through Registry::call, whose selection runs the full check
// with no cache. The verdicts must agree.
TEST_F(FastPathTest, AgreesWithTheFullCheckOnRandomMutations) {
  T x({3, 8}), out({3, 4}), xs({3, 8});
  xs.explicit_strides();
  DLTensor* base[] = {&x.t, &out.t};
  DLTensor* base_strided[] = {&xs.t, &out.t};
  auto h = reg.resolve("fp.pair", base);
  ASSERT_TRUE(h.ok());
  std::mt19937 rng(17);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const int64_t extents[] = {-1, 0, 1, 2, 3, 4, 5, 7, 8, 16};
  const DLDataType dtypes[] = {
      {kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 64, 1}, {kDLInt, 32, 1}, {kDLFloat, 32, 2}};
  const DLDevice devices[] = {{kDLCPU, 0}, {kDLCPU, 1}, {kDLCUDA, 0}, {kDLCUDAHost, 0}};
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    T m0({3, 8}), m1({3, 4});
    T* m[2] = {&m0, &m1};
    const bool strided = trial % 2;  // then the cached call has strides too
    if (strided) m0.explicit_strides();
    DLTensor* args[] = {&m0.t, &m1.t};
    size_t count = 2;
    for (int k = 0, n = 1 + pick(3); k < n; ++k) {
      T& t = *m[pick(2)];
      switch (pick(8)) {
        case 0:
          t.shape[pick(2)] = extents[pick(10)];
          break;
        case 1:
          t.explicit_strides();
          t.strides[pick(2)] = extents[pick(10)];
          break;
        case 2:
          t.t.dtype = dtypes[pick(5)];
          break;
        case 3:
          t.t.device = devices[pick(4)];
          break;
        case 4:
          t.t.ndim = pick(4);
          break;
        case 5:
          args[pick(2)] = nullptr;
          break;
        case 6:
          count = static_cast<size_t>(pick(3));
          break;
        default:
          t.t.shape = nullptr;
          break;
      }
    }
    ASSERT_TRUE(h->call(strided ? base_strided : base).ok());  // the cache holds it
    const std::span<DLTensor* const> call(args, count);
    const long before = g_runs.load();
    const bool by_handle = h->call(call).ok();
    const bool ran = g_runs.load() != before;
    const bool full = reg.call("fp.pair", call).ok();
    ASSERT_EQ(by_handle, full) << "trial " << trial;
    ASSERT_EQ(ran, by_handle) << "trial " << trial;
    // Twice: now the mutated call may be the one cached.
    ASSERT_EQ(h->call(call).ok(), full) << "trial " << trial << ", again";
    (full ? accepted : refused)++;
  }
  // The mutations reached both verdicts often enough to mean something.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 1000);
}

// Counts the calls that reached it, whatever the arguments (a raw C kernel: any arity).
int32_t count_raw(const kreg_call_frame*, kreg_error*) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  return KREG_OK;
}

// The compare is specialized per arity (up to 8 tensors; the generic loop past that): for
// every arity up to kMaxTensors, random mutations of an accepted call of tensors of ranks 1 to 5
// (the fast compare, and matches() past rank 4), an optional tensor given or left out, an any-rank
// tensor, with and without strides, get the uncached full check's verdict through the handle.
TEST_F(FastPathTest, EveryArityAgreesWithTheFullCheck) {
  const char* syms[] = {"A", "B", "C", "D", "E"};
  const int64_t extent[] = {2, 3, 1, 5, 4};
  std::mt19937 rng(1717);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const int64_t extents[] = {-1, 0, 1, 2, 3, 4, 5, 6};
  const DLDataType dtypes[] = {{kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 64, 1}};
  const DLDevice devices[] = {{kDLCPU, 0}, {kDLCPU, 1}, {kDLCUDA, 0}};
  int accepted = 0, refused = 0;
  for (int n = 1; n <= kMaxTensors; ++n) {
    // Tensor i: ranked of rank 1..4 over the symbols (i % 5 < 3), optional [A] (i % 5 == 3),
    // or any rank (i % 5 == 4; called with rank 3, or rank 5 in odd arities: matches()).
    std::string name = "arity" + std::to_string(n), sig = name + "(", kinds;
    std::vector<std::vector<int64_t>> dims(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      std::string p;
      if (i % 5 < 3) {
        const int rank = 1 + (i * 3 + n) % 4;
        p = "Tensor[";
        for (int k = 0; k < rank; ++k) {
          const int sym = i == 0 ? k : (i + k) % 5;  // tensor 0 binds A first
          p += std::string(k ? "," : "") + syms[sym];
          dims[static_cast<size_t>(i)].push_back(extent[sym]);
        }
        p += "]";
        kinds += 'T';
      } else if (i % 5 == 3) {
        p = "Tensor?[A]";
        dims[static_cast<size_t>(i)] = {extent[0]};
        kinds += 'O';
      } else {
        p = "Tensor";
        dims[static_cast<size_t>(i)] =
            n % 2 ? std::vector<int64_t>{1, 2, 1, 2, 3} : std::vector<int64_t>{2, 1, 3};
        kinds += 'T';
      }
      sig += std::string(i ? ", " : "") + p + " x" + std::to_string(i);
    }
    sig += ") -> ()";
    const std::string op = "fp." + name;
    ASSERT_TRUE(reg.add(spec(op.c_str(), sig.c_str(), Binding{&count_raw, kinds.c_str()})).ok())
        << sig;
    std::vector<std::unique_ptr<T>> base(static_cast<size_t>(n));
    std::vector<DLTensor*> base_args(static_cast<size_t>(n));
    auto fill = [&](T& t, int i) {
      const auto& d = dims[static_cast<size_t>(i)];
      t.reset({});
      for (size_t k = 0; k < d.size(); ++k) t.shape[k] = d[k];
      t.t.ndim = static_cast<int32_t>(d.size());
    };
    for (int i = 0; i < n; ++i) {
      base[static_cast<size_t>(i)] = std::make_unique<T>(std::initializer_list<int64_t>{});
      fill(*base[static_cast<size_t>(i)], i);
      if (i % 2) base[static_cast<size_t>(i)]->explicit_strides();
      base_args[static_cast<size_t>(i)] = &base[static_cast<size_t>(i)]->t;
    }
    auto h = reg.resolve(op, base_args);
    ASSERT_TRUE(h.ok()) << sig << ": " << h.status().message();
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<std::unique_ptr<T>> m(static_cast<size_t>(n));
      std::vector<DLTensor*> args(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        m[static_cast<size_t>(i)] = std::make_unique<T>(std::initializer_list<int64_t>{});
        fill(*m[static_cast<size_t>(i)], i);
        if (i % 2) m[static_cast<size_t>(i)]->explicit_strides();
        args[static_cast<size_t>(i)] = &m[static_cast<size_t>(i)]->t;
      }
      size_t count = static_cast<size_t>(n);
      for (int k = 0, changes = 1 + pick(3); k < changes; ++k) {
        const int i = pick(n);
        T& t = *m[static_cast<size_t>(i)];
        const int dim = pick(std::max(t.t.ndim, 1));
        switch (pick(9)) {
          case 0:
          case 1:
            t.shape[dim] = extents[pick(8)];
            break;
          case 2:
            t.explicit_strides();
            t.strides[dim] = extents[pick(8)];
            break;
          case 3:
            t.t.dtype = dtypes[pick(3)];
            break;
          case 4:
            t.t.device = devices[pick(3)];
            break;
          case 5:
            t.t.ndim = pick(10);
            break;
          case 6:
            args[static_cast<size_t>(i)] = nullptr;
            break;
          case 7:
            count = static_cast<size_t>(pick(n + 2));
            break;
          default:
            t.t.shape = nullptr;
            break;
        }
      }
      ASSERT_TRUE(h->call(base_args).ok()) << sig;  // the cache holds it
      args.resize(std::max(args.size(), count), args.empty() ? nullptr : args[0]);
      const std::span<DLTensor* const> call(args.data(), count);
      const long before = g_runs.load();
      const bool by_handle = h->call(call).ok();
      const bool ran = g_runs.load() != before;
      const bool full = reg.call(op, call).ok();
      ASSERT_EQ(by_handle, full) << sig << ", trial " << trial;
      // An accepted call runs the kernel unless every tensor given is empty.
      bool empty = false;
      if (by_handle) {
        bool any = false, all_empty = true;
        for (const DLTensor* t : call) {
          if (t == nullptr) continue;
          any = true;
          all_empty &= std::find(t->shape, t->shape + t->ndim, 0) != t->shape + t->ndim;
        }
        empty = any && all_empty;
      }
      ASSERT_EQ(ran, by_handle && !empty) << sig << ", trial " << trial;
      ASSERT_EQ(h->call(call).ok(), full) << sig << ", trial " << trial << ", again";
      (full ? accepted : refused)++;
    }
  }
  EXPECT_GT(accepted, 300);
  EXPECT_GT(refused, 2000);
}

TEST_F(FastPathTest, OptionalTensorsGivenAndOmitted) {
  ASSERT_TRUE(reg.add(spec("fp.opt", "opt(Tensor[N] x, Tensor?[N] bias, Tensor(a!)[N] out) -> ()",
                           bind<&count_opt>))
                  .ok());
  T x({4}), bias({4}), out({4}), short_bias({3});
  DLTensor* without[] = {&x.t, nullptr, &out.t};
  DLTensor* with[] = {&x.t, &bias.t, &out.t};
  DLTensor* wrong[] = {&x.t, &short_bias.t, &out.t};
  auto h = reg.resolve("fp.opt", without);
  ASSERT_TRUE(h.ok()) << h.status().message();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(h->call(without).ok());
    EXPECT_TRUE(h->call(with).ok());
    Status st = h->call(wrong);
    EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
    EXPECT_NE(st.message().find("'bias'"), std::string::npos) << st.message();
  }
}

TEST_F(FastPathTest, AttributesAreCheckedOnEveryCall) {
  ASSERT_TRUE(
      reg.add(spec("fp.alpha", "alpha(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0) -> ()",
                   bind<&count_pair_alpha>))
          .ok());
  T x({4}), out({4});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("fp.alpha", args);
  ASSERT_TRUE(h.ok());
  const kreg_attr alpha{KREG_ATTR_FLOAT, 0, {.f = 3.0}};
  const kreg_attr wrong_type{KREG_ATTR_INT, 0, {.i = 3}};
  const kreg_attr two[] = {alpha, alpha};
  ASSERT_TRUE(h->call(args, {&alpha, 1}).ok());
  ASSERT_TRUE(h->call(args, {&alpha, 1}).ok());
  EXPECT_EQ(h->call(args, {&wrong_type, 1}).code(), KREG_INVALID_ARGUMENT);
  EXPECT_EQ(h->call(args, two).code(), KREG_INVALID_ARGUMENT);
  EXPECT_TRUE(h->call(args).ok());  // the default
}

// Many threads call one handle, each with its own shapes, some refused: every verdict is
// the full check's, whatever the others store meanwhile (run under TSan too).
TEST_F(FastPathTest, ConcurrentCallersWithDifferentShapes) {
  T x0({3, 8}), out0({3, 4});
  DLTensor* args0[] = {&x0.t, &out0.t};
  auto h = reg.resolve("fp.pair", args0);
  ASSERT_TRUE(h.ok());
  const KernelHandle handle = *h;
  std::atomic<long> wrong{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      const int64_t t = 1 + w, d = 2 + w;
      T x({t, 2 * d}), out({t, d}), bad({t, d + 1});
      DLTensor* good[] = {&x.t, &out.t};
      DLTensor* refused[] = {&x.t, &bad.t};
      for (int i = 0; i < 5000; ++i) {
        if (!handle.call(good).ok()) wrong.fetch_add(1, std::memory_order_relaxed);
        if (i % 3 == 0 && handle.call(refused).ok()) wrong.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(FastPathTest, HitsAndMissesAllocateNothing) {
  T x({3, 8}), out({3, 4}), x2({2, 2}), out2({2, 1});
  DLTensor* a[] = {&x.t, &out.t};
  DLTensor* b[] = {&x2.t, &out2.t};
  auto h = reg.resolve("fp.pair", a);
  ASSERT_TRUE(h.ok());
  (void)h->call(a);
  const long before = g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    Status s1 = h->call(a);  // a hit
    Status s2 = h->call(a);
    Status s3 = h->call(b);  // a miss, then stored
    if (!s1.ok() || !s2.ok() || !s3.ok()) FAIL();
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

// ---- Resources and hot swap, with the resgrp test plugin ----

class FastPathResourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kreg_fast_path_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    lib_ = dir_ / "libkreg_resgrp.so";
    fs::copy_file(plugin("resgrp"), lib_, fs::copy_options::overwrite_existing);
    Manifest m;
    m.file = (dir_ / "test.yaml").string();
    GroupEntry e;
    e.name = "resgrp";
    e.library = lib_;
    e.library_spec = lib_.string();
    m.groups.push_back(e);
    auto reg = Registry::open(m);
    ASSERT_TRUE(reg.ok()) << reg.status().message();
    reg_ = std::move(reg).value();
  }
  void TearDown() override {
    reg_.reset();
    fs::remove_all(dir_);
  }
  static fs::path plugin(const std::string& name) {
    return fs::path(KREG_TEST_PLUGIN_DIR) / ("libkreg_" + name + ".so");
  }
  fs::path dir_, lib_;
  std::unique_ptr<Registry> reg_;
};

TEST_F(FastPathResourceTest, ADestroyedResourceIsRefusedAfterAcceptedCalls) {
  auto c = reg_->create_resource("resgrp.counter", {{"start", int64_t{10}}});
  auto other = reg_->create_resource("resgrp.other");
  ASSERT_TRUE(c.ok() && other.ok());
  int64_t v = 0;
  int64_t shape[1] = {1};
  DLTensor out{&v, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&out};
  auto h = reg_->resolve("resgrp.next", args);
  ASSERT_TRUE(h.ok()) << h.status().message();
  const kreg_attr live = c->attr();
  ASSERT_TRUE(h->call(args, {&live, 1}).ok());
  ASSERT_TRUE(h->call(args, {&live, 1}).ok());
  EXPECT_EQ(v, 11);
  const kreg_attr wrong_type = other->attr();
  Status st = h->call(args, {&wrong_type, 1});
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT) << st.message();
  c->reset();
  st = h->call(args, {&live, 1});
  EXPECT_EQ(st.code(), KREG_FAILED_PRECONDITION) << st.message();
  EXPECT_NE(st.message().find("was destroyed"), std::string::npos) << st.message();
  EXPECT_EQ(v, 11);
}

// A reload swaps the function under a handle whose calls take the fast path: the next call
// runs the new generation's code (v2's `next` adds 1000).
TEST_F(FastPathResourceTest, HotSwapReachesCallsOnTheFastPath) {
  int64_t v = 0;
  int64_t shape[1] = {1};
  DLTensor out{&v, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&out};
  auto h = reg_->resolve("resgrp.next", args);
  ASSERT_TRUE(h.ok());
  auto old_counter = reg_->create_resource("resgrp.counter", {{"start", int64_t{5}}});
  ASSERT_TRUE(old_counter.ok());
  const kreg_attr a = old_counter->attr();
  ASSERT_TRUE(h->call(args, {&a, 1}).ok());
  ASSERT_TRUE(h->call(args, {&a, 1}).ok());
  EXPECT_EQ(v, 6);
  const fs::path tmp = dir_ / ".libkreg_resgrp.so.tmp";
  fs::copy_file(plugin("resgrp_v2"), tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, lib_);
  auto r = reg_->reload("resgrp");
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto new_counter = reg_->create_resource("resgrp.counter", {{"start", int64_t{5}}});
  ASSERT_TRUE(new_counter.ok());
  const kreg_attr b = new_counter->attr();
  ASSERT_TRUE(h->call(args, {&b, 1}).ok());
  EXPECT_EQ(v, 1005);
  // The old resource keeps its generation's code, on the same cached words.
  ASSERT_TRUE(h->call(args, {&a, 1}).ok());
  EXPECT_EQ(v, 7);
}

}  // namespace
}  // namespace kreg
