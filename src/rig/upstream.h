#pragma once
// The gateway's side of a proxied request: one HTTP/1.1 exchange with a backend on 127.0.0.1,
// driven entirely by the thread that serves the client. It sends the request, reads the status
// and headers, and then hands the body over piece by piece as the backend writes it, so a token
// crosses no thread on its way through the rig. Connections are kept alive and reused, so a
// request costs no connect (and the backend no accept and hand-off to a worker).
#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace anvil::rig {

// Idle kept-alive connections per backend port, newest first.
class UpstreamPool {
 public:
  UpstreamPool() = default;
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // A live idle connection to the port, or -1. Closes the stale ones it passes over: idle past
  // kMaxIdle (servers drop idle connections, httplib's after 5 s, uvicorn's after 5 s) or
  // already closed or readable (a backend that exited or restarted).
  int take(int port);
  void give_back(int port, int fd);
  size_t idle(int port) const;

  static constexpr auto kMaxIdle = std::chrono::seconds(4);
  static constexpr size_t kMaxIdlePerPort = 256;

 private:
  struct Idle {
    int fd;
    std::chrono::steady_clock::time_point since;
  };
  mutable std::mutex mutex_;
  std::map<int, std::vector<Idle>> idle_;
};

struct UpstreamRequest {
  std::string method = "POST";
  std::string target;  // path and query
  httplib::Headers headers;  // forwarded as they are; Host and Content-Length are set here
  std::string body;
  int connect_timeout_s = 10;
  int write_timeout_s = 60;
  int read_timeout_s = 3600;  // a long reasoning answer may be silent for minutes
};

class UpstreamResponse {
 public:
  // Sends the request on a pooled connection (once more on a new one when a reused connection
  // turns out dead before any answer) and reads the status line and headers. On failure,
  // status() is 0 and error() says why.
  UpstreamResponse(UpstreamPool& pool, int port, const UpstreamRequest& request);
  ~UpstreamResponse();  // closes a connection whose body was not read to its end
  UpstreamResponse(const UpstreamResponse&) = delete;
  UpstreamResponse& operator=(const UpstreamResponse&) = delete;

  int status() const { return status_; }
  const std::string& error() const { return error_; }
  const httplib::Headers& headers() const { return headers_; }
  bool chunked() const { return chunked_; }

  // The next piece of the body as soon as the backend sent it: false at its end or on an error
  // (error() is then set). A chunked body comes a chunk (or a part of a large one) at a time.
  bool read(std::string& piece);
  // Reads the whole body; false on an error.
  bool read_all(std::string& body);
  // The client went away: the connection is closed, not reused, so the backend sees it too.
  void abandon();

 private:
  // Sends and reads up to the body; false (and *nothing_back when not one byte came back) on failure.
  bool exchange(const std::string& message, bool* nothing_back);
  bool fill();  // more bytes into buffer_; false at EOF (eof_) or on an error
  bool read_line(std::string& line);
  void fail(const std::string& why);  // keeps the first reason; closes the connection
  void finish();  // the body's end: the connection goes back to the pool if it can be reused
  bool fail_body();

  UpstreamPool& pool_;
  int port_;
  int fd_ = -1;
  int read_timeout_s_;
  std::string buffer_;
  size_t at_ = 0;  // start of the unread bytes in buffer_
  int status_ = 0;
  std::string error_;
  httplib::Headers headers_;
  bool chunked_ = false;
  bool until_close_ = false;  // neither chunked nor a length: the body ends when the backend closes
  bool keep_alive_ = true;
  size_t left_ = 0;           // bytes left of the current chunk, or of a Content-Length body
  bool finished_ = false;     // the body was read to its end
  bool crlf_pending_ = false; // the CRLF after a chunk's data is still to be read
  bool eof_ = false;
  bool got_bytes_ = false;    // the backend sent something back on this connection
};

}  // namespace anvil::rig
