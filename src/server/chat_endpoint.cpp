// POST /v1/chat/completions.
#include "server/endpoints.h"

#include "server/openai_responses.h"
#include "server/sse.h"

namespace anvil::server {

namespace {

struct ChatStream {
  std::shared_ptr<ServedModel> model;  // keeps the engine and tokenizer alive while streaming
  std::shared_ptr<GenerationJob> job;
  std::string id, model_name;
  int64_t created = 0;
  bool logprobs = false, include_usage = false, continuous_usage = false, token_ids = false;
  LogprobFormat logprob_format;
  bool started = false;

  Json chunk(Json choices) const {
    Json out = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model_name},
                {"choices", std::move(choices)}};
    if (continuous_usage) out["usage"] = usage_json(job->prompt_tokens(), job->completion_tokens(), job->cached_prompt_tokens());
    return out;
  }

  std::string on_updates(const std::vector<ChoiceUpdate>& updates) {
    std::string out;
    if (!started) {
      // vLLM opens every choice with the assistant role before any text.
      started = true;
      Json choices = Json::array();
      for (size_t i = 0; i < job->num_choices(); ++i)
        choices.push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      out += sse_data(chunk(std::move(choices)));
    }
    for (const ChoiceUpdate& update : updates) {
      if (!update.error.empty()) out += sse_data(error_body(500, update.error));
      Json delta = chat_delta_json(update);
      // Tokens that add no text yet (a held-back tag, a header) still reach clients that asked
      // for their ids or logprobs.
      if (delta.empty() && !update.finished && !((logprobs || token_ids) && !update.tokens.empty())) continue;
      Json choice = {{"index", update.index}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (logprobs) choice["logprobs"] = chat_logprobs(update.tokens, logprob_format);
      if (token_ids) {
        Json ids = Json::array();
        for (const GeneratedToken& token : update.tokens) ids.push_back(token.token);
        choice["token_ids"] = std::move(ids);
      }
      if (update.finished) {
        choice["finish_reason"] = update.finish_reason;
        choice["stop_reason"] = update.stop_reason;
      }
      out += sse_data(chunk(Json::array({std::move(choice)})));
    }
    return out;
  }

  std::string on_end() const {
    if (!include_usage) return {};
    Json last = chunk(Json::array());
    last["usage"] = usage_json(job->prompt_tokens(), job->completion_tokens(), job->cached_prompt_tokens());
    return sse_data(last);
  }
};

Json chat_response(const ChatRequest& request, const GenerationJob& job, const std::string& model_name,
                   const LogprobFormat& format, const std::vector<int32_t>& prompt_ids) {
  Json choices = Json::array();
  for (size_t i = 0; i < job.num_choices(); ++i) {
    const ChoiceResult& result = job.result(i);
    if (!result.error.empty()) throw ApiError(500, result.error);
    Json choice = {{"index", i},
                   {"message", chat_message_json(result)},
                   {"logprobs", request.logprobs ? chat_logprobs(result.tokens, format) : Json(nullptr)},
                   {"finish_reason", result.finish_reason},
                   {"stop_reason", result.stop_reason}};
    if (request.options.return_token_ids) {
      Json ids = Json::array();
      for (const GeneratedToken& token : result.tokens) ids.push_back(token.token);
      choice["token_ids"] = std::move(ids);
    }
    choices.push_back(std::move(choice));
  }
  Json response = {{"id", make_response_id("chatcmpl-")},
                   {"object", "chat.completion"},
                   {"created", unix_time()},
                   {"model", model_name},
                   {"choices", std::move(choices)},
                   {"usage", usage_json(job.prompt_tokens(), job.completion_tokens(), job.cached_prompt_tokens())}};
  if (request.options.return_token_ids) response["prompt_token_ids"] = prompt_ids;
  return response;
}

}  // namespace

void handle_chat_completions(EndpointContext& context, const std::string& http_body, httplib::Response& res) {
  const ChatRequest request = parse_chat_request(parse_request_body(http_body));
  check_model_name(context.config, request.options.model);
  log_ignored_fields(request.options, "/v1/chat/completions");
  const ServedModel& model = *context.model;
  const GenerationOptions& options = request.options;

  const RenderedPrompt prompt = model.chat->render(request);
  const int64_t max_tokens = resolve_max_tokens(options, int64_t(prompt.ids.size()), model.max_model_len, std::nullopt, "messages");
  check_token_ids(options.stop_token_ids, model.vocab_size, "stop_token_ids");
  const ConstraintFactory constraint = model.chat->constraint(request, prompt);

  std::vector<ChoiceSetup> setups;
  for (int64_t i = 0; i < options.n; ++i) {
    setups.push_back({0, make_params(options, model, prompt.ids, max_tokens, i, model.chat->stop_token_ids(), constraint)});
    check_sampling(setups.back().params);
  }
  OutputOptions output;
  output.tokenizer = model.tokenizer.get();
  const ChatFormat* format = model.chat.get();
  output.make_parser = [format, prompt] { return format->make_parser(prompt); };
  output.stop = options.stop;
  output.include_stop_str = options.include_stop_str_in_output;
  output.skip_special_tokens = options.skip_special_tokens;
  output.include_reasoning = request.include_reasoning;
  output.parallel_tool_calls = request.parallel_tool_calls;
  output.stop_token_ids = options.stop_token_ids;

  auto job = std::make_shared<GenerationJob>(*model.engine, context.metrics, std::move(output));
  job->start(std::move(setups), {int64_t(prompt.ids.size())});
  const LogprobFormat logprob_format{model.tokenizer.get(), options.tokens_as_ids};

  if (!options.stream) {
    run_to_completion(*job, context);
    res.set_content(dump_json(chat_response(request, *job, context.response_model(), logprob_format, prompt.ids)),
                    "application/json");
    return;
  }
  auto stream = std::make_shared<ChatStream>();
  stream->model = context.model;
  stream->job = job;
  stream->id = make_response_id("chatcmpl-");
  stream->model_name = context.response_model();
  stream->created = unix_time();
  stream->logprobs = request.logprobs;
  stream->include_usage = options.include_usage;
  stream->continuous_usage = options.include_usage && options.continuous_usage_stats;
  stream->token_ids = options.return_token_ids;
  stream->logprob_format = logprob_format;
  stream_response(res, job,
                  {[stream](const std::vector<ChoiceUpdate>& updates) { return stream->on_updates(updates); },
                   [stream] { return stream->on_end(); }},
                  context);
}

}  // namespace anvil::server
