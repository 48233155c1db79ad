#include "kreg/dtype.hpp"

#include <array>

namespace kreg {

namespace {
struct DTypeInfo {
  std::string_view name;
  DLDataType dl;
  size_t size;
};
constexpr std::array<DTypeInfo, static_cast<size_t>(DType::kCount)> kInfo = {{
    {"f32", {kDLFloat, 32, 1}, 4},
    {"f16", {kDLFloat, 16, 1}, 2},
    {"bf16", {kDLBfloat, 16, 1}, 2},
    {"f64", {kDLFloat, 64, 1}, 8},
    {"i8", {kDLInt, 8, 1}, 1},
    {"i16", {kDLInt, 16, 1}, 2},
    {"i32", {kDLInt, 32, 1}, 4},
    {"i64", {kDLInt, 64, 1}, 8},
    {"u8", {kDLUInt, 8, 1}, 1},
    {"bool", {kDLBoolCode, 8, 1}, 1},
    {"f8e4m3", {kDLFloat8E4M3FnCode, 8, 1}, 1},
    {"f8e5m2", {kDLFloat8E5M2Code, 8, 1}, 1},
}};
}  // namespace

std::string_view dtype_name(DType d) { return kInfo[static_cast<size_t>(d)].name; }
DLDataType to_dl(DType d) { return kInfo[static_cast<size_t>(d)].dl; }
size_t dtype_size(DType d) { return kInfo[static_cast<size_t>(d)].size; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].name == name) return static_cast<DType>(i);
  }
  // Common spellings from other frameworks.
  if (name == "float32" || name == "float") return DType::kF32;
  if (name == "float16" || name == "half") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float64" || name == "double") return DType::kF64;
  if (name == "int32") return DType::kI32;
  if (name == "int64") return DType::kI64;
  return std::nullopt;
}

std::optional<DTypeMask> parse_dtype_set(std::string_view text, std::string* bad) {
  DTypeMask mask = 0;
  while (!text.empty()) {
    size_t bar = text.find('|');
    std::string_view item = text.substr(0, bar);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    auto d = parse_dtype(item);
    if (!d) {
      if (bad) *bad = std::string(item);
      return std::nullopt;
    }
    mask |= mask_of(*d);
    if (bar == std::string_view::npos) break;
    text.remove_prefix(bar + 1);
  }
  return mask;
}

std::string dtype_set_name(DTypeMask mask) {
  std::string s;
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (mask & (DTypeMask{1} << i)) {
      if (!s.empty()) s += "|";
      s += kInfo[i].name;
    }
  }
  return s.empty() ? "(none)" : s;
}

std::string describe_dl(DLDataType t) {
  if (auto d = from_dl(t)) return std::string(dtype_name(*d));
  return "dlpack(code=" + std::to_string(t.code) + ",bits=" + std::to_string(t.bits) +
         ",lanes=" + std::to_string(t.lanes) + ")";
}

}  // namespace kreg
