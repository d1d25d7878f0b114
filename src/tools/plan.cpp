#include "tools/plan.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "backend/cuda/mxfp4_f16_layout.h"
#include "core/error.h"
#include "engine/engine.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"

namespace anvil::tools {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

std::string type_of(const json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}: {}", path.string(), std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) fail("cannot read {}", path.string());
  return contents.str();
}

json parse_json_object(const std::string& text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", source, one_line(e.what()));
  }
  if (!root.is_object()) fail("{}: expected a JSON object at the top level, got {}", source, root.type_name());
  return root;
}

// Typed reads of one JSON object; every error names the file and the dotted field.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* find(const std::string& key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  std::string name(const std::string& key) const { return prefix_ + key; }
  const std::string& source() const { return source_; }

  int64_t require_int(const std::string& key) const {
    const json* value = find(key);
    if (!value) fail("{}: missing required field '{}'", source_, name(key));
    return to_int(key, *value);
  }
  int64_t require_positive(const std::string& key) const {
    const int64_t value = require_int(key);
    if (value <= 0) fail("{}: field '{}' must be positive, got {}", source_, name(key), value);
    return value;
  }
  std::optional<int64_t> optional_int(const std::string& key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    return to_int(key, *value);
  }
  int64_t get_int(const std::string& key, int64_t fallback) const { return optional_int(key).value_or(fallback); }
  bool get_bool(const std::string& key, bool fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_boolean()) fail("{}: field '{}' must be a boolean, got {}", source_, name(key), type_of(*value));
    return value->get<bool>();
  }
  std::optional<std::string> optional_string(const std::string& key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_string()) fail("{}: field '{}' must be a string, got {}", source_, name(key), type_of(*value));
    return value->get<std::string>();
  }
  const json* optional_object(const std::string& key) const {
    const json* value = find(key);
    if (value && !value->is_object())
      fail("{}: field '{}' must be an object, got {}", source_, name(key), type_of(*value));
    return value;
  }
  std::vector<int64_t> int_list(const std::string& key) const {
    std::vector<int64_t> result;
    const json* value = find(key);
    if (!value) return result;
    if (!value->is_array()) fail("{}: field '{}' must be a list, got {}", source_, name(key), type_of(*value));
    for (size_t i = 0; i < value->size(); ++i) {
      if (!(*value)[i].is_number_integer())
        fail("{}: field '{}[{}]' must be an integer, got {}", source_, name(key), i, type_of((*value)[i]));
      result.push_back((*value)[i].get<int64_t>());
    }
    return result;
  }

 private:
  int64_t to_int(const std::string& key, const json& value) const {
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())))
      fail("{}: field '{}' must be an integer, got {}", source_, name(key), type_of(value));
    return value.get<int64_t>();
  }

  const json& object_;
  std::string source_;
  std::string prefix_;
};

const std::set<std::string>& served_architectures() {
  static const std::set<std::string> names = {"GptOssForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"};
  return names;
}

uint64_t dtype_bytes(const std::string& dtype) {
  const std::string d = lower(dtype);
  if (d == "float32" || d == "float" || d == "fp32") return 4;
  return 2;  // bfloat16, float16, half
}

// Quantized weight + its scales, per weight: `bits` of payload and one scale of `scale_bits`
// per `group` weights.
BitsPerWeight grouped(uint64_t bits, uint64_t scale_bits, uint64_t group) {
  if (group == 0) return {bits, 1};
  return {bits * group + scale_bits, group};
}

