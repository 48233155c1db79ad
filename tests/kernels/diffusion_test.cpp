// The diffusion group: every CPU reference against an independent double-precision
// oracle written here, every CUDA kernel against its CPU reference over a shape sweep
// with awkward sizes and misaligned views (skipped without a GPU), and bad arguments
// rejected with messages that name the argument.
//
// The modulation tensors ([B,H] or [B,S,H]) and group_norm_silu's rank-free x cannot be
// built from a signature's named dimensions, so each case lists its tensors explicitly.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <random>

#include "harness.hpp"
#include "kreg/registry.hpp"

namespace fs = std::filesystem;

namespace kreg {
namespace {

using harness::Buffer;
using Values = std::vector<std::vector<double>>;

constexpr DLDevice kCpuDevice{kDLCPU, 0};
constexpr DLDevice kGpuDevice{kDLCUDA, 0};

Registry& registry() {
  static std::unique_ptr<Registry> reg = [] {
    auto m = load_manifest(fs::path(KREG_SOURCE_DIR) / "registry.yaml",
                           ManifestOptions{fs::path(KREG_PLUGIN_DIR), true});
    EXPECT_TRUE(m.ok()) << m.status().message();
    auto r = Registry::open(*m);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }();
  return *reg;
}

std::vector<double> values(const Buffer& b) {
  auto v = b.to_doubles();
  EXPECT_TRUE(v.ok()) << v.status().message();
  return v.ok() ? *v : std::vector<double>{};
}

size_t at(int64_t i) { return static_cast<size_t>(i); }

// ---- Cases: explicit tensors, attributes and the oracle ----

struct Arg {
  std::string name;
  std::vector<int64_t> shape;
  std::optional<DType> dtype;  // unset: the call's dtype
  bool output = false;
  std::vector<double> fixed;  // input values to use instead of random ones
};

// Writes the expected value of every output element into out[i] (sized like in[i]) and,
// where the oracle knows its own comparison needs more room than the dtype's tolerance
// (fp32 phase rounding in timestep_embedding), an extra absolute slack into slack[i].
using Oracle = std::function<void(const Values& in, Values& out, Values& slack)>;

struct Case {
  std::string op;
  std::string label;
  std::vector<Arg> args;
  std::vector<NamedAttr> attrs;
  Oracle oracle;
};

struct Built {
  std::vector<Buffer> buffers;
  std::vector<DLTensor*> tensors;
};

Built build(const Case& c, DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Built b;
  for (const Arg& a : c.args) {
    auto buf = Buffer::make(kCpuDevice, a.dtype.value_or(dt), a.shape);
    EXPECT_TRUE(buf.ok());
    Status st = a.output          ? buf->poison()
                : a.fixed.empty() ? buf->fill_random(rng)
                                  : buf->from_doubles(a.fixed);
    EXPECT_TRUE(st.ok()) << st.message();
    b.buffers.push_back(std::move(buf).value());
  }
  for (Buffer& x : b.buffers) b.tensors.push_back(x.tensor());
  return b;
}

Built to_device(const Built& host) {
  Built d;
  for (const Buffer& h : host.buffers) {
    auto buf = Buffer::make(kGpuDevice, h.dtype(), h.shape());
    EXPECT_TRUE(buf.ok());
    EXPECT_TRUE(buf->copy_from(h).ok());
    d.buffers.push_back(std::move(buf).value());
  }
  for (Buffer& x : d.buffers) d.tensors.push_back(x.tensor());
  return d;
}

Result<KernelHandle> resolve(const std::string& op, DLDevice dev, DType dt) {
  return registry().resolve(op, Target{dev, dt},
                            {std::string(dev.device_type == kDLCPU ? "cpu" : "cuda")});
}

Status run(const KernelHandle& h, const Case& c, Built& b) {
  auto attrs = h.attrs(c.attrs);
  if (!attrs.ok()) return attrs.status();
  return h.call(b.tensors, attrs->view());
}

// Element-wise |got - want| <= atol + slack + rtol |want| (NaN fails).
void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, const std::vector<double>& slack,
                  harness::Tolerance tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double room = tol.atol + (slack.empty() ? 0.0 : slack[i]) + tol.rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= room)) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << "/" << want.size() << " mismatches; first at "
                     << first << ": got " << got[first] << ", want " << want[first];
}

// ---- Oracles (double precision, from the rounded inputs) ----

// Row r of a modulation tensor: per batch ([B,H]) or per token ([B,S,H]).
int64_t mod_row(bool per_token, int64_t b, int64_t s, int64_t tokens) {
  return per_token ? b * tokens + s : b;
}

