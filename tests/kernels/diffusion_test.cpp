// The diffusion group: every CPU reference against an independent double-precision
// oracle written here, every CUDA kernel against its CPU reference over a shape sweep
// with awkward sizes and misaligned views (skipped without a GPU), and bad arguments
// rejected with messages that name the argument.
//
// The modulation tensors ([B,H] or [B,S,H]) and group_norm_silu's rank-free x cannot be
// built from a signature's named dimensions, so each case lists its tensors explicitly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;
using Values = std::vector<std::vector<double>>;

using namespace test;  // kernel_test.hpp

// ---- Cases: explicit tensors, attributes and the oracle ----

struct Arg {
  std::string name;
  std::vector<int64_t> shape;
  std::optional<DType> dtype;  // unset: the call's dtype
  bool output = false;
  std::vector<double> fixed;  // input values to use instead of random ones
  bool omitted = false;       // an optional tensor left out: the call gets a null pointer
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
    auto buf = Buffer::make(kCpu, a.dtype.value_or(dt), a.shape);
    EXPECT_TRUE(buf.ok());
    Status st = a.output          ? buf->poison()
                : a.fixed.empty() ? buf->fill_random(rng)
                                  : buf->from_doubles(a.fixed);
    EXPECT_TRUE(st.ok()) << st.message();
    b.buffers.push_back(std::move(buf).value());
  }
  for (size_t i = 0; i < c.args.size(); ++i) {
    b.tensors.push_back(c.args[i].omitted ? nullptr : b.buffers[i].tensor());
  }
  return b;
}

Built to_device(const Built& host) {
  Built d;
  for (size_t i = 0; i < host.buffers.size(); ++i) {
    const Buffer& h = host.buffers[i];
    auto buf = Buffer::make(kGpu, h.dtype(), h.shape());
    EXPECT_TRUE(buf.ok());
    EXPECT_TRUE(buf->copy_from(h).ok());
    d.buffers.push_back(std::move(buf).value());
  }
  for (size_t i = 0; i < d.buffers.size(); ++i) {
    d.tensors.push_back(host.tensors[i] == nullptr ? nullptr : d.buffers[i].tensor());
  }
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

// affine: bit 0 passes weight, bit 1 passes bias (each optional, omitted otherwise).
Case norm_scale_shift_case(int64_t B, int64_t S, int64_t H, bool scale_per_token,
                           bool shift_per_token, int affine, double eps = 1e-6) {
  const bool with_weight = (affine & 1) != 0, with_bias = (affine & 2) != 0;
  Case c;
  c.op = "diffusion.norm_scale_shift";
  c.label = "B=" + std::to_string(B) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
            (scale_per_token ? " scale[B,S,H]" : " scale[B,H]") +
            (shift_per_token ? " shift[B,S,H]" : " shift[B,H]") + (with_weight ? " weight" : "") +
            (with_bias ? " bias" : "") + " eps=" + std::to_string(eps);
  const std::vector<int64_t> bsh{B, S, H}, bh{B, H};
  c.args = {{"x", bsh},
            {"scale", scale_per_token ? bsh : bh},
            {"shift", shift_per_token ? bsh : bh},
            {"weight", {H}, std::nullopt, false, {}, !with_weight},
            {"bias", {H}, std::nullopt, false, {}, !with_bias},
            {"out", bsh, std::nullopt, true}};
  c.attrs = {{"eps", eps}};
  c.oracle = [=](const Values& in, Values& out, Values&) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t row = b * S + s;
        double mean = 0, var = 0;
        for (int64_t h = 0; h < H; ++h) mean += in[0][at(row * H + h)];
        mean /= static_cast<double>(H);
        for (int64_t h = 0; h < H; ++h) {
          const double d = in[0][at(row * H + h)] - mean;
          var += d * d;
        }
        var /= static_cast<double>(H);
        for (int64_t h = 0; h < H; ++h) {
          double y = (in[0][at(row * H + h)] - mean) / std::sqrt(var + eps);
          if (with_weight) y *= in[3][at(h)];
          if (with_bias) y += in[4][at(h)];
          const double sc = in[1][at(mod_row(scale_per_token, b, s, S) * H + h)];
          const double sh = in[2][at(mod_row(shift_per_token, b, s, S) * H + h)];
          out[5][at(row * H + h)] = y * (1 + sc) + sh;
        }
      }
  };
  return c;
}

