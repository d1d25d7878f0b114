// KV block allocation and sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "backend/kv_storage.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"

namespace anvil {
namespace {

KvLayout two_group_layout(int64_t window) {
  KvLayout layout;
  layout.kv_heads = 1;
  layout.head_dim = 4;
  layout.layer_group = {1, 0};
  layout.layer_slot = {0, 0};
  layout.group_layers = {1, 1};
  layout.group_window = {0, window};
  return layout;
}

TEST(KvCache, SlidingGroupHoldsOnlyItsWindow) {
  const KvLayout layout = two_group_layout(8);
  const int64_t block = 4, chunk = 1;
  KvCache cache(layout, kv_blocks_needed(layout, block, 1000, chunk), block);
  EXPECT_EQ(cache.total_blocks(0), 250);
  EXPECT_EQ(cache.total_blocks(1), 4);  // (8 + 1) / 4 rounded up, plus one for a straddling span
  SequenceKv seq;
  for (int64_t pos = 0; pos < 1000; ++pos) {
    cache.trim_windows(seq, pos);
    ASSERT_TRUE(cache.grow(seq, pos + 1)) << "position " << pos;
    // Every position the query at `pos` can see has a block.
    for (int64_t j = std::max<int64_t>(0, pos - 7); j <= pos; ++j)
      ASSERT_GE(seq.block_tables[1][size_t(j / block)], 0);
  }
  EXPECT_EQ(cache.free_blocks(0), 0);
  cache.release(seq);
  EXPECT_EQ(cache.free_blocks(0), 250);
  EXPECT_EQ(cache.free_blocks(1), 4);
}

TEST(KvCache, GrowFailsWithoutChangingAnything) {
  const KvLayout layout = two_group_layout(0);
  KvCache cache(layout, {2, 2}, 4);
  SequenceKv seq;
  EXPECT_TRUE(cache.grow(seq, 8));
  EXPECT_FALSE(cache.grow(seq, 9));
  EXPECT_EQ(seq.block_tables[0].size(), 2u);
  EXPECT_EQ(cache.free_blocks(0), 0);
}

// A decode graph keyed on the first layer's address alone replayed against a smaller cache
// allocated at that address, writing later layers at the old stride past its end (session 26's
// qwen3moe-tiny crash): the layout a graph is keyed on must tell caches of other sizes apart.
TEST(KvStorage, DeviceLayoutTellsCachesOfOtherSizesApart) {
  KvGroupShape shape;
  shape.num_layers = 2;
  shape.num_blocks = 8;
  shape.kv_heads = 1;
  shape.head_dim = 4;
  const KvGroupStorage big(shape);
  const KvGroupStorage same(shape);
  shape.num_blocks = 3;
  const KvGroupStorage small(shape);
  // Host caches have no device buffers, so the bases are equal (null) in all three, as a
  // reallocated device cache's often are.
  EXPECT_EQ(big.device_layout(), same.device_layout());
  EXPECT_NE(big.device_layout(), small.device_layout());
}

TEST(Sampler, GreedyPicksLowestIndexOfTheMaximum) {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params);
  EXPECT_EQ(sampler.sample(logits.data(), 4), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(100);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i));
  SamplingParams params;
  params.seed = 42;
  Sampler a(params), b(params);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 100), b.sample(logits.data(), 100));
}

TEST(Sampler, FiltersKeepOnlyAllowedTokens) {
  // Probabilities at temperature 1 are proportional to exp(logit).
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto draw_set = [&](SamplingParams params) {
    params.seed = 7;
    Sampler sampler(params);
    std::map<int32_t, int> counts;
    for (int i = 0; i < 2000; ++i) counts[sampler.sample(logits.data(), 4)]++;
    return counts;
  };
  SamplingParams top_k;
  top_k.top_k = 2;
  auto counts = draw_set(top_k);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[0] / 2000.0, 0.5 / 0.8, 0.04);

  SamplingParams top_p;
  top_p.top_p = 0.7f;  // 0.5 + 0.3 reaches 0.7
  counts = draw_set(top_p);
  EXPECT_EQ(counts.size(), 2u);

  SamplingParams min_p;
  min_p.min_p = 0.25f;  // keeps p >= 0.125: tokens 0, 1, 2
  counts = draw_set(min_p);
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts.count(3), 0u);

  SamplingParams all;
  counts = draw_set(all);
  EXPECT_EQ(counts.size(), 4u);
  EXPECT_NEAR(counts[3] / 2000.0, 0.05, 0.02);
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  SamplingParams params;
  params.top_p = 0.0f;
  EXPECT_THROW(params.validate(), Error);
  params = {};
  params.temperature = -1.0f;
  EXPECT_THROW(params.validate(), Error);
  params = {};
  params.min_p = 2.0f;
  EXPECT_THROW(params.validate(), Error);
}

}  // namespace
}  // namespace anvil
