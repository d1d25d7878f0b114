#include "server/openai_protocol.h"

#include <cctype>
#include <limits>

#include "server/json_input.h"

namespace anvil::server {

namespace {

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr double kHuge = 1e30;
constexpr size_t kMaxStopStrings = 64;
constexpr size_t kMaxStopBytes = 4096;

bool is_default(const Json& value) {
  return value.is_null() || (value.is_boolean() && !value.get<bool>()) || (value.is_object() && value.empty()) ||
         (value.is_array() && value.empty()) || (value.is_string() && value.get_ref<const std::string&>().empty());
}

// Fields that change the output and that anvil does not implement: refused unless they hold
// their do-nothing value, never accepted and ignored.
void refuse_unimplemented(FieldReader& fields, std::initializer_list<std::string_view> keys) {
  for (const std::string_view key : keys) {
    const Json* value = fields.raw(key);
    if (value && !is_default(*value)) bad_request(fields.param(key), "{} is not supported by this server", fields.param(key));
  }
}

std::string schema_text(const Json& schema, const std::string& param) {
  if (schema.is_string()) {
    // Old clients send guided_json as JSON text.
    const Json parsed = Json::parse(schema.get_ref<const std::string&>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) bad_request(param, "{} must be a JSON schema object", param);
    check_json_depth(schema.get_ref<const std::string&>(), kMaxJsonDepth, param);
    return dump_json(parsed);
  }
  if (!schema.is_object()) bad_request(param, "{} must be a JSON schema object, got {}", param, json_type_name(schema));
  return dump_json(schema);
}

void set_structured(GenerationOptions& options, StructuredOutput::Kind kind, std::string schema, const std::string& param) {
  if (options.structured.kind != StructuredOutput::Kind::None)
    bad_request(param, "{} conflicts with {}: give one kind of structured output", param, options.structured.param);
  options.structured = {kind, std::move(schema), param};
}

void parse_response_format(const Json& value, GenerationOptions& options) {
  FieldReader format(object_value(value, "response_format"), "response_format");
  const auto type = format.choice("type", {"text", "json_object", "json_schema"});
  if (!type) bad_request("response_format.type", "response_format.type is required");
  if (*type == "json_object") {
    set_structured(options, StructuredOutput::Kind::JsonObject, "", "response_format");
  } else if (*type == "json_schema") {
    const Json* spec = format.raw("json_schema");
    if (!spec) bad_request("response_format.json_schema", "response_format.json_schema is required for type json_schema");
    FieldReader fields(object_value(*spec, "response_format.json_schema"), "response_format.json_schema");
    const Json* schema = fields.raw("schema");
    if (!schema) bad_request("response_format.json_schema.schema", "response_format.json_schema.schema is required");
    fields.string("name");
    fields.string("description");
    fields.boolean("strict");  // always enforced
    set_structured(options, StructuredOutput::Kind::JsonSchema, schema_text(*schema, "response_format.json_schema.schema"),
                   "response_format.json_schema.schema");
  }
}

void parse_structured_fields(FieldReader& fields, GenerationOptions& options) {
  if (const Json* format = fields.raw("response_format")) parse_response_format(*format, options);
  if (const Json* schema = fields.raw("guided_json"))
    set_structured(options, StructuredOutput::Kind::JsonSchema, schema_text(*schema, "guided_json"), "guided_json");
  refuse_unimplemented(fields, {"guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern"});
  fields.ignore({"guided_decoding_backend"});
  if (const Json* spec = fields.raw("structured_outputs")) {
    FieldReader structured(object_value(*spec, "structured_outputs"), "structured_outputs");
    if (const Json* schema = structured.raw("json"))
      set_structured(options, StructuredOutput::Kind::JsonSchema, schema_text(*schema, "structured_outputs.json"),
                     "structured_outputs.json");
    if (structured.boolean("json_object").value_or(false))
      set_structured(options, StructuredOutput::Kind::JsonObject, "", "structured_outputs.json_object");
    refuse_unimplemented(structured, {"regex", "choice", "grammar", "structural_tag"});
    structured.ignore({"disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"});
    for (const std::string& key : structured.unread_keys()) bad_request(key, "{} is not supported by this server", key);
  }
}

std::vector<std::string> parse_stop(const Json& value) {
  std::vector<std::string> stops;
  auto add = [&](const Json& item, const std::string& param) {
    const std::string& text = string_value(item, param);
    if (text.size() > kMaxStopBytes) bad_request(param, "{} is longer than {} bytes", param, kMaxStopBytes);
    if (!text.empty()) stops.push_back(text);
  };
  if (value.is_string()) {
    add(value, "stop");
  } else {
    array_value(value, "stop");
    if (value.size() > kMaxStopStrings) bad_request("stop", "stop has more than {} strings", kMaxStopStrings);
    for (size_t i = 0; i < value.size(); ++i) add(value[i], "stop[" + std::to_string(i) + "]");
  }
  return stops;
}

void parse_generation_options(FieldReader& fields, GenerationOptions& options, bool chat) {
  options.model = fields.string("model").value_or("");
  options.temperature = fields.number("temperature", 0.0, kHuge);
  options.top_p = fields.number("top_p", 0.0, 1.0);
  if (options.top_p && *options.top_p <= 0.0) bad_request("top_p", "top_p must be in (0, 1], got {}", *options.top_p);
  options.min_p = fields.number("min_p", 0.0, 1.0);
  options.top_k = fields.integer("top_k", -1, kInt32Max);
  options.presence_penalty = fields.number("presence_penalty", -2.0, 2.0).value_or(0.0);
  options.frequency_penalty = fields.number("frequency_penalty", -2.0, 2.0).value_or(0.0);
  options.repetition_penalty = fields.number("repetition_penalty", 0.0, 10.0).value_or(1.0);
  if (options.repetition_penalty <= 0.0) bad_request("repetition_penalty", "repetition_penalty must be > 0");

  const auto max_tokens = fields.integer("max_tokens", 1, kInt32Max);
  const auto max_completion_tokens = chat ? fields.integer("max_completion_tokens", 1, kInt32Max) : std::nullopt;
  options.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  options.min_tokens = fields.integer("min_tokens", 0, kInt32Max).value_or(0);
  if (options.max_tokens && options.min_tokens > *options.max_tokens)
    bad_request("min_tokens", "min_tokens ({}) must not exceed max_tokens ({})", options.min_tokens, *options.max_tokens);
  options.n = fields.integer("n", 1, kMaxSequencesPerRequest).value_or(1);
  if (const Json* best_of = fields.raw("best_of"); best_of && integer_value(*best_of, "best_of", 1, kMaxSequencesPerRequest) != options.n)
    bad_request("best_of", "best_of other than n is not supported by this server");
  if (const auto seed = fields.integer("seed", kInt64Min, kInt64Max)) options.seed = uint64_t(*seed);

  if (const Json* stop = fields.raw("stop")) options.stop = parse_stop(*stop);
  if (const Json* ids = fields.raw("stop_token_ids")) {
    array_value(*ids, "stop_token_ids");
    for (size_t i = 0; i < ids->size(); ++i)
      options.stop_token_ids.push_back(int32_t(integer_value((*ids)[i], "stop_token_ids[" + std::to_string(i) + "]", 0, kInt32Max)));
  }
  options.include_stop_str_in_output = fields.boolean("include_stop_str_in_output").value_or(false);
  options.ignore_eos = fields.boolean("ignore_eos").value_or(false);
  options.skip_special_tokens = fields.boolean("skip_special_tokens").value_or(true);

  options.stream = fields.boolean("stream").value_or(false);
  if (const Json* stream_options = fields.raw("stream_options")) {
    if (!options.stream) bad_request("stream_options", "stream_options can only be given when stream is true");
    FieldReader so(object_value(*stream_options, "stream_options"), "stream_options");
    options.include_usage = so.boolean("include_usage").value_or(false);
    options.continuous_usage_stats = so.boolean("continuous_usage_stats").value_or(false);
    for (const std::string& key : so.unread_keys()) options.ignored_fields.push_back(key);
  }
  options.return_token_ids = fields.boolean("return_token_ids").value_or(false);
  options.tokens_as_ids = fields.boolean("return_tokens_as_token_ids").value_or(false);
  parse_structured_fields(fields, options);

  if (const Json* user = fields.raw("user")) string_value(*user, "user");
  refuse_unimplemented(fields, {"logit_bias", "echo", "use_beam_search", "prompt_logprobs", "truncate_prompt_tokens",
                                "allowed_token_ids", "bad_words", "logits_processors", "thinking_token_budget"});
  // Known and without effect on the output here.
  fields.ignore({"spaces_between_special_tokens", "add_special_tokens", "request_id", "priority", "metadata", "store",
                 "service_tier", "cache_salt", "kv_transfer_params", "vllm_xargs", "stream_interval", "length_penalty",
                 "mm_processor_kwargs", "media_io_kwargs"});
}

std::string message_content(const Json& content, const std::string& param) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  array_value(content, param);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_param = param + "[" + std::to_string(i) + "]";
    FieldReader part(object_value(content[i], part_param), part_param);
    const auto type = part.string("type").value_or("text");
    if (type != "text" && type != "input_text")
      bad_request(part_param + ".type", "content part type '{}' is not supported (text only)", type);
    const auto piece = part.string("text");
    if (!piece) bad_request(part_param + ".text", "{}.text is required", part_param);
    text += (i ? "\n" : "") + *piece;
  }
  return text;
}

