// Malformed and hostile bodies: each gets a 4xx with OpenAI's error shape, and the server keeps
// serving everyone else.
#include <gtest/gtest.h>

#include <random>

#include "support/server_harness.h"

namespace anvil::test {
namespace {

struct Case {
  std::string path;
  std::string body;
  std::string what;
};

const Json kChat = {{"model", "qwen"}, {"messages", {{{"role", "user"}, {"content", "Hello, how are you?"}}}}, {"max_tokens", 4}};
const Json kCompletion = {{"model", "qwen"}, {"prompt", "Once upon a time"}, {"max_tokens", 4}};

std::vector<Case> hostile_cases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& path, const std::string& body, const std::string& what) { cases.push_back({path, body, what}); };
  const std::string chat = "/v1/chat/completions", completions = "/v1/completions";

  // Fuzzed JSON that can never be valid: truncated, or with a raw control byte spliced in.
  std::mt19937 rng(1234);
  for (const auto& [path, valid] : {std::pair{chat, kChat.dump()}, std::pair{completions, kCompletion.dump()}}) {
    for (int i = 0; i < 30; ++i) {
      const size_t cut = 1 + rng() % (valid.size() - 1);
      add(path, valid.substr(0, cut), "truncated at " + std::to_string(cut));
    }
    for (int i = 0; i < 20; ++i) {
      std::string broken = valid;
      broken.insert(1 + rng() % (broken.size() - 1), 1, char(1 + rng() % 8));
      add(path, broken, "control byte");
    }
    for (int i = 0; i < 10; ++i) {
      std::string broken = valid;
      const char* invalid[] = {"\xff", "\xc0\xaf", "\xe2\x82", "\xed\xa0\x80", "\xf8\x88\x80\x80\x80"};
      broken.insert(valid.find("\"", 30) + 1, invalid[i % 5]);
      add(path, broken, "invalid UTF-8");
    }
  }
  for (const std::string body : {"", " ", "null", "[]", "123", "\"text\"", "true", "{}", "{\"messages\": null}", "{{}}",
                                 "{\"a\":1,}", "NaN", "{\"max_tokens\": NaN}", "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}"})
    add(chat, body, "odd body " + body);

