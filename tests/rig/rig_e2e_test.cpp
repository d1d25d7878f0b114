// `anvil rig` with real backends: `anvil serve` processes on the tiny fixtures (and plain
// commands where a misbehaving backend is the point) behind one rig started as a child process.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <regex>
#include <thread>

#include "rig/process.h"
#include "rig/rig_harness.h"

namespace anvil::test {
namespace {

namespace fs = std::filesystem;

// Small KV caches and one thread each: several backends share a 2-core machine.
std::string anvil_model(const std::string& name, const fs::path& dir, const std::string& extra = "") {
  return fmt::format("  {}:\n    model: {}\n    args: [--kv-cache-memory, \"0.0625\", --threads, \"1\"]\n    start_timeout: 60\n{}",
                     name, dir.string(), extra);
}

std::string header(const TempDir& dir, const std::string& extra = "") {
  return fmt::format("listen: 127.0.0.1:0\nstate_dir: {}\nstop_timeout: 5\ndrain_timeout: 30\n{}models:\n",
                     (dir.path() / "state").string(), extra);
}

Json completion(const std::string& model, int max_tokens) {
  return {{"model", model}, {"prompt", {1, 2, 3}}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"temperature", 0}};
}

// A listening socket on a free loopback port, held by this (test) process.
struct HeldPort {
  int port = 0;
  int fd = listen_loopback(port, 4);
  ~HeldPort() { close(fd); }
};

int free_port() {
  HeldPort held;
  return held.port;
}

TEST(RigE2E, AliasesRoutingStreamingAndObservability) {
  TempDir dir;
  RigProcess rig(dir.path(), header(dir) + anvil_model("tiny", tiny_model_dir(), "    aliases: [llama3]\n") +
                                 anvil_model("qwen", qwen_tiny_dir()));
  ASSERT_GT(rig.port(), 0) << rig.log();

  EXPECT_EQ(rig.get("/health").status, 200);
  const HttpResult models = rig.get("/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  std::map<std::string, std::string> roots;
  for (const auto& card : models.json["data"]) roots[card["id"]] = card["root"];
  EXPECT_EQ(roots, (std::map<std::string, std::string>{{"tiny", "tiny"}, {"llama3", "tiny"}, {"qwen", "qwen"}}));
  EXPECT_EQ(rig.backend("tiny")["state"], "stopped");  // started on first request, not before

  const HttpResult aliased = rig.post("/v1/completions", completion("llama3", 3));
  ASSERT_EQ(aliased.status, 200) << aliased.body << rig.log();
  EXPECT_EQ(aliased.json["model"], "tiny");
  EXPECT_EQ(aliased.json["usage"]["completion_tokens"], 3);
  EXPECT_EQ(rig.backend("tiny")["state"], "ready");
  EXPECT_EQ(rig.backend("qwen")["state"], "stopped");  // its own group: untouched

  const HttpResult unknown = rig.post("/v1/completions", completion("gpt-5", 3));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.json["error"]["message"], "The model `gpt-5` does not exist.");
  EXPECT_EQ(unknown.json["error"]["code"], 404);
  EXPECT_EQ(rig.post("/v1/completions", Json{{"prompt", "x"}}).status, 400);

  // A stream through the rig carries the same text as the backend sends directly. (Event counts
  // may differ: the server merges tokens that pile up between two writes into one event.)
  Json body = {{"model", "qwen"}, {"prompt", "hello there"}, {"max_tokens", 12}, {"ignore_eos", true},
               {"temperature", 0}, {"stream", true}};
  const SseStream through = rig.stream(body);
  ASSERT_EQ(through.status, 200) << through.raw;
  EXPECT_TRUE(through.done);
  const Json qwen = rig.backend("qwen");
  ASSERT_EQ(qwen["state"], "ready");
  httplib::Client direct("127.0.0.1", qwen["port"].get<int>());
  direct.set_read_timeout(60, 0);
  const auto direct_result = direct.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(direct_result);
  ASSERT_EQ(direct_result->status, 200) << direct_result->body;
  const SseStream straight = parse_sse(direct_result->status, direct_result->body);
  auto text_of = [](const SseStream& stream) {
    std::string text;
    for (const auto& event : stream.events) text += event["choices"][0].value("text", "");
    return text;
  };
  EXPECT_FALSE(text_of(through).empty());
  EXPECT_EQ(text_of(through), text_of(straight));
  ASSERT_FALSE(through.events.empty());
  EXPECT_EQ(through.events.back()["choices"][0]["finish_reason"], "length");

  const HttpResult metrics = rig.get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("anvil_rig_backend_state{model=\"tiny\",state=\"ready\"} 1"), std::string::npos) << metrics.body;
  EXPECT_EQ(metric_value(metrics.body, "anvil_rig_backend_starts_total"), 2);
  EXPECT_NE(metrics.body.find("anvil_rig_requests_total{model=\"tiny\",code=\"200\"} 1"), std::string::npos);
  // Recorded once the upstream call has wound down, a moment after the client saw [DONE].
  EXPECT_TRUE(wait_until(5, [&] { return metric_value(rig.get("/metrics").body, "anvil_rig_proxy_request_seconds_count") == 2; }));

