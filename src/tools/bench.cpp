#include "tools/bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "tools/bench_dataset.h"
#include "tools/bench_loop.h"
#include "tools/bench_stats.h"
#include "tools/openai_client.h"

namespace anvil::tools {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, separator)) {
    const size_t begin = item.find_first_not_of(" \t");
    const size_t end = item.find_last_not_of(" \t");
    if (begin != std::string::npos) out.push_back(item.substr(begin, end - begin + 1));
  }
  return out;
}

double parse_rate(const std::string& text, const std::string& option) {
  if (text == "inf" || text == "Infinity" || text == "infinity") return std::numeric_limits<double>::infinity();
  try {
    size_t used = 0;
    const double rate = std::stod(text, &used);
    if (used == text.size() && rate > 0) return rate;
  } catch (const std::exception&) {
  }
  fail("{} {}: expected a positive number of requests per second or inf", option, text);
}

Json rate_json(double rate) { return std::isinf(rate) ? Json("inf") : Json(rate); }

std::string date_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%d-%H%M%S", &tm);
  return text;
}

// The progress bar on stderr: redrawn in place on a terminal, a line every few seconds elsewhere.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t total, std::string label, const std::atomic<int64_t>& finished,
              const std::atomic<int64_t>& failed)
      : enabled_(enabled), tty_(isatty(STDERR_FILENO)), total_(total), label_(std::move(label)), finished_(finished),
        failed_(failed), start_(std::chrono::steady_clock::now()) {
    if (enabled_) thread_ = std::thread([this] { loop(); });
  }
  ~ProgressBar() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
    draw(true);
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    const auto period = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
    while (!wake_.wait_for(lock, period, [this] { return stopping_; })) draw(false);
  }
  void draw(bool final) {
    const int64_t done = finished_.load(), failed = failed_.load();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double fraction = total_ > 0 ? double(done) / double(total_) : 1.0;
    const double rate = seconds > 0 ? double(done) / seconds : 0;
    std::string failed_text = failed ? fmt::format(", {} failed", failed) : "";
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = int(fraction * kWidth + 0.5);
      std::fprintf(stderr, "\r%s %3.0f%% |%s%s| %lld/%lld [%.1fs, %.1f req/s%s]\033[K%s", label_.c_str(), fraction * 100,
                   std::string(size_t(filled), '#').c_str(), std::string(size_t(kWidth - filled), ' ').c_str(),
                   static_cast<long long>(done), static_cast<long long>(total_), seconds, rate, failed_text.c_str(),
                   final ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s %lld/%lld requests (%.0f%%) in %.1f s, %.1f req/s%s\n", label_.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total_), fraction * 100, seconds, rate,
                   failed_text.c_str());
    }
    std::fflush(stderr);
  }

  bool enabled_, tty_;
  int64_t total_;
  std::string label_;
  const std::atomic<int64_t>& finished_;
  const std::atomic<int64_t>& failed_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

struct SweepPlan {
  std::string key;  // "" (one run), "max_concurrency" or "request_rate"
  std::vector<double> values;
};

SweepPlan parse_sweep(const std::string& text) {
  SweepPlan plan;
  if (text.empty()) return plan;
  const size_t equals = text.find('=');
  if (equals == std::string::npos)
    fail("--sweep {}: expected max-concurrency=1,4,16 or request-rate=1,2,inf", text);
  std::string key = text.substr(0, equals);
  std::replace(key.begin(), key.end(), '_', '-');
  if (key == "max-concurrency" || key == "concurrency") plan.key = "max_concurrency";
  else if (key == "request-rate" || key == "rate") plan.key = "request_rate";
  else fail("--sweep {}: sweeps go over max-concurrency or request-rate, not {}", text, key);
  for (const std::string& value : split(text.substr(equals + 1), ',')) {
    if (plan.key == "request_rate") {
      plan.values.push_back(parse_rate(value, "--sweep"));
    } else {
      char* end = nullptr;
      const long long n = std::strtoll(value.c_str(), &end, 10);
      if (*end != '\0' || n <= 0) fail("--sweep {}: {} is not a positive concurrency", text, value);
      plan.values.push_back(double(n));
    }
  }
  if (plan.values.empty()) fail("--sweep {}: no values", text);
  return plan;
}

