#pragma once
// OpenAI (and vLLM-extra) request bodies turned into plain structs, with every field checked for
// type and range. Fields we know but do not implement are refused when set to anything that
// would change the output, so a client never gets a 200 for a request we did not honour.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/chat.h"
#include "server/api_error.h"

namespace anvil::server {

struct StructuredOutput {
  enum class Kind { None, JsonObject, JsonSchema };
  Kind kind = Kind::None;
  std::string schema_json;
  std::string param;  // the field it came from, for schema errors
};

// Fields shared by chat and text completions.
struct GenerationOptions {
  std::string model;  // empty: the first served name
  std::optional<double> temperature, top_p, min_p;  // unset: generation_config.json, then defaults
  std::optional<int64_t> top_k;
  double presence_penalty = 0.0, frequency_penalty = 0.0, repetition_penalty = 1.0;
  std::optional<int64_t> max_tokens;  // unset: chat fills the context, completions take 16
  int64_t min_tokens = 0;
  int64_t n = 1;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats
  int top_logprobs = -1;  // -1: no logprobs
  bool return_token_ids = false;
  bool tokens_as_ids = false;  // return_tokens_as_token_ids: logprob tokens as "token_id:N"
  StructuredOutput structured;
  std::vector<std::string> ignored_fields;  // unknown keys, logged by the handler
};

enum class ToolChoice { None, Auto, Required, Named };

struct ChatRequest {
  GenerationOptions options;
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::None;
  std::string named_tool;
  bool parallel_tool_calls = true;
  std::optional<std::string> reasoning_effort;
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking
  bool include_reasoning = true;
  bool add_generation_prompt = true;
  bool logprobs = false;
};

struct CompletionPrompt {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> ids;
};

struct CompletionRequest {
  GenerationOptions options;
  std::vector<CompletionPrompt> prompts;  // a batch: choices are numbered prompt by prompt
};

// Sequences one request may ask for (prompts x n): bounds the work a single body can queue.
inline constexpr int64_t kMaxSequencesPerRequest = 256;

ChatRequest parse_chat_request(const Json& body);
CompletionRequest parse_completion_request(const Json& body);

// Messages in OpenAI's shape (shared with /tokenize).
std::vector<ChatMessage> parse_messages(const Json& messages, const std::string& param);
std::vector<ToolDefinition> parse_tools(const Json& tools, const std::string& param);

}  // namespace anvil::server
