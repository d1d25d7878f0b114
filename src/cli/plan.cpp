// anvil plan MODEL: what fits on a GPU, from config.json and the safetensors headers. The
// arithmetic lives in src/tools/plan.*; this verb parses flags, resolves --gpu-memory, prints.
#include <cmath>
#include <cstdio>

#include "cli/verbs.h"
#include "core/error.h"
#include "tools/gpu_probe.h"
#include "tools/plan.h"

namespace anvil::cli {

void register_plan(CLI::App& app) {
  struct Options {
    std::string model;
    std::string gpu_memory = "detected";
    double utilization = 0.9;
    int64_t max_model_len = 0;
    std::string kv_cache_dtype = "bf16";
    int64_t max_num_batched_tokens = 2048;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* verb = app.add_subcommand(
      "plan", "What fits: weight bytes by component, KV cache bytes per token by layer type, KV tokens, concurrency "
              "and the longest context at a GPU memory budget (reads config.json and safetensors headers only)");
  verb->add_option("MODEL", options->model, "Model directory (config.json; safetensors files optional)")->required();
  verb->add_option("--gpu-memory", options->gpu_memory,
                   "GPU memory in GB as GPUs are quoted (GiB, 2^30 bytes), or 'detected': GPU 0's (the default)");
  verb->add_option("--gpu-memory-utilization", options->utilization,
                   "Share of the GPU's memory the server may use (default 0.9)");
  verb->add_option("--max-model-len", options->max_model_len,
                   "Context length for the concurrency figure (default: the model's max_position_embeddings)");
  verb->add_option("--kv-cache-dtype", options->kv_cache_dtype, "bf16 (default) or fp8");
  verb->add_option("--max-num-batched-tokens", options->max_num_batched_tokens,
                   "Tokens per engine step, which sizes the activation reserve (default 2048, as anvil serve)");
  verb->add_flag("--json", options->json, "Print exactly one JSON object on stdout");
  verb->callback([options, verb] {
    tools::PlanOptions plan_options;
    plan_options.gpu_memory_utilization = options->utilization;
    if (options->max_model_len != 0) plan_options.max_model_len = options->max_model_len;
    plan_options.kv_cache_dtype = tools::parse_kv_cache_dtype(options->kv_cache_dtype);
    plan_options.max_num_batched_tokens = options->max_num_batched_tokens;
    std::string gpu_note;
    if (options->gpu_memory == "detected") {
      const tools::GpuProbe probe = tools::probe_gpus();
      if (!probe.gpus.empty()) {
        const tools::GpuDevice& gpu = probe.gpus.front();
        plan_options.gpu_memory_bytes = gpu.total_memory;
        plan_options.gpu_memory_source = "detected: GPU 0, " + gpu.name;
        if (probe.gpus.size() > 1)
          gpu_note = "the plan is for one GPU (GPU 0 of " + std::to_string(probe.gpus.size()) + ")";
      } else if (verb->count("--gpu-memory") > 0) {
        fail("--gpu-memory detected: no GPU found ({}); pass --gpu-memory GB", probe.status);
      } else {
        gpu_note = "no GPU detected (" + probe.status + "): pass --gpu-memory GB for the KV cache figures";
      }
    } else {
      double gib = 0;
      size_t used = 0;
      try {
        gib = std::stod(options->gpu_memory, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != options->gpu_memory.size() || !(gib > 0) || !std::isfinite(gib))
        fail("--gpu-memory must be a positive number of GB or 'detected', got '{}'", options->gpu_memory);
      plan_options.gpu_memory_bytes = uint64_t(std::llround(gib * double(uint64_t(1) << 30)));
      plan_options.gpu_memory_source = "--gpu-memory " + options->gpu_memory;
    }
    tools::Plan plan = tools::make_plan(options->model, plan_options);
    if (!gpu_note.empty()) plan.notes.push_back(gpu_note);
    if (options->json)
      std::printf("%s\n", tools::plan_to_json(plan).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else
      std::fputs(tools::format_plan_text(plan).c_str(), stdout);
  });
}

}  // namespace anvil::cli
