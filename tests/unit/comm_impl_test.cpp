// The communication group's internals without the registry (plugins/communication/
// comm.hpp): create_comm's checks, the CPU transport on 1, 2 and 4 ranks (threads, each
// with its own Comm and store connection) over a TCP and a file store, against the
// references of reference.hpp; mismatched ranks, missing ranks and key cleanup.
//
// Exactness: the CPU transport and the references both reduce in fp32 in rank order and
// round once, so all_reduce, all_gather and reduce_scatter must match bit for bit in every
// dtype. The fused op's norm has multiply-adds a compiler may contract differently in the
// two (FMA on other architectures), so it is compared within 2e-6 relative (f32) and one
// bf16 ulp (2^-7 relative); the residual, a plain sum, is exact.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm.hpp"
#include "kreg/numeric.hpp"
#include "layernorm.hpp"
#include "reference.hpp"
#include "store/store.hpp"
#include "test_support.hpp"

namespace kc = kreg::communication;
namespace ref = kreg::communication::reference;
namespace fs = std::filesystem;

namespace {

// ---- Tensors and contexts ----

struct Tensor {
  ref::Dtype dtype = ref::Dtype::kF32;
  std::vector<int64_t> shape;
  std::vector<float> f32;
  std::vector<uint16_t> half;  // bf16 / f16 bits
  DLTensor t{};

  Tensor(ref::Dtype d, std::vector<int64_t> s, const std::vector<float>& values)
      : dtype(d), shape(std::move(s)) {
    if (d == ref::Dtype::kF32) {
      f32 = values;
    } else {
      for (float v : values) {
        half.push_back(d == ref::Dtype::kBF16 ? kreg::to_bf16(v).bits : kreg::to_f16(v).bits);
      }
    }
    t.data = d == ref::Dtype::kF32 ? static_cast<void*>(f32.data()) : half.data();
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int>(shape.size());
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    t.dtype = d == ref::Dtype::kF32    ? DLDataType{kDLFloat, 32, 1}
              : d == ref::Dtype::kBF16 ? DLDataType{kDLBfloat, 16, 1}
                                       : DLDataType{kDLFloat, 16, 1};
  }
  Tensor(const Tensor&) = delete;

  std::vector<float> values() const {
    if (dtype == ref::Dtype::kF32) return f32;
    std::vector<float> out;
    for (uint16_t b : half) {
      out.push_back(dtype == ref::Dtype::kBF16 ? kreg::to_float(kreg::bf16{b})
                                               : kreg::to_float(kreg::f16{b}));
    }
    return out;
  }
};

struct Ctx {
  char buf[1024] = "";
  kreg_error err{sizeof(kreg_error), buf, sizeof buf};
  kreg::Context ctx{nullptr, &err};
  std::string message() const { return buf; }
};

// Random values in +-[0.25, 2], representable in the dtype: never zero, no ties.
std::vector<float> random_values(size_t n, ref::Dtype d, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mag(0.25f, 2.0f);
  std::vector<float> out(n);
  for (float& v : out) v = ref::round_to(d, (gen() & 1 ? -1.0f : 1.0f) * mag(gen));
  return out;
}

// ---- Stores and ranks ----

enum class StoreKind { kTcp, kFile };

// A store for one test: a TCP server on 127.0.0.1 port 0, or a file store in a temp dir.
class TestStore {
 public:
  explicit TestStore(StoreKind kind) {
    std::string err;
    if (kind == StoreKind::kTcp) {
      server_ = kreg::comm::TcpStoreServer::start("127.0.0.1", 0, &err);
      if (server_ != nullptr) url_ = "tcp://127.0.0.1:" + std::to_string(server_->port());
    } else if (!dir_.root().empty()) {
      url_ = "file://" + (dir_.root() / "store").string();
    }
    error_ = err;
  }
  const std::string& url() const { return url_; }
  const std::string& error() const { return error_; }

