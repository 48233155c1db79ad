// CUDA routing for moe.topk_softmax, moe.grouped_topk and every method of moe.route: one
// kernel template, routing_kernel<T, kVec, kSlots>, driven by the RoutingParams that the
// host code in routing.cpp builds (the math is stated in routing.hpp).
//
// Launch shape: one warp per token, kWarpsPerBlock tokens a block. A token's E <= 512
// logits live in registers, kSlots per lane (8 when E <= 256, else 16), loaded as vectors
// of kVec elements (16 bytes when E and the pointer allow): lane L holds experts
// (c * 32 + L) * kVec + v for chunk c and v < kVec, so each chunk is one coalesced load.
// Softmax max and sum are warp butterflies. Each of the k picks is a warp argmax over
// (key, expert index): every lane proposes its best unpicked slot, five xor-shuffle steps
// pick the largest key with the lower index on ties, and the owner marks its slot. The
// group limit (n_group > 1) stages the keys in shared memory, lane g sums group g's top
// two, and topk_group warp argmaxes over the group scores choose the kept groups. Pick j
// is held by lane j (j < 32) and stored coalesced after the renormalization sum; picks past
// 32 are written by lane 0 and rescaled after a __syncwarp.
//
// Programmatic dependent launch (ctx.pdl(), pdl.cuh): the kernel waits before its first
// load of gating and signals the next kernel once the bias is loaded, so a routing call
// behind another kernel (the router GEMM) or in front of one (align_block_size) overlaps
// its launch with that kernel's tail.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "kreg/device/reduce.cuh"
#include "kreg/device/vec.cuh"
#include "kreg/dtype.hpp"
#include "moe.hpp"
#include "routing.hpp"

