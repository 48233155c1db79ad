// Registry semantics with in-process registrations: selection, duplicate policy, argument
// checks and their messages, defaults, aliases, KREG_FORCE_BACKEND, and the call path's
// zero-allocation promise.
#include "kreg/registry.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kreg/plugin.hpp"

// Counts heap allocations in this test binary.
static std::atomic<long> g_allocations{0};
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The array and nothrow forms too: a sanitizer runtime replaces each form separately, and
// memory from its operator new[] must not reach this file's free().
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

namespace kreg {
namespace {

// out = x * alpha; records which implementation ran.
thread_local const char* g_last = nullptr;

KernelStatus scale_a(Context&, const DLTensor& x, DLTensor& out, double alpha) {
  g_last = "a";
  for (int64_t i = 0; i < numel(x); ++i) {
    data_ptr<float>(out)[i] = static_cast<float>(alpha) * data_ptr<float>(x)[i];
  }
  return kOk;
}
KernelStatus scale_b(Context& ctx, const DLTensor& x, DLTensor& out, double alpha) {
  g_last = "b";
  return scale_a(ctx, x, out, alpha);
}
KernelStatus failing(Context& ctx, const DLTensor&, DLTensor&, double) {
  return ctx.fail(KREG_RESOURCE_EXHAUSTED, "out of %s", "workspace");
}

constexpr kreg_capability kCudaOld[] = {{kDLCUDA, 70, 75}};

KernelSpec spec(const std::string& op, const std::string& backend, Binding b, int priority = 0,
                const char* sig = nullptr, const char* dtypes = "f32|bf16") {
  kreg_kernel_desc d{};
  d.struct_size = sizeof d;
  d.op = op.c_str();
  d.backend = backend.c_str();
  d.caps = backend == "cpu" ? kCpu : kCudaSm75Plus;
  d.num_caps = 1;
  const std::string name = op.substr(op.find('.') + 1);
  const std::string default_sig = name + "(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0) -> ()";
  d.signature = sig ? sig : default_sig.c_str();
  d.dtypes = dtypes;
  d.arg_kinds = b.arg_kinds;
  d.priority = priority;
  d.description = "test";
  d.source_file = "registry_test.cpp";
  d.fn = b.fn;
  auto s = make_kernel_spec(d, Provenance{op.substr(0, op.find('.')), "0.1.0", "", ""});
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

struct Vec {
  explicit Vec(std::vector<int64_t> shape, DLDataType dt = {kDLFloat, 32, 1},
               DLDevice dev = {kDLCPU, 0})
      : shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    data_.assign(static_cast<size_t>(n), 1.5f);
    t.data = data_.data();
    t.device = dev;
    t.ndim = static_cast<int32_t>(shape_.size());
    t.dtype = dt;
    t.shape = shape_.data();
  }
  DLTensor t{};
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("KREG_FORCE_BACKEND"); }
  Registry reg;
};

TEST_F(RegistryTest, ResolvesAndCallsThroughAHandle) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.scale", args);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->backend(), "cpu");
  kreg_attr alpha{KREG_ATTR_FLOAT, 0, {.f = 3.0}};
  ASSERT_TRUE(h->call(args, {&alpha, 1}).ok());
  EXPECT_FLOAT_EQ(out.data_[7], 4.5f);
  ASSERT_TRUE(h->call(args).ok());  // default alpha = 2.0
  EXPECT_FLOAT_EQ(out.data_[0], 3.0f);
}

TEST_F(RegistryTest, UnknownOpIsNotFound) {
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.nope", args);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(h.status().message().find("unknown op 'g.nope'"), std::string::npos);
  EXPECT_EQ(reg.call("nogroup.x", args).code(), KREG_NOT_FOUND);
}

TEST_F(RegistryTest, IdenticalReRegistrationIsANoOp) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  EXPECT_EQ(reg.implementations("g.scale").size(), 1u);
}

TEST_F(RegistryTest, ConflictingRegistrationNamesBothSources) {
  KernelSpec first = spec("g.scale", "cpu", bind<&scale_a>);
  first.provenance.library = "libfirst.so";
  ASSERT_TRUE(reg.add(first).ok());
  KernelSpec second = spec("g.scale", "cpu", bind<&scale_a>, 0, nullptr, "f32");
  second.provenance.library = "libsecond.so";
  Status st = reg.add(second);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), KREG_ALREADY_EXISTS);
  EXPECT_NE(st.message().find("libfirst.so"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("libsecond.so"), std::string::npos) << st.message();
  EXPECT_EQ(reg.implementations("g.scale").size(), 1u);
}

TEST_F(RegistryTest, HighestPriorityWinsAmongFittingCandidates) {
  // Two CPU-device implementations can't share a backend name; use cpu + a cuda one that
  // can never fit CPU tensors, plus check order with explicit backends.
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>, 0)).ok());
  ASSERT_TRUE(reg.add(spec("g.scale", "cuda", bind<&scale_b>, 100)).ok());
  auto impls = reg.implementations("g.scale");
  ASSERT_EQ(impls.size(), 2u);
  EXPECT_EQ(impls[0]->backend, "cuda");  // priority order
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.scale", args);  // CPU tensors: cuda is filtered out
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->backend(), "cpu");
}

