// attention.decode's split kernel on tensor cores (mma.sync m16n8k16, fp32 accumulate).
//
// One block per (split, kv head, chunk of up to 8 query heads, sequence). Its kWarps warps
// each own whole 16-token tiles of the split's range, taken round-robin (warp w: tiles w,
// w + kWarps, ...), and each runs its own cp.async pipeline of kStages tiles (K and V,
// 16 x D each), so the main loop has no block barrier (cp.async.wait_group + __syncwarp).
// A tile row (a token's D elements) is stored with an XOR swizzle: 16-byte chunk c of row r
// at c ^ (r & 7), so ldmatrix's 8 row addresses hit 8 different bank quads.
//
// The products run transposed, with tokens as the MMA's M, so a group of up to 8 heads
// needs no padding rows:
//   S^T = K Q^T      A = K (16 tokens x 16 d, ldmatrix), B = q^T (registers, loaded once);
//                    the accumulators hold 2 tokens x 2 heads a lane;
//   online softmax   in the log2 domain (S scaled by scale * log2(e) in fp32; q is not
//                    rounded again), the max over tokens by 3 shuffles;
//   O^T += V^T P^T   P^T packed to 16 bits and transposed in registers (movmatrix) into B,
//                    A = V^T from ldmatrix.trans: D / 16 MMAs a tile.
// P is rounded to the input type before P V, as FlashAttention and FlashInfer do.
//
// Pages: when the page size is a multiple of 16 a tile lies in one page (tiles start at
// multiples of 16), so a lane reads one table entry a tile; otherwise (kRowPages) each
// lane reads the page of each row it copies. Either way the table entries of the tile
// kStages ahead are read one tile before their copies are issued, and a tile's rows past
// the end or on a page id outside [0, num_pages) are zero-filled and masked out of the
// softmax (a 16-bit row mask per stage).
//
// At the end the warps' (max, sum, acc) are merged in shared memory (which the pipeline no
// longer needs) and the block writes out (one split) or the partials (decode.cuh's merge).
//
// Measured against the FMA kernel on the H200 (tools/bench/variants/decode_mma_bench.cu, bf16
// D=128, page 16): B=64 ctx 4096 392 -> 258 us (65% -> 99% of copy), B=32 ragged Hq=64
// 228 -> 86 us, B=1 ctx 4096 15.3 -> 11.4 us; docs/performance.md has the plugin's numbers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "decode.cuh"
#include "kreg/device/vec.cuh"

namespace kreg::attention::decode_detail {
namespace {

constexpr int kTile = 16;  // tokens a warp tile
constexpr int kHeads = 8;  // query heads a block: the MMA's N
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix (x4, optionally transposed) at tile + (lane_off ^ (kX << 5)), the XOR inside the
// asm so that the compiler does not hoist one offset register per k-step out of the loop.
// With the swizzle, chunk 2 x + e of row r (e in {0, 1}) is at tile_off(r, e) ^ (x << 5).
template <int kX, bool kT>
__device__ __forceinline__ void ldsm_x4_sw(uint32_t (&r)[4], uint32_t tile, uint32_t lane_off) {
  if constexpr (kT) {
    asm volatile(
        "{\n\t.reg .b32 a;\n\txor.b32 a, %5, %6;\n\tadd.u32 a, a, %4;\n\t"
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [a];\n\t}\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(tile), "r"(lane_off), "n"(kX << 5)
        : "memory");
  } else {
    asm volatile(
        "{\n\t.reg .b32 a;\n\txor.b32 a, %5, %6;\n\tadd.u32 a, a, %4;\n\t"
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [a];\n\t}\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(tile), "r"(lane_off), "n"(kX << 5)
        : "memory");
  }
}

// Compile-time loop: f(std::integral_constant<int, I>) for I in [0, N).
template <int I, int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(std::integral_constant<int, I>{});
    static_for<I + 1, N>(f);
  }
}

// d += A (16x16, row) * B (16x8, col), 16-bit inputs of type T, fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 8x8 16-bit transpose across the warp: lane l holds (row l / 4, cols 2 (l % 4), +1) of the
// matrix before and of its transpose after.
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const typename device::detail::Pair<T>::type v =
      device::detail::Pair<T>::from_float2(make_float2(lo, hi));
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int kDim>
__device__ __forceinline__ uint32_t tile_off(int r, int c) {
  return static_cast<uint32_t>(r * (kDim * 2) + ((c ^ (r & 7)) << 4));
}