namespace kreg::moe {
namespace {

using device::vec_t;

constexpr int kLanes = 32;
constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;
// Keys of one token in shared memory, one pad word every 32 so that the lanes scanning
// different groups (stride E / n_group) hit different banks.
constexpr int kKeyStride = kMaxRoutingExperts + kMaxRoutingExperts / kLanes;

// The argmax order: the larger key wins, the lower index on equal keys. Keys are never
// NaN (mapped to -inf), so this is a total order and every lane of a butterfly agrees.
__device__ __forceinline__ bool beats(float key_a, int idx_a, float key_b, int idx_b) {
  return key_a > key_b || (key_a == key_b && idx_a < idx_b);
}

template <typename T, int kVec, int kSlots>
__global__ void __launch_bounds__(kWarpsPerBlock* kLanes)
    routing_kernel(const T* __restrict__ gating, float* __restrict__ out_w,
                   int32_t* __restrict__ out_ids, const RoutingParams p) {
  static_assert(kSlots % kVec == 0 && kSlots <= 32, "slots are whole vectors, bits of a mask");
  constexpr int kChunks = kSlots / kVec;
  constexpr float kNegInf = -__builtin_huge_valf();
  __shared__ float group_keys[kWarpsPerBlock][kKeyStride];

  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int warp = static_cast<int>(threadIdx.x) / kLanes;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (token >= p.tokens) return;  // whole warps leave together; no block barrier below
  const int E = p.experts;
  const auto expert_of = [lane](int s) { return ((s / kVec) * kLanes + lane) * kVec + s % kVec; };

  // Logits, softcapped.
  float l[kSlots];
  uint32_t excluded = 0;  // bit s: slot s cannot be picked (absent, picked, or group cut)
  const T* row = gating + token * E;
  device::pdl_wait();  // programmatic launch: gating may be the previous kernel's output
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int base = (c * kLanes + lane) * kVec;
    if (base < E) {  // E is a multiple of kVec: the whole vector is in the row
      vec_t<float, kVec> f;
      f.cast_load(row + base);
#pragma unroll
      for (int v = 0; v < kVec; ++v) l[c * kVec + v] = f[v];
    } else {
#pragma unroll
      for (int v = 0; v < kVec; ++v) l[c * kVec + v] = 0.0f;
      excluded |= ((1u << kVec) - 1u) << (c * kVec);
    }
  }
  if (p.softcap > 0.0f) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) l[s] = p.softcap * tanhf(l[s] / p.softcap);
  }

  // Scores (the weights before post-processing).
  float score[kSlots];
  if (p.score == Score::kSoftmax) {
    float m = kNegInf;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!((excluded >> s) & 1u)) m = fmaxf(m, l[s]);
    }
    m = device::warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      score[s] = ((excluded >> s) & 1u) ? 0.0f : expf(l[s] - m);
      sum += score[s];
    }
    sum = device::warp_sum(sum);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) score[s] = score[s] / sum;
  } else if (p.score == Score::kSigmoid) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) score[s] = 1.0f / (1.0f + expf(-l[s]));
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) score[s] = l[s];
  }

  // Selection keys.
  float key[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int e = expert_of(s);
    float v = p.key_on_score ? score[s] : l[s];
    if (p.bias != nullptr && e < E) v = v + __ldg(p.bias + e);
    key[s] = isnan(v) ? kNegInf : v;
  }
  device::pdl_launch_dependents();  // every input is loaded (the rest is registers and shared)

  // Group limit: keep the topk_group groups with the largest top-2 key sums.
  if (p.n_group > 1) {
    float* keys = group_keys[warp];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = expert_of(s);
      if (e < E) keys[e + e / kLanes] = key[s];
    }
    __syncwarp();
    const int gsize = E / p.n_group;
    float gscore = kNegInf;
    if (lane < p.n_group) {
      float top1 = kNegInf, top2 = kNegInf;
      for (int i = 0; i < gsize; ++i) {
        const int e = lane * gsize + i;
        const float v = keys[e + e / kLanes];
        if (v > top1) {
          top2 = top1;
          top1 = v;
        } else if (v > top2) {
          top2 = v;
        }
      }
      const float gs = gsize >= 2 ? top1 + top2 : top1;
      gscore = isnan(gs) ? kNegInf : gs;
    }
    uint32_t kept = 0;
    bool taken = lane >= p.n_group;
    for (int r = 0; r < p.topk_group; ++r) {
      float bk = taken ? kNegInf : gscore;
      int bi = taken ? INT_MAX : lane;
#pragma unroll
      for (int off = kLanes / 2; off > 0; off /= 2) {
        const float ok = __shfl_xor_sync(kFullMask, bk, off);
        const int oi = __shfl_xor_sync(kFullMask, bi, off);
        if (beats(ok, oi, bk, bi)) {
          bk = ok;
          bi = oi;
        }
      }
      kept |= 1u << bi;  // bi < n_group: an untaken group always beats a taken lane
      if (lane == bi) taken = true;
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int e = expert_of(s);
      if (e < E && !((kept >> (e / gsize)) & 1u)) excluded |= 1u << s;
    }
  }

  // k warp argmaxes.
  const int k = p.k;
  float* w_row = out_w + token * k;
  int32_t* id_row = out_ids + token * k;
  float wsum = 0.0f, first = 0.0f, my_t = 0.0f;
  int my_id = 0;
  for (int r = 0; r < k; ++r) {
    float bk = kNegInf;
    int bi = INT_MAX;
    float bs = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!((excluded >> s) & 1u) && beats(key[s], expert_of(s), bk, bi)) {
        bk = key[s];
        bi = expert_of(s);
        bs = score[s];
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) {
      const float ok = __shfl_xor_sync(kFullMask, bk, off);
      const int oi = __shfl_xor_sync(kFullMask, bi, off);
      const float os = __shfl_xor_sync(kFullMask, bs, off);
      if (beats(ok, oi, bk, bi)) {
        bk = ok;
        bi = oi;
        bs = os;
      }
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (expert_of(s) == bi) excluded |= 1u << s;
    }
    if (r == 0) first = bs;
    const float t = p.softmax_topk ? expf(bs - first) : bs;
    wsum += t;
    if (r < kLanes) {
      if (lane == r) {
        my_t = t;
        my_id = bi;
      }
    } else if (lane == 0) {
      w_row[r] = t;
      id_row[r] = bi;
    }
  }
  const bool norm = p.renormalize || p.softmax_topk;
  if (lane < k) {
    w_row[lane] = (norm ? my_t / wsum : my_t) * p.scale;
    id_row[lane] = my_id;
  }
  if (k > kLanes) {
    __syncwarp();  // orders lane 0's stores of picks 32.. before the other lanes read them
    for (int j = kLanes + lane; j < k; j += kLanes) {
      const float t = w_row[j];
      w_row[j] = (norm ? t / wsum : t) * p.scale;
    }
  }
}

