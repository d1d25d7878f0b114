#include "rig/upstream.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace anvil::rig {

using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxLine = 64 * 1024;

// -1 with errno set on failure. The socket ends up blocking: reads and writes then cost one
// system call each, their timeouts kept by the kernel (SO_RCVTIMEO, SO_SNDTIMEO).
int connect_loopback(int port, int timeout_s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int yes = 1;
  // Each SSE event is one small write; Nagle would hold it until the previous one is acked.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(uint16_t(port));
  bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  if (!connected && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof error;
    connected = ::poll(&p, 1, timeout_s * 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    if (!connected) errno = error ? error : ETIMEDOUT;
  }
  if (connected && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) return fd;
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return -1;
}

void set_timeout(int fd, int option, int seconds) {
  const timeval value{seconds, 0};
  setsockopt(fd, SOL_SOCKET, option, &value, sizeof value);
}

bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) sent += size_t(n);
    else if (n < 0 && errno == EINTR) continue;
    else return false;  // EAGAIN: SO_SNDTIMEO ran out
  }
  return true;
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::string header_value(const httplib::Headers& headers, const char* name) {
  const auto found = headers.find(name);  // httplib's Headers compare names case-insensitively
  return found == headers.end() ? std::string() : found->second;
}

bool contains_token(const std::string& value, const char* token) {
  std::string lowered = value;
  for (char& c : lowered) c = char(std::tolower(static_cast<unsigned char>(c)));
  return lowered.find(token) != std::string::npos;
}

}  // namespace

UpstreamPool::~UpstreamPool() {
  for (auto& [port, list] : idle_)
    for (const Idle& idle : list) ::close(idle.fd);
}

int UpstreamPool::take(int port) {
  const std::lock_guard lock(mutex_);
  auto found = idle_.find(port);
  if (found == idle_.end()) return -1;
  auto& list = found->second;
  const auto now = Clock::now();
  while (!list.empty()) {
    const Idle idle = list.back();
    list.pop_back();
    // An idle connection has nothing to read; readable means closed (EOF or reset) or garbage.
    pollfd p{idle.fd, POLLIN, 0};
    if (now - idle.since < kMaxIdle && ::poll(&p, 1, 0) == 0) return idle.fd;
    ::close(idle.fd);
  }
  return -1;
}

void UpstreamPool::give_back(int port, int fd) {
  const std::lock_guard lock(mutex_);
  // Expired ones go here too, for every port: a restarted backend gets a new port, and nothing
  // would take the old port's connections again.
  const auto now = Clock::now();
  for (auto it = idle_.begin(); it != idle_.end();) {
    auto& older = it->second;  // oldest first
    size_t expired = 0;
    while (expired < older.size() && now - older[expired].since >= kMaxIdle) ::close(older[expired++].fd);
    older.erase(older.begin(), older.begin() + std::ptrdiff_t(expired));
    it = older.empty() && it->first != port ? idle_.erase(it) : std::next(it);
  }
  auto& list = idle_[port];
  if (list.size() >= kMaxIdlePerPort) {
    ::close(fd);
    return;
  }
  list.push_back({fd, now});
}

size_t UpstreamPool::idle(int port) const {
  const std::lock_guard lock(mutex_);
  const auto found = idle_.find(port);
  return found == idle_.end() ? 0 : found->second.size();
}

UpstreamResponse::UpstreamResponse(UpstreamPool& pool, int port, const UpstreamRequest& request)
    : pool_(pool), port_(port), read_timeout_s_(request.read_timeout_s) {
  std::string head = fmt::format("{} {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", request.method, request.target, port);
  for (const auto& [name, value] : request.headers) head += name + ": " + value + "\r\n";
  head += fmt::format("Content-Length: {}\r\n\r\n", request.body.size());
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = attempt == 0 ? pool_.take(port) : -1;
    const bool reused = fd >= 0;
    if (fd < 0 && (fd = connect_loopback(port, request.connect_timeout_s)) < 0) {
      error_ = fmt::format("cannot connect to 127.0.0.1:{}: {}", port, std::strerror(errno));
      return;
    }
    fd_ = fd;
    set_timeout(fd, SO_SNDTIMEO, request.write_timeout_s);
    set_timeout(fd, SO_RCVTIMEO, request.read_timeout_s);
    buffer_.clear();
    at_ = 0;
    eof_ = got_bytes_ = false;
    keep_alive_ = true;
    bool nothing_back = false;
    if (exchange(head + request.body, &nothing_back)) return;
    // A reused connection that ends before one byte of answer is, in practice, one the backend
    // closed as idle just as it was taken (servers do so without a word), so the request was never
    // read; it goes once more on a new connection, as HTTP clients and proxies do.
    if (!(reused && nothing_back)) return;
    error_.clear();
  }
}

UpstreamResponse::~UpstreamResponse() {
  if (fd_ >= 0) ::close(fd_);  // an answer not read to its end: the connection is in an unknown state
}

void UpstreamResponse::finish() {
  finished_ = true;
  if (fd_ < 0) return;
  // Back to the pool now, not when this object dies: the caller hands the end of the answer to
  // its client next, and a client that sends its next request at once must find it idle.
  if (keep_alive_ && at_ == buffer_.size())
    pool_.give_back(port_, fd_);
  else
    ::close(fd_);
  fd_ = -1;
}

