// kreg-tp-demo: one tensor-parallel MLP block run the way an inference engine runs it, and
// checked against the same block computed without sharding (docs/ops/communication.md).
//
//   kreg-tp-demo --ranks N [--cpu] [--tokens T] [--hidden H] [--ffn F] [--dtype f32|bf16]
//                [--manifest registry.yaml] [--timeout S]
//
// The launcher serves a TCP store on 127.0.0.1 (an ephemeral port) and starts N copies of
// this binary as ranks (--rank r --store tcp://127.0.0.1:P; rank r on GPU r, or on the CPU
// with --cpu). Every rank builds the same inputs from a fixed seed (x [T,H], residual
// [T,H], W1 [H,F], W2 [F,H], norm weight [H]), keeps its shards (W1's columns
// r*F/N..(r+1)*F/N: column-parallel; W2's rows of the same range: row-parallel), computes
// y_r = relu(x W1_r) W2_r (cuBLAS on the GPU, with the ReLU on a host copy of h; plain
// loops with --cpu) and calls communication.all_reduce_add_rmsnorm(y_r, residual, weight,
// comm, eps) through the registry: the all-reduce of the partial sums, the residual add and
// the RMSNorm that end every TP block. It then checks x and residual against the whole
// block in fp64 on the same (dtype-rounded) inputs.
//
// Exit codes as the other tools: 0 every rank passed, 1 a rank failed, crashed or hung (or
// the launcher could not start them), 2 a usage error.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_numbers.hpp"
#include "cli_parse.hpp"
#include "cublas_matmul.hpp"
#include "harness.hpp"
#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "store.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

extern char** environ;

