#include "server/metrics.h"

#include <fmt/format.h>

namespace anvil::server {

namespace {

// vLLM's buckets (vllm/v1/metrics/loggers.py).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                           0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,   15.0, 20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

std::string escape_label(const std::string& value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void metric(std::string& out, const std::string& name, const char* type, const char* help, const std::string& labels,
            double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const std::lock_guard lock(mutex_);
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help, const std::string& labels) const {
  const std::lock_guard lock(mutex_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, count_);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
}

ServerMetrics::ServerMetrics() : ttft_(kTtftBuckets), tpot_(kTokenBuckets), itl_(kTokenBuckets), e2e_(kRequestBuckets) {}

void ServerMetrics::observe_request(double ttft, const std::vector<double>& token_gaps, double e2e,
                                    const std::string& finish_reason) {
  if (ttft >= 0) ttft_.observe(ttft);
  for (const double gap : token_gaps) {
    tpot_.observe(gap);
    itl_.observe(gap);
  }
  e2e_.observe(e2e);
  const std::lock_guard lock(mutex_);
  ++finished_[finish_reason];
}

std::string ServerMetrics::render(const EngineStats* stats, const std::string& model_name) const {
  const std::string labels = "model_name=\"" + escape_label(model_name) + "\"";
  const EngineStats s = stats ? *stats : EngineStats{};
  std::string out;
  metric(out, "anvil:num_requests_running", "gauge", "Requests in the running batch.", labels, double(s.running));
  metric(out, "anvil:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", labels, double(s.waiting));
  metric(out, "anvil:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = full).", labels, s.kv_usage);
  metric(out, "anvil:prompt_tokens_total", "counter", "Prefill tokens processed.", labels, double(s.prompt_tokens_total));
  metric(out, "anvil:generation_tokens_total", "counter", "Generation tokens processed.", labels,
         double(s.generation_tokens_total));
  metric(out, "anvil:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", labels,
         double(s.prefix_cache_queries));
  metric(out, "anvil:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.", labels,
         double(s.prefix_cache_hits));
  metric(out, "anvil:num_preemptions_total", "counter", "Requests preempted (recomputed) for lack of KV blocks.", labels,
         double(s.preemptions_total));
  {
    const std::lock_guard lock(mutex_);
    out += "# HELP anvil:request_success_total Finished requests by finish reason.\n"
           "# TYPE anvil:request_success_total counter\n";
    for (const char* reason : {"stop", "length", "abort", "error"}) {
      const auto found = finished_.find(reason);
      out += fmt::format("anvil:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels, reason,
                         found == finished_.end() ? 0 : found->second);
    }
  }
  ttft_.render(out, "anvil:time_to_first_token_seconds", "Time to first token.", labels);
  tpot_.render(out, "anvil:time_per_output_token_seconds", "Time between output tokens.", labels);
  itl_.render(out, "anvil:inter_token_latency_seconds", "Time between output tokens.", labels);
  e2e_.render(out, "anvil:e2e_request_latency_seconds", "End-to-end request latency.", labels);
  return out;
}

}  // namespace anvil::server
