#include "formats/model_config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace anvil {
namespace {

using json = nlohmann::json;

constexpr const char* kSupportedArchitectures = "GptOssForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM";

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string type_of(const json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

std::optional<std::string> read_text(const std::filesystem::path& path, bool absent_ok) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    std::error_code ec;
    if (absent_ok && !std::filesystem::exists(path, ec)) return std::nullopt;
    fail("cannot open {}: {}", path.string(), std::strerror(error));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) fail("cannot read {}", path.string());
  return contents.str();
}

json parse_object(const std::string& text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", source, one_line(e.what()));
  }
  if (!root.is_object())
    fail("{}: expected a JSON object at the top level, got {}", source, root.type_name());
  return root;
}

// Typed access to one JSON object, with every error naming the file and the dotted field path.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // Present and not null.
  bool has(const char* key) const {
    const auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  const json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }

  int64_t require_int(const char* key) const {
    if (object_.find(key) == object_.end()) fail("{}: missing required field '{}'", source_, name(key));
    return to_int(key, object_.at(key));
  }
  int64_t get_int(const char* key, int64_t fallback) const {
    const json* value = find(key);
    return value ? to_int(key, *value) : fallback;
  }
  std::optional<int64_t> optional_int(const char* key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    return to_int(key, *value);
  }
  double require_double(const char* key) const {
    if (object_.find(key) == object_.end()) fail("{}: missing required field '{}'", source_, name(key));
    return to_double(key, object_.at(key));
  }
  double get_double(const char* key, double fallback) const {
    const json* value = find(key);
    return value ? to_double(key, *value) : fallback;
  }
  std::optional<double> optional_double(const char* key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    return to_double(key, *value);
  }
  bool get_bool(const char* key, bool fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_boolean())
      fail("{}: field '{}' must be a boolean, got {}", source_, name(key), type_of(*value));
    return value->get<bool>();
  }
  std::optional<std::string> optional_string(const char* key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_string())
      fail("{}: field '{}' must be a string, got {}", source_, name(key), type_of(*value));
    return value->get<std::string>();
  }
  std::optional<int32_t> optional_token_id(const char* key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    return to_token_id(name(key), *value);
  }
  // A single id or a list of ids (both forms appear in published configs).
  std::vector<int32_t> token_ids(const char* key) const {
    const json* value = find(key);
    std::vector<int32_t> ids;
    if (!value) return ids;
    if (value->is_array()) {
      for (size_t i = 0; i < value->size(); ++i) {
        ids.push_back(to_token_id(fmt::format("{}[{}]", name(key), i), (*value)[i]));
      }
    } else if (value->is_number_integer()) {
      ids.push_back(to_token_id(name(key), *value));
    } else {
      fail("{}: field '{}' must be an integer or a list of integers, got {}", source_, name(key),
           type_of(*value));
    }
    return ids;
  }

  const std::string& source() const { return source_; }

 private:
  int64_t to_int(const char* key, const json& value) const {
    // Unsigned values above int64 range would wrap; no real dimension is that large.
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() &&
         value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))) {
      fail("{}: field '{}' must be an integer, got {}", source_, name(key), type_of(value));
    }
    return value.get<int64_t>();
  }
  double to_double(const char* key, const json& value) const {
    if (!value.is_number())
      fail("{}: field '{}' must be a number, got {}", source_, name(key), type_of(value));
    return value.get<double>();
  }
  int32_t to_token_id(const std::string& field, const json& value) const {
    if (!value.is_number_integer()) {
      fail("{}: field '{}' must be an integer token id, got {}", source_, field, type_of(value));
    }
    if ((!value.is_number_unsigned() && value.get<int64_t>() < 0) ||
        value.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())) {
      fail("{}: field '{}' is not a valid token id: {}", source_, field, value.dump());
    }
    return value.get<int32_t>();
  }

  const json& object_;
  std::string source_;
  std::string prefix_;
};

void require_positive(const std::string& source, std::string_view field, int64_t value) {
  if (value <= 0) fail("{}: field '{}' must be positive, got {}", source, field, value);
}

