#include "formats/chat_harmony.h"

#include <nlohmann/json.hpp>

#include <string_view>
#include <unordered_set>
#include <utility>

#include "core/error.h"

namespace anvil {
namespace {

using Json = nlohmann::ordered_json;  // the TypeScript rendering follows the schema's key order

constexpr std::string_view kDefaultIdentity = "You are ChatGPT, a large language model trained by OpenAI.";
constexpr std::string_view kKnowledgeCutoff = "2024-06";
// A header is a handful of tokens; this many without <|message|> means the model is not writing one.
constexpr size_t kMaxHeaderTokens = 64;

int32_t required_token(const Tokenizer& tokenizer, std::string_view text) {
  const auto id = tokenizer.token_id(text);
  if (!id) fail("the tokenizer has no {} token; the Harmony chat format needs an o200k_harmony tokenizer", text);
  return *id;
}

// ---- JSON Schema -> TypeScript, as harmony's json_schema_to_typescript -------------------------

const Json* member(const Json& value, const char* key) {
  if (!value.is_object()) return nullptr;
  const auto found = value.find(key);
  return found == value.end() ? nullptr : &*found;
}

const std::string* string_member(const Json& value, const char* key) {
  const Json* found = member(value, key);
  return found && found->is_string() ? found->get_ptr<const std::string*>() : nullptr;
}

bool is_enum(const Json& schema) {
  const Json* values = member(schema, "enum");
  return values && values->is_array() && !values->empty();
}

bool is_nullable(const Json& schema) {
  const Json* nullable = member(schema, "nullable");
  return nullable && nullable->is_boolean() && nullable->get<bool>();
}

std::string with_null(std::string type, const Json& schema) {
  if (is_nullable(schema) && type.find("null") == std::string::npos) type += " | null";
  return type;
}

// Harmony quotes string defaults except enum values, and prints other values as JSON.
std::string default_text(const Json& value, bool in_enum) {
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    return in_enum ? text : "\"" + text + "\"";
  }
  return value.dump();
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
  }
  return out;
}

std::string to_typescript(const Json& schema, const std::string& indent);

void append_one_of_property(std::string& out, const std::string& key, const Json& property, const Json& variants,
                            bool required, const std::string& indent) {
  const std::string* property_desc = string_member(property, "description");
  bool skip_property_desc = false;
  if (property_desc && !variants.empty()) {
    const std::string* first_desc = string_member(variants.front(), "description");
    skip_property_desc = first_desc && *first_desc == *property_desc;
  }
  const bool desc_above = property_desc && !skip_property_desc;
  if (desc_above) out += indent + "// " + *property_desc + "\n";
  if (const Json* def = member(property, "default")) out += indent + "// default: " + default_text(*def, is_enum(property)) + "\n";
  out += indent + key + (required ? "" : "?") + ":\n";
  for (size_t i = 0; i < variants.size(); ++i) {
    const Json& variant = variants[i];
    out += indent + " | " + with_null(to_typescript(variant, indent + "   "), variant);
    std::vector<std::string> comments;
    const std::string* desc = string_member(variant, "description");
    if (!(i == 0 && desc_above) && desc && !(property_desc && *desc == *property_desc)) comments.push_back(*desc);
    if (const Json* def = member(variant, "default")) comments.push_back("default: " + default_text(*def, is_enum(variant)));
    if (!comments.empty()) out += " // " + join(comments, " ");
    out += "\n";
  }
  out += indent + ",\n";
}

std::string object_to_typescript(const Json& schema, const std::string& indent) {
  std::string out;
  if (const std::string* desc = string_member(schema, "description")) out += indent + "// " + *desc + "\n";
  out += "{\n";
  const Json* properties = member(schema, "properties");
  if (properties && properties->is_object()) {
    std::unordered_set<std::string> required;
    if (const Json* names = member(schema, "required"); names && names->is_array()) {
      for (const Json& name : *names) {
        if (name.is_string()) required.insert(name.get<std::string>());
      }
    }
    for (const auto& [key, value] : properties->items()) {
      const bool is_required = required.contains(key);
      const Json* one_of = member(value, "oneOf");
      if (const std::string* title = string_member(value, "title")) out += indent + "// " + *title + "\n" + indent + "//\n";
      if (!one_of) {
        if (const std::string* desc = string_member(value, "description")) out += indent + "// " + *desc + "\n";
      }
      if (const Json* examples = member(value, "examples"); examples && examples->is_array() && !examples->empty()) {
        out += indent + "// Examples:\n";
        for (const Json& example : *examples) {
          if (example.is_string()) out += indent + "// - \"" + example.get<std::string>() + "\"\n";
        }
      }
      if (one_of && one_of->is_array()) {
        append_one_of_property(out, key, value, *one_of, is_required, indent);
        continue;
      }
      out += indent + key + (is_required ? "" : "?") + ": ";
      out += with_null(to_typescript(value, indent + "    "), value) + ",";
      if (!one_of) {
        if (const Json* def = member(value, "default")) out += " // default: " + default_text(*def, is_enum(value));
      }
      out += "\n";
    }
  }
  out += indent + "}";
  return out;
}

