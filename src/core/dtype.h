#pragma once
// Scalar formats found in checkpoints, and exact conversions to float32.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace anvil {

enum class DType { F32, F16, BF16, U8, I8, I32, I64, F8_E4M3, F8_E5M2, BOOL };

// Safetensors spelling ("BF16", "F8_E4M3", ...); nullopt for names we do not read.
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
std::string_view dtype_name(DType dtype);
size_t dtype_size(DType dtype);

inline float f32_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline uint32_t f32_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bf16_to_f32(uint16_t bits) { return f32_from_bits(uint32_t(bits) << 16); }

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits = f32_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

// OCP FP8: E4M3 (no infinities, 0x7f/0xff are NaN) and E5M2 (IEEE-like).
float fp8_e4m3_to_f32(uint8_t bits);
float fp8_e5m2_to_f32(uint8_t bits);

// FP4 E2M1 code -> value; bit 3 is the sign.
inline constexpr float kFp4E2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// E8M0 scale byte: 2^(s - 127). No reference implementation treats 0xFF as NaN, so neither do we.
inline float e8m0_to_f32(uint8_t bits) { return std::ldexp(1.0f, int(bits) - 127); }

}  // namespace anvil
