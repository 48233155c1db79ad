// The typed C++ layer for plugin authors (the plugin SDK), on top of the C ABI (abi.h).
//
// A kernel is an ordinary function whose first parameter is a kreg::Context& and whose
// other parameters follow the op's signature in order:
//   DLTensor& / const DLTensor&   a tensor argument ('T'); DLTensor* for 'Tensor?' ('O')
//   int64_t / int32_t / int       an int attribute  ('i')
//   double / float                a float attribute ('f')
//   bool                          a bool attribute  ('b')
//   const char* / std::string_view a string attribute ('s')
//
//   kreg::KernelStatus rmsnorm_cuda(kreg::Context& ctx, const DLTensor& x, const DLTensor& w,
//                                   DLTensor& out, double eps);
//
// A group lists its ops once, as data: one record per op (signature, dtypes, description,
// default traits) with its implementations under it, one line each:
//
//   constexpr kreg::Op kOps[] = {
//       {.signature = "rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, "
//                     "float eps=1e-6) -> ()",
//        .dtypes = "bf16|f16|f32",
//        .description = "RMSNorm: x * rsqrt(mean(x^2) + eps) * w",
//        .impls = {kreg::cpu(kreg::bind<&rmsnorm_cpu>, "reference.cpp"),
//                  KREG_IF_CUDA(kreg::cuda(kreg::bind<&rmsnorm_cuda>, "rmsnorm.cu"))}},
//   };
//   KREG_GROUP("layernorm", kOps);
//
// - The op id is "<group>.<name in the signature>" ("layernorm.rmsnorm"): said once.
// - The version comes from CMake (kreg_add_plugin(layernorm VERSION 0.2.0 ...)), as
//   KREG_PLUGIN_VERSION; registry.yaml may pin an expected version.
// - Traits: Op::traits (default deterministic + graph-safe) for every implementation; a
//   CPU implementation is never graph-safe; "mutates" is added when the signature writes
//   an input (Tensor(a!)); .with(t) / .without(t) adjust one implementation.
// - A CUDA implementation's capability comes from the architectures its target was
//   compiled for (CMAKE_CUDA_ARCHITECTURES, KREG_PLUGIN_CUDA_ARCHS): "80-real;90" claims
//   sm80-sm89 (SASS 8.0) and sm90 and newer (SASS 9.0, PTX 9.0). .sm(90) narrows it by
//   hand (a kernel that needs TMA). The core checks the claim against the fatbinary the
//   library really holds when it loads it.
// - The implementation learns which op it serves from ctx.op(), so one function may
//   serve several ops without a wrapper per op.
// KREG_GROUP also embeds all of this as data in the ELF section KREG_METADATA_SECTION
// (format: kreg/plugin_metadata.hpp), which the core reads without loading the library.
//
// The lower-level KREG_PLUGIN(GROUP, VERSION, KERNELS) takes one KernelDef per
// implementation, with everything spelled out (test fixtures that need unusual records).
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

#include <array>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <new>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kreg/abi.h"
#include "kreg/checked_math.hpp"

// Set by kreg_add_plugin (core/cmake/KregPlugin.cmake) for the plugin being built.
#ifndef KREG_PLUGIN_CUDA_VERSION
#define KREG_PLUGIN_CUDA_VERSION 0
#endif
#ifndef KREG_PLUGIN_CUDA_ARCHS
#define KREG_PLUGIN_CUDA_ARCHS ""
#endif
#ifndef KREG_PLUGIN_VERSION
#define KREG_PLUGIN_VERSION ""
#endif

namespace kreg {

// A kernel's result: a canonical code; the message, if any, is already in the Context.
struct KernelStatus {
  int32_t code = KREG_OK;
  constexpr bool ok() const { return code == KREG_OK; }
};

inline constexpr KernelStatus kOk{};

// What a kernel gets besides its arguments: the stream, the op it serves, the host's
// services and launch flags, and a place for error messages. Fields a core older than ABI
// 1.2 does not send read as their defaults ("", no services, no flags).
class Context {
 public:
  Context(void* stream, kreg_error* err) : stream_(stream), err_(err) {}
  Context(const kreg_call_frame& frame, kreg_error* err) : stream_(frame.stream), err_(err) {
    const kreg_call_frame* f = &frame;
    if (KREG_STRUCT_HAS(f, kreg_call_frame, launch_flags)) {
      if (f->op != nullptr) op_ = f->op;
      services_ = f->services;
      launch_flags_ = f->launch_flags;
    }
    if (KREG_STRUCT_HAS(f, kreg_call_frame, jit_kernel)) jit_kernel_ = f->jit_kernel;
  }

