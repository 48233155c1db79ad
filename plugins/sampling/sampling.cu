// CUDA kernels of the sampling group. One thread-block cluster of C blocks per row (8,
// the portable size, or 16 on sm_90 when few long rows would leave SMs idle): block r
// holds the r-th slice of the row in shared memory (read from HBM once, as keys:
// filter_math.hpp's key_of), and every search pass runs over shared memory, the blocks
// combining their histograms and partial sums through distributed shared memory (DSMEM)
// behind cluster barriers. At B = 1 a row is read by 16 SMs at once; at large B the
// clusters of 8 fill the GPU. Rows too long for shared memory (more than
// C * kMaxRowSmem bytes) are re-read from global memory (L2) by each pass.
//
// The cut searches are radix descents over the 31-bit keys (8, 8, 8, 7 bits), each level
// a histogram of counts and fixed-point weights (filter_math.hpp's weight_of) of the keys
// still matching the prefix: top-k finds the largest key t with count(key >= t) >= k,
// top-p the largest with reaches(weight(key >= t), target). Integer counts and weights
// make every sum exact, so the cut, the tie count and the draw equal the CPU reference's.
// docs/ops/sampling.md has the contract and the design.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "filter_math.hpp"
#include "kreg/device/launch.cuh"
#include "kreg/device/pdl.cuh"
#include "sampling.hpp"

namespace kreg::sampling {
namespace {

namespace cg = cooperative_groups;

constexpr int kCluster = 8;  // blocks per row: the portable cluster size
// Blocks per row for a few long rows (launch): sm_90's non-portable maximum, from
// kWideMinV columns (shorter rows make short passes, where the barriers dominate).
constexpr int kWideCluster = 16;
constexpr int64_t kWideMinV = 32768;
constexpr int kBins = 256;                  // radix digit of 8 bits
constexpr int64_t kMaxRowSmem = 200 << 10;  // bytes of a slice kept in shared memory
constexpr uint32_t kAllTies = 0xffffffffu;  // a cut keeping every tie of its key
// Top-k sets of at most this many keys (k plus ties, and at most the block's threads) are
// gathered whole into every block of the row's cluster by top_k_top_p sampling, which
// then finds its top-p cut and draws from the list (Shared's cand_*), without more passes.
constexpr int kMaxCand = 512;
using u64 = unsigned long long;

enum class Mode { kTopKRenorm, kTopPRenorm, kTopKTopPSample, kMinPSample };

struct Params {
  const float* probs;
  int64_t V;
  int32_t slice;  // columns per block (a multiple of 4)
  bool smem_row;  // the slices live in shared memory
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  float* out;
  int32_t* out_ids;
  const int64_t* rng;
};

// What a block shares: histograms (double-buffered, read by the other blocks of the
// cluster), the cluster-reduced histograms, per-block partials read by the cluster, and
// block-wide broadcasts.
struct Shared {
  uint32_t cnt[2][kBins];
  u64 qs[2][kBins];
  uint32_t l0_cnt[kBins];  // the cluster's level-0 histogram (all keys), kept for reuse
  u64 l0_qs[kBins];
  uint32_t red_cnt[kBins];  // the cluster's histogram of the current level
  u64 red_qs[kBins];
  // Per-block partials (each written once, read by the cluster).
  uint32_t max_key, bad, eq_count;
  long long tie_col;
  u64 kept_q;
  double kept_sum;
  // Block scratch and broadcasts.
  u64 scan[32];
  double dscan[32];
  uint32_t ured[32];
  int digit;
  uint32_t add_c, eq_c;
  u64 add_s, total, prefix, point;
  uint32_t max_all, bad_all;
  long long col;
  double sum;
  // The candidate list (kMaxCand): this block's keys >= the top-k cut and their columns
  // (read by the cluster), then the cluster's whole list, with weights.
  uint32_t loc_n;
  uint32_t loc_key[kMaxCand];
  int32_t loc_col[kMaxCand];
  uint32_t goff[kWideCluster + 1];
  uint32_t cand_key[kMaxCand];
  int32_t cand_col[kMaxCand];
  u64 cand_w[kMaxCand];
};
// A slice of kMaxRowSmem bytes and Shared fit one block's 227 KB of sm_90 shared memory.
static_assert(kMaxRowSmem + sizeof(Shared) <= 227 * 1024, "shared memory of a block");

// ---- Block helpers (blockDim.x a multiple of 32, at least kBins) ----

__device__ __forceinline__ u64 warp_inclusive_scan(u64 x, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += t;
  }
  return x;
}

// The exclusive prefix of v over the block's threads in thread order; `total` gets the
// block's sum. Ends with a barrier.
__device__ u64 block_exclusive_scan(Shared& sh, u64 v, u64& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const u64 inc = warp_inclusive_scan(v, lane);
  if (lane == 31) sh.scan[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const u64 w = lane < nwarps ? sh.scan[lane] : 0;
    const u64 winc = warp_inclusive_scan(w, lane);
    if (lane < nwarps) sh.scan[lane] = winc;
  }
  __syncthreads();
  const u64 excl = (warp > 0 ? sh.scan[warp - 1] : 0) + inc - v;
  total = sh.scan[nwarps - 1];
  __syncthreads();
  return excl;
}

__device__ double block_sum(Shared& sh, double v) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) sh.dscan[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < nwarps; ++w) s += sh.dscan[w];  // fixed order
  __syncthreads();
  return s;
}

