// kreg-bench-transfer: kvcache.transfer and kvcache.transfer_layers next to
// cudaMemcpyAsync of the same number of bytes between page-locked host memory and the
// device, measured in the same run (issue 6's target: >= 80% of the memcpy bandwidth for
// 4 KiB and 256-byte rows, both directions).
//
// Each case moves N rows (N * row = --mb MiB, default 256) in random order on both sides
// (a permutation of the source rows into a permutation of the destination rows), checks
// every row of one call against the expected bytes, then times --reps calls with CUDA
// events (median). The memcpy baseline copies the same bytes contiguously, pinned <->
// device, on the same stream. GB/s = N * row bytes per second (the payload, one
// direction). Skips (exit 0) without a CUDA device; exit 1 on a wrong result.
//
//   build/tests/bench/kreg-bench-transfer [--mb 256] [--reps 20] [--layers 16]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kreg/registry.hpp"

namespace {

#define CHECK_CUDA(expr)                                                 \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)

struct Options {
  int64_t mb = 256;
  int reps = 20;
  int64_t layers = 16;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--mb") {
      o.mb = std::max<int64_t>(1, value("--mb"));
    } else if (a == "--reps") {
      o.reps = static_cast<int>(std::max<int64_t>(3, value("--reps")));
    } else if (a == "--layers") {
      o.layers = std::max<int64_t>(1, value("--layers"));
    } else {
      std::fprintf(stderr, "usage: %s [--mb MiB] [--reps N] [--layers L]\n", argv[0]);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `fn` (which enqueues on `stream`), each call between two events.
template <typename F>
double time_ms(cudaStream_t stream, int reps, F&& fn) {
  for (int i = 0; i < 3; ++i) fn();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return median(ms);
}

enum class Side { kDevice, kHost };

const char* side_name(Side s) { return s == Side::kDevice ? "device" : "host"; }

struct Pools {
  uint8_t* device = nullptr;   // cudaMalloc
  uint8_t* host = nullptr;     // cudaHostAlloc
  uint8_t* device2 = nullptr;  // a second device pool for device -> device
  size_t bytes = 0;
};

uint8_t* pool(const Pools& p, Side s, bool second = false) {
  return s == Side::kHost ? p.host : second ? p.device2 : p.device;
}

struct Row {
  std::string op, dir;
  int64_t row = 0, n = 0;
  double kreg_ms = 0, memcpy_ms = 0;
  bool ok = true;
};

// The tensors of one transfer call: indices on the device, src/dst viewed as bf16 rows.
struct Call {
  int64_t idx_shape[1];
  int64_t src_shape[2], dst_shape[2];
  DLTensor src_idx, dst_idx, src, dst;
  DLTensor* args[4];
  Call(int64_t* d_src_idx, int64_t* d_dst_idx, int64_t n, uint8_t* src_p, Side src_side,
       uint8_t* dst_p, Side dst_side, int64_t rows, int64_t row) {
    idx_shape[0] = n;
    src_shape[0] = dst_shape[0] = rows;
    src_shape[1] = dst_shape[1] = row / 2;
    const DLDataType i64{kDLInt, 64, 1}, bf16{kDLBfloat, 16, 1};
    auto dev = [](Side s) {
      return s == Side::kHost ? DLDevice{kDLCUDAHost, 0} : DLDevice{kDLCUDA, 0};
    };
    src_idx = DLTensor{d_src_idx, {kDLCUDA, 0}, 1, i64, idx_shape, nullptr, 0};
    dst_idx = DLTensor{d_dst_idx, {kDLCUDA, 0}, 1, i64, idx_shape, nullptr, 0};
    src = DLTensor{src_p, dev(src_side), 2, bf16, src_shape, nullptr, 0};
    dst = DLTensor{dst_p, dev(dst_side), 2, bf16, dst_shape, nullptr, 0};
    args[0] = &src_idx;
    args[1] = &dst_idx;
    args[2] = &src;
    args[3] = &dst;
  }
};

void report(const Row& r) {
  const double bytes = static_cast<double>(r.n) * static_cast<double>(r.row);
  const double kreg_gbps = bytes / (r.kreg_ms * 1e6), copy_gbps = bytes / (r.memcpy_ms * 1e6);
  const double pct = 100.0 * kreg_gbps / copy_gbps;
  std::printf("%-16s %-15s %6lld %9lld %10.1f %9.1f %11.1f %8.1f%%  %s\n", r.op.c_str(),
              r.dir.c_str(), static_cast<long long>(r.row), static_cast<long long>(r.n),
              r.kreg_ms * 1e3, kreg_gbps, copy_gbps, pct,
              !r.ok         ? "WRONG RESULT"
              : pct >= 80.0 ? "ok (>= 80%)"
                            : "below 80%");
}

kreg_attr int_attr(int64_t v) {
  kreg_attr a{};
  a.type = KREG_ATTR_INT;
  a.value.i = v;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (!kreg::harness::gpu_available()) {
    std::puts("kreg-bench-transfer: no CUDA device on this machine: skipped");
    return 0;
  }
  const char* dir = std::getenv("KREG_PLUGIN_DIR");
  auto m = kreg::load_manifest(
      KREG_SOURCE_DIR "/registry.yaml",
      kreg::ManifestOptions{std::filesystem::path(dir && *dir ? dir : KREG_PLUGIN_DIR), true});
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().message().c_str());
    return 2;
  }
  auto reg = kreg::Registry::open(*m);
  if (!reg.ok()) {
    std::fprintf(stderr, "%s\n", reg.status().message().c_str());
    return 2;
  }
  const kreg::ResolveOptions cuda{std::string("cuda")};
  const kreg::Target target{DLDevice{kDLCUDA, 0}, std::nullopt};
  auto transfer = (*reg)->resolve("kvcache.transfer", target, cuda);
  auto layered = (*reg)->resolve("kvcache.transfer_layers", target, cuda);
  if (!transfer.ok() || !layered.ok()) {
    std::fprintf(stderr, "%s\n",
                 (!transfer.ok() ? transfer.status() : layered.status()).message().c_str());
    return 2;
  }

