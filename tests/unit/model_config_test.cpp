#include "formats/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/test_support.h"

namespace anvil {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr LayerAttention S = LayerAttention::Sliding;
constexpr LayerAttention F = LayerAttention::Full;

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), Not(HasSubstr("\n"))) << "errors must be one line";
    return e.what();
  }
  ADD_FAILURE() << "expected anvil::Error";
  return "";
}

json fixture_config(const std::string& model) {
  return json::parse(test::read_file(test::fixtures_dir() / model / "config.json"));
}

ModelConfig parse(const json& config) { return parse_model_config(config.dump(), "test/config.json"); }

// The error that parsing `config` raises; it must name the source file.
std::string parse_error(const json& config) {
  const std::string message = error_of([&] { parse(config); });
  EXPECT_THAT(message, HasSubstr("test/config.json"));
  return message;
}

TEST(ModelConfig, GptOssFixture) {
  const auto path = test::fixtures_dir() / "gpt-oss-tiny" / "config.json";
  const ModelConfig config = load_model_config(path);
  EXPECT_EQ(config.architecture, "GptOssForCausalLM");
  EXPECT_EQ(config.model_type, "gpt_oss");
  EXPECT_EQ(config.hidden_size, 128);
  EXPECT_EQ(config.num_layers, 3);
  EXPECT_EQ(config.num_heads, 4);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.intermediate_size, 128);
  EXPECT_EQ(config.num_experts, 16);
  EXPECT_EQ(config.num_experts_per_tok, 4);
  EXPECT_EQ(config.vocab_size, 1024);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);
  EXPECT_EQ(config.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(config.rope.theta, 150000.0);
  EXPECT_DOUBLE_EQ(config.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(config.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(config.rope.beta_slow, 1.0);
  EXPECT_EQ(config.rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(config.rope.truncate);
  EXPECT_FALSE(config.rope.attention_factor.has_value());
  EXPECT_EQ(config.max_position_embeddings, 4096);
  EXPECT_EQ(config.sliding_window, 8);
  EXPECT_EQ(config.layer_types, (std::vector<LayerAttention>{S, F, S}));
  EXPECT_DOUBLE_EQ(config.swiglu_limit, 7.0);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_TRUE(config.attention_bias);
  EXPECT_EQ(config.quant_method, QuantMethod::Mxfp4);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(config.pad_token_id, 0);
  EXPECT_FALSE(config.bos_token_id.has_value());
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(config.is_moe_layer(i));
}

TEST(ModelConfig, Qwen3Fixture) {
  const ModelConfig config = load_model_config(test::fixtures_dir() / "qwen3-tiny" / "config.json");
  EXPECT_EQ(config.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(config.model_type, "qwen3");
  EXPECT_EQ(config.rope.type, "default");
  EXPECT_DOUBLE_EQ(config.rope.theta, 1e6);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_FALSE(config.attention_bias);
  EXPECT_EQ(config.head_dim, 32);
  EXPECT_EQ(config.intermediate_size, 320);
  EXPECT_EQ(config.num_experts, 0);
  EXPECT_EQ(config.sliding_window, 0);
  EXPECT_EQ(config.layer_types, (std::vector<LayerAttention>{F, F, F}));
  EXPECT_EQ(config.quant_method, QuantMethod::None);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_FALSE(config.bos_token_id.has_value());
  EXPECT_EQ(config.eos_token_ids, (std::vector<int32_t>{3}));
  for (int64_t i = 0; i < 3; ++i) EXPECT_FALSE(config.is_moe_layer(i));
}

TEST(ModelConfig, Qwen3MoeFixture) {
  const ModelConfig config = load_model_config(test::fixtures_dir() / "qwen3moe-tiny" / "config.json");
  EXPECT_EQ(config.model_type, "qwen3_moe");
  EXPECT_EQ(config.num_experts, 16);  // from num_local_experts
  EXPECT_EQ(config.num_experts_per_tok, 4);
  EXPECT_TRUE(config.norm_topk_prob);
  EXPECT_EQ(config.moe_intermediate_size, 64);
  EXPECT_EQ(config.intermediate_size, 256);
  EXPECT_EQ(config.decoder_sparse_step, 1);
  EXPECT_TRUE(config.mlp_only_layers.empty());
  EXPECT_DOUBLE_EQ(config.rope.theta, 1e6);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_EQ(config.layer_types, (std::vector<LayerAttention>{F, F, F}));
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(config.is_moe_layer(i));
}

TEST(ModelConfig, Qwen3MoeSparseStepAndDenseLayers) {
  json config = fixture_config("qwen3moe-tiny");
  config.erase("num_local_experts");
  config["num_experts"] = 8;  // the spelling real Qwen3-MoE configs use
  config["num_hidden_layers"] = 6;
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = {3};
  const ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.num_experts, 8);
  const std::vector<bool> moe = {false, true, false, false, false, true};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(parsed.is_moe_layer(i), moe[size_t(i)]) << "layer " << i;

  config["mlp_only_layers"] = {6};
  EXPECT_THAT(parse_error(config), HasSubstr("mlp_only_layers[0]"));
  // Dense layers need the dense intermediate size.
  config["mlp_only_layers"] = {3};
  config.erase("intermediate_size");
  EXPECT_THAT(parse_error(config), HasSubstr("'intermediate_size'"));
}

TEST(ModelConfig, RopeParametersYarnForm) {
  // gpt-oss as transformers 5 writes it: everything inside rope_parameters.
  json config = fixture_config("gpt-oss-tiny");
  config.erase("rope_scaling");
  config.erase("rope_theta");
  config["rope_parameters"] = {{"rope_type", "yarn"},
                               {"rope_theta", 5e5},
                               {"factor", 8.0},
                               {"beta_fast", 16},
                               {"beta_slow", 2.0},
                               {"attention_factor", 1.25},
                               {"original_max_position_embeddings", 1024}};
  const ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 5e5);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(parsed.rope.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(parsed.rope.beta_slow, 2.0);
  EXPECT_EQ(parsed.rope.original_max_position_embeddings, 1024);
  EXPECT_TRUE(parsed.rope.truncate);  // absent means true
  EXPECT_EQ(parsed.rope.attention_factor, 1.25);
}

TEST(ModelConfig, RopeScalingLegacySpellings) {
  json config = fixture_config("qwen3-tiny");
  config.erase("rope_parameters");
  config["rope_theta"] = 20000.0;
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
  const ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(parsed.rope.theta, 20000.0);
  EXPECT_DOUBLE_EQ(parsed.rope.factor, 4.0);
  // Without the original length, transformers uses max_position_embeddings.
  EXPECT_EQ(parsed.rope.original_max_position_embeddings, 4096);

  config["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(config).rope.type, "default");
  EXPECT_DOUBLE_EQ(parse(config).rope.theta, 20000.0);

  config["rope_scaling"] = {{"rope_type", "longrope"}};
  EXPECT_THAT(parse_error(config), HasSubstr("'longrope'"));
  config["rope_scaling"] = {{"rope_type", "yarn"}};
  EXPECT_THAT(parse_error(config), HasSubstr("'rope_scaling.factor'"));
}

TEST(ModelConfig, DerivedDefaults) {
  json config = fixture_config("gpt-oss-tiny");
  config.erase("head_dim");
  config.erase("layer_types");
  config.erase("num_experts_per_tok");
  config["experts_per_token"] = 2;  // key of the original gpt-oss config
  config["num_hidden_layers"] = 4;
  config["eos_token_id"] = {200002, 199999};
  config["bos_token_id"] = nullptr;
  const ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.head_dim, 32);  // hidden / heads
  EXPECT_EQ(parsed.num_experts_per_tok, 2);
  EXPECT_EQ(parsed.layer_types, (std::vector<LayerAttention>{S, F, S, F}));
  EXPECT_EQ(parsed.eos_token_ids, (std::vector<int32_t>{200002, 199999}));
  EXPECT_FALSE(parsed.bos_token_id.has_value());
}

TEST(ModelConfig, Qwen3SlidingWindowLayers) {
  json config = fixture_config("qwen3-tiny");
  config.erase("layer_types");
  config["num_hidden_layers"] = 5;
  config["max_window_layers"] = 3;
  config["sliding_window"] = 16;
  // Without use_sliding_window the window is ignored, as transformers does.
  ModelConfig parsed = parse(config);
  EXPECT_EQ(parsed.sliding_window, 0);
  EXPECT_EQ(parsed.layer_types, (std::vector<LayerAttention>{F, F, F, F, F}));

  config["use_sliding_window"] = true;
  parsed = parse(config);
  EXPECT_EQ(parsed.sliding_window, 16);
  EXPECT_EQ(parsed.layer_types, (std::vector<LayerAttention>{F, F, F, S, S}));
}

TEST(ModelConfig, LayerTypesValidated) {
  json config = fixture_config("gpt-oss-tiny");
  config["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_THAT(parse_error(config), HasSubstr("'layer_types' has 2 entries"));
  config["layer_types"] = {"sliding_attention", "full_attention", "chunked_attention"};
  EXPECT_THAT(parse_error(config), HasSubstr("layer_types[2]"));
  config["layer_types"] = {"sliding_attention", "full_attention", "full_attention"};
  config["sliding_window"] = nullptr;
  EXPECT_THAT(parse_error(config), HasSubstr("sliding_window"));
}

TEST(ModelConfig, UnknownArchitecture) {
  json config = fixture_config("qwen3-tiny");
  config["architectures"] = {"LlamaForCausalLM"};
  EXPECT_EQ(parse_error(config),
            "test/config.json: architecture 'LlamaForCausalLM' is not supported (supported: "
            "GptOssForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)");
  config.erase("architectures");
  EXPECT_THAT(parse_error(config), HasSubstr("'architectures'"));
}

TEST(ModelConfig, ModelTypeMustMatchArchitecture) {
  json config = fixture_config("qwen3-tiny");
  config["model_type"] = "qwen3_moe";
  EXPECT_THAT(parse_error(config), HasSubstr("'model_type'"));
}

TEST(ModelConfig, UnknownQuantMethod) {
  json config = fixture_config("gpt-oss-tiny");
  config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  const std::string message = parse_error(config);
  EXPECT_THAT(message, HasSubstr("quant_method"));
  EXPECT_THAT(message, HasSubstr("'fp8'"));

  config.erase("quantization_config");
  EXPECT_EQ(parse(config).quant_method, QuantMethod::None);
}

TEST(ModelConfig, Mxfp4NeedsHiddenMultipleOf32) {
  json config = fixture_config("gpt-oss-tiny");
  config["hidden_size"] = 136;
  config["head_dim"] = 34;
  EXPECT_THAT(parse_error(config), HasSubstr("divisible by 32"));
}

TEST(ModelConfig, MissingHiddenSize) {
  json config = fixture_config("qwen3-tiny");
  config.erase("hidden_size");
  EXPECT_THAT(parse_error(config), HasSubstr("missing required field 'hidden_size'"));
}

TEST(ModelConfig, WrongTypeForNumHiddenLayers) {
  json config = fixture_config("qwen3-tiny");
  config["num_hidden_layers"] = "3";
  EXPECT_THAT(parse_error(config), HasSubstr("'num_hidden_layers' must be an integer, got string"));
  config["num_hidden_layers"] = 3.5;
  EXPECT_THAT(parse_error(config), HasSubstr("'num_hidden_layers' must be an integer, got number"));
}

TEST(ModelConfig, InvalidDimensions) {
  json config = fixture_config("qwen3-tiny");
  config["num_key_value_heads"] = 3;
  EXPECT_THAT(parse_error(config), HasSubstr("divisible by num_key_value_heads"));
  config["num_key_value_heads"] = 0;
  EXPECT_THAT(parse_error(config), HasSubstr("'num_key_value_heads' must be positive"));

  json moe = fixture_config("qwen3moe-tiny");
  moe["num_experts_per_tok"] = 17;
  EXPECT_THAT(parse_error(moe), HasSubstr("exceeds the number of experts"));
}

TEST(ModelConfig, MalformedJson) {
  EXPECT_THAT(error_of([] { parse_model_config("{\"hidden_size\": ", "x/config.json"); }),
              HasSubstr("x/config.json: not valid JSON"));
  const auto missing = test::fixtures_dir() / "no-such-model" / "config.json";
  const std::string message = error_of([&] { load_model_config(missing); });
  EXPECT_THAT(message, HasSubstr("cannot open " + missing.string()));
}

TEST(ModelConfigGeneration, Fixture) {
  const GenerationConfig config =
      load_generation_config(test::fixtures_dir() / "qwen3-tiny" / "generation_config.json");
  EXPECT_EQ(config.eos_token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(config.pad_token_id, 0);
  EXPECT_FALSE(config.temperature.has_value());
}

TEST(ModelConfigGeneration, AllFieldsAndErrors) {
  test::TempDir dir;
  const auto path = dir.path() / "generation_config.json";
  test::write_file(path, R"({"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012],
                             "pad_token_id": null, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                             "min_p": 0, "do_sample": true})");
  const GenerationConfig config = load_generation_config(path);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int32_t>{200002, 199999, 200012}));
  EXPECT_EQ(config.bos_token_id, 199998);
  EXPECT_FALSE(config.pad_token_id.has_value());
  EXPECT_EQ(config.temperature, 0.6);
  EXPECT_EQ(config.top_p, 0.95);
  EXPECT_EQ(config.top_k, 20);
  EXPECT_EQ(config.min_p, 0.0);

  const GenerationConfig absent = load_generation_config(dir.path() / "absent.json");
  EXPECT_TRUE(absent.eos_token_ids.empty());
  EXPECT_FALSE(absent.top_k.has_value());

  test::write_file(path, "{\"eos_token_id\": [1,");
  EXPECT_THAT(error_of([&] { load_generation_config(path); }), HasSubstr(path.string()));
  test::write_file(path, R"({"top_k": "20"})");
  const std::string message = error_of([&] { load_generation_config(path); });
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("'top_k'"));
}

