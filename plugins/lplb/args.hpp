// Argument checks the signature cannot express, shared by the CPU references and the
// CUDA launchers so both refuse the same calls with the same messages.
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::lplb {

// build_lp: out_A is [L + G, R + 1 + G], out_b [L + G], out_c [R + 1 + G].
inline KernelStatus check_build_lp(Context& ctx, const DLTensor& counts, const DLTensor& phy2gpu,
                                   const DLTensor& out_a, int64_t num_gpus) {
  const int64_t L = counts.shape[0], R = phy2gpu.shape[0];
  if (num_gpus < 1 || num_gpus > 65536) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'num_gpus' = %lld, expected 1..65536",
                    ctx.op(), static_cast<long long>(num_gpus));
  }
  if (out_a.shape[0] != L + num_gpus || out_a.shape[1] != R + 1 + num_gpus) {
    return ctx.fail(KREG_INVALID_ARGUMENT,
                    "%s: argument 'out_a' has shape [%lld,%lld], expected "
                    "[L+num_gpus, R+1+num_gpus] = [%lld,%lld]",
                    ctx.op(), static_cast<long long>(out_a.shape[0]),
                    static_cast<long long>(out_a.shape[1]), static_cast<long long>(L + num_gpus),
                    static_cast<long long>(R + 1 + num_gpus));
  }
  return kOk;
}

inline KernelStatus check_solve(Context& ctx, int64_t max_iter, double tol) {
  if (max_iter < 0 || max_iter > 1000) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'max_iter' = %lld, expected 0..1000",
                    ctx.op(), static_cast<long long>(max_iter));
  }
  if (!(tol > 0.0) || !(tol < 1.0)) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: attribute 'tol' = %g, expected (0, 1)", ctx.op(),
                    tol);
  }
  return kOk;
}

}  // namespace kreg::lplb
