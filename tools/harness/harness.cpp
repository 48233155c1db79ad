#include "harness.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "example_values.hpp"
#include "kreg/checked_math.hpp"
#include "kreg/device/fp8_e4m3.hpp"
#include "kreg/numeric.hpp"
#include "kreg/parse_number.hpp"
#include "kreg/text.hpp"
#include "memory.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace kreg::harness {

namespace {

#if defined(KREG_HAVE_CUDA)
Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return Status(KREG_INTERNAL, std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// Byte sums over several tensors: saturate rather than wrap, so "too much" stays too much.
uint64_t sat_add(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }
uint64_t sat_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

bool is_host(DLDevice d) { return d.device_type == kDLCPU || d.device_type == kDLCUDAHost; }

// Below this a buffer is not worth a free-memory query (a file read on the host).
constexpr uint64_t kCheckFreeAbove = uint64_t{64} << 20;

[[maybe_unused]] Status no_cuda() {
  return Status(KREG_UNAVAILABLE, "this kreg was built without CUDA; only CPU tensors work");
}

// FP8 counts as float: random inputs are real values and a poisoned output is NaN.
bool is_float(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kF64 ||
         d == DType::kF8E4M3 || d == DType::kF8E5M2;
}

// E5M2 is the upper byte of an IEEE half: decoding is exact; encoding rounds the half's
// low byte to nearest even (the harness encodes inputs and poison, never results, so the
// float -> half -> E5M2 double rounding only picks one of two neighbouring inputs).
float e5m2_to_float(uint8_t b) { return to_float(f16{static_cast<uint16_t>(b << 8)}); }

uint8_t float_to_e5m2(float v) {
  const uint16_t h = to_f16(v).bits;
  if ((h & 0x7c00u) == 0x7c00u) {  // infinity stays, NaN stays NaN (a quiet pattern)
    return static_cast<uint8_t>((h >> 8) | ((h & 0x03ffu) != 0 ? 0x02u : 0u));
  }
  const uint32_t rounded = h + 0x7fu + ((h >> 8) & 1u);  // may carry into infinity: right
  return static_cast<uint8_t>(rounded >> 8);
}

double read_element(const void* base, DType d, int64_t i) {
  switch (d) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF64:
      return static_cast<const double*>(base)[i];
    case DType::kF16:
      return to_float(static_cast<const f16*>(base)[i]);
    case DType::kBF16:
      return to_float(static_cast<const bf16*>(base)[i]);
    case DType::kI8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kI16:
      return static_cast<const int16_t*>(base)[i];
    case DType::kI32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::kU8:
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i];
    case DType::kF8E4M3:
      return device::e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2:
      return e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

// The doubles an integer dtype holds exactly-enough to convert without undefined
// behaviour: [min, max] of the type (for i64 the largest double below 2^63).
std::optional<std::pair<double, double>> int_range(DType d) {
  switch (d) {
    case DType::kI8:
      return std::pair{-128.0, 127.0};
    case DType::kI16:
      return std::pair{-32768.0, 32767.0};
    case DType::kI32:
      return std::pair{-2147483648.0, 2147483647.0};
    case DType::kI64:
      return std::pair{-0x1p63, 0x1.fffffffffffffp62};
    case DType::kU8:
    case DType::kBool:
      return std::pair{0.0, 255.0};
    default:
      return std::nullopt;
  }
}

void write_element(void* base, DType d, int64_t i, double v) {
  switch (d) {
    case DType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::kF16:
      static_cast<f16*>(base)[i] = to_f16(static_cast<float>(v));
      break;
    case DType::kBF16:
      static_cast<bf16*>(base)[i] = to_bf16(static_cast<float>(v));
      break;
    case DType::kI8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      break;
    case DType::kI16:
      static_cast<int16_t*>(base)[i] = static_cast<int16_t>(v);
      break;
    case DType::kI32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DType::kI64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(base)[i] = device::float_to_e4m3(static_cast<float>(v));
      break;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(base)[i] = float_to_e5m2(static_cast<float>(v));
      break;
    default:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      break;
  }
}

}  // namespace

bool gpu_available() {
#if defined(KREG_HAVE_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

std::string gpu_name() {
#if defined(KREG_HAVE_CUDA)
  cudaDeviceProp prop{};
  if (gpu_available() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    return std::string(prop.name) + " (sm" + std::to_string(prop.major * 10 + prop.minor) + ")";
  }
#endif
  return "none";
}

// ---- Buffer ----

Result<Buffer> Buffer::make(DLDevice device, DType dtype, std::vector<int64_t> shape) {
  // Every byte count is checked before anything is allocated: a negative extent or a
  // size past int64 is an argument error, a size past the free memory a resource error.
  if (shape.size() > static_cast<size_t>(detail::kMaxCallNdim)) {
    return Status(KREG_INVALID_ARGUMENT, "buffer: " + std::to_string(shape.size()) +
                                             " dimensions, at most " +
                                             std::to_string(detail::kMaxCallNdim));
  }
  int64_t elements = 0;
  const int bad = check_extents(shape.data(), static_cast<int>(shape.size()),
                                static_cast<int64_t>(dtype_size(dtype)), &elements);
  if (bad >= 0) {
    return Status(KREG_INVALID_ARGUMENT, "buffer of shape " + shape_text(shape) + ": dim " +
                                             std::to_string(bad) + " is negative");
  }
  if (bad == kShapeTooLarge) {
    return Status(KREG_INVALID_ARGUMENT, "buffer of shape " + shape_text(shape) + " " +
                                             std::string(dtype_name(dtype)) +
                                             ": its size in bytes overflows int64");
  }
  const uint64_t want = static_cast<uint64_t>(elements) * dtype_size(dtype);
  if (want > kCheckFreeAbove) {
    if (Status st = check_fits(
            device, want,
            "a buffer of shape " + shape_text(shape) + " " + std::string(dtype_name(dtype)));
        !st.ok()) {
      return st;
    }
  }
  Buffer b;
  b.dtype_ = dtype;
  b.shape_ = std::move(shape);
  b.t_.device = device;
  b.t_.dtype = to_dl(dtype);
  b.t_.ndim = static_cast<int32_t>(b.shape_.size());
  b.t_.shape = b.shape_.data();
  b.t_.strides = nullptr;
  b.t_.byte_offset = 0;
  const size_t n = std::max<size_t>(b.bytes(), 1);
  if (device.device_type == kDLCPU) {
    try {
      b.t_.data = ::operator new(n, std::align_val_t(64));
    } catch (const std::bad_alloc&) {  // the free figure is a snapshot; another may have won
      return Status(KREG_RESOURCE_EXHAUSTED, "buffer of shape " + shape_text(b.shape_) + ": " +
                                                 byte_text(n) + " of host memory not available");
    }
  } else if (device.device_type == kDLCUDA) {
#if defined(KREG_HAVE_CUDA)
    // On the tensor's device, whatever device the calling thread has current.
    int current = 0;
    if (Status st = cuda_status(cudaGetDevice(&current), "cudaGetDevice"); !st.ok()) return st;
    if (current != device.device_id) {
      if (Status st = cuda_status(cudaSetDevice(device.device_id), "cudaSetDevice"); !st.ok()) {
        return st;
      }
    }
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, n);
    if (current != device.device_id) cudaSetDevice(current);
    if (Status st = cuda_status(err, "cudaMalloc"); !st.ok()) return st;
    b.t_.data = p;
#else
    return no_cuda();
#endif
  } else if (device.device_type == kDLCUDAHost) {
#if defined(KREG_HAVE_CUDA)
    void* p = nullptr;
    if (Status st = cuda_status(cudaHostAlloc(&p, n, cudaHostAllocDefault), "cudaHostAlloc");
        !st.ok()) {
      return st;
    }
    b.t_.data = p;
#else
    return no_cuda();
#endif
  } else {
    return Status(KREG_UNIMPLEMENTED, "harness buffers live on cpu, cuda_host or cuda only");
  }
  return b;
}

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    t_ = o.t_;
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    t_.shape = shape_.data();
    o.t_.data = nullptr;
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (t_.data == nullptr) return;
  if (t_.device.device_type == kDLCPU) {
    ::operator delete(t_.data, std::align_val_t(64));
  } else {
#if defined(KREG_HAVE_CUDA)
    if (t_.device.device_type == kDLCUDAHost) {
      cudaFreeHost(t_.data);
    } else {
      cudaFree(t_.data);
    }
#endif
  }
  t_.data = nullptr;
}

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

