// CPU emulation of lplb_solve_bench.cu's one-block kernels (V2, V3) against the CPU solve,
// for checking a variant's logic where no GPU is at hand (not its speed; not a substitute
// for the bench's GPU rows). 512 cooperative threads, __syncthreads / warp operations as
// barriers; each V3 solve also runs with the threads in reverse and shuffled order within
// every barrier interval, so a missing barrier (a race) shows as a failure.
//   cd tools/bench/variants/lplb_emu && python3 extract.py ../lplb_solve_bench.cu /tmp/gen.hpp &&
//   g++ -std=c++20 -O1 -U_FORTIFY_SOURCE -fno-strict-aliasing -w -I/tmp -I. main.cpp -o
//   /tmp/lplb_emu && /tmp/lplb_emu 4      (4: the bench's correctness LPs, 213; 1: demo; 2:
//   small/dense; 3: larger)
#include <chrono>
#include <string>
#include "gen.hpp"
// Emulated launch: vec4 when A is 16-byte aligned, as the bench's launch.
template <class K>
Result emu_run(K kernel, const HostLp& h, int max_iter, double tol, int order, int a_off,
               bool* ok) {
  std::vector<float> abuf(h.A.size() + 8 + a_off);
  float* base = abuf.data();
  while (reinterpret_cast<uintptr_t>(base) & 15) ++base;
  float* A = base + a_off;
  std::copy(h.A.begin(), h.A.end(), A);
  std::vector<float> b = h.b, c = h.c;
  Result r{std::vector<float>(h.n, NAN), std::vector<float>(8, NAN)};
  const bool vec4 = (reinterpret_cast<uintptr_t>(A) & 15) == 0;
  std::memset(emu::smem_buf, 0xcd,
              sizeof emu::smem_buf);  // garbage, like uninitialised shared memory
  *ok = emu::run(
      [&] {
        kernel(A, b.data(), c.data(), r.x.data(), r.st.data(), h.m, h.n, max_iter, tol, vec4,
               nullptr);
      },
      order);
  return r;
}
int main(int argc, char** argv) {
  const int which = argc > 1 ? std::atoi(argv[1]) : 4;
  std::vector<HostLp> lps;
  std::vector<int> aoff;
  auto add = [&](HostLp h, int off = 0) {
    lps.push_back(std::move(h));
    aoff.push_back(off);
  };
  if (which == 0 || which == 1) {
    add(demo_lp(1, 256, 8, 32, 4096, 8, 1.0));
    add(demo_lp(2, 256, 8, 32, 4096, 8, 1.0), 1);
    add(demo_lp(8, 256, 8, 32, 512, 8, 0.0));
  }
  if (which == 0 || which == 2) {
    std::mt19937_64 rng(17);
    for (int t = 0; t < 24; ++t) {
      std::uniform_int_distribution<int> L(1, 16), G(1, 6), C(1, 4), X(0, 12), O(0, 2);
      const int c = C(rng);
      const int l = L(rng), gg = G(rng), x = X(rng), o = O(rng);
      add(random_lp(rng, l, gg, c, x, o, t % 4 == 0, "small " + std::to_string(t)), t % 3 == 0);
    }
    std::mt19937_64 rng2(31);
    for (int t = 0; t < 12; ++t) {
      const int m = 1 + t % 20, n = m + 1 + (t * 7) % (m + 5);
      add(dense_lp(rng2, m, n, "dense " + std::to_string(t)));
    }
  }
  if (which == 0 || which == 3) {
    std::mt19937_64 rng(5);
    add(random_lp(rng, 96, 40, 4, 40, 0, true, "G=40"));
    std::mt19937_64 rng2(31);
    add(dense_lp(rng2, 20, 44, "dense 20x44"));
    add(demo_lp(4, 256, 16, 32, 4096, 8, 1.0));
    std::mt19937_64 rng3(4);
    add(random_lp(rng3, 256, 8, 4, 32, 0, true, "tests' large_instance(4)"));
  }
  if (which == 4) {
    for (uint64_t s = 1; s <= 6; ++s) add(demo_lp(s, 256, 8, 32, 4096, 8, 1.0));
    add(demo_lp(7, 256, 8, 32, 4096, 8, 1.5));
    add(demo_lp(8, 256, 8, 32, 512, 8, 0.0));
    for (uint64_t s = 1; s <= 6; ++s) {
      std::mt19937_64 rng(s);
      add(random_lp(rng, 256, 8, 4, 32, 0, true, "large " + std::to_string(s)));
    }
    {
      std::mt19937_64 rng(17);
      for (int t = 0; t < 120; ++t) {
        std::uniform_int_distribution<int> L(1, 16), G(1, 6), C(1, 4), X(0, 12), O(0, 2);
        const int c = C(rng);
        const int l = L(rng), gg = G(rng), x = X(rng), o = O(rng);
        add(random_lp(rng, l, gg, c, x, o, t % 4 == 0, "small " + std::to_string(t)));
      }
    }
    {
      std::mt19937_64 rng(31);
      for (int t = 0; t < 60; ++t) {
        const int m = 1 + t % 20, n = m + 1 + (t * 7) % (m + 5);
        add(dense_lp(rng, m, n, "dense " + std::to_string(t)));
      }
    }
    {
      std::mt19937_64 rng(5);
      add(random_lp(rng, 96, 40, 4, 40, 0, true, "G=40"));
      add(random_lp(rng, 64, 48, 3, 30, 1, false, "G=48"));
      add(random_lp(rng, 200, 33, 4, 60, 0, true, "G=33"));
      add(dense_lp(rng, 40, 70, "dense 40x70"));
    }
    add(demo_lp(3, 512, 16, 64, 8192, 8, 1.0));
    add(demo_lp(4, 256, 16, 32, 4096, 8, 1.0));
    {
      std::mt19937_64 rng(9);
      add(random_lp(rng, 1000, 8, 2, 24, 0, true, "1000/+24/8"));
    }
    add(demo_lp(1, 256, 8, 32, 4096, 8, 1.0), 1);
    add(demo_lp(2, 256, 8, 32, 4096, 8, 1.0), 1);
    std::mt19937_64 rng(77);
    for (int t = 0; t < 6; ++t)
      add(random_lp(rng, 3 + 2 * t, 1 + t, 3, 4, t % 2, t % 2 == 0, "unaligned small"), 1);
    add(dense_lp(rng, 13, 29, "unaligned dense 13x29"), 1);
    {
      std::mt19937_64 r2(9);
      add(random_lp(r2, 400, 8, 2, 24, 0, true, "400/+24/8 skewed"));
    }
  }
  int fails = 0;
  for (size_t i = 0; i < lps.size(); ++i) {
    const HostLp& h = lps[i];
    for (int mi : {30, 0, 2}) {
      if (mi != 30 && i > 0) continue;
      Result c{std::vector<float>(h.n), std::vector<float>(8)};
      cpu::solve(h.A.data(), h.b.data(), h.c.data(), h.m, h.n, mi, 1e-6, c.x.data(), c.st.data());
      for (int v = 2; v <= 3; ++v) {
        for (int order : {0, 1, 7}) {
          if (v == 2 && order != 0) continue;
          bool ok = false;
          auto t0 = std::chrono::steady_clock::now();
          const Result g = v == 2
                               ? emu_run(v2::ipm_kernel<false>, h, mi, 1e-6, order, aoff[i], &ok)
                               : emu_run(v3::ipm_kernel<false>, h, mi, 1e-6, order, aoff[i], &ok);
          const double sec =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          Agreement a = compare(g, c, nullptr);
          bool good = ok && a.ok;
          if (a.why == "refused (too large) where V0 is not")
            good = ok && c.st[kStatusDiagRows] == g.st[kStatusDiagRows];
          double xe = 0, xmax = 0;
          for (float q : c.x) xmax = std::max(xmax, std::fabs(double(q)));
          for (int j = 0; j < h.n; ++j)
            xe = std::max(xe, std::fabs(double(g.x[j]) - c.x[j]) / (1 + xmax));
          if (mi != 30)
            good = good && g.st[0] == c.st[0] && g.st[4] == c.st[4] && g.st[6] == c.st[6] &&
                   g.st[7] == c.st[7] && xe <= 1e-6;
          fails += !good;
          std::printf(
              "V%d ord %d %-28s %4dx%-4d mi %2d: it %g/%g conv %g/%g reason %g/%g k %g/%g dx %.2e "
              "%s%s (%.1fs)\n",
              v, order, h.name.c_str(), h.m, h.n, mi, g.st[4], c.st[4], g.st[0], c.st[0], g.st[6],
              c.st[6], g.st[7], c.st[7], xe, good ? "ok" : "FAIL ", good ? "" : a.why.c_str(), sec);
          std::fflush(stdout);
        }
      }
    }
  }
  std::printf("%d failures\n", fails);
  return fails != 0;
}
