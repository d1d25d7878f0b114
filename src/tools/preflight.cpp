#include "tools/preflight.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "core/error.h"
#include "tools/json_schema_check.h"
#include "tools/openai_client.h"

namespace anvil::tools {

namespace {

using Clock = std::chrono::steady_clock;

// Text that must never reach a user: reasoning delimiters and chat-format tokens of Qwen/DeepSeek
// (<think>), harmony (gpt-oss) and ChatML, and the tool-call wrappers of Hermes-style parsers.
const char* const kMarkers[] = {"<think>",     "</think>",    "<|channel|>",  "<|message|>", "<|start|>",
                                "<|end|>",     "<|return|>",  "<|call|>",     "<|constrain|>", "<|im_start|>",
                                "<|im_end|>",  "<|endoftext|>", "<tool_call>", "</tool_call>"};

std::string find_marker(const std::string& text) {
  for (const char* marker : kMarkers)
    if (text.find(marker) != std::string::npos) return marker;
  return "";
}

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

bool is_protocol_check(const std::string& name) {
  return name != "smoke" && name != "needle" && name != "tool_arguments";
}

class Preflight {
 public:
  Preflight(const PreflightOptions& options, const PreflightLog& log)
      : o_(options), log_(log), client_(options.base_url, options.api_key, options.timeout_s) {
    rng_.seed(options.seed ? *options.seed : std::random_device{}());
  }

  PreflightReport run() {
    for (const std::string& name : o_.only)
      if (std::find(std::begin(kCheckNames), std::end(kCheckNames), name) == std::end(kCheckNames))
        fail("--checks {}: unknown check (known: models, smoke, structured_json, needle, tool_calls, tool_arguments, "
             "reasoning, stop_finish, stream_equivalence)",
             name);
    report_.base_url = client_.url().origin() + client_.url().prefix;
    model_ = o_.model;
    info_ = probe_server(client_, model_);
    if (model_.empty() && !info_.model_ids.empty()) {
      model_ = info_.model_ids.front();
      info_ = probe_server(client_, model_);
    }
    if (!info_.reachable || model_.empty()) {
      // Nothing else can run; the report still says why, in the same shape.
      CheckResult r;
      r.name = "models";
      r.reason = !info_.reachable ? "the server cannot be reached" : "no --model given and /v1/models lists none";
      r.detail = info_.error;
      report_.model = model_;
      report_.checks.push_back(r);
      return report_;
    }
    report_.model = model_;
    report_.engine = info_.engine;
    report_.quantization = info_.quantization;
    report_.max_model_len = info_.max_model_len;

    run_check("models", [&](CheckResult& r) { check_models(r); });
    run_check("smoke", [&](CheckResult& r) { check_smoke(r); });
    run_check("structured_json", [&](CheckResult& r) { check_structured(r); });
    run_check("needle", [&](CheckResult& r) { check_needle(r); });
    if (wanted("tool_calls") || wanted("tool_arguments")) check_tools();
    run_check("reasoning", [&](CheckResult& r) { check_reasoning(r); });
    run_check("stream_equivalence", [&](CheckResult& r) { check_stream(r); });
    run_check("stop_finish", [&](CheckResult& r) { check_stop(r); });

    // Report in the documented order.
    std::vector<CheckResult> ordered;
    for (const char* name : kCheckNames)
      for (const CheckResult& r : results_)
        if (r.name == name) ordered.push_back(r);
    report_.checks = std::move(ordered);
    report_.passed = std::all_of(report_.checks.begin(), report_.checks.end(), [](const CheckResult& r) { return r.passed; });
    return report_;
  }

 private:
  bool wanted(const std::string& name) const {
    return o_.only.empty() || std::find(o_.only.begin(), o_.only.end(), name) != o_.only.end();
  }

  template <typename Fn>
  void run_check(const std::string& name, Fn body) {
    if (!wanted(name)) return;
    log_("preflight: " + name + " ...");
    CheckResult result;
    result.name = name;
    result.quality = !is_protocol_check(name);
    const auto start = Clock::now();
    try {
      body(result);
    } catch (const std::exception& error) {
      result.passed = false;
      result.reason = "the check could not run";
      result.detail = error.what();
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    log_(fmt::format("preflight: {} {} ({:.1f} s)", name, result.passed ? "passed" : "FAILED", result.seconds));
    results_.push_back(std::move(result));
  }

  Json chat(const std::string& prompt, int64_t max_tokens) const {
    Json body = {{"model", model_},
                 {"messages", Json::array({{{"role", "user"}, {"content", prompt}}})},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"seed", 1234}};
    if (o_.no_thinking) body["chat_template_kwargs"] = {{"enable_thinking", false}};
    return body;
  }