  const Json running = rig.backend("tiny");
  EXPECT_GT(running["pid"].get<int>(), 0);
  EXPECT_GE(running["uptime_s"].get<double>(), 0);
  EXPECT_EQ(running["last_error"], nullptr);

  const std::string state = (dir.path() / "state").string();
  const auto ps = run_anvil("rig ps --state-dir '" + state + "'");
  EXPECT_EQ(ps.exit_code, 0) << ps.err;
  EXPECT_TRUE(std::regex_search(ps.out, std::regex(R"(\ntiny +tiny +ready +\d+)"))) << ps.out;
  const auto logs = run_anvil("rig logs qwen --state-dir '" + state + "'");
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_NE(logs.out.find("--- anvil rig: starting qwen on port"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("serving"), std::string::npos) << logs.out;  // the backend's own log lines
  const auto missing = run_anvil("rig logs nope --state-dir '" + state + "'");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("no log for model nope (logs here: "), std::string::npos) << missing.err;

  // A clean stop takes the backends down with the rig.
  const pid_t backend_pid = running["pid"].get<int>();
  EXPECT_EQ(rig.stop(), 0) << rig.log();
  EXPECT_FALSE(process_alive(backend_pid));
  EXPECT_FALSE(fs::exists(dir.path() / "state" / "backends" / "tiny.json"));
  EXPECT_NE(run_anvil("rig ps --state-dir '" + state + "'").out.find("no rig is running"), std::string::npos);
}

TEST(RigE2E, ApiKeyGuardsV1Routes) {
  TempDir dir;
  RigProcess rig(dir.path(), header(dir, "api_key: sesame\n") + "  x:\n    command: [sleep, \"100\", \"${PORT}\"]\n");
  ASSERT_GT(rig.port(), 0) << rig.log();
  const HttpResult denied = rig.post("/v1/completions", completion("x", 1));
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(denied.json["error"]["code"], 401);
  EXPECT_EQ(rig.post("/v1/completions", completion("nope", 1), {{"Authorization", "Bearer sesame"}}).status, 404);
  EXPECT_EQ(rig.get("/health").status, 200);
  EXPECT_EQ(rig.backend("x")["starts"], 0);  // a denied request starts nothing
}

