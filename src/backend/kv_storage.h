#pragma once
// Paged storage for attention keys and values. Layers that attend the same way share a group;
// each group has its own pool of fixed-size blocks, so sliding-window layers can give back
// blocks that fell out of their window while full-attention layers keep theirs. Which block a
// sequence's position lives in is the engine's business (block tables); this only stores.
#include <compare>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/runtime.h"

namespace anvil {

// Where a model's KV cache lives: float32 in host memory for the CPU backend, device memory of
// the chosen element type (bf16 by default) for the CUDA backend.
enum class KvDevice { Host, Cuda };

struct KvGroupShape {
  int64_t num_layers = 0;  // layers in this group
  int64_t num_blocks = 0;
  int64_t block_size = 16;  // positions per block
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  KvDevice device = KvDevice::Host;
  cuda::KvDtype dtype = cuda::KvDtype::BF16;  // device caches only; the host cache is float32
};

class KvGroupStorage {
 public:
  explicit KvGroupStorage(const KvGroupShape& shape);
  const KvGroupShape& shape() const { return shape_; }
  // Host: start of [kv_heads, head_dim] floats for (layer in group, block, slot in block).
  float* key(int64_t layer, int64_t block, int64_t slot) { return keys_.data() + offset(layer, block, slot); }
  float* value(int64_t layer, int64_t block, int64_t slot) { return values_.data() + offset(layer, block, slot); }
  // Device: one layer's [num_blocks, block_size, kv_heads, head_dim] keys / values of shape().dtype.
  void* device_keys(int64_t layer) const { return device_keys_.get<uint8_t>() + offset(layer, 0, 0) * element_bytes(shape_); }
  void* device_values(int64_t layer) const {
    return device_values_.get<uint8_t>() + offset(layer, 0, 0) * element_bytes(shape_);
  }
  // What every device pointer into this cache follows from: layer l's keys sit at
  // keys + l * num_blocks * (block bytes), its values likewise. A CUDA graph captured against one
  // cache may replay against another only if these are equal; the first layer's address alone
  // is not enough, as a smaller cache freed and allocated again often starts at the same address
  // while every later layer moves.
  struct DeviceLayout {
    const void* keys = nullptr;
    const void* values = nullptr;
    int64_t num_blocks = 0;
    auto operator<=>(const DeviceLayout&) const = default;
  };
  DeviceLayout device_layout() const {
    return {device_keys_.get<uint8_t>(), device_values_.get<uint8_t>(), shape_.num_blocks};
  }
  size_t bytes() const { return size_t(shape_.num_blocks) * bytes_per_block(shape_); }
  static size_t element_bytes(const KvGroupShape& shape) {
    return shape.device == KvDevice::Host ? sizeof(float) : cuda::kv_dtype_bytes(shape.dtype);
  }
  static size_t bytes_per_block(const KvGroupShape& shape) {
    const size_t element = element_bytes(shape);
    return size_t(2 * shape.num_layers * shape.block_size * shape.kv_heads * shape.head_dim) * element;
  }

 private:
  size_t offset(int64_t layer, int64_t block, int64_t slot) const {
    return size_t(((layer * shape_.num_blocks + block) * shape_.block_size + slot) * shape_.kv_heads * shape_.head_dim);
  }
  KvGroupShape shape_;
  std::vector<float> keys_;
  std::vector<float> values_;
  cuda::DeviceBuffer device_keys_, device_values_;
};

}  // namespace anvil