size_t Buffer::bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

Result<std::vector<double>> Buffer::to_doubles() const {
  std::vector<char> host(bytes());
  const void* src = t_.data;
  if (on_gpu()) {
#if defined(KREG_HAVE_CUDA)
    if (Status st = cuda_status(cudaMemcpy(host.data(), t_.data, bytes(), cudaMemcpyDeviceToHost),
                                "cudaMemcpy to host");
        !st.ok()) {
      return st;
    }
    src = host.data();
#else
    return no_cuda();
#endif
  }
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = read_element(src, dtype_, i);
  return out;
}

Status Buffer::from_doubles(const std::vector<double>& values) {
  if (static_cast<int64_t>(values.size()) != numel()) {
    return Status(KREG_INVALID_ARGUMENT, "from_doubles: size mismatch");
  }
  // An integer element outside its type (or NaN) would be an undefined conversion.
  if (const auto range = int_range(dtype_)) {
    for (size_t i = 0; i < values.size(); ++i) {
      const double v = values[i];
      if (!(v >= range->first && v <= range->second)) {
        return Status(KREG_INVALID_ARGUMENT, "from_doubles: element " + std::to_string(i) + " = " +
                                                 std::to_string(v) + " does not fit " +
                                                 std::string(dtype_name(dtype_)));
      }
    }
  }
  std::vector<char> host(on_gpu() ? bytes() : 0);  // a staging copy for device buffers only
  void* dst = on_gpu() ? static_cast<void*>(host.data()) : t_.data;
  for (int64_t i = 0; i < numel(); ++i)
    write_element(dst, dtype_, i, values[static_cast<size_t>(i)]);
  if (on_gpu()) {
#if defined(KREG_HAVE_CUDA)
    return cuda_status(cudaMemcpy(t_.data, host.data(), bytes(), cudaMemcpyHostToDevice),
                       "cudaMemcpy to device");
#else
    return no_cuda();
#endif
  }
  return OkStatus();
}

