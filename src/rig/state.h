#pragma once
// The rig's state dir: a record of the running rig (rig.json: its pid, address, log dir) and one
// pid file per started backend (backends/NAME.json). They let `anvil rig ps` and `logs` find a
// running rig, and let the next rig clear exactly the processes an earlier one started.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "rig/config.h"

namespace anvil::rig {

// Every backend process carries ANVIL_RIG_TOKEN=<token> in its environment, inherited by what it
// forks; the token is how leftovers are recognised as ours and nothing else is touched.
inline constexpr const char* kTokenVariable = "ANVIL_RIG_TOKEN";

struct PidRecord {
  std::string name;
  pid_t pid = 0;
  uint64_t start_time = 0;  // /proc/PID/stat field 22 when started
  std::string token;
  int port = 0;
};

void write_pid_record(const std::filesystem::path& state_dir, const PidRecord& record);
void remove_pid_record(const std::filesystem::path& state_dir, const std::string& name);

// Finds the processes earlier rigs started (leader by pid and start time, the rest by token),
// sends them SIGTERM, SIGKILL after `grace_s`, removes the pid files. One line per action.
std::vector<std::string> clear_leftovers(const std::filesystem::path& state_dir, double grace_s);

struct RigRecord {
  pid_t pid = 0;
  uint64_t start_time = 0;
  std::string host;
  int port = 0;
  std::string log_dir;
  std::string config;
};
// Refuses (anvil::Error) when another live rig owns the state dir, then records this one.
void claim_state_dir(const std::filesystem::path& state_dir, const RigRecord& record);
void release_state_dir(const std::filesystem::path& state_dir);
// The record in the state dir and whether its rig still runs (same pid and start time).
std::optional<RigRecord> read_rig_record(const std::filesystem::path& state_dir, bool* alive);

}  // namespace anvil::rig
