#pragma once
// What the host is, read from /proc and /sys (and a few commands), for `anvil doctor`. Every
// reader takes the roots it reads under, so tests hand it a fake tree; nothing here needs
// privileges, and a file that is missing or unreadable reads as "unknown", never as an error.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace anvil::tools {

using Environment = std::map<std::string, std::string>;

// Where the probes read. Defaults are the live system.
struct HostPaths {
  std::filesystem::path proc = "/proc";
  std::filesystem::path sys = "/sys";
  // WSL2 mounts the Windows drive here; each user's folder may hold a .wslconfig.
  std::filesystem::path windows_users = "/mnt/c/Users";
};

// The process's own environment as a map.
Environment current_environment();

struct MemoryInfo {
  uint64_t total = 0;      // MemTotal
  uint64_t available = 0;  // MemAvailable
  uint64_t swap_total = 0;
  std::optional<uint64_t> cgroup_limit;  // memory.max of this cgroup, when it is a number
  // RAM this process can use: the smaller of MemTotal and the cgroup limit.
  uint64_t usable() const { return cgroup_limit && *cgroup_limit < total ? *cgroup_limit : total; }
};
std::optional<MemoryInfo> read_memory(const HostPaths& paths);

struct KernelInfo {
  std::string release;  // /proc/sys/kernel/osrelease
  std::string version;  // /proc/version
};
KernelInfo read_kernel(const HostPaths& paths);

// WSL: the kernel release says "microsoft" ("-microsoft-standard-WSL2" on WSL2, "-Microsoft" on
// WSL1). Under WSL2 the Linux side sees only the memory the VM is capped at (MemTotal).
struct WslInfo {
  bool detected = false;
  int version = 0;  // 1 or 2 when detected
  // .wslconfig files found under HostPaths::windows_users, with their [wsl2] memory= when set.
  struct ConfigFile {
    std::filesystem::path path;
    std::optional<uint64_t> memory_bytes;
    std::string memory_text;  // as written, e.g. "48GB"
  };
  std::vector<ConfigFile> configs;
};
WslInfo detect_wsl(const HostPaths& paths, const KernelInfo& kernel);
// "48GB", "512MB", "64G", "1TB" -> bytes (binary units, as WSL reads them); nullopt otherwise.
std::optional<uint64_t> parse_wsl_memory(const std::string& text);

// One listening TCP socket from /proc/net/tcp or /proc/net/tcp6.
struct ListeningSocket {
  std::string address;  // "127.0.0.1", "0.0.0.0", "::", "::1", ...
  int port = 0;
  uint64_t inode = 0;
  bool ipv6 = false;
};
std::vector<ListeningSocket> listening_sockets(const HostPaths& paths);

struct ProcessInfo {
  int pid = 0;
  int ppid = 0;
  std::string comm;               // /proc/PID/comm
  std::vector<std::string> argv;  // /proc/PID/cmdline
  std::string container;          // a docker/containerd id (12 chars) from /proc/PID/cgroup, or ""
  std::string command_line() const;  // argv joined with spaces (comm when argv is empty)
};
std::vector<ProcessInfo> list_processes(const HostPaths& paths);
// Socket inode -> pid, from /proc/*/fd links "socket:[INODE]". Processes of other users are
// missing unless this runs as root.
std::map<uint64_t, int> socket_owners(const HostPaths& paths);

// The NVIDIA kernel driver's version: /sys/module/nvidia/version, else /proc/driver/nvidia/version.
std::optional<std::string> nvidia_kernel_driver_version(const HostPaths& paths);

// An inference server found among the processes.
struct ServerProcess {
  std::string engine;  // "anvil", "vLLM", "llama.cpp", "SGLang", "Ollama", "TGI"
  ProcessInfo process;
};
// Which engine a process is, or "" when it is none we know.
std::string server_engine(const ProcessInfo& process);
// Servers among `processes`, skipping `self_pid` and children of a server already listed (one
// entry per server, not per worker).
std::vector<ServerProcess> find_servers(const std::vector<ProcessInfo>& processes, int self_pid);

// Runs a command: argv[0] is an absolute path; env is the child's whole environment.
struct CommandResult {
  int exit_code = -1;  // -1: could not start, or killed at the timeout
  bool timed_out = false;
  std::string out, err;
};
using CommandRunner =
    std::function<CommandResult(const std::vector<std::string>& argv, const Environment& env, double timeout_s)>;
CommandResult run_command(const std::vector<std::string>& argv, const Environment& env, double timeout_s);

// `name` searched along env's PATH; nullopt when it is not there or not executable.
std::optional<std::filesystem::path> find_on_path(const std::string& name, const Environment& env);

// Running docker containers, and whether each has GPUs attached (--gpus / the nvidia runtime).
struct Container {
  std::string id, name, image, status;
  bool gpus = false;
};
struct DockerInfo {
  bool present = false;  // a docker CLI on PATH
  bool reachable = false;
  std::string problem;   // why the containers could not be listed
  std::vector<Container> containers;
};
DockerInfo probe_docker(const Environment& env, const CommandRunner& runner);

}  // namespace anvil::tools
