// CUDA kernels for kvcache.transfer and kvcache.transfer_layers: indexed copies of KV
// rows between device memory and page-locked host memory, in either direction, done by
// the GPU's own loads and stores (zero-copy: host memory is read and written over the
// link, no staging buffer, no copy engine).
//
// Launch shape: one kernel for both ops, 256-thread blocks, blockIdx.y = layer (a
// grid-stride loop over layers past 65535), blockIdx.x over rows (a grid-stride loop).
// A row is owned by a group of G lanes, G the smallest power of two covering its 16-byte
// words, at most 32 (a 256-byte row: 16 lanes, two rows per warp; 4 KiB: one warp). Each
// lane loads 8 words before it stores any: kW words of each of 8 / kW rows, kW the power
// of two covering the lane's share of a row (4 KiB: 8 words of one row; 256 bytes: one
// word of each of 8 rows). That keeps 128 bytes in flight per lane; at 72-105 registers
// 2-3 blocks fit on an SM, 64-96 KiB in flight per SM, far above what the link needs
// (PCIe Gen5 ~55 GB/s times a few microseconds is a few hundred KiB for the whole GPU)
// and enough for device memory. The grid is one wave of resident blocks (occupancy API),
// split evenly between the layers.
//
// A layer whose bases or strides are not 16-byte aligned is copied byte by byte (correct,
// slow); transfer's tensors are 16-byte aligned whenever the allocator's are.
//
// Indices outside their ranges skip the row; duplicate destination indices race (each
// 16-byte word comes from one of the candidate rows).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kvcache.hpp"

namespace kreg::kvcache {
namespace {

constexpr int kThreads = 256;
constexpr int kWordsInFlight = 8;   // 16-byte words a lane loads before it stores
constexpr int kMaxBlocksPerSm = 8;  // 8 x 256 threads: a full SM

struct TransferParams {
  const int64_t* src_idx;
  const int64_t* dst_idx;
  int64_t n;
  // transfer: the one layer's bases (tables null); transfer_layers: the tables.
  const uint8_t* src;
  uint8_t* dst;
  const int64_t* src_ptrs;
  const int64_t* dst_ptrs;
  int64_t layers;
  int64_t src_rows;
  int64_t dst_rows;
  int64_t src_stride;  // bytes from one row to the next
  int64_t dst_stride;
  int64_t row_bytes;  // a multiple of 16
  int log2_lanes;     // lanes per row: 1 << log2_lanes
};

__device__ __forceinline__ bool row_in_range(const TransferParams& p, int64_t s, int64_t d) {
  return s >= 0 && s < p.src_rows && d >= 0 && d < p.dst_rows;
}

// One layer's rows as single bytes: the path for bases or strides that are not 16-byte
// aligned (kept out of line so it costs the fast path nothing).
__device__ __noinline__ void copy_rows_bytewise(const TransferParams& p, const uint8_t* src,
                                                uint8_t* dst, int64_t group, int64_t groups,
                                                int lane, int lanes) {
  for (int64_t r = group; r < p.n; r += groups) {
    const int64_t s = __ldg(p.src_idx + r), d = __ldg(p.dst_idx + r);
    if (!row_in_range(p, s, d)) continue;
    const uint8_t* from = src + s * p.src_stride;
    uint8_t* to = dst + d * p.dst_stride;
    for (int64_t j = lane; j < p.row_bytes; j += lanes) to[j] = from[j];
  }
}

template <int kW>
__global__ void __launch_bounds__(kThreads) transfer_kernel(const TransferParams p) {
  constexpr int kR = kWordsInFlight / kW;  // rows a group moves at once
  const int lanes = 1 << p.log2_lanes;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t groups_per_block = kThreads >> p.log2_lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * groups_per_block +
                        (static_cast<int64_t>(threadIdx.x) >> p.log2_lanes);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * groups_per_block;
  const int64_t row_words = p.row_bytes / 16;

  for (int64_t layer = blockIdx.y; layer < p.layers; layer += gridDim.y) {
    const uint8_t* src = p.src;
    uint8_t* dst = p.dst;
    if (p.src_ptrs != nullptr) {
      src = reinterpret_cast<const uint8_t*>(__ldg(p.src_ptrs + layer));
      dst = reinterpret_cast<uint8_t*>(__ldg(p.dst_ptrs + layer));
      if (src == nullptr || dst == nullptr) continue;  // a layer left out
    }
    const uint64_t align_bits = reinterpret_cast<uintptr_t>(src) |
                                reinterpret_cast<uintptr_t>(dst) |
                                static_cast<uint64_t>(p.src_stride | p.dst_stride);
    if ((align_bits & 15) != 0) {
      copy_rows_bytewise(p, src, dst, group, groups, lane, lanes);
      continue;
    }
    for (int64_t r0 = group; r0 < p.n; r0 += groups * kR) {
      // This group's rows r0, r0 + groups, ...: null where the row is skipped.
      const uint4* from[kR];
      uint4* to[kR];
#pragma unroll
      for (int k = 0; k < kR; ++k) {
        const int64_t r = r0 + k * groups;
        from[k] = nullptr;
        to[k] = nullptr;
        if (r < p.n) {
          const int64_t s = __ldg(p.src_idx + r), d = __ldg(p.dst_idx + r);
          if (row_in_range(p, s, d)) {
            from[k] = reinterpret_cast<const uint4*>(src + s * p.src_stride);
            to[k] = reinterpret_cast<uint4*>(dst + d * p.dst_stride);
          }
        }
      }
      for (int64_t base = lane; base < row_words; base += static_cast<int64_t>(kW) * lanes) {
        uint4 buf[kR][kW];
#pragma unroll
        for (int k = 0; k < kR; ++k) {
#pragma unroll
          for (int w = 0; w < kW; ++w) {
            const int64_t j = base + static_cast<int64_t>(w) * lanes;
            if (from[k] != nullptr && j < row_words) buf[k][w] = __ldcs(from[k] + j);
          }
        }
#pragma unroll
        for (int k = 0; k < kR; ++k) {
#pragma unroll
          for (int w = 0; w < kW; ++w) {
            const int64_t j = base + static_cast<int64_t>(w) * lanes;
            if (to[k] != nullptr && j < row_words) to[k][j] = buf[k][w];
          }
        }
      }
    }
  }
}

// ---- Host side ----

struct LaunchShape {
  int log2_lanes;
  int words_per_lane;  // kW
};

LaunchShape shape_for(int64_t row_bytes) {
  const int64_t words = row_bytes / 16;
  const auto lanes = std::bit_ceil(static_cast<uint64_t>(std::clamp<int64_t>(words, 1, 32)));
  const int64_t share = (words + static_cast<int64_t>(lanes) - 1) / static_cast<int64_t>(lanes);
  const auto kw = std::bit_ceil(static_cast<uint64_t>(std::clamp<int64_t>(share, 1, 8)));
  return {std::countr_zero(lanes), static_cast<int>(kw)};
}

// Blocks of transfer_kernel<kW> resident on the whole current device at once (SMs times
// blocks per SM, which the registers limit to 2-3), read once per device and variant: the
// grid is one wave of them, each block looping over its share of the rows.
template <int kW>
int64_t resident_blocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return 132 * 2;
  }
  int64_t n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, transfer_kernel<kW>, kThreads, 0) !=
            cudaSuccess) {
      cudaGetLastError();
      return 132 * 2;
    }
    n = int64_t{std::max(sms, 1)} * std::clamp(per_sm, 1, kMaxBlocksPerSm);
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

