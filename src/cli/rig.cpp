// anvil rig: one endpoint over many backends (anvil's own engine, or any server started as a
// command), with aliases, swapping within GPU groups and supervision. See src/rig/.
#include <httplib.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/runtime.h"
#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "rig/check.h"
#include "rig/gateway.h"
#include "rig/process.h"
#include "rig/state.h"
#include "rig/supervisor.h"
#include "server/log.h"

namespace anvil::cli {

namespace {

namespace fs = std::filesystem;

struct RigOptions {
  std::string config;
  int port = -1;
  std::string state_dir;
  std::string name;
  int lines = 200;
  bool json = false;
  double gpu_memory_gb = 0;  // rig check: plan against one GPU of this size instead of those visible
};

void run_rig(const RigOptions& options) {
  const rig::RigConfig config = rig::load_config(options.config);
  const int port = options.port >= 0 ? options.port : config.port;
  if (port > 65535) fail("--port must be in [0, 65535], got {}", port);
  bool alive = false;
  if (const auto other = rig::read_rig_record(config.state_dir, &alive); other && alive)
    fail("{}: another rig (pid {}, listening on {}:{}) uses this state dir; stop it or set state_dir",
         config.state_dir.string(), other->pid, other->host, other->port);

  // Signals reach one watcher thread; every thread started below inherits the blocked mask
  // (backends get a clean one at exec).
  block_stop_signals();
  rig::Supervisor supervisor(config);
  rig::Gateway gateway(config, supervisor);
  gateway.bind(port);
  rig::claim_state_dir(config.state_dir, {getpid(), rig::process_start_time(getpid()).value_or(0), config.host,
                                          gateway.port(), config.log_dir.string(), fs::absolute(config.file).string()});
  for (const auto& line : supervisor.start()) server::log_info("earlier rig: {}", line);
  {
    const StopSignalWatcher watcher([&gateway](int signal) {
      server::log_info("received signal {}, stopping the backends", signal);
      gateway.stop();
    });
    server::log_info("anvil rig serving {} model(s) on http://{}:{}", config.models.size(), config.host, gateway.port());
    gateway.run();
  }
  supervisor.shutdown();
  rig::release_state_dir(config.state_dir);
}

fs::path state_dir_for(const RigOptions& options) {
  if (!options.state_dir.empty()) return options.state_dir;
  if (!options.config.empty()) return rig::load_config(options.config).state_dir;
  return rig::default_state_dir();
}

void run_check(const RigOptions& options) {
  const rig::RigConfig config = rig::load_config(options.config);
  std::vector<cuda::DeviceInfo> gpus;
  if (options.gpu_memory_gb > 0) {
    cuda::DeviceInfo gpu;
    gpu.name = fmt::format("stand-in (--gpu-memory {})", options.gpu_memory_gb);
    gpu.total_memory = size_t(options.gpu_memory_gb * 1e9);
    gpus.push_back(gpu);
  } else {
    gpus = cuda::devices();
  }
  const auto report = rig::check_config(config, gpus);
  std::fputs(report.text.c_str(), stdout);
  for (const auto& problem : report.problems) std::fprintf(stderr, "anvil: error: %s\n", problem.c_str());
  if (!report.problems.empty()) throw CLI::RuntimeError(1);
}

void run_ps(const RigOptions& options) {
  const fs::path state_dir = state_dir_for(options);
  bool alive = false;
  const auto record = rig::read_rig_record(state_dir, &alive);
  if (!record || !alive) {
    std::printf("no rig is running with state dir %s\n", state_dir.string().c_str());
    return;
  }
  httplib::Client client(record->host, record->port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(10, 0);
  const auto result = client.Get("/running");
  if (!result || result->status != 200)
    fail("the rig (pid {}) at {}:{} did not answer /running: {}", record->pid, record->host, record->port,
         result ? "HTTP " + std::to_string(result->status) : httplib::to_string(result.error()));
  const auto running = nlohmann::json::parse(result->body);
  if (options.json) {
    std::printf("%s\n", running.dump(2).c_str());
    return;
  }
  std::printf("rig pid %d on http://%s:%d, config %s\n", record->pid, record->host.c_str(), record->port,
              record->config.c_str());
  std::printf("%-20s %-10s %-9s %6s %8s %9s %6s %7s %5s  %s\n", "MODEL", "GROUP", "STATE", "PORT", "PID", "UPTIME",
              "STARTS", "CRASHES", "SWAPS", "LAST ERROR");
  for (const auto& backend : running["backends"]) {
    auto number = [](const nlohmann::json& value) { return value.is_null() ? std::string("-") : value.dump(); };
    std::printf("%-20s %-10s %-9s %6s %8s %8.0fs %6s %7s %5s  %s\n", backend["model"].get<std::string>().c_str(),
                backend["group"].get<std::string>().c_str(), backend["state"].get<std::string>().c_str(),
                number(backend["port"]).c_str(), number(backend["pid"]).c_str(), backend["uptime_s"].get<double>(),
                backend["starts"].dump().c_str(), backend["crashes"].dump().c_str(), backend["swaps"].dump().c_str(),
                backend["last_error"].is_null() ? "" : backend["last_error"].get<std::string>().c_str());
  }
}

void run_logs(const RigOptions& options) {
  const fs::path state_dir = state_dir_for(options);
  fs::path log_dir;
  if (const auto record = rig::read_rig_record(state_dir, nullptr); record && !record->log_dir.empty())
    log_dir = record->log_dir;
  else if (!options.config.empty())
    log_dir = rig::load_config(options.config).log_dir;
  else
    log_dir = state_dir / "logs";
  const fs::path log = log_dir / (options.name + ".log");
  std::ifstream in(log, std::ios::binary);
  if (!in) {
    std::string known;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(log_dir, error))
      if (entry.path().extension() == ".log") known += (known.empty() ? "" : ", ") + entry.path().stem().string();
    fail("{}: no log for model {} (logs here: {})", log.string(), options.name, known.empty() ? "none" : known);
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  const size_t from = options.lines > 0 && lines.size() > size_t(options.lines) ? lines.size() - size_t(options.lines) : 0;
  for (size_t i = from; i < lines.size(); ++i) std::printf("%s\n", lines[i].c_str());
}

}  // namespace

void register_rig(CLI::App& app) {
  auto options = std::make_shared<RigOptions>();
  CLI::App* verb = app.add_subcommand("rig", "One OpenAI endpoint over many models and engines: aliases, swaps, supervision");
  verb->add_option("config", options->config, "The rig's YAML config");
  verb->add_option("--port", options->port, "Port to listen on, overriding listen's (0: any free port)");

  CLI::App* check = verb->add_subcommand("check", "Validate a config, plan memory per group, print what would run");
  check->add_option("config", options->config, "The rig's YAML config")->required();
  check->add_option("--gpu-memory", options->gpu_memory_gb,
                    "Plan against one GPU of this many GB (10^9 bytes, as vram_gb) instead of the GPUs visible here")
      ->check(CLI::PositiveNumber);
  check->callback([options] { run_check(*options); });

  CLI::App* ps = verb->add_subcommand("ps", "Show the running rig's backends");
  ps->add_option("--state-dir", options->state_dir, "The rig's state dir (default: the config's, else ~/.local/state/anvil/rig)");
  ps->add_option("--config", options->config, "Read the state dir from this config");
  ps->add_flag("--json", options->json, "Print /running's JSON");
  ps->callback([options] { run_ps(*options); });

  CLI::App* logs = verb->add_subcommand("logs", "Print a backend's log");
  logs->add_option("name", options->name, "Model name")->required();
  logs->add_option("--state-dir", options->state_dir, "The rig's state dir");
  logs->add_option("--config", options->config, "Read the log dir from this config");
  logs->add_option("-n,--lines", options->lines, "Last N lines (0: all)");
  logs->callback([options] { run_logs(*options); });

  verb->require_subcommand(0, 1);
  verb->callback([verb, options] {
    if (!verb->get_subcommands().empty()) return;
    if (options->config.empty()) throw CLI::RequiredError("config (or one of check, ps, logs)");
    run_rig(*options);
  });
}

}  // namespace anvil::cli
