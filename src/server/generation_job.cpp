#include "server/generation_job.h"

#include <algorithm>

#include "core/error.h"

namespace anvil::server {

GenerationJob::GenerationJob(Engine& engine, ServerMetrics& metrics, OutputOptions options)
    : engine_(engine), metrics_(metrics), options_(std::move(options)) {}

GenerationJob::~GenerationJob() { cancel(); }

void GenerationJob::cancel() {
  for (Choice& choice : choices_)
    if (choice.submitted && !choice.engine_finished) engine_.cancel(choice.engine_id);
}

void GenerationJob::start(std::vector<ChoiceSetup> setups, std::vector<int64_t> prompt_lengths) {
  // All of a request's sequences queue before any runs, so more of them than the queue holds
  // could never be admitted: a 503 would have the client retry forever.
  const int64_t queue_bound = engine_.config().max_waiting;
  if (int64_t(setups.size()) > queue_bound)
    throw ApiError(400,
                   fmt::format("this request asks for {} sequences (prompts x n), more than the {} the server queues "
                               "at once (--max-queued-requests)",
                               setups.size(), queue_bound),
                   "n");
  prompt_lengths_ = std::move(prompt_lengths);
  choices_.resize(setups.size());
  for (size_t i = 0; i < setups.size(); ++i) {
    Choice& choice = choices_[i];
    choice.prompt_index = setups[i].prompt_index;
    if (options_.make_parser) choice.parser = options_.make_parser();
    else if (options_.tokenizer) choice.decoder = std::make_unique<StreamDecoder>(*options_.tokenizer, options_.skip_special_tokens);
    choice.stop = StopMatcher(options_.stop, options_.include_stop_str);
  }
  for (size_t i = 0; i < setups.size(); ++i) {
    // The callback holds the channel, not the job: outputs that arrive after the handler has gone
    // (a cancelled request's last words) land in a queue nobody reads.
    std::shared_ptr<Channel> channel = channel_;
    OutputCallback callback = [channel, i](const RequestOutput& output) {
      const Clock::time_point now = Clock::now();
      {
        const std::lock_guard lock(channel->mutex);
        channel->items.push_back(Item{i, output, now});
      }
      channel->ready.notify_one();
    };
    try {
      choices_[i].engine_id = engine_.submit(std::move(setups[i].params), std::move(callback));
      choices_[i].submitted = true;
    } catch (const QueueFullError& error) {
      cancel();
      throw ApiError(503, std::string("the server is busy: ") + error.what());
    } catch (const Error& error) {
      cancel();
      throw ApiError(400, error.what());
    }
  }
}

bool GenerationJob::done() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.result.finished; });
}

std::vector<ChoiceUpdate> GenerationJob::wait(std::chrono::milliseconds timeout) {
  std::deque<Item> items;
  {
    std::unique_lock lock(channel_->mutex);
    channel_->ready.wait_for(lock, timeout, [&] { return !channel_->items.empty(); });
    items.swap(channel_->items);
  }
  std::vector<ChoiceUpdate> updates;
  std::vector<size_t> slot(choices_.size(), SIZE_MAX);
  for (const Item& item : items) {
    Choice& choice = choices_[item.choice];
    if (item.output.finished) choice.engine_finished = true;
    if (choice.result.finished) continue;
    if (slot[item.choice] == SIZE_MAX) {
      slot[item.choice] = updates.size();
      updates.emplace_back().index = item.choice;
    }
    process(choice, updates[slot[item.choice]], item);
  }
  return updates;
}

