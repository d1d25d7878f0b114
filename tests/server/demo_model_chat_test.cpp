// The shipped demo model served as the README's first command serves it: held-out questions
// (known commands, phrasings never seen in training) through the harmony chat path, greedy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "support/server_harness.h"

namespace anvil::test {
namespace {

const std::filesystem::path kDemo = std::filesystem::path(ANVIL_SOURCE_DIR) / "models" / "demo";

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return text;
}

TEST(DemoModelChat, HeldOutQuestionsGetKeywordAnswersWithReasoningSplitOut) {
  ServerProcess server({kDemo.string(), "--served-model-name", "demo", "--kv-cache-memory", "0.25"});
  ASSERT_TRUE(server.wait_ready(120)) << server.log();
  const Json heldout = Json::parse(read_file(kDemo / "eval" / "heldout_questions.json"));
  const Json& questions = heldout.at("questions");
  ASSERT_GE(questions.size(), 20u);
  int hits = 0;
  std::string misses;
  for (const Json& q : questions) {
    const Json body = {{"model", "demo"},
                       {"messages", {{{"role", "user"}, {"content", q.at("question")}}}},
                       {"temperature", 0},
                       {"max_tokens", 128}};
    const HttpResult reply = post(server, "/v1/chat/completions", body);
    ASSERT_EQ(reply.status, 200) << reply.body;
    const Json& message = reply.json.at("choices").at(0).at("message");
    const std::string content = message.value("content", std::string());
    const std::string reasoning = message.value("reasoning_content", std::string());
    // The analysis channel goes to reasoning_content and nowhere else.
    EXPECT_FALSE(reasoning.empty()) << q.at("question") << ": " << reply.body;
    EXPECT_EQ(content.find("<|"), std::string::npos) << reply.body;
    EXPECT_EQ(content.find("The user"), std::string::npos) << reply.body;
    if (!reasoning.empty()) {
      EXPECT_EQ(content.find(reasoning), std::string::npos) << reply.body;
    }
    bool hit = false;
    for (const Json& keyword : q.at("keywords")) hit = hit || lower(content).find(keyword.get<std::string>()) != std::string::npos;
    hits += hit;
    if (!hit) misses += "\n  " + q.at("question").get<std::string>() + " -> " + content;
  }
  EXPECT_GE(hits, 14) << hits << "/" << questions.size() << " answers name a man-page keyword; misses:" << misses;
  std::printf("demo model: %d/%zu held-out answers contain a man-page keyword%s\n", hits, questions.size(),
              misses.c_str());
}

}  // namespace
}  // namespace anvil::test
