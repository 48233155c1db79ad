// CUDA kernels run on the device that holds their tensors, whatever device the calling
// thread has current, and leave the caller's current device as it was (the launchers'
// kreg::device::DeviceGuard). Needs two GPUs: skipped with a message otherwise.
//
// Each case allocates its tensors on device 1, makes device 0 current, calls the CUDA
// implementation and compares every written tensor with the CPU reference on the same
// inputs. Without the guard the kernel would be launched on device 0 with device-1
// pointers (no peer access is enabled here): an illegal-address error, or wrong values.
#include <gtest/gtest.h>

#include <filesystem>

#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace kreg {
namespace {

using harness::SymbolMap;

using namespace test;  // kernel_test.hpp

const KernelSpec* implementation(const std::string& op, const std::string& backend) {
  for (const KernelSpec* k : registry().implementations(op)) {
    if (k->backend == backend) return k;
  }
  return nullptr;
}

struct Case {
  const char* op;
  SymbolMap symbols;
};

TEST(MultiDevice, KernelsRunOnTheTensorsDeviceWhateverDeviceIsCurrent) {
#if !defined(KREG_HAVE_CUDA)
  GTEST_SKIP() << "built without CUDA: the multi-device test needs two GPUs";
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices, found " << devices
                 << ": the device-guard test is skipped (run it on a 2-GPU machine)";
  }
  const Case cases[] = {
      {"layernorm.rmsnorm", {{"T", 5}, {"H", 96}}},
      {"layernorm.fused_add_rmsnorm", {{"T", 3}, {"H", 200}}},
      {"activation.silu_and_mul", {{"T", 3}, {"D", 40}}},
      {"moe.sum", {{"T", 4}, {"K", 3}, {"H", 72}}},
      {"attention.concat_mla_k", {{"T", 3}, {"H", 2}}},
  };
  const DLDevice cpu{kDLCPU, 0};
  const DLDevice dev1{kDLCUDA, 1};
  uint64_t seed = 7;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const KernelSpec* cuda = implementation(c.op, "cuda");
    ASSERT_NE(cuda, nullptr);
    auto host = harness::make_example(*cuda, c.symbols, DType::kBF16, cpu, ++seed);
    ASSERT_TRUE(host.ok()) << host.status().message();
    auto want = harness::copy_example(*host, cpu);
    auto got = harness::copy_example(*host, dev1);
    ASSERT_TRUE(want.ok() && got.ok());

    auto ref = registry().resolve(c.op, want->tensors, {std::string("cpu")});
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    ASSERT_TRUE(ref->call(want->tensors).ok());

    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto h = registry().resolve(c.op, got->tensors, {std::string("cuda")});
    ASSERT_TRUE(h.ok()) << h.status().message();
    const Status st = h->call(got->tensors);  // the legacy default stream (of device 1)
    ASSERT_TRUE(st.ok()) << st.message();
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 0) << "the call changed the caller's current device";
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a kernel failed on device 1";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

    int t = 0;
    for (const Param& p : cuda->signature.params) {
      if (!p.is_tensor()) continue;
      const size_t i = static_cast<size_t>(t++);
      if (!p.written()) continue;
      auto g = got->buffers[i].to_doubles();
      auto w = want->buffers[i].to_doubles();
      ASSERT_TRUE(g.ok() && w.ok());
      const auto cmp =
          harness::compare_values(p.name, *g, *w, harness::tolerance_for(DType::kBF16));
      EXPECT_TRUE(cmp.ok()) << p.name << ": " << cmp.mismatches << " of " << cmp.count
                            << " differ, max abs " << cmp.max_abs;
    }
  }
#endif
}

}  // namespace
}  // namespace kreg