Case residual_gate_add_case(int64_t B, int64_t S, int64_t H, bool per_token) {
  Case c;
  c.op = "diffusion.residual_gate_add";
  c.label = "B=" + std::to_string(B) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
            (per_token ? " gate[B,S,H]" : " gate[B,H]");
  const std::vector<int64_t> bsh{B, S, H};
  c.args = {{"residual", bsh},
            {"x", bsh},
            {"gate", per_token ? bsh : std::vector<int64_t>{B, H}},
            {"out", bsh, std::nullopt, true}};
  c.oracle = [=](const Values& in, Values& out, Values&) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t i = (b * S + s) * H + h;
          const double g = in[2][at(mod_row(per_token, b, s, S) * H + h)];
          out[3][at(i)] = in[0][at(i)] + g * in[1][at(i)];
        }
  };
  return c;
}

std::vector<Case> cases(bool gpu) {
  std::vector<Case> out;
  const std::vector<std::array<int64_t, 3>> bsh =
      gpu ? std::vector<std::array<int64_t, 3>>{{1, 1, 1},     {2, 3, 7},    {1, 5, 64},
                                                {3, 2, 100},   {1, 4, 4097}, {2, 2, 3072},
                                                {2, 64, 3072}, {1, 3, 8},    {4, 17, 1000},
                                                {1, 2, 16384}, {1, 1, 36864}}
          : std::vector<std::array<int64_t, 3>>{{1, 1, 1},   {2, 3, 7},    {1, 5, 64},
                                                {3, 2, 100}, {1, 4, 4097}, {2, 2, 3072}};
  for (auto [b, s, h] : bsh) {
    for (bool per_token : {false, true}) out.push_back(residual_gate_add_case(b, s, h, per_token));
  }
  return out;
}

const char* const kDiffusionOps[] = {"diffusion.residual_gate_add"};

TEST(DiffusionKernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> shipped, covered(std::begin(kDiffusionOps), std::end(kDiffusionOps));
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("diffusion.")) shipped.push_back(id);
  }
  std::set<std::string> with_cases;
  for (const Case& c : cases(false)) with_cases.insert(c.op);
  std::sort(covered.begin(), covered.end());
  EXPECT_EQ(shipped, covered) << "a new diffusion op needs an oracle in this file";
  for (const std::string& op : covered) EXPECT_TRUE(with_cases.count(op)) << op << " has no cases";
}

TEST(DiffusionKernels, CpuReferencesMatchTheOracle) {
  uint64_t seed = 1;
  for (const Case& c : cases(false)) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(c.op + " " + c.label + " " + std::string(dtype_name(dt)));
      auto h = resolve(c.op, kCpuDevice, dt);
      ASSERT_TRUE(h.ok()) << h.status().message();
      Built b = build(c, dt, seed++);
      Values in;
      for (const Buffer& x : b.buffers) in.push_back(values(x));
      Values want = in, slack(in.size());
      for (size_t i = 0; i < in.size(); ++i) slack[i].assign(in[i].size(), 0.0);
      c.oracle(in, want, slack);
      Status st = run(*h, c, b);
      ASSERT_TRUE(st.ok()) << st.message();
      for (size_t i = 0; i < c.args.size(); ++i) {
        const auto& a = c.args[i];
        const auto got = values(b.buffers[i]);
        if (!a.output) {
          EXPECT_EQ(got, in[i]) << "input '" << a.name << "' was modified";
          continue;
        }
        expect_close(a.name, got, want[i], slack[i], harness::tolerance_for(b.buffers[i].dtype()));
      }
    }
  }
}

class GpuDiffusionKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!harness::gpu_available()) {
      GTEST_SKIP() << "no CUDA device on this machine: GPU kernel tests skipped "
                      "(run ctest on a GPU machine to exercise them)";
    }
  }
};

// The CUDA kernel on poisoned outputs against the CPU reference on the same inputs.
void check_on_gpu(const Case& c, DType dt, uint64_t seed) {
  SCOPED_TRACE(c.op + " " + c.label + " " + std::string(dtype_name(dt)));
  auto cuda = resolve(c.op, kGpuDevice, dt);
  ASSERT_TRUE(cuda.ok()) << cuda.status().message();
  auto cpu = resolve(c.op, kCpuDevice, dt);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  Built host = build(c, dt, seed);
  Built dev = to_device(host);
  Status st = run(*cuda, c, dev);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(harness::device_synchronize().ok());
  st = run(*cpu, c, host);
  ASSERT_TRUE(st.ok()) << st.message();
  for (size_t i = 0; i < c.args.size(); ++i) {
    if (!c.args[i].output) continue;
    expect_close(c.args[i].name, values(dev.buffers[i]), values(host.buffers[i]), {},
                 harness::tolerance_for(host.buffers[i].dtype()));
  }
}

