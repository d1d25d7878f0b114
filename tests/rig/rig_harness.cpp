#include "rig/rig_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace anvil::test {

namespace fs = std::filesystem;

RigProcess::RigProcess(const fs::path& dir, const std::string& yaml) {
  const fs::path config = dir / "rig.yaml";
  write_file(config, yaml);
  // Each rig its own log: a test may start a second rig in the same dir, whose port line must not
  // be confused with the first one's.
  static int count = 0;
  log_path_ = dir / ("rig-" + std::to_string(count++) + ".log");
  pid_ = start_anvil({"rig", config.string(), "--port", "0"}, log_path_);
  port_ = wait_for_port(pid_, log_path_, 60);
}

RigProcess::~RigProcess() { stop(); }

std::string RigProcess::log() const { return read_log(log_path_); }

void RigProcess::kill_hard() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

// The rig stops its backends before it exits, each within stop_timeout.
int RigProcess::stop() { return stop_child(pid_, 30); }

HttpResult RigProcess::post(const std::string& path, const Json& body, const httplib::Headers& headers) const {
  return test::post(port_, path, body.dump(), headers);
}

HttpResult RigProcess::get(const std::string& path) const { return test::get(port_, path); }

SseStream RigProcess::stream(const Json& body) const { return post_stream(port_, "/v1/completions", body); }

Json RigProcess::backend(const std::string& model) const {
  const auto running = get("/running");
  if (running.status != 200) return {};
  for (const auto& entry : running.json["backends"])
    if (entry["model"] == model) return entry;
  return {};
}

int listen_loopback(int& port, int backlog) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || listen(fd, backlog) != 0)
    throw std::runtime_error("cannot listen on a loopback port");
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  return fd;
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;  // our child, now reaped
  if (kill(pid, 0) != 0) return false;
  // A zombie that is not our child still answers kill(0); /proc says it is gone.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

bool wait_until(double timeout_s, const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

}  // namespace anvil::test