  static bool failed_request(const HttpReply& reply, CheckResult& r) {
    if (reply.ok()) return false;
    r.reason = "the request failed";
    r.detail = reply.describe();
    return true;
  }

  // The protocol every chat reply owes: a message, a finish_reason, and usage.
  static bool bad_shape(const ChatResult& c, CheckResult& r) {
    if (!c.problems.empty() || !c.has_message) {
      r.reason = "the reply is not a chat completion";
      r.detail = c.problems.empty() ? "no message" : c.problems.front();
      return true;
    }
    if (c.finish_reason != "stop" && c.finish_reason != "length" && c.finish_reason != "tool_calls") {
      r.reason = "finish_reason is not stop, length or tool_calls";
      r.detail = "finish_reason \"" + c.finish_reason + "\"";
      return true;
    }
    if (!c.completion_tokens || !c.prompt_tokens) {
      r.reason = "the reply has no usage";
      return true;
    }
    return false;
  }

  void check_models(CheckResult& r) {
    const HttpReply reply = client_.get("/v1/models");
    if (failed_request(reply, r)) return;
    if (std::find(info_.model_ids.begin(), info_.model_ids.end(), model_) == info_.model_ids.end()) {
      r.reason = "/v1/models does not list the model";
      std::string ids;
      for (const std::string& id : info_.model_ids) ids += (ids.empty() ? "" : ", ") + id;
      r.detail = "listed: " + (ids.empty() ? std::string("none") : ids);
      return;
    }
    r.passed = true;
    r.reason = "the model is listed";
    r.detail = info_.engine.empty() ? model_ : model_ + " on " + info_.engine;
  }

  void check_smoke(CheckResult& r) {
    const HttpReply reply = client_.post(
        "/v1/chat/completions",
        chat("Write a Python function named add that takes two numbers and returns their sum. Reply with the code only.",
             o_.max_tokens));
    if (failed_request(reply, r)) return;
    const ChatResult c = chat_result_from_reply(reply.json);
    if (bad_shape(c, r)) return;
    r.detail = fmt::format("{} tokens, finish_reason {}: \"{}\"", *c.completion_tokens, c.finish_reason, excerpt(c.content));
    if (trim(c.content).empty()) {
      r.reason = c.finish_reason == "length" ? "no answer within max_tokens" : "the reply has no content";
      if (!c.reasoning.empty()) r.detail += fmt::format(" ({} characters of reasoning)", c.reasoning.size());
      return;
    }
    static const std::regex function(R"(def\s+add\s*\()");
    if (!std::regex_search(c.content, function) || c.content.find("return") == std::string::npos) {
      r.reason = "answer does not contain a Python function add";
      return;
    }
    r.passed = true;
    r.reason = "answer contains a Python function add";
  }

  // A schema-constrained reply needs room for its keys, values and whatever whitespace the model
  // chooses between them, however small --max-tokens is.
  static constexpr int64_t kJsonRoom = 300;

