// The element types kreg signatures can name, and their DLPack encodings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <dlpack/dlpack.h>

namespace kreg {

// DLPack >= 1.1 type codes, spelled out so that older dlpack.h (Debian 12 ships 0.6)
// can still describe bool and fp8 tensors.
inline constexpr uint8_t kDLBoolCode = 6;
inline constexpr uint8_t kDLFloat8E4M3FnCode = 10;
inline constexpr uint8_t kDLFloat8E5M2Code = 12;

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
  kCount
};

// A set of DTypes as a bitmask, e.g. "bf16|f16|f32".
using DTypeMask = uint32_t;
constexpr DTypeMask mask_of(DType d) { return DTypeMask{1} << static_cast<unsigned>(d); }

std::string_view dtype_name(DType d);
std::optional<DType> parse_dtype(std::string_view name);
// Parses "a|b|c"; returns nullopt on an unknown name (reported through `bad`).
std::optional<DTypeMask> parse_dtype_set(std::string_view text, std::string* bad = nullptr);
std::string dtype_set_name(DTypeMask mask);

DLDataType to_dl(DType d);
size_t dtype_size(DType d);

// Maps a DLPack dtype to a DType; nullopt for anything kreg cannot name (vector lanes,
// unusual widths). Inline: it sits on the call path.
inline std::optional<DType> from_dl(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      return t.bits == 32   ? std::optional(DType::kF32)
             : t.bits == 16 ? std::optional(DType::kF16)
             : t.bits == 64 ? std::optional(DType::kF64)
                            : std::nullopt;
    case kDLBfloat:
      return t.bits == 16 ? std::optional(DType::kBF16) : std::nullopt;
    case kDLInt:
      return t.bits == 32   ? std::optional(DType::kI32)
             : t.bits == 64 ? std::optional(DType::kI64)
             : t.bits == 8  ? std::optional(DType::kI8)
             : t.bits == 16 ? std::optional(DType::kI16)
                            : std::nullopt;
    case kDLUInt:
      return t.bits == 8 ? std::optional(DType::kU8) : std::nullopt;
    case kDLBoolCode:
      return t.bits == 8 ? std::optional(DType::kBool) : std::nullopt;
    case kDLFloat8E4M3FnCode:
      return t.bits == 8 ? std::optional(DType::kF8E4M3) : std::nullopt;
    case kDLFloat8E5M2Code:
      return t.bits == 8 ? std::optional(DType::kF8E5M2) : std::nullopt;
    default:
      return std::nullopt;
  }
}

// "bf16", or "dlpack(code=9,bits=8,lanes=1)" for types kreg cannot name.
std::string describe_dl(DLDataType t);

}  // namespace kreg