template <int kDim>
struct Shape {
  static constexpr int kChunks = kDim / 8;              // 16-byte chunks a row: 8, 16, 32
  static constexpr int kTileBytes = kTile * kDim * 2;   // K or V of a tile
  static constexpr int kRowsPerCopy = 32 / kChunks;     // rows one copy instruction covers
  static constexpr int kCopies = kTile / kRowsPerCopy;  // copy instructions a lane, per tile
  static constexpr int kRedStride = kDim + 4;           // floats a row of the block merge
};

template <int kDim, int kWarps, int kStages>
__host__ __device__ constexpr int smem_bytes() {
  return kWarps * kStages * 2 * Shape<kDim>::kTileBytes;
}

template <typename T, int kDim, int kWarps, int kStages, int kMinBlocks, bool kRowPages>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) decode_mma_kernel(DecodeParams<T> p) {
  using S = Shape<kDim>;
  static_assert(kStages >= 2 && kStages <= 4, "the row masks of the stages fit 64 bits");
  static_assert(kWarps * kHeads * S::kRedStride * 4 <= smem_bytes<kDim, kWarps, kStages>(),
                "the block merge reuses the pipeline's shared memory");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float red_m[kWarps][kHeads];
  __shared__ float red_l[kWarps][kHeads];

  const int split = static_cast<int>(blockIdx.x);
  const int chunks = (p.group + kHeads - 1) / kHeads;
  const int kh = static_cast<int>(blockIdx.y) / chunks;
  const int chunk = static_cast<int>(blockIdx.y) - kh * chunks;
  const int hq0 = kh * p.group + chunk * kHeads;
  const int nh = min(kHeads, p.group - chunk * kHeads);  // heads of this block
  const int b = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int gid = lane >> 2;  // the MMA fragments' groupID
  const int tig = lane & 3;   // thread in group

  // With PDL: every input may be the previous kernel's output (a cache append, rope on q).
  device::pdl_wait();

  const SplitRange range = split_range<kTile>(p, b, split);
  const int begin = range.begin, end = range.end;  // begin: a multiple of 16
  const int num_tiles = (end - begin + kTile - 1) / kTile;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp - 1) / kWarps + 1 : 0;

  // This warp's stages: [kStages][K, V][16][kDim].
  const uint32_t wbase = smem_u32(smem) + static_cast<uint32_t>(warp * kStages * 2 * S::kTileBytes);
  const int32_t* table = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  const int cl = lane % S::kChunks;  // the chunk this lane copies
  const int rl = lane / S::kChunks;  // its first row; then every kRowsPerCopy rows
  auto tile_tok0 = [&](int i) { return begin + (warp + i * kWarps) * kTile; };

  // The table entries a lane needs for a tile: one (the tile's page), or one per row it
  // copies; -1 past the end.
  struct Pages {
    int32_t v[kRowPages ? S::kCopies : 1];
  };
  auto lookup = [&](int i, Pages& pg) {
    const int tok0 = tile_tok0(i);
    if constexpr (kRowPages) {
#pragma unroll
      for (int j = 0; j < S::kCopies; ++j) {
        const int tok = tok0 + j * S::kRowsPerCopy + rl;
        pg.v[j] = tok < end ? __ldg(table + p.page_div.div(static_cast<uint32_t>(tok))) : -1;
      }
    } else {
      pg.v[0] = tok0 < end ? __ldg(table + p.page_div.div(static_cast<uint32_t>(tok0))) : -1;
    }
  };
  // The copies of tile i into stage s; returns the tile's row mask (bit r: token r counts).
  auto issue = [&](int i, int s, const Pages& pg) -> uint32_t {
    const int tok0 = tile_tok0(i);
    const uint32_t ks = wbase + static_cast<uint32_t>(s * 2 * S::kTileBytes);
    const uint32_t vs = ks + S::kTileBytes;
    const int64_t step = int64_t{S::kRowsPerCopy} * p.heads_k * kDim;  // elements per copy
    if constexpr (!kRowPages) {
      const int32_t page = pg.v[0];
      const bool pok = page >= 0 && page < p.num_pages;
      const int slot0 =
          tok0 - static_cast<int>(p.page_div.div(static_cast<uint32_t>(tok0))) * p.page_size;
      int64_t off =
          ((static_cast<int64_t>(pok ? page : 0) * p.page_size + slot0 + rl) * p.heads_k + kh) *
              kDim +
          cl * 8;
      const int rows_ok = pok ? min(end - tok0, kTile) : 0;  // rows [0, rows_ok) count
#pragma unroll
      for (int j = 0; j < S::kCopies; ++j) {
        const int r = j * S::kRowsPerCopy + rl;
        const bool ok = r < rows_ok;
        const uint32_t d = tile_off<kDim>(r, cl);
        cp_async_16(ks + d, ok ? p.k_cache + off : p.k_cache, ok);
        cp_async_16(vs + d, ok ? p.v_cache + off : p.v_cache, ok);
        off += step;
      }
      return rows_ok > 0 ? (rows_ok >= kTile ? 0xffffu : (1u << rows_ok) - 1u) : 0u;
    } else {
      uint32_t bits = 0;
#pragma unroll
      for (int j = 0; j < S::kCopies; ++j) {
        const int r = j * S::kRowsPerCopy + rl;
        const int tok = tok0 + r;
        const int32_t page = pg.v[j];  // -1 past the end
        const bool ok = page >= 0 && page < p.num_pages;
        const int slot =
            tok - static_cast<int>(p.page_div.div(static_cast<uint32_t>(tok))) * p.page_size;
        const int64_t off =
            ((static_cast<int64_t>(ok ? page : 0) * p.page_size + slot) * p.heads_k + kh) * kDim +
            cl * 8;
        const uint32_t d = tile_off<kDim>(r, cl);
        cp_async_16(ks + d, ok ? p.k_cache + off : p.k_cache, ok);
        cp_async_16(vs + d, ok ? p.v_cache + off : p.v_cache, ok);
        bits |= static_cast<uint32_t>(ok) << r;
      }
      return __reduce_or_sync(kFull, bits);
    }
  };

  uint64_t masks = 0;  // bits [16 s, 16 s + 16): the row mask of the tile in stage s
  Pages next_pages;
  {
    Pages pre[kStages];
#pragma unroll
    for (int s = 0; s < kStages; ++s) lookup(s, pre[s]);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < my_tiles) masks |= static_cast<uint64_t>(issue(s, s, pre[s])) << (16 * s);
      cp_async_commit();
    }
    next_pages = pre[kStages - 1];
  }

  // q of head gid (zero past the block's heads) as the B operand of S^T = K Q^T:
  // b0 = q[gid][16 ks + 2 tig, +1], b1 = q[gid][16 ks + 8 + 2 tig, +1].
  uint32_t qf[kDim / 16][2];
  {
    const bool hv = gid < nh;
    const T* qrow = p.q + (static_cast<int64_t>(b) * p.heads_q + hq0 + (hv ? gid : 0)) * kDim;
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      qf[ks][0] = hv ? *reinterpret_cast<const uint32_t*>(qrow + 16 * ks + 2 * tig) : 0u;
      qf[ks][1] = hv ? *reinterpret_cast<const uint32_t*>(qrow + 16 * ks + 8 + 2 * tig) : 0u;
    }
  }
  // Every block has started reading: the merge kernel (or the caller's next kernel) may be
  // scheduled; it waits for this grid to complete before it reads anything.
  device::pdl_launch_dependents();

  // m, l of heads 2 tig, 2 tig + 1; acc[mt] = O^T[16 mt + gid (+8)][2 tig, +1].
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[kDim / 16][4];
#pragma unroll
  for (int i = 0; i < kDim / 16; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  }

  // ldmatrix row addresses (bytes in a tile), per lane:
  //  pattern A: matrices (rows 0-7, chunk 2x), (rows 0-7, 2x+1), (rows 8-15, 2x), (rows 8-15, 2x+1)
  //  pattern B: matrices (rows 0-7, chunk 2x), (rows 8-15, 2x), (rows 0-7, 2x+1), (rows 8-15, 2x+1)
  const int ra = ((lane >> 4) << 3) + (lane & 7), ca = (lane >> 3) & 1;
  const int rb = (((lane >> 3) & 1) << 3) + (lane & 7), cb = lane >> 4;
  const uint32_t off_a = tile_off<kDim>(ra, ca), off_b = tile_off<kDim>(rb, cb);

  for (int i = 0; i < my_tiles; ++i) {
    const int nxt = i + kStages - 1;
    __syncwarp();  // every lane is done with stage nxt % kStages (read at tile i - 1)
    if (nxt < my_tiles) {
      const int s = nxt % kStages;
      masks = (masks & ~(uint64_t{0xffff} << (16 * s))) |
              (static_cast<uint64_t>(issue(nxt, s, next_pages)) << (16 * s));
    }
    cp_async_commit();
    if (nxt + 1 < my_tiles) lookup(nxt + 1, next_pages);
    cp_async_wait<kStages - 1>();
    __syncwarp();  // the other lanes' copies of tile i are visible

    const int stage = i % kStages;
    const uint32_t ks = wbase + static_cast<uint32_t>(stage * 2 * S::kTileBytes);
    const uint32_t vs = ks + S::kTileBytes;
    const auto rows = static_cast<uint32_t>(masks >> (16 * stage));

    // S^T[token gid (+8)][head 2 tig, +1]: s0, s1 token gid; s2, s3 token gid + 8.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    static_for<0, kDim / 16>([&](auto kst_c) {
      constexpr int kst = decltype(kst_c)::value;
      uint32_t ka[4];  // pattern B with x = kst: a0..a3 of K (16 tokens x 16 d)
      ldsm_x4_sw<kst, false>(ka, ks, off_b);
      mma<T>(s, ka, qf[kst][0], qf[kst][1]);
    });
    const bool v0 = (rows >> gid) & 1u, v1 = (rows >> (gid + 8)) & 1u;
    s[0] = v0 ? s[0] * p.scale_log2 : -INFINITY;
    s[1] = v0 ? s[1] * p.scale_log2 : -INFINITY;
    s[2] = v1 ? s[2] * p.scale_log2 : -INFINITY;
    s[3] = v1 ? s[3] * p.scale_log2 : -INFINITY;
    float mx[2] = {fmaxf(m[0], fmaxf(s[0], s[2])), fmaxf(m[1], fmaxf(s[1], s[3]))};