// `pdl`: programmatic dependent launch (the caller's KREG_LAUNCH_PDL; pdl.cuh).
template <typename T, int kVec, int kSlots>
cudaError_t launch(const T* gating, float* w, int32_t* ids, const RoutingParams& p,
                   cudaStream_t stream, bool pdl) {
  const auto blocks = static_cast<unsigned>((p.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return device::launch(routing_kernel<T, kVec, kSlots>, dim3(blocks),
                        dim3(kWarpsPerBlock * kLanes), 0, stream, pdl, gating, w, ids, p);
}

template <typename T, int kSlots>
cudaError_t launch_slots(const T* gating, float* w, int32_t* ids, const RoutingParams& p,
                         cudaStream_t stream, bool pdl) {
  return device::visit_vec_elems<T>(device::max_vec_elems<T>(p.experts, gating), [&](auto vec) {
    return launch<T, decltype(vec)::value, kSlots>(gating, w, ids, p, stream, pdl);
  });
}

template <typename T>
cudaError_t launch_typed(const DLTensor& gating, DLTensor& out_w, DLTensor& out_ids,
                         const RoutingParams& p, cudaStream_t stream, bool pdl) {
  const T* g = data_ptr<const T>(gating);
  float* w = data_ptr<float>(out_w);
  int32_t* ids = data_ptr<int32_t>(out_ids);
  if (p.experts <= 8 * kLanes) return launch_slots<T, 8>(g, w, ids, p, stream, pdl);
  return launch_slots<T, 16>(g, w, ids, p, stream, pdl);
}

KernelStatus route_launch(Context& ctx, const DLTensor& gating, DLTensor& out_w, DLTensor& out_ids,
                          const RoutingParams& p) {
  const char* op = ctx.op();
  if (p.tokens == 0) return kOk;
  const device::DeviceGuard guard(gating);
  if (!guard.ok()) return guard.fail(ctx, op);
  const auto stream = static_cast<cudaStream_t>(ctx.stream());
  return device::visit_float_dtype(ctx, op, gating, [&](auto tag) {
    return device::launch_status(
        ctx, op, launch_typed<decltype(tag)>(gating, out_w, out_ids, p, stream, ctx.pdl()));
  });
}

}  // namespace

KernelStatus topk_softmax_cuda(Context& ctx, const DLTensor& gating,
                               const DLTensor* correction_bias, DLTensor& out_weights,
                               DLTensor& out_ids, bool renormalize, double softcapping) {
  RoutingParams p;
  if (KernelStatus st = topk_softmax_params(ctx, gating, correction_bias, out_weights, renormalize,
                                            softcapping, p);
      !st.ok()) {
    return st;
  }
  return route_launch(ctx, gating, out_weights, out_ids, p);
}

KernelStatus grouped_topk_cuda(Context& ctx, const DLTensor& gating,
                               const DLTensor& correction_bias, DLTensor& out_weights,
                               DLTensor& out_ids, int64_t n_group, int64_t topk_group,
                               bool renormalize, double routed_scaling_factor) {
  RoutingParams p;
  if (KernelStatus st = grouped_topk_params(ctx, gating, correction_bias, out_weights, n_group,
                                            topk_group, renormalize, routed_scaling_factor, p);
      !st.ok()) {
    return st;
  }
  return route_launch(ctx, gating, out_weights, out_ids, p);
}

KernelStatus route_cuda(Context& ctx, const DLTensor& gating, const DLTensor* correction_bias,
                        DLTensor& out_weights, DLTensor& out_ids, std::string_view method,
                        int64_t n_group, int64_t topk_group, double routed_scaling_factor) {
  RoutingParams p;
  if (KernelStatus st = route_params(ctx, gating, correction_bias, out_weights, method, n_group,
                                     topk_group, routed_scaling_factor, p);
      !st.ok()) {
    return st;
  }
  return route_launch(ctx, gating, out_weights, out_ids, p);
}

}  // namespace kreg::moe