std::string to_typescript(const Json& schema, const std::string& indent) {
  if (const Json* one_of = member(schema, "oneOf"); one_of && one_of->is_array()) {
    std::string out;
    for (const Json& variant : *one_of) {
      out += "\n" + indent + " | " + with_null(to_typescript(variant, indent + "   "), variant);
      std::vector<std::string> comments;
      if (const std::string* desc = string_member(variant, "description")) comments.push_back(*desc);
      if (const Json* def = member(variant, "default")) {
        // Unlike the property forms, this one prints an enum's string default as JSON (quoted).
        comments.push_back("default: " + (def->is_string() && !is_enum(variant) ? default_text(*def, false) : def->dump()));
      }
      if (!comments.empty()) out += " // " + join(comments, " ");
    }
    return out;
  }
  const Json* type = member(schema, "type");
  if (type && type->is_array()) {
    std::vector<std::string> names;
    for (const Json& name : *type) {
      if (name.is_string()) names.push_back(name == "integer" ? "number" : name.get<std::string>());
    }
    if (!names.empty()) return join(names, " | ");
  }
  if (!type || !type->is_string()) return "any";
  const auto& name = type->get_ref<const std::string&>();
  if (name == "object") return object_to_typescript(schema, indent);
  if (name == "string") {
    std::vector<std::string> values;
    if (const Json* values_json = member(schema, "enum"); values_json && values_json->is_array()) {
      for (const Json& value : *values_json) {
        if (value.is_string()) values.push_back("\"" + value.get<std::string>() + "\"");
      }
    }
    return values.empty() ? "string" : join(values, " | ");
  }
  if (name == "number" || name == "integer") return "number";
  if (name == "boolean") return "boolean";
  if (name == "array") {
    const Json* items = member(schema, "items");
    return items ? to_typescript(*items, indent) + "[]" : "Array<any>";
  }
  return "any";
}

// Rust's str::lines: no final empty line, "\r\n" counts as one break.
std::vector<std::string> text_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    begin = end + 1;
  }
  return lines;
}

// ---- Rendering ---------------------------------------------------------------------------------

struct HarmonyMessage {
  std::string author;
  std::string channel;
  std::string recipient;
  bool recipient_first = false;  // tool results: "functions.x to=assistant<|channel|>..."
  bool constrain_json = false;
  bool assistant = false;
  std::string content;
};

HarmonyMessage plain_message(std::string author, std::string content) {
  HarmonyMessage message;
  message.author = std::move(author);
  message.content = std::move(content);
  return message;
}

class TokenWriter {
 public:
  explicit TokenWriter(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  void token(std::string_view text) { ids_.push_back(required_token(tokenizer_, text)); }
  void text(std::string_view text) {
    if (text.empty()) return;
    const auto ids = tokenizer_.encode(text, /*allow_special=*/false);
    ids_.insert(ids_.end(), ids.begin(), ids.end());
  }
  void message(const HarmonyMessage& message) {
    token("<|start|>");
    text(message.author);
    if (message.recipient_first && !message.recipient.empty()) text(" to=" + message.recipient);
    if (!message.channel.empty()) {
      token("<|channel|>");
      text(message.channel);
    }
    if (!message.recipient_first && !message.recipient.empty()) text(" to=" + message.recipient);
    if (message.constrain_json) {
      text(" ");
      token("<|constrain|>");
      text("json");
    }
    token("<|message|>");
    text(message.content);
    token(message.assistant && !message.recipient.empty() ? "<|call|>" : "<|end|>");
  }
  std::vector<int32_t> take() { return std::move(ids_); }

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
};

std::string system_text(const ChatRenderOptions& options, bool has_tools) {
  const std::string& effort = options.reasoning_effort;
  if (effort != "low" && effort != "medium" && effort != "high") {
    fail("reasoning_effort '{}' is not supported by Harmony (expected low, medium or high)", effort);
  }
  std::string text = options.model_identity.empty() ? std::string(kDefaultIdentity) : options.model_identity;
  text += "\nKnowledge cutoff: " + std::string(kKnowledgeCutoff);
  if (options.current_date && !options.current_date->empty()) text += "\nCurrent date: " + *options.current_date;
  text += "\n\nReasoning: " + effort;
  text += "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.";
  if (has_tools) text += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  return text;
}

std::string tool_function_name(std::span<const ChatMessage> messages, size_t index) {
  const ChatMessage& message = messages[index];
  if (!message.name.empty()) return message.name;
  for (size_t i = index; i-- > 0;) {
    for (const ToolCall& call : messages[i].tool_calls) {
      if (!message.tool_call_id.empty() && call.id == message.tool_call_id) return call.name;
    }
  }
  fail("chat message {}: tool message with tool_call_id '{}' answers no earlier assistant tool call and has no name",
       index, message.tool_call_id);
}

}  // namespace

