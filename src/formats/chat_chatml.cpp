#include "formats/chat_chatml.h"

#include <nlohmann/json.hpp>

#include <array>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace anvil {
namespace {

using Json = nlohmann::ordered_json;  // json.dumps keeps the caller's key order

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, UTF-8 kept as is.
// transformers' tojson filter is exactly this, and the prompt must match it byte for byte.
void python_dumps(const Json& value, std::string& out) {
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) out += ", ";
      first = false;
      out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
      out += ": ";
      python_dumps(item, out);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += ", ";
      python_dumps(value[i], out);
    }
    out += ']';
  } else {
    out += value.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

std::string python_dumps(const Json& value) {
  std::string out;
  python_dumps(value, out);
  return out;
}

std::string strip_newlines(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  while (left && begin < end && text[begin] == '\n') ++begin;
  while (right && end > begin && text[end - 1] == '\n') --end;
  return std::string(text.substr(begin, end - begin));
}

// The prompt as text runs and the template's control tokens, kept apart so that the id form can
// encode only the control tokens as ids.
class Prompt {
 public:
  void control(std::string_view token) { pieces_.push_back({true, std::string(token)}); }
  void text(std::string_view text) {
    if (text.empty()) return;
    if (pieces_.empty() || pieces_.back().control) pieces_.push_back({false, ""});
    pieces_.back().text += text;
  }
  void turn(std::string_view role, std::string_view content) {
    control(kImStart);
    text(role);
    text("\n");
    text(content);
    control(kImEnd);
    text("\n");
  }

  struct Piece {
    bool control;
    std::string text;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  std::vector<Piece> pieces_;
};

Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& error) {
    fail("{} not valid JSON: {}", what, error.what());
  }
}

std::string tool_json(const ToolDefinition& tool) {
  if (tool.name.empty()) fail("a tool definition has an empty name");
  Json function = Json::object();
  function["name"] = tool.name;
  if (!tool.description.empty()) function["description"] = tool.description;
  if (!tool.parameters_json_schema.empty()) {
    function["parameters"] = parse_json(tool.parameters_json_schema, "tool '" + tool.name + "': parameters are");
  }
  Json wrapper = Json::object();
  wrapper["type"] = "function";
  wrapper["function"] = std::move(function);
  return python_dumps(wrapper);
}

bool is_system(const ChatMessage& message) { return message.role == "system" || message.role == "developer"; }

bool is_tool_response_wrapper(const std::string& content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

void render_assistant(Prompt& prompt, const ChatMessage& message, size_t index, bool after_query, bool last) {
  std::string content = message.content;
  std::string reasoning = message.reasoning;
  if (reasoning.empty()) {
    if (const size_t close = content.find("</think>"); close != std::string::npos) {
      // The template's content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n').
      std::string before = strip_newlines(std::string_view(content).substr(0, close), false, true);
      if (const size_t open = before.rfind("<think>"); open != std::string::npos) before.erase(0, open + 7);
      reasoning = strip_newlines(before, true, false);
      content = strip_newlines(std::string_view(content).substr(content.rfind("</think>") + 8), true, false);
    }
  }
  const bool think = after_query && (last || !reasoning.empty());
  prompt.control(kImStart);
  prompt.text("assistant\n");
  if (think) {
    prompt.text("<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n" + strip_newlines(content, true, false));
  } else {
    prompt.text(content);
  }
  for (size_t i = 0; i < message.tool_calls.size(); ++i) {
    const ToolCall& call = message.tool_calls[i];
    if (i > 0 || !content.empty()) prompt.text("\n");
    // vLLM hands the template parsed arguments, which tojson then writes back Python-style.
    const std::string arguments = call.arguments_json.empty()
                                      ? "{}"
                                      : python_dumps(parse_json(call.arguments_json,
                                                                fmt::format("chat message {}: arguments of tool call '{}' are", index, call.name)));
    prompt.text("<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " + arguments + "}\n</tool_call>");
  }
  prompt.control(kImEnd);
  prompt.text("\n");
}

Prompt build_prompt(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                    const ChatRenderOptions& options) {
  Prompt prompt;
  const bool system_first = !messages.empty() && is_system(messages[0]);
  if (!tools.empty()) {
    prompt.control(kImStart);
    prompt.text("system\n");
    if (system_first) prompt.text(messages[0].content + "\n\n");
    prompt.text(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (const ToolDefinition& tool : tools) prompt.text("\n" + tool_json(tool));
    prompt.text(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>");
    prompt.control(kImEnd);
    prompt.text("\n");
  } else if (system_first) {
    prompt.turn("system", messages[0].content);
  }

  // The last real user query; reasoning is shown only for the assistant turns after it.
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user" && !is_tool_response_wrapper(messages[i].content)) {
      last_query = i;
      break;
    }
  }

  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const bool last = i + 1 == messages.size();
    if (message.role == "user") {
      prompt.turn("user", message.content);
    } else if (is_system(message)) {
      if (i > 0) prompt.turn("system", message.content);
    } else if (message.role == "assistant") {
      render_assistant(prompt, message, i, i > last_query, last);
    } else if (message.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") {
        prompt.control(kImStart);
        prompt.text("user");
      }
      prompt.text("\n<tool_response>\n" + message.content + "\n</tool_response>");
      if (last || messages[i + 1].role != "tool") {
        prompt.control(kImEnd);
        prompt.text("\n");
      }
    } else {
      fail("chat message {}: unknown role '{}' (expected system, developer, user, assistant or tool)", i,
           message.role);
    }
  }
  if (options.add_generation_prompt) {
    prompt.control(kImStart);
    prompt.text("assistant\n");
    if (!options.enable_thinking) prompt.text("<think>\n\n</think>\n\n");
  }
  return prompt;
}

