// CPU references of the attention group: the plain loops that define what the CUDA
// kernels must compute. Inputs are converted to double, every sum is accumulated in
// double and each output is rounded once, at its store.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention.hpp"
#include "checks.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::attention {
namespace {

template <typename T>
double load(const T* p, int64_t i) {
  return load_as_float(p[i]);
}

template <typename T>
void store(T* p, int64_t i, double v) {
  p[i] = store_from_float<T>(static_cast<float>(v));
}

// positions[t] as an int64, from an i32 or i64 tensor.
int64_t position_at(const DLTensor& positions, int64_t t) {
  return from_dl(positions.dtype) == DType::kI64 ? data_ptr<const int64_t>(positions)[t]
                                                 : data_ptr<const int32_t>(positions)[t];
}

// Rotates the first rotary_dim elements of one head in place by the angle whose cosine
// and sine are c[i], s[i] for pair i. NeoX pairs element i with i + rotary_dim / 2;
// GPT-J pairs 2i with 2i + 1.
template <typename T>
void rotate_head(T* x, int64_t rotary_dim, bool is_neox, const double* c, const double* s) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t ia = is_neox ? i : 2 * i;
    const int64_t ib = is_neox ? i + half : 2 * i + 1;
    const double a = load(x, ia);
    const double b = load(x, ib);
    store(x, ia, a * c[i] - b * s[i]);
    store(x, ib, b * c[i] + a * s[i]);
  }
}

}  // namespace

KernelStatus concat_mla_k_cpu(Context& ctx, const DLTensor& k_nope, const DLTensor& k_rope,
                              DLTensor& out) {
  return host::visit_float_dtype(ctx, ctx.op(), out, [&](auto tag) {
    using T = decltype(tag);
    const T* nope = data_ptr<const T>(k_nope);
    const T* rope = data_ptr<const T>(k_rope);
    T* o = data_ptr<T>(out);
    const int64_t tokens = out.shape[0], heads = out.shape[1];
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        T* row = o + (t * heads + h) * 192;
        for (int64_t i = 0; i < 128; ++i) row[i] = nope[(t * heads + h) * 128 + i];
        for (int64_t i = 0; i < 64; ++i) row[128 + i] = rope[t * 64 + i];
      }
    }
    return kOk;
  });
}

KernelStatus mrope_interleave_cpu(Context& ctx, const DLTensor& x, DLTensor& out, int64_t section_t,
                                  int64_t section_h, int64_t section_w) {
  const char* op = ctx.op();
  if (auto st = check_mrope_sections(ctx, op, section_t, section_h, section_w); !st.ok()) {
    return st;
  }
  return host::visit_float_dtype(ctx, op, out, [&](auto tag) {
    using T = decltype(tag);
    const T* in = data_ptr<const T>(x);
    T* o = data_ptr<T>(out);
    const int64_t s_len = out.shape[0], dim = out.shape[1];
    for (int64_t s = 0; s < s_len; ++s) {
      for (int64_t i = 0; i < dim; ++i) {
        int64_t stream = 0;
        if (i % 3 == 1 && i < 3 * section_h) stream = 1;
        if (i % 3 == 2 && i < 3 * section_w) stream = 2;
        o[s * dim + i] = in[(stream * s_len + s) * dim + i];
      }
    }
    return kOk;
  });
}

