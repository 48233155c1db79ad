// CPU references of the activation group: the plain loops that define what the CUDA
// kernels must compute (fp32 math, one rounding at the store).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "activation.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::activation {
namespace {

struct Silu {
  float operator()(float a) const { return a / (1.0f + std::exp(-a)); }
};

// 0.5 a (1 + erf(a / sqrt(2))), evaluated as 0.5 a erfc(-a / sqrt(2)): the same value,
// without the cancellation of 1 + erf for a << 0.
struct Gelu {
  float operator()(float a) const {
    constexpr float kInvSqrt2 = 0.70710678118654752f;
    return 0.5f * a * std::erfc(-a * kInvSqrt2);
  }
};

// 0.5 a (1 + tanh(u)) with u = sqrt(2/pi) (a + 0.044715 a^3), evaluated as
// a / (1 + exp(-2u)): an identity, without the cancellation of 1 + tanh for a << 0.
struct GeluTanh {
  float operator()(float a) const {
    constexpr float kSqrt2OverPi = 0.79788456080286536f;
    constexpr float kCubic = 0.044715f;
    return a / (1.0f + std::exp(-2.0f * kSqrt2OverPi * (a + kCubic * a * a * a)));
  }
};

template <typename T, typename Act>
void act_and_mul_rows(const T* x, T* out, int64_t rows, int64_t d, Act act) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * d;
    const T* up = gate + d;
    T* outr = out + r * d;
    for (int64_t i = 0; i < d; ++i) {
      outr[i] = store_from_float<T>(act(load_as_float(gate[i])) * load_as_float(up[i]));
    }
  }
}

// The function of each Act value.
template <Act A>
using Functor =
    std::conditional_t<A == Act::kSilu, Silu, std::conditional_t<A == Act::kGelu, Gelu, GeluTanh>>;

}  // namespace

template <Act A>
KernelStatus act_and_mul_cpu(Context& ctx, const DLTensor& x, DLTensor& out) {
  const int64_t rows = x.shape[0];
  const int64_t d = out.shape[1];
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    act_and_mul_rows(data_ptr<const T>(x), data_ptr<T>(out), rows, d, Functor<A>{});
  });
}

template KernelStatus act_and_mul_cpu<Act::kSilu>(Context&, const DLTensor&, DLTensor&);
template KernelStatus act_and_mul_cpu<Act::kGelu>(Context&, const DLTensor&, DLTensor&);
template KernelStatus act_and_mul_cpu<Act::kGeluTanh>(Context&, const DLTensor&, DLTensor&);

}  // namespace kreg::activation
