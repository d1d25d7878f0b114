#include "server/served_model.h"

#include <algorithm>

namespace anvil::server {

std::unique_ptr<ServedModel> make_served_model(std::unique_ptr<Model> model, const ServerConfig& config) {
  auto served = std::make_unique<ServedModel>();
  served->dir = config.model_dir;
  if (std::filesystem::exists(config.model_dir / "tokenizer.json"))
    served->tokenizer = Tokenizer::from_file(config.model_dir / "tokenizer.json");
  served->generation = load_generation_config(config.model_dir / "generation_config.json");
  served->eos_ids = model->config().eos_token_ids;
  for (const int32_t id : served->generation.eos_token_ids)
    if (std::find(served->eos_ids.begin(), served->eos_ids.end(), id) == served->eos_ids.end()) served->eos_ids.push_back(id);
  served->vocab_size = model->config().vocab_size;
  served->chat = std::make_unique<ChatFormat>(model->config(), served->tokenizer.get());
  served->engine = std::make_unique<Engine>(std::move(model), config.engine);
  served->max_model_len = served->engine->max_model_len();
  return served;
}

}  // namespace anvil::server
