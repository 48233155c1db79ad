// quantization.hadamard_transform: out = scale * x * H_N, H_N the Sylvester Hadamard matrix
// in natural order (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]; H_N[i][j] =
// (-1)^popcount(i & j)), for N a power of two from 2 to 32768. The rotation QuaRot /
// SpinQuant-style quantization applies before quantizing activations; SGLang calls Dao-AILab's
// fast-hadamard-transform for it. docs/ops/quantization.md has the contract.
//
// Both functions trust their frame (x and out share one of bf16/f16/f32 and the shape [T, N],
// contiguous) and check N themselves (check_hadamard_n). out may alias x.
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::quantization {

// The largest N the op takes (Dao-AILab's fast-hadamard-transform's limit too).
inline constexpr int64_t kHadamardMaxN = 32768;

// log2(N) when N is a power of two in [2, kHadamardMaxN], else -1.
constexpr int hadamard_log2(int64_t n) {
  if (n < 2 || n > kHadamardMaxN || (n & (n - 1)) != 0) return -1;
  int log = 0;
  while ((int64_t{1} << log) < n) ++log;
  return log;
}

// KREG_INVALID_ARGUMENT naming the op and N when N is out of contract, else kOk.
inline KernelStatus check_hadamard_n(Context& ctx, int64_t n) {
  if (hadamard_log2(n) >= 0) return kOk;
  return ctx.fail(KREG_INVALID_ARGUMENT,
                  "%s: N = %lld (x's last dimension) must be a power of two from 2 to %lld",
                  ctx.op(), static_cast<long long>(n), static_cast<long long>(kHadamardMaxN));
}

// CPU reference (hadamard_reference.cpp): the butterflies in double, one rounding at the store.
KernelStatus hadamard_transform_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double scale);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA (hadamard.cu): fp32 butterflies in registers, shuffles and one shared-memory exchange;
// enqueues on ctx.stream() and returns without waiting.
KernelStatus hadamard_transform_cuda(Context& ctx, const DLTensor& x, DLTensor& out, double scale);
#endif

}  // namespace kreg::quantization
