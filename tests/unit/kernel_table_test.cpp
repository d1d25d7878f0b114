// The kernel table picks families by exact compute capability (issue 4: "never capability >= N"):
// the bulk-copy GEMV is named only on the row it was measured on (9.0), never on 8.x (no bulk copy
// engine) nor, until measured there, on 10.0 and 12.0; every row says which decode GEMV it runs.
// A build without CUDA has an empty table.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/runtime.h"

namespace anvil {
namespace {

std::string family_of(const cuda::ArchKernels& row, const std::string& op) {
  for (const auto& entry : row.ops)
    if (entry.op == op) return entry.family;
  return "";
}

TEST(KernelTable, BulkCopyGemvOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) {
    EXPECT_TRUE(cuda::kernel_table().empty());
    return;
  }
  ASSERT_FALSE(cuda::kernel_table().empty());
  for (const auto& row : cuda::kernel_table()) {
    SCOPED_TRACE(std::to_string(row.major) + "." + std::to_string(row.minor));
    const std::string decode = family_of(row, cuda::kLinearDecodeOp);
    EXPECT_FALSE(decode.empty()) << "no decode GEMV named";
    EXPECT_EQ(decode == cuda::kLinearDecodeBulk, row.major == 9 && row.minor == 0);
  }
}

// Batch 1's MoE sum inside down: only where it was measured (an SM90 card), never picked for a
// row whose shared memory holds fewer of its blocks.
TEST(KernelTable, MoeSumInDownOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) return;
  for (const auto& row : cuda::kernel_table()) {
    SCOPED_TRACE(std::to_string(row.major) + "." + std::to_string(row.minor));
    const std::string sum = family_of(row, cuda::kMoeBatch1SumOp);
    EXPECT_FALSE(sum.empty()) << "no batch-1 MoE sum named";
    EXPECT_EQ(sum == cuda::kMoeBatch1SumInDown, row.major == 9 && row.minor == 0);
  }
}

// The 20-warp decode attention block needs 160 KB of shared memory: only on the row where it was
// measured (SM90), never on 8.x or 12.0, whose SMs cannot give one block that much.
TEST(KernelTable, WideDecodeAttentionOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) return;
  for (const auto& row : cuda::kernel_table()) {
    SCOPED_TRACE(std::to_string(row.major) + "." + std::to_string(row.minor));
    const std::string blocks = family_of(row, cuda::kDecodeAttentionBlockOp);
    EXPECT_FALSE(blocks.empty()) << "no decode attention block named";
    EXPECT_EQ(blocks == cuda::kDecodeAttentionWide, row.major == 9 && row.minor == 0);
  }
}

}  // namespace
}  // namespace anvil
