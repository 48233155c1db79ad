// The kv_canary group's ops, registered by op (kreg/plugin.hpp).
#include "kv_canary.hpp"

namespace kreg::kv_canary {
namespace {

// kv (optional: omitted, only the records are stamped / checked) is [S, ...] of any dtype,
// read as rows of bytes. Its dtype set is spelled out on the tensor rather than shared:
// the core takes the shared dtype from the first tensor that uses it, which must not be an
// omitted optional one.
#define KREG_KV_DTYPES "u8|i8|i16|i32|i64|bf16|f16|f32|f64|bool|f8e4m3|f8e5m2"
#define KREG_KV_TENSOR "Tensor?<" KREG_KV_DTYPES "> kv"

constexpr Op kOps[] = {
    {.signature =
         "stamp(Tensor<i64>(a!)[S,4] canary, Tensor<i64>[N,4] plan, " KREG_KV_TENSOR ") -> ()",
     .dtypes = KREG_KV_DTYPES,
     .description =
         "For each plan row (slot, token, position, prev_slot) with 0 <= slot < S and "
         "-1 <= prev_slot < S: canary[slot] = (token, position, chain, data) with chain = "
         "fmix64(fmix64(prev ^ token) + position + 0x9e3779b97f4a7c15), prev = the chain of the "
         "plan "
         "row just before when prev_slot is that row's slot, else canary[prev_slot].chain, or "
         "0x4b5643414e415259 for prev_slot = -1; data = the 64-bit hash of kv[slot]'s bytes when "
         "kv[S,...] is given (rows a multiple of 8 bytes), else 0. Other rows are skipped. A "
         "prev_slot not stamped by the row before must not be stamped elsewhere in the same call.",
     .impls = {cpu(bind<&stamp_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&stamp_cuda>, "canary.cu"))}},
    {.signature =
         "verify(Tensor<i64>[S,4] canary, Tensor<i64>[N,4] plan, "
         "Tensor<i64>(a!)[C,4] violations, Tensor<i64>(b!)[1] count, " KREG_KV_TENSOR ") -> ()",
     .dtypes = KREG_KV_DTYPES,
     .description =
         "For each plan row (slot, token, position, prev_slot): reason bits 16 when slot or "
         "prev_slot "
         "is out of range, else 1 token != canary[slot].token, 2 position differs, 4 chain != "
         "mix(chain of prev_slot or seed, token, position), 8 (kv given) data hash of kv[slot] "
         "differs. Each failing row appends (slot, reason, expected, found) of its lowest reason "
         "at "
         "index count++ of violations[C,4] when that index < C; count (cumulative, never reset "
         "here) "
         "keeps counting past C.",
     // Not deterministic on CUDA: the violations' order in the ring buffer depends on
     // scheduling.
     .impls = {cpu(bind<&verify_cpu>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&verify_cuda>, "canary.cu").without(KREG_TRAIT_DETERMINISTIC))}},
};

#undef KREG_KV_TENSOR
#undef KREG_KV_DTYPES

}  // namespace
}  // namespace kreg::kv_canary

KREG_GROUP("kv_canary", kreg::kv_canary::kOps);