KernelStatus rope_cpu(Context& ctx, DLTensor& q, DLTensor& k, const DLTensor& cos_sin_cache,
                      const DLTensor& positions, bool is_neox) {
  const char* op = ctx.op();
  if (auto st = check_rope(ctx, op, q, cos_sin_cache); !st.ok()) return st;
  const int64_t tokens = q.shape[0];
  const int64_t max_pos = cos_sin_cache.shape[0];
  // All positions are checked before anything is written.
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t pos = position_at(positions, t);
    if (pos < 0 || pos >= max_pos) {
      return ctx.fail(KREG_OUT_OF_RANGE,
                      "%s: argument 'positions'[%lld] = %lld is outside the cache [0, %lld)", op,
                      static_cast<long long>(t), static_cast<long long>(pos),
                      static_cast<long long>(max_pos));
    }
  }
  if (tokens == 0) return kOk;  // nothing to rotate: no table sized by the cache's width
  return host::visit_float_dtype(ctx, op, q, [&](auto tag) {
    using T = decltype(tag);
    const int64_t rotary_dim = cos_sin_cache.shape[1];
    const int64_t half = rotary_dim / 2;
    const int64_t head_dim = q.shape[2];
    const float* cache = data_ptr<const float>(cos_sin_cache);
    std::vector<double> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = cache + position_at(positions, t) * rotary_dim;
      for (int64_t i = 0; i < half; ++i) {
        c[static_cast<size_t>(i)] = row[i];
        s[static_cast<size_t>(i)] = row[half + i];
      }
      for (DLTensor* x : {&q, &k}) {
        const int64_t heads = x->shape[1];
        for (int64_t h = 0; h < heads; ++h) {
          rotate_head(data_ptr<T>(*x) + (t * heads + h) * head_dim, rotary_dim, is_neox, c.data(),
                      s.data());
        }
      }
    }
    return kOk;
  });
}

KernelStatus fused_qk_norm_rope_cpu(Context& ctx, DLTensor& qkv, const DLTensor& q_weight,
                                    const DLTensor& k_weight, const DLTensor& positions,
                                    int64_t num_heads_q, int64_t num_heads_k, int64_t num_heads_v,
                                    int64_t head_dim, double eps, double base, bool is_neox) {
  const char* op = ctx.op();
  if (auto st = check_fused_qk_norm_rope(ctx, op, qkv, q_weight, k_weight, num_heads_q, num_heads_k,
                                         num_heads_v, head_dim, eps, base);
      !st.ok()) {
    return st;
  }
  return host::visit_float_dtype(ctx, op, qkv, [&](auto tag) {
    using T = decltype(tag);
    const int64_t tokens = qkv.shape[0];
    const int64_t width = qkv.shape[1];
    const int64_t half = head_dim / 2;
    // inv_freq[i] = base^(-2i / head_dim) as an fp32 value; the angle pos * inv_freq[i] is
    // an fp32 product, as in the model code; its cosine and sine are taken exactly.
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      inv_freq[static_cast<size_t>(i)] = static_cast<float>(
          std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
    }
    std::vector<double> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    std::vector<double> y(static_cast<size_t>(head_dim));
    const float eps_f = static_cast<float>(eps);
    for (int64_t t = 0; t < tokens; ++t) {
      const float pos = static_cast<float>(position_at(positions, t));
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[static_cast<size_t>(i)];
        c[static_cast<size_t>(i)] = std::cos(static_cast<double>(angle));
        s[static_cast<size_t>(i)] = std::sin(static_cast<double>(angle));
      }
      for (int64_t h = 0; h < num_heads_q + num_heads_k; ++h) {
        T* x = data_ptr<T>(qkv) + t * width + h * head_dim;
        const T* w = data_ptr<const T>(h < num_heads_q ? q_weight : k_weight);
        double sum_sq = 0.0;
        for (int64_t i = 0; i < head_dim; ++i) sum_sq += load(x, i) * load(x, i);
        const double inv_rms =
            1.0 / std::sqrt(sum_sq / static_cast<double>(head_dim) + static_cast<double>(eps_f));
        for (int64_t i = 0; i < head_dim; ++i) {
          y[static_cast<size_t>(i)] = load(x, i) * inv_rms * load(w, i);
        }
        for (int64_t i = 0; i < half; ++i) {
          const int64_t ia = is_neox ? i : 2 * i;
          const int64_t ib = is_neox ? i + half : 2 * i + 1;
          const double a = y[static_cast<size_t>(ia)], b = y[static_cast<size_t>(ib)];
          store(x, ia, a * c[static_cast<size_t>(i)] - b * s[static_cast<size_t>(i)]);
          store(x, ib, b * c[static_cast<size_t>(i)] + a * s[static_cast<size_t>(i)]);
        }
      }
    }
    return kOk;
  });
}