 private:
  kreg::test::Scratch dir_;
  std::unique_ptr<kreg::comm::TcpStoreServer> server_;
  std::string url_;
  std::string error_;
};

// Runs fn(rank) on world_size threads and waits for all.
void run_ranks(int64_t world_size, const std::function<void(int64_t)>& fn) {
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world_size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

struct CommDeleter {
  void operator()(kc::Comm* c) const { kc::destroy_comm(c); }
};
using CommPtr = std::unique_ptr<kc::Comm, CommDeleter>;

CommPtr make_comm(int64_t rank, int64_t world, const std::string& url, const std::string& name,
                  double timeout = 20.0) {
  std::string err;
  CommPtr c(kc::create_comm(rank, world, url, -1, name, timeout, &err));
  EXPECT_NE(c, nullptr) << "rank " << rank << ": " << err;
  return c;
}

// ---- create_comm's checks ----

std::string create_error(int64_t rank, int64_t world, std::string_view url, int64_t device,
                         std::string_view name, double timeout) {
  std::string err;
  kc::Comm* c = kc::create_comm(rank, world, url, device, name, timeout, &err);
  EXPECT_EQ(c, nullptr) << "created a comm for rank " << rank << " of " << world;
  kc::destroy_comm(c);
  return err;
}

TEST(CommImpl, CreateCommRefusesBadArguments) {
  const std::string url = "file:///nonexistent-unused";
  EXPECT_NE(create_error(0, 0, url, -1, "c", 5).find("world_size 0 is outside 1..4096"),
            std::string::npos);
  EXPECT_NE(create_error(0, 4097, url, -1, "c", 5).find("world_size 4097 is outside 1..4096"),
            std::string::npos);
  EXPECT_NE(create_error(-1, 2, url, -1, "c", 5).find("rank -1 is outside 0..1"),
            std::string::npos);
  EXPECT_NE(create_error(2, 2, url, -1, "c", 5).find("rank 2 is outside 0..1"), std::string::npos);
  EXPECT_NE(create_error(0, 1, "", -2, "c", 5).find("device -2 is neither -1"), std::string::npos);
  for (double t : {0.0, -1.0, 3600.5, std::nan("")}) {
    EXPECT_NE(create_error(0, 1, "", -1, "c", t).find("is outside (0, 3600]"), std::string::npos)
        << t;
  }
  EXPECT_NE(create_error(0, 1, "", -1, "", 5).find("must be 1..200 bytes"), std::string::npos);
  EXPECT_NE(create_error(0, 1, "", -1, "a b", 5).find("must be 1..200 bytes"), std::string::npos);
  EXPECT_NE(create_error(0, 1, "", -1, std::string(201, 'a'), 5).find("(201 bytes)"),
            std::string::npos);
  EXPECT_NE(create_error(1, 2, "", -1, "c", 5).find("a store URL"), std::string::npos);
  EXPECT_NE(create_error(0, 2, "http://x", -1, "c", 5).find("connecting to the store"),
            std::string::npos);
  // A CUDA device: refused in a CPU build and on a machine without a GPU or NCCL, with the
  // device and the rank named; where both exist a world of one on device 0 is valid.
  std::string dev;
  kc::Comm* c = kc::create_comm(0, 1, "", 0, "c", 5, &dev);
  if (c != nullptr) {
#if !defined(KREG_COMM_TEST_HAS_CUDA)
    ADD_FAILURE() << "a CPU build created a comm on CUDA device 0";
#endif
    kc::destroy_comm(c);
    return;
  }
  EXPECT_NE(dev.find("device 0"), std::string::npos) << dev;
  EXPECT_NE(dev.find("rank 0 of 1"), std::string::npos) << dev;
}

TEST(CommImpl, ParsesReductions) {
  for (const char* op : {"sum", "prod", "max", "min", "avg"}) {
    const auto r = kc::parse_reduce_op(op);
    ASSERT_TRUE(r.has_value()) << op;
    EXPECT_STREQ(kc::reduce_op_name(*r), op);
  }
  EXPECT_FALSE(kc::parse_reduce_op("Sum").has_value());
  EXPECT_FALSE(kc::parse_reduce_op("").has_value());
}

// ---- World size 1, no store ----

class WorldOne : public ::testing::TestWithParam<ref::Dtype> {};

TEST_P(WorldOne, EveryOpIsTheIdentityOrLayernorm) {
  const ref::Dtype d = GetParam();
  CommPtr comm = make_comm(0, 1, "", "solo");
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->store, nullptr);
  const std::vector<float> v = random_values(24, d, 7);
  for (const char* op : {"sum", "prod", "max", "min", "avg"}) {
    Tensor x(d, {4, 6}, v);
    Ctx c;
    ASSERT_TRUE(kc::all_reduce_cpu(c.ctx, x.t, *comm, op).ok()) << c.message();
    EXPECT_EQ(x.values(), v) << op;
    Tensor out(d, {4, 6}, std::vector<float>(24, 9.0f));
    ASSERT_TRUE(kc::reduce_scatter_cpu(c.ctx, x.t, out.t, *comm, op).ok()) << c.message();
    EXPECT_EQ(out.values(), v) << op;
  }
  Tensor x(d, {24}, v);
  Tensor out(d, {24}, std::vector<float>(24, 9.0f));
  Ctx c;
  ASSERT_TRUE(kc::all_gather_cpu(c.ctx, x.t, out.t, *comm).ok()) << c.message();
  EXPECT_EQ(out.values(), v);

  // The fused op equals layernorm.fused_add_rmsnorm bit for bit (the same arithmetic).
  const std::vector<float> res = random_values(24, d, 8);
  const std::vector<float> w = random_values(6, d, 9);
  Tensor x1(d, {4, 6}, v), r1(d, {4, 6}, res), w1(d, {6}, w);
  Tensor x2(d, {4, 6}, v), r2(d, {4, 6}, res), w2(d, {6}, w);
  ASSERT_TRUE(kc::all_reduce_add_rmsnorm_cpu(c.ctx, x1.t, r1.t, w1.t, *comm, 1e-5).ok())
      << c.message();
  ASSERT_TRUE(kreg::layernorm::fused_add_rmsnorm_cpu(c.ctx, x2.t, r2.t, w2.t, 1e-5).ok());
  EXPECT_EQ(x1.values(), x2.values());
  EXPECT_EQ(r1.values(), r2.values());
  EXPECT_NE(x1.values(), v);  // it did something
  EXPECT_EQ(comm->seq, 12u);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WorldOne,
                         ::testing::Values(ref::Dtype::kF32, ref::Dtype::kBF16, ref::Dtype::kF16));

TEST(CommImpl, WorldOneChecksItsArguments) {
  CommPtr comm = make_comm(0, 1, "", "solo-args");
  ASSERT_NE(comm, nullptr);
  Tensor x(ref::Dtype::kF32, {4}, random_values(4, ref::Dtype::kF32, 1));
  Tensor bf(ref::Dtype::kBF16, {4}, random_values(4, ref::Dtype::kBF16, 1));
  Tensor big(ref::Dtype::kF32, {5}, random_values(5, ref::Dtype::kF32, 1));
  Ctx c;
  EXPECT_EQ(kc::all_reduce_cpu(c.ctx, x.t, *comm, "mean").code, KREG_INVALID_ARGUMENT);
  EXPECT_NE(c.message().find("communication.all_reduce: op 'mean' is not one of"),
            std::string::npos)
      << c.message();
  EXPECT_EQ(kc::all_gather_cpu(c.ctx, x.t, big.t, *comm).code, KREG_INVALID_ARGUMENT);
  EXPECT_NE(c.message().find("out has 5 elements; world size 1 times x's 4 expected"),
            std::string::npos)
      << c.message();
  EXPECT_EQ(kc::all_gather_cpu(c.ctx, x.t, bf.t, *comm).code, KREG_INVALID_ARGUMENT);
  EXPECT_NE(c.message().find("out has dtype bf16 but x has f32"), std::string::npos) << c.message();
  int64_t strides[1] = {2};
  x.t.strides = strides;
  EXPECT_EQ(kc::all_reduce_cpu(c.ctx, x.t, *comm, "sum").code, KREG_INVALID_ARGUMENT);
  EXPECT_NE(c.message().find("x must be contiguous"), std::string::npos) << c.message();
  x.t.strides = nullptr;
  x.t.device = {kDLCUDA, 0};
  EXPECT_EQ(kc::all_reduce_cpu(c.ctx, x.t, *comm, "sum").code, KREG_INVALID_ARGUMENT);
  EXPECT_NE(c.message().find("the CPU transport takes CPU tensors"), std::string::npos)
      << c.message();
}

// ---- 2 and 4 ranks over TCP and file stores ----

struct Setup {
  StoreKind store;
  int64_t world;
};
void PrintTo(const Setup& s, std::ostream* os) {
  *os << (s.store == StoreKind::kTcp ? "tcp" : "file") << " store, " << s.world << " ranks";
}

class MultiRank : public ::testing::TestWithParam<Setup> {
 protected:
  std::string name(const char* what) const {
    return std::string(what) + "-" + std::to_string(GetParam().world);
  }
};

std::string setup_name(const ::testing::TestParamInfo<Setup>& info) {
  return std::string(info.param.store == StoreKind::kTcp ? "Tcp" : "File") +
         std::to_string(info.param.world);
}

ref::Ranks random_ranks(int64_t world, size_t n, ref::Dtype d, uint32_t seed) {
  ref::Ranks out;
  for (int64_t r = 0; r < world; ++r) out.push_back(random_values(n, d, seed + 101 * r));
  return out;
}

bool within(float got, float want, ref::Dtype d) {
  const float rel = d == ref::Dtype::kF32 ? 2e-6f : 1.0f / 128.0f;
  return std::fabs(got - want) <= rel * std::fabs(want) + 1e-6f;
}

// Asserts that none of the keys a comm of `world` ranks named `name` may use survived.
void expect_no_keys(const std::string& url, const std::string& name, int64_t world,
                    uint64_t collectives) {
  std::string err;
  auto store = kreg::comm::connect_store(url, 5, &err);
  ASSERT_NE(store, nullptr) << err;
  std::vector<std::string> keys = {name + "/join/ready", name + "/join/read"};
  for (int64_t r = 0; r < world; ++r) keys.push_back(name + "/join/" + std::to_string(r));
  for (uint64_t s = 0; s < collectives; ++s) {
    keys.push_back(name + "/" + std::to_string(s) + "/done");
    for (int64_t r = 0; r < world; ++r) {
      keys.push_back(name + "/" + std::to_string(s) + "/" + std::to_string(r));
    }
  }
  for (const std::string& k : keys) {
    std::string value;
    EXPECT_FALSE(store->get(k, 0.01, &value, &err)) << "key " << k << " was left in " << url;
  }
}

TEST_P(MultiRank, EveryOpMatchesTheReference) {
  const auto [kind, world] = GetParam();
  TestStore store(kind);
  ASSERT_FALSE(store.url().empty()) << store.error();
  const std::string cname = name("ops");
  constexpr int64_t kRows = 3, kHidden = 8;
  constexpr size_t kN = kRows * kHidden;
  std::atomic<uint64_t> seq{0};
  run_ranks(world, [&](int64_t rank) {
    CommPtr comm = make_comm(rank, world, store.url(), cname);
    if (comm == nullptr) return;
    for (ref::Dtype d : {ref::Dtype::kF32, ref::Dtype::kBF16}) {
      const char* dn = d == ref::Dtype::kF32 ? "f32" : "bf16";
      for (const char* op : {"sum", "prod", "max", "min", "avg"}) {
        const ref::Ranks in = random_ranks(world, kN, d, 11);
        const ref::Ranks want = ref::all_reduce(in, op, d);
        Tensor x(d, {kRows, kHidden}, in[rank]);
        Ctx c;
        ASSERT_TRUE(kc::all_reduce_cpu(c.ctx, x.t, *comm, op).ok()) << c.message();
        EXPECT_EQ(x.values(), want[rank]) << "all_reduce " << op << " " << dn << " rank " << rank;

        const ref::Ranks rs_in = random_ranks(world, kN * world, d, 23);
        const ref::Ranks rs_want = ref::reduce_scatter(rs_in, op, d);
        Tensor rx(d, {static_cast<int64_t>(kN) * world}, rs_in[rank]);
        Tensor rout(d, {static_cast<int64_t>(kN)}, std::vector<float>(kN, 0.5f));
        ASSERT_TRUE(kc::reduce_scatter_cpu(c.ctx, rx.t, rout.t, *comm, op).ok()) << c.message();
        EXPECT_EQ(rout.values(), rs_want[rank])
            << "reduce_scatter " << op << " " << dn << " rank " << rank;
      }
      const ref::Ranks in = random_ranks(world, kN, d, 31);
      Tensor x(d, {static_cast<int64_t>(kN)}, in[rank]);
      Tensor out(d, {world, static_cast<int64_t>(kN)}, std::vector<float>(kN * world, 0.5f));
      Ctx c;
      ASSERT_TRUE(kc::all_gather_cpu(c.ctx, x.t, out.t, *comm).ok()) << c.message();
      EXPECT_EQ(out.values(), ref::all_gather(in)[rank]) << "all_gather " << dn;

      const ref::Ranks res = random_ranks(world, kN, d, 41);
      const ref::Ranks w = random_ranks(world, kHidden, d, 43);
      const ref::AddRmsnorm want = ref::all_reduce_add_rmsnorm(in, res, w, kHidden, 1e-6, d);
      Tensor fx(d, {kRows, kHidden}, in[rank]);
      Tensor fr(d, {kRows, kHidden}, res[rank]);
      Tensor fw(d, {kHidden}, w[rank]);
      ASSERT_TRUE(kc::all_reduce_add_rmsnorm_cpu(c.ctx, fx.t, fr.t, fw.t, *comm, 1e-6).ok())
          << c.message();
      EXPECT_EQ(fr.values(), want.residual[rank]) << "residual " << dn << " rank " << rank;
      const std::vector<float> got = fx.values();
      for (size_t i = 0; i < kN; ++i) {
        EXPECT_TRUE(within(got[i], want.x[rank][i], d))
            << dn << " rank " << rank << " [" << i << "]: " << got[i] << " vs " << want.x[rank][i];
      }
    }
    seq = comm->seq;
  });
  EXPECT_EQ(seq.load(), 2u * (5 * 2 + 2));
  expect_no_keys(store.url(), cname, world, seq.load());
}

TEST_P(MultiRank, MismatchedSizesFailOnEveryRankAndTheCommGoesOn) {
  const auto [kind, world] = GetParam();
  TestStore store(kind);
  ASSERT_FALSE(store.url().empty()) << store.error();
  const std::string cname = name("mismatch");
  run_ranks(world, [&](int64_t rank) {
    CommPtr comm = make_comm(rank, world, store.url(), cname);
    if (comm == nullptr) return;
    const ref::Dtype d = ref::Dtype::kF32;
    // Rank 1 has 6 elements, the others 4: every rank sees a mismatch.
    const int64_t n = rank == 1 ? 6 : 4;
    Tensor x(d, {n}, random_values(static_cast<size_t>(n), d, 5));
    Ctx c;
    EXPECT_EQ(kc::all_reduce_cpu(c.ctx, x.t, *comm, "sum").code, KREG_INVALID_ARGUMENT);
    const std::string want =
        rank == 1 ? "rank 0 has 4 elements, this rank 6" : "rank 1 has 6 elements, this rank 4";
    EXPECT_NE(c.message().find(want), std::string::npos) << rank << ": " << c.message();

    // Only the last rank's out is too small: it says why, the others hear it from it.
    const int64_t last = world - 1;
    Tensor gx(d, {4}, random_values(4, d, 6));
    Tensor gout(d, {rank == last ? 4 * world - 1 : 4 * world},
                std::vector<float>(static_cast<size_t>(4 * world), 0.5f));
    const kreg::KernelStatus s = kc::all_gather_cpu(c.ctx, gx.t, gout.t, *comm);
    if (rank == last) {
      EXPECT_EQ(s.code, KREG_INVALID_ARGUMENT);
      EXPECT_NE(
          c.message().find("out has " + std::to_string(4 * world - 1) + " elements; world size " +
                           std::to_string(world) + " times x's 4 expected"),
          std::string::npos)
          << c.message();
    } else {
      EXPECT_EQ(s.code, KREG_ABORTED);
      EXPECT_NE(c.message().find("rank " + std::to_string(last) + " failed: "), std::string::npos)
          << c.message();
      EXPECT_NE(c.message().find("out has"), std::string::npos) << c.message();
    }

    // Different dtypes across ranks.
    const ref::Dtype rd = rank == 0 ? ref::Dtype::kBF16 : ref::Dtype::kF32;
    Tensor dx(rd, {4}, random_values(4, rd, 8));
    EXPECT_EQ(kc::all_reduce_cpu(c.ctx, dx.t, *comm, "sum").code, KREG_INVALID_ARGUMENT);
    EXPECT_NE(c.message().find("has dtype"), std::string::npos) << c.message();

    // The ranks stayed in step: the next collective works.
    const ref::Ranks in = random_ranks(world, 4, d, 9);
    Tensor ok(d, {4}, in[rank]);
    EXPECT_TRUE(kc::all_reduce_cpu(c.ctx, ok.t, *comm, "sum").ok()) << c.message();
    EXPECT_EQ(ok.values(), ref::all_reduce(in, "sum", d)[rank]);
  });
  expect_no_keys(store.url(), cname, world, 4);
}

TEST_P(MultiRank, AMissingRankMakesTheOthersTimeOut) {
  const auto [kind, world] = GetParam();
  TestStore store(kind);
  ASSERT_FALSE(store.url().empty()) << store.error();
  // At creation: the last rank never comes.
  const std::string cname = name("missing");
  run_ranks(world - 1, [&](int64_t rank) {
    std::string err;
    kc::Comm* c = kc::create_comm(rank, world, store.url(), -1, cname, 0.5, &err);
    EXPECT_EQ(c, nullptr);
    kc::destroy_comm(c);
    const std::string where = "rank " + std::to_string(rank) + " of " + std::to_string(world);
    EXPECT_NE(err.find(where + ": "), std::string::npos) << err;
    if (rank == 0) {
      EXPECT_NE(err.find("waiting for rank " + std::to_string(world - 1) + " to join comm '" +
                         cname + "' in " + store.url()),
                std::string::npos)
          << err;
    } else {
      EXPECT_NE(err.find("waiting for rank 0's go-ahead in " + store.url()), std::string::npos)
          << err;
    }
    EXPECT_NE(err.find("timed out after 0.5 s"), std::string::npos) << err;
  });

  // In a collective: all ranks join, the last one never calls.
  const std::string cname2 = name("absent");
  run_ranks(world, [&](int64_t rank) {
    CommPtr comm = make_comm(rank, world, store.url(), cname2, 0.5);
    if (comm == nullptr || rank == world - 1) return;
    Tensor x(ref::Dtype::kF32, {4}, random_values(4, ref::Dtype::kF32, 3));
    Ctx c;
    EXPECT_EQ(kc::all_reduce_cpu(c.ctx, x.t, *comm, "sum").code, KREG_UNAVAILABLE);
    EXPECT_NE(c.message().find("waiting for rank " + std::to_string(world - 1) +
                               "'s data (collective 0) in " + store.url()),
              std::string::npos)
        << c.message();
    EXPECT_NE(c.message().find("timed out after 0.5 s"), std::string::npos) << c.message();
    // The comm is unusable from then on, and says why.
    EXPECT_EQ(kc::all_reduce_cpu(c.ctx, x.t, *comm, "sum").code, KREG_FAILED_PRECONDITION);
    EXPECT_NE(c.message().find("unusable after an earlier failure"), std::string::npos)
        << c.message();
  });
}

TEST_P(MultiRank, RanksMustAgreeOnTheWorldSize) {
  const auto [kind, world] = GetParam();
  TestStore store(kind);
  ASSERT_FALSE(store.url().empty()) << store.error();
  const std::string cname = name("disagree");
  // Rank 1 believes in a world one larger; rank 0 sees its record.
  std::string err0, err1;
  std::thread t1(
      [&] { kc::destroy_comm(kc::create_comm(1, world + 1, store.url(), -1, cname, 1.0, &err1)); });
  kc::destroy_comm(kc::create_comm(0, world, store.url(), -1, cname, 1.0, &err0));
  t1.join();
  EXPECT_NE(err0.find("rank 1 joined with world size " + std::to_string(world + 1) +
                      ", this rank with " + std::to_string(world)),
            std::string::npos)
      << err0;
  EXPECT_FALSE(err1.empty());
}

INSTANTIATE_TEST_SUITE_P(Stores, MultiRank,
                         ::testing::Values(Setup{StoreKind::kTcp, 2}, Setup{StoreKind::kTcp, 4},
                                           Setup{StoreKind::kFile, 2}, Setup{StoreKind::kFile, 4}),
                         setup_name);

// ---- The references themselves, on numbers worked out by hand ----

TEST(CommReference, SmallCasesByHand) {
  const ref::Ranks x = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  EXPECT_EQ(ref::all_reduce(x, "sum", ref::Dtype::kF32)[1], (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(ref::all_reduce(x, "avg", ref::Dtype::kF32)[0],
            (std::vector<float>{5.5, 11, 16.5, 22}));
  EXPECT_EQ(ref::all_reduce(x, "prod", ref::Dtype::kF32)[0], (std::vector<float>{10, 40, 90, 160}));
  EXPECT_EQ(ref::all_reduce({{1, -5}, {2, -6}}, "min", ref::Dtype::kF32)[0],
            (std::vector<float>{1, -6}));
  EXPECT_EQ(ref::all_gather(x)[0], (std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40}));
  EXPECT_EQ(ref::reduce_scatter(x, "max", ref::Dtype::kF32)[1], (std::vector<float>{30, 40}));
  // 1 + 2^-8 is not a bf16: the sum rounds to even.
  EXPECT_EQ(ref::all_reduce({{1.0f}, {0.00390625f}}, "sum", ref::Dtype::kBF16)[0][0], 1.0f);
  // s = (3 + 1, 0 + 0) = (4, 0): mean(s^2) = 8, x = s / sqrt(8) * w.
  const ref::AddRmsnorm f = ref::all_reduce_add_rmsnorm({{1, 0}, {2, 0}}, {{1, 0}, {1, 0}},
                                                        {{1, 1}, {2, 2}}, 2, 0.0, ref::Dtype::kF32);
  EXPECT_EQ(f.residual[0], (std::vector<float>{4, 0}));
  EXPECT_FLOAT_EQ(f.x[0][0], 4.0f / std::sqrt(8.0f));
  EXPECT_FLOAT_EQ(f.x[1][0], 8.0f / std::sqrt(8.0f));
  EXPECT_THROW(ref::all_reduce({{1}, {1, 2}}, "sum", ref::Dtype::kF32), std::invalid_argument);
  EXPECT_THROW(ref::all_reduce(x, "mean", ref::Dtype::kF32), std::invalid_argument);
}

}  // namespace
