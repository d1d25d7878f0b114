#pragma once
// Runs the backends: starts one on first request (or at boot with `preload`), waits until its
// health probe passes while requests queue (bounded), swaps members of a group (drain, stop,
// start), restarts a crashed backend with backoff, unloads idle ones after their ttl, and clears
// what an earlier rig left behind. One thread (the monitor) forks, reaps and probes; request
// threads only wait on it.
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rig/config.h"

namespace anvil::rig {

// A request that cannot reach its backend: the HTTP status to answer and why.
class BackendUnavailable : public std::runtime_error {
 public:
  BackendUnavailable(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

enum class BackendState { Stopped, Starting, Ready, Draining, Stopping, Failed };
const char* state_name(BackendState state);

struct BackendStatus {
  std::string name;
  std::string group;
  BackendState state = BackendState::Stopped;
  int port = 0;
  pid_t pid = 0;
  double uptime_s = 0;  // since it became ready; 0 when not ready
  std::string last_error;
  uint64_t starts = 0, crashes = 0, restarts = 0, swaps = 0, start_failures = 0;
  int waiting = 0, in_flight = 0;
  std::string log;
};

class Supervisor {
 public:
  explicit Supervisor(const RigConfig& config);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Clears an earlier rig's leftovers (returns one line per thing cleared), then starts the
  // monitor and the preloaded backends.
  std::vector<std::string> start();
  // Stops every backend (SIGTERM to its group, SIGKILL after stop_timeout) and the monitor.
  void shutdown();

  // Holds a ready backend for one proxied request; the backend is not stopped while held
  // (except past drain_timeout in a swap).
  class Lease {
   public:
    Lease(Supervisor& owner, size_t index, int port) : owner_(owner), index_(index), port_(port) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    int port() const { return port_; }

   private:
    Supervisor& owner_;
    size_t index_;
    int port_;
  };
  // Blocks until the model's backend is ready. BackendUnavailable: 503 when the queue is full or
  // the backend failed to start (with the reason), 504 when it was not ready in time.
  std::unique_ptr<Lease> acquire(const ModelConfig& model);

  std::vector<BackendStatus> status() const;

 private:
  struct Backend;
  void monitor();
  void step(std::unique_lock<std::mutex>& lock);
  void launch(Backend& backend, bool swap_in);
  void begin_stop(Backend& backend, const std::string& reason);
  void fail_start(Backend& backend, const std::string& reason);
  void write_pid_file(const Backend& backend) const;
  void remove_pid_file(const Backend& backend) const;

  const RigConfig& config_;
  std::vector<std::unique_ptr<Backend>> backends_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::thread monitor_;
};

}  // namespace anvil::rig
