// The call frame's ABI 1.2 fields reach a kernel: ctx.op() names the op that was called,
// ctx.services() and ctx.launch_flags() are the caller's kreg::CallOptions, and
// ctx.host_alloc/host_free reach the host's kreg_host_services (with the call's stream),
// through KernelHandle::call and through the by-name Registry::call. CPU only: the
// kernels are local functions registered in-process with Registry::add.
#include <gtest/gtest.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kreg/plugin.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

constexpr kreg_capability kCpuCaps[] = {{kDLCPU, 0, 0}};

// What the last kernel call saw.
struct Seen {
  int calls = 0;
  std::string op;
  const kreg_host_services* services = nullptr;
  uint64_t launch_flags = 0;
  void* stream = nullptr;
  bool host_allocates = false;
  void* workspace = nullptr;
};
Seen g_seen;

// A host allocator that counts its calls and hands out memory of its own.
struct CountingHost {
  int allocs = 0;
  int frees = 0;
  size_t last_bytes = 0;
  void* last_stream = nullptr;
  void* freed = nullptr;
  bool refuse = false;
  std::vector<std::vector<char>> blocks;
};

void* counting_alloc(void* self, size_t bytes, DLDevice /*device*/, void* stream, kreg_error* err) {
  auto* h = static_cast<CountingHost*>(self);
  ++h->allocs;
  h->last_bytes = bytes;
  h->last_stream = stream;
  if (h->refuse) {
    std::snprintf(err->message, err->capacity, "test allocator refuses %zu bytes", bytes);
    return nullptr;
  }
  h->blocks.emplace_back(bytes);
  return h->blocks.back().data();
}

void counting_free(void* self, void* ptr, size_t /*bytes*/, DLDevice /*device*/, void* stream) {
  auto* h = static_cast<CountingHost*>(self);
  ++h->frees;
  h->freed = ptr;
  h->last_stream = stream;
}

kreg_host_services services_of(CountingHost& h) {
  return kreg_host_services{sizeof(kreg_host_services), &h, &counting_alloc, &counting_free};
}

// Records the context; with a host allocator, takes 64 bytes of workspace from it and
// gives them back (as kreg::device::Workspace does).
KernelStatus record(Context& ctx, const DLTensor& x, DLTensor& out, double alpha) {
  ++g_seen.calls;
  g_seen.op = ctx.op();
  g_seen.services = ctx.services();
  g_seen.launch_flags = ctx.launch_flags();
  g_seen.stream = ctx.stream();
  g_seen.host_allocates = ctx.host_allocates();
  g_seen.workspace = nullptr;
  if (ctx.host_allocates()) {
    void* p = ctx.host_alloc(64, x.device);
    if (p == nullptr) return KernelStatus{KREG_RESOURCE_EXHAUSTED};  // message from the host
    g_seen.workspace = p;
    ctx.host_free(p, 64, x.device);
  }
  const auto* in = static_cast<const float*>(x.data);
  auto* o = static_cast<float*>(out.data);
  for (int64_t i = 0; i < x.shape[0]; ++i) o[i] = in[i] * static_cast<float>(alpha);
  return kOk;
}

// Kernels that throw: a CPU reference's std::bad_alloc, a library's std::runtime_error,
// something that is no std::exception.
KernelStatus throws_bad_alloc(Context&, const DLTensor&, DLTensor&, double) {
  throw std::bad_alloc();
}
KernelStatus throws_runtime_error(Context&, const DLTensor&, DLTensor&, double) {
  throw std::runtime_error("the table is inconsistent");
}
KernelStatus throws_an_int(Context&, const DLTensor&, DLTensor&, double) { throw 7; }

