#include <algorithm>
#include <map>

#include "backend/cuda/runtime.h"
#include "core/error.h"
#include "models/model.h"

namespace anvil {

namespace {
const std::map<std::string, ModelFactory>& registry() {
  static const std::map<std::string, ModelFactory> factories = {
      {"GptOssForCausalLM", make_gpt_oss},
      {"Qwen3ForCausalLM", make_qwen3},
      {"Qwen3MoeForCausalLM", make_qwen3_moe},
  };
  return factories;
}
}  // namespace

bool architecture_has_cuda_path(const std::string& architecture) {
  return cuda::compiled_in() && (architecture == "GptOssForCausalLM" || architecture == "Qwen3ForCausalLM" ||
                                 architecture == "Qwen3MoeForCausalLM");
}

int64_t StepBatch::logit_rows() const {
  int64_t rows = 0;
  for (const auto& seq : sequences) rows += seq.all_logits ? seq.num_tokens : seq.need_logits ? 1 : 0;
  return rows;
}

Model::Model(ModelConfig config, std::unique_ptr<WeightSource> weights, Device device, cuda::KvDtype kv_dtype)
    : config_(std::move(config)), device_(device), kv_layout_(make_kv_layout(config_)), weights_(std::move(weights)) {
  kv_layout_.device = device == Device::Cuda ? KvDevice::Cuda : KvDevice::Host;
  kv_layout_.dtype = kv_dtype;
}

ComputeDtype parse_compute_dtype(const std::string& value) {
  if (value == "auto") return ComputeDtype::Auto;
  if (value == "bfloat16" || value == "bf16") return ComputeDtype::BF16;
  if (value == "float32" || value == "float" || value == "fp32") return ComputeDtype::F32;
  fail("--dtype '{}' is not one of auto, bfloat16, float32", value);
}

KvCacheDtype parse_kv_cache_dtype(const std::string& value) {
  if (value == "auto") return KvCacheDtype::Auto;
  if (value == "bfloat16" || value == "bf16") return KvCacheDtype::BF16;
  if (value == "float32" || value == "fp32") return KvCacheDtype::F32;
  if (value == "fp8" || value == "fp8_e4m3") return KvCacheDtype::FP8_E4M3;
  fail("--kv-cache-dtype '{}' is not one of auto, bfloat16, float32, fp8, fp8_e4m3", value);
}

cuda::KvDtype resolve_kv_dtype(const LoadOptions& options) {
  switch (options.kv_cache_dtype) {
    case KvCacheDtype::BF16: return cuda::KvDtype::BF16;
    case KvCacheDtype::F32: return cuda::KvDtype::F32;
    case KvCacheDtype::FP8_E4M3: return cuda::KvDtype::FP8_E4M3;
    case KvCacheDtype::Auto: break;
  }
  return options.dtype == ComputeDtype::F32 ? cuda::KvDtype::F32 : cuda::KvDtype::BF16;
}

void Model::forward_argmax(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, int32_t* token_ids) {
  const int64_t rows = batch.logit_rows(), vocab = config_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  forward(batch, kv_cache, logits.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    token_ids[r] = int32_t(std::max_element(row, row + vocab) - row);
  }
}

KvLayout make_kv_layout(const ModelConfig& config) {
  KvLayout layout;
  layout.kv_heads = config.num_kv_heads;
  layout.head_dim = config.head_dim;
  layout.group_layers = {0};
  layout.group_window = {0};
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const bool sliding = config.layer_types[size_t(i)] == LayerAttention::Sliding && config.sliding_window > 0;
    const int group = sliding ? 1 : 0;
    if (sliding && layout.group_layers.size() == 1) {
      layout.group_layers.push_back(0);
      layout.group_window.push_back(config.sliding_window);
    }
    layout.layer_group.push_back(group);
    layout.layer_slot.push_back(layout.group_layers[size_t(group)]++);
  }
  return layout;
}

std::unique_ptr<Model> create_model(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                    const LoadOptions& options) {
  const auto& factories = registry();
  const auto found = factories.find(config.architecture);
  if (found == factories.end()) fail("architecture '{}' is not supported", config.architecture);
  if (options.device == Device::Cuda) {
    // Checked before any GPU is looked for, so the answer is the same with or without one.

    if (options.quantize_dense && *options.quantize_dense != WeightFormat::FP8)
      fail("--quantize-dense: CUDA quantizes dense layers to fp8 only (mxfp4 applies to --device cpu)");
    cuda::select_device(options.cuda_device);
  } else {
    if (options.dtype == ComputeDtype::BF16)
      fail("--dtype bfloat16: the CPU backend computes in float32 (bfloat16 applies to --device cuda)");
    if (options.kv_cache_dtype == KvCacheDtype::BF16 || options.kv_cache_dtype == KvCacheDtype::FP8_E4M3)
      fail("--kv-cache-dtype: the CPU backend keeps its KV cache in float32 (bfloat16 and fp8 apply to --device cuda)");
  }
  return found->second(config, std::move(weights), options);
}

std::unique_ptr<Model> load_model(const std::filesystem::path& model_dir, const LoadOptions& options) {
  if (!std::filesystem::is_directory(model_dir)) fail("{}: model directory does not exist", model_dir.string());
  ModelConfig config = load_model_config(model_dir / "config.json");
  config.rope.inv_freq_bf16 = options.rope_inv_freq_bf16;
  auto weights = options.format == LoadFormat::Dummy ? make_dummy_weights(options.dummy_seed)
                                                     : open_checkpoint_weights(model_dir);
  return create_model(config, std::move(weights), options);
}

}  // namespace anvil
