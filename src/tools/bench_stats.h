#pragma once
// vLLM's serving-benchmark metrics (vllm/benchmarks/serve.py, calculate_metrics) from what each
// request saw on the client side, under vLLM's key names.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace anvil::tools {

// One request as the client saw it. Times are seconds; `start` counts from the run's start.
struct RequestRecord {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;       // the dataset's length, replaced by usage.prompt_tokens when sent
  int64_t output_tokens = -1;   // usage.completion_tokens; else counted afterwards; -1 unknown
  int64_t chunks = 0;           // SSE chunks that carried choices
  double start = 0;             // when the request was sent
  double ttft = 0;              // send -> first chunk with choices
  double latency = 0;           // send -> last chunk with choices (E2EL)
  std::vector<double> itl;      // gaps between successive chunks with choices
  std::string text;             // generated text (content and reasoning), to count tokens without usage
};

// --goodput: a request is good when every listed metric is at or under its SLO (milliseconds).
struct GoodputSlo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
// "ttft:500 tpot:50" or "ttft:500,e2el:2000"; throws anvil::Error on other keys or bad numbers.
GoodputSlo parse_goodput(const std::vector<std::string>& specs);

// numpy.percentile's default (linear interpolation between closest ranks); 0 for no values.
double percentile(std::vector<double> values, double p);

struct MetricOptions {
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> percentiles = {99};
  GoodputSlo goodput;
};

// duration: wall seconds of the main run. The object has completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, request_goodput (null without SLOs), output_throughput,
// total_token_throughput, max_output_tokens_per_s, max_concurrent_requests (vLLM's per-second
// buckets), peak_concurrent_requests (the exact instantaneous peak) and, for each selected metric,
// mean_/median_/std_/pNN_{metric}_ms.
nlohmann::json compute_metrics(const std::vector<RequestRecord>& records, double duration, const MetricOptions& options);

}  // namespace anvil::tools
