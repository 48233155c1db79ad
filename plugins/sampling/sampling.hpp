// The sampling group: top-k / top-p renormalization and sampling one token per row from
// a filtered distribution (top-k then top-p, or min-p), with Philox random numbers keyed
// by a device-side (seed, offset) that every call advances. docs/ops/sampling.md states
// the exact contract; filter_math.hpp and philox.hpp hold the arithmetic both backends
// share.
//
// Every function trusts its frame: the core has checked dtypes (probs f32, top_k i32,
// top_p / min_p f32, out_ids i32, rng i64), ranks, the named dimensions, device and
// contiguity.
#pragma once

#include "kreg/plugin.hpp"

namespace kreg::sampling {

// CPU references (reference.cpp): sort-based, the definition the kernels must match.
KernelStatus top_k_renorm_probs_cpu(Context& ctx, const DLTensor& probs, const DLTensor& top_k,
                                    DLTensor& out);
KernelStatus top_p_renorm_probs_cpu(Context& ctx, const DLTensor& probs, const DLTensor& top_p,
                                    DLTensor& out);
KernelStatus top_k_top_p_sampling_from_probs_cpu(Context& ctx, const DLTensor& probs,
                                                 const DLTensor& top_k, const DLTensor& top_p,
                                                 DLTensor& out_ids, DLTensor& rng);
KernelStatus min_p_sampling_from_probs_cpu(Context& ctx, const DLTensor& probs,
                                           const DLTensor& min_p, DLTensor& out_ids, DLTensor& rng);

#if defined(KREG_PLUGIN_HAS_CUDA)
// CUDA kernels (sampling.cu): one thread-block cluster per row, the row held in the
// cluster's shared memory. They enqueue on ctx.stream() and return without waiting.
KernelStatus top_k_renorm_probs_cuda(Context& ctx, const DLTensor& probs, const DLTensor& top_k,
                                     DLTensor& out);
KernelStatus top_p_renorm_probs_cuda(Context& ctx, const DLTensor& probs, const DLTensor& top_p,
                                     DLTensor& out);
KernelStatus top_k_top_p_sampling_from_probs_cuda(Context& ctx, const DLTensor& probs,
                                                  const DLTensor& top_k, const DLTensor& top_p,
                                                  DLTensor& out_ids, DLTensor& rng);
KernelStatus min_p_sampling_from_probs_cuda(Context& ctx, const DLTensor& probs,
                                            const DLTensor& min_p, DLTensor& out_ids,
                                            DLTensor& rng);
#endif

}  // namespace kreg::sampling