#pragma unroll
    for (int off = 4; off < 32; off *= 2) {
#pragma unroll
      for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], off));
    }
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // While nothing was seen (mx -inf) the reference 0 keeps exp2f's arguments -inf, not
      // NaN: corr and the weights are then 0.
      const float ref = mx[h] == -INFINITY ? 0.0f : mx[h];
      corr[h] = exp2f(m[h] - ref);
      m[h] = mx[h];
      s[h] = exp2f(s[h] - ref);
      s[h + 2] = exp2f(s[h + 2] - ref);
      l[h] = l[h] * corr[h] + s[h] + s[h + 2];
    }
#pragma unroll
    for (int mt = 0; mt < kDim / 16; ++mt) {
      acc[mt][0] *= corr[0];
      acc[mt][1] *= corr[1];
      acc[mt][2] *= corr[0];
      acc[mt][3] *= corr[1];
    }
    // P^T (tokens x heads) as B of O^T += V^T P^T: b0 = P^T[2 tig, +1][gid] (tokens 0-7),
    // b1 the same for tokens 8-15: the transposes of the accumulators' 8x8 blocks.
    const uint32_t pb0 = movmatrix_t(pack2<T>(s[0], s[1]));
    const uint32_t pb1 = movmatrix_t(pack2<T>(s[2], s[3]));
    static_for<0, kDim / 16>([&](auto mt_c) {
      constexpr int mt = decltype(mt_c)::value;
      uint32_t va[4];  // pattern A with x = mt, transposed: a0..a3 of V^T (16 d x 16 tokens)
      ldsm_x4_sw<mt, true>(va, vs, off_a);
      mma<T>(acc[mt], va, pb0, pb1);
    });
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline's shared memory

  // The warps' states over disjoint tokens, merged in shared memory.
  float* red_acc = reinterpret_cast<float*>(smem);  // [kWarps][kHeads][kRedStride]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int off = 4; off < 32; off *= 2) l[h] += __shfl_xor_sync(kFull, l[h], off);
  }
  {
    float* r0 = red_acc + (warp * kHeads + 2 * tig) * S::kRedStride + gid;
    float* r1 = r0 + S::kRedStride;
#pragma unroll
    for (int mt = 0; mt < kDim / 16; ++mt) {
      r0[16 * mt] = acc[mt][0];
      r1[16 * mt] = acc[mt][1];
      r0[16 * mt + 8] = acc[mt][2];
      r1[16 * mt + 8] = acc[mt][3];
    }
    if (gid == 0) {
      red_m[warp][2 * tig] = m[0];
      red_m[warp][2 * tig + 1] = m[1];
      red_l[warp][2 * tig] = l[0];
      red_l[warp][2 * tig + 1] = l[1];
    }
  }
  __syncthreads();
  for (int o = tid; o < nh * kDim; o += kWarps * 32) {
    const int g = o / kDim;
    const int d = o % kDim;
    float mxw = -INFINITY;
#pragma unroll
    for (int n = 0; n < kWarps; ++n) mxw = fmaxf(mxw, red_m[n][g]);
    float sum = 0.0f, a = 0.0f;
    if (mxw != -INFINITY) {
#pragma unroll
      for (int n = 0; n < kWarps; ++n) {
        const float mn = red_m[n][g];
        if (mn == -INFINITY) continue;
        const float w = exp2f(mn - mxw);
        sum += w * red_l[n][g];
        a += w * red_acc[(n * kHeads + g) * S::kRedStride + d];
      }
    }
    const int64_t bh = static_cast<int64_t>(b) * p.heads_q + hq0 + g;
    if (p.num_splits == 1) {
      p.out[bh * kDim + d] = device::from_float<T>(sum > 0.0f ? a / sum : 0.0f);
    } else {
      const int64_t idx = bh * p.num_splits + split;
      p.ws_acc[idx * kDim + d] = a;
      if (d == 0) p.ws_ml[idx] = make_float2(mxw, sum);
    }
  }
}