// t: explicit timesteps (diffusion schedules use 0..1000), or random +-[0.05, 2] if empty.
Case timestep_embedding_case(int64_t N, int64_t dim, bool flip, double shift, double scale,
                             int64_t max_period, bool large_t) {
  Case c;
  c.op = "diffusion.timestep_embedding";
  c.label = "N=" + std::to_string(N) + " dim=" + std::to_string(dim) + (flip ? " flip" : "") +
            " shift=" + std::to_string(shift) + " scale=" + std::to_string(scale) +
            " max_period=" + std::to_string(max_period) + (large_t ? " t in [0,1000)" : " t small");
  std::vector<double> t;
  if (large_t) {
    for (int64_t n = 0; n < N; ++n) t.push_back(std::fmod(static_cast<double>(n) * 137.25, 1000.0));
  }
  c.args = {{"t", {N}, std::nullopt, false, t}, {"out", {N, dim}, DType::kF32, true}};
  c.attrs = {{"dim", dim},
             {"flip_sin_to_cos", flip},
             {"downscale_freq_shift", shift},
             {"scale", scale},
             {"max_period", max_period}};
  c.oracle = [=](const Values& in, Values& out, Values& slack) {
    const int64_t half = dim / 2;
    for (int64_t n = 0; n < N; ++n) {
      const double tv = in[0][at(n)];
      for (int64_t i = 0; i < half; ++i) {
        const double freq = std::exp(-std::log(static_cast<double>(max_period)) *
                                     static_cast<double>(i) / (static_cast<double>(half) - shift));
        const double arg = scale * tv * freq;
        const int64_t sin_col = flip ? half + i : i, cos_col = flip ? i : half + i;
        out[1][at(n * dim + sin_col)] = std::sin(arg);
        out[1][at(n * dim + cos_col)] = std::cos(arg);
        // The op rounds the exponent, frequency and argument to fp32 as diffusers does:
        // the phase is off by a few fp32 ulps of |t * scale|.
        const double room = 2e-6 + 5e-7 * std::fabs(tv * scale);
        slack[1][at(n * dim + sin_col)] = room;
        slack[1][at(n * dim + cos_col)] = room;
      }
      if (dim % 2 == 1) out[1][at(n * dim + dim - 1)] = 0.0;
    }
  };
  return c;
}

Case group_norm_silu_case(std::vector<int64_t> shape, int64_t groups, double eps = 1e-5) {
  Case c;
  c.op = "diffusion.group_norm_silu";
  std::string dims;
  for (int64_t d : shape) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  c.label = "x " + dims + " G=" + std::to_string(groups) + " eps=" + std::to_string(eps);
  const int64_t N = shape[0], C = shape[1];
  int64_t L = 1;
  for (size_t i = 2; i < shape.size(); ++i) L *= shape[i];
  c.args = {{"x", shape}, {"weight", {C}}, {"bias", {C}}, {"out", shape, std::nullopt, true}};
  c.attrs = {{"num_groups", groups}, {"eps", eps}};
  c.oracle = [=](const Values& in, Values& out, Values&) {
    const int64_t cpg = C / groups;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        double mean = 0, var = 0;
        const int64_t count = cpg * L;
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c)
          for (int64_t l = 0; l < L; ++l) mean += in[0][at((n * C + c) * L + l)];
        mean /= static_cast<double>(count);
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c)
          for (int64_t l = 0; l < L; ++l) {
            const double d = in[0][at((n * C + c) * L + l)] - mean;
            var += d * d;
          }
        var /= static_cast<double>(count);
        for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c)
          for (int64_t l = 0; l < L; ++l) {
            const int64_t i = (n * C + c) * L + l;
            const double z =
                (in[0][at(i)] - mean) / std::sqrt(var + eps) * in[1][at(c)] + in[2][at(c)];
            out[3][at(i)] = z / (1 + std::exp(-z));
          }
      }
  };
  return c;
}