  const size_t total = static_cast<size_t>(opt.mb) << 20;
  Pools pools;
  pools.bytes = total;
  CHECK_CUDA(cudaMalloc(&pools.device, total));
  CHECK_CUDA(cudaMalloc(&pools.device2, total));
  CHECK_CUDA(cudaHostAlloc(&pools.host, total, cudaHostAllocDefault));
  std::vector<uint8_t> pattern(total), check(total);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < total; i += 8) {
    const uint64_t r = rng();
    std::memcpy(pattern.data() + i, &r, std::min<size_t>(8, total - i));
  }
  int64_t* d_src_idx = nullptr;
  int64_t* d_dst_idx = nullptr;
  int64_t* d_ptrs = nullptr;            // [2, layers]: source then destination addresses
  const size_t max_rows = total / 256;  // the smallest row benchmarked
  CHECK_CUDA(cudaMalloc(&d_src_idx, max_rows * sizeof(int64_t)));
  CHECK_CUDA(cudaMalloc(&d_dst_idx, max_rows * sizeof(int64_t)));
  CHECK_CUDA(cudaMalloc(&d_ptrs, 2 * static_cast<size_t>(opt.layers) * sizeof(int64_t)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf(
      "kvcache.transfer vs cudaMemcpyAsync on %s: %lld MiB per call, rows in random "
      "order on both sides, median of %d\n",
      kreg::harness::gpu_name().c_str(), static_cast<long long>(opt.mb), opt.reps);
  std::printf("%-16s %-15s %6s %9s %10s %9s %11s %9s\n", "op", "direction", "row", "rows",
              "kreg us", "kreg GB/s", "memcpy GB/s", "% memcpy");
  bool all_ok = true;
  const std::pair<Side, Side> directions[] = {
      {Side::kDevice, Side::kHost}, {Side::kHost, Side::kDevice}, {Side::kDevice, Side::kDevice}};
  for (int64_t row : {int64_t{4096}, int64_t{256}}) {
    for (bool per_layer : {false, true}) {
      // transfer: one pool of n rows each side. transfer_layers: L layers of n / L rows,
      // consecutive slices of the same pools (same total bytes).
      const int64_t layers = per_layer ? opt.layers : 1;
      const int64_t rows = static_cast<int64_t>(total) / row / layers;
      const int64_t n = rows;
      std::vector<int64_t> src_idx(static_cast<size_t>(n)), dst_idx(static_cast<size_t>(n));
      std::iota(src_idx.begin(), src_idx.end(), 0);
      std::iota(dst_idx.begin(), dst_idx.end(), 0);
      std::shuffle(src_idx.begin(), src_idx.end(), rng);
      std::shuffle(dst_idx.begin(), dst_idx.end(), rng);
      CHECK_CUDA(
          cudaMemcpy(d_src_idx, src_idx.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
      CHECK_CUDA(
          cudaMemcpy(d_dst_idx, dst_idx.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
      const size_t bytes = static_cast<size_t>(n * row * layers);
      for (auto [from, to] : directions) {
        uint8_t* src = pool(pools, from);
        uint8_t* dst = pool(pools, to, from == to);
        const cudaMemcpyKind kind = from == Side::kHost ? cudaMemcpyHostToDevice
                                    : to == Side::kHost ? cudaMemcpyDeviceToHost
                                                        : cudaMemcpyDeviceToDevice;
        // Known source bytes, a cleared destination.
        CHECK_CUDA(cudaMemcpy(src, pattern.data(), bytes, cudaMemcpyDefault));
        if (to == Side::kHost) {
          std::memset(dst, 0, bytes);
        } else {
          CHECK_CUDA(cudaMemset(dst, 0, bytes));
        }
        std::vector<int64_t> ptrs;
        for (int64_t l = 0; l < layers; ++l) {
          ptrs.push_back(reinterpret_cast<int64_t>(src + l * rows * row));
        }
        for (int64_t l = 0; l < layers; ++l) {
          ptrs.push_back(reinterpret_cast<int64_t>(dst + l * rows * row));
        }
        CHECK_CUDA(
            cudaMemcpy(d_ptrs, ptrs.data(), ptrs.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
        Call call(d_src_idx, d_dst_idx, n, src, from, dst, to, rows, row);
        int64_t ptr_shape[1] = {layers};
        DLTensor sp{d_ptrs, {kDLCUDA, 0}, 1, {kDLInt, 64, 1}, ptr_shape, nullptr, 0};
        DLTensor dp{d_ptrs + layers, {kDLCUDA, 0}, 1, {kDLInt, 64, 1}, ptr_shape, nullptr, 0};
        DLTensor* layer_args[] = {&call.src_idx, &call.dst_idx, &sp, &dp};
        const kreg_attr attrs[] = {int_attr(row), int_attr(rows), int_attr(rows)};
        bool failed = false;
        auto run_kreg = [&] {
          const kreg::Status st = per_layer ? layered->call(layer_args, attrs, stream)
                                            : transfer->call(call.args, {}, stream);
          if (!st.ok() && !failed) {
            std::fprintf(stderr, "%s\n", st.message().c_str());
            failed = true;
          }
        };
        run_kreg();
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaMemcpy(check.data(), dst, bytes, cudaMemcpyDefault));
        bool ok = !failed;
        for (int64_t l = 0; l < layers && ok; ++l) {
          const uint8_t* want = pattern.data() + l * rows * row;
          const uint8_t* got = check.data() + l * rows * row;
          for (int64_t i = 0; i < n && ok; ++i) {
            ok = std::memcmp(got + dst_idx[static_cast<size_t>(i)] * row,
                             want + src_idx[static_cast<size_t>(i)] * row,
                             static_cast<size_t>(row)) == 0;
          }
        }
        all_ok = all_ok && ok;
        Row r;
        r.op = per_layer ? "transfer_layers" : "transfer";
        r.dir = std::string(side_name(from)) + "->" + side_name(to) +
                (per_layer ? " L=" + std::to_string(layers) : "");
        r.row = row;
        r.n = n * layers;
        r.ok = ok;
        r.kreg_ms = time_ms(stream, opt.reps, run_kreg);
        r.memcpy_ms = time_ms(stream, opt.reps,
                              [&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream)); });
        report(r);
      }
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  cudaFree(d_src_idx);
  cudaFree(d_dst_idx);
  cudaFree(d_ptrs);
  cudaFree(pools.device);
  cudaFree(pools.device2);
  cudaFreeHost(pools.host);
  if (!all_ok) {
    std::puts("kreg-bench-transfer: WRONG RESULTS (see the rows marked above)");
    return 1;
  }
  return 0;
}