Status Buffer::copy_from(const Buffer& o) {
  if (o.bytes() != bytes() || o.dtype_ != dtype_) {
    return Status(KREG_INVALID_ARGUMENT, "copy_from: dtype or size mismatch");
  }
  if (!on_gpu() && !o.on_gpu()) {
    // An empty buffer may have no storage: memcpy's pointers must not be null.
    if (bytes() > 0) std::memcpy(t_.data, o.t_.data, bytes());
    return OkStatus();
  }
#if defined(KREG_HAVE_CUDA)
  return cuda_status(cudaMemcpy(t_.data, o.t_.data, bytes(), cudaMemcpyDefault), "cudaMemcpy");
#else
  return no_cuda();
#endif
}

Status Buffer::fill_random(std::mt19937_64& rng) {
  // A splitmix64 stream seeded from rng, written straight into the typed buffer: large
  // benchmark inputs (gigabytes) must not go through a vector of doubles.
  uint64_t state = rng();
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<char> host(bytes());
  const int64_t n = numel();
  if (is_float(dtype_)) {
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t r = next();
      const double mag = 0.05 + 1.95 * static_cast<double>(r >> 11) * 0x1.0p-53;
      write_element(host.data(), dtype_, i, (r & 1) ? mag : -mag);
    }
  } else {
    for (int64_t i = 0; i < n; ++i)
      write_element(host.data(), dtype_, i, static_cast<double>(next() & 15));
  }
  if (!on_gpu()) {
    if (!host.empty()) std::memcpy(t_.data, host.data(), host.size());
    return OkStatus();
  }
#if defined(KREG_HAVE_CUDA)
  return cuda_status(cudaMemcpy(t_.data, host.data(), host.size(), cudaMemcpyHostToDevice),
                     "cudaMemcpy to device");
#else
  return no_cuda();
#endif
}

Status Buffer::poison() {
  // Written element by element into one host staging copy (no vector of doubles).
  const double v = is_float(dtype_) ? std::numeric_limits<double>::quiet_NaN() : 127.0;
  std::vector<char> staging(on_gpu() ? bytes() : 0);
  void* dst = on_gpu() ? static_cast<void*>(staging.data()) : t_.data;
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) write_element(dst, dtype_, i, v);
  if (!on_gpu()) return OkStatus();
#if defined(KREG_HAVE_CUDA)
  return cuda_status(cudaMemcpy(t_.data, staging.data(), bytes(), cudaMemcpyHostToDevice),
                     "cudaMemcpy to device");
#else
  return no_cuda();
#endif
}

// ---- Example arguments ----

