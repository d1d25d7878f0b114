// anvil bench-gpu: the GPU's copy bandwidth and a model's prefill and decode speed on it, in one
// run, so batch-1 decode can be stated as a fraction of what the memory allows. The model is
// driven step by step as the engine drives it, with
// every sequence's KV blocks laid out up front. Decode picks greedy tokens on the device
// (forward_argmax), as a greedy benchmark client would be served. Used for docs/perf/ and scripts/gpu_check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/cuda/runtime.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"

namespace anvil::cli {

namespace {

struct BenchGpuOptions {
  ModelLoadFlags model;
  int64_t prefill_tokens = 2048;
  int64_t decode_prompt = 512;  // as the llama.cpp anchor's parallel-decode run
  int64_t decode_steps = 32;
  std::string batches = "1,8,32,64";
  int64_t copy_mib = 2048;
  bool profile = false;
};

// Device-to-device copy, counting bytes read plus bytes written (the STREAM convention the
// performance anchors use). Best of several.
double copy_bandwidth_gbps(size_t bytes) {
  cuda::DeviceBuffer a(bytes), b(bytes);
  cuda::memset_device(a.get(), 1, bytes);
  cuda::EventTimer timer;
  double best = 0.0;
  for (int i = 0; i < 12; ++i) {
    timer.start();
    cuda::copy_device_to_device(b.get(), a.get(), bytes);
    const double ms = timer.stop_ms();
    if (i >= 2) best = std::max(best, 2.0 * double(bytes) / (ms * 1e-3) / 1e9);
  }
  return best;
}

// B sequences with disjoint blocks; the cache holds `context` positions per sequence.
struct BenchCache {
  std::vector<KvGroupStorage> storage;
  std::vector<std::vector<int32_t>> tables;  // per sequence, shared by all groups
  BenchCache(const KvLayout& layout, int64_t sequences, int64_t context) {
    const int64_t blocks_per_seq = (context + 15) / 16;
    for (int g = 0; g < layout.num_groups(); ++g)
      storage.emplace_back(KvGroupShape{layout.group_layers[size_t(g)], sequences * blocks_per_seq, 16, layout.kv_heads,
                                        layout.head_dim, layout.device, layout.dtype});
    for (int64_t s = 0; s < sequences; ++s) {
      std::vector<int32_t> table;
      for (int64_t b = 0; b < blocks_per_seq; ++b) table.push_back(int32_t(s * blocks_per_seq + b));
      tables.push_back(std::move(table));
    }
  }
};

StepBatch make_step(const BenchCache& cache, const KvLayout& layout, int64_t first_seq, int64_t sequences,
                    int64_t start_pos, int64_t tokens_each, int32_t vocab) {
  StepBatch batch;
  for (int64_t s = first_seq; s < first_seq + sequences; ++s) {
    SequenceStep seq;
    seq.start_pos = start_pos;
    seq.num_tokens = tokens_each;
    for (int g = 0; g < layout.num_groups(); ++g) seq.block_tables.emplace_back(cache.tables[size_t(s)]);
    batch.sequences.push_back(std::move(seq));
    for (int64_t t = 0; t < tokens_each; ++t)
      batch.tokens.push_back(int32_t((s * 7919 + (start_pos + t) * 104729 + 13) % vocab));
  }
  return batch;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_bench_gpu(const BenchGpuOptions& options) {
  if (cuda::devices().empty()) fail("bench-gpu: no CUDA GPU ({})", cuda::unavailable_reason());
  const auto device = cuda::devices().front();
  const double copy_gbps = copy_bandwidth_gbps(size_t(options.copy_mib) << 20);
  const size_t free_before = cuda::device_free_memory();
  const auto load_start = std::chrono::steady_clock::now();
  ModelLoadFlags flags = options.model;
  if (flags.device == "auto") flags.device = "cuda";
  auto model = flags.load();
  const double load_seconds = seconds_since(load_start);
  if (model->device() != Device::Cuda) fail("bench-gpu: the model did not load on the GPU");
  const KvLayout& layout = model->kv_layout();
  const int32_t vocab = int32_t(model->config().vocab_size);
  const std::vector<int32_t> batches = parse_id_list(options.batches, "--batches");
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());

  nlohmann::json out = {{"gpu", device.name},
                        {"compute_capability", std::to_string(device.major) + "." + std::to_string(device.minor)},
                        {"model", options.model.model_dir},
                        {"load_format", options.model.load_format},
                        {"load_seconds", load_seconds},
                        {"copy_bandwidth_gbps", copy_gbps},
                        {"dtype", flags.dtype},
                        {"kv_cache_dtype", cuda::kv_dtype_name(layout.dtype)},
                        {"cuda_graphs", !flags.enforce_eager}};
  const double weight_gb = double(model->weight_bytes_per_token()) / 1e9;
  out["weights_gb_per_decoded_token"] = weight_gb;
  out["decode_ceiling_tokens_per_s"] = copy_gbps / weight_gb;

  // Prefill: one prompt in one step, logits for its last token (as the engine's last chunk).
  {
    BenchCache cache(layout, 1, options.prefill_tokens);
    std::vector<float> logits(static_cast<size_t>(vocab));
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const StepBatch step = make_step(cache, layout, 0, 1, 0, options.prefill_tokens, vocab);
      const auto start = std::chrono::steady_clock::now();
      model->forward(step, cache.storage, logits.data());
      if (rep > 0) best = std::min(best, seconds_since(start));
    }
    out["prefill_tokens"] = options.prefill_tokens;
    out["prefill_tokens_per_s"] = double(options.prefill_tokens) / best;
  }

