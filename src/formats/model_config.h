#pragma once
// config.json, generation_config.json and tokenizer_config.json turned into typed structs.
// Both the published form (rope_scaling + top-level rope_theta) and the transformers-5 form
// (rope_parameters) are read.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace anvil {

enum class LayerAttention { Full, Sliding };

struct RopeConfig {
  std::string type = "default";  // "default" or "yarn"
  double theta = 10000.0;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;  // transformers' default when the key is absent
  std::optional<double> attention_factor;  // overrides 0.1 ln(factor) + 1 when given
  // Round the inverse frequencies to bf16, as transformers ends up doing when a whole model is
  // cast with .to(torch.bfloat16) (buffers included). Off by default: from_pretrained keeps them
  // float32, and so do vLLM and llama.cpp. Exists to reproduce references made that way.
  bool inv_freq_bf16 = false;
};

enum class QuantMethod { None, Mxfp4 };

struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_heads when absent
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;  // qwen3_moe; gpt-oss experts use intermediate_size
  int64_t num_experts = 0;           // num_local_experts or num_experts; 0 = dense
  int64_t num_experts_per_tok = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  int64_t max_position_embeddings = 0;
  int64_t sliding_window = 0;  // 0 = none
  std::vector<LayerAttention> layer_types;  // size num_layers, always filled
  double swiglu_limit = 0.0;  // gpt-oss
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  QuantMethod quant_method = QuantMethod::None;
  std::vector<int32_t> eos_token_ids;  // from config.json; generation_config adds more
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;

  bool is_moe_layer(int64_t layer) const;
};

// Throws anvil::Error naming the file and field on anything missing or malformed, and for an
// architecture or quantization method anvil does not serve.
ModelConfig load_model_config(const std::filesystem::path& config_json);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name);

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
};
// Absent file: empty struct.
GenerationConfig load_generation_config(const std::filesystem::path& generation_config_json);

struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<std::string> chat_template;  // kept for the server
  bool add_bos_token = false;
};
// Absent file: empty struct.
TokenizerConfig load_tokenizer_config(const std::filesystem::path& tokenizer_config_json);

}  // namespace anvil