// One level of a radix descent, run by warp 0 on the cluster's histogram (cnt, qs): the
// largest digit d with pred(above_c + count(bins >= d), above_s + weight(bins >= d)),
// written to sh.digit (-1 when none) with the count and weight of the bins above it
// (add_c, add_s) and its own count (eq_c).
template <typename Pred>
__device__ void descend(Shared& sh, const uint32_t* cnt, const u64* qs, uint32_t above_c,
                        u64 above_s, Pred pred) {
  const int lane = threadIdx.x & 31;
  uint32_t lc = 0;
  u64 ls = 0;
  for (int b = 0; b < 8; ++b) {
    lc += cnt[lane * 8 + b];
    ls += qs[lane * 8 + b];
  }
  // Sums over the lanes at or above this one (higher digits).
  uint32_t sc = lc;
  u64 ss = ls;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t tc = __shfl_down_sync(0xffffffffu, sc, o);
    const u64 ts = __shfl_down_sync(0xffffffffu, ss, o);
    if (lane + o < 32) {
      sc += tc;
      ss += ts;
    }
  }
  uint32_t c = above_c + (sc - lc);
  u64 s = above_s + (ss - ls);
  int best = -1;
  uint32_t addc = 0;
  u64 adds = 0;
  for (int b = 7; b >= 0; --b) {
    const int d = lane * 8 + b;
    const uint32_t nc = c + cnt[d];
    const u64 ns = s + qs[d];
    if (pred(nc, ns)) {
      best = d;
      addc = c - above_c;
      adds = s - above_s;
      break;
    }
    c = nc;
    s = ns;
  }
  const int top =
      static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<unsigned>(best + 1))) - 1;
  if (top < 0) {
    if (lane == 0) sh.digit = -1;
  } else if (best == top) {
    sh.digit = best;
    sh.add_c = addc;
    sh.add_s = adds;
    sh.eq_c = cnt[best];
  }
}

// A cut: kept(key, col) = key > key_ || (key == key_ && (ties == kAllTies || rank of col
// among the ties < ties)); c_eq ties share key_, c_gt keys are above it, weighing s_gt.
struct Cut {
  uint32_t key = 0;
  uint32_t ties = kAllTies;
  uint32_t c_gt = 0, c_eq = 0;
  u64 s_gt = 0;
};

