#include "instant_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "support/server_harness.h"

namespace anvil::test {

namespace {

std::string hex(size_t n) {
  char text[32];
  std::snprintf(text, sizeof text, "%zx", n);
  return text;
}

void append_chunk(std::string& out, const std::string& data) {
  out += hex(data.size());
  out += "\r\n";
  out += data;
  out += "\r\n";
}

// `"key": 12` in a JSON body, without parsing it all; -1 when absent.
int64_t find_integer(const std::string& body, const std::string& key) {
  const size_t at = body.find("\"" + key + "\"");
  if (at == std::string::npos) return -1;
  size_t i = body.find(':', at);
  if (i == std::string::npos) return -1;
  ++i;
  while (i < body.size() && body[i] == ' ') ++i;
  return std::atoll(body.c_str() + i);
}

// Token ids in a `"prompt": [1, 2, 3]` body; 1 for a text prompt.
int64_t prompt_ids(const std::string& body) {
  const size_t at = body.find("\"prompt\":[");
  if (at == std::string::npos) return 1;
  const size_t end = body.find(']', at);
  int64_t count = 1;
  for (size_t i = at; i < end && i < body.size(); ++i) count += body[i] == ',';
  return count;
}

struct Client {
  std::string in;
};

}  // namespace

InstantServer::InstantServer(Options options) : options_(options) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int yes = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(listen_fd_, SOMAXCONN) != 0)
    throw std::runtime_error("InstantServer: cannot listen");
  socklen_t length = sizeof address;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &event);
  event.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event);
  thread_ = std::thread([this] { loop(); });
}

InstantServer::~InstantServer() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
  ::close(epoll_fd_);
  ::close(listen_fd_);
}

std::vector<std::string> InstantServer::bodies() const {
  const std::lock_guard lock(mutex_);
  return bodies_;
}

void InstantServer::loop() {
  std::unordered_map<int, Client> clients;
  epoll_event events[256];
  char buffer[65536];
  while (true) {
    const int n = epoll_wait(epoll_fd_, events, 256, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int e = 0; e < n; ++e) {
      const int fd = events[e].data.fd;
      if (fd == wake_fd_) {
        for (auto& [client_fd, client] : clients) ::close(client_fd);
        return;
      }
      if (fd == listen_fd_) {
        while (true) {
          const int client_fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (client_fd < 0) break;
          int yes = 1;
          setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
          epoll_event event{};
          event.events = EPOLLIN | EPOLLRDHUP;
          event.data.fd = client_fd;
          epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, client_fd, &event);
          clients[client_fd] = Client{};
          ++connections_;
        }
        continue;
      }
      Client& client = clients[fd];
      bool closed = false;
      while (true) {
        const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
        if (got > 0) {
          client.in.append(buffer, size_t(got));
          continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) closed = true;
        break;
      }
      // Answer every complete request in the buffer.
      std::string out;
      while (true) {
        const size_t head_end = client.in.find("\r\n\r\n");
        if (head_end == std::string::npos) break;
        const std::string head = client.in.substr(0, head_end);
        int64_t length = 0;
        for (const char* name : {"Content-Length:", "content-length:"}) {
          const size_t at = head.find(name);
          if (at != std::string::npos) length = std::atoll(head.c_str() + at + std::strlen(name));
        }
        if (client.in.size() < head_end + 4 + size_t(length)) break;
        const std::string body = client.in.substr(head_end + 4, size_t(length));
        const bool chat = head.find("chat/completions") != std::string::npos;
        client.in.erase(0, head_end + 4 + size_t(length));
        const int64_t number = ++requests_;
        {
          const std::lock_guard lock(mutex_);
          if (bodies_.size() < 16) bodies_.push_back(body);
        }
        if (options_.fail_every > 0 && number % options_.fail_every == 0) {
          const std::string error = R"({"error":{"message":"injected failure","type":"InternalServerError","code":500}})";
          out += "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: " +
                 std::to_string(error.size()) + "\r\n\r\n" + error;
          continue;
        }
        int64_t tokens = find_integer(body, "max_tokens");
        if (tokens <= 0) tokens = options_.default_tokens;
        tokens = std::min<int64_t>(tokens, 4096);
        out += "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        for (int64_t t = 0; t < tokens; ++t) {
          const bool last = t + 1 == tokens;
          const std::string finish = last ? "\"length\"" : "null";
          const std::string chunk =
              chat ? R"(data: {"id":"x","object":"chat.completion.chunk","model":"instant","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":)" +
                         finish + "}]}\n\n"
                   : R"(data: {"id":"x","object":"text_completion","model":"instant","choices":[{"index":0,"text":" tok","finish_reason":)" +
                         finish + "}]}\n\n";
          append_chunk(out, chunk);
        }
        if (options_.usage)
          append_chunk(out, R"(data: {"id":"x","object":"text_completion","model":"instant","choices":[],"usage":{"prompt_tokens":)" +
                                std::to_string(prompt_ids(body)) +
                                R"(,"completion_tokens":)" + std::to_string(tokens) + "}}\n\n");
        append_chunk(out, "data: [DONE]\n\n");
        out += "0\r\n\r\n";
      }
      if (!out.empty()) {
        size_t sent = 0;
        while (sent < out.size()) {
          const ssize_t w = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
          if (w > 0) {
            sent += size_t(w);
            continue;
          }
          if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            // Replies are small; a full socket buffer means a stuck client: wait for it briefly.
            pollfd p{fd, POLLOUT, 0};
            ::poll(&p, 1, 1000);
            continue;
          }
          closed = true;
          break;
        }
      }
      if (closed) {
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        clients.erase(fd);
      }
    }
  }
}

