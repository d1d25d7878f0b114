// Structured output through the server: JSON schemas and forced tool calls on random-weight
// models, whose unconstrained output would be noise, must always parse and validate.
#include <gtest/gtest.h>

#include <thread>

#include "support/server_harness.h"

namespace anvil::test {
namespace {

// A validator for the schema features these tests use.
bool validates(const Json& value, const Json& schema, std::string& why) {
  if (schema.contains("enum")) {
    for (const Json& option : schema["enum"])
      if (option == value) return true;
    why = value.dump() + " not in enum " + schema["enum"].dump();
    return false;
  }
  if (schema.contains("const") && schema["const"] != value) {
    why = value.dump() + " != const";
    return false;
  }
  const std::string type = schema.value("type", "");
  if (type == "object") {
    if (!value.is_object()) return why = value.dump() + " is not an object", false;
    const Json properties = schema.value("properties", Json::object());
    for (const Json& key : schema.value("required", Json::array()))
      if (!value.contains(key.get<std::string>())) return why = "missing " + key.get<std::string>(), false;
    for (const auto& [key, item] : value.items()) {
      if (!properties.contains(key)) {
        if (schema.value("additionalProperties", true) == false) return why = "extra key " + key, false;
        continue;
      }
      if (!validates(item, properties[key], why)) return false;
    }
    return true;
  }
  if (type == "array") {
    if (!value.is_array()) return why = value.dump() + " is not an array", false;
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) return why = "too many items", false;
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) return why = "too few items", false;
    for (const Json& item : value)
      if (schema.contains("items") && !validates(item, schema["items"], why)) return false;
    return true;
  }
  if (type == "integer" && !value.is_number_integer()) return why = value.dump() + " is not an integer", false;
  if (type == "boolean" && !value.is_boolean()) return why = value.dump() + " is not a boolean", false;
  if (type == "string" && !value.is_string()) return why = value.dump() + " is not a string", false;
  return true;
}

const Json kSchema = Json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "enum": ["ann", "bob", "cy"]},
    "ok": {"type": "boolean"},
    "size": {"enum": [1, 2, 3]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 3},
    "inner": {"type": "object", "properties": {"v": {"type": "integer", "enum": [10, 20]}}, "required": ["v"],
              "additionalProperties": false}
  },
  "required": ["name", "ok", "size", "tags", "inner"],
  "additionalProperties": false
})");

TEST(ServerStructuredOutput, HundredSchemaRequestsAllParseAndValidate) {
  ServerProcess& server = qwen_server();
  constexpr int kRequests = 100, kThreads = 8;
  std::vector<HttpResult> results(kRequests);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kRequests; i += kThreads) {
        const Json body = {
            {"prompt", "Give me a record:"}, {"max_tokens", 400}, {"temperature", 1.0}, {"seed", i},
            {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "record"}, {"schema", kSchema}}}}}};
        results[size_t(i)] = post(server, "/v1/completions", body);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < kRequests; ++i) {
    const HttpResult& result = results[size_t(i)];
    ASSERT_EQ(result.status, 200) << result.body;
    const std::string text = result.json["choices"][0].at("text");
    EXPECT_EQ(result.json["choices"][0].at("finish_reason"), "stop") << text;
    const Json parsed = Json::parse(text, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << "request " << i << ": " << text;
    std::string why;
    EXPECT_TRUE(validates(parsed, kSchema, why)) << "request " << i << ": " << why << " in " << text;
  }
}

