// A stand-in OpenAI backend with no engine behind it, for what the rig itself costs: the rig's
// tests start it as a `command` model, and scripts/rig_overhead.sh (FAKE_BACKEND=) measures the gateway
// against it, directly and through a rig, without an engine's timing in the way.
//
//   anvil_fake_backend --port N [--first-token-ms F] [--itl-ms I] [--tokens T]
//
// POST /v1/completions and /v1/chat/completions stream (or, without "stream": true, return)
// max_tokens tokens (T when absent): the first F ms after the request arrived, then one every
// I ms, then a usage chunk (as stream_options.include_usage asks) and [DONE]. GET /health is 200;
// GET /stats counts the POSTs and the distinct connections they came on.
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

namespace {

using Json = nlohmann::json;

struct Options {
  int port = 0;
  double first_token_ms = 0;
  double itl_ms = 0;
  int64_t tokens = 16;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "anvil_fake_backend: %s\nusage: anvil_fake_backend --port N [--first-token-ms F] [--itl-ms I] [--tokens T]\n", why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  bool port_seen = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const char* value = argv[++i];
    char* end = nullptr;
    const double number = std::strtod(value, &end);
    if (end == value || *end != '\0' || number < 0) usage((flag + ": not a non-negative number: " + value).c_str());
    if (flag == "--port") options.port = int(number), port_seen = true;
    else if (flag == "--first-token-ms") options.first_token_ms = number;
    else if (flag == "--itl-ms") options.itl_ms = number;
    else if (flag == "--tokens") options.tokens = int64_t(number);
    else usage(("unknown flag " + flag).c_str());
  }
  if (!port_seen) usage("--port is required");
  return options;
}

std::string token_event(bool chat, const std::string& model, int64_t index, bool last) {
  Json choice = {{"index", 0}, {"finish_reason", last ? Json("length") : Json(nullptr)}};
  if (chat) choice["delta"] = {{"content", " t" + std::to_string(index)}};
  else choice["text"] = " t" + std::to_string(index);
  const Json event = {{"id", "fake"}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"model", model},
                      {"choices", Json::array({choice})}};
  return "data: " + event.dump() + "\n\n";
}

// httplib listens with a backlog of 5; a burst of connections would wait out a one-second SYN
// retransmit, which is the client's cost, not the gateway's. Listening again widens it.
class Listener : public httplib::Server {
 public:
  void widen_backlog() { ::listen(svr_sock_.load(), SOMAXCONN); }
};

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  Listener http;
  // Every stream holds a worker for its whole length; the rig's tests run 16 at once.
  http.new_task_queue = [] { return new httplib::ThreadPool(128); };
  http.set_tcp_nodelay(true);
  http.set_keep_alive_max_count(100000);
  std::mutex mutex;
  std::set<std::pair<std::string, int>> connections;
  int64_t posts = 0;
  http.Get("/stats", [&](const httplib::Request&, httplib::Response& res) {
    const std::lock_guard lock(mutex);
    res.set_content(Json{{"posts", posts}, {"connections", connections.size()}}.dump(), "application/json");
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content(R"({"status":"ok"})", "application/json"); });
  auto generate = [&](const httplib::Request& req, httplib::Response& res) {
    const auto arrived = std::chrono::steady_clock::now();
    {
      const std::lock_guard lock(mutex);
      ++posts;
      connections.emplace(req.remote_addr, req.remote_port);
    }
    const Json body = Json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"the request body must be a JSON object","code":400}})", "application/json");
      return;
    }
    const bool chat = req.path == "/v1/chat/completions";
    const std::string model = body.value("model", std::string("fake"));
    const int64_t tokens = std::max<int64_t>(1, body.value("max_tokens", options.tokens));
    const int64_t prompt = body.contains("prompt") && body["prompt"].is_array() ? int64_t(body["prompt"].size()) : 1;
    const Json usage = {{"prompt_tokens", prompt}, {"completion_tokens", tokens}, {"total_tokens", prompt + tokens}};
    // Token i is due first_token_ms + i * itl_ms after the request arrived.
    auto due = [=, &options](int64_t i) {
      return arrived + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double, std::milli>(options.first_token_ms + double(i) * options.itl_ms));
    };
    if (!body.value("stream", false)) {
      std::this_thread::sleep_until(due(tokens - 1));
      std::string text;
      for (int64_t i = 0; i < tokens; ++i) text += " t" + std::to_string(i);
      Json choice = {{"index", 0}, {"finish_reason", "length"}};
      if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
      else choice["text"] = text;
      res.set_content(Json{{"id", "fake"}, {"object", chat ? "chat.completion" : "text_completion"}, {"model", model},
                           {"choices", Json::array({choice})}, {"usage", usage}}.dump(),
                      "application/json");
      return;
    }
    auto next = std::make_shared<int64_t>(0);
    res.set_chunked_content_provider("text/event-stream", [=](size_t, httplib::DataSink& sink) {
      const int64_t i = (*next)++;
      if (i < tokens) {
        std::this_thread::sleep_until(due(i));
        const std::string event = token_event(chat, model, i, i + 1 == tokens);
        return sink.write(event.data(), event.size());
      }
      const std::string tail = "data: " + Json{{"id", "fake"}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                                               {"model", model}, {"choices", Json::array()}, {"usage", usage}}.dump() +
                               "\n\ndata: [DONE]\n\n";
      const bool ok = sink.write(tail.data(), tail.size());
      sink.done();
      return ok;
    });
  };
  http.Post("/v1/completions", generate);
  http.Post("/v1/chat/completions", generate);
  if (!http.bind_to_port("127.0.0.1", options.port)) {
    std::fprintf(stderr, "anvil_fake_backend: cannot listen on 127.0.0.1:%d\n", options.port);
    return 1;
  }
  http.widen_backlog();
  std::fprintf(stderr, "anvil_fake_backend serving on http://127.0.0.1:%d\n", options.port);
  http.listen_after_bind();
  return 0;
}
