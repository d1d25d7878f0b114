// anvil init-demo: writes a small random-weight gpt-oss checkpoint in the Hugging Face layout,
// with the tokenizer it is given. It stands in for a trained demo model: its text is gibberish,
// but it exercises the real loading, tokenizer and generation paths end to end.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "formats/safetensors.h"

namespace anvil::cli {

namespace {

nlohmann::json demo_config() {
  return {
      {"architectures", {"GptOssForCausalLM"}},
      {"model_type", "gpt_oss"},
      {"hidden_size", 256},
      {"intermediate_size", 256},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 2},
      {"head_dim", 64},
      {"num_local_experts", 8},
      {"num_experts_per_tok", 4},
      {"experts_per_token", 4},
      {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
      {"sliding_window", 128},
      {"rope_theta", 150000.0},
      {"rope_scaling",
       {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
        {"original_max_position_embeddings", 4096}, {"truncate", false}}},
      {"max_position_embeddings", 131072},
      {"swiglu_limit", 7.0},
      {"rms_norm_eps", 1e-5},
      {"vocab_size", 201088},
      {"eos_token_id", 200002},
      {"pad_token_id", 199999},
      {"attention_bias", true},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"quantization_config",
       {{"quant_method", "mxfp4"},
        {"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}}},
  };
}

void write_json(const std::filesystem::path& path, const nlohmann::json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  if (!out) fail("{}: cannot write", path.string());
}

struct InitDemoOptions {
  std::string out, tokenizer;
  uint64_t seed = 0;
};

void run_init_demo(const InitDemoOptions& options) {
  const std::filesystem::path out = options.out;
  std::filesystem::create_directories(out);
  const nlohmann::json config = demo_config();
  write_json(out / "config.json", config);
  write_json(out / "generation_config.json",
             {{"bos_token_id", 199998}, {"eos_token_id", {200002, 199999, 200012}}, {"pad_token_id", 199999}});
  if (!options.tokenizer.empty() && std::filesystem::absolute(options.tokenizer) != std::filesystem::absolute(out / "tokenizer.json"))
    std::filesystem::copy_file(options.tokenizer, out / "tokenizer.json", std::filesystem::copy_options::overwrite_existing);

  // Building the model through a recording source lists exactly the tensors it reads.
  auto recording = std::make_unique<RecordingDummyWeights>(options.seed);
  RecordingDummyWeights& recorded = *recording;
  auto model = create_model(parse_model_config(config.dump(), "demo config"), std::move(recording));
  std::vector<NamedTensor> tensors;
  for (const auto& [name, view] : recorded.tensors()) tensors.push_back({name, view});
  // Wider elements first, so every tensor's data stays aligned to its element size (safetensors
  // allows no padding between tensors).
  std::stable_sort(tensors.begin(), tensors.end(), [](const NamedTensor& a, const NamedTensor& b) {
    return dtype_size(a.view.dtype) > dtype_size(b.view.dtype);
  });
  write_safetensors(out / "model.safetensors", tensors, {{"format", "pt"}});
  std::printf("wrote %s (%zu tensors, random weights)\n", out.c_str(), tensors.size());
}

}  // namespace

void register_init_demo(CLI::App& app) {
  auto options = std::make_shared<InitDemoOptions>();
  CLI::App* verb = app.add_subcommand("init-demo", "Write a small random-weight gpt-oss checkpoint (a stand-in demo model)");
  verb->add_option("--out", options->out, "Directory to write")->required();
  verb->add_option("--tokenizer", options->tokenizer, "tokenizer.json to ship with it");
  verb->add_option("--seed", options->seed, "Seed of the random weights");
  verb->callback([options] { run_init_demo(*options); });
}

}  // namespace anvil::cli
