// The attention group: the CPU references against independent double-precision oracles
// written here, every CUDA implementation against its CPU reference over a shape sweep
// with awkward sizes (skipped without a GPU), and bad arguments rejected with messages
// that name the argument. Index inputs (positions, block tables, lengths) are generated
// valid; the out-of-range behaviour is tested on purpose, separately.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <functional>
#include <numeric>
#include <random>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

using harness::Buffer;

using namespace test;  // kernel_test.hpp

// ---- Building inputs ----

// One call's arguments on the CPU: tensors in signature order, named attributes.
struct Call {
  std::string label;
  std::vector<Buffer> buffers;
  std::vector<NamedAttr> attrs;
  std::vector<DLTensor*> tensors() {
    std::vector<DLTensor*> t;
    for (Buffer& b : buffers) t.push_back(b.tensor());
    return t;
  }
  int64_t int_attr(const std::string& name) const {
    for (const auto& a : attrs) {
      if (a.name == name) return std::get<int64_t>(a.value);
    }
    ADD_FAILURE() << "no attribute " << name;
    return 0;
  }
  double float_attr(const std::string& name) const {
    for (const auto& a : attrs) {
      if (a.name == name) return std::get<double>(a.value);
    }
    ADD_FAILURE() << "no attribute " << name;
    return 0;
  }
  bool bool_attr(const std::string& name) const {
    for (const auto& a : attrs) {
      if (a.name == name) return std::get<bool>(a.value);
    }
    ADD_FAILURE() << "no attribute " << name;
    return false;
  }
};

Buffer make_buffer(DType dt, std::vector<int64_t> shape) {
  auto b = Buffer::make(DLDevice{kDLCPU, 0}, dt, std::move(shape));
  EXPECT_TRUE(b.ok()) << b.status().message();
  return std::move(b).value();
}

// Random non-zero floats (uniform in +-[0.05, 2]).
Buffer random_buffer(DType dt, std::vector<int64_t> shape, std::mt19937_64& rng) {
  Buffer b = make_buffer(dt, std::move(shape));
  EXPECT_TRUE(b.fill_random(rng).ok());
  return b;
}

Buffer values_buffer(DType dt, std::vector<int64_t> shape, const std::vector<double>& v) {
  Buffer b = make_buffer(dt, std::move(shape));
  EXPECT_TRUE(b.from_doubles(v).ok());
  return b;
}

Buffer poisoned_buffer(DType dt, std::vector<int64_t> shape) {
  Buffer b = make_buffer(dt, std::move(shape));
  EXPECT_TRUE(b.poison().ok());
  return b;
}

// A cos/sin cache as models build it: row p = [cos(p f_i)..., sin(p f_i)...].
Buffer cos_sin_cache(int64_t max_pos, int64_t rotary_dim) {
  std::vector<double> v(at(max_pos * rotary_dim));
  const int64_t half = rotary_dim / 2;
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::pow(10000.0, -2.0 * static_cast<double>(i) / rotary_dim);
      v[at(p * rotary_dim + i)] = std::cos(static_cast<double>(p) * f);
      v[at(p * rotary_dim + half + i)] = std::sin(static_cast<double>(p) * f);
    }
  }
  return values_buffer(DType::kF32, {max_pos, rotary_dim}, v);
}

std::vector<double> random_positions(int64_t n, int64_t max_pos, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> dist(0, max_pos - 1);
  std::vector<double> v(at(n));
  for (double& x : v) x = static_cast<double>(dist(rng));
  return v;
}

Call concat_call(DType dt, int64_t tokens, int64_t heads, std::mt19937_64& rng) {
  Call c;
  c.label = "T=" + std::to_string(tokens) + " H=" + std::to_string(heads);
  c.buffers.push_back(random_buffer(dt, {tokens, heads, 128}, rng));
  c.buffers.push_back(random_buffer(dt, {tokens, 1, 64}, rng));
  c.buffers.push_back(poisoned_buffer(dt, {tokens, heads, 192}));
  return c;
}

Call mrope_call(DType dt, int64_t seq, int64_t dim, std::array<int64_t, 3> sections,
                std::mt19937_64& rng) {
  Call c;
  c.label = "S=" + std::to_string(seq) + " D=" + std::to_string(dim) +
            " sections=" + std::to_string(sections[0]) + "," + std::to_string(sections[1]) + "," +
            std::to_string(sections[2]);
  c.buffers.push_back(random_buffer(dt, {3, seq, dim}, rng));
  c.buffers.push_back(poisoned_buffer(dt, {seq, dim}));
  c.attrs = {{"section_t", sections[0]}, {"section_h", sections[1]}, {"section_w", sections[2]}};
  return c;
}

Call rope_call(DType dt, int64_t tokens, int64_t hq, int64_t hk, int64_t dim, int64_t rotary,
               bool neox, DType pos_dtype, std::mt19937_64& rng) {
  Call c;
  c.label = "T=" + std::to_string(tokens) + " Hq=" + std::to_string(hq) +
            " Hk=" + std::to_string(hk) + " D=" + std::to_string(dim) +
            " R=" + std::to_string(rotary) + (neox ? " neox " : " gptj ") +
            std::string(dtype_name(pos_dtype));
  const int64_t max_pos = 257;
  c.buffers.push_back(random_buffer(dt, {tokens, hq, dim}, rng));
  c.buffers.push_back(random_buffer(dt, {tokens, hk, dim}, rng));
  c.buffers.push_back(cos_sin_cache(max_pos, rotary));
  c.buffers.push_back(values_buffer(pos_dtype, {tokens}, random_positions(tokens, max_pos, rng)));
  c.attrs = {{"is_neox", neox}};
  return c;
}

Call fused_call(DType dt, int64_t tokens, int64_t nq, int64_t nk, int64_t nv, int64_t hd, bool neox,
                double base, DType pos_dtype, std::mt19937_64& rng) {
  Call c;
  c.label = "T=" + std::to_string(tokens) + " heads=" + std::to_string(nq) + "/" +
            std::to_string(nk) + "/" + std::to_string(nv) + " hd=" + std::to_string(hd) +
            (neox ? " neox" : " gptj") + " base=" + std::to_string(base);
  c.buffers.push_back(random_buffer(dt, {tokens, (nq + nk + nv) * hd}, rng));
  c.buffers.push_back(random_buffer(dt, {hd}, rng));
  c.buffers.push_back(random_buffer(dt, {hd}, rng));
  c.buffers.push_back(values_buffer(pos_dtype, {tokens}, random_positions(tokens, 5000, rng)));
  c.attrs = {{"num_heads_q", nq}, {"num_heads_k", nk}, {"num_heads_v", nv}, {"head_dim", hd},
             {"eps", 1e-6},       {"base", base},      {"is_neox", neox}};
  return c;
}

