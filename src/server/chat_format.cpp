#include "server/chat_format.h"

#include <algorithm>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/chat_chatml.h"
#include "formats/chat_harmony.h"
#include "server/api_error.h"
#include "server/prefix_constraint.h"

namespace anvil::server {

namespace {

// The first constraint is built while the request is checked, so a bad schema is a 400 before
// anything is queued; the factory hands that one out first instead of building it twice.
ConstraintFactory checked_factory(std::function<std::unique_ptr<TokenConstraint>()> make, const std::string& param) {
  struct First {
    std::mutex mutex;
    std::unique_ptr<TokenConstraint> constraint;
  };
  auto first = std::make_shared<First>();
  try {
    first->constraint = make();
  } catch (const Error& error) {
    bad_request(param, "{}: {}", param, error.what());
  }
  return [make = std::move(make), first]() -> std::unique_ptr<TokenConstraint> {
    {
      const std::lock_guard lock(first->mutex);
      if (first->constraint) return std::move(first->constraint);
    }
    return make();
  };
}

std::string harmony_effort(const std::optional<std::string>& effort) {
  if (!effort || *effort == "medium") return "medium";
  if (*effort == "none" || *effort == "minimal" || *effort == "low") return "low";
  return "high";
}

std::string object_schema(const std::string& parameters) {
  return parameters.empty() ? std::string(R"({"type":"object"})") : parameters;
}

// A ChatML reply forced by the constraint: the forced prefix, then JSON (the answer, or the body of
// the one tool call), then the end of the turn. Everything after the prefix is the JSON, whatever
// tags its strings spell.
class ForcedChatMlParser : public ChatOutputParser {
 public:
  ForcedChatMlParser(const Tokenizer& tokenizer, size_t prefix_tokens, bool tool_call)
      : decoder_(tokenizer, /*skip_special=*/true), skip_(prefix_tokens), tool_call_(tool_call) {}

  ChatDelta push(int32_t id) override {
    ChatDelta delta;
    if (skip_ > 0) {
      --skip_;  // the constraint wrote exactly these tokens
      return delta;
    }
    take(decoder_.push(id), delta);
    return delta;
  }

  ChatDelta finish() override {
    ChatDelta delta;
    take(decoder_.finish(), delta);
    if (tool_call_ && !call_done_) {
      call_done_ = true;
      complete_call(delta);
    }
    return delta;
  }

  ParsedOutput result() const override { return result_; }

 private:
  void take(const std::string& text, ChatDelta& delta) {
    if (tool_call_) {
      body_ += text;
    } else {
      delta.content += text;
      result_.content += text;
    }
  }

  // As ChatMlStreamParser completes a call: {"name", "arguments"} with the arguments as compact
  // JSON, or, when max_tokens cut the JSON short, the text as content.
  void complete_call(ChatDelta& delta) {
    using OrderedJson = nlohmann::ordered_json;  // the arguments keep the model's key order
    const OrderedJson parsed = OrderedJson::parse(body_, nullptr, /*allow_exceptions=*/false);
    const auto name = parsed.is_object() ? parsed.find("name") : parsed.end();
    if (name == parsed.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      delta.content += body_;
      result_.content += body_;
      return;
    }
    std::string arguments = "{}";
    if (const auto found = parsed.find("arguments"); found != parsed.end() && found->is_string()) {
      arguments = found->get<std::string>();
    } else if (found != parsed.end() && !found->is_null()) {
      arguments = found->dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
    }
    ToolCall call{make_tool_call_id(), name->get<std::string>(), std::move(arguments)};
    delta.tool_calls.push_back(ToolCallDelta{0, call.id, call.name, call.arguments_json});
    result_.tool_calls.push_back(std::move(call));
  }

