// anvil logits: the logits at every prompt position, written as a safetensors file.
#include "cli/common.h"
#include "cli/verbs.h"
#include "engine/generator.h"
#include "formats/safetensors.h"

namespace anvil::cli {

namespace {
struct LogitsOptions {
  std::string model_dir, prompt_ids, out, load_format = "auto";
  int threads = 0;
};

void run_logits(const LogitsOptions& options) {
  apply_threads_option(options.threads);
  const auto ids = parse_id_list(options.prompt_ids, "--prompt-ids");
  LoadOptions load;
  load.format = parse_load_format(options.load_format);
  auto model = load_model(options.model_dir, load);
  const std::vector<float> logits = prompt_logits(*model, ids);
  TensorView view;
  view.dtype = DType::F32;
  view.shape = {int64_t(ids.size()), model->config().vocab_size};
  view.data = logits.data();
  write_safetensors(options.out, {{"logits", view}});
}
}  // namespace

void register_logits(CLI::App& app) {
  auto options = std::make_shared<LogitsOptions>();
  CLI::App* verb = app.add_subcommand("logits", "Write the logits at every prompt position to a safetensors file");
  verb->add_option("--model", options->model_dir, "Hugging Face checkpoint directory")->required();
  verb->add_option("--prompt-ids", options->prompt_ids, "Prompt token ids, comma-separated")->required();
  verb->add_option("--out", options->out, "Output .safetensors file (tensor `logits`, float32 [T, vocab])")->required();
  verb->add_option("--load-format", options->load_format, "auto (read weights) or dummy (random weights)");
  add_threads_option(*verb, options->threads);
  verb->callback([options] { run_logits(*options); });
}

}  // namespace anvil::cli
