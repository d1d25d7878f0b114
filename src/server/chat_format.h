#pragma once
// The chat format a model speaks, picked by architecture: Harmony for gpt-oss, ChatML for
// Qwen3 / Qwen3-MoE. It renders a chat request to prompt ids, names the ids that end a turn,
// makes the streaming output parser, and builds the constraints that write JSON answers and
// forced tool calls in the format's own syntax.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "formats/chat.h"
#include "formats/model_config.h"
#include "formats/tokenizer.h"
#include "server/openai_protocol.h"

namespace anvil::server {

using ConstraintFactory = std::function<std::unique_ptr<TokenConstraint>()>;

enum class ChatFormatKind { None, Harmony, ChatMl };

// A reply the request forces through constraint(): a JSON answer (response_format) or a tool call
// (tool_choice required or named). Either skips reasoning: Harmony writes it straight on the final
// channel (or as a commentary call), ChatML after an empty or closed <think> block, so the
// constraint never shapes reasoning and the reply is never read as reasoning.
enum class ForcedReply { None, JsonAnswer, ToolCall };

struct RenderedPrompt {
  std::vector<int32_t> ids;
  bool starts_in_reasoning = false;  // ChatML: the generation prompt left a <think> open
  bool thinking_enabled = true;      // ChatML: no empty <think></think> was appended
  ForcedReply forced = ForcedReply::None;
  // ChatML: what the forced reply starts with before its JSON (closing or skipping the think block,
  // then "<tool_call>\n" for a call). Harmony's headers are built by constraint().
  std::vector<int32_t> forced_prefix;
};

class ChatFormat {
 public:
  ChatFormat(const ModelConfig& config, const Tokenizer* tokenizer);
  ChatFormatKind kind() const { return kind_; }

  // Throws ApiError (400) when the model has no chat format or the messages cannot be rendered.
  RenderedPrompt render(const ChatRequest& request) const;
  std::vector<int32_t> stop_token_ids() const { return stop_ids_; }
  // A forced ChatML reply gets a parser that reads it by position rather than by tags: its JSON may
  // hold "</think>" or "<tool_call>" as string data, which the tag parser would act on.
  std::unique_ptr<ChatOutputParser> make_parser(const RenderedPrompt& prompt) const;
  // The constraint for the request's JSON answer or forced tool call; empty when unconstrained.
  // Schemas are checked here, once (ApiError 400), so the factory itself does not fail.
  ConstraintFactory constraint(const ChatRequest& request, const RenderedPrompt& prompt) const;

 private:
  std::vector<int32_t> encode(const std::string& text) const;
  int32_t special(const char* token) const;

  ChatFormatKind kind_ = ChatFormatKind::None;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> stop_ids_;
};

// A constraint factory for a JSON schema or any JSON object, checked once (ApiError 400 naming
// `structured.param` for a schema the constraint cannot enforce).
ConstraintFactory json_constraint(const StructuredOutput& structured, const Tokenizer& tokenizer);

}  // namespace anvil::server