WeightFormat read_weight_format(const json& root, const fs::path& model_dir, const std::string& source,
                                const std::string& model_type, const std::string& dtype) {
  WeightFormat format;
  const uint64_t plain_bits = dtype_bytes(dtype) * 8;
  format.linear = {plain_bits, 1};
  const std::string plain_name = lower(dtype) == "float32" ? "fp32" : lower(dtype) == "float16" ? "fp16" : "bf16";
  format.description = "unquantized " + plain_name;

  const Fields top(root, source);
  const json* quant = top.optional_object("quantization_config");
  std::string quant_source = source, prefix = "quantization_config.";
  json hf_quant;
  if (!quant) {
    // ModelOpt writes its settings beside config.json.
    const fs::path hf_quant_path = model_dir / "hf_quant_config.json";
    std::error_code ec;
    if (!fs::is_regular_file(hf_quant_path, ec)) return format;
    hf_quant = parse_json_object(read_text_file(hf_quant_path), hf_quant_path.string());
    const auto it = hf_quant.find("quantization");
    if (it == hf_quant.end() || !it->is_object())
      fail("{}: missing required field 'quantization'", hf_quant_path.string());
    quant = &*it;
    quant_source = hf_quant_path.string();
    prefix = "quantization.";
    hf_quant["quantization"]["quant_method"] = "modelopt";
  }
  const Fields q(*quant, quant_source, prefix);
  std::string method = lower(q.optional_string("quant_method").value_or(""));
  if (method.empty() && q.has("quant_algo")) method = "modelopt";
  if (method.empty()) fail("{}: missing required field '{}quant_method'", quant_source, prefix);
  format.method = method;

  const auto not_converted_has = [&](const char* needle) {
    for (const char* key : {"modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules"}) {
      const json* list = q.find(key);
      if (!list || !list->is_array()) continue;
      for (const auto& entry : *list)
        if (entry.is_string() && entry.get<std::string>().find(needle) != std::string::npos) return true;
    }
    return false;
  };

  if (method == "mxfp4") {
    // 4-bit E2M1 values plus one E8M0 scale byte per 32: 4.25 bits per weight.
    format.linear = grouped(4, 8, 32);
    format.experts_only = model_type == "gpt_oss" || not_converted_has("self_attn");
    format.description = format.experts_only
                             ? "MXFP4 experts (4.25 bits/weight incl. E8M0 scales), the rest " + plain_name
                             : "MXFP4 linear layers (4.25 bits/weight incl. E8M0 scales), the rest " + plain_name;
  } else if (method == "fp8") {
    const std::vector<int64_t> block = q.int_list("weight_block_size");
    if (block.size() == 2 && block[0] > 0 && block[1] > 0) {
      // One float32 scale per block.
      format.linear = grouped(8, 32, uint64_t(block[0] * block[1]));
      format.description = fmt::format("FP8 linear layers with {}x{} block scales, the rest {}", block[0], block[1],
                                       plain_name);
    } else {
      format.linear = {8, 1};
      format.description = "FP8 linear layers (per-tensor scales), the rest " + plain_name;
    }
  } else if (method == "awq" || method == "gptq" || method == "awq_marlin" || method == "gptq_marlin") {
    const int64_t bits = q.has("bits") ? q.require_positive("bits") : q.get_int("w_bit", 4);
    const int64_t group = q.has("group_size") ? q.require_int("group_size") : q.get_int("q_group_size", 128);
    // An fp16 scale and a packed zero point per group.
    format.linear = group > 0 ? grouped(uint64_t(bits), uint64_t(16 + bits), uint64_t(group)) : BitsPerWeight{uint64_t(bits), 1};
    format.description = fmt::format("{} {}-bit linear layers (group {}), the rest {}", method, bits, group, plain_name);
  } else if (method == "compressed-tensors") {
    const std::string ct_format = lower(q.optional_string("format").value_or(""));
    int64_t bits = 0, group = 0;
    std::string type;
    if (const json* groups = q.optional_object("config_groups")) {
      for (const auto& [name, group_config] : groups->items()) {
        if (!group_config.is_object() || !group_config.contains("weights") || !group_config["weights"].is_object()) continue;
        const Fields weights(group_config["weights"], quant_source, prefix + "config_groups." + name + ".weights.");
        bits = weights.get_int("num_bits", 0);
        group = weights.get_int("group_size", 0);
        type = lower(weights.optional_string("type").value_or("int"));
        break;
      }
    }
    if (ct_format.find("nvfp4") != std::string::npos || (bits == 4 && type == "float" && group == 16)) {
      format.linear = grouped(4, 8, 16);  // FP8 (E4M3) scale per 16
      format.description = "NVFP4 linear layers (4.5 bits/weight incl. FP8 scales), the rest " + plain_name;
    } else if (ct_format.find("mxfp4") != std::string::npos || (bits == 4 && type == "float")) {
      format.linear = grouped(4, 8, 32);
      format.description = "MXFP4 linear layers (4.25 bits/weight incl. E8M0 scales), the rest " + plain_name;
    } else if (bits == 8) {
      format.linear = {8, 1};
      format.description = std::string(type == "float" ? "FP8" : "INT8") + " linear layers, the rest " + plain_name;
    } else if (bits > 0) {
      format.linear = group > 0 ? grouped(uint64_t(bits), 16, uint64_t(group)) : BitsPerWeight{uint64_t(bits), 1};
      format.description = fmt::format("{}-bit {} linear layers (group {}), the rest {}", bits, type, group, plain_name);
    } else {
      format.known = false;
    }
  } else if (method == "modelopt") {
    const std::string algo = lower(q.optional_string("quant_algo").value_or(""));
    if (algo == "nvfp4") {
      format.linear = grouped(4, 8, 16);
      format.description = "NVFP4 linear layers (4.5 bits/weight incl. FP8 scales), the rest " + plain_name;
    } else if (algo.rfind("fp8", 0) == 0) {
      format.linear = {8, 1};
      format.description = "FP8 linear layers, the rest " + plain_name;
    } else {
      format.known = false;
    }
  } else if (method == "bitsandbytes") {
    if (q.get_bool("load_in_4bit", false)) {
      format.linear = grouped(4, 32, 64);  // an fp32 absmax per 64
      format.description = "bitsandbytes 4-bit linear layers, the rest " + plain_name;
    } else if (q.get_bool("load_in_8bit", false)) {
      format.linear = {8, 1};
      format.description = "bitsandbytes 8-bit linear layers, the rest " + plain_name;
    } else {
      format.known = false;
    }
  } else {
    format.known = false;
  }
  if (!format.known) {
    format.linear = {plain_bits, 1};
    format.description = "quantization '" + method + "' is not modelled: weights counted as unquantized " + plain_name +
                         " (an upper bound)";
  }
  return format;
}

}  // namespace

uint64_t BitsPerWeight::bytes(uint64_t weights) const {
  // weights * num / d without overflowing: split weights into whole groups of d and a remainder.
  const uint64_t d = 8 * den;
  return weights / d * num + weights % d * num / d;
}

int64_t ModelShape::sliding_layers() const { return int64_t(std::count(sliding.begin(), sliding.end(), true)); }

