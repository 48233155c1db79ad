// The sampling group's ops, registered by op (kreg/plugin.hpp). docs/ops/sampling.md has
// the full contract.
#include "sampling.hpp"

namespace kreg::sampling {
namespace {

constexpr Op kOps[] = {
    {.signature = "top_k_renorm_probs(Tensor<f32>[B,V] probs, Tensor<i32>[B] top_k, "
                  "Tensor<f32>(a!)[B,V] out) -> ()",
     .dtypes = "f32",
     .description = "Keeps each row's top_k largest probabilities (descending, ties in index "
                    "order; top_k <= 0 or >= V keeps all), zeroes the rest and divides by the "
                    "kept sum; negative entries read as 0; a row with NaN/inf or no positive "
                    "entry: CPU error naming the row, CUDA writes NaN; CUDA: one 8-block cluster "
                    "per row, the row in shared memory, radix select on the float bits",
     .impls = {cpu(bind<&top_k_renorm_probs_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&top_k_renorm_probs_cuda>, "sampling.cu").sm(90))}},
    {.signature = "top_p_renorm_probs(Tensor<f32>[B,V] probs, Tensor<f32>[B] top_p, "
                  "Tensor<f32>(a!)[B,V] out) -> ()",
     .dtypes = "f32",
     .description = "Keeps the smallest descending prefix (ties in index order, at least one "
                    "token) whose fixed-point weight reaches top_p * the row's (top_p >= 1 keeps "
                    "all), zeroes the rest and divides by the kept sum; bad rows as "
                    "top_k_renorm_probs; CUDA: one cluster per row, radix search of the cut",
     .impls = {cpu(bind<&top_p_renorm_probs_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&top_p_renorm_probs_cuda>, "sampling.cu").sm(90))}},
    {.signature = "top_k_top_p_sampling_from_probs(Tensor<f32>[B,V] probs, Tensor<i32>[B] top_k, "
                  "Tensor<f32>[B] top_p, Tensor<i32>(a!)[B] out_ids, Tensor<i64>(b!)[2] rng) -> ()",
     .dtypes = "f32",
     .description = "One token per row from the top-k set, then its top-p prefix (FlashInfer's "
                    "filter_apply_order=top_k_first), drawn by inverse CDF over exact fixed-point "
                    "weights with Philox4x32-10 keyed by rng = (seed, offset); rng[1] += 1 per "
                    "call (on the device for CUDA); CPU and CUDA draw the same ids; a bad row: CPU "
                    "error naming it, CUDA id -1",
     .impls = {cpu(bind<&top_k_top_p_sampling_from_probs_cpu>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&top_k_top_p_sampling_from_probs_cuda>, "sampling.cu").sm(90))}},
    {.signature = "min_p_sampling_from_probs(Tensor<f32>[B,V] probs, Tensor<f32>[B] min_p, "
                  "Tensor<i32>(a!)[B] out_ids, Tensor<i64>(b!)[2] rng) -> ()",
     .dtypes = "f32",
     .description = "One token per row among those with p >= min_p * max p (FlashInfer's "
                    "min_p_sampling_from_probs; min_p <= 0 keeps all), drawn as "
                    "top_k_top_p_sampling_from_probs draws; rng[1] += 1 per call",
     .impls = {cpu(bind<&min_p_sampling_from_probs_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&min_p_sampling_from_probs_cuda>, "sampling.cu").sm(90))}},
};

}  // namespace
}  // namespace kreg::sampling

KREG_GROUP("sampling", kreg::sampling::kOps);