// C blocks per row (a cluster): kCluster, or kWideCluster when few rows leave SMs idle.
template <Mode M, int C>
__global__ void __launch_bounds__(1024) sampling_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 s_row4[];
  uint32_t* s_key = reinterpret_cast<uint32_t*>(s_row4);
  __shared__ Shared sh;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int64_t row = blockIdx.x / C;
  const int64_t begin = static_cast<int64_t>(rank) * p.slice;
  const int n = static_cast<int>(begin < p.V ? (p.V - begin < p.slice ? p.V - begin : p.slice) : 0);
  const float* g = p.probs + row * p.V + (begin < p.V ? begin : 0);

  kreg::device::pdl_wait();

  // ---- Load: keys, the row max, NaN / inf ----
  uint32_t mx = 0, bad = 0;
  const bool vec = (reinterpret_cast<uintptr_t>(g) & 15) == 0;
  const int n4 = vec ? n / 4 : 0;
  for (int i = tid; i < n4; i += nthreads) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(g) + i);
    const uint4 k{key_of(v.x), key_of(v.y), key_of(v.z), key_of(v.w)};
    mx = max(mx, max(max(k.x, k.y), max(k.z, k.w)));
    bad |= is_bad_key(k.x) | is_bad_key(k.y) | is_bad_key(k.z) | is_bad_key(k.w);
    if (p.smem_row) s_row4[i] = k;
  }
  for (int i = 4 * n4 + tid; i < n; i += nthreads) {
    const uint32_t k = key_of(__ldg(g + i));
    mx = max(mx, k);
    bad |= is_bad_key(k);
    if (p.smem_row) s_key[i] = k;
  }
  kreg::device::pdl_launch_dependents();
  auto key_at = [&](int i) -> uint32_t { return p.smem_row ? s_key[i] : key_of(__ldg(g + i)); };

  mx = __reduce_max_sync(0xffffffffu, mx);
  bad = __reduce_or_sync(0xffffffffu, bad);
  if ((tid & 31) == 0) sh.ured[tid >> 5] = mx | (bad << 31);  // keys < 2^31: bit 31 is free
  __syncthreads();
  if (tid == 0) {
    uint32_t m = 0, b = 0;
    for (int w = 0; w < nthreads / 32; ++w) {
      m = max(m, sh.ured[w] & 0x7fffffffu);
      b |= sh.ured[w] >> 31;
    }
    sh.max_key = m;
    sh.bad = b;
    sh.tie_col = -1;
  }
  cluster.sync();
  if (tid == 0) {
    uint32_t m = 0, b = 0;
    for (int r = 0; r < C; ++r) {
      m = max(m, *cluster.map_shared_rank(&sh.max_key, r));
      b |= *cluster.map_shared_rank(&sh.bad, r);
    }
    sh.max_all = m;
    sh.bad_all = b;
  }
  __syncthreads();
  const uint32_t max_key = sh.max_all;
  constexpr bool kRenorm = M == Mode::kTopKRenorm || M == Mode::kTopPRenorm;

  if (sh.bad_all != 0 || max_key == 0) {
    // No distribution: NaN out (renorm) or id -1 (sampling); see docs/ops/sampling.md.
    if constexpr (kRenorm) {
      float* o = p.out + row * p.V + begin;
      for (int i = tid; i < n; i += nthreads) o[i] = __int_as_float(0x7fc00000);
    } else {
      if (rank == 0 && tid == 0) p.out_ids[row] = -1;
    }
    cluster.sync();  // no block leaves while another may read its shared memory
    return;
  }

  int parity = 0;
  // One histogram level over the keys at or above `lo_key` whose bits above `pshift` equal
  // `pfx`, digits of `width` bits at `shift`, reduced over the cluster into (dst_cnt,
  // dst_qs).
  auto histogram = [&](int pshift, uint32_t pfx, uint32_t lo_key, int shift, int width,
                       uint32_t* dst_cnt, u64* dst_qs) {
    const int buf = parity;
    parity ^= 1;
    for (int d = tid; d < kBins; d += nthreads) {
      sh.cnt[buf][d] = 0;
      sh.qs[buf][d] = 0;
    }
    __syncthreads();
    const uint32_t mask = (1u << width) - 1;
    // Warp-aggregated: a row's keys crowd into a few digits (probabilities share their top
    // exponent bits), so one shared-memory atomic per key would serialize on those bins.
    // The lanes holding the same digit (__match_any_sync) add their count and weights in
    // registers and one of them adds the sums. Weights are < 2^33 (weight_of), so their
    // 16-bit halves summed over 32 lanes stay below 2^22: __reduce_add_sync is exact. The
    // loop runs whole warps (base is uniform) so every lane takes part in the match.
    // Below level 0 only the few keys of the chosen prefix count: a warp holding none of
    // them skips the match and the reductions (one ballot), which makes those levels a
    // plain scan of shared memory.
    constexpr uint32_t kNoDigit = 0xffffffffu;
    for (int base = 0; base < n; base += nthreads) {
      const int i = base + tid;
      uint32_t d = kNoDigit;
      u64 w = 0;
      if (i < n) {
        const uint32_t k = key_at(i);
        if ((k >> pshift) == pfx && k >= lo_key) {
          d = (k >> shift) & mask;
          w = weight_of(k, max_key);
        }
      }
      if (__ballot_sync(0xffffffffu, d != kNoDigit) == 0) continue;  // uniform in the warp
      const unsigned peers = __match_any_sync(0xffffffffu, d);
      if (d != kNoDigit) {
        const uint32_t lo = __reduce_add_sync(peers, static_cast<uint32_t>(w & 0xffffu));
        const uint32_t hi = __reduce_add_sync(peers, static_cast<uint32_t>(w >> 16));
        if ((tid & 31) == __ffs(static_cast<int>(peers)) - 1) {
          atomicAdd(&sh.cnt[buf][d], static_cast<uint32_t>(__popc(peers)));
          atomicAdd(&sh.qs[buf][d], (static_cast<u64>(hi) << 16) + lo);
        }
      }
    }
    // The buffer was last read by the other blocks two levels ago, before the barrier
    // of the previous level, so one cluster barrier per level suffices.
    cluster.sync();
    for (int d = tid; d < kBins; d += nthreads) {
      uint32_t c = 0;
      u64 s = 0;
      for (int r = 0; r < C; ++r) {
        c += *cluster.map_shared_rank(&sh.cnt[buf][d], r);
        s += *cluster.map_shared_rank(&sh.qs[buf][d], r);
      }
      dst_cnt[d] = c;
      dst_qs[d] = s;
    }
    __syncthreads();
  };

  // A radix descent for the largest key t with pred(count(key >= t), weight(key >= t));
  // false when no key qualifies (level 0 found no digit). Levels 1..3 count only keys at
  // or above lo_key: exact when the answer is known to be >= lo_key, as the top-p cut
  // over a top-k set is (see the caller); level 0 reuses the all-keys histogram.
  auto search = [&](auto pred, uint32_t lo_key, Cut& cut) -> bool {
    constexpr int kShift[4] = {23, 15, 7, 0};
    constexpr int kWidth[4] = {8, 8, 8, 7};
    uint32_t pfx = 0, above_c = 0;
    u64 above_s = 0;
    for (int level = 0; level < 4; ++level) {
      const uint32_t* cnt = sh.l0_cnt;
      const u64* qs = sh.l0_qs;
      if (level > 0) {
        histogram(kShift[level - 1], pfx, lo_key, kShift[level], kWidth[level], sh.red_cnt,
                  sh.red_qs);
        cnt = sh.red_cnt;
        qs = sh.red_qs;
      }
      if (tid < 32) descend(sh, cnt, qs, above_c, above_s, pred);
      __syncthreads();
      const int d = sh.digit;
      if (d < 0) return false;  // uniform: level 0 only
      above_c += sh.add_c;
      above_s += sh.add_s;
      pfx = (pfx << kWidth[level]) | static_cast<uint32_t>(d);
      cut.c_eq = sh.eq_c;
      __syncthreads();  // sh.digit etc. are rewritten by the next level
    }
    cut.key = pfx;
    cut.c_gt = above_c;
    cut.s_gt = above_s;
    return true;
  };

  // The largest v over the block (v of every thread; ends with every thread holding it).
  auto block_max = [&](uint32_t v) -> uint32_t {
    v = __reduce_max_sync(0xffffffffu, v);
    __syncthreads();  // the previous readers of sh.ured are done
    if ((tid & 31) == 0) sh.ured[tid >> 5] = v;
    __syncthreads();
    uint32_t m = 0;
    for (int w = 0; w < nthreads / 32; ++w) m = max(m, sh.ured[w]);
    return m;
  };

  // top_k_top_p sampling or top_k renorm with top_k = k in (0, V) when the keys >= lo, lo
  // at or below the top-k cut, are few (at most min(threads, kMaxCand)): every key the
  // top-k cut, the top-p cut, the draw and the renorm sum can touch is >= the top-k cut
  // (see the lo_key comment below),
  // so each block gathers the cluster's keys >= lo with their columns (one pass, one
  // cluster barrier) and finds, on this list of one entry a thread, what the descents, the
  // tie pass and the draw pass would: the same integer sums over the same keys (a key
  // below the top-k cut on the list is never kept, and the counts and weights of the keys
  // at or above any t >= lo are those of the whole row), so the same cuts, ties and id.
  // With lo the top digit's floor of the top-k cut it replaces 6 histogram levels, up to
  // 2 tie barriers and the draw barrier by one (renorm: 3 levels, the tie barriers and the
  // sum barrier); with lo the top-k cut, 3 levels and the rest. Renorm writes its row.
  auto finish_from_candidates = [&](uint32_t lo, uint32_t k) {
    if (tid == 0) sh.loc_n = 0;
    __syncthreads();
    const int lane = tid & 31;
    for (int base = 0; base < n; base += nthreads) {  // whole warps: base is uniform
      const int i = base + tid;
      const uint32_t key = i < n ? key_at(i) : 0;
      const bool cand = i < n && key >= lo;
      const unsigned ball = __ballot_sync(0xffffffffu, cand);
      if (ball == 0) continue;
      const int leader = __ffs(static_cast<int>(ball)) - 1;
      uint32_t at = 0;
      if (lane == leader) at = atomicAdd(&sh.loc_n, static_cast<uint32_t>(__popc(ball)));
      at = __shfl_sync(0xffffffffu, at, leader) +
           static_cast<uint32_t>(__popc(ball & ((1u << lane) - 1)));
      if (cand && at < kMaxCand) {  // the cluster's count bounds it; the test guards memory
        sh.loc_key[at] = key;
        sh.loc_col[at] = static_cast<int32_t>(begin + i);
      }
    }
    cluster.sync();
    if (tid == 0) {
      uint32_t off = 0;
      for (int r = 0; r < C; ++r) {
        sh.goff[r] = off;
        off += min(*cluster.map_shared_rank(&sh.loc_n, r), static_cast<uint32_t>(kMaxCand));
      }
      sh.goff[C] = min(off, static_cast<uint32_t>(kMaxCand));
    }
    __syncthreads();
    const int total = static_cast<int>(sh.goff[C]);  // the keys >= lo
    for (int r = 0; r < C; ++r) {
      const int o = static_cast<int>(sh.goff[r]);
      const int m = min(static_cast<int>(sh.goff[r + 1]), total) - o;
      const uint32_t* rk = cluster.map_shared_rank(sh.loc_key, r);
      const int32_t* rc = cluster.map_shared_rank(sh.loc_col, r);
      for (int j = tid; j < m; j += nthreads) {
        sh.cand_key[o + j] = rk[j];
        sh.cand_col[o + j] = rc[j];
        sh.cand_w[o + j] = weight_of(rk[j], max_key);
      }
    }
    __syncthreads();
    const bool mine = tid < total;  // thread i holds entry i
    const uint32_t my_key = mine ? sh.cand_key[tid] : 0;
    const int32_t my_col = mine ? sh.cand_col[tid] : 0;
    const u64 my_w = mine ? sh.cand_w[tid] : 0;
    // Above my key: the count and weight; at it: the count (ties weigh alike).
    uint32_t gt_c = 0, eq = 0;
    u64 gt = 0;
    if (mine) {
      for (int j = 0; j < total; ++j) {
        const uint32_t kj = sh.cand_key[j];
        if (kj > my_key) {
          ++gt_c;
          gt += sh.cand_w[j];
        }
        eq += kj == my_key;
      }
    }

    // Top-k: the largest key t with count(key >= t) >= k (some: the list holds the top-k
    // cut and every key above it), as search() finds it.
    Cut kcut;
    {
      const uint32_t best = block_max(mine && gt_c + eq >= k ? my_key + 1 : 0);  // < 2^31
      if (mine && my_key == best - 1) {
        sh.add_c = gt_c;  // every thread of this key writes the same values
        sh.add_s = gt;
        sh.eq_c = eq;
      }
      __syncthreads();
      kcut.key = best - 1;
      kcut.c_gt = sh.add_c;
      kcut.s_gt = sh.add_s;
      kcut.c_eq = sh.eq_c;
      kcut.ties = k - kcut.c_gt;
      __syncthreads();  // sh.add_s, sh.eq_c are rewritten below
    }
    if constexpr (M == Mode::kTopKRenorm) {
      // out = p / (sum of the kept p) on the kept set: the list holds every kept entry,
      // hence the sum (double, one fixed order; the CPU's order differs, see
      // docs/ops/sampling.md) and the column of the last kept tie.
      bool kept = mine && my_key > kcut.key;
      if (mine && my_key == kcut.key) {
        uint32_t before = 0;
        for (int j = 0; j < total; ++j)
          before += sh.cand_key[j] == kcut.key && sh.cand_col[j] < my_col;
        kept = before < kcut.ties;
      }
      // At least one tie is kept (kcut.ties >= 1): last >= 1.
      const uint32_t last =
          block_max(kept && my_key == kcut.key ? static_cast<uint32_t>(my_col) + 1 : 0);
      const long long tie_col = static_cast<long long>(last) - 1;
      const float sum =
          static_cast<float>(block_sum(sh, kept ? static_cast<double>(key_value(my_key)) : 0.0));
      float* o = p.out + row * p.V + begin;
      for (int i = tid; i < n; i += nthreads) {
        const uint32_t key = key_at(i);
        const bool keep = key > kcut.key || (key == kcut.key && begin + i <= tie_col);
        o[i] = keep ? __fdiv_rn(key_value(key), sum) : 0.0f;
      }
      return;
    }
    const u64 kept_total = kcut.s_gt + static_cast<u64>(kcut.ties) * weight_of(kcut.key, max_key);

    // Top-p over the top-k set: the largest key t whose weight(key >= t) reaches the
    // target, as search() finds it (weight(key >= my_key) = s_gt + c_eq * q); then how
    // many of its ties, and the shorter cut of the two.
    Cut cut = kcut;
    const float top_p = __ldg(p.top_p + row);
    if (!top_p_keeps_all(top_p)) {
      const double target = top_p_target(top_p, kept_total);
      Cut pcut;
      bool found = true;
      if (!(target > 0)) {
        pcut.key = max_key;  // the first max only: rank the ties of the max
        pcut.ties = 1;
        pcut.c_eq = kAllTies;
      } else {
        const bool ok = mine && reaches(gt + static_cast<u64>(eq) * my_w, target);
        const uint32_t best = block_max(ok ? my_key + 1 : 0);  // keys < 2^31: no wrap
        found = best != 0;  // always (the keys >= kcut.key weigh >= the target)
        if (found && mine && my_key == best - 1) {
          sh.add_s = gt;  // every thread of this key writes the same values
          sh.eq_c = eq;
        }
        __syncthreads();
        if (found) {
          pcut.key = best - 1;
          pcut.s_gt = sh.add_s;
          pcut.c_eq = sh.eq_c;
          pcut.ties = ties_needed(pcut.s_gt, weight_of(pcut.key, max_key), pcut.c_eq, target);
        }
      }
      if (found && (pcut.key > cut.key || (pcut.key == cut.key && pcut.ties < cut.ties))) {
        cut = pcut;
      }
    }

    // Kept: above the cut, or one of its first cut.ties ties in column order.
    bool kept = false;
    if (mine && my_key > cut.key) {
      kept = true;
    } else if (mine && my_key == cut.key) {
      uint32_t before = 0;
      for (int j = 0; j < total; ++j)
        before += sh.cand_key[j] == cut.key && sh.cand_col[j] < my_col;
      kept = cut.ties == kAllTies || before < cut.ties;
    }
    __syncthreads();  // every thread is done reading cand_w
    if (mine) sh.cand_w[tid] = kept ? my_w : 0;
    __syncthreads();

    // The draw: the kept entry of smallest column whose inclusive prefix weight (kept
    // entries in column order) exceeds the point.
    u64 all = 0, incl = 0;
    for (int j = 0; j < total; ++j) {
      const u64 w = sh.cand_w[j];
      all += w;
      if (sh.cand_col[j] <= my_col) incl += w;
    }
    const uint64_t seed = static_cast<uint64_t>(p.rng[0]);
    const uint64_t offset = static_cast<uint64_t>(p.rng[1]);
    const u64 point = draw_point(philox_draw(seed, offset, static_cast<uint32_t>(row)), all);
    const bool hit = kept && incl > point;
    // The smallest hit column, as the largest 2^31 - col (columns < 2^31; 0: none).
    const uint32_t m = block_max(hit ? 0x80000000u - static_cast<uint32_t>(my_col) : 0);
    if (rank == 0 && tid == 0) {
      p.out_ids[row] = m != 0 ? static_cast<int32_t>(0x80000000u - m) : -1;
    }
  };

  // ---- The cut ----
  Cut cut;
  if constexpr (M == Mode::kMinPSample) {
    cut.key = min_p_threshold(__ldg(p.min_p + row), max_key);
  } else {
    histogram(31, 0, 0, 23, 8, sh.l0_cnt, sh.l0_qs);
    Cut kcut;  // top-k (or everything)
    u64 kept_total;
    const uint32_t cand_cap = static_cast<uint32_t>(min(nthreads, kMaxCand));
    if constexpr (M == Mode::kTopKRenorm || M == Mode::kTopKTopPSample) {
      const int32_t k = __ldg(p.top_k + row);
      if (k > 0 && k < p.V) {
        const uint32_t ku = static_cast<uint32_t>(k);
        {
          // Level 0 of the top-k descent: when the keys of its digit and above are few,
          // the candidate list replaces the rest (uniform: cluster-reduced histogram).
          if (tid < 32)
            descend(sh, sh.l0_cnt, sh.l0_qs, 0, 0, [ku](uint32_t c, u64) { return c >= ku; });
          __syncthreads();
          const int d0 = sh.digit;
          const uint32_t at_or_above = sh.add_c + sh.eq_c;
          __syncthreads();  // sh.digit etc. are rewritten by the search
          if (d0 >= 0 && at_or_above <= cand_cap) {
            finish_from_candidates(static_cast<uint32_t>(d0) << 23, ku);
            cluster.sync();  // no block leaves while another may read its shared memory
            return;
          }
        }
        search([ku](uint32_t c, u64) { return c >= ku; }, 0, kcut);
        kcut.ties = ku - kcut.c_gt;
      }
    }
    if (kcut.ties == kAllTies) {
      if (tid < 32) {
        u64 s = 0;
        for (int b = 0; b < 8; ++b) s += sh.l0_qs[tid * 8 + b];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (tid == 0) sh.total = s;
      }
      __syncthreads();
      kept_total = sh.total;
    } else {
      kept_total = kcut.s_gt + static_cast<u64>(kcut.ties) * weight_of(kcut.key, max_key);
    }
    if constexpr (M == Mode::kTopKTopPSample) {
      // Uniform over the cluster: kcut comes from the cluster-reduced histograms.
      if (kcut.ties != kAllTies && kcut.c_gt + kcut.c_eq <= cand_cap) {
        finish_from_candidates(kcut.key, kcut.ties + kcut.c_gt);
        cluster.sync();  // no block leaves while another may read its shared memory
        return;
      }
    }
    cut = kcut;
    if constexpr (M == Mode::kTopPRenorm || M == Mode::kTopKTopPSample) {
      const float top_p = __ldg(p.top_p + row);
      if (!top_p_keeps_all(top_p)) {
        const double target = top_p_target(top_p, kept_total);
        // After a top-k cut the top-p cut is at or above it: the keys >= kcut.key (all
        // its ties) weigh at least kept_total >= target, so the largest t reaching the
        // target is >= kcut.key, and a descent counting only the keys >= kcut.key (k
        // plus ties: here more than the candidate list holds, e.g. a long run of ties at
        // the cut) finds the same t, ties and weights. When
        // this t is kcut.key, ties_needed keeps at most kcut.ties of its ties (their
        // weight kept_total reaches the target), so the choice below is unchanged.
        const uint32_t lo_key = kcut.ties == kAllTies ? 0 : kcut.key;
        Cut pcut;
        bool found = true;
        if (!(target > 0)) {
          pcut.key = max_key;  // the first max only: rank the ties of the max
          pcut.ties = 1;
          pcut.c_eq = kAllTies;
        } else if (search([target](uint32_t, u64 s) { return reaches(s, target); }, lo_key, pcut)) {
          pcut.ties = ties_needed(pcut.s_gt, weight_of(pcut.key, max_key), pcut.c_eq, target);
        } else {
          found = false;
        }
        // The shorter prefix of the two (top-p over the top-k set never exceeds it).
        if (found && (pcut.key > cut.key || (pcut.key == cut.key && pcut.ties < cut.ties))) {
          cut = pcut;
        }
      }
    }
  }

  // ---- Ties: the column of the last kept tie, when not all are kept ----
  long long tie_col = p.V;  // every tie kept
  if (cut.ties != kAllTies && cut.ties < cut.c_eq) {
    // Contiguous chunks per thread (odd length: conflict-free), ranked in index order.
    const int ch = ((n + nthreads - 1) / nthreads) | 1;
    const int lo = tid * ch, hi = min(lo + ch, n);
    uint32_t c = 0;
    for (int i = lo; i < hi; ++i) c += key_at(i) == cut.key;
    u64 block_total;
    const u64 excl = block_exclusive_scan(sh, c, block_total);
    if (tid == 0) sh.eq_count = static_cast<uint32_t>(block_total);
    cluster.sync();
    if (tid == 0) {
      u64 before = 0;
      for (unsigned r = 0; r < rank; ++r) before += *cluster.map_shared_rank(&sh.eq_count, r);
      sh.prefix = before;
    }
    __syncthreads();
    const u64 want = cut.ties - 1;  // 0-based rank of the last kept tie
    u64 at = sh.prefix + excl;
    if (want >= at && want < at + c) {
      for (int i = lo; i < hi; ++i) {
        if (key_at(i) != cut.key) continue;
        if (at++ == want) {
          sh.tie_col = begin + i;
          break;
        }
      }
    }
    cluster.sync();
    if (tid == 0) {
      long long col = -1;
      for (int r = 0; r < C; ++r) col = max(col, *cluster.map_shared_rank(&sh.tie_col, r));
      sh.col = col;
    }
    __syncthreads();
    tie_col = sh.col;
  }
  const uint32_t ck = cut.key;
  auto kept = [&](uint32_t k, int i) { return k > ck || (k == ck && begin + i <= tie_col); };

  if constexpr (kRenorm) {
    // ---- out = p / (sum of the kept p) ----
    double s = 0;
    for (int i = tid; i < n; i += nthreads) {
      const uint32_t k = key_at(i);
      if (kept(k, i)) s += key_value(k);
    }
    s = block_sum(sh, s);
    if (tid == 0) sh.kept_sum = s;
    cluster.sync();
    if (tid == 0) {
      double all = 0;
      for (int r = 0; r < C; ++r) all += *cluster.map_shared_rank(&sh.kept_sum, r);
      sh.sum = all;
    }
    __syncthreads();
    const float sum = static_cast<float>(sh.sum);
    float* o = p.out + row * p.V + begin;
    for (int i = tid; i < n; i += nthreads) {
      const uint32_t k = key_at(i);
      o[i] = kept(k, i) ? __fdiv_rn(key_value(k), sum) : 0.0f;
    }
  } else {
    // ---- The draw: the first kept token, in index order, whose inclusive prefix weight
    // exceeds draw_point(philox bits, kept weight) ----
    const int ch = ((n + nthreads - 1) / nthreads) | 1;
    const int lo = tid * ch, hi = min(lo + ch, n);
    u64 w = 0;
    for (int i = lo; i < hi; ++i) {
      const uint32_t k = key_at(i);
      if (kept(k, i)) w += weight_of(k, max_key);
    }
    u64 block_total;
    const u64 excl = block_exclusive_scan(sh, w, block_total);
    if (tid == 0) sh.kept_q = block_total;
    cluster.sync();
    if (tid == 0) {
      u64 before = 0, total = 0;
      for (int r = 0; r < C; ++r) {
        const u64 q = *cluster.map_shared_rank(&sh.kept_q, r);
        if (static_cast<unsigned>(r) < rank) before += q;
        total += q;
      }
      const uint64_t seed = static_cast<uint64_t>(p.rng[0]);
      const uint64_t offset = static_cast<uint64_t>(p.rng[1]);
      sh.prefix = before;
      sh.point = draw_point(philox_draw(seed, offset, static_cast<uint32_t>(row)), total);
    }
    __syncthreads();
    const u64 point = sh.point;
    u64 at = sh.prefix + excl;
    if (point >= at && point < at + w) {
      for (int i = lo; i < hi; ++i) {
        const uint32_t k = key_at(i);
        if (!kept(k, i)) continue;
        at += weight_of(k, max_key);
        if (point < at) {
          p.out_ids[row] = static_cast<int32_t>(begin + i);
          break;
        }
      }
    }
  }
  cluster.sync();  // no block leaves while another may read its shared memory
