#include "rig/sizing.h"

#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <filesystem>

#include "engine/engine.h"
#include "tools/plan.h"

namespace anvil::rig {

namespace {

double gb(double bytes) { return bytes / 1e9; }

// The GPU indices a backend sees: its `gpus` (numeric ones; UUIDs cannot be matched to an index
// here), else every GPU.
std::vector<int> visible_indices(const ModelConfig& model, const std::vector<cuda::DeviceInfo>& gpus) {
  std::vector<int> out;
  if (model.cuda_visible_devices.empty()) {
    for (const auto& gpu : gpus) out.push_back(gpu.index);
    return out;
  }
  size_t at = 0;
  while (at <= model.cuda_visible_devices.size()) {
    const size_t comma = model.cuda_visible_devices.find(',', at);
    const std::string item = model.cuda_visible_devices.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) out.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// The value of `--name V` or `--name=V` in an argument list; the last one wins, as in the CLI.
std::optional<std::string> flag_value(const std::vector<std::string>& args, const std::string& name) {
  std::optional<std::string> value;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) value = args[++i];
    else if (args[i].rfind(name + "=", 0) == 0) value = args[i].substr(name.size() + 1);
  }
  return value;
}

// Reads the serve flags that change the plan; a value anvil serve would reject is a problem.
struct ServeFlags {
  tools::PlanOptions plan;
  std::optional<double> kv_cache_gib;
  std::string device = "auto";
  std::string kv_note;  // a KV cache dtype the plan cannot size
};

ServeFlags read_flags(const RigConfig& config, const ModelConfig& model, std::vector<std::string>& problems) {
  ServeFlags flags;
  auto bad = [&](const std::string& flag, const std::string& expected, const std::string& value) {
    problems.push_back(fmt::format("{}:{}: models.{}.args: {} expects {}, got '{}'", config.file.string(), model.line,
                                   model.name, flag, expected, value));
  };
  auto number = [&](const std::string& flag, const std::string& expected) -> std::optional<double> {
    const auto text = flag_value(model.args, flag);
    if (!text) return std::nullopt;
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(*text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text->size() || !std::isfinite(value) || value <= 0) {
      bad(flag, expected, *text);
      return std::nullopt;
    }
    return value;
  };
  if (const auto value = number("--gpu-memory-utilization", "a share in (0, 1]")) {
    if (*value > 1) bad("--gpu-memory-utilization", "a share in (0, 1]", *flag_value(model.args, "--gpu-memory-utilization"));
    else flags.plan.gpu_memory_utilization = *value;
  }
  if (const auto value = number("--max-model-len", "a positive number of tokens")) flags.plan.max_model_len = int64_t(*value);
  if (const auto value = number("--max-num-batched-tokens", "a positive number of tokens"))
    flags.plan.max_num_batched_tokens = int64_t(*value);
  flags.kv_cache_gib = number("--kv-cache-memory", "a positive number of GiB");
  if (const auto device = flag_value(model.args, "--device")) flags.device = *device;
  // --kv-cache-dtype auto follows --dtype; float32 is a dtype anvil serves but plan does not size.
  std::string kv = flag_value(model.args, "--kv-cache-dtype").value_or("auto");
  if (kv == "auto" && flag_value(model.args, "--dtype").value_or("auto") == "float32") kv = "float32";
  if (kv == "float32") {
    flags.kv_note = "; KV cache float32, planned as bf16 (half its size)";
  } else {
    try {
      flags.plan.kv_cache_dtype = tools::parse_kv_cache_dtype(kv);
    } catch (const std::exception&) {
      bad("--kv-cache-dtype", "auto, bfloat16, float32 or fp8", kv);
    }
  }
  return flags;
}

}  // namespace

