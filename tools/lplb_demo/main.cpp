// lplb_demo: LP-based load balancing of redundant MoE experts, end to end through the
// registry (docs/ops/lplb.md).
//
// Simulates one batch of skewed routing (Zipf over the experts, top-k distinct experts per
// token), places the experts on GPUs (E/G primaries per GPU, the hottest experts get one
// extra replica each on the least-loaded GPU that lacks them), then runs
// lplb.build_lp -> lplb.solve -> lplb.replica_probabilities -> lplb.dispatch and prints the
// largest and mean GPU load: without replication, with replication split uniformly, and
// after balancing (the LP's optimum and the load the sampled dispatch realises), plus the
// time of each op. On CPU by default; --device cuda runs the CUDA implementations and
// times them with CUDA events.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_numbers.hpp"
#include "cli_parse.hpp"
#include "harness.hpp"
#include "kreg/parse_number.hpp"
#include "kreg/registry.hpp"
#include "kreg/text.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

// The CUDA solver's limits (kMaxRows, kMaxCols, kMaxNnz), from the plugin's own header.
#include "lplb.hpp"

namespace {

using kreg::harness::Buffer;

struct Options {
  std::string manifest;
  std::string device = "cpu";
  int64_t tokens = 4096, topk = 8, experts = 256, gpus = 8, extra = 32, max_iter = 30;
  double zipf = 1.0;
  // Taken as text and parsed by kreg/parse_number.hpp, as kreg run's: whole, in range,
  // never wrapped ("--seed -1" is an error, not 2^64-1).
  std::string seed_text = "1";
  uint64_t seed = 1;
  int reps = 200;
  bool pdl = false;  // CUDA: launch flag KREG_LAUNCH_PDL on every call
};

struct Placement {
  int64_t C = 1, R = 0;
  std::vector<double> log2phy;  // [E, C]
  std::vector<double> phy2gpu;  // [R]
  std::vector<int64_t> primary_gpu;
};

// E/G primaries per GPU (expert e on GPU e / (E/G)); `extra` replicas for the hottest
// experts by expected load, each on the GPU with the least expected load (uniform split)
// that does not hold the expert yet. Replica ids are numbered GPU by GPU.
Placement place(const Options& o, const std::vector<double>& weight) {
  const int64_t E = o.experts, G = o.gpus;
  std::vector<std::vector<int64_t>> gpus_of(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) gpus_of[static_cast<size_t>(e)].push_back(e * G / E);
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return weight[static_cast<size_t>(a)] > weight[static_cast<size_t>(b)];
  });
  auto expected_loads = [&] {
    std::vector<double> load(static_cast<size_t>(G), 0.0);
    for (int64_t e = 0; e < E; ++e) {
      const auto& g = gpus_of[static_cast<size_t>(e)];
      for (int64_t x : g)
        load[static_cast<size_t>(x)] +=
            weight[static_cast<size_t>(e)] / static_cast<double>(g.size());
    }
    return load;
  };
  for (int64_t i = 0; i < o.extra; ++i) {
    const int64_t e = order[static_cast<size_t>(i % E)];
    auto& g = gpus_of[static_cast<size_t>(e)];
    if (static_cast<int64_t>(g.size()) >= G) continue;
    const auto load = expected_loads();
    int64_t best = -1;
    for (int64_t c = 0; c < G; ++c) {
      if (std::find(g.begin(), g.end(), c) != g.end()) continue;
      if (best < 0 || load[static_cast<size_t>(c)] < load[static_cast<size_t>(best)]) best = c;
    }
    g.push_back(best);
  }
  Placement p;
  for (const auto& g : gpus_of) p.C = std::max<int64_t>(p.C, static_cast<int64_t>(g.size()));
  p.log2phy.assign(static_cast<size_t>(E * p.C), -1.0);
  std::vector<int64_t> filled(static_cast<size_t>(E), 0);
  for (int64_t gpu = 0; gpu < G; ++gpu) {
    for (int64_t e = 0; e < E; ++e) {
      const auto& g = gpus_of[static_cast<size_t>(e)];
      if (std::find(g.begin(), g.end(), gpu) == g.end()) continue;
      p.log2phy[static_cast<size_t>(e * p.C + filled[static_cast<size_t>(e)]++)] =
          static_cast<double>(p.R++);
      p.phy2gpu.push_back(static_cast<double>(gpu));
    }
  }
  p.primary_gpu.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) p.primary_gpu[static_cast<size_t>(e)] = e * G / E;
  return p;
}

