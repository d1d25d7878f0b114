#include "tools/host_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace anvil::tools {

namespace fs = std::filesystem;

namespace {

// A small text file (proc files report size 0, so read to the end), or nullopt.
std::optional<std::string> read_small(const fs::path& path, size_t limit = 1 << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text;
  char buffer[4096];
  while (text.size() < limit) {
    in.read(buffer, sizeof buffer);
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    text.append(buffer, size_t(n));
  }
  return text;
}

std::string trim(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::vector<std::string> split_whitespace(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> fields;
  for (std::string field; in >> field;) fields.push_back(field);
  return fields;
}

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Directories of /proc whose name is a pid.
std::vector<int> pids(const HostPaths& paths) {
  std::vector<int> result;
  std::error_code ec;
  for (fs::directory_iterator it(paths.proc, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (all_digits(name) && name.size() < 10) result.push_back(std::stoi(name));
  }
  std::sort(result.begin(), result.end());
  return result;
}

std::string ipv4_text(const std::string& hex) {
  const uint32_t value = uint32_t(std::stoul(hex, nullptr, 16));
  // The kernel prints the address as a host-order (little-endian) integer.
  return std::to_string(value & 0xff) + "." + std::to_string((value >> 8) & 0xff) + "." +
         std::to_string((value >> 16) & 0xff) + "." + std::to_string((value >> 24) & 0xff);
}

std::string ipv6_text(const std::string& hex) {
  unsigned char bytes[16];
  for (int word = 0; word < 4; ++word) {
    const uint32_t value = uint32_t(std::stoul(hex.substr(size_t(word) * 8, 8), nullptr, 16));
    for (int b = 0; b < 4; ++b) bytes[word * 4 + b] = static_cast<unsigned char>((value >> (8 * b)) & 0xff);
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (!inet_ntop(AF_INET6, bytes, text, sizeof text)) return hex;
  return text;
}

void parse_tcp_table(const fs::path& path, bool ipv6, std::vector<ListeningSocket>& out) {
  const auto text = read_small(path, 64 << 20);
  if (!text) return;
  std::istringstream in(*text);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    const auto fields = split_whitespace(line);
    if (fields.size() < 10 || fields[3] != "0A") continue;  // 0A = TCP_LISTEN
    const std::string& local = fields[1];
    const size_t colon = local.find(':');
    if (colon == std::string::npos) continue;
    const std::string address = local.substr(0, colon), port = local.substr(colon + 1);
    if (address.size() != (ipv6 ? 32u : 8u) || port.empty() || !all_digits(fields[9])) continue;
    try {
      ListeningSocket socket;
      socket.address = ipv6 ? ipv6_text(address) : ipv4_text(address);
      socket.port = int(std::stoul(port, nullptr, 16));
      socket.inode = std::stoull(fields[9]);
      socket.ipv6 = ipv6;
      out.push_back(socket);
    } catch (const std::exception&) {
      // A malformed line says nothing about the ports; skip it.
    }
  }
}

std::string container_from_cgroup(const std::string& text) {
  for (const char* marker : {"docker-", "/docker/", "libpod-", "/containerd/", "cri-containerd-"}) {
    size_t at = text.find(marker);
    while (at != std::string::npos) {
      const size_t begin = at + std::strlen(marker);
      size_t end = begin;
      while (end < text.size() && std::isxdigit(static_cast<unsigned char>(text[end]))) ++end;
      if (end - begin >= 12) return text.substr(begin, 12);
      at = text.find(marker, at + 1);
    }
  }
  return "";
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const size_t eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

std::optional<MemoryInfo> read_memory(const HostPaths& paths) {
  const auto text = read_small(paths.proc / "meminfo");
  if (!text) return std::nullopt;
  MemoryInfo info;
  bool found_total = false;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    const auto fields = split_whitespace(line);
    if (fields.size() < 2 || !all_digits(fields[1]) || fields[1].size() > 15) continue;
    const uint64_t kib = std::stoull(fields[1]);
    if (fields[0] == "MemTotal:") {
      info.total = kib * 1024;
      found_total = true;
    } else if (fields[0] == "MemAvailable:") {
      info.available = kib * 1024;
    } else if (fields[0] == "SwapTotal:") {
      info.swap_total = kib * 1024;
    }
  }
  if (!found_total) return std::nullopt;
  // cgroup v2 first, then v1; "max" (or v1's huge sentinel) means no limit.
  for (const char* file : {"fs/cgroup/memory.max", "fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (const auto limit = read_small(paths.sys / file)) {
      const std::string value = trim(*limit);
      if (all_digits(value) && value.size() < 20) {
        const uint64_t bytes = std::stoull(value);
        if (bytes < (uint64_t(1) << 60)) info.cgroup_limit = bytes;
      }
      break;
    }
  }
  return info;
}

KernelInfo read_kernel(const HostPaths& paths) {
  KernelInfo kernel;
  kernel.release = trim(read_small(paths.proc / "sys/kernel/osrelease").value_or(""));
  kernel.version = trim(read_small(paths.proc / "version").value_or(""));
  return kernel;
}

std::optional<uint64_t> parse_wsl_memory(const std::string& raw) {
  std::string text = lower(trim(raw));
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') && text.back() == text.front())
    text = trim(text.substr(1, text.size() - 2));
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  if (digits == 0) return std::nullopt;
  double value = 0;
  try {
    value = std::stod(text.substr(0, digits));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = trim(text.substr(digits));
  double scale = 0;
  if (unit == "" || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb") scale = 1024.0;
  else if (unit == "m" || unit == "mb") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb") scale = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;
  return uint64_t(value * scale);
}

WslInfo detect_wsl(const HostPaths& paths, const KernelInfo& kernel) {
  WslInfo wsl;
  const std::string release = lower(kernel.release), version = lower(kernel.version);
  if (release.find("microsoft") == std::string::npos && version.find("microsoft") == std::string::npos) return wsl;
  wsl.detected = true;
  // WSL2 kernels say "microsoft-standard-WSL2" (older ones "-microsoft-standard"); WSL1 reports
  // a fake 4.4 kernel named "-Microsoft".
  const bool wsl2 = release.find("wsl2") != std::string::npos || release.find("microsoft-standard") != std::string::npos ||
                    version.find("wsl2") != std::string::npos || version.find("microsoft-standard") != std::string::npos;
  wsl.version = wsl2 ? 2 : 1;
  std::error_code ec;
  for (fs::directory_iterator it(paths.windows_users, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path config = it->path() / ".wslconfig";
    const auto text = read_small(config);
    if (!text) continue;
    WslInfo::ConfigFile file;
    file.path = config;
    std::istringstream in(*text);
    std::string section;
    for (std::string line; std::getline(in, line);) {
      std::string t = trim(line);
      if (t.empty() || t[0] == '#' || t[0] == ';') continue;
      if (t.front() == '[') {
        section = lower(trim(t.substr(1, t.find(']') == std::string::npos ? std::string::npos : t.find(']') - 1)));
        continue;
      }
      const size_t eq = t.find('=');
      if (section != "wsl2" || eq == std::string::npos) continue;
      if (lower(trim(t.substr(0, eq))) != "memory") continue;
      std::string value = trim(t.substr(eq + 1));
      if (const size_t comment = value.find_first_of("#;"); comment != std::string::npos) value = trim(value.substr(0, comment));
      file.memory_text = value;
      file.memory_bytes = parse_wsl_memory(value);
    }
    wsl.configs.push_back(file);
  }
  std::sort(wsl.configs.begin(), wsl.configs.end(),
            [](const WslInfo::ConfigFile& a, const WslInfo::ConfigFile& b) { return a.path < b.path; });
  return wsl;
}

std::vector<ListeningSocket> listening_sockets(const HostPaths& paths) {
  std::vector<ListeningSocket> sockets;
  parse_tcp_table(paths.proc / "net/tcp", false, sockets);
  parse_tcp_table(paths.proc / "net/tcp6", true, sockets);
  return sockets;
}

std::string ProcessInfo::command_line() const {
  if (argv.empty()) return comm;
  std::string text;
  for (const auto& arg : argv) text += (text.empty() ? "" : " ") + arg;
  return text;
}

std::vector<ProcessInfo> list_processes(const HostPaths& paths) {
  std::vector<ProcessInfo> processes;
  for (int pid : pids(paths)) {
    const fs::path dir = paths.proc / std::to_string(pid);
    ProcessInfo process;
    process.pid = pid;
    process.comm = trim(read_small(dir / "comm").value_or(""));
    if (const auto cmdline = read_small(dir / "cmdline")) {
      size_t begin = 0;
      while (begin < cmdline->size()) {
        size_t end = cmdline->find('\0', begin);
        if (end == std::string::npos) end = cmdline->size();
        process.argv.push_back(cmdline->substr(begin, end - begin));
        begin = end + 1;
      }
      while (!process.argv.empty() && process.argv.back().empty()) process.argv.pop_back();
    }
    if (const auto stat = read_small(dir / "stat")) {
      // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so parse after the last ')'.
      const size_t close = stat->rfind(')');
      if (close != std::string::npos) {
        const auto fields = split_whitespace(stat->substr(close + 1));
        if (fields.size() >= 2 && all_digits(fields[1]) && fields[1].size() < 10) process.ppid = std::stoi(fields[1]);
      }
    }
    if (const auto cgroup = read_small(dir / "cgroup")) process.container = container_from_cgroup(*cgroup);
    if (process.comm.empty() && process.argv.empty()) continue;  // gone, or not readable
    processes.push_back(std::move(process));
  }
  return processes;
}

std::map<uint64_t, int> socket_owners(const HostPaths& paths) {
  std::map<uint64_t, int> owners;
  for (int pid : pids(paths)) {
    std::error_code ec;
    for (fs::directory_iterator it(paths.proc / std::to_string(pid) / "fd", ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code link_error;
      const std::string target = fs::read_symlink(it->path(), link_error).string();
      if (link_error || target.rfind("socket:[", 0) != 0 || target.back() != ']') continue;
      const std::string inode = target.substr(8, target.size() - 9);
      if (all_digits(inode) && inode.size() < 20) owners.emplace(std::stoull(inode), pid);
    }
  }
  return owners;
}

std::optional<std::string> nvidia_kernel_driver_version(const HostPaths& paths) {
  if (const auto text = read_small(paths.sys / "module/nvidia/version")) {
    const std::string version = trim(*text);
    if (!version.empty()) return version;
  }
  if (const auto text = read_small(paths.proc / "driver/nvidia/version")) {
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..."
    const std::string first = text->substr(0, text->find('\n'));
    for (const auto& field : split_whitespace(first)) {
      if (!field.empty() && std::isdigit(static_cast<unsigned char>(field[0])) && field.find('.') != std::string::npos)
        return field;
    }
  }
  return std::nullopt;
}

std::string server_engine(const ProcessInfo& process) {
  const auto& argv = process.argv;
  const std::string base0 = argv.empty() ? process.comm : basename_of(argv[0]);
  const auto has_verb_after = [&](const std::string& program, std::initializer_list<const char*> verbs) {
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (basename_of(argv[i]) != program) continue;
      for (const char* verb : verbs)
        if (argv[i + 1] == verb) return true;
    }
    return false;
  };
  const auto any_arg_has = [&](const char* needle) {
    return std::any_of(argv.begin(), argv.end(), [&](const std::string& a) { return a.find(needle) != std::string::npos; });
  };
  if (process.comm.rfind("VLLM::", 0) == 0 || (!argv.empty() && argv[0].rfind("VLLM::", 0) == 0) ||
      has_verb_after("vllm", {"serve"}) || any_arg_has("vllm.entrypoints."))
    return "vLLM";
  if (process.comm.rfind("sglang::", 0) == 0 || (!argv.empty() && argv[0].rfind("sglang::", 0) == 0) ||
      has_verb_after("sglang", {"serve"}) || any_arg_has("sglang.launch_server"))
    return "SGLang";
  if (base0 == "llama-server") return "llama.cpp";
  if (has_verb_after("anvil", {"serve", "rig"})) return "anvil";
  if (has_verb_after("ollama", {"serve", "runner"})) return "Ollama";
  if (base0 == "text-generation-launcher" || base0 == "text-generation-server") return "TGI";
  return "";
}

std::vector<ServerProcess> find_servers(const std::vector<ProcessInfo>& processes, int self_pid) {
  std::map<int, std::string> engines;
  for (const auto& process : processes) {
    if (process.pid == self_pid) continue;
    const std::string engine = server_engine(process);
    if (!engine.empty()) engines[process.pid] = engine;
  }
  std::vector<ServerProcess> servers;
  for (const auto& process : processes) {
    const auto it = engines.find(process.pid);
    if (it == engines.end() || engines.count(process.ppid)) continue;  // a worker of a server already listed
    servers.push_back({it->second, process});
  }
  return servers;
}

std::optional<fs::path> find_on_path(const std::string& name, const Environment& env) {
  const auto path = env.find("PATH");
  if (path == env.end()) return std::nullopt;
  std::istringstream in(path->second);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    const fs::path candidate = fs::path(dir) / name;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

CommandResult run_command(const std::vector<std::string>& argv, const Environment& env, double timeout_s) {
  CommandResult result;
  if (argv.empty()) return result;
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the parent may have threads).
  std::vector<std::string> env_text;
  for (const auto& [key, value] : env) env_text.push_back(key + "=" + value);
  std::vector<char*> child_argv, child_env;
  for (const auto& arg : argv) child_argv.push_back(const_cast<char*>(arg.c_str()));
  child_argv.push_back(nullptr);
  for (auto& entry : env_text) child_env.push_back(entry.data());
  child_env.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return result;
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return result;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    return result;
  }
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execve(child_argv[0], child_argv.data(), child_env.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    const int ready = ::poll(fds, 2, int(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        std::string& sink = i == 0 ? result.out : result.err;
        if (sink.size() < (8u << 20)) sink.append(buffer, size_t(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& fd : fds)
    if (fd.fd >= 0) ::close(fd.fd);
  if (result.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

DockerInfo probe_docker(const Environment& env, const CommandRunner& runner) {
  DockerInfo info;
  const auto docker = find_on_path("docker", env);
  if (!docker) return info;
  info.present = true;
  const auto first_line = [](const CommandResult& r) {
    const std::string text = trim(r.err.empty() ? r.out : r.err);
    return r.timed_out ? std::string("timed out") : text.substr(0, text.find('\n'));
  };
  const CommandResult ps =
      runner({docker->string(), "ps", "--no-trunc", "--format", "{{.ID}}\t{{.Names}}\t{{.Image}}\t{{.Status}}"}, env, 10.0);
  if (ps.exit_code != 0) {
    info.problem = "`docker ps` failed: " + first_line(ps);
    return info;
  }
  info.reachable = true;
  std::istringstream in(ps.out);
  for (std::string line; std::getline(in, line);) {
    if (trim(line).empty()) continue;
    std::vector<std::string> fields;
    std::istringstream cells(line);
    for (std::string cell; std::getline(cells, cell, '\t');) fields.push_back(cell);
    if (fields.size() < 4) continue;
    info.containers.push_back({fields[0], fields[1], fields[2], fields[3], false});
  }
  if (info.containers.empty()) return info;
  std::vector<std::string> inspect = {docker->string(), "inspect", "--format",
                                      "{{.Id}}\t{{json .HostConfig.DeviceRequests}}\t{{.HostConfig.Runtime}}"};
  for (const auto& container : info.containers) inspect.push_back(container.id);
  const CommandResult details = runner(inspect, env, 10.0);
  if (details.exit_code != 0) {
    info.problem = "`docker inspect` failed: " + first_line(details);
    return info;
  }
  std::istringstream lines(details.out);
  for (std::string line; std::getline(lines, line);) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    const std::string id = line.substr(0, tab), rest = lower(line.substr(tab + 1));
    const bool gpus = rest.find("\"gpu\"") != std::string::npos || rest.find("\"nvidia\"") != std::string::npos ||
                      rest.find("\tnvidia") != std::string::npos;
    for (auto& container : info.containers)
      if (container.id == id || id.rfind(container.id, 0) == 0 || container.id.rfind(id, 0) == 0) container.gpus = gpus;
  }
  return info;
}

}  // namespace anvil::tools