namespace {

using kreg::DType;
using kreg::harness::Buffer;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kMaxRanks = 64;
constexpr uint64_t kSeed = 20261202;  // the same inputs on every rank
constexpr double kEps = 1e-6;
// Each of x, W1, W2 (and h on a rank) at most this many elements: 1 GiB of f32.
constexpr int64_t kMaxElements = int64_t{1} << 28;
// Every rank holds the whole W1 and W2 (and x, residual, the reference) in fp64 and checks
// the whole block on the host: the ranks' host memory together at most 16 GiB, the CPU's
// multiply-adds at most 2^34 a rank and 2^37 for all ranks. The documented 8-GPU run
// (T=128, H=4096, F=14336: about 1.6 GB and 1.5e10 a rank) fits; a rank past them would
// only be killed at --timeout, or take the host's memory.
constexpr int64_t kMaxHostBytes = int64_t{1} << 34;
constexpr int64_t kMaxRankMultiplyAdds = int64_t{1} << 34;
constexpr int64_t kMaxMultiplyAdds = int64_t{1} << 37;

struct Options {
  int ranks = 0;
  bool cpu = false;
  int64_t tokens = 16, hidden = 256, ffn = 1024;
  std::string dtype = "f32";
  std::string manifest;
  double timeout = 120;
  // Set by the launcher for a rank.
  int rank = -1;
  std::string store, name;
};

DType dtype_of(const Options& o) { return o.dtype == "bf16" ? DType::kBF16 : DType::kF32; }

// Largest |got - want| / max(1, |want|) allowed. f32: the ranks sum the same products in
// another order (F/N-term partial sums, then N of them), so a few ulps of the largest
// partial sum, well under 1e-4 for sizes this tool accepts with values of order 1. bf16:
// h, y_r, the reduced sum, residual and x are each rounded to 8 significant bits (2^-9
// relative each), so a few times 4e-3; a wrong shard or a missing rank is off by O(1).
double tolerance(DType dt) { return dt == DType::kBF16 ? 5e-2 : 1e-4; }

// ---- A rank ----

struct Inputs {
  std::vector<double> x, residual, w1, w2, weight;
};

// `v` rounded to dtype, exactly as a Buffer of that dtype holds it.
std::vector<double> rounded(DType dt, const std::vector<double>& v, std::string* error) {
  auto b = Buffer::make(DLDevice{kDLCPU, 0}, dt, {static_cast<int64_t>(v.size())});
  if (!b) {
    *error = b.status().message();
    return {};
  }
  if (kreg::Status st = b->from_doubles(v); !st.ok()) {
    *error = st.message();
    return {};
  }
  auto out = b->to_doubles();
  if (!out) {
    *error = out.status().message();
    return {};
  }
  return std::move(out).value();
}

// Values of order 1 at every stage: x, residual in [-1, 1], W1 scaled by 1/sqrt(H), W2 by
// 1/sqrt(F), the norm weight in [0.5, 1.5]. Drawn in one fixed order, so every rank (any
// N) sees the same numbers.
bool make_inputs(const Options& o, Inputs* in, std::string* error) {
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const auto T = static_cast<size_t>(o.tokens), H = static_cast<size_t>(o.hidden),
             F = static_cast<size_t>(o.ffn);
  auto draw = [&](size_t n, double scale, double offset) {
    std::vector<double> v(n);
    for (double& d : v) d = offset + scale * u(rng);
    return v;
  };
  const DType dt = dtype_of(o);
  in->x = rounded(dt, draw(T * H, 1.0, 0.0), error);
  in->residual = rounded(dt, draw(T * H, 1.0, 0.0), error);
  in->w1 = rounded(dt, draw(H * F, 1.0 / std::sqrt(static_cast<double>(H)), 0.0), error);
  in->w2 = rounded(dt, draw(F * H, 1.0 / std::sqrt(static_cast<double>(F)), 0.0), error);
  in->weight = rounded(dt, draw(H, 0.5, 1.0), error);
  return error->empty();
}

struct Reference {
  std::vector<double> x, residual;  // [T, H]
};

// The whole block on one device, no sharding, in fp64.
Reference reference(const Options& o, const Inputs& in) {
  const auto T = static_cast<size_t>(o.tokens), H = static_cast<size_t>(o.hidden),
             F = static_cast<size_t>(o.ffn);
  std::vector<double> a(F);
  Reference r{std::vector<double>(T * H), std::vector<double>(T * H)};
  for (size_t t = 0; t < T; ++t) {
    std::fill(a.begin(), a.end(), 0.0);
    for (size_t i = 0; i < H; ++i) {
      const double xv = in.x[t * H + i];
      for (size_t j = 0; j < F; ++j) a[j] += xv * in.w1[i * F + j];
    }
    for (double& v : a) v = std::max(v, 0.0);
    double* s = &r.residual[t * H];
    for (size_t k = 0; k < H; ++k) s[k] = in.residual[t * H + k];
    for (size_t j = 0; j < F; ++j) {
      for (size_t k = 0; k < H; ++k) s[k] += a[j] * in.w2[j * H + k];
    }
    double ss = 0;
    for (size_t k = 0; k < H; ++k) ss += s[k] * s[k];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(H) + kEps);
    for (size_t k = 0; k < H; ++k) r.x[t * H + k] = s[k] * inv * in.weight[k];
  }
  return r;
}

// The rank's partial y_r = relu(x W1_r) W2_r on the host: fp32 sums, h rounded to the
// dtype as a device GEMM writing that dtype would.
bool partial_on_cpu(const Options& o, const Inputs& in, const std::vector<double>& w1_r,
                    const std::vector<double>& w2_r, std::vector<double>* y, std::string* error) {
  const auto T = static_cast<size_t>(o.tokens), H = static_cast<size_t>(o.hidden),
             Fr = static_cast<size_t>(o.ffn / o.ranks);
  std::vector<double> h(T * Fr);
  std::vector<float> acc(Fr);
  for (size_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t i = 0; i < H; ++i) {
      const auto xv = static_cast<float>(in.x[t * H + i]);
      for (size_t j = 0; j < Fr; ++j) acc[j] += xv * static_cast<float>(w1_r[i * Fr + j]);
    }
    for (size_t j = 0; j < Fr; ++j) h[t * Fr + j] = acc[j];
  }
  h = rounded(dtype_of(o), h, error);
  if (!error->empty()) return false;
  y->assign(T * H, 0.0);
  std::vector<float> out(H);
  for (size_t t = 0; t < T; ++t) {
    std::fill(out.begin(), out.end(), 0.0f);
    for (size_t j = 0; j < Fr; ++j) {
      const auto a = static_cast<float>(std::max(h[t * Fr + j], 0.0));  // relu
      for (size_t k = 0; k < H; ++k) out[k] += a * static_cast<float>(w2_r[j * H + k]);
    }
    for (size_t k = 0; k < H; ++k) (*y)[t * H + k] = out[k];
  }
  return true;
}