std::string header_line(const std::string& header) {
  const size_t colon = header.find(':'), equals = header.find('=');
  const size_t at = std::min(colon, equals);
  if (at == std::string::npos || at == 0) fail("--header {}: expected NAME=VALUE", header);
  std::string value = header.substr(at + 1);
  value.erase(0, value.find_first_not_of(' '));
  return header.substr(0, at) + ": " + value;
}

// Distinct failure messages with their counts, most frequent first (at most five).
Json error_summary(const std::vector<RequestRecord>& records) {
  std::map<std::string, int64_t> counts;
  for (const RequestRecord& r : records)
    if (!r.success) ++counts[r.error.empty() ? "unknown error" : r.error];
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  Json out = Json::array();
  for (size_t i = 0; i < sorted.size() && i < 5; ++i) out.push_back({{"error", sorted[i].first}, {"count", sorted[i].second}});
  return out;
}

}  // namespace

Json run_bench(const BenchOptions& o, const BenchLog& log) {
  OpenAiClient client(o.base_url, o.api_key, 60);
  const BaseUrl& url = client.url();
  if (url.scheme != "http") fail("--base-url {}: bench speaks plain HTTP (put a local proxy in front of HTTPS)", o.base_url);

  std::string model = o.model;
  if (model.empty()) {
    const ServerInfo info = probe_server(client, "");
    if (info.model_ids.empty())
      fail("bench: no --model given and {} lists no models ({})", url.origin() + url.path("/v1/models"),
           info.error.empty() ? "empty list" : info.error);
    model = info.model_ids.front();
    log("bench: model " + model + " (the first of /v1/models)");
  }
  const bool chat = o.endpoint.find("chat/completions") != std::string::npos;
  if (o.prompt_format != "auto" && o.prompt_format != "ids" && o.prompt_format != "text")
    fail("--prompt-format {}: expected auto, ids or text", o.prompt_format);
  if (chat && o.prompt_format == "ids") fail("--prompt-format ids: chat requests carry text");
  const bool as_text = chat || o.prompt_format == "text" || o.dataset_name == "custom";

  std::unique_ptr<TokenSource> tokens;
  if (!o.tokenizer.empty()) tokens = local_token_source(o.tokenizer);
  else if ((tokens = server_token_source(client, model))) {
  } else if (o.vocab_size > 0) tokens = vocab_token_source(o.vocab_size);
  if (tokens) log("bench: tokens from " + tokens->describe());

  DatasetOptions dataset;
  dataset.name = o.dataset_name;
  dataset.path = o.dataset_path;
  dataset.num_prompts = o.num_prompts;
  dataset.input_len = o.input_len;
  dataset.output_len = o.output_len;
  dataset.prefix_len = o.prefix_len;
  dataset.range_ratio = o.range_ratio;
  dataset.seed = o.seed;
  dataset.as_text = as_text;
  const std::vector<BenchPrompt> prompts = make_dataset(dataset, tokens.get());

  // vLLM turns ignore_eos on for random prompts sent to OpenAI-compatible servers.
  const bool ignore_eos = o.ignore_eos >= 0 ? o.ignore_eos != 0 : o.dataset_name == "random";
  Json extra = Json::object();
  if (!o.extra_body.empty()) {
    extra = Json::parse(o.extra_body, nullptr, false);
    if (!extra.is_object()) fail("--extra-body {}: expected a JSON object", o.extra_body);
  }
  std::vector<std::string> headers;
  if (!o.api_key.empty()) headers.push_back("Authorization: Bearer " + o.api_key);
  for (const std::string& h : o.headers) headers.push_back(header_line(h));

  MetricOptions metric_options;
  metric_options.percentile_metrics = split(o.percentile_metrics, ',');
  for (const std::string& m : metric_options.percentile_metrics)
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el")
      fail("--percentile-metrics {}: unknown metric {} (ttft, tpot, itl, e2el)", o.percentile_metrics, m);
  metric_options.percentiles.clear();
  for (const std::string& p : split(o.metric_percentiles, ',')) {
    char* end = nullptr;
    const double value = std::strtod(p.c_str(), &end);
    if (*end != '\0' || value <= 0 || value >= 100) fail("--metric-percentiles {}: {} is not in (0, 100)", o.metric_percentiles, p);
    metric_options.percentiles.push_back(value);
  }
  metric_options.goodput = parse_goodput(o.goodput);

  const std::string path = url.path(o.endpoint.empty() || o.endpoint[0] != '/' ? "/" + o.endpoint : o.endpoint);
  std::vector<LoadRequest> requests;
  requests.reserve(prompts.size());
  for (const BenchPrompt& prompt : prompts) {
    Json body = {{"model", model},
                 {"temperature", o.temperature},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (ignore_eos) body["ignore_eos"] = true;
    if (chat) {
      body["messages"] = Json::array({{{"role", "user"}, {"content", prompt.text}}});
      body["max_completion_tokens"] = prompt.output_len;
      body["max_tokens"] = prompt.output_len;
    } else {
      body["prompt"] = prompt.text.empty() ? Json(prompt.ids) : Json(prompt.text);
      body["max_tokens"] = prompt.output_len;
    }
    for (const auto& [key, value] : extra.items()) body[key] = value;
    LoadRequest request;
    request.http = http_post(url.host, url.port, path, body.dump(), headers);
    request.prompt_len = prompt.prompt_len;
    requests.push_back(std::move(request));
  }

  LoadOptions load;
  load.host = url.host;
  load.port = url.port;
  load.timeout_s = o.timeout_s;

  // vLLM's ready check: the first prompt until it succeeds (or the timeout passes), not counted.
  if (o.ready_check_timeout_s > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.ready_check_timeout_s);
    LoadOptions check = load;
    check.timeout_s = o.ready_check_timeout_s;
    while (true) {
      const LoadResult result = run_load(check, {requests.front()});
      const RequestRecord& r = result.records.front();
      if (r.success) break;
      // A server that answers 4xx is up and says no: waiting will not change that.
      const bool client_error = r.error.rfind("HTTP 4", 0) == 0;
      if (client_error || std::chrono::steady_clock::now() >= deadline)
        fail("bench: the test request to {} failed: {}", url.origin() + path, r.error);
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  if (o.num_warmups > 0) {
    log(fmt::format("bench: {} warmup request(s)", o.num_warmups));
    std::vector<LoadRequest> warmups(size_t(o.num_warmups), requests.front());
    run_load(load, warmups);
  }

  const SweepPlan sweep = parse_sweep(o.sweep);
  std::vector<double> points = sweep.values;
  if (points.empty()) points.push_back(0);
  Json runs = Json::array();
  for (const double point : points) {
    double rate = o.request_rate;
    int64_t concurrency = o.max_concurrency;
    if (sweep.key == "request_rate") rate = point;
    if (sweep.key == "max_concurrency") concurrency = int64_t(point);
    const std::vector<double> arrivals = arrival_times(requests.size(), rate, o.burstiness, o.seed);
    for (size_t i = 0; i < requests.size(); ++i) requests[i].arrival = arrivals[i];
    load.max_concurrency = concurrency;
    std::atomic<int64_t> finished{0}, failed{0};
    load.finished = &finished;
    load.failed = &failed;
    log(fmt::format("bench: {} requests, rate {}, burstiness {}, max concurrency {}", requests.size(),
                    std::isinf(rate) ? "inf" : fmt::format("{:g}/s", rate), o.burstiness,
                    concurrency > 0 ? std::to_string(concurrency) : "none"));
    LoadResult result;
    {
      ProgressBar bar(o.progress, int64_t(requests.size()), "bench", finished, failed);
      result = run_load(load, requests);
    }
    // Output tokens: the server's usage; else counted from the text; else one per chunk.
    std::string counted_by = "usage";
    for (RequestRecord& r : result.records) {
      if (!r.success || r.output_tokens >= 0) continue;
      std::optional<int64_t> n = tokens ? tokens->count(r.text) : std::nullopt;
      if (n) {
        if (counted_by == "usage") counted_by = "tokenizer";
      } else {
        counted_by = "chunks";
      }
      r.output_tokens = n ? *n : r.chunks;
    }
    Json out = {{"date", date_stamp()},
                {"endpoint_type", chat ? "openai-chat" : "openai"},
                {"backend", chat ? "openai-chat" : "openai"},
                {"label", o.label.empty() ? (chat ? "openai-chat" : "openai") : o.label},
                {"model_id", model},
                {"tokenizer_id", tokens ? tokens->describe() : ""},
                {"num_prompts", int64_t(requests.size())},
                {"request_rate", rate_json(rate)},
                {"burstiness", o.burstiness},
                {"max_concurrency", concurrency > 0 ? Json(concurrency) : Json(nullptr)}};
    const Json metrics = compute_metrics(result.records, result.duration, metric_options);
    for (const auto& [key, value] : metrics.items()) out[key] = value;
    out["base_url"] = url.origin() + url.prefix;
    out["endpoint"] = o.endpoint;
    out["dataset_name"] = o.dataset_name;
    out["input_len"] = o.input_len;
    out["output_len"] = o.output_len;
    out["range_ratio"] = o.range_ratio;
    out["ignore_eos"] = ignore_eos;
    out["output_tokens_from"] = counted_by;
    out["errors"] = error_summary(result.records);
    if (o.save_detailed) {
      Json input_lens = Json::array(), output_lens = Json::array(), ttfts = Json::array(), itls = Json::array(),
           texts = Json::array(), errors = Json::array(), starts = Json::array();
      for (const RequestRecord& r : result.records) {
        input_lens.push_back(r.prompt_len);
        output_lens.push_back(r.success ? r.output_tokens : 0);
        ttfts.push_back(r.success ? r.ttft : 0);
        itls.push_back(r.itl);
        texts.push_back(r.text);
        errors.push_back(r.error);
        starts.push_back(r.start);
      }
      out["input_lens"] = input_lens;
      out["output_lens"] = output_lens;
      out["ttfts"] = ttfts;
      out["itls"] = itls;
      out["generated_texts"] = texts;
      out["errors_detailed"] = errors;
      out["start_times"] = starts;
    }
    if (metrics["failed"].get<int64_t>() > 0)
      log(fmt::format("bench: {} request(s) failed; first: {}", metrics["failed"].get<int64_t>(),
                      out["errors"].empty() ? "" : out["errors"][0]["error"].get<std::string>()));
    runs.push_back(std::move(out));
  }
  if (sweep.key.empty()) return runs[0];
  Json values = Json::array();
  for (const double v : sweep.values) values.push_back(sweep.key == "request_rate" ? rate_json(v) : Json(int64_t(v)));
  Json out = {{"date", runs[0]["date"]},
              {"endpoint_type", runs[0]["endpoint_type"]},
              {"backend", runs[0]["backend"]},
              {"label", runs[0]["label"]},
              {"model_id", model},
              {"tokenizer_id", runs[0]["tokenizer_id"]},
              {"num_prompts", int64_t(requests.size())},
              {"sweep", {{"key", sweep.key}, {"values", values}}},
              {"runs", runs}};
  return out;
}

namespace {

std::string line(const std::string& label, const std::string& value) { return fmt::format("{:<40} {:<10}\n", label, value); }

std::string number(const Json& result, const std::string& key, int decimals = 2) {
  if (!result.contains(key) || result[key].is_null()) return "n/a";
  const Json& v = result[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  return fmt::format("{:.{}f}", v.get<double>(), decimals);
}

std::string centered(const std::string& text, char fill) {
  const size_t width = 50;
  if (text.size() >= width) return text + "\n";
  const size_t left = (width - text.size()) / 2;
  return std::string(left, fill) + text + std::string(width - text.size() - left, fill) + "\n";
}

std::string one_result(const Json& r) {
  std::string out = centered(" Serving Benchmark Result ", '=');
  out += line("Successful requests:", number(r, "completed"));
  out += line("Failed requests:", number(r, "failed"));
  if (r.contains("max_concurrency") && !r["max_concurrency"].is_null())
    out += line("Maximum request concurrency:", number(r, "max_concurrency"));
  if (r.contains("request_rate")) out += line("Request rate configured (RPS):", number(r, "request_rate"));
  out += line("Benchmark duration (s):", number(r, "duration"));
  out += line("Total input tokens:", number(r, "total_input_tokens"));
  out += line("Total generated tokens:", number(r, "total_output_tokens"));
  out += line("Request throughput (req/s):", number(r, "request_throughput"));
  if (r.contains("request_goodput") && !r["request_goodput"].is_null())
    out += line("Request goodput (req/s):", number(r, "request_goodput"));
  out += line("Output token throughput (tok/s):", number(r, "output_throughput"));
  out += line("Peak output token throughput (tok/s):", number(r, "max_output_tokens_per_s"));
  out += line("Peak concurrent requests:", number(r, "max_concurrent_requests"));
  out += line("Total Token throughput (tok/s):", number(r, "total_token_throughput"));
  const std::vector<std::tuple<std::string, std::string, std::string>> sections = {
      {"ttft", "TTFT", "Time to First Token"},
      {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
      {"itl", "ITL", "Inter-token Latency"},
      {"e2el", "E2EL", "End-to-end Latency"}};
  for (const auto& [key, abbrev, title] : sections) {
    if (!r.contains("mean_" + key + "_ms")) continue;
    out += centered(title, '-');
    out += line("Mean " + abbrev + " (ms):", number(r, "mean_" + key + "_ms"));
    out += line("Median " + abbrev + " (ms):", number(r, "median_" + key + "_ms"));
    for (const auto& [k, v] : r.items()) {
      const std::string suffix = "_" + key + "_ms";
      if (k.size() > suffix.size() && k[0] == 'p' && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          std::isdigit(static_cast<unsigned char>(k[1])))
        out += line("P" + k.substr(1, k.size() - 1 - suffix.size()) + " " + abbrev + " (ms):", number(r, k));
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace

std::string format_bench_result(const Json& result) {
  if (!result.contains("runs")) return one_result(result);
  std::string out;
  const std::string key = result["sweep"].value("key", "");
  for (const Json& run : result["runs"]) {
    out += fmt::format("{} = {}\n", key, run.contains(key) ? (run[key].is_string() ? run[key].get<std::string>() : run[key].dump()) : "?");
    out += one_result(run) + "\n";
  }
  return out;
}

namespace {

// Round tick spacing: 1, 2 or 5 times a power of ten, about `count` ticks over [0, max].
double tick_step(double max, int count) {
  if (max <= 0) return 1;
  const double raw = max / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * magnitude) return m * magnitude;
  return 10 * magnitude;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  if (std::fabs(v) >= 1000) return fmt::format("{:.0f}", v);
  return fmt::format("{:g}", v);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string bench_plot_svg(const Json& result) {
  std::vector<Json> runs;
  std::string key;
  if (result.contains("runs")) {
    for (const Json& r : result["runs"]) runs.push_back(r);
    key = result["sweep"].value("key", "");
  } else {
    runs.push_back(result);
  }
  auto value = [](const Json& r, const std::string& k) {
    return r.contains(k) && r[k].is_number() ? r[k].get<double>() : 0.0;
  };
  auto point_label = [&](const Json& r) {
    if (key == "max_concurrency") return "c=" + r["max_concurrency"].dump();
    if (key == "request_rate")
      return r["request_rate"].is_string() ? std::string("inf") : fmt::format("{:g}/s", r["request_rate"].get<double>());
    return std::string();
  };
  const double width = 760, panel_height = 260, left = 80, right = 30, top = 50, gap = 70;
  const double plot_width = width - left - right;
  const double height = top + 2 * panel_height + gap + 50;
  double x_max = 0;
  for (const Json& r : runs) x_max = std::max(x_max, value(r, "output_throughput"));
  const double x_step = tick_step(x_max * 1.08, 6);
  const double x_top = std::max(x_step, std::ceil(x_max * 1.08 / x_step) * x_step);

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  const std::string title = fmt::format("{} — latency vs output throughput{}", result.value("model_id", std::string("")),
                                        key.empty() ? "" : " (sweep over " + key + ")");
  svg += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n", width / 2, xml_escape(title));

  struct Series {
    std::string key, label, color, dash;
  };
  const std::vector<std::pair<std::string, std::vector<Series>>> panels = {
      {"TTFT (ms)", {{"median_ttft_ms", "median TTFT", "#1f77b4", ""}, {"p99_ttft_ms", "p99 TTFT", "#1f77b4", "6,4"}}},
      {"TPOT (ms)", {{"median_tpot_ms", "median TPOT", "#d62728", ""}, {"p99_tpot_ms", "p99 TPOT", "#d62728", "6,4"}}}};
  for (size_t p = 0; p < panels.size(); ++p) {
    const double y0 = top + double(p) * (panel_height + gap);
    const auto& [axis, series] = panels[p];
    double y_max = 0;
    for (const Json& r : runs)
      for (const Series& s : series) y_max = std::max(y_max, value(r, s.key));
    const double y_step = tick_step(y_max * 1.1, 5);
    const double y_top = std::max(y_step, std::ceil(y_max * 1.1 / y_step) * y_step);
    auto px = [&](double x) { return left + x / x_top * plot_width; };
    auto py = [&](double y) { return y0 + panel_height - y / y_top * panel_height; };
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left, y0,
                       plot_width, panel_height);
    for (double y = 0; y <= y_top + y_step / 2; y += y_step) {
      svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", left, py(y),
                         left + plot_width, py(y));
      svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, py(y) + 4, tick_label(y));
    }
    for (double x = 0; x <= x_top + x_step / 2; x += x_step) {
      svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#eee\"/>\n", px(x), y0, px(x),
                         y0 + panel_height);
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(x), y0 + panel_height + 16,
                         tick_label(x));
    }
    svg += fmt::format("<text x=\"18\" y=\"{:.1f}\" transform=\"rotate(-90 18 {:.1f})\" text-anchor=\"middle\">{}</text>\n",
                       y0 + panel_height / 2, y0 + panel_height / 2, axis);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">output throughput (tok/s)</text>\n",
                       left + plot_width / 2, y0 + panel_height + 34);
    double legend_x = left + 10;
    for (const Series& s : series) {
      std::string points;
      for (const Json& r : runs) points += fmt::format("{:.1f},{:.1f} ", px(value(r, "output_throughput")), py(value(r, s.key)));
      svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{}/>\n", points, s.color,
                         s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"");
      for (const Json& r : runs)
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", px(value(r, "output_throughput")),
                           py(value(r, s.key)), s.color);
      svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}/>"
                         "<text x=\"{}\" y=\"{}\">{}</text>\n",
                         legend_x, y0 + 14, legend_x + 24, y0 + 14, s.color,
                         s.dash.empty() ? "" : " stroke-dasharray=\"" + s.dash + "\"", legend_x + 30, y0 + 18, s.label);
      legend_x += 130;
    }
    for (const Json& r : runs) {
      const std::string label = point_label(r);
      if (label.empty()) continue;
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#555\">{}</text>\n",
                         px(value(r, "output_throughput")) + 5, py(value(r, series[0].key)) - 6, xml_escape(label));
    }
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace anvil::tools