TEST_F(RegistryTest, ExplicitBackendThatIsAbsentIsAnError) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.scale", args, ResolveOptions{std::string("cuda")});
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), KREG_NOT_FOUND);
  EXPECT_NE(h.status().message().find("no implementation for backend 'cuda'"), std::string::npos);
  EXPECT_NE(h.status().message().find("it has: cpu"), std::string::npos);
}

TEST_F(RegistryTest, NoCandidateListsAReasonPerCandidate) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  ASSERT_TRUE(reg.add(spec("g.scale", "cuda", bind<&scale_b>, 100)).ok());
  Vec x({8}, {kDLFloat, 64, 1}), out({8}, {kDLFloat, 64, 1});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.scale", args);
  ASSERT_FALSE(h.ok());
  const std::string& m = h.status().message();
  EXPECT_NE(m.find("no implementation of 'g.scale' accepts"), std::string::npos) << m;
  EXPECT_NE(m.find("- cuda: runs on cuda tensors, the arguments are on cpu:0"), std::string::npos)
      << m;
  EXPECT_NE(m.find("- cpu: "), std::string::npos) << m;
  EXPECT_NE(m.find("has dtype f64, expected f32|bf16"), std::string::npos) << m;
}

TEST_F(RegistryTest, SmWindowFiltersCudaCandidatesOnTargets) {
  KernelSpec old = spec("g.scale", "cuda", bind<&scale_b>, 100);
  old.capabilities = {Capability{kDLCUDA, 70, 75}};
  ASSERT_TRUE(reg.add(old).ok());
  auto h = reg.resolve("g.scale", Target{DLDevice{kDLCUDA, 0}, DType::kF32});
  ASSERT_FALSE(h.ok());  // no GPU here, or one newer than sm75: rejected either way
  const std::string& m = h.status().message();
  EXPECT_TRUE(m.find("backend unavailable") != std::string::npos ||
              m.find("the implementation needs cuda sm70-sm75") != std::string::npos)
      << m;
}

// With the library's CUDA images known, the reason names the missing image and the builds.
TEST_F(RegistryTest, SmOutsideTheWindowsNamesTheLibrarysImages) {
  KernelSpec old = spec("g.scale", "cuda", bind<&scale_b>, 100);
  old.capabilities = {Capability{kDLCUDA, 70, 75}};
  old.provenance.library = "/opt/kreg/plugins/libkreg_g.so";
  old.provenance.cuda_images = "sm_70, sm_75, compute_75";
  ASSERT_TRUE(reg.add(old).ok());
  auto h = reg.resolve("g.scale", Target{DLDevice{kDLCUDA, 0}, DType::kF32});
  ASSERT_FALSE(h.ok());
  const std::string& m = h.status().message();
  const KernelBackend* cuda = find_backend("cuda");
  ASSERT_NE(cuda, nullptr);
  const auto sm = cuda->available() ? cuda->sm_of(0) : std::nullopt;
  if (!sm) {
    EXPECT_NE(m.find("backend unavailable"), std::string::npos) << m;
    GTEST_SKIP() << "no GPU: the image reason needs a device SM";
  }
  ASSERT_GT(*sm, 75);
  EXPECT_NE(m.find("- cuda: no image for sm_" + std::to_string(*sm) +
                   " in libkreg_g.so: built sm_70, sm_75, compute_75"),
            std::string::npos)
      << m;
}