// Row-major C[m,n] = A[m,k] B[k,n] on the rank's GPU (cuBLAS, fp32 accumulation).
bool gemm(int64_t m, int64_t n, int64_t k, const Buffer& a, const Buffer& b, Buffer& c,
          const char* what, std::string* error) {
  const kreg::Status st = kreg::harness::cublas_matmul(a, b, c, m, n, k);
  if (!st.ok()) *error = std::string(what) + ": " + st.message();
  return st.ok();
}

struct RankError {
  std::string message;
};

template <class T>
T take(kreg::Result<T> r, const char* what) {
  if (!r) throw RankError{std::string(what) + ": " + r.status().message()};
  return std::move(r).value();
}

void check(const kreg::Status& st, const char* what) {
  if (!st.ok()) throw RankError{std::string(what) + ": " + st.message()};
}

Buffer buffer(DLDevice dev, DType dt, std::vector<int64_t> shape, const std::vector<double>& v) {
  Buffer b = take(Buffer::make(dev, dt, std::move(shape)), "allocating a tensor");
  if (!v.empty()) check(b.from_doubles(v), "filling a tensor");
  return b;
}

struct Errors {
  double max_abs = 0, max_rel = 0;  // rel: |got - want| / max(1, |want|)
};

Errors compare(const std::vector<double>& got, const std::vector<double>& want) {
  Errors e;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    e.max_abs = std::max(e.max_abs, std::isnan(d) ? INFINITY : d);
    e.max_rel =
        std::max(e.max_rel, std::isnan(d) ? INFINITY : d / std::max(1.0, std::fabs(want[i])));
  }
  return e;
}

