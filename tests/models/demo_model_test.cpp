// The shipped demo model (models/demo) against what its training tool computed in PyTorch:
// tokenizer ids, logits of the exported weights, and held-out perplexity through `anvil perplexity`.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "models/model.h"
#include "support/test_support.h"

namespace anvil {
namespace {

const std::filesystem::path kDemo = std::filesystem::path(ANVIL_SOURCE_DIR) / "models" / "demo";

nlohmann::json read_json(const std::filesystem::path& path) { return nlohmann::json::parse(test::read_file(path)); }

TEST(DemoModel, TokenizerMatchesTheTrainingTokenizer) {
  // The ids the `tokenizers` library produced for the held-out text and a few probes.
  const auto tokenizer = Tokenizer::from_file(kDemo / "tokenizer.json");
  const auto check = read_json(kDemo / "eval" / "tokenizer_check.json");
  const std::string text = test::read_file(kDemo / "eval" / "heldout_text.txt");
  EXPECT_EQ(tokenizer->encode(text, false), check.at("heldout_text_ids").get<std::vector<int32_t>>());
  for (const auto& probe : check.at("probes"))
    EXPECT_EQ(tokenizer->encode(probe.at("text").get<std::string>(), false), probe.at("ids").get<std::vector<int32_t>>())
        << probe.at("text");
  for (const char* special : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"})
    EXPECT_TRUE(tokenizer->token_id(special).has_value()) << special;
}

TEST(DemoModel, LogitsMatchPyTorchReference) {
  // PyTorch ran the exported weights in float32 (bf16 upcast, MXFP4 decoded); transformers'
  // GptOssForCausalLM agreed with it to 1.3e-5. The logits here span about +-30, so 2e-3 absolute
  // is ~1e-4 relative: summation order, not a different computation.
  constexpr float kTolerance = 2e-3f;
  auto model = load_model(kDemo);
  const auto reference = read_json(kDemo / "eval" / "reference.json");
  const SafetensorsFile logits_file(kDemo / "eval" / "reference_logits.safetensors");
  const int64_t vocab = model->config().vocab_size;
  for (const auto& c : reference.at("cases")) {
    const auto ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto positions = c.at("positions").get<std::vector<int64_t>>();
    const TensorView& want = logits_file.tensor(c.at("logits_tensor").get<std::string>());
    ASSERT_EQ(want.shape, (std::vector<int64_t>{int64_t(positions.size()), vocab}));
    const std::vector<float> got = prompt_logits(*model, ids);
    for (size_t p = 0; p < positions.size(); ++p) {
      const float* expected = static_cast<const float*>(want.data) + p * size_t(vocab);
      const float* actual = got.data() + size_t(positions[p]) * size_t(vocab);
      float worst = 0;
      for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(expected[v] - actual[v]));
      EXPECT_LE(worst, kTolerance) << c.at("logits_tensor") << " position " << positions[p];
    }
  }
}

TEST(DemoModel, PerplexityWithinOnePercentOfPyTorch) {
  const auto eval = read_json(kDemo / "eval" / "eval.json").at("heldout_perplexity");
  const auto result = test::run_anvil("perplexity --model '" + kDemo.string() + "' --file '" +
                                      (kDemo / "eval" / "heldout_text.txt").string() + "' --ctx " +
                                      std::to_string(eval.at("ctx").get<int>()) + " --stride " +
                                      std::to_string(eval.at("stride").get<int>()) + " --json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto out = nlohmann::json::parse(result.out);
  EXPECT_EQ(out.at("scored_tokens").get<int64_t>(), eval.at("scored_tokens").get<int64_t>());
  const double want = eval.at("mxfp4_experts").get<double>();
  const double got = out.at("perplexity").get<double>();
  EXPECT_LE(std::fabs(got - want) / want, 0.01) << "anvil " << got << ", PyTorch " << want;
}

TEST(DemoModel, PerplexityRejectsBadOptions) {
  const std::string model = "--model '" + kDemo.string() + "' ";
  const auto missing = test::run_anvil("perplexity " + model + "--file /nonexistent/text.txt");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/text.txt: cannot read"), std::string::npos) << missing.err;
  const auto stride = test::run_anvil("perplexity " + model + "--file '" +
                                      (kDemo / "eval" / "heldout_text.txt").string() + "' --ctx 64 --stride 65");
  EXPECT_NE(stride.exit_code, 0);
  EXPECT_NE(stride.err.find("--stride must be from 1 to --ctx (64), got 65"), std::string::npos) << stride.err;
}

// run_anvil() gives the child an empty stdin; chat reads its turns from stdin, so it runs here.
test::CommandResult run_chat(const std::filesystem::path& dir, const std::string& flags) {
  const auto out = dir / "out", err = dir / "err";
  const std::string command = std::string("'") + ANVIL_BINARY + "' chat --model '" + kDemo.string() + "' " + flags +
                              " <'" + (dir / "questions.txt").string() + "' >'" + out.string() + "' 2>'" +
                              err.string() + "'";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, test::read_file(out), test::read_file(err)};
}

TEST(DemoModel, ChatAnswersOnStdoutAndReasonsOnStderr) {
  const test::TempDir dir;
  test::write_file(dir.path() / "questions.txt", "What does grep do?\n");
  const auto chat = run_chat(dir.path(), "");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.out.find("print lines that match patterns"), std::string::npos) << chat.out;
  EXPECT_EQ(chat.out.find("The user"), std::string::npos) << chat.out;
  EXPECT_EQ(chat.out.find("<|"), std::string::npos) << chat.out;
  EXPECT_NE(chat.err.find("grep"), std::string::npos) << chat.err;
  const auto hidden = run_chat(dir.path(), "--hide-reasoning");
  ASSERT_EQ(hidden.exit_code, 0) << hidden.err;
  EXPECT_EQ(hidden.out, chat.out);
  EXPECT_EQ(hidden.err.find("grep"), std::string::npos) << hidden.err;
}

}  // namespace
}  // namespace anvil
