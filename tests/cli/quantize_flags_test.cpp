// --quantize-experts / --quantize-dense on the command line: bad values, and the combinations CUDA
// does not run, are refused in one line naming the flag; good values load and run.
#include <gtest/gtest.h>

#include <algorithm>

#include "support/test_support.h"

namespace anvil {
namespace {

std::string fixture(const std::string& name) { return "'" + (test::fixtures_dir() / name).string() + "'"; }

void expect_one_line_failure(const test::CommandResult& result, const std::vector<std::string>& needles) {
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  for (const auto& needle : needles) EXPECT_NE(result.err.find(needle), std::string::npos) << "missing '" << needle << "' in: " << result.err;
}

TEST(CliQuantizeFlags, BadValuesNameTheFlag) {
  const std::string generate = "generate --model " + fixture("gpt-oss-tiny") + " --prompt-ids 1,2 --max-tokens 2 --device cpu ";
  expect_one_line_failure(test::run_anvil(generate + "--quantize-experts int4"), {"--quantize-experts", "'int4'", "nvfp4"});
  expect_one_line_failure(test::run_anvil(generate + "--quantize-dense nvfp4"), {"--quantize-dense", "'nvfp4'", "fp8"});
}

TEST(CliQuantizeFlags, RefusedOnCuda) {
  // Refused before any GPU is looked for, so the answer is the same with or without one.
  const std::string generate = "generate --model " + fixture("gpt-oss-tiny") + " --prompt-ids 1,2 --max-tokens 2 ";
  expect_one_line_failure(test::run_anvil(generate + "--device cuda:0 --quantize-dense mxfp4"),
                          {"--quantize-dense", "fp8 only"});
}

TEST(CliQuantizeFlags, GoodValuesRun) {
  const auto result = test::run_anvil("generate --model " + fixture("qwen3moe-tiny") +
                                      " --prompt-ids 1,2,3 --max-tokens 4 --device cpu --quantize-experts nvfp4 "
                                      "--quantize-dense fp8");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const auto fp8 = test::run_anvil("generate --model " + fixture("gpt-oss-tiny") +
                                   " --prompt-ids 1,2,3 --max-tokens 4 --device cpu --quantize-experts fp8");
  EXPECT_EQ(fp8.exit_code, 0) << fp8.err;
}

}  // namespace
}  // namespace anvil