int32_t required_token(const Tokenizer& tokenizer, std::string_view text) {
  const auto id = tokenizer.token_id(text);
  if (!id) fail("the tokenizer has no {} token; the ChatML chat format needs a Qwen-style tokenizer", text);
  return *id;
}

}  // namespace

std::string render_chatml(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                          const ChatRenderOptions& options) {
  const Prompt prompt = build_prompt(messages, tools, options);
  std::string text;
  for (const auto& piece : prompt.pieces()) text += piece.text;
  return text;
}

std::vector<int32_t> render_chatml_ids(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                       std::span<const ToolDefinition> tools, const ChatRenderOptions& options) {
  const int32_t im_start = required_token(tokenizer, kImStart);
  const int32_t im_end = required_token(tokenizer, kImEnd);
  const Prompt prompt = build_prompt(messages, tools, options);
  std::vector<int32_t> ids;
  for (const auto& piece : prompt.pieces()) {
    if (piece.control) {
      ids.push_back(piece.text == kImStart ? im_start : im_end);
      continue;
    }
    const auto encoded = tokenizer.encode(piece.text, /*allow_special=*/false);
    ids.insert(ids.end(), encoded.begin(), encoded.end());
  }
  return ids;
}

std::vector<int32_t> chatml_stop_token_ids(const Tokenizer& tokenizer) {
  return {required_token(tokenizer, kImEnd), required_token(tokenizer, "<|endoftext|>")};
}

// ---- Streaming parser --------------------------------------------------------------------------

namespace {

constexpr std::string_view kThink = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";
constexpr std::array<std::string_view, 4> kTags = {kThink, kThinkEnd, kToolCall, kToolCallEnd};

}  // namespace

ChatMlStreamParser::ChatMlStreamParser(const Tokenizer& tokenizer, bool starts_in_reasoning)
    : decoder_(tokenizer, /*skip_special=*/true), mode_(starts_in_reasoning ? Mode::kReasoning : Mode::kContent) {}

ChatDelta ChatMlStreamParser::push(int32_t id) {
  Delta delta;
  pending_ += decoder_.push(id);
  consume(/*final=*/false, delta);
  return delta;
}

ChatDelta ChatMlStreamParser::finish() {
  Delta delta;
  pending_ += decoder_.finish();
  consume(/*final=*/true, delta);
  if (mode_ == Mode::kToolCall) complete_tool_call(delta);  // cut off before </tool_call>
  end_section();
  mode_ = Mode::kContent;
  return delta;
}

