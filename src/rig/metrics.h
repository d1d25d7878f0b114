#pragma once
// The rig's Prometheus page: per backend its state and lifecycle counters (from the supervisor)
// and what the gateway saw of its requests (counts by status, latency histograms).
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "rig/supervisor.h"

namespace anvil::rig {

class ProxyMetrics {
 public:
  // first_byte_s: from the request's arrival to the backend's response headers (includes any
  // wait for a start or a swap); total_s: to the last byte sent to the client.
  void record(const std::string& model, int status, double first_byte_s, double total_s);
  std::string render(const std::vector<BackendStatus>& backends) const;

 private:
  static constexpr std::array<double, 15> kBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                      1,     2.5,   5,    10,    30,    60,  300};
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};
    uint64_t count = 0;
    double sum = 0;
    void add(double value);
  };
  struct PerModel {
    std::map<int, uint64_t> by_status;
    Histogram first_byte, total;
  };
  mutable std::mutex mutex_;
  std::map<std::string, PerModel> models_;
};

}  // namespace anvil::rig
