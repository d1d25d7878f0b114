#pragma once
// The Harmony chat format of gpt-oss (o200k_harmony tokenizer): prompt rendering to token ids and
// a streaming parser for what the model generates. See specs/models.md §2.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats/chat.h"
#include "formats/tokenizer.h"

namespace anvil {

// Renders the conversation as Harmony token ids: a system message built from the options, a
// developer message from the OpenAI system/developer messages plus the function tools, then the
// turns, and (with add_generation_prompt) "<|start|>assistant". Formatting tokens are inserted as
// ids and all text is encoded without special tokens, so text such as "<|end|>" in a message stays
// text. Analysis (reasoning) before the last final answer is dropped, as vLLM does. Throws
// anvil::Error for an unknown role, an invalid reasoning effort, tool parameters that are not JSON,
// or a tool message whose function cannot be named.
std::vector<int32_t> render_harmony(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                    std::span<const ToolDefinition> tools, const ChatRenderOptions& options);

// The TypeScript-like `namespace functions { ... }` section Harmony shows the model (exposed for tests
// and debugging). Throws anvil::Error when a tool's parameters are not valid JSON.
std::string harmony_tools_section(std::span<const ToolDefinition> tools);

// Generation stops on <|return|> (final answer done) and <|call|> (tool call), never on <|end|>.
std::vector<int32_t> harmony_stop_token_ids(const Tokenizer& tokenizer);

// Parses generated ids, starting inside the assistant header the prompt opened. Routes analysis to
// reasoning, final (and commentary preambles) to content, and messages to functions.NAME to tool
// calls whose arguments stream as they are generated. Messages to other recipients (built-in tools
// the server does not offer) count as reasoning. Separate messages of one field are joined by "\n".
class HarmonyStreamParser : public ChatOutputParser {
 public:
  using Delta = ChatDelta;
  // Throws anvil::Error when the tokenizer lacks the Harmony formatting tokens.
  explicit HarmonyStreamParser(const Tokenizer& tokenizer);

  Delta push(int32_t id) override;
  Delta finish() override;
  ParsedOutput result() const override { return result_; }

 private:
  enum class State { kHeader, kContent, kExpectStart };
  enum class Route { kReasoning, kContent, kToolCall };

  void begin_header();
  void open_message(Delta& delta);
  void open_plain_content();
  void close_message(Delta& delta);
  void emit_text(const std::string& text, Delta& delta);
  void flush_header_as_content(Delta& delta);

  const Tokenizer& tokenizer_;
  int32_t start_, channel_, message_, end_, call_, return_, constrain_;
  State state_ = State::kHeader;
  std::vector<int32_t> header_;
  bool header_has_markers_ = false;  // a <|channel|> or <|constrain|> token: a real header, never content
  Route route_ = Route::kContent;
  bool message_has_text_ = false;
  StreamDecoder decoder_;
  ParsedOutput result_;
};

// The whole generated sequence at once: the same parser, fed every id, then finished.
ParsedOutput parse_harmony_output(const Tokenizer& tokenizer, std::span<const int32_t> ids);

}  // namespace anvil