MemoryFigure memory_figure(const RigConfig& config, const ModelConfig& model, const std::vector<cuda::DeviceInfo>& gpus) {
  MemoryFigure figure;
  const std::vector<int> visible = visible_indices(model, gpus);
  if (model.engine != EngineKind::Anvil) {
    figure.gpus = visible;
    if (model.vram_gb) figure.gb = *model.vram_gb;
    figure.source = model.vram_gb ? "vram_gb" : "no vram_gb";
    return figure;
  }

  ServeFlags flags = read_flags(config, model, figure.problems);
  if (flags.device == "cpu") {
    figure.gb = 0;
    figure.source = "--device cpu: no GPU memory";
    return figure;
  }
  size_t ordinal = 0;  // cuda:N counts among the GPUs the backend sees
  if (flags.device.rfind("cuda:", 0) == 0) ordinal = size_t(std::strtoul(flags.device.c_str() + 5, nullptr, 10));
  const cuda::DeviceInfo* gpu = nullptr;
  if (ordinal < visible.size()) {
    figure.gpus = {visible[ordinal]};
    for (const auto& candidate : gpus)
      if (candidate.index == visible[ordinal]) gpu = &candidate;
  } else if (!gpus.empty()) {
    figure.problems.push_back(fmt::format("{}:{}: models.{}: anvil serve would run on GPU {} of the {} it sees, which "
                                          "does not exist",
                                          config.file.string(), model.line, model.name, ordinal, visible.size()));
  }
  if (model.vram_gb) {
    figure.gb = *model.vram_gb;
    figure.source = "vram_gb";
    return figure;
  }
  if (!std::filesystem::is_directory(model.model)) {
    figure.source = "no vram_gb, and no model directory for anvil plan";
    return figure;
  }

  if (gpu) {
    flags.plan.gpu_memory_bytes = gpu->total_memory;
    flags.plan.gpu_memory_source = fmt::format("GPU {}", gpu->index);
  }
  tools::Plan plan;
  try {
    plan = tools::make_plan(model.model, flags.plan);
  } catch (const std::exception& error) {
    figure.problems.push_back(fmt::format("{}:{}: models.{}: anvil plan: {}", config.file.string(), model.line,
                                          model.name, error.what()));
    figure.source = "anvil plan failed";
    return figure;
  }
  const double weights = double(plan.weights.total());
  const double reserve = double(gpu_activation_reserve_bytes(flags.plan.max_num_batched_tokens));
  const std::string where = fmt::format("{}:{}: models.{}: anvil plan", config.file.string(), model.line, model.name);

  if (flags.kv_cache_gib) {
    // A fixed KV cache (--kv-cache-memory) replaces the share of the GPU.
    const double kv = *flags.kv_cache_gib * double(uint64_t(1) << 30);
    figure.gb = gb(weights + reserve + kv);
    figure.source = fmt::format("anvil plan: weights {:.2f} + activation reserve {:.2f} + KV cache {:.2f} GB "
                                "(--kv-cache-memory {}){}",
                                gb(weights), gb(reserve), gb(kv), *flag_value(model.args, "--kv-cache-memory"), flags.kv_note);
    const double sequence = double(plan.kv_bytes_for_sequence(plan.max_model_len));
    if (sequence > kv)
      figure.problems.push_back(fmt::format("{}: one sequence of --max-model-len {} needs {:.4f} GB of {} KV cache, "
                                            "--kv-cache-memory gives {:.4f} GB",
                                            where, plan.max_model_len, gb(sequence),
                                            tools::kv_cache_dtype_name(flags.plan.kv_cache_dtype), gb(kv)));
    return figure;
  }
  if (!gpu) {
    figure.source = fmt::format("anvil plan: {:.2f} of the GPU it runs on, and no GPU to size it against",
                                flags.plan.gpu_memory_utilization);
    return figure;
  }
  // anvil serve fills --gpu-memory-utilization of its GPU: weights, activation reserve, then KV.
  figure.gb = gb(double(plan.usable_bytes));
  figure.source = fmt::format("anvil plan: {:.2f} x {:.1f} GB of GPU {}: weights {:.2f}, activation reserve {:.2f}, "
                              "{} KV cache {:.2f} GB ({} tokens){}",
                              flags.plan.gpu_memory_utilization, gb(double(gpu->total_memory)), gpu->index, gb(weights),
                              gb(reserve), tools::kv_cache_dtype_name(flags.plan.kv_cache_dtype),
                              gb(double(std::max<int64_t>(plan.kv_cache_bytes, 0))), tools::format_count(int64_t(plan.kv_tokens)),
                              flags.kv_note);
  const std::string on = fmt::format("{} on GPU {} ({:.1f} GB)", where, gpu->index, gb(double(gpu->total_memory)));
  if (plan.kv_cache_bytes <= 0)
    figure.problems.push_back(fmt::format("{}: the weights ({:.2f} GB) and the activation reserve ({:.2f} GB) do not fit "
                                          "in {:.2f} of it ({:.2f} GB)",
                                          on, gb(weights), gb(reserve), flags.plan.gpu_memory_utilization,
                                          gb(double(plan.usable_bytes))));
  else if (plan.max_concurrency < 1)
    figure.problems.push_back(fmt::format("{}: one sequence of --max-model-len {} needs {:.4f} GB of {} KV cache, "
                                          "{:.4f} GB is left",
                                          on, plan.max_model_len, gb(double(plan.kv_bytes_for_sequence(plan.max_model_len))),
                                          tools::kv_cache_dtype_name(flags.plan.kv_cache_dtype), gb(double(plan.kv_cache_bytes))));
  return figure;
}

}  // namespace anvil::rig
