// The typed C++ layer for plugin authors, on top of the C ABI (abi.h).
//
// A kernel is an ordinary function whose first parameter is a kreg::Context& and whose
// other parameters follow the op's signature in order:
//   DLTensor& / const DLTensor&   a tensor argument ('T')
//   int64_t / int32_t / int       an int attribute  ('i')
//   double / float                a float attribute ('f')
//   bool                          a bool attribute  ('b')
//   const char* / std::string_view a string attribute ('s')
//
//   kreg::KernelStatus rmsnorm(kreg::Context& ctx, const DLTensor& x, const DLTensor& w,
//                              DLTensor& out, double eps);
//
// A group lists its implementations once, as data, and exports them:
//
//   constexpr kreg::KernelDef kKernels[] = {
//       {.op = "layernorm.rmsnorm", .backend = "cuda", .caps = kreg::kCudaSm75Plus,
//        .signature = "rmsnorm(Tensor[T,H] x, ...) -> ()", .dtypes = "bf16|f16|f32",
//        .impl = kreg::bind<&rmsnorm_cuda>, .source = "rmsnorm.cu"},
//   };
//   KREG_PLUGIN("layernorm", "0.1.0", kKernels);
//
// The core checks each call against the signature before the kernel runs (counts,
// dtypes, ranks, named dimensions, device, contiguity). The decoder still trusts nothing
// structural in the frame it is given, since anything that can dlopen a plugin can call
// it: counts against the function, null frame, tensor and attribute arrays, null required
// tensors, attribute kinds, null strings, ints that do not fit an int32_t parameter,
// floats past a float parameter's range, bools other than 0/1, and each tensor's ndim
// (0..64), shape pointer, negative extents and byte size (checked_math.hpp). A bad frame
// returns INVALID_ARGUMENT with a message naming the argument; the function is not
// called. That is a few compares per argument and one multiply per dimension. The
// binding also records which argument kinds the function decodes (`arg_kinds`); the
// core refuses a registration whose signature disagrees.
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kreg/abi.h"
#include "kreg/checked_math.hpp"

namespace kreg {

// A kernel's result: a canonical code; the message, if any, is already in the Context.
struct KernelStatus {
  int32_t code = KREG_OK;
  constexpr bool ok() const { return code == KREG_OK; }
};

inline constexpr KernelStatus kOk{};

// What a kernel gets besides its arguments: the stream and a place for error messages.
class Context {
 public:
  Context(void* stream, kreg_error* err) : stream_(stream), err_(err) {}

  // The device stream to enqueue on (cudaStream_t for CUDA); null means the default.
  void* stream() const { return stream_; }

  // Records a printf-style message and returns `code`, for `return ctx.fail(...)`.
  [[gnu::format(printf, 3, 4)]] KernelStatus fail(kreg_status_code code, const char* fmt,
                                                  ...) const {
    if (err_ != nullptr && err_->message != nullptr && err_->capacity > 0) {
      va_list args;
      va_start(args, fmt);
      std::vsnprintf(err_->message, err_->capacity, fmt, args);
      va_end(args);
    }
    return KernelStatus{code};
  }

 private:
  void* stream_;
  kreg_error* err_;
};

// ---- Tensor access helpers (the core has validated dtype, rank and contiguity) ----

// Cannot overflow for a tensor that reached a bound kernel: the decoder checked its size.
inline int64_t numel(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

template <typename T>
inline T* data_ptr(const DLTensor& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data) + t.byte_offset);
}

// ---- Capability sets ----

struct Caps {
  const kreg_capability* data = nullptr;
  uint32_t size = 0;
  template <uint32_t N>
  constexpr Caps(const kreg_capability (&a)[N]) : data(a), size(N) {}  // NOLINT
  constexpr Caps() = default;
};

inline constexpr kreg_capability kCpu[] = {{kDLCPU, 0, 0}};
// CUDA 13 compiles for sm_75 and newer; 120 covers Blackwell consumer parts.
inline constexpr kreg_capability kCudaSm75Plus[] = {{kDLCUDA, 75, 121}};

// ---- Binding: typed function -> kreg_kernel_fn ----

