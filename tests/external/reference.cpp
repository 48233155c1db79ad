// CPU references of the example group.
#include <cstdint>
#include <string_view>

#include "example.hpp"

namespace example {
namespace {

template <typename T>
void axpy_loop(const DLTensor& x, const DLTensor& y, DLTensor& out, T alpha, T sign) {
  const T* xs = kreg::data_ptr<T>(x);
  const T* ys = kreg::data_ptr<T>(y);
  T* os = kreg::data_ptr<T>(out);
  const int64_t n = kreg::numel(x);
  for (int64_t i = 0; i < n; ++i) os[i] = alpha * xs[i] + sign * ys[i];
}

}  // namespace

// One function serves both ops: ctx.op() says which one was called.
kreg::KernelStatus axpy_cpu(kreg::Context& ctx, const DLTensor& x, const DLTensor& y, DLTensor& out,
                            double alpha) {
  const std::string_view op = ctx.op();
  double sign = 1.0;
  if (op == "example.axmy") {
    sign = -1.0;
  } else if (op != "example.axpy") {
    return ctx.fail(KREG_INVALID_ARGUMENT, "example: axpy_cpu called for op '%.*s'",
                    static_cast<int>(op.size()), op.data());
  }
  // The core checked the dtype against the signature's set (f32|f64).
  if (x.dtype.bits == 64) {
    axpy_loop<double>(x, y, out, alpha, sign);
  } else {
    axpy_loop<float>(x, y, out, static_cast<float>(alpha), static_cast<float>(sign));
  }
  return kreg::kOk;
}

}  // namespace example
