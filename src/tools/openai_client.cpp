#include "tools/openai_client.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace anvil::tools {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The message of an OpenAI-style error body ({"error": {"message": ...}} or {"error": "..."}).
std::string error_message(const std::string& body, const Json& json) {
  if (json.is_object() && json.contains("error")) {
    const Json& error = json["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string())
      return error["message"].get<std::string>();
    if (error.is_string()) return error.get<std::string>();
  }
  if (json.is_object() && json.contains("message") && json["message"].is_string()) return json["message"].get<std::string>();
  return excerpt(body, 200);
}

std::string transport_error(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::Read: return "the connection broke while reading the reply";
    case httplib::Error::Write: return "the connection broke while sending the request";
    case httplib::Error::ConnectionTimeout: return "connecting timed out";
    case httplib::Error::SSLConnection: return "TLS connection failed";
    case httplib::Error::SSLServerVerification: return "TLS server verification failed";
    case httplib::Error::Canceled: return "cancelled";
    default: return "HTTP error " + httplib::to_string(error);
  }
}

httplib::Client make_client(const BaseUrl& url, double timeout_s) {
  httplib::Client client(url.origin());
  const time_t whole = time_t(timeout_s);
  const time_t micros = time_t((timeout_s - double(whole)) * 1e6);
  client.set_read_timeout(whole, micros);
  client.set_write_timeout(whole, micros);
  client.set_connection_timeout(10, 0);
  client.set_tcp_nodelay(true);
  return client;
}

httplib::Headers headers_for(const std::string& api_key) {
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  return headers;
}

}  // namespace

std::string BaseUrl::origin() const { return scheme + "://" + host + ":" + std::to_string(port); }

bool BaseUrl::loopback() const {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

BaseUrl parse_base_url(const std::string& text) {
  static const std::regex pattern(R"(^(https?)://(\[[0-9a-fA-F:.]+\]|[^/:?#]+)(?::(\d+))?(/[^?#]*)?$)");
  std::smatch match;
  if (!std::regex_match(text, match, pattern))
    fail("--base-url {}: expected http://HOST[:PORT][/PATH], e.g. http://127.0.0.1:8000", text);
  BaseUrl url;
  url.scheme = match[1];
  url.host = match[2];
  url.port = match[3].matched ? std::stoi(match[3]) : (url.scheme == "https" ? 443 : 80);
  if (url.port <= 0 || url.port > 65535) fail("--base-url {}: port {} is out of range", text, url.port);
  std::string path = match[4].matched ? std::string(match[4]) : std::string();
  while (!path.empty() && path.back() == '/') path.pop_back();
  // `.../v1` is how OpenAI clients spell the base; the endpoints here add /v1 themselves.
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) path.resize(path.size() - 3);
  url.prefix = path;
  return url;
}

std::string HttpReply::describe() const {
  if (!error.empty()) return error;
  return "HTTP " + std::to_string(status) + ": " + error_message(body, json);
}

std::string StreamReply::describe() const {
  if (!error.empty()) return error;
  return "HTTP " + std::to_string(status) + ": " + error_message(body, Json::parse(body, nullptr, false));
}

void SseParser::dispatch(const std::function<void(std::string&&)>& on_data) {
  if (has_data_) on_data(std::move(data_));
  data_.clear();
  has_data_ = false;
}

void SseParser::feed(const char* data, size_t size, const std::function<void(std::string&&)>& on_data) {
  for (size_t i = 0; i < size; ++i) {
    const char c = data[i];
    if (c == '\n' && last_cr_) {  // the \n of a \r\n: the line already ended at \r
      last_cr_ = false;
      continue;
    }
    last_cr_ = c == '\r';
    if (c != '\n' && c != '\r') {
      line_ += c;
      continue;
    }
    if (line_.empty()) {
      dispatch(on_data);
      continue;
    }
    if (line_[0] != ':') {
      const size_t colon = line_.find(':');
      const std::string_view field = std::string_view(line_).substr(0, colon);
      if (field == "data") {
        std::string_view value = colon == std::string::npos ? std::string_view() : std::string_view(line_).substr(colon + 1);
        if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
        if (has_data_) data_ += '\n';
        data_ += value;
        has_data_ = true;
      }
    }
    line_.clear();
  }
}

