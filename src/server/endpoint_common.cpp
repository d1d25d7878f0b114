#include "server/endpoint_common.h"

#include <algorithm>

#include "core/error.h"
#include "server/log.h"
#include "server/sse.h"

namespace anvil::server {

void check_model_name(const ServerConfig& config, const std::string& requested) {
  if (requested.empty()) return;
  const auto& names = config.served_model_names;
  if (std::find(names.begin(), names.end(), requested) == names.end())
    throw ApiError(404, "The model `" + requested + "` does not exist.", "model");
}

void log_ignored_fields(const GenerationOptions& options, const char* endpoint) {
  if (options.ignored_fields.empty()) return;
  std::string keys;
  for (const std::string& key : options.ignored_fields) keys += (keys.empty() ? "" : ", ") + key;
  log_warning("{}: ignoring unknown request fields: {}", endpoint, keys);
}

int64_t resolve_max_tokens(const GenerationOptions& options, int64_t prompt_length, int64_t max_model_len,
                           std::optional<int64_t> default_max, const std::string& what) {
  if (prompt_length >= max_model_len)
    bad_request(what,
                "This model's maximum context length is {} tokens. However, your request has {} input tokens "
                "({} in the {}), which leaves no room for the completion. Please reduce the length of the {}.",
                max_model_len, prompt_length, prompt_length, what, what);
  const int64_t room = max_model_len - prompt_length;
  std::optional<int64_t> wanted = options.max_tokens ? options.max_tokens : default_max;
  return wanted ? std::min(*wanted, room) : room;
}

void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& param) {
  for (const int32_t id : ids)
    if (id < 0 || id >= vocab_size) bad_request(param, "token id {} is outside the vocabulary (size {})", id, vocab_size);
}

RequestParams make_params(const GenerationOptions& options, const ServedModel& model, const std::vector<int32_t>& prompt,
                          int64_t max_tokens, int64_t sample, const std::vector<int32_t>& format_stop_ids,
                          const ConstraintFactory& constraint) {
  const GenerationConfig& defaults = model.generation;
  RequestParams params;
  params.prompt_ids = prompt;
  double temperature = options.temperature.value_or(defaults.temperature.value_or(1.0));
  if (temperature < 1e-5) temperature = 0.0;  // vLLM: below this, greedy
  params.sampling.temperature = float(temperature);
  params.sampling.top_p = float(options.top_p.value_or(defaults.top_p.value_or(1.0)));
  params.sampling.top_k = options.top_k.value_or(defaults.top_k.value_or(0));
  params.sampling.min_p = float(options.min_p.value_or(defaults.min_p.value_or(0.0)));
  // n > 1 with a seed: sample i draws from seed + i, as vLLM's child requests do.
  if (options.seed) params.sampling.seed = *options.seed + uint64_t(sample);
  params.max_tokens = max_tokens;
  params.min_tokens = std::min(options.min_tokens, max_tokens);
  params.ignore_eos = options.ignore_eos;
  params.eos_token_ids = model.eos_ids;
  // ignore_eos also passes the chat format's end-of-turn ids, so a request (a benchmark's) for N
  // tokens gets N. vLLM does so for ChatML's <|im_end|> (Qwen's generation_config lists it as EOS)
  // but keeps harmony's <|return|> and <|call|> as stop ids; llama.cpp never samples any
  // end-of-generation token then. One rule for both formats here. Ids the client names still stop.
  if (!options.ignore_eos) params.stop_token_ids = format_stop_ids;
  for (const int32_t id : options.stop_token_ids)
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) == params.stop_token_ids.end())
      params.stop_token_ids.push_back(id);
  params.presence_penalty = float(options.presence_penalty);
  params.frequency_penalty = float(options.frequency_penalty);
  params.repetition_penalty = float(options.repetition_penalty);
  params.top_logprobs = options.top_logprobs;
  if (constraint) params.constraint = constraint();
  return params;
}

void check_sampling(const RequestParams& params) {
  try {
    params.sampling.validate();
  } catch (const Error& error) {
    bad_request("", "{}", error.what());
  }
}

void run_to_completion(GenerationJob& job, const EndpointContext& context) {
  // Outputs wake the wait at every step; the socket is looked at no more often than this.
  constexpr auto kCheckEvery = std::chrono::milliseconds(100);
  Clock::time_point checked = Clock::now();
  while (!job.done()) {
    if (context.stopping.load()) {
      job.cancel();
      throw ApiError(503, "the server is shutting down");
    }
    if (const Clock::time_point now = Clock::now(); now - checked >= kCheckEvery) {
      checked = now;
      if (context.client_gone && context.client_gone()) {
        job.cancel();
        log_info("the client closed its connection; request cancelled");
        throw ApiError(499, "the client closed the connection");
      }
    }
    job.wait(kCheckEvery);
  }
}

namespace {

struct StreamState {
  std::shared_ptr<GenerationJob> job;
  StreamFormatter formatter;
  const std::atomic<bool>* stopping;
  std::function<bool()> client_gone;
  bool ended = false;
  Clock::time_point last_write = Clock::now();
};

// One turn of httplib's provider loop: wait a little for outputs, write what they became.
// Returning false tells httplib the stream is broken; it then calls the releaser.
bool pump(StreamState& state, httplib::DataSink& sink) {
  if (state.ended) {
    sink.done();
    return true;
  }
  // A write fails only once the client is gone and something is written: a stream still queued
  // behind others writes nothing but a ping every few seconds, so the socket is asked directly.
  if (state.client_gone && state.client_gone()) {
    state.job->cancel();
    return false;
  }
  std::string out;
  if (state.stopping->load()) {
    state.job->cancel();
    out = sse_data(error_body(503, "the server is shutting down")) + kSseDone;
    state.ended = true;
  } else {
    // Short waits keep shutdown prompt: a stopping server hears back within a quarter second.
    const std::vector<ChoiceUpdate> updates = state.job->wait(std::chrono::milliseconds(250));
    if (!updates.empty()) out = state.formatter.updates(updates);
    if (state.job->done()) {
      out += state.formatter.end();
      out += kSseDone;
      state.ended = true;
    }
  }
  const Clock::time_point now = Clock::now();
  if (out.empty() && now - state.last_write > std::chrono::seconds(3)) out = kSsePing;
  if (!out.empty()) {
    if (!sink.write(out.data(), out.size())) return false;
    state.last_write = now;
  }
  if (state.ended) sink.done();
  return true;
}

}  // namespace

void stream_response(httplib::Response& res, std::shared_ptr<GenerationJob> job, StreamFormatter formatter,
                     EndpointContext& context) {
  auto state = std::make_shared<StreamState>(
      StreamState{std::move(job), std::move(formatter), &context.stopping, context.client_gone});
  std::atomic<int>* open_streams = &context.open_streams;
  ++*open_streams;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) {
        try {
          return pump(*state, sink);
        } catch (const std::exception& error) {
          log_error("stream failed: {}", error.what());
          state->job->cancel();
          return false;
        }
      },
      [state, open_streams](bool success) {
        if (!success) state->job->cancel();
        --*open_streams;
      });
}

}  // namespace anvil::server