KernelStatus decode_cpu(Context& ctx, const DLTensor& q, const DLTensor& k_cache,
                        const DLTensor& v_cache, const DLTensor& block_table,
                        const DLTensor& seq_lens, DLTensor& out, double scale) {
  const char* op = ctx.op();
  if (auto st = check_decode(ctx, op, q, k_cache, scale); !st.ok()) return st;
  const int64_t batch = q.shape[0], heads_q = q.shape[1], dim = q.shape[2];
  const int64_t num_pages = k_cache.shape[0], page_size = k_cache.shape[1];
  const int64_t heads_k = k_cache.shape[2];
  const int64_t max_pages = block_table.shape[1];
  const int32_t* table = data_ptr<const int32_t>(block_table);
  const int32_t* lens = data_ptr<const int32_t>(seq_lens);
  // Every index read from a tensor is checked before anything is written.
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[b];
    if (len < 0 || len > max_pages * page_size) {
      return ctx.fail(KREG_OUT_OF_RANGE,
                      "%s: argument 'seq_lens'[%lld] = %lld is outside [0, max_pages * page_size "
                      "= %lld]",
                      op, static_cast<long long>(b), static_cast<long long>(len),
                      static_cast<long long>(max_pages * page_size));
    }
    for (int64_t p = 0; p < (len + page_size - 1) / page_size; ++p) {
      const int64_t page = table[b * max_pages + p];
      if (page < 0 || page >= num_pages) {
        return ctx.fail(KREG_OUT_OF_RANGE,
                        "%s: argument 'block_table'[%lld, %lld] = %lld is outside the cache "
                        "[0, %lld)",
                        op, static_cast<long long>(b), static_cast<long long>(p),
                        static_cast<long long>(page), static_cast<long long>(num_pages));
      }
    }
  }
  return host::visit_float_dtype(ctx, op, q, [&](auto tag) {
    using T = decltype(tag);
    const T* qp = data_ptr<const T>(q);
    const T* kp = data_ptr<const T>(k_cache);
    const T* vp = data_ptr<const T>(v_cache);
    T* op_out = data_ptr<T>(out);
    const int64_t group = heads_q / heads_k;
    std::vector<double> logits;
    std::vector<double> acc(static_cast<size_t>(dim));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens[b];
      logits.assign(static_cast<size_t>(len), 0.0);
      for (int64_t h = 0; h < heads_q; ++h) {
        const int64_t kh = h / group;
        const T* qrow = qp + (b * heads_q + h) * dim;
        // Row offset of token j of this sequence in the caches, for head kh.
        auto row = [&](int64_t j) {
          const int64_t page = table[b * max_pages + j / page_size];
          return ((page * page_size + j % page_size) * heads_k + kh) * dim;
        };
        double max_logit = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < len; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < dim; ++d) dot += load(qrow, d) * load(kp, row(j) + d);
          logits[static_cast<size_t>(j)] = dot * scale;
          max_logit = std::max(max_logit, logits[static_cast<size_t>(j)]);
        }
        double denom = 0.0;
        acc.assign(static_cast<size_t>(dim), 0.0);
        for (int64_t j = 0; j < len; ++j) {
          const double p = std::exp(logits[static_cast<size_t>(j)] - max_logit);
          denom += p;
          for (int64_t d = 0; d < dim; ++d) acc[static_cast<size_t>(d)] += p * load(vp, row(j) + d);
        }
        // An empty sequence attends to nothing: its output is zero.
        for (int64_t d = 0; d < dim; ++d) {
          store(op_out, (b * heads_q + h) * dim + d,
                len > 0 ? acc[static_cast<size_t>(d)] / denom : 0.0);
        }
      }
    }
    return kOk;
  });
}

}  // namespace kreg::attention
