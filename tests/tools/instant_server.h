#pragma once
// Test servers for the operator's tools.
//
// InstantServer answers every POST at once with a whole SSE stream (one chunk per token, a usage
// chunk, [DONE]) from one epoll thread over keep-alive connections: against it, whatever latency
// bench measures is bench's own. It can fail every Nth request and leave usage out.
//
// BrokenProxy sits in front of a real `anvil serve` and breaks one thing on purpose (drops
// response_format, leaks reasoning into content, ...), so preflight can be shown to notice.
#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace anvil::test {

class InstantServer {
 public:
  struct Options {
    int64_t fail_every = 0;   // every Nth request gets HTTP 500 (0: none)
    bool usage = true;        // send a usage chunk (stream_options.include_usage)
    int64_t default_tokens = 4;  // chunks when the request names no max_tokens
  };
  InstantServer() : InstantServer(Options{}) {}
  explicit InstantServer(Options options);
  ~InstantServer();
  InstantServer(const InstantServer&) = delete;
  InstantServer& operator=(const InstantServer&) = delete;

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int64_t requests() const { return requests_.load(); }
  int64_t connections() const { return connections_.load(); }
  // The first bodies received (up to 16), to see what the client sent.
  std::vector<std::string> bodies() const;

 private:
  void loop();
  Options options_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1, port_ = 0;
  std::atomic<int64_t> requests_{0}, connections_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> bodies_;
  std::thread thread_;
};

class BrokenProxy {
 public:
  enum class Mode {
    kPassThrough,
    kDropResponseFormat,   // forwards requests without response_format (a server that ignores it)
    kReasoningInContent,   // puts the reasoning, with harmony markup, into content (parser off)
    kCopyReasoning,        // answers with a chain of thought copied into content as well
    kStreamDiffers,        // streamed replies get one more character than whole ones
    kDropTools,            // forwards requests without tools/tool_choice
    kDropStop,             // forwards requests without stop
  };
  BrokenProxy(int upstream_port, Mode mode);
  ~BrokenProxy();
  BrokenProxy(const BrokenProxy&) = delete;
  BrokenProxy& operator=(const BrokenProxy&) = delete;
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  nlohmann::json transform_reply(nlohmann::json reply) const;
  std::string transform_stream(const std::string& raw) const;
  int upstream_port_;
  Mode mode_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace anvil::test