Result<SymbolMap> parse_shape_spec(const std::string& text, const std::string& flag) {
  SymbolMap out;
  if (text.empty()) {
    return Status(KREG_INVALID_ARGUMENT,
                  flag + ": empty (expected NAME=SIZE,..., e.g. T=64,H=4096)");
  }
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    bool ident = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char c : name) ident = ident && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (eq == std::string::npos || !ident) {
      return Status(KREG_INVALID_ARGUMENT,
                    flag + ": '" + excerpt(item, 40) + "' is not NAME=SIZE (e.g. T=64,H=4096)");
    }
    auto n = parse_int(item.substr(eq + 1), flag + " " + excerpt(name, 40), 0);
    if (!n) return n.status();
    if (!out.emplace(name, *n).second) {
      return Status(KREG_INVALID_ARGUMENT,
                    flag + ": dimension '" + excerpt(name, 40) + "' is given twice");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

namespace {

Status needs_every_symbol(const KernelSpec& spec, const SymbolMap& symbols) {
  const Signature& sig = spec.signature;
  for (const std::string& s : sig.symbols) {
    if (!symbols.count(s)) {
      std::string example;
      for (const std::string& t : sig.symbols) example += (example.empty() ? "" : ",") + t + "=N";
      return Status(KREG_INVALID_ARGUMENT, spec.op + ": --shape needs a size for '" + s +
                                               "' (signature " + sig.text + "; e.g. --shape " +
                                               example + ")");
    }
  }
  return OkStatus();
}

}  // namespace

Status check_shape_names(const KernelSpec& spec, const SymbolMap& symbols) {
  const Signature& sig = spec.signature;
  std::string all;
  for (const std::string& t : sig.symbols) all += (all.empty() ? "" : ", ") + t;
  for (const auto& [name, value] : symbols) {
    if (std::find(sig.symbols.begin(), sig.symbols.end(), name) == sig.symbols.end()) {
      return Status(KREG_INVALID_ARGUMENT, "--shape: '" + name + "' is not a dimension of " +
                                               spec.op +
                                               " (its dimensions: " + (all.empty() ? "none" : all) +
                                               "; signature " + sig.text + ")");
    }
  }
  return needs_every_symbol(spec, symbols);
}

bool left_absent(const Param& p) { return p.is_tensor() && p.optional && !p.ranked; }

std::vector<std::string> absent_tensors(const KernelSpec& spec) {
  std::vector<std::string> names;
  for (const Param& p : spec.signature.params) {
    if (left_absent(p)) names.push_back(p.name);
  }
  return names;
}

Buffer* ExampleArgs::buffer(size_t n) {
  return const_cast<Buffer*>(static_cast<const ExampleArgs*>(this)->buffer(n));
}

const Buffer* ExampleArgs::buffer(size_t n) const {
  if (n >= tensors.size() || tensors[n] == nullptr) return nullptr;
  // Buffers hold the present tensors in order: this one's index is how many come before.
  const size_t b = static_cast<size_t>(
      std::count_if(tensors.begin(), tensors.begin() + static_cast<std::ptrdiff_t>(n),
                    [](const DLTensor* t) { return t != nullptr; }));
  return b < buffers.size() ? &buffers[b] : nullptr;
}

namespace {

// One tensor of an example, sized and checked before anything is allocated; an absent one
// (left_absent) takes no memory.
struct PlannedTensor {
  const Param* param = nullptr;
  bool absent = false;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  int64_t numel = 0;
  int64_t bytes = 0;
};

Result<std::vector<PlannedTensor>> plan_example(const KernelSpec& spec, const SymbolMap& symbols,
                                                DType dtype) {
  const Signature& sig = spec.signature;
  if (Status st = needs_every_symbol(spec, symbols); !st.ok()) return st;
  std::vector<PlannedTensor> out;
  for (const Param& p : sig.params) {
    if (!p.is_tensor()) continue;
    PlannedTensor t;
    t.param = &p;
    if (left_absent(p)) {  // nothing to size it from: passed as null, as a caller may
      t.absent = true;
      out.push_back(std::move(t));
      continue;
    }
    if (!p.ranked) {
      return Status(KREG_INVALID_ARGUMENT,
                    spec.op + ": tensor '" + p.name + "' has no named shape to build it from");
    }
    // "tensor 'x' [T,2*D] with T=4, D=8": what a message about this tensor starts with.
    auto where = [&] {
      std::string w = spec.op + ": tensor '" + p.name + "' " + sig.shape_name(p);
      std::string with;
      for (const DimExpr& d : p.dims) {
        if (d.symbol < 0) continue;
        const std::string& name = sig.symbols[static_cast<size_t>(d.symbol)];
        const std::string item = name + "=" + std::to_string(symbols.at(name));
        if (with.find(item) == std::string::npos) with += (with.empty() ? "" : ", ") + item;
      }
      return with.empty() ? w : w + " with " + with;
    };
    for (const DimExpr& d : p.dims) {
      int64_t extent = d.literal;
      if (d.symbol >= 0) {
        const int64_t v = symbols.at(sig.symbols[static_cast<size_t>(d.symbol)]);
        if (!checked_mul(d.coef, v, &extent)) {
          return Status(KREG_INVALID_ARGUMENT, where() + ": dimension " + sig.dim_name(d) + " = " +
                                                   std::to_string(d.coef) + " * " +
                                                   std::to_string(v) + " overflows int64");
        }
      }
      t.shape.push_back(extent);
    }
    t.dtype = dtype;
    if (p.dtypes != 0) {  // an explicit dtype set: its first member
      for (int i = 0; i < static_cast<int>(DType::kCount); ++i) {
        if (p.dtypes & mask_of(static_cast<DType>(i))) {
          t.dtype = static_cast<DType>(i);
          break;
        }
      }
    }
    const int64_t item = static_cast<int64_t>(dtype_size(t.dtype));
    const int bad = check_extents(t.shape.data(), static_cast<int>(t.shape.size()), item, &t.numel);
    if (bad >= 0) {
      return Status(KREG_INVALID_ARGUMENT,
                    where() + ": dim " + std::to_string(bad) + " is negative");
    }
    if (bad == kShapeTooLarge) {
      // A shape with a zero extent holds nothing, but the core refuses it all the same when
      // its other extents overflow (checked_math.hpp: a kernel's partial products must fit).
      const bool empty = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
      return Status(KREG_INVALID_ARGUMENT,
                    where() + ": shape " + shape_text(t.shape) + " of " +
                        std::string(dtype_name(t.dtype)) + " (" + std::to_string(item) +
                        " bytes each) " +
                        (empty ? "holds no elements, but its nonzero extents come to more than "
                                 "9223372036854775807 bytes (kreg refuses such a shape: a "
                                 "kernel's partial products would overflow)"
                               : "is more than 9223372036854775807 bytes"));
    }
    t.bytes = t.numel * item;
    out.push_back(std::move(t));
  }
  return out;
}

// "x [T=99999999999,H=8] 1.6 TB, out ..." for the message when an example does not fit.
std::string planned_text(const KernelSpec& spec, const std::vector<PlannedTensor>& plan) {
  std::string s = spec.op + "'s example tensors (";
  bool first = true;
  for (const PlannedTensor& t : plan) {
    if (t.absent) continue;
    s += (first ? "" : ", ") + t.param->name + " " + shape_text(t.shape) + " " +
         std::string(dtype_name(t.dtype));
    first = false;
  }
  return s + ")";
}

// What an example needs on `device` and, for a device example, in host staging copies.
Status plan_fits(const KernelSpec& spec, const std::vector<PlannedTensor>& plan, DLDevice device) {
  uint64_t total = 0, largest = 0;
  for (const PlannedTensor& t : plan) {
    total = sat_add(total, static_cast<uint64_t>(t.bytes));
    largest = std::max(largest, static_cast<uint64_t>(t.bytes));
  }
  // Filling a tensor stages one copy of it on the host.
  if (is_host(device)) return check_fits(device, sat_add(total, largest), planned_text(spec, plan));
  if (Status st = check_fits(device, total, planned_text(spec, plan)); !st.ok()) return st;
  return check_fits(DLDevice{kDLCPU, 0}, largest, planned_text(spec, plan) + " staged on the host");
}

}  // namespace

Status check_example_fits(const KernelSpec& spec, const SymbolMap& symbols, DType dtype,
                          DLDevice device, bool with_reference) {
  auto plan = plan_example(spec, symbols, dtype);
  if (!plan) return plan.status();
  if (!with_reference) return plan_fits(spec, *plan, device);
  // Everything check_against_reference holds at once: the host example, a staging copy,
  // the device copy, and per written tensor two vectors of doubles (implementation and
  // reference) plus the copy they are read from.
  uint64_t total = 0, largest = 0, compare = 0;
  for (const PlannedTensor& t : *plan) {
    total = sat_add(total, static_cast<uint64_t>(t.bytes));
    largest = std::max(largest, static_cast<uint64_t>(t.bytes));
    if (t.param->written()) {
      compare =
          sat_add(compare, sat_add(sat_mul(2 * sizeof(double), static_cast<uint64_t>(t.numel)),
                                   static_cast<uint64_t>(t.bytes)));
    }
  }
  uint64_t host_need = sat_add(sat_add(total, largest), compare);
  if (is_host(device)) host_need = sat_add(host_need, total);
  if (Status st = check_fits(DLDevice{kDLCPU, 0}, host_need,
                             planned_text(spec, *plan) + ", the reference and the comparison");
      !st.ok()) {
    return st;
  }
  if (!is_host(device)) return check_fits(device, total, planned_text(spec, *plan));
  return OkStatus();
}

namespace {

// make_example, with the call's attributes for the table of example_values.hpp.
Result<ExampleArgs> make_example_for(const KernelSpec& spec, const SymbolMap& symbols,
                                     std::span<const kreg_attr> attrs, DType dtype, DLDevice device,
                                     uint64_t seed) {
  auto plan = plan_example(spec, symbols, dtype);
  if (!plan) return plan.status();
  if (Status st = plan_fits(spec, *plan, device); !st.ok()) return st;
  std::mt19937_64 rng(seed);
  ExampleArgs args;
  std::vector<bool> present;
  for (PlannedTensor& t : *plan) {
    present.push_back(!t.absent);
    if (t.absent) continue;
    auto buf = Buffer::make(device, t.dtype, std::move(t.shape));
    if (!buf) return buf.status();
    Status st = t.param->read() ? buf->fill_random(rng) : buf->poison();
    if (!st.ok()) return st;
    args.buffers.push_back(std::move(buf).value());
  }
  // The views once every buffer is in place (a growing vector moves its Buffers).
  size_t b = 0;
  for (bool here : present) args.tensors.push_back(here ? args.buffers[b++].tensor() : nullptr);
  if (Status st = apply_example_values(spec, symbols, attrs, args, seed); !st.ok()) return st;
  return args;
}

}  // namespace

Result<ExampleArgs> make_example(const KernelSpec& spec, const SymbolMap& symbols, DType dtype,
                                 DLDevice device, uint64_t seed) {
  return make_example_for(spec, symbols, {}, dtype, device, seed);
}

Result<ExampleArgs> copy_example(const ExampleArgs& src, DLDevice device) {
  ExampleArgs out;
  for (const Buffer& b : src.buffers) {
    auto nb = Buffer::make(device, b.dtype(), b.shape());
    if (!nb) return nb.status();
    if (Status st = nb->copy_from(b); !st.ok()) return st;
    out.buffers.push_back(std::move(nb).value());
  }
  // src's absent tensors stay absent; the others are its buffers in order.
  size_t b = 0;
  for (const DLTensor* t : src.tensors) {
    out.tensors.push_back(t != nullptr && b < out.buffers.size() ? out.buffers[b++].tensor()
                                                                 : nullptr);
  }
  return out;
}

size_t bytes_moved(const KernelSpec& spec, const ExampleArgs& args) {
  size_t total = 0;
  size_t i = 0;
  for (const Param& p : spec.signature.params) {
    if (!p.is_tensor()) continue;
    const Buffer* buf = args.buffer(i++);
    if (buf == nullptr) continue;  // absent: nothing moved
    if (p.read()) total += buf->bytes();
    if (p.written()) total += buf->bytes();
  }
  return total;
}

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {1e-2, 1.6e-2};
    case DType::kF16:
      return {1e-3, 2e-3};
    case DType::kF64:
      return {1e-10, 1e-10};
    case DType::kF32:
      return {1e-5, 1e-4};
    default:
      return {0, 0};
  }
}

