#include "rig/gateway.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "rig/metrics.h"
#include "rig/process.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/log.h"

namespace anvil::rig {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {}) {
  res.status = status;
  res.set_content(server::dump_json(server::error_body(status, message, param)), "application/json");
}

// One proxied response on its way from the backend to the client. Until the client's content
// provider runs, the upstream thread queues chunks (bounded: a slow client holds the backend
// back); once it runs, the provider hands its sink over and sleeps, and the upstream thread
// writes each chunk straight to the client as it arrives: no second hand-off per token.
struct Pipe {
  std::mutex mutex;
  std::condition_variable changed;
  bool headers_ready = false;
  int status = 0;
  httplib::Headers headers;
  std::deque<std::string> chunks;
  size_t buffered = 0;
  bool finished = false;
  bool cancelled = false;  // the client went away: stop reading from the backend
  httplib::DataSink* sink = nullptr;  // set while the provider waits for the upstream thread
  std::string error;
  static constexpr size_t kMaxBuffered = size_t(4) << 20;
};

bool hop_by_hop(const std::string& name) {
  static const char* const names[] = {"Host",       "Content-Length", "Connection",  "Transfer-Encoding", "Keep-Alive",
                                      "Accept-Encoding", "REMOTE_ADDR", "REMOTE_PORT", "LOCAL_ADDR",        "LOCAL_PORT"};
  return std::any_of(std::begin(names), std::end(names),
                     [&](const char* hop) { return strcasecmp(hop, name.c_str()) == 0; });
}

}  // namespace

struct Gateway::Impl {
  const RigConfig& config;
  Supervisor& supervisor;
  httplib::Server http;
  ProxyMetrics metrics;
  std::atomic<int> proxies{0};
  int port = 0;
  Clock::time_point started = Clock::now();

  Impl(const RigConfig& c, Supervisor& s) : config(c), supervisor(s) {}
  void routes();
  void proxy(const httplib::Request& req, httplib::Response& res);
  Json model_card(const std::string& id, const ModelConfig& model, const BackendStatus& status) const;
};

Json Gateway::Impl::model_card(const std::string& id, const ModelConfig& model, const BackendStatus& status) const {
  return {{"id", id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "anvil-rig"},
          {"root", model.name},
          {"parent", id == model.name ? Json(nullptr) : Json(model.name)},
          {"state", state_name(status.state)}};
}

