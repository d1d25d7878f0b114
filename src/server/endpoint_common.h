#pragma once
// What the chat and text-completion endpoints share: the model-name check, vLLM's max_tokens
// rule, engine parameters from request options, and driving a job to a JSON body or an SSE stream.
#include <httplib.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/chat_format.h"
#include "server/generation_job.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/served_model.h"

namespace anvil::server {

struct EndpointContext {
  const ServerConfig& config;
  ServerMetrics& metrics;
  std::shared_ptr<ServedModel> model;  // loaded
  const std::atomic<bool>& stopping;
  std::atomic<int>& open_streams;  // lets shutdown wait for streams to end cleanly
  std::function<bool()> client_gone;  // true once the client closed its connection
  const std::string& response_model() const { return config.served_model_names.front(); }
};

// 404 unless `requested` is empty or one of the served names.
void check_model_name(const ServerConfig& config, const std::string& requested);
void log_ignored_fields(const GenerationOptions& options, const char* endpoint);

// vLLM's rule: the prompt must leave room for at least one token; max_tokens (or, when unset,
// `default_max`, or else the rest of the context) is capped at what the context has left.
int64_t resolve_max_tokens(const GenerationOptions& options, int64_t prompt_length, int64_t max_model_len,
                           std::optional<int64_t> default_max, const std::string& what);
// 400 for an id outside the model's vocabulary.
void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab_size, const std::string& param);

// Engine parameters for sample `sample` (0-based) of one prompt; the constraint comes fresh from
// the factory, since constraints follow one sequence each.
RequestParams make_params(const GenerationOptions& options, const ServedModel& model, const std::vector<int32_t>& prompt,
                          int64_t max_tokens, int64_t sample, const std::vector<int32_t>& format_stop_ids,
                          const ConstraintFactory& constraint);
void check_sampling(const RequestParams& params);

// Blocks until every choice finished; ApiError 503 when the server stops first. A client that
// closes its connection meanwhile has the job cancelled, so its sequences leave the engine at the
// next step, and gets ApiError 499 (nginx's "client closed request", for the log).
void run_to_completion(GenerationJob& job, const EndpointContext& context);

struct StreamFormatter {
  std::function<std::string(const std::vector<ChoiceUpdate>&)> updates;  // SSE text for some updates
  std::function<std::string()> end;  // chunks after the last update (usage), before [DONE]
};
// Answers with an SSE stream fed by the job. A client that goes away (a failed write) cancels
// the job, so its sequences leave the engine at the next step.
// When the server stops, open streams end with an error event and [DONE] before it closes.
void stream_response(httplib::Response& res, std::shared_ptr<GenerationJob> job, StreamFormatter formatter,
                     EndpointContext& context);

}  // namespace anvil::server