namespace detail {

template <typename P>
struct ArgKind;
template <>
struct ArgKind<DLTensor&> {
  static constexpr char kind = 'T';
};
template <>
struct ArgKind<const DLTensor&> {
  static constexpr char kind = 'T';
};
// Optional tensors ('Tensor?' in the signature): null when the caller omitted them.
template <>
struct ArgKind<DLTensor*> {
  static constexpr char kind = 'O';
};
template <>
struct ArgKind<const DLTensor*> {
  static constexpr char kind = 'O';
};
template <>
struct ArgKind<int64_t> {
  static constexpr char kind = 'i';
};
template <>
struct ArgKind<int32_t> {
  static constexpr char kind = 'i';
};
template <>
struct ArgKind<double> {
  static constexpr char kind = 'f';
};
template <>
struct ArgKind<float> {
  static constexpr char kind = 'f';
};
template <>
struct ArgKind<bool> {
  static constexpr char kind = 'b';
};
template <>
struct ArgKind<const char*> {
  static constexpr char kind = 's';
};
template <>
struct ArgKind<std::string_view> {
  static constexpr char kind = 's';
};

template <typename F>
struct FnTraits;
template <typename... Ps>
struct FnTraits<KernelStatus (*)(Context&, Ps...)> {
  using Params = std::tuple<Ps...>;
  static constexpr size_t arity = sizeof...(Ps);
  static constexpr char kinds[sizeof...(Ps) + 1] = {ArgKind<Ps>::kind..., '\0'};
};

// Index of parameter I among the tensors (if a tensor) or among the attributes.
template <size_t I, size_t N>
constexpr int index_among(const char (&kinds)[N]) {
  auto is_tensor = [](char k) { return k == 'T' || k == 'O'; };
  const bool tensor = is_tensor(kinds[I]);
  int n = 0;
  // `j != I`, not `j < I`: nvcc warns that `j < 0` is pointless when I is 0.
  for (size_t j = 0; j != I; ++j) n += (is_tensor(kinds[j]) == tensor) ? 1 : 0;
  return n;
}

template <typename P, char K>
inline P decode(const kreg_call_frame* f, int idx) {
  if constexpr (K == 'T') {
    return *f->tensors[idx];
  } else if constexpr (K == 'O') {
    return f->tensors[idx];
  } else if constexpr (K == 'i') {
    return static_cast<P>(f->attrs[idx].value.i);
  } else if constexpr (K == 'f') {
    return static_cast<P>(f->attrs[idx].value.f);
  } else if constexpr (K == 'b') {
    return f->attrs[idx].value.i != 0;
  } else {
    return P(f->attrs[idx].value.s);
  }
}

// ---- Frame checks (before any parameter is decoded) ----

inline constexpr int32_t kMaxFrameNdim = 64;

[[gnu::format(printf, 2, 3)]] inline int32_t frame_error(kreg_error* err, const char* fmt, ...) {
  if (err != nullptr && err->message != nullptr && err->capacity > 0) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(err->message, err->capacity, fmt, args);
    va_end(args);
  }
  return KREG_INVALID_ARGUMENT;
}

template <size_t N>
constexpr int count_tensors(const char (&kinds)[N]) {
  int n = 0;
  for (size_t j = 0; j + 1 < N; ++j) n += (kinds[j] == 'T' || kinds[j] == 'O') ? 1 : 0;
  return n;
}

inline int32_t check_tensor(const DLTensor* t, int idx, kreg_error* err) {
  if (static_cast<uint32_t>(t->ndim) > static_cast<uint32_t>(kMaxFrameNdim)) {
    return frame_error(err, "tensor %d has ndim %d, outside [0, %d]", idx, t->ndim, kMaxFrameNdim);
  }
  if (t->ndim > 0 && t->shape == nullptr) {
    return frame_error(err, "tensor %d has ndim %d but a null shape", idx, t->ndim);
  }
  const int bad =
      check_extents(t->shape, t->ndim, dl_item_bytes(t->dtype.bits, t->dtype.lanes), nullptr);
  if (bad >= 0) {
    return frame_error(err, "tensor %d has a negative extent %lld in dim %d", idx,
                       static_cast<long long>(t->shape[bad]), bad);
  }
  if (bad == kShapeTooLarge) {
    return frame_error(err, "tensor %d is too large: its size in bytes overflows int64", idx);
  }
  return KREG_OK;
}