template <int kW>
void launch_variant(const TransferParams& p, cudaStream_t stream) {
  const int64_t rows_per_block = int64_t{kThreads >> p.log2_lanes} * (kWordsInFlight / kW);
  const int64_t need = (p.n + rows_per_block - 1) / rows_per_block;
  const int64_t gy = std::min<int64_t>(p.layers, 65535);
  const int64_t budget = std::max<int64_t>(1, resident_blocks<kW>() / gy);
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>(need, 1, budget)),
                  static_cast<unsigned>(gy));
  transfer_kernel<kW><<<grid, kThreads, 0, stream>>>(p);
}

KernelStatus launch(Context& ctx, const char* op, TransferParams p) {
  const LaunchShape sh = shape_for(p.row_bytes);
  p.log2_lanes = sh.log2_lanes;
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  switch (sh.words_per_lane) {
    case 1:
      launch_variant<1>(p, stream);
      break;
    case 2:
      launch_variant<2>(p, stream);
      break;
    case 4:
      launch_variant<4>(p, stream);
      break;
    default:
      launch_variant<8>(p, stream);
      break;
  }
  return device::launch_status(ctx, op);
}

// The address the kernel uses for tensor `t`. A tensor on the device is used as is (the
// core has checked its device). A tensor in host memory (kDLCUDAHost, or kDLCPU as
// PyTorch exports pinned tensors) must be page-locked, first and last byte: the kernel
// must never touch pageable memory. Its device address comes from the driver (the same
// address on UVA systems).
KernelStatus device_address(Context& ctx, const char* op, const char* name, const DLTensor& t,
                            int64_t bytes, uint8_t** out) {
  auto* p = data_ptr<uint8_t>(t);
  *out = p;
  if (t.device.device_type == kDLCUDA || bytes == 0) return kOk;
  for (uint8_t* probe : {p, p + (bytes - 1)}) {
    cudaPointerAttributes a{};
    if (const cudaError_t err = cudaPointerGetAttributes(&a, probe); err != cudaSuccess) {
      cudaGetLastError();  // not sticky, but it must not fail the launch check below
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: argument '%s' is in host memory the CUDA driver cannot describe "
                      "(%s): pin it (cudaHostAlloc / tensor.pin_memory())",
                      op, name, cudaGetErrorString(err));
    }
    if (a.type == cudaMemoryTypeDevice) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: argument '%s' is labelled as host memory (DLPack device type %d) but "
                      "its address is device memory",
                      op, name, static_cast<int>(t.device.device_type));
    }
    if (a.type != cudaMemoryTypeHost && a.type != cudaMemoryTypeManaged) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: argument '%s' is in pageable host memory: pin it (cudaHostAlloc / "
                      "tensor.pin_memory())",
                      op, name);
    }
    if (probe == p && a.type == cudaMemoryTypeHost) {
      if (a.devicePointer == nullptr) {
        return ctx.fail(KREG_INVALID_ARGUMENT,
                        "%s: argument '%s' is page-locked but not mapped into the device's "
                        "address space (allocate it with cudaHostAlloc, or register it with "
                        "cudaHostRegisterMapped)",
                        op, name);
      }
      *out = static_cast<uint8_t*>(a.devicePointer);
    }
  }
  return kOk;
}

}  // namespace

