#pragma once
// The KV layout and model config of one full or sliding layer, for GPU tests that upload a step
// (DeviceStep) without a model.
#include <cstdint>

#include "models/model.h"

namespace anvil::test {

inline KvLayout one_layer_layout(int64_t kv_heads, int64_t head_dim, int64_t window) {
  KvLayout layout;
  layout.kv_heads = kv_heads;
  layout.head_dim = head_dim;
  layout.group_layers = {1};
  layout.group_window = {window};
  layout.layer_group = {0};
  layout.layer_slot = {0};
  return layout;
}

// Positions up to max_positions; a vocabulary of one.
inline ModelConfig positions_only_config(int64_t max_positions) {
  ModelConfig config;
  config.vocab_size = 1;
  config.max_position_embeddings = max_positions;
  return config;
}

}  // namespace anvil::test