int run_rank_checked(const Options& o) {
  const int r = o.rank, N = o.ranks;
  const int64_t T = o.tokens, H = o.hidden, F = o.ffn, Fr = F / N;
  const DType dt = dtype_of(o);

  auto manifest = kreg::load_manifest(o.manifest, kreg::manifest_options_from_env());
  if (!manifest)
    throw RankError{"cannot use manifest " + o.manifest + ": " + manifest.status().message()};
  auto registry = take(kreg::Registry::open(*manifest, kreg::OpenOptions{.load_lazy_groups = true}),
                       "opening the registry");
  // The launcher's clock keeps running past this: fail on a missing peer before it kills us.
  kreg::Resource comm =
      take(registry->create_resource("communication.comm", {{"rank", int64_t{r}},
                                                            {"world_size", int64_t{N}},
                                                            {"store", o.store},
                                                            {"device", int64_t{o.cpu ? -1 : r}},
                                                            {"name", o.name},
                                                            {"timeout_s", 0.75 * o.timeout}}),
           "creating communication.comm");

  Inputs in;
  std::string error;
  if (!make_inputs(o, &in, &error)) throw RankError{"building the inputs: " + error};
  // The shards: W1's columns [r*Fr, (r+1)*Fr) and W2's rows of the same range.
  std::vector<double> w1_r(static_cast<size_t>(H * Fr));
  for (int64_t i = 0; i < H; ++i) {
    std::copy_n(in.w1.begin() + i * F + r * Fr, Fr, w1_r.begin() + i * Fr);
  }
  const std::vector<double> w2_r(in.w2.begin() + r * Fr * H, in.w2.begin() + (r + 1) * Fr * H);

  const DLDevice dev{o.cpu ? kDLCPU : kDLCUDA, o.cpu ? 0 : r};
  Buffer y, residual, weight;
  if (o.cpu) {
    std::vector<double> y_host;
    if (!partial_on_cpu(o, in, w1_r, w2_r, &y_host, &error)) throw RankError{error};
    y = buffer(dev, dt, {T, H}, y_host);  // rounded to the dtype, as a GEMM's output is
  } else {
#if defined(KREG_HAVE_CUDA)
    if (cudaError_t e = cudaSetDevice(r); e != cudaSuccess) {
      throw RankError{"cudaSetDevice(" + std::to_string(r) + "): " + cudaGetErrorString(e)};
    }
    Buffer x = buffer(dev, dt, {T, H}, in.x);
    Buffer w1 = buffer(dev, dt, {H, Fr}, w1_r), w2 = buffer(dev, dt, {Fr, H}, w2_r);
    Buffer h = buffer(dev, dt, {T, Fr}, {});
    y = buffer(dev, dt, {T, H}, {});
    if (!gemm(T, Fr, H, x, w1, h, "x W1_r", &error)) throw RankError{error};
    // The ReLU on a host copy (the copies synchronize with the GEMM on the default stream):
    // a demo of the collective, not of an activation kernel.
    std::vector<double> hv = take(h.to_doubles(), "copying h to the host");
    for (double& v : hv) v = std::max(v, 0.0);
    check(h.from_doubles(hv), "copying relu(h) to the device");
    if (!gemm(T, H, Fr, h, w2, y, "relu(h) W2_r", &error)) throw RankError{error};
    check(kreg::harness::device_synchronize(), "after the GEMMs");
#else
    throw RankError{"GPU mode is not built (a CPU-only build): use --cpu"};
#endif
  }
  residual = buffer(dev, dt, {T, H}, in.residual);
  weight = buffer(dev, dt, {H}, in.weight);

  kreg_attr attrs[2] = {comm.attr(), kreg_attr{}};
  attrs[1].type = KREG_ATTR_FLOAT;
  attrs[1].value.f = kEps;
  DLTensor* args[] = {y.tensor(), residual.tensor(), weight.tensor()};
  check(registry->call("communication.all_reduce_add_rmsnorm", args, attrs),
        "communication.all_reduce_add_rmsnorm");
  check(kreg::harness::device_synchronize(), "after communication.all_reduce_add_rmsnorm");

  const Reference want = reference(o, in);
  const Errors ex = compare(take(y.to_doubles(), "reading x"), want.x);
  const Errors er = compare(take(residual.to_doubles(), "reading residual"), want.residual);
  const double tol = tolerance(dt);
  const bool ok = ex.max_rel <= tol && er.max_rel <= tol;
  std::printf(
      "rank %d: x max_abs_err %.3g max_rel_err %.3g, residual max_abs_err %.3g max_rel_err "
      "%.3g (tolerance %.0e) %s\n",
      r, ex.max_abs, ex.max_rel, er.max_abs, er.max_rel, tol, ok ? "OK" : "MISMATCH");
  std::fflush(stdout);
  return ok ? kExitOk : kExitFailed;
}

int run_rank(const Options& o) {
  try {
    return run_rank_checked(o);
  } catch (const RankError& e) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, kreg::terminal_message(e.message).c_str());
    std::printf("rank %d: FAILED\n", o.rank);
    std::fflush(stdout);
    return kExitFailed;
  }
}

// ---- The launcher ----

std::string describe(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return code == 0 ? "passed" : "FAILED (exit " + std::to_string(code) + ")";
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "CRASHED (signal " + std::to_string(sig) + ": " + strsignal(sig) + ")";
  }
  return "FAILED (status " + std::to_string(status) + ")";
}

