#pragma once
// The rig's one stable endpoint: /v1/* routed by the request's `model` (a name or an alias) to
// the backend the supervisor holds ready, responses streamed back chunk by chunk as they arrive;
// /v1/models, /health, /running and /metrics answered by the rig itself.
#include <memory>

#include "rig/config.h"
#include "rig/supervisor.h"

namespace anvil::rig {

class Gateway {
 public:
  Gateway(const RigConfig& config, Supervisor& supervisor);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Binds config.host:port (port 0: any free one); anvil::Error naming the process that holds it.
  void bind(int port);
  int port() const;
  void run();   // serves until stop()
  void stop();  // thread-safe

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::rig
