// Resources (ABI 1.4, kreg/resource.hpp): creation with typed parameters and their errors,
// the per-call type and liveness checks, destruction by the creating generation, and hot
// swapping with live resources (old resources keep their generation's code, new ones get
// the new code; a reload that drops or changes a resource type is refused).
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "kreg/registry.hpp"
#include "kreg/resource.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using test::contains;
using test::test_plugin;

class ResourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kreg_resource_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(dir_);
    lib_ = dir_ / "libkreg_resgrp.so";
    fs::copy_file(test_plugin("resgrp"), lib_);
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
  void place(const fs::path& from) {
    const fs::path tmp = dir_ / ".libkreg_resgrp.so.tmp";
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
    fs::rename(tmp, lib_);
  }
  Result<Resource> counter(int64_t start, int64_t step = 1) {
    return reg_->create_resource("resgrp.counter", {{"start", start}, {"step", step}});
  }
  // resgrp.next through the registry with attribute `a`; the value it wrote, or the error.
  Status next(const kreg_attr& a, int64_t* value, const char* op = "resgrp.next") {
    int64_t shape[1] = {1};
    DLTensor out{value, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0};
    DLTensor* args[] = {&out};
    return reg_->call(op, args, std::span<const kreg_attr>(&a, 1));
  }
  std::pair<int64_t, int64_t> stats() {
    int64_t o[2] = {-1, -1};
    int64_t shape[1] = {2};
    DLTensor out{o, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0};
    DLTensor* args[] = {&out};
    EXPECT_TRUE(reg_->call("resgrp.stats", args).ok());
    return {o[0], o[1]};
  }

  static inline int counter_ = 0;
  fs::path dir_, lib_;
  std::unique_ptr<Registry> reg_;
};

TEST_F(ResourceTest, CreateCallDestroy) {
  auto c = counter(10, 5);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->valid());
  EXPECT_EQ(c->type(), "resgrp.counter");
  EXPECT_EQ(c->generation(), 1u);
  int64_t v = 0;
  for (int64_t want : {10, 15, 20}) {
    ASSERT_TRUE(next(c->attr(), &v).ok());
    EXPECT_EQ(v, want);
  }
  // Two resources are independent; ids are unique.
  auto d = counter(-3, -1);
  ASSERT_TRUE(d.ok());
  EXPECT_NE(d->id(), c->id());
  EXPECT_EQ(reg_->find_resource(c->id()), c->get());
  EXPECT_EQ(reg_->find_resource(d->id()), d->get());
  EXPECT_EQ(reg_->find_resource(0), nullptr);
  EXPECT_EQ(reg_->find_resource(99), nullptr);
  ASSERT_TRUE(next(d->attr(), &v).ok());
  EXPECT_EQ(v, -3);
  ASSERT_TRUE(next(c->attr(), &v).ok());
  EXPECT_EQ(v, 25);
  // Through a handle and named attributes too.
  int64_t shape[1] = {1};
  DLTensor out{&v, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&out};
  auto h = reg_->resolve("resgrp.next", args);
  ASSERT_TRUE(h.ok()) << h.status().message();
  auto attrs = h->attrs({{"counter", ResourceArg{d->get()}}});
  ASSERT_TRUE(attrs.ok()) << attrs.status().message();
  ASSERT_TRUE(h->call(args, attrs->view()).ok());
  EXPECT_EQ(v, -4);

  EXPECT_EQ(stats(), std::make_pair(int64_t{2}, int64_t{0}));
  const kreg_attr stale = c->attr();
  c->reset();
  EXPECT_FALSE(c->valid());
  EXPECT_EQ(stats(), std::make_pair(int64_t{2}, int64_t{1}));
  c->reset();  // twice: nothing more
  EXPECT_EQ(stats(), std::make_pair(int64_t{2}, int64_t{1}));
  Status st = next(stale, &v);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), KREG_FAILED_PRECONDITION);
  EXPECT_TRUE(contains(st.message(), "resource 1 (resgrp.counter) was destroyed")) << st.message();
  // A handle going out of scope destroys; the registry destroys what is left.
  { Resource moved = std::move(d).value(); }
  EXPECT_EQ(stats(), std::make_pair(int64_t{2}, int64_t{2}));
  auto e = counter(0);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(reg_->resource_types().size(), 2u);
  EXPECT_EQ(reg_->resource_types()[0].type, "resgrp.counter");
  EXPECT_EQ(reg_->resource_types()[0].live, 1u);
  reg_.reset();  // destroys e's state; e itself is now dead
  EXPECT_FALSE(e->valid());
}

