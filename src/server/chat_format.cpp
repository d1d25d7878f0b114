#include "server/chat_format.h"

#include <algorithm>
#include <mutex>

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
  const auto think = tokenizer_->token_id("<think>");
  const auto think_end = tokenizer_->token_id("</think>");
  if (think && think_end) {
    for (auto it = prompt.ids.rbegin(); it != prompt.ids.rend(); ++it) {
      if (*it == *think_end) break;
      if (*it == *think) {
        prompt.starts_in_reasoning = true;
        break;
      }
    }
  }
  return prompt;
}

std::unique_ptr<ChatOutputParser> ChatFormat::make_parser(const RenderedPrompt& prompt) const {
  if (kind_ == ChatFormatKind::Harmony) return std::make_unique<HarmonyStreamParser>(*tokenizer_);
  return std::make_unique<ChatMlStreamParser>(*tokenizer_, prompt.starts_in_reasoning);
}

ConstraintFactory ChatFormat::constraint(const ChatRequest& request, const RenderedPrompt& prompt) const {
  const bool forced_call = request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Named;
  if (!forced_call && request.options.structured.kind == StructuredOutput::Kind::None) return {};
  const Tokenizer* tok = tokenizer_;

  // ChatML: a forced answer skips the reasoning block rather than leaving it unconstrained.
  std::string chatml_prefix;
  if (kind_ == ChatFormatKind::ChatMl && prompt.starts_in_reasoning) chatml_prefix = "\n</think>\n\n";
  else if (kind_ == ChatFormatKind::ChatMl && prompt.thinking_enabled) chatml_prefix = "<think>\n\n</think>\n\n";

  if (!forced_call) {
    ConstraintFactory body = json_constraint(request.options.structured, *tokenizer_);
    std::vector<int32_t> prefix;
    if (kind_ == ChatFormatKind::Harmony) {
      prefix = {special("<|channel|>")};
      for (const int32_t id : encode("final")) prefix.push_back(id);
      prefix.push_back(special("<|message|>"));
    } else {
      prefix = encode(chatml_prefix);
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
  const std::vector<int32_t> prefix = encode(chatml_prefix + "<tool_call>\n");
  return [prefix, body] { return std::make_unique<PrefixConstraint>(std::vector<ForcedPrefix>{{prefix, body}}); };
}

}  // namespace anvil::server
