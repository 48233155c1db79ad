// Hot swapping a CUDA group while its kernels are in flight: caller threads keep a deep
// queue of cudagrp.mark calls (each kernel spins ~20 us) on their own streams, through
// handles resolved before any swap, while the main thread swaps the group between two
// builds 100 times. Every output must come entirely from one generation (offset 0 or
// 1000), no call may fail, and both generations must be seen. Skipped without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "kreg/registry.hpp"
#include "test_support.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace fs = std::filesystem;

namespace kreg {
namespace {

#if defined(KREG_HAVE_CUDA)

using test::test_plugin;

TEST(GpuReload, SwapsWhileKernelsAreInFlight) {
  if (!harness::gpu_available()) {
    GTEST_SKIP() << "no CUDA device on this machine: the GPU hot-swap test is skipped "
                    "(run ctest on a GPU machine to exercise it)";
  }
  const fs::path dir =
      fs::temp_directory_path() / ("kreg_reload_gpu_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path lib = dir / "libkreg_cudagrp.so";
  fs::copy_file(test_plugin("cudagrp_v1"), lib, fs::copy_options::overwrite_existing);
  Manifest manifest;
  manifest.file = (dir / "test.yaml").string();
  GroupEntry e;
  e.name = "cudagrp";
  e.library = lib;
  e.library_spec = lib.string();
  manifest.groups.push_back(e);
  auto reg = Registry::open(manifest);
  ASSERT_TRUE(reg.ok()) << reg.status().message();

  constexpr int kThreads = 4, kSlots = 32, kSwaps = 100;
  constexpr int64_t kN = 1 << 14, kSpinNs = 20000;
  auto x = harness::Buffer::make(DLDevice{kDLCUDA, 0}, DType::kF32, {kN});
  ASSERT_TRUE(x.ok());
  std::vector<double> xv(kN);
  for (int64_t i = 0; i < kN; ++i) xv[static_cast<size_t>(i)] = static_cast<double>(i % 977) + 0.5;
  ASSERT_TRUE(x->from_doubles(xv).ok());
  auto handle = (*reg)->resolve("cudagrp.mark", Target{DLDevice{kDLCUDA, 0}, DType::kF32});
  ASSERT_TRUE(handle.ok()) << handle.status().message();
  EXPECT_EQ(handle->backend(), "cuda");
  kreg_attr spin{KREG_ATTR_INT, 0, {.i = kSpinNs}};

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, failed{0}, torn{0}, seen_v1{0}, seen_v2{0}, max_queued{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        ++failed;
        return;
      }
      std::vector<harness::Buffer> outs;
      for (int s = 0; s < kSlots; ++s) {
        outs.push_back(
            std::move(harness::Buffer::make(DLDevice{kDLCUDA, 0}, DType::kF32, {kN})).value());
      }
      std::vector<float> host(kN);
      while (!stop.load(std::memory_order_relaxed)) {
        for (auto& o : outs) {
          if (cudaMemsetAsync(o.tensor()->data, 0xff, kN * sizeof(float), stream) != cudaSuccess) {
            ++failed;
          }
        }
        // Enqueue a whole batch without waiting: ~kSlots * 20 us of work stays queued.
        for (auto& o : outs) {
          DLTensor* args[] = {x->tensor(), o.tensor()};
          if (!handle->call(args, {&spin, 1}, stream).ok()) ++failed;
          ++calls;
        }
        if (cudaStreamQuery(stream) == cudaErrorNotReady) ++max_queued;
        for (auto& o : outs) {
          if (cudaMemcpyAsync(host.data(), o.tensor()->data, kN * sizeof(float),
                              cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
              cudaStreamSynchronize(stream) != cudaSuccess) {
            ++failed;
            continue;
          }
          int64_t v1 = 0, v2 = 0;
          for (int64_t i = 0; i < kN; ++i) {
            const float want = static_cast<float>(xv[static_cast<size_t>(i)]);
            v1 += host[static_cast<size_t>(i)] == want;
            v2 += host[static_cast<size_t>(i)] == want + 1000.0f;
          }
          if (v1 == kN) {
            ++seen_v1;
          } else if (v2 == kN) {
            ++seen_v2;
          } else {
            ++torn;
          }
        }
      }
      cudaStreamDestroy(stream);
    });
  }
  std::vector<double> latency;
  for (int i = 0; i < kSwaps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const fs::path tmp = dir / ".libkreg_cudagrp.so.tmp";
    fs::copy_file(test_plugin(i % 2 == 0 ? "cudagrp_v2" : "cudagrp_v1"), tmp,
                  fs::copy_options::overwrite_existing);
    fs::rename(tmp, lib);
    auto r = (*reg)->reload("cudagrp");
    ASSERT_TRUE(r.ok()) << r.status().message();
    latency.push_back(r->latency_ms);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  for (auto& t : threads) t.join();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::sort(latency.begin(), latency.end());
  std::printf(
      "GPU hot swap: %d swaps, calls=%llu failed=%llu torn=%llu v1=%llu v2=%llu "
      "batches-still-running-after-enqueue=%llu, reload median %.2f ms max %.2f ms\n",
      kSwaps, (unsigned long long)calls.load(), (unsigned long long)failed.load(),
      (unsigned long long)torn.load(), (unsigned long long)seen_v1.load(),
      (unsigned long long)seen_v2.load(), (unsigned long long)max_queued.load(),
      latency[latency.size() / 2], latency.back());
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GT(seen_v1.load(), 0u);
  EXPECT_GT(seen_v2.load(), 0u);
  EXPECT_GT(max_queued.load(), 0u) << "no batch was still running when checked: not a test of "
                                      "in-flight swaps";
  EXPECT_EQ((*reg)->groups()[0].generation, 1u + kSwaps);
  reg->reset();
  fs::remove_all(dir);
}

#else

TEST(GpuReload, SwapsWhileKernelsAreInFlight) {
  GTEST_SKIP() << "built without CUDA: the GPU hot-swap test is skipped";
}

#endif

}  // namespace
}  // namespace kreg