ToolCall parse_tool_call(const Json& value, const std::string& param) {
  FieldReader fields(object_value(value, param), param);
  ToolCall call;
  call.id = fields.string("id").value_or("");
  if (const auto type = fields.string("type"); type && *type != "function")
    bad_request(param + ".type", "{}.type must be 'function'", param);
  const Json* function = fields.raw("function");
  if (!function) bad_request(param + ".function", "{}.function is required", param);
  FieldReader f(object_value(*function, param + ".function"), param + ".function");
  call.name = f.string("name").value_or("");
  if (call.name.empty()) bad_request(param + ".function.name", "{}.function.name is required", param);
  if (const Json* arguments = f.raw("arguments")) {
    call.arguments_json = arguments->is_string() ? arguments->get<std::string>() : dump_json(object_value(*arguments, param + ".function.arguments"));
  } else {
    call.arguments_json = "{}";
  }
  return call;
}

void check_tool_name(const std::string& name, const std::string& param) {
  // OpenAI's rule; it also keeps names from breaking Harmony's `to=functions.NAME` header.
  bool ok = !name.empty() && name.size() <= 64;
  for (const char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  if (!ok) bad_request(param, "{} must match ^[a-zA-Z0-9_-]{{1,64}}$, got '{}'", param, name);
}

}  // namespace