// resolve() and the by-name call choose through one rule: the same implementation, an
// explicit or forced backend honoured by both, and call allocation-free either way.
TEST_F(RegistryTest, CallAndResolveSelectAlike) {
  setenv("KREG_FORCE_BACKEND", "g.scale=cpu", 1);
  Registry forced;
  unsetenv("KREG_FORCE_BACKEND");
  ASSERT_TRUE(forced.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  ASSERT_TRUE(forced.add(spec("g.scale", "cuda", bind<&scale_b>, 100)).ok());
  ASSERT_TRUE(forced.add(spec("g.other", "cpu", bind<&scale_b>, 5)).ok());
  ASSERT_TRUE(forced.add_alias("g.old", "g.scale", "").ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = forced.resolve("g.scale", args);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->backend(), "cpu");
  g_last = nullptr;
  ASSERT_TRUE(forced.call("g.scale", args).ok());
  EXPECT_STREQ(g_last, "a");
  (void)forced.call("g.old", args);  // the alias warning, once
  const long before = g_allocations.load();
  for (int i = 0; i < 100; ++i) {
    if (!forced.call("g.scale", args).ok() || !forced.call("g.old", args).ok() ||
        !forced.call("g.other", args).ok()) {
      FAIL();
    }
  }
  EXPECT_EQ(g_allocations.load() - before, 0) << "a forced backend or an alias allocated";
  // Wrong arguments: both say the same thing.
  Vec bad({8}, DLDataType{kDLInt, 32, 1});
  DLTensor* bad_args[] = {&bad.t, &out.t};
  auto r = forced.resolve("g.scale", bad_args);
  Status c = forced.call("g.scale", bad_args);
  ASSERT_FALSE(r.ok());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(r.status().message(), c.message());
  EXPECT_NE(c.message().find("forced by KREG_FORCE_BACKEND"), std::string::npos) << c.message();
  // A wrong attribute: the implementation the tensors select reports it.
  kreg_attr wrong{KREG_ATTR_INT, 0, {.i = 3}};
  Status a = forced.call("g.scale", args, {&wrong, 1});
  EXPECT_EQ(a.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(a.message().find("g.scale (cpu): attribute 'alpha'"), std::string::npos) << a.message();
}

TEST_F(RegistryTest, ForceBackendEnvironment) {
  setenv("KREG_FORCE_BACKEND", "g.*=cuda", 1);
  Registry forced;
  ASSERT_TRUE(forced.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  ASSERT_TRUE(forced.add(spec("g.scale", "cuda", bind<&scale_b>, 100)).ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = forced.resolve("g.scale", args);
  ASSERT_FALSE(h.ok());  // forced to cuda, arguments on the CPU
  EXPECT_NE(h.status().message().find("forced by KREG_FORCE_BACKEND"), std::string::npos)
      << h.status().message();
  setenv("KREG_FORCE_BACKEND", "cuda,g.scale=cpu", 1);  // the most specific pattern wins
  Registry specific;
  ASSERT_TRUE(specific.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  auto h2 = specific.resolve("g.scale", args);
  ASSERT_TRUE(h2.ok()) << h2.status().message();
  EXPECT_EQ(h2->backend(), "cpu");
  unsetenv("KREG_FORCE_BACKEND");
}

// ---- argument checks ----

class CheckTest : public RegistryTest {
 protected:
  void SetUp() override {
    RegistryTest::SetUp();
    ASSERT_TRUE(reg.add(spec("g.mlp", "cpu", bind<&scale3>, 0,
                             "mlp(Tensor[T,2*D] x, Tensor[D] w, Tensor(a!)[T,D] out, float a=1.0, "
                             "int k=3) -> ()"))
                    .ok());
  }
  static KernelStatus scale3(Context&, const DLTensor&, const DLTensor&, DLTensor&, double,
                             int64_t) {
    return kOk;
  }
  Status call(std::vector<DLTensor*> args, std::vector<kreg_attr> attrs = {}) {
    auto h = reg.resolve("g.mlp", Target{DLDevice{kDLCPU, 0}, DType::kF32});
    EXPECT_TRUE(h.ok());
    return h->call(args, attrs);
  }
};

TEST_F(CheckTest, AcceptsConsistentShapes) {
  Vec x({4, 6}), w({3}), out({4, 3});
  EXPECT_TRUE(call({&x.t, &w.t, &out.t}).ok());
}

TEST_F(CheckTest, TensorCount) {
  Vec x({4, 6}), w({3});
  Status st = call({&x.t, &w.t});
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("expected 3 tensors (x, w, out), got 2"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("g.mlp (cpu): "), std::string::npos);
}

TEST_F(CheckTest, NamedDimensionMismatchNamesBothSides) {
  Vec x({4, 6}), w({4}), out({4, 3});
  Status st = call({&x.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("argument 'w' (tensor 2 of 3) has shape [4], expected [D]: dim 0 (D) "
                              "is 4, but D = 3 from 'x' dim 1"),
            std::string::npos)
      << st.message();
}

TEST_F(CheckTest, DimensionNotDivisible) {
  Vec x({4, 7}), w({3}), out({4, 3});
  Status st = call({&x.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 3) dim 1 (2*D) is 7, not a multiple of 2"),
            std::string::npos)
      << st.message();
}

TEST_F(CheckTest, Rank) {
  Vec x({2, 4, 6}), w({3}), out({4, 3});
  Status st = call({&x.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("has rank 3 [2,4,6], expected rank 2 [T,2*D]"), std::string::npos)
      << st.message();
}

TEST_F(CheckTest, DtypeAndSharedDtype) {
  Vec xi({4, 6}, {kDLInt, 32, 1}), w({3}), out({4, 3});
  Status st = call({&xi.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 3) has dtype i32, expected f32|bf16"),
            std::string::npos)
      << st.message();
  Vec x({4, 6}), wb({3}, {kDLBfloat, 16, 1});
  st = call({&x.t, &wb.t, &out.t});
  EXPECT_NE(st.message().find("has dtype bf16, but 'x' has f32 (these tensors share one dtype)"),
            std::string::npos)
      << st.message();
}

TEST_F(CheckTest, DeviceNullAndContiguity) {
  Vec x({4, 6}), w({3}), out({4, 3});
  Vec g({4, 6}, {kDLFloat, 32, 1}, {kDLCUDA, 0});
  Status st = call({&g.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("is on cuda:0, but backend cpu runs on cpu tensors"),
            std::string::npos)
      << st.message();
  st = call({&x.t, nullptr, &out.t});
  EXPECT_NE(st.message().find("argument 'w' (tensor 2 of 3) is null"), std::string::npos);
  int64_t strides[] = {1, 4};  // column-major
  x.t.strides = strides;
  st = call({&x.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("is not contiguous (shape [4,6], strides [1,4])"), std::string::npos)
      << st.message();
  int64_t row_major[] = {6, 1};
  x.t.strides = row_major;
  EXPECT_TRUE(call({&x.t, &w.t, &out.t}).ok());
}

TEST_F(CheckTest, EmptyTensorsAreContiguousWhateverTheirStrides) {
  Vec x({0, 6}), w({3}), out({0, 3});
  int64_t zero_strides[2] = {0, 0};
  x.t.strides = zero_strides;  // what NumPy and PyTorch export for [0, n]
  EXPECT_TRUE(call({&x.t, &w.t, &out.t}).ok());
  Vec y({2, 6});
  int64_t transposed[2] = {1, 2};
  y.t.strides = transposed;
  Vec out2({2, 3});
  Status st = call({&y.t, &w.t, &out2.t});
  EXPECT_NE(st.message().find("is not contiguous"), std::string::npos) << st.message();
}

TEST_F(CheckTest, AttributeTypesAndCount) {
  Vec x({4, 6}), w({3}), out({4, 3});
  kreg_attr as_int{KREG_ATTR_INT, 0, {.i = 1}};
  Status st = call({&x.t, &w.t, &out.t}, {as_int});
  EXPECT_NE(st.message().find("attribute 'a' (attribute 1) must be float, got int"),
            std::string::npos)
      << st.message();
  kreg_attr f{KREG_ATTR_FLOAT, 0, {.f = 1.0}};
  st = call({&x.t, &w.t, &out.t}, {f, as_int, as_int});
  EXPECT_NE(st.message().find("expected 0 to 2 attributes (a, k), got 3"), std::string::npos)
      << st.message();
}

TEST_F(CheckTest, NamedAttributes) {
  auto h = reg.resolve("g.mlp", Target{DLDevice{kDLCPU, 0}, DType::kF32});
  ASSERT_TRUE(h.ok());
  auto list = h->attrs({{"k", int64_t{5}}, {"a", int64_t{2}}});  // int widens to float
  ASSERT_TRUE(list.ok()) << list.status().message();
  ASSERT_EQ(list->view().size(), 2u);
  EXPECT_DOUBLE_EQ(list->view()[0].value.f, 2.0);
  EXPECT_EQ(list->view()[1].value.i, 5);
  auto bad = h->attrs({{"alpha", 1.0}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown attribute 'alpha' (attributes: a, k)"),
            std::string::npos);
  auto wrong = h->attrs({{"k", std::string("x")}});
  EXPECT_NE(wrong.status().message().find("attribute 'k' must be int"), std::string::npos);
  // A name given twice is refused (it used to keep the last value silently), as is a
  // resource where the signature wants a number.
  auto twice = h->attrs({{"k", int64_t{5}}, {"k", int64_t{6}}});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("attribute 'k' is given twice"), std::string::npos)
      << twice.status().message();
  auto resource = h->attrs({{"k", ResourceArg{}}});
  ASSERT_FALSE(resource.ok());
  EXPECT_NE(resource.status().message().find("attribute 'k' must be int"), std::string::npos)
      << resource.status().message();
  auto missing = h->attrs({});
  ASSERT_TRUE(missing.ok()) << "both attributes have defaults: " << missing.status().message();
}

// ---- call-time shape checks: a caller's DLTensor is not trusted ----

// A tensor header with no data behind it: the checks must refuse it before anything
// would touch memory, and the kernels these tests bind never read their data.
struct Header {
  explicit Header(std::vector<int64_t> shape, DLDataType dt = {kDLFloat, 32, 1})
      : shape_(std::move(shape)) {
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape_.size());
    t.dtype = dt;
    t.shape = shape_.data();
  }
  DLTensor t{};
  std::vector<int64_t> shape_;
};

TEST_F(CheckTest, NegativeExtentsAreRefusedNamingTheArgument) {
  Header x({4, -6}), w({-3}), out({4, -3});
  Status st = call({&x.t, &w.t, &out.t});
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 3) has shape [4,-6]: dim 1 is negative"),
            std::string::npos)
      << st.message();
  Header x2({4, 6}), w2({3}), out2({-4, 3});
  st = call({&x2.t, &w2.t, &out2.t});
  EXPECT_NE(st.message().find("argument 'out' (tensor 3 of 3) has shape [-4,3]: dim 0 is negative"),
            std::string::npos)
      << st.message();
}

TEST_F(CheckTest, SizesOverflowingInt64AreRefused) {
  // 2^31 * 2^31 elements fit int64, times 4 bytes they do not.
  const int64_t k = int64_t{1} << 31;
  Header x({k, 2 * k}), w({k}), out({k, k});
  Status st = call({&x.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 3) has shape [2147483648,4294967296] of "
                              "f32: its size in bytes overflows int64"),
            std::string::npos)
      << st.message();
  // A zero extent does not hide the others: rows * cols still overflows in a kernel.
  Header x0({0, int64_t{1} << 62}), w0({int64_t{1} << 61}), out0({0, int64_t{1} << 61});
  st = call({&x0.t, &w0.t, &out0.t});
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 3) has shape [0,4611686018427387904]"),
            std::string::npos)
      << st.message();
  Header huge({INT64_MAX, INT64_MAX}), hw({3}), ho({4, 3});
  st = call({&huge.t, &hw.t, &ho.t});
  EXPECT_NE(st.message().find("overflows int64"), std::string::npos) << st.message();
}

KernelStatus pair_kernel(Context&, const DLTensor&, const DLTensor&) { return kOk; }

// A symbol's first use with a coefficient (a[c*N]) and later uses with others (b[d*N]):
// b must be a / c * d. Power-of-two first coefficients take the shift path, the others a
// division; both must accept exactly the matching extents.
TEST_F(RegistryTest, CoefficientPairsAcceptExactlyTheMatchingExtents) {
  struct Case {
    int c, d;
  };
  int n_op = 0;
  for (const Case k : {Case{1, 1}, Case{2, 1}, Case{4, 1}, Case{8, 3}, Case{3, 1}, Case{6, 4},
                       Case{1, 5}, Case{12, 12}}) {
    const std::string op = "g.pair" + std::to_string(n_op++);
    const std::string sig = op.substr(2) + "(Tensor[" + std::to_string(k.c) + "*N] a, Tensor[" +
                            std::to_string(k.d) + "*N] b) -> ()";
    ASSERT_TRUE(reg.add(spec(op.c_str(), "cpu", bind<&pair_kernel>, 0, sig.c_str(), "u8")).ok())
        << sig;
    auto h = reg.resolve(op, Target{DLDevice{kDLCPU, 0}, DType::kU8});
    ASSERT_TRUE(h.ok()) << h.status().message();
    const DLDataType u8{kDLUInt, 8, 1};
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 40}) {
      Header a({k.c * n}, u8), b({k.d * n}, u8), b_more({k.d * n + 1}, u8);
      DLTensor* good[] = {&a.t, &b.t};
      EXPECT_TRUE(h->call(good).ok()) << sig << " N=" << n;
      DLTensor* bad[] = {&a.t, &b_more.t};
      EXPECT_FALSE(h->call(bad).ok()) << sig << " N=" << n << " b one larger";
      if (k.c > 1 && n > 0) {
        Header a_off({k.c * n + 1}, u8);  // not a multiple of c
        DLTensor* off[] = {&a_off.t, &b.t};
        EXPECT_FALSE(h->call(off).ok()) << sig << " N=" << n << " a not a multiple";
      }
    }
  }
}

TEST_F(RegistryTest, DimensionProductsNeverOverflowOrDivideByZero) {
  ASSERT_TRUE(reg.add(spec("g.coef", "cpu", bind<&pair_kernel>, 0,
                           "coef(Tensor[N] a, Tensor[2147483647*N] b) -> ()", "u8"))
                  .ok());
  auto h = reg.resolve("g.coef", Target{DLDevice{kDLCPU, 0}, DType::kU8});
  ASSERT_TRUE(h.ok()) << h.status().message();
  const DLDataType u8{kDLUInt, 8, 1};
  // N = 2^40 from a: b would need 2^40 * (2^31 - 1) elements, past int64.
  Header a({int64_t{1} << 40}, u8), b({int64_t{2147483647} * 4}, u8);
  DLTensor* args[] = {&a.t, &b.t};
  Status st = h->call(args);
  EXPECT_NE(st.message().find("argument 'b' (tensor 2 of 2) has shape [8589934588], expected "
                              "[2147483647*N]: dim 0 (2147483647*N) is 8589934588, but N = "
                              "1099511627776 from 'a' dim 0"),
            std::string::npos)
      << st.message();
  Header a_ok({4}, u8);
  DLTensor* ok_args[] = {&a_ok.t, &b.t};
  EXPECT_TRUE(h->call(ok_args).ok());
  Header odd({int64_t{2147483647} * 4 + 1}, u8);
  DLTensor* odd_args[] = {&a_ok.t, &odd.t};
  st = h->call(odd_args);
  EXPECT_NE(st.message().find("not a multiple of 2147483647"), std::string::npos) << st.message();
}

TEST_F(RegistryTest, CoefficientsPastInt32AreRefusedAtRegistration) {
  for (const char* sig :
       {"coef(Tensor[4294967296*N] a, Tensor[N] b) -> ()",
        "coef(Tensor[2147483649*N] a, Tensor[N] b) -> ()", "coef(Tensor[0*N] a, Tensor[N] b) -> ()",
        "coef(Tensor[99999999999999999999] a, Tensor[N] b) -> ()"}) {
    kreg_kernel_desc d{};
    d.struct_size = sizeof d;
    d.op = "g.coef";
    d.backend = "cpu";
    d.caps = kCpu;
    d.num_caps = 1;
    d.signature = sig;
    d.dtypes = "u8";
    d.arg_kinds = bind<&pair_kernel>.arg_kinds;
    d.fn = bind<&pair_kernel>.fn;
    auto s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
    ASSERT_FALSE(s.ok()) << sig;
    EXPECT_NE(s.status().message().find("is out of range"), std::string::npos)
        << s.status().message();
  }
}

KernelStatus any_rank(Context&, const DLTensor&, DLTensor&) { return kOk; }

TEST_F(RegistryTest, UnreadableShapesAreRefusedBeforeTheyAreRead) {
  ASSERT_TRUE(reg.add(spec("g.any", "cpu", bind<&any_rank>, 0,
                           "any(Tensor x, Tensor(a!) out) -> ()", "f32"))
                  .ok());
  auto h = reg.resolve("g.any", Target{DLDevice{kDLCPU, 0}, DType::kF32});
  ASSERT_TRUE(h.ok());
  Header x({2, 3}), out({2, 3});
  DLTensor* args[] = {&x.t, &out.t};
  EXPECT_TRUE(h->call(args).ok());
  x.t.ndim = -1;
  Status st = h->call(args);
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 2) has ndim -1, outside [0, 64]"),
            std::string::npos)
      << st.message();
  x.t.ndim = 1 << 30;  // two entries behind the pointer: ASan catches any read past them
  st = h->call(args);
  EXPECT_NE(st.message().find("has ndim 1073741824, outside [0, 64]"), std::string::npos)
      << st.message();
  x.t.ndim = 2;
  x.t.shape = nullptr;
  st = h->call(args);
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 2) has ndim 2 but a null shape"),
            std::string::npos)
      << st.message();
  x.t.ndim = 0;  // a scalar needs no shape array
  EXPECT_TRUE(h->call(args).ok());
  // Resolution by arguments says the same, and never reads the bad shape either.
  x.t.ndim = -5;
  auto r = reg.resolve("g.any", args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has ndim -5"), std::string::npos) << r.status().message();
}