ModelShape read_model_shape(const fs::path& model_dir) {
  std::error_code ec;
  fs::path config_path = model_dir / "config.json";
  fs::path dir = model_dir;
  if (fs::is_regular_file(model_dir, ec)) {  // a config.json named directly
    config_path = model_dir;
    dir = model_dir.parent_path();
  } else if (!fs::exists(model_dir, ec)) {
    fail("cannot open model directory {}: No such file or directory", model_dir.string());
  } else if (!fs::exists(config_path, ec)) {
    fail("cannot open {}: No such file or directory (a model directory needs its config.json)", config_path.string());
  }
  const std::string source = config_path.string();
  const json root = parse_json_object(read_text_file(config_path), source);
  const Fields top(root, source);

  ModelShape shape;
  shape.config_path = config_path;
  if (const json* architectures = top.find("architectures")) {
    if (!architectures->is_array() || (!architectures->empty() && !(*architectures)[0].is_string()))
      fail("{}: field 'architectures' must be a list of strings", source);
    if (!architectures->empty()) shape.architecture = (*architectures)[0].get<std::string>();
  }
  shape.model_type = top.optional_string("model_type").value_or("");

  // Multimodal configs nest the language model's settings in text_config.
  const json* text = &root;
  std::string prefix;
  if (!top.has("hidden_size") && top.optional_object("text_config")) {
    text = &root.at("text_config");
    prefix = "text_config.";
    shape.from_text_config = true;
  }
  const Fields f(*text, source, prefix);
  if (shape.from_text_config) shape.model_type = f.optional_string("model_type").value_or(shape.model_type);
  const std::string& type = shape.model_type;
  if (f.has("kv_lora_rank"))
    fail("{}: field '{}' is set: multi-head latent attention (DeepSeek-style) is not modelled by anvil plan", source,
         f.name("kv_lora_rank"));

  shape.hidden_size = f.require_positive("hidden_size");
  shape.num_layers = f.require_positive("num_hidden_layers");
  shape.num_heads = f.require_positive("num_attention_heads");
  shape.num_kv_heads = f.has("num_key_value_heads") ? f.require_positive("num_key_value_heads") : shape.num_heads;
  if (shape.num_heads % shape.num_kv_heads != 0)
    fail("{}: num_attention_heads ({}) must be divisible by num_key_value_heads ({})", source, shape.num_heads,
         shape.num_kv_heads);
  if (f.has("head_dim")) {
    shape.head_dim = f.require_positive("head_dim");
  } else {
    if (shape.hidden_size % shape.num_heads != 0)
      fail("{}: no '{}' and hidden_size ({}) is not divisible by num_attention_heads ({})", source, f.name("head_dim"),
           shape.hidden_size, shape.num_heads);
    shape.head_dim = shape.hidden_size / shape.num_heads;
  }
  shape.vocab_size = f.require_positive("vocab_size");
  shape.max_position_embeddings = f.optional_int("max_position_embeddings");
  if (shape.max_position_embeddings && *shape.max_position_embeddings <= 0)
    fail("{}: field '{}' must be positive, got {}", source, f.name("max_position_embeddings"),
         *shape.max_position_embeddings);

  // Experts: the key differs by family.
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"}) {
    if (f.has(key)) {
      shape.num_experts = f.require_int(key);
      if (shape.num_experts < 0) fail("{}: field '{}' must not be negative", source, f.name(key));
      break;
    }
  }
  for (const char* key : {"num_experts_per_tok", "experts_per_token", "moe_topk"}) {
    if (f.has(key)) {
      shape.num_experts_per_tok = f.require_int(key);
      break;
    }
  }
  const std::vector<int64_t> mlp_only = f.int_list("mlp_only_layers");
  const int64_t sparse_step = f.has("decoder_sparse_step") ? f.require_positive("decoder_sparse_step") : 1;
  const int64_t first_dense = f.get_int("first_k_dense_replace", 0);
  for (int64_t i = 0; i < shape.num_layers; ++i) {
    const bool moe = shape.num_experts > 0 && std::find(mlp_only.begin(), mlp_only.end(), i) == mlp_only.end() &&
                     (i + 1) % sparse_step == 0 && i >= first_dense;
    shape.moe.push_back(moe);
  }
  const bool any_dense = std::find(shape.moe.begin(), shape.moe.end(), false) != shape.moe.end();
  const bool any_moe = std::find(shape.moe.begin(), shape.moe.end(), true) != shape.moe.end();
  if (any_dense) {
    shape.intermediate_size = f.require_positive("intermediate_size");
  } else {
    shape.intermediate_size = f.get_int("intermediate_size", 0);
  }
  if (any_moe) {
    shape.expert_intermediate_size =
        f.has("moe_intermediate_size") ? f.require_positive("moe_intermediate_size") : f.require_positive("intermediate_size");
    if (f.has("shared_expert_intermediate_size")) {
      shape.shared_expert_intermediate_size = f.require_int("shared_expert_intermediate_size");
    } else if (f.has("n_shared_experts")) {
      shape.shared_expert_intermediate_size = f.require_int("n_shared_experts") * shape.expert_intermediate_size;
    }
  }

  // Sliding-window layers.
  const std::optional<int64_t> window = f.optional_int("sliding_window");
  shape.sliding.assign(size_t(shape.num_layers), false);
  if (const json* types = f.find("layer_types")) {
    if (!types->is_array()) fail("{}: field '{}' must be a list, got {}", source, f.name("layer_types"), type_of(*types));
    if (int64_t(types->size()) != shape.num_layers)
      fail("{}: field '{}' has {} entries but num_hidden_layers is {}", source, f.name("layer_types"), types->size(),
           shape.num_layers);
    for (size_t i = 0; i < types->size(); ++i) {
      const json& entry = (*types)[i];
      if (entry == "sliding_attention") {
        shape.sliding[i] = true;
      } else if (entry != "full_attention") {
        fail("{}: field '{}[{}]' is {}: anvil plan models full_attention and sliding_attention layers only", source,
             f.name("layer_types"), i, entry.dump());
      }
    }
  } else if (type == "gpt_oss") {
    for (int64_t i = 0; i < shape.num_layers; i += 2) shape.sliding[size_t(i)] = true;
  } else if (type.rfind("qwen2", 0) == 0 || type.rfind("qwen3", 0) == 0) {
    // Qwen ignores sliding_window unless use_sliding_window is set; then layers from
    // max_window_layers on slide.
    if (f.get_bool("use_sliding_window", false) && window && *window > 0) {
      const int64_t from = f.get_int("max_window_layers", 28);
      for (int64_t i = std::max<int64_t>(from, 0); i < shape.num_layers; ++i) shape.sliding[size_t(i)] = true;
    }
  } else if (type == "gemma2") {
    for (int64_t i = 0; i < shape.num_layers; i += 2) shape.sliding[size_t(i)] = true;
  } else if (f.has("sliding_window_pattern")) {
    const int64_t pattern = f.require_positive("sliding_window_pattern");
    for (int64_t i = 0; i < shape.num_layers; ++i) shape.sliding[size_t(i)] = (i + 1) % pattern != 0;
  } else if (f.get_bool("use_sliding_window", true) && window && *window > 0) {
    // Mistral 7B v0.1 and the like: every layer slides.
    shape.sliding.assign(size_t(shape.num_layers), true);
  }
  if (std::find(shape.sliding.begin(), shape.sliding.end(), true) != shape.sliding.end()) {
    shape.sliding_window = window.value_or(type == "gpt_oss" ? 128 : 0);
    if (shape.sliding_window <= 0)
      fail("{}: there are sliding_attention layers but field '{}' is not set", source, f.name("sliding_window"));
  }

  shape.tie_word_embeddings = f.get_bool("tie_word_embeddings", top.get_bool("tie_word_embeddings", false));
  shape.attention_bias = type == "gpt_oss" || f.get_bool("attention_bias", false);
  shape.qkv_bias = !shape.attention_bias && (type == "qwen2" || type == "qwen2_moe");
  shape.attention_sinks = type == "gpt_oss";
  shape.qk_norm = type == "qwen3" || type == "qwen3_moe";
  const std::optional<std::string> dtype =
      f.has("torch_dtype") ? f.optional_string("torch_dtype")
      : f.has("dtype")     ? f.optional_string("dtype")
      : top.has("torch_dtype") ? top.optional_string("torch_dtype")
                               : top.optional_string("dtype");
  shape.dtype = dtype.value_or("bfloat16");
  shape.dtype_assumed = !dtype;
  shape.format = read_weight_format(root, dir, source, type, shape.dtype);

  // What anvil itself would do with this config: its own parser decides.
  if (served_architectures().count(shape.architecture)) {
    try {
      const ModelConfig config = load_model_config(config_path);
      shape.served = true;
      shape.head_dim = config.head_dim;
      shape.num_experts = config.num_experts;
      shape.num_experts_per_tok = config.num_experts_per_tok;
      shape.sliding_window = config.sliding_window;
      for (int64_t i = 0; i < shape.num_layers; ++i) {
        shape.sliding[size_t(i)] = config.layer_types[size_t(i)] == LayerAttention::Sliding;
        shape.moe[size_t(i)] = config.is_moe_layer(i);
      }
    } catch (const Error& error) {
      shape.not_served_reason = error.what();
    }
  } else {
    shape.not_served_reason = shape.architecture.empty() ? "config.json names no architecture"
                                                         : "anvil does not serve " + shape.architecture + " yet";
  }
  return shape;
}