TEST(ServerStructuredOutput, ChatJsonAnswersInBothFormats) {
  const Json small = {{"type", "object"},
                      {"properties", {{"answer", {{"enum", {"yes", "no"}}}}, {"n", {{"enum", {1, 2}}}}}},
                      {"required", {"answer", "n"}}, {"additionalProperties", false}};
  for (ServerProcess* server : {&qwen_server(), &demo_server()}) {
    for (const bool stream : {false, true}) {
      const Json body = {{"messages", {{{"role", "user"}, {"content", "yes or no?"}}}}, {"max_tokens", 300}, {"stream", stream},
                         {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", small}}}}}};
      std::string content;
      if (stream) {
        const SseStream events = post_stream(*server, "/v1/chat/completions", body);
        ASSERT_TRUE(events.done) << events.raw;
        for (const Json& event : events.events)
          for (const Json& c : event.value("choices", Json::array()))
            if (c.at("delta").contains("content")) content += c["delta"]["content"].get<std::string>();
      } else {
        const HttpResult result = post(*server, "/v1/chat/completions", body);
        ASSERT_EQ(result.status, 200) << result.body;
        content = result.json["choices"][0]["message"].at("content");
        EXPECT_TRUE(result.json["choices"][0]["message"].at("reasoning").is_null());
      }
      const Json parsed = Json::parse(content, nullptr, false);
      std::string why;
      EXPECT_TRUE(!parsed.is_discarded() && validates(parsed, small, why)) << content << " " << why;
    }
  }
}

Json weather_tools() {
  return Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
      "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"enum": [1, 3]}},
                     "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
      "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                     "additionalProperties": false}}}
  ])");
}

TEST(ServerStructuredOutput, ForcedToolCallsAreValidCalls) {
  const Json tools = weather_tools();
  for (ServerProcess* server : {&qwen_server(), &demo_server()}) {
    for (const Json& choice : {Json("required"), Json{{"type", "function"}, {"function", {{"name", "get_time"}}}}}) {
      const Json body = {{"messages", {{{"role", "user"}, {"content", "What time is it?"}}}}, {"tools", tools},
                         {"tool_choice", choice}, {"max_tokens", 300}, {"temperature", 1.0}, {"seed", 3}};
      const HttpResult result = post(*server, "/v1/chat/completions", body);
      ASSERT_EQ(result.status, 200) << result.body;
      const Json& c = result.json["choices"][0];
      EXPECT_EQ(c.at("finish_reason"), "tool_calls") << result.body;
      ASSERT_TRUE(c["message"].contains("tool_calls")) << result.body;
      const Json& call = c["message"]["tool_calls"][0];
      EXPECT_EQ(call.at("type"), "function");
      EXPECT_EQ(call.at("id").get<std::string>().rfind("call_", 0), 0u);
      const std::string name = call["function"].at("name");
      if (choice.is_object()) {
        EXPECT_EQ(name, "get_time");
      }
      const Json& schema = tools[name == "get_weather" ? 0 : 1]["function"]["parameters"];
      const Json arguments = Json::parse(call["function"].at("arguments").get<std::string>(), nullptr, false);
      std::string why;
      EXPECT_TRUE(!arguments.is_discarded() && validates(arguments, schema, why)) << result.body << " " << why;

      // Streamed: the deltas rebuild the same kind of call.
      Json streamed = body;
      streamed["stream"] = true;
      const SseStream events = post_stream(*server, "/v1/chat/completions", streamed);
      ASSERT_TRUE(events.done) << events.raw;
      std::string streamed_name, streamed_arguments, finish;
      for (const Json& event : events.events)
        for (const Json& d : event.value("choices", Json::array())) {
          if (d.contains("finish_reason") && d["finish_reason"].is_string()) finish = d["finish_reason"];
          for (const Json& piece : d.at("delta").value("tool_calls", Json::array())) {
            if (piece["function"].contains("name")) streamed_name = piece["function"]["name"];
            streamed_arguments += piece["function"].value("arguments", "");
          }
        }
      EXPECT_EQ(streamed_name, name);
      EXPECT_EQ(streamed_arguments, call["function"].at("arguments").get<std::string>());
      EXPECT_EQ(finish, "tool_calls");
    }
  }
}