std::vector<ChatMessage> parse_messages(const Json& messages, const std::string& param) {
  array_value(messages, param);
  if (messages.empty()) bad_request(param, "{} must not be empty", param);
  std::vector<ChatMessage> result;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    FieldReader fields(object_value(messages[i], p), p);
    ChatMessage message;
    message.role = fields.choice("role", {"system", "developer", "user", "assistant", "tool"}).value_or("");
    if (message.role.empty()) bad_request(p + ".role", "{}.role is required", p);
    if (const Json* content = fields.raw("content")) message.content = message_content(*content, p + ".content");
    if (message.role == "assistant") {
      message.reasoning = fields.string("reasoning_content").value_or(fields.string("reasoning").value_or(""));
      if (const Json* calls = fields.raw("tool_calls")) {
        array_value(*calls, p + ".tool_calls");
        for (size_t j = 0; j < calls->size(); ++j)
          message.tool_calls.push_back(parse_tool_call((*calls)[j], p + ".tool_calls[" + std::to_string(j) + "]"));
      }
    }
    if (message.role == "tool") {
      message.tool_call_id = fields.string("tool_call_id").value_or("");
      message.name = fields.string("name").value_or("");
    } else {
      fields.string("name");  // a participant name: not part of the prompt formats
    }
    result.push_back(std::move(message));
  }
  return result;
}

