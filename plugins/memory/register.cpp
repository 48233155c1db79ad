// The memory group's ops, registered by op (kreg/plugin.hpp).
#include "memory.hpp"

namespace kreg::memory {
namespace {

constexpr Op kOps[] = {
    {.signature = "copy_rows(Tensor src, Tensor(a!) dst, Tensor<i32|i64>[1] offset, "
                  "Tensor<i32|i64>[1] count, bool offset_on_src) -> ()",
     // Bytes are bytes: every dtype kreg can name.
     .dtypes = "f32|f16|bf16|f64|i8|i16|i32|i64|u8|bool|f8e4m3|f8e5m2",
     .description =
         "Row-range copy with the range on the device. src[Ns,...] and dst[Nd,...] share dtype, "
         "rank (>= 1) and trailing shape; offset and count are one-element i32/i64 tensors on "
         "the same device. offset_on_src: dst[0:n] = src[offset:offset+n]; else "
         "dst[offset:offset+n] = src[0:n]. n = count clamped so both ranges fit (offset < 0 or "
         "count <= 0: nothing); rows of dst outside the range are untouched; src and dst must "
         "not overlap. CUDA: reads offset/count on the device (no host sync), 16-byte words "
         "when rows and pointers allow, grid sized from min(Ns, Nd) rows.",
     .impls = {cpu(bind<&copy_rows_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&copy_rows_cuda>, "copy_rows.cu"))}},
};

}  // namespace
}  // namespace kreg::memory

KREG_GROUP("memory", kreg::memory::kOps);