void SseParser::finish(const std::function<void(std::string&&)>& on_data) {
  if (!line_.empty()) {
    const char end = '\n';
    feed(&end, 1, on_data);
  }
  dispatch(on_data);
}

OpenAiClient::OpenAiClient(const std::string& base_url, std::string api_key, double timeout_s)
    : url_(parse_base_url(base_url)), api_key_(std::move(api_key)), timeout_s_(timeout_s) {}

HttpReply OpenAiClient::get(const std::string& path) const {
  auto client = make_client(url_, timeout_s_);
  HttpReply reply;
  const auto start = Clock::now();
  const auto result = client.Get(url_.path(path), headers_for(api_key_));
  reply.seconds = since(start);
  if (!result) {
    reply.error = transport_error(result.error());
    return reply;
  }
  reply.status = result->status;
  reply.body = result->body;
  reply.json = Json::parse(reply.body, nullptr, false);
  return reply;
}

HttpReply OpenAiClient::post(const std::string& path, const Json& body) const {
  auto client = make_client(url_, timeout_s_);
  HttpReply reply;
  const auto start = Clock::now();
  const auto result = client.Post(url_.path(path), headers_for(api_key_), body.dump(), "application/json");
  reply.seconds = since(start);
  if (!result) {
    reply.error = transport_error(result.error());
    return reply;
  }
  reply.status = result->status;
  reply.body = result->body;
  reply.json = Json::parse(reply.body, nullptr, false);
  return reply;
}

StreamReply OpenAiClient::post_stream(const std::string& path, const Json& body,
                                      const std::function<void(const SseEvent&)>& on_event) const {
  auto client = make_client(url_, timeout_s_);
  StreamReply reply;
  SseParser parser;
  httplib::Request request;
  request.method = "POST";
  request.path = url_.path(path);
  request.headers = headers_for(api_key_);
  request.headers.emplace("Content-Type", "application/json");
  request.headers.emplace("Accept", "text/event-stream");
  request.body = body.dump();
  Clock::time_point start;
  const auto on_data = [&](std::string&& data) {
    SseEvent event;
    event.t = since(start);
    event.data = std::move(data);
    if (event.data == "[DONE]") {
      reply.done = true;
    } else {
      event.json = Json::parse(event.data, nullptr, false);
      if (event.json.is_discarded()) reply.all_json = false;
    }
    if (on_event) on_event(event);
    reply.events.push_back(std::move(event));
  };
  request.response_handler = [&](const httplib::Response& response) {
    reply.status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    reply.body.append(data, size);
    if (reply.status == 200) parser.feed(data, size, on_data);
    return true;
  };
  start = Clock::now();
  const auto result = client.send(request);
  if (reply.status == 200) parser.finish(on_data);
  reply.seconds = since(start);
  if (!result) {
    reply.error = transport_error(result.error());
  } else {
    reply.status = result->status;
  }
  return reply;
}

namespace {

const char* const kReasoningFields[] = {"reasoning_content", "reasoning", "thinking"};

void read_usage(const Json& usage, ChatResult& out) {
  if (!usage.is_object()) return;
  if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer()) out.prompt_tokens = usage["prompt_tokens"].get<int64_t>();
  if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer())
    out.completion_tokens = usage["completion_tokens"].get<int64_t>();
  if (usage.contains("total_tokens") && usage["total_tokens"].is_number_integer()) out.total_tokens = usage["total_tokens"].get<int64_t>();
}

std::string string_or_empty(const Json& value) { return value.is_string() ? value.get<std::string>() : std::string(); }

// Reads one message or delta's text fields into out (appending, for deltas).
void read_text_fields(const Json& message, ChatResult& out) {
  if (message.contains("content")) {
    const Json& content = message["content"];
    if (content.is_string()) out.content += content.get<std::string>();
    else if (content.is_null()) out.content_null = true;
    else out.problems.push_back("content is neither a string nor null");
  }
  for (const char* field : kReasoningFields) {
    if (!message.contains(field) || !message[field].is_string()) continue;
    const std::string text = message[field].get<std::string>();
    if (text.empty()) continue;
    // anvil and vLLM send the same text under two names; take the first one that carries it.
    if (out.reasoning_field.empty()) out.reasoning_field = field;
    if (out.reasoning_field == field) out.reasoning += text;
  }
}

}  // namespace