const char* component_name(WeightComponent component) {
  switch (component) {
    case WeightComponent::Experts: return "experts";
    case WeightComponent::Mlp: return "mlp";
    case WeightComponent::Attention: return "attention";
    case WeightComponent::Router: return "router";
    case WeightComponent::Embeddings: return "embeddings";
    case WeightComponent::LmHead: return "lm_head";
    case WeightComponent::Norms: return "norms";
    case WeightComponent::Other: return "other";
  }
  return "other";
}

WeightComponent classify_tensor(const std::string& raw) {
  const std::string name = lower(raw);
  const auto has = [&](const char* needle) { return name.find(needle) != std::string::npos; };
  if (has("lm_head") || has("unembed") || name == "output.weight") return WeightComponent::LmHead;
  if (has("embed_tokens") || has("tok_embeddings") || has("word_embeddings") || has(".wte.") || name.rfind("wte.", 0) == 0 ||
      has("embed_in") || name.rfind("embedding", 0) == 0)
    return WeightComponent::Embeddings;
  if (has(".experts.") || has(".experts_")) return WeightComponent::Experts;
  if (has(".router.") || has(".mlp.gate.") || has("block_sparse_moe.gate.") || has("shared_expert_gate"))
    return WeightComponent::Router;
  if (has("norm")) return WeightComponent::Norms;
  if (has(".self_attn.") || has(".attention.") || has(".attn.")) return WeightComponent::Attention;
  if (has(".mlp.") || has(".feed_forward.") || has(".ffn.") || has("block_sparse_moe")) return WeightComponent::Mlp;
  return WeightComponent::Other;
}

uint64_t WeightBytes::total() const {
  uint64_t sum = 0;
  for (uint64_t bytes : by_component) sum += bytes;
  return sum;
}

std::vector<fs::path> safetensors_files(const fs::path& model_dir, std::vector<std::string>* missing) {
  std::vector<fs::path> files;
  std::error_code ec;
  const fs::path index_path = model_dir / "model.safetensors.index.json";
  if (fs::is_regular_file(index_path, ec)) {
    const std::string source = index_path.string();
    const json index = parse_json_object(read_text_file(index_path), source);
    const auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object()) fail("{}: missing required field 'weight_map'", source);
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string())
        fail("{}: field 'weight_map.{}' must be a file name, got {}", source, tensor, type_of(shard));
      shards.insert(shard.get<std::string>());
    }
    for (const auto& shard : shards) {
      if (fs::is_regular_file(model_dir / shard, ec)) {
        files.push_back(model_dir / shard);
      } else if (missing) {
        missing->push_back(shard);
      }
    }
    return files;
  }
  if (fs::is_regular_file(model_dir / "model.safetensors", ec)) return {model_dir / "model.safetensors"};
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

