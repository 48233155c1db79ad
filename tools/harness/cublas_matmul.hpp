// The tools' own matmuls on a CUDA device (kreg-host's MLP step, kreg-tp-demo's ranks):
// row-major out[m,n] = a[m,k] @ b[k,n] through cuBLAS, fp32 accumulation, rounded to the
// buffers' dtype (f32, f16 or bf16), on the legacy default stream of the buffers' device.
//
// cuBLAS is loaded with dlopen at the first call of the process, not linked: linked, its
// 540 MB libcublasLt was mapped and relocated at every start of those tools, GPU or not
// (0.75 s of kreg-host's start-up on a machine without one). Its handle is made once per
// device. A build without CUDA, a library that cannot be loaded (the error names it) and a
// failed call are Status errors.
#pragma once

#include <cstdint>

#include "harness.hpp"

namespace kreg::harness {

Status cublas_matmul(const Buffer& a, const Buffer& b, Buffer& out, int64_t m, int64_t n,
                     int64_t k);

}  // namespace kreg::harness