std::vector<Case> cases(bool gpu) {
  std::vector<Case> out;
  const std::vector<std::array<int64_t, 3>> bsh =
      gpu ? std::vector<std::array<int64_t, 3>>{{1, 1, 1},     {2, 3, 7},     {1, 5, 64},
                                                {3, 2, 100},   {1, 4, 4097},  {2, 2, 3072},
                                                {2, 64, 3072}, {1, 3, 8},     {4, 17, 1000},
                                                {1, 2, 16384}, {1, 1, 36864}, {2, 4401, 768},
                                                {3, 12001, 40}}
          : std::vector<std::array<int64_t, 3>>{{1, 1, 1},   {2, 3, 7},    {1, 5, 64},
                                                {3, 2, 100}, {1, 4, 4097}, {2, 2, 3072}};
  for (auto [b, s, h] : bsh) {
    for (bool per_token : {false, true}) out.push_back(residual_gate_add_case(b, s, h, per_token));
    // Each layout combination somewhere in the sweep, and each of none / weight / bias /
    // both of the optional affine tensors.
    const bool even = (h % 2) == 0;
    out.push_back(norm_scale_shift_case(b, s, h, false, false, even ? 3 : 0));
    out.push_back(norm_scale_shift_case(b, s, h, true, false, even ? 0 : 3, 1e-5));
    out.push_back(norm_scale_shift_case(b, s, h, false, true, even ? 1 : 2));
    out.push_back(norm_scale_shift_case(b, s, h, true, true, even ? 2 : 1));
  }
  const std::vector<std::pair<int64_t, int64_t>> n_dim =
      gpu ? std::vector<std::pair<int64_t, int64_t>>{{1, 1},   {3, 2},    {2, 3},
                                                     {5, 8},   {16, 33},  {16, 256},
                                                     {7, 320}, {4, 1024}, {70000, 16}}
          : std::vector<std::pair<int64_t, int64_t>>{{1, 1},   {3, 2},    {2, 3},  {5, 8},
                                                     {16, 33}, {16, 256}, {7, 320}};
  for (auto [n, dim] : n_dim) {
    // diffusers' default shift 1 divides by half - 1: zero for dim 2 and 3 (refused).
    out.push_back(
        timestep_embedding_case(n, dim, false, dim / 2 == 1 ? 0.5 : 1.0, 1.0, 10000, false));
    out.push_back(timestep_embedding_case(n, dim, true, 0.0, 1.0, 10000, true));
    out.push_back(timestep_embedding_case(n, dim, false, 0.0, 1000.0, 100, false));
  }
  std::vector<std::pair<std::vector<int64_t>, int64_t>> gn = {
      {{1, 1}, 1},         {{2, 4}, 2},         {{2, 6, 5}, 3},
      {{1, 32, 8, 8}, 32}, {{2, 64, 7, 9}, 8},  {{1, 96, 3, 5, 7}, 32},
      {{1, 4, 4097}, 2},   {{2, 40, 16, 16}, 4}};
  if (gpu) {
    gn.push_back({{2, 512, 64, 64}, 32});
    gn.push_back({{3, 320, 32, 32}, 32});
    gn.push_back({{1, 8, 3, 1001}, 1});
    gn.push_back({{4, 128, 1}, 32});
    // The resident path on older GPUs (a cluster of 8 per group on sm_90 before the cluster
    // two-pass kernel took those groups: 64 groups of 256K elements), a group split unevenly
    // over 2 blocks, 4 vectors a thread; the two-pass fallback for groups above the resident
    // limit (512K elements).
    gn.push_back({{2, 128, 256, 256}, 32});
    gn.push_back({{1, 3, 1000, 8}, 1});
    gn.push_back({{3, 24, 40, 40}, 3});
    gn.push_back({{1, 2, 512, 512}, 1});
    // Groups of 2049..32768 16-byte vectors (bf16/f16: 8 elements, f32: 4), which the
    // cluster two-pass kernel (chunks of ~2048 vectors) takes from the resident one on
    // sm_90: clusters of 2..8 with a short last block (partial warps), chunks that start
    // and end inside channels, chunks above 1024 vectors (more than one batch a thread),
    // and both sides of each switch (bf16 groups of 1024 and 1032, 2048 (one group: a
    // resident cluster of 2) and 2049, 16384 and 16392, 32768 and 32769 vectors: the
    // resident limit).
    gn.push_back({{1, 1, 8256}, 1});
    gn.push_back({{1, 2, 4096}, 1});
    gn.push_back({{1, 1, 16384}, 1});
    gn.push_back({{1, 1, 16392}, 1});
    gn.push_back({{2, 64, 48, 48}, 4});
    gn.push_back({{1, 7, 8000}, 1});
    gn.push_back({{1, 16, 8192}, 1});
    gn.push_back({{1, 1, 131136}, 1});
    gn.push_back({{1, 1, 262144}, 1});
    gn.push_back({{1, 1, 262152}, 1});
  }
  for (auto& [shape, g] : gn) out.push_back(group_norm_silu_case(shape, g));
  return out;
}