TEST_F(ResourceTest, CreationErrorsNameTheParameter) {
  struct Case {
    std::string type;
    std::vector<NamedAttr> params;
    std::vector<std::string> expect;
  };
  const Case cases[] = {
      {"resgrp.counter",
       {{"stepp", int64_t{1}}},
       {"unknown parameter 'stepp'", "start, step, label"}},
      {"resgrp.counter", {{"start", std::string("x")}}, {"parameter 'start' must be int"}},
      {"resgrp.counter",
       {{"start", int64_t{1}}, {"start", int64_t{2}}},
       {"'start' is given twice"}},
      {"resgrp.counter", {{"label", std::string("a\0b", 3)}}, {"without NUL bytes"}},
      {"resgrp.counter", {{"step", int64_t{0}}}, {"create failed", "step must not be 0"}},
      {"resgrp.counter", {{"label", std::string("fail")}}, {"create failed", "asked to fail"}},
      {"resgrp.nope",
       {},
       {"declares no resource type 'resgrp.nope'", "resgrp.counter, resgrp.other"}},
      {"nogroup.comm", {}, {"no group 'nogroup'"}},
      {"resgrp", {}, {"not of the form <group>.<name>"}},
      {"resgrp.", {}, {"not of the form"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.type);
    auto r = reg_->create_resource(c.type, c.params);
    ASSERT_FALSE(r.ok());
    for (const std::string& s : c.expect) {
      EXPECT_TRUE(contains(r.status().message(), s))
          << "missing '" << s << "' in " << r.status().message();
    }
  }
  EXPECT_EQ(stats(), std::make_pair(int64_t{0}, int64_t{0}));  // nothing half-made
  // The create frame is a real call frame: defaults fill every parameter.
  auto ok = reg_->create_resource("resgrp.counter");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  int64_t v = -1;
  ASSERT_TRUE(next(ok->attr(), &v).ok());
  EXPECT_EQ(v, 0);
}

TEST_F(ResourceTest, CallsCheckTheResource) {
  auto other = reg_->create_resource("resgrp.other");
  ASSERT_TRUE(other.ok()) << other.status().message();
  int64_t v = 0;
  Status st = next(other->attr(), &v);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "of type resgrp.other, expected Resource<resgrp.counter>"))
      << st.message();
  kreg_attr none{};
  none.type = KREG_ATTR_RESOURCE;
  st = next(none, &v);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "got no resource")) << st.message();
  kreg_attr number{};
  number.type = KREG_ATTR_INT;
  number.value.i = 5;
  st = next(number, &v);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "must be Resource<resgrp.counter>, got int")) << st.message();
  // No attribute at all.
  int64_t shape[1] = {1};
  DLTensor out{&v, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&out};
  st = reg_->call("resgrp.next", args);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "attributes (counter)")) << st.message();
}

TEST_F(ResourceTest, HotSwapKeepsOldResourcesOnTheirGeneration) {
  auto old_counter = counter(100);
  ASSERT_TRUE(old_counter.ok());
  int64_t v = 0;
  ASSERT_TRUE(next(old_counter->attr(), &v).ok());
  EXPECT_EQ(v, 100);

  place(test_plugin("resgrp_v2"));
  auto r = reg_->reload("resgrp");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->generation, 2u);
  // The old resource runs generation 1's code (no +1000), on its own state.
  ASSERT_TRUE(next(old_counter->attr(), &v).ok());
  EXPECT_EQ(v, 101);
  // A new one is made by generation 2's create and runs its code.
  auto new_counter = counter(7);
  ASSERT_TRUE(new_counter.ok());
  EXPECT_EQ(new_counter->generation(), 2u);
  ASSERT_TRUE(next(new_counter->attr(), &v).ok());
  EXPECT_EQ(v, 1007);
  // generation 2's stats count only its own creations.
  EXPECT_EQ(stats(), std::make_pair(int64_t{1}, int64_t{0}));
  // An op that came with generation 2 cannot take a generation-1 resource.
  Status st = next(old_counter->attr(), &v, "resgrp.peek");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "created by generation 1")) << st.message();
  ASSERT_TRUE(next(new_counter->attr(), &v, "resgrp.peek").ok());
  EXPECT_EQ(v, 8);
  // The old resource is destroyed by generation 1's destroy (generation 2 counts none).
  old_counter->reset();
  EXPECT_EQ(stats(), std::make_pair(int64_t{1}, int64_t{0}));
  new_counter->reset();
  EXPECT_EQ(stats(), std::make_pair(int64_t{1}, int64_t{1}));

  // A build that changes a resource type's parameters is refused; v2 keeps serving.
  auto keep = counter(0);
  ASSERT_TRUE(keep.ok());
  place(test_plugin("resgrp_changed"));
  r = reg_->reload("resgrp");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "drops or changes resource types"))
      << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "resgrp.counter: running 'counter(int start=0"))
      << r.status().message();
  ASSERT_TRUE(next(keep->attr(), &v).ok());
  EXPECT_EQ(v, 1000);
}