std::string harmony_tools_section(std::span<const ToolDefinition> tools) {
  std::vector<std::string> lines = {"## functions\n", "namespace functions {\n"};
  for (const ToolDefinition& tool : tools) {
    if (tool.name.empty()) fail("a tool definition has an empty name");
    for (const std::string& line : text_lines(tool.description)) lines.push_back("// " + line);
    if (tool.parameters_json_schema.empty()) {
      lines.push_back("type " + tool.name + " = () => any;\n");
      continue;
    }
    Json schema;
    try {
      schema = Json::parse(tool.parameters_json_schema);
    } catch (const Json::exception& error) {
      fail("tool '{}': parameters are not valid JSON: {}", tool.name, error.what());
    }
    lines.push_back("type " + tool.name + " = (_: " + to_typescript(schema, "") + ") => any;\n");
  }
  lines.push_back("} // namespace functions");
  return "# Tools\n\n" + join(lines, "\n");
}

std::vector<int32_t> render_harmony(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                    std::span<const ToolDefinition> tools, const ChatRenderOptions& options) {
  std::vector<HarmonyMessage> rendered;
  rendered.push_back(plain_message("system", system_text(options, !tools.empty())));

  std::vector<std::string> instructions;
  for (const ChatMessage& message : messages) {
    if (message.role == "system" || message.role == "developer") instructions.push_back(message.content);
  }
  std::vector<std::string> developer_sections;
  if (!instructions.empty()) {
    developer_sections.push_back("# Instructions");
    developer_sections.push_back(join(instructions, "\n\n"));
  }
  if (!tools.empty()) developer_sections.push_back(harmony_tools_section(tools));
  if (!developer_sections.empty()) rendered.push_back(plain_message("developer", join(developer_sections, "\n\n")));

  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "system" || message.role == "developer") continue;
    if (message.role == "user") {
      rendered.push_back(plain_message("user", message.content));
    } else if (message.role == "assistant") {
      HarmonyMessage base = plain_message("assistant", "");
      base.assistant = true;
      auto on_channel = [&](const char* channel, const std::string& content) {
        HarmonyMessage part = base;
        part.channel = channel;
        part.content = content;
        rendered.push_back(std::move(part));
      };
      if (!message.reasoning.empty()) on_channel("analysis", message.reasoning);
      if (message.tool_calls.empty()) {
        if (!message.content.empty() || message.reasoning.empty()) on_channel("final", message.content);
        continue;
      }
      if (!message.content.empty()) on_channel("commentary", message.content);  // a preamble
      for (const ToolCall& call : message.tool_calls) {
        if (call.name.empty()) fail("chat message {}: a tool call has an empty function name", i);
        HarmonyMessage part = base;
        part.channel = "commentary";
        part.recipient = "functions." + call.name;
        part.constrain_json = true;
        part.content = call.arguments_json;
        rendered.push_back(std::move(part));
      }
    } else if (message.role == "tool") {
      std::string name = tool_function_name(messages, i);
      if (!name.starts_with("functions.")) name = "functions." + name;
      HarmonyMessage result = plain_message(std::move(name), message.content);
      result.channel = "commentary";
      result.recipient = "assistant";
      result.recipient_first = true;
      rendered.push_back(std::move(result));
    } else {
      fail("chat message {}: unknown role '{}' (expected system, developer, user, assistant or tool)", i,
           message.role);
    }
  }

  // Chain of thought of answered turns goes (vLLM's auto_drop_analysis_messages): the model was
  // trained to see earlier turns without it, and a turn still in tool calls keeps its own.
  size_t last_final = 0;
  for (size_t i = 0; i < rendered.size(); ++i) {
    if (rendered[i].assistant && rendered[i].channel == "final") last_final = i;
  }
  TokenWriter writer(tokenizer);
  for (size_t i = 0; i < rendered.size(); ++i) {
    if (i < last_final && rendered[i].channel == "analysis") continue;
    writer.message(rendered[i]);
  }
  if (options.add_generation_prompt) {
    writer.token("<|start|>");
    writer.text("assistant");
  }
  return writer.take();
}