Comparison compare_values(const std::string& name, const std::vector<double>& got,
                          const std::vector<double>& want, Tolerance tol) {
  Comparison c;
  c.tensor = name;
  c.count = want.size();
  if (got.size() != want.size()) {
    c.mismatches = std::max(got.size(), want.size());
    return c;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i], b = want[i];
    // Equal values match, infinities included (-inf is a result: a masked logit), where
    // inf - inf would be NaN.
    if (a == b) continue;
    const double diff = std::fabs(a - b);
    // Otherwise an infinity matches nothing: rtol * inf would accept any finite value.
    const bool finite = std::isfinite(a) && std::isfinite(b);
    if (!finite || !(diff <= tol.atol + tol.rtol * std::fabs(b))) ++c.mismatches;  // NaN fails
    if (std::isnan(diff)) {
      c.max_abs = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (!std::isnan(c.max_abs)) c.max_abs = std::max(c.max_abs, diff);
    if (finite && std::fabs(b) > 1e-3) c.max_rel = std::max(c.max_rel, diff / std::fabs(b));
  }
  return c;
}

Result<std::vector<Comparison>> check_against_reference(Registry& registry,
                                                        const KernelHandle& handle,
                                                        const SymbolMap& symbols, DType dtype,
                                                        const AttrList& attrs, uint64_t seed) {
  const KernelSpec& spec = handle.spec();
  const DLDevice device{static_cast<DLDeviceType>(spec.device_type()), 0};
  if (Status st = check_example_fits(spec, symbols, dtype, device, true); !st.ok()) return st;
  auto host = make_example_for(spec, symbols, attrs.view(), dtype, DLDevice{kDLCPU, 0}, seed);
  if (!host) return host.status();
  auto dev = copy_example(*host, device);
  if (!dev) return dev.status();
  if (Status st = handle.call(dev->tensors, attrs.view()); !st.ok()) return st;
  if (Status st = device_synchronize(); !st.ok()) {
    return Status(st.code(), spec.op + " (" + spec.backend + "): " + st.message());
  }
  auto ref = registry.resolve(spec.op, Target{DLDevice{kDLCPU, 0}, dtype},
                              ResolveOptions{std::string("cpu")});
  if (!ref) return ref.status();
  if (Status st = ref->call(host->tensors, attrs.view()); !st.ok()) return st;
  std::vector<Comparison> out;
  size_t i = 0;
  for (const Param& p : spec.signature.params) {
    if (!p.is_tensor()) continue;
    const Buffer* got_buf = dev->buffer(i);
    const Buffer* want_buf = host->buffer(i);
    ++i;
    if (!p.written() || want_buf == nullptr || got_buf == nullptr) continue;  // absent: unwritten
    auto got = got_buf->to_doubles();
    if (!got) return got.status();
    auto want = want_buf->to_doubles();
    if (!want) return want.status();
    out.push_back(compare_values(p.name, *got, *want, tolerance_for(want_buf->dtype())));
  }
  return out;
}