std::vector<ToolDefinition> parse_tools(const Json& tools, const std::string& param) {
  array_value(tools, param);
  std::vector<ToolDefinition> result;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    FieldReader fields(object_value(tools[i], p), p);
    if (const auto type = fields.string("type"); type && *type != "function")
      bad_request(p + ".type", "{}.type must be 'function', got '{}'", p, *type);
    const Json* function = fields.raw("function");
    if (!function) bad_request(p + ".function", "{}.function is required", p);
    FieldReader f(object_value(*function, p + ".function"), p + ".function");
    ToolDefinition tool;
    tool.name = f.string("name").value_or("");
    check_tool_name(tool.name, p + ".function.name");
    for (const ToolDefinition& other : result)
      if (other.name == tool.name) bad_request(p + ".function.name", "two tools are named '{}'", tool.name);
    tool.description = f.string("description").value_or("");
    if (const Json* parameters = f.raw("parameters"))
      tool.parameters_json_schema = dump_json(object_value(*parameters, p + ".function.parameters"));
    f.boolean("strict");
    result.push_back(std::move(tool));
  }
  return result;
}

ChatRequest parse_chat_request(const Json& body) {
  FieldReader fields(body, "");
  ChatRequest request;
  parse_generation_options(fields, request.options, /*chat=*/true);
  const Json* messages = fields.raw("messages");
  if (!messages) bad_request("messages", "messages is required");
  request.messages = parse_messages(*messages, "messages");
  if (const Json* tools = fields.raw("tools")) request.tools = parse_tools(*tools, "tools");

  request.tool_choice = request.tools.empty() ? ToolChoice::None : ToolChoice::Auto;
  if (const Json* choice = fields.raw("tool_choice")) {
    if (choice->is_string()) {
      const std::string& name = choice->get_ref<const std::string&>();
      if (name == "none") request.tool_choice = ToolChoice::None;
      else if (name == "auto") request.tool_choice = ToolChoice::Auto;
      else if (name == "required") request.tool_choice = ToolChoice::Required;
      else bad_request("tool_choice", "tool_choice must be none, auto, required or a named function, got '{}'", name);
    } else {
      FieldReader named(object_value(*choice, "tool_choice"), "tool_choice");
      if (const auto type = named.string("type"); type && *type != "function")
        bad_request("tool_choice.type", "tool_choice.type must be 'function'");
      const Json* function = named.raw("function");
      if (!function) bad_request("tool_choice.function", "tool_choice.function is required");
      FieldReader f(object_value(*function, "tool_choice.function"), "tool_choice.function");
      request.named_tool = f.string("name").value_or("");
      request.tool_choice = ToolChoice::Named;
      bool found = false;
      for (const ToolDefinition& tool : request.tools) found = found || tool.name == request.named_tool;
      if (!found) bad_request("tool_choice.function.name", "tool_choice names '{}', which is not in tools", request.named_tool);
    }
    if ((request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Named) && request.tools.empty())
      bad_request("tool_choice", "tool_choice {} needs tools", request.tool_choice == ToolChoice::Required ? "required" : "named");
  }
  const bool forced_call = request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Named;
  if (forced_call && request.options.structured.kind != StructuredOutput::Kind::None)
    bad_request("tool_choice", "a forced tool call cannot be combined with {}", request.options.structured.param);
  request.parallel_tool_calls = fields.boolean("parallel_tool_calls").value_or(true);

  request.reasoning_effort =
      fields.choice("reasoning_effort", {"none", "minimal", "low", "medium", "high", "xhigh", "max"});
  if (const Json* kwargs = fields.raw("chat_template_kwargs")) {
    FieldReader k(object_value(*kwargs, "chat_template_kwargs"), "chat_template_kwargs");
    request.enable_thinking = k.boolean("enable_thinking");
    if (const auto effort = k.choice("reasoning_effort", {"none", "minimal", "low", "medium", "high", "xhigh", "max"});
        effort && !request.reasoning_effort)
      request.reasoning_effort = effort;
    for (const std::string& key : k.unread_keys()) request.options.ignored_fields.push_back(key);
  }
  request.include_reasoning = fields.boolean("include_reasoning").value_or(true);
  request.add_generation_prompt = fields.boolean("add_generation_prompt").value_or(true);

  request.logprobs = fields.boolean("logprobs").value_or(false);
  const auto top = fields.integer("top_logprobs", 0, 20);
  if (top && !request.logprobs) bad_request("top_logprobs", "top_logprobs needs logprobs set to true");
  request.options.top_logprobs = request.logprobs ? int(top.value_or(0)) : -1;

  refuse_unimplemented(fields, {"continue_final_message", "chat_template", "documents", "functions", "function_call",
                                "prediction", "audio", "tool_parser", "reasoning_parser"});
  if (const Json* modalities = fields.raw("modalities"); modalities && *modalities != Json::array({"text"}) && !is_default(*modalities))
    bad_request("modalities", "only the text modality is supported");
  request.options.ignored_fields = [&] {
    auto keys = fields.unread_keys();
    keys.insert(keys.end(), request.options.ignored_fields.begin(), request.options.ignored_fields.end());
    return keys;
  }();
  return request;
}