// One parameter of kind K and type P at index idx among the tensors or the attributes.
template <typename P, char K>
inline int32_t check_param(const kreg_call_frame* f, int idx, kreg_error* err) {
  if constexpr (K == 'T' || K == 'O') {
    const DLTensor* t = f->tensors[idx];
    if (t == nullptr) {
      if constexpr (K == 'O') return KREG_OK;
      return frame_error(err, "tensor %d is null (not an optional tensor)", idx);
    }
    return check_tensor(t, idx, err);
  } else {
    const kreg_attr& a = f->attrs[idx];
    constexpr int32_t want = K == 'i'   ? KREG_ATTR_INT
                             : K == 'f' ? KREG_ATTR_FLOAT
                             : K == 'b' ? KREG_ATTR_BOOL
                                        : KREG_ATTR_STRING;
    if (a.type != want) {
      return frame_error(err, "attribute %d has type %d, the function takes type %d", idx, a.type,
                         want);
    }
    if constexpr (K == 'i' && sizeof(P) < sizeof(int64_t)) {
      if (a.value.i < std::numeric_limits<P>::min() || a.value.i > std::numeric_limits<P>::max()) {
        return frame_error(err, "attribute %d: %lld does not fit the function's %d-bit int", idx,
                           static_cast<long long>(a.value.i), static_cast<int>(8 * sizeof(P)));
      }
    } else if constexpr (K == 'f' && sizeof(P) < sizeof(double)) {
      // Converting a finite double past the float range is undefined; inf and nan convert.
      const double v = a.value.f;
      if (std::isfinite(v) && std::fabs(v) > static_cast<double>(std::numeric_limits<P>::max())) {
        return frame_error(err, "attribute %d: %g is outside the function's float range", idx, v);
      }
    } else if constexpr (K == 'b') {
      if (a.value.i != 0 && a.value.i != 1) {
        return frame_error(err, "attribute %d: bool value %lld is not 0 or 1", idx,
                           static_cast<long long>(a.value.i));
      }
    } else if constexpr (K == 's') {
      if (a.value.s == nullptr) return frame_error(err, "attribute %d is a null string", idx);
    }
    return KREG_OK;
  }
}

template <typename Traits, size_t... I>
inline int32_t check_frame(const kreg_call_frame* f, kreg_error* err, std::index_sequence<I...>) {
  using Params = typename Traits::Params;
  constexpr int tensors = count_tensors(Traits::kinds);
  constexpr int attrs = static_cast<int>(Traits::arity) - tensors;
  if (f == nullptr) return frame_error(err, "null call frame");
  if (f->struct_size < sizeof(kreg_call_frame)) {
    return frame_error(err, "call frame too small (struct_size %zu, expected %zu)", f->struct_size,
                       sizeof(kreg_call_frame));
  }
  if (f->num_tensors != tensors || f->num_attrs != attrs) {
    return frame_error(err, "frame has %d tensors and %d attributes, the function takes %d and %d",
                       f->num_tensors, f->num_attrs, tensors, attrs);
  }
  if constexpr (tensors > 0) {
    if (f->tensors == nullptr) return frame_error(err, "null tensor array");
  }
  if constexpr (attrs > 0) {
    if (f->attrs == nullptr) return frame_error(err, "null attribute array");
  }
  int32_t rc = KREG_OK;
  (void)((rc = check_param<
              std::remove_cv_t<std::remove_reference_t<std::tuple_element_t<I, Params>>>,
              Traits::kinds[I]>(f, index_among<I>(Traits::kinds), err),
          rc == KREG_OK) &&
         ...);
  return rc;
}

template <auto Fn, size_t... I>
inline int32_t invoke(const kreg_call_frame* f, kreg_error* err, std::index_sequence<I...> seq) {
  using Traits = FnTraits<decltype(Fn)>;
  using Params = typename Traits::Params;
  if (const int32_t rc = check_frame<Traits>(f, err, seq); rc != KREG_OK) [[unlikely]] {
    return rc;
  }
  Context ctx(f->stream, err);
  return Fn(ctx, decode<std::tuple_element_t<I, Params>, Traits::kinds[I]>(
                     f, index_among<I>(Traits::kinds))...)
      .code;
}

}  // namespace detail

