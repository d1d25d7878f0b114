#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "server/auth.h"
#include "server/endpoints.h"
#include "server/log.h"

namespace anvil::server {

namespace {

// httplib's compiled listen backlog is 5; a burst of clients (a benchmark opening 64 streams)
// would see dropped SYNs and one-second retransmit stalls. Listening again widens it.
class HttpListener : public httplib::Server {
 public:
  void widen_backlog() {
    const auto fd = svr_sock_.load();
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
  }
};

// Address and port of a socket name, in the numeric text httplib puts in a Request.
bool socket_name(const sockaddr_storage& address, std::string& host, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    port = ntohs(v4.sin_port);
    if (!inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text)) return false;
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    port = ntohs(v6.sin6_port);
    if (!inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text)) return false;
  } else {
    return false;
  }
  host = text;
  return true;
}

struct ConnectionEnds {
  std::string remote_addr, local_addr;
  int remote_port = -1, local_port = -1;
};

// The socket a request came in on. Debian's httplib (0.11) gives handlers neither the socket
// nor Request::is_connection_closed (added in later versions), but the request carries both ends'
// addresses, and those name exactly one connected socket of this process. INVALID_SOCKET when
// none matches (the request then just cannot be seen to disconnect).
socket_t connection_socket(const ConnectionEnds& ends) {
  const auto unscoped = [](const std::string& host) { return host.substr(0, host.find('%')); };
  const std::string remote = unscoped(ends.remote_addr), local = unscoped(ends.local_addr);
  DIR* fds = ::opendir("/proc/self/fd");
  if (!fds) return INVALID_SOCKET;
  socket_t found = INVALID_SOCKET;
  while (const dirent* entry = ::readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    std::string host;
    int port = -1;
    if (::getsockname(int(fd), reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
        !socket_name(address, host, port) || port != ends.local_port || host != local)
      continue;
    length = sizeof address;
    if (::getpeername(int(fd), reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
        !socket_name(address, host, port) || port != ends.remote_port || host != remote)
      continue;
    found = socket_t(fd);
    break;
  }
  ::closedir(fds);
  return found;
}

// True once the client has closed or reset the connection. The request body has been read by
// then, so a readable socket holds either a pipelined next request (still there) or the end of
// the stream (gone). A client that only shuts down its sending side also reads as gone, as with
// newer httplib's is_connection_closed; HTTP clients do not do that while awaiting an answer.
bool connection_closed(socket_t sock) {
  if (sock == INVALID_SOCKET) return false;
  pollfd entry{sock, POLLIN | POLLRDHUP, 0};
  if (::poll(&entry, 1, 0) <= 0) return false;
  if (entry.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (!(entry.revents & POLLIN)) return false;
  char byte;
  const ssize_t n = ::recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {}) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump_json(error_body(status, message, param)), "application/json");
}

}  // namespace

struct OpenAiServer::Impl {
  ServerConfig config;
  HttpListener http;
  ServerMetrics metrics;
  std::mutex mutex;
  std::shared_ptr<ServedModel> model;
  std::string load_error;
  std::atomic<bool> failed{false}, stopping{false}, entering_listen{false}, listen_returned{false};
  std::atomic<int> open_streams{0};
  std::thread loader;

  explicit Impl(ServerConfig c) : config(std::move(c)) {}

  std::shared_ptr<ServedModel> loaded() {
    const std::lock_guard lock(mutex);
    return model;
  }

  std::shared_ptr<ServedModel> ready_model() {
    auto current = loaded();
    if (!current) throw ApiError(503, "the model is still loading");
    return current;
  }