// The launch shape per head size: 4 warps; 3 stages (D = 64: 48 KiB, 4 blocks an SM;
// D = 128: 96 KiB, 2 blocks; D = 256: 192 KiB, 1 block, up to 255 registers for its 64
// accumulators and 32 words of q). kWide (D <= 128): 8 warps, 2 stages (D = 64: 64 KiB,
// 3 blocks an SM; D = 128: 128 KiB, 1 block).
template <int kDim, bool kWide>
struct Config {
  static_assert(!kWide || kDim <= 128);
  static constexpr int kWarps = kWide ? 8 : 4;
  static constexpr int kStages = kWide ? 2 : 3;
  static constexpr int kMinBlocks = kDim == 256 ? 1 : 16 / kWarps;
};

template <typename T, int kDim, bool kRowPages, bool kWide>
KernelStatus launch_pages(Context& ctx, const char* op, DecodeParams<T> p, int batch,
                          DLDevice device) {
  using C = Config<kDim, kWide>;
  constexpr int kThreads = C::kWarps * 32;
  constexpr int kSmem = smem_bytes<kDim, C::kWarps, C::kStages>();
  const auto kernel = decode_mma_kernel<T, kDim, C::kWarps, C::kStages, C::kMinBlocks, kRowPages>;
  static std::atomic<int> known[64];  // resident blocks per device, 0 until asked
  int64_t resident = 0;
  if (const cudaError_t e = resident_blocks(kernel, kThreads, kSmem, known, resident);
      e != cudaSuccess) {
    cudaGetLastError();
    return device::launch_status(ctx, op, e);
  }
  const int chunks = (p.group + kHeads - 1) / kHeads;
  const int y_blocks = p.heads_k * chunks;
  // A block's round is kWarps tiles: at least one round a split.
  p.num_splits = choose_splits(int64_t{batch} * y_blocks, int64_t{p.max_pages} * p.page_size,
                               resident, std::max(kMinTokensPerSplit, C::kWarps * kTile));
  return launch_split_and_merge<T, kDim>(ctx, op, p, batch, y_blocks, device, kernel, kThreads,
                                         kSmem);
}

}  // namespace