// A kernel function as the ABI sees it, plus the kinds of arguments it decodes.
struct Binding {
  kreg_kernel_fn fn = nullptr;
  const char* arg_kinds = "";
};

template <auto Fn>
inline int32_t bound_kernel(const kreg_call_frame* frame, kreg_error* err) {
  using Traits = detail::FnTraits<decltype(Fn)>;
  return detail::invoke<Fn>(frame, err, std::make_index_sequence<Traits::arity>{});
}

template <auto Fn>
inline constexpr Binding bind{&bound_kernel<Fn>, detail::FnTraits<decltype(Fn)>::kinds};

// ---- Registration records ----

struct KernelDef {
  const char* op = "";
  const char* backend = "";
  Caps caps;
  const char* signature = "";
  const char* dtypes = "";
  uint32_t traits = 0;
  int32_t priority = 0;
  const char* description = "";
  Binding impl;
  const char* source = "";
};

namespace detail {
template <size_t N, size_t... I>
constexpr auto to_descs(const KernelDef (&defs)[N], std::index_sequence<I...>) {
  struct Table {
    kreg_kernel_desc items[N];
  };
  return Table{{kreg_kernel_desc{
      sizeof(kreg_kernel_desc), defs[I].op, defs[I].backend, defs[I].caps.data, defs[I].caps.size,
      defs[I].traits, defs[I].signature, defs[I].dtypes, defs[I].impl.arg_kinds, defs[I].priority,
      0, defs[I].description, defs[I].source, defs[I].impl.fn}...}};
}
}  // namespace detail

template <size_t N>
constexpr auto to_descs(const KernelDef (&defs)[N]) {
  return detail::to_descs(defs, std::make_index_sequence<N>{});
}

}  // namespace kreg

#ifndef KREG_PLUGIN_CUDA_VERSION
#define KREG_PLUGIN_CUDA_VERSION 0
#endif
#ifndef KREG_PLUGIN_CUDA_ARCHS
#define KREG_PLUGIN_CUDA_ARCHS ""
#endif
#if defined(__clang__)
#define KREG_COMPILER_STRING "Clang " __clang_version__
#elif defined(__GNUC__)
#define KREG_COMPILER_STRING "GNU " __VERSION__
#else
#define KREG_COMPILER_STRING "unknown"
#endif

// Defines the plugin's descriptor and its exported entry symbol. INIT and SHUTDOWN are
// `int32_t(kreg_error*)` and `void()` functions or nullptr.
#define KREG_PLUGIN_WITH_HOOKS(GROUP, VERSION, KERNELS, INIT, SHUTDOWN)                          \
  namespace {                                                                                    \
  constexpr auto kreg_plugin_table_ = ::kreg::to_descs(KERNELS);                                 \
  constexpr kreg_build_info kreg_plugin_build_ = {sizeof(kreg_build_info), KREG_COMPILER_STRING, \
                                                  KREG_PLUGIN_CUDA_VERSION, 0,                   \
                                                  KREG_PLUGIN_CUDA_ARCHS};                       \
  constexpr kreg_plugin_desc kreg_plugin_desc_ = {                                               \
      sizeof(kreg_plugin_desc),                                                                  \
      KREG_ABI_MAJOR,                                                                            \
      KREG_ABI_MINOR,                                                                            \
      GROUP,                                                                                     \
      VERSION,                                                                                   \
      &kreg_plugin_build_,                                                                       \
      kreg_plugin_table_.items,                                                                  \
      static_cast<uint32_t>(sizeof(kreg_plugin_table_.items) / sizeof(kreg_kernel_desc)),        \
      0,                                                                                         \
      INIT,                                                                                      \
      SHUTDOWN};                                                                                 \
  }                                                                                              \
  extern "C" __attribute__((visibility("default"))) const kreg_plugin_desc* kreg_plugin_entry(   \
      void) {                                                                                    \
    return &kreg_plugin_desc_;                                                                   \
  }

#define KREG_PLUGIN(GROUP, VERSION, KERNELS) \
  KREG_PLUGIN_WITH_HOOKS(GROUP, VERSION, KERNELS, nullptr, nullptr)
