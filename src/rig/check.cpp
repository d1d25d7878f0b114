#include "rig/check.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <set>

#include "rig/recipes.h"
#include "rig/sizing.h"

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

}  // namespace

CheckReport check_config(const RigConfig& config, const std::vector<cuda::DeviceInfo>& gpus) {
  CheckReport report;
  std::string& out = report.text;
  out += fmt::format("{}: valid; the rig listens on {}:{}; state {}; logs {}\n\n", config.file.string(), config.host,
                     config.port, config.state_dir.string(), config.log_dir.string());
  std::map<std::string, std::vector<size_t>> groups;
  std::vector<MemoryFigure> figures;
  for (const auto& model : config.models) {
    groups[model.group].push_back(figures.size());
    figures.push_back(memory_figure(config, model, gpus));
    const MemoryFigure& figure = figures.back();
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
    std::string placed;
    for (int index : figure.gpus) placed += (placed.empty() ? " on GPU " : ", ") + std::to_string(index);
    out += figure.gb ? fmt::format("  memory: {:.1f} GB{} ({})\n", *figure.gb, placed, figure.source)
                     : fmt::format("  memory: not counted ({})\n", figure.source);
    if (model.engine == EngineKind::Anvil && !std::filesystem::is_directory(model.model))
      report.problems.push_back(fmt::format("{}:{}: models.{}.model: {} is not a directory", config.file.string(),
                                            model.line, model.name, model.model));
    report.problems.insert(report.problems.end(), figure.problems.begin(), figure.problems.end());
  }

  out += "\nMemory per group (members swap, so a group needs its largest member):\n";
  std::map<int, double> per_gpu;
  std::set<std::string> unknown;
  for (const auto& [group, members] : groups) {
    double need = 0;
    const ModelConfig* largest = nullptr;
    std::map<int, double> group_gpu;  // one member runs at a time: the group's peak per GPU
    std::string names;
    for (size_t i : members) {
      const ModelConfig& model = config.models[i];
      const MemoryFigure& figure = figures[i];
      names += (names.empty() ? "" : ", ") + model.name;
      if (!figure.gb) {
        unknown.insert(model.name);
        continue;
      }
      if (*figure.gb >= need) {
        need = *figure.gb;
        largest = &model;
      }
      for (int index : figure.gpus)
        group_gpu[index] = std::max(group_gpu[index], *figure.gb / double(figure.gpus.size()));
    }
    out += fmt::format("  {:<16} {:>7.1f} GB  ({}){}\n", group, need, names,
                       largest ? fmt::format("; largest {}", largest->name) : std::string(", no memory figure"));
    for (const auto& [index, share] : group_gpu) per_gpu[index] += share;
  }
  if (!unknown.empty()) {
    std::string names;
    for (const auto& name : unknown) names += (names.empty() ? "" : ", ") + name;
    out += fmt::format("  no memory figure for {}: not counted (set vram_gb to include them)\n", names);
  }
  if (gpus.empty()) {
    out += fmt::format("GPUs: none visible ({}); placement not checked\n", cuda::unavailable_reason());
    return report;
  }
  for (const auto& gpu : gpus) {
    const double total = double(gpu.total_memory) / 1e9;
    const double need = per_gpu.count(gpu.index) ? per_gpu[gpu.index] : 0;
    const std::string capability = gpu.major > 0 ? fmt::format(" (compute capability {}.{})", gpu.major, gpu.minor) : "";
    out += fmt::format("GPU {} {}{}: {:.1f} of {:.1f} GB planned\n", gpu.index, gpu.name, capability, need, total);
    if (need > total)
      report.problems.push_back(fmt::format("GPU {}: the groups placed on it need {:.1f} GB, it has {:.1f} GB", gpu.index,
                                            need, total));
  }
  return report;
}

}  // namespace anvil::rig