// 8 warps of 2 stages where a tile is one page and D <= 128, else 4 warps of 3 stages.
// On an H100 (vs_torch, 2026-12-06) the 8-warp shape took B=1 ctx 4096 from 12.7 to 11.7
// us and B=64 ctx 1024 from 101 to 96, B=8 ctx 8192 ragged from 71.4 to 72.5-73.0, and
// was slower on pages of 1 token (83.2 against 85.4 us).
template <typename T, int kDim>
KernelStatus launch_mma(Context& ctx, const char* op, const DecodeParams<T>& p, int batch,
                        DLDevice device) {
  if (p.page_size % kTile == 0) {
    if constexpr (kDim <= 128) return launch_pages<T, kDim, false, true>(ctx, op, p, batch, device);
    return launch_pages<T, kDim, false, false>(ctx, op, p, batch, device);
  }
  return launch_pages<T, kDim, true, false>(ctx, op, p, batch, device);
}

#define KREG_DECODE_MMA(T)                                                                     \
  template KernelStatus launch_mma<T, 64>(Context&, const char*, const DecodeParams<T>&, int,  \
                                          DLDevice);                                           \
  template KernelStatus launch_mma<T, 128>(Context&, const char*, const DecodeParams<T>&, int, \
                                           DLDevice);                                          \
  template KernelStatus launch_mma<T, 256>(Context&, const char*, const DecodeParams<T>&, int, \
                                           DLDevice);
KREG_DECODE_MMA(__nv_bfloat16)
KREG_DECODE_MMA(__half)
#undef KREG_DECODE_MMA

}  // namespace kreg::attention::decode_detail