TEST_F(ResourceTest, SwapUnderConcurrentCallsNeverMixesGenerations) {
  // Calls with a generation-1 resource must run generation 1's code through any number of
  // swaps (to v2, then v2 again: each reload is a new generation), while calls with fresh
  // resources run the generation that created them.
  auto pinned = counter(0);
  ASSERT_TRUE(pinned.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, calls{0};
  std::thread caller([&] {
    int64_t expect = 0;
    while (!stop.load()) {
      int64_t v = -1;
      if (!next(pinned->attr(), &v).ok() || v != expect) ++bad;
      ++expect;
      ++calls;
    }
  });
  for (int i = 0; i < 6; ++i) {
    place(test_plugin("resgrp_v2"));
    auto r = reg_->reload("resgrp");
    EXPECT_TRUE(r.ok()) << r.status().message();
    auto fresh = counter(0);
    EXPECT_TRUE(fresh.ok());
    int64_t v = -1;
    EXPECT_TRUE(fresh.ok() && next(fresh->attr(), &v).ok());
    EXPECT_EQ(v, 1000);
    EXPECT_EQ(fresh->generation(), static_cast<uint64_t>(i + 2));
  }
  while (calls.load() < 1000) std::this_thread::yield();
  stop = true;
  caller.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ResourceTypeSpecTest, DescriptorsAreChecked) {
  auto create = +[](const kreg_call_frame*, void**, kreg_error*) -> int32_t { return KREG_OK; };
  auto destroy = +[](void*) {};
  struct Case {
    kreg_resource_type_desc d;
    std::string expect;
  };
  const Case cases[] = {
      {{sizeof(kreg_resource_type_desc), nullptr, "c() -> ()", "", create, destroy}, "no name"},
      {{sizeof(kreg_resource_type_desc), "other.c", "c() -> ()", "", create, destroy},
       "must be named <group>.<name> with group 'grp'"},
      {{sizeof(kreg_resource_type_desc), "grp.a.b", "b() -> ()", "", create, destroy},
       "must be named"},
      {{sizeof(kreg_resource_type_desc), "grp.c", nullptr, "", create, destroy}, "no signature"},
      {{sizeof(kreg_resource_type_desc), "grp.c", "d() -> ()", "", create, destroy},
       "named 'd', expected 'c'"},
      {{sizeof(kreg_resource_type_desc), "grp.c", "c(Tensor x) -> ()", "", create, destroy},
       "parameter 'x' is a Tensor"},
      {{sizeof(kreg_resource_type_desc), "grp.c", "c(Resource<grp.c> r) -> ()", "", create,
        destroy},
       "parameter 'r' is a Resource"},
      {{sizeof(kreg_resource_type_desc), "grp.c", "c(int a", "", create, destroy}, "signature"},
      {{sizeof(kreg_resource_type_desc), "grp.c", "c() -> ()", "", nullptr, destroy},
       "lacks its create"},
      {{sizeof(kreg_resource_type_desc), "grp.c", "c() -> ()", "", create, nullptr},
       "lacks its destroy"},
  };
  for (const Case& c : cases) {
    auto r = make_resource_type_spec(c.d, "grp");
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_TRUE(contains(r.status().message(), c.expect)) << r.status().message();
  }
  auto ok = make_resource_type_spec({sizeof(kreg_resource_type_desc), "grp.c",
                                     "c(int a=1, str s=\"x\") -> ()", "d", create, destroy},
                                    "grp");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->params.num_attrs, 2);
  EXPECT_EQ(ok->group(), "grp");
}

TEST(ResourceSignatureTest, ParsesResourceParameters) {
  auto sig =
      parse_signature("f(Tensor(a!) x, Resource<communication.comm> comm, str op=\"sum\") -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->arg_kinds(), "Trs");
  EXPECT_EQ(sig->attr(0).resource_type, "communication.comm");
  for (const char* bad : {"f(Resource<comm> c) -> ()", "f(Resource<a.b> c=1) -> ()",
                          "f(Resource a.b c) -> ()", "f(Resource<a.b c) -> ()"}) {
    EXPECT_FALSE(parse_signature(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace kreg
