// anvil preflight end to end against the real `anvil serve`: every protocol check passes on a
// healthy server (harmony and ChatML), the quality checks fail honestly on random-weight models,
// and each deliberately broken server (a proxy that drops or mangles one thing) fails the check
// that should catch it, with that check's reason.
#include <gtest/gtest.h>

#include "instant_server.h"
#include "support/server_harness.h"

namespace anvil::test {
namespace {

struct Preflight {
  CommandResult command;
  Json json;
  const Json* check(const std::string& name) const {
    for (const Json& c : json["checks"])
      if (c["name"] == name) return &c;
    return nullptr;
  }
};

// Runs `anvil preflight ... --json`; stdout must be exactly one JSON object.
Preflight preflight(const std::string& base_url, const std::string& model, const std::string& args,
                    const std::string& notebook = "") {
  Preflight out;
  out.command = run_anvil("preflight --base-url " + base_url + " --model " + model + " --json --seed 7 --max-tokens 48 " + args +
                          (notebook.empty() ? " --no-notebook" : " --notebook '" + notebook + "'"));
  out.json = Json::parse(out.command.out, nullptr, false);
  EXPECT_TRUE(out.json.is_object() && out.json.contains("checks") && out.json.contains("passed"))
      << "stdout is not one preflight object:\n"
      << out.command.out << "\nstderr:\n"
      << out.command.err;
  if (!out.json.is_object()) out.json = {{"checks", Json::array()}, {"passed", false}};
  return out;
}

std::string url(const ServerProcess& server) { return "http://127.0.0.1:" + std::to_string(server.port()); }

void expect_protocol_checks_pass(const Preflight& p) {
  for (const Json& c : p.json["checks"]) {
    if (c["quality"].get<bool>()) continue;
    EXPECT_TRUE(c["passed"].get<bool>()) << c["name"] << ": " << c["reason"] << " (" << c["detail"] << ")";
  }
}

// The quality checks need a capable model; random weights fail them, each for its stated reason.
void expect_quality_checks_fail_honestly(const Preflight& p) {
  const Json* smoke = p.check("smoke");
  ASSERT_TRUE(smoke);
  EXPECT_FALSE((*smoke)["passed"].get<bool>());
  EXPECT_TRUE((*smoke)["reason"] == "answer does not contain a Python function add" ||
              (*smoke)["reason"] == "no answer within max_tokens")
      << *smoke;
  const Json* needle = p.check("needle");
  ASSERT_TRUE(needle);
  EXPECT_FALSE((*needle)["passed"].get<bool>());
  EXPECT_EQ((*needle)["reason"], "answer does not contain the code word") << *needle;
  const Json* arguments = p.check("tool_arguments");
  ASSERT_TRUE(arguments);
  EXPECT_FALSE((*arguments)["passed"].get<bool>());
  EXPECT_EQ((*arguments)["reason"], "a call had the wrong tool or arguments") << *arguments;
}

TEST(ToolsPreflight, HealthyHarmonyServerPassesEveryProtocolCheck) {
  ServerProcess& server = demo_server();
  TempDir dir;
  const auto notebook = dir.path() / "notebook.sqlite";
  const Preflight p = preflight(url(server), "demo", "--needle-ctx 384 --tool-batch 4", notebook.string());
  EXPECT_EQ(p.command.exit_code, 1) << "random weights fail the quality checks, so the command fails";
  ASSERT_EQ(p.json["checks"].size(), 9u) << p.json.dump(2);
  expect_protocol_checks_pass(p);
  expect_quality_checks_fail_honestly(p);
  EXPECT_FALSE(p.json["passed"].get<bool>());
  EXPECT_EQ(p.json["engine"], "anvil 0.1.0");
  // Progress went to stderr, and the run to the notebook.
  EXPECT_NE(p.command.err.find("preflight: needle"), std::string::npos);
  const CommandResult table = run_anvil("notebook --notebook '" + notebook.string() + "'");
  EXPECT_NE(table.out.find("| demo |"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("no (smoke, needle, tool_arguments)"), std::string::npos) << table.out;
}

TEST(ToolsPreflight, HealthyChatMlServerPassesEveryProtocolCheck) {
  ServerProcess& server = qwen_server();
  const Preflight p = preflight(url(server), "qwen", "--needle-ctx 384 --tool-batch 4");
  ASSERT_EQ(p.json["checks"].size(), 9u) << p.json.dump(2);
  expect_protocol_checks_pass(p);
  expect_quality_checks_fail_honestly(p);
}

TEST(ToolsPreflight, NoThinkingIsHonouredByChatMl) {
  ServerProcess& server = qwen_server();
  const Preflight p = preflight(url(server), "qwen", "--no-thinking --checks reasoning,stream_equivalence");
  EXPECT_EQ(p.command.exit_code, 0) << p.json.dump(2);
  const Json* reasoning = p.check("reasoning");
  ASSERT_TRUE(reasoning);
  EXPECT_EQ((*reasoning)["detail"], "no reasoning, as asked") << *reasoning;
}

TEST(ToolsPreflight, TextReportHasALinePerCheck) {
  ServerProcess& server = demo_server();
  const CommandResult r = run_anvil("preflight --no-notebook --base-url " + url(server) +
                                    " --model demo --max-tokens 32 --checks models,structured_json,needle --needle-ctx 256");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("PASS  models"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS  structured_json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL  needle               answer does not contain the code word"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 of 3 checks passed"), std::string::npos) << r.out;
  const CommandResult ok = run_anvil("preflight --no-notebook --base-url " + url(server) + " --model demo --checks models");
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
}

struct BrokenCase {
  BrokenProxy::Mode mode;
  std::string check, reason;
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.check << " -> \"" << c.reason << "\""; }

class ToolsPreflightBroken : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(ToolsPreflightBroken, FailsTheCheckThatCatchesIt) {
  const BrokenCase& c = GetParam();
  ServerProcess& server = demo_server();
  BrokenProxy proxy(server.port(), c.mode);
  const Preflight p = preflight(proxy.base_url(), "demo", "--tool-batch 3 --checks " + c.check);
  EXPECT_EQ(p.command.exit_code, 1);
  const Json* check = p.check(c.check);
  ASSERT_TRUE(check) << p.json.dump(2);
  EXPECT_FALSE((*check)["passed"].get<bool>());
  EXPECT_EQ((*check)["reason"], c.reason) << *check;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ToolsPreflightBroken,
    ::testing::Values(
        BrokenCase{BrokenProxy::Mode::kDropResponseFormat, "structured_json",
                   "reply is not JSON: response_format was accepted but not applied"},
        BrokenCase{BrokenProxy::Mode::kReasoningInContent, "reasoning", "reasoning markup leaked into content"},
        BrokenCase{BrokenProxy::Mode::kCopyReasoning, "reasoning", "content repeats the chain of thought"},
        BrokenCase{BrokenProxy::Mode::kStreamDiffers, "stream_equivalence", "streamed reply differs from the non-streamed one"},
        BrokenCase{BrokenProxy::Mode::kDropTools, "tool_calls", "a call did not come back in tool_calls"},
        BrokenCase{BrokenProxy::Mode::kDropStop, "stop_finish", "the stop string was not honoured"}),
    [](const ::testing::TestParamInfo<BrokenCase>& param_info) {
      std::string name = param_info.param.check + "_" + std::to_string(param_info.index);
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

TEST(ToolsPreflight, APassThroughProxyChangesNothing) {
  ServerProcess& server = demo_server();
  BrokenProxy proxy(server.port(), BrokenProxy::Mode::kPassThrough);
  const Preflight p = preflight(proxy.base_url(), "demo", "--checks structured_json,reasoning,stream_equivalence,stop_finish");
  EXPECT_EQ(p.command.exit_code, 0) << p.json.dump(2);
  expect_protocol_checks_pass(p);
}

TEST(ToolsPreflight, UnreachableServerIsOneFailedCheck) {
  const Preflight p = preflight("http://127.0.0.1:1", "x", "");
  EXPECT_EQ(p.command.exit_code, 1);
  ASSERT_EQ(p.json["checks"].size(), 1u);
  EXPECT_EQ(p.json["checks"][0]["reason"], "the server cannot be reached");
  EXPECT_FALSE(p.json["passed"].get<bool>());
}

}  // namespace
}  // namespace anvil::test