void print_loads(const char* what, const std::vector<double>& load) {
  const double mx = *std::max_element(load.begin(), load.end());
  const double mean =
      std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
  std::printf("  %-34s max %9.1f  mean %9.1f  max/mean %.3f\n", what, mx, mean,
              mean > 0 ? mx / mean : 0.0);
}

// Times fn (which enqueues work) per call: CUDA events on a GPU, the wall clock on a CPU.
double time_us(bool gpu, int reps, const std::function<bool()>& fn) {
  if (!fn()) return -1;  // warm-up, and a check that it runs
#if defined(KREG_HAVE_CUDA)
  if (gpu) {
    cudaDeviceSynchronize();
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start);
    for (int i = 0; i < reps; ++i) fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 1000.0 * ms / reps;
  }
#endif
  (void)gpu;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
}

// CUDA: the whole step (the four ops, as a model step runs them) as replays of a graph of
// kGraphSteps steps on a stream of its own (harness::time_graph_replays), with `flags` on
// every call: the median of `reps` replays, per step, or the error that stopped it.
kreg::Result<double> step_graph_us(
    int reps, uint64_t flags, const std::function<kreg::Status(const kreg::CallOptions&)>& step) {
#if defined(KREG_HAVE_CUDA)
  constexpr int kGraphSteps = 16;
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return kreg::Status(KREG_INTERNAL,
                        std::string("cannot create a stream: ") + cudaGetErrorString(e));
  }
  const kreg::CallOptions options{stream, nullptr, flags};
  // One step outside the graph first: what a first call sets up stays out of the capture.
  kreg::Status st = step(options);
  if (st.ok()) {
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      st = kreg::Status(KREG_INTERNAL, std::string("the step failed: ") + cudaGetErrorString(e));
    }
  }
  kreg::Result<kreg::harness::ReplayTiming> t =
      st.ok() ? kreg::harness::time_graph_replays(stream, kGraphSteps, reps,
                                                  [&](int) { return step(options); })
              : kreg::Result<kreg::harness::ReplayTiming>(st);
  cudaStreamDestroy(stream);
  if (!t) return t.status();
  return t->median_us;
#else
  (void)reps, (void)flags, (void)step;
  return kreg::Status(KREG_UNAVAILABLE, "this build has no CUDA");
#endif
}

