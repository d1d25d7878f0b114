// The gateway's own costs, against anvil_fake_backend (no engine): streams in flight at once must
// not wait for one another, a burst of new connections must not wait out dropped SYNs, and
// requests to a backend reuse their connections.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "rig/rig_harness.h"

namespace anvil::test {
namespace {

using Clock = std::chrono::steady_clock;

std::string fake_rig(const TempDir& dir, const std::string& fake_args, const std::string& extra = "") {
  return fmt::format("listen: 127.0.0.1:0\nstate_dir: {}\n{}models:\n  fake:\n    command: [{}, --port, '${{PORT}}'{}]\n"
                     "    preload: true\n    start_timeout: 30\n",
                     (dir.path() / "state").string(), extra, ANVIL_FAKE_BACKEND, fake_args);
}

// One streamed request on its own raw connection, so that many can be opened in one burst.
struct RawStream {
  int fd = -1;
  std::string request, received;
  size_t sent = 0;
  Clock::time_point started, first_chunk, finished;
  bool has_first = false, done = false;
};

// Opens every connection at once (non-blocking connects in one loop, as a benchmark or a batch
// job would), sends each a streamed completion, and notes when its first token and its [DONE]
// arrive.
std::vector<RawStream> burst_of_streams(int port, int count, double timeout_s) {
  std::vector<RawStream> streams(static_cast<size_t>(count));
  const std::string body = R"({"model":"fake","prompt":[1,2,3],"max_tokens":5,"stream":true})";
  for (auto& stream : streams) {
    stream.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(uint16_t(port));
    stream.started = Clock::now();
    connect(stream.fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
    stream.request = fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 "Content-Length: {}\r\n\r\n{}",
                                 body.size(), body);
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (Clock::now() < deadline) {
    std::vector<pollfd> polls;
    for (auto& stream : streams)
      if (!stream.done) polls.push_back({stream.fd, short(stream.sent < stream.request.size() ? POLLOUT : POLLIN), 0});
    if (polls.empty()) break;
    poll(polls.data(), polls.size(), 50);
    for (auto& stream : streams) {
      if (stream.done) continue;
      if (stream.sent < stream.request.size()) {
        const ssize_t n = send(stream.fd, stream.request.data() + stream.sent, stream.request.size() - stream.sent, MSG_NOSIGNAL);
        if (n > 0) stream.sent += size_t(n);
        continue;
      }
      char buffer[4096];
      const ssize_t n = recv(stream.fd, buffer, sizeof buffer, 0);
      if (n <= 0) continue;
      stream.received.append(buffer, size_t(n));
      if (!stream.has_first && stream.received.find("\"text\"") != std::string::npos) {
        stream.has_first = true;
        stream.first_chunk = Clock::now();
      }
      if (stream.received.find("data: [DONE]") != std::string::npos) {
        stream.done = true;
        stream.finished = Clock::now();
      }
    }
  }
  for (auto& stream : streams) close(stream.fd);
  return streams;
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

TEST(RigGateway, StreamsInFlightTogetherAllStartBeforeAnyEnds) {
  TempDir dir;
  // Each stream: its first token at once, its last 2 s later. A small wait queue (max_waiting)
  // must not shrink how many streams the gateway carries at once.
  RigProcess rig(dir.path(), fake_rig(dir, ", --first-token-ms, '0', --itl-ms, '500'", "queue:\n  max_waiting: 1\n"));
  ASSERT_GT(rig.port(), 0) << rig.log();
  ASSERT_TRUE(wait_until(30, [&] { return rig.backend("fake")["state"] == "ready"; })) << rig.log();

  const int count = 64;
  const auto streams = burst_of_streams(rig.port(), count, 20);
  Clock::time_point first_end = Clock::time_point::max(), last_start{};
  double slowest_first_ms = 0;
  int finished = 0;
  for (const auto& stream : streams) {
    ASSERT_TRUE(stream.has_first) << stream.received.substr(0, 300);
    finished += stream.done;
    if (stream.done) first_end = std::min(first_end, stream.finished);
    last_start = std::max(last_start, stream.first_chunk);
    slowest_first_ms = std::max(slowest_first_ms, ms(stream.first_chunk - stream.started));
  }
  EXPECT_EQ(finished, count);
  // Serialized streams (too few workers) would see their first token only after another ended.
  EXPECT_LT(ms(last_start - first_end), 0) << "the last first token came that many ms after the first stream ended";
  // A dropped SYN (the listen queue overflowing) costs TCP's initial retransmit timeout, 1 s.
  EXPECT_LT(slowest_first_ms, 900) << "a stream waited that long for its first token";
}

TEST(RigGateway, RequestsReuseTheirBackendConnection) {
  TempDir dir;
  RigProcess rig(dir.path(), fake_rig(dir, ""));
  ASSERT_GT(rig.port(), 0) << rig.log();
  ASSERT_TRUE(wait_until(30, [&] { return rig.backend("fake")["state"] == "ready"; })) << rig.log();
  for (int i = 0; i < 10; ++i) {
    const Json body = {{"model", "fake"}, {"prompt", {1, 2}}, {"max_tokens", 3}, {"stream", i % 2 == 0}};
    const HttpResult answer = rig.post("/v1/completions", body);
    ASSERT_EQ(answer.status, 200) << answer.body;
    if (i % 2 == 1) EXPECT_EQ(answer.json["usage"]["completion_tokens"], 3) << answer.body;
    else EXPECT_NE(answer.body.find("data: [DONE]"), std::string::npos) << answer.body;
  }
  httplib::Client direct("127.0.0.1", rig.backend("fake")["port"].get<int>());
  const auto stats = direct.Get("/stats");
  ASSERT_TRUE(stats);
  const Json counts = Json::parse(stats->body);
  EXPECT_EQ(counts["posts"], 10);
  EXPECT_EQ(counts["connections"], 1) << "one request after another should share one kept-alive connection";
}

}  // namespace
}  // namespace anvil::test
