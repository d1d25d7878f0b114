#pragma once
// The device layout of MXFP4 codes. Checkpoints keep code i of a 32-bit word in nibble i;
// decoding a pair of codes (p, p+4) from that into bf16 bits costs 4 ALU ops (its sign and its
// magnitude need different shifts), which made the batch-1 MoE kernels issue-bound. The device
// copy has each word's bits permuted once at load (mxfp4_pack_codes) so that pair p's magnitude
// bits land on bits 6-8 / 22-24 after a left rotation by magnitude_rotation(p), and its sign
// bits on bits 15 / 31 after one by sign_rotation(p) (mxfp4_common.cuh, fp4_pair_raw). A
// rotation by r + 16 only swaps the half a code is stored in, so a layout is a tiling of Z16 by
// four 3-bit runs and four single bits; these rotations are the cheapest (exhaustive search):
// 5 distinct rotations and 6 logic ops decode a word's four pairs, 11 ops against 16. No tiling
// lets every pair come from a single rotation.
// Plain C++ as well as CUDA, so host code and tests can pack and unpack words too.
#include <cstdint>

#include "core/host_device.h"

namespace anvil::cuda::mxfp4 {

constexpr uint32_t kPairMagnitudeBits = 0x01C001C0u;  // bits 6-8 and 22-24
constexpr uint32_t kPairSignBits = 0x80008000u;       // bits 15 and 31

ANVIL_HOST_DEVICE constexpr int magnitude_rotation(int pair) { return pair == 0 ? 6 : pair == 1 ? 3 : pair == 2 ? 0 : 13; }
ANVIL_HOST_DEVICE constexpr int sign_rotation(int pair) { return pair == 0 ? 2 : pair == 1 ? 3 : pair == 2 ? 0 : 1; }

// Whether a left rotation by `bits` brings any bit of `mask` around from the top of the word; if
// not, a plain left shift keeps the same masked bits (mxfp4_common.cuh, shift_for_mask).
ANVIL_HOST_DEVICE constexpr bool rotation_wraps(int bits, uint32_t mask) {
  return bits != 0 && (mask & ((1u << bits) - 1u)) != 0;
}

// Where bit `bit` (0-31) of a checkpoint word is stored in the device word.
ANVIL_HOST_DEVICE constexpr int packed_position(int bit) {
  const int code = bit / 4, within = bit % 4, pair = code % 4, half = code / 4;
  const int target = within == 3 ? 15 + 16 * half : 6 + 16 * half + within;
  const int rotation = within == 3 ? sign_rotation(pair) : magnitude_rotation(pair);
  return (target - rotation + 32) % 32;
}

ANVIL_HOST_DEVICE constexpr uint32_t pack_codes_word(uint32_t word) {
  uint32_t packed = 0;
  for (int bit = 0; bit < 32; ++bit) packed |= ((word >> bit) & 1u) << packed_position(bit);
  return packed;
}

ANVIL_HOST_DEVICE constexpr uint32_t unpack_codes_word(uint32_t packed) {
  uint32_t word = 0;
  for (int bit = 0; bit < 32; ++bit) word |= ((packed >> packed_position(bit)) & 1u) << bit;
  return word;
}

}  // namespace anvil::cuda::mxfp4
