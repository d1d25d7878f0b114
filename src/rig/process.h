#pragma once
// Processes and ports as Linux shows them: starting a backend in its own session, signalling its
// whole group, and finding which process holds a port or carries a rig token, read from /proc.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace anvil::rig {

struct SpawnSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the complete environment, NAME=value
  std::string cwd;               // empty: the rig's own
  std::filesystem::path log;     // stdout and stderr are appended here
};

// fork + setsid + exec, so the backend leads its own process group and session. The child gets
// SIGTERM when the forking thread dies (call this from a thread that lives as long as the rig).
// anvil::Error when the log cannot be opened; an exec failure shows as exit status 127 and a
// line in the log.
pid_t spawn(const SpawnSpec& spec);

// The start time in clock ticks since boot (/proc/PID/stat field 22); nullopt when gone.
// Together with the pid it names one process for good: a recycled pid has a later start time.
std::optional<uint64_t> process_start_time(pid_t pid);
std::string process_cmdline(pid_t pid);  // arguments joined by spaces; empty when unreadable
// Processes whose environment holds NAME=VALUE (only processes of our own user are readable).
std::vector<pid_t> processes_with_env(const std::string& name, const std::string& value);

// Who listens on a TCP port, from /proc/net/tcp{,6} and /proc/*/fd; pid 0 when the socket's
// owner is not visible to us (another user's process).
struct PortHolder {
  pid_t pid = 0;
  std::string cmdline;
};
std::optional<PortHolder> port_holder(int port);
bool port_free(const std::string& host, int port);
int pick_free_port(const std::string& host);  // the kernel's choice; 0 when none

std::string describe_exit(int wait_status);
std::string random_token();

}  // namespace anvil::rig
