#include "rig/metrics.h"

#include <fmt/format.h>

namespace anvil::rig {

void ProxyMetrics::Histogram::add(double value) {
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (value <= kBuckets[i]) ++counts[i];
  ++count;
  sum += value;
}

void ProxyMetrics::record(const std::string& model, int status, double first_byte_s, double total_s) {
  const std::lock_guard lock(mutex_);
  PerModel& stats = models_[model];
  ++stats.by_status[status];
  stats.first_byte.add(first_byte_s);
  stats.total.add(total_s);
}

std::string ProxyMetrics::render(const std::vector<BackendStatus>& backends) const {
  std::string out;
  auto counter = [&](const char* name, const char* help, const char* type, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const auto& backend : backends) out += fmt::format("{}{{model=\"{}\"}} {}\n", name, backend.name, value(backend));
  };
  out += "# HELP anvil_rig_backend_state 1 for the state each backend is in, 0 for the others\n"
         "# TYPE anvil_rig_backend_state gauge\n";
  for (const auto& backend : backends)
    for (BackendState state : {BackendState::Stopped, BackendState::Starting, BackendState::Ready,
                               BackendState::Draining, BackendState::Stopping, BackendState::Failed})
      out += fmt::format("anvil_rig_backend_state{{model=\"{}\",state=\"{}\"}} {}\n", backend.name, state_name(state),
                         backend.state == state ? 1 : 0);
  counter("anvil_rig_backend_starts_total", "Processes started", "counter", [](const auto& b) { return b.starts; });
  counter("anvil_rig_backend_start_failures_total", "Starts that never became ready", "counter",
          [](const auto& b) { return b.start_failures; });
  counter("anvil_rig_backend_crashes_total", "Exits while serving", "counter", [](const auto& b) { return b.crashes; });
  counter("anvil_rig_backend_restarts_total", "Crashed backends that came back", "counter", [](const auto& b) { return b.restarts; });
  counter("anvil_rig_backend_swaps_total", "Starts that replaced another member of the group", "counter",
          [](const auto& b) { return b.swaps; });
  counter("anvil_rig_queue_waiting", "Requests waiting for the backend to become ready", "gauge",
          [](const auto& b) { return b.waiting; });
  counter("anvil_rig_requests_in_flight", "Requests being proxied to the backend", "gauge",
          [](const auto& b) { return b.in_flight; });

  const std::lock_guard lock(mutex_);
  out += "# HELP anvil_rig_requests_total Proxied requests by the status the client got\n"
         "# TYPE anvil_rig_requests_total counter\n";
  for (const auto& [model, stats] : models_)
    for (const auto& [status, count] : stats.by_status)
      out += fmt::format("anvil_rig_requests_total{{model=\"{}\",code=\"{}\"}} {}\n", model, status, count);
  auto histogram = [&](const char* name, const char* help, Histogram PerModel::*which) {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (const auto& [model, stats] : models_) {
      const Histogram& h = stats.*which;
      for (size_t i = 0; i < kBuckets.size(); ++i)
        out += fmt::format("{}_bucket{{model=\"{}\",le=\"{}\"}} {}\n", name, model, kBuckets[i], h.counts[i]);
      out += fmt::format("{}_bucket{{model=\"{}\",le=\"+Inf\"}} {}\n", name, model, h.count);
      out += fmt::format("{}_sum{{model=\"{}\"}} {}\n{}_count{{model=\"{}\"}} {}\n", name, model, h.sum, name, model, h.count);
    }
  };
  histogram("anvil_rig_proxy_first_byte_seconds",
            "From the request's arrival to the backend's response headers, waits for starts and swaps included",
            &PerModel::first_byte);
  histogram("anvil_rig_proxy_request_seconds", "From the request's arrival to its last byte", &PerModel::total);
  return out;
}

}  // namespace anvil::rig
