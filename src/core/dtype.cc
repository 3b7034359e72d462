// dtype names and sizes; f16 widening.
#include "miles/dtype.h"

#include <cmath>

namespace miles {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  int size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::kF32, "F32", 4}, {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2},
    {DType::kF64, "F64", 8}, {DType::kI8, "I8", 1},     {DType::kU8, "U8", 1},
    {DType::kI16, "I16", 2}, {DType::kI32, "I32", 4},   {DType::kI64, "I64", 8},
    {DType::kBool, "BOOL", 1},
};
}  // namespace

int dtype_size(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i.size;
  return 0;
}

std::string_view dtype_name(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i.name;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

}  // namespace miles
