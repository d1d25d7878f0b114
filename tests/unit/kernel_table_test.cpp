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

// Every row names a family for `op`, and `sm90_family` exactly on the SM90 row.
void expect_family_only_on_sm90(const std::string& op, const std::string& sm90_family) {
  for (const auto& row : cuda::kernel_table()) {
    SCOPED_TRACE(std::to_string(row.major) + "." + std::to_string(row.minor) + " " + op);
    const std::string family = family_of(row, op);
    EXPECT_FALSE(family.empty()) << "no family named";
    EXPECT_EQ(family == sm90_family, row.major == 9 && row.minor == 0);
  }
}

TEST(KernelTable, BulkCopyGemvOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) {
    EXPECT_TRUE(cuda::kernel_table().empty());
    return;
  }
  ASSERT_FALSE(cuda::kernel_table().empty());
  expect_family_only_on_sm90(cuda::kLinearDecodeOp, cuda::kLinearDecodeBulk);
}

// Batch 1's MoE sum inside down: only where it was measured (an SM90 card), never picked for a
// row whose shared memory holds fewer of its blocks.
TEST(KernelTable, MoeSumInDownOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) return;
  expect_family_only_on_sm90(cuda::kMoeBatch1SumOp, cuda::kMoeBatch1SumInDown);
}

// The 20-warp decode attention block needs ~161 KB of shared memory: only on the row where it was
// measured (SM90); SM86, Ada and SM120 cannot give one block that much, and an A100 is unmeasured.
TEST(KernelTable, WideDecodeAttentionOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) return;
  expect_family_only_on_sm90(cuda::kDecodeAttentionBlockOp, cuda::kDecodeAttentionWide);
}

// Every row names a family for `op`, and none names `unmeasured`.
void expect_family_on_no_row(const std::string& op, const std::string& unmeasured) {
  for (const auto& row : cuda::kernel_table()) {
    SCOPED_TRACE(std::to_string(row.major) + "." + std::to_string(row.minor) + " " + op);
    const std::string family = family_of(row, op);
    EXPECT_FALSE(family.empty()) << "no family named";
    EXPECT_NE(family, unmeasured);
  }
}

// Batch 1's one-launch routing: measured on an H100 and an H200 (SM90); other rows either lack clusters or
// could not place its blocks beside their neighbours'.
TEST(KernelTable, OneLaunchRoutingOnlyOnTheMeasuredRow) {
  if (!cuda::compiled_in()) return;
  expect_family_only_on_sm90(cuda::kMoeBatch1RouteOp, cuda::kMoeBatch1RouteCluster);
}

// The RoPE inside the decode attention measured level at batch 1 (session 31): on no row.
TEST(KernelTable, RopeInsideAttentionOnNoRow) {
  if (!cuda::compiled_in()) return;
  expect_family_on_no_row(cuda::kDecodeRopeOp, cuda::kDecodeRopeInAttention);
}

}  // namespace
}  // namespace anvil
