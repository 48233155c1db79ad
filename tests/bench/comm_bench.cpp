// kreg-bench-comm: communication.all_reduce and communication.all_reduce_add_rmsnorm next to
// direct NCCL calls on a second communicator of the same ranks, measured in the same run
// (issue 18's targets: all_reduce within 1 us of ncclAllReduce at 8-256 KB, bus bandwidth
// at 256 MB >= 95% of NCCL's, the fused op faster than ncclAllReduce followed by
// layernorm.fused_add_rmsnorm).
//
// One process per rank, rank r on GPU r; the ranks meet through a kreg store:
//   build/tests/bench/kreg-bench-comm                                        (one GPU)
//   build/tools/store/kreg-store serve --port 29500 &                       (N GPUs)
//   for r in $(seq 0 $((N-1))); do
//     build/tests/bench/kreg-bench-comm --world N --rank $r --store tcp://127.0.0.1:29500 &
//   done; wait
// The build's plugin folder is compiled in; $KREG_PLUGIN_DIR overrides it.
// With one rank it measures kreg's overhead over NCCL at world 1 and the fused op against
// the two-call sequence. At world 1 an in-place ncclAllReduce moves no bytes (its time is
// the host's enqueue, its graph is empty): the differences are kreg's host overhead, and the
// bandwidth target only means something at world > 1. Times are CUDA events around back-to-back
// calls on one stream (200 calls, 20 at 64 MB and above), the median of --trials trials with kreg
// and NCCL alternating; small sizes also as CUDA-graph replays of 100 calls. Rank 0 prints the
// table. Exit 1 with the message on any error, 2 on bad options.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kreg/registry.hpp"
#include "kreg/resource.hpp"
#include "store.hpp"

namespace {

int g_rank = 0;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "kreg-bench-comm rank %d: %s\n", g_rank, msg.c_str());
  std::exit(1);
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
#define CHECK_CUDA(expr) cuda_check((expr), #expr)

template <typename T>
T take(kreg::Result<T> r, const std::string& what) {
  if (!r.ok()) die(what + ": " + r.status().message());
  return std::move(*r);
}

// The direct baseline's NCCL, declared here (nccl.h 2.x ABI: 128-byte id, bf16 = 9, sum = 0)
// and opened like the plugin opens it, so both use the same library.
struct NcclId {
  char internal[128];
};
using NcclComm = struct NcclCommOpaque*;
struct Nccl {
  int version = 0;
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclId*) = nullptr;
  int (*comm_init_rank)(NcclComm*, int, NcclId, int) = nullptr;
  int (*comm_destroy)(NcclComm) = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  void check(int rc, const char* what) const {
    if (rc != 0) die(std::string(what) + ": " + error_string(rc));
  }
};

Nccl load_nccl() {
  std::vector<std::string> paths;
  if (const char* p = std::getenv("KREG_NCCL_LIBRARY"); p && *p) paths.emplace_back(p);
  paths.emplace_back("libnccl.so.2");
  paths.emplace_back("/usr/local/cuda/lib64/libnccl.so.2");
  void* lib = nullptr;
  std::string why;
  for (const std::string& p : paths) {
    if ((lib = dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    const char* e = dlerror();
    why += "\n  " + (e ? std::string(e) : p + ": cannot open");
  }
  if (lib == nullptr) die("cannot open NCCL:" + why);
  Nccl n;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr) die(std::string("NCCL has no symbol ") + name);
  };
  sym(n.get_version, "ncclGetVersion");
  sym(n.get_unique_id, "ncclGetUniqueId");
  sym(n.comm_init_rank, "ncclCommInitRank");
  sym(n.comm_destroy, "ncclCommDestroy");
  sym(n.error_string, "ncclGetErrorString");
  sym(n.all_reduce, "ncclAllReduce");
  n.check(n.get_version(&n.version), "ncclGetVersion");
  return n;
}

struct Options {
  int world = 1, rank = 0, trials = 5;
  std::string store, name = "kreg-bench-comm", manifest;
  double timeout_s = 60;
};