// Every tag is looked for in every mode, so a tag never passes as text; the modes differ only in
// what a tag does.
void ChatMlStreamParser::consume(bool final, Delta& delta) {
  while (!pending_.empty()) {
    size_t at = std::string::npos;
    std::string_view tag;
    for (const std::string_view candidate : kTags) {
      const size_t found = pending_.find(candidate);
      if (found < at) {
        at = found;
        tag = candidate;
      }
    }
    if (at != std::string::npos) {
      on_text(std::string_view(pending_).substr(0, at), delta);
      pending_.erase(0, at + tag.size());
      on_tag(tag, delta);
      continue;
    }
    size_t keep = pending_.size();
    if (!final) {
      // Hold back the longest tail that could still grow into a tag.
      for (size_t start = pending_.size() > 11 ? pending_.size() - 11 : 0; start < pending_.size(); ++start) {
        const std::string_view tail = std::string_view(pending_).substr(start);
        bool prefix = false;
        for (const std::string_view candidate : kTags) prefix = prefix || candidate.starts_with(tail);
        if (prefix) {
          keep = start;
          break;
        }
      }
    }
    on_text(std::string_view(pending_).substr(0, keep), delta);
    pending_.erase(0, keep);
    return;
  }
}

void ChatMlStreamParser::on_text(std::string_view text, Delta& delta) {
  if (text.empty()) return;
  if (mode_ == Mode::kToolCall) {
    tool_body_ += text;
    return;
  }
  if (section_start_) {
    while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
    if (text.empty()) return;
  }
  std::string& total = mode_ == Mode::kReasoning ? result_.reasoning : result_.content;
  std::string& piece = mode_ == Mode::kReasoning ? delta.reasoning : delta.content;
  std::string out;
  if (section_start_ && !total.empty()) out += '\n';
  section_start_ = false;
  const size_t last = text.find_last_not_of('\n');
  if (last == std::string_view::npos) {
    held_newlines_ += text;
    return;
  }
  out += held_newlines_;
  out += text.substr(0, last + 1);
  held_newlines_ = std::string(text.substr(last + 1));
  total += out;
  piece += out;
}

void ChatMlStreamParser::end_section() {
  held_newlines_.clear();
  section_start_ = true;
}

void ChatMlStreamParser::on_tag(std::string_view tag, Delta& delta) {
  if (mode_ == Mode::kToolCall) {
    if (tag == kToolCallEnd || tag == kToolCall) {
      complete_tool_call(delta);
      mode_ = tag == kToolCall ? Mode::kToolCall : Mode::kContent;  // a new call without closing the last
      end_section();
    } else {
      tool_body_ += tag;  // <think> inside a JSON string is data
    }
    return;
  }
  if (tag == kThink && mode_ == Mode::kContent) {
    end_section();
    mode_ = Mode::kReasoning;
  } else if (tag == kThinkEnd && mode_ == Mode::kReasoning) {
    end_section();
    mode_ = Mode::kContent;
  } else if (tag == kToolCall && mode_ == Mode::kContent) {
    end_section();
    mode_ = Mode::kToolCall;
    tool_body_.clear();
  }
  // Anything else is a stray tag (</think> in content, <think> inside reasoning, ...): dropped.
}

void ChatMlStreamParser::complete_tool_call(Delta& delta) {
  std::string body = std::move(tool_body_);
  tool_body_.clear();
  const size_t begin = body.find_first_not_of(" \t\r\n");
  const size_t end = body.find_last_not_of(" \t\r\n");
  body = begin == std::string::npos ? std::string() : body.substr(begin, end - begin + 1);
  const Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  const auto name = parsed.is_object() ? parsed.find("name") : parsed.end();
  if (name == parsed.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    // Not a call we can run: the text is the model's answer, minus the tags.
    const Mode mode = mode_;
    mode_ = Mode::kContent;
    end_section();
    on_text(body, delta);
    end_section();
    mode_ = mode;
    return;
  }
  std::string arguments = "{}";
  const auto found = parsed.find("arguments");  // an object here: find() is safe
  if (found != parsed.end() && found->is_string()) {
    arguments = found->get<std::string>();
  } else if (found != parsed.end() && !found->is_null()) {
    arguments = found->dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  ToolCall call{make_tool_call_id(), name->get<std::string>(), std::move(arguments)};
  delta.tool_calls.push_back(ToolCallDelta{result_.tool_calls.size(), call.id, call.name, call.arguments_json});
  result_.tool_calls.push_back(std::move(call));
}

ParsedOutput parse_chatml_output(const Tokenizer& tokenizer, std::span<const int32_t> ids, bool starts_in_reasoning) {
  ChatMlStreamParser parser(tokenizer, starts_in_reasoning);
  for (const int32_t id : ids) parser.push(id);
  parser.finish();
  return parser.result();
}

}  // namespace anvil