// Decode inputs: each sequence's pages are distinct random pages of the cache (a few
// spare pages are never referenced); lengths are given (0, mid-page, full).
Call decode_call(DType dt, const std::vector<int64_t>& lens, int64_t hq, int64_t hk, int64_t dim,
                 int64_t page_size, int64_t max_pages, std::mt19937_64& rng) {
  Call c;
  const auto batch = static_cast<int64_t>(lens.size());
  c.label = "B=" + std::to_string(batch) + " Hq=" + std::to_string(hq) +
            " Hk=" + std::to_string(hk) + " D=" + std::to_string(dim) +
            " page=" + std::to_string(page_size) + " max_pages=" + std::to_string(max_pages) +
            " lens=";
  for (int64_t l : lens) c.label += std::to_string(l) + ",";
  const int64_t num_pages = batch * max_pages + 3;
  std::vector<double> pages(at(num_pages));
  std::iota(pages.begin(), pages.end(), 0.0);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(at(batch * max_pages));
  std::vector<double> len_values(lens.begin(), lens.end());
  c.buffers.push_back(random_buffer(dt, {batch, hq, dim}, rng));
  c.buffers.push_back(random_buffer(dt, {num_pages, page_size, hk, dim}, rng));
  c.buffers.push_back(random_buffer(dt, {num_pages, page_size, hk, dim}, rng));
  c.buffers.push_back(values_buffer(DType::kI32, {batch, max_pages}, pages));
  c.buffers.push_back(values_buffer(DType::kI32, {batch}, len_values));
  c.buffers.push_back(poisoned_buffer(dt, {batch, hq, dim}));
  c.attrs = {{"scale", 1.0 / std::sqrt(static_cast<double>(dim))}};
  return c;
}

// ---- Oracles: each op's math in double, from the rounded inputs ----
// An oracle returns the expected contents of every tensor (inputs it does not write are
// returned unchanged and not compared).

using Values = std::vector<std::vector<double>>;
using Oracle = std::function<Values(const Call&, const Values& in)>;

Values concat_oracle(const Call& c, const Values& in) {
  Values out = in;
  const int64_t tokens = c.buffers[2].shape()[0], heads = c.buffers[2].shape()[1];
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < 192; ++i) {
        out[2][at((t * heads + h) * 192 + i)] =
            i < 128 ? in[0][at((t * heads + h) * 128 + i)] : in[1][at(t * 64 + i - 128)];
      }
    }
  }
  return out;
}

Values mrope_oracle(const Call& c, const Values& in) {
  Values out = in;
  const int64_t seq = c.buffers[1].shape()[0], dim = c.buffers[1].shape()[1];
  const int64_t sec_h = c.int_attr("section_h"), sec_w = c.int_attr("section_w");
  // Python's apply_interleaved_rope, literally: x_t = x[0]; x_t[1 : 3*s1 : 3] = x[1][...];
  // x_t[2 : 3*s2 : 3] = x[2][...].
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t i = 0; i < dim; ++i) out[1][at(s * dim + i)] = in[0][at(s * dim + i)];
    for (int64_t i = 1; i < std::min(dim, 3 * sec_h); i += 3) {
      out[1][at(s * dim + i)] = in[0][at((seq + s) * dim + i)];
    }
    for (int64_t i = 2; i < std::min(dim, 3 * sec_w); i += 3) {
      out[1][at(s * dim + i)] = in[0][at((2 * seq + s) * dim + i)];
    }
  }
  return out;
}

// Rotates pairs as complex numbers: (a + ib) (cos + i sin).
void rotate(std::vector<double>& x, int64_t base, int64_t rotary, bool neox,
            const std::function<std::complex<double>(int64_t)>& rot) {
  const int64_t half = rotary / 2;
  for (int64_t i = 0; i < half; ++i) {
    const size_t ia = at(base + (neox ? i : 2 * i));
    const size_t ib = at(base + (neox ? i + half : 2 * i + 1));
    const std::complex<double> z = std::complex<double>(x[ia], x[ib]) * rot(i);
    x[ia] = z.real();
    x[ib] = z.imag();
  }
}

Values rope_oracle(const Call& c, const Values& in) {
  Values out = in;
  const bool neox = c.bool_attr("is_neox");
  const int64_t tokens = c.buffers[0].shape()[0], dim = c.buffers[0].shape()[2];
  const int64_t rotary = c.buffers[2].shape()[1];
  for (int64_t t = 0; t < tokens; ++t) {
    const auto pos = static_cast<int64_t>(in[3][at(t)]);
    auto rot = [&](int64_t i) {
      return std::complex<double>(in[2][at(pos * rotary + i)],
                                  in[2][at(pos * rotary + rotary / 2 + i)]);
    };
    for (size_t x : {size_t{0}, size_t{1}}) {
      const int64_t heads = c.buffers[x].shape()[1];
      for (int64_t h = 0; h < heads; ++h) rotate(out[x], (t * heads + h) * dim, rotary, neox, rot);
    }
  }
  return out;
}

Values fused_oracle(const Call& c, const Values& in) {
  Values out = in;
  const int64_t nq = c.int_attr("num_heads_q"), nk = c.int_attr("num_heads_k");
  const int64_t hd = c.int_attr("head_dim");
  const double base = c.float_attr("base");
  const bool neox = c.bool_attr("is_neox");
  const int64_t tokens = c.buffers[0].shape()[0], width = c.buffers[0].shape()[1];
  const double eps = static_cast<double>(static_cast<float>(c.float_attr("eps")));
  for (int64_t t = 0; t < tokens; ++t) {
    // The contract: inv_freq and the angle are fp32 values.
    const auto pos = static_cast<float>(in[3][at(t)]);
    auto rot = [&](int64_t i) {
      const auto inv_freq = static_cast<float>(std::pow(base, -2.0 * static_cast<double>(i) / hd));
      return std::polar(1.0, static_cast<double>(pos * inv_freq));
    };
    for (int64_t h = 0; h < nq + nk; ++h) {
      const int64_t start = t * width + h * hd;
      const auto& w = h < nq ? in[1] : in[2];
      double mean_sq = 0;
      for (int64_t i = 0; i < hd; ++i) mean_sq += in[0][at(start + i)] * in[0][at(start + i)];
      mean_sq /= static_cast<double>(hd);
      for (int64_t i = 0; i < hd; ++i) {
        out[0][at(start + i)] = in[0][at(start + i)] / std::sqrt(mean_sq + eps) * w[at(i)];
      }
      rotate(out[0], start, hd, neox, rot);
    }
  }
  return out;
}

// Gathers each sequence's K and V rows from its pages, then softmax(scale q K^T) V.
// Lengths beyond the table are clamped and tokens on out-of-range pages are skipped: the
// CUDA kernel's documented behaviour (the CPU reference refuses such inputs instead).
Values decode_oracle(const Call& c, const Values& in) {
  Values out = in;
  const auto& qs = c.buffers[0].shape();
  const auto& cs = c.buffers[1].shape();
  const int64_t batch = qs[0], hq = qs[1], dim = qs[2];
  const int64_t num_pages = cs[0], page_size = cs[1], hk = cs[2];
  const int64_t max_pages = c.buffers[3].shape()[1];
  const double scale = c.float_attr("scale");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len =
        std::clamp(static_cast<int64_t>(in[4][at(b)]), int64_t{0}, max_pages * page_size);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / (hq / hk);
      std::vector<std::vector<double>> keys, vals;
      for (int64_t j = 0; j < len; ++j) {
        const auto page = static_cast<int64_t>(in[3][at(b * max_pages + j / page_size)]);
        if (page < 0 || page >= num_pages) continue;
        const int64_t row = ((page * page_size + j % page_size) * hk + kh) * dim;
        keys.emplace_back(in[1].begin() + row, in[1].begin() + row + dim);
        vals.emplace_back(in[2].begin() + row, in[2].begin() + row + dim);
      }
      std::vector<double> logits;
      for (const auto& k : keys) {
        double dot = 0;
        for (int64_t d = 0; d < dim; ++d) dot += in[0][at((b * hq + h) * dim + d)] * k[at(d)];
        logits.push_back(dot * scale);
      }
      const double mx = logits.empty() ? 0.0 : *std::max_element(logits.begin(), logits.end());
      double denom = 0;
      for (double& l : logits) denom += (l = std::exp(l - mx));
      for (int64_t d = 0; d < dim; ++d) {
        double acc = 0;
        for (size_t j = 0; j < vals.size(); ++j) acc += logits[j] * vals[j][at(d)];
        out[5][at((b * hq + h) * dim + d)] = vals.empty() ? 0.0 : acc / denom;
      }
    }
  }
  return out;
}

