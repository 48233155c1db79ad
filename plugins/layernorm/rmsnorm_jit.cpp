// The JIT RMSNorm implementations (docs/jit.md): their sources, embedded from
// jit/rmsnorm.cu.jit and its headers at build time, and the host launchers, which launch
// the kernel the core compiled for the call's H and dtype (ctx.jit_kernel()).
#include <cuda_runtime.h>

#include <cstdint>

#include "jit/rmsnorm_config.h"
#include "kreg/device/jit_launch.hpp"
#include "kreg/device/launch.cuh"
#include "layernorm.hpp"
#include "layernorm_jit_sources.h"  // generated (kreg_embed_jit_sources)

namespace kreg::layernorm {
namespace {

constexpr kreg_jit_file kHeaders[] = {
    {"kreg_jit/prelude.cuh", kreg_jit_text::prelude_cuh},
    {"rmsnorm_config.h", kreg_jit_text::rmsnorm_config_h},
};

constexpr kreg_jit_desc desc(const char* kernel) {
  return kreg_jit_desc{sizeof(kreg_jit_desc),
                       "rmsnorm.cu.jit",
                       kreg_jit_text::rmsnorm_cu_jit,
                       kHeaders,
                       sizeof(kHeaders) / sizeof(kHeaders[0]),
                       0,
                       kernel,
                       "H,dtype",
                       ""};
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

KernelStatus launch(Context& ctx, const DLTensor& x, DLTensor* residual, const DLTensor& weight,
                    DLTensor& out, double eps, bool fused) {
  const int64_t rows = x.shape[0];
  const int64_t h = x.shape[1];
  if (rows == 0 || h == 0) return kOk;
  const device::DeviceGuard guard(x);
  if (!guard.ok()) return guard.fail(ctx, ctx.op());
  const void* in = data_ptr<const void>(x);
  void* res = residual != nullptr ? data_ptr<void>(*residual) : nullptr;
  const void* w = data_ptr<const void>(weight);
  void* o = data_ptr<void>(out);
  const auto cfg = kreg_jit::rms_config(static_cast<int>(h), x.dtype.bits / 8, fused);
  const int64_t blocks = (rows + cfg.rows - 1) / cfg.rows;
  if (blocks > INT32_MAX) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s: T = %lld rows is too many for one launch", ctx.op(),
                    static_cast<long long>(rows));
  }
  long long n = rows;
  float e = static_cast<float>(eps);
  void* args[] = {&in, &res, &w, &o, &n, &e};
  return device::jit_launch(
      ctx, dim3(static_cast<unsigned>(blocks)),
      dim3(static_cast<unsigned>(cfg.threads), static_cast<unsigned>(cfg.rows)), 0, args);
}

// The JIT kernel serves the widths the AOT kernel reads in scalars: H not a multiple of
// a 16-byte vector. Measured on an H200 (T = 32768 bf16, tools/bench/gpu_quick.sh), with
// the weights read as scalars: rmsnorm H = 4097 533 -> 221 us, fused 630 -> 298 us; at
// H = 4096 and 7168 the AOT kernel is as fast or faster (rmsnorm 7168: 256 vs 311 us), so
// it keeps those. (Blocks walking 32 rows of one shift class with the weights held in
// registers were slower: 256 and 446 us at H = 4097; one row per block stays.) The plain
// forms then held x in fp32 over 288 threads (41 registers: 4 blocks an SM, 56%
// occupancy); they now hold it in its storage type over 256 threads in 32 registers
// (8 blocks an SM, twice the bytes in flight), not yet measured.
// Rows read as 16-byte vectors also need 16-byte aligned base pointers; views that are
// not (an offset into a larger buffer) take the AOT kernel.
// Decode sizes go to the AOT kernel too: at T = 64, H = 4097 (a CUDA graph) it took
// 3.50 us against the JIT kernel's 3.93; at T = 32768 the JIT kernel is 2.2x faster. The
// crossover is not measured; 256 rows is below every prefill shape the benchmarks run.
constexpr int64_t kAotMaxRows = 256;

bool jit_fits(const DLTensor& x, std::initializer_list<const void*> ps) {
  const int64_t vec = 16 / (x.dtype.bits / 8);
  if (x.ndim == 2 && x.shape[1] % vec == 0) return false;
  if (x.ndim == 2 && x.shape[0] <= kAotMaxRows) return false;
  for (const void* p : ps) {
    if (!aligned16(p)) return false;
  }
  return true;
}

}  // namespace

constexpr kreg_jit_desc kRmsnormJit = desc("kreg_jit::rmsnorm<{H}, kreg_jit::{dtype}, 0>");
constexpr kreg_jit_desc kGemmaRmsnormJit = desc("kreg_jit::rmsnorm<{H}, kreg_jit::{dtype}, 1>");
constexpr kreg_jit_desc kFusedAddRmsnormJit = desc("kreg_jit::rmsnorm<{H}, kreg_jit::{dtype}, 2>");
constexpr kreg_jit_desc kGemmaFusedAddRmsnormJit =
    desc("kreg_jit::rmsnorm<{H}, kreg_jit::{dtype}, 3>");

KernelStatus rmsnorm_jit(Context& ctx, const DLTensor& x, const DLTensor& weight, DLTensor& out,
                         double eps) {
  if (!jit_fits(x, {data_ptr<const void>(x), data_ptr<const void>(weight), data_ptr<void>(out)})) {
    return rmsnorm_cuda(ctx, x, weight, out, eps);
  }
  return launch(ctx, x, nullptr, weight, out, eps, false);
}

KernelStatus gemma_rmsnorm_jit(Context& ctx, const DLTensor& x, const DLTensor& weight,
                               DLTensor& out, double eps) {
  if (!jit_fits(x, {data_ptr<const void>(x), data_ptr<const void>(weight), data_ptr<void>(out)})) {
    return gemma_rmsnorm_cuda(ctx, x, weight, out, eps);
  }
  return launch(ctx, x, nullptr, weight, out, eps, false);
}

KernelStatus fused_add_rmsnorm_jit(Context& ctx, DLTensor& x, DLTensor& residual,
                                   const DLTensor& weight, double eps) {
  if (!jit_fits(x, {data_ptr<void>(x), data_ptr<void>(residual), data_ptr<const void>(weight)})) {
    return fused_add_rmsnorm_cuda(ctx, x, residual, weight, eps);
  }
  return launch(ctx, x, &residual, weight, x, eps, true);
}

KernelStatus gemma_fused_add_rmsnorm_jit(Context& ctx, DLTensor& x, DLTensor& residual,
                                         const DLTensor& weight, double eps) {
  if (!jit_fits(x, {data_ptr<void>(x), data_ptr<void>(residual), data_ptr<const void>(weight)})) {
    return gemma_fused_add_rmsnorm_cuda(ctx, x, residual, weight, eps);
  }
  return launch(ctx, x, &residual, weight, x, eps, true);
}

}  // namespace kreg::layernorm
