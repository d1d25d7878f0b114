#pragma once
// ChatML as Qwen3's chat template writes it (with <think> reasoning and <tool_call> blocks), and a
// streaming parser for Qwen3 output. See specs/models.md §3.5.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/chat.h"
#include "formats/tokenizer.h"

namespace anvil {

// The prompt text exactly as the Qwen3 Jinja template renders it: tools in the system turn as
// json.dumps text (", " / ": " separators, non-ASCII kept), consecutive tool results grouped into one
// user turn, reasoning kept only for assistant turns after the last user query, and with
// enable_thinking=false an empty <think> block after the generation prompt. A system or developer
// message first becomes the system turn; later ones render as system turns. Throws anvil::Error
// for an unknown role or tool parameters / call arguments that are not valid JSON.
std::string render_chatml(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                          const ChatRenderOptions& options);

// The same prompt as token ids. Only the template's own <|im_start|>/<|im_end|> become control ids;
// the text between them is encoded without special tokens, so a message cannot forge a turn. The
// ids equal tokenizing render_chatml's text with special tokens allowed whenever messages hold no
// special-token text.
std::vector<int32_t> render_chatml_ids(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                       std::span<const ToolDefinition> tools, const ChatRenderOptions& options);

// <|im_end|> and <|endoftext|>.
std::vector<int32_t> chatml_stop_token_ids(const Tokenizer& tokenizer);

// Splits Qwen3 output into reasoning (inside <think>...</think>), content, and tool calls
// (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, arguments re-serialized as compact
// JSON). Use starts_in_reasoning when the prompt itself opened <think> (templates such as
// Qwen3-*-Thinking-2507), so the output holds only the closing tag. Text that might be the start
// of a tag is held back until it is decided, so no tag reaches content even when split across
// tokens. Newlines around reasoning and around tool calls are trimmed as the template writes them;
// content pieces separated by tool calls are joined by "\n". A tool call whose body is not
// {"name", "arguments"} JSON becomes content (without its tags).
class ChatMlStreamParser : public ChatOutputParser {
 public:
  using Delta = ChatDelta;
  explicit ChatMlStreamParser(const Tokenizer& tokenizer, bool starts_in_reasoning = false);

  Delta push(int32_t id) override;
  Delta finish() override;
  ParsedOutput result() const override { return result_; }

 private:
  enum class Mode { kContent, kReasoning, kToolCall };

  void consume(bool final, Delta& delta);
  void on_text(std::string_view text, Delta& delta);
  void on_tag(std::string_view tag, Delta& delta);
  void end_section();
  void complete_tool_call(Delta& delta);

  StreamDecoder decoder_;
  Mode mode_;
  std::string pending_;        // decoded text not yet classified (may begin a tag)
  std::string held_newlines_;  // trailing newlines of the section, released when more text follows
  bool section_start_ = true;  // leading newlines of a section are dropped
  std::string tool_body_;
  ParsedOutput result_;
};

// The whole generated sequence at once: the same parser, fed every id, then finished.
ParsedOutput parse_chatml_output(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                                 bool starts_in_reasoning = false);

}  // namespace anvil