// ---- The sweeps ----

struct OpCase {
  const char* op;
  std::vector<DType> dtypes;
  Oracle oracle;
  // The calls of the sweep for one dtype.
  std::function<std::vector<Call>(DType, std::mt19937_64&)> sweep;
};

std::vector<OpCase> op_cases() {
  const std::vector<DType> all = {DType::kF32, DType::kBF16, DType::kF16};
  const std::vector<DType> half = {DType::kBF16, DType::kF16};
  return {
      {"attention.concat_mla_k", all, concat_oracle,
       [](DType dt, std::mt19937_64& rng) {
         std::vector<Call> calls;
         for (int64_t t : {1, 3, 17}) {
           for (int64_t h : {1, 3, 16, 128}) calls.push_back(concat_call(dt, t, h, rng));
         }
         return calls;
       }},
      {"attention.mrope_interleave", all, mrope_oracle,
       [](DType dt, std::mt19937_64& rng) {
         std::vector<Call> calls;
         const std::array<int64_t, 3> sections[] = {
             {24, 20, 20}, {16, 24, 24}, {0, 0, 0}, {3, 1, 40}, {10, 5, 0}};
         for (int64_t s : {1, 5, 37}) {
           for (int64_t d : {1, 7, 64, 100, 128}) {
             for (const auto& sec : sections) calls.push_back(mrope_call(dt, s, d, sec, rng));
           }
         }
         return calls;
       }},
      {"attention.rope", all, rope_oracle,
       [](DType dt, std::mt19937_64& rng) {
         std::vector<Call> calls;
         // GPT-J's fast paths: rotary_dim a multiple of two words (128, 80, 32) and of one
         // only (48 -> 24 in 16-bit types).
         const std::array<int64_t, 2> dims[] = {{128, 128}, {128, 64}, {64, 64}, {7, 6},   {10, 4},
                                                {256, 256}, {80, 80},  {96, 32}, {48, 24}, {2, 2}};
         const std::array<int64_t, 2> heads[] = {{1, 1}, {4, 1}, {32, 8}, {3, 5}};
         for (int64_t t : {1, 3, 19}) {
           for (const auto& hh : heads) {
             for (const auto& dr : dims) {
               for (bool neox : {true, false}) {
                 calls.push_back(rope_call(dt, t, hh[0], hh[1], dr[0], dr[1], neox,
                                           t == 3 ? DType::kI64 : DType::kI32, rng));
               }
             }
           }
         }
         return calls;
       }},
      {"attention.fused_qk_norm_rope", half, fused_oracle,
       [](DType dt, std::mt19937_64& rng) {
         std::vector<Call> calls;
         // q + k heads for every register class of the hd = 128 half-warp kernel (8 half
         // warps: 1, 2, 4, 5, 8 or 10 heads each) and past it (88: the warp-per-head kernel).
         const std::array<int64_t, 3> heads[] = {{1, 1, 1},  {32, 8, 8}, {5, 3, 2},
                                                 {16, 0, 4}, {0, 2, 1},  {12, 12, 0},
                                                 {56, 8, 8}, {64, 8, 8}, {80, 8, 0}};
         for (int64_t t : {1, 3, 19}) {
           for (const auto& h : heads) {
             for (int64_t hd : {64, 128, 256}) {
               for (bool neox : {true, false}) {
                 calls.push_back(fused_call(dt, t, h[0], h[1], h[2], hd, neox, neox ? 10000.0 : 1e6,
                                            t == 3 ? DType::kI64 : DType::kI32, rng));
               }
             }
           }
         }
         return calls;
       }},
      {"attention.decode", half, decode_oracle,
       [](DType dt, std::mt19937_64& rng) {
         std::vector<Call> calls;
         struct Heads {
           int64_t q, k;
         };
         // GQA groups 1, 4, 3 (odd: one-head chunks), 8 and 16 (two chunks of 8).
         const Heads heads[] = {{1, 1}, {4, 1}, {6, 2}, {8, 1}, {32, 2}};
         for (int64_t dim : {64, 128, 256}) {
           for (const Heads& h : heads) {
             // Short table: one split, tokens ending mid-page, an empty sequence.
             calls.push_back(decode_call(dt, {0, 1, 17, 40}, h.q, h.k, dim, 16, 3, rng));
             // Long table: several splits and tiles; page size 5 ends pages off tiles.
             calls.push_back(decode_call(dt, {1100, 0, 333}, h.q, h.k, dim, 5, 230, rng));
           }
           calls.push_back(decode_call(dt, {7}, 1, 1, dim, 1, 9, rng));
           calls.push_back(decode_call(dt, {600, 601}, 8, 2, dim, 16, 40, rng));
         }
         return calls;
       }},
  };
}

TEST(AttentionKernels, EveryShippedOpHasAnOracleHere) {
  std::vector<std::string> covered;
  for (const auto& c : op_cases()) covered.push_back(c.op);
  std::sort(covered.begin(), covered.end());
  std::vector<std::string> shipped;
  for (const std::string& id : registry().op_ids()) {
    if (id.starts_with("attention.")) shipped.push_back(id);
  }
  EXPECT_EQ(shipped, covered) << "a new op needs an oracle in this file";
}

// The tensors a signature writes, by index among its tensors.
std::vector<size_t> written_tensors(const KernelSpec& spec) {
  std::vector<size_t> w;
  size_t i = 0;
  for (const Param& p : spec.signature.params) {
    if (!p.is_tensor()) continue;
    if (p.written()) w.push_back(i);
    ++i;
  }
  return w;
}

void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, harness::Tolerance tol) {
  const auto cmp = harness::compare_values(what, got, want, tol);
  EXPECT_TRUE(cmp.ok()) << what << ": " << cmp.mismatches << "/" << cmp.count
                        << " mismatches, max_abs " << cmp.max_abs << ", max_rel " << cmp.max_rel;
}

TEST(AttentionKernels, CpuReferencesMatchTheOracle) {
  std::mt19937_64 rng(5);
  for (const OpCase& c : op_cases()) {
    for (DType dt : c.dtypes) {
      auto h = registry().resolve(c.op, Target{DLDevice{kDLCPU, 0}, dt}, {std::string("cpu")});
      ASSERT_TRUE(h.ok()) << h.status().message();
      for (Call& call : c.sweep(dt, rng)) {
        SCOPED_TRACE(std::string(c.op) + " " + std::string(dtype_name(dt)) + " " + call.label);
        Values in;
        for (const Buffer& b : call.buffers) in.push_back(values(b));
        const Values want = c.oracle(call, in);
        auto attrs = h->attrs(call.attrs);
        ASSERT_TRUE(attrs.ok()) << attrs.status().message();
        const Status st = h->call(call.tensors(), attrs->view());
        ASSERT_TRUE(st.ok()) << st.message();
        for (size_t i : written_tensors(h->spec())) {
          expect_close(h->spec().signature.tensor(static_cast<int>(i)).name,
                       values(call.buffers[i]), want[i], harness::tolerance_for(dt));
        }
      }
    }
  }
}