TEST_F(CheckTest, RankedTensorWithANullShape) {
  Header x({4, 6}), w({3}), out({4, 3});
  x.t.shape = nullptr;
  Status st = call({&x.t, &w.t, &out.t});
  EXPECT_NE(st.message().find("argument 'x' (tensor 1 of 3) has ndim 2 but a null shape"),
            std::string::npos)
      << st.message();
}

// out = x * alpha (+ bias when given): an optional tensor arrives as a pointer.
KernelStatus scale_bias(Context&, const DLTensor& x, const DLTensor* bias, DLTensor& out,
                        double alpha) {
  for (int64_t i = 0; i < numel(x); ++i) {
    const float b = bias ? data_ptr<float>(*bias)[i % bias->shape[0]] : 0.0f;
    data_ptr<float>(out)[i] = static_cast<float>(alpha) * data_ptr<float>(x)[i] + b;
  }
  return kOk;
}

TEST_F(RegistryTest, OptionalTensorsMayBeNullAndAreCheckedWhenGiven) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_bias>, 0,
                           "scale(Tensor[N,H] x, Tensor?[H] bias, Tensor(a!)[N,H] out, "
                           "float alpha=2.0) -> ()",
                           "f32"))
                  .ok());
  Vec x({2, 4}), bias({4}), out({2, 4}), bad_bias({3});
  bias.data_[1] = 10.0f;
  DLTensor* with[] = {&x.t, &bias.t, &out.t};
  DLTensor* without[] = {&x.t, nullptr, &out.t};
  auto h = reg.resolve("g.scale", without);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_TRUE(h->call(without).ok());
  EXPECT_FLOAT_EQ(out.data_[1], 3.0f);
  ASSERT_TRUE(h->call(with).ok());
  EXPECT_FLOAT_EQ(out.data_[1], 3.0f + 10.0f);
  EXPECT_FLOAT_EQ(out.data_[5], 3.0f + 10.0f);
  DLTensor* wrong[] = {&x.t, &bad_bias.t, &out.t};
  Status st = h->call(wrong);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'bias'"), std::string::npos) << st.message();
  // A required tensor is still required.
  DLTensor* no_out[] = {&x.t, &bias.t, nullptr};
  st = h->call(no_out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'out'"), std::string::npos) << st.message();
}