std::vector<int32_t> harmony_stop_token_ids(const Tokenizer& tokenizer) {
  return {required_token(tokenizer, "<|return|>"), required_token(tokenizer, "<|call|>")};
}

// ---- Streaming parser --------------------------------------------------------------------------

namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string trim(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end && is_ascii_space(text[begin])) ++begin;
  while (end > begin && is_ascii_space(text[end - 1])) --end;
  return std::string(text.substr(begin, end - begin));
}

struct Header {
  std::string channel, recipient, content_type;
};

// Harmony's parse_header_from_tokens, lenient: leftover parts are ignored instead of failing.
Header parse_header(std::string text) {
  Header header;
  constexpr std::string_view kChannel = "<|channel|>";
  if (const size_t at = text.find(kChannel); at != std::string::npos) {
    const size_t begin = at + kChannel.size();
    size_t end = begin;
    while (end < text.size() && !is_ascii_space(text[end]) && text[end] != '<') ++end;
    header.channel = text.substr(begin, end - begin);
    text = text.substr(0, at) + text.substr(end);
  }
  text = trim(text);
  constexpr std::string_view kConstrain = "<|constrain|>";
  for (size_t at = text.find(kConstrain); at != std::string::npos; at = text.find(kConstrain, at + kConstrain.size() + 1)) {
    text.insert(at, " ");
  }
  std::vector<std::string> parts;
  for (size_t at = 0; at < text.size();) {
    while (at < text.size() && is_ascii_space(text[at])) ++at;
    size_t end = at;
    while (end < text.size() && !is_ascii_space(text[end])) ++end;
    if (end > at) parts.push_back(text.substr(at, end - at));
    at = end;
  }
  if (!parts.empty() && parts.front() == "assistant") parts.erase(parts.begin());
  if (parts.empty()) return header;
  // Harmony also takes a bare word as the recipient; here a bare word must name a function, so
  // stray words in a garbled header do not turn the answer into a hidden tool message.
  auto recipient = [](const std::string& part) {
    if (part.starts_with("to=")) return part.substr(3);
    return part.starts_with("functions.") ? part : std::string();
  };
  const size_t count = parts.size();
  std::string last = parts.back();
  parts.pop_back();
  if (last.starts_with("to=") || count == 1) {
    header.recipient = recipient(last);
  } else {
    header.content_type = std::move(last);
    header.recipient = recipient(parts.back());
  }
  return header;
}

}  // namespace

HarmonyStreamParser::HarmonyStreamParser(const Tokenizer& tokenizer)
    : tokenizer_(tokenizer),
      start_(required_token(tokenizer, "<|start|>")),
      channel_(required_token(tokenizer, "<|channel|>")),
      message_(required_token(tokenizer, "<|message|>")),
      end_(required_token(tokenizer, "<|end|>")),
      call_(required_token(tokenizer, "<|call|>")),
      return_(required_token(tokenizer, "<|return|>")),
      constrain_(required_token(tokenizer, "<|constrain|>")),
      decoder_(tokenizer, /*skip_special=*/true) {}

void HarmonyStreamParser::begin_header() {
  state_ = State::kHeader;
  header_.clear();
  header_has_markers_ = false;
}

void HarmonyStreamParser::emit_text(const std::string& text, Delta& delta) {
  if (text.empty()) return;
  const bool first = !message_has_text_;
  message_has_text_ = true;
  if (route_ == Route::kToolCall) {
    const size_t index = result_.tool_calls.size() - 1;
    result_.tool_calls.back().arguments_json += text;
    if (delta.tool_calls.empty() || delta.tool_calls.back().index != index) {
      delta.tool_calls.emplace_back();
      delta.tool_calls.back().index = index;
    }
    delta.tool_calls.back().arguments += text;
    return;
  }
  std::string& total = route_ == Route::kReasoning ? result_.reasoning : result_.content;
  std::string& piece = route_ == Route::kReasoning ? delta.reasoning : delta.content;
  if (first && !total.empty()) {
    total += '\n';
    piece += '\n';
  }
  total += text;
  piece += text;
}

