// The MXFP4 device layout (backend/cuda/mxfp4_layout.h), checked on the host: every code's bits
// reach their bf16 pair positions through the rotations the decode uses, and where the batch-1
// decode kernel replaces a rotation by a plain shift (rotation_wraps says no bit of the mask comes
// around), the masked bits are the same. The GPU tests check the kernels; these run in CI.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/mxfp4_layout.h"

namespace anvil {
namespace {

using namespace cuda::mxfp4;

uint32_t rotl(uint32_t word, int bits) { return bits == 0 ? word : (word << bits) | (word >> (32 - bits)); }

// The decode's pair p from a device word, with a rotation or (where allowed) a shift per mask.
uint32_t pair_raw(uint32_t word, int pair, bool plain_shifts) {
  auto shifted = [&](int bits, uint32_t mask) {
    return plain_shifts && !rotation_wraps(bits, mask) ? word << bits : rotl(word, bits);
  };
  return (shifted(magnitude_rotation(pair), kPairMagnitudeBits) & kPairMagnitudeBits) |
         (shifted(sign_rotation(pair), kPairSignBits) & kPairSignBits);
}

std::vector<uint32_t> words() {
  std::vector<uint32_t> out = {0u, 0xFFFFFFFFu, 0x80000000u, 0x00000001u, 0x88888888u, 0x77777777u};
  for (int bit = 0; bit < 32; ++bit) out.push_back(1u << bit);
  std::mt19937 rng(7);
  while (out.size() < 5000) out.push_back(uint32_t(rng()));
  return out;
}

TEST(Mxfp4Layout, PairsCarryTheirCodesMagnitudeAndSign) {
  for (uint32_t checkpoint : words()) {
    const uint32_t device = pack_codes_word(checkpoint);
    for (int pair = 0; pair < 4; ++pair) {
      const uint32_t raw = pair_raw(device, pair, false);
      const uint32_t lo = (checkpoint >> (4 * pair)) & 0xFu, hi = (checkpoint >> (4 * (pair + 4))) & 0xFu;
      // Code (pair) in the low bf16, code (pair + 4) in the high one: magnitude at bits 6-8, sign at 15.
      const uint32_t want = ((lo & 7u) << 6) | ((lo >> 3) << 15) | ((hi & 7u) << 22) | ((hi >> 3) << 31);
      ASSERT_EQ(raw, want) << "word " << checkpoint << " pair " << pair;
    }
  }
}

TEST(Mxfp4Layout, PlainShiftsKeepTheMaskedBits) {
  int shifts = 0;
  for (int pair = 0; pair < 4; ++pair) {
    shifts += !rotation_wraps(magnitude_rotation(pair), kPairMagnitudeBits) && magnitude_rotation(pair) != 0;
    shifts += !rotation_wraps(sign_rotation(pair), kPairSignBits) && sign_rotation(pair) != 0;
  }
  EXPECT_GE(shifts, 4);  // the point of the shifts: most of the rotations need no wrap
  for (uint32_t word : words())
    for (int pair = 0; pair < 4; ++pair) ASSERT_EQ(pair_raw(word, pair, true), pair_raw(word, pair, false));
}

TEST(Mxfp4Layout, RotationWrapsWhenAMaskedBitComesAround) {
  EXPECT_FALSE(rotation_wraps(0, 0xFFFFFFFFu));
  EXPECT_TRUE(rotation_wraps(13, kPairMagnitudeBits));  // bits 6-8 come from 25-27
  EXPECT_FALSE(rotation_wraps(6, kPairMagnitudeBits));  // bits 6-8 from 0-2
  EXPECT_FALSE(rotation_wraps(2, kPairSignBits));
  for (int bits = 1; bits < 32; ++bits)
    for (uint32_t mask : {kPairMagnitudeBits, kPairSignBits, 0x0000FFFFu, 0xFFFF0000u, 0x00000001u}) {
      bool same = true;
      for (uint32_t word : {0xFFFFFFFFu, 0xA5A5A5A5u, 0x5A5A5A5Au, 0x12345678u})
        same = same && ((word << bits) & mask) == (rotl(word, bits) & mask);
      EXPECT_EQ(same, !rotation_wraps(bits, mask)) << bits << " " << mask;
    }
}

}  // namespace
}  // namespace anvil