  // The device stream to enqueue on (cudaStream_t for CUDA); null means the default.
  void* stream() const { return stream_; }
  // The op being called, "<group>.<name>" ("" from a core older than ABI 1.2).
  const char* op() const { return op_; }
  uint64_t launch_flags() const { return launch_flags_; }
  // The caller asks for programmatic dependent launch (KREG_LAUNCH_PDL).
  bool pdl() const { return (launch_flags_ & KREG_LAUNCH_PDL) != 0; }
  // With PDL, the caller vouches for the op's documented stable inputs
  // (KREG_LAUNCH_STABLE_INPUTS): they may be read before the wait for the previous kernel.
  bool stable_inputs() const { return pdl() && (launch_flags_ & KREG_LAUNCH_STABLE_INPUTS) != 0; }
  const kreg_host_services* services() const { return services_; }
  // A "jit" implementation's compiled kernel for this call (a CUkernel; abi.h); null for
  // other backends and from a core older than ABI 1.3.
  const void* jit_kernel() const { return jit_kernel_; }

  // Whether the host allocates workspace (else kreg/device/workspace.cuh falls back to
  // cudaMallocAsync on the call's stream).
  bool host_allocates() const {
    return services_ != nullptr && KREG_STRUCT_HAS(services_, kreg_host_services, workspace_free) &&
           services_->workspace_alloc != nullptr && services_->workspace_free != nullptr;
  }
  // Workspace from the host's allocator, on the call's stream; null (message recorded)
  // on failure. Only when host_allocates().
  void* host_alloc(size_t bytes, DLDevice device) const {
    return services_->workspace_alloc(services_->self, bytes, device, stream_, err_);
  }
  void host_free(void* p, size_t bytes, DLDevice device) const {
    services_->workspace_free(services_->self, p, bytes, device, stream_);
  }

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
  const char* op_ = "";
  const kreg_host_services* services_ = nullptr;
  uint64_t launch_flags_ = 0;
  const void* jit_kernel_ = nullptr;
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
// A hand-written claim of every SM CUDA 13 compiles for (sm75 .. sm121). Prefer the
// default of kreg::cuda(): the architectures the plugin was really built for.
inline constexpr kreg_capability kCudaSm75Plus[] = {{kDLCUDA, 75, 121}};
// What a JIT implementation claims: NVRTC compiles for the device it finds.
inline constexpr kreg_capability kJitCaps[] = {{kDLCUDA, 75, 121}};

// The newest SM the core knows (kreg::is_real_sm); PTX claims reach up to it.
inline constexpr int32_t kNewestSm = 121;
// At most this many SM windows per implementation.
inline constexpr uint32_t kMaxCapsPerImpl = 8;

namespace detail {

inline constexpr int32_t kRealSms[] = {50, 52, 53, 60, 61,  62,  70,  72,  75,  80,
                                       86, 87, 89, 90, 100, 101, 103, 110, 120, 121};

constexpr bool real_sm(int32_t sm) {
  for (int32_t r : kRealSms) {
    if (r == sm) return true;
  }
  return false;
}
// The newest real SM of `sm`'s major (SASS for sm_XY runs on sm_XZ, Z >= Y).
constexpr int32_t newest_of_major(int32_t sm) {
  int32_t best = sm;
  for (int32_t r : kRealSms) {
    if (r / 10 == sm / 10 && r > best) best = r;
  }
  return best;
}
// The first real SM after `sm`, or 0.
constexpr int32_t next_real_sm(int32_t sm) {
  for (int32_t r : kRealSms) {
    if (r > sm) return r;
  }
  return 0;
}

struct CapList {
  kreg_capability items[kMaxCapsPerImpl] = {};
  uint32_t size = 0;
  bool parsed = true;  // false: an architecture list this parser does not know
  constexpr void add(int32_t lo, int32_t hi) {
    // Keep sorted and merged: windows with no real SM between them become one.
    for (uint32_t i = 0; i < size; ++i) {
      kreg_capability& w = items[i];
      const bool touch = !(hi < w.sm_min && next_real_sm(hi) < w.sm_min) &&
                         !(lo > w.sm_max && next_real_sm(w.sm_max) < lo);
      if (touch) {
        const int32_t nlo = lo < w.sm_min ? lo : w.sm_min;
        const int32_t nhi = hi > w.sm_max ? hi : w.sm_max;
        for (uint32_t j = i; j + 1 < size; ++j) items[j] = items[j + 1];
        --size;
        add(nlo, nhi);
        return;
      }
    }
    if (size == kMaxCapsPerImpl) {
      parsed = false;
      return;
    }
    uint32_t at = 0;
    while (at < size && items[at].sm_min < lo) ++at;
    for (uint32_t j = size; j > at; --j) items[j] = items[j - 1];
    items[at] = {kDLCUDA, lo, hi};
    ++size;
  }
};

// CMAKE_CUDA_ARCHITECTURES as KregPlugin.cmake passes it ("80-real,90"), turned into the
// SM windows whose devices can run some image of the build:
//   "NN-real"    SASS NN: sm_NN up to the newest SM of its major;
//   "NN-virtual" PTX NN: sm_NN and every newer SM (the driver JIT-compiles it);
//   "NN"         both;   "NNa" (arch-specific, e.g. 90a): sm_NN only;
//   "NNf" (family-specific, e.g. 100f): SASS and PTX within sm_NN's major.
// Anything else ("native", "all") leaves `parsed` false: the claim is then sm75+ and the
// core narrows it to the images the library holds (KREG_KERNEL_CAPS_FROM_BUILD).
constexpr CapList caps_from_archs(const char* archs) {
  CapList out;
  const char* p = archs;
  while (*p != '\0') {
    int32_t n = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
      n = n * 10 + (*p - '0');
      ++p;
      ++digits;
    }
    bool specific = false, family = false;
    if (*p == 'a' || *p == 'f') {
      specific = *p == 'a';
      family = *p == 'f';
      ++p;
    }
    bool sass = true, ptx = true;
    auto skip = [&](const char* word) {
      const char* q = p;
      for (const char* w = word; *w != '\0'; ++w, ++q) {
        if (*q != *w) return false;
      }
      p = q;
      return true;
    };
    if (skip("-real")) {
      ptx = false;
    } else if (skip("-virtual")) {
      sass = false;
    }
    if (digits == 0 || !real_sm(n) || (*p != ',' && *p != '\0')) {
      out.parsed = false;
      break;
    }
    if (specific) {
      out.add(n, n);
    } else {
      if (sass) out.add(n, newest_of_major(n));
      // Family PTX (compute_100f) runs within its major only.
      if (ptx) out.add(n, family ? newest_of_major(n) : kNewestSm);
    }
    if (*p == ',') ++p;
  }
  if (!out.parsed || out.size == 0) {
    out = CapList{};
    out.parsed = false;
    out.add(75, kNewestSm);
    out.parsed = false;
  }
  return out;
}

}  // namespace detail

// ---- Resources (ABI 1.4) ----

// A 'Resource<group.name>' argument as a kernel receives it: a live resource of that type
// (the core checked both), whose state is what the type's create function made.
struct ResourceRef {
  const kreg_resource* resource = nullptr;
  template <typename T>
  T& state() const {
    return *static_cast<T*>(resource->state);
  }
  uint64_t id() const { return resource->id; }
  const char* type() const { return resource->type; }
};

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
template <>
struct ArgKind<ResourceRef> {
  static constexpr char kind = 'r';
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
  } else if constexpr (K == 'r') {
    return ResourceRef{f->attrs[idx].value.r};
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
                             : K == 'r' ? KREG_ATTR_RESOURCE
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
    } else if constexpr (K == 'r') {
      if (a.value.r == nullptr || a.value.r->state == nullptr) {
        return frame_error(err, "attribute %d is a null resource", idx);
      }
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
  // ABI 1.0's frame is the smallest a core sends; later fields are read when present.
  constexpr size_t kMinFrame = offsetof(kreg_call_frame, stream) + sizeof(void*);
  if (f->struct_size < kMinFrame) {
    return frame_error(err, "call frame too small (struct_size %zu, expected at least %zu)",
                       f->struct_size, kMinFrame);
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
  Context ctx(*f, err);
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

namespace detail {

// No exception crosses the C ABI: one that escapes a kernel or a resource's create (a CPU
// reference's std::bad_alloc, a std::length_error) becomes an error naming the op and what
// was thrown. No cost on the path that does not throw (table-based unwinding).
inline int32_t escaped_exception(const kreg_call_frame* f, kreg_error* err) noexcept {
  const Context ctx(*f, err);
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return ctx.fail(KREG_RESOURCE_EXHAUSTED, "%s: out of host memory (std::bad_alloc)", ctx.op())
        .code;
  } catch (const std::exception& e) {
    return ctx
        .fail(KREG_INTERNAL, "%s: the implementation threw an exception: %s", ctx.op(), e.what())
        .code;
  } catch (...) {
    return ctx.fail(KREG_INTERNAL, "%s: the implementation threw an exception", ctx.op()).code;
  }
}

}  // namespace detail

template <auto Fn>
inline int32_t bound_kernel(const kreg_call_frame* frame, kreg_error* err) noexcept {
  using Traits = detail::FnTraits<decltype(Fn)>;
  try {
    return detail::invoke<Fn>(frame, err, std::make_index_sequence<Traits::arity>{});
  } catch (...) {
    return detail::escaped_exception(frame, err);
  }
}

template <auto Fn>
inline constexpr Binding bind{&bound_kernel<Fn>, detail::FnTraits<decltype(Fn)>::kinds};

// ---- Resource types (ABI 1.4) ----
//
// A resource type's create function is typed like a kernel, with the state to fill
// second and the creation parameters (attributes of the type's signature) after it:
//   KernelStatus create_comm(Context& ctx, void** state, int64_t rank, int64_t world_size);
//   void destroy_comm(void* state);
//   constexpr kreg::ResourceType kResources[] = {
//       {.type = "communication.comm",
//        .signature = "comm(int rank, int world_size) -> ()",
//        .description = "...",
//        .create = kreg::bind_create<&create_comm>,
//        .destroy = &destroy_comm}};
//   KREG_GROUP_WITH_RESOURCES("communication", kOps, kResources, nullptr, nullptr);
namespace detail {

template <typename F>
struct CreateTraits;
template <typename... Ps>
struct CreateTraits<KernelStatus (*)(Context&, void**, Ps...)> {
  using Params = std::tuple<Ps...>;
  static constexpr size_t arity = sizeof...(Ps);
  static constexpr char kinds[sizeof...(Ps) + 1] = {ArgKind<Ps>::kind..., '\0'};
};

template <auto Fn, size_t... I>
inline int32_t invoke_create(const kreg_call_frame* f, void** state, kreg_error* err,
                             std::index_sequence<I...> seq) {
  using Traits = CreateTraits<decltype(Fn)>;
  using Params = typename Traits::Params;
  static_assert(count_tensors(Traits::kinds) == 0, "a resource's create takes no tensors");
  if (const int32_t rc = check_frame<Traits>(f, err, seq); rc != KREG_OK) return rc;
  if (state == nullptr) return frame_error(err, "null state pointer");
  Context ctx(*f, err);
  return Fn(ctx, state,
            decode<std::tuple_element_t<I, Params>, Traits::kinds[I]>(
                f, index_among<I>(Traits::kinds))...)
      .code;
}

}  // namespace detail

using ResourceCreateFn = int32_t (*)(const kreg_call_frame*, void**, kreg_error*);

template <auto Fn>
inline int32_t bound_create(const kreg_call_frame* frame, void** state, kreg_error* err) noexcept {
  using Traits = detail::CreateTraits<decltype(Fn)>;
  try {
    return detail::invoke_create<Fn>(frame, state, err, std::make_index_sequence<Traits::arity>{});
  } catch (...) {
    return detail::escaped_exception(frame, err);
  }
}

template <auto Fn>
inline constexpr ResourceCreateFn bind_create = &bound_create<Fn>;

struct ResourceType {
  const char* type = "";       // "<group>.<name>"
  const char* signature = "";  // "<name>(int rank, ...) -> ()": creation parameters only
  const char* description = "";
  ResourceCreateFn create = nullptr;
  void (*destroy)(void* state) = nullptr;
};

namespace detail {

template <size_t N>
struct ResourceTable {
  kreg_resource_type_desc items[N == 0 ? 1 : N] = {};
};

template <size_t N>
constexpr ResourceTable<N> make_resource_descs(const ResourceType (&types)[N]) {
  ResourceTable<N> t{};
  for (size_t i = 0; i < N; ++i) {
    t.items[i] = kreg_resource_type_desc{sizeof(kreg_resource_type_desc),
                                         types[i].type,
                                         types[i].signature,
                                         types[i].description,
                                         types[i].create,
                                         types[i].destroy};
  }
  return t;
}

}  // namespace detail

// ---- Registration records ----

// One implementation of an op, as listed under it: kreg::cpu(...) or kreg::cuda(...).
struct Implementation {
  const char* backend = nullptr;  // null: an unused slot of Op::impls
  Binding impl;
  const char* source = "";
  int32_t priority = 0;
  Caps caps;           // a hand-written claim; empty: from the backend / the build
  int32_t sm_min = 0;  // narrows the build's claim (.sm())
  int32_t sm_max = kNewestSm;
  uint32_t traits_on = 0;              // .with()
  uint32_t traits_off = 0;             // .without()
  const char* description = nullptr;   // .describe(): this implementation's own text
  const kreg_jit_desc* jit = nullptr;  // kreg::cuda_jit(): the CUDA source the core compiles

  // Only on devices of SM `lo` (major*10+minor) up to `hi` (within what the build covers).
  constexpr Implementation sm(int32_t lo, int32_t hi = kNewestSm) const {
    Implementation r = *this;
    r.sm_min = lo;
    r.sm_max = hi;
    return r;
  }
  // A hand-written capability set instead of the build's (the core checks it against the
  // library's fatbinary and refuses a claim it cannot run).
  constexpr Implementation claim(Caps c) const {
    Implementation r = *this;
    r.caps = c;
    return r;
  }
  constexpr Implementation with(uint32_t traits) const {
    Implementation r = *this;
    r.traits_on |= traits;
    return r;
  }
  constexpr Implementation without(uint32_t traits) const {
    Implementation r = *this;
    r.traits_off |= traits;
    return r;
  }
  constexpr Implementation describe(const char* text) const {
    Implementation r = *this;
    r.description = text;
    return r;
  }
};

// The CPU implementation (the reference every other implementation is tested against).
constexpr Implementation cpu(Binding fn, const char* source, int32_t priority = 0) {
  return Implementation{.backend = "cpu", .impl = fn, .source = source, .priority = priority};
}
// A CUDA implementation; priority 100 puts it ahead of the CPU reference.
constexpr Implementation cuda(Binding fn, const char* source, int32_t priority = 100) {
  return Implementation{.backend = "cuda", .impl = fn, .source = source, .priority = priority};
}

// A collective on NCCL (backend "nccl": CUDA tensors; available where a GPU exists and
// libnccl.so.2 loads). Its CUDA code, like cuda()'s, claims the architectures it was built for.
constexpr Implementation nccl(Binding fn, const char* source, int32_t priority = 100) {
  return Implementation{.backend = "nccl", .impl = fn, .source = source, .priority = priority};
}

// A JIT implementation (docs/jit.md): the core compiles `desc`'s CUDA source with NVRTC
// for the device's architecture and the call's specialization when the op is resolved;
// `fn` is the launcher, which launches ctx.jit_kernel(). Priority 200 puts it ahead of an
// ahead-of-time CUDA kernel where NVRTC and a GPU exist. It claims every SM NVRTC can
// compile for (sm75+): the core compiles for the device it runs on.
constexpr Implementation cuda_jit(Binding fn, const char* source, const kreg_jit_desc* desc,
                                  int32_t priority = 200) {
  return Implementation{.backend = "jit",
                        .impl = fn,
                        .source = source,
                        .priority = priority,
                        .caps = kJitCaps,
                        .jit = desc};
}

// Lists a CUDA implementation only in a build with CUDA (the functions do not exist in a
// CPU-only build): `.impls = {kreg::cpu(...), KREG_IF_CUDA(kreg::cuda(...))}`.
#if defined(KREG_PLUGIN_HAS_CUDA)
#define KREG_IF_CUDA(...) __VA_ARGS__
#else
#define KREG_IF_CUDA(...)
#endif

inline constexpr uint32_t kDefaultTraits = KREG_TRAIT_DETERMINISTIC | KREG_TRAIT_GRAPH_SAFE;
inline constexpr size_t kMaxImplsPerOp = 6;

// One op: everything its implementations share, and the implementations.
struct Op {
  const char* signature = "";  // "name(Tensor[T,H] x, ...) -> ()": the op is "<group>.name"
  const char* dtypes = "";     // the shared dtype variable's set, "bf16|f16|f32"
  const char* description = "";
  uint32_t traits = kDefaultTraits;  // KREG_TRAIT_*; mutates is added from the signature
  Implementation impls[kMaxImplsPerOp] = {};
};

// The low-level record: one implementation with every field spelled out (KREG_PLUGIN).
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

// One implementation with everything decided: what the tables and the metadata are made of.
struct FlatKernel {
  const char* group_prefix = nullptr;  // set: the op id is group_prefix "." name
  const char* name = "";               // the op's name, or its whole id (group_prefix null)
  size_t name_len = 0;
  const char* backend = "";
  const char* signature = "";
  const char* dtypes = "";
  const char* description = "";
  const char* source = "";
  Binding impl;
  uint32_t traits = 0;
  int32_t priority = 0;
  uint32_t flags = 0;
  uint32_t num_caps = 0;
  kreg_capability caps[kMaxCapsPerImpl] = {};
  const kreg_jit_desc* jit = nullptr;
};

constexpr size_t cstr_len(const char* s) {
  size_t n = 0;
  if (s == nullptr) return 0;
  while (s[n] != '\0') ++n;
  return n;
}

// Whether a signature writes an input: an alias annotation "Tensor(a!)".
constexpr bool writes_input(const char* sig) {
  for (size_t i = 0; sig[i] != '\0'; ++i) {
    if (sig[i] == '!' && sig[i + 1] == ')') return true;
  }
  return false;
}

// The name part of a signature, "rmsnorm(...)" -> "rmsnorm" (its length).
constexpr size_t signature_name_len(const char* sig) {
  size_t n = 0;
  while (sig[n] != '\0' && sig[n] != '(' && sig[n] != ' ') ++n;
  return n;
}

template <size_t N>
constexpr size_t count_impls(const Op (&ops)[N]) {
  size_t n = 0;
  for (const Op& op : ops) {
    for (const Implementation& i : op.impls) n += i.backend != nullptr ? 1 : 0;
  }
  return n;
}

template <const auto& Ops, const char* Group>
constexpr auto flatten_ops() {
  constexpr size_t n = count_impls(Ops);
  std::array<FlatKernel, n> out{};
  size_t k = 0;
  for (const Op& op : Ops) {
    for (const Implementation& i : op.impls) {
      if (i.backend == nullptr) continue;
      FlatKernel& f = out[k++];
      f.group_prefix = Group;
      f.name = op.signature;
      f.name_len = signature_name_len(op.signature);
      f.backend = i.backend;
      f.signature = op.signature;
      f.dtypes = op.dtypes;
      f.description = i.description != nullptr ? i.description : op.description;
      f.source = i.source;
      f.impl = i.impl;
      f.priority = i.priority;
      f.jit = i.jit;
      const bool is_cpu =
          i.backend[0] == 'c' && i.backend[1] == 'p' && i.backend[2] == 'u' && i.backend[3] == '\0';
      uint32_t traits =
          op.traits | (writes_input(op.signature) ? uint32_t{KREG_TRAIT_MUTATES} : 0u);
      if (is_cpu) traits &= ~uint32_t{KREG_TRAIT_GRAPH_SAFE};
      f.traits = (traits | i.traits_on) & ~i.traits_off;
      if (i.caps.size > 0) {
        for (uint32_t c = 0; c < i.caps.size && c < kMaxCapsPerImpl; ++c)
          f.caps[c] = i.caps.data[c];
        f.num_caps = i.caps.size < kMaxCapsPerImpl ? i.caps.size : kMaxCapsPerImpl;
      } else if (is_cpu) {
        f.caps[0] = kCpu[0];
        f.num_caps = 1;
      } else {
        const CapList build = caps_from_archs(KREG_PLUGIN_CUDA_ARCHS);
        CapList narrowed;
        for (uint32_t c = 0; c < build.size; ++c) {
          const int32_t lo = build.items[c].sm_min > i.sm_min ? build.items[c].sm_min : i.sm_min;
          const int32_t hi = build.items[c].sm_max < i.sm_max ? build.items[c].sm_max : i.sm_max;
          if (lo <= hi) narrowed.add(lo, hi);
        }
        for (uint32_t c = 0; c < narrowed.size; ++c) f.caps[c] = narrowed.items[c];
        f.num_caps = narrowed.size;
        f.flags |= KREG_KERNEL_CAPS_FROM_BUILD;
      }
    }
  }
  return out;
}

template <const auto& Defs>
constexpr auto flatten_defs() {
  constexpr size_t n = sizeof(Defs) / sizeof(Defs[0]);
  std::array<FlatKernel, n> out{};
  for (size_t k = 0; k < n; ++k) {
    const KernelDef& d = Defs[k];
    FlatKernel& f = out[k];
    f.name = d.op;
    f.name_len = cstr_len(d.op);
    f.backend = d.backend;
    f.signature = d.signature;
    f.dtypes = d.dtypes;
    f.description = d.description;
    f.source = d.source;
    f.impl = d.impl;
    f.traits = d.traits;
    f.priority = d.priority;
    for (uint32_t c = 0; c < d.caps.size && c < kMaxCapsPerImpl; ++c) f.caps[c] = d.caps.data[c];
    f.num_caps = d.caps.size < kMaxCapsPerImpl ? d.caps.size : kMaxCapsPerImpl;
  }
  return out;
}

// ---- The embedded metadata (format: kreg/plugin_metadata.hpp) ----

// Writes "key=value\0" pairs, or only counts them (Out null).
struct MetaWriter {
  char* out = nullptr;
  size_t n = 0;
  constexpr void put(char c) {
    if (out != nullptr) out[n] = c;
    ++n;
  }
  constexpr void text(const char* s, size_t len) {
    for (size_t i = 0; i < len; ++i) put(s[i] == '\0' ? '?' : s[i]);
  }
  constexpr void text(const char* s) { text(s, cstr_len(s)); }
  // For pointers known not to be null. Comparing the address of a template's static
  // member (FnTraits::kinds) with null is not a constant expression under GCC's
  // -fsanitize=undefined, so arg_kinds never goes through cstr_len's null check.
  constexpr void text_nonnull(const char* s) {
    for (size_t i = 0; s[i] != '\0'; ++i) put(s[i]);
  }
  constexpr void number(int64_t v) {
    if (v < 0) {
      put('-');
      v = -v;
    }
    char digits[24] = {};
    int k = 0;
    do {
      digits[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (k > 0) put(digits[--k]);
  }
  constexpr void key(const char* k) {
    text(k);
    put('=');
  }
  constexpr void end() { put('\0'); }
  constexpr void pair(const char* k, const char* v) {
    key(k);
    text(v);
    end();
  }
  constexpr void pair(const char* k, int64_t v) {
    key(k);
    number(v);
    end();
  }
};

struct BuildStrings {
  const char* group;
  const char* version;
  const char* compiler;
  int32_t cuda_version;
  const char* cuda_archs;
};

template <size_t N>
constexpr void write_metadata(MetaWriter& w, const std::array<FlatKernel, N>& ks,
                              const BuildStrings& b) {
  w.pair("kreg_metadata", 1);
  w.key("abi");
  w.number(KREG_ABI_MAJOR);
  w.put('.');
  w.number(KREG_ABI_MINOR);
  w.end();
  w.pair("group", b.group);
  w.pair("version", b.version);
  w.pair("compiler", b.compiler);
  w.pair("cuda_version", b.cuda_version);
  w.pair("cuda_archs", b.cuda_archs);
  w.pair("kernels", static_cast<int64_t>(N));
  for (size_t i = 0; i < N; ++i) {
    const FlatKernel& k = ks[i];
    w.pair("kernel", static_cast<int64_t>(i));
    w.key("op");
    if (k.group_prefix != nullptr) {
      w.text(k.group_prefix);
      w.put('.');
    }
    w.text(k.name, k.name_len);
    w.end();
    w.pair("backend", k.backend);
    w.pair("signature", k.signature);
    w.pair("dtypes", k.dtypes);
    w.key("arg_kinds");
    w.text_nonnull(k.impl.arg_kinds);
    w.end();
    w.pair("traits", k.traits);
    w.pair("priority", k.priority);
    w.pair("flags", k.flags);
    w.key("caps");
    for (uint32_t c = 0; c < k.num_caps; ++c) {
      if (c) w.put(',');
      w.number(k.caps[c].device_type);
      w.put(':');
      w.number(k.caps[c].sm_min);
      w.put('-');
      w.number(k.caps[c].sm_max);
    }
    w.end();
    w.pair("description", k.description);
    w.pair("source", k.source);
  }
  w.pair("end", static_cast<int64_t>(N));
}

template <size_t N>
constexpr size_t metadata_size(const std::array<FlatKernel, N>& ks, const BuildStrings& b) {
  MetaWriter w;
  write_metadata(w, ks, b);
  return w.n;
}

template <size_t Size, size_t N>
constexpr std::array<char, Size> make_metadata(const std::array<FlatKernel, N>& ks,
                                               const BuildStrings& b) {
  std::array<char, Size> out{};
  MetaWriter w{out.data()};
  write_metadata(w, ks, b);
  return out;
}

// Where kernel i's op id starts in the metadata: after the i-th "op=".
template <size_t Size>
constexpr size_t op_offset(const std::array<char, Size>& blob, size_t i) {
  size_t seen = 0;
  for (size_t p = 0; p + 3 < Size; ++p) {
    const bool at_pair = p == 0 || blob[p - 1] == '\0';
    if (at_pair && blob[p] == 'o' && blob[p + 1] == 'p' && blob[p + 2] == '=') {
      if (seen++ == i) return p + 3;
    }
  }
  return 0;
}

template <size_t N>
struct CapTables {
  kreg_capability caps[N == 0 ? 1 : N][kMaxCapsPerImpl] = {};
  kreg_capability_record records[N == 0 ? 1 : N][kMaxCapsPerImpl] = {};
};

template <size_t N>
constexpr CapTables<N> make_caps(const std::array<FlatKernel, N>& ks) {
  CapTables<N> t{};
  for (size_t i = 0; i < N; ++i) {
    for (uint32_t c = 0; c < ks[i].num_caps; ++c) {
      t.caps[i][c] = ks[i].caps[c];
      t.records[i][c] = {sizeof(kreg_capability_record), ks[i].caps[c].device_type,
                         ks[i].caps[c].sm_min, ks[i].caps[c].sm_max, 0};
    }
  }
  return t;
}

template <size_t N>
struct DescTable {
  kreg_kernel_desc items[N == 0 ? 1 : N] = {};
};

template <size_t N, size_t Size>
constexpr DescTable<N> make_descs(const std::array<FlatKernel, N>& ks, const CapTables<N>& caps,
                                  const std::array<char, Size>& blob) {
  DescTable<N> t{};
  for (size_t i = 0; i < N; ++i) {
    const FlatKernel& k = ks[i];
    const bool has = k.num_caps > 0;
    t.items[i] = kreg_kernel_desc{sizeof(kreg_kernel_desc),
                                  blob.data() + op_offset(blob, i),
                                  k.backend,
                                  has ? caps.caps[i] : nullptr,
                                  k.num_caps,
                                  k.traits,
                                  k.signature,
                                  k.dtypes,
                                  k.impl.arg_kinds,
                                  k.priority,
                                  0,
                                  k.description,
                                  k.source,
                                  k.impl.fn,
                                  has ? caps.records[i] : nullptr,
                                  k.num_caps,
                                  k.flags,
                                  k.jit};
  }
  return t;
}

}  // namespace detail

// The old entry point: KernelDef records -> kreg_kernel_desc (no metadata, no caps records).
template <size_t N>
constexpr auto to_descs(const KernelDef (&defs)[N]) {
  struct Table {
    kreg_kernel_desc items[N];
  };
  Table t{};
  for (size_t i = 0; i < N; ++i) {
    const KernelDef& d = defs[i];
    t.items[i] = kreg_kernel_desc{sizeof(kreg_kernel_desc),
                                  d.op,
                                  d.backend,
                                  d.caps.data,
                                  d.caps.size,
                                  d.traits,
                                  d.signature,
                                  d.dtypes,
                                  d.impl.arg_kinds,
                                  d.priority,
                                  0,
                                  d.description,
                                  d.source,
                                  d.impl.fn,
                                  nullptr,
                                  0,
                                  0,
                                  nullptr};
  }
  return t;
}

}  // namespace kreg

#if defined(__clang__)
#define KREG_COMPILER_STRING "Clang " __clang_version__
#elif defined(__GNUC__)
#define KREG_COMPILER_STRING "GNU " __VERSION__
#else
#define KREG_COMPILER_STRING "unknown"
#endif
#if defined(__has_attribute)
#if __has_attribute(retain)
#define KREG_DETAIL_RETAIN __attribute__((retain))
#endif
#endif
#ifndef KREG_DETAIL_RETAIN
#define KREG_DETAIL_RETAIN
#endif

// The tables, the metadata section and the exported entry, from kreg_flat_ (an
// std::array<kreg::detail::FlatKernel, N> defined just before).
#define KREG_DETAIL_TABLES(GROUP, VERSION, INIT, SHUTDOWN, RESOURCES, NUM_RESOURCES)             \
  constexpr ::kreg::detail::BuildStrings kreg_build_strings_ = {                                 \
      GROUP, VERSION, KREG_COMPILER_STRING, KREG_PLUGIN_CUDA_VERSION, KREG_PLUGIN_CUDA_ARCHS};   \
  __attribute__((section(KREG_METADATA_SECTION), used))                                          \
  KREG_DETAIL_RETAIN constexpr auto kreg_metadata_ =                                             \
      ::kreg::detail::make_metadata<::kreg::detail::metadata_size(                               \
          kreg_flat_, kreg_build_strings_)>(kreg_flat_, kreg_build_strings_);                    \
  constexpr auto kreg_caps_ = ::kreg::detail::make_caps(kreg_flat_);                             \
  constexpr auto kreg_plugin_table_ =                                                            \
      ::kreg::detail::make_descs(kreg_flat_, kreg_caps_, kreg_metadata_);                        \
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
      kreg_flat_.size() ? kreg_plugin_table_.items : nullptr,                                    \
      static_cast<uint32_t>(kreg_flat_.size()),                                                  \
      0,                                                                                         \
      INIT,                                                                                      \
      SHUTDOWN,                                                                                  \
      RESOURCES,                                                                                 \
      NUM_RESOURCES,                                                                             \
      0};                                                                                        \
  }                                                                                              \
  extern "C" __attribute__((visibility("default"))) const kreg_plugin_desc* kreg_plugin_entry(   \
      void) {                                                                                    \
    return &kreg_plugin_desc_;                                                                   \
  }