KernelSpec spec(const std::string& op, Binding b) {
  kreg_kernel_desc d{};
  d.struct_size = sizeof d;
  d.op = op.c_str();
  d.backend = "cpu";
  d.caps = kCpuCaps;
  d.num_caps = 1;
  const std::string sig =
      op.substr(op.find('.') + 1) + "(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0) -> ()";
  d.signature = sig.c_str();
  d.dtypes = "f32";
  d.arg_kinds = b.arg_kinds;
  d.description = "records its context";
  d.source_file = "context_test.cpp";
  d.fn = b.fn;
  auto s = make_kernel_spec(d, Provenance{op.substr(0, op.find('.')), "0.1.0", "", ""});
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

struct Tensors {
  std::vector<int64_t> shape{4};
  std::vector<float> x{1, 2, 3, 4};
  std::vector<float> out = std::vector<float>(4, -1.0f);
  DLTensor tx{}, tout{};
  std::vector<DLTensor*> ptrs;
  Tensors() {
    for (auto [t, data] : {std::pair{&tx, x.data()}, std::pair{&tout, out.data()}}) {
      t->data = data;
      t->device = {kDLCPU, 0};
      t->ndim = 1;
      t->dtype = {kDLFloat, 32, 1};
      t->shape = shape.data();
    }
    ptrs = {&tx, &tout};
  }
};

class ContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_seen = {};
    ASSERT_TRUE(reg_.add(spec("ctxgrp.first", bind<&record>)).ok());
    ASSERT_TRUE(reg_.add(spec("ctxgrp.second", bind<&record>)).ok());
  }
  KernelHandle handle(const char* op) {
    auto h = reg_.resolve(op, Target{DLDevice{kDLCPU, 0}, DType::kF32});
    EXPECT_TRUE(h.ok()) << h.status().message();
    return h.ok() ? *h : KernelHandle{};
  }
  Registry reg_;
};

TEST_F(ContextTest, TheHandleCallPassesTheOpServicesFlagsAndStream) {
  CountingHost host;
  const kreg_host_services services = services_of(host);
  int stream_token = 0;
  Tensors t;
  const KernelHandle h = handle("ctxgrp.second");
  ASSERT_TRUE(h.call(t.ptrs, {}, CallOptions{&stream_token, &services, KREG_LAUNCH_PDL}).ok());
  EXPECT_EQ(g_seen.calls, 1);
  EXPECT_EQ(g_seen.op, "ctxgrp.second");
  EXPECT_EQ(g_seen.services, &services);
  EXPECT_EQ(g_seen.launch_flags, uint64_t{KREG_LAUNCH_PDL});
  EXPECT_EQ(g_seen.stream, &stream_token);
  EXPECT_TRUE(g_seen.host_allocates);
  // The workspace came from the host and went back to it, on the call's stream.
  EXPECT_EQ(host.allocs, 1);
  EXPECT_EQ(host.frees, 1);
  EXPECT_EQ(host.last_bytes, 64u);
  EXPECT_EQ(host.last_stream, &stream_token);
  ASSERT_EQ(host.blocks.size(), 1u);
  EXPECT_EQ(g_seen.workspace, host.blocks[0].data());
  EXPECT_EQ(host.freed, host.blocks[0].data());
  EXPECT_EQ(t.out, (std::vector<float>{2, 4, 6, 8}));  // alpha's default, 2.0
}

TEST_F(ContextTest, TheByNameCallPassesTheSameFields) {
  CountingHost host;
  const kreg_host_services services = services_of(host);
  Tensors t;
  kreg_attr alpha{};
  alpha.type = KREG_ATTR_FLOAT;
  alpha.value.f = 3.0;
  ASSERT_TRUE(reg_.call("ctxgrp.first", t.ptrs, std::span(&alpha, 1),
                        CallOptions{nullptr, &services, KREG_LAUNCH_PDL})
                  .ok());
  EXPECT_EQ(g_seen.op, "ctxgrp.first");
  EXPECT_EQ(g_seen.services, &services);
  EXPECT_EQ(g_seen.launch_flags, uint64_t{KREG_LAUNCH_PDL});
  EXPECT_EQ(g_seen.stream, nullptr);
  EXPECT_EQ(host.allocs, 1);
  EXPECT_EQ(host.frees, 1);
  EXPECT_EQ(t.out, (std::vector<float>{3, 6, 9, 12}));
}

