// CPU references of the elementwise group: the plain loops that define what the CUDA
// kernels compute (fp32 math, one rounding at the store). Tensors are contiguous, so a
// [T,H] call is one flat loop over T*H elements.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "elementwise.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::elementwise {
namespace {

// out[i] = fn(x[i]) or fn(x[i], y[i]) in fp32, rounded once at the store. out may be x
// or y: each element is read before it is written.
template <typename T, typename Fn>
void map(const T* x, const T* y, T* out, int64_t n, Fn fn) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = load_as_float(x[i]);
    if constexpr (std::is_invocable_v<Fn, float, float>) {
      out[i] = store_from_float<T>(fn(a, load_as_float(y[i])));
    } else {
      out[i] = store_from_float<T>(fn(a));
    }
  }
}

template <typename Fn>
KernelStatus run(Context& ctx, const DLTensor& x, const DLTensor* y, DLTensor& out, Fn fn) {
  const int64_t n = numel(x);
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    map(data_ptr<const T>(x), y ? data_ptr<const T>(*y) : nullptr, data_ptr<T>(out), n, fn);
  });
}

}  // namespace

// cap * tanh(x * (1/cap)), 1/cap rounded to fp32 once (as the CUDA kernel does it).
// std::tanh saturates to +-1 for large |x|, and tanh(+-inf) = +-1: the result is +-cap,
// never NaN, for every non-NaN x.
KernelStatus softcap_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double cap) {
  float c = 0;
  if (KernelStatus st = fp32_attr(ctx, "cap", cap, true, &c); !st.ok()) return st;
  const float inv = 1.0f / c;
  return run(ctx, x, nullptr, out, [c, inv](float a) { return c * std::tanh(a * inv); });
}

// x * sigmoid(g) as x / (1 + exp(-g)): exp(-g) overflows to inf for g << 0, giving 0
// (or NaN for an infinite x), and tends to 0 for g >> 0, giving x.
KernelStatus sigmoid_gate_mul_cpu(Context& ctx, const DLTensor& x, const DLTensor& gate,
                                  DLTensor& out) {
  return run(ctx, x, &gate, out, [](float a, float g) { return a / (1.0f + std::exp(-g)); });
}

KernelStatus add_constant_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double c) {
  float cf = 0;
  if (KernelStatus st = fp32_attr(ctx, "c", c, false, &cf); !st.ok()) return st;
  return run(ctx, x, nullptr, out, [cf](float a) { return a + cf; });
}

}  // namespace kreg::elementwise
