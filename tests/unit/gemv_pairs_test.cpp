// The rows each block of the GEMV's paired epilogues multiplies (backend/cuda/gemv_pairs.h),
// checked on the host: over the launch's out / 16 blocks every row of the matrix is taken exactly
// once, and each row is paired with the partner its epilogue needs (the up row of its gate row;
// element i + head_dim / 2 of the same head for element i < head_dim / 2). The GPU tests check the
// kernels' values; these run in CI.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/gemv_pairs.h"

namespace anvil {
namespace {

// Marks the 16 rows of every block; each row must be marked once.
template <typename RowsOf>
void expect_each_row_once(int64_t out, RowsOf rows_of) {
  std::vector<int> taken(size_t(out), 0);
  for (int64_t block = 0; block < out / 16; ++block) {
    const cuda::PairedRows rows = rows_of(block);
    for (int64_t g = 0; g < 8; ++g) {
      ASSERT_LT(rows.first_row + g + rows.partner_offset, out) << "block " << block;
      ++taken[size_t(rows.first_row + g)];
      ++taken[size_t(rows.first_row + g + rows.partner_offset)];
    }
  }
  for (int64_t row = 0; row < out; ++row) EXPECT_EQ(taken[size_t(row)], 1) << "row " << row;
}

TEST(GemvPairs, SiluMulBlocksPairEachGateRowWithItsUpRow) {
  for (const int64_t width : {8, 64, 1536}) {
    SCOPED_TRACE("width " + std::to_string(width));
    expect_each_row_once(2 * width, [&](int64_t block) {
      const cuda::PairedRows rows = cuda::silu_mul_rows(block, 2 * width);
      EXPECT_EQ(rows.partner_offset, width);
      return rows;
    });
  }
}

TEST(GemvPairs, RopeBlocksPairEachElementWithItsRotationPartnerInTheSameHead) {
  // gpt-oss (64 q heads, 8 kv heads of 64), its tiny fixture (4 + 2 * 2 heads of 64), head 128.
  for (const auto& [heads, head_dim] : {std::pair<int, int>{80, 64}, {8, 64}, {12, 128}}) {
    SCOPED_TRACE("heads " + std::to_string(heads) + " head_dim " + std::to_string(head_dim));
    expect_each_row_once(int64_t(heads) * head_dim, [&](int64_t block) {
      const cuda::RopeBlock at = cuda::rope_block(int(block), head_dim);
      const cuda::PairedRows rows = cuda::rope_rows(at, head_dim);
      EXPECT_EQ(rows.partner_offset, head_dim / 2);
      EXPECT_LT(at.head, heads);
      // The block's 8 first elements are pairs pair0 .. pair0 + 7 of its head's first half.
      EXPECT_EQ(rows.first_row, int64_t(at.head) * head_dim + at.pair0);
      EXPECT_LE(at.pair0 + 8, head_dim / 2);
      EXPECT_EQ(at.pair0 % 8, 0);
      return rows;
    });
  }
}

}  // namespace
}  // namespace anvil
