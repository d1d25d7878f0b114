#pragma once
// One HTTP request's work in the engine: one engine request per choice (prompts x n), their
// outputs carried from the engine thread to the handler thread, and there turned into text:
// detokenized or parsed by the chat format, cut at stop strings, counted for usage and metrics.
// The engine callback only queues; all decoding runs on the handler's thread.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "formats/chat.h"
#include "formats/tokenizer.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/stop_matcher.h"

namespace anvil::server {

using Clock = std::chrono::steady_clock;

struct OutputOptions {
  const Tokenizer* tokenizer = nullptr;  // null: token ids only, no text
  // Chat: makes each choice's output parser; empty for text completions.
  std::function<std::unique_ptr<ChatOutputParser>()> make_parser;
  std::vector<std::string> stop;
  bool include_stop_str = false;
  bool skip_special_tokens = true;
  bool include_reasoning = true;
  bool parallel_tool_calls = true;
  std::vector<int32_t> stop_token_ids;  // the client's own, reported as stop_reason
};

struct ChoiceSetup {
  size_t prompt_index = 0;
  RequestParams params;
};

// What one choice gained since the last wait().
struct ChoiceUpdate {
  size_t index = 0;
  std::string text;       // completions: text; chat: content
  std::string reasoning;  // chat
  std::vector<ToolCallDelta> tool_calls;
  std::vector<GeneratedToken> tokens;
  bool finished = false;
  std::string finish_reason;
  Json stop_reason;  // null, the stop string, or the client's stop token id
  std::string error;
};

// A choice's whole output, accumulated as updates are made.
struct ChoiceResult {
  std::string text, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<GeneratedToken> tokens;
  bool finished = false;
  std::string finish_reason;
  Json stop_reason;
  std::string error;
};

class GenerationJob {
 public:
  GenerationJob(Engine& engine, ServerMetrics& metrics, OutputOptions options);
  ~GenerationJob();  // cancels every choice still running, so its KV blocks free at the next step
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  // Submits every choice; ApiError 400 (engine refused the request) or 503 (queue full).
  void start(std::vector<ChoiceSetup> choices, std::vector<int64_t> prompt_lengths);
  // Blocks until outputs arrive or the timeout passes; one merged update per choice that moved.
  std::vector<ChoiceUpdate> wait(std::chrono::milliseconds timeout);
  bool done() const;
  void cancel();

  size_t num_choices() const { return choices_.size(); }
  const ChoiceResult& result(size_t index) const { return choices_[index].result; }
  int64_t prompt_tokens() const;
  int64_t cached_prompt_tokens() const;
  int64_t completion_tokens() const;

 private:
  struct Item {
    size_t choice;
    RequestOutput output;
    Clock::time_point at;
  };
  struct Channel {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<Item> items;
  };
  struct Choice {
    size_t prompt_index = 0;
    uint64_t engine_id = 0;
    bool submitted = false, engine_finished = false;
    std::unique_ptr<ChatOutputParser> parser;
    std::unique_ptr<StreamDecoder> decoder;
    StopMatcher stop;
    int64_t cached_prompt_tokens = 0;
    Clock::time_point last_token_at;
    double ttft = -1.0;
    std::vector<double> gaps;
    ChoiceResult result;
  };

  void process(Choice& choice, ChoiceUpdate& update, const Item& item);
  void emit_chat(Choice& choice, ChoiceUpdate& update, const ChatDelta& delta);
  void emit_text(Choice& choice, ChoiceUpdate& update, const std::string& text);
  void finish(Choice& choice, ChoiceUpdate& update, const std::string& reason, Json stop_reason, Clock::time_point at);

  Engine& engine_;
  ServerMetrics& metrics_;
  OutputOptions options_;
  std::shared_ptr<Channel> channel_ = std::make_shared<Channel>();
  std::vector<Choice> choices_;
  std::vector<int64_t> prompt_lengths_;
  Clock::time_point arrival_ = Clock::now();
};

}  // namespace anvil::server
