// The memory group's implementations, listed as data.
#include "memory.hpp"

namespace kreg::memory {
namespace {

constexpr const char* kCopyRows =
    "copy_rows(Tensor src, Tensor(a!) dst, Tensor<i32|i64>[1] offset, Tensor<i32|i64>[1] count, "
    "bool offset_on_src) -> ()";
// Bytes are bytes: every dtype kreg can name.
constexpr const char* kAnyDtype = "f32|f16|bf16|f64|i8|i16|i32|i64|u8|bool|f8e4m3|f8e5m2";

constexpr const char* kCopyRowsContract =
    "Row-range copy with the range on the device. src[Ns,...] and dst[Nd,...] share dtype, "
    "rank (>= 1) and trailing shape; offset and count are one-element i32/i64 tensors on the "
    "same device. offset_on_src: dst[0:n] = src[offset:offset+n]; else dst[offset:offset+n] = "
    "src[0:n]. n = count clamped so both ranges fit (offset < 0 or count <= 0: nothing); rows "
    "of dst outside the range are untouched; src and dst must not overlap.";

constexpr KernelDef kKernels[] = {
    {.op = "memory.copy_rows",
     .backend = "cpu",
     .caps = kCpu,
     .signature = kCopyRows,
     .dtypes = kAnyDtype,
     .traits = KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_MUTATES,
     .priority = 0,
     .description = kCopyRowsContract,
     .impl = bind<&copy_rows_cpu>,
     .source = "reference.cpp"},
#if defined(KREG_PLUGIN_HAS_CUDA)
    {.op = "memory.copy_rows",
     .backend = "cuda",
     .caps = kCudaSm75Plus,
     .signature = kCopyRows,
     .dtypes = kAnyDtype,
     .traits = KREG_TRAIT_GRAPH_SAFE | KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_MUTATES,
     .priority = 100,
     .description = "Row-range copy reading offset/count on the device (no host sync): 16-byte "
                    "words when rows and pointers allow, grid sized from min(Ns, Nd) rows. "
                    "Same contract as the cpu reference.",
     .impl = bind<&copy_rows_cuda>,
     .source = "copy_rows.cu"},
#endif
};

}  // namespace
}  // namespace kreg::memory

KREG_PLUGIN("memory", "0.1.0", kreg::memory::kKernels);