TEST(RigE2E, GroupSwapLetsTheInFlightRequestFinish) {
  TempDir dir;
  RigProcess rig(dir.path(), header(dir) + anvil_model("tiny", tiny_model_dir(), "    group: gpu0\n") +
                                 anvil_model("qwen", qwen_tiny_dir(), "    group: gpu0\n"));
  ASSERT_GT(rig.port(), 0) << rig.log();
  ASSERT_EQ(rig.post("/v1/completions", completion("tiny", 1)).status, 200) << rig.log();

  // A long stream on tiny; qwen is asked for while it runs.
  Json long_body = completion("tiny", 3000);
  long_body["stream"] = true;
  auto long_stream = std::async(std::launch::async, [&] { return rig.stream(long_body); });
  ASSERT_TRUE(wait_until(30, [&] { return rig.backend("tiny")["in_flight"] == 1; })) << rig.log();
  auto swapped = std::async(std::launch::async, [&] { return rig.post("/v1/completions", completion("qwen", 4)); });
  ASSERT_TRUE(wait_until(10, [&] { return rig.backend("tiny")["state"] != "ready"; }));
  const Json during = rig.backend("tiny");
  const bool still_running = during["in_flight"] == 1;

  const SseStream finished = long_stream.get();
  ASSERT_EQ(finished.status, 200);
  EXPECT_TRUE(finished.done) << "the in-flight stream was cut: " << finished.raw.substr(0, 300);
  ASSERT_FALSE(finished.events.empty());
  EXPECT_EQ(finished.events.back()["choices"][0]["finish_reason"], "length");
  const HttpResult answer = swapped.get();
  ASSERT_EQ(answer.status, 200) << answer.body << rig.log();
  EXPECT_EQ(answer.json["model"], "qwen");

  // The supervisor settles both states on its own thread; the answer can reach us a moment earlier.
  EXPECT_TRUE(wait_until(10, [&] {
    return rig.backend("tiny")["state"] == "stopped" && rig.backend("qwen")["state"] == "ready";
  })) << rig.get("/running").body << rig.log();
  EXPECT_EQ(rig.backend("qwen")["swaps"], 1);
  // Whether the swap overlapped the stream is what this test is about; say if it did not.
  EXPECT_TRUE(still_running) << "tiny finished 3000 tokens before the swap began; the drain was not exercised: "
                             << during.dump();
  EXPECT_NE(rig.log().find("draining tiny (1 in flight) for qwen"), std::string::npos) << rig.log();

  // And back: tiny's request swaps qwen out again.
  ASSERT_EQ(rig.post("/v1/completions", completion("tiny", 2)).status, 200);
  EXPECT_TRUE(wait_until(10, [&] { return rig.backend("qwen")["state"] == "stopped"; })) << rig.get("/running").body;
  EXPECT_EQ(rig.backend("tiny")["swaps"], 1);
}

TEST(RigE2E, KilledBackendComesBack) {
  TempDir dir;
  RigProcess rig(dir.path(), header(dir) + anvil_model("tiny", tiny_model_dir()));
  ASSERT_GT(rig.port(), 0) << rig.log();
  ASSERT_EQ(rig.post("/v1/completions", completion("tiny", 2)).status, 200) << rig.log();
  const pid_t first = rig.backend("tiny")["pid"].get<int>();
  ASSERT_EQ(kill(first, SIGKILL), 0);

  ASSERT_TRUE(wait_until(10, [&] { return rig.backend("tiny")["crashes"] == 1; })) << rig.log();
  EXPECT_NE(rig.backend("tiny")["last_error"].get<std::string>().find("was killed by signal"), std::string::npos);
  // Back after the backoff by itself; the next request succeeds either way.
  ASSERT_TRUE(wait_until(20, [&] { return rig.backend("tiny")["state"] == "ready"; })) << rig.log();
  const HttpResult again = rig.post("/v1/completions", completion("tiny", 2));
  EXPECT_EQ(again.status, 200) << again.body;
  const Json status = rig.backend("tiny");
  EXPECT_EQ(status["restarts"], 1);
  EXPECT_EQ(status["starts"], 2);
  EXPECT_NE(status["pid"].get<int>(), first);
  EXPECT_EQ(metric_value(rig.get("/metrics").body, "anvil_rig_backend_crashes_total"), 1);
}

TEST(RigE2E, BackendThatNeverBecomesReadyTimesOut) {
  TempDir dir;
  const int dead_port = free_port();
  RigProcess rig(dir.path(), header(dir) + fmt::format("  sleepy:\n    command: [sleep, \"100\"]\n    port: {}\n"
                                                       "    health: /health\n    start_timeout: 2\n",
                                                       dead_port));
  ASSERT_GT(rig.port(), 0) << rig.log();
  const auto started = std::chrono::steady_clock::now();
  const HttpResult result = rig.post("/v1/chat/completions", Json{{"model", "sleepy"}, {"messages", Json::array()}});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(result.status, 503) << result.body;
  const std::string message = result.json["error"]["message"];
  EXPECT_NE(message.find(fmt::format("model sleepy did not become ready within 2 s (start_timeout): GET "
                                     "http://127.0.0.1:{}/health last gave: ",
                                     dead_port)),
            std::string::npos)
      << message;
  EXPECT_GE(waited, 1.9);
  EXPECT_LT(waited, 10);
  // The sleep is stopped, its pid file gone.
  std::smatch match;
  const std::string log = rig.log();
  ASSERT_TRUE(std::regex_search(log, match, std::regex(R"(starting sleepy \(pid (\d+))"))) << log;
  const pid_t sleeper = std::stoi(match[1]);
  EXPECT_TRUE(wait_until(10, [&] { return !process_alive(sleeper); }));
  EXPECT_TRUE(wait_until(5, [&] { return !fs::exists(dir.path() / "state" / "backends" / "sleepy.json"); }));
  EXPECT_EQ(rig.backend("sleepy")["start_failures"], 1);
}

