#include "core/dtype.h"

namespace anvil {

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  if (name == "F32") return DType::F32;
  if (name == "F16") return DType::F16;
  if (name == "BF16") return DType::BF16;
  if (name == "U8") return DType::U8;
  if (name == "I8") return DType::I8;
  if (name == "I32") return DType::I32;
  if (name == "I64") return DType::I64;
  if (name == "F8_E4M3") return DType::F8_E4M3;
  if (name == "F8_E5M2") return DType::F8_E5M2;
  if (name == "BOOL") return DType::BOOL;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::U8:
    case DType::I8:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::BOOL: return 1;
  }
  return 0;
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24.
    const float magnitude = std::ldexp(float(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
  return f32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float value) {
  const uint32_t bits = f32_to_bits(value);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;
  if (magnitude < std::ldexp(1.0f, -14)) {
    // Subnormal range: round magnitude / 2^-24 to nearest even integer.
    const float scaled = magnitude * std::ldexp(1.0f, 24);
    return sign | uint16_t(std::nearbyint(scaled));
  }
  uint32_t abs_bits = bits & 0x7fffffffu;
  abs_bits += 0x0fffu + ((abs_bits >> 13) & 1u);
  return sign | uint16_t((abs_bits - (112u << 23)) >> 13);
}

float fp8_e4m3_to_f32(uint8_t bits) {
  const bool negative = bits & 0x80u;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 15 && mantissa == 7) return std::nanf("");
  if (exponent == 0) {
    magnitude = std::ldexp(float(mantissa), -9);  // 2^(1-7) * m/8
  } else {
    magnitude = std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
  }
  return negative ? -magnitude : magnitude;
}

float fp8_e5m2_to_f32(uint8_t bits) { return f16_to_f32(uint16_t(bits) << 8); }

}  // namespace anvil
