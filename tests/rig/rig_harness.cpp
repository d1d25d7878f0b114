#include "rig/rig_harness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
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
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    FILE* log = std::fopen(log_path_.c_str(), "a");
    if (log) {
      dup2(fileno(log), STDOUT_FILENO);
      dup2(fileno(log), STDERR_FILENO);
    }
    std::vector<std::string> argv = {ANVIL_BINARY, "rig", config.string(), "--port", "0"};
    std::vector<char*> raw;
    for (auto& arg : argv) raw.push_back(arg.data());
    raw.push_back(nullptr);
    execv(raw[0], raw.data());
    _exit(127);
  }
  const std::regex serving(R"(on http://127\.0\.0\.1:(\d+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && process_alive(pid_)) {
    std::smatch match;
    const std::string text = log();
    if (std::regex_search(text, match, serving)) {
      port_ = std::stoi(match[1]);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

RigProcess::~RigProcess() { stop(); }

std::string RigProcess::log() const {
  std::ifstream in(log_path_, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

httplib::Client RigProcess::client(int timeout_s) const {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(timeout_s, 0);
  client.set_write_timeout(timeout_s, 0);
  client.set_connection_timeout(10, 0);
  return client;
}

void RigProcess::kill_hard() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int RigProcess::stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 600; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill_hard();
  return -1;
}

namespace {

HttpResult to_result(const httplib::Result& result) {
  HttpResult out;
  if (!result) return out;
  out.status = result->status;
  out.body = result->body;
  out.headers = result->headers;
  out.json = Json::parse(out.body, nullptr, false);
  return out;
}

}  // namespace

HttpResult RigProcess::post(const std::string& path, const Json& body, const httplib::Headers& headers) const {
  auto c = client();
  return to_result(c.Post(path, headers, body.dump(), "application/json"));
}

HttpResult RigProcess::get(const std::string& path) const {
  auto c = client();
  return to_result(c.Get(path));
}

SseStream RigProcess::stream(const Json& body) const {
  auto c = client();
  const auto result = c.Post("/v1/completions", body.dump(), "application/json");
  if (!result) return {};
  return parse_sse(result->status, result->body);
}

Json RigProcess::backend(const std::string& model) const {
  const auto running = get("/running");
  if (running.status != 200) return {};
  for (const auto& entry : running.json["backends"])
    if (entry["model"] == model) return entry;
  return {};
}

fs::path qwen_tiny_dir() {
  static TempDir scratch;
  const fs::path dir = scratch.path() / "qwen3-tiny";
  if (!fs::exists(dir / "tokenizer.json")) {
    fs::create_directories(dir);
    for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
      fs::copy_file(fixtures_dir() / "qwen3-tiny" / file, dir / file, fs::copy_options::overwrite_existing);
    write_file(dir / "tokenizer.json", qwen_like_tokenizer().dump());
  }
  return dir;
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
