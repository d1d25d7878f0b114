#include "rig/check.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <set>

#include "rig/recipes.h"

namespace anvil::rig {

namespace {

std::string quoted_command(const ModelConfig& model) {
  std::vector<std::string> argv;
  if (model.engine == EngineKind::Anvil) {
    argv = {"anvil", "serve", model.model, "--host", "127.0.0.1", "--port",
            model.port ? std::to_string(*model.port) : "${PORT}", "--served-model-name", model.name};
    argv.insert(argv.end(), model.aliases.begin(), model.aliases.end());
  } else {
    argv = model.command;
  }
  argv.insert(argv.end(), model.args.begin(), model.args.end());
  std::string out;
  for (auto& arg : argv) {
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"${MODEL}", model.model}, {"${NAME}", model.name},
                                     {"${PORT}", model.port ? std::to_string(*model.port) : "${PORT}"}})
      for (size_t at = arg.find(key); at != std::string::npos; at = arg.find(key, at + value.size())) arg.replace(at, key.size(), value);
    const bool plain = !arg.empty() && arg.find_first_of(" \t'\"\\$;&|<>()") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain || arg.find("${") == 0 ? arg : "'" + arg + "'");
  }
  return out;
}

std::vector<int> gpu_indices(const ModelConfig& model, const std::vector<cuda::DeviceInfo>& gpus) {
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

}  // namespace

CheckReport check_config(const RigConfig& config, const std::vector<cuda::DeviceInfo>& gpus) {
  CheckReport report;
  std::string& out = report.text;
  out += fmt::format("{}: valid; the rig listens on {}:{}; state {}; logs {}\n\n", config.file.string(), config.host,
                     config.port, config.state_dir.string(), config.log_dir.string());
  std::map<std::string, std::vector<const ModelConfig*>> groups;
  for (const auto& model : config.models) {
    groups[model.group].push_back(&model);
    std::string aliases;
    for (const auto& alias : model.aliases) aliases += (aliases.empty() ? "" : ", ") + alias;
    out += fmt::format("{}{}  (group {}, {} {}{})\n", model.name, aliases.empty() ? "" : " [" + aliases + "]",
                       model.group, model.engine == EngineKind::Anvil ? "anvil" : "command",
                       server_kind_name(model.server), model.preload ? ", preloaded" : ", started on first request");
    out += fmt::format("  run:    {}\n", quoted_command(model));
    for (const auto& [name, value] : model.env) out += fmt::format("  env:    {}={}\n", name, value);
    if (!model.cuda_visible_devices.empty()) out += fmt::format("  env:    CUDA_VISIBLE_DEVICES={}\n", model.cuda_visible_devices);
    if (!model.cwd.empty()) out += fmt::format("  cwd:    {}\n", model.cwd);
    out += fmt::format("  ready:  GET {} answers 200 within {:.0f} s{}\n", model.health_path, model.start_timeout_s,
                       model.ttl_s > 0 ? fmt::format("; unloaded after {:.0f} s idle", model.ttl_s) : std::string());
    if (const Recipe* recipe = model.recipe.empty() ? nullptr : find_recipe(model.recipe)) {
      out += fmt::format("  recipe: {}: {}\n          avoids {}\n", recipe->name, recipe->summary, recipe->avoids);
      bool arch_seen = false;
      for (const auto& gpu : gpus) arch_seen |= fmt::format("{}.{}", gpu.major, gpu.minor) == recipe->arch;
      if (!arch_seen)
        out += fmt::format("  warning: the recipe is for compute capability {}, which no visible GPU has\n", recipe->arch);
    }
    if (model.engine == EngineKind::Anvil && !std::filesystem::is_directory(model.model))
      report.problems.push_back(fmt::format("{}:{}: models.{}.model: {} is not a directory", config.file.string(),
                                            model.line, model.name, model.model));
  }

  out += "\nMemory per group (members swap, so a group needs its largest member):\n";
  std::map<int, double> per_gpu;
  std::set<std::string> unknown;
  for (const auto& [group, members] : groups) {
    double need = 0;
    const ModelConfig* largest = nullptr;
    for (const ModelConfig* model : members) {
      if (!model->vram_gb) unknown.insert(model->name);
      else if (*model->vram_gb >= need) {
        need = *model->vram_gb;
        largest = model;
      }
    }
    std::string names;
    for (const ModelConfig* model : members) names += (names.empty() ? "" : ", ") + model->name;
    out += fmt::format("  {:<16} {:>7.1f} GB  ({}){}\n", group, need, names,
                       largest ? fmt::format("; largest {}", largest->name) : std::string(", no vram_gb given"));
    if (largest)
      for (int index : gpu_indices(*largest, gpus)) per_gpu[index] += need / double(std::max<size_t>(1, gpu_indices(*largest, gpus).size()));
  }
  if (!unknown.empty()) {
    std::string names;
    for (const auto& name : unknown) names += (names.empty() ? "" : ", ") + name;
    out += fmt::format("  no vram_gb for {}: not counted (set vram_gb to include them)\n", names);
  }
  if (gpus.empty()) {
    out += fmt::format("GPUs: none visible ({}); placement not checked\n", cuda::unavailable_reason());
    return report;
  }
  for (const auto& gpu : gpus) {
    const double total = double(gpu.total_memory) / 1e9;
    const double need = per_gpu.count(gpu.index) ? per_gpu[gpu.index] : 0;
    out += fmt::format("GPU {} {} (compute capability {}.{}): {:.1f} of {:.1f} GB planned\n", gpu.index, gpu.name, gpu.major,
                       gpu.minor, need, total);
    if (need > total)
      report.problems.push_back(fmt::format("GPU {}: the groups placed on it need {:.1f} GB, it has {:.1f} GB", gpu.index,
                                            need, total));
  }
  return report;
}

}  // namespace anvil::rig