#else
  __trap();  // registered for sm_90+ only (.sm(90))
#endif
}

// rng[1] += 1 after the sampling kernel read it (same stream, so a captured graph draws
// fresh numbers on every replay). Launched as a programmatic dependent of the sampling
// kernel where the device has PDL, so its launch overlaps the sampling kernel:
// griddepcontrol.wait returns once that kernel has completed (every row has read the
// offset) and its writes are visible.
__global__ void advance_rng_kernel(int64_t* rng) {
  kreg::device::pdl_wait();
  rng[1] = static_cast<int64_t>(static_cast<uint64_t>(rng[1]) + 1);
}

// The shape of one launch for rows of V columns, C blocks a row.
struct Geometry {
  int64_t slice = 0;  // columns per block, a multiple of 4
  bool smem_row = false;
  size_t smem = 0;
  int threads = 0;
};

Geometry geometry(int64_t V, int C) {
  Geometry g;
  g.slice = ((V + C - 1) / C + 3) / 4 * 4;
  g.smem_row = g.slice * 4 <= kMaxRowSmem;
  g.smem = g.smem_row ? static_cast<size_t>(g.slice) * 4 : 0;
  // About 16 keys a thread with kCluster blocks, 8 with kWideCluster: at V = 128256 both
  // run 1024 threads, the wide cluster halving each thread's share of every pass.
  const int64_t per = C == kWideCluster ? 8 : 16;
  const int64_t t = ((g.slice + per - 1) / per + 31) / 32 * 32;
  g.threads = static_cast<int>(t < kBins ? kBins : (t > 1024 ? 1024 : t));
  return g;
}