void parse_rope(const Fields& top, const json& root, ModelConfig& config, double default_theta) {
  const std::string& source = top.source();
  RopeConfig& rope = config.rope;
  rope.theta = top.get_double("rope_theta", default_theta);

  // transformers 5 moved everything, theta included, into rope_parameters; older configs keep
  // theta at the top level and the scaling in rope_scaling.
  const char* params_key = top.has("rope_parameters") ? "rope_parameters"
                           : top.has("rope_scaling")  ? "rope_scaling"
                                                      : nullptr;
  if (!params_key) return;
  const json& params = root.at(params_key);
  if (!params.is_object())
    fail("{}: field '{}' must be an object, got {}", source, params_key, type_of(params));
  for (const auto& [key, value] : params.items()) {
    // transformers 5 allows one parameter set per layer type (Gemma 3); none of our architectures use it.
    if (value.is_object()) fail("{}: per-layer-type '{}.{}' is not supported", source, params_key, key);
  }
  const Fields fields(params, source, std::string(params_key) + ".");
  rope.theta = fields.get_double("rope_theta", rope.theta);
  if (fields.has("rope_type")) {
    rope.type = *fields.optional_string("rope_type");
  } else if (fields.has("type")) {
    rope.type = *fields.optional_string("type");
  }
  if (rope.type == "default") return;
  if (rope.type != "yarn") {
    fail("{}: field '{}.rope_type' is '{}', which is not supported (supported: default, yarn)", source,
         params_key, rope.type);
  }
  rope.factor = fields.require_double("factor");
  rope.beta_fast = fields.get_double("beta_fast", rope.beta_fast);
  rope.beta_slow = fields.get_double("beta_slow", rope.beta_slow);
  // transformers falls back to max_position_embeddings when the original length is absent; resolving
  // it here spares every consumer that rule.
  rope.original_max_position_embeddings =
      fields.get_int("original_max_position_embeddings", config.max_position_embeddings);
  rope.truncate = fields.get_bool("truncate", true);
  rope.attention_factor = fields.optional_double("attention_factor");
  if (!(rope.factor > 0))
    fail("{}: field '{}.factor' must be positive, got {}", source, params_key, rope.factor);
  require_positive(source, std::string(params_key) + ".original_max_position_embeddings",
                   rope.original_max_position_embeddings);
}

