#pragma once
// The canonical sampling rule, shared by the CPU sampler (engine/sampler.cpp) and the CUDA
// kernel (backend/cuda/sampling.cu) so that both pick the same token for the same logits,
// parameters and uniform number u in [0, 1):
//
//  1. NaN logits count as -inf. Temperature 0, top_k 1, or a row whose largest logit is not
//     finite: the argmax (the lowest id among equal maxima).
//  2. Tokens are ranked by logit, descending, ties to the lower id.
//  3. p_i = expf((l_i - max) / T) in float32; the token's weight is w_i = floor(p_i * 2^44), an
//     integer, so every sum below is exact and independent of summation order (what lets a
//     parallel kernel agree with a sequential loop). Tokens under 2^-44 of the top token weigh 0.
//  4. top-k (0 < k < vocab): keep the first k by rank.
//  5. top-p (< 1): of those, keep the shortest rank prefix whose weight reaches
//     ceil(top_p * W), W their total weight.
//  6. min-p (> 0): of those, drop tokens with p_i < min_p (p of the top token is 1).
//  7. Inverse CDF over the kept tokens in ascending id order: with W the kept total and
//     t = min(floor(u * W), W - 1), the first kept id whose running weight exceeds t.
//
// The only arithmetic that can differ between the host and a GPU is expf (CUDA's is within 2 ulp,
// glibc's within 1): a token whose p sits within an ulp of min_p, a cut within rounding of
// ceil(top_p * W), or a u within rounding of a CDF boundary may go either way. tests/gpu says how
// that is allowed for.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/host_device.h"

namespace anvil {

// One logit row's draw: temperature 0 (or top_k 1) is greedy; top_k <= 0, top_p 1 and min_p 0
// are off; uniform in [0, 1) is drawn by the caller from the sequence's own generator.
struct RowSampling {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double uniform = 0.0;
};

// The rule on the host (sampling_rule.cpp). scratch, when given, is reused between calls.
int32_t sample_row(const float* logits, int64_t vocab, const RowSampling& row,
                   std::vector<std::pair<float, int32_t>>* scratch = nullptr);

namespace sampling_rule {

// Scale of the integer weights: a vocabulary of 2^19 tokens at weight <= 2^44 sums below 2^63.
inline constexpr float kWeightScale = 0x1p44f;

ANVIL_HOST_DEVICE inline float clean_logit(float x) { return x != x ? -INFINITY : x; }

// An unsigned key with the order of the (cleaned) float: larger logit, larger key.
ANVIL_HOST_DEVICE inline uint32_t order_key(float x) {
  x = clean_logit(x);
#if defined(__CUDA_ARCH__)
  uint32_t bits = __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
#endif
  if (bits == 0x80000000u) bits = 0;  // -0 ranks with +0
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

ANVIL_HOST_DEVICE inline uint64_t weight(float p) { return uint64_t(p * kWeightScale); }

// The weight a top-p prefix must reach, in [1, total].
ANVIL_HOST_DEVICE inline uint64_t top_p_threshold(float top_p, uint64_t total) {
  const double want = std::ceil(double(top_p) * double(int64_t(total)));
  if (want < 1.0) return 1;
  if (want >= double(int64_t(total))) return total;
  return uint64_t(want);
}

// The running weight the drawn token's interval covers, in [0, total - 1].
ANVIL_HOST_DEVICE inline uint64_t draw_target(double uniform, uint64_t total) {
  const double t = std::floor(uniform * double(int64_t(total)));
  if (!(t > 0.0)) return 0;
  if (t >= double(int64_t(total))) return total - 1;
  return uint64_t(t);
}

}  // namespace sampling_rule
}  // namespace anvil
