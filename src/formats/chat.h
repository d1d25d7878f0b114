#pragma once
// Chat structures shared by the chat formats (Harmony for gpt-oss, ChatML for Qwen3). The server
// converts OpenAI chat-completions JSON to and from these plain structs; the formats turn them into
// prompt token ids and turn generated ids back into reasoning, content and tool calls.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace anvil {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments_json;  // the function arguments as JSON text
};

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::string content;
  std::string reasoning;  // assistant chain of thought (Harmony analysis, Qwen3 <think>)
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;  // tool messages: the call they answer
  std::string name;          // tool messages: the function name (else looked up by tool_call_id)
};

struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_json_schema;  // raw JSON text; empty when the function takes no parameters
};

struct ChatRenderOptions {
  std::string reasoning_effort = "medium";  // Harmony: low, medium or high
  bool enable_thinking = true;              // ChatML: false appends an empty <think> block
  bool add_generation_prompt = true;
  // Harmony "Current date:" line, omitted when unset or empty. Never the wall clock by default:
  // a date that changes daily would break prefix-cache reuse and reproducibility.
  std::optional<std::string> current_date;
  std::string model_identity;  // Harmony; empty means the model's trained default
};

struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// One step of a streamed tool call, shaped like OpenAI's delta.tool_calls[i]: the first delta of a
// call carries its id and name, later ones only more argument text.
struct ToolCallDelta {
  size_t index = 0;  // position of the call in ParsedOutput::tool_calls
  std::string id;
  std::string name;
  std::string arguments;
};

// What one generated token adds. Concatenating every delta's fields (and each call's argument
// pieces) gives exactly result(), so streamed and non-streamed responses agree.
struct ChatDelta {
  std::string reasoning;
  std::string content;
  // A vector rather than one optional: a single token can end one call and start another.
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Parses generated token ids as they arrive. Never throws on malformed model output: text it cannot
// place becomes content, and formatting tokens never reach the user.
class ChatOutputParser {
 public:
  virtual ~ChatOutputParser() = default;
  virtual ChatDelta push(int32_t id) = 0;
  // Call once after the last token (stop token, max_tokens or abort): flushes held-back text.
  virtual ChatDelta finish() = 0;
  virtual ParsedOutput result() const = 0;
};

// "call_" + 24 random alphanumerics, the shape OpenAI clients expect; random so that ids stay unique
// across the turns of a conversation that clients send back.
inline std::string make_tool_call_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 engine{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(engine)];
  return id;
}

}  // namespace anvil
