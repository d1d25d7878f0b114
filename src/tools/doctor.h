#pragma once
// `anvil doctor`: what this host is and what will break before serving. Everything it looks at
// comes in through DoctorInput (the /proc and /sys roots, the environment, the GPUs, the kernel
// table, a command runner), so tests hand it fake hosts; gather_doctor_input() fills it from the
// live system.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/runtime.h"
#include "tools/gpu_probe.h"
#include "tools/host_probe.h"

namespace anvil::tools {

enum class Severity { Info, Warning, Error };
const char* severity_name(Severity severity);

// One thing doctor found: what, and what to do about it.
struct Finding {
  std::string id;  // stable, for scripts: "port_in_use", "wsl_memory", ...
  Severity severity = Severity::Info;
  std::string message;
  std::string fix;  // empty for plain information
};

struct DoctorOptions {
  std::optional<std::filesystem::path> model_dir;  // --model: compare its size with RAM (and GPU memory)
  int port = 8000;                                 // --port: the port `anvil serve` would take
};

struct DoctorInput {
  HostPaths paths;
  Environment env;
  int self_pid = 0;
  GpuProbe gpus;
  // This build: CUDA kernels compiled in, for which targets, the CUDA version built with, and the
  // exact-capability kernel table.
  bool cuda_compiled_in = false;
  std::vector<std::string> cuda_targets;
  int cuda_build_version = 0;
  std::string cublaslt;  // cuda::cublaslt_status(): found (path, version) or why not; "" without CUDA
  std::vector<cuda::ArchKernels> kernel_table;
  std::string cpu_kernels;  // the CPU kernel ISA in use ("avx2", "scalar")
  int cpu_threads = 0;
  CommandRunner run = run_command;
};

// The live host: /proc, /sys, this process's environment, the driver's GPUs, this build's table.
DoctorInput gather_doctor_input();

struct DoctorReport {
  nlohmann::json json;  // the whole report, findings included
  std::vector<Finding> findings;
  int exit_code() const;  // 0 ok (info only), 1 warnings, 2 errors
};

DoctorReport run_doctor(const DoctorInput& input, const DoctorOptions& options);
std::string format_doctor_text(const DoctorReport& report);

}  // namespace anvil::tools
