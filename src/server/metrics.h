#pragma once
// Prometheus text exposition with vLLM's metric names under an `anvil:` prefix, so dashboards and
// gateways built for vLLM read ours. Gauges and token counters come from the engine's stats;
// latency histograms are observed here, where requests start and tokens reach the client.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace anvil::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  void render(std::string& out, const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void observe_request(double ttft, const std::vector<double>& token_gaps, double e2e, const std::string& finish_reason);
  // stats is null while the model loads.
  std::string render(const EngineStats* stats, const std::string& model_name) const;

 private:
  Histogram ttft_, tpot_, itl_, e2e_;
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t> finished_;
};

}  // namespace anvil::server
