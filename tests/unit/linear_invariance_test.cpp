// Batch invariance: a token's output must not depend on how many other tokens share the call.
// The serving engine batches unrelated requests into one step; without this, a request's
// greedy tokens would change with the traffic around it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/linear.h"
#include "core/dtype.h"

namespace anvil {
namespace {

void expect_batch_invariant(WeightFormat format, int64_t out, int64_t in) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<uint8_t> codes(size_t(out * in / 2)), scales(size_t(out * in / 32));
  std::vector<uint16_t> halves(size_t(out * in));
  std::vector<float> floats(size_t(out * in)), bias(static_cast<size_t>(out)), row_scales(static_cast<size_t>(out));
  // FP8 (one E4M3 byte per weight, never the NaN codes 0x7f / 0xff) or MXFP4 (two codes per byte).
  std::vector<uint8_t> bytes(size_t(out * in));
  for (auto& b : bytes) b = uint8_t(rng() % 0x7f) | uint8_t(rng() & 0x80);
  for (auto& s : row_scales) s = 0.25f + 0.01f * float(rng() % 100);
  for (auto& b : codes) b = uint8_t(rng());
  for (auto& s : scales) s = uint8_t(120 + rng() % 8);
  for (size_t i = 0; i < halves.size(); ++i) {
    floats[i] = uniform(rng);
    halves[i] = format == WeightFormat::F16 ? f32_to_f16(floats[i]) : f32_to_bf16(floats[i]);
  }
  for (auto& b : bias) b = uniform(rng);
  LinearWeight weight;
  weight.format = format;
  weight.out_features = out;
  weight.in_features = in;
  weight.data = format == WeightFormat::MXFP4 ? static_cast<const void*>(codes.data())
                : format == WeightFormat::FP8  ? static_cast<const void*>(bytes.data())
                : format == WeightFormat::F32  ? static_cast<const void*>(floats.data())
                                               : static_cast<const void*>(halves.data());
  weight.scales = scales.data();
  if (format == WeightFormat::FP8) weight.row_scales = row_scales.data();
  weight.bias = bias.data();

  // More threads than rows per thread grain on the larger layers, so partitions vary.
  ThreadPool pool(3);
  const int64_t max_tokens = 70;
  std::vector<float> x(size_t(max_tokens * in));
  for (auto& v : x) v = uniform(rng);
  std::vector<float> alone(size_t(max_tokens * out)), together(size_t(max_tokens * out));
  for (int64_t t = 0; t < max_tokens; ++t) linear_forward(weight, x.data() + t * in, 1, alone.data() + t * out, pool);
  for (int64_t tokens : {2, 3, 4, 5, 7, 8, 13, 48, 49, 70}) {
    linear_forward(weight, x.data(), tokens, together.data(), pool);
    for (int64_t t = 0; t < tokens; ++t)
      ASSERT_EQ(std::memcmp(alone.data() + t * out, together.data() + t * out, size_t(out) * sizeof(float)), 0)
          << "token " << t << " of " << tokens;
  }
}

TEST(LinearBatchInvariance, Mxfp4) {
  const Mxfp4Activations saved = mxfp4_activations();
  for (Mxfp4Activations mode : {Mxfp4Activations::Float32, Mxfp4Activations::Int8}) {
    SCOPED_TRACE(mxfp4_activations_name(mode));
    set_mxfp4_activations(mode);
    expect_batch_invariant(WeightFormat::MXFP4, 67, 2880);
  }
  set_mxfp4_activations(saved);
}
TEST(LinearBatchInvariance, Bf16) { expect_batch_invariant(WeightFormat::BF16, 67, 2880); }
TEST(LinearBatchInvariance, F16) { expect_batch_invariant(WeightFormat::F16, 33, 640); }
TEST(LinearBatchInvariance, F32) { expect_batch_invariant(WeightFormat::F32, 33, 640); }
TEST(LinearBatchInvariance, Fp8) { expect_batch_invariant(WeightFormat::FP8, 37, 656); }
// Row lengths that leave a tail after the last whole chunk, and row counts that leave rows after
// the last whole tile: the paths for both must keep the canonical order too.
TEST(LinearBatchInvariance, Bf16RaggedShape) { expect_batch_invariant(WeightFormat::BF16, 35, 2888); }
TEST(LinearBatchInvariance, F32RaggedShape) { expect_batch_invariant(WeightFormat::F32, 19, 644); }

}  // namespace
}  // namespace anvil