// ---- BrokenProxy ----------------------------------------------------------------------------

BrokenProxy::BrokenProxy(int upstream_port, Mode mode) : upstream_port_(upstream_port), mode_(mode) {
  auto forward_get = [this](const httplib::Request& req, httplib::Response& res) {
    httplib::Client upstream("127.0.0.1", upstream_port_);
    upstream.set_read_timeout(300, 0);
    if (auto reply = upstream.Get(req.path)) {
      res.status = reply->status;
      res.set_content(reply->body, reply->get_header_value("Content-Type"));
    } else {
      res.status = 502;
    }
  };
  server_.Get(R"(/.*)", forward_get);
  server_.Post(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
    nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
    const bool chat = req.path == "/v1/chat/completions";
    if (chat && body.is_object()) {
      if (mode_ == Mode::kDropResponseFormat) body.erase("response_format");
      if (mode_ == Mode::kDropTools) body.erase("tools"), body.erase("tool_choice");
      if (mode_ == Mode::kDropStop) body.erase("stop");
    }
    const bool stream = body.is_object() && body.value("stream", false);
    httplib::Client upstream("127.0.0.1", upstream_port_);
    upstream.set_read_timeout(300, 0);
    auto reply = upstream.Post(req.path, body.is_object() ? body.dump() : req.body, "application/json");
    if (!reply) {
      res.status = 502;
      return;
    }
    res.status = reply->status;
    if (!chat || reply->status != 200) {
      res.set_content(reply->body, reply->get_header_value("Content-Type"));
      return;
    }
    if (stream) {
      res.set_content(transform_stream(reply->body), "text/event-stream");
      return;
    }
    res.set_content(transform_reply(nlohmann::json::parse(reply->body)).dump(), "application/json");
  });
  port_ = server_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

BrokenProxy::~BrokenProxy() {
  server_.stop();
  if (thread_.joinable()) thread_.join();
}

namespace {

const char* const kFakeThought = "Let me think. 17 times 20 is 340, and 17 times 3 is 51, so 17 times 23 is 391.";

}  // namespace

nlohmann::json BrokenProxy::transform_reply(nlohmann::json reply) const {
  if (!reply.contains("choices") || reply["choices"].empty()) return reply;
  nlohmann::json& message = reply["choices"][0]["message"];
  const std::string content = message.value("content", nlohmann::json()).is_string() ? message["content"].get<std::string>() : "";
  std::string reasoning;
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    reasoning = message["reasoning_content"].get<std::string>();
  if (mode_ == Mode::kReasoningInContent) {
    // What a server with its reasoning parser off returns for gpt-oss: the raw harmony channels.
    message["content"] = "<|channel|>analysis<|message|>" + reasoning + "<|end|><|start|>assistant<|channel|>final<|message|>" + content;
    message.erase("reasoning_content");
    message.erase("reasoning");
  } else if (mode_ == Mode::kCopyReasoning) {
    message["reasoning_content"] = kFakeThought;
    message["reasoning"] = kFakeThought;
    message["content"] = std::string(kFakeThought) + "\n" + content;
  }
  return reply;
}

std::string BrokenProxy::transform_stream(const std::string& raw) const {
  const SseStream stream = parse_sse(200, raw);
  std::vector<nlohmann::json> events = stream.events;
  if (mode_ == Mode::kStreamDiffers) {
    // One extra character in the last content delta (or a new one before the end).
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (!it->contains("choices") || (*it)["choices"].empty()) continue;
      nlohmann::json& delta = (*it)["choices"][0]["delta"];
      delta["content"] = (delta.value("content", nlohmann::json()).is_string() ? delta["content"].get<std::string>() : "") + "~";
      break;
    }
  } else if (mode_ == Mode::kReasoningInContent || mode_ == Mode::kCopyReasoning) {
    bool opened = false;
    for (nlohmann::json& event : events) {
      if (!event.contains("choices") || event["choices"].empty()) continue;
      nlohmann::json& delta = event["choices"][0]["delta"];
      if (mode_ == Mode::kCopyReasoning) {
        if (!opened) delta["content"] = std::string(kFakeThought) + "\n", delta["reasoning_content"] = kFakeThought;
        opened = true;
        continue;
      }
      std::string text;
      if (!opened) text = "<|channel|>analysis<|message|>", opened = true;
      if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string())
        text += delta["reasoning_content"].get<std::string>();
      if (delta.contains("content") && delta["content"].is_string()) text += delta["content"].get<std::string>();
      delta.erase("reasoning_content");
      delta.erase("reasoning");
      delta["content"] = text;
    }
  }
  std::string out;
  for (const nlohmann::json& event : events) out += "data: " + event.dump() + "\n\n";
  if (stream.done) out += "data: [DONE]\n\n";
  return out;
}

}  // namespace anvil::test
