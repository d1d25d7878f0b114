#include "rig/gateway.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "rig/metrics.h"
#include "rig/process.h"
#include "rig/upstream.h"
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

// httplib listens with its compiled-in backlog of 5: a burst of new client connections (a
// benchmark opening its streams, a batch job starting) overflows it, and the dropped SYNs come
// back only after TCP's one-second retransmit timeout. Listening again widens the queue.
class Listener : public httplib::Server {
 public:
  void widen_backlog() {
    const auto fd = svr_sock_.load();
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
  }
};

bool hop_by_hop(const std::string& name) {
  // Framing and connection handling are each hop's own; REMOTE_ADDR and the like are httplib's
  // notes about the client's socket, not headers it sent.
  static const char* const names[] = {"Host",    "Content-Length", "Connection",  "Transfer-Encoding", "Keep-Alive",
                                      "Accept-Encoding", "Expect", "TE",       "Trailer",     "Upgrade",
                                      "Proxy-Connection", "REMOTE_ADDR", "REMOTE_PORT", "LOCAL_ADDR", "LOCAL_PORT"};
  return std::any_of(std::begin(names), std::end(names),
                     [&](const char* hop) { return strcasecmp(hop, name.c_str()) == 0; });
}

}  // namespace

struct Gateway::Impl {
  const RigConfig& config;
  Supervisor& supervisor;
  Listener http;
  ProxyMetrics metrics;
  UpstreamPool upstreams;
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

  UpstreamRequest upstream;
  upstream.target = req.target.empty() ? req.path : req.target;
  for (const auto& [name, value] : req.headers) {
    if (hop_by_hop(name)) continue;
    if (!config.api_key.empty() && strcasecmp(name.c_str(), "Authorization") == 0) continue;  // the rig's key, not the backend's
    upstream.headers.emplace(name, value);
  }
  upstream.body = std::move(upstream_body);
  // This thread sends the request and then streams the answer itself: no thread per request and
  // no hand-off between threads for the first chunk or any other.
  auto answer = std::make_shared<UpstreamResponse>(upstreams, lease->port(), upstream);
  const double first_byte = std::chrono::duration<double>(Clock::now() - arrived).count();
  auto seconds_since = [arrived] { return std::chrono::duration<double>(Clock::now() - arrived).count(); };
  if (answer->status() == 0) {
    metrics.record(model->name, 502, first_byte, seconds_since());
    return send_error(res, 502, fmt::format("model {}'s backend (port {}) gave no answer: {}", model->name,
                                            lease->port(), answer->error()));
  }
  res.status = answer->status();
  std::string content_type = "application/octet-stream";
  for (const auto& [name, value] : answer->headers()) {
    if (hop_by_hop(name)) continue;
    if (strcasecmp(name.c_str(), "Content-Type") == 0) content_type = value;
    else res.headers.emplace(name, value);
  }
  if (!answer->chunked()) {
    // A whole answer (not a stream): read it here and send it with its length.
    std::string whole;
    if (!answer->read_all(whole)) {
      res.headers.clear();
      metrics.record(model->name, 502, first_byte, seconds_since());
      return send_error(res, 502, fmt::format("model {}'s backend (port {}) broke off its answer: {}", model->name,
                                              lease->port(), answer->error()));
    }
    answer.reset();  // the connection back to the pool before the backend is released
    lease.reset();
    res.set_content(std::move(whole), content_type);
    metrics.record(model->name, res.status, first_byte, seconds_since());
    return;
  }
  // The lease travels with the stream: the backend counts as busy until its answer is read.
  res.set_chunked_content_provider(
      content_type,
      [answer](size_t, httplib::DataSink& sink) {
        std::string piece;
        while (answer->read(piece))
          if (!sink.write(piece.data(), piece.size())) {
            answer->abandon();  // the client went away: so does the backend's connection, and its work
            return false;
          }
        // A stream the backend broke off ends without its last chunk, so the client sees it broken.
        if (!answer->error().empty()) return false;
        sink.done();
        return true;
      },
      [this, answer, lease, first_byte, seconds_since, status = res.status, name = model->name](bool success) mutable {
        const bool complete = success && answer->error().empty();
        answer.reset();
        lease.reset();
        metrics.record(name, complete ? status : 502, first_byte, seconds_since());
      });
}

Gateway::Gateway(const RigConfig& config, Supervisor& supervisor) : impl_(std::make_unique<Impl>(config, supervisor)) {
  // httplib serves each client connection on one worker for as long as it stays open: every
  // stream in flight, every request waiting for its backend to start and every idle kept-alive
  // connection holds one, and a connection beyond the pool waits unseen in its queue. Room for
  // 256 of those besides a full wait queue per model; idle threads cost only address space.
  size_t threads = 256;
  for (size_t i = 0; i < config.models.size(); ++i) threads += size_t(config.max_waiting);
  threads = std::min<size_t>(threads, 4096);
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

Gateway::~Gateway() { stop(); }

void Gateway::bind(int port) {
  const std::string& host = impl_->config.host;
  if (port == 0) {
    impl_->port = impl_->http.bind_to_any_port(host);
    if (impl_->port <= 0) fail("cannot listen on {} (address not available)", host);
    impl_->http.widen_backlog();
    return;
  }
  if (!impl_->http.bind_to_port(host, port)) {
    const auto holder = port_holder(port);
    if (holder && holder->pid > 0)
      fail("cannot listen on {}:{}: the port is held by pid {} ({})", host, port, holder->pid, holder->cmdline);
    fail("cannot listen on {}:{} (address in use or not available)", host, port);
  }
  impl_->port = port;
  impl_->http.widen_backlog();
}

int Gateway::port() const { return impl_->port; }

void Gateway::run() { impl_->http.listen_after_bind(); }

void Gateway::stop() {
  if (impl_->http.is_running()) impl_->http.stop();
}

}  // namespace anvil::rig
