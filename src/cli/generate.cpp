// anvil generate: the engine from the terminal, and the contract the model checks call.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "engine/generator.h"

namespace anvil::cli {

namespace {

struct GenerateOptions {
  ModelLoadFlags model;
  std::string prompt, prompt_ids;
  int64_t max_tokens = 64;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int64_t top_k = 0;
  std::optional<uint64_t> seed;
  bool ignore_eos = false, json = false, allow_special = false;
};

void run_generate(const GenerateOptions& options) {
  if (options.prompt.empty() == options.prompt_ids.empty()) fail("give exactly one of --prompt or --prompt-ids");
  const std::string& model_dir = options.model.model_dir;
  auto model = options.model.load();
  auto tokenizer = load_model_tokenizer(model_dir);

  GenerateRequest request;
  if (!options.prompt_ids.empty()) {
    request.prompt_ids = parse_id_list(options.prompt_ids, "--prompt-ids");
  } else {
    if (!tokenizer) fail("{}: no tokenizer.json, so --prompt cannot be tokenized; use --prompt-ids", model_dir);
    request.prompt_ids = tokenizer->encode(options.prompt, options.allow_special);
  }
  request.max_tokens = options.max_tokens;
  request.sampling.temperature = options.temperature;
  request.sampling.top_k = options.top_k;
  request.sampling.top_p = options.top_p;
  request.sampling.min_p = options.min_p;
  request.sampling.seed = options.seed;
  request.sampling.validate();
  request.ignore_eos = options.ignore_eos;
  request.eos_token_ids = model_eos_ids(model_dir, model->config());

  std::unique_ptr<StreamDecoder> stream;
  if (tokenizer && !options.json) stream = std::make_unique<StreamDecoder>(*tokenizer);
  const auto on_token = [&](int32_t id) {
    if (!stream) return;
    std::fputs(stream->push(id).c_str(), stdout);
    std::fflush(stdout);
  };
  const GenerateResult result = generate(*model, request, on_token);

  if (options.json) {
    nlohmann::json out;
    out["prompt_ids"] = request.prompt_ids;
    out["output_ids"] = result.output_ids;
    out["text"] = tokenizer ? tokenizer->decode(result.output_ids) : "";
    out["finish_reason"] = result.finish_reason;
    const double prompt_tokens = double(request.prompt_ids.size());
    out["timings"] = {
        {"prefill_seconds", result.prefill_seconds},
        {"decode_seconds", result.decode_seconds},
        {"prefill_tokens_per_s", result.prefill_seconds > 0 ? prompt_tokens / result.prefill_seconds : 0.0},
        {"decode_tokens_per_s", result.decode_seconds > 0 ? double(result.decode_steps) / result.decode_seconds : 0.0},
        // Weights one decode step reads (experts at top-k), to compare against memory bandwidth.
        {"weight_bytes_per_token", model->weight_bytes_per_token()},
        {"decode_weight_gb_per_s", result.decode_seconds > 0 ? double(result.decode_steps) *
                                                                   double(model->weight_bytes_per_token()) /
                                                                   result.decode_seconds / 1e9
                                                             : 0.0},
    };
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (stream) {
    std::printf("%s\n", stream->finish().c_str());
  } else {
    for (size_t i = 0; i < result.output_ids.size(); ++i) std::printf("%s%d", i ? "," : "", result.output_ids[i]);
    std::printf("\n");
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* verb = app.add_subcommand("generate", "Generate text from a prompt on this machine");
  options->model.add_to(*verb);
  verb->add_option("--prompt", options->prompt, "Prompt text (needs tokenizer.json)");
  verb->add_option("--prompt-ids", options->prompt_ids, "Prompt token ids, comma-separated");
  verb->add_option("--max-tokens", options->max_tokens, "Tokens to generate at most");
  verb->add_option("--temperature", options->temperature, "0 = greedy");
  verb->add_option("--top-k", options->top_k, "Keep the k most likely tokens (0 = off)");
  verb->add_option("--top-p", options->top_p, "Keep the smallest set with this much probability");
  verb->add_option("--min-p", options->min_p, "Drop tokens less likely than this times the best");
  verb->add_option("--seed", options->seed, "Random seed (same seed, same output)");
  verb->add_flag("--ignore-eos", options->ignore_eos, "Keep generating past end-of-sequence tokens");
  verb->add_flag("--allow-special", options->allow_special, "Let special-token text in --prompt become control tokens");
  verb->add_flag("--json", options->json, "Print one JSON object with ids, text and timings");
  verb->callback([options] { run_generate(*options); });
}

}  // namespace anvil::cli