// Registers a group by op (kreg::Op records). The version comes from CMake
// (kreg_add_plugin(<group> VERSION x.y.z), i.e. KREG_PLUGIN_VERSION). INIT and SHUTDOWN
// are `int32_t(kreg_error*)` and `void()` functions or nullptr.
#define KREG_GROUP_WITH_HOOKS(GROUP, OPS, INIT, SHUTDOWN)                           \
  namespace {                                                                       \
  static_assert(KREG_PLUGIN_VERSION[0] != '\0',                                     \
                "kreg: the plugin version comes from CMake: "                       \
                "kreg_add_plugin(<group> VERSION x.y.z ...)");                      \
  constexpr char kreg_group_name_[] = GROUP;                                        \
  constexpr auto kreg_flat_ = ::kreg::detail::flatten_ops<OPS, kreg_group_name_>(); \
  KREG_DETAIL_TABLES(GROUP, KREG_PLUGIN_VERSION, INIT, SHUTDOWN, nullptr, 0)

#define KREG_GROUP(GROUP, OPS) KREG_GROUP_WITH_HOOKS(GROUP, OPS, nullptr, nullptr)

// A group that also declares resource types (kreg::ResourceType records, ABI 1.4).
#define KREG_GROUP_WITH_RESOURCES(GROUP, OPS, RESOURCES, INIT, SHUTDOWN)                     \
  namespace {                                                                                \
  static_assert(KREG_PLUGIN_VERSION[0] != '\0',                                              \
                "kreg: the plugin version comes from CMake: "                                \
                "kreg_add_plugin(<group> VERSION x.y.z ...)");                               \
  constexpr char kreg_group_name_[] = GROUP;                                                 \
  constexpr auto kreg_flat_ = ::kreg::detail::flatten_ops<OPS, kreg_group_name_>();          \
  constexpr auto kreg_resource_table_ = ::kreg::detail::make_resource_descs(RESOURCES);      \
  KREG_DETAIL_TABLES(GROUP, KREG_PLUGIN_VERSION, INIT, SHUTDOWN, kreg_resource_table_.items, \
                     static_cast<uint32_t>(std::size(RESOURCES)))

// The low-level form: one KernelDef per implementation, the version given here.
#define KREG_PLUGIN_WITH_HOOKS(GROUP, VERSION, KERNELS, INIT, SHUTDOWN) \
  namespace {                                                           \
  constexpr auto kreg_flat_ = ::kreg::detail::flatten_defs<KERNELS>();  \
  KREG_DETAIL_TABLES(GROUP, VERSION, INIT, SHUTDOWN, nullptr, 0)

#define KREG_PLUGIN(GROUP, VERSION, KERNELS) \
  KREG_PLUGIN_WITH_HOOKS(GROUP, VERSION, KERNELS, nullptr, nullptr)
