// The gateway's upstream client: pieces of a stream as the backend writes them, kept-alive
// connections reused, dead ones replaced, broken answers reported.
#include "rig/upstream.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <thread>

#include "rig/rig_harness.h"

namespace anvil::rig {
namespace {

// A loopback server that runs `script` on each accepted connection, one after another, so a
// test can misbehave exactly as it likes at the byte level.
class RawServer {
 public:
  explicit RawServer(std::function<void(int fd, int connection)> script) : script_(std::move(script)) {
    fd_ = test::listen_loopback(port_);
    thread_ = std::thread([this] {
      for (int connection = 0;; ++connection) {
        const int client = accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        script_(client, connection);
        close(client);
      }
    });
  }
  ~RawServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  std::function<void(int, int)> script_;
  int fd_ = -1, port_ = 0;
  std::thread thread_;
};

// Reads one request's head and its Content-Length body; false when the peer closed first.
bool read_request(int fd) {
  std::string data;
  char buffer[4096];
  for (;;) {
    const size_t end = data.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = data.find("Content-Length: ");
      const size_t length = at == std::string::npos ? 0 : std::stoul(data.substr(at + 16));
      if (data.size() >= end + 4 + length) return true;
    }
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return false;
    data.append(buffer, size_t(n));
  }
}

void send_text(int fd, const std::string& text) { ASSERT_EQ(send(fd, text.data(), text.size(), MSG_NOSIGNAL), ssize_t(text.size())); }

UpstreamRequest completion() {
  UpstreamRequest request;
  request.target = "/v1/completions";
  request.headers.emplace("Content-Type", "application/json");
  request.body = R"({"model":"m","stream":true})";
  request.read_timeout_s = 10;
  return request;
}

TEST(RigUpstream, HandsOverEachChunkBeforeTheNextIsWritten) {
  std::promise<void> first_read;
  auto first_read_done = first_read.get_future();
  RawServer server([&](int fd, int) {
    if (!read_request(fd)) return;
    send_text(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    send_text(fd, "d\r\ndata: first\n\n\r\n");
    // The second chunk only once the client has the first: a client that waited for more
    // (a buffering proxy) would time out here instead.
    if (first_read_done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) return;
    send_text(fd, "e\r\ndata: second\n\n\r\n0\r\n\r\n");
    read_request(fd);  // keeps the connection open until the client leaves
  });
  UpstreamPool pool;
  {
    UpstreamResponse answer(pool, server.port(), completion());
    ASSERT_EQ(answer.status(), 200) << answer.error();
    EXPECT_TRUE(answer.chunked());
    EXPECT_EQ(answer.headers().find("content-type")->second, "text/event-stream");
    std::string piece;
    ASSERT_TRUE(answer.read(piece)) << answer.error();
    EXPECT_EQ(piece, "data: first\n\n");
    first_read.set_value();
    ASSERT_TRUE(answer.read(piece)) << answer.error();
    EXPECT_EQ(piece, "data: second\n\n");
    EXPECT_FALSE(answer.read(piece));
    EXPECT_EQ(answer.error(), "");
    // Back in the pool at the body's end, before the answer object dies: the gateway sends the
    // client the stream's end first, and the client's next request must find the connection idle.
    EXPECT_EQ(pool.idle(server.port()), 1u);
  }
  EXPECT_EQ(pool.idle(server.port()), 1u);
}

TEST(RigUpstream, ReusesAKeptAliveConnectionAndReplacesOneClosedUnderIt) {
  std::atomic<int> connections{0};
  RawServer server([&](int fd, int connection) {
    connections = connection + 1;
    // The first connection answers once, then reads the next request and closes without a word,
    // as a backend does when its keep-alive timer fires just as the request arrives.
    for (int request = 0; read_request(fd); ++request) {
      if (connection == 0 && request == 1) return;
      send_text(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }
  });
  UpstreamPool pool;
  std::string body;
  {
    UpstreamResponse answer(pool, server.port(), completion());
    ASSERT_EQ(answer.status(), 200) << answer.error();
    EXPECT_FALSE(answer.chunked());
    ASSERT_TRUE(answer.read_all(body));
    EXPECT_EQ(body, "ok");
    EXPECT_EQ(pool.idle(server.port()), 1u);  // at the body's end, not when the answer dies
  }
  ASSERT_EQ(pool.idle(server.port()), 1u);
  {
    UpstreamResponse answer(pool, server.port(), completion());  // the pooled one dies: sent again on a new one
    ASSERT_EQ(answer.status(), 200) << answer.error();
    ASSERT_TRUE(answer.read_all(body));
    EXPECT_EQ(body, "ok");
  }
  EXPECT_EQ(connections, 2);
  {
    UpstreamResponse answer(pool, server.port(), completion());
    ASSERT_EQ(answer.status(), 200) << answer.error();
    ASSERT_TRUE(answer.read_all(body));
  }
  EXPECT_EQ(connections, 2);  // the second connection carried the third request too
}

TEST(RigUpstream, ReportsABackendThatBreaksOffOrIsNotThere) {
  RawServer server([&](int fd, int) {
    if (!read_request(fd)) return;
    send_text(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  });
  UpstreamPool pool;
  {
    UpstreamResponse answer(pool, server.port(), completion());
    ASSERT_EQ(answer.status(), 200) << answer.error();
    std::string piece;
    ASSERT_TRUE(answer.read(piece));
    EXPECT_EQ(piece, "hello");
    EXPECT_FALSE(answer.read(piece));
    EXPECT_EQ(answer.error(), "127.0.0.1:" + std::to_string(server.port()) + " closed the connection in the middle of the body");
  }
  EXPECT_EQ(pool.idle(server.port()), 0u);

  int closed_port = 0;
  {
    RawServer gone([](int, int) {});
    closed_port = gone.port();
  }
  UpstreamResponse refused(pool, closed_port, completion());
  EXPECT_EQ(refused.status(), 0);
  EXPECT_EQ(refused.error(), "cannot connect to 127.0.0.1:" + std::to_string(closed_port) + ": Connection refused");
}

TEST(RigUpstream, GivesUpOnABackendSilentPastItsReadTimeout) {
  RawServer server([&](int fd, int) {
    if (!read_request(fd)) return;
    send_text(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    read_request(fd);  // silent until the client gives up
  });
  UpstreamPool pool;
  UpstreamRequest request = completion();
  request.read_timeout_s = 1;
  UpstreamResponse answer(pool, server.port(), request);
  ASSERT_EQ(answer.status(), 200) << answer.error();
  const auto started = std::chrono::steady_clock::now();
  std::string piece;
  EXPECT_FALSE(answer.read(piece));
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(900));
  EXPECT_EQ(answer.error(), "127.0.0.1:" + std::to_string(server.port()) + " sent nothing for 1 s");
}

}  // namespace
}  // namespace anvil::rig
