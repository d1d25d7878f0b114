// POST /v1/completions.
#include "server/endpoints.h"

#include "server/openai_responses.h"
#include "server/sse.h"

namespace anvil::server {

namespace {

struct CompletionStream {
  std::shared_ptr<ServedModel> model;
  std::shared_ptr<GenerationJob> job;
  std::string id, model_name;
  int64_t created = 0;
  bool logprobs = false, include_usage = false, continuous_usage = false, token_ids = false;
  LogprobFormat logprob_format;
  std::vector<size_t> text_offsets;

  Json chunk(Json choices) const {
    Json out = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model_name},
                {"choices", std::move(choices)}};
    if (continuous_usage) out["usage"] = usage_json(job->prompt_tokens(), job->completion_tokens(), job->cached_prompt_tokens());
    return out;
  }

  std::string on_updates(const std::vector<ChoiceUpdate>& updates) {
    std::string out;
    for (const ChoiceUpdate& update : updates) {
      if (!update.error.empty()) out += sse_data(error_body(500, update.error));
      if (update.text.empty() && !update.finished && update.tokens.empty()) continue;
      Json choice = {{"index", update.index}, {"text", update.text}, {"logprobs", nullptr}, {"finish_reason", nullptr},
                     {"stop_reason", nullptr}};
      if (logprobs) {
        choice["logprobs"] = completion_logprobs(update.tokens, logprob_format, text_offsets[update.index]);
        text_offsets[update.index] += update.text.size();
      }
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

}  // namespace

void handle_completions(EndpointContext& context, const std::string& http_body, httplib::Response& res) {
  const CompletionRequest request = parse_completion_request(parse_request_body(http_body));
  check_model_name(context.config, request.options.model);
  log_ignored_fields(request.options, "/v1/completions");
  const ServedModel& model = *context.model;
  const GenerationOptions& options = request.options;
  const Tokenizer* tokenizer = model.tokenizer.get();
  if (!tokenizer && !options.stop.empty())
    bad_request("stop", "stop strings need text, and this model has no tokenizer.json");

  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    const CompletionPrompt& prompt = request.prompts[p];
    const std::string param = request.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(p) + "]";
    if (prompt.is_text) {
      if (!tokenizer) bad_request(param, "this model has no tokenizer.json; send the prompt as token ids");
      prompts.push_back(tokenizer->encode(prompt.text, /*allow_special=*/true));
      if (prompts.back().empty()) bad_request(param, "the prompt encodes to no tokens");
    } else {
      prompts.push_back(prompt.ids);
      check_token_ids(prompt.ids, model.vocab_size, param);
    }
    lengths.push_back(int64_t(prompts.back().size()));
  }
  check_token_ids(options.stop_token_ids, model.vocab_size, "stop_token_ids");
  ConstraintFactory constraint;
  if (options.structured.kind != StructuredOutput::Kind::None) {
    if (!tokenizer) bad_request(options.structured.param, "structured output needs this model's tokenizer.json");
    constraint = json_constraint(options.structured, *tokenizer);
  }

  std::vector<ChoiceSetup> setups;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string what = request.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(p) + "]";
    const int64_t max_tokens = resolve_max_tokens(options, lengths[p], model.max_model_len, 16, what);
    for (int64_t i = 0; i < options.n; ++i) {
      setups.push_back({p, make_params(options, model, prompts[p], max_tokens, i, {}, constraint)});
      check_sampling(setups.back().params);
    }
  }
  OutputOptions output;
  output.tokenizer = tokenizer;
  output.stop = options.stop;
  output.include_stop_str = options.include_stop_str_in_output;
  output.skip_special_tokens = options.skip_special_tokens;
  output.stop_token_ids = options.stop_token_ids;
  auto job = std::make_shared<GenerationJob>(*model.engine, context.metrics, std::move(output));
  job->start(std::move(setups), lengths);
  const LogprobFormat logprob_format{tokenizer, options.tokens_as_ids};
  const bool logprobs = options.top_logprobs >= 0;

  if (!options.stream) {
    run_to_completion(*job, context);
    Json choices = Json::array();
    for (size_t i = 0; i < job->num_choices(); ++i) {
      const ChoiceResult& result = job->result(i);
      if (!result.error.empty()) throw ApiError(500, result.error);
      Json choice = {{"index", i},
                     {"text", result.text},
                     {"logprobs", logprobs ? completion_logprobs(result.tokens, logprob_format, 0) : Json(nullptr)},
                     {"finish_reason", result.finish_reason},
                     {"stop_reason", result.stop_reason},
                     {"prompt_logprobs", nullptr}};
      if (options.return_token_ids) {
        Json ids = Json::array();
        for (const GeneratedToken& token : result.tokens) ids.push_back(token.token);
        choice["token_ids"] = std::move(ids);
        choice["prompt_token_ids"] = prompts[i / size_t(options.n)];
      }
      choices.push_back(std::move(choice));
    }
    const Json response = {{"id", make_response_id("cmpl-")},
                           {"object", "text_completion"},
                           {"created", unix_time()},
                           {"model", context.response_model()},
                           {"choices", std::move(choices)},
                           {"usage", usage_json(job->prompt_tokens(), job->completion_tokens(), job->cached_prompt_tokens())}};
    res.set_content(dump_json(response), "application/json");
    return;
  }
  auto stream = std::make_shared<CompletionStream>();
  stream->model = context.model;
  stream->job = job;
  stream->id = make_response_id("cmpl-");
  stream->model_name = context.response_model();
  stream->created = unix_time();
  stream->logprobs = logprobs;
  stream->include_usage = options.include_usage;
  stream->continuous_usage = options.include_usage && options.continuous_usage_stats;
  stream->token_ids = options.return_token_ids;
  stream->logprob_format = logprob_format;
  stream->text_offsets.assign(job->num_choices(), 0);
  stream_response(res, job,
                  {[stream](const std::vector<ChoiceUpdate>& updates) { return stream->on_updates(updates); },
                   [stream] { return stream->on_end(); }},
                  context);
}

}  // namespace anvil::server
