// The communication group's test references (reference.hpp): plain loops over all ranks'
// inputs, sharing no code with the transports.
#include "reference.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "kreg/numeric.hpp"

namespace kreg::communication::reference {
namespace {

void check_same_sizes(const Ranks& x, const char* what) {
  if (x.empty()) throw std::invalid_argument(std::string(what) + ": no ranks");
  for (const auto& v : x) {
    if (v.size() != x[0].size()) {
      throw std::invalid_argument(std::string(what) + ": ranks have different sizes");
    }
  }
}

// The reduction of column i over the ranks, in rank order, before the final rounding.
float reduce_column(const Ranks& x, size_t i, std::string_view op) {
  float acc = x[0][i];
  for (size_t r = 1; r < x.size(); ++r) {
    const float v = x[r][i];
    if (op == "sum" || op == "avg") {
      acc = acc + v;
    } else if (op == "prod") {
      acc = acc * v;
    } else if (op == "max") {
      acc = std::fmax(acc, v);
    } else if (op == "min") {
      acc = std::fmin(acc, v);
    }
  }
  if (op == "avg") acc = acc / static_cast<float>(x.size());
  return acc;
}

void check_op(std::string_view op) {
  if (op != "sum" && op != "prod" && op != "max" && op != "min" && op != "avg") {
    throw std::invalid_argument("unknown reduction '" + std::string(op) + "'");
  }
}

}  // namespace

float round_to(Dtype dtype, float v) {
  switch (dtype) {
    case Dtype::kF32:
      return v;
    case Dtype::kF16:
      return to_float(to_f16(v));
    case Dtype::kBF16:
      return to_float(to_bf16(v));
  }
  return v;
}

Ranks all_reduce(const Ranks& x, std::string_view op, Dtype dtype) {
  check_same_sizes(x, "all_reduce");
  check_op(op);
  std::vector<float> result(x[0].size());
  for (size_t i = 0; i < result.size(); ++i) result[i] = round_to(dtype, reduce_column(x, i, op));
  return Ranks(x.size(), result);
}

Ranks all_gather(const Ranks& x) {
  check_same_sizes(x, "all_gather");
  std::vector<float> result;
  for (const auto& v : x) result.insert(result.end(), v.begin(), v.end());
  return Ranks(x.size(), result);
}

Ranks reduce_scatter(const Ranks& x, std::string_view op, Dtype dtype) {
  check_same_sizes(x, "reduce_scatter");
  check_op(op);
  const size_t world = x.size();
  if (x[0].size() % world != 0) {
    throw std::invalid_argument("reduce_scatter: size does not divide by the world size");
  }
  const size_t n = x[0].size() / world;
  Ranks out(world, std::vector<float>(n));
  for (size_t r = 0; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) out[r][i] = round_to(dtype, reduce_column(x, r * n + i, op));
  }
  return out;
}

AddRmsnorm all_reduce_add_rmsnorm(const Ranks& x, const Ranks& residual, const Ranks& weight,
                                  int64_t hidden, double eps, Dtype dtype) {
  check_same_sizes(x, "all_reduce_add_rmsnorm");
  const size_t world = x.size();
  const size_t n = x[0].size();
  if (residual.size() != world || weight.size() != world || hidden <= 0 ||
      n % static_cast<size_t>(hidden) != 0) {
    throw std::invalid_argument("all_reduce_add_rmsnorm: bad shapes");
  }
  const auto h = static_cast<size_t>(hidden);
  const std::vector<float> reduced = all_reduce(x, "sum", dtype)[0];
  AddRmsnorm out{Ranks(world, std::vector<float>(n)), Ranks(world, std::vector<float>(n))};
  for (size_t r = 0; r < world; ++r) {
    if (residual[r].size() != n || weight[r].size() != h) {
      throw std::invalid_argument("all_reduce_add_rmsnorm: bad shapes");
    }
    for (size_t row = 0; row < n / h; ++row) {
      std::vector<float> s(h);
      double sum_sq = 0.0;
      for (size_t i = 0; i < h; ++i) {
        s[i] = reduced[row * h + i] + residual[r][row * h + i];
        sum_sq += static_cast<double>(s[i]) * static_cast<double>(s[i]);
      }
      const float mean = static_cast<float>(sum_sq / static_cast<double>(hidden));
      const float scale = 1.0f / std::sqrt(mean + static_cast<float>(eps));
      for (size_t i = 0; i < h; ++i) {
        out.residual[r][row * h + i] = round_to(dtype, s[i]);
        out.x[r][row * h + i] = round_to(dtype, s[i] * scale * weight[r][i]);
      }
    }
  }
  return out;
}

}  // namespace kreg::communication::reference
