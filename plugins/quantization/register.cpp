// The quantization group's ops, registered by op (kreg/plugin.hpp). docs/ops/quantization.md
// has the full contract.
#include "hadamard.hpp"
#include "quantization.hpp"

namespace kreg::quantization {
namespace {

#define KREG_QUANT_GROUP_ATTRS "int group_size=128, float eps=1e-10, bool scale_ue8m0=false"

constexpr Op kOps[] = {
    {.signature = "per_token_group_quant_fp8(Tensor[T,H] x, Tensor<f8e4m3>(a!)[T,H] out, "
                  "Tensor<f32>(b!)[T,G] out_scales, " KREG_QUANT_GROUP_ATTRS ") -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Per-token-group FP8: for every row t and group g of group_size columns (G = "
                    "H / group_size): s = max(max|x|, eps) / 448 (fp32), rounded up to a power of "
                    "two if scale_ue8m0; out = e4m3(clamp(x / s, +-448)) (fp32 division, nearest "
                    "even); out_scales[t, g] = s. SGLang's per_token_group_quant_fp8; CUDA: a few "
                    "lanes per group, one 16-byte load each, the max by shuffles",
     .impls = {cpu(bind<&group_quant_fp8_cpu<GroupOp::kFp8>>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&group_quant_fp8_cuda<GroupOp::kFp8>>, "group_quant.cu"))}},
    {.signature = "per_token_group_quant_fp8_col_major(Tensor[T,H] x, Tensor<f8e4m3>(a!)[T,H] "
                  "out, Tensor<f32>(b!)[G,P] out_scales, " KREG_QUANT_GROUP_ATTRS ") -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "per_token_group_quant_fp8 with DeepGEMM's column-major scales: out_scales is "
                    "the contiguous [G, P] storage (P >= T; P = T rounded up to 4 is SGLang's "
                    "scale_tma_aligned), out_scales[g, t] = s; columns T..P-1 are not written",
     .impls = {cpu(bind<&group_quant_fp8_cpu<GroupOp::kFp8ColMajor>>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&group_quant_fp8_cuda<GroupOp::kFp8ColMajor>>, "group_quant.cu"))}},
    {.signature = "silu_and_mul_per_token_group_quant_fp8(Tensor[T,2*H] x, Tensor<f8e4m3>(a!)[T,H] "
                  "out, Tensor<f32>(b!)[T,G] out_scales, " KREG_QUANT_GROUP_ATTRS ") -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "per_token_group_quant_fp8 of y = silu(x[:, :H]) * x[:, H:], y in fp32 (not "
                    "rounded to x's dtype), silu(a) = a / (1 + exp(-a)) with the group's own fp32 "
                    "exp (docs/ops/quantization.md)",
     .impls = {cpu(bind<&group_quant_fp8_cpu<GroupOp::kSiluFp8>>, "reference.cpp"),
               KREG_IF_CUDA(
                   cuda(bind<&group_quant_fp8_cuda<GroupOp::kSiluFp8>>, "group_quant.cu"))}},
    {.signature =
         "silu_and_mul_per_token_group_quant_fp8_col_major(Tensor[T,2*H] x, "
         "Tensor<f8e4m3>(a!)[T,H] out, Tensor<f32>(b!)[G,P] out_scales, " KREG_QUANT_GROUP_ATTRS
         ") -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "silu_and_mul_per_token_group_quant_fp8 with column-major scales [G, P], P >= "
                    "T, as per_token_group_quant_fp8_col_major",
     .impls = {cpu(bind<&group_quant_fp8_cpu<GroupOp::kSiluFp8ColMajor>>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&group_quant_fp8_cuda<GroupOp::kSiluFp8ColMajor>>,
                                 "group_quant.cu"))}},
    {.signature = "per_token_group_quant_int8(Tensor[T,H] x, Tensor<i8>(a!)[T,H] out, "
                  "Tensor<f32>(b!)[T,G] out_scales, int group_size=128, float eps=1e-10) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Per-token-group int8: s = max(max|x|, eps) / 127 (fp32); out = "
                    "rint(clamp(x / s, +-127)) (fp32 division, ties to even); out_scales[t, g] = "
                    "s. SGLang's per_token_group_quant_int8",
     .impls = {cpu(bind<&group_quant_int8_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&group_quant_int8_cuda>, "group_quant.cu"))}},
    {.signature = "per_token_quant_fp8(Tensor[T,H] x, Tensor<f8e4m3>(a!)[T,H] out, "
                  "Tensor<f32>(b!)[T] out_scales) -> ()",
     .dtypes = "bf16|f16|f32",
     .description =
         "Per-token FP8: s = max(max over the row of |x|, 1e-10) / 448 (fp32); out = "
         "e4m3(clamp(x / s, +-448)); out_scales[t] = s. SGLang's sgl_per_token_quant_fp8 "
         "(which has no eps); CUDA: one block per row, the row in registers",
     .impls = {cpu(bind<&token_quant_fp8_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&token_quant_fp8_cuda>, "token_quant.cu"))}},
    {.signature = "per_tensor_quant_fp8(Tensor[T,H] x, Tensor<f8e4m3>(a!)[T,H] out, "
                  "Tensor<f32>(b!)[1] scale, bool is_static=false) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Per-tensor FP8: static: s = scale[0] as given; dynamic: scale[0] = s = "
                    "max(max|x|, 1e-10) / 448 found on the device in the same call; out = "
                    "e4m3(clamp(x / s, +-448)); an empty x leaves scale as it is. SGLang's "
                    "sgl_per_tensor_quant_fp8; CUDA: memset, a max kernel (atomicMax on the "
                    "scale's bits), the quantize kernel; no host synchronisation",
     .impls = {cpu(bind<&tensor_quant_fp8_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&tensor_quant_fp8_cuda>, "token_quant.cu"))}},
    {.signature = "hadamard_transform(Tensor[T,N] x, Tensor(a!)[T,N] out, float scale=1.0) -> ()",
     .dtypes = "bf16|f16|f32",
     .description = "Fast Walsh-Hadamard transform of each row: out = scale * x * H_N, H_N the "
                    "Sylvester Hadamard matrix in natural order, N a power of two in [2, 32768]; "
                    "fp32 butterflies, one rounding at the store; out may alias x. Dao-AILab's "
                    "fast-hadamard-transform (SGLang); CUDA: rows in registers, shuffles and one "
                    "swizzled shared-memory exchange",
     .impls = {cpu(bind<&hadamard_transform_cpu>, "hadamard_reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&hadamard_transform_cuda>, "hadamard.cu"))}},
};

#undef KREG_QUANT_GROUP_ATTRS

}  // namespace
}  // namespace kreg::quantization

KREG_GROUP("quantization", kreg::quantization::kOps);
