// Many clients at once, and clients that leave: batching must not change anyone's tokens, a
// client that disconnects (mid-stream or while awaiting a whole answer) must give its KV blocks
// back, and past the queue bound clients are told to come back later without harm to the rest.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "support/server_harness.h"

namespace anvil::test {
namespace {

std::vector<int> stream_token_ids(const SseStream& stream) {
  std::vector<int> ids;
  for (const Json& event : stream.events)
    for (const Json& c : event.value("choices", Json::array()))
      for (const Json& id : c.value("token_ids", Json::array())) ids.push_back(id.get<int>());
  return ids;
}

TEST(ServerConcurrency, SixtyFourStreamsGetTheirSoloTokens) {
  ServerProcess& server = tiny_server();
  constexpr int kClients = 64;
  std::vector<Json> bodies;
  for (int c = 0; c < kClients; ++c) {
    std::vector<int> prompt;
    for (int i = 0; i < 6 + c % 23; ++i) prompt.push_back((c * 131 + i * 29 + 5) % 1024);
    bodies.push_back({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0},
                      {"ignore_eos", true}, {"return_token_ids", true}});
  }
  std::vector<Json> alone(kClients);
  for (int c = 0; c < kClients; ++c) {
    const HttpResult result = post(server, "/v1/completions", bodies[c]);
    ASSERT_EQ(result.status, 200) << result.body;
    alone[c] = result.json["choices"][0].at("token_ids");
  }
  std::vector<SseStream> streams(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Json body = bodies[c];
      body["stream"] = true;
      streams[c] = post_stream(server, "/v1/completions", body);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int c = 0; c < kClients; ++c) {
    ASSERT_EQ(streams[c].status, 200) << "client " << c << ": " << streams[c].raw;
    EXPECT_TRUE(streams[c].done) << "client " << c;
    EXPECT_EQ(Json(stream_token_ids(streams[c])), alone[c]) << "client " << c;
  }
}

// A raw socket, so the test decides exactly when the connection goes away.
class RawClient {
 public:
  explicit RawClient(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(uint16_t(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  bool send_all(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += size_t(n);
    }
    return true;
  }
  // Reads until `needle` has been seen `count` times (or the peer closes).
  std::string read_until(const std::string& needle, int count) {
    std::string received;
    char buffer[4096];
    while (true) {
      int seen = 0;
      for (size_t at = received.find(needle); at != std::string::npos; at = received.find(needle, at + 1)) ++seen;
      if (seen >= count) break;
      const ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      received.append(buffer, size_t(n));
    }
    return received;
  }

 private:
  int fd_;
  bool connected_ = false;
};

TEST(ServerConcurrency, ADisconnectedStreamFreesItsKvBlocks) {
  ServerProcess& server = tiny_server();
  const auto metrics = [&] { return get(server, "/metrics").body; };
  const double generated_before = metric_value(metrics(), "anvil:generation_tokens_total");

  const Json body = {{"model", "tiny"}, {"prompt", {1, 2, 3, 4, 5, 6, 7, 8}}, {"max_tokens", 4000},
                     {"ignore_eos", true}, {"stream", true}, {"temperature", 0}};
  const std::string payload = body.dump();
  {
    RawClient client(server.port());
    ASSERT_TRUE(client.connected());
    ASSERT_TRUE(client.send_all("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(payload.size()) + "\r\n\r\n" + payload));
    const std::string head = client.read_until("data: ", 3);
    ASSERT_NE(head.find("200 OK"), std::string::npos) << head;
    const std::string during = metrics();
    EXPECT_EQ(metric_value(during, "anvil:num_requests_running"), 1);
    EXPECT_GT(metric_value(during, "anvil:kv_cache_usage_perc"), 0);
  }  // the connection closes here, mid-stream
  bool freed = false;
  std::string after;
  for (int i = 0; i < 100 && !freed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = metrics();
    freed = metric_value(after, "anvil:num_requests_running") == 0 && metric_value(after, "anvil:kv_cache_usage_perc") == 0;
  }
  EXPECT_TRUE(freed) << after;
  // It was cancelled, not run to its 4000 tokens.
  EXPECT_LT(metric_value(after, "anvil:generation_tokens_total") - generated_before, 3000);
  EXPECT_EQ(get(server, "/health").status, 200);
}

// Polls /metrics until `done` holds for the text (about five seconds at most); the last text.
template <typename Predicate>
std::string wait_for_metrics(ServerProcess& server, Predicate done) {
  std::string text;
  for (int i = 0; i < 250; ++i) {
    text = get(server, "/metrics").body;
    if (done(text)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return text;
}

TEST(ServerConcurrency, ADisconnectedWholeResponseClientIsCancelled) {
  ServerProcess& server = tiny_server();
  const auto running = [](const std::string& text) { return metric_value(text, "anvil:num_requests_running"); };
  const auto kv_usage = [](const std::string& text) { return metric_value(text, "anvil:kv_cache_usage_perc"); };
  const double generated_before = metric_value(get(server, "/metrics").body, "anvil:generation_tokens_total");

  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    SCOPED_TRACE(path);
    // Not streamed: nothing is written to the client until the very end, so only watching the
    // socket can notice that it left.
    Json body = {{"max_tokens", 4000}, {"ignore_eos", true}, {"temperature", 0}};
    ServerProcess* target = &server;
    if (std::string(path) == "/v1/completions") {
      body["prompt"] = {1, 2, 3, 4, 5, 6, 7, 8};
    } else {
      target = &qwen_server();  // the tiny gpt-oss has no tokenizer, so no chat
      body["messages"] = {{{"role", "user"}, {"content", "count forever"}}};
      body["max_tokens"] = 3500;  // qwen3-tiny writes about 2000 tokens a second
    }
    const double target_before = metric_value(get(*target, "/metrics").body, "anvil:generation_tokens_total");
    const std::string payload = body.dump();
    {
      RawClient client(target->port());
      ASSERT_TRUE(client.connected());
      ASSERT_TRUE(client.send_all(std::string("POST ") + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                  "Content-Length: " + std::to_string(payload.size()) + "\r\n\r\n" + payload));
      const std::string during = wait_for_metrics(*target, [&](const std::string& text) { return running(text) == 1; });
      ASSERT_EQ(running(during), 1) << during;
      EXPECT_GT(kv_usage(during), 0);
    }  // the connection closes here, the answer still being generated
    const std::string after = wait_for_metrics(
        *target, [&](const std::string& text) { return running(text) == 0 && kv_usage(text) == 0; });
    EXPECT_EQ(running(after), 0) << after;
    EXPECT_EQ(metric_value(after, "anvil:num_requests_waiting"), 0) << after;
    EXPECT_EQ(kv_usage(after), 0) << after;
    // It was cancelled, not run to the end of its max_tokens.
    EXPECT_LT(metric_value(after, "anvil:generation_tokens_total") - target_before, body["max_tokens"].get<double>() * 0.75);
    EXPECT_EQ(get(*target, "/health").status, 200);
  }
  // The server goes on answering.
  const HttpResult next = post(server, "/v1/completions", Json{{"prompt", {1, 2, 3}}, {"max_tokens", 2}});
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_GT(metric_value(get(server, "/metrics").body, "anvil:generation_tokens_total"), generated_before);
}

TEST(ServerConcurrency, AFullQueueAnswers503WithRetryAfterAndLosesNothing) {
  // One sequence runs, one may wait: a third request at once must be turned away.
  ServerProcess server({tiny_model_dir().string(), "--max-num-seqs", "1", "--max-queued-requests", "1",
                        "--kv-cache-memory", "0.0625"});
  ASSERT_TRUE(server.wait_ready(60)) << server.log();
  const auto metric = [&](const char* name) { return metric_value(get(server, "/metrics").body, name); };
  // Long enough that the first is still running while the rest of the test knocks.
  constexpr int kTokens = 2500;
  auto body_for = [&](int seed) {
    std::vector<int> prompt;
    for (int i = 0; i < 12; ++i) prompt.push_back((seed * 97 + i * 13 + 1) % 1000);
    return Json{{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}, {"ignore_eos", true},
                {"return_token_ids", true}, {"stream", true}};
  };

  SseStream first, second;
  std::thread first_client([&] { first = post_stream(server, "/v1/completions", body_for(1)); });
  for (int i = 0; i < 250 && metric("anvil:num_requests_running") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread second_client([&] { second = post_stream(server, "/v1/completions", body_for(2)); });
  for (int i = 0; i < 250 && metric("anvil:num_requests_waiting") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(metric("anvil:num_requests_running"), 1);
  ASSERT_EQ(metric("anvil:num_requests_waiting"), 1);

  // Several more at once, streamed or not, chat or text: each is refused before any work.
  constexpr int kRefused = 6;
  std::vector<HttpResult> refused(kRefused);
  std::vector<std::thread> knockers;
  for (int k = 0; k < kRefused; ++k) {
    knockers.emplace_back([&, k] {
      Json body = body_for(10 + k);
      body["stream"] = k % 2 == 0;
      body["max_tokens"] = 4;
      refused[size_t(k)] = post(server, "/v1/completions", body.dump());
    });
  }
  for (std::thread& knocker : knockers) knocker.join();
  EXPECT_EQ(get(server, "/health").status, 200);
  // Still the same two: the refusals came while the first was running and the second waiting.
  EXPECT_EQ(metric("anvil:num_requests_running"), 1);
  EXPECT_EQ(metric("anvil:num_requests_waiting"), 1);
  for (const HttpResult& result : refused) {
    EXPECT_EQ(result.status, 503) << result.body;
    EXPECT_EQ(result.header("Retry-After"), "1");
    EXPECT_NE(result.header("Content-Type").find("application/json"), std::string::npos);
    const Json& error = result.json.at("error");
    EXPECT_EQ(error.at("code"), 503);
    EXPECT_EQ(error.at("type"), "ServiceUnavailableError");
    EXPECT_NE(error.at("message").get<std::string>().find("queue is full"), std::string::npos) << result.body;
  }

  first_client.join();
  second_client.join();
  // The two admitted requests finish whole, with the tokens each gets alone.
  for (const auto& [stream, seed] : {std::pair{&first, 1}, std::pair{&second, 2}}) {
    SCOPED_TRACE(seed);
    ASSERT_EQ(stream->status, 200) << stream->raw.substr(0, 400);
    EXPECT_TRUE(stream->done);
    Json alone = body_for(seed);
    alone.erase("stream");
    const HttpResult solo = post(server, "/v1/completions", alone);
    ASSERT_EQ(solo.status, 200) << solo.body;
    EXPECT_EQ(Json(stream_token_ids(*stream)), solo.json["choices"][0].at("token_ids"));
    EXPECT_EQ(stream_token_ids(*stream).size(), size_t(kTokens));
  }
  // And the queue takes requests again.
  EXPECT_EQ(post(server, "/v1/completions", Json{{"prompt", {1, 2}}, {"max_tokens", 2}}).status, 200);
  // More sequences in one request than the queue holds could never be admitted: that is the
  // client's error, not a reason to retry.
  const HttpResult too_many = post(server, "/v1/completions", Json{{"prompt", {1, 2}}, {"max_tokens", 2}, {"n", 2}});
  EXPECT_EQ(too_many.status, 400) << too_many.body;
  EXPECT_EQ(too_many.json.at("error").at("param"), "n");
}

}  // namespace
}  // namespace anvil::test
