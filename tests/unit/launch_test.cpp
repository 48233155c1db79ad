// kreg/device/launch.cuh, the host side every CUDA entry point shares: the dtype visit and
// its message, launch_status, and DeviceGuard on whatever this machine has (no GPU, one,
// or several: each case asserts what it can).
#include "kreg/device/launch.cuh"

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <utility>

namespace {

using kreg::KernelStatus;
namespace device = kreg::device;

// A Context whose error messages land in `message`.
struct Ctx {
  char message[256] = "";
  kreg_error err{sizeof(kreg_error), message, sizeof message};
  kreg::Context ctx{nullptr, &err};
};

DLTensor tensor(DLDataType dtype, DLDeviceType type = kDLCUDA, int id = 0) {
  DLTensor t{};
  t.dtype = dtype;
  t.device = {type, id};
  return t;
}

constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF16{kDLFloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kF64{kDLFloat, 64, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};

// The element type the visit chose, by name, or the error message.
template <typename... Ts>
std::string visited(DLDataType dtype) {
  Ctx c;
  std::string seen;
  const KernelStatus st =
      device::visit_dtype<Ts...>(c.ctx, "grp.op", tensor(dtype), [&](auto tag) -> KernelStatus {
        seen = device::ElementType<decltype(tag)>::kName;
        return kreg::kOk;
      });
  if (!st.ok()) {
    EXPECT_EQ(st.code, KREG_INVALID_ARGUMENT);
    EXPECT_TRUE(seen.empty());
    return c.message;
  }
  return seen;
}

TEST(VisitDtype, CallsTheFunctionWithTheTensorsElementType) {
  using device::visit_float_dtype;
  for (const auto& [dtype, name] :
       {std::pair{kBF16, "bf16"}, std::pair{kF16, "f16"}, std::pair{kF32, "f32"}}) {
    Ctx c;
    std::string seen;
    const KernelStatus st = visit_float_dtype(c.ctx, "grp.op", tensor(dtype), [&](auto tag) {
      using T = decltype(tag);
      static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> ||
                    std::is_same_v<T, float>);
      seen = device::ElementType<T>::kName;
      return KernelStatus{KREG_OUT_OF_RANGE};  // the function's status is returned as is
    });
    EXPECT_EQ(st.code, KREG_OUT_OF_RANGE);
    EXPECT_EQ(seen, name);
  }
  EXPECT_EQ((visited<int32_t, int64_t, float>(kI64)), "i64");
  EXPECT_EQ((visited<int32_t, int64_t, float>(kI32)), "i32");
}

TEST(VisitDtype, AnyOtherDtypeFailsNamingTheOpAndTheSet) {
  EXPECT_EQ((visited<__nv_bfloat16, __half, float>(kF64)),
            "grp.op: dtype must be bf16, f16 or f32");
  EXPECT_EQ((visited<__nv_bfloat16, __half, float>(kI32)),
            "grp.op: dtype must be bf16, f16 or f32");
  EXPECT_EQ((visited<__nv_bfloat16, __half>(kF32)), "grp.op: dtype must be bf16 or f16");
  EXPECT_EQ((visited<int32_t, int64_t, float>(kBF16)), "grp.op: dtype must be i32, i64 or f32");
  EXPECT_EQ((visited<float>(kF16)), "grp.op: dtype must be f32");
  EXPECT_EQ((visited<float>(DLDataType{kDLFloat, 32, 4})), "grp.op: dtype must be f32");  // lanes
}

TEST(LaunchStatus, ALaunchErrorIsAnInternalErrorNamingTheOp) {
  Ctx c;
  EXPECT_TRUE(device::launch_status(c.ctx, "grp.op", cudaSuccess).ok());
  EXPECT_STREQ(c.message, "");
  const KernelStatus st = device::launch_status(c.ctx, "grp.op", cudaErrorInvalidConfiguration);
  EXPECT_EQ(st.code, KREG_INTERNAL);
  EXPECT_EQ(std::string(c.message), std::string("grp.op: kernel launch failed: ") +
                                        cudaGetErrorString(cudaErrorInvalidConfiguration));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  return n;
}

// device::launch only peeks at a launch error (it returns it): launch_status(ctx, op, err)
// clears the runtime's last-error slot as it reports it, so that the next op's
// launch_status(ctx, op) does not report it again under its own name.
TEST(LaunchStatus, AReportedLaunchErrorIsNotLeftForTheNextOp) {
  if (device_count() == 0) GTEST_SKIP() << "no GPU";
  const cudaError_t err = cudaLaunchKernel(static_cast<const void*>(nullptr), dim3(1), dim3(1),
                                           nullptr, 0, nullptr);  // no such kernel
  ASSERT_NE(err, cudaSuccess);
  Ctx c;
  EXPECT_EQ(device::launch_status(c.ctx, "grp.op", err).code, KREG_INTERNAL);
  Ctx next;
  EXPECT_TRUE(device::launch_status(next.ctx, "grp.next").ok()) << next.message;
}

TEST(Aligned16, SixteenByteAddressesOnly) {
  alignas(16) char buf[32];
  EXPECT_TRUE(device::aligned16(buf));
  EXPECT_TRUE(device::aligned16(buf + 16));
  EXPECT_FALSE(device::aligned16(buf + 8));
  EXPECT_FALSE(device::aligned16(buf + 1));
}

TEST(DeviceGuard, HostMemoryNeedsNoDevice) {
  for (DLDeviceType type : {kDLCUDAHost, kDLCPU}) {
    const device::DeviceGuard guard(tensor(kF32, type, 0));
    EXPECT_TRUE(guard.ok());
  }
}

// No GPU (this machine's CI): the guard fails with a status, never a throw or a crash.
// (Without a driver the runtime's initialization error stays in cudaGetLastError
// whatever clears it, so that part is checked in the GPU case below.)
TEST(DeviceGuard, WithoutADeviceFailsAsUnavailable) {
  if (device_count() > 0) GTEST_SKIP() << "a GPU is present";
  Ctx c;
  {
    const device::DeviceGuard guard(tensor(kF32));
    ASSERT_FALSE(guard.ok());
    const KernelStatus st = guard.fail(c.ctx, "grp.op");
    EXPECT_EQ(st.code, KREG_UNAVAILABLE);
    EXPECT_EQ(std::string(c.message).rfind("grp.op: cannot make CUDA device 0 current: ", 0), 0u)
        << c.message;
  }
}

TEST(DeviceGuard, TheCurrentDeviceStaysAndAMissingOneFails) {
  const int n = device_count();
  if (n == 0) GTEST_SKIP() << "no GPU";
  int before = -1;
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  {
    const device::DeviceGuard guard(tensor(kF32, kDLCUDA, before));
    EXPECT_TRUE(guard.ok());
    int now = -1;
    EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, before);
  }
  Ctx c;
  {
    const device::DeviceGuard guard(tensor(kF32, kDLCUDA, n));  // one past the last
    ASSERT_FALSE(guard.ok());
    EXPECT_EQ(guard.fail(c.ctx, "grp.op").code, KREG_UNAVAILABLE);
    EXPECT_EQ(std::string(c.message).rfind(
                  "grp.op: cannot make CUDA device " + std::to_string(n) + " current: ", 0),
              0u)
        << c.message;
  }
  // The failure is not left for the next launch check to report.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(device::launch_status(c.ctx, "grp.op").ok());
  int after = -1;
  EXPECT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, before);
}

TEST(DeviceGuard, SwitchesToTheTensorsDeviceAndBack) {
  const int n = device_count();
  if (n < 2) GTEST_SKIP() << "needs two GPUs";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  {
    const device::DeviceGuard guard(tensor(kF32, kDLCUDA, n - 1));
    EXPECT_TRUE(guard.ok());
    int now = -1;
    EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, n - 1);
  }
  int after = -1;
  EXPECT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, 0);
}

}  // namespace