TEST_F(ContextTest, WithoutOptionsTheKernelSeesNoServicesAndNoFlags) {
  Tensors t;
  ASSERT_TRUE(reg_.call("ctxgrp.first", t.ptrs).ok());
  EXPECT_EQ(g_seen.calls, 1);
  EXPECT_EQ(g_seen.op, "ctxgrp.first");
  EXPECT_EQ(g_seen.services, nullptr);
  EXPECT_EQ(g_seen.launch_flags, 0u);
  EXPECT_FALSE(g_seen.host_allocates);
  ASSERT_TRUE(handle("ctxgrp.second").call(t.ptrs).ok());
  EXPECT_EQ(g_seen.op, "ctxgrp.second");
  EXPECT_EQ(g_seen.services, nullptr);
}

TEST_F(ContextTest, ServicesWithoutAFreeFunctionAreNotUsed) {
  CountingHost host;
  kreg_host_services services = services_of(host);
  services.workspace_free = nullptr;  // half a service: the SDK must not allocate from it
  Tensors t;
  ASSERT_TRUE(reg_.call("ctxgrp.first", t.ptrs, {}, CallOptions{nullptr, &services, 0}).ok());
  EXPECT_EQ(g_seen.services, &services);
  EXPECT_FALSE(g_seen.host_allocates);
  EXPECT_EQ(host.allocs, 0);
}

TEST_F(ContextTest, TheHostsRefusalReachesTheCallersStatus) {
  CountingHost host;
  host.refuse = true;
  const kreg_host_services services = services_of(host);
  Tensors t;
  const Status st = reg_.call("ctxgrp.first", t.ptrs, {}, CallOptions{nullptr, &services, 0});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), KREG_RESOURCE_EXHAUSTED);
  EXPECT_NE(st.message().find("test allocator refuses 64 bytes"), std::string::npos)
      << st.message();
  EXPECT_EQ(host.allocs, 1);
  EXPECT_EQ(host.frees, 0);
}

}  // namespace
}  // namespace kreg

namespace kreg {
namespace {

// No exception crosses the C ABI (kreg::bind): one that escapes a kernel is the call's
// error, naming the op and what was thrown, and the registry serves the next call.
TEST_F(ContextTest, AnExceptionThatEscapesAKernelIsTheCallsError) {
  ASSERT_TRUE(reg_.add(spec("ctxgrp.oom", bind<&throws_bad_alloc>)).ok());
  ASSERT_TRUE(reg_.add(spec("ctxgrp.broken", bind<&throws_runtime_error>)).ok());
  ASSERT_TRUE(reg_.add(spec("ctxgrp.odd", bind<&throws_an_int>)).ok());
  Tensors t;
  const Status oom = handle("ctxgrp.oom").call(t.ptrs);
  EXPECT_EQ(oom.code(), KREG_RESOURCE_EXHAUSTED) << oom.message();
  EXPECT_NE(oom.message().find("ctxgrp.oom: out of host memory (std::bad_alloc)"),
            std::string::npos)
      << oom.message();
  const Status broken = reg_.call("ctxgrp.broken", t.ptrs);
  EXPECT_EQ(broken.code(), KREG_INTERNAL) << broken.message();
  EXPECT_NE(broken.message().find(
                "ctxgrp.broken: the implementation threw an exception: the table is inconsistent"),
            std::string::npos)
      << broken.message();
  const Status odd = handle("ctxgrp.odd").call(t.ptrs);
  EXPECT_EQ(odd.code(), KREG_INTERNAL) << odd.message();
  EXPECT_NE(odd.message().find("ctxgrp.odd: the implementation threw an exception"),
            std::string::npos)
      << odd.message();
  ASSERT_TRUE(handle("ctxgrp.first").call(t.ptrs).ok());
  EXPECT_EQ(t.out[3], 8.0f);
}

}  // namespace
}  // namespace kreg