Options parse(int argc, char** argv) {
  Options o;
  auto usage = [&](const std::string& why) {
    std::fprintf(stderr,
                 "%s\nusage: %s [--world N] [--rank R] [--store tcp://HOST:PORT|file:///dir] "
                 "[--name NAME] [--manifest registry.yaml] [--timeout S] [--trials N]\n",
                 why.c_str(), argv[0]);
    std::exit(2);
  };
  auto integer = [&](const std::string& flag, const char* v, int lo, int hi) {
    int x = 0;
    const char* end = v + std::char_traits<char>::length(v);
    auto [p, ec] = std::from_chars(v, end, x);
    if (ec != std::errc() || p != end || x < lo || x > hi) {
      usage(flag + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "], got '" + v + "'");
    }
    return x;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("kreg-bench-comm: kreg collectives vs direct NCCL");
    if (i + 1 >= argc) usage(a + " needs a value (or is unknown)");
    const char* v = argv[++i];
    if (a == "--world") {
      o.world = integer(a, v, 1, 1024);
    } else if (a == "--rank") {
      o.rank = integer(a, v, 0, 1023);
    } else if (a == "--trials") {
      o.trials = integer(a, v, 1, 1000);
    } else if (a == "--store") {
      o.store = v;
    } else if (a == "--name") {
      o.name = v;
    } else if (a == "--manifest") {
      o.manifest = v;
    } else if (a == "--timeout") {
      char* end = nullptr;
      o.timeout_s = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(o.timeout_s > 0 && o.timeout_s <= 3600)) {
        usage(std::string("--timeout needs seconds in (0, 3600], got '") + v + "'");
      }
    } else {
      usage("unknown option " + a);
    }
  }
  if (o.rank >= o.world) usage("--rank must be below --world");
  if (o.world > 1 && o.store.empty()) usage("--world > 1 needs --store");
  if (o.manifest.empty()) {
    o.manifest = std::filesystem::exists(KREG_SOURCE_DIR "/registry.yaml") ? KREG_SOURCE_DIR
                     "/registry.yaml"
                                                                           : "registry.yaml";
  }
  return o;
}

