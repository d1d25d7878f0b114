#include "tools/bench_loop.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tools/openai_client.h"

namespace anvil::tools {

namespace {

using Json = nlohmann::json;

double monotonic_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Thousands of streams at once need thousands of descriptors; the soft limit is often 1024.
void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

struct Conn {
  enum class State { Connecting, Writing, Reading, Idle };
  int fd = -1;
  State state = State::Connecting;
  uint32_t events = 0;  // what epoll watches now
  int64_t req = -1;
  size_t written = 0;
  bool reused = false;     // an earlier reply came over it
  bool got_bytes = false;  // a byte of the current reply has arrived
  bool retried = false;    // the current request already moved once off a stale connection

  // The reply being read.
  std::string head;
  bool headers_done = false;
  int status = 0;
  bool chunked = false, keep_alive = true;
  int64_t content_left = -1;  // Content-Length still to come; -1 when the reply has none
  enum class Chunk { Size, Data, DataEnd, Trailer } chunk = Chunk::Size;
  std::string chunk_line;
  int64_t chunk_left = 0;
  SseParser sse;
  std::string error_body;
  bool first_chunk = false, stream_error = false, complete = false;
  double last_t = 0;

  void reset_reply() {
    got_bytes = false;
    head.clear();
    headers_done = false;
    status = 0;
    chunked = false;
    keep_alive = true;
    content_left = -1;
    chunk = Chunk::Size;
    chunk_line.clear();
    chunk_left = 0;
    sse = SseParser();
    error_body.clear();
    first_chunk = stream_error = complete = false;
    last_t = 0;
    written = 0;
  }
};

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

class LoadLoop {
 public:
  LoadLoop(const LoadOptions& options, const std::vector<LoadRequest>& requests)
      : options_(options), requests_(requests), records_(requests.size()) {
    resolve();
    raise_fd_limit();
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (epoll_ < 0 || timer_ < 0) fail("bench: cannot create the event loop ({})", std::strerror(errno));
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.ptr = nullptr;  // the timer
    epoll_ctl(epoll_, EPOLL_CTL_ADD, timer_, &event);
  }

  ~LoadLoop() {
    for (auto& conn : conns_)
      if (conn->fd >= 0) ::close(conn->fd);
    if (timer_ >= 0) ::close(timer_);
    if (epoll_ >= 0) ::close(epoll_);
  }

  LoadResult run() {
    const size_t n = requests_.size();
    base_ = monotonic_now();
    double last_scan = 0;
    epoll_event events[256];
    while (done_ < n) {
      dispatch();
      arm_timer();
      const int count = epoll_wait(epoll_, events, 256, 100);
      if (count < 0 && errno != EINTR) fail("bench: epoll_wait failed ({})", std::strerror(errno));
      for (int i = 0; i < count; ++i) {
        Conn* conn = static_cast<Conn*>(events[i].data.ptr);
        if (!conn) {
          uint64_t expirations = 0;
          [[maybe_unused]] const ssize_t r = ::read(timer_, &expirations, sizeof expirations);
          armed_at_ = -1;
          continue;
        }
        handle(conn, events[i].events);
      }
      const double now = elapsed();
      if (now - last_scan >= 0.1) {
        last_scan = now;
        expire(now);
      }
    }
    LoadResult result;
    result.duration = end_time_;
    result.records = std::move(records_);
    return result;
  }

 private:
  double elapsed() const { return monotonic_now() - base_; }

  void resolve() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string host = options_.host.size() > 2 && options_.host.front() == '['
                                 ? options_.host.substr(1, options_.host.size() - 2)
                                 : options_.host;
    const int rc = getaddrinfo(host.c_str(), std::to_string(options_.port).c_str(), &hints, &found);
    if (rc != 0 || !found) fail("bench: cannot resolve {} ({})", options_.host, gai_strerror(rc));
    std::memcpy(&address_, found->ai_addr, found->ai_addrlen);
    address_length_ = found->ai_addrlen;
    family_ = found->ai_family;
    freeaddrinfo(found);
  }

