// kreg-bench-launch: the host time of one CUDA kernel call, the figure the Python call
// path is measured against (docs/python.md).
//   BM_CudaLaunchEmpty  cudaLaunchKernel of an empty kernel: what CUDA itself costs
//   BM_PluginDirect     layernorm.rmsnorm's CUDA entry point through its function pointer
//                       (the plugin's launcher: grid choice, launch, error check)
//   BM_HandleCall       the same through a resolved KernelHandle (the core's checks too)
// on a [1,128] bf16 input, every call on one stream. The device is synchronised every
// 256 calls outside the timed region, so the queue never fills. Skips without a GPU.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "harness.hpp"
#include "kreg/registry.hpp"

void kreg_bench_launch_empty(cudaStream_t stream);  // launch_bench_kernel.cu

namespace {

constexpr int kSyncEvery = 256;

struct Fixture {
  std::unique_ptr<kreg::Registry> reg;
  kreg::KernelHandle handle;
  kreg::harness::ExampleArgs args;
  kreg_attr eps{KREG_ATTR_FLOAT, 0, {.f = 1e-6}};
  cudaStream_t stream = nullptr;
  std::string error;

  Fixture() {
    if (!kreg::harness::gpu_available()) {
      error = "no CUDA device: nothing to measure";
      return;
    }
    const char* dir = std::getenv("KREG_PLUGIN_DIR");
    auto m = kreg::load_manifest(
        KREG_SOURCE_DIR "/registry.yaml",
        kreg::ManifestOptions{std::filesystem::path(dir && *dir ? dir : KREG_PLUGIN_DIR), true});
    if (!m.ok()) {
      error = m.status().message();
      return;
    }
    auto r = kreg::Registry::open(*m);
    if (!r.ok()) {
      error = r.status().message();
      return;
    }
    reg = std::move(r).value();
    const kreg::KernelSpec* spec = nullptr;
    for (const kreg::KernelSpec* k : reg->implementations("layernorm.rmsnorm")) {
      if (k->backend == "cuda") spec = k;
    }
    if (spec == nullptr) {
      error = "layernorm.rmsnorm has no cuda implementation";
      return;
    }
    auto host = kreg::harness::make_example(*spec, {{"T", 1}, {"H", 128}}, kreg::DType::kBF16,
                                            {kDLCPU, 0}, 1);
    auto dev = host ? kreg::harness::copy_example(*host, {kDLCUDA, 0})
                    : kreg::Result<kreg::harness::ExampleArgs>(host.status());
    if (!dev) {
      error = dev.status().message();
      return;
    }
    args = std::move(dev).value();
    auto h =
        reg->resolve("layernorm.rmsnorm", args.tensors, kreg::ResolveOptions{std::string("cuda")});
    if (!h) {
      error = h.status().message();
      return;
    }
    handle = *h;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

template <typename F>
void run(benchmark::State& state, F&& call) {
  Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  int n = 0;
  for (auto _ : state) {
    call(f);
    if (++n == kSyncEvery) {
      state.PauseTiming();
      cudaStreamSynchronize(f.stream);
      n = 0;
      state.ResumeTiming();
    }
  }
  if (cudaStreamSynchronize(f.stream) != cudaSuccess) state.SkipWithError("a launch failed");
}

void BM_CudaLaunchEmpty(benchmark::State& state) {
  run(state, [](Fixture& f) { kreg_bench_launch_empty(f.stream); });
}
BENCHMARK(BM_CudaLaunchEmpty);

void BM_PluginDirect(benchmark::State& state) {
  run(state, [](Fixture& f) {
    const kreg_call_frame frame{sizeof(kreg_call_frame),
                                f.args.tensors.data(),
                                static_cast<int32_t>(f.args.tensors.size()),
                                1,
                                &f.eps,
                                f.stream};
    char message[256];
    message[0] = '\0';
    kreg_error err{sizeof(kreg_error), message, sizeof message};
    int32_t rc = f.handle.spec().fn(&frame, &err);
    benchmark::DoNotOptimize(rc);
  });
}
BENCHMARK(BM_PluginDirect);

void BM_HandleCall(benchmark::State& state) {
  run(state, [](Fixture& f) {
    kreg::Status st = f.handle.call(f.args.tensors, {&f.eps, 1}, f.stream);
    benchmark::DoNotOptimize(st);
  });
}
BENCHMARK(BM_HandleCall);

}  // namespace

BENCHMARK_MAIN();
