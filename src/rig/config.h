#pragma once
// `anvil rig`'s configuration: which backends exist, how each is started, how its readiness is
// judged, which ones share a GPU. Parsed from YAML; every mistake is one line naming the file,
// the line and the field.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace anvil::rig {

enum class EngineKind { Anvil, Command };

// What kind of server a command runs. Only the default readiness probe depends on it: anvil,
// llama.cpp and vLLM answer GET /health with 200 once they serve (vLLM does not even open its
// port before), SGLang answers /health before its warmup and /health_generate only after it.
enum class ServerKind { Anvil, Vllm, Sglang, LlamaCpp, Other };

struct ModelConfig {
  std::string name;
  int line = 0;  // where the model's entry starts, for errors found after parsing
  std::vector<std::string> aliases;
  EngineKind engine = EngineKind::Anvil;
  ServerKind server = ServerKind::Anvil;
  std::string model;               // anvil: the model dir; command: substituted for ${MODEL}
  std::vector<std::string> args;   // anvil: extra `anvil serve` flags; command: appended to command
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  std::string cwd;
  std::optional<int> port;         // unset: a free port is picked at each start and given as ${PORT}
  std::string cuda_visible_devices;  // from `gpus`; empty leaves the variable alone
  std::string health_path = "/health";
  double start_timeout_s = 600;
  double ttl_s = 0;                // 0: never unloaded for idleness
  std::string group;               // members of one group swap; defaults to the model's own name
  std::optional<double> vram_gb;
  std::string recipe;
  std::string upstream_model;      // when set, the request's `model` is rewritten to it
  bool preload = false;
};

struct RigConfig {
  std::filesystem::path file;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int max_waiting = 64;             // requests queued per backend while it starts or swaps
  double drain_timeout_s = 30;      // a swap waits this long for in-flight requests
  double stop_timeout_s = 10;       // SIGTERM, then SIGKILL after this long
  std::filesystem::path state_dir;  // pid files and the running rig's address
  std::filesystem::path log_dir;    // one log per backend
  std::filesystem::path anvil_binary;  // runs `engine: anvil` models; defaults to this executable
  std::vector<ModelConfig> models;  // in file order

  const ModelConfig* find(const std::string& name_or_alias) const;
};

// Reads and validates; anvil::Error "FILE:LINE: FIELD: problem" on any mistake.
RigConfig load_config(const std::filesystem::path& file);
RigConfig parse_config(const std::string& text, const std::filesystem::path& file);

// $XDG_STATE_HOME/anvil/rig, else ~/.local/state/anvil/rig.
std::filesystem::path default_state_dir();

const char* server_kind_name(ServerKind kind);

}  // namespace anvil::rig