void GenerationJob::process(Choice& choice, ChoiceUpdate& update, const Item& item) {
  const RequestOutput& output = item.output;
  choice.cached_prompt_tokens = std::max(choice.cached_prompt_tokens, output.cached_prompt_tokens);
  for (size_t t = 0; t < output.tokens.size() && !choice.result.finished; ++t) {
    const GeneratedToken& token = output.tokens[t];
    if (choice.ttft < 0) {
      choice.ttft = std::chrono::duration<double>(item.at - arrival_).count();
    } else {
      choice.gaps.push_back(std::chrono::duration<double>(item.at - choice.last_token_at).count());
    }
    choice.last_token_at = item.at;
    choice.result.tokens.push_back(token);
    update.tokens.push_back(token);
    // The token that ended the request (EOS or a stop id) is counted but never shown, as vLLM does.
    const bool ending = output.finished && output.stop_token && *output.stop_token == token.token &&
                        t + 1 == output.tokens.size();
    if (ending) break;
    // Ids past the tokenizer's vocabulary (padding rows of the embedding) have no text.
    if (!options_.tokenizer || token.token < 0 || token.token >= options_.tokenizer->vocab_size()) continue;
    if (choice.parser) {
      emit_chat(choice, update, choice.parser->push(token.token));
    } else if (choice.decoder) {
      emit_text(choice, update, choice.decoder->push(token.token));
    }
    if (choice.stop.matched()) {
      engine_.cancel(choice.engine_id);
      finish(choice, update, "stop", choice.stop.stop(), item.at);
    }
  }
  if (!output.finished || choice.result.finished) return;

  if (choice.parser) emit_chat(choice, update, choice.parser->finish());
  else if (choice.decoder) emit_text(choice, update, choice.decoder->finish());
  if (choice.stop.matched()) {
    finish(choice, update, "stop", choice.stop.stop(), item.at);
    return;
  }
  const std::string rest = choice.stop.flush();
  if (!rest.empty()) {
    update.text += rest;
    choice.result.text += rest;
  }
  Json stop_reason = nullptr;
  if (output.stop_token &&
      std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(), *output.stop_token) != options_.stop_token_ids.end())
    stop_reason = *output.stop_token;
  if (output.finish_reason == "error") {
    update.error = choice.result.error = output.error.empty() ? "the engine failed this request" : output.error;
  }
  std::string reason = output.finish_reason;
  if (reason == "stop" && !choice.result.tool_calls.empty()) reason = "tool_calls";
  finish(choice, update, reason, stop_reason, item.at);
}

void GenerationJob::emit_text(Choice& choice, ChoiceUpdate& update, const std::string& text) {
  const std::string out = choice.stop.push(text);
  update.text += out;
  choice.result.text += out;
}

// Stop strings are looked for in content only: reasoning (and tool-call text) never reaches the
// stop matcher. They delimit the answer; a model that thinks the word must still get to answer.
// vLLM means the same: a stop string firing inside reasoning was reported as a bug (vllm#14399)
// and skipped until reasoning ends (vllm#14550); its V1 detokenizer matching over the whole text
// is reported again as a bug (vllm#38499, vllm#52393). Cutting a tool call would leave invalid JSON.
void GenerationJob::emit_chat(Choice& choice, ChoiceUpdate& update, const ChatDelta& delta) {
  if (options_.include_reasoning && !delta.reasoning.empty()) {
    update.reasoning += delta.reasoning;
    choice.result.reasoning += delta.reasoning;
  }
  if (!delta.content.empty()) emit_text(choice, update, delta.content);
  for (const ToolCallDelta& call : delta.tool_calls) {
    if (!options_.parallel_tool_calls && call.index > 0) continue;
    if (call.index >= choice.result.tool_calls.size()) choice.result.tool_calls.resize(call.index + 1);
    ToolCall& total = choice.result.tool_calls[call.index];
    if (!call.id.empty()) total.id = call.id;
    if (!call.name.empty()) total.name = call.name;
    total.arguments_json += call.arguments;
    if (!update.tool_calls.empty() && update.tool_calls.back().index == call.index && call.id.empty()) {
      update.tool_calls.back().arguments += call.arguments;
    } else {
      update.tool_calls.push_back(call);
    }
  }
}

void GenerationJob::finish(Choice& choice, ChoiceUpdate& update, const std::string& reason, Json stop_reason,
                           Clock::time_point at) {
  choice.result.finished = update.finished = true;
  choice.result.finish_reason = update.finish_reason = reason;
  choice.result.stop_reason = update.stop_reason = std::move(stop_reason);
  const double e2e = std::chrono::duration<double>(at - arrival_).count();
  metrics_.observe_request(choice.ttft, choice.gaps, e2e, reason == "tool_calls" ? "stop" : reason);
}

int64_t GenerationJob::prompt_tokens() const {
  int64_t total = 0;
  for (const int64_t length : prompt_lengths_) total += length;
  return total;
}

int64_t GenerationJob::cached_prompt_tokens() const {
  std::vector<int64_t> cached(prompt_lengths_.size(), 0);
  for (const Choice& choice : choices_)
    cached[choice.prompt_index] = std::max(cached[choice.prompt_index], choice.cached_prompt_tokens);
  int64_t total = 0;
  for (const int64_t c : cached) total += c;
  return total;
}

int64_t GenerationJob::completion_tokens() const {
  int64_t total = 0;
  for (const Choice& choice : choices_) total += int64_t(choice.result.tokens.size());
  return total;
}

}  // namespace anvil::server
