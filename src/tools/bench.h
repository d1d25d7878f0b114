#pragma once
// anvil bench: vLLM's `bench serve` against any OpenAI-compatible server, with vLLM's options,
// metric definitions and JSON key names, and sweeps over request rates or concurrencies.
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::tools {

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                          // default: the first id of /v1/models
  std::string api_key, label;
  std::string tokenizer;                      // tokenizer.json or a model dir; else the server's /tokenize
  int64_t vocab_size = 0;                     // last resort: random ids below this
  std::string prompt_format = "auto";         // auto (ids for completions, text for chat) | ids | text
  std::string dataset_name = "random", dataset_path;
  int64_t num_prompts = 1000, input_len = 1024, output_len = 128, prefix_len = 0;
  double range_ratio = 0;
  double request_rate = std::numeric_limits<double>::infinity(), burstiness = 1;
  int64_t max_concurrency = 0;                // 0: none
  std::string sweep;                          // "max-concurrency=1,4,16" or "request-rate=1,2,inf"
  std::vector<std::string> goodput;           // "ttft:500", "tpot:50", "e2el:2000"
  int ignore_eos = -1;                        // -1: vLLM's default (on for the random dataset)
  uint64_t seed = 0;
  double temperature = 0;
  std::string percentile_metrics = "ttft,tpot,itl,e2el", metric_percentiles = "99";
  int64_t num_warmups = 0;
  double ready_check_timeout_s = 600;         // 0: no test request before the run
  std::string extra_body;                     // JSON object merged into every request
  std::vector<std::string> headers;           // "Name=value" or "Name: value"
  double timeout_s = 6 * 3600;
  bool progress = true, save_detailed = false;
};

using BenchLog = std::function<void(const std::string&)>;

// One run: vLLM's result object. A sweep: {"sweep": {"key", "values"}, "runs": [result, ...]}
// plus the shared fields (model_id, backend, ...). Throws anvil::Error for bad options or a
// server that fails the ready check. Progress and notes go to log (stderr in the CLI).
nlohmann::json run_bench(const BenchOptions& options, const BenchLog& log);

// vLLM's console block ("============ Serving Benchmark Result ============" ...), one per run.
std::string format_bench_result(const nlohmann::json& result);

// Latency against throughput for a sweep (or a single run): two panels, TTFT and TPOT (median and
// p99) over output tokens per second, each point labelled with its rate or concurrency.
std::string bench_plot_svg(const nlohmann::json& result);

}  // namespace anvil::tools
