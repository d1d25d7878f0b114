// anvil logits: the logits at every prompt position, written as a safetensors file.
#include "cli/common.h"
#include "cli/verbs.h"
#include "engine/generator.h"
#include "formats/safetensors.h"

namespace anvil::cli {

namespace {
struct LogitsOptions {
  ModelLoadFlags model;
  std::string prompt_ids, out;
};

void run_logits(const LogitsOptions& options) {
  const auto ids = parse_id_list(options.prompt_ids, "--prompt-ids");
  auto model = options.model.load();
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
  options->model.add_to(*verb);
  verb->add_option("--prompt-ids", options->prompt_ids, "Prompt token ids, comma-separated")->required();
  verb->add_option("--out", options->out, "Output .safetensors file (tensor `logits`, float32 [T, vocab])")->required();
  verb->callback([options] { run_logits(*options); });
}

}  // namespace anvil::cli
