// The canonical sampling rule (backend/sampling_rule.h) on the CPU: hand-worked draws, a naive
// restatement of the rule over random rows, and the seeded Sampler drawing through it. The CUDA
// kernel is compared with the same function in tests/gpu/sampling_gpu_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "backend/sampling_rule.h"
#include "engine/sampler.h"

namespace anvil {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SamplingParams make(float temperature, int64_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

// The rule restated the slow, obvious way: sort everything by rank, cut, re-sort by id, walk.
int32_t naive_rule(const std::vector<float>& raw, const SamplingParams& p, double u) {
  const int64_t n = int64_t(raw.size());
  std::vector<float> l(raw.size());
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::isnan(raw[i]) ? kNegInf : raw[i];
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  const float max = l[size_t(order[0])];
  if (p.temperature == 0.0f || p.top_k == 1 || !std::isfinite(max)) return order[0];
  auto prob = [&](int32_t i) { return std::exp((l[size_t(i)] - max) / p.temperature); };
  auto w = [&](int32_t i) { return uint64_t(std::ldexp(double(prob(i)), 44)); };
  if (p.top_k > 0 && p.top_k < n) order.resize(size_t(p.top_k));
  if (p.top_p < 1.0f) {
    uint64_t total = 0;
    for (int32_t i : order) total += w(i);
    const uint64_t need = uint64_t(std::max(1.0, std::min(std::ceil(double(p.top_p) * double(total)), double(total))));
    uint64_t run = 0;
    size_t cut = 0;
    while (run < need) run += w(order[cut++]);
    order.resize(cut);
  }
  std::erase_if(order, [&](int32_t i) { return p.min_p > 0.0f && prob(i) < p.min_p; });
  std::sort(order.begin(), order.end());
  uint64_t total = 0;
  for (int32_t i : order) total += w(i);
  const uint64_t target = std::min(uint64_t(std::floor(u * double(total))), total - 1);
  uint64_t run = 0;
  for (int32_t i : order)
    if ((run += w(i)) > target) return i;
  return -1;
}

TEST(SamplingRule, DrawsByInverseCdfInIdOrder) {
  // Relative probabilities 0.1, 1, 0.3, 0.6 (total 2): the CDF runs in id order, not by rank.
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.15f), std::log(0.3f)};
  const auto p = make(1.0f);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, 0.0), 0);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, 0.04), 0);   // 0.08 < 0.1
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, 0.06), 1);   // 0.12 in [0.1, 1.1)
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, 0.54), 1);   // 1.08
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, 0.56), 2);   // 1.12 in [1.1, 1.4)
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, 0.71), 3);   // 1.42
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, p, std::nextafter(1.0, 0.0)), 3);
}

TEST(SamplingRule, FiltersCutByRankThenMinP) {
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.15f), std::log(0.3f)};
  // top-k 2 keeps ids 1 and 3 (weights 1 and 0.6 of 1.6).
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 2), 0.0), 1);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 2), 0.6), 1);  // 0.96 < 1
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 2), 0.65), 3);
  // top-p: 0.45 of 2 is reached by the top token alone; 0.75 needs the top two; 0.85 three.
  for (double u : {0.0, 0.5, 0.99}) EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 0.45f), u), 1);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 0.75f), 0.99), 3);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 0.85f), 0.0), 1);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 0.85f), 0.99), 3);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 0.85f), 0.65), 2);  // 1.235 of 1.9
  // top-p applies to what top-k kept: of {1, 3}, 0.65 of 1.6 needs both.
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 2, 0.65f), 0.99), 3);
  // min-p 0.2 drops id 0 (0.1 of the top), keeps the rest; min-p 0.5 keeps 1 and 3.
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 1.0f, 0.2f), 0.0), 1);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 1.0f, 0.5f), 0.99), 3);
  EXPECT_EQ(sample_with_uniform(logits.data(), 4, make(1.0f, 0, 1.0f, 0.5f), 0.5), 1);  // 0.8 < 1
}