int launch(const Options& o) {
  if (!o.cpu) {
#if defined(KREG_HAVE_CUDA)
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (count < o.ranks) {
      std::fprintf(stderr,
                   "kreg-tp-demo: --ranks %d on GPUs needs %d CUDA devices, %d here (--cpu runs "
                   "the ranks on the CPU)\n",
                   o.ranks, o.ranks, count);
      return kExitFailed;
    }
#else
    std::fprintf(stderr, "kreg-tp-demo: the GPU mode is not built (a CPU-only build): use --cpu\n");
    return kExitUsage;
#endif
  }
  // A manifest the ranks cannot read is one message here, not N.
  if (auto m = kreg::load_manifest(o.manifest, kreg::manifest_options_from_env()); !m) {
    std::fprintf(stderr, "kreg-tp-demo: cannot use manifest %s:\n%s\n",
                 kreg::terminal_safe(o.manifest).c_str(),
                 kreg::terminal_message("  " + m.status().message()).c_str());
    return kExitUsage;
  }
  std::string error;
  auto server = kreg::comm::TcpStoreServer::start("127.0.0.1", 0, &error);
  if (!server) {
    std::fprintf(stderr, "kreg-tp-demo: cannot start the TCP store on 127.0.0.1: %s\n",
                 error.c_str());
    return kExitFailed;
  }
  const std::string url = "tcp://127.0.0.1:" + std::to_string(server->port());
  const std::string name = "tp-demo-" + std::to_string(::getpid());
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) {
    std::fprintf(stderr, "kreg-tp-demo: cannot find this program (/proc/self/exe): %s\n",
                 ec.message().c_str());
    return kExitFailed;
  }
  std::printf("kreg-tp-demo: %d ranks on %s, T=%lld H=%lld F=%lld (%lld per rank), %s, store %s\n",
              o.ranks, o.cpu ? "the CPU" : "GPUs 0..N-1", static_cast<long long>(o.tokens),
              static_cast<long long>(o.hidden), static_cast<long long>(o.ffn),
              static_cast<long long>(o.ffn / o.ranks), o.dtype.c_str(), url.c_str());
  std::fflush(stdout);

  std::vector<pid_t> pids;
  auto kill_all = [&] {
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  };
  char timeout_text[32];
  std::snprintf(timeout_text, sizeof timeout_text, "%.17g", o.timeout);
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> args = {self,
                                     "--rank",
                                     std::to_string(r),
                                     "--ranks",
                                     std::to_string(o.ranks),
                                     "--store",
                                     url,
                                     "--name",
                                     name,
                                     "--tokens",
                                     std::to_string(o.tokens),
                                     "--hidden",
                                     std::to_string(o.hidden),
                                     "--ffn",
                                     std::to_string(o.ffn),
                                     "--dtype",
                                     o.dtype,
                                     "--manifest",
                                     o.manifest,
                                     "--timeout",
                                     timeout_text};
    if (o.cpu) args.emplace_back("--cpu");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int err = ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ);
    if (err != 0) {
      std::fprintf(stderr, "kreg-tp-demo: cannot start rank %d (%s): %s\n", r, self.c_str(),
                   std::strerror(err));
      kill_all();
      return kExitFailed;
    }
    pids.push_back(pid);
  }

  // Wait for every rank; one still running at the deadline is killed and reported.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout);
  std::vector<std::string> verdict(static_cast<size_t>(o.ranks));
  int running = o.ranks;
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < o.ranks; ++r) {
      if (!verdict[static_cast<size_t>(r)].empty()) continue;
      int status = 0;
      if (::waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) ==
          pids[static_cast<size_t>(r)]) {
        verdict[static_cast<size_t>(r)] = describe(status);
        --running;
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < o.ranks; ++r) {
    if (!verdict[static_cast<size_t>(r)].empty()) continue;
    ::kill(pids[static_cast<size_t>(r)], SIGKILL);
    ::waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
    verdict[static_cast<size_t>(r)] =
        "HUNG past --timeout " + std::string(timeout_text) + " s: killed";
  }
  int passed = 0;
  for (int r = 0; r < o.ranks; ++r) {
    std::printf("kreg-tp-demo: rank %d %s\n", r, verdict[static_cast<size_t>(r)].c_str());
    passed += verdict[static_cast<size_t>(r)] == "passed";
  }
  if (passed == o.ranks) {
    std::printf("kreg-tp-demo: all %d ranks passed\n", o.ranks);
    return kExitOk;
  }
  std::printf("kreg-tp-demo: %d of %d ranks did not pass\n", o.ranks - passed, o.ranks);
  return kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kreg-tp-demo: a tensor-parallel MLP block over communication.comm, checked"};
  Options o;
  const char* env = std::getenv("KREG_MANIFEST");
  o.manifest = env && *env ? env : "registry.yaml";
  app.add_option("--ranks", o.ranks, "tensor-parallel ranks (processes)")
      ->required()
      ->check(CLI::Range(1, kMaxRanks));
  app.add_flag("--cpu", o.cpu, "run the ranks on the CPU (default: rank r on GPU r)");
  app.add_option("--tokens", o.tokens, "tokens T")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--hidden", o.hidden, "hidden size H")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--ffn", o.ffn, "FFN size F (a multiple of --ranks)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--dtype", o.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--manifest", o.manifest,
                 "registry manifest (default $KREG_MANIFEST or ./registry.yaml)");
  app.add_option("--timeout", o.timeout, "seconds a rank may take before it is killed")
      ->check(kreg::cli::finite_range(0.1, 86400));
  // A rank's options, set by the launcher.
  app.add_option("--rank", o.rank, "(internal) run as this rank")
      ->group("")
      ->check(CLI::Range(0, kMaxRanks - 1));
  app.add_option("--store", o.store, "(internal) the launcher's store URL")->group("");
  app.add_option("--name", o.name, "(internal) the comm's name")->group("");
  if (auto code = kreg::cli::parse_command_line(app, argc, argv, "kreg-tp-demo")) return *code;
  auto usage = [](const std::string& message) {
    std::fprintf(stderr, "kreg-tp-demo: %s\n", message.c_str());
    return kExitUsage;
  };
  if (o.ffn % o.ranks != 0) {
    return usage("--ffn " + std::to_string(o.ffn) + " is not divisible by --ranks " +
                 std::to_string(o.ranks) + " (each rank takes F/N columns of W1)");
  }
  const int64_t T = o.tokens, H = o.hidden, F = o.ffn;
  if (T * H > kMaxElements || H * F > kMaxElements || T * F > kMaxElements) {
    return usage(
        "--tokens x --hidden, --hidden x --ffn and --tokens x --ffn must each be at "
        "most " +
        std::to_string(kMaxElements) + " elements");
  }
  // Within the checks above none of these overflows: T*H*F <= 2^48, N <= 64.
  const int64_t N = o.ranks, Fr = F / N;
  // A rank's fp64 vectors at their peak (make_inputs, the shards, the partial sum, the
  // reference, the copies read back), counted from above.
  const int64_t rank_bytes = 8 * (7 * T * H + 3 * H * F + 2 * H * Fr + 2 * T * Fr + F);
  // The fp64 reference of the whole block on every rank; with --cpu, the rank's shard too.
  const int64_t rank_madds = 2 * T * H * F + (o.cpu ? 2 * T * H * Fr : 0);
  const std::string shape = "--ranks " + std::to_string(N) + ", --tokens " + std::to_string(T) +
                            ", --hidden " + std::to_string(H) + ", --ffn " + std::to_string(F);
  if (N * rank_bytes > kMaxHostBytes) {
    return usage(shape + ": the ranks would hold about " + std::to_string(N * rank_bytes) +
                 " bytes of host memory; at most " + std::to_string(kMaxHostBytes) + " (16 GiB)");
  }
  if (rank_madds > kMaxRankMultiplyAdds) {
    return usage(shape + ": a rank's CPU work (the reference block" +
                 (o.cpu ? std::string(" and its shard") : std::string()) + ") would take " +
                 std::to_string(rank_madds) + " multiply-adds; at most " +
                 std::to_string(kMaxRankMultiplyAdds) + " (2^34)");
  }
  if (N * rank_madds > kMaxMultiplyAdds) {
    return usage(shape + ": the ranks' CPU work would take " + std::to_string(N * rank_madds) +
                 " multiply-adds; at most " + std::to_string(kMaxMultiplyAdds) + " (2^37)");
  }
  if (o.rank >= 0) {
    if (o.rank >= o.ranks) {
      return usage("--rank " + std::to_string(o.rank) + " is not below --ranks " +
                   std::to_string(o.ranks));
    }
    if (o.ranks > 1 && o.store.empty()) return usage("--rank needs --store with --ranks > 1");
    if (o.name.empty()) o.name = "tp-demo";
    return run_rank(o);
  }
  return launch(o);
}