// What an expert tensor takes on the GPU: an MXFP4 `*_blocks` [..., K/32, 16] or `*_scales`
// [..., K/32] uint8 tensor in whole 128-code chunks per row; anything else as stored.
uint64_t device_bytes(const std::string& name, WeightComponent component, const TensorView& view) {
  const uint64_t stored = view.nbytes();
  if (component != WeightComponent::Experts || view.dtype != DType::U8 || view.shape.empty()) return stored;
  const auto& shape = view.shape;
  if (name.ends_with("_blocks") && shape.size() >= 2 && shape.back() == 16 && shape[shape.size() - 2] > 0) {
    const int64_t blocks = shape[shape.size() - 2];
    return uint64_t(view.numel() / (blocks * 16)) * uint64_t(cuda::mxfp4::f16_row_bytes(int(32 * blocks)));
  }
  if (name.ends_with("_scales") && shape.back() > 0) {
    const int64_t blocks = shape.back();
    return uint64_t(view.numel() / blocks) * uint64_t(cuda::mxfp4::f16_scale_row_bytes(int(32 * blocks)));
  }
  return stored;
}

// gpt-oss-style MXFP4 experts from config.json: `matrices` matrices of `rows` x `in`, in whole
// 128-code chunks per row (codes and E8M0 scales), as device_bytes counts their tensors.
uint64_t mxfp4_expert_bytes(uint64_t matrices, uint64_t rows, uint64_t in) {
  const int k = int(in);
  return matrices * rows * uint64_t(cuda::mxfp4::f16_row_bytes(k) + cuda::mxfp4::f16_scale_row_bytes(k));
}

}  // namespace

WeightBytes weights_from_headers(const std::vector<fs::path>& files) {
  WeightBytes weights;
  weights.from_headers = true;
  weights.files = files;
  for (const auto& file : files) {
    const SafetensorsHeader header = read_safetensors_header(file);
    for (const auto& [name, view] : header.tensors) {
      const WeightComponent component = classify_tensor(name);
      const uint64_t held = device_bytes(name, component, view);
      weights[component] += held;
      weights.layout_padding += held - view.nbytes();
    }
  }
  weights.source = fmt::format("safetensors headers ({} file{})", files.size(), files.size() == 1 ? "" : "s");
  return weights;
}

WeightBytes estimate_weights(const ModelShape& s) {
  WeightBytes w;
  w.source = "estimated from config.json";
  const uint64_t dt = dtype_bytes(s.dtype);
  const BitsPerWeight plain{dt * 8, 1};
  const BitsPerWeight linear = s.format.method.empty() || !s.format.known ? plain : s.format.linear;
  const BitsPerWeight dense = s.format.experts_only ? plain : linear;
  const uint64_t H = uint64_t(s.hidden_size), L = uint64_t(s.num_layers), hd = uint64_t(s.head_dim);
  const uint64_t q = uint64_t(s.num_heads) * hd, kv = uint64_t(s.num_kv_heads) * hd;
  const uint64_t moe_layers = uint64_t(std::count(s.moe.begin(), s.moe.end(), true));
  const uint64_t dense_layers = L - moe_layers;
  const uint64_t E = uint64_t(s.num_experts);
  const bool gpt_oss = s.model_type == "gpt_oss";

  // Attention: q, k, v, o projections; biases and sinks are stored unquantized.
  uint64_t attention_extra = 0;
  if (s.attention_bias) attention_extra += L * (q + 2 * kv + H);
  if (s.qkv_bias) attention_extra += L * (q + 2 * kv);
  if (s.attention_sinks) attention_extra += L * uint64_t(s.num_heads);
  w[WeightComponent::Attention] = dense.bytes(L * (H * q + 2 * H * kv + q * H)) + attention_extra * dt;
  // Gated MLPs (gate, up, down) everywhere: three H x I matrices.
  w[WeightComponent::Mlp] = dense.bytes(dense_layers * 3 * H * uint64_t(s.intermediate_size)) +
                            dense.bytes(moe_layers * 3 * H * uint64_t(s.shared_expert_intermediate_size));
  const uint64_t I = uint64_t(s.expert_intermediate_size);
  uint64_t experts = linear.bytes(moe_layers * E * 3 * H * I);
  if (s.format.method == "mxfp4" && H % 32 == 0 && I % 32 == 0) {  // checkpoints with *_blocks / *_scales
    const uint64_t held = mxfp4_expert_bytes(moe_layers * E, 2 * I, H) + mxfp4_expert_bytes(moe_layers * E, H, I);
    w.layout_padding = held - experts;
    experts = held;
  }
  w[WeightComponent::Experts] = experts + (gpt_oss ? moe_layers * E * (2 * I + H) * dt : 0);  // gpt-oss expert biases
  w[WeightComponent::Router] = moe_layers * E * (H + (gpt_oss ? 1 : 0)) * dt;
  w[WeightComponent::Norms] = (L * 2 * H + H + (s.qk_norm ? L * 2 * hd : 0)) * dt;
  w[WeightComponent::Embeddings] = uint64_t(s.vocab_size) * H * dt;
  w[WeightComponent::LmHead] = s.tie_word_embeddings ? 0 : uint64_t(s.vocab_size) * H * dt;
  return w;
}

