#pragma once
// What every architecture's CUDA path shares: weights moved to (or generated on) the device, a
// step's metadata uploaded once for all layers, and growable activation buffers. Only compiled
// into builds with the CUDA backend.
#if ANVIL_WITH_CUDA
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
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
  // Raw bytes (MXFP4 scales).
  const uint8_t* u8(const std::string& name, const std::vector<int64_t>& shape);
  // A checkpoint's MXFP4 experts `prefix`_blocks [E, N, K/32, 16] and `prefix`_scales
  // [E, N, K/32] in `format`: as stored (MXFP4), or re-quantized on the device by the CPU
  // quantizer's rule (--quantize-experts nvfp4 / fp8); the codes in the device layouts the MoE
  // kernels read (cuda::ExpertFormat). Fails naming the tensor on a non-finite weight.
  struct Experts {
    const uint8_t* codes = nullptr;
    const uint8_t* scales = nullptr;      // MXFP4, NVFP4
    const float* row_scales = nullptr;    // NVFP4, FP8: [E, N]
  };
  Experts experts(const std::string& prefix, int64_t experts, int64_t rows, int64_t in, cuda::ExpertFormat format);
  // Per-expert bf16 checkpoint matrices quantized on the device into one expert matrix [E, N, in]
  // in `format` (--quantize-experts on Qwen3-MoE), by the CPU quantizer's rule for each checkpoint
  // matrix: names[e] lists expert e's matrices of `rows` rows each, whose rows interleave (gate
  // and up: row 2j of the result is gate row j, row 2j+1 up row j), N = names[e].size() * rows.
  // Fails naming the tensor on a non-finite weight.
  Experts quantized_experts(const std::vector<std::vector<std::string>>& names, int64_t rows, int64_t in,
                            cuda::ExpertFormat format);
  // Small float tensors (norms, biases, sinks), through load_f32.
  const float* f32(const std::string& name, const std::vector<int64_t>& shape);
  const float* upload(const std::vector<float>& host);
  // Several bf16 matrices of equal width stacked into one [sum of rows, in] (fused q/k/v).
  const uint16_t* stacked_bf16(const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t in);
  // The same stacking as a dense layer: bf16 as stored, or with fp8 (--quantize-dense fp8)
  // quantized to FP8 E4M3 rows on the device by the CPU quantizer's rule (the bf16 copy is only
  // staging). Fails naming the tensor on a non-finite weight.
  cuda::DenseWeight dense(const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t in,
                          bool fp8);
  size_t bytes() const { return bytes_; }

 private:
  void* allocate(size_t bytes);
  uint8_t* upload_u8(const std::string& name, const std::vector<int64_t>& shape);
  void fill_u8(uint8_t* target, const std::string& name, const std::vector<int64_t>& shape);
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
  // Throws on an inconsistent batch (the same checks as the CPU's StepContext). With
  // graph_shapes, block tables are padded to a power-of-two stride and max_context is that
  // stride's capacity, so consecutive decode steps of one batch have identical kernel arguments
  // (a CUDA graph replays them) until a sequence outgrows the stride.
  void upload(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config, cuda::Stream stream,
              bool graph_shapes = false);
  // Changes whenever the device image moved (a graph captured before then is stale).
  uint64_t generation() const { return generation_; }

  int64_t rows = 0, logit_rows = 0;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* logit_row_index = nullptr;
  std::vector<cuda::AttentionBatch> groups;

 private:
  std::vector<int32_t> host_;
  uint64_t generation_ = 0;
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
    if (buffers_[size_t(slot)].bytes() < bytes) {
      buffers_[size_t(slot)] = cuda::DeviceBuffer(bytes + bytes / 4);
      ++generation_;
    }
    return buffers_[size_t(slot)].get<T>();
  }
  // As get, zero-filled (on `stream`) whenever the buffer is new: for workspaces whose users
  // keep part of them at zero between calls (attention's tickets).
  template <typename T>
  T* get_zeroed(int slot, int64_t count, cuda::Stream stream) {
    const uint64_t before = generation_;
    T* data = get<T>(slot, count);
    if (generation_ != before) cuda::memset_device(data, 0, buffers_[size_t(slot)].bytes(), stream);
    return data;
  }
  // Changes whenever a buffer moved (a graph captured before then is stale).
  uint64_t generation() const { return generation_; }

 private:
  std::vector<cuda::DeviceBuffer> buffers_;
  uint64_t generation_ = 0;
};

// What a model's CUDA step needs around its kernels: its own stream, the step's metadata on the
// device, scratch, and decode steps replayed as CUDA graphs. A model supplies `enqueue`, which
// puts the whole step (embedding to logits, and their argmax when asked) on `stream` reading only
// device memory, and leaves the results in device_logits / device_ids. Sampling is the runner's:
// it follows enqueue with cuda::sample_rows in the same graph.
class CudaStepRunner {
 public:
  cuda::OwnedStream stream;
  cuda::StreamMarks marks{stream.get()};  // per-operation breakdown (Model::set_step_profiling)
  DeviceStep step;
  DeviceArena arena;
  bool graphs_enabled = true;
  float* device_logits = nullptr;  // [step.logit_rows, vocab], set by enqueue
  int32_t* device_ids = nullptr;   // [step.logit_rows], set by enqueue when argmax

  // Uploads the batch, runs the step (a decode step, one new token per sequence, replays a graph
  // once its shape has run before with the same buffers), and copies to the host the logits, or
  // with token_ids one token per logit row: with `sampling` (host, [logit_rows]) each row's draw
  // (backend/sampling_rule.h), else its argmax.
  void run(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config,
           const std::vector<KvGroupStorage>& kv_cache, float* logits, int32_t* token_ids,
           const std::function<void(bool argmax)>& enqueue, const RowSampling* sampling = nullptr);
  // The device time of the graph replays since the last call, per replay (0 if none ran): a
  // step's wall time minus this is what the host adds between replays.
  double take_replay_ms();

 private:
  enum class Mode { Logits, Greedy, Sample };
  // Arena slots of the sampling parameters and drawn ids, past any a model uses.
  static constexpr int kSamplingSlot = 64, kSampledIdsSlot = 65;

  // What a decode graph's kernel arguments depend on.
  struct GraphKey {
    int64_t rows, logit_rows;
    Mode mode;
    std::vector<int64_t> strides;  // per KV group
    std::vector<KvGroupStorage::DeviceLayout> caches;  // per KV group: the cache the graph writes into
    auto operator<=>(const GraphKey&) const = default;
  };
  struct GraphEntry {
    cuda::StreamGraph graph;
    bool warm = false;  // ran once eagerly with these buffers
    uint64_t step_generation = 0, arena_generation = 0;
  };
  std::map<GraphKey, GraphEntry> graphs_;
  cuda::EventTimer replay_timer_{stream.get()};
  double replay_ms_ = 0;
  int64_t replays_ = 0;
};

}  // namespace anvil
#endif