template <Mode M, int C>
cudaError_t launch_clusters(const Geometry& g, int64_t B, const Params& prm, cudaStream_t stream,
                            bool pdl) {
  auto* kernel = &sampling_kernel<M, C>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(g.smem));
  if (err != cudaSuccess) return err;
  if constexpr (C > kCluster) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
  }
  return device::launch_clusters(kernel, dim3(static_cast<unsigned>(B * C)),
                                 dim3(static_cast<unsigned>(g.threads)), g.smem, stream, pdl, C,
                                 prm);
}

// How many kWideCluster clusters of this geometry the device runs at once (0 when it
// cannot, or when asking fails: then the portable size is used). Asked once per device
// and geometry: the last answer per mode is kept (benign under the mutex).
template <Mode M>
int wide_clusters_at_once(const Geometry& g) {
  struct Known {
    int dev = -1;
    size_t smem = 0;
    int threads = 0;
    int clusters = 0;
  };
  static std::mutex mu;
  static Known known;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const std::lock_guard<std::mutex> lock(mu);
  if (known.dev == dev && known.smem == g.smem && known.threads == g.threads) {
    return known.clusters;
  }
  auto* kernel = &sampling_kernel<M, kWideCluster>;
  int clusters = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
          cudaSuccess &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(g.smem)) == cudaSuccess) {
    clusters = device::max_active_clusters(kernel, kWideCluster,
                                           dim3(static_cast<unsigned>(g.threads)), g.smem);
  } else {
    cudaGetLastError();  // not an error of the call: the portable size serves
  }
  known = Known{dev, g.smem, g.threads, clusters};
  return clusters;
}

