// The kvcache group's ops, registered by op (kreg/plugin.hpp).
#include "kvcache.hpp"

namespace kreg::kvcache {
namespace {

// Every CUDA implementation is not deterministic: with duplicate indices, which row lands
// is unspecified.
constexpr Op kOps[] = {
    {.signature = "store(Tensor[T,Hk,D] k, Tensor[T,Hk,D] v, Tensor<i32|i64>[T] slot_mapping, "
                  "Tensor<bf16|f16|f32|f8e4m3>(a!)[P,S,Hk,D] k_cache, "
                  "Tensor<bf16|f16|f32|f8e4m3>(b!)[P,S,Hk,D] v_cache, float k_scale=1.0, float "
                  "v_scale=1.0) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "k_cache/v_cache[P,S,Hk,D] viewed as [P*S,Hk,D]: row slot_mapping[t] = k[t] / "
                    "v[t] for every t with 0 <= slot < P*S (-1 pads; other out-of-range slots are "
                    "skipped too). Caches of k's dtype get an exact copy (scales must be 1.0); "
                    "f8e4m3 caches get round_e4m3(clamp(x / scale, +-448)), x / scale one fp32 "
                    "division, round to nearest even.",
     .impls = {cpu(bind<&store_cpu>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&store_cuda>, "store.cu").without(KREG_TRAIT_DETERMINISTIC))}},
    {.signature = "set_mla_kv_buffer(Tensor(a!)[P,W] kv_buffer, Tensor<i32|i64>[N] loc, "
                  "Tensor[N,Dn] k_nope, Tensor[N,Dr] k_rope) -> ()",
     .dtypes = "bf16|f16|f32|f8e4m3",
     .description = "kv_buffer[loc[i]] = concat(k_nope[i], k_rope[i]) for every i with 0 <= loc[i] "
                    "< P (-1 pads; other out-of-range rows are skipped too); W must equal Dn + Dr; "
                    "an exact copy in any of the dtypes (DeepSeek MLA: Dn = 512, Dr = 64).",
     .impls = {cpu(bind<&set_mla_kv_buffer_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&set_mla_kv_buffer_cuda>, "store.cu")
                                .without(KREG_TRAIT_DETERMINISTIC))}},
    {.signature = "transfer(Tensor<i64>[N] src_idx, Tensor<i64>[N] dst_idx, Tensor@host src, "
                  "Tensor@host(a!) dst) -> ()",
     .dtypes = "u8|i8|i16|i32|i64|bf16|f16|f32|f64|bool|f8e4m3|f8e5m2",
     .description = "dst[dst_idx[i]] = src[src_idx[i]] for every i with 0 <= src_idx[i] < src rows "
                    "and 0 <= dst_idx[i] < dst rows (other rows are skipped: -1 pads); src and dst "
                    "are contiguous [rows, ...] of one dtype whose rows (everything after "
                    "dimension 0) have the same size, a positive multiple of 16 bytes; a byte "
                    "copy. The indices live on the call's device; src and dst each on that device "
                    "or in page-locked host memory (kDLCUDAHost, or kDLCPU as PyTorch exports "
                    "pinned tensors: verified page-locked, pageable memory is refused), so one op "
                    "moves rows device->host, host->device and device->device. Duplicate dst "
                    "indices: one candidate row's words land (CPU: the last). The copy is ordered "
                    "on the stream: host-side results are visible after the stream synchronizes.",
     .impls = {cpu(bind<&transfer_cpu>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&transfer_cuda>, "transfer.cu").without(KREG_TRAIT_DETERMINISTIC))}},
    {.signature = "transfer_layers(Tensor<i64>[N] src_idx, Tensor<i64>[N] dst_idx, Tensor<i64>[L] "
                  "src_ptrs, Tensor<i64>[L] dst_ptrs, int row_bytes, int src_rows, int dst_rows, "
                  "int src_stride=0, int dst_stride=0) -> ()",
     .dtypes = "i64",
     .description = "For each layer l < L with src_ptrs[l] != 0 and dst_ptrs[l] != 0, and each i "
                    "with 0 <= src_idx[i] < src_rows and 0 <= dst_idx[i] < dst_rows: the row_bytes "
                    "bytes at dst_ptrs[l] + dst_idx[i] * dst_stride = those at src_ptrs[l] + "
                    "src_idx[i] * src_stride (a stride of 0 means row_bytes; otherwise >= "
                    "row_bytes). row_bytes is a positive multiple of 16. The tables hold raw "
                    "addresses of device memory or page-locked host memory that the call's device "
                    "can access (CPU backend: host addresses); the caller guarantees them, they "
                    "are not verified. 16-byte aligned layers (bases and strides) move 16-byte "
                    "words, others bytes. One launch covers every layer.",
     // Writes through the raw addresses of its tables (no argument says so).
     .traits = kDefaultTraits | KREG_TRAIT_MUTATES,
     .impls = {cpu(bind<&transfer_layers_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&transfer_layers_cuda>, "transfer.cu")
                                .without(KREG_TRAIT_DETERMINISTIC))}},
};

}  // namespace
}  // namespace kreg::kvcache

KREG_GROUP("kvcache", kreg::kvcache::kOps);