std::vector<LayerAttention> parse_layer_types(const Fields& top, const json& root, int64_t num_layers) {
  const std::string& source = top.source();
  const json& types = root.at("layer_types");
  if (!types.is_array()) fail("{}: field 'layer_types' must be a list, got {}", source, type_of(types));
  if (int64_t(types.size()) != num_layers) {
    fail("{}: field 'layer_types' has {} entries but num_hidden_layers is {}", source, types.size(),
         num_layers);
  }
  std::vector<LayerAttention> result;
  for (size_t i = 0; i < types.size(); ++i) {
    const json& type = types[i];
    if (type == "full_attention") {
      result.push_back(LayerAttention::Full);
    } else if (type == "sliding_attention") {
      result.push_back(LayerAttention::Sliding);
    } else {
      fail("{}: field 'layer_types[{}]' is {}, expected \"full_attention\" or \"sliding_attention\"", source,
           i, type.dump());
    }
  }
  return result;
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (model_type == "gpt_oss") return true;
  if (model_type == "qwen3_moe") {
    if (num_experts <= 0) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
      return false;
    return (layer + 1) % decoder_sparse_step == 0;
  }
  return false;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name) {
  const std::string& source = source_name;
  const json root = parse_object(json_text, source);
  const Fields top(root, source);
  ModelConfig config;

  const json* architectures = top.find("architectures");
  if (!architectures) fail("{}: missing required field 'architectures'", source);
  if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
    fail("{}: field 'architectures' must be a non-empty list of strings", source);
  }
  config.architecture = (*architectures)[0].get<std::string>();
  std::string expected_type;
  if (config.architecture == "GptOssForCausalLM") {
    expected_type = "gpt_oss";
  } else if (config.architecture == "Qwen3ForCausalLM") {
    expected_type = "qwen3";
  } else if (config.architecture == "Qwen3MoeForCausalLM") {
    expected_type = "qwen3_moe";
  } else {
    fail("{}: architecture '{}' is not supported (supported: {})", source, config.architecture,
         kSupportedArchitectures);
  }
  // Behaviour keys on model_type; a config whose two names disagree is broken, not a variant.
  config.model_type = top.optional_string("model_type").value_or(expected_type);
  if (config.model_type != expected_type) {
    fail("{}: field 'model_type' is '{}' but architecture {} needs '{}'", source, config.model_type,
         config.architecture, expected_type);
  }
  const bool gpt_oss = config.model_type == "gpt_oss";
  const bool qwen3_moe = config.model_type == "qwen3_moe";

  config.hidden_size = top.require_int("hidden_size");
  config.num_layers = top.require_int("num_hidden_layers");
  config.num_heads = top.require_int("num_attention_heads");
  config.num_kv_heads = top.require_int("num_key_value_heads");
  config.vocab_size = top.require_int("vocab_size");
  config.max_position_embeddings = top.require_int("max_position_embeddings");
  require_positive(source, "hidden_size", config.hidden_size);
  require_positive(source, "num_hidden_layers", config.num_layers);
  require_positive(source, "num_attention_heads", config.num_heads);
  require_positive(source, "num_key_value_heads", config.num_kv_heads);
  require_positive(source, "vocab_size", config.vocab_size);
  require_positive(source, "max_position_embeddings", config.max_position_embeddings);
  if (config.num_heads % config.num_kv_heads != 0) {
    fail("{}: num_attention_heads ({}) must be divisible by num_key_value_heads ({})", source,
         config.num_heads, config.num_kv_heads);
  }
  if (top.has("head_dim")) {
    config.head_dim = top.require_int("head_dim");
    require_positive(source, "head_dim", config.head_dim);
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      fail("{}: no 'head_dim' and hidden_size ({}) is not divisible by num_attention_heads ({})", source,
           config.hidden_size, config.num_heads);
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }

  if (gpt_oss) {
    const char* experts_key =
        top.has("num_experts") && !top.has("num_local_experts") ? "num_experts" : "num_local_experts";
    config.num_experts = top.require_int(experts_key);
    require_positive(source, experts_key, config.num_experts);
    // gpt-oss softmaxes the top-k router logits, which equals renormalising the full softmax over them.
    config.norm_topk_prob = true;
  } else if (qwen3_moe) {
    const char* experts_key =
        top.has("num_local_experts") && !top.has("num_experts") ? "num_local_experts" : "num_experts";
    config.num_experts = top.require_int(experts_key);
    // Zero experts is a valid (if odd) Qwen3-MoE: every layer then has the dense MLP.
    if (config.num_experts < 0) fail("{}: field '{}' must not be negative", source, experts_key);
    config.norm_topk_prob = top.get_bool("norm_topk_prob", false);
    config.decoder_sparse_step = top.get_int("decoder_sparse_step", 1);
    require_positive(source, "decoder_sparse_step", config.decoder_sparse_step);
    if (const json* layers = top.find("mlp_only_layers")) {
      if (!layers->is_array())
        fail("{}: field 'mlp_only_layers' must be a list, got {}", source, type_of(*layers));
      for (size_t i = 0; i < layers->size(); ++i) {
        const json& layer = (*layers)[i];
        if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
            layer.get<int64_t>() >= config.num_layers) {
          fail("{}: field 'mlp_only_layers[{}]' must be a layer index below {}, got {}", source, i,
               config.num_layers, layer.dump());
        }
        config.mlp_only_layers.push_back(layer.get<int64_t>());
      }
    }
  }
  bool any_moe = false, any_dense = false;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const bool moe_layer = config.is_moe_layer(i);
    any_moe = any_moe || moe_layer;
    any_dense = any_dense || !moe_layer;
  }
  if (any_moe) {
    const char* top_k_key = top.has("num_experts_per_tok") || !top.has("experts_per_token")
                                ? "num_experts_per_tok"
                                : "experts_per_token";
    config.num_experts_per_tok = top.require_int(top_k_key);
    require_positive(source, top_k_key, config.num_experts_per_tok);
    if (config.num_experts_per_tok > config.num_experts) {
      fail("{}: {} ({}) exceeds the number of experts ({})", source, top_k_key, config.num_experts_per_tok,
           config.num_experts);
    }
    if (qwen3_moe) {
      config.moe_intermediate_size = top.require_int("moe_intermediate_size");
      require_positive(source, "moe_intermediate_size", config.moe_intermediate_size);
    }
  }
  // gpt-oss experts are intermediate_size wide; Qwen3-MoE needs it only for its dense layers.
  if (any_dense || gpt_oss) {
    config.intermediate_size = top.require_int("intermediate_size");
    require_positive(source, "intermediate_size", config.intermediate_size);
  } else {
    config.intermediate_size = top.get_int("intermediate_size", 0);
  }

  config.rms_norm_eps = top.get_double("rms_norm_eps", gpt_oss ? 1e-5 : 1e-6);
  if (!(config.rms_norm_eps > 0)) {
    fail("{}: field 'rms_norm_eps' must be positive, got {}", source, config.rms_norm_eps);
  }
  parse_rope(top, root, config, gpt_oss ? 150000.0 : 10000.0);
  if (!(config.rope.theta > 0)) fail("{}: rope_theta must be positive, got {}", source, config.rope.theta);

  // Qwen3 ignores sliding_window unless use_sliding_window is set (transformers drops it to None).
  const bool qwen_sliding = !gpt_oss && top.get_bool("use_sliding_window", false);
  if (gpt_oss || qwen_sliding) {
    // null means no window; only an absent key takes the gpt-oss class default.
    const int64_t absent = gpt_oss && !root.contains("sliding_window") ? 128 : 0;
    config.sliding_window = top.get_int("sliding_window", absent);
    if (config.sliding_window < 0) fail("{}: field 'sliding_window' must not be negative", source);
  }
  if (top.has("layer_types")) {
    config.layer_types = parse_layer_types(top, root, config.num_layers);
  } else {
    const int64_t max_window_layers = top.get_int("max_window_layers", 28);
    for (int64_t i = 0; i < config.num_layers; ++i) {
      const bool sliding =
          gpt_oss ? i % 2 == 0 : qwen_sliding && config.sliding_window > 0 && i >= max_window_layers;
      config.layer_types.push_back(sliding ? LayerAttention::Sliding : LayerAttention::Full);
    }
  }
  const bool any_sliding = std::find(config.layer_types.begin(), config.layer_types.end(),
                                     LayerAttention::Sliding) != config.layer_types.end();
  if (any_sliding && config.sliding_window <= 0) {
    fail("{}: layer_types has sliding_attention layers but sliding_window is not set", source);
  }

  if (gpt_oss) config.swiglu_limit = top.get_double("swiglu_limit", 7.0);
  config.tie_word_embeddings = top.get_bool("tie_word_embeddings", false);
  // The gpt-oss config class forces attention biases on whatever the file says.
  config.attention_bias = gpt_oss ? true : top.get_bool("attention_bias", false);

  if (const json* quant = top.find("quantization_config")) {
    if (!quant->is_object()) {
      fail("{}: field 'quantization_config' must be an object, got {}", source, type_of(*quant));
    }
    const Fields quant_fields(*quant, source, "quantization_config.");
    const std::optional<std::string> method = quant_fields.optional_string("quant_method");
    if (!method) fail("{}: missing required field 'quantization_config.quant_method'", source);
    if (*method != "mxfp4") {
      fail("{}: quantization_config.quant_method '{}' is not supported (supported: mxfp4, or none)", source,
           *method);
    }
    if (!gpt_oss) fail("{}: quant_method 'mxfp4' is only supported for GptOssForCausalLM", source);
    config.quant_method = QuantMethod::Mxfp4;
    // MXFP4 blocks are 32 values along each expert matrix's input dimension.
    if (config.hidden_size % 32 != 0 || config.intermediate_size % 32 != 0) {
      fail("{}: MXFP4 needs hidden_size ({}) and intermediate_size ({}) divisible by 32", source,
           config.hidden_size, config.intermediate_size);
    }
  }

  config.eos_token_ids = top.token_ids("eos_token_id");
  config.bos_token_id = top.optional_token_id("bos_token_id");
  config.pad_token_id = top.optional_token_id("pad_token_id");
  return config;
}

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  return parse_model_config(*read_text(config_json, false), config_json.string());
}