Status device_synchronize() {
#if defined(KREG_HAVE_CUDA)
  if (!gpu_available()) return OkStatus();
  return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  return OkStatus();
#endif
}

// ---- GPU timing ----

#if defined(KREG_HAVE_CUDA)
namespace {

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  float ms() const {
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    return t;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A stream of the timing's own, destroyed on every path out.
struct OwnedStream {
  cudaStream_t s = nullptr;
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};

// What a capture makes, destroyed on every path out.
struct OwnedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  OwnedGraph() = default;
  OwnedGraph(const OwnedGraph&) = delete;
  OwnedGraph& operator=(const OwnedGraph&) = delete;
  ~OwnedGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

}  // namespace
#endif

Result<ReplayTiming> time_graph_replays(void* stream_ptr, int calls, int reps,
                                        const std::function<Status(int)>& call) {
  if (calls < 1 || reps < 1) {
    return Status(KREG_INVALID_ARGUMENT, "graph timing: calls (" + std::to_string(calls) +
                                             ") and reps (" + std::to_string(reps) +
                                             ") must be positive");
  }
#if defined(KREG_HAVE_CUDA)
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  OwnedGraph g;
  if (Status st = cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "graph capture");
      !st.ok()) {
    return st;
  }
  Status failed = OkStatus();
  for (int i = 0; i < calls && failed.ok(); ++i) failed = call(i);
  // The capture begun here always ends here, so that the stream is usable again.
  const cudaError_t ended = cudaStreamEndCapture(stream, &g.graph);
  if (!failed.ok()) {
    cudaGetLastError();  // the invalidated capture's error belongs to the failed call
    return failed;
  }
  if (Status st = cuda_status(ended, "graph capture"); !st.ok()) return st;
  if (Status st = cuda_status(cudaGraphInstantiate(&g.exec, g.graph, 0), "graph instantiate");
      !st.ok()) {
    return st;
  }
  Events ev;
  if (Status st = cuda_status(cudaGraphLaunch(g.exec, stream), "graph replay"); !st.ok()) return st;
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(ev.start, stream);
    cudaGraphLaunch(g.exec, stream);
    cudaEventRecord(ev.stop, stream);
    if (Status st = cuda_status(cudaEventSynchronize(ev.stop), "graph replay"); !st.ok()) return st;
    samples.push_back(ev.ms() * 1000.0 / calls);
  }
  ReplayTiming t;
  t.median_us = median(samples);
  t.min_us = *std::min_element(samples.begin(), samples.end());
  return t;
