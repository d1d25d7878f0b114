// The CLI contract our checks call, and its answers to bad input: one line naming the file,
// field or value, a non-zero exit code, and never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "support/test_support.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using test::run_anvil;

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

nlohmann::json first_case(const std::string& fixture, size_t index) {
  return nlohmann::json::parse(test::read_file(test::fixtures_dir() / fixture / "reference.json")).at("cases").at(index);
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
  return text;
}

// A failed run: exit code 1 (not a signal), one line on stderr that contains every `needles`.
void expect_clean_failure(const test::CommandResult& result, const std::vector<std::string>& needles) {
  EXPECT_EQ(result.exit_code, 1) << result.err;
  const std::string& err = result.err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  for (const auto& needle : needles) EXPECT_NE(err.find(needle), std::string::npos) << "missing '" << needle << "' in: " << err;
}

// A copy of a fixture directory that a test may damage.
fs::path copy_fixture(const test::TempDir& dir, const std::string& fixture) {
  const fs::path target = dir.path() / fixture;
  fs::create_directories(target);
  for (const auto& entry : fs::directory_iterator(test::fixtures_dir() / fixture))
    fs::copy_file(entry.path(), target / entry.path().filename());
  for (const auto& entry : fs::directory_iterator(target))
    fs::permissions(entry.path(), fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  return target;
}

TEST(CliGenerate, JsonGreedyMatchesReference) {
  const auto c = first_case("gpt-oss-tiny", 2);
  const auto result = run_anvil("generate --model " + quoted(test::fixtures_dir() / "gpt-oss-tiny") +
                                " --prompt-ids " + join_ids(c.at("prompt_ids").get<std::vector<int32_t>>()) +
                                " --max-tokens 24 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto out = nlohmann::json::parse(result.out);
  EXPECT_EQ(out.at("output_ids"), c.at("greedy_ids"));
  EXPECT_EQ(out.at("prompt_ids"), c.at("prompt_ids"));
  EXPECT_EQ(out.at("finish_reason"), "length");
  EXPECT_TRUE(out.at("text").is_string());
  EXPECT_GT(out.at("timings").at("prefill_tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(out.at("timings").at("decode_tokens_per_s").get<double>(), 0.0);
}

TEST(CliGenerate, StopsAtEosWithoutIgnoreEos) {
  // qwen3-tiny's eos is 3; pick a prompt and check that finish_reason agrees with the ids.
  const auto result = run_anvil("generate --model " + quoted(test::fixtures_dir() / "qwen3-tiny") +
                                " --prompt-ids 5,6,7 --max-tokens 40 --temperature 1.5 --seed 11 --json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto out = nlohmann::json::parse(result.out);
  const auto ids = out.at("output_ids").get<std::vector<int32_t>>();
  const bool stopped = !ids.empty() && ids.back() == 3;
  EXPECT_EQ(out.at("finish_reason"), stopped ? "stop" : "length");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 3), stopped ? 1 : 0);
}

TEST(CliGenerate, SameSeedSameOutput) {
  const std::string args = "generate --model " + quoted(test::fixtures_dir() / "qwen3moe-tiny") +
                           " --prompt-ids 10,20,30 --max-tokens 16 --temperature 1.0 --top-k 50 --top-p 0.9 "
                           "--min-p 0.01 --ignore-eos --json --seed ";
  const auto a = run_anvil(args + "1234"), b = run_anvil(args + "1234"), c = run_anvil(args + "99");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto ids_a = nlohmann::json::parse(a.out).at("output_ids");
  EXPECT_EQ(ids_a, nlohmann::json::parse(b.out).at("output_ids"));
  EXPECT_NE(ids_a, nlohmann::json::parse(c.out).at("output_ids"));
}

TEST(CliLogits, WritesReferenceLogits) {
  test::TempDir dir;
  const auto c = first_case("qwen3moe-tiny", 1);
  const fs::path out = dir.path() / "logits.safetensors";
  // bf16 RoPE frequencies reproduce how the Qwen3 references were made (see tests/models).
  const auto result = run_anvil("logits --model " + quoted(test::fixtures_dir() / "qwen3moe-tiny") + " --prompt-ids " +
                                join_ids(c.at("prompt_ids").get<std::vector<int32_t>>()) + " --out " + quoted(out) +
                                " --rope-freq-dtype bf16");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  SafetensorsFile got(out), want(test::fixtures_dir() / "qwen3moe-tiny" / "reference_logits.safetensors");
  const TensorView& g = got.tensor("logits");
  const TensorView& w = want.tensor(c.at("logits_tensor").get<std::string>());
  ASSERT_EQ(g.dtype, DType::F32);
  ASSERT_EQ(g.shape, w.shape);
  float worst = 0.0f;
  for (int64_t i = 0; i < g.numel(); ++i)
    worst = std::max(worst, std::fabs(static_cast<const float*>(g.data)[i] - static_cast<const float*>(w.data)[i]));
  EXPECT_LE(worst, 1e-3f);
}

TEST(CliTokenize, RoundTripsThroughTheHarmonyTokenizer) {
  const std::string tokenizer = quoted(test::harmony_tokenizer_json());
  const auto encoded = run_anvil("tokenize --tokenizer " + tokenizer + " --text 'Hello, world! <|start|>'");
  ASSERT_EQ(encoded.exit_code, 0) << encoded.err;
  const auto ids = nlohmann::json::parse(encoded.out).get<std::vector<int32_t>>();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 200006), 0) << "special token text became a control token";
  const auto special = run_anvil("tokenize --tokenizer " + tokenizer + " --allow-special --text '<|start|>'");
  EXPECT_EQ(nlohmann::json::parse(special.out), nlohmann::json::array({200006}));
  const auto decoded = run_anvil("detokenize --tokenizer " + tokenizer + " --ids " + join_ids(ids));
  ASSERT_EQ(decoded.exit_code, 0) << decoded.err;
  EXPECT_EQ(decoded.out, "Hello, world! <|start|>\n");
}

TEST(CliBadInput, MissingModelDirectory) {
  expect_clean_failure(run_anvil("generate --model /nonexistent/model --prompt-ids 1,2"), {"/nonexistent/model"});
}

TEST(CliBadInput, MissingWeights) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "qwen3-tiny");
  fs::remove(model / "model.safetensors");
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"), {"model.safetensors"});
}