  void check_structured(CheckResult& r) {
    const Json schema = {
        {"type", "object"},
        {"properties",
         {{"language", {{"type", "string"}, {"enum", {"python", "rust", "go", "c"}}}},
          {"first_released", {{"type", "integer"}, {"minimum", 1950}, {"maximum", 2030}}},
          {"statically_typed", {{"type", "boolean"}}},
          {"summary", {{"type", "string"}, {"maxLength", 60}}}}},
        {"required", {"language", "first_released", "statically_typed", "summary"}},
        {"additionalProperties", false}};
    // The prompt asks for prose: only a server that applies the schema returns JSON.
    Json body = chat("Tell me about the Python programming language in two or three sentences of plain prose. "
                     "Do not use JSON, lists or code.",
                     std::max<int64_t>(o_.max_tokens, kJsonRoom));
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "language_facts"}, {"schema", schema}, {"strict", true}}}};
    const HttpReply reply = client_.post("/v1/chat/completions", body);
    if (!reply.ok() && reply.status >= 400 && reply.status < 500) {
      r.reason = "the server rejected response_format";
      r.detail = reply.describe();
      return;
    }
    if (failed_request(reply, r)) return;
    const ChatResult c = chat_result_from_reply(reply.json);
    if (bad_shape(c, r)) return;
    const std::string text = trim(c.content);
    r.detail = fmt::format("finish_reason {}: \"{}\"", c.finish_reason, excerpt(text));
    const Json value = Json::parse(text, nullptr, false);
    if (value.is_discarded()) {
      if (!text.empty() && text[0] == '{' && c.finish_reason == "length")
        r.reason = "the reply was cut at max_tokens before the JSON ended";
      else
        r.reason = "reply is not JSON: response_format was accepted but not applied";
      return;
    }
    if (const std::string why = schema_violation(value, schema); !why.empty()) {
      r.reason = "reply does not validate against the schema";
      r.detail = why + "; reply \"" + excerpt(text) + "\"";
      return;
    }
    r.passed = true;
    r.reason = "reply parses and validates against the schema";
  }

  void check_needle(CheckResult& r) {
    int64_t ctx = o_.needle_ctx;
    if (ctx <= 0) {
      ctx = 4096;
      if (info_.max_model_len) ctx = std::min<int64_t>(ctx, int64_t(double(*info_.max_model_len) * 0.9));
    }
    if (info_.max_model_len && ctx + 16 > *info_.max_model_len) {
      r.reason = "the needle context does not fit the server's max_model_len";
      r.detail = fmt::format("--needle-ctx {} with max_model_len {}", ctx, *info_.max_model_len);
      return;
    }
    static const char* const kAdjectives[] = {"amber", "cobalt", "velvet", "crimson", "silent", "hollow", "lunar", "frosty"};
    static const char* const kNouns[] = {"falcon", "otter", "lantern", "harbor", "thistle", "glacier", "meadow", "comet"};
    const std::string word = fmt::format("{}-{}-{}", kAdjectives[rng_() % 8], kNouns[rng_() % 8], 1000 + rng_() % 9000);
    const double depth = 0.1 + 0.8 * double(rng_() % 1000) / 1000.0;
    static const char* const kFiller[] = {
        "The river turned east after the old mill, where the water slowed and the reeds grew tall.",
        "Most of the town's bread came from a bakery that opened before dawn and closed at noon.",
        "A committee met every Tuesday to argue about the color of the new benches in the park.",
        "The library kept its maps in long flat drawers that smelled faintly of cedar and dust.",
        "Farmers in the valley rotated barley, beans and clover to keep the soil from tiring.",
        "When the tram line was extended, the market square filled with stalls selling cheap umbrellas.",
        "The lighthouse keeper logged the weather three times a day in a ledger bound with twine.",
        "Children learned to swim in the cold lake each June, racing between two wooden rafts.",
        "An engineer measured the bridge's sway with a pendulum and a stopwatch one windy afternoon.",
        "The choir rehearsed in the school gym because the church roof was being repaired.",
        "Every autumn the orchard hired pickers who slept in the barn and sang late into the night.",
        "The museum's oldest clock lost four minutes a week, and nobody dared to adjust it.",
        "A narrow staircase led from the harbor to the chapel, worn smooth by centuries of feet.",
        "The postal service once delivered letters by boat to the islands twice each month.",
        "Local cooks swore that the soup tasted better on the second day, after the herbs settled.",
        "The mountain pass closed in November and reopened only when the snowplows could reach it.",
    };
    const size_t filler_count = sizeof(kFiller) / sizeof(kFiller[0]);
    std::string cycle;
    for (size_t i = 0; i < filler_count; ++i) cycle += std::string(kFiller[i]) + " ";
    // Tokens per character from the server's own tokenizer when it has /tokenize; else ~4 chars/token.
    double chars_per_token = 4.0;
    bool calibrated = false;
    if (const HttpReply t = client_.post("/tokenize", {{"model", model_}, {"prompt", cycle}, {"add_special_tokens", false}});
        t.ok() && t.json.is_object() && t.json.contains("count") && t.json["count"].get<int64_t>() > 0) {
      chars_per_token = double(cycle.size()) / double(t.json["count"].get<int64_t>());
      calibrated = true;
    }
    const std::string head = "Below is a long text. Somewhere in it is a secret code word. Read it carefully.\n\n";
    const std::string question = "\n\nWhat is the secret code word hidden in the text above? Reply with the code word only.";
    const std::string needle = "The secret code word is " + word + ". ";
    const int64_t overhead = 64 + int64_t(double(head.size() + question.size() + needle.size()) / chars_per_token);
    const size_t target_chars = size_t(std::max<double>(0, double(ctx - overhead) * chars_per_token));
    std::string hay;
    for (size_t i = rng_() % filler_count; hay.size() < target_chars; i = (i + 7) % filler_count)
      hay += std::string(kFiller[i]) + " ";
    size_t at = size_t(double(hay.size()) * depth);
    while (at > 0 && hay[at - 1] != ' ') --at;  // between sentences' words, not inside one
    while (at > 0 && at < hay.size() && !(hay[at - 1] == ' ' && at >= 2 && hay[at - 2] == '.')) --at;
    hay.insert(at, needle);

    const HttpReply reply = client_.post("/v1/chat/completions", chat(head + hay + question, o_.max_tokens));
    if (failed_request(reply, r)) {
      r.detail = fmt::format("{} (about {} tokens)", r.detail, ctx);
      return;
    }
    const ChatResult c = chat_result_from_reply(reply.json);
    if (bad_shape(c, r)) return;
    const int64_t seen = *c.prompt_tokens;
    r.detail = fmt::format("code word \"{}\" at {:.0f}% depth, {} prompt tokens; answer \"{}\"", word, depth * 100, seen,
                           excerpt(trim(c.content), 60));
    if (calibrated && double(seen) < 0.8 * double(ctx - overhead)) {
      r.reason = "the server truncated the prompt";
      r.detail = fmt::format("it counted {} prompt tokens of about {} sent", seen, ctx);
      return;
    }
    if (lower(c.content).find(lower(word)) == std::string::npos) {
      r.reason = "answer does not contain the code word";
      return;
    }
    r.passed = true;
    r.reason = "answer contains the code word";
  }

  // The start of a call that never closed: a JSON object or a tool-call wrapper.
  static bool looks_like_call(const std::string& content) {
    const std::string text = trim(content);
    return (!text.empty() && text[0] == '{') || text.find("<tool_call>") != std::string::npos ||
           text.find("\"arguments\"") != std::string::npos;
  }

  struct ToolCase {
    std::string city, unit, tool;  // unit empty for get_local_time
    bool named = false, stream = false;
    ChatResult result;
    std::string request_error;
  };

  void check_tools() {
    static const char* const kCities[] = {"Paris", "Tokyo", "Lima", "Oslo", "Nairobi", "Sydney", "Toronto", "Cairo"};
    Json cities = Json::array();
    for (const char* city : kCities) cities.push_back(city);
    const Json weather_params = {
        {"type", "object"},
        {"properties", {{"city", {{"type", "string"}, {"enum", cities}}}, {"unit", {{"type", "string"}, {"enum", {"celsius", "fahrenheit"}}}}}},
        {"required", {"city", "unit"}},
        {"additionalProperties", false}};
    const Json time_params = {{"type", "object"},
                              {"properties", {{"city", {{"type", "string"}, {"enum", cities}}}}},
                              {"required", {"city"}},
                              {"additionalProperties", false}};
    const std::map<std::string, Json> params = {{"get_weather", weather_params}, {"get_local_time", time_params}};
    const Json tools = Json::array(
        {{{"type", "function"},
          {"function", {{"name", "get_weather"}, {"description", "Current weather in a city."}, {"parameters", weather_params}}}},
         {{"type", "function"},
          {"function",
           {{"name", "get_local_time"}, {"description", "Current local time in a city."}, {"parameters", time_params}}}}});

    const int64_t n = std::max<int64_t>(1, o_.tool_batch);
    std::vector<ToolCase> cases(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ToolCase& t = cases[size_t(i)];
      t.city = kCities[size_t(i) % 8];
      t.tool = i % 2 == 0 ? "get_weather" : "get_local_time";
      if (t.tool == "get_weather") t.unit = (i / 2) % 2 == 0 ? "celsius" : "fahrenheit";
      t.named = i % 3 != 2;  // every third leaves the choice to the model (tool_choice "required")
      t.stream = (i / 2) % 2 == 1;
    }
    const auto run_case = [&](ToolCase& t) {
      const std::string prompt = t.tool == "get_weather"
                                     ? fmt::format("What is the weather in {} right now? Give the temperature in {}.", t.city, t.unit)
                                     : fmt::format("What time is it in {} right now?", t.city);
      Json body = chat(prompt, std::max<int64_t>(o_.max_tokens, kJsonRoom));
      body["tools"] = tools;
      body["tool_choice"] = t.named ? Json{{"type", "function"}, {"function", {{"name", t.tool}}}} : Json("required");
      if (t.stream) {
        body["stream"] = true;
        const StreamReply reply = client_.post_stream("/v1/chat/completions", body);
        if (!reply.ok()) t.request_error = reply.describe();
        else t.result = chat_result_from_stream(reply);
      } else {
        const HttpReply reply = client_.post("/v1/chat/completions", body);
        if (!reply.ok()) t.request_error = reply.describe();
        else t.result = chat_result_from_reply(reply.json);
      }
    };
    const auto start = Clock::now();
    log_(fmt::format("preflight: tool_calls: {} requests at once ...", n));
    std::vector<std::thread> threads;
    for (ToolCase& t : cases) threads.emplace_back([&run_case, &t] {
      try {
        run_case(t);
      } catch (const std::exception& error) {
        t.request_error = error.what();
      }
    });
    for (std::thread& thread : threads) thread.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

    // Protocol: each call lands in tool_calls, names an offered tool (the named one when named),
    // with arguments that parse and validate; no tool markup in content; not cut short.
    CheckResult protocol;
    protocol.name = "tool_calls";
    protocol.seconds = seconds;
    std::vector<const ToolCase*> judged;
    size_t bad = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const ToolCase& t = cases[i];
      const std::string which = fmt::format("call {} ({}, {})", i + 1, t.stream ? "streamed" : "whole",
                                            t.named ? "named " + t.tool : std::string("required"));
      std::string reason, detail;
      const ChatResult& c = t.result;
      if (!t.request_error.empty()) {
        reason = "a request failed", detail = t.request_error;
      } else if (c.finish_reason == "length" && (!c.tool_calls.empty() || looks_like_call(c.content))) {
        reason = "a call was cut at max_tokens";
        detail = fmt::format("content \"{}\"", excerpt(c.content));
      } else if (c.tool_calls.empty()) {
        reason = "a call did not come back in tool_calls";
        detail = fmt::format("finish_reason {}, content \"{}\"", c.finish_reason, excerpt(c.content));
      } else if (const std::string marker = find_marker(c.content); !marker.empty()) {
        reason = "tool-call markup leaked into content", detail = marker;
      } else {
        const ChatToolCall& call = c.tool_calls.front();
        const Json arguments = Json::parse(call.arguments, nullptr, false);
        if (t.named && call.name != t.tool) {
          reason = "a named tool_choice was not honoured", detail = "called \"" + call.name + "\"";
        } else if (!params.count(call.name)) {
          reason = "a call names a tool that was not offered", detail = "called \"" + call.name + "\"";
        } else if (call.id.empty()) {
          reason = "a call has no id";
        } else if (!arguments.is_object()) {
          reason = "arguments are not a JSON object", detail = "\"" + excerpt(call.arguments) + "\"";
        } else if (const std::string why = schema_violation(arguments, params.at(call.name)); !why.empty()) {
          reason = "arguments do not validate against the tool's parameters", detail = why;
        }
      }
      if (reason.empty()) {
        judged.push_back(&t);
        continue;
      }
      if (bad++ == 0) {
        protocol.reason = reason;
        protocol.detail = which + (detail.empty() ? "" : ": " + detail);
      }
    }
    protocol.passed = bad == 0;
    if (protocol.passed) {
      protocol.reason = "every call came back in tool_calls with a right name and schema-valid arguments";
      protocol.detail = fmt::format("{} calls, {} streamed, {} named", cases.size(),
                                    std::count_if(cases.begin(), cases.end(), [](const ToolCase& t) { return t.stream; }),
                                    std::count_if(cases.begin(), cases.end(), [](const ToolCase& t) { return t.named; }));
    } else {
      protocol.detail = fmt::format("{} of {} failed; first: {}", bad, cases.size(), protocol.detail);
    }

    // Quality: the tool the question asks for, with the city and unit it names.
    CheckResult quality;
    quality.name = "tool_arguments";
    quality.quality = true;
    quality.seconds = seconds;
    size_t wrong = 0;
    for (const ToolCase* t : judged) {
      const ChatToolCall& call = t->result.tool_calls.front();
      const Json arguments = Json::parse(call.arguments);
      std::string why;
      if (call.name != t->tool) why = "called " + call.name + " instead of " + t->tool;
      else if (arguments.value("city", "") != t->city) why = "city " + arguments.value("city", "?") + " instead of " + t->city;
      else if (!t->unit.empty() && arguments.value("unit", "") != t->unit)
        why = "unit " + arguments.value("unit", "?") + " instead of " + t->unit;
      if (why.empty()) continue;
      if (wrong++ == 0) quality.detail = why;
    }
    if (judged.empty()) {
      quality.reason = "no call to judge (see tool_calls)";
    } else if (wrong) {
      quality.reason = "a call had the wrong tool or arguments";
      quality.detail = fmt::format("{} of {} wrong; first: {}", wrong, judged.size(), quality.detail);
    } else {
      quality.passed = true;
      quality.reason = "every call had the right tool and arguments";
      quality.detail = fmt::format("{} calls", judged.size());
    }
    for (CheckResult* result : {&protocol, &quality}) {
      if (!wanted(result->name)) continue;
      log_(fmt::format("preflight: {} {}", result->name, result->passed ? "passed" : "FAILED"));
      results_.push_back(*result);
    }
  }

  // Reasoning stays in its field: no format markup anywhere in content, no copy of the chain of
  // thought in content, and none at all when thinking was turned off.
  static std::string reasoning_problem(const ChatResult& c, bool no_thinking, std::string& detail) {
    if (const std::string marker = find_marker(c.content); !marker.empty()) {
      detail = "\"" + marker + "\" in content: \"" + excerpt(c.content) + "\"";
      return "reasoning markup leaked into content";
    }
    if (const std::string marker = find_marker(c.reasoning); !marker.empty()) {
      detail = "\"" + marker + "\" in " + c.reasoning_field;
      return "format markup leaked into the reasoning field";
    }
    const std::string thought = trim(c.reasoning);
    if (thought.size() >= 20) {
      const std::string probe = thought.substr(0, std::min<size_t>(thought.size(), 60));
      if (c.content.find(probe) != std::string::npos) {
        detail = "content repeats \"" + excerpt(probe, 40) + "\"";
        return "content repeats the chain of thought";
      }
    }
    if (no_thinking && !thought.empty()) {
      detail = fmt::format("{} characters in {}", thought.size(), c.reasoning_field);
      return "reasoning came back although thinking was turned off";
    }
    return "";
  }

  void check_reasoning(CheckResult& r) {
    const Json body = chat("What is 17 multiplied by 23? Think it through step by step, then give the final number.", o_.max_tokens);
    const HttpReply whole = client_.post("/v1/chat/completions", body);
    if (failed_request(whole, r)) return;
    const ChatResult c = chat_result_from_reply(whole.json);
    if (bad_shape(c, r)) return;
    Json streamed_body = body;
    streamed_body["stream"] = true;
    const StreamReply stream = client_.post_stream("/v1/chat/completions", streamed_body);
    if (!stream.ok()) {
      r.reason = "the request failed";
      r.detail = "streamed: " + stream.describe();
      return;
    }
    const ChatResult s = chat_result_from_stream(stream);
    for (const auto& [label, result] : {std::pair<const char*, const ChatResult*>{"whole", &c}, {"streamed", &s}}) {
      std::string detail;
      if (const std::string problem = reasoning_problem(*result, o_.no_thinking, detail); !problem.empty()) {
        r.reason = problem;
        r.detail = std::string(label) + " reply: " + detail;
        return;
      }
    }
    r.passed = true;
    if (c.reasoning.empty()) {
      r.reason = "content carries no reasoning markup";
      r.detail = o_.no_thinking ? "no reasoning, as asked" : "no reasoning came back";
    } else {
      r.reason = "reasoning stays out of content";
      r.detail = fmt::format("{} characters of reasoning in {}", c.reasoning.size(), c.reasoning_field);
    }
  }

  Json baseline_body() const {
    Json body = chat("Write a short poem about a lighthouse keeper and the sea.", std::min<int64_t>(o_.max_tokens, 128));
    return body;
  }

  static std::string first_difference(const std::string& a, const std::string& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    return fmt::format("at byte {}: \"{}\" vs \"{}\"", i, excerpt(a.substr(std::min(i, a.size())), 30),
                       excerpt(b.substr(std::min(i, b.size())), 30));
  }

  void check_stream(CheckResult& r) {
    const Json body = baseline_body();
    const HttpReply whole = client_.post("/v1/chat/completions", body);
    if (failed_request(whole, r)) return;
    const ChatResult c = chat_result_from_reply(whole.json);
    if (bad_shape(c, r)) return;
    baseline_ = c;
    Json streamed_body = body;
    streamed_body["stream"] = true;
    streamed_body["stream_options"] = {{"include_usage", true}};
    const StreamReply stream = client_.post_stream("/v1/chat/completions", streamed_body);
    if (!stream.ok()) {
      r.reason = "the request failed";
      r.detail = "streamed: " + stream.describe();
      return;
    }
    if (!stream.all_json) {
      r.reason = "a stream event is not JSON";
      for (const SseEvent& e : stream.events)
        if (e.data != "[DONE]" && e.json.is_discarded()) r.detail = "\"" + excerpt(e.data) + "\"";
      return;
    }
    if (!stream.done) {
      r.reason = "the stream did not end with data: [DONE]";
      return;
    }
    const ChatResult s = chat_result_from_stream(stream);
    if (!s.problems.empty()) {
      r.reason = "the stream is malformed";
      r.detail = s.problems.front();
      return;
    }
    if (!s.completion_tokens) {
      r.reason = "no usage chunk although stream_options.include_usage was set";
      return;
    }
    const std::vector<std::tuple<std::string, std::string, std::string>> fields = {
        {"content", c.content, s.content},
        {"reasoning", c.reasoning, s.reasoning},
        {"finish_reason", c.finish_reason, s.finish_reason},
        {"completion_tokens", std::to_string(*c.completion_tokens), std::to_string(*s.completion_tokens)}};
    for (const auto& [field, a, b] : fields) {
      if (a == b) continue;
      r.reason = "streamed reply differs from the non-streamed one";
      r.detail = field + " " + first_difference(a, b);
      return;
    }
    if (c.tool_calls.size() != s.tool_calls.size()) {
      r.reason = "streamed reply differs from the non-streamed one";
      r.detail = fmt::format("{} tool calls whole, {} streamed", c.tool_calls.size(), s.tool_calls.size());
      return;
    }
    r.passed = true;
    r.reason = "streamed and non-streamed replies are identical";
    r.detail = fmt::format("{} tokens, {} events, finish_reason {}", *c.completion_tokens, stream.events.size(), c.finish_reason);
  }

  void check_stop(CheckResult& r) {
    // max_tokens: never more tokens than asked, and "length" exactly when the limit cut the reply.
    constexpr int64_t kLimit = 4;
    Json limited = chat("Count from one to twenty in words.", kLimit);
    const HttpReply cut = client_.post("/v1/chat/completions", limited);
    if (failed_request(cut, r)) return;
    const ChatResult l = chat_result_from_reply(cut.json);
    if (bad_shape(l, r)) return;
    if (*l.completion_tokens > kLimit) {
      r.reason = "the server generated more than max_tokens";
      r.detail = fmt::format("{} completion tokens for max_tokens {}", *l.completion_tokens, kLimit);
      return;
    }
    if (l.finish_reason == "length" && *l.completion_tokens < kLimit) {
      r.reason = "finish_reason is length before max_tokens";
      r.detail = fmt::format("{} completion tokens for max_tokens {}", *l.completion_tokens, kLimit);
      return;
    }
    if (l.finish_reason != "length" && l.finish_reason != "stop") {
      r.reason = "finish_reason is not stop or length";
      r.detail = "finish_reason \"" + l.finish_reason + "\"";
      return;
    }
    const std::string limit_note = fmt::format("max_tokens {}: {} tokens, finish_reason {}", kLimit, *l.completion_tokens, l.finish_reason);

    // A stop string taken from the middle of the greedy reply must end it just before itself.
    if (!baseline_) {
      const HttpReply whole = client_.post("/v1/chat/completions", baseline_body());
      if (failed_request(whole, r)) return;
      baseline_ = chat_result_from_reply(whole.json);
      if (bad_shape(*baseline_, r)) return;
    }
    const std::string& text = baseline_->content;
    // Three whole characters starting a third of the way in, not all blank.
    std::vector<size_t> starts;
    for (size_t i = 0; i < text.size(); ++i)
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts.push_back(i);
    std::string stop;
    size_t at = std::string::npos;
    for (size_t k = starts.size() / 3; k + 3 < starts.size() && stop.empty(); ++k) {
      const std::string candidate = text.substr(starts[k], starts[k + 3] - starts[k]);
      if (trim(candidate).empty() || starts[k] == 0) continue;
      const size_t first = text.find(candidate);
      if (first == 0) continue;
      stop = candidate;
      at = first;
    }
    if (stop.empty()) {
      r.passed = true;
      r.reason = "finish_reason and usage agree with max_tokens";
      r.detail = limit_note + "; stop strings not tried: the greedy reply had too little content (" +
                 std::to_string(text.size()) + " bytes)";
      return;
    }
    Json stopped = baseline_body();
    stopped["stop"] = Json::array({stop});
    const HttpReply reply = client_.post("/v1/chat/completions", stopped);
    if (failed_request(reply, r)) return;
    const ChatResult s = chat_result_from_reply(reply.json);
    if (bad_shape(s, r)) return;
    const std::string expected = text.substr(0, at);
    const std::string stop_note = fmt::format("stop \"{}\" at byte {}", excerpt(stop), at);
    if (s.content.find(stop) != std::string::npos) {
      r.reason = "the stop string was not honoured";
      r.detail = stop_note + ": content \"" + excerpt(s.content) + "\"";
      return;
    }
    if (s.finish_reason != "stop") {
      r.reason = "finish_reason is not stop after a stop string";
      r.detail = stop_note + ": finish_reason " + s.finish_reason;
      return;
    }
    if (s.content != expected) {
      r.reason = "the stop string did not cut the reply where it first appears";
      r.detail = stop_note + ": " + first_difference(expected, s.content);
      return;
    }
    r.passed = true;
    r.reason = "finish_reason and usage agree with max_tokens; the stop string cut the reply before itself";
    r.detail = limit_note + "; " + stop_note;
  }

  const PreflightOptions& o_;
  const PreflightLog& log_;
  OpenAiClient client_;
  std::mt19937_64 rng_;
  ServerInfo info_;
  std::string model_;
  std::optional<ChatResult> baseline_;
  std::vector<CheckResult> results_;
  PreflightReport report_;
};

}  // namespace

