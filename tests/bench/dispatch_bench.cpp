// kreg-bench-dispatch: what the registry adds to a kernel call.
//   BM_DirectCall     the plugin's C entry point through a function pointer, frame prebuilt
//   BM_HandleCall     the same kernel through a resolved KernelHandle (checks + frame)
//   BM_HandleCallSpan the same through a span of a run-time size (as the Python and torch
//                     bindings call)
//   BM_HandleCallAlternating  two shapes in turn through the handle (two calls per
//                     iteration; both hit once the fast path's ways hold both shapes)
//   BM_LookupAndCall  Registry::call by op name (lookup, selection, checks, call)
// The kernel is activation.silu_and_mul's CPU reference, [1,16] f32 -> [1,8]: tiny, so
// the numbers are dominated by dispatch. Each benchmark reports allocs_per_call, counted
// by a replaced global operator new. Goals: handle <= direct + 5 ns (issue 17), lookup
// <= 50 ns, zero allocations.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <span>

#include "kreg/registry.hpp"

static std::atomic<long> g_allocs{0};
void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

struct Fixture {
  std::unique_ptr<kreg::Registry> reg;
  kreg::KernelHandle handle;
  float x[16], out[8];
  int64_t xs[2] = {1, 16}, os[2] = {1, 8};
  DLTensor tx{x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, nullptr, 0};
  DLTensor to{out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, os, nullptr, 0};
  DLTensor* args[2] = {&tx, &to};
  // The same data as [2,8] -> [2,4]: a second shape, for calls that alternate.
  int64_t xs2[2] = {2, 8}, os2[2] = {2, 4};
  DLTensor tx2{x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs2, nullptr, 0};
  DLTensor to2{out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, os2, nullptr, 0};
  DLTensor* args2[2] = {&tx2, &to2};