int run(const Options& o) {
  auto manifest = kreg::load_manifest(o.manifest, kreg::manifest_options_from_env());
  if (!manifest) {
    std::fprintf(stderr, "lplb_demo: cannot use manifest %s:\n%s\n",
                 kreg::terminal_safe(o.manifest).c_str(),
                 kreg::terminal_message("  " + manifest.status().message()).c_str());
    return 2;
  }
  auto registry = kreg::Registry::open(*manifest, kreg::OpenOptions{.load_lazy_groups = true});
  if (!registry) {
    std::fprintf(stderr, "lplb_demo: %s\n",
                 kreg::terminal_message(registry.status().message()).c_str());
    return 1;
  }
  const bool gpu = o.device == "cuda";
  if (gpu && !kreg::harness::gpu_available()) {
    std::fprintf(stderr, "lplb_demo: --device cuda, but no CUDA device here\n");
    return 1;
  }
  const DLDevice dev{gpu ? kDLCUDA : kDLCPU, 0};
  const int64_t E = o.experts, G = o.gpus, T = o.tokens, K = o.topk;  // K <= E: checked

  // Routing: each token picks K distinct experts by Zipf weight (ranks shuffled).
  std::mt19937_64 rng(o.seed);
  std::vector<double> weight(static_cast<size_t>(E));
  std::vector<int64_t> rank(static_cast<size_t>(E));
  std::iota(rank.begin(), rank.end(), 1);
  std::shuffle(rank.begin(), rank.end(), rng);
  for (int64_t e = 0; e < E; ++e)
    weight[static_cast<size_t>(e)] =
        1.0 / std::pow(static_cast<double>(rank[static_cast<size_t>(e)]), o.zipf);
  std::discrete_distribution<int64_t> pick(weight.begin(), weight.end());
  std::vector<double> topk(static_cast<size_t>(T * K)), counts(static_cast<size_t>(E), 0.0);
  std::vector<char> taken(static_cast<size_t>(E), 0);
  std::vector<double> rest(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      // A draw that repeats an expert of the token is drawn again; after kRedraws repeats
      // the draw is made from the weights of the experts not yet taken. Both sample the
      // same distribution (the weights renormalized over the rest), but the second always
      // ends: skewed weights with K close to E would take without bound to hit the rest.
      constexpr int kRedraws = 16;
      int64_t e = pick(rng);
      for (int i = 0; taken[static_cast<size_t>(e)] && i < kRedraws; ++i) e = pick(rng);
      if (taken[static_cast<size_t>(e)]) {
        for (int64_t f = 0; f < E; ++f) {
          rest[static_cast<size_t>(f)] =
              taken[static_cast<size_t>(f)] ? 0.0 : weight[static_cast<size_t>(f)];
        }
        e = std::discrete_distribution<int64_t>(rest.begin(), rest.end())(rng);
      }
      taken[static_cast<size_t>(e)] = 1;
      topk[static_cast<size_t>(t * K + k)] = static_cast<double>(e);
      counts[static_cast<size_t>(e)] += 1;
    }
    for (int64_t k = 0; k < K; ++k)
      taken[static_cast<size_t>(topk[static_cast<size_t>(t * K + k)])] = 0;
  }
  const Placement p = place(o, weight);
  const int64_t M = E + G, N = p.R + 1 + G;
  std::printf(
      "lplb_demo on %s: %lld tokens x top-%lld, Zipf s=%.2f over %lld experts, %lld replicas "
      "(%lld extra, <= %lld per expert) on %lld GPUs\n",
      gpu ? kreg::harness::gpu_name().c_str() : "cpu", static_cast<long long>(T),
      static_cast<long long>(K), o.zipf, static_cast<long long>(E), static_cast<long long>(p.R),
      static_cast<long long>(p.R - E), static_cast<long long>(p.C), static_cast<long long>(G));

  // Loads without the LP.
  std::vector<double> no_rep(static_cast<size_t>(G), 0.0), uniform(static_cast<size_t>(G), 0.0);
  for (int64_t e = 0; e < E; ++e) {
    no_rep[static_cast<size_t>(p.primary_gpu[static_cast<size_t>(e)])] +=
        counts[static_cast<size_t>(e)];
    int valid = 0;
    for (int64_t c = 0; c < p.C; ++c) valid += p.log2phy[static_cast<size_t>(e * p.C + c)] >= 0;
    for (int64_t c = 0; c < p.C; ++c) {
      const double id = p.log2phy[static_cast<size_t>(e * p.C + c)];
      if (id >= 0)
        uniform[static_cast<size_t>(p.phy2gpu[static_cast<size_t>(id)])] +=
            counts[static_cast<size_t>(e)] / valid;
    }
  }

  // The pipeline through the registry.
  auto make = [&](kreg::DType dt, std::vector<int64_t> shape, const std::vector<double>& v) {
    auto b = Buffer::make(dev, dt, std::move(shape));
    if (!b) {
      std::fprintf(stderr, "lplb_demo: %s\n", kreg::terminal_message(b.status().message()).c_str());
      std::exit(1);
    }
    if (!v.empty()) (void)b->from_doubles(v);
    return std::move(b).value();
  };
  Buffer counts_b = make(kreg::DType::kI32, {E}, counts);
  Buffer l2p = make(kreg::DType::kI32, {E, p.C}, p.log2phy);
  Buffer p2g = make(kreg::DType::kI32, {p.R}, p.phy2gpu);
  Buffer A = make(kreg::DType::kF32, {M, N}, {}), b = make(kreg::DType::kF32, {M}, {}),
         c = make(kreg::DType::kF32, {N}, {});
  Buffer x = make(kreg::DType::kF32, {N}, {}), status = make(kreg::DType::kF32, {8}, {});
  Buffer probs = make(kreg::DType::kF32, {E, p.C}, {});
  std::vector<double> u(static_cast<size_t>(T * K));
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (auto& v : u) v = static_cast<float>(ud(rng));
  Buffer ids = make(kreg::DType::kI32, {T, K}, topk), ub = make(kreg::DType::kF32, {T, K}, u),
         phy = make(kreg::DType::kI32, {T, K}, {});

  const std::string backend = gpu ? "cuda" : "cpu";
  auto resolve = [&](const char* op, kreg::DType dt) {
    auto h = (*registry)->resolve(op, kreg::Target{dev, dt}, kreg::ResolveOptions{backend});
    if (!h) {
      std::fprintf(stderr, "lplb_demo: %s\n", kreg::terminal_message(h.status().message()).c_str());
      std::exit(1);
    }
    return *h;
  };
  const kreg::KernelHandle build = resolve("lplb.build_lp", kreg::DType::kI32);
  const kreg::KernelHandle solve = resolve("lplb.solve", kreg::DType::kF32);
  const kreg::KernelHandle prob = resolve("lplb.replica_probabilities", kreg::DType::kI32);
  const kreg::KernelHandle disp = resolve("lplb.dispatch", kreg::DType::kI32);
  auto build_attrs = build.attrs({{"num_gpus", G}});
  auto solve_attrs = solve.attrs({{"max_iter", o.max_iter}});
  if (!build_attrs || !solve_attrs) {
    std::fprintf(stderr, "lplb_demo: bad attributes\n");
    return 1;
  }
  DLTensor* build_args[] = {counts_b.tensor(), l2p.tensor(), p2g.tensor(),
                            A.tensor(),        b.tensor(),   c.tensor()};
  DLTensor* solve_args[] = {A.tensor(), b.tensor(), c.tensor(), x.tensor(), status.tensor()};
  DLTensor* prob_args[] = {counts_b.tensor(), l2p.tensor(), x.tensor(), status.tensor(),
                           probs.tensor()};
  DLTensor* disp_args[] = {ids.tensor(), probs.tensor(), l2p.tensor(), ub.tensor(), phy.tensor()};
  auto check = [](const kreg::Status& st) {
    if (!st.ok()) {
      std::fprintf(stderr, "lplb_demo: %s\n", kreg::terminal_message(st.message()).c_str());
    }
    return st.ok();
  };
  const kreg::CallOptions on_default{nullptr, nullptr, o.pdl ? uint64_t{KREG_LAUNCH_PDL} : 0};
  auto call_build = [&] { return check(build.call(build_args, build_attrs->view(), on_default)); };
  auto call_solve = [&] { return check(solve.call(solve_args, solve_attrs->view(), on_default)); };
  auto call_prob = [&] { return check(prob.call(prob_args, {}, on_default)); };
  auto call_disp = [&] { return check(disp.call(disp_args, {}, on_default)); };
  const double t_build = time_us(gpu, o.reps, call_build);
  const double t_solve = time_us(gpu, gpu ? o.reps : std::max(1, o.reps / 20), call_solve);
  const double t_prob = time_us(gpu, o.reps, call_prob);
  const double t_disp = time_us(gpu, o.reps, call_disp);
  if (t_build < 0 || t_solve < 0 || t_prob < 0 || t_disp < 0) return 1;
  double t_step = -1;
  if (gpu) {
    auto step = step_graph_us(std::max(1, o.reps / 10), on_default.launch_flags,
                              [&](const kreg::CallOptions& opt) {
                                kreg::Status st = build.call(build_args, build_attrs->view(), opt);
                                if (st.ok()) st = solve.call(solve_args, solve_attrs->view(), opt);
                                if (st.ok()) st = prob.call(prob_args, {}, opt);
                                if (st.ok()) st = disp.call(disp_args, {}, opt);
                                return st;
                              });
    if (!step) {
      std::fprintf(stderr, "lplb_demo: timing the step as a CUDA graph: %s\n",
                   kreg::terminal_message(step.status().message()).c_str());
      return 1;
    }
    t_step = *step;
  }
  if (!kreg::harness::device_synchronize().ok()) return 1;

  const std::vector<double> st = *status.to_doubles();
  const std::vector<double> xs = *x.to_doubles();
  const std::vector<double> chosen = *phy.to_doubles();
  std::vector<double> lp_load(static_cast<size_t>(G), 0.0), realised(static_cast<size_t>(G), 0.0);
  for (int64_t r = 0; r < p.R; ++r)
    lp_load[static_cast<size_t>(p.phy2gpu[static_cast<size_t>(r)])] += xs[static_cast<size_t>(r)];
  int64_t unassigned = 0;
  for (double id : chosen) {
    if (id < 0 || id >= static_cast<double>(p.R)) {
      ++unassigned;
      continue;
    }
    realised[static_cast<size_t>(p.phy2gpu[static_cast<size_t>(id)])] += 1;
  }

  std::printf("GPU load (tokens):\n");
  print_loads("no replication", no_rep);
  print_loads("replicas, uniform split", uniform);
  print_loads("replicas, LP split (solution x)", lp_load);
  print_loads("replicas, LP split (dispatched)", realised);
  std::printf(
      "solve: %s after %g iterations (reason %g), z = %.2f, residuals %.2g / %.2g, gap %.2g, "
      "%g diagonal rows\n",
      st[0] == 1.0 ? "converged" : "NOT converged (uniform fallback used)", st[4], st[6], st[5],
      st[1], st[2], st[3], st[7]);
  if (unassigned > 0)
    std::printf("  %lld slots without a replica\n", static_cast<long long>(unassigned));
  std::printf(
      "time per call (%s): build_lp %.2f us, solve %.2f us, replica_probabilities %.2f us, "
      "dispatch %.2f us\n",
      gpu ? "CUDA events, back-to-back launches" : "wall clock", t_build, t_solve, t_prob, t_disp);
  if (gpu) {
    std::printf("step (the four ops, CUDA graph replays%s): %.2f us\n",
                o.pdl ? ", programmatic dependent launch" : "", t_step);
  }
  return st[0] == 1.0 ? 0 : 1;
}

