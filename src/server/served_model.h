#pragma once
// Everything the endpoints need about the one model this server serves, built once loading is
// done: the engine (which owns the model), the tokenizer, the chat format and the defaults.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "formats/model_config.h"
#include "formats/tokenizer.h"
#include "server/chat_format.h"

namespace anvil::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::filesystem::path model_dir;
  std::vector<std::string> served_model_names;  // the first names responses and metrics
  std::string api_key;  // empty: no authentication
  size_t max_body_bytes = size_t(8) << 20;
  std::string version;
  EngineConfig engine;
};

struct ServedModel {
  std::filesystem::path dir;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the directory has no tokenizer.json
  GenerationConfig generation;
  std::vector<int32_t> eos_ids;  // config.json and generation_config.json together
  std::unique_ptr<ChatFormat> chat;
  std::unique_ptr<Engine> engine;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;  // rows of the model's logits
};

std::unique_ptr<ServedModel> make_served_model(std::unique_ptr<Model> model, const ServerConfig& config);

}  // namespace anvil::server