class AttentionGpu : public test::GpuTest {};

// Device copies of a call's buffers, as views starting `offset_elems` elements into
// their allocations (1 defeats every vector width); write-only outputs re-poisoned.
struct DeviceCall {
  std::vector<Buffer> storage;
  std::vector<DLTensor> views;
  std::vector<DLTensor*> tensors() {
    std::vector<DLTensor*> t;
    for (DLTensor& v : views) t.push_back(&v);
    return t;
  }
};

DeviceCall to_device(const Call& call, int64_t offset_elems) {
  DeviceCall d;
  for (const Buffer& b : call.buffers) {
    auto p = Buffer::make(DLDevice{kDLCUDA, 0}, b.dtype(), {b.numel() + offset_elems});
    EXPECT_TRUE(p.ok()) << p.status().message();
    std::vector<double> v = values(b);
    v.insert(v.begin(), static_cast<size_t>(offset_elems), 0.5);
    EXPECT_TRUE(p->from_doubles(v).ok());
    d.storage.push_back(std::move(p).value());
  }
  for (size_t i = 0; i < call.buffers.size(); ++i) {
    DLTensor t = *call.buffers[i].tensor();
    t.device = DLDevice{kDLCUDA, 0};
    t.data = d.storage[i].tensor()->data;
    t.byte_offset = static_cast<uint64_t>(offset_elems) * dtype_size(call.buffers[i].dtype());
    d.views.push_back(t);
  }
  return d;
}

std::vector<double> device_values(const DeviceCall& d, size_t i, int64_t offset_elems) {
  std::vector<double> v = values(d.storage[i]);
  v.erase(v.begin(), v.begin() + offset_elems);
  return v;
}

// Runs the CUDA implementation on device copies and the CPU reference on the host
// buffers, then compares every written tensor.
void check_gpu_against_cpu(const OpCase& c, DType dt, Call& call, int64_t offset_elems) {
  SCOPED_TRACE(std::string(c.op) + " " + std::string(dtype_name(dt)) + " " + call.label +
               " offset=" + std::to_string(offset_elems));
  auto gpu = registry().resolve(c.op, Target{DLDevice{kDLCUDA, 0}, dt}, {std::string("cuda")});
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  auto cpu = registry().resolve(c.op, Target{DLDevice{kDLCPU, 0}, dt}, {std::string("cpu")});
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  auto attrs = gpu->attrs(call.attrs);
  ASSERT_TRUE(attrs.ok()) << attrs.status().message();
  DeviceCall d = to_device(call, offset_elems);
  Status st = gpu->call(d.tensors(), attrs->view());
  ASSERT_TRUE(st.ok()) << st.message();
  st = harness::device_synchronize();
  ASSERT_TRUE(st.ok()) << st.message();
  st = cpu->call(call.tensors(), attrs->view());
  ASSERT_TRUE(st.ok()) << st.message();
  for (size_t i : written_tensors(gpu->spec())) {
    expect_close(gpu->spec().signature.tensor(static_cast<int>(i)).name,
                 device_values(d, i, offset_elems), values(call.buffers[i]),
                 harness::tolerance_for(dt));
  }
}

TEST_F(AttentionGpu, MatchTheCpuReferenceOverAShapeSweep) {
  std::mt19937_64 rng(6);
  for (const OpCase& c : op_cases()) {
    for (DType dt : c.dtypes) {
      for (Call& call : c.sweep(dt, rng)) check_gpu_against_cpu(c, dt, call, 0);
    }
  }
}

TEST_F(AttentionGpu, LargeShapes) {
  std::mt19937_64 rng(8);
  const auto cases = op_cases();
  auto find = [&](const char* op) -> const OpCase& {
    return *std::find_if(cases.begin(), cases.end(),
                         [&](const OpCase& c) { return std::string(c.op) == op; });
  };
  const DType bf = DType::kBF16;
  Call concat = concat_call(bf, 300, 128, rng);
  check_gpu_against_cpu(find("attention.concat_mla_k"), bf, concat, 0);
  Call mrope = mrope_call(bf, 2000, 64, {16, 24, 24}, rng);
  check_gpu_against_cpu(find("attention.mrope_interleave"), bf, mrope, 0);
  Call rope = rope_call(bf, 600, 32, 8, 128, 128, true, DType::kI64, rng);
  check_gpu_against_cpu(find("attention.rope"), bf, rope, 0);
  Call fused = fused_call(bf, 600, 32, 8, 8, 128, true, 1e6, DType::kI32, rng);
  check_gpu_against_cpu(find("attention.fused_qk_norm_rope"), bf, fused, 0);
  std::vector<int64_t> lens;
  for (int i = 0; i < 16; ++i) lens.push_back(4096 - 37 * i);
  Call decode = decode_call(bf, lens, 32, 8, 128, 16, 256, rng);
  check_gpu_against_cpu(find("attention.decode"), bf, decode, 0);
}

// The split counts decode picks from the SM count: many short splits for one sequence
// with a long table (B=1: up to 128 splits of 64+ tokens), far more splits than a short
// sequence can fill (empty splits in the merge), ragged batches with empty and length-1
// sequences next to long ones, groups of 8 and 12 (blocks take chunks of up to 8 heads).
TEST_F(AttentionGpu, DecodeSplitRegimes) {
  std::mt19937_64 rng(14);
  const auto cases = op_cases();
  const OpCase& c = *std::find_if(cases.begin(), cases.end(), [](const OpCase& oc) {
    return std::string(oc.op) == "attention.decode";
  });
  for (DType dt : {DType::kBF16, DType::kF16}) {
    // Llama-3-8B heads, one long sequence: tens of splits.
    Call one = decode_call(dt, {16384}, 32, 8, 128, 16, 1024, rng);
    check_gpu_against_cpu(c, dt, one, 0);
    // One kv head, 8192-token table: the split count at its maximum (128), all used.
    Call full = decode_call(dt, {8192}, 4, 1, 128, 16, 512, rng);
    check_gpu_against_cpu(c, dt, full, 0);
    // The same split count for 100 tokens: most splits see no token.
    Call sparse = decode_call(dt, {100}, 4, 1, 128, 16, 1024, rng);
    check_gpu_against_cpu(c, dt, sparse, 0);
    // Ragged: empty and length-1 sequences among long ones.
    Call ragged = decode_call(dt, {0, 1, 4000, 17, 0, 1, 2500, 64}, 32, 8, 128, 16, 256, rng);
    check_gpu_against_cpu(c, dt, ragged, 0);
    // Llama-3-70B heads (group 8), ragged.
    Call g8 = decode_call(dt, {3000, 1, 0, 777}, 64, 8, 128, 16, 200, rng);
    check_gpu_against_cpu(c, dt, g8, 0);
    // Group 12: a full chunk of 8 heads and a chunk of 4; pages of 16 and of 1 token (one
    // table read a tile, one a row).
    for (int64_t page : {16, 1}) {
      Call g12 = decode_call(dt, {2100, 0, 15, 16, 17}, 24, 2, 128, page, 2200 / page, rng);
      check_gpu_against_cpu(c, dt, g12, 0);
    }
  }
  // The other head sizes with many splits; page 7 ends pages off tiles.
  for (int64_t dim : {64, 256}) {
    Call call = decode_call(DType::kBF16, {5000, 0, 1}, 8, 1, dim, 7, 800, rng);
    check_gpu_against_cpu(c, DType::kBF16, call, 0);
  }
}

