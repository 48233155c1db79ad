// The empty kernel of kreg-bench-launch (launch_bench.cpp): the cost of a launch alone.
#include <cuda_runtime.h>

namespace {
__global__ void empty_kernel() {}
}  // namespace

void kreg_bench_launch_empty(cudaStream_t stream) { empty_kernel<<<1, 32, 0, stream>>>(); }
