#include "support/server_harness.h"

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

pid_t start_anvil(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv = {ANVIL_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    FILE* out = std::fopen(log.c_str(), "a");
    if (out) {
      dup2(fileno(out), STDOUT_FILENO);
      dup2(fileno(out), STDERR_FILENO);
    }
    std::vector<char*> raw;
    for (std::string& arg : argv) raw.push_back(arg.data());
    raw.push_back(nullptr);
    execv(raw[0], raw.data());
    _exit(127);
  }
  return pid;
}

int wait_for_port(pid_t& pid, const fs::path& log, double timeout_s) {
  const std::regex serving(R"(on http://127\.0\.0\.1:(\d+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && child_running(pid)) {
    std::smatch match;
    const std::string text = read_log(log);
    if (std::regex_search(text, match, serving)) return std::stoi(match[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

bool child_running(pid_t& pid) {
  if (pid <= 0) return false;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    pid = -1;
    return false;
  }
  return true;
}

int stop_child(pid_t& pid, double timeout_s) {
  if (pid <= 0) return -1;
  kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
  return -1;
}

std::string read_log(const fs::path& log) {
  std::ifstream in(log, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

httplib::Client loopback_client(int port, int timeout_s) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(timeout_s, 0);
  client.set_write_timeout(timeout_s, 0);
  client.set_connection_timeout(10, 0);
  return client;
}

ServerProcess::ServerProcess(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--port", "0", "--host", "127.0.0.1"});
  const fs::path log_path = dir_.path() / "server.log";
  pid_ = start_anvil(argv, log_path);
  port_ = wait_for_port(pid_, log_path, 60);
  if (port_ == 0) return;
  auto probe = client(5);
  if (auto health = probe.Get("/health")) first_health_ = health->status;
}

ServerProcess::~ServerProcess() { stop(); }

std::string ServerProcess::log() const { return read_log(dir_.path() / "server.log"); }

bool ServerProcess::alive() { return child_running(pid_); }

int ServerProcess::stop() { return stop_child(pid_, 15); }

httplib::Client ServerProcess::client(int timeout_s) const { return loopback_client(port_, timeout_s); }

bool ServerProcess::wait_ready(double timeout_s) {
  if (port_ == 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto c = client(5);
  while (std::chrono::steady_clock::now() < deadline && alive()) {
    if (auto result = c.Get("/health"); result && result->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

namespace {

ServerProcess& started(std::unique_ptr<ServerProcess>& slot, const std::vector<std::string>& args) {
  if (!slot) {
    slot = std::make_unique<ServerProcess>(args);
    if (!slot->wait_ready(180)) throw std::runtime_error("anvil serve did not become ready:\n" + slot->log());
  }
  return *slot;
}

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest map to U+0100 on.
std::string byte_level_char(int byte) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int codepoint = byte;
  if (!printable(byte)) {
    codepoint = 256;
    for (int c = 0; c < byte; ++c) codepoint += !printable(c);
  }
  std::string out;
  if (codepoint < 0x80) {
    out += char(codepoint);
  } else {
    out += char(0xC0 | (codepoint >> 6));
    out += char(0x80 | (codepoint & 0x3F));
  }
  return out;
}

TempDir& model_scratch() {
  static TempDir dir;
  return dir;
}

}  // namespace

fs::path tiny_model_dir() { return fixtures_dir() / "gpt-oss-tiny"; }

Json qwen_like_tokenizer() {
  Json vocab = Json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[byte_level_char(byte)] = byte;
  Json added = Json::array();
  const std::vector<std::pair<std::string, bool>> tokens = {{"<|endoftext|>", true}, {"<|im_start|>", true},
                                                            {"<|im_end|>", true},    {"<tool_call>", false},
                                                            {"</tool_call>", false}, {"<think>", false},
                                                            {"</think>", false}};
  for (size_t i = 0; i < tokens.size(); ++i)
    added.push_back({{"id", 256 + int(i)}, {"content", tokens[i].first}, {"special", tokens[i].second},
                     {"normalized", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
  Json merges = Json::array();
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz {}\":,";
  int id = 263;
  for (size_t a = 0; a < letters.size() && id < 1024; ++a) {
    for (size_t b = 0; b < letters.size() && id < 1024; ++b) {
      const std::string left = byte_level_char(static_cast<unsigned char>(letters[a]));
      const std::string right = byte_level_char(static_cast<unsigned char>(letters[b]));
      merges.push_back(left + " " + right);
      vocab[left + right] = id++;
    }
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

ServerProcess& tiny_server() {
  static std::unique_ptr<ServerProcess> server;
  return started(server, {tiny_model_dir().string(), "--served-model-name", "tiny", "tiny-alias", "--kv-cache-memory",
                          "0.0625", "--max-body-bytes", "1048576"});
}

ServerProcess& demo_server() {
  static std::unique_ptr<ServerProcess> server;
  if (!server) {
    const fs::path dir = model_scratch().path() / "demo";
    const auto made = run_anvil("init-demo --out '" + dir.string() + "' --tokenizer '" + harmony_tokenizer_json().string() + "'");
    if (made.exit_code != 0) throw std::runtime_error("init-demo failed: " + made.err);
    return started(server, {dir.string(), "--served-model-name", "demo", "--kv-cache-memory", "0.25"});
  }
  return *server;
}

fs::path qwen_tiny_dir() {
  const fs::path dir = model_scratch().path() / "qwen3-tiny";
  if (!fs::exists(dir / "tokenizer.json")) {
    fs::create_directories(dir);
    for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
      fs::copy_file(fixtures_dir() / "qwen3-tiny" / file, dir / file, fs::copy_options::overwrite_existing);
    write_file(dir / "tokenizer.json", qwen_like_tokenizer().dump());
  }
  return dir;
}

ServerProcess& qwen_server() {
  static std::unique_ptr<ServerProcess> server;
  return started(server, {qwen_tiny_dir().string(), "--served-model-name", "qwen", "--kv-cache-memory", "0.0625"});
}

std::string HttpResult::header(const std::string& name) const {
  const auto found = headers.find(name);
  return found == headers.end() ? std::string() : found->second;
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

HttpResult post(int port, const std::string& path, const std::string& body, const httplib::Headers& headers) {
  auto client = loopback_client(port);
  return to_result(client.Post(path, headers, body, "application/json"));
}

HttpResult get(int port, const std::string& path, const httplib::Headers& headers) {
  auto client = loopback_client(port);
  return to_result(client.Get(path, headers));
}

HttpResult post(const ServerProcess& server, const std::string& path, const std::string& body, const httplib::Headers& headers) {
  return post(server.port(), path, body, headers);
}

HttpResult post(const ServerProcess& server, const std::string& path, const Json& body) {
  return post(server, path, body.dump());
}

HttpResult get(const ServerProcess& server, const std::string& path, const httplib::Headers& headers) {
  return get(server.port(), path, headers);
}

SseStream parse_sse(int status, const std::string& raw) {
  SseStream stream;
  stream.status = status;
  stream.raw = raw;
  size_t at = 0;
  while (at < raw.size()) {
    size_t end = raw.find("\n\n", at);
    if (end == std::string::npos) end = raw.size();
    const std::string event = raw.substr(at, end - at);
    at = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      stream.done = true;
      continue;
    }
    stream.events.push_back(Json::parse(data, nullptr, false));
  }
  return stream;
}

SseStream post_stream(int port, const std::string& path, const Json& body) {
  auto client = loopback_client(port);
  const auto result = client.Post(path, body.dump(), "application/json");
  if (!result) return {};
  return parse_sse(result->status, result->body);
}

SseStream post_stream(const ServerProcess& server, const std::string& path, const Json& body) {
  return post_stream(server.port(), path, body);
}

double metric_value(const std::string& text, const std::string& name) {
  double total = -1;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (line.substr(0, name_end) != name) continue;
    const size_t space = line.rfind(' ');
    total = (total < 0 ? 0 : total) + std::stod(line.substr(space + 1));
  }
  return total;
}

}  // namespace anvil::test