KvCacheDtype parse_kv_cache_dtype(const std::string& text) {
  const std::string t = lower(text);
  if (t == "bf16" || t == "bfloat16" || t == "auto") return KvCacheDtype::Bf16;
  if (t == "fp8" || t == "fp8_e4m3" || t == "fp8_e5m2") return KvCacheDtype::Fp8;
  fail("--kv-cache-dtype must be bf16 or fp8, got '{}'", text);
}

const char* kv_cache_dtype_name(KvCacheDtype dtype) { return dtype == KvCacheDtype::Fp8 ? "fp8" : "bf16"; }

uint64_t Plan::kv_bytes_for_sequence(int64_t length) const {
  const uint64_t n = uint64_t(std::max<int64_t>(length, 0));
  return kv_bytes_per_token * n + sliding_bytes_per_token * std::min<uint64_t>(n, uint64_t(sliding_window));
}

Plan make_plan(const ModelShape& shape, const WeightBytes& weights, const PlanOptions& options) {
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0))
    fail("--gpu-memory-utilization must be in (0, 1], got {}", options.gpu_memory_utilization);
  if (options.max_model_len && *options.max_model_len <= 0)
    fail("--max-model-len must be positive, got {}", *options.max_model_len);
  if (options.max_num_batched_tokens <= 0)
    fail("--max-num-batched-tokens must be positive, got {}", options.max_num_batched_tokens);
  Plan plan;
  plan.model = shape;
  plan.weights = weights;
  plan.options = options;
  if (options.max_model_len) {
    plan.max_model_len = *options.max_model_len;
  } else if (shape.max_position_embeddings) {
    plan.max_model_len = *shape.max_position_embeddings;
  } else {
    fail("{}: missing required field 'max_position_embeddings' (or pass --max-model-len)", shape.config_path.string());
  }

  // KV cache: keys and values of kv_heads x head_dim per token per layer.
  const uint64_t element = options.kv_cache_dtype == KvCacheDtype::Fp8 ? 1 : 2;
  const uint64_t per_layer = 2 * uint64_t(shape.num_kv_heads) * uint64_t(shape.head_dim) * element;
  const int64_t sliding = shape.sliding_layers(), full = shape.full_layers();
  plan.kv_bytes_per_token = uint64_t(full) * per_layer;
  plan.sliding_bytes_per_token = uint64_t(sliding) * per_layer;
  plan.sliding_window = sliding > 0 ? shape.sliding_window : 0;
  if (full > 0) plan.kv_layer_types.push_back({"full_attention", full, 0, per_layer, plan.kv_bytes_per_token, 0});
  if (sliding > 0)
    plan.kv_layer_types.push_back({"sliding_attention", sliding, shape.sliding_window, per_layer,
                                   plan.sliding_bytes_per_token, plan.sliding_bytes_per_token * uint64_t(shape.sliding_window)});

  // Which numbers are estimates.
  if (!weights.from_headers)
    plan.estimates.push_back("weights: no safetensors files; computed from config.json (" + shape.format.description + ")");
  if (!shape.served)
    plan.estimates.push_back("everything: " + shape.not_served_reason +
                             "; the plan assumes anvil's memory layout (paged KV cache, sliding-window layers "
                             "holding only their window)");
  if (!shape.format.known) plan.notes.push_back(shape.format.description);
  if (shape.dtype_assumed && !weights.from_headers && shape.model_type != "gpt_oss")
    plan.notes.push_back("config.json names no dtype: bf16 assumed for unquantized weights");
  if (shape.from_text_config) plan.notes.push_back("multimodal config: only the language model (text_config) is planned");
  if (shape.max_position_embeddings && plan.max_model_len > *shape.max_position_embeddings)
    plan.notes.push_back(fmt::format("--max-model-len {} is beyond the model's max_position_embeddings ({})",
                                     plan.max_model_len, *shape.max_position_embeddings));

  if (!options.gpu_memory_bytes) return plan;
  plan.has_budget = true;
  const uint64_t gpu = *options.gpu_memory_bytes;
  plan.usable_bytes = uint64_t(std::floor((long double)gpu * (long double)options.gpu_memory_utilization));
  plan.activation_reserve_bytes = gpu_activation_reserve_bytes(options.max_num_batched_tokens);
  plan.kv_cache_bytes = int64_t(plan.usable_bytes) - int64_t(weights.total()) - int64_t(plan.activation_reserve_bytes);
  plan.estimates.push_back(fmt::format(
      "activation reserve: anvil's engine sets aside 1 GiB + 64 KiB per batched token ({} tokens) beside the "
      "weights and the KV cache; peak activation use is not measured",
      options.max_num_batched_tokens));

  const uint64_t budget = plan.kv_cache_bytes > 0 ? uint64_t(plan.kv_cache_bytes) : 0;
  const uint64_t a = plan.kv_bytes_per_token, b = plan.sliding_bytes_per_token, W = uint64_t(plan.sliding_window);
  const uint64_t per_sequence = plan.kv_bytes_for_sequence(plan.max_model_len);
  const uint64_t window_cost = b * std::min<uint64_t>(uint64_t(plan.max_model_len), W);
  if (per_sequence > 0) {
    plan.max_concurrency = int64_t(budget / per_sequence);
    plan.concurrency = double(budget) / double(per_sequence);
  }
  if (a > 0) {
    // Token positions of the full-attention layers once each resident sequence has its window.
    const uint64_t windows = uint64_t(std::max<int64_t>(plan.max_concurrency, 1)) * window_cost;
    plan.kv_tokens = budget > windows ? (budget - windows) / a : 0;
    // One sequence: a*L + b*min(L, W) <= budget.
    plan.max_context_tokens_by_memory = budget >= (a + b) * W ? int64_t((budget - b * W) / a) : int64_t(budget / (a + b));
  } else if (b > 0) {
    plan.kv_tokens = budget / b;
    plan.max_context_tokens_by_memory =
        budget >= b * W ? std::numeric_limits<int64_t>::max() : int64_t(budget / b);
  }
  plan.max_context_tokens = plan.max_context_tokens_by_memory;
  if (shape.max_position_embeddings)
    plan.max_context_tokens = std::min(plan.max_context_tokens, *shape.max_position_embeddings);
  plan.fits = plan.kv_cache_bytes > 0 && plan.max_concurrency >= 1;
  if (plan.kv_cache_bytes <= 0) {
    plan.notes.push_back(fmt::format("the weights ({}) and the activation reserve ({}) do not fit in {} x {:.2f} = {}",
                                     format_gib(double(weights.total())), format_gib(double(plan.activation_reserve_bytes)),
                                     format_gib(double(gpu)), options.gpu_memory_utilization,
                                     format_gib(double(plan.usable_bytes))));
  } else if (plan.max_concurrency < 1) {
    plan.notes.push_back(fmt::format("one sequence of --max-model-len {} needs {} of KV cache but only {} is left; "
                                     "lower --max-model-len to at most {} or raise --gpu-memory-utilization",
                                     format_count(plan.max_model_len), format_gib(double(per_sequence)),
                                     format_gib(double(budget)), format_count(plan.max_context_tokens)));
  }
  return plan;
}

