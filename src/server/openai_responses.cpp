#include "server/openai_responses.h"

#include <chrono>
#include <cmath>
#include <random>

namespace anvil::server {

std::string make_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 32; ++i) id += kHex[rng() & 15];
  return id;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string LogprobFormat::token_text(int32_t id) const {
  if (tokens_as_ids || !tokenizer || id < 0 || id >= tokenizer->vocab_size()) return "token_id:" + std::to_string(id);
  return tokenizer->decode(std::vector<int32_t>{id});
}

namespace {

// -inf (a token the constraint masked) has no JSON form; OpenAI clients read -9999 as "never".
double finite_logprob(float value) { return std::isfinite(value) ? double(value) : -9999.0; }

Json token_bytes(const LogprobFormat& format, int32_t id) {
  Json bytes = Json::array();
  if (format.tokenizer && id >= 0 && id < format.tokenizer->vocab_size())
    for (const unsigned char c : format.tokenizer->token_bytes(id)) bytes.push_back(int(c));
  return bytes;
}

}  // namespace

Json chat_logprobs(const std::vector<GeneratedToken>& tokens, const LogprobFormat& format) {
  Json content = Json::array();
  for (const GeneratedToken& token : tokens) {
    Json top = Json::array();
    for (const TokenLogprob& alt : token.top_logprobs)
      top.push_back({{"token", format.token_text(alt.token)},
                     {"logprob", finite_logprob(alt.logprob)},
                     {"bytes", token_bytes(format, alt.token)}});
    content.push_back({{"token", format.token_text(token.token)},
                       {"logprob", finite_logprob(token.logprob)},
                       {"bytes", token_bytes(format, token.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

Json completion_logprobs(const std::vector<GeneratedToken>& tokens, const LogprobFormat& format, size_t text_offset) {
  Json text_tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  for (const GeneratedToken& token : tokens) {
    const std::string text = format.token_text(token.token);
    text_tokens.push_back(text);
    token_logprobs.push_back(finite_logprob(token.logprob));
    Json alternatives = Json::object();
    for (const TokenLogprob& alt : token.top_logprobs) alternatives[format.token_text(alt.token)] = finite_logprob(alt.logprob);
    top.push_back(std::move(alternatives));
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", std::move(text_tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

Json chat_delta_json(const ChoiceUpdate& update) {
  Json delta = Json::object();
  if (!update.reasoning.empty()) {
    delta["reasoning"] = update.reasoning;
    delta["reasoning_content"] = update.reasoning;
  }
  if (!update.text.empty()) delta["content"] = update.text;
  if (!update.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCallDelta& call : update.tool_calls) {
      Json item = {{"index", call.index}};
      Json function = {{"arguments", call.arguments}};
      if (!call.id.empty()) {
        item["id"] = call.id;
        item["type"] = "function";
        function["name"] = call.name;
      }
      item["function"] = std::move(function);
      calls.push_back(std::move(item));
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta;
}

Json chat_message_json(const ChoiceResult& result) {
  Json message = {{"role", "assistant"}};
  message["content"] = result.text.empty() && !result.tool_calls.empty() ? Json(nullptr) : Json(result.text);
  message["reasoning"] = result.reasoning.empty() ? Json(nullptr) : Json(result.reasoning);
  message["reasoning_content"] = message["reasoning"];
  if (!result.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ToolCall& call : result.tool_calls)
      calls.push_back({{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments_json}}}});
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

}  // namespace anvil::server
