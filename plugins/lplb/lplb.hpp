// The lplb group: LP-based load balancing of redundant MoE expert replicas.
// docs/ops/lplb.md states the exact contract of each op.
//
//   build_lp               counts + topology -> the LP  min c'x, Ax = b, x >= 0 (dense f32)
//   solve                  a Mehrotra predictor-corrector interior-point method, one block
//   replica_probabilities  LP solution -> per-replica probabilities (uniform fallback)
//   dispatch               (token, slot) -> physical replica by inverse CDF
//
// The LP of build_lp, for L experts, R replicas and G GPUs (m = L + G rows,
// n = R + 1 + G columns):
//   columns  0..R-1   x_r  tokens sent to replica r
//            R        z    the largest GPU load
//            R+1+g    s_g  slack of GPU g (load_g + s_g = z)
//   rows     l < L    sum of x_r over the replicas of expert l = counts[l]
//            L+g      sum of x_r over the replicas on GPU g - z + s_g = 0
//   c = e_R (minimise z).
//
// Every function trusts its frame: the core has checked dtypes, ranks, the named
// dimensions, device and contiguity. Values (replica ids, GPU ids) are checked by the CPU
// references; the CUDA kernels treat out-of-range ids as padding (they cannot report an
// error without a host synchronisation).
#pragma once

#include <cstdint>

#include "kreg/plugin.hpp"

namespace kreg::lplb {

// ---- solve's status vector: Tensor<f32>[8] out_status ----
enum StatusSlot : int {
  kStatusConverged = 0,   // 1.0 when all three measures below are <= tol, else 0.0
  kStatusPrimalRes = 1,   // ||b - Ax||inf / (1 + ||b||inf), on the scaled problem
  kStatusDualRes = 2,     // ||c - A'y - s||inf / (1 + ||c||inf), on the scaled problem
  kStatusGap = 3,         // |c'x - b'y| / (1 + |c'x|), on the scaled problem
  kStatusIterations = 4,  // iterations run
  kStatusObjective = 5,   // c'x in the caller's units
  kStatusReason = 6,      // a SolveReason
  kStatusDiagRows = 7,    // leading rows eliminated as a diagonal block (structure found)
  kStatusSize = 8,
};

enum SolveReason : int {
  kReasonConverged = 0,
  kReasonIterationLimit = 1,  // max_iter reached first
  kReasonBreakdown = 2,       // a non-finite value appeared
  kReasonTooLarge = 3,        // CUDA only: more nonzeros / dense rows than one block holds
};

// ---- The interior-point method's constants, shared by the CPU and CUDA solvers ----
inline constexpr double kStepFactor = 0.99;     // fraction of the step to the boundary
inline constexpr double kStartFloor = 1e-3;     // lower bound of the starting x and s
inline constexpr double kTinyDiag = 1e-30;      // a diagonal-block pivot at or below: skipped
inline constexpr double kRelPivotTol = 1e-14;   // dense pivot <= this * max diagonal: skipped
inline constexpr double kSkippedPivot = 1e128;  // a skipped pivot's value (its dy becomes ~0)

// CUDA solver limits (the CPU reference has none): nonzeros of A, rows outside the leading
// diagonal block, and the coupling block between the two.
inline constexpr int kMaxNnz = 3072;
inline constexpr int kMaxDense = 48;
inline constexpr int kMaxCoupling = 4096;
inline constexpr int kMaxRows = 1024;
inline constexpr int kMaxCols = 2048;

// CPU references (reference.cpp).
KernelStatus build_lp_cpu(Context& ctx, const DLTensor& counts, const DLTensor& log2phy,
                          const DLTensor& phy2gpu, DLTensor& out_a, DLTensor& out_b,
                          DLTensor& out_c, int64_t num_gpus);
KernelStatus solve_cpu(Context& ctx, const DLTensor& a, const DLTensor& b, const DLTensor& c,
                       DLTensor& out_x, DLTensor& out_status, int64_t max_iter, double tol);
KernelStatus replica_probabilities_cpu(Context& ctx, const DLTensor& counts,
                                       const DLTensor& log2phy, const DLTensor& x,
                                       const DLTensor& status, DLTensor& out_probs);
KernelStatus dispatch_cpu(Context& ctx, const DLTensor& topk_ids, const DLTensor& probs,
                          const DLTensor& log2phy, const DLTensor& u, DLTensor& out_phy_ids);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels. They enqueue on ctx.stream() and return without waiting.
KernelStatus build_lp_cuda(Context& ctx, const DLTensor& counts, const DLTensor& log2phy,
                           const DLTensor& phy2gpu, DLTensor& out_a, DLTensor& out_b,
                           DLTensor& out_c, int64_t num_gpus);  // build_lp.cu
KernelStatus solve_cuda(Context& ctx, const DLTensor& a, const DLTensor& b, const DLTensor& c,
                        DLTensor& out_x, DLTensor& out_status, int64_t max_iter,
                        double tol);  // solve.cu
KernelStatus replica_probabilities_cuda(Context& ctx, const DLTensor& counts,
                                        const DLTensor& log2phy, const DLTensor& x,
                                        const DLTensor& status,
                                        DLTensor& out_probs);  // dispatch.cu
KernelStatus dispatch_cuda(Context& ctx, const DLTensor& topk_ids, const DLTensor& probs,
                           const DLTensor& log2phy, const DLTensor& u,
                           DLTensor& out_phy_ids);  // dispatch.cu
#endif

}  // namespace kreg::lplb