ChatResult chat_result_from_reply(const Json& reply) {
  ChatResult out;
  if (!reply.is_object() || !reply.contains("choices") || !reply["choices"].is_array() || reply["choices"].empty()) {
    out.problems.push_back("the reply has no choices");
    return out;
  }
  const Json& choice = reply["choices"][0];
  if (choice.contains("finish_reason")) out.finish_reason = string_or_empty(choice["finish_reason"]);
  if (reply.contains("usage")) read_usage(reply["usage"], out);
  if (!choice.contains("message") || !choice["message"].is_object()) {
    out.problems.push_back("choices[0] has no message");
    return out;
  }
  out.has_message = true;
  const Json& message = choice["message"];
  read_text_fields(message, out);
  if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
    for (const Json& call : message["tool_calls"]) {
      ChatToolCall tool;
      tool.id = string_or_empty(call.value("id", Json()));
      tool.type = string_or_empty(call.value("type", Json()));
      if (call.contains("function") && call["function"].is_object()) {
        tool.name = string_or_empty(call["function"].value("name", Json()));
        const Json arguments = call["function"].value("arguments", Json());
        // OpenAI sends arguments as a JSON string; some servers send the object itself.
        if (arguments.is_string()) tool.arguments = arguments.get<std::string>();
        else if (!arguments.is_null()) {
          tool.arguments = arguments.dump();
          out.problems.push_back("tool call arguments are an object, not a JSON string");
        }
      }
      out.tool_calls.push_back(std::move(tool));
    }
  }
  return out;
}

ChatResult chat_result_from_stream(const StreamReply& stream) {
  ChatResult out;
  for (const SseEvent& event : stream.events) {
    if (event.data == "[DONE]") continue;
    const Json& chunk = event.json;
    if (!chunk.is_object()) {
      out.problems.push_back("a stream event is not JSON: " + excerpt(event.data));
      continue;
    }
    if (chunk.contains("error")) out.problems.push_back("the stream carried an error: " + excerpt(chunk["error"].dump()));
    if (chunk.contains("usage") && chunk["usage"].is_object()) read_usage(chunk["usage"], out);
    if (!chunk.contains("choices") || !chunk["choices"].is_array()) continue;
    for (const Json& choice : chunk["choices"]) {
      if (choice.value("index", 0) != 0) continue;
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
        out.finish_reason = choice["finish_reason"].get<std::string>();
      if (!choice.contains("delta") || !choice["delta"].is_object()) continue;
      out.has_message = true;
      const Json& delta = choice["delta"];
      read_text_fields(delta, out);
      if (!delta.contains("tool_calls") || !delta["tool_calls"].is_array()) continue;
      for (const Json& piece : delta["tool_calls"]) {
        const size_t index = size_t(piece.value("index", int64_t(out.tool_calls.size())));
        if (index > 1024) continue;
        if (index >= out.tool_calls.size()) out.tool_calls.resize(index + 1);
        ChatToolCall& call = out.tool_calls[index];
        if (piece.contains("id") && piece["id"].is_string()) call.id += piece["id"].get<std::string>();
        if (piece.contains("type") && piece["type"].is_string()) call.type = piece["type"].get<std::string>();
        if (piece.contains("function") && piece["function"].is_object()) {
          const Json& function = piece["function"];
          if (function.contains("name") && function["name"].is_string()) call.name += function["name"].get<std::string>();
          if (function.contains("arguments") && function["arguments"].is_string())
            call.arguments += function["arguments"].get<std::string>();
        }
      }
    }
  }
  // A stream that never sent content says nothing about null; treat it like the whole reply.
  if (out.content.empty() && !out.tool_calls.empty()) out.content_null = true;
  return out;
}