#else
  (void)stream_ptr, (void)call;
  return no_cuda();
#endif
}

Result<Timing> time_on_gpu(const KernelHandle& handle, const SymbolMap& symbols, DType dtype,
                           const AttrList& attrs, int reps, uint64_t seed, uint64_t launch_flags,
                           const Producer* before) {
#if defined(KREG_HAVE_CUDA)
  const KernelSpec& spec = handle.spec();
  for (const KernelSpec* s : {&spec, before != nullptr ? &before->handle->spec() : nullptr}) {
    if (s != nullptr && s->device_type() != kDLCUDA) {
      return Status(KREG_INVALID_ARGUMENT, "bench times CUDA implementations; " + s->op +
                                               " resolved to backend " + s->backend);
    }
  }
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  auto first = make_example_for(spec, symbols, attrs.view(), dtype, DLDevice{kDLCUDA, 0}, seed);
  if (!first) return first.status();
  Timing t;
  t.bytes = bytes_moved(spec, *first);
  const size_t per_set = std::max<size_t>(t.bytes, 1);
  // Enough sets that the total exceeds twice the L2, so each call misses in cache.
  int sets = static_cast<int>(std::clamp<size_t>(2 * static_cast<size_t>(l2) / per_set + 1, 2, 64));
  // No more sets than fit in what the device has free (less a margin for the kernel).
  if (auto avail = available_memory(DLDevice{kDLCUDA, 0}); avail.ok()) {
    const uint64_t fit = avail->bytes / 10 * 9 / std::max<uint64_t>(per_set, 1);
    sets = static_cast<int>(std::clamp<uint64_t>(fit, 1, static_cast<uint64_t>(sets)));
  }
  std::vector<ExampleArgs> all;
  all.push_back(std::move(first).value());
  for (int s = 1; s < sets; ++s) {  // copies of set 0: distinct memory, same values
    auto a = copy_example(all.front(), DLDevice{kDLCUDA, 0});
    if (!a) return a.status();
    all.push_back(std::move(a).value());
  }
  t.buffer_sets = sets;
  // The producer's sets, one per op set (copies: distinct memory, same values).
  std::vector<ExampleArgs> pre;
  if (before != nullptr) {
    auto p0 = make_example_for(before->handle->spec(), before->symbols, before->attrs->view(),
                               before->dtype, DLDevice{kDLCUDA, 0}, seed + 1);
    if (!p0) return p0.status();
    pre.push_back(std::move(p0).value());
    for (int s = 1; s < sets; ++s) {
      auto a = copy_example(pre.front(), DLDevice{kDLCUDA, 0});
      if (!a) return a.status();
      pre.push_back(std::move(a).value());
    }
  }
  OwnedStream owned;
  if (Status st = cuda_status(cudaStreamCreateWithFlags(&owned.s, cudaStreamNonBlocking), "stream");
      !st.ok()) {
    return st;
  }
  cudaStream_t stream = owned.s;
  auto run = [&](int i) {
    if (before != nullptr) {
      if (Status st = before->handle->call(
              pre[static_cast<size_t>(i % sets)].tensors, before->attrs->view(),
              CallOptions{stream, nullptr, launch_flags & KREG_LAUNCH_PDL});
          !st.ok()) {
        return st;
      }
    }
    return handle.call(all[static_cast<size_t>(i % sets)].tensors, attrs.view(),
                       CallOptions{stream, nullptr, launch_flags});
  };
  for (int i = 0; i < 3 * sets; ++i) {
    if (Status st = run(i); !st.ok()) return st;
  }
  Events ev;
  cudaEventRecord(ev.start, stream);
  for (int i = 0; i < sets; ++i) (void)run(i);
  cudaEventRecord(ev.stop, stream);
  if (Status st = cuda_status(cudaStreamSynchronize(stream), "warm-up"); !st.ok()) return st;
  const double warm_us = ev.ms() * 1000.0 / sets;
  if (warm_us < 20.0 && spec.graph_safe() &&
      (before == nullptr || before->handle->spec().graph_safe())) {
    // Graph of `batch` calls rotating over the sets; time replays.
    t.graph = true;
    auto replays = time_graph_replays(stream, std::max(sets, 64), reps, run);
    if (!replays) return replays.status();
    t.median_us = replays->median_us;
    t.min_us = replays->min_us;
  } else {
    std::vector<double> samples;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(ev.start, stream);
      (void)run(r);
      cudaEventRecord(ev.stop, stream);
      cudaEventSynchronize(ev.stop);
      samples.push_back(ev.ms() * 1000.0);
    }
    t.median_us = median(samples);
    t.min_us = *std::min_element(samples.begin(), samples.end());
  }
  if (Status st = cuda_status(cudaStreamSynchronize(stream), "timed calls"); !st.ok()) return st;
  t.gbps = static_cast<double>(t.bytes) / (t.median_us * 1e3);
  return t;
#else
  (void)handle, (void)symbols, (void)dtype, (void)attrs, (void)reps, (void)seed, (void)launch_flags,
      (void)before;
  return no_cuda();
#endif
}

Result<double> copy_bandwidth_gbps(size_t bytes) {
#if defined(KREG_HAVE_CUDA)
  void* a = nullptr;
  void* b = nullptr;
  if (Status st = cuda_status(cudaMalloc(&a, bytes), "cudaMalloc"); !st.ok()) return st;
  if (Status st = cuda_status(cudaMalloc(&b, bytes), "cudaMalloc"); !st.ok()) {
    cudaFree(a);
    return st;
  }
  cudaMemset(a, 1, bytes);
  Events ev;
  std::vector<double> samples;
  for (int r = 0; r < 23; ++r) {
    cudaEventRecord(ev.start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(ev.stop);
    cudaEventSynchronize(ev.stop);
    if (r >= 3) samples.push_back(ev.ms());
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (median(samples) * 1e6);
#else
  (void)bytes;
  return no_cuda();
#endif
}

}  // namespace kreg::harness