  Fixture() {
    for (int i = 0; i < 16; ++i) x[i] = 0.1f * static_cast<float>(i + 1);
    const char* dir = std::getenv("KREG_PLUGIN_DIR");
    auto m = kreg::load_manifest(
        KREG_SOURCE_DIR "/registry.yaml",
        kreg::ManifestOptions{std::filesystem::path(dir && *dir ? dir : KREG_PLUGIN_DIR), false});
    if (!m.ok()) std::abort();
    // Only the group measured: the others need not be built (hence no file check above).
    for (kreg::GroupEntry& g : m->groups) g.enabled = g.name == "activation";
    auto r = kreg::Registry::open(*m);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      std::abort();
    }
    reg = std::move(r).value();
    auto h =
        reg->resolve("activation.silu_and_mul", args, kreg::ResolveOptions{std::string("cpu")});
    if (!h.ok()) std::abort();
    handle = *h;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void report_allocs(benchmark::State& state, long before) {
  state.counters["allocs_per_call"] = benchmark::Counter(
      static_cast<double>(g_allocs.load() - before) / static_cast<double>(state.iterations()));
}

void BM_DirectCall(benchmark::State& state) {
  Fixture& f = fixture();
  kreg_kernel_fn fn = f.handle.spec().fn;
  benchmark::DoNotOptimize(fn);
  const kreg_call_frame frame{sizeof(kreg_call_frame), f.args, 2, 0, nullptr, nullptr};
  const long before = g_allocs.load();
  for (auto _ : state) {
    char message[256];
    message[0] = '\0';
    kreg_error err{sizeof(kreg_error), message, sizeof message};
    int32_t rc = fn(&frame, &err);
    benchmark::DoNotOptimize(rc);
    benchmark::ClobberMemory();
  }
  report_allocs(state, before);
}
BENCHMARK(BM_DirectCall);

void BM_HandleCall(benchmark::State& state) {
  Fixture& f = fixture();
  const long before = g_allocs.load();
  for (auto _ : state) {
    kreg::Status st = f.handle.call(f.args);
    benchmark::DoNotOptimize(st);
    benchmark::ClobberMemory();
  }
  report_allocs(state, before);
}
BENCHMARK(BM_HandleCall);

// A span whose size the compiler does not know: KernelHandle::call's span overload.
std::span<DLTensor* const> runtime_span(Fixture& f) {
  size_t n = 2;
  benchmark::DoNotOptimize(n);
  return {f.args, n};
}

void BM_HandleCallSpan(benchmark::State& state) {
  Fixture& f = fixture();
  const std::span<DLTensor* const> args = runtime_span(f);
  const long before = g_allocs.load();
  for (auto _ : state) {
    kreg::Status st = f.handle.call(args);
    benchmark::DoNotOptimize(st);
    benchmark::ClobberMemory();
  }
  report_allocs(state, before);
}
BENCHMARK(BM_HandleCallSpan);

// Two shapes in turn (an op called on the hidden state and on heads, say): the fast path
// keeps several shapes (CheckPlan::kShapeWays), so both calls hit. Two calls per iteration.
void BM_HandleCallAlternating(benchmark::State& state) {
  Fixture& f = fixture();
  const long before = g_allocs.load();
  for (auto _ : state) {
    kreg::Status a = f.handle.call(f.args);
    benchmark::DoNotOptimize(a);
    kreg::Status b = f.handle.call(f.args2);
    benchmark::DoNotOptimize(b);
    benchmark::ClobberMemory();
  }
  report_allocs(state, before);
}
BENCHMARK(BM_HandleCallAlternating);

void BM_LookupAndCall(benchmark::State& state) {
  Fixture& f = fixture();
  const long before = g_allocs.load();
  for (auto _ : state) {
    kreg::Status st = f.reg->call("activation.silu_and_mul", f.args);
    benchmark::DoNotOptimize(st);
    benchmark::ClobberMemory();
  }
  report_allocs(state, before);
}
BENCHMARK(BM_LookupAndCall);

void BM_Resolve(benchmark::State& state) {
  Fixture& f = fixture();
  for (auto _ : state) {
    auto h = f.reg->resolve("activation.silu_and_mul", f.args);
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_Resolve);

// For instruction counts: N calls of one way in a function of its own, so that callgrind's
// inclusive cost of count_direct / count_handle divided by N is the cost per call.
[[gnu::noinline]] void count_direct(Fixture& f, long n) {
  kreg_kernel_fn fn = f.handle.spec().fn;
  const kreg_call_frame frame{sizeof(kreg_call_frame), f.args, 2, 0, nullptr, nullptr};
  for (long i = 0; i < n; ++i) {
    char message[256];
    message[0] = '\0';
    kreg_error err{sizeof(kreg_error), message, sizeof message};
    int32_t rc = fn(&frame, &err);
    benchmark::DoNotOptimize(rc);
    benchmark::ClobberMemory();
  }
}
[[gnu::noinline]] void count_handle(Fixture& f, long n) {
  for (long i = 0; i < n; ++i) {
    kreg::Status st = f.handle.call(f.args);
    benchmark::DoNotOptimize(st);
    benchmark::ClobberMemory();
  }
}
[[gnu::noinline]] void count_handle_span(Fixture& f, long n) {
  const std::span<DLTensor* const> args = runtime_span(f);
  for (long i = 0; i < n; ++i) {
    kreg::Status st = f.handle.call(args);
    benchmark::DoNotOptimize(st);
    benchmark::ClobberMemory();
  }
}

}  // namespace

// KREG_DISPATCH_CALLS=N: run N direct calls, N handle calls with an array and N with a
// run-time span, and exit, for
//   valgrind --tool=callgrind --toggle-collect='*count_*' kreg-bench-dispatch
// (Ir of count_handle or count_handle_span minus count_direct, over N: the handle's
// instructions per call; the first handle call misses and takes the full check once).
int main(int argc, char** argv) {
  if (const char* n = std::getenv("KREG_DISPATCH_CALLS")) {
    Fixture& f = fixture();
    const long calls = std::atol(n);
    count_direct(f, calls);
    count_handle(f, calls);
    count_handle_span(f, calls);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
