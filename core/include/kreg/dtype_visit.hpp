// From a tensor's run-time dtype to a C++ element type, once for every kernel: the CPU
// references visit kreg::bf16 / kreg::f16 (numeric.hpp) / float; the CUDA launchers
// (device/launch.cuh) add __nv_bfloat16 and __half to ElementType and visit those.
//
//   return cpu::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
//     using T = decltype(tag);
//     scale_rows(data_ptr<const T>(x), data_ptr<T>(out), ...);
//     return kOk;
//   });
#pragma once

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "kreg/dtype.hpp"
#include "kreg/numeric.hpp"
#include "kreg/plugin.hpp"

namespace kreg {

// The DType and name of a kernel's C++ element type.
template <typename T>
struct ElementType;
template <>
struct ElementType<bf16> {
  static constexpr DType kDType = DType::kBF16;
  static constexpr const char* kName = "bf16";
};
template <>
struct ElementType<f16> {
  static constexpr DType kDType = DType::kF16;
  static constexpr const char* kName = "f16";
};
template <>
struct ElementType<float> {
  static constexpr DType kDType = DType::kF32;
  static constexpr const char* kName = "f32";
};
template <>
struct ElementType<int32_t> {
  static constexpr DType kDType = DType::kI32;
  static constexpr const char* kName = "i32";
};
template <>
struct ElementType<int64_t> {
  static constexpr DType kDType = DType::kI64;
  static constexpr const char* kName = "i64";
};

namespace detail {
// fn(T{}) as a status: its own, or kOk when it returns nothing.
template <typename T, typename Fn>
KernelStatus call_with_element(Fn& fn) {
  if constexpr (std::is_void_v<std::invoke_result_t<Fn&, T>>) {
    fn(T{});
    return kOk;
  } else {
    return fn(T{});
  }
}
}  // namespace detail

// Calls fn with a value of the element type of `t` among Ts and returns its status (kOk
// when fn returns nothing):
// visit_dtype<int32_t, int64_t>(ctx, op, ids, [&](auto tag) { using I = decltype(tag); ... }).
// Any other dtype: "<op>: dtype must be i32 or i64".
template <typename... Ts, typename Fn>
KernelStatus visit_dtype(Context& ctx, const char* op, const DLTensor& t, Fn&& fn) {
  const DType d = from_dl(t.dtype).value_or(DType::kCount);
  KernelStatus status;
  if (((d == ElementType<Ts>::kDType && (status = detail::call_with_element<Ts>(fn), true)) ||
       ...)) {
    return status;
  }
  constexpr const char* kNames[] = {ElementType<Ts>::kName...};
  constexpr int kCount = sizeof...(Ts);
  char list[64] = "";
  int len = 0;
  for (int i = 0; i < kCount && len < static_cast<int>(sizeof list); ++i) {
    const char* sep = i == 0 ? "" : i + 1 == kCount ? " or " : ", ";
    len += std::snprintf(list + len, sizeof list - len, "%s%s", sep, kNames[i]);
  }
  return ctx.fail(KREG_INVALID_ARGUMENT, "%s: dtype must be %s", op, list);
}

// The floating-point types of the CPU references: bf16, f16 or f32. (In kreg::host: the
// CUDA launchers' kreg::device::visit_float_dtype visits CUDA's 16-bit types, and two
// such functions in kreg and kreg::device would make unqualified calls ambiguous.)
namespace host {
template <typename Fn>
KernelStatus visit_float_dtype(Context& ctx, const char* op, const DLTensor& t, Fn&& fn) {
  return visit_dtype<bf16, f16, float>(ctx, op, t, static_cast<Fn&&>(fn));
}
}  // namespace host

}  // namespace kreg