// out = x + (bias when given), where only the optional bias takes the shared dtype.
KernelStatus add_bias(Context&, const DLTensor& x, const DLTensor* bias, DLTensor& out) {
  for (int64_t i = 0; i < numel(x); ++i) {
    data_ptr<float>(out)[i] = data_ptr<float>(x)[i] + (bias ? data_ptr<float>(*bias)[i] : 0.0f);
  }
  return kOk;
}

TEST_F(RegistryTest, AnOmittedOptionalTensorMayBeTheOnlyOneOfTheSharedDtype) {
  ASSERT_TRUE(
      reg.add(spec("g.addb", "cpu", bind<&add_bias>, 0,
                   "addb(Tensor<f32>[N] x, Tensor?[N] bias, Tensor<f32>(a!)[N] out) -> ()", "f32"))
          .ok());
  Vec x({4}), bias({4}), out({4});
  DLTensor* without[] = {&x.t, nullptr, &out.t};
  auto h = reg.resolve("g.addb", without);
  ASSERT_TRUE(h.ok()) << h.status().message();
  Status st = h->call(without);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_FLOAT_EQ(out.data_[0], 1.5f);
  DLTensor* with[] = {&x.t, &bias.t, &out.t};
  ASSERT_TRUE(h->call(with).ok());
  EXPECT_FLOAT_EQ(out.data_[0], 3.0f);
  Vec f64({4}, DLDataType{kDLFloat, 64, 1});
  DLTensor* wrong[] = {&x.t, &f64.t, &out.t};
  st = h->call(wrong);
  EXPECT_NE(st.message().find("'bias'"), std::string::npos) << st.message();
}