void Gateway::Impl::routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!config.api_key.empty() && server::route_needs_key(req.path) &&
        !server::authorized(req.get_header_value("Authorization"), config.api_key)) {
      send_error(res, 401, "invalid or missing API key (send Authorization: Bearer <key>)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, res.status, res.status == 404 ? fmt::format("no route for {} {}", req.method, req.path)
                                                  : fmt::format("HTTP error {}", res.status));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    std::string what = "internal error";
    try {
      if (error) std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  auto list_models = [this](const std::string* only) {
    const auto statuses = supervisor.status();
    Json data = Json::array();
    for (size_t i = 0; i < config.models.size(); ++i) {
      const ModelConfig& model = config.models[i];
      std::vector<std::string> ids = {model.name};
      ids.insert(ids.end(), model.aliases.begin(), model.aliases.end());
      for (const auto& id : ids)
        if (!only || *only == id) data.push_back(model_card(id, model, statuses[i]));
    }
    return data;
  };
  http.Get("/v1/models", [list_models](const httplib::Request&, httplib::Response& res) {
    res.set_content(server::dump_json({{"object", "list"}, {"data", list_models(nullptr)}}), "application/json");
  });
  http.Get(R"(/v1/models/(.+))", [list_models](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const Json data = list_models(&id);
    if (data.empty()) return send_error(res, 404, fmt::format("The model `{}` does not exist.", id), "model");
    res.set_content(server::dump_json(data[0]), "application/json");
  });
  http.Get("/running", [this](const httplib::Request&, httplib::Response& res) {
    Json backends = Json::array();
    for (const auto& status : supervisor.status()) {
      const ModelConfig* model = config.find(status.name);
      backends.push_back({{"model", status.name},
                          {"aliases", model->aliases},
                          {"group", status.group},
                          {"engine", model->engine == EngineKind::Anvil ? "anvil" : "command"},
                          {"state", state_name(status.state)},
                          {"port", status.port ? Json(status.port) : Json(nullptr)},
                          {"pid", status.pid ? Json(status.pid) : Json(nullptr)},
                          {"uptime_s", status.uptime_s},
                          {"last_error", status.last_error.empty() ? Json(nullptr) : Json(status.last_error)},
                          {"starts", status.starts},
                          {"start_failures", status.start_failures},
                          {"crashes", status.crashes},
                          {"restarts", status.restarts},
                          {"swaps", status.swaps},
                          {"waiting", status.waiting},
                          {"in_flight", status.in_flight},
                          {"log", status.log}});
    }
    res.set_content(server::dump_json({{"backends", backends},
                                       {"uptime_s", std::chrono::duration<double>(Clock::now() - started).count()}}),
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(supervisor.status()), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto proxy_route = [this](const httplib::Request& req, httplib::Response& res) { proxy(req, res); };
  http.Post(R"(/v1/.+)", proxy_route);
  http.Post("/tokenize", proxy_route);
  http.Post("/detokenize", proxy_route);
}

void Gateway::Impl::proxy(const httplib::Request& req, httplib::Response& res) {
  const auto arrived = Clock::now();
  Json body = Json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return send_error(res, 400, "the request body must be a JSON object");
  if (!body.contains("model") || !body["model"].is_string())
    return send_error(res, 400, "the request names no model (the rig routes by the `model` field)", "model");
  const std::string requested = body["model"].get<std::string>();
  const ModelConfig* model = config.find(requested);
  if (!model) return send_error(res, 404, fmt::format("The model `{}` does not exist.", requested), "model");
  std::string upstream_body = req.body;
  if (!model->upstream_model.empty()) {
    body["model"] = model->upstream_model;
    upstream_body = server::dump_json(body);
  }

  std::shared_ptr<Supervisor::Lease> lease;
  try {
    lease = supervisor.acquire(*model);
  } catch (const BackendUnavailable& error) {
    if (error.status() == 503) res.set_header("Retry-After", "5");
    send_error(res, error.status(), error.what());
    metrics.record(model->name, error.status(), std::chrono::duration<double>(Clock::now() - arrived).count(),
                   std::chrono::duration<double>(Clock::now() - arrived).count());
    return;
  }

  auto pipe = std::make_shared<Pipe>();
  auto upstream = std::make_shared<httplib::Request>();
  upstream->method = "POST";
  upstream->path = req.target.empty() ? req.path : req.target;
  for (const auto& [name, value] : req.headers) {
    if (hop_by_hop(name)) continue;
    if (!config.api_key.empty() && strcasecmp(name.c_str(), "Authorization") == 0) continue;  // the rig's key, not the backend's
    upstream->headers.emplace(name, value);
  }
  upstream->body = std::move(upstream_body);
  upstream->response_handler = [pipe](const httplib::Response& response) {
    const std::lock_guard lock(pipe->mutex);
    pipe->status = response.status;
    pipe->headers = response.headers;
    pipe->headers_ready = true;
    pipe->changed.notify_all();
    return !pipe->cancelled;
  };
  upstream->content_receiver = [pipe](const char* data, size_t length, uint64_t, uint64_t) {
    std::unique_lock lock(pipe->mutex);
    if (pipe->sink && !pipe->cancelled) {
      if (pipe->sink->write(data, length)) return true;
      pipe->cancelled = true;
      pipe->changed.notify_all();
      return false;
    }
    pipe->changed.wait(lock, [&] { return pipe->cancelled || pipe->sink || pipe->buffered < Pipe::kMaxBuffered; });
    if (pipe->cancelled) return false;
    if (pipe->sink) {
      if (pipe->sink->write(data, length)) return true;
      pipe->cancelled = true;
      pipe->changed.notify_all();
      return false;
    }
    pipe->chunks.emplace_back(data, length);
    pipe->buffered += length;
    pipe->changed.notify_all();
    return true;
  };
  auto first_byte = std::make_shared<double>(0);
  ++proxies;
  // The lease travels with the upstream call: the backend counts as busy until its answer is read.
  std::thread([this, pipe, upstream, lease, port = lease->port(), first_byte, arrived, name = model->name]() mutable {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(10, 0);
    client.set_read_timeout(3600, 0);  // a long reasoning answer may be silent for minutes
    client.set_write_timeout(60, 0);
    client.set_tcp_nodelay(true);
    const auto result = client.send(*upstream);
    int status = 0;
    {
      const std::lock_guard lock(pipe->mutex);
      if (!pipe->headers_ready) pipe->error = httplib::to_string(result.error());
      pipe->finished = true;
      status = pipe->headers_ready ? pipe->status : 502;
      pipe->changed.notify_all();
    }
    lease.reset();
    metrics.record(name, status, *first_byte, std::chrono::duration<double>(Clock::now() - arrived).count());
    --proxies;
  }).detach();

  std::unique_lock lock(pipe->mutex);
  pipe->changed.wait(lock, [&] { return pipe->headers_ready || pipe->finished; });
  *first_byte = std::chrono::duration<double>(Clock::now() - arrived).count();
  if (!pipe->headers_ready)
    return send_error(res, 502, fmt::format("model {}'s backend (port {}) gave no answer: {}", model->name,
                                            lease->port(), pipe->error));
  res.status = pipe->status;
  std::string content_type = "application/octet-stream";
  for (const auto& [name, value] : pipe->headers) {
    if (hop_by_hop(name)) continue;
    if (strcasecmp(name.c_str(), "Content-Type") == 0) content_type = value;
    else res.headers.emplace(name, value);
  }
  lease.reset();
  res.set_chunked_content_provider(
      content_type,
      [pipe](size_t, httplib::DataSink& sink) {
        std::unique_lock guard(pipe->mutex);
        while (!pipe->chunks.empty()) {
          const std::string chunk = std::move(pipe->chunks.front());
          pipe->chunks.pop_front();
          pipe->buffered -= chunk.size();
          pipe->changed.notify_all();
          guard.unlock();
          if (!sink.write(chunk.data(), chunk.size())) {
            guard.lock();
            pipe->cancelled = true;
            pipe->changed.notify_all();
            return false;
          }
          guard.lock();
        }
        if (!pipe->finished) {
          // The backlog is out (checked under the lock), so from here the upstream thread writes.
          pipe->sink = &sink;
          pipe->changed.notify_all();
          pipe->changed.wait(guard, [&] { return pipe->finished || pipe->cancelled; });
          pipe->sink = nullptr;
          if (pipe->cancelled) return false;
        }
        sink.done();
        return true;
      },
      [pipe](bool success) {
        if (success) return;
        const std::lock_guard guard(pipe->mutex);
        pipe->cancelled = true;
        pipe->changed.notify_all();
      });
}

Gateway::Gateway(const RigConfig& config, Supervisor& supervisor) : impl_(std::make_unique<Impl>(config, supervisor)) {
  // Every waiting or proxied request holds a worker; the pool covers a full queue per model.
  size_t threads = 32;
  for (size_t i = 0; i < config.models.size(); ++i) threads += size_t(config.max_waiting) + 8;
  threads = std::min<size_t>(threads, 1024);
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl_->http.set_read_timeout(60);
  impl_->http.set_write_timeout(60);
  impl_->http.set_keep_alive_max_count(1000);
  impl_->http.set_tcp_nodelay(true);
  impl_->http.set_payload_max_length(size_t(64) << 20);
  // Without SO_REUSEPORT (httplib's default sets it) a second rig on the same port fails to bind
  // instead of silently taking half the connections.
  impl_->http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  impl_->routes();
}

Gateway::~Gateway() {
  stop();
  // Detached upstream threads reference this object; let them see their streams end.
  for (int i = 0; i < 200 && impl_->proxies > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
}

void Gateway::bind(int port) {
  const std::string& host = impl_->config.host;
  if (port == 0) {
    impl_->port = impl_->http.bind_to_any_port(host);
    if (impl_->port <= 0) fail("cannot listen on {} (address not available)", host);
    return;
  }
  if (!impl_->http.bind_to_port(host, port)) {
    const auto holder = port_holder(port);
    if (holder && holder->pid > 0)
      fail("cannot listen on {}:{}: the port is held by pid {} ({})", host, port, holder->pid, holder->cmdline);
    fail("cannot listen on {}:{} (address in use or not available)", host, port);
  }
  impl_->port = port;
}

int Gateway::port() const { return impl_->port; }

void Gateway::run() { impl_->http.listen_after_bind(); }

void Gateway::stop() {
  if (impl_->http.is_running()) impl_->http.stop();
}

}  // namespace anvil::rig