GenerationConfig load_generation_config(const std::filesystem::path& generation_config_json) {
  GenerationConfig config;
  const std::optional<std::string> text = read_text(generation_config_json, true);
  if (!text) return config;
  const std::string source = generation_config_json.string();
  const json root = parse_object(*text, source);
  const Fields fields(root, source);
  config.eos_token_ids = fields.token_ids("eos_token_id");
  config.bos_token_id = fields.optional_token_id("bos_token_id");
  config.pad_token_id = fields.optional_token_id("pad_token_id");
  config.temperature = fields.optional_double("temperature");
  config.top_p = fields.optional_double("top_p");
  config.min_p = fields.optional_double("min_p");
  config.top_k = fields.optional_int("top_k");
  return config;
}

namespace {

// A special token is either its text or an AddedToken object {"content": ..., "lstrip": ..., ...}.
std::optional<std::string> token_text(const Fields& fields, const char* key) {
  const json* value = fields.find(key);
  if (!value) return std::nullopt;
  if (value->is_string()) return value->get<std::string>();
  if (value->is_object()) {
    const auto content = value->find("content");
    if (content != value->end() && content->is_string()) return content->get<std::string>();
  }
  fail("{}: field '{}' must be a string or an object with a string 'content', got {}", fields.source(), key,
       type_of(*value));
}

std::optional<std::string> chat_template_from(const json& value, const std::string& source,
                                              const std::string& field) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    // Named templates (e.g. "default", "tool_use"); plain chat uses "default".
    const json* chosen = nullptr;
    for (size_t i = 0; i < value.size(); ++i) {
      const json& entry = value[i];
      if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
        fail("{}: field '{}[{}]' must be an object with a string 'template'", source, field, i);
      }
      if (!chosen) chosen = &entry;
      if (entry.contains("name") && entry["name"] == "default") {
        chosen = &entry;
        break;
      }
    }
    if (!chosen) return std::nullopt;
    return (*chosen)["template"].get<std::string>();
  }
  fail("{}: field '{}' must be a string or a list of {{name, template}}, got {}", source, field,
       type_of(value));
}

}  // namespace