TEST_F(AttentionGpu, MisalignedViewsTakeTheScalarPaths) {
  std::mt19937_64 rng(9);
  for (const OpCase& c : op_cases()) {
    if (std::string(c.op) == "attention.decode") continue;  // requires alignment: below
    for (DType dt : c.dtypes) {
      std::vector<Call> calls = c.sweep(dt, rng);
      // A few calls of each sweep: the largest shapes are at the end.
      for (size_t i = calls.size() > 6 ? calls.size() - 6 : 0; i < calls.size(); ++i) {
        check_gpu_against_cpu(c, dt, calls[i], 1);
      }
    }
  }
}

TEST_F(AttentionGpu, DecodeRefusesMisalignedTensors) {
  std::mt19937_64 rng(10);
  Call call = decode_call(DType::kBF16, {5}, 4, 1, 64, 16, 1, rng);
  auto h = registry().resolve("attention.decode", Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
  ASSERT_TRUE(h.ok());
  auto attrs = h->attrs(call.attrs);
  DeviceCall d = to_device(call, 1);
  const Status st = h->call(d.tensors(), attrs->view());
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.message();
}

TEST_F(AttentionGpu, ZeroTokensLaunchNothing) {
  std::mt19937_64 rng(11);
  std::vector<Call> calls;
  calls.push_back(concat_call(DType::kBF16, 0, 16, rng));
  calls.push_back(mrope_call(DType::kBF16, 0, 64, {24, 20, 20}, rng));
  calls.push_back(rope_call(DType::kBF16, 0, 4, 1, 128, 128, true, DType::kI32, rng));
  calls.push_back(fused_call(DType::kBF16, 0, 4, 1, 1, 128, true, 1e4, DType::kI32, rng));
  const char* ops[] = {"attention.concat_mla_k", "attention.mrope_interleave", "attention.rope",
                       "attention.fused_qk_norm_rope"};
  for (size_t i = 0; i < calls.size(); ++i) {
    auto h = registry().resolve(ops[i], Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
    ASSERT_TRUE(h.ok());
    auto attrs = h->attrs(calls[i].attrs);
    DeviceCall d = to_device(calls[i], 0);
    EXPECT_TRUE(h->call(d.tensors(), attrs->view()).ok()) << ops[i];
  }
  EXPECT_TRUE(harness::device_synchronize().ok());
}

// Out-of-range indices on the device: rope skips the token (rows unchanged); decode clamps
// lengths and skips tokens on out-of-range pages. Nothing outside the tensors is read.
TEST_F(AttentionGpu, OutOfRangeIndicesAreSkippedNotRead) {
  std::mt19937_64 rng(12);
  const auto cases = op_cases();
  {
    Call call = rope_call(DType::kBF16, 4, 4, 2, 128, 128, true, DType::kI64, rng);
    std::vector<double> pos = values(call.buffers[3]);
    pos[1] = 257;        // == max_pos
    pos[2] = -1;         // negative
    pos[3] = 1ll << 40;  // far outside
    ASSERT_TRUE(call.buffers[3].from_doubles(pos).ok());
    auto h = registry().resolve("attention.rope", Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
    ASSERT_TRUE(h.ok());
    auto attrs = h->attrs(call.attrs);
    DeviceCall d = to_device(call, 0);
    ASSERT_TRUE(h->call(d.tensors(), attrs->view()).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    Values in;
    for (const Buffer& b : call.buffers) in.push_back(values(b));
    // Token 0 is valid: the oracle with only token 0 rotated.
    Values want = in;
    {
      Call first = rope_call(DType::kBF16, 1, 4, 2, 128, 128, true, DType::kI64, rng);
      for (size_t i = 0; i < 4; ++i) {
        std::vector<double> v = in[i];
        if (i < 2) v.resize(v.size() / 4);
        if (i == 3) v.resize(1);
        ASSERT_TRUE(first.buffers[i].from_doubles(v).ok());
      }
      Values fin;
      for (const Buffer& b : first.buffers) fin.push_back(values(b));
      const Values rotated = rope_oracle(first, fin);
      for (size_t i = 0; i < 2; ++i) {
        std::copy(rotated[i].begin(), rotated[i].end(), want[i].begin());
      }
    }
    for (size_t i = 0; i < 2; ++i) {
      expect_close(i == 0 ? "q" : "k", device_values(d, i, 0), want[i],
                   harness::tolerance_for(DType::kBF16));
    }
  }
  {
    Call call = decode_call(DType::kBF16, {40, 20, 3}, 8, 2, 128, 16, 3, rng);
    std::vector<double> table = values(call.buffers[3]);
    table[1] = -5;                              // sequence 0, page 1
    table[3] = static_cast<double>(INT32_MAX);  // sequence 1, page 0
    ASSERT_TRUE(call.buffers[3].from_doubles(table).ok());
    std::vector<double> lens = values(call.buffers[4]);
    lens[2] = 1000;  // beyond max_pages * page_size = 48: clamped
    ASSERT_TRUE(call.buffers[4].from_doubles(lens).ok());
    auto h = registry().resolve("attention.decode", Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
    ASSERT_TRUE(h.ok());
    auto attrs = h->attrs(call.attrs);
    DeviceCall d = to_device(call, 0);
    ASSERT_TRUE(h->call(d.tensors(), attrs->view()).ok());
    ASSERT_TRUE(harness::device_synchronize().ok());
    Values in;
    for (const Buffer& b : call.buffers) in.push_back(values(b));
    expect_close("out", device_values(d, 5, 0), decode_oracle(call, in)[5],
                 harness::tolerance_for(DType::kBF16));
  }
}

// Programmatic dependent launch (KREG_LAUNCH_PDL): a kernel may start before the one it
// follows has finished and must wait before reading that kernel's output. A chain whose
// links read the previous link's output, behind a large first rope (so that an early read
// would see stale memory): rope again in place, decode on the first tokens of the rotated
// q, rope once more (rewriting q after decode read it). Bit for bit what the same chain
// gives without PDL, repeated so that a race has chances to show.
TEST_F(AttentionGpu, PdlChainsReadWhatTheKernelBeforeWrote) {
  const int64_t t = 4096, hq = 32, hk = 8, dim = 128;
  std::mt19937_64 rng(16);
  Call rope_host = rope_call(DType::kBF16, t, hq, hk, dim, dim, true, DType::kI64, rng);
  Call dec_host = decode_call(DType::kBF16, {300, 1, 0, 77}, hq, hk, dim, 16, 20, rng);
  auto rope = handle("attention.rope", "cuda");
  auto dec = handle("attention.decode", "cuda");
  auto dec_attrs = dec.attrs(dec_host.attrs);
  ASSERT_TRUE(dec_attrs.ok()) << dec_attrs.status().message();
  DeviceCall rope_in = to_device(rope_host, 0);  // q, k, cache, positions: the start state
  DeviceCall dec_in = to_device(dec_host, 0);
  auto copy = [](const Buffer& b) {
    auto d = Buffer::make(kGpu, b.dtype(), b.shape());
    EXPECT_TRUE(d.ok());
    EXPECT_TRUE(d->copy_from(b).ok());
    return std::move(d).value();
  };
  auto run_chain = [&](uint64_t flags) {
    Buffer q = copy(rope_in.storage[0]), k = copy(rope_in.storage[1]);
    Buffer out = copy(dec_in.storage[5]);
    // The views of to_device (shapes, dtypes) over this run's copies.
    DLTensor qt = rope_in.views[0], kt = rope_in.views[1], dout = dec_in.views[5];
    qt.data = q.tensor()->data;
    kt.data = k.tensor()->data;
    dout.data = out.tensor()->data;
    // Decode's q: the first B tokens of rope's q.
    int64_t dec_q_shape[3] = {4, hq, dim};
    DLTensor dq = qt;
    dq.shape = dec_q_shape;
    const CallOptions first{nullptr, nullptr, 0};
    const CallOptions next{nullptr, nullptr, flags};
    DLTensor* r[] = {&qt, &kt, &rope_in.views[2], &rope_in.views[3]};
    DLTensor* d[] = {&dq,  &dec_in.views[1], &dec_in.views[2], &dec_in.views[3], &dec_in.views[4],
                     &dout};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(rope.call(r, {}, first).ok());
      EXPECT_TRUE(rope.call(r, {}, next).ok());                // reads q, k
      EXPECT_TRUE(dec.call(d, dec_attrs->view(), next).ok());  // reads q
      EXPECT_TRUE(rope.call(r, {}, next).ok());                // rewrites q after decode
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{test::bytes_of(q), test::bytes_of(k),
                                             test::bytes_of(out)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 5);
}

// KREG_LAUNCH_STABLE_INPUTS with PDL: decode's stable inputs are the lengths, the table and
// every cache row but each sequence's newest (token len - 1); only q and the newest rows may
// be the previous kernel's output (docs/kernels.md; decode reads nothing early today, see
// tools/bench/ab/decode_stable_inputs.patch). Here the previous kernel is a large rope over
// q and over a run of cache rows whose last pages hold the newest tokens (lengths are 1
// modulo the page size, so a newest token is alone in its page and rope writes no history
// row); decode's q is rope's last B tokens. An early read of q or of a newest row would see
// the rows before rotation. Bit for bit what the chain gives with plain launches, which
// differs from decode before the last rope (what rope writes counts). Pages of 16 (a tile a
// page) and of 5 (a page per row).
TEST_F(AttentionGpu, StableInputsChainsGiveThePlainResult) {
  const int64_t hq = 32, hk = 8, dim = 128;
  auto rope = handle("attention.rope", "cuda");
  auto dec = handle("attention.decode", "cuda");
  for (const int64_t page : {int64_t{16}, int64_t{5}}) {
    SCOPED_TRACE("page " + std::to_string(page));
    std::mt19937_64 rng(static_cast<uint64_t>(17 + page));
    std::vector<int64_t> lens;
    for (int64_t l : {256, 0, 0, 5, 19, 128, 2, 63}) lens.push_back(l == 0 ? 0 : l * page + 1);
    const auto batch = static_cast<int64_t>(lens.size());
    const int64_t max_pages = 257;      // the longest: 256 pages of history + the newest
    const int64_t spare = 8192 / page;  // pages rope rotates that nobody reads
    // Pages: [0, spare) rope's filler, spare + b the newest page of sequence b, then the
    // history pages, shuffled over the sequences.
    int64_t history = 0;
    for (int64_t l : lens) history += l > 0 ? (l - 1) / page : 0;
    const int64_t num_pages = spare + batch + history;
    std::vector<double> hist_ids(at(history));
    std::iota(hist_ids.begin(), hist_ids.end(), static_cast<double>(spare + batch));
    std::shuffle(hist_ids.begin(), hist_ids.end(), rng);
    std::vector<double> table(at(batch * max_pages), 0.0), len_values(lens.begin(), lens.end());
    size_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      if (lens[at(b)] == 0) continue;
      const int64_t newest = (lens[at(b)] - 1) / page;
      for (int64_t j = 0; j < newest; ++j) table[at(b * max_pages + j)] = hist_ids[next++];
      table[at(b * max_pages + newest)] = static_cast<double>(spare + b);
    }
    const int64_t tokens = (spare + batch) * page;  // rope's rows: pages [0, spare + batch)
    Call host;
    host.buffers.push_back(random_buffer(DType::kBF16, {tokens, hq, dim}, rng));  // rope's q
    host.buffers.push_back(random_buffer(DType::kBF16, {num_pages, page, hk, dim}, rng));
    host.buffers.push_back(random_buffer(DType::kBF16, {num_pages, page, hk, dim}, rng));
    host.buffers.push_back(values_buffer(DType::kI32, {batch, max_pages}, table));
    host.buffers.push_back(values_buffer(DType::kI32, {batch}, len_values));
    host.buffers.push_back(poisoned_buffer(DType::kBF16, {batch, hq, dim}));
    host.buffers.push_back(cos_sin_cache(257, dim));
    host.buffers.push_back(
        values_buffer(DType::kI64, {tokens}, random_positions(tokens, 257, rng)));
    DeviceCall start = to_device(host, 0);
    auto attrs = dec.attrs({{"scale", 1.0 / std::sqrt(static_cast<double>(dim))}});
    ASSERT_TRUE(attrs.ok()) << attrs.status().message();
    auto copy = [](const Buffer& b) {
      auto d = Buffer::make(kGpu, b.dtype(), b.shape());
      EXPECT_TRUE(d.ok());
      EXPECT_TRUE(d->copy_from(b).ok());
      return std::move(d).value();
    };
    // rope, rope again (PDL: the producer), decode; four times. `last_rope`: whether the
    // final round's second rope runs (without it decode sees the rows of the round before).
    auto run_chain = [&](uint64_t flags, bool last_rope) {
      Buffer q = copy(start.storage[0]), kc = copy(start.storage[1]);
      Buffer out = copy(start.storage[5]);
      DLTensor rq = start.views[0], rk = start.views[1], dout = start.views[5];
      DLTensor dq = start.views[0], dk = start.views[1];
      int64_t rk_shape[3] = {tokens, hk, dim}, dq_shape[3] = {batch, hq, dim};
      rq.data = q.tensor()->data;
      rk.data = kc.tensor()->data;  // cache rows [0, tokens) as [T, Hk, D]
      rk.ndim = 3;
      rk.shape = rk_shape;
      rk.strides = nullptr;
      dq.data = q.tensor()->data;  // decode's q: rope's last B tokens
      dq.shape = dq_shape;
      dq.strides = nullptr;
      dq.byte_offset = static_cast<uint64_t>((tokens - batch) * hq * dim) * 2;
      dk.data = kc.tensor()->data;
      dout.data = out.tensor()->data;
      const CallOptions plain{nullptr, nullptr, 0};
      const CallOptions pdl{nullptr, nullptr, flags};
      DLTensor* r[] = {&rq, &rk, &start.views[6], &start.views[7]};
      DLTensor* d[] = {&dq, &dk, &start.views[2], &start.views[3], &start.views[4], &dout};
      for (int i = 0; i < 4; ++i) {
        EXPECT_TRUE(rope.call(r, {}, plain).ok());
        if (i < 3 || last_rope) EXPECT_TRUE(rope.call(r, {}, pdl).ok());
        EXPECT_TRUE(dec.call(d, attrs->view(), pdl).ok());
      }
      EXPECT_TRUE(harness::device_synchronize().ok());
      return std::vector<std::vector<uint8_t>>{test::bytes_of(out)};
    };
    EXPECT_TRUE(run_chain(0, true) != run_chain(0, false))
        << "the rows rope writes do not change decode's output: the test could not fail";
    test::expect_pdl_chain_matches_plain([&](uint64_t flags) { return run_chain(flags, true); }, 5,
                                         uint64_t{KREG_LAUNCH_PDL | KREG_LAUNCH_STABLE_INPUTS});
  }
}

// Programmatic dependent launch for fused_qk_norm_rope (both kernels), concat_mla_k and
// mrope_interleave: each must wait before its first load, since every input may be the
// previous kernel's output. One qkv buffer [T, 48 * 128] in a loop: fused_qk_norm_rope as
// 32/8/8 heads of 128 (the half-warp kernel; T = 4096, the large first link), again as
// 64/16/16 heads of 64 (the warp kernel, with a second batch of heads), concat_mla_k with
// k_nope = qkv as [T, 48, 128] and k_rope = qkv's last T * 64 elements, then
// mrope_interleave of concat's output as [3, S, 128] into qkv's first half, which the next
// round's first link reads. Bit for bit what the same chain gives with plain launches.
TEST_F(AttentionGpu, PdlChainsThroughQkNormConcatAndMrope) {
  const int64_t t = 4096, heads = 48, width = heads * 128;
  const int64_t s = t * heads * 192 / (3 * 128);  // concat's output as mrope's [3, S, 128]
  const DLDevice dev = kGpu;
  auto fused = handle("attention.fused_qk_norm_rope", "cuda");
  auto concat = handle("attention.concat_mla_k", "cuda");
  auto mrope = handle("attention.mrope_interleave", "cuda");
  auto hw = fused.attrs({{"num_heads_q", int64_t{32}},
                         {"num_heads_k", int64_t{8}},
                         {"num_heads_v", int64_t{8}},
                         {"head_dim", int64_t{128}},
                         {"is_neox", true}});
  auto warp = fused.attrs({{"num_heads_q", int64_t{64}},
                           {"num_heads_k", int64_t{16}},
                           {"num_heads_v", int64_t{16}},
                           {"head_dim", int64_t{64}},
                           {"is_neox", false}});
  auto sections = mrope.attrs(
      {{"section_t", int64_t{24}}, {"section_h", int64_t{20}}, {"section_w", int64_t{20}}});
  ASSERT_TRUE(hw.ok() && warp.ok() && sections.ok());
  std::mt19937_64 rng(19);
  auto copy = [&](const Buffer& b) {
    auto d = Buffer::make(dev, b.dtype(), b.shape());
    EXPECT_TRUE(d.ok()) << d.status().message();
    EXPECT_TRUE(d->copy_from(b).ok());
    return std::move(d).value();
  };
  const Buffer qkv0 = random_buffer(DType::kBF16, {t, width}, rng);
  const Buffer cat0 = random_buffer(DType::kBF16, {t, heads, 192}, rng);
  // Inputs nothing writes: the weights of 128 and of 64, the positions.
  Buffer qw128 = copy(random_buffer(DType::kBF16, {128}, rng));
  Buffer kw128 = copy(random_buffer(DType::kBF16, {128}, rng));
  Buffer qw64 = copy(random_buffer(DType::kBF16, {64}, rng));
  Buffer kw64 = copy(random_buffer(DType::kBF16, {64}, rng));
  Buffer pos = copy(values_buffer(DType::kI64, {t}, random_positions(t, 5000, rng)));
  auto run_chain = [&](uint64_t flags) {
    Buffer q = copy(qkv0), cat = copy(cat0);
    int64_t nope_shape[3] = {t, heads, 128}, rope_shape[3] = {t, 1, 64};
    int64_t x_shape[3] = {3, s, 128}, out_shape[2] = {s, 128};
    // `b` as [shape], `skip` elements in.
    auto view = [](Buffer& b, int64_t* shape, int32_t ndim, int64_t skip = 0) {
      DLTensor v = *b.tensor();
      v.ndim = ndim;
      v.shape = shape;
      v.strides = nullptr;
      v.byte_offset = static_cast<uint64_t>(skip) * dtype_size(b.dtype());
      return v;
    };
    DLTensor k_nope = view(q, nope_shape, 3), k_rope = view(q, rope_shape, 3, t * (width - 64));
    DLTensor x = view(cat, x_shape, 3), m_out = view(q, out_shape, 2);
    DLTensor* f128[] = {q.tensor(), qw128.tensor(), kw128.tensor(), pos.tensor()};
    DLTensor* f64[] = {q.tensor(), qw64.tensor(), kw64.tensor(), pos.tensor()};
    DLTensor* c[] = {&k_nope, &k_rope, cat.tensor()};
    DLTensor* m[] = {&x, &m_out};
    const CallOptions opts{nullptr, nullptr, flags};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(fused.call(f128, hw->view(), opts).ok());     // reads what mrope wrote
      EXPECT_TRUE(fused.call(f64, warp->view(), opts).ok());    // reads the q and k heads
      EXPECT_TRUE(concat.call(c, {}, opts).ok());               // reads qkv
      EXPECT_TRUE(mrope.call(m, sections->view(), opts).ok());  // reads concat's output
    }
    EXPECT_TRUE(harness::device_synchronize().ok());
    return std::vector<std::vector<uint8_t>>{test::bytes_of(q), test::bytes_of(cat)};
  };
  test::expect_pdl_chain_matches_plain(run_chain, 3);
}

TEST_F(AttentionGpu, CpuTensorsToTheCudaPathAreRefused) {
  std::mt19937_64 rng(13);
  Call call = concat_call(DType::kBF16, 2, 4, rng);
  auto h = registry().resolve("attention.concat_mla_k", Target{DLDevice{kDLCUDA, 0}, DType::kBF16});
  ASSERT_TRUE(h.ok());
  const Status st = h->call(call.tensors());
  EXPECT_EQ(st.code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("is on cpu:0, but backend cuda runs on cuda tensors"),
            std::string::npos)
      << st.message();
}

// ---- Bad arguments (CPU references; the CUDA launchers run the same checks) ----

Status call_cpu(const char* op, DType dt, Call& call) {
  auto h = registry().resolve(op, Target{DLDevice{kDLCPU, 0}, dt}, {std::string("cpu")});
  EXPECT_TRUE(h.ok()) << h.status().message();
  auto attrs = h->attrs(call.attrs);
  if (!attrs.ok()) return attrs.status();
  return h->call(call.tensors(), attrs->view());
}

void expect_error(const Status& st, kreg_status_code code, const std::string& text) {
  EXPECT_EQ(st.code(), code) << st.message();
  EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
}

TEST(AttentionKernels, ZeroTokensOnTheCpu) {
  std::mt19937_64 rng(15);
  Call concat = concat_call(DType::kBF16, 0, 16, rng);
  EXPECT_TRUE(call_cpu("attention.concat_mla_k", DType::kBF16, concat).ok());
  Call mrope = mrope_call(DType::kBF16, 0, 64, {24, 20, 20}, rng);
  EXPECT_TRUE(call_cpu("attention.mrope_interleave", DType::kBF16, mrope).ok());
  Call rope = rope_call(DType::kBF16, 0, 4, 1, 128, 128, true, DType::kI32, rng);
  EXPECT_TRUE(call_cpu("attention.rope", DType::kBF16, rope).ok());
  Call fused = fused_call(DType::kBF16, 0, 4, 1, 1, 128, true, 1e4, DType::kI32, rng);
  EXPECT_TRUE(call_cpu("attention.fused_qk_norm_rope", DType::kBF16, fused).ok());
}

TEST(AttentionKernels, BadArgumentsAreRejectedWithTheArgumentNamed) {
  std::mt19937_64 rng(14);
  const DType bf = DType::kBF16;
  {  // concat_mla_k: k_nope's last dimension must be 128.
    Call c = concat_call(bf, 2, 4, rng);
    c.buffers[0] = random_buffer(bf, {2, 4, 127}, rng);
    expect_error(call_cpu("attention.concat_mla_k", bf, c), KREG_INVALID_ARGUMENT, "'k_nope'");
  }
  {  // concat_mla_k: a dtype outside bf16|f16|f32.
    Call c = concat_call(bf, 2, 4, rng);
    c.buffers[0] = random_buffer(DType::kF64, {2, 4, 128}, rng);
    expect_error(call_cpu("attention.concat_mla_k", bf, c), KREG_INVALID_ARGUMENT, "dtype f64");
  }
  {  // mrope_interleave: negative section.
    Call c = mrope_call(bf, 3, 64, {24, -1, 20}, rng);
    expect_error(call_cpu("attention.mrope_interleave", bf, c), KREG_INVALID_ARGUMENT,
                 "'section_h'");
  }
  {  // mrope_interleave: x must have 3 streams.
    Call c = mrope_call(bf, 3, 64, {24, 20, 20}, rng);
    c.buffers[0] = random_buffer(bf, {2, 3, 64}, rng);
    expect_error(call_cpu("attention.mrope_interleave", bf, c), KREG_INVALID_ARGUMENT, "'x'");
  }
  {  // rope: rotary_dim larger than the head, odd rotary_dim.
    Call c = rope_call(bf, 2, 2, 1, 64, 64, true, DType::kI32, rng);
    c.buffers[2] = cos_sin_cache(257, 66);
    expect_error(call_cpu("attention.rope", bf, c), KREG_INVALID_ARGUMENT, "'cos_sin_cache'");
    c.buffers[2] = cos_sin_cache(257, 63);
    expect_error(call_cpu("attention.rope", bf, c), KREG_INVALID_ARGUMENT, "'cos_sin_cache'");
  }
  {  // rope: a position outside the cache is an error on the CPU, nothing written.
    Call c = rope_call(bf, 3, 2, 1, 64, 64, false, DType::kI64, rng);
    const std::vector<double> q_before = values(c.buffers[0]);
    ASSERT_TRUE(c.buffers[3].from_doubles({1, 257, 0}).ok());
    expect_error(call_cpu("attention.rope", bf, c), KREG_OUT_OF_RANGE, "'positions'[1] = 257");
    EXPECT_EQ(values(c.buffers[0]), q_before);
  }
  {  // rope: float positions, f16 cache, k head size differing from q's.
    Call c = rope_call(bf, 2, 2, 1, 64, 64, true, DType::kI32, rng);
    c.buffers[3] = values_buffer(DType::kF32, {2}, {0, 1});
    expect_error(call_cpu("attention.rope", bf, c), KREG_INVALID_ARGUMENT, "'positions'");
    c = rope_call(bf, 2, 2, 1, 64, 64, true, DType::kI32, rng);
    c.buffers[2] = random_buffer(DType::kF16, {257, 64}, rng);
    expect_error(call_cpu("attention.rope", bf, c), KREG_INVALID_ARGUMENT, "'cos_sin_cache'");
    c = rope_call(bf, 2, 2, 1, 64, 64, true, DType::kI32, rng);
    c.buffers[1] = random_buffer(bf, {2, 1, 32}, rng);
    expect_error(call_cpu("attention.rope", bf, c), KREG_INVALID_ARGUMENT, "'k'");
  }
  {  // fused_qk_norm_rope: unsupported head_dim, width mismatch, weight size, eps, base.
    Call c = fused_call(bf, 2, 2, 1, 1, 96, true, 1e4, DType::kI32, rng);
    expect_error(call_cpu("attention.fused_qk_norm_rope", bf, c), KREG_INVALID_ARGUMENT,
                 "'head_dim' = 96");
    c = fused_call(bf, 2, 2, 1, 1, 64, true, 1e4, DType::kI32, rng);
    c.attrs[2].value = int64_t{2};  // num_heads_v: the width no longer agrees
    expect_error(call_cpu("attention.fused_qk_norm_rope", bf, c), KREG_INVALID_ARGUMENT, "'qkv'");
    c = fused_call(bf, 2, 2, 1, 1, 64, true, 1e4, DType::kI32, rng);
    c.buffers[1] = random_buffer(bf, {32}, rng);
    c.buffers[2] = random_buffer(bf, {32}, rng);
    expect_error(call_cpu("attention.fused_qk_norm_rope", bf, c), KREG_INVALID_ARGUMENT,
                 "'q_weight'");
    c = fused_call(bf, 2, 2, 1, 1, 64, true, 1e4, DType::kI32, rng);
    c.attrs[4].value = -1.0;
    expect_error(call_cpu("attention.fused_qk_norm_rope", bf, c), KREG_INVALID_ARGUMENT, "'eps'");
    c = fused_call(bf, 2, 2, 1, 1, 64, true, 0.0, DType::kI32, rng);
    expect_error(call_cpu("attention.fused_qk_norm_rope", bf, c), KREG_INVALID_ARGUMENT, "'base'");
  }
  {  // fused_qk_norm_rope: f32 is not among its dtypes.
    Call c = fused_call(DType::kF32, 2, 2, 1, 1, 64, true, 1e4, DType::kI32, rng);
    expect_error(call_cpu("attention.fused_qk_norm_rope", bf, c), KREG_INVALID_ARGUMENT,
                 "dtype f32");
  }
  {  // decode: unsupported D, Hq not a multiple of Hk.
    Call c = decode_call(bf, {3}, 2, 1, 96, 16, 1, rng);
    expect_error(call_cpu("attention.decode", bf, c), KREG_INVALID_ARGUMENT, "D = 96");
    c = decode_call(bf, {3}, 3, 2, 64, 16, 1, rng);
    expect_error(call_cpu("attention.decode", bf, c), KREG_INVALID_ARGUMENT, "'k_cache'");
  }
  {  // decode: out-of-range page id and length are errors on the CPU.
    Call c = decode_call(bf, {20, 3}, 4, 1, 64, 16, 2, rng);
    std::vector<double> table = values(c.buffers[3]);
    table[1] = 1000;
    ASSERT_TRUE(c.buffers[3].from_doubles(table).ok());
    expect_error(call_cpu("attention.decode", bf, c), KREG_OUT_OF_RANGE, "'block_table'[0, 1]");
    c = decode_call(bf, {20, 33}, 4, 1, 64, 16, 2, rng);
    expect_error(call_cpu("attention.decode", bf, c), KREG_OUT_OF_RANGE, "'seq_lens'[1] = 33");
  }
  {  // decode: an i64 block table.
    Call c = decode_call(bf, {3}, 4, 1, 64, 16, 1, rng);
    c.buffers[3] = values_buffer(DType::kI64, {1, 1}, {0});
    expect_error(call_cpu("attention.decode", bf, c), KREG_INVALID_ARGUMENT, "'block_table'");
  }
}

}  // namespace
}  // namespace kreg
