// anvil bench-cpu: one command that measures this machine's memory bandwidth and FMA peak and a
// model's prefill and decode speed on the CPU in the same run, so decode can be stated as a
// fraction of what the memory allows, and batched decode (--streams) against the arithmetic
// ceiling. Used for docs/perf/cpu.md and docs/perf/cpu-batching.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backend/cpu/machine_peak.h"
#include "backend/cpu/memory_bandwidth.h"
#include "backend/linear.h"
#include "backend/vector_ops.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/generator.h"

namespace anvil::cli {

namespace {

struct BenchCpuOptions {
  ModelLoadFlags model;
  int64_t prompt_tokens = 128;
  int64_t decode_tokens = 16;
  int64_t buffer_mib = 1024;
  std::string mxfp4_activations;  // empty: ANVIL_MXFP4_ACTIVATIONS or the default
  std::string streams;  // "1,8": also run the engine with that many concurrent sequences
};

// Read-only bandwidth: every thread streams its slice of a buffer too large for the caches,
// which is what a matrix-vector kernel does with its weights. Best of three passes.
double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes) {
  std::vector<float> buffer(bytes / sizeof(float), 1.0f);
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<double> total{0.0};
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(int64_t(buffer.size()), [&](int64_t begin, int64_t end) {
      total.fetch_add(double(dot_f32(buffer.data() + begin, buffer.data() + begin, end - begin)));
    }, 4096);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (total.load() <= 0.0) return 0.0;  // uses the result, so the reads cannot be elided
    best = std::max(best, double(bytes) / seconds / 1e9);
  }
  return best;
}

// A deterministic prompt per (run, stream): distinct, so no stream reuses another's KV blocks.
std::vector<int32_t> bench_prompt(int64_t length, int64_t vocab, int64_t salt) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < length; ++i) ids.push_back(int32_t((i * 7919 + 13 + salt * 104729) % vocab));
  return ids;
}

