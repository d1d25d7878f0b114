// anvil bench-cpu: one command that measures this machine's memory bandwidth and a model's
// prefill and decode speed on the CPU in the same run, so decode can be stated as a fraction of
// what the memory allows. Used for docs/perf/cpu.md.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/cpu/memory_bandwidth.h"
#include "backend/vector_ops.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "core/thread_pool.h"
#include "engine/generator.h"

namespace anvil::cli {

namespace {

struct BenchCpuOptions {
  ModelLoadFlags model;
  int64_t prompt_tokens = 128;
  int64_t decode_tokens = 16;
  int64_t buffer_mib = 1024;
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

void run_bench_cpu(const BenchCpuOptions& options) {
  const auto load_start = std::chrono::steady_clock::now();
  auto model = options.model.load();
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  ThreadPool& pool = default_thread_pool();
  const size_t buffer_bytes = size_t(options.buffer_mib) << 20;
  const double copy_gbps = measure_copy_bandwidth_gbps(pool, buffer_bytes);
  const double read_gbps = measure_read_bandwidth_gbps(pool, buffer_bytes);

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
      {"load_seconds", load_seconds},
      {"weights_gb_total", double(model->weight_bytes_total()) / 1e9},
      {"weights_gb_per_decoded_token", weight_gb},
      {"copy_bandwidth_gbps", copy_gbps},
      {"read_bandwidth_gbps", read_gbps},
      {"prompt_tokens", options.prompt_tokens},
      {"prefill_tokens_per_s", prefill_tps},
      {"decode_steps", result.decode_steps},
      {"decode_tokens_per_s", decode_tps},
      {"decode_weight_read_gbps", decode_tps * weight_gb},
      {"decode_fraction_of_read_bandwidth", read_gbps > 0 ? decode_tps * weight_gb / read_gbps : 0.0},
      {"decode_fraction_of_copy_bandwidth", copy_gbps > 0 ? decode_tps * weight_gb / copy_gbps : 0.0},
  };
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
  verb->callback([options] { run_bench_cpu(*options); });
}

}  // namespace anvil::cli
