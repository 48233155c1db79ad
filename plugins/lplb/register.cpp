// The lplb group's ops, registered by op (kreg/plugin.hpp).
#include "lplb.hpp"

namespace kreg::lplb {
namespace {

constexpr const char* kCountDtypes = "i32|i64|f32";

constexpr Op kOps[] = {
    {.signature = "build_lp(Tensor[L] counts, Tensor<i32>[L,C] log2phy, Tensor<i32>[R] phy2gpu, "
                  "Tensor<f32>(a!)[M,N] out_a, Tensor<f32>(b!)[M] out_b, Tensor<f32>(c!)[N] out_c, "
                  "int num_gpus=8) -> ()",
     .dtypes = kCountDtypes,
     .description = "LP of the max-GPU-load problem in standard form min c'x, Ax = b, x >= 0, "
                    "dense f32: M = L + num_gpus rows (expert l: sum of its replicas' x = "
                    "counts[l]; GPU g: load_g - z + s_g = 0), N = R + 1 + num_gpus columns (x per "
                    "replica, z, slack per GPU), c = e_R. log2phy[L,C]: replica ids, -1 padding, "
                    "each replica at most once; phy2gpu[R] in [0, num_gpus). Every element of "
                    "out_a/out_b/out_c is written. CUDA: one thread per element of A, each written "
                    "once; out-of-range ids act as padding",
     .impls = {cpu(bind<&build_lp_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&build_lp_cuda>, "build_lp.cu"))}},
    {.signature = "solve(Tensor<f32>[M,N] a, Tensor<f32>[M] b, Tensor<f32>[N] c, "
                  "Tensor<f32>(a!)[N] out_x, Tensor<f32>(b!)[8] out_status, int max_iter=30, float "
                  "tol=1e-6) -> ()",
     .dtypes = "f32",
     .description = "Mehrotra predictor-corrector interior-point method in double for small LPs "
                    "min c'x, Ax = b, x >= 0 (b, c scaled to unit max norm; normal equations by "
                    "eliminating the leading column-disjoint rows, dense Cholesky of the rest). "
                    "Stops when the relative primal and dual residuals and gap are <= tol or after "
                    "max_iter iterations. out_x: the last iterate. out_status[8]: converged (1/0), "
                    "primal residual, dual residual, gap, iterations, objective c'x, reason (0 "
                    "converged, 1 iteration limit, 2 non-finite, 3 too large for one block), "
                    "leading diagonal rows. CUDA: one 256-thread block, double precision, A held "
                    "sparse in shared memory; limits: nnz(A) <= 3072, at most 48 rows outside the "
                    "leading diagonal block, M <= 1024, N <= 2048 (status reason 3 beyond the "
                    "first two)",
     .impls = {cpu(bind<&solve_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&solve_cuda>, "solve.cu"))}},
    {.signature = "replica_probabilities(Tensor[L] counts, Tensor<i32>[L,C] log2phy, "
                  "Tensor<f32>[N] x, Tensor<f32>[8] status, Tensor<f32>(a!)[L,C] out_probs) -> ()",
     .dtypes = kCountDtypes,
     .description = "Per-replica probabilities out_probs[l,c] = max(x[log2phy[l,c]], 0) / sum over "
                    "the expert's valid replicas; uniform over the valid replicas (ids in [0, N)) "
                    "when status[0] != 1 (solve did not converge: the fallback), counts[l] <= 0 or "
                    "the sum is 0; 0 for padding. fp32, sums in replica order; CUDA: one thread "
                    "per expert",
     .impls = {cpu(bind<&replica_probabilities_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&replica_probabilities_cuda>, "dispatch.cu"))}},
    {.signature = "dispatch(Tensor<i32>[T,K] topk_ids, Tensor<f32>[L,C] probs, Tensor<i32>[L,C] "
                  "log2phy, Tensor<f32>[T,K] u, Tensor<i32>(a!)[T,K] out_phy_ids) -> ()",
     .dtypes = "i32",
     .description =
         "Physical replica per (token, slot) by inverse CDF: for e = topk_ids[t,k] the "
         "first valid replica c of positive probability with u[t,k] * total < "
         "cumulative probs[e,0..c] (fp32, replica order, u clamped to [0,1]); uniform "
         "over valid replicas when all probabilities are 0; -1 for an id outside [0, L) "
         "or an expert without replicas; CUDA: one thread per (token, slot), grid-stride",
     .impls = {cpu(bind<&dispatch_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&dispatch_cuda>, "dispatch.cu"))}},
};

}  // namespace
}  // namespace kreg::lplb

KREG_GROUP("lplb", kreg::lplb::kOps);
