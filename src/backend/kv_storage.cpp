#include "backend/kv_storage.h"

#include "core/error.h"

namespace anvil {

KvGroupStorage::KvGroupStorage(const KvGroupShape& shape) : shape_(shape) {
  if (shape.num_layers < 0 || shape.num_blocks < 0 || shape.block_size <= 0 || shape.kv_heads <= 0 ||
      shape.head_dim <= 0)
    fail("KV cache shape is invalid (layers {}, blocks {}, block size {}, kv heads {}, head dim {})",
         shape.num_layers, shape.num_blocks, shape.block_size, shape.kv_heads, shape.head_dim);
  const size_t n = size_t(shape.num_layers * shape.num_blocks * shape.block_size * shape.kv_heads * shape.head_dim);
  if (shape.device == KvDevice::Cuda) {
    device_keys_ = cuda::DeviceBuffer(n * element_bytes(shape));
    device_values_ = cuda::DeviceBuffer(n * element_bytes(shape));
    return;
  }
  keys_.resize(n);
  values_.resize(n);
}

}  // namespace anvil