  // Wrong types and out-of-range values, one field at a time on an otherwise valid request.
  const std::vector<std::pair<std::string, Json>> bad_fields = {
      {"messages", 5}, {"messages", "hi"}, {"messages", Json::array()}, {"messages", {1}}, {"messages", {{{"role", 5}}}},
      {"messages", {{{"role", "wizard"}, {"content", "x"}}}}, {"messages", {{{"content", "x"}}}},
      {"messages", {{{"role", "user"}, {"content", 5}}}}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}},
      {"messages", {{{"role", "assistant"}, {"tool_calls", "x"}}}}, {"messages", {{{"role", "assistant"}, {"tool_calls", {{{"function", 5}}}}}}},
      {"temperature", "hot"}, {"temperature", -1}, {"temperature", true}, {"temperature", Json::array()},
      {"top_p", 0}, {"top_p", 1.5}, {"top_p", -0.1}, {"top_p", "1"},
      {"n", 0}, {"n", -1}, {"n", 1.5}, {"n", 1000000000}, {"n", "2"}, {"n", 1e30},
      {"max_tokens", 0}, {"max_tokens", -5}, {"max_tokens", 1e20}, {"max_tokens", 2.5}, {"max_tokens", "10"},
      {"max_completion_tokens", -1}, {"max_tokens", Json::parse("123456789012345678901234567890")},
      {"stop", 5}, {"stop", {1}}, {"stop", {nullptr}}, {"stop", Json::object()},
      {"seed", "x"}, {"seed", 1.5}, {"seed", 1e30}, {"stream", "yes"}, {"stream", 1}, {"stream_options", 5},
      {"logprobs", "x"}, {"top_logprobs", 3}, {"presence_penalty", 3}, {"presence_penalty", -2.5}, {"frequency_penalty", "a"},
      {"repetition_penalty", 0}, {"repetition_penalty", -1}, {"top_k", -2}, {"top_k", "5"}, {"min_p", 2}, {"min_p", -1},
      {"min_tokens", -1}, {"min_tokens", 10}, {"ignore_eos", "no"}, {"skip_special_tokens", 0}, {"include_reasoning", "no"},
      {"chat_template_kwargs", 5}, {"chat_template_kwargs", {{"enable_thinking", "yes"}}},
      {"model", 5}, {"user", 5}, {"reasoning_effort", "extreme"}, {"reasoning_effort", 5},
      {"response_format", "json"}, {"response_format", {{"type", "xml"}}}, {"response_format", {{"type", "json_schema"}}},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", 5}}}}},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}, {"pattern", "a+"}}}}}}},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "quantum"}}}}}}},
      {"tools", "x"}, {"tools", {5}}, {"tools", {{{"type", "function"}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "bad name!"}}}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}}},
      {"tool_choice", "sometimes"}, {"tool_choice", "required"}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "missing"}}}}},
      {"guided_regex", "a+"}, {"guided_choice", {"a", "b"}}, {"guided_grammar", "root ::= x"}, {"guided_json", 5},
      {"logit_bias", {{"1", 5}}}, {"echo", true}, {"use_beam_search", true}, {"structured_outputs", {{"regex", "a"}}},
      {"continue_final_message", true}, {"functions", {{{"name", "f"}}}}, {"stop_token_ids", {-1}}, {"stop_token_ids", {100000}},
  };
  for (const auto& [field, value] : bad_fields) {
    Json body = kChat;
    body[field] = value;
    add(chat, body.dump(), "chat " + field + "=" + value.dump());
  }
  const std::vector<std::pair<std::string, Json>> bad_completion_fields = {
      {"prompt", Json::array()}, {"prompt", ""}, {"prompt", {-1}}, {"prompt", {99999999}}, {"prompt", {1.5}},
      {"prompt", {Json::array()}}, {"prompt", {{1}, {"a"}}}, {"prompt", 5}, {"prompt", nullptr}, {"prompt", {{{"a", 1}}}},
      {"suffix", "x"}, {"logprobs", 21}, {"logprobs", -1}, {"best_of", 3}, {"echo", true}, {"n", 300},
  };
  for (const auto& [field, value] : bad_completion_fields) {
    Json body = kCompletion;
    body[field] = value;
    add(completions, body.dump(), "completion " + field + "=" + value.dump());
  }
  // Deep nesting, in the body and inside a field.
  add(chat, std::string(100000, '[') + std::string(100000, ']'), "100000 nested arrays");
  std::string objects;
  for (int i = 0; i < 50000; ++i) objects += "{\"a\":";
  add(chat, objects + "1" + std::string(50000, '}'), "50000 nested objects");
  add(chat, "{\"messages\": " + std::string(5000, '[') + std::string(5000, ']') + "}", "nested inside messages");
  add(chat, std::string(100000, '['), "unclosed nesting");
  // Huge numbers and lengths.
  add(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 1e400}", "1e400");
  add(chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": -1e400}", "-1e400");
  add(completions, Json{{"prompt", std::vector<int>(5000, 1)}}.dump(), "prompt longer than the context");
  add(chat, Json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"stop", std::vector<std::string>(100, "a")}}.dump(), "100 stop strings");
  return cases;
}

TEST(ServerHostileInput, EveryMalformedBodyIs4xxAndTheServerStaysUp) {
  ServerProcess& server = qwen_server();
  const std::vector<Case> cases = hostile_cases();
  EXPECT_GE(cases.size(), 200u);
  auto client = server.client();
  for (const Case& c : cases) {
    const auto result = client.Post(c.path, c.body, "application/json");
    ASSERT_TRUE(result) << c.what << ": no response (server down?)\n" << server.log().substr(0, 4000);
    EXPECT_GE(result->status, 400) << c.what << ": " << result->body;
    EXPECT_LT(result->status, 500) << c.what << ": " << result->body;
    const Json error = Json::parse(result->body, nullptr, false);
    EXPECT_TRUE(error.is_object() && error.contains("error") && error["error"].contains("message") &&
                error["error"].contains("type") && error["error"].contains("code"))
        << c.what << ": " << result->body;
  }
  EXPECT_TRUE(server.alive());
  EXPECT_EQ(get(server, "/health").status, 200);
  // And real work still gets done.
  const HttpResult ok = post(server, "/v1/chat/completions", kChat);
  EXPECT_EQ(ok.status, 200) << ok.body;
  // Unknown fields are ignored, with a warning in the log.
  Json extra = kCompletion;
  extra["frobnicate"] = 3;
  EXPECT_EQ(post(server, "/v1/completions", extra).status, 200);
  EXPECT_NE(server.log().find("frobnicate"), std::string::npos);
}

}  // namespace
}  // namespace anvil::test
