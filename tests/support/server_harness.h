#pragma once
// End-to-end harness: the real `anvil serve` as a child process on a loopback port, and the
// models it serves in these tests.
#include <httplib.h>
#include <sys/types.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace anvil::test {

using Json = nlohmann::json;

class ServerProcess {
 public:
  // `args` follow `anvil serve`; the server gets --port 0 and reports the port it took.
  explicit ServerProcess(const std::vector<std::string>& args);
  ~ServerProcess();  // SIGTERM, then SIGKILL if it does not exit
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  httplib::Client client(int timeout_s = 120) const;
  // Waits for /health 200; false (with the log in the failure message) on timeout or exit.
  bool wait_ready(double timeout_s);
  bool alive();
  // Sends SIGTERM and returns the exit status (-1 when it had to be killed).
  int stop();
  std::string log() const;
  // /health's status on the first request after the port opened (503 while the model loads).
  int first_health_status() const { return first_health_; }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  int first_health_ = 0;
};

// `ANVIL_BINARY args...` as a child process, stdout and stderr appended to `log`.
pid_t start_anvil(const std::vector<std::string>& args, const std::filesystem::path& log);
// The port in the child's "... on http://127.0.0.1:PORT" log line, written once it has bound;
// 0 when it exits or `timeout_s` passes first.
int wait_for_port(pid_t& pid, const std::filesystem::path& log, double timeout_s);
// Whether our child still runs (reaping it, and setting pid to -1, when it has exited).
bool child_running(pid_t& pid);
// SIGTERM, then SIGKILL after `timeout_s`; the exit status (128 + signal when a signal ended it),
// -1 when it had to be killed. pid becomes -1.
int stop_child(pid_t& pid, double timeout_s);
std::string read_log(const std::filesystem::path& log);
httplib::Client loopback_client(int port, int timeout_s = 120);

// Servers shared by the whole suite, started on first use and stopped at exit.
ServerProcess& tiny_server();   // gpt-oss-tiny fixture (no tokenizer), names "tiny" and "tiny-alias"
ServerProcess& demo_server();   // init-demo gpt-oss with the o200k_harmony tokenizer (harmony chat)
ServerProcess& qwen_server();   // qwen3-tiny fixture with a byte-level tokenizer (ChatML chat)
std::filesystem::path tiny_model_dir();
// qwen3-tiny with qwen_like_tokenizer() beside it, written once per process.
std::filesystem::path qwen_tiny_dir();
// A Qwen-like byte-level BPE tokenizer.json filling qwen3-tiny's 1024 ids: bytes 0-255, Qwen3's
// added tokens at 256-262, and two-letter merges for the rest, so every id the model can emit has
// text. qwen_server() serves it; unit tests load it directly.
Json qwen_like_tokenizer();

struct HttpResult {
  int status = 0;
  std::string body;
  Json json;  // parsed body (discarded when not JSON)
  std::string header(const std::string& name) const;
  httplib::Headers headers;
};
HttpResult post(const ServerProcess& server, const std::string& path, const std::string& body,
                const httplib::Headers& headers = {});
HttpResult post(const ServerProcess& server, const std::string& path, const Json& body);
HttpResult get(const ServerProcess& server, const std::string& path, const httplib::Headers& headers = {});
// The same against any loopback port.
HttpResult post(int port, const std::string& path, const std::string& body, const httplib::Headers& headers = {});
HttpResult get(int port, const std::string& path, const httplib::Headers& headers = {});

// A finished SSE response: its data events in order (JSON), and whether [DONE] closed it.
struct SseStream {
  int status = 0;
  std::vector<Json> events;
  bool done = false;
  std::string raw;
};
SseStream post_stream(const ServerProcess& server, const std::string& path, const Json& body);
SseStream post_stream(int port, const std::string& path, const Json& body);
SseStream parse_sse(int status, const std::string& raw);

// One value of a Prometheus sample line (`name{labels} value`), summed over label sets;
// -1 when absent.
double metric_value(const std::string& text, const std::string& name);

}  // namespace anvil::test