CompletionRequest parse_completion_request(const Json& body) {
  FieldReader fields(body, "");
  CompletionRequest request;
  parse_generation_options(fields, request.options, /*chat=*/false);
  const auto logprobs = fields.integer("logprobs", 0, 20);
  request.options.top_logprobs = logprobs ? int(*logprobs) : -1;
  refuse_unimplemented(fields, {"suffix"});

  const Json* prompt = fields.raw("prompt");
  if (!prompt) bad_request("prompt", "prompt is required");
  auto id_list = [](const Json& ids, const std::string& param) {
    CompletionPrompt p;
    p.is_text = false;
    for (size_t i = 0; i < ids.size(); ++i)
      p.ids.push_back(int32_t(integer_value(ids[i], param + "[" + std::to_string(i) + "]", 0, kInt32Max)));
    if (p.ids.empty()) bad_request(param, "{} must not be empty", param);
    return p;
  };
  if (prompt->is_string()) {
    request.prompts.push_back({true, prompt->get<std::string>(), {}});
  } else {
    array_value(*prompt, "prompt");
    if (prompt->empty()) bad_request("prompt", "prompt must not be empty");
    if ((*prompt)[0].is_number()) {
      request.prompts.push_back(id_list(*prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const Json& item = (*prompt)[i];
        const std::string param = "prompt[" + std::to_string(i) + "]";
        if (item.is_string()) request.prompts.push_back({true, item.get<std::string>(), {}});
        else request.prompts.push_back(id_list(array_value(item, param), param));
      }
    }
  }
  for (size_t i = 0; i < request.prompts.size(); ++i)
    if (request.prompts[i].is_text && request.prompts[i].text.empty())
      bad_request("prompt", "the prompt must not be empty");
  if (int64_t(request.prompts.size()) * request.options.n > kMaxSequencesPerRequest)
    bad_request("n", "prompts x n must be at most {}", kMaxSequencesPerRequest);
  request.options.ignored_fields = [&] {
    auto keys = fields.unread_keys();
    keys.insert(keys.end(), request.options.ignored_fields.begin(), request.options.ignored_fields.end());
    return keys;
  }();
  return request;
}

}  // namespace anvil::server
