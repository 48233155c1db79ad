// The example group's kernels (an out-of-tree plugin: tests/external).
#pragma once

#include "kreg/plugin.hpp"

namespace example {

// out = alpha * x + y (example.axpy) or alpha * x - y (example.axmy), f32 or f64.
kreg::KernelStatus axpy_cpu(kreg::Context& ctx, const DLTensor& x, const DLTensor& y, DLTensor& out,
                            double alpha);

}  // namespace example
