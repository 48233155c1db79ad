// CPU reference of quantization.hadamard_transform: the fast Walsh-Hadamard butterflies in
// double over each row, the scale, one rounding at the store. It defines the result the CUDA
// kernel (fp32 butterflies) must match within a few fp32 ulps of the row's magnitude.
#include <cstdint>
#include <vector>

#include "hadamard.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::quantization {
namespace {

// In place over one row: for every bit b, the pairs (i, i | b) with bit b of i clear become
// (u + v, u - v). Each stage applies H_2 on one index bit; their product over all bits is
// H_2 (x) ... (x) H_2 = H_N in natural (Sylvester) order, whatever the order of the stages.
void fwht(std::vector<double>& v) {
  const size_t n = v.size();
  for (size_t half = 1; half < n; half *= 2) {
    for (size_t base = 0; base < n; base += 2 * half) {
      for (size_t i = base; i < base + half; ++i) {
        const double u = v[i], w = v[i + half];
        v[i] = u + w;
        v[i + half] = u - w;
      }
    }
  }
}

template <typename T>
void hadamard_rows(const T* x, T* out, int64_t rows, int64_t n, double scale) {
  std::vector<double> row(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* outr = out + r * n;
    // The whole row is read before any of it is written: out may alias x.
    for (int64_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = load_as_float(xr[i]);
    fwht(row);
    for (int64_t i = 0; i < n; ++i) {
      outr[i] = store_from_float<T>(static_cast<float>(scale * row[static_cast<size_t>(i)]));
    }
  }
}

}  // namespace

KernelStatus hadamard_transform_cpu(Context& ctx, const DLTensor& x, DLTensor& out, double scale) {
  const int64_t rows = x.shape[0];
  const int64_t n = x.shape[1];
  if (const KernelStatus st = check_hadamard_n(ctx, n); !st.ok()) return st;
  return host::visit_float_dtype(ctx, ctx.op(), x, [&](auto tag) {
    using T = decltype(tag);
    hadamard_rows(data_ptr<const T>(x), data_ptr<T>(out), rows, n, scale);
  });
}

}  // namespace kreg::quantization