PreflightReport run_preflight(const PreflightOptions& options, const PreflightLog& log) {
  Preflight preflight(options, log);
  return preflight.run();
}

nlohmann::json preflight_json(const PreflightReport& report) {
  Json checks = Json::array();
  for (const CheckResult& r : report.checks)
    checks.push_back({{"name", r.name},
                      {"passed", r.passed},
                      {"reason", r.reason},
                      {"detail", r.detail},
                      {"quality", r.quality},
                      {"seconds", r.seconds}});
  return {{"base_url", report.base_url},
          {"model", report.model},
          {"engine", report.engine},
          {"quantization", report.quantization},
          {"max_model_len", report.max_model_len ? Json(*report.max_model_len) : Json(nullptr)},
          {"checks", checks},
          {"passed", report.passed}};
}

std::string preflight_text(const PreflightReport& report) {
  std::string out = fmt::format("preflight {} model {}{}\n", report.base_url, report.model,
                                report.engine.empty() ? "" : " (" + report.engine + ")");
  size_t passed = 0;
  for (const CheckResult& r : report.checks) {
    passed += r.passed;
    out += fmt::format("{}  {:<20} {}{}\n", r.passed ? "PASS" : "FAIL", r.name, r.reason,
                       r.detail.empty() ? "" : " (" + r.detail + ")");
  }
  out += fmt::format("{} of {} checks passed\n", passed, report.checks.size());
  return out;
}

}  // namespace anvil::tools