const char* const kDiffusionOps[] = {"diffusion.group_norm_silu", "diffusion.norm_scale_shift",
                                     "diffusion.residual_gate_add", "diffusion.timestep_embedding"};

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
      auto h = resolve(c.op, kCpu, dt);
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

class GpuDiffusionKernels : public test::GpuTest {};

// The CUDA kernel on poisoned outputs against the CPU reference on the same inputs.
void check_on_gpu(const Case& c, DType dt, uint64_t seed) {
  SCOPED_TRACE(c.op + " " + c.label + " " + std::string(dtype_name(dt)));
  auto cuda = resolve(c.op, kGpu, dt);
  ASSERT_TRUE(cuda.ok()) << cuda.status().message();
  auto cpu = resolve(c.op, kCpu, dt);
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

// The launch shapes chosen by call size, on both sides of each switch (the thresholds
// assume 132 SMs of 2048 threads; the results must not depend on which side a call is):
// norm_scale_shift's block per row for few rows (bf16/f16 H = 3072: up to 660 rows, f32:
// 264; H = 8192 and 16384: one and two vectors a lane) against a warp per row;
// timestep_embedding's one frequency a thread (N * dim/2 <= 270336) against four.
TEST_F(GpuDiffusionKernels, LaunchShapesOnBothSidesOfTheSizeSwitches) {
  std::vector<Case> cs;
  for (auto [b, s, h] : std::vector<std::array<int64_t, 3>>{{1, 16, 3072},
                                                            {1, 660, 3072},
                                                            {1, 661, 3072},
                                                            {2, 132, 3072},
                                                            {1, 265, 3072},
                                                            {3, 5, 8192},
                                                            {1, 133, 8192},
                                                            {2, 3, 16384},
                                                            {1, 7, 4096},
                                                            {1, 529, 4096},
                                                            {4, 9, 512}}) {
    cs.push_back(norm_scale_shift_case(b, s, h, false, false, 0));
    cs.push_back(norm_scale_shift_case(b, s, h, true, true, 3));
  }
  // The staged kernel ([B,H] modulation, rows of 257..384 16-byte vectors, S % 32 == 0,
  // at least 132 * 3 * 32 = 12672 rows) and its neighbours: just below the row count,
  // S not a multiple of 32, per-token shift, and the affine forms (weight, bias, both).
  for (auto [b, s, h, shift_tok, affine] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, bool, int>>{{2, 6336, 3072, false, 0},
                                                                     {2, 6336, 3072, false, 1},
                                                                     {2, 6336, 3072, false, 2},
                                                                     {3, 4224, 2056, false, 3},
                                                                     {2, 6336, 1536, false, 3},
                                                                     {1, 12640, 3072, false, 0},
                                                                     {1, 12680, 3072, false, 0},
                                                                     {2, 6336, 3072, true, 0}}) {
    cs.push_back(norm_scale_shift_case(b, s, h, false, shift_tok, affine));
  }
  for (auto [n, dim] : std::vector<std::pair<int64_t, int64_t>>{
           {2, 320}, {16, 256}, {1056, 512}, {1057, 512}, {600, 1024}, {3, 1023}, {1, 641}}) {
    cs.push_back(timestep_embedding_case(n, dim, false, 1.0, 1.0, 10000, true));
    cs.push_back(timestep_embedding_case(n, dim, true, 0.0, 1000.0, 100, false));
  }
  uint64_t seed = 5000;
  for (const Case& c : cs) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) check_on_gpu(c, dt, seed++);
  }
}