// N sequences submitted at once to the continuous-batching engine, each with the same prompt
// length and token budget, so after one shared prefill they decode in lockstep, N tokens per
// step. Aggregate decode speed counts the tokens after every stream's first (which the prefill
// step produces) over the time from the last first token to the last token.
nlohmann::json run_streams(Engine& engine, int64_t streams, const BenchCpuOptions& options, int64_t salt) {
  using Clock = std::chrono::steady_clock;
  std::mutex mutex;
  std::condition_variable done;
  int64_t finished = 0, first_tokens = 0, tokens = 0;
  Clock::time_point last_first, last_token;
  std::string error;
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < streams; ++i) {
    RequestParams params;
    params.prompt_ids = bench_prompt(options.prompt_tokens, engine.model().config().vocab_size, salt + i);
    params.max_tokens = options.decode_tokens;
    params.ignore_eos = true;
    params.sampling.temperature = 0.0f;
    engine.submit(std::move(params), [&, seen = int64_t(0)](const RequestOutput& out) mutable {
      const Clock::time_point now = Clock::now();
      std::lock_guard<std::mutex> lock(mutex);
      for (size_t k = 0; k < out.tokens.size(); ++k) {
        if (seen++ == 0) {
          ++first_tokens;
          last_first = now;
        }
        ++tokens;
        last_token = now;
      }
      if (out.finish_reason == "error") error = out.error;
      if (out.finished && ++finished == streams) done.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(mutex);
  done.wait(lock, [&] { return finished == streams; });
  if (!error.empty()) fail("bench-cpu --streams: a request failed: {}", error);
  const double prefill_seconds = std::chrono::duration<double>(last_first - start).count();
  const double decode_seconds = std::chrono::duration<double>(last_token - last_first).count();
  const int64_t decode_tokens = tokens - first_tokens;
  return {
      {"streams", streams},
      {"prefill_seconds", prefill_seconds},
      {"decode_tokens", decode_tokens},
      {"decode_seconds", decode_seconds},
      {"decode_tokens_per_s", decode_seconds > 0 ? double(decode_tokens) / decode_seconds : 0.0},
  };
}

void run_bench_cpu(const BenchCpuOptions& options) {
  if (options.mxfp4_activations == "int8") {
    set_mxfp4_activations(Mxfp4Activations::Int8);
  } else if (options.mxfp4_activations == "f32") {
    set_mxfp4_activations(Mxfp4Activations::Float32);
  } else if (!options.mxfp4_activations.empty()) {
    fail("--mxfp4-activations: '{}' is not one of f32, int8", options.mxfp4_activations);
  }
  std::vector<int64_t> stream_counts;
  if (!options.streams.empty()) {
    for (int32_t n : parse_id_list(options.streams, "--streams")) {
      if (n < 1) fail("--streams: {} is not a positive number of streams", n);
      stream_counts.push_back(n);
    }
  }
  if (options.decode_tokens < 2) fail("--decode-tokens must be at least 2 (the first token comes from the prefill)");
  const auto load_start = std::chrono::steady_clock::now();
  auto model = options.model.load();
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  ThreadPool& pool = default_thread_pool();
  const size_t buffer_bytes = size_t(options.buffer_mib) << 20;
  const double copy_gbps = measure_copy_bandwidth_gbps(pool, buffer_bytes);
  const double read_gbps = measure_read_bandwidth_gbps(pool, buffer_bytes);
  const double peak_gflops = measure_peak_fma_gflops(pool);

  GenerateRequest request;
  for (int64_t i = 0; i < options.prompt_tokens; ++i)
    request.prompt_ids.push_back(int32_t((i * 7919 + 13) % model->config().vocab_size));
  request.max_tokens = options.decode_tokens;
  request.sampling.temperature = 0.0f;
  request.ignore_eos = true;
  const GenerateResult result = generate(*model, request);

  const double prefill_tps = double(options.prompt_tokens) / result.prefill_seconds;
  const double decode_tps = double(result.decode_steps) / result.decode_seconds;
  const double weight_gb = double(model->weight_bytes_per_token()) / 1e9;
  nlohmann::json out = {
      {"model", options.model.model_dir},
      {"load_format", options.model.load_format},
      {"threads", pool.size()},
      {"cpu_kernels", cpu_kernel_isa()},
      {"mxfp4_activations", mxfp4_activations_name(mxfp4_activations())},
      {"load_seconds", load_seconds},
      {"weights_gb_total", double(model->weight_bytes_total()) / 1e9},
      {"weights_gb_per_decoded_token", weight_gb},
      {"copy_bandwidth_gbps", copy_gbps},
      {"read_bandwidth_gbps", read_gbps},
      {"peak_fma_gflops", peak_gflops},
      {"prompt_tokens", options.prompt_tokens},
      {"prefill_tokens_per_s", prefill_tps},
      {"decode_steps", result.decode_steps},
      {"decode_tokens_per_s", decode_tps},
      {"decode_weight_read_gbps", decode_tps * weight_gb},
      {"decode_fraction_of_read_bandwidth", read_gbps > 0 ? decode_tps * weight_gb / read_gbps : 0.0},
      {"decode_fraction_of_copy_bandwidth", copy_gbps > 0 ? decode_tps * weight_gb / copy_gbps : 0.0},
  };
  if (!stream_counts.empty()) {
    // Batched decode is bounded by arithmetic (2 FLOP per weight per token), one stream by
    // bandwidth (every weight byte once per token), so the best ratio between them this machine
    // allows is (peak FLOP/s / FLOP per token) / (bandwidth / bytes per token). FLOP per token
    // is known here for unquantized models (2-byte weights: one FLOP per byte, less the embedding
    // row, which is read but not multiplied); attention's share is left out (about 1% at the
    // context lengths of this benchmark).
    const auto& config_ref = model->config();
    const double bytes_per_token = double(model->weight_bytes_per_token());
    const double flops_per_token =
        config_ref.quant_method == QuantMethod::None ? bytes_per_token - 2.0 * double(config_ref.hidden_size) : 0.0;
    EngineConfig config;
    config.enable_prefix_caching = false;  // every run prefills its own prompts
    const int64_t largest = *std::max_element(stream_counts.begin(), stream_counts.end());
    config.max_num_seqs = std::max<int64_t>(largest, 1);
    config.max_num_batched_tokens = std::max<int64_t>(2048, largest * options.prompt_tokens);
    Engine engine(std::move(model), config);
    nlohmann::json runs = nlohmann::json::array();
    int64_t salt = 1;
    for (int64_t n : stream_counts) {
      runs.push_back(run_streams(engine, n, options, salt));
      salt += n;
    }
    out["streams"] = runs;
    if (flops_per_token > 0) out["decode_flops_per_token"] = flops_per_token;
    if (flops_per_token > 0 && peak_gflops > 0 && read_gbps > 0) {
      out["ceiling_batched_tokens_per_s"] = peak_gflops * 1e9 / flops_per_token;
      out["ceiling_single_stream_tokens_per_s"] = read_gbps * 1e9 / bytes_per_token;
      out["ceiling_ratio"] = (peak_gflops * 1e9 / flops_per_token) / (read_gbps * 1e9 / bytes_per_token);
    }
    const double one = runs[0]["decode_tokens_per_s"].get<double>();
    for (auto& run : out["streams"]) {
      if (one > 0) run["speedup_over_first"] = run["decode_tokens_per_s"].get<double>() / one;
      if (flops_per_token > 0 && peak_gflops > 0) {
        run["fraction_of_fma_peak"] = run["decode_tokens_per_s"].get<double>() * flops_per_token / (peak_gflops * 1e9);
      }
      if (read_gbps > 0) {
        run["fraction_of_read_bandwidth"] = run["decode_tokens_per_s"].get<double>() * bytes_per_token / (read_gbps * 1e9);
      }
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

void register_bench_cpu(CLI::App& app) {
  auto options = std::make_shared<BenchCpuOptions>();
  CLI::App* verb = app.add_subcommand(
      "bench-cpu", "Measure memory bandwidth, then a model's prefill and decode speed on the CPU, in one run");
  options->model.add_to(*verb);
  verb->add_option("--prompt-tokens", options->prompt_tokens, "Prompt length for the prefill figure");
  verb->add_option("--decode-tokens", options->decode_tokens, "Tokens to decode for the decode figure");
  verb->add_option("--buffer-mib", options->buffer_mib, "Buffer size for the bandwidth measurements");
  verb->add_option("--mxfp4-activations", options->mxfp4_activations,
                   "f32 (exact) or int8 (quantized input, faster); default ANVIL_MXFP4_ACTIVATIONS, else f32");
  verb->add_option("--streams", options->streams,
                   "Also decode N concurrent sequences through the batching engine, for each N of a list "
                   "like 1,8 (aggregate tokens/s)");
  verb->callback([options] { run_bench_cpu(*options); });
}

}  // namespace anvil::cli
