// The FP16 form's layout of MXFP4 experts (backend/cuda/mxfp4_f16_layout.h), checked on the host:
// every code of a packed row reads back through f16_pair_a..d as an fp16 of exactly its value
// times 2^-14 at the k slot the mma expects of its lane, padding is zero, the scales keep their
// order, the bf16 reading gives value * 2^-126, and the prefill GEMM's k order is a permutation.
// The probe (tools/cuda-harness/moe_probe.cu) times kernels on this layout; these run in CI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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

// A bf16 value, bit by bit (16 bits: the top half of a float32).
double bf16_value(uint32_t bits) {
  uint32_t f = bits << 16;
  float v;
  std::memcpy(&v, &f, 4);
  return double(v);
}

// The bf16 kernels' reading of the layout (the prefill GEMM, the decode kernel for several
// tokens): every code as exactly value * 2^-126, and f16_code gives the nibble back.
TEST(Mxfp4F16Layout, Bf16ReadingAndCodesOfEveryWord) {
  const int k = 2880;
  const std::vector<uint8_t> row = random_row(k, 7u);
  std::vector<uint8_t> packed(size_t(f16_row_bytes(k)));
  pack_row_f16(row.data(), packed.data(), k);
  for (int block = 0; block < k / 32; ++block)
    for (int t = 0; t < 4; ++t) {
      const uint32_t word = layout_word(packed, block, t);
      for (int j = 0; j < 4; ++j) {
        const uint32_t pair = bf16_from_f16_pair(f16_pair(word, j));
        for (int e = 0; e < 2; ++e) {
          const int kk = 32 * block + f16_slot(t, j) + e;
          const uint32_t code = checkpoint_code(row.data(), kk);
          ASSERT_EQ(f16_code(word, j, e), code) << "k " << kk;
          const uint32_t bits = e == 0 ? pair & 0xFFFFu : pair >> 16;
          ASSERT_EQ(bf16_value(bits), double(kE2m1[code]) * std::ldexp(1.0, -126)) << "k " << kk;
          ASSERT_EQ(bits >> 15, code >> 3) << "sign of k " << kk;
        }
      }
    }
}

// A lane's pairs cover its k in natural order (the token needs no permutation): lane quad t's
// pair j of block b is k 32b + 8t + 2j, each k of a block exactly once.
TEST(Mxfp4F16Layout, LaneSlotsCoverTheBlockInOrder) {
  std::set<int> seen;
  for (int t = 0; t < 4; ++t)
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(f16_slot(t, j), 8 * t + 2 * j);
      EXPECT_TRUE(seen.insert(f16_slot(t, j)).second);
    }
  EXPECT_EQ(*seen.rbegin(), 30);
}

// The prefill GEMM's logical order is a permutation of each 64-wide tile, and it puts physical k
// where the GEMM's lane quad t feeds it: step s = 2a + b takes word a's pairs 2b and 2b + 1 as
// logical (2t, 2t+1) and (2t+8, 2t+9) of the step.
TEST(Mxfp4F16Layout, PrefillOrderIsThePermutationTheGemmFeeds) {
  std::set<int> logical;
  for (int physical = 0; physical < 64; ++physical) {
    const int l = f16_prefill_logical_column(physical);
    ASSERT_GE(l, 0);
    ASSERT_LT(l, 64);
    EXPECT_TRUE(logical.insert(l).second) << physical;
  }
  for (int t = 0; t < 4; ++t)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 2; ++h)
          for (int e = 0; e < 2; ++e) {
            const int physical = 32 * a + f16_slot(t, 2 * b + h) + e;  // word a of the tile, pair 2b + h
            EXPECT_EQ(f16_prefill_logical_column(physical), 16 * (2 * a + b) + 8 * h + 2 * t + e);
          }
}

// The four pairs' source bits are disjoint and fill the word (so a word holds its 8 codes and
// nothing else), and each pair's decode reads only its own: a word with one bit set decodes to
// exactly one bit of one pair, at the place f16_source_bit names.
TEST(Mxfp4F16Layout, PairsShareTheWordsBitsOnce) {
  std::set<int> sources;
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 2; ++e)
      for (int i = 0; i < 4; ++i) {
        const int bit = f16_pair_bit(e, i), source = f16_source_bit(j, bit);
        ASSERT_GE(source, 0);
        ASSERT_LT(source, 32);
        EXPECT_TRUE(sources.insert(source).second) << "pair " << j << " bit " << bit;
      }
  EXPECT_EQ(sources.size(), 32u);
  for (int source = 0; source < 32; ++source) {
    int hits = 0;
    for (int j = 0; j < 4; ++j) {
      const uint32_t pair = f16_pair(1u << source, j);
      if (pair == 0) continue;
      ++hits;
      ASSERT_EQ(pair & (pair - 1), 0u) << "one bit in, one bit out";
      const int bit = __builtin_ctz(pair);
      EXPECT_EQ(f16_source_bit(j, bit), source);
      EXPECT_NE(kF16PairBits & pair, 0u);
    }
    EXPECT_EQ(hits, 1) << "bit " << source;
  }
  EXPECT_EQ(reverse_bits(0x00000001u), 0x80000000u);
  EXPECT_EQ(reverse_bits(0x12345678u), 0x1E6A2C48u);
}

// The device matrix's 16-row tiles: every (row, chunk) piece of a 48-row matrix has its own 64
// bytes, together exactly the matrix's rows x row bytes; a tile's chunk is 1 KB in one piece (rows
// 0-15 in order), and an expert of N rows (a multiple of 16) starts where its first row would in
// rows laid one after another.
TEST(Mxfp4F16Layout, TilesOfSixteenRowsFillTheMatrix) {
  for (const int k : {160, 2880}) {
    const int chunks = f16_chunks(k), rows = 48;
    std::vector<int> owner(size_t(rows * f16_row_bytes(k) / kF16ChunkBytes), -1);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < chunks; ++c) {
        const int64_t at = f16_piece_offset(r, c, chunks);
        ASSERT_EQ(at % kF16ChunkBytes, 0);
        ASSERT_LT(size_t(at / kF16ChunkBytes), owner.size());
        ASSERT_EQ(owner[size_t(at / kF16ChunkBytes)], -1) << "row " << r << " chunk " << c;
        owner[size_t(at / kF16ChunkBytes)] = r * chunks + c;
        if (r % 16 > 0) {
          EXPECT_EQ(at, f16_piece_offset(r - 1, c, chunks) + kF16ChunkBytes);
        }
        if (c > 0) {
          EXPECT_EQ(at, f16_piece_offset(r, c - 1, chunks) + kF16ChunkStride);
        }
      }
    EXPECT_EQ(f16_piece_offset(32, 0, chunks), int64_t(32) * f16_row_bytes(k));
  }
}

// A block's word in the device matrix, from its row's piece of chunk 0 (the float32 path's
// addressing): the word the host packer's one-row form holds at f16_word_offset, in that row's
// piece of chunk b / 4.
TEST(Mxfp4F16Layout, TileWordOffsetFindsTheRowsWord) {
  const int k = 2880, chunks = f16_chunks(k);
  for (const int row : {0, 5, 17, 47})
    for (int b = 0; b < k / 32; ++b)
      for (int t = 0; t < 4; ++t) {
        const int64_t piece = f16_piece_offset(row, b / 4, chunks);
        EXPECT_EQ(f16_piece_offset(row, 0, chunks) + f16_tile_word_offset(b, t),
                  piece + f16_word_offset(b, t) - (b / 4) * kF16ChunkBytes)
            << "row " << row << " block " << b << " quad " << t;
      }
}

}  // namespace
}  // namespace anvil
