// The communication group through the registry (docs/ops/communication.md): a world of
// one rank on the CPU (every op the identity, the fused op equal to layernorm's
// fused_add_rmsnorm bit for bit); several ranks as separate processes (this binary run
// again as each rank) meeting in a TCP store, every op against the one-process
// references of all ranks; a hot swap of the group under a live comm; and on a GPU, world
// size 1 through NCCL and without it (skipped where there is no GPU or no NCCL).
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"
#include "reference.hpp"
#include "store/store.hpp"

extern char** environ;

namespace kreg {
namespace {

using harness::Buffer;
using namespace test;  // kernel_test.hpp
namespace ref = communication::reference;

kreg_attr str_attr(const char* s) {
  kreg_attr a{};
  a.type = KREG_ATTR_STRING;
  a.value.s = s;
  return a;
}

Buffer random_buffer(DLDevice dev, DType dt, std::vector<int64_t> shape, uint64_t seed) {
  auto b = Buffer::make(dev, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  std::mt19937_64 rng(seed);
  EXPECT_TRUE(b->fill_random(rng).ok());
  return std::move(b).value();
}

Buffer copy_of(const Buffer& b, DLDevice dev) {
  auto c = Buffer::make(dev, b.dtype(), b.shape());
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(c->copy_from(b).ok());
  return std::move(c).value();
}

Resource make_comm(Registry& reg, std::vector<NamedAttr> params = {}) {
  auto c = reg.create_resource("communication.comm", params);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : Resource{};
}

// Every op with one rank on `dev`: the identity, and the fused op equal to
// layernorm.fused_add_rmsnorm on copies of the same inputs.
void check_world_one(Registry& reg, const Resource& comm, DLDevice dev, DType dt) {
  const kreg_attr c = comm.attr();
  Buffer x = random_buffer(dev, dt, {5, 24}, 1);
  const std::vector<double> x0 = values(x);
  {
    DLTensor* args[] = {x.tensor()};
    const kreg_attr attrs[] = {c, str_attr("max")};
    ASSERT_TRUE(reg.call("communication.all_reduce", args, attrs).ok());
    EXPECT_EQ(values(x), x0);
  }
  for (const char* op : {"communication.all_gather", "communication.reduce_scatter"}) {
    SCOPED_TRACE(op);
    auto out = Buffer::make(dev, dt, {5, 24});
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE(out->poison().ok());
    DLTensor* args[] = {x.tensor(), out->tensor()};
    Status st = reg.call(op, args, std::span<const kreg_attr>(&c, 1));
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(values(*out), x0);
  }
  Buffer residual = random_buffer(dev, dt, {5, 24}, 2);
  Buffer weight = random_buffer(dev, dt, {24}, 3);
  Buffer x2 = copy_of(x, dev), r2 = copy_of(residual, dev);
  const kreg_attr fused[] = {c, float_attr(1e-5)};
  DLTensor* args[] = {x.tensor(), residual.tensor(), weight.tensor()};
  Status st = reg.call("communication.all_reduce_add_rmsnorm", args, fused);
  ASSERT_TRUE(st.ok()) << st.message();
  DLTensor* args2[] = {x2.tensor(), r2.tensor(), weight.tensor()};
  const kreg_attr eps = float_attr(1e-5);
  ASSERT_TRUE(reg.call("layernorm.fused_add_rmsnorm", args2, std::span(&eps, 1)).ok());
  EXPECT_EQ(values(residual), values(r2));
  if (dev.device_type == kDLCPU) {
    EXPECT_EQ(values(x), values(x2));  // the same CPU arithmetic
  } else {
    const auto cmp =
        harness::compare_values("x", values(x), values(x2), harness::tolerance_for(dt));
    EXPECT_TRUE(cmp.ok()) << cmp.mismatches << " mismatches, max_abs " << cmp.max_abs;
  }
}

TEST(CommunicationCpu, WorldOfOneIsTheIdentity) {
  Resource comm = make_comm(registry());
  ASSERT_TRUE(comm.valid());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    check_world_one(registry(), comm, kCpu, dt);
  }
}

TEST(CommunicationCpu, BadArgumentsNameTheProblem) {
  auto r = registry().create_resource("communication.comm", {{"world_size", int64_t{2}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("store"), std::string::npos) << r.status().message();
  r = registry().create_resource("communication.comm", {{"rank", int64_t{3}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank"), std::string::npos) << r.status().message();
  Resource comm = make_comm(registry());
  Buffer x = random_buffer(kCpu, DType::kF32, {8}, 4);
  auto out = Buffer::make(kCpu, DType::kF32, {7});
  ASSERT_TRUE(out.ok());
  const kreg_attr c = comm.attr();
  DLTensor* args[] = {x.tensor(), out->tensor()};
  Status st = registry().call("communication.all_gather", args, std::span(&c, 1));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("8"), std::string::npos) << st.message();
  DLTensor* one[] = {x.tensor()};
  const kreg_attr bad_op[] = {c, str_attr("median")};
  st = registry().call("communication.all_reduce", one, bad_op);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("median"), std::string::npos) << st.message();
  comm.reset();
  const kreg_attr sum[] = {c, str_attr("sum")};
  st = registry().call("communication.all_reduce", one, sum);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("was destroyed"), std::string::npos) << st.message();
}

// ---- Several ranks, one process each ----

constexpr int64_t kRows = 3, kHidden = 40;

// Rank r's inputs of one call (the same on every process: seeded by rank).
std::vector<float> rank_data(int64_t rank, size_t n, uint64_t salt) {
  std::mt19937_64 rng(1000 * static_cast<uint64_t>(rank) + salt);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

Buffer f32_buffer(const std::vector<float>& v, std::vector<int64_t> shape) {
  return exact_buffer(kCpu, DType::kF32, std::move(shape), v.data());
}

std::vector<float> floats(const Buffer& b) {
  const auto* p = static_cast<const float*>(b.tensor()->data);
  return std::vector<float>(p, p + b.numel());
}

// The body of one rank (run when KREG_TEST_COMM_RANK is set): every op on f32 data, checked
// against the references of all ranks. Failures fail this process's test.
TEST(CommunicationRank, Run) {
  const char* rank_env = std::getenv("KREG_TEST_COMM_RANK");
  if (rank_env == nullptr) GTEST_SKIP() << "runs as one rank of CommunicationCpu.RanksAsProcesses";
  const int64_t rank = std::atoll(rank_env);
  const int64_t world = std::atoll(std::getenv("KREG_TEST_COMM_WORLD"));
  const std::string store = std::getenv("KREG_TEST_COMM_STORE");
  Resource comm = make_comm(registry(), {{"rank", rank},
                                         {"world_size", world},
                                         {"store", store},
                                         {"name", std::string(std::getenv("KREG_TEST_COMM_NAME"))},
                                         {"timeout_s", 20.0}});
  ASSERT_TRUE(comm.valid());
  const kreg_attr c = comm.attr();
  const size_t n = kRows * kHidden;
  auto all = [&](uint64_t salt, size_t count) {
    ref::Ranks r;
    for (int64_t k = 0; k < world; ++k) r.push_back(rank_data(k, count, salt));
    return r;
  };
  // all_reduce, every reduction.
  for (const char* op : {"sum", "prod", "max", "min", "avg"}) {
    SCOPED_TRACE(op);
    const ref::Ranks in = all(1, n);
    Buffer x = f32_buffer(in[static_cast<size_t>(rank)], {kRows, kHidden});
    DLTensor* args[] = {x.tensor()};
    const kreg_attr attrs[] = {c, str_attr(op)};
    Status st = registry().call("communication.all_reduce", args, attrs);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(floats(x), ref::all_reduce(in, op, ref::Dtype::kF32)[static_cast<size_t>(rank)]);
  }
  {  // all_gather
    const ref::Ranks in = all(2, n);
    Buffer x = f32_buffer(in[static_cast<size_t>(rank)], {kRows, kHidden});
    auto out = Buffer::make(kCpu, DType::kF32, {world * kRows, kHidden});
    ASSERT_TRUE(out.ok());
    DLTensor* args[] = {x.tensor(), out->tensor()};
    ASSERT_TRUE(registry().call("communication.all_gather", args, std::span(&c, 1)).ok());
    EXPECT_EQ(floats(*out), ref::all_gather(in)[static_cast<size_t>(rank)]);
  }
  {  // reduce_scatter
    const ref::Ranks in = all(3, n * static_cast<size_t>(world));
    Buffer x = f32_buffer(in[static_cast<size_t>(rank)], {world * kRows, kHidden});
    auto out = Buffer::make(kCpu, DType::kF32, {kRows, kHidden});
    ASSERT_TRUE(out.ok());
    DLTensor* args[] = {x.tensor(), out->tensor()};
    const kreg_attr attrs[] = {c, str_attr("sum")};
    ASSERT_TRUE(registry().call("communication.reduce_scatter", args, attrs).ok());
    EXPECT_EQ(floats(*out),
              ref::reduce_scatter(in, "sum", ref::Dtype::kF32)[static_cast<size_t>(rank)]);
  }
  {  // the fused op
    const ref::Ranks xs = all(4, n), rs = all(5, n);
    const std::vector<float> w = rank_data(99, kHidden, 6);  // the same weight everywhere
    const ref::Ranks ws(static_cast<size_t>(world), w);
    Buffer x = f32_buffer(xs[static_cast<size_t>(rank)], {kRows, kHidden});
    Buffer r = f32_buffer(rs[static_cast<size_t>(rank)], {kRows, kHidden});
    Buffer wb = f32_buffer(w, {kHidden});
    DLTensor* args[] = {x.tensor(), r.tensor(), wb.tensor()};
    const kreg_attr attrs[] = {c, float_attr(1e-6)};
    ASSERT_TRUE(registry().call("communication.all_reduce_add_rmsnorm", args, attrs).ok());
    const ref::AddRmsnorm want =
        ref::all_reduce_add_rmsnorm(xs, rs, ws, kHidden, 1e-6, ref::Dtype::kF32);
    EXPECT_EQ(floats(r), want.residual[static_cast<size_t>(rank)]);
    const std::vector<float> got = floats(x), exp = want.x[static_cast<size_t>(rank)];
    ASSERT_EQ(got.size(), exp.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], exp[i], 2e-6 * std::max(1.0f, std::fabs(exp[i]))) << i;
    }
  }
}

TEST(CommunicationCpu, RanksAsProcessesOverATcpStore) {
  std::string error;
  auto server = comm::TcpStoreServer::start("127.0.0.1", 0, &error);
  ASSERT_TRUE(server) << error;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(server->port());
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> env_s;
      for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
      env_s.push_back("KREG_TEST_COMM_RANK=" + std::to_string(r));
      env_s.push_back("KREG_TEST_COMM_WORLD=" + std::to_string(world));
      env_s.push_back("KREG_TEST_COMM_STORE=" + url);
      env_s.push_back("KREG_TEST_COMM_NAME=ranks" + std::to_string(world));
      std::vector<char*> envp;
      for (std::string& s : env_s) envp.push_back(s.data());
      envp.push_back(nullptr);
      std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
      std::string filter = "--gtest_filter=CommunicationRank.Run";
      char* argv[] = {self.data(), filter.data(), nullptr};
      pid_t pid = 0;
      ASSERT_EQ(::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "a rank failed (status " << status << "); its output is above";
    }
  }
}

// ---- Hot swap with a live comm ----

TEST(CommunicationCpu, HotSwapKeepsALiveComm) {
  auto m = load_manifest(std::filesystem::path(KREG_SOURCE_DIR) / "registry.yaml",
                         ManifestOptions{std::filesystem::path(KREG_PLUGIN_DIR), true});
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto reg = Registry::open(*m);
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  Resource old_comm = make_comm(**reg);
  ASSERT_EQ(old_comm.generation(), 1u);
  auto swapped = (*reg)->reload("communication");
  ASSERT_TRUE(swapped.ok()) << swapped.status().message();
  EXPECT_EQ(swapped->generation, 2u);
  // The live comm keeps working (generation 1's code), a new one is generation 2's.
  check_world_one(**reg, old_comm, kCpu, DType::kF32);
  Resource new_comm = make_comm(**reg);
  EXPECT_EQ(new_comm.generation(), 2u);
  check_world_one(**reg, new_comm, kCpu, DType::kBF16);
  const auto types = (*reg)->resource_types();
  ASSERT_EQ(types.size(), 1u);
  EXPECT_EQ(types[0].type, "communication.comm");
  EXPECT_EQ(types[0].live, 2u);
  old_comm.reset();
  EXPECT_EQ((*reg)->resource_types()[0].live, 1u);
}

// ---- GPU ----

class CommunicationGpu : public GpuTest {};

TEST_F(CommunicationGpu, WorldOfOneWithoutNccl) {
  // A host-only comm of one rank serves CUDA tensors too: nothing to exchange.
  Resource comm = make_comm(registry());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    check_world_one(registry(), comm, kGpu, dt);
  }
}

TEST_F(CommunicationGpu, WorldOfOneOnNccl) {
  const KernelBackend* nccl = find_backend("nccl");
  ASSERT_NE(nccl, nullptr);
  if (!nccl->available()) GTEST_SKIP() << "no NCCL here: " << nccl->unavailable_reason();
  Resource comm = make_comm(registry(), {{"device", int64_t{0}}});
  ASSERT_TRUE(comm.valid());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    check_world_one(registry(), comm, kGpu, dt);
  }
  // The same comm serves CPU tensors through the cpu implementation (no store needed for
  // one rank).
  check_world_one(registry(), comm, kCpu, DType::kF32);
}

}  // namespace
}  // namespace kreg
