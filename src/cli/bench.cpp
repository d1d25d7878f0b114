// anvil bench: vLLM's serving benchmark against any OpenAI-compatible server.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "cli/notebook_flags.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "tools/bench.h"
#include "tools/notebook.h"

namespace anvil::cli {

namespace {

struct BenchFlags {
  tools::BenchOptions options;
  std::string request_rate = "inf", result_file, plot;
  bool json = false, no_progress = false, ignore_eos = false, no_ignore_eos = false;
  NotebookFlags notebook;
};

double parse_request_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double rate = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(rate > 0)) fail("--request-rate {}: expected a positive number or inf", text);
  return rate;
}

void write_text(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) fail("{} {}: cannot write", what, path);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  tools::BenchOptions& o = flags->options;
  CLI::App* verb = app.add_subcommand("bench", "Benchmark an OpenAI-compatible server as vLLM's `bench serve` does");
  verb->add_option("--base-url", o.base_url, "Server to measure, e.g. http://127.0.0.1:8000")->capture_default_str();
  verb->add_option("--endpoint", o.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  verb->add_option("--model", o.model, "Model name (default: the first of /v1/models)");
  verb->add_option("--api-key", o.api_key, "Bearer token for the server");
  verb->add_option("--label", o.label, "Label for the result (default: the backend)");
  verb->add_option("--tokenizer", o.tokenizer,
                   "tokenizer.json (or a model dir) for prompts and token counts (default: the server's /tokenize)");
  verb->add_option("--vocab-size", o.vocab_size, "Without any tokenizer: draw prompt ids below this");
  verb->add_option("--prompt-format", o.prompt_format, "auto (ids for completions, text for chat), ids or text")
      ->capture_default_str();
  verb->add_option("--dataset-name", o.dataset_name, "random, or custom (--dataset-path JSONL with a \"prompt\" per line)")
      ->capture_default_str();
  verb->add_option("--dataset-path", o.dataset_path, "JSONL file for --dataset-name custom");
  verb->add_option("--num-prompts", o.num_prompts, "Requests to send")->capture_default_str();
  verb->add_option("--input-len,--random-input-len", o.input_len, "Prompt tokens")->capture_default_str();
  verb->add_option("--output-len,--random-output-len", o.output_len, "Tokens to generate")->capture_default_str();
  verb->add_option("--range-ratio,--random-range-ratio", o.range_ratio,
                   "Lengths drawn from [L(1-r), L(1+r)], r in [0, 1)")->capture_default_str();
  verb->add_option("--random-prefix-len", o.prefix_len, "Tokens of one shared prefix before every prompt")
      ->capture_default_str();
  verb->add_option("--request-rate", flags->request_rate, "Requests per second (Poisson arrivals), or inf")
      ->capture_default_str();
  verb->add_option("--burstiness", o.burstiness, "Gamma shape of the arrivals (1 = Poisson)")->capture_default_str();
  verb->add_option("--max-concurrency", o.max_concurrency, "Requests in flight at most");
  verb->add_option("--sweep", o.sweep, "Run once per value: max-concurrency=1,4,16 or request-rate=1,2,inf");
  verb->add_option("--goodput", o.goodput, "SLOs for goodput, e.g. ttft:500 tpot:50 e2el:5000 (milliseconds)");
  verb->add_flag("--ignore-eos", flags->ignore_eos, "Generate every requested token (default for random prompts)");
  verb->add_flag("--no-ignore-eos", flags->no_ignore_eos, "Let the model stop early");
  verb->add_option("--seed", o.seed, "Seed for prompts and arrivals")->capture_default_str();
  verb->add_option("--temperature", o.temperature, "Sampling temperature")->capture_default_str();
  verb->add_option("--percentile-metrics", o.percentile_metrics, "Metrics to report: ttft,tpot,itl,e2el")
      ->capture_default_str();
  verb->add_option("--metric-percentiles", o.metric_percentiles, "Percentiles to report, e.g. 50,90,99")
      ->capture_default_str();
  verb->add_option("--num-warmups", o.num_warmups, "Uncounted requests before the run")->capture_default_str();
  verb->add_option("--ready-check-timeout-sec", o.ready_check_timeout_s,
                   "Retry a first test request this long before the run (0: no test request)")
      ->capture_default_str();
  verb->add_option("--extra-body", o.extra_body, "JSON object merged into every request body");
  verb->add_option("--header", o.headers, "Extra request header NAME=VALUE (repeatable)");
  verb->add_option("--timeout", o.timeout_s, "Seconds one request may take")->capture_default_str();
  verb->add_flag("--disable-tqdm,--no-progress", flags->no_progress, "No progress bar on stderr");
  verb->add_flag("--save-detailed", o.save_detailed, "Add per-request lengths, TTFTs, ITLs, texts and errors to the JSON");
  verb->add_option("--result-file", flags->result_file, "Also write the JSON result to this file");
  verb->add_option("--plot", flags->plot, "Write latency against throughput as SVG (for a sweep: one point per value)");
  verb->add_flag("--json", flags->json, "Print one JSON object with vLLM's key names on stdout");
  flags->notebook.add_to(*verb);
  verb->callback([flags] {
    tools::BenchOptions options = flags->options;
    options.request_rate = parse_request_rate(flags->request_rate);
    if (flags->ignore_eos && flags->no_ignore_eos) fail("give --ignore-eos or --no-ignore-eos, not both");
    if (flags->ignore_eos) options.ignore_eos = 1;
    if (flags->no_ignore_eos) options.ignore_eos = 0;
    options.progress = !flags->no_progress;
    const auto log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    const nlohmann::json result = tools::run_bench(options, log);
    if (flags->json) std::printf("%s\n", result.dump(2).c_str());
    else std::fputs(tools::format_bench_result(result).c_str(), stdout);
    std::fflush(stdout);
    if (!flags->result_file.empty()) write_text(flags->result_file, result.dump(2) + "\n", "--result-file");
    if (!flags->plot.empty()) {
      write_text(flags->plot, tools::bench_plot_svg(result), "--plot");
      std::fprintf(stderr, "bench: plot written to %s\n", flags->plot.c_str());
    }

    if (flags->notebook.skip) return;
    const std::string model = result.value("model_id", options.model);
    const tools::OpenAiClient client(options.base_url, options.api_key, 30);
    const tools::ServerInfo info = tools::probe_server(client, model);
    tools::NotebookRun run;
    run.kind = "bench";
    run.base_url = client.url().origin() + client.url().prefix;
    run.model = model;
    run.figures = result;
    run.flags = {{"endpoint", options.endpoint},
                 {"dataset_name", options.dataset_name},
                 {"num_prompts", options.num_prompts},
                 {"input_len", options.input_len},
                 {"output_len", options.output_len},
                 {"range_ratio", options.range_ratio},
                 {"request_rate", std::isinf(options.request_rate) ? nlohmann::json("inf") : nlohmann::json(options.request_rate)},
                 {"burstiness", options.burstiness},
                 {"max_concurrency", options.max_concurrency > 0 ? nlohmann::json(options.max_concurrency) : nlohmann::json(nullptr)},
                 {"sweep", options.sweep}};
    flags->notebook.record(run, client.url(), info.engine, info.quantization);
  });
}

}  // namespace anvil::cli