TokenizerConfig load_tokenizer_config(const std::filesystem::path& tokenizer_config_json) {
  TokenizerConfig config;
  const std::optional<std::string> text = read_text(tokenizer_config_json, true);
  if (text) {
    const std::string source = tokenizer_config_json.string();
    const json root = parse_object(*text, source);
    const Fields fields(root, source);
    config.bos_token = token_text(fields, "bos_token");
    config.eos_token = token_text(fields, "eos_token");
    config.pad_token = token_text(fields, "pad_token");
    config.unk_token = token_text(fields, "unk_token");
    if (const auto it = root.find("chat_template"); it != root.end()) {
      config.chat_template = chat_template_from(*it, source, "chat_template");
    }
    config.add_bos_token = fields.get_bool("add_bos_token", false);
  }
  // Newer transformers save the template beside tokenizer_config.json instead of inside it.
  if (text && !config.chat_template) {
    const auto dir = tokenizer_config_json.parent_path();
    if (const auto jinja = read_text(dir / "chat_template.jinja", true)) {
      config.chat_template = *jinja;
    } else if (const auto template_json = read_text(dir / "chat_template.json", true)) {
      const std::string source = (dir / "chat_template.json").string();
      const json root = parse_object(*template_json, source);
      if (const auto it = root.find("chat_template"); it != root.end()) {
        config.chat_template = chat_template_from(*it, source, "chat_template");
      }
    }
  }
  return config;
}

}  // namespace anvil