KernelStatus transfer_cuda(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                           const DLTensor& src, DLTensor& dst) {
  const char* const kOp = ctx.op();
  if (KernelStatus st = check_transfer(ctx, kOp, src, dst); !st.ok()) return st;
  const int64_t row = row_bytes_of(src);
  // Before device_address: a mapped host pointer's device address is the current device's.
  const device::DeviceGuard guard(src_idx);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  TransferParams p{};
  uint8_t* src_addr = nullptr;
  if (KernelStatus st = device_address(ctx, kOp, "src", src, src.shape[0] * row, &src_addr);
      !st.ok()) {
    return st;
  }
  if (KernelStatus st = device_address(ctx, kOp, "dst", dst, dst.shape[0] * row, &p.dst);
      !st.ok()) {
    return st;
  }
  p.src = src_addr;
  p.src_idx = data_ptr<const int64_t>(src_idx);
  p.dst_idx = data_ptr<const int64_t>(dst_idx);
  p.n = src_idx.shape[0];
  p.layers = 1;
  p.src_rows = src.shape[0];
  p.dst_rows = dst.shape[0];
  p.src_stride = row;
  p.dst_stride = row;
  p.row_bytes = row;
  if (p.n == 0 || p.src_rows == 0 || p.dst_rows == 0) return kOk;
  return launch(ctx, kOp, p);
}

KernelStatus transfer_layers_cuda(Context& ctx, const DLTensor& src_idx, const DLTensor& dst_idx,
                                  const DLTensor& src_ptrs, const DLTensor& dst_ptrs,
                                  int64_t row_bytes, int64_t src_rows, int64_t dst_rows,
                                  int64_t src_stride, int64_t dst_stride) {
  const char* const kOp = ctx.op();
  if (KernelStatus st =
          check_transfer_layers(ctx, kOp, row_bytes, src_rows, dst_rows, src_stride, dst_stride);
      !st.ok()) {
    return st;
  }
  TransferParams p{};
  p.src_idx = data_ptr<const int64_t>(src_idx);
  p.dst_idx = data_ptr<const int64_t>(dst_idx);
  p.n = src_idx.shape[0];
  p.src_ptrs = data_ptr<const int64_t>(src_ptrs);
  p.dst_ptrs = data_ptr<const int64_t>(dst_ptrs);
  p.layers = src_ptrs.shape[0];
  p.src_rows = src_rows;
  p.dst_rows = dst_rows;
  p.src_stride = src_stride != 0 ? src_stride : row_bytes;
  p.dst_stride = dst_stride != 0 ? dst_stride : row_bytes;
  p.row_bytes = row_bytes;
  if (p.n == 0 || p.layers == 0 || src_rows == 0 || dst_rows == 0) return kOk;
  const device::DeviceGuard guard(src_idx);
  if (!guard.ok()) return guard.fail(ctx, kOp);
  return launch(ctx, kOp, p);
}

}  // namespace kreg::kvcache
