#pragma once
// `anvil serve`'s HTTP side: OpenAI-compatible routes over cpp-httplib, answering while the model
// loads in the background (/health 503 until it is ready).
#include <functional>
#include <memory>

#include "models/model.h"
#include "server/served_model.h"

namespace anvil::server {

class OpenAiServer {
 public:
  explicit OpenAiServer(ServerConfig config);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds the listening socket; anvil::Error when the address is taken or invalid.
  void bind();
  // Starts loading on a background thread; a failure stops the server and run() reports it.
  void load_in_background(std::function<std::unique_ptr<Model>()> load_model);
  // Serves until stop(). Throws anvil::Error when the model failed to load.
  void run();
  // Thread-safe; streams in flight end with an error event, their sequences cancelled.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::server
