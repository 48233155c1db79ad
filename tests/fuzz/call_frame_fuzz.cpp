// The typed plugin layer's decoder (kreg::bind, plugin.hpp) on call frames built from fuzz
// bytes: counts that disagree with the function, null frames, arrays and tensors,
// attributes of the wrong kind or range, null strings, ndim huge or negative, null or
// nonsense shapes. Every array the frame points at really has the room its counts could
// index (16 tensors, 16 attributes, 64 shape entries), so any read past what the decoder
// checked shows up under ASan; the bound functions read every shape entry and string they
// are handed. The decoder must answer OK (and the function run) or INVALID_ARGUMENT.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kreg/plugin.hpp"

namespace {

// Everything a function reads goes into the sink (wrapping: the values are fuzz bytes).
volatile uint64_t g_sink = 0;
void sink(int64_t v) { g_sink = g_sink + static_cast<uint64_t>(v); }

void touch(const DLTensor& t) {
  sink(kreg::numel(t));
  sink(t.dtype.bits);
  for (int k = 0; k < t.ndim; ++k) sink(t.shape[k]);
}

kreg::KernelStatus two_tensors(kreg::Context&, const DLTensor& x, DLTensor& out, double eps) {
  touch(x);
  touch(out);
  sink(eps == eps);
  return kreg::kOk;
}

kreg::KernelStatus mixed(kreg::Context&, const DLTensor& x, const DLTensor* opt, int32_t k, bool b,
                         const char* s) {
  touch(x);
  if (opt != nullptr) touch(*opt);
  sink(k);
  sink(b);
  sink(static_cast<int64_t>(std::strlen(s)));
  return kreg::kOk;
}

kreg::KernelStatus narrow(kreg::Context& ctx, DLTensor& a, float f, std::string_view sv, int64_t i,
                          int k) {
  touch(a);
  sink(f == f);
  sink(static_cast<int64_t>(sv.size()));
  sink(i);
  sink(k);
  return ctx.fail(KREG_OK, "ran");
}

kreg::KernelStatus nothing(kreg::Context&) { return kreg::kOk; }

constexpr kreg::Binding kBindings[] = {kreg::bind<&two_tensors>, kreg::bind<&mixed>,
                                       kreg::bind<&narrow>, kreg::bind<&nothing>};

class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  int64_t i64() {
    uint64_t v = 0;
    for (int b = 0; b < 8; ++b) v |= uint64_t{u8()} << (8 * b);
    int64_t r;
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
  int32_t i32() { return static_cast<int32_t>(i64()); }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

constexpr int kSlots = 16;
constexpr int kShapeRoom = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t which = in.u8();
  const uint8_t flags = in.u8();

  static DLTensor tensors[kSlots];
  static int64_t shapes[kSlots][kShapeRoom];
  static char strings[kSlots][32];
  DLTensor* ptrs[kSlots] = {};
  kreg_attr attrs[kSlots] = {};
  for (int i = 0; i < kSlots; ++i) {
    DLTensor& t = tensors[i];
    t = DLTensor{};
    const uint8_t mode = in.u8();
    // Small ranks most of the time so the shape bytes matter; any int32 sometimes.
    t.ndim = (mode & 3) == 3 ? in.i32() : static_cast<int8_t>(in.u8()) % 10;
    for (int k = 0; k < kShapeRoom; ++k) shapes[i][k] = k < 8 ? in.i64() : 1;
    if ((mode & 12) == 0) {  // small extents, so some frames pass and the functions run
      for (int k = 0; k < 8; ++k) shapes[i][k] = static_cast<int64_t>(shapes[i][k] & 7);
    }
    t.shape = (mode & 16) ? nullptr : shapes[i];
    t.dtype = {static_cast<uint8_t>(in.u8() & 7), in.u8(), static_cast<uint16_t>(in.u8() & 3)};
    ptrs[i] = (mode & 32) ? nullptr : &t;
    kreg_attr& a = attrs[i];
    a.type = in.u8() % 6;
    a.value.i = in.i64();
    if (a.type == KREG_ATTR_STRING) {
      std::memset(strings[i], 0, sizeof strings[i]);
      for (size_t c = 0; c + 1 < sizeof strings[i]; ++c) strings[i][c] = static_cast<char>(in.u8());
      a.value.s = (mode & 64) ? nullptr : strings[i];
    }
  }
  kreg_call_frame frame{};
  frame.struct_size = (flags & 1) ? in.u8() : sizeof frame;
  frame.num_tensors = (flags & 2) ? in.i32() : in.u8() % 5;
  frame.num_attrs = (flags & 4) ? in.i32() : in.u8() % 6;
  frame.tensors = (flags & 8) ? nullptr : ptrs;
  frame.attrs = (flags & 16) ? nullptr : attrs;
  char message[128] = {};
  kreg_error err{sizeof err, message, sizeof message};
  const kreg_call_frame* f = (flags & 32) ? nullptr : &frame;
  kreg_error* e = (flags & 64) ? nullptr : &err;
  const int32_t rc = kBindings[which % 4].fn(f, e);
  if (rc != KREG_OK && rc != KREG_INVALID_ARGUMENT) {
    std::fprintf(stderr, "call_frame_fuzz: the decoder returned %d\n", rc);
    std::abort();
  }
  if (rc == KREG_INVALID_ARGUMENT && e != nullptr && message[0] == '\0') {
    std::fprintf(stderr, "call_frame_fuzz: a refused frame without a message\n");
    std::abort();
  }
  return 0;
}
