// The grammar group's ops, registered by op (kreg/plugin.hpp). docs/ops/grammar.md has
// the details.
//
// `indices` would be `Tensor?<i32>[R]`, but an optional tensor's named dimensions must be
// bound by a required tensor and no other tensor has R; so it is rank-free in the
// signature and the kernels check that it is one-dimensional.
#include "grammar.hpp"

namespace kreg::grammar {
namespace {

constexpr Op kOps[] = {
    {.signature = "apply_token_bitmask(Tensor(a!)[B,V] logits, Tensor<i32>[B,W] bitmask, "
                  "Tensor?<i32> indices) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "xgrammar's apply_token_bitmask_inplace: logits[b, v] = -inf where bit v % "
                    "32 of bitmask[b, v / 32] is clear, allowed logits untouched; W >= ceil(V / "
                    "32) (extra bits ignored); with indices [R], only rows indices[r] (logits and "
                    "bitmask row alike; CPU refuses an index outside [0, B), CUDA skips it). "
                    "CUDA: a thread per mask word (32 logits), all-allowed words return after "
                    "one load, 16-byte -inf stores, read-modify-write only for mixed vectors.",
     .impls = {cpu(bind<&apply_token_bitmask_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&apply_token_bitmask_cuda>, "apply_token_bitmask.cu"))}},
};

}  // namespace
}  // namespace kreg::grammar

KREG_GROUP("grammar", kreg::grammar::kOps);