std::string quantization_from_name(const std::string& name) {
  const std::string text = lower(name);
  static const std::vector<std::pair<std::regex, std::string>> patterns = {
      {std::regex(R"(nvfp4)"), "nvfp4"},
      {std::regex(R"(mxfp4)"), "mxfp4"},
      {std::regex(R"(awq)"), "awq"},
      {std::regex(R"(gptq)"), "gptq"},
      {std::regex(R"(fp8)"), "fp8"},
      {std::regex(R"(int8|w8a8)"), "int8"},
      {std::regex(R"(int4|w4a16)"), "int4"},
      {std::regex(R"(\b(i?q[2-8]_[0-9a-z_]+)\b)"), ""},  // GGUF types: the match itself
      {std::regex(R"(bf16)"), "bf16"},
      {std::regex(R"(fp16|f16)"), "fp16"},
  };
  for (const auto& [pattern, label] : patterns) {
    std::smatch match;
    if (std::regex_search(text, match, pattern)) return label.empty() ? match.str(1) : label;
  }
  return "";
}

namespace {

// The quantization a local checkpoint declares: quantization_config.quant_method, else its dtype.
std::string quantization_from_dir(const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path config = fs::path(root) / "config.json";
  if (root.empty() || !fs::is_regular_file(config, ec)) return "";
  std::ifstream in(config);
  const Json json = Json::parse(in, nullptr, false);
  if (!json.is_object()) return "";
  if (json.contains("quantization_config") && json["quantization_config"].is_object()) {
    const Json& q = json["quantization_config"];
    if (q.contains("quant_method") && q["quant_method"].is_string()) return lower(q["quant_method"].get<std::string>());
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!json.contains(key) || !json[key].is_string()) continue;
    const std::string dtype = json[key].get<std::string>();
    if (dtype == "bfloat16") return "bf16";
    if (dtype == "float16") return "fp16";
    if (dtype == "float32") return "fp32";
    return dtype;
  }
  return "";
}

}  // namespace

ServerInfo probe_server(const OpenAiClient& client, const std::string& model) {
  ServerInfo info;
  const HttpReply models = client.get("/v1/models");
  if (!models.error.empty()) {
    info.error = models.error;
    return info;
  }
  info.reachable = true;
  std::string owned_by;
  if (models.ok() && models.json.is_object() && models.json.contains("data") && models.json["data"].is_array()) {
    for (const Json& card : models.json["data"]) {
      if (!card.is_object() || !card.contains("id") || !card["id"].is_string()) continue;
      const std::string id = card["id"].get<std::string>();
      info.model_ids.push_back(id);
      if (id == model || (model.empty() && info.model_card.is_null())) info.model_card = card;
    }
  } else {
    info.error = "/v1/models: " + models.describe();
  }
  if (info.model_card.is_object()) {
    const Json& card = info.model_card;
    owned_by = string_or_empty(card.value("owned_by", Json()));
    for (const char* key : {"max_model_len", "context_length", "max_context_length"})
      if (card.contains(key) && card[key].is_number_integer()) {
        info.max_model_len = card[key].get<int64_t>();
        break;
      }
    // llama.cpp puts the context size under meta.n_ctx_train and the served one elsewhere.
    if (client.url().loopback()) info.quantization = quantization_from_dir(string_or_empty(card.value("root", Json())));
  }
  if (info.quantization.empty()) info.quantization = quantization_from_name(model);

  std::string version;
  if (const HttpReply reply = client.get("/version"); reply.ok() && reply.json.is_object() && reply.json.contains("version"))
    version = reply.json["version"].is_string() ? reply.json["version"].get<std::string>() : reply.json["version"].dump();
  std::string name = owned_by;
  if (name == "llamacpp") name = "llama.cpp";
  if (name.empty() || name == "system" || name == "openai") {
    // llama.cpp answers /props; vLLM and anvil say who they are in owned_by.
    if (const HttpReply props = client.get("/props"); props.ok() && props.json.is_object() && props.json.contains("build_info"))
      name = "llama.cpp", version = string_or_empty(props.json["build_info"]);
  }
  info.engine = name.empty() ? version : (version.empty() ? name : name + " " + version);
  return info;
}

std::string excerpt(const std::string& text, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < max_chars; ++i) {
    const char c = text[i];
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += ' ';
    else out += c;
  }
  if (out.size() >= max_chars && text.size() > max_chars) {
    // Back off to a UTF-8 character boundary before the ellipsis.
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && (static_cast<unsigned char>(out.back()) & 0x80)) out.pop_back();
    out += "...";
  }
  return out;
}

}  // namespace anvil::tools
