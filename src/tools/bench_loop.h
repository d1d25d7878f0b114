#pragma once
// The benchmark's load generator: one thread, epoll, non-blocking sockets kept alive between
// requests. Requests leave at their arrival times (or as soon as a concurrency slot frees up),
// and every streamed chunk is stamped when its bytes come off the socket, so the client adds
// microseconds, not milliseconds, to what it measures.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench_stats.h"

namespace anvil::tools {

struct LoadRequest {
  std::string http;        // the whole HTTP/1.1 request, ready to write
  int64_t prompt_len = 0;  // the dataset's input length (usage.prompt_tokens replaces it)
  double arrival = 0;      // seconds after the start when it may leave
};

struct LoadOptions {
  std::string host;
  int port = 0;
  int64_t max_concurrency = 0;  // 0: no limit
  double timeout_s = 6 * 3600;  // per request, as vLLM's aiohttp timeout
  std::atomic<int64_t>* finished = nullptr;  // progress: requests done (ok or not)
  std::atomic<int64_t>* failed = nullptr;
};

struct LoadResult {
  std::vector<RequestRecord> records;  // in request order
  double duration = 0;                 // first arrival -> last request done
};

// Runs every request; throws anvil::Error when the host cannot be resolved.
LoadResult run_load(const LoadOptions& options, const std::vector<LoadRequest>& requests);

// "POST path HTTP/1.1" with Host, Content-Type/-Length, Accept and any extra header lines
// ("Name: value"), then body.
std::string http_post(const std::string& host, int port, const std::string& path, const std::string& body,
                      const std::vector<std::string>& headers);

}  // namespace anvil::tools
