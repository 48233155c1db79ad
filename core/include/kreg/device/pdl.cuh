// Programmatic dependent launch (sm90+), when the caller asks for it (KREG_LAUNCH_PDL in
// the call frame's launch flags, Context::pdl()).
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start
// while the kernel before it on the stream is still running: its blocks are scheduled as
// soon as the previous grid signals (griddepcontrol.launch_dependents, or its end), which
// hides the launch latency that dominates decode-sized calls. Such a kernel must not read
// anything the previous kernel writes before griddepcontrol.wait, which returns once the
// previous grid has completed and its memory is visible; so kernels call pdl_wait() before
// their first dependent load and pdl_launch_dependents() once the next kernel may start
// being scheduled. Both are no-ops without PDL (a normal launch has no pending
// prerequisite) and below sm90.
//
//   my_kernel<<<...>>>  becomes  device::launch(my_kernel, grid, block, 0, stream, ctx.pdl(),
//   args...)
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace kreg::device {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the current device can take programmatic launches (compute capability >= 9.0),
// asked once per device.
inline bool pdl_supported() {
  constexpr int kMaxDevices = 64;
  static signed char known[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no (benign race)
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  if (known[dev] == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    known[dev] = major >= 9 ? 1 : -1;
  }
  return known[dev] > 0;
}

// The launch configuration of launch_clusters: `cluster_x` blocks a cluster along x (1: no
// cluster attribute) and programmatic stream serialization when `programmatic`. Not
// copyable: `config.attrs` points into the object.
struct ClusterLaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[2] = {};

  ClusterLaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, unsigned cluster_x,
                      bool programmatic) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    unsigned n = 0;
    if (cluster_x > 1) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = cluster_x;
      attr[n].val.clusterDim.y = 1;
      attr[n].val.clusterDim.z = 1;
      ++n;
    }
    if (programmatic) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    config.attrs = attr;
    config.numAttrs = n;
  }
  ClusterLaunchConfig(const ClusterLaunchConfig&) = delete;
  ClusterLaunchConfig& operator=(const ClusterLaunchConfig&) = delete;
};

// Launches `kernel` in thread block clusters of `cluster_x` blocks along x (sm90+; 1: no
// cluster), with programmatic stream serialization when `pdl` is asked for and the device
// supports it; the launch's error is returned, and also left for cudaGetLastError
// (launch_status) as <<<>>> leaves it. A size above the portable 8 needs the kernel's
// cudaFuncAttributeNonPortableClusterSizeAllowed, which the caller sets.
template <typename... Params, typename... Args>
cudaError_t launch_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, bool pdl, unsigned cluster_x, Args&&... args) {
  const bool programmatic = pdl && pdl_supported();
  if (cluster_x <= 1 && !programmatic) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return cudaPeekAtLastError();
  }
  const ClusterLaunchConfig launch(grid, block, smem, stream, cluster_x, programmatic);
  return cudaLaunchKernelEx(&launch.config, kernel,
                            static_cast<Params>(std::forward<Args>(args))...);
}

// How many clusters of `cluster_x` blocks of `block` threads and `smem` bytes of dynamic
// shared memory the current device runs at once (cudaOccupancyMaxActiveClusters); 0 when
// it cannot or the query fails (the error is cleared: the caller falls back to a launch
// without clusters or with fewer blocks). The kernel's shared-memory and non-portable
// cluster attributes must be set first, as for the launch.
template <typename... Params>
int max_active_clusters(void (*kernel)(Params...), unsigned cluster_x, dim3 block, size_t smem) {
  const ClusterLaunchConfig query(dim3(cluster_x), block, smem, nullptr, cluster_x, false);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &query.config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

// launch_clusters without clusters: the usual launch of a kernel that may take PDL.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  return launch_clusters(kernel, grid, block, smem, stream, pdl, 1u, std::forward<Args>(args)...);
}

}  // namespace kreg::device
