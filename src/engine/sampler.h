#pragma once
// Token sampling: greedy, temperature, top-k, top-p, min-p, seeded. The same seed and logits
// always give the same token.
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace anvil {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 or -1 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  std::optional<uint64_t> seed;

  // Throws anvil::Error naming the field when a value is out of range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest value; the lowest index wins ties.
int32_t argmax(const float* values, int64_t n);

}  // namespace anvil
