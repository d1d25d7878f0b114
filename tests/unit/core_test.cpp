// dtypes, the thread pool, and RoPE tables.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "backend/rope.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace anvil {
namespace {

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  for (float value : {0.0f, 1.0f, -2.5f, 3.140625f, std::ldexp(1.0f, -100), 65536.0f})
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(value)), value);
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256.0f), f32_to_bf16(1.0f));  // halfway rounds to even
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DType, F16AllFiniteValuesRoundTrip) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf / nan
    const float value = f16_to_f32(uint16_t(bits));
    EXPECT_EQ(f32_to_f16(value), uint16_t(bits)) << bits;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, Fp8Decoding) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7b), 57344.0f);
}

TEST(DType, Mxfp4Tables) {
  EXPECT_EQ(kFp4E2M1Values[7], 6.0f);
  EXPECT_EQ(kFp4E2M1Values[9], -0.5f);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(120), 1.0f / 128.0f);
}

TEST(ThreadPool, CoversRangeExactlyOnceAndDeterministically) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 64, 1001}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) hits[size_t(i)]++;
        },
        16);
    for (auto& hit : hits) EXPECT_EQ(hit.load(), 1);
  }
  std::vector<std::pair<int64_t, int64_t>> first, second;
  std::mutex mutex;
  for (auto* ranges : {&first, &second}) {
    pool.parallel_for(
        100,
        [&](int64_t begin, int64_t end) {
          std::lock_guard<std::mutex> lock(mutex);
          ranges->emplace_back(begin, end);
        },
        8);
    std::sort(ranges->begin(), ranges->end());
  }
  EXPECT_EQ(first, second);
  for (auto [begin, end] : first) EXPECT_EQ(begin % 8, 0);
}

TEST(ThreadPool, RunsEveryTaskAcrossSpinningAndSleepingWorkers) {
  // Calls back to back (workers still spinning), then after pauses longer than the spin window
  // (workers asleep, woken through the condition variable): every call must run on every thread
  // exactly once and return only when all have finished.
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    std::atomic<int> runs{0};
    for (int call = 0; call < 400; ++call) {
      std::vector<int> seen(size_t(threads), 0);
      pool.run_on_all([&](int index) {
        seen[size_t(index)]++;
        runs++;
      });
      for (int count : seen) ASSERT_EQ(count, 1) << "call " << call;
      if (call % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(3 * ThreadPool::kSpinMicroseconds));
    }
    EXPECT_EQ(runs.load(), 400 * threads);
  }
}

TEST(Rope, YarnFrequenciesMatchTheOpenAIReference) {
  // models.md §1.5.3: gpt-oss, truncate false.
  RopeConfig config;
  config.type = "yarn";
  config.theta = 150000.0;
  config.factor = 32.0;
  config.beta_fast = 32.0;
  config.beta_slow = 1.0;
  config.original_max_position_embeddings = 4096;
  config.truncate = false;
  const RopeTable table(config, 64);
  const double expected[32] = {1.0,
                               0.689044306,
                               0.474782055,
                               0.327145872,
                               0.225418,
                               0.155322989,
                               0.107024421,
                               0.0737445682,
                               0.0508132748,
                               0.0317056962,
                               0.0193350011,
                               0.0115920493,
                               0.00679495949,
                               0.00386035932,
                               0.00209379238,
                               0.0010526021,
                               0.000456483919,
                               0.000129318701,
                               3.83088124e-05,
                               2.6396469e-05,
                               1.81883367e-05,
                               1.25325698e-05,
                               8.63549588e-06,
                               5.95023926e-06,
                               4.09997848e-06,
                               2.82506683e-06,
                               1.94659621e-06,
                               1.34129104e-06,
                               9.2420895e-07,
                               6.36820915e-07,
                               4.38797825e-07,
                               3.02351143e-07};
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(table.inv_freq()[size_t(i)], expected[i], expected[i] * 2e-6) << i;
  EXPECT_NEAR(table.attention_scale(), 1.3465735902799727, 1e-6);

  config.truncate = true;  // rounds the correction range to 8 and 18: dims 9..17 change
  const RopeTable truncated(config, 64);
  EXPECT_NE(truncated.inv_freq()[12], table.inv_freq()[12]);
  EXPECT_EQ(truncated.inv_freq()[3], table.inv_freq()[3]);
}

TEST(Rope, HalfSplitRotationPreservesNorm) {
  RopeConfig config;
  config.theta = 10000.0;
  const RopeTable table(config, 8);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  table.apply(x, 1, 8, 0);
  EXPECT_EQ(x[0], 1.0f);  // position 0 is the identity
  table.apply(x, 1, 8, 5);
  // Dimension 0 pairs with dimension 4 (half split), at angle 5 * inv_freq[0] = 5.
  EXPECT_NEAR(x[0], 1 * std::cos(5.0f) - 5 * std::sin(5.0f), 1e-5);
  EXPECT_NEAR(x[4], 5 * std::cos(5.0f) + 1 * std::sin(5.0f), 1e-5);
}

}  // namespace
}  // namespace anvil