// Median over trials of the mean microseconds per call of `calls` back-to-back calls of
// each function; the functions alternate trial by trial so that drift hits both alike.
std::vector<double> time_us(cudaStream_t s, int calls, int trials,
                            const std::vector<std::function<void()>>& fns) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<std::vector<double>> us(fns.size());
  for (int t = 0; t < trials; ++t) {
    for (size_t f = 0; f < fns.size(); ++f) {
      CHECK_CUDA(cudaEventRecord(a, s));
      for (int i = 0; i < calls; ++i) fns[f]();
      CHECK_CUDA(cudaEventRecord(b, s));
      CHECK_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
      us[f].push_back(1000.0 * ms / calls);
    }
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::vector<double> med;
  for (auto& v : us) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

// A graph of `calls` calls of `fn` captured on `s`; null with *why when capture fails.
cudaGraphExec_t capture(cudaStream_t s, int calls, const std::function<std::string()>& fn,
                        std::string* why) {
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls && why->empty(); ++i) *why = fn();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  cudaGraphExec_t exec = nullptr;
  if (why->empty() && end != cudaSuccess)
    *why = std::string("end capture: ") + cudaGetErrorString(end);
  if (why->empty()) {
    if (cudaError_t e = cudaGraphInstantiate(&exec, graph, 0); e != cudaSuccess) {
      *why = std::string("instantiate: ") + cudaGetErrorString(e);
      exec = nullptr;
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // a failed capture leaves its error behind
  return exec;
}

std::string size_text(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + " MB"
                                    : std::to_string(bytes >> 10) + " KB";
}

kreg::harness::Buffer bf16_buffer(int device, std::vector<int64_t> shape, std::mt19937_64* rng) {
  auto b = take(
      kreg::harness::Buffer::make(DLDevice{kDLCUDA, device}, kreg::DType::kBF16, std::move(shape)),
      "allocating a bf16 buffer");
  if (rng != nullptr) {
    if (kreg::Status st = b.fill_random(*rng); !st.ok()) die("filling a buffer: " + st.message());
  } else {
    CHECK_CUDA(cudaMemset(b.tensor()->data, 0, b.bytes()));  // sums of zeros never overflow
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  g_rank = o.rank;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // before any NCCL call (the GPU machines need it off)
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (o.rank >= devices) {
    die("rank " + std::to_string(o.rank) + " needs GPU " + std::to_string(o.rank) + " but " +
        std::to_string(devices) + " are visible");
  }
  CHECK_CUDA(cudaSetDevice(o.rank));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, o.rank));
  const Nccl nccl = load_nccl();

  kreg::ManifestOptions mo = kreg::manifest_options_from_env();
  if (!mo.plugin_dir_override) mo.plugin_dir_override = std::filesystem::path(KREG_PLUGIN_DIR);
  auto manifest = take(kreg::load_manifest(o.manifest, mo), "manifest " + o.manifest);
  auto registry = take(kreg::Registry::open(manifest), "opening the registry");

  // Rank 0 clears the direct comm's id key before the kreg comm's rendezvous, which no rank
  // passes before rank 0 joins: nobody reads a previous run's id.
  std::unique_ptr<kreg::comm::Store> store;
  const std::string id_key = o.name + "/bench-direct-nccl-id";
  if (o.world > 1) {
    std::string err;
    store = kreg::comm::connect_store(o.store, o.timeout_s, &err);
    if (!store) die("connecting to " + o.store + ": " + err);
    if (o.rank == 0 && !store->erase(id_key, &err)) die("erasing " + id_key + ": " + err);
  }
  kreg::Resource comm =
      take(registry->create_resource("communication.comm", {{"rank", int64_t{o.rank}},
                                                            {"world_size", int64_t{o.world}},
                                                            {"store", o.store},
                                                            {"device", int64_t{o.rank}},
                                                            {"name", o.name},
                                                            {"timeout_s", o.timeout_s}}),
           "creating communication.comm");
  NcclId id{};
  if (o.rank == 0) nccl.check(nccl.get_unique_id(&id), "ncclGetUniqueId");
  if (o.world > 1) {
    std::string err, value;
    if (o.rank == 0 && !store->set(id_key, std::string(id.internal, sizeof id), &err)) {
      die("publishing the direct NCCL id: " + err);
    }
    if (o.rank != 0) {
      if (!store->get(id_key, o.timeout_s, &value, &err)) {
        die("waiting for rank 0's direct NCCL id under " + id_key + ": " + err);
      }
      if (value.size() != sizeof id)
        die(id_key + " holds " + std::to_string(value.size()) + " bytes, not 128");
      std::copy(value.begin(), value.end(), id.internal);
    }
  }
  NcclComm direct = nullptr;
  nccl.check(nccl.comm_init_rank(&direct, o.world, id, o.rank), "ncclCommInitRank (direct)");
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const kreg_attr comm_attr = comm.attr();
  const bool print = o.rank == 0;
  auto status_text = [](const kreg::Status& st) { return st.ok() ? std::string() : st.message(); };

  if (print) {
    std::printf("kreg-bench-comm on %s, NCCL %d.%d.%d, world %d (rank r on GPU r), median of %d\n",
                prop.name, nccl.version / 10000, nccl.version / 100 % 100, nccl.version % 100,
                o.world, o.trials);
    std::printf("\ncommunication.all_reduce (bf16, sum, in place) vs ncclAllReduce; %s\n",
                o.world == 1 ? "GB/s = algorithm bandwidth bytes/t (world 1: no bus)"
                             : "GB/s = bus bandwidth 2(n-1)/n * bytes/t");
    std::printf("%8s %6s %9s %9s %8s %9s %9s  %10s %10s %8s  %s\n", "size", "calls", "kreg us",
                "nccl us", "diff us", "kreg GB/s", "nccl GB/s", "graph kreg", "graph nccl",
                "g diff", "target");
  }
  kreg::KernelHandle ar;
  bool graphs = true;
  std::string graph_why;
  for (size_t bytes : {size_t{8} << 10, size_t{16} << 10, size_t{32} << 10, size_t{64} << 10,
                       size_t{128} << 10, size_t{256} << 10, size_t{256} << 20}) {
    const size_t n = bytes / 2;
    kreg::harness::Buffer x = bf16_buffer(o.rank, {static_cast<int64_t>(n)}, nullptr);
    DLTensor* args[] = {x.tensor()};
    if (!ar.valid()) {
      ar = take(registry->resolve("communication.all_reduce", args, {std::string("nccl")}),
                "resolving communication.all_reduce (nccl)");
    }
    auto kreg_call = [&] { return status_text(ar.call(args, {&comm_attr, 1}, s)); };
    auto nccl_call = [&] {
      const int rc = nccl.all_reduce(x.tensor()->data, x.tensor()->data, n, 9, 0, direct, s);
      return rc == 0 ? std::string() : std::string("ncclAllReduce: ") + nccl.error_string(rc);
    };
    auto checked = [](const std::function<std::string()>& f) {
      return [f] {
        if (std::string e = f(); !e.empty()) die(e);
      };
    };
    const bool big = bytes >= (size_t{64} << 20);
    const int calls = big ? 20 : 200;
    for (int i = 0; i < (big ? 3 : 20); ++i) checked(kreg_call)(), checked(nccl_call)();
    CHECK_CUDA(cudaStreamSynchronize(s));
    const auto t = time_us(s, calls, o.trials, {checked(kreg_call), checked(nccl_call)});
    const double factor = o.world == 1 ? 1.0 : 2.0 * (o.world - 1) / o.world;
    const double kbw = factor * bytes / (t[0] * 1e3), nbw = factor * bytes / (t[1] * 1e3);
    std::vector<double> g;
    if (!big && graphs) {
      std::string why;
      cudaGraphExec_t gk = capture(s, 100, kreg_call, &why);
      cudaGraphExec_t gn = gk ? capture(s, 100, nccl_call, &why) : nullptr;
      if (gk && gn) {
        for (auto* e : {gk, gn}) CHECK_CUDA(cudaGraphLaunch(e, s));
        CHECK_CUDA(cudaStreamSynchronize(s));
        g = time_us(s, 1, o.trials,
                    {[&] { CHECK_CUDA(cudaGraphLaunch(gk, s)); },
                     [&] { CHECK_CUDA(cudaGraphLaunch(gn, s)); }});
        for (double& v : g) v /= 100;
      } else {
        graphs = false;
        graph_why = why;
      }
      if (gk) cudaGraphExecDestroy(gk);
      if (gn) cudaGraphExecDestroy(gn);
    }
    const std::string target =
        big && o.world == 1 ? "n/a at world 1 (nothing moves)"
        : big               ? (kbw >= 0.95 * nbw ? "ok (>= 95% of NCCL)" : "below 95% of NCCL")
                            : (t[0] - t[1] <= 1.0 ? "ok (<= 1 us)" : "over 1 us");
    if (print) {
      char gtext[64] = "";
      if (!g.empty())
        std::snprintf(gtext, sizeof gtext, "%10.2f %10.2f %8.2f", g[0], g[1], g[0] - g[1]);
      std::printf("%8s %6d %9.2f %9.2f %8.2f %9.1f %9.1f  %-29s  %s\n", size_text(bytes).c_str(),
                  calls, t[0], t[1], t[0] - t[1], kbw, nbw, g.empty() ? "-" : gtext,
                  target.c_str());
    }
  }
  if (print && !graphs) std::printf("CUDA graphs skipped: capture failed: %s\n", graph_why.c_str());

  // The fused tail against ncclAllReduce + layernorm.fused_add_rmsnorm, on the same buffers
  // (x is normalized by every call, so repeated calls stay finite).
  constexpr int64_t H = 7168;
  std::mt19937_64 rng(18 + o.rank);
  if (print) {
    std::printf(
        "\ncommunication.all_reduce_add_rmsnorm vs ncclAllReduce + "
        "layernorm.fused_add_rmsnorm (bf16, H = %lld)\n",
        static_cast<long long>(H));
    std::printf("%6s %6s %11s %13s %9s %8s  %-11s  %s\n", "T", "calls", "fused us", "nccl+norm us",
                "diff us", "speedup", "target", "norm backend");
  }
  for (int64_t T : {int64_t{16}, int64_t{64}, int64_t{2048}, int64_t{8192}}) {
    kreg::harness::Buffer x = bf16_buffer(o.rank, {T, H}, &rng);
    kreg::harness::Buffer res = bf16_buffer(o.rank, {T, H}, &rng);
    kreg::harness::Buffer w = bf16_buffer(o.rank, {H}, &rng);
    DLTensor* args[] = {x.tensor(), res.tensor(), w.tensor()};
    // Resolved per shape: the norm's default may be a jit specialization of these sizes.
    const kreg::KernelHandle fused =
        take(registry->resolve("communication.all_reduce_add_rmsnorm", args, {std::string("nccl")}),
             "resolving communication.all_reduce_add_rmsnorm (nccl)");
    const kreg::KernelHandle norm = take(registry->resolve("layernorm.fused_add_rmsnorm", args),
                                         "resolving layernorm.fused_add_rmsnorm");
    auto fused_call = [&] {
      if (kreg::Status st = fused.call(args, {&comm_attr, 1}, s); !st.ok()) die(st.message());
    };
    auto two_calls = [&] {
      nccl.check(nccl.all_reduce(x.tensor()->data, x.tensor()->data, static_cast<size_t>(T * H), 9,
                                 0, direct, s),
                 "ncclAllReduce");
      if (kreg::Status st = norm.call(args, {}, s); !st.ok()) die(st.message());
    };
    const bool big = x.bytes() >= (size_t{64} << 20);
    const int calls = big ? 20 : 200;
    for (int i = 0; i < (big ? 3 : 20); ++i) fused_call(), two_calls();
    CHECK_CUDA(cudaStreamSynchronize(s));
    const auto t = time_us(s, calls, o.trials, {fused_call, two_calls});
    if (print) {
      std::printf("%6lld %6d %11.2f %13.2f %9.2f %7.2fx  %-11s  %s\n", static_cast<long long>(T),
                  calls, t[0], t[1], t[0] - t[1], t[1] / t[0],
                  t[0] < t[1] ? "ok (faster)" : "not faster", norm.backend().c_str());
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  nccl.check(nccl.comm_destroy(direct), "ncclCommDestroy (direct)");
  comm.reset();
  if (!print) std::printf("kreg-bench-comm rank %d: done (rank 0 prints the table)\n", o.rank);
  return 0;
}
