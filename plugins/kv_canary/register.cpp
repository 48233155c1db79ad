// The kv_canary group's implementations, listed as data.
#include "kv_canary.hpp"

namespace kreg::kv_canary {
namespace {

// kv (optional: omitted, only the records are stamped / checked) is [S, ...] of any dtype,
// read as rows of bytes. Its dtype set is spelled out on the tensor rather than shared:
// the core takes the shared dtype from the first tensor that uses it, which must not be an
// omitted optional one.
#define KREG_KV_TENSOR "Tensor?<u8|i8|i16|i32|i64|bf16|f16|f32|f64|bool|f8e4m3|f8e5m2> kv"
constexpr const char* kStamp =
    "stamp(Tensor<i64>(a!)[S,4] canary, Tensor<i64>[N,4] plan, " KREG_KV_TENSOR ") -> ()";
constexpr const char* kVerify =
    "verify(Tensor<i64>[S,4] canary, Tensor<i64>[N,4] plan, Tensor<i64>(a!)[C,4] violations, "
    "Tensor<i64>(b!)[1] count, " KREG_KV_TENSOR ") -> ()";
#undef KREG_KV_TENSOR
constexpr const char* kKvDtypes = "u8|i8|i16|i32|i64|bf16|f16|f32|f64|bool|f8e4m3|f8e5m2";

constexpr const char* kStampContract =
    "For each plan row (slot, token, position, prev_slot) with 0 <= slot < S and "
    "-1 <= prev_slot < S: canary[slot] = (token, position, chain, data) with chain = "
    "fmix64(fmix64(prev ^ token) + position + 0x9e3779b97f4a7c15), prev = the chain of the plan "
    "row just before when prev_slot is that row's slot, else canary[prev_slot].chain, or "
    "0x4b5643414e415259 for prev_slot = -1; data = the 64-bit hash of kv[slot]'s bytes when "
    "kv[S,...] is given (rows a multiple of 8 bytes), else 0. Other rows are skipped. A "
    "prev_slot not stamped by the row before must not be stamped elsewhere in the same call.";
constexpr const char* kVerifyContract =
    "For each plan row (slot, token, position, prev_slot): reason bits 16 when slot or prev_slot "
    "is out of range, else 1 token != canary[slot].token, 2 position differs, 4 chain != "
    "mix(chain of prev_slot or seed, token, position), 8 (kv given) data hash of kv[slot] "
    "differs. Each failing row appends (slot, reason, expected, found) of its lowest reason at "
    "index count++ of violations[C,4] when that index < C; count (cumulative, never reset here) "
    "keeps counting past C.";

constexpr KernelDef kKernels[] = {
    {.op = "kv_canary.stamp",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kStamp,
     .dtypes = kKvDtypes,
     .traits = KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = kStampContract,
     .impl = bind<&stamp_cpu>,
     .source = "reference.cpp"},
    {.op = "kv_canary.verify",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kVerify,
     .dtypes = kKvDtypes,
     .traits = KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = kVerifyContract,
     .impl = bind<&verify_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "kv_canary.stamp",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kStamp,
     .dtypes = kKvDtypes,
     .traits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = kStampContract,
     .impl = bind<&stamp_cuda>,
     .source = "canary.cu"},
    // Not deterministic: the violations' order in the ring buffer depends on scheduling.
    {.op = "kv_canary.verify",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kVerify,
     .dtypes = kKvDtypes,
     .traits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = kVerifyContract,
     .impl = bind<&verify_cuda>,
     .source = "canary.cu"},
#endif
};

}  // namespace
}  // namespace kreg::kv_canary

KREG_PLUGIN("kv_canary", "0.1.0", kreg::kv_canary::kKernels);