TEST_F(RegistryTest, KernelErrorsCarryOpAndMessage) {
  ASSERT_TRUE(reg.add(spec("g.fail", "cpu", bind<&failing>)).ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  Status st = reg.call("g.fail", args);
  EXPECT_EQ(st.code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.message(), "g.fail (cpu): out of workspace");
}

TEST_F(RegistryTest, AliasesResolveAndWarnOnce) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  ASSERT_TRUE(reg.add_alias("g.old_scale", "g.scale", "renamed").ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  testing::internal::CaptureStderr();
  EXPECT_TRUE(reg.call("g.old_scale", args).ok());
  EXPECT_TRUE(reg.call("g.old_scale", args).ok());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("'g.old_scale' is a deprecated alias of 'g.scale': renamed"),
            std::string::npos);
  EXPECT_EQ(err.find("deprecated", err.find("deprecated") + 1), std::string::npos)
      << "warned twice";
  EXPECT_EQ(reg.add_alias("g.old_scale", "g.scale", "").code(), KREG_ALREADY_EXISTS);
  EXPECT_EQ(reg.add_alias("g.x", "g.x", "").code(), KREG_INVALID_ARGUMENT);
}

// A kernel's message is free text from the plugin: escaped, and read no further than the
// buffer it was given even without a terminating NUL.
int32_t hostile_message(const kreg_call_frame*, kreg_error* err) {
  std::snprintf(err->message, err->capacity, "bad\n error [forged]\x1b[31m\r\xc2\x9b\xff");
  return KREG_INTERNAL;
}
int32_t unterminated_message(const kreg_call_frame*, kreg_error* err) {
  std::memset(err->message, 'A', err->capacity);
  return KREG_INTERNAL;
}