// The demo's bounds, checked before any work (docs/validation.md, "The limits that remain").
// Slots of the batch (--tokens x --topk): each a few tensors' element, the routing sampler
// and dispatch walk them all.
constexpr int64_t kMaxSlots = int64_t{1} << 22;
// Element operations of the whole run, counted from above (below): the routing (at worst a
// redraw over all experts a slot), every timed call of the four ops on its tensors, and
// every solve's iterations; kreg-host's CPU reference is held to the same 2^33.
constexpr int64_t kMaxWork = int64_t{1} << 33;

// Replicas place() makes: E primaries, then extra replica i for the (i mod E)-th hottest
// expert unless it is on every GPU already. Depends on E, G and extra only.
int64_t replicas(const Options& o) {
  const int64_t E = o.experts, G = o.gpus, q = o.extra / E, rem = o.extra % E;
  int64_t R = E;
  for (int64_t p = 0; p < E; ++p) R += std::min(G - 1, q + (p < rem ? 1 : 0));
  return R;
}

// Why the options are refused (a usage error, before anything runs), or an empty string.
std::string usage_error(const Options& o) {
  auto n = [](int64_t v) { return std::to_string(v); };
  if (o.experts % o.gpus != 0) return "--gpus must divide --experts";
  if (o.topk > o.experts) {
    return "--topk " + n(o.topk) + " is more than --experts " + n(o.experts) +
           " (each token picks --topk distinct experts)";
  }
  const int64_t E = o.experts, G = o.gpus, T = o.tokens, K = o.topk, R = replicas(o);
  // build_lp's LP: E + G rows, R + 1 + G columns, two nonzeros a replica and two a GPU.
  // The CUDA solver refuses more rows or columns than one block holds and gives up on more
  // nonzeros (lplb.hpp); the demo's LP is the one either device solves.
  const int64_t M = E + G, N = R + 1 + G, nnz = 2 * R + 2 * G;
  if (M > kreg::lplb::kMaxRows) {
    return "--experts " + n(E) + " + --gpus " + n(G) + " = " + n(M) +
           " LP rows; lplb.solve takes at most " + n(kreg::lplb::kMaxRows);
  }
  if (N > kreg::lplb::kMaxCols || nnz > kreg::lplb::kMaxNnz) {
    return "--experts " + n(E) + ", --gpus " + n(G) + " and --extra " + n(o.extra) + " make " +
           n(R) + " replicas: an LP of " + n(N) + " columns and " + n(nnz) +
           " nonzeros; lplb.solve takes at most " + n(kreg::lplb::kMaxCols) + " columns and " +
           n(kreg::lplb::kMaxNnz) + " nonzeros";
  }
  if (T * K > kMaxSlots) {
    return "--tokens " + n(T) + " x --topk " + n(K) + " = " + n(T * K) + " slots; at most " +
           n(kMaxSlots) + " (2^22)";
  }
  // Within the bounds above every term fits int64 (reps <= 1e5, max_iter <= 1000).
  const bool gpu = o.device == "cuda";
  const int64_t reps = o.reps, C = std::min<int64_t>(G, R - E + 1);
  const int64_t calls = reps + 1;  // time_us: a warm-up, then reps
  const int64_t solves = (gpu ? reps : std::max<int64_t>(1, reps / 20)) + 1;
  // CUDA: the step graph of 16 steps, captured once, a warm-up replay and reps/10 replays.
  const int64_t steps = gpu ? 1 + 16 * (std::max<int64_t>(1, reps / 10) + 2) : 0;
  const int64_t per_call = M * N + E * C + T * K;  // build_lp's A, probabilities, dispatch
  const int64_t per_solve = M * N + o.max_iter * (nnz + E * G + G * G * G);
  const int64_t work = T * K * E + (calls + steps) * per_call + (solves + steps) * per_solve;
  if (work > kMaxWork) {
    return "--reps " + n(reps) + " x the step of --tokens " + n(T) + ", --topk " + n(K) +
           ", --experts " + n(E) + ", --gpus " + n(G) + ", --extra " + n(o.extra) +
           ", --max-iter " + n(o.max_iter) + " would take " + n(work) +
           " element operations; at most " + n(kMaxWork) + " (2^33)";
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lplb_demo: LP load balancing of redundant MoE experts through the kreg registry"};
  Options o;
  const char* env = std::getenv("KREG_MANIFEST");
  o.manifest = env && *env ? env : "registry.yaml";
  app.add_option("--manifest", o.manifest,
                 "registry manifest (default $KREG_MANIFEST or ./registry.yaml)");
  app.add_option("--device", o.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tokens", o.tokens, "tokens in the batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--topk", o.topk, "experts per token")->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--experts", o.experts, "logical experts")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--gpus", o.gpus, "GPUs (divides --experts)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--extra", o.extra, "redundant replicas")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  // Up to 16 every weight (rank^-s, rank <= 4096) stays a normal double.
  app.add_option("--zipf", o.zipf, "Zipf exponent of the routing skew, 0 (uniform) to 16")
      ->check(kreg::cli::finite_range(0, 16));
  app.add_option("--max-iter", o.max_iter, "interior-point iterations at most")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  app.add_option("--seed", o.seed_text, "random seed, in [0, 2^64-1]");
  app.add_option("--reps", o.reps, "timed calls per op")->check(CLI::Range(1, 100000));
  app.add_flag("--pdl", o.pdl,
               "CUDA: ask for programmatic dependent launch (KREG_LAUNCH_PDL) on every call");
  if (auto code = kreg::cli::parse_command_line(app, argc, argv, "lplb_demo")) return *code;
  auto seed = kreg::parse_uint(o.seed_text, "--seed");
  if (!seed) {
    std::fprintf(stderr, "lplb_demo: %s\n",
                 kreg::terminal_message(seed.status().message()).c_str());
    return 2;
  }
  o.seed = *seed;
  if (const std::string why = usage_error(o); !why.empty()) {
    std::fprintf(stderr, "lplb_demo: %s\n", kreg::terminal_message(why).c_str());
    return 2;
  }
  return run(o);
}
