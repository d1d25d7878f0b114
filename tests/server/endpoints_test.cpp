// Every route of `anvil serve` over loopback: shapes, status codes, auth, limits, lifecycle.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support/server_harness.h"

namespace anvil::test {
namespace {

TEST(ServerEndpoints, HealthIs503WhileLoadingThen200) {
  ServerProcess& server = demo_server();  // 212 MB of weights and a 28 MB tokenizer: loading takes a while
  EXPECT_EQ(server.first_health_status(), 503);
  const HttpResult health = get(server, "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "");
}

TEST(ServerEndpoints, VersionAndModelsListEveryAlias) {
  ServerProcess& server = tiny_server();
  const HttpResult version = get(server, "/version");
  ASSERT_EQ(version.status, 200);
  EXPECT_TRUE(version.json.at("version").is_string());

  const HttpResult models = get(server, "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.json.at("object"), "list");
  ASSERT_EQ(models.json.at("data").size(), 2u);
  EXPECT_EQ(models.json["data"][0].at("id"), "tiny");
  EXPECT_EQ(models.json["data"][1].at("id"), "tiny-alias");
  EXPECT_EQ(models.json["data"][0].at("object"), "model");
  EXPECT_EQ(models.json["data"][0].at("max_model_len"), 4096);

  EXPECT_EQ(get(server, "/v1/models/tiny-alias").json.at("id"), "tiny-alias");
  EXPECT_EQ(get(server, "/v1/models/other").status, 404);

  // Either name is accepted; responses name the first.
  const HttpResult completion = post(server, "/v1/completions", Json{{"model", "tiny-alias"}, {"prompt", {1, 2, 3}}, {"max_tokens", 2}});
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(completion.json.at("model"), "tiny");
  EXPECT_EQ(completion.json.at("object"), "text_completion");
}

TEST(ServerEndpoints, MetricsUseVllmNamesWithAnvilPrefix) {
  ServerProcess& server = tiny_server();
  ASSERT_EQ(post(server, "/v1/completions", Json{{"prompt", {5, 6, 7}}, {"max_tokens", 3}, {"ignore_eos", true}}).status, 200);
  const HttpResult metrics = get(server, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.header("Content-Type").find("text/plain"), std::string::npos);
  for (const char* name :
       {"anvil:num_requests_running", "anvil:num_requests_waiting", "anvil:kv_cache_usage_perc", "anvil:prompt_tokens_total",
        "anvil:generation_tokens_total", "anvil:prefix_cache_queries_total", "anvil:prefix_cache_hits_total",
        "anvil:time_to_first_token_seconds_count", "anvil:time_per_output_token_seconds_count",
        "anvil:e2e_request_latency_seconds_count", "anvil:request_success_total"})
    EXPECT_GE(metric_value(metrics.body, name), 0) << name;
  EXPECT_GE(metric_value(metrics.body, "anvil:generation_tokens_total"), 3);
  EXPECT_GE(metric_value(metrics.body, "anvil:e2e_request_latency_seconds_count"), 1);
  EXPECT_NE(metrics.body.find("anvil:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"}"), std::string::npos);
  EXPECT_NE(metrics.body.find("# TYPE anvil:e2e_request_latency_seconds histogram"), std::string::npos);
}

TEST(ServerEndpoints, TokenizeAndDetokenize) {
  ServerProcess& server = demo_server();
  const HttpResult tokens = post(server, "/tokenize", Json{{"prompt", "Hello world"}, {"return_token_strs", true}});
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  EXPECT_EQ(tokens.json.at("tokens"), Json({13225, 2375}));
  EXPECT_EQ(tokens.json.at("count"), 2);
  EXPECT_EQ(tokens.json.at("token_strs"), Json({"Hello", " world"}));
  EXPECT_EQ(tokens.json.at("max_model_len"), 131072);

  const HttpResult text = post(server, "/detokenize", Json{{"tokens", {13225, 2375}}});
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_EQ(text.json.at("prompt"), "Hello world");

  // A chat renders through the model's format: harmony starts with <|start|>system.
  const HttpResult chat = post(server, "/tokenize", Json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.json.at("tokens")[0], 200006);
  EXPECT_EQ(post(server, "/detokenize", Json{{"tokens", {-1}}}).status, 400);
  EXPECT_EQ(post(server, "/detokenize", Json{{"tokens", {999999999}}}).status, 400);
  // Without a tokenizer the route says so.
  EXPECT_EQ(post(tiny_server(), "/tokenize", Json{{"prompt", "x"}}).status, 400);
}

TEST(ServerEndpoints, UnknownRoutesModelsAndMethodsAreJsonErrors) {
  ServerProcess& server = tiny_server();
  const HttpResult route = get(server, "/v2/whatever");
  EXPECT_EQ(route.status, 404);
  EXPECT_EQ(route.json.at("error").at("code"), 404);
  EXPECT_TRUE(route.json["error"].at("message").is_string());

  const HttpResult model = post(server, "/v1/completions", Json{{"model", "gpt-4"}, {"prompt", {1}}});
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(model.json["error"].at("type"), "NotFoundError");
  EXPECT_EQ(model.json["error"].at("param"), "model");
  EXPECT_EQ(model.json["error"].at("message"), "The model `gpt-4` does not exist.");

  EXPECT_EQ(get(server, "/v1/chat/completions").status, 405);
}

TEST(ServerEndpoints, BodiesOverTheLimitGet413) {
  ServerProcess& server = tiny_server();  // --max-body-bytes 1048576
  const std::string big = "{\"prompt\": \"" + std::string(1100000, 'a') + "\"}";
  const HttpResult result = post(server, "/v1/completions", big);
  EXPECT_EQ(result.status, 413);
  // Form-encoded bodies (curl -d) are read under the same limit, not httplib's 8 KiB one: this
  // one is read and judged on its content.
  auto client = server.client();
  const Json small = {{"prompt", std::vector<int>(3000, 7)}, {"max_tokens", 0}};
  const auto form = client.Post("/v1/completions", small.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 400) << form->body;
  EXPECT_EQ(Json::parse(form->body).at("error").at("param"), "max_tokens");
  EXPECT_EQ(get(server, "/health").status, 200);
}

TEST(ServerEndpoints, ApiKeyGuardsV1RoutesOnly) {
  ServerProcess server({tiny_model_dir().string(), "--api-key", "sk-test", "--kv-cache-memory", "0.01"});
  ASSERT_TRUE(server.wait_ready(60)) << server.log();
  EXPECT_EQ(get(server, "/v1/models").status, 401);
  EXPECT_EQ(get(server, "/v1/models", {{"Authorization", "Bearer sk-wrong"}}).status, 401);
  EXPECT_EQ(get(server, "/v1/models", {{"Authorization", "sk-test"}}).status, 401);
  const HttpResult ok = get(server, "/v1/models", {{"Authorization", "Bearer sk-test"}});
  EXPECT_EQ(ok.status, 200);
  // The default served name is the model directory as given.
  EXPECT_EQ(ok.json.at("data")[0].at("id"), tiny_model_dir().string());
  const HttpResult unauthorized = post(server, "/v1/completions", Json{{"prompt", {1}}}.dump());
  EXPECT_EQ(unauthorized.status, 401);
  EXPECT_EQ(unauthorized.json.at("error").at("code"), 401);
  EXPECT_EQ(get(server, "/health").status, 200);
  EXPECT_EQ(get(server, "/metrics").status, 200);
  // SIGTERM is a clean shutdown.
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(ServerEndpoints, BadCommandLinesFailWithOneLine) {
  const auto missing = run_anvil("serve /nonexistent/model --port 0");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model"), std::string::npos) << missing.err;
  const auto format = run_anvil("serve '" + tiny_model_dir().string() + "' --load-format bogus");
  EXPECT_EQ(format.exit_code, 1);
  EXPECT_NE(format.err.find("--load-format"), std::string::npos) << format.err;
  // A port in use is an error, not a second server sharing it.
  const auto taken = run_anvil("serve '" + tiny_model_dir().string() + "' --port " + std::to_string(tiny_server().port()));
  EXPECT_EQ(taken.exit_code, 1);
  EXPECT_NE(taken.err.find("cannot listen"), std::string::npos) << taken.err;
}

TEST(ServerEndpoints, ShutdownEndsOpenStreamsAndExitsZero) {
  ServerProcess server({tiny_model_dir().string(), "--kv-cache-memory", "0.01"});
  ASSERT_TRUE(server.wait_ready(60)) << server.log();
  std::string received;
  std::thread client([&] {
    auto c = server.client();
    const Json body = {{"prompt", {1, 2, 3}}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}};
    if (auto result = c.Post("/v1/completions", body.dump(), "application/json")) received = result->body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.stop(), 0) << server.log();
  client.join();
  const SseStream stream = parse_sse(200, received);
  EXPECT_TRUE(stream.done) << received.substr(0, 300);
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back().at("error").at("code"), 503);
}

TEST(ServerEndpoints, ALoadFailureExitsNonZero) {
  TempDir dir;
  write_file(dir.path() / "config.json", "{\"architectures\": [\"NopeForCausalLM\"]}");
  ServerProcess server({dir.path().string()});
  EXPECT_FALSE(server.wait_ready(30));
  for (int i = 0; i < 200 && server.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(server.alive()) << server.log();
  EXPECT_NE(server.log().find("failed"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace anvil::test
