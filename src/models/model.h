#pragma once
// The interface every architecture implements, and the registry that picks one by
// config.json's architectures[0]. A model is stateless between steps except for the KV cache it
// is handed, so one engine thread can batch any mix of prefills and decodes into a step.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/kv_storage.h"
#include "backend/sampling_rule.h"
#include "formats/model_config.h"
#include "models/weights.h"

namespace anvil {

enum class Device { Cpu, Cuda };

// How the model's layers map onto KV cache groups. Layers attending the same way share a group.
struct KvLayout {
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  std::vector<int> layer_group;           // per layer: its group
  std::vector<int64_t> layer_slot;        // per layer: index within its group
  std::vector<int64_t> group_layers;      // per group: how many layers
  std::vector<int64_t> group_window;      // per group: sliding window, 0 for full attention
  KvDevice device = KvDevice::Host;       // where the model wants its cache
  cuda::KvDtype dtype = cuda::KvDtype::BF16;  // its element type on the device
  int num_groups() const { return int(group_layers.size()); }
};

struct SequenceStep {
  int64_t start_pos = 0;   // tokens of this sequence already in the KV cache
  int64_t num_tokens = 0;  // new tokens this step, consecutive in StepBatch::tokens
  std::vector<std::span<const int32_t>> block_tables;  // one per KV group
  bool all_logits = false;   // logits for every new token, else only for the last
  bool need_logits = true;   // false for a prefill chunk that does not reach the end
};

struct StepBatch {
  std::vector<int32_t> tokens;
  std::vector<SequenceStep> sequences;
  // Rows of logits forward() writes: per sequence, num_tokens if all_logits, else 1 if
  // need_logits, else 0.
  int64_t logit_rows() const;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  const KvLayout& kv_layout() const { return kv_layout_; }
  // Bytes of weights one decoded token reads (experts counted at top-k): for bandwidth figures.
  virtual size_t weight_bytes_per_token() const = 0;
  size_t weight_bytes_total() const { return weights_->bytes_loaded(); }
  Device device() const { return device_; }
  // Writes logits [batch.logit_rows(), vocab] and appends the batch's keys/values to the cache.
  virtual void forward(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, float* logits) = 0;
  // The same step, returning only each logit row's argmax (ties to the lower id): greedy decoding
  // without moving logits off the device. This default runs forward() and picks on the host.
  virtual void forward_argmax(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, int32_t* token_ids);
  // The same step, returning each logit row's token drawn with rows[r] by the rule of
  // backend/sampling_rule.h (temperature 0 = argmax): the token the CPU sampler picks for the
  // same uniform, on GPU models without moving logits off the device. This default runs
  // forward() and draws on the host.
  virtual void forward_sample(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, const RowSampling* rows,
                              int32_t* token_ids) {
    const int64_t logit_rows = batch.logit_rows(), vocab = config_.vocab_size;
    std::vector<float> logits(size_t(logit_rows * vocab));
    forward(batch, kv_cache, logits.data());
    for (int64_t r = 0; r < logit_rows; ++r) token_ids[r] = sample_row(logits.data() + r * vocab, vocab, rows[r]);
  }
  // GPU models: while on, steps run kernel by kernel with device events between operations, and
  // step_profile() returns (operation, ms) summed over the steps since the last call.
  virtual void set_step_profiling(bool on) { (void)on; }
  virtual std::vector<std::pair<std::string, double>> step_profile() { return {}; }
  // GPU models: the device time of the decode-graph replays since the last call, per replay (0
  // where none ran), so a caller can tell the GPU's share of a step from the host's.
  virtual double graph_replay_ms() { return 0.0; }

 protected:
  Model(ModelConfig config, std::unique_ptr<WeightSource> weights, Device device = Device::Cpu,
        cuda::KvDtype kv_dtype = cuda::KvDtype::BF16);
  ModelConfig config_;
  Device device_ = Device::Cpu;
  KvLayout kv_layout_;
  std::unique_ptr<WeightSource> weights_;
};

enum class LoadFormat { Auto, Dummy };

// Numerics of the CUDA path (`--dtype`, `--kv-cache-dtype`); the CPU computes and caches in
// float32 whatever is asked. Auto: bf16 matrix inputs and a bf16 KV cache. F32 keeps every
// activation and the cache in float32 on CUDA cores: slower, but within float32 rounding of the
// reference (what fixture checks need; bf16 rounding alone moves a tiny random model's logits by
// whole units).
enum class ComputeDtype { Auto, BF16, F32 };
enum class KvCacheDtype { Auto, BF16, F32, FP8_E4M3 };

struct LoadOptions {
  LoadFormat format = LoadFormat::Auto;
  uint64_t dummy_seed = 0;
  bool rope_inv_freq_bf16 = false;  // see RopeConfig::inv_freq_bf16
  Device device = Device::Cpu;
  int cuda_device = 0;
  ComputeDtype dtype = ComputeDtype::Auto;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
  bool enforce_eager = false;  // CUDA: never replay decode steps as CUDA graphs (vLLM's flag)
  // CPU only: re-quantize at load (`--quantize-experts`, `--quantize-dense`); empty keeps the
  // checkpoint's format. Experts: MXFP4 or NVFP4. Dense: FP8 or MXFP4, for attention projections
  // and dense MLPs; embeddings, lm_head, routers and norms are never re-quantized.
  std::optional<WeightFormat> quantize_experts;
  std::optional<WeightFormat> quantize_dense;
};

// Parses `--dtype` / `--kv-cache-dtype` values (vLLM's spellings); fails naming the flag.
ComputeDtype parse_compute_dtype(const std::string& value);
KvCacheDtype parse_kv_cache_dtype(const std::string& value);
// The device cache's element type for these options (Auto follows --dtype).
cuda::KvDtype resolve_kv_dtype(const LoadOptions& options);

// Reads config.json (and the weights unless dummy) from model_dir.
std::unique_ptr<Model> load_model(const std::filesystem::path& model_dir, const LoadOptions& options = {});
// Builds a model from a parsed config and a weight source.
std::unique_ptr<Model> create_model(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                    const LoadOptions& options = {});

// Registry: one line per architecture, in registry.cpp.
using ModelFactory =
    std::function<std::unique_ptr<Model>(const ModelConfig&, std::unique_ptr<WeightSource>, const LoadOptions&)>;
std::unique_ptr<Model> make_gpt_oss(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                    const LoadOptions& options);
std::unique_ptr<Model> make_qwen3(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                  const LoadOptions& options);
std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                      const LoadOptions& options);

// Whether an architecture's model file has a CUDA forward pass.
bool architecture_has_cuda_path(const std::string& architecture);

// Groups: 0 = full-attention layers, 1 = sliding-window layers (when the model has any).
KvLayout make_kv_layout(const ModelConfig& config);

}  // namespace anvil
