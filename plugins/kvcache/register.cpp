// The kvcache group's implementations, listed as data.
#include "kvcache.hpp"

namespace kreg::kvcache {
namespace {

constexpr const char* kStore =
    "store(Tensor[T,Hk,D] k, Tensor[T,Hk,D] v, Tensor<i32|i64>[T] slot_mapping, "
    "Tensor<bf16|f16|f32|f8e4m3>(a!)[P,S,Hk,D] k_cache, "
    "Tensor<bf16|f16|f32|f8e4m3>(b!)[P,S,Hk,D] v_cache, float k_scale=1.0, "
    "float v_scale=1.0) -> ()";
constexpr const char* kStoreDtypes = "bf16|f16|f32";
constexpr const char* kStoreContract =
    "k_cache/v_cache[P,S,Hk,D] viewed as [P*S,Hk,D]: row slot_mapping[t] = k[t] / v[t] for every "
    "t with 0 <= slot < P*S (-1 pads; other out-of-range slots are skipped too). Caches of k's "
    "dtype get an exact copy (scales must be 1.0); f8e4m3 caches get "
    "round_e4m3(clamp(x / scale, +-448)), x / scale one fp32 division, round to nearest even.";

constexpr const char* kSetMla =
    "set_mla_kv_buffer(Tensor(a!)[P,W] kv_buffer, Tensor<i32|i64>[N] loc, Tensor[N,Dn] k_nope, "
    "Tensor[N,Dr] k_rope) -> ()";
constexpr const char* kSetMlaDtypes = "bf16|f16|f32|f8e4m3";
constexpr const char* kSetMlaContract =
    "kv_buffer[loc[i]] = concat(k_nope[i], k_rope[i]) for every i with 0 <= loc[i] < P (-1 pads; "
    "other out-of-range rows are skipped too); W must equal Dn + Dr; an exact copy in any of the "
    "dtypes (DeepSeek MLA: Dn = 512, Dr = 64).";

constexpr uint32_t kCpuTraits = KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_MUTATES;
// Not marked deterministic: with duplicate indices, which row lands is unspecified.
constexpr uint32_t kCudaTraits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_MUTATES;

constexpr KernelDef kKernels[] = {
    {.op = "kvcache.store",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kStore,
     .dtypes = kStoreDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kStoreContract,
     .impl = bind<&store_cpu>,
     .source = "reference.cpp"},
    {.op = "kvcache.set_mla_kv_buffer",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kSetMla,
     .dtypes = kSetMlaDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kSetMlaContract,
     .impl = bind<&set_mla_kv_buffer_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "kvcache.store",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kStore,
     .dtypes = kStoreDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = kStoreContract,
     .impl = bind<&store_cuda>,
     .source = "store.cu"},
    {.op = "kvcache.set_mla_kv_buffer",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kSetMla,
     .dtypes = kSetMlaDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = kSetMlaContract,
     .impl = bind<&set_mla_kv_buffer_cuda>,
     .source = "store.cu"},
#endif
};

}  // namespace
}  // namespace kreg::kvcache

KREG_PLUGIN("kvcache", "0.1.0", kreg::kvcache::kKernels);
