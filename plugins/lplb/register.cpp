// The lplb group's implementations, listed as data.
#include "lplb.hpp"

namespace kreg::lplb {
namespace {

constexpr const char* kBuildLp =
    "build_lp(Tensor[L] counts, Tensor<i32>[L,C] log2phy, Tensor<i32>[R] phy2gpu, "
    "Tensor<f32>(a!)[M,N] out_a, Tensor<f32>(b!)[M] out_b, Tensor<f32>(c!)[N] out_c, "
    "int num_gpus=8) -> ()";
constexpr const char* kSolve =
    "solve(Tensor<f32>[M,N] a, Tensor<f32>[M] b, Tensor<f32>[N] c, Tensor<f32>(a!)[N] out_x, "
    "Tensor<f32>(b!)[8] out_status, int max_iter=30, float tol=1e-6) -> ()";
constexpr const char* kReplicaProbabilities =
    "replica_probabilities(Tensor[L] counts, Tensor<i32>[L,C] log2phy, Tensor<f32>[N] x, "
    "Tensor<f32>[8] status, Tensor<f32>(a!)[L,C] out_probs) -> ()";
constexpr const char* kDispatch =
    "dispatch(Tensor<i32>[T,K] topk_ids, Tensor<f32>[L,C] probs, Tensor<i32>[L,C] log2phy, "
    "Tensor<f32>[T,K] u, Tensor<i32>(a!)[T,K] out_phy_ids) -> ()";
constexpr const char* kCountDtypes = "i32|i64|f32";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC;
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC;

constexpr const char* kBuildLpDoc =
    "LP of the max-GPU-load problem in standard form min c'x, Ax = b, x >= 0, dense f32: "
    "M = L + num_gpus rows (expert l: sum of its replicas' x = counts[l]; GPU g: load_g - z + "
    "s_g = 0), N = R + 1 + num_gpus columns (x per replica, z, slack per GPU), c = e_R. "
    "log2phy[L,C]: replica ids, -1 padding, each replica at most once; phy2gpu[R] in "
    "[0, num_gpus). Every element of out_a/out_b/out_c is written";
constexpr const char* kSolveDoc =
    "Mehrotra predictor-corrector interior-point method in double for small LPs min c'x, "
    "Ax = b, x >= 0 (b, c scaled to unit max norm; normal equations by eliminating the leading "
    "column-disjoint rows, dense Cholesky of the rest). Stops when the relative primal and dual "
    "residuals and gap are <= tol or after max_iter iterations. out_x: the last iterate. "
    "out_status[8]: converged (1/0), primal residual, dual residual, gap, iterations, "
    "objective c'x, reason (0 converged, 1 iteration limit, 2 non-finite, 3 too large for one "
    "block), leading diagonal rows";
constexpr const char* kProbDoc =
    "Per-replica probabilities out_probs[l,c] = max(x[log2phy[l,c]], 0) / sum over the "
    "expert's valid replicas; uniform over the valid replicas (ids in [0, N)) when status[0] "
    "!= 1 (solve did not converge: the fallback), counts[l] <= 0 or the sum is 0; 0 for "
    "padding. fp32, sums in replica order";
constexpr const char* kDispatchDoc =
    "Physical replica per (token, slot) by inverse CDF: for e = topk_ids[t,k] the first "
    "valid replica c of positive probability with u[t,k] * total < cumulative probs[e,0..c] "
    "(fp32, replica order, u clamped to [0,1]); uniform over valid replicas when all "
    "probabilities are 0; -1 for an id outside [0, L) or an expert without replicas";

constexpr KernelDef kKernels[] = {
    {.op = "lplb.build_lp",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kBuildLp,
     .dtypes = kCountDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kBuildLpDoc,
     .impl = bind<&build_lp_cpu>,
     .source = "reference.cpp"},
    {.op = "lplb.solve",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kSolve,
     .dtypes = "f32",
     .traits = kCpuTraits,
     .priority = 0,
     .description = kSolveDoc,
     .impl = bind<&solve_cpu>,
     .source = "reference.cpp"},
    {.op = "lplb.replica_probabilities",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kReplicaProbabilities,
     .dtypes = kCountDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kProbDoc,
     .impl = bind<&replica_probabilities_cpu>,
     .source = "reference.cpp"},
    {.op = "lplb.dispatch",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kDispatch,
     .dtypes = "i32",
     .traits = kCpuTraits,
     .priority = 0,
     .description = kDispatchDoc,
     .impl = bind<&dispatch_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "lplb.build_lp",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kBuildLp,
     .dtypes = kCountDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "LP of the max-GPU-load problem (see the cpu record), one thread per "
                    "element of A, each written once; out-of-range ids act as padding",
     .impl = bind<&build_lp_cuda>,
     .source = "build_lp.cu"},
    {.op = "lplb.solve",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kSolve,
     .dtypes = "f32",
     .traits = kCudaTraits,
     .priority = 100,
     .description = "The cpu record's interior-point method in one 256-thread block, double "
                    "precision, A held sparse in shared memory; limits: nnz(A) <= 3072, at most "
                    "48 rows outside the leading diagonal block, M <= 1024, N <= 2048 "
                    "(status reason 3 beyond the first two)",
     .impl = bind<&solve_cuda>,
     .source = "solve.cu"},
    {.op = "lplb.replica_probabilities",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kReplicaProbabilities,
     .dtypes = kCountDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Per-replica probabilities (see the cpu record), one thread per expert",
     .impl = bind<&replica_probabilities_cuda>,
     .source = "dispatch.cu"},
    {.op = "lplb.dispatch",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kDispatch,
     .dtypes = "i32",
     .traits = kCudaTraits,
     .priority = 100,
     .description = "Inverse-CDF replica choice (see the cpu record), one thread per "
                    "(token, slot), grid-stride",
     .impl = bind<&dispatch_cuda>,
     .source = "dispatch.cu"},
#endif
};

}  // namespace
}  // namespace kreg::lplb

KREG_PLUGIN("lplb", "0.1.0", kreg::lplb::kKernels);