TEST_F(RegistryTest, KernelMessagesAreEscapedAndBounded) {
  ASSERT_TRUE(reg.add(spec("g.hostile", "cpu", Binding{&hostile_message, "TTf"})).ok());
  ASSERT_TRUE(reg.add(spec("g.unterminated", "cpu", Binding{&unterminated_message, "TTf"})).ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  Status st = reg.call("g.hostile", args);
  EXPECT_EQ(st.code(), KREG_INTERNAL);
  EXPECT_EQ(st.message(), "g.hostile (cpu): bad\\n error [forged]\\x1b[31m\\r\\xc2\\x9b\\xff");
  st = reg.call("g.unterminated", args);
  EXPECT_EQ(st.message(), "g.unterminated (cpu): " + std::string(256, 'A'));
}

TEST_F(RegistryTest, UnknownOpNamesAreEscapedExcerpts) {
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.no\n error [forged]\x1b[2J", args);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), KREG_NOT_FOUND);
  EXPECT_EQ(h.status().message(), "unknown op 'g.no\\n error [forged]\\x1b[2J'");
  h = reg.resolve(std::string(100000, 'a'), Target{});
  ASSERT_FALSE(h.ok());
  EXPECT_LT(h.status().message().size(), 200u) << "a huge name makes a short message";
}

TEST_F(RegistryTest, AliasChainsResolveEverywhere) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  ASSERT_TRUE(reg.add_alias("g.v3", "g.scale", "").ok());
  ASSERT_TRUE(reg.add_alias("g.v2", "g.v3", "").ok());
  ASSERT_TRUE(reg.add_alias("g.v1", "g.v2", "use g.scale").ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  testing::internal::CaptureStderr();
  auto h = reg.resolve("g.v1", args);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->op(), "g.scale");
  EXPECT_TRUE(reg.resolve("g.v1", Target{DLDevice{kDLCPU, 0}, DType::kF32}).ok());
  EXPECT_TRUE(reg.call("g.v1", args).ok());
  EXPECT_TRUE(reg.call("g.v2", args).ok());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("op 'g.v1' is a deprecated alias of 'g.scale' (via g.v2 -> g.v3): "
                     "use g.scale"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("op 'g.v2' is a deprecated alias of 'g.scale' (via g.v3)"), std::string::npos)
      << err;

  auto chain = reg.resolve_alias("g.v1");
  ASSERT_TRUE(chain.has_value());
  EXPECT_EQ(chain->names, (std::vector<std::string>{"g.v1", "g.v2", "g.v3", "g.scale"}));
  EXPECT_EQ(chain->op(), "g.scale");
  EXPECT_TRUE(chain->found);
  EXPECT_EQ(chain->message, "use g.scale");
  EXPECT_EQ(chain->text(), "g.v1 -> g.v2 -> g.v3 -> g.scale");
  EXPECT_EQ(reg.alias("g.v1")->first, "g.scale");
  EXPECT_FALSE(reg.resolve_alias("g.scale").has_value()) << "a real op is not an alias";
  EXPECT_FALSE(reg.resolve_alias("g.nothing").has_value());

  // A cycle cannot be closed, however long; a chain ending at a missing op says so.
  EXPECT_TRUE(reg.add_alias("g.v0", "g.v1", "").ok()) << "joining a chain is no cycle";
  Status cycle = reg.add_alias("g.v3b", "g.v3b_next", "");
  EXPECT_TRUE(cycle.ok());
  cycle = reg.add_alias("g.v3b_next", "g.v3b", "");
  EXPECT_EQ(cycle.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(cycle.message().find("alias cycle: g.v3b_next -> g.v3b -> g.v3b_next"),
            std::string::npos)
      << cycle.message();
  ASSERT_TRUE(reg.add_alias("g.dangling", "g.gone_too", "").ok());
  ASSERT_TRUE(reg.add_alias("g.gone_too", "g.gone", "").ok());
  auto dangling = reg.resolve("g.dangling", args);
  ASSERT_FALSE(dangling.ok());
  EXPECT_EQ(dangling.status().message(),
            "unknown op 'g.dangling' (an alias: g.dangling -> g.gone_too -> g.gone, and no group "
            "registers g.gone)");
  EXPECT_FALSE(reg.resolve_alias("g.dangling")->found);
}

TEST_F(RegistryTest, CallPathAllocatesNothing) {
  ASSERT_TRUE(reg.add(spec("g.scale", "cpu", bind<&scale_a>)).ok());
  Vec x({8}), out({8});
  DLTensor* args[] = {&x.t, &out.t};
  auto h = reg.resolve("g.scale", args);
  ASSERT_TRUE(h.ok());
  kreg_attr alpha{KREG_ATTR_FLOAT, 0, {.f = 3.0}};
  (void)h->call(args, {&alpha, 1});
  (void)reg.call("g.scale", args);
  const long before = g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    Status a = h->call(args, {&alpha, 1});
    Status b = reg.call("g.scale", args);
    Status c = h->call(args);  // defaults filled in
    if (!a.ok() || !b.ok() || !c.ok()) FAIL();
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

TEST_F(RegistryTest, SpecFromDescriptorRejectsMismatches) {
  kreg_kernel_desc d{};
  d.struct_size = sizeof d;
  d.op = "g.scale";
  d.backend = "cpu";
  d.caps = kCpu;
  d.num_caps = 1;
  d.signature = "scale(Tensor x, Tensor y, Tensor(a!) z) -> ()";
  d.dtypes = "f32";
  d.arg_kinds = bind<&scale_a>.arg_kinds;  // TTf
  d.fn = bind<&scale_a>.fn;
  auto s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.status().message().find("declares argument kinds 'TTT' but the bound function takes 'TTf'"),
      std::string::npos)
      << s.status().message();
  d.signature = "scale(Tensor x, Tensor(a!) out, float alpha) -> ()";
  d.op = "other.scale";
  s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  EXPECT_NE(s.status().message().find("op belongs to group 'other', but the plugin is group 'g'"),
            std::string::npos);
  d.op = "g.Scale";
  s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  EXPECT_NE(s.status().message().find("snake_case"), std::string::npos);
  d.op = "g.scale";
  d.backend = "tpu";
  s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  EXPECT_NE(s.status().message().find("unknown backend 'tpu'"), std::string::npos);
  d.backend = "cuda";
  d.caps = kCudaOld;
  d.dtypes = "f32|q4";
  s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  EXPECT_NE(s.status().message().find("unknown dtype 'q4'"), std::string::npos);
  constexpr kreg_capability inverted[] = {{kDLCUDA, 90, 80}};
  d.caps = inverted;
  d.dtypes = "f32";
  s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  EXPECT_NE(s.status().message().find("invalid SM window"), std::string::npos);
  constexpr kreg_capability unreal[] = {{kDLCUDA, 75, 95}};
  d.caps = unreal;
  s = make_kernel_spec(d, Provenance{"g", "1", "", ""});
  EXPECT_NE(s.status().message().find("invalid SM window cuda sm75-sm95: bounds must be real"),
            std::string::npos)
      << s.status().message();
}

}  // namespace
}  // namespace kreg
