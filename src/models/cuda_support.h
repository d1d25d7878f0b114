#pragma once
// What every architecture's CUDA path shares: weights moved to (or generated on) the device, a
// step's metadata uploaded once for all layers, and growable activation buffers. Only compiled
// into builds with the CUDA backend.
#if ANVIL_WITH_CUDA
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/ops.h"
#include "backend/cuda/runtime.h"
#include "models/model.h"
#include "models/weights.h"

namespace anvil {

// Device copies of a model's tensors. Checkpoint tensors are copied straight from the mmap (no
// second host copy); dummy tensors are generated on the GPU, the same values as on the CPU.
class DeviceWeights {
 public:
  explicit DeviceWeights(WeightSource& source) : source_(source) {}
  // A bf16 matrix; F32/F16 checkpoints are converted on the host a row block at a time.
  const uint16_t* bf16(const std::string& name, const std::vector<int64_t>& shape);
  // Raw bytes (MXFP4 blocks and scales).
  const uint8_t* u8(const std::string& name, const std::vector<int64_t>& shape);
  // Small float tensors (norms, biases, sinks), through load_f32.
  const float* f32(const std::string& name, const std::vector<int64_t>& shape);
  const float* upload(const std::vector<float>& host);
  // Several bf16 matrices of equal width stacked into one [sum of rows, in] (fused q/k/v).
  const uint16_t* stacked_bf16(const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t in);
  size_t bytes() const { return bytes_; }

 private:
  void* allocate(size_t bytes);
  void fill_bf16(uint16_t* target, const std::string& name, const std::vector<int64_t>& shape);
  WeightSource& source_;
  std::vector<cuda::DeviceBuffer> buffers_;
  size_t bytes_ = 0;
};

// A step's metadata on the device: tokens, positions, logit rows, and per KV group the
// attention view (sequence rows, start positions, block tables).
class DeviceStep {
 public:
  DeviceStep();
  ~DeviceStep();
  DeviceStep(const DeviceStep&) = delete;
  DeviceStep& operator=(const DeviceStep&) = delete;
  // Throws on an inconsistent batch (the same checks as the CPU's StepContext).
  void upload(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config, cuda::Stream stream);

  int64_t rows = 0, logit_rows = 0;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* logit_row_index = nullptr;
  std::vector<cuda::AttentionBatch> groups;

 private:
  std::vector<int32_t> host_;
  int32_t* pinned_ = nullptr;
  size_t pinned_capacity_ = 0;
  cuda::DeviceBuffer device_;
};

// Device scratch that grows to the largest step seen, so steady-state steps allocate nothing.
class DeviceArena {
 public:
  template <typename T>
  T* get(int slot, int64_t count) {
    if (slot >= int(buffers_.size())) buffers_.resize(size_t(slot) + 1);
    const size_t bytes = size_t(count) * sizeof(T);
    if (buffers_[size_t(slot)].bytes() < bytes) buffers_[size_t(slot)] = cuda::DeviceBuffer(bytes + bytes / 4);
    return buffers_[size_t(slot)].get<T>();
  }

 private:
  std::vector<cuda::DeviceBuffer> buffers_;
};

}  // namespace anvil
#endif
