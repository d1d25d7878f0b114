#pragma once
// The nearest FP4 E2M1 code of a float, on the host and the device: one definition for the CPU
// quantizers (f32_to_e2m1) and the GPU's (cuda::quantize_mxfp4_experts_to_nvfp4), so experts
// quantized on either side have the same bytes.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace anvil {

// Ties go to the even code, as float rounding does; magnitudes above 6 saturate to 6. The sign
// bit is x's, so negative values that round to zero give -0 (code 8).
ANVIL_HOST_DEVICE inline uint8_t e2m1_nearest(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  const uint8_t sign = uint8_t((bits >> 31) << 3);
  const float a = fabsf(x);
  // Midpoints between the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  uint8_t code;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return uint8_t(sign | code);
}

}  // namespace anvil
