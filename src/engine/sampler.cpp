#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) fail("temperature must be >= 0, got {}", temperature);
  if (top_k < -1) fail("top_k must be -1, 0 or positive, got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("top_p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("min_p must be in [0, 1], got {}", min_p);
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {
  params_.validate();
}

int32_t argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (values[i] > values[best]) best = i;
  return int32_t(best);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return argmax(logits, vocab);

  // Softmax at the temperature over all tokens, then filter by rank (top-k), cumulative mass
  // (top-p) and relative probability (min-p), then draw from what is left.
  candidates_.resize(size_t(vocab));
  float max_logit = logits[argmax(logits, vocab)];
  for (int64_t i = 0; i < vocab; ++i) {
    const float p = std::exp((logits[i] - max_logit) / params_.temperature);
    candidates_[size_t(i)] = {p, int32_t(i)};
  }
  auto by_probability = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = size_t(vocab);
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + long(keep), candidates_.end(), by_probability);
  } else if (params_.top_p < 1.0f) {
    std::sort(candidates_.begin(), candidates_.end(), by_probability);
  }
  candidates_.resize(keep);
  if (params_.top_p < 1.0f) {
    double kept_sum = 0.0;
    for (const auto& c : candidates_) kept_sum += c.first;
    double cumulative = 0.0;
    size_t cut = 0;
    while (cut < candidates_.size()) {
      cumulative += candidates_[cut].first;
      ++cut;
      if (cumulative >= params_.top_p * kept_sum) break;
    }
    candidates_.resize(cut);
  }
  if (params_.min_p > 0.0f) {
    // The most likely token has probability exp(0) = 1 before normalization.
    const float threshold = params_.min_p;
    std::erase_if(candidates_, [threshold](const auto& c) { return c.first < threshold; });
  }
  double total = 0.0;
  for (const auto& c : candidates_) total += c.first;
  std::uniform_real_distribution<double> uniform(0.0, total);
  double draw = uniform(rng_);
  for (const auto& c : candidates_) {
    draw -= c.first;
    if (draw <= 0.0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace anvil