TEST(SamplingRule, TiesGoToTheLowerIdAndMaskedTokensNeverWin) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 2.0f, kNegInf};
  for (double u : {0.0, 0.3, 0.49}) EXPECT_EQ(sample_with_uniform(logits.data(), 5, make(1.0f, 2), u), 1);
  for (double u : {0.51, 0.9, 0.999}) EXPECT_EQ(sample_with_uniform(logits.data(), 5, make(1.0f, 2), u), 2);
  // top-p at a tie: one of three equal tokens is enough for 0.2 of the mass, the lowest id.
  EXPECT_EQ(sample_with_uniform(logits.data(), 5, make(1.0f, 0, 0.2f), 0.99), 1);
  EXPECT_EQ(sample_with_uniform(logits.data(), 5, make(0.0f), 0.7), 1);
  for (double u : {0.0, 0.5, 0.999999}) EXPECT_NE(sample_with_uniform(logits.data(), 5, make(1.5f), u), 4);

  const std::vector<float> masked = {kNegInf, kNegInf, kNegInf};
  EXPECT_EQ(sample_with_uniform(masked.data(), 3, make(1.0f), 0.9), 0);
  const std::vector<float> with_nan = {std::nanf(""), 0.5f, kNegInf};
  EXPECT_EQ(sample_with_uniform(with_nan.data(), 3, make(1.0f), 0.0), 1);  // NaN counts as -inf
  EXPECT_EQ(sample_with_uniform(with_nan.data(), 3, make(0.0f), 0.0), 1);
  const float one = 3.0f;
  EXPECT_EQ(sample_with_uniform(&one, 1, make(0.7f, 50, 0.9f, 0.1f), 0.999), 0);
}

TEST(SamplingRule, MatchesTheNaiveRestatementOnRandomRows) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::pair<float, int32_t>> scratch;
  int checked = 0;
  for (int64_t vocab : {1, 7, 1000, 5000}) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (auto& l : logits) {
        l = normal(rng);
        if (kind == 1) l = std::round(l);            // many ties
        if (kind == 2 && uniform(rng) < 0.5) l = kNegInf;  // masked
      }
      for (float t : {0.0f, 0.7f, 1.5f})
        for (int64_t k : {0, 1, 50})
          for (float top_p : {1.0f, 0.9f, 1e-6f})
            for (float min_p : {0.0f, 0.1f})
              for (int draw = 0; draw < 4; ++draw) {
                const auto p = make(t, k, top_p, min_p);
                const double u = uniform(rng);
                ASSERT_EQ(sample_with_uniform(logits.data(), vocab, p, u, &scratch), naive_rule(logits, p, u))
                    << "vocab " << vocab << " kind " << kind << " T " << t << " k " << k << " top_p " << top_p
                    << " min_p " << min_p << " u " << u;
                ++checked;
              }
    }
  }
  EXPECT_EQ(checked, 4 * 3 * 3 * 3 * 3 * 2 * 4);
}

TEST(SamplingRule, SeededSamplerDrawsOneUniformPerToken) {
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 2.0f * std::sin(float(i));
  auto p = make(0.8f, 40, 0.95f, 0.05f);
  p.seed = 11;
  Sampler sampler(p), uniforms(p);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(sampler.sample(logits.data(), 300), sample_with_uniform(logits.data(), 300, p, uniforms.next_uniform()));
}

TEST(SamplingRule, DistributionIsTheTemperedSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, -1.0f, 0.5f, kNegInf};
  const float t = 0.7f;
  std::vector<double> want(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += want[i] = std::exp(double(logits[i]) / t);
  auto p = make(t);
  p.seed = 3;
  Sampler sampler(p);
  std::vector<int> counts(logits.size(), 0);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) counts[size_t(sampler.sample(logits.data(), int64_t(logits.size())))]++;
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(counts[i] / double(draws), want[i] / sum, 0.01) << i;
}

TEST(SamplingRule, IntegerHelpersStayInRange) {
  namespace rule = sampling_rule;
  EXPECT_EQ(rule::weight(1.0f), uint64_t(1) << 44);
  EXPECT_EQ(rule::weight(0.0f), 0u);
  EXPECT_EQ(rule::top_p_threshold(1.0f, 10), 10u);
  EXPECT_EQ(rule::top_p_threshold(1e-6f, 10), 1u);
  EXPECT_EQ(rule::top_p_threshold(0.5f, 9), 5u);
  EXPECT_EQ(rule::draw_target(0.0, 10), 0u);
  EXPECT_EQ(rule::draw_target(std::nextafter(1.0, 0.0), 10), 9u);
  EXPECT_EQ(rule::draw_target(1.0, 10), 9u);
  EXPECT_LT(rule::order_key(-1.0f), rule::order_key(-0.5f));
  EXPECT_LT(rule::order_key(-0.5f), rule::order_key(0.0f));
  EXPECT_EQ(rule::order_key(-0.0f), rule::order_key(0.0f));
  EXPECT_LT(rule::order_key(0.0f), rule::order_key(1e-30f));
  EXPECT_EQ(rule::order_key(std::nanf("")), rule::order_key(kNegInf));
  EXPECT_GT(rule::order_key(kNegInf), 0u);
}

}  // namespace
}  // namespace anvil