void UpstreamResponse::fail(const std::string& why) {
  if (error_.empty()) error_ = why;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void UpstreamResponse::abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool UpstreamResponse::fill() {
  if (fd_ < 0) return false;
  if (at_ == buffer_.size()) {
    buffer_.clear();
    at_ = 0;
  } else if (at_ > 65536) {
    buffer_.erase(0, at_);
    at_ = 0;
  }
  char chunk[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n > 0) {
      buffer_.append(chunk, size_t(n));
      got_bytes_ = true;
      return true;
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      fail(fmt::format("127.0.0.1:{} sent nothing for {} s", port_, read_timeout_s_));
    else
      fail(fmt::format("reading from 127.0.0.1:{}: {}", port_, std::strerror(errno)));
    return false;
  }
}

bool UpstreamResponse::read_line(std::string& line) {
  for (;;) {
    const size_t newline = buffer_.find('\n', at_);
    if (newline != std::string::npos) {
      line.assign(buffer_, at_, newline - at_);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      at_ = newline + 1;
      return true;
    }
    if (buffer_.size() - at_ > kMaxLine) {
      fail(fmt::format("127.0.0.1:{} sent a header or chunk line longer than {} bytes", port_, kMaxLine));
      return false;
    }
    if (!fill()) return false;
  }
}

bool UpstreamResponse::exchange(const std::string& message, bool* nothing_back) {
  if (!send_all(fd_, message)) {
    *nothing_back = true;
    fail(fmt::format("sending to 127.0.0.1:{}: {}", port_, std::strerror(errno)));
    return false;
  }
  std::string line;
  for (;;) {  // 1xx interim answers (100 Continue) come before the real one
    if (!read_line(line)) {
      *nothing_back = !got_bytes_;
      fail(fmt::format("127.0.0.1:{} closed the connection without an answer", port_));
      return false;
    }
    int code = 0;
    if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12 || std::sscanf(line.c_str() + 9, "%3d", &code) != 1 ||
        code < 100 || code > 999) {
      fail(fmt::format("127.0.0.1:{} answered something other than HTTP/1.x: '{}'", port_, line.substr(0, 80)));
      return false;
    }
    if (line[7] == '0') keep_alive_ = false;
    httplib::Headers headers;
    for (;;) {
      if (!read_line(line)) {
        fail(fmt::format("127.0.0.1:{} closed the connection in the middle of its headers", port_));
        return false;
      }
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      headers.emplace(trim(line.substr(0, colon)), trim(line.substr(colon + 1)));
    }
    if (code < 200) continue;
    status_ = code;
    headers_ = std::move(headers);
    break;
  }
  if (contains_token(header_value(headers_, "Connection"), "close")) keep_alive_ = false;
  if (status_ == 204 || status_ == 304) {
    finish();
  } else if (contains_token(header_value(headers_, "Transfer-Encoding"), "chunked")) {
    chunked_ = true;
  } else if (const std::string length = header_value(headers_, "Content-Length"); !length.empty()) {
    left_ = size_t(std::strtoull(length.c_str(), nullptr, 10));
    if (left_ == 0) finish();
  } else {
    until_close_ = true;
    keep_alive_ = false;
  }
  return true;
}

bool UpstreamResponse::read(std::string& piece) {
  piece.clear();
  if (finished_ || fd_ < 0) return false;
  if (chunked_) {
    std::string line;
    if (crlf_pending_) {  // the CRLF after the previous chunk's data
      if (!read_line(line)) return fail_body();
      crlf_pending_ = false;
    }
    if (left_ == 0) {
      if (!read_line(line)) return fail_body();
      char* end = nullptr;
      left_ = size_t(std::strtoull(line.c_str(), &end, 16));
      if (end == line.c_str()) {
        fail(fmt::format("127.0.0.1:{} sent a bad chunk size line: '{}'", port_, line.substr(0, 80)));
        return false;
      }
      if (left_ == 0) {
        do {  // trailers, up to the empty line that ends the body
          if (!read_line(line)) return fail_body();
        } while (!line.empty());
        finish();
        return false;
      }
    }
  }
  if (at_ == buffer_.size() && !fill()) {
    if (until_close_ && eof_) {
      finish();  // keep_alive_ is false: closes
      return false;
    }
    return fail_body();
  }
  const size_t available = buffer_.size() - at_;
  const size_t take = until_close_ ? available : std::min(available, left_);
  piece.assign(buffer_, at_, take);
  at_ += take;
  if (!until_close_) {
    left_ -= take;
    if (left_ == 0) {
      if (chunked_) crlf_pending_ = true;
      else finish();
    }
  }
  return true;
}

bool UpstreamResponse::fail_body() {
  fail(fmt::format("127.0.0.1:{} closed the connection in the middle of the body", port_));
  return false;
}

bool UpstreamResponse::read_all(std::string& body) {
  body.clear();
  std::string piece;
  while (read(piece)) body += piece;
  return finished_;
}

}  // namespace anvil::rig
