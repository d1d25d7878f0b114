#pragma once
// Rotary position embedding tables: default RoPE and YaRN ("NTK-by-parts"), half-split (NeoX)
// rotation as gpt-oss and Qwen3 use. The YaRN correction range follows the OpenAI reference
// formula; `truncate` rounds it as transformers does when the config asks for that.
#include <cstdint>
#include <vector>

#include "formats/model_config.h"

namespace anvil {

class RopeTable {
 public:
  RopeTable(const RopeConfig& config, int64_t rotary_dim);

  int64_t rotary_dim() const { return rotary_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_scale() const { return mscale_; }

  // Rotates `heads` vectors of head_dim floats at `x` (consecutive) for absolute position pos.
  void apply(float* x, int64_t heads, int64_t head_dim, int64_t position) const;

 private:
  int64_t rotary_dim_;
  std::vector<float> inv_freq_;
  float mscale_ = 1.0f;
};

}  // namespace anvil
