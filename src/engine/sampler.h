#pragma once
// Token sampling: greedy, temperature, top-k, top-p, min-p, seeded. The same seed and logits
// always give the same token, on the CPU or (through sample_with_uniform's rule) on a GPU.
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "backend/sampling_rule.h"

namespace anvil {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 or -1 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  std::optional<uint64_t> seed;

  // Throws anvil::Error naming the field when a value is out of range.
  void validate() const;
  // Whether the token is the argmax and no random number is drawn for it.
  bool greedy() const { return temperature == 0.0f || top_k == 1; }
};

// The device-neutral form of params with one uniform number, for sample_row or a model's
// forward_sample.
RowSampling to_row_sampling(const SamplingParams& params, double uniform);

// The token the canonical rule (backend/sampling_rule.h) picks for uniform in [0, 1): the
// same the CUDA kernel picks. scratch is reused between calls when given.
int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& params, double uniform,
                            std::vector<std::pair<float, int32_t>>* scratch = nullptr);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }
  // Draws this sequence's next uniform number: one per non-greedy token, whether the token is
  // then picked here or on a GPU, so a seeded request gives the same tokens either way.
  double next_uniform();
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest value; the lowest index wins ties.
int32_t argmax(const float* values, int64_t n);

}  // namespace anvil