void HarmonyStreamParser::open_message(Delta& delta) {
  std::string text;
  for (const int32_t id : header_) text += tokenizer_.token_bytes(id);
  const Header header = parse_header(std::move(text));
  state_ = State::kContent;
  message_has_text_ = false;
  constexpr std::string_view kFunctions = "functions.";
  if (header.recipient.starts_with(kFunctions) && header.recipient.size() > kFunctions.size()) {
    route_ = Route::kToolCall;
    ToolCallDelta& start = delta.tool_calls.emplace_back();
    start.index = result_.tool_calls.size();
    start.id = make_tool_call_id();
    start.name = header.recipient.substr(kFunctions.size());
    result_.tool_calls.push_back(ToolCall{start.id, start.name, ""});
  } else if (!header.recipient.empty() && header.recipient != "all") {
    route_ = Route::kReasoning;  // a built-in tool we do not serve: keep it out of the answer
  } else {
    route_ = header.channel == "analysis" ? Route::kReasoning : Route::kContent;
  }
}

void HarmonyStreamParser::open_plain_content() {
  state_ = State::kContent;
  route_ = Route::kContent;
  message_has_text_ = false;
}

void HarmonyStreamParser::close_message(Delta& delta) {
  emit_text(decoder_.finish(), delta);
  state_ = State::kExpectStart;
}

// Text the model wrote where a header belongs. A header with formatting tokens in it is dropped
// (its words are not part of any answer); plain text is the answer of a model that skipped the
// header, so it becomes content.
void HarmonyStreamParser::flush_header_as_content(Delta& delta) {
  const std::vector<int32_t> header = std::move(header_);
  const bool markers = header_has_markers_;
  begin_header();
  if (markers || header.empty()) return;
  open_plain_content();
  std::string text;
  for (const int32_t id : header) text += decoder_.push(id);
  // The role after a <|start|> is header, not answer.
  if (text == "assistant" || (text.starts_with("assistant") && is_ascii_space(text[9]))) text.erase(0, 10);
  emit_text(text, delta);
}

ChatDelta HarmonyStreamParser::push(int32_t id) {
  Delta delta;
  const bool terminator = id == end_ || id == call_ || id == return_;
  switch (state_) {
    case State::kExpectStart:
      if (id == start_ || id == channel_) {
        begin_header();
        if (id == channel_) {
          header_.push_back(id);
          header_has_markers_ = true;
        }
        return delta;
      }
      if (tokenizer_.is_special(id) || terminator || id == message_ || id == constrain_) return delta;
      open_plain_content();  // text where a message should start: keep it as content
      emit_text(decoder_.push(id), delta);
      return delta;
    case State::kHeader:
      if (id == message_) {
        open_message(delta);
      } else if (terminator || id == start_) {
        flush_header_as_content(delta);
        close_message(delta);
        if (id == start_) begin_header();
      } else {
        header_.push_back(id);
        header_has_markers_ = header_has_markers_ || id == channel_ || id == constrain_;
        if (header_.size() > kMaxHeaderTokens) {
          header_has_markers_ = false;  // not a header after all: the text is the answer
          flush_header_as_content(delta);
        }
      }
      return delta;
    case State::kContent:
      if (terminator || id == start_ || id == channel_) {
        close_message(delta);
        if (id == start_ || id == channel_) push(id);
        return delta;
      }
      if (!tokenizer_.is_special(id) && id != message_ && id != constrain_) emit_text(decoder_.push(id), delta);
      return delta;
  }
  return delta;
}

ChatDelta HarmonyStreamParser::finish() {
  Delta delta;
  if (state_ == State::kHeader) flush_header_as_content(delta);
  if (state_ == State::kContent) close_message(delta);
  state_ = State::kExpectStart;
  return delta;
}

ParsedOutput parse_harmony_output(const Tokenizer& tokenizer, std::span<const int32_t> ids) {
  HarmonyStreamParser parser(tokenizer);
  for (const int32_t id : ids) parser.push(id);
  parser.finish();
  return parser.result();
}

}  // namespace anvil
