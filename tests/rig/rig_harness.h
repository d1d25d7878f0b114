#pragma once
// The real `anvil rig` as a child process: a config written to a temp dir, --port 0, the port
// read from its "serving ... on http://HOST:PORT" log line. Process and HTTP plumbing come from
// tests/support (server_harness.h), shared with the `anvil serve` suites.
#include <httplib.h>
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "support/server_harness.h"
#include "support/test_support.h"

namespace anvil::test {

class RigProcess {
 public:
  // `yaml` is the config; the rig's state and logs go under `dir`.
  RigProcess(const std::filesystem::path& dir, const std::string& yaml);
  ~RigProcess();  // SIGTERM (the rig stops its backends), SIGKILL if it hangs
  RigProcess(const RigProcess&) = delete;
  RigProcess& operator=(const RigProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const;
  void kill_hard();  // SIGKILL, as a crash or an OOM killer would
  int stop();        // SIGTERM; the exit status

  HttpResult post(const std::string& path, const Json& body, const httplib::Headers& headers = {}) const;
  HttpResult get(const std::string& path) const;
  SseStream stream(const Json& body) const;
  // /running's entry for a model.
  Json backend(const std::string& model) const;

 private:
  std::filesystem::path log_path_;
  pid_t pid_ = -1;
  int port_ = 0;
};

bool process_alive(pid_t pid);
// A socket listening on a free loopback port (close-on-exec: started children do not inherit
// it); the fd, and the port in `port`.
int listen_loopback(int& port, int backlog = 16);
bool wait_until(double timeout_s, const std::function<bool()>& condition);

}  // namespace anvil::test