TEST(ModelConfigTokenizer, StringAndAddedTokenForms) {
  test::TempDir dir;
  const auto path = dir.path() / "tokenizer_config.json";
  test::write_file(path, R"({
    "add_bos_token": true,
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "<|im_end|>",
    "pad_token": null,
    "unk_token": {"content": "<unk>"},
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
  })");
  const TokenizerConfig config = load_tokenizer_config(path);
  EXPECT_TRUE(config.add_bos_token);
  EXPECT_EQ(config.bos_token, "<s>");
  EXPECT_EQ(config.eos_token, "<|im_end|>");
  EXPECT_FALSE(config.pad_token.has_value());
  EXPECT_EQ(config.unk_token, "<unk>");
  EXPECT_EQ(config.chat_template, "D");

  test::write_file(path, R"({"chat_template": [{"name": "rag", "template": "R"}]})");
  EXPECT_EQ(load_tokenizer_config(path).chat_template, "R");
  test::write_file(path, R"({"chat_template": "{{ messages }}"})");
  EXPECT_EQ(load_tokenizer_config(path).chat_template, "{{ messages }}");
  EXPECT_FALSE(load_tokenizer_config(path).add_bos_token);
}

TEST(ModelConfigTokenizer, TemplateFileBesideConfig) {
  test::TempDir dir;
  const auto path = dir.path() / "tokenizer_config.json";
  test::write_file(path, R"({"eos_token": "<|im_end|>"})");
  test::write_file(dir.path() / "chat_template.jinja", "{% for m in messages %}{% endfor %}");
  EXPECT_EQ(load_tokenizer_config(path).chat_template, "{% for m in messages %}{% endfor %}");
}

TEST(ModelConfigTokenizer, AbsentAndMalformed) {
  test::TempDir dir;
  const TokenizerConfig absent = load_tokenizer_config(dir.path() / "tokenizer_config.json");
  EXPECT_FALSE(absent.eos_token.has_value());
  EXPECT_FALSE(absent.chat_template.has_value());

  const auto path = dir.path() / "tokenizer_config.json";
  test::write_file(path, R"({"eos_token": 5})");
  const std::string message = error_of([&] { load_tokenizer_config(path); });
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("'eos_token'"));
  test::write_file(path, "not json");
  EXPECT_THAT(error_of([&] { load_tokenizer_config(path); }), HasSubstr("not valid JSON"));
}

}  // namespace
}  // namespace anvil
