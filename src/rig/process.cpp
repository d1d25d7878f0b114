#include "rig/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"

namespace anvil::rig {

namespace fs = std::filesystem;

pid_t spawn(const SpawnSpec& spec) {
  if (spec.argv.empty()) fail("cannot start an empty command");
  const int log = ::open(spec.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) fail("{}: cannot open the backend log: {}", spec.log.string(), std::strerror(errno));
  // Everything the child touches is prepared before fork: only async-signal-safe calls after it.
  std::vector<std::string> argv = spec.argv, env = spec.env;
  std::vector<char*> raw_argv, raw_env;
  for (auto& arg : argv) raw_argv.push_back(arg.data());
  raw_argv.push_back(nullptr);
  for (auto& var : env) raw_env.push_back(var.data());
  raw_env.push_back(nullptr);
  const std::string exec_failed = "anvil rig: cannot execute " + spec.argv[0] + " (not found or not executable)\n";
  const std::string chdir_failed = "anvil rig: cannot enter the working directory " + spec.cwd + "\n";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(log);
    fail("fork failed: {}", std::strerror(errno));
  }
  if (pid == 0) {
    setsid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(126);  // the rig died between fork and prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the rig blocks signals it waits for; a backend must not inherit that
    signal(SIGPIPE, SIG_DFL);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    const int null_in = ::open("/dev/null", O_RDONLY);
    if (null_in >= 0) dup2(null_in, STDIN_FILENO);
    if (!spec.cwd.empty() && chdir(spec.cwd.c_str()) != 0) {
      (void)!write(STDERR_FILENO, chdir_failed.data(), chdir_failed.size());
      _exit(127);
    }
    execvpe(raw_argv[0], raw_argv.data(), raw_env.data());
    (void)!write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    _exit(127);
  }
  ::close(log);
  return pid;
}

std::optional<uint64_t> process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  // The command name may hold spaces and parentheses; fields resume after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int index = 3; fields >> field; ++index)
    if (index == 22) return std::stoull(field);
  return std::nullopt;
}

std::string process_cmdline(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  for (char& c : text)
    if (c == '\0') c = ' ';
  return text;
}

namespace {

std::vector<pid_t> all_pids() {
  std::vector<pid_t> pids;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

}  // namespace

std::vector<pid_t> processes_with_env(const std::string& name, const std::string& value) {
  const std::string wanted = name + "=" + value;
  std::vector<pid_t> found;
  for (pid_t pid : all_pids()) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    if (!in) continue;
    for (std::string var; std::getline(in, var, '\0');)
      if (var == wanted) {
        found.push_back(pid);
        break;
      }
  }
  return found;
}

std::optional<PortHolder> port_holder(int port) {
  // Listening sockets (state 0A) on the port, by inode.
  std::vector<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      const size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) inodes.push_back("socket:[" + inode + "]");
    }
  }
  if (inodes.empty()) return std::nullopt;
  for (pid_t pid : all_pids()) {
    std::error_code error;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
      std::error_code link_error;
      const std::string target = fs::read_symlink(fd.path(), link_error).string();
      for (const auto& inode : inodes)
        if (target == inode) return PortHolder{pid, process_cmdline(pid)};
    }
  }
  return PortHolder{};
}

bool port_free(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return free;
}

int pick_free_port(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

std::string random_token() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}", device(), device());
}

}  // namespace anvil::rig