  StreamDecoder decoder_;
  size_t skip_;
  bool tool_call_;
  bool call_done_ = false;
  std::string body_;
  ParsedOutput result_;
};

}  // namespace

ConstraintFactory json_constraint(const StructuredOutput& structured, const Tokenizer& tokenizer) {
  if (structured.kind == StructuredOutput::Kind::None) return {};
  const Tokenizer* tok = &tokenizer;
  if (structured.kind == StructuredOutput::Kind::JsonObject)
    return [tok] { return make_json_object_constraint(*tok); };
  return checked_factory([tok, schema = structured.schema_json] { return make_json_schema_constraint(schema, *tok); },
                         structured.param);
}

ChatFormat::ChatFormat(const ModelConfig& config, const Tokenizer* tokenizer) : tokenizer_(tokenizer) {
  if (!tokenizer) return;
  if (config.model_type == "gpt_oss") {
    kind_ = ChatFormatKind::Harmony;
    stop_ids_ = harmony_stop_token_ids(*tokenizer);
  } else if (config.model_type == "qwen3" || config.model_type == "qwen3_moe") {
    kind_ = ChatFormatKind::ChatMl;
    stop_ids_ = chatml_stop_token_ids(*tokenizer);
  }
}

std::vector<int32_t> ChatFormat::encode(const std::string& text) const { return tokenizer_->encode(text, false); }

int32_t ChatFormat::special(const char* token) const {
  const auto id = tokenizer_->token_id(token);
  if (!id) throw ApiError(500, fmt::format("the tokenizer has no {} token", token));
  return *id;
}

RenderedPrompt ChatFormat::render(const ChatRequest& request) const {
  if (!tokenizer_) bad_request("messages", "this model has no tokenizer.json; use /v1/completions with token ids");
  if (kind_ == ChatFormatKind::None) bad_request("messages", "this model has no chat format; use /v1/completions");
  const std::vector<ToolDefinition> no_tools;
  const auto& tools = request.tool_choice == ToolChoice::None ? no_tools : request.tools;
  ChatRenderOptions options;
  options.add_generation_prompt = request.add_generation_prompt;
  RenderedPrompt prompt;
  const bool forced_call = request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Named;
  if (forced_call) prompt.forced = ForcedReply::ToolCall;
  else if (request.options.structured.kind != StructuredOutput::Kind::None) prompt.forced = ForcedReply::JsonAnswer;
  try {
    if (kind_ == ChatFormatKind::Harmony) {
      options.reasoning_effort = harmony_effort(request.reasoning_effort);
      prompt.ids = render_harmony(*tokenizer_, request.messages, tools, options);
      return prompt;
    }
    // vLLM: reasoning_effort "none" turns thinking off unless the template kwargs say otherwise.
    options.enable_thinking = request.enable_thinking.value_or(request.reasoning_effort != "none");
    prompt.thinking_enabled = options.enable_thinking;
    prompt.ids = render_chatml_ids(*tokenizer_, request.messages, tools, options);
  } catch (const Error& error) {
    bad_request("messages", "{}", error.what());
  }
  // Only the generation prompt (after the last <|im_start|>) can leave the reply inside a think
  // block: <think> is not a special token, so a user message mentioning it encodes to its id too.
  const auto think = tokenizer_->token_id("<think>");
  const auto think_end = tokenizer_->token_id("</think>");
  const auto im_start = tokenizer_->token_id("<|im_start|>");
  if (think && think_end) {
    for (auto it = prompt.ids.rbegin(); it != prompt.ids.rend(); ++it) {
      if (*it == *think_end || (im_start && *it == *im_start)) break;
      if (*it == *think) {
        prompt.starts_in_reasoning = true;
        break;
      }
    }
  }

  if (prompt.forced != ForcedReply::None) {
    // Skip the reasoning rather than leave it unconstrained: close the block the prompt opened,
    // or write an empty one, as the template's enable_thinking=false does.
    std::string prefix;
    if (prompt.starts_in_reasoning) prefix = "\n</think>\n\n";
    else if (prompt.thinking_enabled) prefix = "<think>\n\n</think>\n\n";
    if (prompt.forced == ForcedReply::ToolCall) prefix += "<tool_call>\n";
    prompt.forced_prefix = encode(prefix);
  }
  return prompt;
}

std::unique_ptr<ChatOutputParser> ChatFormat::make_parser(const RenderedPrompt& prompt) const {
  // Harmony's parser acts only on special tokens, which constrained text never holds, so it reads
  // a forced reply as it is.
  if (kind_ == ChatFormatKind::Harmony) return std::make_unique<HarmonyStreamParser>(*tokenizer_);
  if (prompt.forced != ForcedReply::None)
    return std::make_unique<ForcedChatMlParser>(*tokenizer_, prompt.forced_prefix.size(),
                                                prompt.forced == ForcedReply::ToolCall);
  return std::make_unique<ChatMlStreamParser>(*tokenizer_, prompt.starts_in_reasoning);
}

ConstraintFactory ChatFormat::constraint(const ChatRequest& request, const RenderedPrompt& prompt) const {
  if (prompt.forced == ForcedReply::None) return {};
  const Tokenizer* tok = tokenizer_;

  if (prompt.forced == ForcedReply::JsonAnswer) {
    ConstraintFactory body = json_constraint(request.options.structured, *tokenizer_);
    std::vector<int32_t> prefix;
    if (kind_ == ChatFormatKind::Harmony) {
      // The answer goes straight to the final channel: no analysis message comes first.
      prefix = {special("<|channel|>")};
      for (const int32_t id : encode("final")) prefix.push_back(id);
      prefix.push_back(special("<|message|>"));
    } else {
      prefix = prompt.forced_prefix;
    }
    if (prefix.empty()) return body;
    return [prefix, body] { return std::make_unique<PrefixConstraint>(std::vector<ForcedPrefix>{{prefix, body}}); };
  }

  std::vector<const ToolDefinition*> allowed;
  for (const ToolDefinition& tool : request.tools)
    if (request.tool_choice == ToolChoice::Required || tool.name == request.named_tool) allowed.push_back(&tool);

  if (kind_ == ChatFormatKind::Harmony) {
    // One header per allowed tool: `<|channel|>commentary to=functions.NAME <|constrain|>json
    // <|message|>`, then the arguments under that tool's parameter schema, ended by <|call|>.
    std::vector<ForcedPrefix> options;
    for (size_t i = 0; i < request.tools.size(); ++i) {
      const ToolDefinition& tool = request.tools[i];
      if (std::find(allowed.begin(), allowed.end(), &tool) == allowed.end()) continue;
      std::vector<int32_t> header = {special("<|channel|>")};
      for (const int32_t id : encode("commentary to=functions." + tool.name + " ")) header.push_back(id);
      header.push_back(special("<|constrain|>"));
      for (const int32_t id : encode("json")) header.push_back(id);
      header.push_back(special("<|message|>"));
      StructuredOutput schema{StructuredOutput::Kind::JsonSchema, object_schema(tool.parameters_json_schema),
                              "tools[" + std::to_string(i) + "].function.parameters"};
      options.push_back({std::move(header), json_constraint(schema, *tok)});
    }
    return [options] { return std::make_unique<PrefixConstraint>(options); };
  }

  // ChatML: `<tool_call>\n{"name": NAME, "arguments": ARGS}` with NAME one of the allowed tools
  // and ARGS under its parameter schema; the parser closes the call at the end of the turn.
  Json branches = Json::array();
  for (const ToolDefinition* tool : allowed) {
    Json parameters = Json::parse(object_schema(tool->parameters_json_schema));
    branches.push_back({{"type", "object"},
                        {"properties", {{"name", {{"const", tool->name}}}, {"arguments", std::move(parameters)}}},
                        {"required", {"name", "arguments"}},
                        {"additionalProperties", false}});
  }
  const Json schema = branches.size() == 1 ? branches[0] : Json{{"anyOf", branches}};
  StructuredOutput call{StructuredOutput::Kind::JsonSchema, dump_json(schema), "tools"};
  ConstraintFactory body = json_constraint(call, *tok);
  const std::vector<int32_t> prefix = prompt.forced_prefix;
  return [prefix, body] { return std::make_unique<PrefixConstraint>(std::vector<ForcedPrefix>{{prefix, body}}); };
}

}  // namespace anvil::server
