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

constexpr const char* kTransfer =
    "transfer(Tensor<i64>[N] src_idx, Tensor<i64>[N] dst_idx, Tensor@host src, "
    "Tensor@host(a!) dst) -> ()";
constexpr const char* kTransferDtypes = "u8|i8|i16|i32|i64|bf16|f16|f32|f64|bool|f8e4m3|f8e5m2";
constexpr const char* kTransferContract =
    "dst[dst_idx[i]] = src[src_idx[i]] for every i with 0 <= src_idx[i] < src rows and "
    "0 <= dst_idx[i] < dst rows (other rows are skipped: -1 pads); src and dst are contiguous "
    "[rows, ...] of one dtype whose rows (everything after dimension 0) have the same size, a "
    "positive multiple of 16 bytes; a byte copy. The indices live on the call's device; src and "
    "dst each on that device or in page-locked host memory (kDLCUDAHost, or kDLCPU as PyTorch "
    "exports pinned tensors: verified page-locked, pageable memory is refused), so one op moves "
    "rows device->host, host->device and device->device. Duplicate dst indices: one candidate "
    "row's words land (CPU: the last). The copy is ordered on the stream: host-side results "
    "are visible after the stream synchronizes.";

constexpr const char* kTransferLayers =
    "transfer_layers(Tensor<i64>[N] src_idx, Tensor<i64>[N] dst_idx, Tensor<i64>[L] src_ptrs, "
    "Tensor<i64>[L] dst_ptrs, int row_bytes, int src_rows, int dst_rows, int src_stride=0, "
    "int dst_stride=0) -> ()";
constexpr const char* kTransferLayersDtypes = "i64";
constexpr const char* kTransferLayersContract =
    "For each layer l < L with src_ptrs[l] != 0 and dst_ptrs[l] != 0, and each i with "
    "0 <= src_idx[i] < src_rows and 0 <= dst_idx[i] < dst_rows: the row_bytes bytes at "
    "dst_ptrs[l] + dst_idx[i] * dst_stride = those at src_ptrs[l] + src_idx[i] * src_stride "
    "(a stride of 0 means row_bytes; otherwise >= row_bytes). row_bytes is a positive multiple "
    "of 16. The tables hold raw addresses of device memory or page-locked host memory that the "
    "call's device can access (CPU backend: host addresses); the caller guarantees them, they "
    "are not verified. 16-byte aligned layers (bases and strides) move 16-byte words, others "
    "bytes. One launch covers every layer.";

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
    {.op = "kvcache.transfer",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kTransfer,
     .dtypes = kTransferDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kTransferContract,
     .impl = bind<&transfer_cpu>,
     .source = "reference.cpp"},
    {.op = "kvcache.transfer_layers",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kTransferLayers,
     .dtypes = kTransferLayersDtypes,
     .traits = kCpuTraits,
     .priority = 0,
     .description = kTransferLayersContract,
     .impl = bind<&transfer_layers_cpu>,
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
    {.op = "kvcache.transfer",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kTransfer,
     .dtypes = kTransferDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = kTransferContract,
     .impl = bind<&transfer_cuda>,
     .source = "transfer.cu"},
    {.op = "kvcache.transfer_layers",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kTransferLayers,
     .dtypes = kTransferLayersDtypes,
     .traits = kCudaTraits,
     .priority = 100,
     .description = kTransferLayersContract,
     .impl = bind<&transfer_layers_cuda>,
     .source = "transfer.cu"},
#endif
};

}  // namespace
}  // namespace kreg::kvcache

KREG_PLUGIN("kvcache", "0.1.0", kreg::kvcache::kKernels);
