// /v1/models, /tokenize, /detokenize.
#include "server/endpoints.h"

#include "server/openai_responses.h"

namespace anvil::server {

namespace {

const Tokenizer& require_tokenizer(const ServedModel& model) {
  if (!model.tokenizer) bad_request("", "this model has no tokenizer.json");
  return *model.tokenizer;
}

}  // namespace

Json models_json(const ServerConfig& config, const ServedModel& model, const std::string* only) {
  static const int64_t created = unix_time();
  Json data = Json::array();
  for (const std::string& name : config.served_model_names) {
    if (only && *only != name) continue;
    Json card = {{"id", name},
                 {"object", "model"},
                 {"created", created},
                 {"owned_by", "anvil"},
                 {"root", model.dir.string()},
                 {"parent", nullptr},
                 {"max_model_len", model.max_model_len},
                 {"permission", Json::array()}};
    if (only) return card;
    data.push_back(std::move(card));
  }
  if (only) throw ApiError(404, "The model `" + *only + "` does not exist.", "model");
  return {{"object", "list"}, {"data", std::move(data)}};
}

// vLLM's /tokenize: {prompt} or {messages} in, {count, max_model_len, tokens[, token_strs]} out.
void handle_tokenize(EndpointContext& context, const std::string& http_body, httplib::Response& res) {
  const Json body = parse_request_body(http_body);
  FieldReader fields(body, "");
  check_model_name(context.config, fields.string("model").value_or(""));
  const ServedModel& model = *context.model;
  const Tokenizer& tokenizer = require_tokenizer(model);
  const bool add_special = fields.boolean("add_special_tokens").value_or(true);
  const bool token_strs = fields.boolean("return_token_strs").value_or(false);
  std::vector<int32_t> ids;
  if (fields.has("messages")) {
    ChatRequest chat;
    chat.messages = parse_messages(*fields.raw("messages"), "messages");
    if (const Json* tools = fields.raw("tools")) chat.tools = parse_tools(*tools, "tools");
    chat.tool_choice = chat.tools.empty() ? ToolChoice::None : ToolChoice::Auto;
    chat.add_generation_prompt = fields.boolean("add_generation_prompt").value_or(true);
    if (const Json* kwargs = fields.raw("chat_template_kwargs")) {
      FieldReader k(object_value(*kwargs, "chat_template_kwargs"), "chat_template_kwargs");
      chat.enable_thinking = k.boolean("enable_thinking");
    }
    chat.reasoning_effort = fields.choice("reasoning_effort", {"none", "minimal", "low", "medium", "high", "xhigh", "max"});
    ids = model.chat->render(chat).ids;
  } else {
    const auto prompt = fields.string("prompt");
    if (!prompt) bad_request("prompt", "give prompt (a string) or messages");
    ids = tokenizer.encode(*prompt, add_special);
  }
  Json out = {{"count", ids.size()}, {"max_model_len", model.max_model_len}, {"tokens", ids}};
  if (token_strs) {
    Json strs = Json::array();
    for (const int32_t id : ids) strs.push_back(tokenizer.decode(std::vector<int32_t>{id}));
    out["token_strs"] = std::move(strs);
  }
  res.set_content(dump_json(out), "application/json");
}

void handle_detokenize(EndpointContext& context, const std::string& http_body, httplib::Response& res) {
  const Json body = parse_request_body(http_body);
  FieldReader fields(body, "");
  check_model_name(context.config, fields.string("model").value_or(""));
  const Tokenizer& tokenizer = require_tokenizer(*context.model);
  const Json* tokens = fields.raw("tokens");
  if (!tokens) bad_request("tokens", "tokens is required");
  array_value(*tokens, "tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i)
    ids.push_back(int32_t(integer_value((*tokens)[i], "tokens[" + std::to_string(i) + "]", 0, tokenizer.vocab_size() - 1)));
  res.set_content(dump_json({{"prompt", tokenizer.decode(ids)}}), "application/json");
}

}  // namespace anvil::server
