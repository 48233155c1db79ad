// Overflow-checked arithmetic on sizes: element counts, byte counts and dimension
// products that come from callers, command lines and signatures. Header only and free of
// allocation, so the call-time check and the plugin decoder can use it too.
#pragma once

#include <cstdint>

namespace kreg {

// a * b into *out; false (and *out unspecified) when the product leaves int64.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// Bytes one element of a DLPack dtype takes (bits * lanes, rounded up to whole bytes).
// bits is 8 bits and lanes 16, so this never overflows.
inline int64_t dl_item_bytes(uint8_t bits, uint16_t lanes) {
  return (int64_t{bits} * int64_t{lanes} + 7) / 8;
}

// Checks a shape from outside: every extent >= 0, and the product of the extents times
// `item_bytes` fits in int64 with zero extents counted as one, so that no partial product
// a kernel may form (rows * cols of a tensor with a zero batch) overflows either. Returns
// the index of the first negative extent, kShapeTooLarge when the size overflows, or
// kShapeOk; *elements gets the element count when it is ok.
inline constexpr int kShapeOk = -1;
inline constexpr int kShapeTooLarge = -2;
inline int check_extents(const int64_t* shape, int ndim, int64_t item_bytes, int64_t* elements) {
  int64_t span = item_bytes > 0 ? item_bytes : 1;
  bool empty = false;
  for (int k = 0; k < ndim; ++k) {
    const int64_t e = shape[k];
    if (e < 0) return k;
    if (e == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(span, e, &span)) return kShapeTooLarge;
  }
  if (elements != nullptr) *elements = empty ? 0 : span / (item_bytes > 0 ? item_bytes : 1);
  return kShapeOk;
}

}  // namespace kreg
