// A host program built against the installed kreg (kreg::core): loads the manifest given
// on the command line, calls the example group's ops on CPU tensors and checks the results
// against values computed here. Exit 0 when every check passes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kreg/manifest.hpp"
#include "kreg/registry.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// A contiguous 1-D CPU tensor over `data`.
template <typename T>
DLTensor tensor_of(std::vector<T>& data, int64_t& extent) {
  extent = static_cast<int64_t>(data.size());
  DLTensor t{};
  t.data = data.data();
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLFloat, static_cast<uint8_t>(sizeof(T) * 8), 1};
  t.shape = &extent;
  return t;
}

// Calls `op` on x, y (out poisoned with NaN first) and compares with alpha * x + sign * y.
template <typename T>
void expect_values(kreg::Registry& reg, const char* op, size_t n, const kreg_attr* alpha_attr,
                   double alpha, double sign) {
  std::vector<T> x(n), y(n), out(n, std::numeric_limits<T>::quiet_NaN());
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<T>(0.25 * static_cast<double>(i) - 3.0);
    y[i] = static_cast<T>(1.0 + 0.5 * static_cast<double>(i % 7));
  }
  int64_t nx = 0, ny = 0, no = 0;
  DLTensor tx = tensor_of(x, nx), ty = tensor_of(y, ny), to = tensor_of(out, no);
  DLTensor* args[] = {&tx, &ty, &to};
  std::span<const kreg_attr> attrs;
  if (alpha_attr != nullptr) attrs = {alpha_attr, 1};
  const kreg::Status st = reg.call(op, args, attrs);
  check(st.ok(), std::string(op) + " returns OK" + (st.ok() ? "" : ": " + st.to_string()));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = alpha * static_cast<double>(x[i]) + sign * static_cast<double>(y[i]);
    const double tol = (sizeof(T) == 4 ? 1e-6 : 1e-14) * (1.0 + std::fabs(want));
    if (!(std::fabs(static_cast<double>(out[i]) - want) <= tol)) ++bad;
  }
  check(bad == 0, std::string(op) + " computes alpha*x " + (sign > 0 ? "+" : "-") + " y for " +
                      std::to_string(n) + " elements (" + std::to_string(bad) + " wrong)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MANIFEST\n", argv[0]);
    return 2;
  }
  auto manifest = kreg::load_manifest(argv[1], kreg::ManifestOptions{});
  if (!manifest.ok()) {
    std::fprintf(stderr, "call_example: %s\n", manifest.status().to_string().c_str());
    return 1;
  }
  auto reg = kreg::Registry::open(*manifest);
  if (!reg.ok()) {
    std::fprintf(stderr, "call_example: %s\n", reg.status().to_string().c_str());
    return 1;
  }

  const kreg_attr alpha{KREG_ATTR_FLOAT, 0, {.f = 2.5}};
  expect_values<float>(**reg, "example.axpy", 1000, &alpha, 2.5, 1.0);
  // No attribute: the signature's default alpha=1.0; the shared function sees ctx.op().
  expect_values<double>(**reg, "example.axmy", 37, nullptr, 1.0, -1.0);

  // The core checks a call against the signature before the plugin runs: y's N differs.
  std::vector<float> x(8, 1.0f), y(7, 1.0f), out(8, -1.0f);
  int64_t nx = 0, ny = 0, no = 0;
  DLTensor tx = tensor_of(x, nx), ty = tensor_of(y, ny), to = tensor_of(out, no);
  DLTensor* args[] = {&tx, &ty, &to};
  const kreg::Status st = (*reg)->call("example.axpy", args);
  check(
      st.code() == KREG_INVALID_ARGUMENT,
      "a call whose y has another N is refused with INVALID_ARGUMENT (got " + st.to_string() + ")");
  check(out[0] == -1.0f, "the refused call did not write out");

  const kreg::Status unknown = (*reg)->call("example.nope", args);
  check(unknown.code() == KREG_NOT_FOUND,
        "an unknown op is NOT_FOUND (got " + unknown.to_string() + ")");

  std::printf("call_example: %d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
