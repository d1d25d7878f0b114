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
  std::vector<float> floats(size_t(out * in)), bias(static_cast<size_t>(out));
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
                : format == WeightFormat::F32  ? static_cast<const void*>(floats.data())
                                               : static_cast<const void*>(halves.data());
  weight.scales = scales.data();
  weight.bias = bias.data();

  ThreadPool pool(2);
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

}  // namespace
}  // namespace anvil