  void watch(Conn* conn, uint32_t events) {
    if (conn->events == events) return;
    epoll_event event{};
    event.events = events;
    event.data.ptr = conn;
    epoll_ctl(epoll_, conn->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, conn->fd, &event);
    conn->events = events;
  }

  // A fresh connection, connecting; nullptr (with errno) when the socket cannot even start.
  Conn* open_connection() {
    const int fd = ::socket(family_, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&address_), address_length_) != 0 && errno != EINPROGRESS) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      return nullptr;
    }
    conns_.push_back(std::make_unique<Conn>());
    Conn* conn = conns_.back().get();
    conn->fd = fd;
    conn->state = Conn::State::Connecting;
    watch(conn, EPOLLOUT);
    return conn;
  }

  void close_connection(Conn* conn) {
    if (conn->fd >= 0) {
      epoll_ctl(epoll_, EPOLL_CTL_DEL, conn->fd, nullptr);
      ::close(conn->fd);
    }
    conn->fd = -1;
    conn->events = 0;
    if (conn->state == Conn::State::Idle) idle_.erase(std::remove(idle_.begin(), idle_.end(), conn), idle_.end());
    conn->req = -1;
    // Retired connections stay allocated (their pointers may still sit in this round's events);
    // drop them in bulk once there are many.
    ++closed_;
  }

  void dispatch() {
    const size_t n = requests_.size();
    while (next_ < n && (options_.max_concurrency <= 0 || inflight_ < options_.max_concurrency) &&
           requests_[next_].arrival <= elapsed()) {
      start(int64_t(next_++));
    }
  }

  void arm_timer() {
    const size_t n = requests_.size();
    if (next_ >= n || (options_.max_concurrency > 0 && inflight_ >= options_.max_concurrency)) return;
    const double at = requests_[next_].arrival;
    if (armed_at_ == at) return;
    armed_at_ = at;
    const double absolute = base_ + at;
    itimerspec spec{};
    spec.it_value.tv_sec = time_t(absolute);
    spec.it_value.tv_nsec = long((absolute - double(spec.it_value.tv_sec)) * 1e9);
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
    timerfd_settime(timer_, TFD_TIMER_ABSTIME, &spec, nullptr);
  }

  void start(int64_t req) {
    ++inflight_;
    RequestRecord& record = records_[size_t(req)];
    record.prompt_len = requests_[size_t(req)].prompt_len;
    Conn* conn = nullptr;
    if (!idle_.empty()) {
      conn = idle_.back();
      idle_.pop_back();
    }
    record.start = elapsed();
    if (!conn) {
      conn = open_connection();
      if (!conn) {
        finish_failed(req, fmt::format("cannot connect to {}:{} ({})", options_.host, options_.port, std::strerror(errno)));
        return;
      }
    }
    conn->req = req;
    conn->retried = false;
    conn->reset_reply();
    if (conn->state != Conn::State::Connecting) {
      conn->state = Conn::State::Writing;
      write_request(conn);
    }
  }

  // Moves the request of a kept-alive connection the server had already closed to a new one.
  bool retry_on_fresh(Conn* conn) {
    if (!conn->reused || conn->got_bytes || conn->retried) return false;
    const int64_t req = conn->req;
    close_connection(conn);
    Conn* fresh = open_connection();
    if (!fresh) return false;
    records_[size_t(req)].start = elapsed();
    fresh->req = req;
    fresh->retried = true;
    fresh->reset_reply();
    return true;
  }

  void write_request(Conn* conn) {
    const std::string& http = requests_[size_t(conn->req)].http;
    while (conn->written < http.size()) {
      const ssize_t n = ::send(conn->fd, http.data() + conn->written, http.size() - conn->written, MSG_NOSIGNAL);
      if (n > 0) {
        conn->written += size_t(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        watch(conn, EPOLLOUT);
        return;
      }
      if (n < 0 && errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      const int64_t req = conn->req;
      if (retry_on_fresh(conn)) return;
      if (conn->fd >= 0) close_connection(conn);
      finish_failed(req, "sending the request failed (" + why + ")");
      return;
    }
    conn->state = Conn::State::Reading;
    watch(conn, EPOLLIN | EPOLLRDHUP);
  }

  void handle(Conn* conn, uint32_t events) {
    if (conn->fd < 0) return;  // closed earlier in this round
    switch (conn->state) {
      case Conn::State::Idle:
        // An idle connection that turns readable was closed by the server (keep-alive timeout).
        close_connection(conn);
        return;
      case Conn::State::Connecting: {
        int error = 0;
        socklen_t length = sizeof error;
        getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error != 0) {
          const int64_t req = conn->req;
          close_connection(conn);
          if (req >= 0) finish_failed(req, fmt::format("cannot connect to {}:{} ({})", options_.host, options_.port, std::strerror(error)));
          return;
        }
        if (conn->req < 0) {  // nothing to send yet (cannot happen: connections open for a request)
          conn->state = Conn::State::Idle;
          idle_.push_back(conn);
          watch(conn, EPOLLIN | EPOLLRDHUP);
          return;
        }
        conn->state = Conn::State::Writing;
        write_request(conn);
        return;
      }
      case Conn::State::Writing:
        write_request(conn);
        return;
      case Conn::State::Reading:
        read_reply(conn);
        return;
    }
  }

  void read_reply(Conn* conn) {
    char buffer[65536];
    while (conn->fd >= 0 && conn->state == Conn::State::Reading) {
      const ssize_t n = ::recv(conn->fd, buffer, sizeof buffer, 0);
      if (n > 0) {
        const double now = elapsed();
        conn->got_bytes = true;
        consume(conn, buffer, size_t(n), now);
        if (conn->complete) {
          finish(conn, now);
          return;
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      // The server closed (n == 0) or reset the connection.
      const std::string why = n == 0 ? "the server closed the connection" : std::string(std::strerror(errno));
      const double now = elapsed();
      if (conn->headers_done && !conn->chunked && conn->content_left < 0) {
        conn->keep_alive = false;  // a reply delimited by the close itself
        finish(conn, now);
        return;
      }
      const int64_t req = conn->req;
      if (retry_on_fresh(conn)) return;
      close_connection(conn);
      finish_failed(req, why + (conn->got_bytes ? " in the middle of the reply" : " before replying"));
      return;
    }
  }

  void consume(Conn* conn, const char* data, size_t size, double now) {
    if (!conn->headers_done) {
      const size_t before = conn->head.size();
      conn->head.append(data, size);
      const size_t end = conn->head.find("\r\n\r\n", before >= 3 ? before - 3 : 0);
      if (end == std::string::npos) {
        if (conn->head.size() > 65536) {
          conn->status = 0;
          conn->error_body = "the reply headers are larger than 64 KiB";
          conn->stream_error = true;
          conn->keep_alive = false;
          conn->complete = true;
        }
        return;
      }
      parse_headers(conn, end);
      const std::string rest = conn->head.substr(end + 4);
      conn->head.clear();
      if (conn->content_left == 0) conn->complete = true;
      if (!rest.empty()) body(conn, rest.data(), rest.size(), now);
      return;
    }
    body(conn, data, size, now);
  }

  void parse_headers(Conn* conn, size_t end) {
    conn->headers_done = true;
    const std::string& head = conn->head;
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    // "HTTP/1.1 200 OK"
    const size_t space = status_line.find(' ');
    conn->status = space == std::string::npos ? 0 : std::atoi(status_line.c_str() + space + 1);
    conn->keep_alive = status_line.rfind("HTTP/1.0", 0) != 0;
    size_t at = line_end + 2;
    while (at < end) {
      line_end = head.find("\r\n", at);
      if (line_end == std::string::npos || line_end > end) line_end = end;
      const std::string line = head.substr(at, line_end - at);
      at = line_end + 2;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string name = lower(line.substr(0, colon));
      const std::string value = lower(trim(line.substr(colon + 1)));
      if (name == "content-length") conn->content_left = std::atoll(value.c_str());
      else if (name == "transfer-encoding") conn->chunked = value.find("chunked") != std::string::npos;
      else if (name == "connection") {
        if (value.find("close") != std::string::npos) conn->keep_alive = false;
        if (value.find("keep-alive") != std::string::npos) conn->keep_alive = true;
      }
    }
    if (conn->chunked) conn->content_left = -1;
  }

  void body(Conn* conn, const char* data, size_t size, double now) {
    if (!conn->chunked) {
      size_t take = size;
      if (conn->content_left >= 0) take = std::min<size_t>(size, size_t(conn->content_left));
      deliver(conn, data, take, now);
      if (conn->content_left >= 0) {
        conn->content_left -= int64_t(take);
        if (conn->content_left == 0) conn->complete = true;
      }
      return;
    }
    size_t i = 0;
    while (i < size && !conn->complete) {
      switch (conn->chunk) {
        case Conn::Chunk::Size: {
          const char c = data[i++];
          if (c != '\n') {
            conn->chunk_line += c;
            break;
          }
          conn->chunk_left = std::strtoll(conn->chunk_line.c_str(), nullptr, 16);
          conn->chunk_line.clear();
          conn->chunk = conn->chunk_left == 0 ? Conn::Chunk::Trailer : Conn::Chunk::Data;
          break;
        }
        case Conn::Chunk::Data: {
          const size_t take = std::min<size_t>(size - i, size_t(conn->chunk_left));
          deliver(conn, data + i, take, now);
          i += take;
          conn->chunk_left -= int64_t(take);
          if (conn->chunk_left == 0) conn->chunk = Conn::Chunk::DataEnd;
          break;
        }
        case Conn::Chunk::DataEnd:
          if (data[i++] == '\n') conn->chunk = Conn::Chunk::Size;
          break;
        case Conn::Chunk::Trailer: {
          const char c = data[i++];
          if (c != '\n') {
            conn->chunk_line += c;
            break;
          }
          const bool blank = conn->chunk_line.empty() || conn->chunk_line == "\r";
          conn->chunk_line.clear();
          if (blank) conn->complete = true;
          break;
        }
      }
    }
  }

  void deliver(Conn* conn, const char* data, size_t size, double now) {
    if (size == 0) return;
    if (conn->status != 200) {
      if (conn->error_body.size() < 4096) conn->error_body.append(data, std::min<size_t>(size, 4096));
      return;
    }
    conn->sse.feed(data, size, [&](std::string&& payload) { on_event(conn, payload, now); });
  }

  void on_event(Conn* conn, const std::string& payload, double now) {
    if (payload == "[DONE]") return;
    RequestRecord& record = records_[size_t(conn->req)];
    const Json chunk = Json::parse(payload, nullptr, false);
    if (!chunk.is_object()) return;
    if (const auto error = chunk.find("error"); error != chunk.end()) {
      conn->stream_error = true;
      record.error = error->is_object() && error->contains("message") && (*error)["message"].is_string()
                         ? (*error)["message"].get<std::string>()
                         : error->dump();
    }
    if (const auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array() && !choices->empty()) {
      if (!conn->first_chunk) {
        conn->first_chunk = true;
        record.ttft = now - record.start;
      } else {
        record.itl.push_back(now - conn->last_t);
      }
      conn->last_t = now;
      ++record.chunks;
      const Json& choice = (*choices)[0];
      if (const auto text = choice.find("text"); text != choice.end() && text->is_string()) record.text += text->get_ref<const std::string&>();
      if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
        for (const char* field : {"content", "reasoning_content"})
          if (const auto piece = delta->find(field); piece != delta->end() && piece->is_string())
            record.text += piece->get_ref<const std::string&>();
      }
    }
    if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
      if (const auto c = usage->find("completion_tokens"); c != usage->end() && c->is_number_integer()) record.output_tokens = c->get<int64_t>();
      if (const auto p = usage->find("prompt_tokens"); p != usage->end() && p->is_number_integer()) record.prompt_len = p->get<int64_t>();
    }
  }

  void finish(Conn* conn, double now) {
    const int64_t req = conn->req;
    RequestRecord& record = records_[size_t(req)];
    if (conn->status != 200) {
      const Json body = Json::parse(conn->error_body, nullptr, false);
      std::string message = excerpt(conn->error_body, 200);
      if (body.is_object() && body.contains("error")) {
        const Json& error = body["error"];
        message = error.is_object() && error.contains("message") && error["message"].is_string()
                      ? error["message"].get<std::string>()
                      : error.dump();
      }
      record.error = fmt::format("HTTP {}: {}", conn->status, message);
    } else if (conn->stream_error) {
      if (record.error.empty()) record.error = "the stream carried an error";
    } else if (!conn->first_chunk) {
      record.error = "the reply had no chunk with choices";
    } else {
      record.success = true;
      record.latency = conn->last_t - record.start;
    }
    if (!record.success) record.latency = now - record.start;
    conn->req = -1;
    if (conn->keep_alive && conn->complete) {
      conn->state = Conn::State::Idle;
      conn->reused = true;
      watch(conn, EPOLLIN | EPOLLRDHUP);
      idle_.push_back(conn);
    } else {
      close_connection(conn);
    }
    count_done(record.success);
  }

  void finish_failed(int64_t req, const std::string& why) {
    RequestRecord& record = records_[size_t(req)];
    record.success = false;
    record.error = why;
    record.latency = elapsed() - record.start;
    count_done(false);
  }

  void count_done(bool success) {
    --inflight_;
    ++done_;
    end_time_ = elapsed();
    if (options_.finished) options_.finished->fetch_add(1, std::memory_order_relaxed);
    if (!success && options_.failed) options_.failed->fetch_add(1, std::memory_order_relaxed);
    // Dispatch at once: a slot freed under --max-concurrency goes to the next request now.
    dispatch();
  }

  void expire(double now) {
    // By index: failing a request dispatches the next, which may open (append) a connection.
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn* conn = conns_[i].get();
      if (conn->fd < 0 || conn->req < 0 || conn->state == Conn::State::Idle) continue;
      RequestRecord& record = records_[size_t(conn->req)];
      if (now - record.start <= options_.timeout_s) continue;
      const int64_t req = conn->req;
      close_connection(conn);
      finish_failed(req, fmt::format("no complete reply within {:g} s", options_.timeout_s));
    }
    // Forget retired connections once they pile up (never mid-round: see close_connection).
    if (closed_ > 1024) {
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->fd < 0; }), conns_.end());
      closed_ = 0;
    }
  }

  const LoadOptions& options_;
  const std::vector<LoadRequest>& requests_;
  std::vector<RequestRecord> records_;
  sockaddr_storage address_{};
  socklen_t address_length_ = 0;
  int family_ = AF_INET;
  int epoll_ = -1, timer_ = -1;
  double base_ = 0, end_time_ = 0, armed_at_ = -1;
  size_t next_ = 0, done_ = 0, closed_ = 0;
  int64_t inflight_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Conn*> idle_;
};

}  // namespace

LoadResult run_load(const LoadOptions& options, const std::vector<LoadRequest>& requests) {
  if (requests.empty()) return {};
  LoadLoop loop(options, requests);
  return loop.run();
}

std::string http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                      const std::vector<std::string>& headers) {
  std::string out = fmt::format("POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\n"
                                "Accept: text/event-stream\r\nContent-Length: {}\r\n",
                                path, host, port, body.size());
  for (const std::string& header : headers) out += header + "\r\n";
  out += "\r\n";
  out += body;
  return out;
}

}  // namespace anvil::tools
