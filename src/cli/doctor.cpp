// anvil doctor: what this host is and what will break before serving. The checks live in
// src/tools/doctor.*; this verb only parses flags, prints, and sets the exit code
// (0 ok, 1 warnings, 2 errors).
#include <cstdio>

#include "cli/verbs.h"
#include "tools/doctor.h"

namespace anvil::cli {

void register_doctor(CLI::App& app) {
  struct Options {
    bool json = false;
    std::string model;
    int port = 8000;
    std::string proc_root, sys_root, windows_users;
  };
  auto options = std::make_shared<Options>();
  CLI::App* verb = app.add_subcommand(
      "doctor", "Check this host before serving: GPUs and their kernels, driver, RAM vs a checkpoint, WSL2 limits, "
                "ports held, running servers and containers, environment variables that break other engines");
  verb->add_flag("--json", options->json, "Print exactly one JSON object on stdout");
  verb->add_option("--model", options->model, "A checkpoint directory to compare with RAM and GPU memory");
  verb->add_option("--port", options->port, "The port `anvil serve` will take (default 8000)")
      ->check(CLI::Range(1, 65535));
  // For tests: read a fake /proc, /sys and Windows user folder instead of the live ones.
  verb->add_option("--proc-root", options->proc_root)->group("");
  verb->add_option("--sys-root", options->sys_root)->group("");
  verb->add_option("--windows-users-dir", options->windows_users)->group("");
  verb->callback([options] {
    tools::DoctorInput input = tools::gather_doctor_input();
    if (!options->proc_root.empty()) input.paths.proc = options->proc_root;
    if (!options->sys_root.empty()) input.paths.sys = options->sys_root;
    if (!options->windows_users.empty()) input.paths.windows_users = options->windows_users;
    tools::DoctorOptions doctor;
    if (!options->model.empty()) doctor.model_dir = options->model;
    doctor.port = options->port;
    const tools::DoctorReport report = tools::run_doctor(input, doctor);
    if (options->json)
      std::printf("%s\n", report.json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else
      std::fputs(tools::format_doctor_text(report).c_str(), stdout);
    std::fflush(stdout);
    if (report.exit_code() != 0) throw CLI::RuntimeError(report.exit_code());
  });
}

}  // namespace anvil::cli
