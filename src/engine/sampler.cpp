#include "engine/sampler.h"

#include <algorithm>
#include <climits>
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

double Sampler::next_uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.greedy()) return sample_with_uniform(logits, vocab, params_, 0.0, &candidates_);
  return sample_with_uniform(logits, vocab, params_, next_uniform(), &candidates_);
}

RowSampling to_row_sampling(const SamplingParams& params, double uniform) {
  RowSampling row;
  row.temperature = params.temperature;
  // Past the vocabulary (and so past int32) top-k keeps everything: the same as off.
  row.top_k = params.top_k > int64_t(INT32_MAX) ? 0 : int32_t(params.top_k);
  row.top_p = params.top_p;
  row.min_p = params.min_p;
  row.uniform = uniform;
  return row;
}

int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& params, double uniform,
                            std::vector<std::pair<float, int32_t>>* scratch) {
  return sample_row(logits, vocab, to_row_sampling(params, uniform), scratch);
}

}  // namespace anvil
