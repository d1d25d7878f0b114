// anvil doctor: what this host is and which kernels anvil would run on it. For now the build,
// the CPU kernels and the GPUs with the exact-architecture kernel table; the doctor issue grows
// it into a full host check.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/vector_ops.h"
#include "backend/cuda/runtime.h"
#include "cli/verbs.h"
#include "core/thread_pool.h"

namespace anvil::cli {

namespace {

nlohmann::json doctor_report() {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& device : cuda::devices()) {
    nlohmann::json gpu = {{"index", device.index},
                          {"name", device.name},
                          {"compute_capability", std::to_string(device.major) + "." + std::to_string(device.minor)},
                          {"memory_gib", double(device.total_memory) / double(1 << 30)},
                          {"free_gib", double(device.free_memory) / double(1 << 30)},
                          {"multiprocessors", device.multiprocessors},
                          {"shared_memory_per_block_kib", device.shared_memory_per_block_optin / 1024}};
    try {
      const auto& row = cuda::kernels_for(device.major, device.minor);
      gpu["kernels"] = row.target;
    } catch (const std::exception& error) {
      gpu["kernels"] = nullptr;
      gpu["problem"] = error.what();
    }
    gpus.push_back(gpu);
  }
  nlohmann::json table = nlohmann::json::array();
  for (const auto& row : cuda::kernel_table()) {
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& op : row.ops) ops[op.op] = op.family;
    table.push_back({{"compute_capability", std::to_string(row.major) + "." + std::to_string(row.minor)},
                     {"gpus", row.gpus},
                     {"target", row.target},
                     {"ops", ops}});
  }
  return {{"cpu", {{"threads", default_thread_pool().size()}, {"kernels", cpu_kernel_isa()}}},
          {"cuda",
           {{"compiled_in", cuda::compiled_in()},
            {"targets", cuda::compiled_targets()},
            {"status", cuda::devices().empty() ? cuda::unavailable_reason() : "ok"}}},
          {"gpus", gpus},
          {"kernel_table", table}};
}

void print_text(const nlohmann::json& report) {
  std::printf("CPU: %d threads, kernels %s\n", report["cpu"]["threads"].get<int>(),
              report["cpu"]["kernels"].get<std::string>().c_str());
  const auto& cuda_info = report["cuda"];
  std::string targets;
  for (const auto& target : cuda_info["targets"]) targets += (targets.empty() ? "" : " ") + target.get<std::string>();
  std::printf("CUDA: %s%s%s\n", cuda_info["compiled_in"].get<bool>() ? "built for " : "not built in",
              targets.c_str(), cuda_info["status"] == "ok" ? "" : (" (" + cuda_info["status"].get<std::string>() + ")").c_str());
  for (const auto& gpu : report["gpus"]) {
    std::printf("GPU %d: %s, compute capability %s, %.1f GiB (%.1f free), %d SMs -> %s\n", gpu["index"].get<int>(),
                gpu["name"].get<std::string>().c_str(), gpu["compute_capability"].get<std::string>().c_str(),
                gpu["memory_gib"].get<double>(), gpu["free_gib"].get<double>(), gpu["multiprocessors"].get<int>(),
                gpu["kernels"].is_null() ? gpu["problem"].get<std::string>().c_str()
                                         : gpu["kernels"].get<std::string>().c_str());
  }
  std::printf("\nKernel table (exact compute capability -> kernels; anything else is refused):\n");
  for (const auto& row : report["kernel_table"]) {
    std::printf("  %-5s %-8s %s\n", row["compute_capability"].get<std::string>().c_str(),
                row["target"].get<std::string>().c_str(), row["gpus"].get<std::string>().c_str());
    for (const auto& [op, family] : row["ops"].items())
      std::printf("        %-16s %s\n", op.c_str(), family.get<std::string>().c_str());
  }
}

}  // namespace

void register_doctor(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* verb = app.add_subcommand("doctor", "Describe this host: CPU kernels, GPUs, and the kernel table");
  verb->add_flag("--json", *json, "Print the report as JSON");
  verb->callback([json] {
    const auto report = doctor_report();
    if (*json)
      std::printf("%s\n", report.dump(2).c_str());
    else
      print_text(report);
  });
}

}  // namespace anvil::cli
