#pragma once
// Floats as unsigned keys in the same order, for the routing kernels' top-k (moe_picks.cuh): a
// warp's arg-max is then two redux.sync (the max key, then the lowest index holding it). -0 and +0
// get one key, as they compare equal; NaN gets the smallest key, 0 (it never wins over a number),
// and key 0 decodes to a NaN. Plain C++ as well as CUDA, so the host tests check the order.
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace anvil::cuda::moe {

ANVIL_HOST_DEVICE inline uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

ANVIL_HOST_DEVICE inline float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

ANVIL_HOST_DEVICE inline uint32_t order_key(float value) {
  if (value != value) return 0u;
  const uint32_t bits = value == 0.0f ? 0u : float_bits(value);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

ANVIL_HOST_DEVICE inline float from_order_key(uint32_t key) {
  return bits_float(key & 0x80000000u ? key & 0x7FFFFFFFu : ~key);
}

}  // namespace anvil::cuda::moe