// The reply a request forces is written after reasoning is skipped (Harmony: on the final channel
// or as a commentary call; Qwen3: after an empty think block), and read as the JSON it is even
// where its strings spell the format's tags.
TEST(ServerStructuredOutput, ForcedRepliesSkipReasoningAndTagTextStaysData) {
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "open": {"const": "<think>"},
      "tag": {"enum": ["</think>", "<tool_call>", "</tool_call>", "<|end|>", "<|channel|>final<|message|>"]}
    },
    "required": ["open", "tag"],
    "additionalProperties": false
  })");
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "tag", "parameters": {"type": "object",
    "properties": {"text": {"enum": ["</tool_call>", "<think>", "</think>"]}}, "required": ["text"],
    "additionalProperties": false}}}])");
  for (ServerProcess* server : {&qwen_server(), &demo_server()}) {
    for (const bool stream : {false, true}) {
      SCOPED_TRACE(std::string(server == &demo_server() ? "harmony" : "chatml") + (stream ? " streamed" : ""));
      // Thinking is on (Qwen3's default), so the reply must skip it.
      const Json answer = {{"messages", {{{"role", "user"}, {"content", "Name a tag."}}}}, {"max_tokens", 200},
                           {"temperature", 1.0}, {"seed", 11}, {"n", 3}, {"stream", stream},
                           {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}}}};
      const Json call = {{"messages", {{{"role", "user"}, {"content", "Call it."}}}}, {"max_tokens", 200},
                         {"temperature", 1.0}, {"seed", 5}, {"n", 3}, {"stream", stream}, {"tools", tools},
                         {"tool_choice", "required"}};
      for (const Json& body : {answer, call}) {
        const bool calling = body.contains("tools");
        std::vector<std::string> content(3), reasoning(3), arguments(3), names(3);
        if (stream) {
          const SseStream events = post_stream(*server, "/v1/chat/completions", body);
          ASSERT_TRUE(events.done) << events.raw;
          for (const Json& event : events.events)
            for (const Json& c : event.value("choices", Json::array())) {
              const size_t i = c.at("index");
              const Json& delta = c.at("delta");
              if (delta.contains("content") && delta["content"].is_string()) content[i] += delta["content"].get<std::string>();
              for (const char* field : {"reasoning", "reasoning_content"})
                if (delta.contains(field) && delta[field].is_string()) reasoning[i] += delta[field].get<std::string>();
              for (const Json& piece : delta.value("tool_calls", Json::array())) {
                if (piece["function"].contains("name")) names[i] = piece["function"]["name"];
                arguments[i] += piece["function"].value("arguments", "");
              }
            }
        } else {
          const HttpResult result = post(*server, "/v1/chat/completions", body);
          ASSERT_EQ(result.status, 200) << result.body;
          for (const Json& c : result.json.at("choices")) {
            const size_t i = c.at("index");
            const Json& message = c.at("message");
            EXPECT_TRUE(message.at("reasoning").is_null()) << result.body;
            if (message.at("content").is_string()) content[i] = message["content"];
            for (const Json& tool : message.value("tool_calls", Json::array())) {
              names[i] = tool["function"]["name"];
              arguments[i] = tool["function"]["arguments"];
            }
            EXPECT_EQ(c.at("finish_reason"), calling ? "tool_calls" : "stop") << result.body;
          }
        }
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_EQ(reasoning[i], "") << "choice " << i;
          std::string why;
          if (calling) {
            EXPECT_EQ(content[i], "") << "choice " << i;
            EXPECT_EQ(names[i], "tag") << "choice " << i;
            const Json parsed = Json::parse(arguments[i], nullptr, false);
            EXPECT_TRUE(!parsed.is_discarded() && validates(parsed, tools[0]["function"]["parameters"], why))
                << "choice " << i << ": " << arguments[i] << " " << why;
          } else {
            const Json parsed = Json::parse(content[i], nullptr, false);
            EXPECT_TRUE(!parsed.is_discarded() && validates(parsed, schema, why))
                << "choice " << i << ": " << content[i] << " " << why;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace anvil::test