  template <typename Fn>
  httplib::Server::Handler wrap(Fn fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& error) {
        send_error(res, error.status(), error.what(), error.param());
      } catch (const Json::exception& error) {
        send_error(res, 400, std::string("invalid request: ") + error.what());
      } catch (const Error& error) {
        send_error(res, 400, error.what());
      } catch (const std::exception& error) {
        log_error("{} {}: {}", req.method, req.path, error.what());
        send_error(res, 500, std::string("internal error: ") + error.what());
      }
    };
  }

  // POST routes read their own body: httplib's built-in reader refuses any form-encoded body over
  // 8 KiB (what `curl -d` sends), and we want one limit, --max-body-bytes, whatever the type.
  template <typename Handler>
  void post_route(const std::string& path, Handler handler) {
    http.Post(path, [this, handler](const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader& reader) {
      wrap([&](const httplib::Request&, httplib::Response&) {
        std::string body;
        bool too_large = false;
        const bool ok = reader([&](const char* data, size_t length) {
          if (body.size() + length > config.max_body_bytes) {
            too_large = true;
            return false;
          }
          body.append(data, length);
          return true;
        });
        if (too_large || res.status == 413)
          throw ApiError(413, fmt::format("the request body is larger than {} bytes", config.max_body_bytes));
        if (!ok) throw ApiError(400, "the request body could not be read");
        // Found on first use: most requests finish without ever asking.
        auto connection = std::make_shared<std::optional<socket_t>>();
        const ConnectionEnds ends{req.remote_addr, req.local_addr, req.remote_port, req.local_port};
        auto client_gone = [connection, ends] {
          if (!*connection) *connection = connection_socket(ends);
          return connection_closed(**connection);
        };
        EndpointContext context{config, metrics, ready_model(), stopping, open_streams, client_gone};
        handler(context, body, res);
      })(req, res);
    });
  }

  void routes();
  void request_stop();
};

void OpenAiServer::Impl::routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // vLLM's default CORS policy (any origin), so browser front ends can call us directly.
    res.set_header("Access-Control-Allow-Origin", "*");
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "*");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!config.api_key.empty() && route_needs_key(req.path) &&
        !authorized(req.get_header_value("Authorization"), config.api_key)) {
      send_error(res, 401, "invalid or missing API key (send Authorization: Bearer <key>)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 413) {
      send_error(res, 413, fmt::format("the request body is larger than {} bytes", config.max_body_bytes));
    } else if (res.status == 404) {
      send_error(res, 404, fmt::format("no route for {} {}", req.method, req.path));
    } else {
      send_error(res, res.status, fmt::format("HTTP error {}", res.status));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, 500, "internal error");
  });
  http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    log_info("{}:{} \"{} {}\" {}", req.remote_addr, req.remote_port, req.method, req.path, res.status);
  });

  auto health = wrap([this](const httplib::Request&, httplib::Response& res) {
    if (!loaded()) throw ApiError(503, failed ? "the model failed to load" : "the model is still loading");
    res.status = 200;
  });
  http.Get("/health", health);
  http.Get("/ping", health);
  http.Post("/ping", health);
  http.Get("/version", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json({{"version", config.version}}), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const auto current = loaded();
    const EngineStats stats = current ? current->engine->stats() : EngineStats{};
    res.set_content(metrics.render(current ? &stats : nullptr, config.served_model_names.front()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/load", wrap([this](const httplib::Request&, httplib::Response& res) {
    const EngineStats stats = ready_model()->engine->stats();
    res.set_content(dump_json({{"server_load", stats.running + stats.waiting}}), "application/json");
  }));
  http.Get("/v1/models", wrap([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(models_json(config, *ready_model(), nullptr)), "application/json");
  }));
  http.Get(R"(/v1/models/(.+))", wrap([this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    res.set_content(dump_json(models_json(config, *ready_model(), &id)), "application/json");
  }));

  post_route("/v1/chat/completions", handle_chat_completions);
  post_route("/v1/completions", handle_completions);
  post_route("/tokenize", handle_tokenize);
  post_route("/detokenize", handle_detokenize);
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"}) {
    http.Get(path, [path](const httplib::Request&, httplib::Response& res) {
      res.set_header("Allow", "POST");
      send_error(res, 405, fmt::format("{} takes POST", path));
    });
  }
}

