// The fixture checkpoints on the GPU against the transformers float32 reference (issue 4's
// correctness bar): max |logit - reference| <= 0.05 at every prompt position, and under teacher
// forcing the greedy token equals the reference's wherever the top-1/top-2 gap exceeds 0.1. The
// reference logits cover the prompts only; past them, the CPU model (within 1e-3 of the
// reference, tests/models/fixture_test.cpp) supplies the gap.
//
// The bar is checked in the float32 compute mode (--dtype float32). The default bf16 mode rounds
// matrix inputs and the KV cache to bf16, which on these tiny random models moves logits by up to
// about one unit where it flips a near-tie in an MoE routing (0.97 measured on gpt-oss-tiny until
// session 16, 0.048 once a RoPE rounding change moved it off that tie; emulating the roundings on
// the CPU gives the same size), so there the test only guards against a regression past that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cuda/ops.h"
#include "backend/cuda/runtime.h"
#include "engine/generator.h"
#include "formats/safetensors.h"
#include "models/model.h"
#include "support/test_support.h"

namespace anvil {
namespace {

constexpr float kLogitTolerance = 0.05f;
constexpr float kDecisiveGap = 0.1f;
constexpr float kBf16Guard = 1.5f;

struct Ranked {
  int32_t top = 0;
  float gap = 0.0f;
};

Ranked rank(const float* logits, int64_t vocab) {
  int32_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  float second = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i)
    if (i != best) second = std::max(second, logits[i]);
  return {best, logits[best] - second};
}

// Test names: the fixture and the compute mode, e.g. gpt_oss_tiny_float32.
std::string fixture_and_dtype_name(const ::testing::TestParamInfo<std::tuple<std::string, ComputeDtype>>& info) {
  std::string name = std::get<0>(info.param) + (std::get<1>(info.param) == ComputeDtype::F32 ? "_float32" : "_bfloat16");
  for (auto& ch : name)
    if (ch == '-') ch = '_';
  return name;
}

class FixtureGpuTest : public ::testing::TestWithParam<std::tuple<std::string, ComputeDtype>> {
 protected:
  void SetUp() override {
    if (cuda::devices().empty()) GTEST_SKIP() << "no CUDA GPU: " << cuda::unavailable_reason();
    dir_ = test::fixtures_dir() / std::get<0>(GetParam());
    exact_ = std::get<1>(GetParam()) == ComputeDtype::F32;
    const auto config = load_model_config(dir_ / "config.json");
    if (!architecture_has_cuda_path(config.architecture))
      GTEST_SKIP() << config.architecture << " has no CUDA path yet";
    LoadOptions options;
    options.device = Device::Cuda;
    options.dtype = std::get<1>(GetParam());
    gpu_ = load_model(dir_, options);
    cpu_ = load_model(dir_);
  }

