// The FP16 form's layout of MXFP4 experts (backend/cuda/mxfp4_f16_layout.h), checked on the host:
// every code of a packed row reads back through f16_pair_a..d as an fp16 of exactly its value
// times 2^-14 at the k slot the mma expects of its lane, padding is zero, the scales keep their
// order, and the token's fp16-pair order puts every k in exactly one place, next to its partner.
// The probe (tools/cuda-harness/moe_probe.cu) times kernels on this layout; these run in CI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "backend/cuda/mxfp4_f16_layout.h"

namespace anvil {
namespace {

using namespace cuda::mxfp4;

constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// An IEEE half's value, bit by bit.
double half_value(uint32_t bits) {
  const int sign = (bits >> 15) & 1, exponent = (bits >> 10) & 31, mantissa = bits & 1023;
  const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), -24)
                                         : std::ldexp(1.0 + double(mantissa) / 1024.0, exponent - 15);
  return sign ? -magnitude : magnitude;
}

std::vector<uint8_t> random_row(int k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> row(size_t(k / 2));
  for (auto& byte : row) byte = uint8_t(rng());
  return row;
}

uint32_t layout_word(const std::vector<uint8_t>& packed, int block, int t) {
  uint32_t word;
  std::memcpy(&word, &packed[size_t(block / 4) * 64 + size_t(t) * 16 + size_t(block % 4) * 4], 4);
  return word;
}

uint32_t pair_of(uint32_t word, int j) {
  return j == 0 ? f16_pair_a(word) : j == 1 ? f16_pair_b(word) : j == 2 ? f16_pair_c(word) : f16_pair_d(word);
}

void expect_row_reads_back(const std::vector<uint8_t>& row, int k) {
  std::vector<uint8_t> packed(size_t(f16_row_bytes(k)), 0xAB);
  pack_row_f16(row.data(), packed.data(), k);
  for (int block = 0; block < 4 * f16_chunks(k); ++block)
    for (int t = 0; t < 4; ++t) {
      const uint32_t word = layout_word(packed, block, t);
      if (block >= k / 32) {
        EXPECT_EQ(word, 0u) << "padding block " << block;
        continue;
      }
      for (int j = 0; j < 4; ++j) {
        const uint32_t pair = pair_of(word, j);
        for (int e = 0; e < 2; ++e) {
          const int kk = 32 * block + f16_slot(t, j) + e;
          const double want = double(kE2m1[checkpoint_code(row.data(), kk)]) * std::ldexp(1.0, -14);
          const uint32_t bits = e == 0 ? pair & 0xFFFFu : pair >> 16;
          ASSERT_EQ(half_value(bits), want) << "k " << kk << " (block " << block << ", lane " << t << ", pair " << j
                                            << ")";
          ASSERT_EQ((bits >> 15) & 1u, checkpoint_code(row.data(), kk) >> 3) << "sign of k " << kk;  // -0 too
        }
      }
    }
}

TEST(Mxfp4F16Layout, EveryCodeReadsBackAtItsSlot) {
  for (const int k : {32, 64, 96, 128, 2880}) {
    SCOPED_TRACE("K = " + std::to_string(k));
    expect_row_reads_back(random_row(k, uint32_t(k)), k);
  }
  // Every code value in every position of a block (16 rows: row r holds code (r + k) % 16 at k).
  for (int r = 0; r < 16; ++r) {
    std::vector<uint8_t> row(16);
    for (int kk = 0; kk < 32; ++kk) row[size_t(kk / 2)] |= uint8_t(((r + kk) % 16) << (4 * (kk % 2)));
    expect_row_reads_back(row, 32);
  }
}

TEST(Mxfp4F16Layout, SizesPadToWholeChunks) {
  EXPECT_EQ(f16_chunks(2880), 23);  // gpt-oss: 90 blocks -> 92
  EXPECT_EQ(f16_row_bytes(2880), 1472);
  EXPECT_EQ(f16_row_bytes(128), 64);
  EXPECT_EQ(f16_row_bytes(160), 128);
  EXPECT_EQ(f16_scale_row_bytes(2880), 92);
  const std::vector<uint8_t> scales = {120, 121, 122, 123, 124};  // K = 160
  std::vector<uint8_t> packed(size_t(f16_scale_row_bytes(160)), 0xAB);
  pack_scales_f16(scales.data(), packed.data(), 160);
  EXPECT_EQ(packed, (std::vector<uint8_t>{120, 121, 122, 123, 124, 0, 0, 0}));
}

// The token's order matches the weights': k and k + 1 share a uint32 (the pair), the pair of lane
// quad t and step j of block b sits where the kernel's lane t loads block b's word j, and the
// words cover the padded token exactly once.
TEST(Mxfp4F16Layout, TokenOrderMatchesTheWeightSlots) {
  const int k = 2880, padded = 128 * f16_chunks(k);
  std::set<std::pair<int, int>> seen;
  for (int kk = 0; kk < padded; ++kk) {
    const F16TokenIndex at = f16_token_index(kk);
    ASSERT_GE(at.word, 0);
    ASSERT_LT(at.word, f16_token_words(k));
    EXPECT_EQ(at.half, kk % 2);
    if (kk % 2 == 1) {
      EXPECT_EQ(at.word, f16_token_index(kk - 1).word);
    }
    EXPECT_TRUE(seen.insert({at.word, at.half}).second) << "k " << kk;
    // The kernel's lane quad t loads, for block w of chunk c, uint4 number (4c + t) * 4 + w and
    // feeds its element j to step j's pair of f16_slot(t, j): that must be this k's slot.
    const int block = kk / 32, within = kk % 32, quad_word = at.word / 4, j = at.word % 4;
    const int t = (quad_word / 4) % 4, c = quad_word / 16, w = quad_word % 4;
    EXPECT_EQ(4 * c + w, block) << "k " << kk;
    EXPECT_EQ(f16_slot(t, j) + at.half, within) << "k " << kk;
  }
  EXPECT_EQ(int(seen.size()), 2 * f16_token_words(k));
}

}  // namespace
}  // namespace anvil