TEST(CliBadInput, TruncatedSafetensors) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "qwen3-tiny");
  const std::string bytes = test::read_file(model / "model.safetensors");
  test::write_file(model / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"), {"model.safetensors"});
  test::write_file(model / "model.safetensors", bytes.substr(0, 5));
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"), {"model.safetensors"});
}

TEST(CliBadInput, CorruptSafetensorsHeader) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "qwen3-tiny");
  std::string bytes = test::read_file(model / "model.safetensors");
  bytes[8] = '#';  // the header's opening brace
  test::write_file(model / "model.safetensors", bytes);
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"), {"model.safetensors"});
}

TEST(CliBadInput, UnknownDtype) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "qwen3-tiny");
  std::string bytes = test::read_file(model / "model.safetensors");
  const size_t at = bytes.find("\"BF16\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 6, "\"XF16\"");
  test::write_file(model / "model.safetensors", bytes);
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"), {"model.safetensors", "XF16"});
}

TEST(CliBadInput, TensorShapeDisagreesWithConfig) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "qwen3-tiny");
  auto config = nlohmann::json::parse(test::read_file(model / "config.json"));
  config["intermediate_size"] = 300;
  test::write_file(model / "config.json", config.dump());
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"),
                       {"model.safetensors", "mlp.gate_proj.weight", "[320, 128]", "[300, 128]"});
}

TEST(CliBadInput, UnknownArchitecture) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "qwen3-tiny");
  auto config = nlohmann::json::parse(test::read_file(model / "config.json"));
  config["architectures"] = {"MambaForCausalLM"};
  test::write_file(model / "config.json", config.dump());
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt-ids 1,2"), {"config.json", "MambaForCausalLM"});
}

TEST(CliBadInput, PromptIdOutsideVocabulary) {
  expect_clean_failure(run_anvil("generate --model " + quoted(test::fixtures_dir() / "qwen3-tiny") + " --prompt-ids 1,5000"),
                       {"5000", "vocabulary"});
  expect_clean_failure(run_anvil("generate --model " + quoted(test::fixtures_dir() / "qwen3-tiny") + " --prompt-ids 1,x"),
                       {"--prompt-ids", "'x'"});
}

TEST(CliBadInput, InvalidUtf8PromptToGenerate) {
  test::TempDir dir;
  const fs::path model = copy_fixture(dir, "gpt-oss-tiny");
  fs::copy_file(test::harmony_tokenizer_json(), model / "tokenizer.json");
  expect_clean_failure(run_anvil("generate --model " + quoted(model) + " --prompt \"$(printf 'ab\\377cd')\""),
                       {"UTF-8", "byte offset 2"});
}

TEST(CliBadInput, InvalidUtf8Prompt) {
  expect_clean_failure(
      run_anvil("tokenize --tokenizer " + quoted(test::harmony_tokenizer_json()) + " --text \"$(printf 'ab\\377cd')\""),
      {"UTF-8"});
}

}  // namespace
}  // namespace anvil