  std::filesystem::path dir_;
  bool exact_ = false;
  std::unique_ptr<Model> gpu_, cpu_;
};

TEST_P(FixtureGpuTest, LogitsAndTeacherForcedGreedyMatchTheReference) {
  const auto reference = nlohmann::json::parse(test::read_file(dir_ / "reference.json"));
  const SafetensorsFile reference_logits(dir_ / "reference_logits.safetensors");
  const int64_t vocab = gpu_->config().vocab_size;
  float worst = 0.0f;
  for (const auto& c : reference.at("cases")) {
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto greedy = c.at("greedy_ids").get<std::vector<int32_t>>();
    const TensorView& expected = reference_logits.tensor(c.at("logits_tensor").get<std::string>());
    const auto* want = static_cast<const float*>(expected.data);

    std::vector<int32_t> forced = prompt;
    forced.insert(forced.end(), greedy.begin(), greedy.end() - 1);
    const std::vector<float> gpu = prompt_logits(*gpu_, forced);
    const std::vector<float> cpu = prompt_logits(*cpu_, forced);
    for (size_t t = 0; t < prompt.size(); ++t) {
      float error = 0.0f;
      for (int64_t i = 0; i < vocab; ++i)
        error = std::max(error, std::fabs(gpu[t * size_t(vocab) + size_t(i)] - want[t * size_t(vocab) + size_t(i)]));
      worst = std::max(worst, error);
      EXPECT_LE(error, exact_ ? kLogitTolerance : kBf16Guard) << "prompt position " << t;
      EXPECT_FALSE(std::isnan(error));
    }
    if (!exact_) continue;
    for (size_t t = prompt.size() - 1; t < forced.size(); ++t) {
      const int32_t want_token = greedy[t - (prompt.size() - 1)];
      const Ranked cpu_rank = rank(cpu.data() + t * size_t(vocab), vocab);
      const float reference_gap = t < prompt.size() ? rank(want + t * size_t(vocab), vocab).gap : cpu_rank.gap;
      if (reference_gap <= kDecisiveGap) continue;
      EXPECT_EQ(rank(gpu.data() + t * size_t(vocab), vocab).top, want_token) << "position " << t;
    }
  }
  std::printf("[ gpu fixture ] %s %s max |logit - reference| = %.5f\n", std::get<0>(GetParam()).c_str(),
              exact_ ? "float32" : "bfloat16", worst);
}

// The same prompts one token per step: every step is a batch-1 decode step (one row, its own
// logit row), the path the decode graphs and their batch-1 shortcuts take (no gather before the
// final norm), held to the same bar against the reference at every prompt position.
TEST_P(FixtureGpuTest, OneTokenStepsMatchTheReference) {
  const auto reference = nlohmann::json::parse(test::read_file(dir_ / "reference.json"));
  const SafetensorsFile reference_logits(dir_ / "reference_logits.safetensors");
  const int64_t vocab = gpu_->config().vocab_size;
  for (const auto& c : reference.at("cases")) {
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto* want = static_cast<const float*>(reference_logits.tensor(c.at("logits_tensor").get<std::string>()).data);
    const std::vector<float> steps = prompt_logits(*gpu_, prompt, 1);
    ASSERT_EQ(steps.size(), prompt.size() * size_t(vocab));
    for (size_t t = 0; t < prompt.size(); ++t) {
      float error = 0.0f;
      for (int64_t i = 0; i < vocab; ++i)
        error = std::max(error, std::fabs(steps[t * size_t(vocab) + size_t(i)] - want[t * size_t(vocab) + size_t(i)]));
      EXPECT_LE(error, exact_ ? kLogitTolerance : kBf16Guard) << "prompt position " << t << ", one token per step";
      EXPECT_FALSE(std::isnan(error)) << "prompt position " << t;
    }
  }
}

// --quantize-dense fp8 and --quantize-experts nvfp4 / fp8 on the GPU: the device quantizes the
// dense layers / the experts to the CPU quantizer's bytes (checked exactly in linear_dense_test.cpp
// and moe_quantized_test.cpp), so the GPU model must follow the CPU model loaded with the same
// flag. In float32 mode (exact decode, float32 activations) that is to the fixture bar, max |logit
// difference| <= 0.05, and the GPU's RMS deviation from that CPU model must be under half of what
// the quantization itself changes (so the quantization is in effect).
//
// In the bf16 mode the GPU's bf16 roundings move these tiny random models by up to a logit unit
// at the few positions where they flip a near-tie in an MoE routing (see above), and which
// positions those are changes with any rounding anywhere: session 16's RoPE rounding took
// gpt-oss-tiny's unquantized bf16 deviation from the CPU from RMS 0.030 (max 0.97, one flip) to
// 0.008 (max 0.048) while the FP8-experts model kept its flip (RMS 0.103, max 2.51). An RMS over all
// positions measures those flips, so the bar is on the median position's RMS deviation, which a
// lost scale, a wrong k order or a dropped bias moves at every position: it must be under half of
// the quantization's effect there, under four times the unquantized GPU model's own deviation
// from its CPU twin there, or under kBf16QuantizedFloor, whichever is largest; and over all
// positions the GPU model must be nearer the quantized CPU model than the unquantized one. The
// exact check is the float32 mode's.
constexpr double kBf16QuantizedFloor = 0.02;
enum class Quantized { Fp8Dense, Nvfp4Experts, Fp8Experts, Mxfp4Experts };

class FixtureGpuQuantizedTest : public ::testing::TestWithParam<std::tuple<std::string, ComputeDtype, Quantized>> {};

std::string quantized_name(const ::testing::TestParamInfo<std::tuple<std::string, ComputeDtype, Quantized>>& info) {
  const ::testing::TestParamInfo<std::tuple<std::string, ComputeDtype>> base(
      std::make_tuple(std::get<0>(info.param), std::get<1>(info.param)), info.index);
  return fixture_and_dtype_name(base) +
         (std::get<2>(info.param) == Quantized::Fp8Dense       ? "_fp8_dense"
          : std::get<2>(info.param) == Quantized::Nvfp4Experts ? "_nvfp4_experts"
          : std::get<2>(info.param) == Quantized::Fp8Experts   ? "_fp8_experts"
                                                               : "_mxfp4_experts");
}

TEST_P(FixtureGpuQuantizedTest, FollowsTheCpuModelQuantizedTheSameWay) {
  if (cuda::devices().empty()) GTEST_SKIP() << "no CUDA GPU: " << cuda::unavailable_reason();
  const auto dir = test::fixtures_dir() / std::get<0>(GetParam());
  const bool exact = std::get<1>(GetParam()) == ComputeDtype::F32;
  const Quantized what = std::get<2>(GetParam());
  LoadOptions quantized;
  if (what == Quantized::Fp8Dense)
    quantized.quantize_dense = WeightFormat::FP8;
  else
    quantized.quantize_experts = what == Quantized::Nvfp4Experts ? WeightFormat::NVFP4
                                 : what == Quantized::Fp8Experts ? WeightFormat::FP8
                                                                 : WeightFormat::MXFP4;
  auto cpu_quantized = load_model(dir, quantized);
  auto cpu = load_model(dir);
  quantized.device = Device::Cuda;
  quantized.dtype = std::get<1>(GetParam());
  auto gpu_quantized = load_model(dir, quantized);
  LoadOptions plain;
  plain.device = Device::Cuda;
  plain.dtype = std::get<1>(GetParam());
  auto gpu = load_model(dir, plain);
  const auto reference = nlohmann::json::parse(test::read_file(dir / "reference.json"));
  double deviation = 0, from_unquantized = 0, effect = 0, noise = 0, worst = 0;
  size_t count = 0;
  // Per prompt position: the RMS over the vocabulary of the deviation, the effect and the noise.
  std::vector<double> position_deviation, position_effect, position_noise;
  for (const auto& c : reference.at("cases")) {
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const std::vector<float> got = prompt_logits(*gpu_quantized, prompt), want = prompt_logits(*cpu_quantized, prompt);
    const std::vector<float> unquantized = prompt_logits(*cpu, prompt), gpu_unquantized = prompt_logits(*gpu, prompt);
    ASSERT_EQ(got.size(), want.size());
    const size_t vocab = got.size() / prompt.size();
    for (size_t t = 0; t < prompt.size(); ++t) {
      double d = 0, e = 0, n = 0;
      for (size_t i = t * vocab; i < (t + 1) * vocab; ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << i;
        d += double(got[i] - want[i]) * (got[i] - want[i]);
        from_unquantized += double(got[i] - unquantized[i]) * (got[i] - unquantized[i]);
        e += double(want[i] - unquantized[i]) * (want[i] - unquantized[i]);
        n += double(gpu_unquantized[i] - unquantized[i]) * (gpu_unquantized[i] - unquantized[i]);
        worst = std::max(worst, double(std::fabs(got[i] - want[i])));
      }
      deviation += d;
      effect += e;
      noise += n;
      position_deviation.push_back(std::sqrt(d / double(vocab)));
      position_effect.push_back(std::sqrt(e / double(vocab)));
      position_noise.push_back(std::sqrt(n / double(vocab)));
    }
    count += got.size();
  }
  auto rms = [&](double sum) { return std::sqrt(sum / double(count)); };
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::printf("[ gpu fixture ] %s %s %s: |gpu - cpu| max %.5f RMS %.5f (median position %.5f); the quantization's "
              "own effect RMS %.5f (%.5f); unquantized |gpu - cpu| RMS %.5f (%.5f)\n",
              std::get<0>(GetParam()).c_str(), exact ? "float32" : "bfloat16",
              what == Quantized::Fp8Dense       ? "fp8 dense"
              : what == Quantized::Nvfp4Experts ? "nvfp4 experts"
              : what == Quantized::Fp8Experts   ? "fp8 experts"
                                                : "mxfp4 experts",
              worst, rms(deviation), median(position_deviation), rms(effect), median(position_effect), rms(noise),
              median(position_noise));
  if (exact) {
    EXPECT_LE(worst, kLogitTolerance);
    EXPECT_LT(rms(deviation), 0.5 * rms(effect));
  } else {
    EXPECT_LT(median(position_deviation), std::max({0.5 * median(position_effect), 4.0 * median(position_noise),
                                                    kBf16QuantizedFloor}));
    EXPECT_LT(rms(deviation), rms(from_unquantized)) << "the GPU model is nearer the unquantized CPU model";
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8Dense, FixtureGpuQuantizedTest,
                         ::testing::Combine(::testing::Values("gpt-oss-tiny", "qwen3-tiny", "qwen3moe-tiny"),
                                            ::testing::Values(ComputeDtype::F32, ComputeDtype::BF16),
                                            ::testing::Values(Quantized::Fp8Dense)),
                         quantized_name);

INSTANTIATE_TEST_SUITE_P(QuantizedExperts, FixtureGpuQuantizedTest,
                         ::testing::Combine(::testing::Values("gpt-oss-tiny", "qwen3moe-tiny"),
                                            ::testing::Values(ComputeDtype::F32, ComputeDtype::BF16),
                                            ::testing::Values(Quantized::Nvfp4Experts, Quantized::Fp8Experts)),
                         quantized_name);

// Qwen3-MoE's bf16 experts also quantize to MXFP4 (gpt-oss's are MXFP4 already: nothing changes).
INSTANTIATE_TEST_SUITE_P(QwenMxfp4Experts, FixtureGpuQuantizedTest,
                         ::testing::Combine(::testing::Values("qwen3moe-tiny"),
                                            ::testing::Values(ComputeDtype::F32, ComputeDtype::BF16),
                                            ::testing::Values(Quantized::Mxfp4Experts)),
                         quantized_name);

// Qwen3-MoE's bf16 experts as shipped take the grouped tensor-core GEMM only once a step has 16+
// slots per expert (moe_quantized_takes_gemm), which the reference prompts never reach: here a
// 300-token prompt (1,200 slots over qwen3moe-tiny's 16 experts) runs every layer's prefill
// through it, against the CPU model in float32. The GEMM rounds the experts' input and the SwiGLU
// output to bf16, as the quantized experts' kernels do. Measured on an H200 in bf16 mode: RMS
// 0.0118, the CPU's argmax kept at 299 of 300 positions (the CUDA-core experts: 0.0068, 300);
// a wrong k order, a lost tile or a swapped gate / up row lands far above both bounds.
TEST(FixtureGpuLongPrompt, Qwen3MoeBf16ExpertsThroughTheGroupedGemm) {
  if (cuda::devices().empty()) GTEST_SKIP() << "no CUDA GPU: " << cuda::unavailable_reason();
  const auto dir = test::fixtures_dir() / "qwen3moe-tiny";
  const auto config = load_model_config(dir / "config.json");
  constexpr int64_t kLength = 300;
  ASSERT_TRUE(cuda::moe_quantized_takes_gemm(kLength, int(config.num_experts_per_tok), config.num_experts,
                                             config.hidden_size, config.moe_intermediate_size))
      << "the prompt no longer reaches the grouped GEMM";
  LoadOptions options;
  options.device = Device::Cuda;
  options.dtype = ComputeDtype::BF16;
  auto gpu = load_model(dir, options);
  auto cpu = load_model(dir);
  std::vector<int32_t> prompt(kLength);
  for (int64_t i = 0; i < kLength; ++i) prompt[size_t(i)] = int32_t((i * 37 + 11) % config.vocab_size);
  const std::vector<float> got = prompt_logits(*gpu, prompt), want = prompt_logits(*cpu, prompt);
  ASSERT_EQ(got.size(), want.size());
  const int64_t vocab = config.vocab_size;
  double squares = 0.0;
  int kept = 0;
  for (int64_t t = 0; t < kLength; ++t) {
    const float* g = got.data() + t * vocab;
    const float* c = want.data() + t * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_FALSE(std::isnan(g[i])) << "position " << t;
      squares += double(g[i] - c[i]) * (g[i] - c[i]);
    }
    kept += rank(g, vocab).top == rank(c, vocab).top ? 1 : 0;
  }
  const double rms = std::sqrt(squares / double(got.size()));
  std::printf("[ gpu fixture ] qwen3moe-tiny bfloat16, %lld-token prompt (grouped GEMM experts): |gpu - cpu| RMS "
              "%.5f, argmax kept %d / %lld\n",
              static_cast<long long>(kLength), rms, kept, static_cast<long long>(kLength));
  EXPECT_LT(rms, 0.03);
  EXPECT_GE(kept, int(kLength) * 97 / 100);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureGpuTest,
                         ::testing::Combine(::testing::Values("gpt-oss-tiny", "qwen3-tiny", "qwen3moe-tiny"),
                                            ::testing::Values(ComputeDtype::F32, ComputeDtype::BF16)),
                         fixture_and_dtype_name);

}  // namespace
}  // namespace anvil