template <Mode M>
KernelStatus launch(Context& ctx, const char* op, const DLTensor& probs, Params prm, int64_t* rng) {
  const int64_t B = probs.shape[0], V = probs.shape[1];
  if (B == 0) return kOk;
  if (V < 1 || V > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: probs has V = %lld columns; need 1 <= V <= 2^31-1",
                    op, static_cast<long long>(V));
  }
  if (B > INT32_MAX / kCluster) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: B = %lld rows; at most %d", op,
                    static_cast<long long>(B), INT32_MAX / kCluster);
  }
  const device::DeviceGuard guard(probs);
  if (!guard.ok()) return guard.fail(ctx, op);

  // Few rows (B = 1: one decode token) leave most SMs idle and each row's time is one
  // block's passes: 16 blocks a row halve them, when the device runs all B clusters of 16
  // at once (one wave; else the portable 8, whose clusters fill the GPU).
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream());
  const bool pdl = ctx.pdl() && device::pdl_supported();
  const Geometry wide = geometry(V, kWideCluster);
  const bool use_wide = V >= kWideMinV && B <= wide_clusters_at_once<M>(wide);
  const Geometry g = use_wide ? wide : geometry(V, kCluster);
  prm.V = V;
  prm.slice = static_cast<int32_t>(g.slice);
  prm.smem_row = g.smem_row;
  cudaError_t err = cudaErrorNotReady;
  if (use_wide) {
    err = launch_clusters<M, kWideCluster>(g, B, prm, stream, pdl);
    if (err != cudaSuccess) cudaGetLastError();  // refused after all: the portable size
  }
  if (err != cudaSuccess) {
    const Geometry p8 = geometry(V, kCluster);
    prm.slice = static_cast<int32_t>(p8.slice);
    prm.smem_row = p8.smem_row;
    err = launch_clusters<M, kCluster>(p8, B, prm, stream, pdl);
  }
  if (err != cudaSuccess) return device::launch_status(ctx, op, err);
  if (rng != nullptr) {
    // PDL here whatever ctx.pdl() says: the only kernel this one overlaps is ours, and
    // the kernel after it starts once it has completed (it never signals early).
    err = device::launch(advance_rng_kernel, dim3(1), dim3(1), 0, stream, true, rng);
    if (err != cudaSuccess) return device::launch_status(ctx, op, err);
  }
  return device::launch_status(ctx, op);
}

}  // namespace

