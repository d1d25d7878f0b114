#include "tools/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace anvil::tools {

using Json = nlohmann::json;

GoodputSlo parse_goodput(const std::vector<std::string>& specs) {
  GoodputSlo slo;
  for (const std::string& spec : specs) {
    std::string text = spec;
    std::replace(text.begin(), text.end(), ',', ' ');
    std::istringstream items(text);
    for (std::string item; items >> item;) {
      const size_t colon = item.find(':');
      if (colon == std::string::npos) fail("--goodput {}: expected KEY:MS, e.g. ttft:500", item);
      const std::string key = item.substr(0, colon);
      double value = 0;
      try {
        size_t used = 0;
        value = std::stod(item.substr(colon + 1), &used);
        if (used != item.size() - colon - 1) throw std::invalid_argument("trailing text");
      } catch (const std::exception&) {
        fail("--goodput {}: {} is not a number of milliseconds", item, item.substr(colon + 1));
      }
      if (value < 0) fail("--goodput {}: the SLO must not be negative", item);
      if (key == "ttft") slo.ttft_ms = value;
      else if (key == "tpot") slo.tpot_ms = value;
      else if (key == "e2el") slo.e2el_ms = value;
      else fail("--goodput {}: unknown metric {} (expected ttft, tpot or e2el)", item, key);
    }
  }
  return slo;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - double(lo)) * (values[hi] - values[lo]);
}

namespace {

double mean(const std::vector<double>& v) { return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }

double stddev(const std::vector<double>& v) {  // numpy.std: the population deviation
  if (v.empty()) return 0;
  const double m = mean(v);
  double sum = 0;
  for (const double x : v) sum += (x - m) * (x - m);
  return std::sqrt(sum / double(v.size()));
}

// "99" -> "p99", "99.9" -> "p99.9" (vLLM formats with :g).
std::string percentile_key(double p) { return fmt::format("p{:g}", p); }

}  // namespace

Json compute_metrics(const std::vector<RequestRecord>& records, double duration, const MetricOptions& options) {
  int64_t completed = 0, failed = 0, good = 0, total_input = 0, total_output = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++failed;
      continue;
    }
    ++completed;
    const int64_t output = std::max<int64_t>(r.output_tokens, 0);
    total_input += r.prompt_len;
    total_output += output;
    double tpot = 0;
    if (output > 1) {
      tpot = (r.latency - r.ttft) / double(output - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
    ttfts.push_back(r.ttft);
    e2els.push_back(r.latency);
    if (options.goodput.any()) {
      const GoodputSlo& slo = options.goodput;
      const bool ok = (!slo.ttft_ms || r.ttft * 1000 <= *slo.ttft_ms) && (!slo.tpot_ms || tpot * 1000 <= *slo.tpot_ms) &&
                      (!slo.e2el_ms || r.latency * 1000 <= *slo.e2el_ms);
      good += ok;
    }
  }
  const double d = duration > 0 ? duration : 1e-9;

  // Peak output tokens and concurrent requests per wall-clock second, as vLLM buckets them: each
  // chunk with choices counts as one token at the time it arrived.
  double max_tokens_per_s = 0;
  int64_t max_concurrent = 0, peak_concurrent = 0;
  if (completed > 0) {
    double first = 1e300, last = -1e300;
    for (const RequestRecord& r : records)
      if (r.success) first = std::min(first, r.start), last = std::max(last, r.start + r.latency);
    const size_t seconds = size_t(std::ceil(last - first)) + 1;
    std::vector<double> tokens(seconds, 0);
    std::vector<int64_t> concurrent(seconds, 0);
    std::vector<std::pair<double, int>> edges;
    for (const RequestRecord& r : records) {
      if (!r.success) continue;
      double t = r.start + r.ttft;
      auto count = [&](double at) {
        const auto bucket = int64_t(at - first);
        if (bucket >= 0 && size_t(bucket) < seconds) tokens[size_t(bucket)] += 1;
      };
      count(t);
      for (const double gap : r.itl) count(t += gap);
      const auto from = int64_t(r.start - first), to = int64_t(r.start + r.latency - first);
      for (int64_t s = std::max<int64_t>(from, 0); s <= to && size_t(s) < seconds; ++s) ++concurrent[size_t(s)];
      edges.push_back({r.start, +1});
      edges.push_back({r.start + r.latency, -1});
    }
    max_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
    max_concurrent = *std::max_element(concurrent.begin(), concurrent.end());
    // Ends sort before starts at the same instant: back-to-back requests do not overlap.
    std::sort(edges.begin(), edges.end());
    int64_t active = 0;
    for (const auto& [at, step] : edges) peak_concurrent = std::max(peak_concurrent, active += step);
  }

  Json out = {{"duration", duration},
              {"completed", completed},
              {"failed", failed},
              {"total_input_tokens", total_input},
              {"total_output_tokens", total_output},
              {"request_throughput", double(completed) / d},
              {"request_goodput", options.goodput.any() ? Json(double(good) / d) : Json(nullptr)},
              {"output_throughput", double(total_output) / d},
              {"total_token_throughput", double(total_input + total_output) / d},
              {"max_output_tokens_per_s", max_tokens_per_s},
              {"max_concurrent_requests", max_concurrent},
              {"peak_concurrent_requests", peak_concurrent}};
  const std::vector<std::pair<std::string, const std::vector<double>*>> metrics = {
      {"ttft", &ttfts}, {"tpot", &tpots}, {"itl", &itls}, {"e2el", &e2els}};
  for (const auto& [name, values] : metrics) {
    if (std::find(options.percentile_metrics.begin(), options.percentile_metrics.end(), name) ==
        options.percentile_metrics.end())
      continue;
    out["mean_" + name + "_ms"] = mean(*values) * 1000;
    out["median_" + name + "_ms"] = percentile(*values, 50) * 1000;
    out["std_" + name + "_ms"] = stddev(*values) * 1000;
    for (const double p : options.percentiles) out[percentile_key(p) + "_" + name + "_ms"] = percentile(*values, p) * 1000;
  }
  return out;
}

}  // namespace anvil::tools
