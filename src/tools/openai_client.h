#pragma once
// A small client for OpenAI-compatible servers (anvil, vLLM, llama.cpp, SGLang): JSON requests,
// streamed SSE replies with the time each event arrived, and the pieces of a chat reply put back
// together the same way whether it came streamed or whole. preflight talks through this; bench
// has its own event loop (bench_loop.h) because it must keep thousands of requests in flight.
#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace anvil::tools {

using Json = nlohmann::json;

// A base URL split up. Both spellings users pass work: `http://host:8000` (vLLM's bench) and
// `http://host:8000/v1` (OpenAI clients); `prefix` keeps any path before /v1 (a gateway's route).
struct BaseUrl {
  std::string scheme = "http";
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string prefix;  // "" or "/some/route", never ending in '/'

  // scheme://host:port
  std::string origin() const;
  // prefix + path, path starting with '/': "/v1/models", "/metrics".
  std::string path(const std::string& p) const { return prefix + p; }
  bool loopback() const;
};
// Throws anvil::Error naming the URL when it cannot be read.
BaseUrl parse_base_url(const std::string& url);

struct HttpReply {
  int status = 0;           // 0: no HTTP answer (see error)
  std::string error;        // transport failure: refused, timed out, ...
  std::string body;
  Json json;                // parsed body, discarded when not JSON
  double seconds = 0;
  bool ok() const { return status == 200 && error.empty(); }
  // "HTTP 400: <error.message>" or the transport error: the reason a check shows.
  std::string describe() const;
};

// One SSE `data:` event, with the time it arrived (seconds since the request was sent).
struct SseEvent {
  double t = 0;
  std::string data;  // the payload after "data:" (e.g. a JSON chunk or "[DONE]")
  Json json;         // parsed payload, discarded when not JSON
};

struct StreamReply {
  int status = 0;
  std::string error;  // transport failure
  std::string body;   // the whole body as received (kept for error replies and diagnostics)
  std::vector<SseEvent> events;
  bool done = false;       // a `data: [DONE]` arrived
  bool all_json = true;    // every event but [DONE] parsed as JSON
  double seconds = 0;
  bool ok() const { return status == 200 && error.empty(); }
  std::string describe() const;
};

// Splits an SSE byte stream into events as it arrives. Handles \n and \r\n line ends, comment
// lines (": ping") and multi-line data fields (joined with '\n').
class SseParser {
 public:
  // Feeds bytes; calls on_data(payload) for every complete event with a data field.
  void feed(const char* data, size_t size, const std::function<void(std::string&&)>& on_data);
  // Whatever is left when the stream ends without a blank line: one last event.
  void finish(const std::function<void(std::string&&)>& on_data);

 private:
  void dispatch(const std::function<void(std::string&&)>& on_data);
  std::string line_, data_;
  bool has_data_ = false, last_cr_ = false;
};

class OpenAiClient {
 public:
  explicit OpenAiClient(const std::string& base_url, std::string api_key = {}, double timeout_s = 600);

  const BaseUrl& url() const { return url_; }
  HttpReply get(const std::string& path) const;
  HttpReply post(const std::string& path, const Json& body) const;
  // POSTs body (its "stream" field is the caller's business) and reads the reply as SSE;
  // on_event, when given, sees each event as it arrives.
  StreamReply post_stream(const std::string& path, const Json& body,
                          const std::function<void(const SseEvent&)>& on_event = {}) const;

 private:
  BaseUrl url_;
  std::string api_key_;
  double timeout_s_;
};

// A chat completion's first choice, from a whole reply or from streamed chunks: the reasoning
// field may be `reasoning_content`, `reasoning` or `thinking`, and tool calls arrive in pieces.
struct ChatToolCall {
  std::string id, type, name, arguments;
};
struct ChatResult {
  bool has_message = false;     // a choice was there at all
  std::string content;
  bool content_null = false;    // "content": null (as with tool calls)
  std::string reasoning;
  std::string reasoning_field;  // which field carried it
  std::vector<ChatToolCall> tool_calls;
  std::string finish_reason;
  std::optional<int64_t> prompt_tokens, completion_tokens, total_tokens;
  std::vector<std::string> problems;  // shape problems found while reading (for protocol checks)
};
ChatResult chat_result_from_reply(const Json& reply);
ChatResult chat_result_from_stream(const StreamReply& stream);

// What a server says about itself, for the notebook: engine name and version, and what the model
// card says (max_model_len, the checkpoint's quantization when the server points at a local dir).
struct ServerInfo {
  bool reachable = false;
  std::string error;
  std::vector<std::string> model_ids;
  std::string engine;       // "anvil 0.1.0", "vllm 0.11.0", "llama.cpp", ... ("" when unknown)
  std::optional<int64_t> max_model_len;
  std::string quantization;  // from the model's config.json when readable, else the model name
  Json model_card;
};
ServerInfo probe_server(const OpenAiClient& client, const std::string& model);

// A guess at the quantization from a model name ("Qwen3-32B-AWQ" -> "awq"), "" when none shows.
std::string quantization_from_name(const std::string& name);

// The first `max_chars` bytes of text on one line, for messages (cut on a UTF-8 boundary).
std::string excerpt(const std::string& text, size_t max_chars = 80);

}  // namespace anvil::tools
