#pragma once
// `anvil plan`: what fits on a GPU, from config.json and the safetensors headers only (no tensor
// data is read). Weight bytes by component, KV cache bytes per token by layer type (sliding-window
// layers hold at most their window, as anvil's paged KV cache does), anvil's activation reserve,
// and from those the tokens of KV cache, the concurrency at a context length and the longest
// context one sequence can have. Works for the architectures anvil serves and, as estimates, for
// other decoder-only attention models (llama, mistral, qwen2, mixtral, ...). The rig sizes models
// with make_plan().
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace anvil::tools {

// Bits per stored weight as a fraction, so byte counts stay exact (MXFP4: 17/4 = 4.25).
struct BitsPerWeight {
  uint64_t num = 16, den = 1;
  double value() const { return double(num) / double(den); }
  uint64_t bytes(uint64_t weights) const;  // weights * num / (8 * den), rounded down
};

// How a config's quantization_config stores the linear layers' weights.
struct WeightFormat {
  std::string method;        // "" (none), "mxfp4", "fp8", "awq", "gptq", "compressed-tensors", "modelopt", ...
  std::string description;   // for people, e.g. "MXFP4 experts (4.25 bits/weight incl. E8M0 scales), the rest bf16"
  BitsPerWeight linear;      // quantized linear weights (scales included)
  bool experts_only = false; // only the MoE experts are quantized (gpt-oss)
  bool known = true;         // false: an unknown method, estimated as unquantized
};

// The shape of a decoder-only attention model, as config.json gives it.
struct ModelShape {
  std::filesystem::path config_path;
  std::string architecture, model_type;
  bool served = false;            // anvil serves this architecture and accepts this config
  std::string not_served_reason;  // why not, when it does not
  bool from_text_config = false;  // a multimodal config whose text_config was read
  int64_t hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t intermediate_size = 0;      // dense MLP width
  int64_t expert_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // always-active shared expert(s), all together
  int64_t num_experts = 0, num_experts_per_tok = 0;
  int64_t vocab_size = 0;
  std::optional<int64_t> max_position_embeddings;
  int64_t sliding_window = 0;  // 0 = none
  std::vector<bool> sliding;   // per layer
  std::vector<bool> moe;       // per layer
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k, v and o biases
  bool qkv_bias = false;        // q, k, v biases only (qwen2)
  bool attention_sinks = false; // gpt-oss: one learned sink per head
  bool qk_norm = false;         // qwen3: q_norm and k_norm
  std::string dtype = "bfloat16";
  bool dtype_assumed = false;   // config.json names no dtype
  WeightFormat format;

  int64_t sliding_layers() const;
  int64_t full_layers() const { return num_layers - sliding_layers(); }
};

// Reads MODEL_DIR/config.json. A missing file, or a field missing or of the wrong type, is a
// one-line anvil::Error naming the file and the field.
ModelShape read_model_shape(const std::filesystem::path& model_dir);

enum class WeightComponent { Experts, Mlp, Attention, Router, Embeddings, LmHead, Norms, Other };
constexpr size_t kWeightComponentCount = 8;
const char* component_name(WeightComponent component);
// Which component a checkpoint tensor belongs to, by its name.
WeightComponent classify_tensor(const std::string& name);

// The bytes anvil holds on the GPU. Those are the checkpoint's, except that MXFP4 experts
// (`*_blocks` / `*_scales`) are held in whole 128-code chunks per row (mxfp4_f16_layout.h):
// gpt-oss's K = 2,880 takes 92 blocks instead of 90, +2.2 %. `layout_padding` is that growth,
// already inside by_component (Experts) and total().
struct WeightBytes {
  std::array<uint64_t, kWeightComponentCount> by_component{};
  bool from_headers = false;  // exact (safetensors headers); else estimated from config.json
  std::string source;         // for people
  std::vector<std::filesystem::path> files;  // the safetensors files read
  uint64_t layout_padding = 0;
  uint64_t total() const;
  uint64_t checkpoint_total() const { return total() - layout_padding; }
  uint64_t& operator[](WeightComponent c) { return by_component[size_t(c)]; }
  uint64_t operator[](WeightComponent c) const { return by_component[size_t(c)]; }
};

// The safetensors files of a checkpoint directory: the shards of model.safetensors.index.json,
// else model.safetensors, else every *.safetensors; empty when there are none. `missing` gets the
// shards an index lists that are not there.
std::vector<std::filesystem::path> safetensors_files(const std::filesystem::path& model_dir,
                                                     std::vector<std::string>* missing = nullptr);
// From the headers of `files` (header bytes only; a corrupt header is an error naming the file).
WeightBytes weights_from_headers(const std::vector<std::filesystem::path>& files);
// From the config: every parameter counted, stored in the format the config's quantization implies.
WeightBytes estimate_weights(const ModelShape& shape);

enum class KvCacheDtype { Bf16, Fp8 };
// "bf16" / "bfloat16" / "auto" -> Bf16; "fp8" / "fp8_e4m3" / "fp8_e5m2" -> Fp8; else an error.
KvCacheDtype parse_kv_cache_dtype(const std::string& text);
const char* kv_cache_dtype_name(KvCacheDtype dtype);

struct PlanOptions {
  std::optional<uint64_t> gpu_memory_bytes;  // none: a plan without a memory budget
  std::string gpu_memory_source;             // "--gpu-memory 96", "detected: GPU 0 NVIDIA H200", ...
  double gpu_memory_utilization = 0.9;
  std::optional<int64_t> max_model_len;      // none: the model's max_position_embeddings
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Bf16;
  int64_t max_num_batched_tokens = 2048;     // anvil serve's default; sizes the activation reserve
};

struct KvLayerType {
  std::string type;               // "full_attention" or "sliding_attention"
  int64_t layers = 0;
  int64_t window = 0;             // sliding only
  uint64_t bytes_per_token_per_layer = 0;
  uint64_t bytes_per_token = 0;   // all layers of this type
  uint64_t max_bytes_per_sequence = 0;  // sliding only: bytes_per_token * window
};

struct Plan {
  ModelShape model;
  WeightBytes weights;
  PlanOptions options;
  int64_t max_model_len = 0;

  std::vector<KvLayerType> kv_layer_types;
  uint64_t kv_bytes_per_token = 0;  // full-attention layers: what each token of context costs
  uint64_t sliding_bytes_per_token = 0;  // sliding layers, for tokens inside the window
  int64_t sliding_window = 0;
  // KV bytes one sequence of `length` tokens holds.
  uint64_t kv_bytes_for_sequence(int64_t length) const;

  // With a memory budget (options.gpu_memory_bytes):
  bool has_budget = false;
  uint64_t usable_bytes = 0;             // gpu memory x utilization
  uint64_t activation_reserve_bytes = 0;
  int64_t kv_cache_bytes = 0;            // usable - weights - reserve; negative: the weights do not fit
  uint64_t kv_tokens = 0;
  int64_t max_concurrency = 0;           // sequences of max_model_len resident at once
  double concurrency = 0;                // the same as a ratio (vLLM's "Maximum concurrency ... 4.68x")
  int64_t max_context_tokens = 0;        // one sequence, also capped by max_position_embeddings
  int64_t max_context_tokens_by_memory = 0;
  bool fits = false;                     // the weights fit and one max_model_len sequence does too

  std::vector<std::string> estimates;  // which numbers are estimates, and why
  std::vector<std::string> notes;
};

// From a model directory: config.json, and the safetensors headers when there are any.
Plan make_plan(const std::filesystem::path& model_dir, const PlanOptions& options);
// From a shape and weights already in hand.
Plan make_plan(const ModelShape& shape, const WeightBytes& weights, const PlanOptions& options);

nlohmann::json plan_to_json(const Plan& plan);
std::string format_plan_text(const Plan& plan);

// "65.25 GB", "1.13 GiB": for people.
std::string format_gb(uint64_t bytes);
std::string format_gib(double bytes);
// 713186 -> "713,186"
std::string format_count(int64_t value);

}  // namespace anvil::tools