KernelStatus top_k_renorm_probs_cuda(Context& ctx, const DLTensor& probs, const DLTensor& top_k,
                                     DLTensor& out) {
  Params prm{};
  prm.probs = data_ptr<const float>(probs);
  prm.top_k = data_ptr<const int32_t>(top_k);
  prm.out = data_ptr<float>(out);
  return launch<Mode::kTopKRenorm>(ctx, "sampling.top_k_renorm_probs", probs, prm, nullptr);
}

KernelStatus top_p_renorm_probs_cuda(Context& ctx, const DLTensor& probs, const DLTensor& top_p,
                                     DLTensor& out) {
  Params prm{};
  prm.probs = data_ptr<const float>(probs);
  prm.top_p = data_ptr<const float>(top_p);
  prm.out = data_ptr<float>(out);
  return launch<Mode::kTopPRenorm>(ctx, "sampling.top_p_renorm_probs", probs, prm, nullptr);
}

KernelStatus top_k_top_p_sampling_from_probs_cuda(Context& ctx, const DLTensor& probs,
                                                  const DLTensor& top_k, const DLTensor& top_p,
                                                  DLTensor& out_ids, DLTensor& rng) {
  Params prm{};
  prm.probs = data_ptr<const float>(probs);
  prm.top_k = data_ptr<const int32_t>(top_k);
  prm.top_p = data_ptr<const float>(top_p);
  prm.out_ids = data_ptr<int32_t>(out_ids);
  prm.rng = data_ptr<const int64_t>(rng);
  return launch<Mode::kTopKTopPSample>(ctx, "sampling.top_k_top_p_sampling_from_probs", probs, prm,
                                       data_ptr<int64_t>(rng));
}

KernelStatus min_p_sampling_from_probs_cuda(Context& ctx, const DLTensor& probs,
                                            const DLTensor& min_p, DLTensor& out_ids,
                                            DLTensor& rng) {
  Params prm{};
  prm.probs = data_ptr<const float>(probs);
  prm.min_p = data_ptr<const float>(min_p);
  prm.out_ids = data_ptr<int32_t>(out_ids);
  prm.rng = data_ptr<const int64_t>(rng);
  return launch<Mode::kMinPSample>(ctx, "sampling.min_p_sampling_from_probs", probs, prm,
                                   data_ptr<int64_t>(rng));
}

}  // namespace kreg::sampling