  // Decode: each batch size prefills its prompts, then times decode steps of one token each.
  const int64_t context = options.decode_prompt + options.decode_steps + 4 + (options.profile ? 8 : 0);
  BenchCache cache(layout, max_batch, context);
  out["memory_used_gib"] = double(free_before - cuda::device_free_memory()) / double(1 << 30);
  nlohmann::json decode = nlohmann::json::array();
  for (int32_t batch_size : batches) {
    std::vector<int32_t> next(static_cast<size_t>(batch_size));
    for (int64_t s = 0; s < batch_size; ++s) {
      const StepBatch prompt = make_step(cache, layout, s, 1, 0, options.decode_prompt, vocab);
      model->forward_argmax(prompt, cache.storage, next.data());
    }
    const int64_t warmup = 2;
    std::chrono::steady_clock::time_point start;
    for (int64_t step = 0; step < options.decode_steps + warmup; ++step) {
      if (step == warmup) {
        start = std::chrono::steady_clock::now();
        model->graph_replay_ms();  // the warm-up's replays are not timed
      }
      const StepBatch batch = make_step(cache, layout, 0, batch_size, options.decode_prompt + step, 1, vocab);
      model->forward_argmax(batch, cache.storage, next.data());
    }
    const double seconds = seconds_since(start);
    const double tokens_per_s = double(batch_size) * double(options.decode_steps) / seconds;
    nlohmann::json row = {{"batch", batch_size},
                          {"tokens_per_s", tokens_per_s},
                          {"step_ms", seconds / double(options.decode_steps) * 1e3}};
    // The device's share of step_ms (0 with --enforce-eager): the rest is the host's between replays.
    if (const double replay_ms = model->graph_replay_ms(); replay_ms > 0) row["graph_replay_ms"] = replay_ms;
    if (options.profile) {
      // Further steps kernel by kernel with device events between operations: where a step's
      // time goes (event gaps included, so the sum exceeds a graph replay's step).
      const int64_t profiled = 8, first = options.decode_prompt + options.decode_steps + warmup;
      model->set_step_profiling(true);
      for (int64_t step = 0; step < profiled; ++step) {
        const StepBatch batch = make_step(cache, layout, 0, batch_size, first + step, 1, vocab);
        model->forward_argmax(batch, cache.storage, next.data());
      }
      nlohmann::json profile = nlohmann::json::object();
      double total = 0.0;
      for (const auto& [name, ms] : model->step_profile()) {
        profile[name] = ms * 1e3 / double(profiled);
        total += ms * 1e3 / double(profiled);
      }
      profile["total"] = total;
      row["profile_us_per_step"] = profile;
      model->set_step_profiling(false);
    }
    if (batch_size == 1) {
      row["fraction_of_ceiling"] = tokens_per_s * weight_gb / copy_gbps;
      out["decode_batch1_fraction_of_ceiling"] = tokens_per_s * weight_gb / copy_gbps;
    }
    decode.push_back(row);
  }
  out["decode"] = decode;
  out["decode_prompt_tokens"] = options.decode_prompt;
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

void register_bench_gpu(CLI::App& app) {
  auto options = std::make_shared<BenchGpuOptions>();
  CLI::App* verb = app.add_subcommand(
      "bench-gpu", "Measure the GPU's copy bandwidth, then a model's prefill and decode speed on it, in one run");
  options->model.add_to(*verb);
  verb->add_option("--prefill-tokens", options->prefill_tokens, "Prompt length for the prefill figure");
  verb->add_option("--decode-prompt", options->decode_prompt, "Prompt tokens per sequence before decoding");
  verb->add_option("--decode-steps", options->decode_steps, "Timed decode steps per batch size");
  verb->add_option("--batches", options->batches, "Decode batch sizes, comma-separated");
  verb->add_option("--copy-mib", options->copy_mib, "Buffer size for the bandwidth measurement");
  verb->add_flag("--profile", options->profile, "Also time each operation of a decode step (device events)");
  verb->callback([options] { run_bench_gpu(*options); });
}

}  // namespace anvil::cli