TEST(RigE2E, PortHeldByAnotherProcessIsReported) {
  TempDir dir;
  HeldPort held;
  RigProcess rig(dir.path(), header(dir) + anvil_model("tiny", tiny_model_dir(), fmt::format("    port: {}\n", held.port)));
  ASSERT_GT(rig.port(), 0) << rig.log();
  const HttpResult result = rig.post("/v1/completions", completion("tiny", 2));
  EXPECT_EQ(result.status, 503);
  EXPECT_NE(result.json["error"]["message"].get<std::string>().find(
                fmt::format("port {} is held by another process, pid {} (", held.port, getpid())),
            std::string::npos)
      << result.body;
  EXPECT_NE(result.header("Retry-After"), "");
  EXPECT_EQ(rig.backend("tiny")["starts"], 0);
}

TEST(RigE2E, RigKilledWithSigkillLeavesNothingThatBreaksTheNextStart) {
  TempDir dir;
  const int port = free_port();
  // A wrapper that shrugs off SIGTERM, as scripts around engines often do: when the rig dies it
  // stays, and so does the server under it, holding the model's fixed port.
  const std::string model = fmt::format(
      "  tiny:\n    command: [sh, -c, 'trap \"\" TERM; \"$0\" serve \"$1\" --host 127.0.0.1 --port \"$2\" "
      "--served-model-name tiny --kv-cache-memory 0.0625 --threads 1', {}, {}, '${{PORT}}']\n"
      "    port: {}\n    preload: true\n    start_timeout: 60\n",
      ANVIL_BINARY, tiny_model_dir().string(), port);
  const std::string yaml = header(dir) + model;
  pid_t leftover = 0;
  {
    RigProcess first(dir.path(), yaml);
    ASSERT_GT(first.port(), 0) << first.log();
    ASSERT_TRUE(wait_until(60, [&] { return first.backend("tiny")["state"] == "ready"; })) << first.log();
    leftover = first.backend("tiny")["pid"].get<int>();
    first.kill_hard();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(process_alive(leftover)) << "the wrapper should outlive the rig for this test to mean anything";
  EXPECT_FALSE(rig::port_free("127.0.0.1", port));

  // A stale pid file naming a process the rig never started: it must be left alone.
  const pid_t stranger = fork();
  if (stranger == 0) {
    execlp("sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  write_file(dir.path() / "state" / "backends" / "ghost.json",
             Json{{"name", "ghost"}, {"pid", stranger}, {"start_time", 1}, {"token", "not-a-live-token"}, {"port", 1}}.dump());

  RigProcess second(dir.path(), yaml);
  ASSERT_GT(second.port(), 0) << second.log();
  EXPECT_NE(second.log().find(fmt::format("earlier rig: tiny: stopping 2 process(es) an earlier rig started")),
            std::string::npos)
      << second.log();
  EXPECT_NE(second.log().find(fmt::format("ghost: pid {} from an earlier rig is now another process; left it alone", stranger)),
            std::string::npos)
      << second.log();
  EXPECT_FALSE(process_alive(leftover));
  EXPECT_TRUE(process_alive(stranger));
  kill(stranger, SIGKILL);
  waitpid(stranger, nullptr, 0);
  ASSERT_TRUE(wait_until(60, [&] { return second.backend("tiny")["state"] == "ready"; })) << second.log();
  const HttpResult answer = second.post("/v1/completions", completion("tiny", 2));
  EXPECT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(second.backend("tiny")["port"], port);
}

}  // namespace
}  // namespace anvil::test
