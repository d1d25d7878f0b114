// `anvil rig check` sizes anvil models with `anvil plan` when the config gives no vram_gb: on the
// fixture checkpoints, against stand-in GPUs of chosen sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "rig/check.h"
#include "rig/config.h"
#include "support/test_support.h"

namespace anvil::rig {
namespace {

using test::fixtures_dir;

cuda::DeviceInfo gpu(int index, double gb) {
  cuda::DeviceInfo info;
  info.index = index;
  info.name = "Stand-in";
  info.major = 9;
  info.total_memory = size_t(gb * 1e9);
  return info;
}

// One anvil model entry on a fixture checkpoint.
std::string entry(const std::string& name, const std::string& fixture, const std::string& extra = "") {
  return fmt::format("  {}:\n    model: {}\n{}", name, (fixtures_dir() / fixture).string(), extra);
}

CheckReport check(const std::string& models, const std::vector<cuda::DeviceInfo>& gpus) {
  return check_config(parse_config("models:\n" + models, "/etc/rig.yaml"), gpus);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(RigSizing, AnvilModelsTakeWhatAnvilPlanGivesThem) {
  // anvil serve fills --gpu-memory-utilization of its GPU: 0.90 x 24 GB and 0.25 x 24 GB.
  const std::string models = entry("tiny", "gpt-oss-tiny") +
                             entry("qwen", "qwen3-tiny", "    args: [--gpu-memory-utilization, \"0.25\"]\n");
  CheckReport report = check(models, {gpu(0, 24)});
  EXPECT_TRUE(has(report.text, "memory: 21.6 GB on GPU 0 (anvil plan: 0.90 x 24.0 GB of GPU 0: weights 0.00, "
                               "activation reserve 1.21, bf16 KV cache 20.39 GB (")) << report.text;
  EXPECT_TRUE(has(report.text, "memory: 6.0 GB on GPU 0 (anvil plan: 0.25 x 24.0 GB of GPU 0:")) << report.text;
  ASSERT_EQ(report.problems.size(), 1u) << report.text;
  EXPECT_EQ(report.problems[0], "GPU 0: the groups placed on it need 27.6 GB, it has 24.0 GB");

  // In one group they swap: the larger one is what the GPU must hold.
  report = check(entry("tiny", "gpt-oss-tiny", "    group: g\n") +
                     entry("qwen", "qwen3-tiny", "    group: g\n    args: [--gpu-memory-utilization, \"0.25\"]\n"),
                 {gpu(0, 24)});
  EXPECT_TRUE(report.problems.empty()) << report.problems[0];
  EXPECT_TRUE(has(report.text, "21.6 of 24.0 GB planned")) << report.text;

  // vram_gb, when given, is the figure, and the output says so.
  report = check(entry("tiny", "gpt-oss-tiny", "    vram_gb: 5\n") +
                     entry("qwen", "qwen3-tiny", "    args: [--gpu-memory-utilization, \"0.25\"]\n"),
                 {gpu(0, 24)});
  EXPECT_TRUE(report.problems.empty()) << report.problems[0];
  EXPECT_TRUE(has(report.text, "memory: 5.0 GB on GPU 0 (vram_gb)")) << report.text;
  EXPECT_TRUE(has(report.text, "11.0 of 24.0 GB planned")) << report.text;
}

TEST(RigSizing, ServeFlagsChangeThePlan) {
  // A fixed KV cache replaces the share: weights + 1 GiB + 2048 x 64 KiB reserve + 0.002 GiB.
  // qwen3-tiny keeps 768 B per token in bf16 (384 in fp8), so 4,096 tokens need 3.1 MB: more
  // than 0.002 GiB (2.1 MB) in bf16, less in fp8.
  const std::string fixed = "    args: [--kv-cache-memory, \"0.002\", --max-model-len, \"4096\"{}]\n";
  CheckReport report = check(entry("qwen", "qwen3-tiny", fmt::format(fmt::runtime(fixed), "")), {gpu(0, 24)});
  EXPECT_TRUE(has(report.text, "memory: 1.2 GB on GPU 0 (anvil plan: weights 0.00 + activation reserve 1.21 + KV cache "
                               "0.00 GB (--kv-cache-memory 0.002))"))
      << report.text;
  ASSERT_EQ(report.problems.size(), 1u) << report.text;
  EXPECT_EQ(report.problems[0], "/etc/rig.yaml:2: models.qwen: anvil plan: one sequence of --max-model-len 4096 needs "
                                "0.0031 GB of bf16 KV cache, --kv-cache-memory gives 0.0021 GB");
  report = check(entry("qwen", "qwen3-tiny", fmt::format(fmt::runtime(fixed), ", --kv-cache-dtype=fp8")), {gpu(0, 24)});
  EXPECT_TRUE(report.problems.empty()) << report.problems[0];

  // A GPU too small for the activation reserve at the given share (0.9 GB of it is still all
  // the group takes, which fits: the model is the problem, not the placement).
  report = check(entry("tiny", "gpt-oss-tiny"), {gpu(0, 1)});
  ASSERT_EQ(report.problems.size(), 1u) << report.text;
  EXPECT_EQ(report.problems[0], "/etc/rig.yaml:2: models.tiny: anvil plan on GPU 0 (1.0 GB): the weights (0.00 GB) and "
                                "the activation reserve (1.21 GB) do not fit in 0.90 of it (0.90 GB)");

  // On the CPU a model takes no GPU memory; a value serve would refuse is named.
  report = check(entry("cpu", "gpt-oss-tiny", "    args: [--device, cpu]\n") +
                     entry("bad", "qwen3-tiny", "    args: [--max-model-len, lots]\n"),
                 {gpu(0, 24)});
  EXPECT_TRUE(has(report.text, "memory: 0.0 GB (--device cpu: no GPU memory)")) << report.text;
  ASSERT_EQ(report.problems.size(), 1u) << report.text;
  EXPECT_EQ(report.problems[0], "/etc/rig.yaml:5: models.bad.args: --max-model-len expects a positive number of tokens, got 'lots'");
}

TEST(RigSizing, AnAnvilModelIsPlacedOnTheOneGpuItRunsOn) {
  // Pinned to GPU 1 (or cuda:1 of all), it is sized by and counted on GPU 1 alone.
  for (const std::string& extra : {std::string("    gpus: [1]\n"), std::string("    args: [--device, \"cuda:1\"]\n")}) {
    const CheckReport report = check(entry("tiny", "gpt-oss-tiny", extra), {gpu(0, 80), gpu(1, 24)});
    EXPECT_TRUE(report.problems.empty()) << report.problems[0];
    EXPECT_TRUE(has(report.text, "memory: 21.6 GB on GPU 1 (anvil plan: 0.90 x 24.0 GB of GPU 1")) << report.text;
    EXPECT_TRUE(has(report.text, "GPU 0 Stand-in (compute capability 9.0): 0.0 of 80.0 GB planned")) << report.text;
    EXPECT_TRUE(has(report.text, "GPU 1 Stand-in (compute capability 9.0): 21.6 of 24.0 GB planned")) << report.text;
  }
  // Without a GPU to size against, the share is all that is known.
  const CheckReport report = check(entry("tiny", "gpt-oss-tiny"), {});
  EXPECT_TRUE(has(report.text, "memory: not counted (anvil plan: 0.90 of the GPU it runs on, and no GPU to size it against)"))
      << report.text;
}

TEST(RigSizing, CheckCommandPlansAgainstAStandInGpu) {
  test::TempDir dir;
  const std::string config = (dir.path() / "rig.yaml").string();
  test::write_file(config, "models:\n" + entry("tiny", "gpt-oss-tiny") + entry("qwen", "qwen3-tiny"));
  auto result = test::run_anvil("rig check '" + config + "' --gpu-memory 40");
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_TRUE(has(result.out, "memory: 36.0 GB on GPU 0 (anvil plan: 0.90 x 40.0 GB of GPU 0:")) << result.out;
  EXPECT_TRUE(has(result.err, "anvil: error: GPU 0: the groups placed on it need 72.0 GB, it has 40.0 GB")) << result.err;
  test::write_file(config, "models:\n" + entry("tiny", "gpt-oss-tiny", "    group: g\n") + entry("qwen", "qwen3-tiny", "    group: g\n"));
  result = test::run_anvil("rig check '" + config + "' --gpu-memory 40");
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_TRUE(has(result.out, "36.0 of 40.0 GB planned")) << result.out;
}

}  // namespace
}  // namespace anvil::rig
