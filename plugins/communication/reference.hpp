// References for the communication group's tests: the results of every rank, given every
// rank's inputs, computed in one process with plain loops (independently of the
// transports). Values are floats; inputs must be representable in the dtype, and every
// result is rounded to it as the ops round (once per stored value).
//
//   ranks[r] = rank r's tensor, flattened (row-major).
//
// The reductions take the ranks in rank order in fp32 (avg: the fp32 sum / world size).
// Bad shapes (ranks of different sizes, a size that does not divide) throw
// std::invalid_argument.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kreg::communication::reference {

enum class Dtype { kF32, kF16, kBF16 };
using Ranks = std::vector<std::vector<float>>;

// v rounded to the dtype (round-to-nearest-even); f32: v.
float round_to(Dtype dtype, float v);

// op: "sum", "prod", "max", "min", "avg". Every rank gets the same vector.
Ranks all_reduce(const Ranks& x, std::string_view op, Dtype dtype);
// Every rank gets x[0] ++ x[1] ++ ... ++ x[world - 1].
Ranks all_gather(const Ranks& x);
// x[r] holds world * n values; rank r gets block r (n values) of the reduction.
Ranks reduce_scatter(const Ranks& x, std::string_view op, Dtype dtype);

struct AddRmsnorm {
  Ranks x;         // the normalized output
  Ranks residual;  // the updated residual
};
// Per rank r: a = all_reduce_sum(x)[r] (rounded); s = a + residual[r] in fp32;
// residual = round(s); x = round(s * scale * weight[r]) with, per row of `hidden` values,
// scale = 1 / sqrt(mean(s^2) + eps) (mean in double over the unrounded s, as
// layernorm.fused_add_rmsnorm).
AddRmsnorm all_reduce_add_rmsnorm(const Ranks& x, const Ranks& residual, const Ranks& weight,
                                  int64_t hidden, double eps, Dtype dtype);

}  // namespace kreg::communication::reference