OpenAiServer::OpenAiServer(ServerConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {
  Impl& impl = *impl_;
  if (impl.config.served_model_names.empty()) impl.config.served_model_names.push_back(impl.config.model_dir.string());
  // Every request in the engine, running or queued, holds a worker until it ends, so the pool must
  // outnumber both together: a request past the queue bound needs a free worker to get its 503,
  // or it would wait unseen in httplib's own unbounded queue.
  const EngineConfig& engine = impl.config.engine;
  const int64_t queued = std::min<int64_t>(engine.max_waiting, 512);
  const size_t threads = size_t(std::clamp<int64_t>(std::min<int64_t>(engine.max_num_seqs, 512) + queued + 16, 64, 512));
  impl.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl.http.set_payload_max_length(impl.config.max_body_bytes);
  impl.http.set_read_timeout(30);
  impl.http.set_write_timeout(30);
  impl.http.set_keep_alive_max_count(1000);
  impl.http.set_tcp_nodelay(true);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half its connections; a port in use must be an error instead.
  impl.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  impl.routes();
}

OpenAiServer::~OpenAiServer() {
  stop();
  if (impl_->loader.joinable()) impl_->loader.join();
}

void OpenAiServer::bind() {
  ServerConfig& config = impl_->config;
  if (config.port == 0) {
    // Port 0: any free port, named in the "serving ... on" log line (tests start servers this way).
    config.port = impl_->http.bind_to_any_port(config.host);
    if (config.port <= 0) fail("cannot listen on {} (address not available)", config.host);
  } else if (!impl_->http.bind_to_port(config.host, config.port)) {
    fail("cannot listen on {}:{} (address in use or not available)", config.host, config.port);
  }
  impl_->http.widen_backlog();
}

void OpenAiServer::load_in_background(std::function<std::unique_ptr<Model>()> load_model) {
  Impl& impl = *impl_;
  impl.loader = std::thread([&impl, load_model = std::move(load_model)] {
    try {
      const auto started = Clock::now();
      auto served = make_served_model(load_model(), impl.config);
      log_info("model {} ready in {:.1f} s: max_model_len {}, chat format {}", impl.config.model_dir.string(),
               std::chrono::duration<double>(Clock::now() - started).count(), served->max_model_len,
               served->chat->kind() == ChatFormatKind::Harmony  ? "harmony"
               : served->chat->kind() == ChatFormatKind::ChatMl ? "chatml"
                                                                : "none");
      const std::lock_guard lock(impl.mutex);
      impl.model = std::move(served);
    } catch (const std::exception& error) {
      {
        const std::lock_guard lock(impl.mutex);
        impl.load_error = error.what();
      }
      impl.failed = true;
      log_error("loading {} failed: {}", impl.config.model_dir.string(), error.what());
      impl.request_stop();
    }
  });
}

void OpenAiServer::Impl::request_stop() {
  stopping = true;
  // Open streams see `stopping` within a quarter second and close with an error event; give them
  // that chance before the sockets go.
  for (int i = 0; i < 60 && open_streams > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!entering_listen) return;
  // httplib's stop() only takes effect once listening has begun.
  while (!http.is_running() && !listen_returned) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  http.stop();
}

void OpenAiServer::run() {
  Impl& impl = *impl_;
  impl.entering_listen = true;
  if (!impl.stopping) {
    log_info("serving {} as {} on http://{}:{}", impl.config.model_dir.string(), impl.config.served_model_names.front(),
             impl.config.host, impl.config.port);
    impl.http.listen_after_bind();
  }
  impl.listen_returned = true;
  if (impl.loader.joinable()) impl.loader.join();
  if (impl.failed) {
    const std::lock_guard lock(impl.mutex);
    fail("{}", impl.load_error);
  }
}

void OpenAiServer::stop() { impl_->request_stop(); }

}  // namespace anvil::server