TEST_F(GpuDiffusionKernels, MisalignedViews) {
  // Every tensor one element into its allocation: no 16-byte vectors anywhere.
  for (const Case& c :
       {residual_gate_add_case(2, 3, 4096, false), residual_gate_add_case(2, 3, 4096, true),
        norm_scale_shift_case(2, 3, 3072, false, true, 1), group_norm_silu_case({2, 64, 8, 8}, 32),
        timestep_embedding_case(5, 1024, true, 0.0, 1.0, 10000, true),
        timestep_embedding_case(600, 1024, false, 1.0, 1.0, 10000, true)}) {
    SCOPED_TRACE(c.op + " " + c.label + " misaligned");
    const DType dt = DType::kBF16;
    auto cuda = resolve(c.op, kGpu, dt);
    auto cpu = resolve(c.op, kCpu, dt);
    ASSERT_TRUE(cuda.ok() && cpu.ok());
    Built host = build(c, dt, 77);
    std::vector<Buffer> padded;
    std::vector<DLTensor> views;
    for (const Buffer& b : host.buffers) {
      auto p = Buffer::make(kGpu, b.dtype(), {b.numel() + 1});
      ASSERT_TRUE(p.ok());
      auto v = values(b);
      v.insert(v.begin(), 0.5);
      ASSERT_TRUE(p->from_doubles(v).ok());
      DLTensor t = *b.tensor();
      t.device = kGpu;
      t.data = p->tensor()->data;
      t.byte_offset = dtype_size(b.dtype());
      views.push_back(t);
      padded.push_back(std::move(p).value());
    }
    std::vector<DLTensor*> ptrs;
    for (size_t i = 0; i < views.size(); ++i) {
      ptrs.push_back(host.tensors[i] == nullptr ? nullptr : &views[i]);
    }
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

// With KREG_LAUNCH_PDL a kernel may start before the one it follows has finished. A chain
// whose every link reads the previous link's output (a diffusion block's order: group norm,
// modulation, gated residual, the timestep embedding of values the gate wrote, and back)
// must give bit for bit what it gives with plain launches. group_norm_silu takes its
// cluster two-pass path here (groups of 4096 vectors), with the PDL and cluster attributes
// on one launch; timestep_embedding computes its frequencies before the wait and must still
// read t after it.
TEST_F(GpuDiffusionKernels, PdlChainsReadWhatTheKernelBeforeWrote) {
  const DType dt = DType::kBF16;
  const std::vector<int64_t> nchw{2, 256, 64, 64};  // G = 32: groups of 32768 elements
  const int64_t B = 2, S = 1024, H = 1024, N = 64, dim = 320;
  const Case gns = group_norm_silu_case(nchw, 32);
  const Case nss = norm_scale_shift_case(B, S, H, false, false, 0);
  const Case rga = residual_gate_add_case(B, S, H, false);
  const Case ts = timestep_embedding_case(N, dim, false, 1.0, 1.0, 10000, false);
  std::vector<KernelHandle> h;
  for (const Case* c : {&gns, &nss, &rga, &ts}) {
    auto r = resolve(c->op, kGpu, dt);
    ASSERT_TRUE(r.ok()) << r.status().message();
    h.push_back(*r);
  }
  // x -> gns -> g; g as [B,S,H] -> nss -> n; (n, g) -> rga -> r; r's first N values -> ts
  // -> e; r as NCHW -> gns -> x.
  auto run_chain = [&](uint64_t flags) {
    Built dgns = to_device(build(gns, dt, 11)), dnss = to_device(build(nss, dt, 12));
    Built drga = to_device(build(rga, dt, 13)), dts = to_device(build(ts, dt, 14));
    DLTensor* x = dgns.tensors[0];
    DLTensor* g = dgns.tensors[3];
    DLTensor* n = dnss.tensors[5];
    DLTensor* r = drga.tensors[3];
    int64_t bsh[3] = {B, S, H}, n1[1] = {N};
    DLTensor g_bsh = *g, r_nchw = *r, r_t = *r;
    g_bsh.ndim = 3;
    g_bsh.shape = bsh;
    r_nchw.ndim = 4;
    r_nchw.shape = const_cast<int64_t*>(nchw.data());
    r_t.ndim = 1;
    r_t.shape = n1;
    auto call = [&](size_t op, const Case& c, std::vector<DLTensor*> t) {
      auto attrs = h[op].attrs(c.attrs);
      ASSERT_TRUE(attrs.ok());
      Status st = h[op].call(t, attrs->view(), CallOptions{nullptr, nullptr, flags});
      EXPECT_TRUE(st.ok()) << c.op << ": " << st.message();
    };
    for (int i = 0; i < 3; ++i) {
      call(0, gns, {x, dgns.tensors[1], dgns.tensors[2], g});
      call(1, nss, {&g_bsh, dnss.tensors[1], dnss.tensors[2], nullptr, nullptr, n});
      call(2, rga, {n, &g_bsh, drga.tensors[2], r});
      call(3, ts, {&r_t, dts.tensors[1]});
      call(0, gns, {&r_nchw, dgns.tensors[1], dgns.tensors[2], x});
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{bytes_of(dgns.buffers[0]), bytes_of(dgns.buffers[3]),
                                             bytes_of(dnss.buffers[5]), bytes_of(drga.buffers[3]),
                                             bytes_of(dts.buffers[1])};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

TEST_F(GpuDiffusionKernels, EmptyTensorsAndCpuTensorsToTheCudaPath) {
  for (const Case& c :
       {residual_gate_add_case(0, 4, 64, false), residual_gate_add_case(2, 0, 64, true)}) {
    auto cuda = resolve(c.op, kGpu, DType::kBF16);
    ASSERT_TRUE(cuda.ok());
    Built dev = to_device(build(c, DType::kBF16, 3));
    Status st = run(*cuda, c, dev);
    EXPECT_TRUE(st.ok()) << c.op << " " << c.label << ": " << st.message();
    EXPECT_TRUE(harness::device_synchronize().ok());
  }
  const Case c = residual_gate_add_case(1, 2, 8, false);
  auto cuda = resolve(c.op, kGpu, DType::kF32);
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
  auto h = resolve(c.op, kCpu, dt);
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
  {
    Case c = norm_scale_shift_case(2, 3, 8, false, false, 0);
    c.args[1].shape = {2, 3};
    expect_refused(c, DType::kBF16,
                   "argument 'scale' has shape [2,3], expected [B,H] = [2,8] or [B,S,H]");
  }
  {
    Case c = norm_scale_shift_case(2, 3, 8, true, true, 3);
    c.args[2].shape = {1, 2, 3, 8};
    expect_refused(c, DType::kBF16, "argument 'shift' has shape [1,2,3,8]");
  }
  {
    Case c = norm_scale_shift_case(2, 3, 8, true, true, 3);
    c.args[3].shape = {9};
    expect_refused(c, DType::kF16, "'weight'");
  }
  {
    Case c = timestep_embedding_case(4, 8, false, 1.0, 1.0, 10000, false);
    c.attrs[0].value = int64_t{9};
    expect_refused(c, DType::kF32,
                   "attribute 'dim' = 9 must equal the width of argument 'out' (8)");
  }
  {
    Case c = timestep_embedding_case(4, 8, false, 4.0, 1.0, 10000, false);
    expect_refused(c, DType::kF32, "attribute 'downscale_freq_shift' = 4 must differ from dim / 2");
  }
  {
    Case c = timestep_embedding_case(4, 8, false, 1.0, 1.0, 0, false);
    expect_refused(c, DType::kF32, "attribute 'max_period' = 0 must be >= 1");
  }
  {
    Case c = timestep_embedding_case(4, 8, false, 1.0, 1.0, 10000, false);
    c.args[1].dtype = DType::kBF16;
    expect_refused(c, DType::kF32, "'out'");
  }
  {
    Case c = group_norm_silu_case({2, 8, 4}, 3);
    expect_refused(c, DType::kF32, "attribute 'num_groups' = 3 must be >= 1 and divide C = 8");
  }
  {
    Case c = group_norm_silu_case({2, 8, 4}, 0);
    expect_refused(c, DType::kF32, "attribute 'num_groups' = 0");
  }
  {
    Case c = group_norm_silu_case({2, 8, 4}, 2);
    c.args[0].shape = {8};
    c.args[3].shape = {8};
    expect_refused(c, DType::kF32, "argument 'x' has shape [8], expected rank >= 2");
  }
  {
    Case c = group_norm_silu_case({2, 8, 4}, 2);
    c.args[3].shape = {2, 8, 5};
    expect_refused(c, DType::kF32, "argument 'out' has shape [2,8,5], expected [2,8,4]");
  }
  {
    Case c = group_norm_silu_case({2, 8, 4}, 2);
    c.args[2].shape = {4};
    expect_refused(c, DType::kBF16, "argument 'bias' (tensor 3 of 4) has shape [4]");
  }
}

}  // namespace
}  // namespace kreg
