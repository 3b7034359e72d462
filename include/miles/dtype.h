// Element types of stored tensors, and the bfloat16 <-> float32 conversions.
//
// Why: checkpoints arrive in float32, bfloat16 (and, from GGUF, other types that are dequantised on load).
// Kernels compute in float32; bfloat16 widening is exact, narrowing rounds to nearest even.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace miles {

enum class DType : uint8_t { kF32, kBF16, kF16, kF64, kI8, kU8, kI16, kI32, kI64, kBool };

// Size of one element in bytes.
int dtype_size(DType t);
// Safetensors spelling: "F32", "BF16", "F16", "F64", "I8", "U8", "I16", "I32", "I64", "BOOL".
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE half -> float (exact).
float f16_to_f32(uint16_t h);

}  // namespace miles