Plan make_plan(const fs::path& model_dir, const PlanOptions& options) {
  const ModelShape shape = read_model_shape(model_dir);
  const fs::path dir = shape.config_path.parent_path();
  std::vector<std::string> missing;
  const std::vector<fs::path> files = safetensors_files(dir, &missing);
  const bool use_headers = !files.empty() && missing.empty();
  WeightBytes weights = use_headers ? weights_from_headers(files) : estimate_weights(shape);
  Plan plan = make_plan(shape, weights, options);
  if (!missing.empty())
    plan.notes.push_back(fmt::format("model.safetensors.index.json lists {} shard{} not in {} (first: {}); weights "
                                     "estimated from config.json",
                                     missing.size(), missing.size() == 1 ? "" : "s", dir.string(), missing.front()));
  return plan;
}

std::string format_gb(uint64_t bytes) { return fmt::format("{:.2f} GB", double(bytes) / 1e9); }

std::string format_gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(1ull << 30)); }

std::string format_count(int64_t value) {
  if (value == std::numeric_limits<int64_t>::max()) return "unlimited";
  std::string digits = std::to_string(value < 0 ? -value : value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

json plan_to_json(const Plan& plan) {
  const ModelShape& m = plan.model;
  json model = {{"config", m.config_path.string()},
                {"architecture", m.architecture},
                {"model_type", m.model_type},
                {"served_by_anvil", m.served},
                {"layers", m.num_layers},
                {"hidden_size", m.hidden_size},
                {"attention_heads", m.num_heads},
                {"kv_heads", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"experts", m.num_experts},
                {"experts_per_token", m.num_experts_per_tok},
                {"vocab_size", m.vocab_size},
                {"max_position_embeddings", m.max_position_embeddings ? json(*m.max_position_embeddings) : json(nullptr)},
                {"sliding_window", m.sliding_window},
                {"weight_format", m.format.description}};
  if (!m.served) model["not_served_reason"] = m.not_served_reason;

  json components = json::object();
  for (size_t i = 0; i < kWeightComponentCount; ++i)
    components[component_name(WeightComponent(i))] = plan.weights.by_component[i];
  json layer_types = json::array();
  for (const auto& t : plan.kv_layer_types) {
    json entry = {{"type", t.type},
                  {"layers", t.layers},
                  {"bytes_per_token_per_layer", t.bytes_per_token_per_layer},
                  {"bytes_per_token", t.bytes_per_token}};
    if (t.type == "sliding_attention") {
      entry["window"] = t.window;
      entry["max_bytes_per_sequence"] = t.max_bytes_per_sequence;
    }
    layer_types.push_back(entry);
  }
  std::string formula = fmt::format("{} * L", plan.kv_bytes_per_token);
  if (plan.sliding_bytes_per_token > 0)
    formula += fmt::format(" + {} * min(L, {})", plan.sliding_bytes_per_token, plan.sliding_window);

  const auto budget_value = [&](auto value) { return plan.has_budget ? json(value) : json(nullptr); };
  json out = {
      {"model", model},
      {"weights_bytes", plan.weights.total()},
      {"weights",
       {{"source", plan.weights.source},
        {"exact", plan.weights.from_headers},
        {"by_component", components},
        {"checkpoint_bytes", plan.weights.checkpoint_total()},
        {"layout_padding_bytes", plan.weights.layout_padding}}},
      {"kv_cache_dtype", kv_cache_dtype_name(plan.options.kv_cache_dtype)},
      {"kv_bytes_per_token", plan.kv_bytes_per_token},
      {"kv_by_layer_type", layer_types},
      {"kv_bytes_per_sequence", {{"formula", formula}, {"at_max_model_len", plan.kv_bytes_for_sequence(plan.max_model_len)}}},
      {"max_model_len", plan.max_model_len},
      {"gpu_memory_bytes", plan.options.gpu_memory_bytes ? json(*plan.options.gpu_memory_bytes) : json(nullptr)},
      {"gpu_memory_source", plan.options.gpu_memory_source},
      {"gpu_memory_utilization", plan.options.gpu_memory_utilization},
      {"usable_bytes", budget_value(plan.usable_bytes)},
      {"activation_reserve_bytes", budget_value(plan.activation_reserve_bytes)},
      {"activation_reserve_formula", fmt::format("1 GiB + {} batched tokens * 64 KiB", plan.options.max_num_batched_tokens)},
      {"kv_cache_bytes", budget_value(plan.kv_cache_bytes)},
      {"kv_tokens", budget_value(plan.kv_tokens)},
      {"max_concurrency", budget_value(plan.max_concurrency)},
      {"concurrency", budget_value(std::round(plan.concurrency * 100) / 100)},
      {"max_context_tokens", budget_value(plan.max_context_tokens)},
      {"max_context_tokens_by_memory",
       plan.has_budget && plan.max_context_tokens_by_memory != std::numeric_limits<int64_t>::max()
           ? json(plan.max_context_tokens_by_memory)
           : json(nullptr)},
      {"fits", budget_value(plan.fits)},
      {"estimates", plan.estimates},
      {"notes", plan.notes},
  };
  return out;
}

std::string format_plan_text(const Plan& plan) {
  const ModelShape& m = plan.model;
  std::string out;
  const auto line = [&](const std::string& text) { out += text + "\n"; };
  line(fmt::format("Model: {} ({}{}), {} layers, {} attention heads / {} KV heads x {}{}", m.config_path.parent_path().string(),
                   m.architecture.empty() ? "no architecture" : m.architecture,
                   m.served ? ", served by anvil" : ", not served by anvil: estimates", m.num_layers, m.num_heads,
                   m.num_kv_heads, m.head_dim,
                   m.num_experts > 0 ? fmt::format(", {} experts (top {})", m.num_experts, m.num_experts_per_tok) : ""));
  line(fmt::format("Weights: {} ({}), {}{}", format_gb(plan.weights.total()), format_gib(double(plan.weights.total())),
                   plan.weights.source, plan.weights.from_headers ? "" : " [estimate]"));
  if (!plan.weights.from_headers) line("  format: " + m.format.description);
  if (plan.weights.layout_padding > 0)
    line(fmt::format("  as held on the GPU: the checkpoint's {} + {} (MXFP4 expert rows padded to whole 128-code chunks)",
                     format_gb(plan.weights.checkpoint_total()), format_gb(plan.weights.layout_padding)));
  for (size_t i = 0; i < kWeightComponentCount; ++i) {
    if (plan.weights.by_component[i] == 0) continue;
    line(fmt::format("  {:<11} {:>10}", component_name(WeightComponent(i)), format_gb(plan.weights.by_component[i])));
  }
  line(fmt::format("KV cache ({}), per token of context:", kv_cache_dtype_name(plan.options.kv_cache_dtype)));
  for (const auto& t : plan.kv_layer_types) {
    if (t.type == "sliding_attention") {
      line(fmt::format("  {:<18} {:>3} layers x {} B = {} B/token, window {}: at most {} per sequence", t.type, t.layers,
                       format_count(int64_t(t.bytes_per_token_per_layer)), format_count(int64_t(t.bytes_per_token)),
                       t.window, format_count(int64_t(t.max_bytes_per_sequence)) + " B"));
    } else {
      line(fmt::format("  {:<18} {:>3} layers x {} B = {} B/token", t.type, t.layers,
                       format_count(int64_t(t.bytes_per_token_per_layer)), format_count(int64_t(t.bytes_per_token))));
    }
  }
  std::string formula = fmt::format("{} x L", format_count(int64_t(plan.kv_bytes_per_token)));
  if (plan.sliding_bytes_per_token > 0)
    formula += fmt::format(" + {} x min(L, {})", format_count(int64_t(plan.sliding_bytes_per_token)), plan.sliding_window);
  line(fmt::format("  one sequence of L tokens: {} bytes; at L = {}: {}", formula, format_count(plan.max_model_len),
                   format_gib(double(plan.kv_bytes_for_sequence(plan.max_model_len)))));
  if (!plan.has_budget) {
    line("Memory: no GPU detected and no --gpu-memory given: pass --gpu-memory GB to size the KV cache");
  } else {
    line(fmt::format("Memory: {} ({}) x {:.2f} = {} usable", format_gib(double(*plan.options.gpu_memory_bytes)),
                     plan.options.gpu_memory_source, plan.options.gpu_memory_utilization, format_gib(double(plan.usable_bytes))));
    line(fmt::format("  weights {}, activation reserve {} (1 GiB + {} batched tokens x 64 KiB), KV cache {}",
                     format_gib(double(plan.weights.total())), format_gib(double(plan.activation_reserve_bytes)),
                     plan.options.max_num_batched_tokens, format_gib(double(plan.kv_cache_bytes))));
    line(fmt::format("KV tokens: {}", format_count(int64_t(plan.kv_tokens))));
    line(fmt::format("Max concurrency at {} tokens: {} ({:.2f}x)", format_count(plan.max_model_len),
                     format_count(plan.max_concurrency), plan.concurrency));
    const bool model_limit = m.max_position_embeddings && plan.max_context_tokens == *m.max_position_embeddings &&
                             plan.max_context_tokens_by_memory > plan.max_context_tokens;
    line(fmt::format("Largest context for one sequence: {} tokens{}", format_count(plan.max_context_tokens),
                     model_limit ? fmt::format(" (the model's limit; memory allows {})",
                                               format_count(plan.max_context_tokens_by_memory))
                                 : " (memory)"));
    line(std::string("Fits: ") + (plan.fits ? "yes" : "no"));
  }
  for (const auto& e : plan.estimates) line("Estimate: " + e);
  for (const auto& n : plan.notes) line("Note: " + n);
  return out;
}

}  // namespace anvil::tools
