#include "backend/rope.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace anvil {

namespace {
// Dimension index at which a wavelength makes `rotations` full turns over the original context.
double yarn_correction_dim(double rotations, double dim, double base, double original_context) {
  return dim * std::log(original_context / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}
}  // namespace

RopeTable::RopeTable(const RopeConfig& config, int64_t rotary_dim) : rotary_dim_(rotary_dim) {
  if (rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > 1024)
    fail("rotary dimension {} must be even and in [2, 1024]", rotary_dim);
  const int64_t half = rotary_dim / 2;
  inv_freq_.resize(size_t(half));
  // The reference computes the frequencies in float32; so do we, to match it bit for bit.
  std::vector<float> position_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(rotary_dim);
    position_freq[size_t(i)] = std::pow(float(config.theta), exponent);
    inv_freq_[size_t(i)] = 1.0f / position_freq[size_t(i)];
  }
  if (config.type == "yarn") {
    const double factor = config.factor;
    if (factor <= 0) fail("rope factor must be positive, got {}", factor);
    if (config.original_max_position_embeddings <= 0) fail("yarn rope needs original_max_position_embeddings");
    const double original = double(config.original_max_position_embeddings);
    double low = yarn_correction_dim(config.beta_fast, double(rotary_dim), config.theta, original);
    double high = yarn_correction_dim(config.beta_slow, double(rotary_dim), config.theta, original);
    if (config.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(rotary_dim - 1));
    if (high == low) high += 0.001;  // transformers avoids a division by zero the same way
    for (int64_t i = 0; i < half; ++i) {
      const float extrapolation = inv_freq_[size_t(i)];
      const float interpolation = 1.0f / (float(factor) * position_freq[size_t(i)]);
      const float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.0f, 1.0f);
      const float extrapolation_weight = 1.0f - ramp;
      inv_freq_[size_t(i)] = interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
    }
    mscale_ = config.attention_factor ? float(*config.attention_factor) : float(0.1 * std::log(factor) + 1.0);
  } else if (config.type != "default") {
    fail("rope type '{}' is not supported (supported: default, yarn)", config.type);
  }
  if (config.inv_freq_bf16)
    for (float& f : inv_freq_) f = bf16_to_f32(f32_to_bf16(f));
}

void RopeTable::apply(float* x, int64_t heads, int64_t head_dim, int64_t position) const {
  const int64_t half = rotary_dim_ / 2;
  // cos/sin are formed in float32 from a float32 angle, as the reference does.
  float cos_table[512], sin_table[512];
  for (int64_t i = 0; i < half; ++i) {
    const float angle = float(position) * inv_freq_[size_t(i)];
    cos_table[i] = std::cos(angle) * mscale_;
    sin_table[i] = std::sin(angle) * mscale_;
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_table[i] - b * sin_table[i];
      v[i + half] = b * cos_table[i] + a * sin_table[i];
    }
  }
}

}  // namespace anvil