TEST_F(GpuDiffusionKernels, MatchTheCpuReferenceOverAShapeSweep) {
  uint64_t seed = 1000;
  for (const Case& c : cases(true)) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) check_on_gpu(c, dt, seed++);
  }
}

TEST_F(GpuDiffusionKernels, MisalignedViews) {
  // Every tensor one element into its allocation: no 16-byte vectors anywhere.
  for (const Case& c :
       {residual_gate_add_case(2, 3, 4096, false), residual_gate_add_case(2, 3, 4096, true)}) {
    SCOPED_TRACE(c.op + " " + c.label + " misaligned");
    const DType dt = DType::kBF16;
    auto cuda = resolve(c.op, kGpuDevice, dt);
    auto cpu = resolve(c.op, kCpuDevice, dt);
    ASSERT_TRUE(cuda.ok() && cpu.ok());
    Built host = build(c, dt, 77);
    std::vector<Buffer> padded;
    std::vector<DLTensor> views;
    for (const Buffer& b : host.buffers) {
      auto p = Buffer::make(kGpuDevice, b.dtype(), {b.numel() + 1});
      ASSERT_TRUE(p.ok());
      auto v = values(b);
      v.insert(v.begin(), 0.5);
      ASSERT_TRUE(p->from_doubles(v).ok());
      DLTensor t = *b.tensor();
      t.device = kGpuDevice;
      t.data = p->tensor()->data;
      t.byte_offset = dtype_size(b.dtype());
      views.push_back(t);
      padded.push_back(std::move(p).value());
    }
    std::vector<DLTensor*> ptrs;
    for (DLTensor& t : views) ptrs.push_back(&t);
    auto attrs = cuda->attrs(c.attrs);
    ASSERT_TRUE(attrs.ok());
    ASSERT_TRUE(cuda->call(ptrs, attrs->view()).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    ASSERT_TRUE(run(*cpu, c, host).ok());
    for (size_t i = 0; i < c.args.size(); ++i) {
      if (!c.args[i].output) continue;
      auto got = values(padded[i]);
      got.erase(got.begin());
      expect_close(c.args[i].name, got, values(host.buffers[i]), {}, harness::tolerance_for(dt));
    }
  }
}

TEST_F(GpuDiffusionKernels, EmptyTensorsAndCpuTensorsToTheCudaPath) {
  for (const Case& c :
       {residual_gate_add_case(0, 4, 64, false), residual_gate_add_case(2, 0, 64, true)}) {
    auto cuda = resolve(c.op, kGpuDevice, DType::kBF16);
    ASSERT_TRUE(cuda.ok());
    Built dev = to_device(build(c, DType::kBF16, 3));
    Status st = run(*cuda, c, dev);
    EXPECT_TRUE(st.ok()) << c.op << " " << c.label << ": " << st.message();
    EXPECT_TRUE(harness::device_synchronize().ok());
  }
  const Case c = residual_gate_add_case(1, 2, 8, false);
  auto cuda = resolve(c.op, kGpuDevice, DType::kF32);
  ASSERT_TRUE(cuda.ok());
  Built host = build(c, DType::kF32, 5);
  Status st = run(*cuda, c, host);
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("backend cuda runs on cuda tensors"), std::string::npos)
      << st.message();
}

// A bad call on the CPU path: the message must contain `expect`, outputs stay poisoned.
void expect_refused(Case c, DType dt, const std::string& expect) {
  SCOPED_TRACE(c.op + " " + c.label);
  auto h = resolve(c.op, kCpuDevice, dt);
  ASSERT_TRUE(h.ok()) << h.status().message();
  Built b = build(c, dt, 9);
  Status st = run(*h, c, b);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(expect), std::string::npos) << st.message();
  for (size_t i = 0; i < c.args.size(); ++i) {
    if (!c.args[i].output) continue;
    for (double v : values(b.buffers[i])) ASSERT_TRUE(std::isnan(v)) << "output written";
  }
}

TEST(DiffusionKernels, BadArgumentsAreRejected) {
  {
    Case c = residual_gate_add_case(2, 3, 8, false);
    c.args[2].shape = {2, 3};
    expect_refused(c, DType::kF32,
                   "argument 'gate' has shape [2,3], expected [B,H] = [2,8] or [B,S,H] = [2,3,8]");
  }
  {
    Case c = residual_gate_add_case(2, 3, 8, true);
    c.args[2].dtype = DType::kBF16;
    expect_refused(c, DType::kF32, "'gate'");
  }
  {
    Case c = residual_gate_add_case(2, 3, 8, true);
    c.args[1].shape = {2, 3, 9};
    expect_refused(c, DType::kF32, "'x'");
  }
}

}  // namespace
}  // namespace kreg
