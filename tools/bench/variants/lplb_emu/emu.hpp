// Minimal CUDA single-block emulator (for lplb_emu/main.cpp): 512 cooperative threads (makecontext
// + _setjmp/_longjmp), warp-level ops by exchange + warp barrier, __syncthreads as a block barrier.
#pragma once
#include <setjmp.h>
#include <ucontext.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>
using std::isfinite;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(a, b)
#define __align__(n) alignas(n)
struct Dim3 {
  unsigned x, y, z;
};
struct float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) double2 {
  double x, y;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline double2 make_double2(double a, double b) { return {a, b}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
typedef int cudaStream_t;

namespace emu {
constexpr int kT = 512;
enum St { RUN, WWAIT, BWAIT, DONE };
struct Thr {
  jmp_buf jb;
  ucontext_t uc;
  St st;
  bool started;
  std::vector<char> stack;
};
inline Thr thr[kT];
inline jmp_buf sched_jb;
inline ucontext_t sched_uc;
inline int cur = 0;
inline std::function<void()> body;
alignas(16) inline unsigned char smem_buf[232448];
inline uint64_t slots[kT / 32][32];
inline long long nsync = 0;
inline void yield(St s) {
  thr[cur].st = s;
  ++nsync;
  if (!_setjmp(thr[cur].jb)) _longjmp(sched_jb, 1);
}
inline void tramp() {
  body();
  thr[cur].st = DONE;
  _longjmp(sched_jb, 1);
}
// Runs body on 512 threads; order: 0 forward, 1 reverse, >1 random permutation per round.
inline bool run(std::function<void()> f, int order) {
  body = std::move(f);
  for (int t = 0; t < kT; ++t) {
    thr[t].st = RUN;
    thr[t].started = false;
    if (thr[t].stack.empty()) thr[t].stack.resize(1 << 18);
  }
  std::mt19937 rng(order);
  std::vector<int> perm(kT);
  for (int t = 0; t < kT; ++t) perm[t] = t;
  for (;;) {
    if (order == 1) std::reverse(perm.begin(), perm.end());
    if (order > 1) std::shuffle(perm.begin(), perm.end(), rng);
    for (int pi = 0; pi < kT; ++pi) {
      const int t = perm[pi];
      if (thr[t].st != RUN) continue;
      cur = t;
      if (!_setjmp(sched_jb)) {
        if (!thr[t].started) {
          thr[t].started = true;
          getcontext(&thr[t].uc);
          thr[t].uc.uc_stack.ss_sp = thr[t].stack.data();
          thr[t].uc.uc_stack.ss_size = thr[t].stack.size();
          thr[t].uc.uc_link = nullptr;
          makecontext(&thr[t].uc, tramp, 0);
          swapcontext(&sched_uc, &thr[t].uc);
        } else {
          _longjmp(thr[t].jb, 1);
        }
      }
    }
    // everyone waits or is done
    bool released = false;
    for (int w = 0; w < kT / 32; ++w) {
      int ww = 0;
      for (int l = 0; l < 32; ++l) ww += thr[w * 32 + l].st == WWAIT;
      if (ww == 32) {
        for (int l = 0; l < 32; ++l) thr[w * 32 + l].st = RUN;
        released = true;
      } else if (ww > 0) {
        std::printf("EMU: warp %d: %d lanes at a warp sync, the others not\n", w, ww);
        return false;
      }
    }
    if (released) continue;
    int bw = 0, dn = 0;
    for (int t = 0; t < kT; ++t) bw += thr[t].st == BWAIT, dn += thr[t].st == DONE;
    if (dn == kT) return true;
    if (bw + dn == kT && dn == 0) {
      for (int t = 0; t < kT; ++t) thr[t].st = RUN;
      continue;
    }
    std::printf("EMU: deadlock (%d at __syncthreads, %d done)\n", bw, dn);
    return false;
  }
}
template <class T>
inline T exch(T v, int src) {
  const int lane = cur % 32, w = cur / 32;
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  slots[w][lane] = b;
  yield(WWAIT);
  T r;
  uint64_t o = slots[w][src];
  std::memcpy(&r, &o, sizeof(T));
  yield(WWAIT);
  return r;
}
inline unsigned gather_bits(bool p) {
  const int lane = cur % 32, w = cur / 32;
  slots[w][lane] = p ? 1 : 0;
  yield(WWAIT);
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= (slots[w][l] ? 1u : 0u) << l;
  yield(WWAIT);
  return m;
}
template <class F>
inline unsigned redux(unsigned v, F f) {
  const int lane = cur % 32, w = cur / 32;
  slots[w][lane] = v;
  yield(WWAIT);
  unsigned m = static_cast<unsigned>(slots[w][0]);
  for (int l = 1; l < 32; ++l) m = f(m, static_cast<unsigned>(slots[w][l]));
  yield(WWAIT);
  return m;
}
}  // namespace emu

#define threadIdx (Dim3{static_cast<unsigned>(emu::cur), 0u, 0u})
#define blockDim (Dim3{512u, 1u, 1u})
inline void __syncthreads() { emu::yield(emu::BWAIT); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield(emu::WWAIT); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = emu::cur % 32;
  return emu::exch(v, (lane / width) * width + (src % width));
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const int lane = emu::cur % 32;
  int src = lane ^ mask;
  if (src / width != lane / width) src = lane;
  return emu::exch(v, src);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  const int lane = emu::cur % 32;
  const int sub = lane % width;
  return emu::exch(v, sub >= static_cast<int>(d) ? lane - static_cast<int>(d) : lane);
}
inline unsigned __ballot_sync(unsigned, bool p) { return emu::gather_bits(p); }
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  return emu::redux(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
  return emu::redux(v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int atomicAdd(int* p, int v) {
  int o = *p;
  *p += v;
  return o;
}
inline int atomicMin(int* p, int v) {
  int o = *p;
  *p = std::min(o, v);
  return o;
}
inline long long clock64() { return 0; }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline int __double2hiint(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return static_cast<int>(b >> 32);
}
inline int __double2loint(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return static_cast<int>(b & 0xffffffffu);
}
inline double __hiloint2double(int hi, int lo) {
  uint64_t b = (static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32) | static_cast<uint32_t>(lo);
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}
inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
inline int __float_as_int(float f) {
  int v;
  std::memcpy(&v, &f, 4);
  return v;
}
template <class A, class B>
inline auto min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <class A, class B>
inline auto max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) > static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
