#pragma once
// FP8 E4M3 both ways, on the host and the device. The nearest code of a float: one definition for
// the CPU quantizers (f32_to_e4m3) and the GPU's (cuda::quantize_fp8_rows,
// cuda::quantize_mxfp4_experts_to_nvfp4), so a layer quantized on either side has the same bytes.
// Ties go to the even mantissa, subnormals are kept, and magnitudes from 448 up saturate to 448
// (0x7e), so the NaN codes 0x7f / 0xff never come out. x must not be NaN.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace anvil {

ANVIL_HOST_DEVICE inline uint8_t e4m3_nearest(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  const uint8_t sign = uint8_t((bits >> 31) << 7);
  const float a = fabsf(x);
  if (a >= 448.0f) return uint8_t(sign | 0x7e);
  if (a == 0.0f) return sign;
  const int e = ilogbf(a);
  // Subnormal: units of 2^-9, and 8 units is the smallest normal, code 0x08: the code is the count.
  // rintf rounds half to even in the default rounding mode, as float arithmetic does.
  if (e < -6) return uint8_t(sign | int(rintf(ldexpf(a, 9))));
  // 8 + mantissa in units of 2^(e - 3); 16 carries into the next exponent, which the sum does too.
  const int q = int(rintf(ldexpf(a, 3 - e)));
  const int code = ((e + 7) << 3) + (q - 8);
  return uint8_t(sign | (code < 0x7e ? code : 0x7e));
}

// The value of a code, as core's fp8_e4m3_to_f32 gives it (a unit test compares all 256), for
// device code, which cannot call that. The NaN codes 0x7f / 0xff give NaN.
ANVIL_HOST_DEVICE inline float e4m3_value(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = ldexpf(float(mantissa), -9);
  } else {
    magnitude = ldexpf(1.0f + float(mantissa) / 8.0f, exponent - 7);
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

}  // namespace anvil
