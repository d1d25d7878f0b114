// --quantize-experts / --quantize-dense at load (LoadOptions::quantize_*): the layers they name
// change format (weight bytes per token, to the byte), the others do not, and the model still
// computes nearly the same logits (close to the unquantized ones, and not equal to them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "engine/generator.h"
#include "models/model.h"
#include "support/test_support.h"

namespace anvil {
namespace {


LoadOptions quantized(std::optional<WeightFormat> experts, std::optional<WeightFormat> dense) {
  LoadOptions options;
  options.quantize_experts = experts;
  options.quantize_dense = dense;
  return options;
}

struct Flags {
  std::optional<WeightFormat> experts, dense;
};

std::string describe(const std::string& fixture, const Flags& flags) {
  auto name = [](std::optional<WeightFormat> f) {
    return !f ? "none" : *f == WeightFormat::MXFP4 ? "mxfp4" : *f == WeightFormat::NVFP4 ? "nvfp4" : "fp8";
  };
  return fixture + " --quantize-experts " + name(flags.experts) + " --quantize-dense " + name(flags.dense);
}

std::unique_ptr<Model> load_fixture(const std::string& name, const LoadOptions& options) {
  return load_model(test::fixtures_dir() / name, options);
}

std::vector<int32_t> first_prompt(const std::string& fixture) {
  const auto reference = nlohmann::json::parse(test::read_file(test::fixtures_dir() / fixture / "reference.json"));
  return reference.at("cases").at(0).at("prompt_ids").get<std::vector<int32_t>>();
}

// Bytes of one [out, in] matrix in each format (linear.h's weight_bytes).
int64_t bytes_of(WeightFormat format, int64_t out, int64_t in) {
  LinearWeight w;
  w.format = format;
  w.out_features = out;
  w.in_features = in;
  return int64_t(w.weight_bytes());
}

// What the flags change in a gpt-oss model's bytes per token: q/k/v/o (bf16 in the fixture) and
// the top-k experts' two matrices (MXFP4).
int64_t gpt_oss_byte_change(const ModelConfig& c, std::optional<WeightFormat> experts, std::optional<WeightFormat> dense) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const int64_t i = c.intermediate_size;
  int64_t change = 0;
  if (dense) {
    for (auto [out, in] : {std::pair{q, h}, {kv, h}, {kv, h}, {h, q}})
      change += bytes_of(*dense, out, in) - bytes_of(WeightFormat::BF16, out, in);
  }
  if (experts) {
    for (auto [out, in] : {std::pair{2 * i, h}, {h, i}})
      change += c.num_experts_per_tok * (bytes_of(*experts, out, in) - bytes_of(WeightFormat::MXFP4, out, in));
  }
  return change * c.num_layers;
}

// Largest |difference| of two logit sets relative to the largest |logit| of the reference.
double relative_difference(const std::vector<float>& a, const std::vector<float>& reference) {
  double worst = 0, scale = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    worst = std::max(worst, double(std::fabs(a[k] - reference[k])));
    scale = std::max(scale, double(std::fabs(reference[k])));
  }
  return worst / scale;
}

TEST(QuantizeAtLoad, GptOssBytesPerTokenFollowTheFlags) {
  const auto base = load_fixture("gpt-oss-tiny", {});
  const int64_t before = int64_t(base->weight_bytes_per_token());
  const std::optional<WeightFormat> none;
  // MXFP4 experts are already MXFP4: no change.
  for (const Flags& flags : {Flags{WeightFormat::NVFP4, none}, Flags{WeightFormat::MXFP4, none}, Flags{none, WeightFormat::FP8},
                             Flags{none, WeightFormat::MXFP4}, Flags{WeightFormat::NVFP4, WeightFormat::FP8}}) {
    const auto model = load_fixture("gpt-oss-tiny", quantized(flags.experts, flags.dense));
    EXPECT_EQ(int64_t(model->weight_bytes_per_token()) - before, gpt_oss_byte_change(base->config(), flags.experts, flags.dense))
        << describe("gpt-oss-tiny", flags);
  }
}

// What the flags change in a Qwen3 / Qwen3-MoE model's bytes per token (all bf16 in the fixtures):
// q/k/v/o and dense MLPs under `dense`, the top-k experts' three matrices under `experts`.
int64_t qwen3_byte_change(const ModelConfig& c, std::optional<WeightFormat> experts, std::optional<WeightFormat> dense) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  auto change = [](std::optional<WeightFormat> to, int64_t out, int64_t in) {
    return to ? bytes_of(*to, out, in) - bytes_of(WeightFormat::BF16, out, in) : 0;
  };
  int64_t total = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (auto [out, in] : {std::pair{q, h}, {kv, h}, {kv, h}, {h, q}}) total += change(dense, out, in);
    if (c.is_moe_layer(l)) {
      const int64_t i = c.moe_intermediate_size;
      total += c.num_experts_per_tok * (2 * change(experts, i, h) + change(experts, h, i));
    } else {
      const int64_t i = c.intermediate_size;
      total += 2 * change(dense, i, h) + change(dense, h, i);
    }
  }
  return total;
}

TEST(QuantizeAtLoad, Qwen3BytesPerTokenFollowTheFlags) {
  const std::optional<WeightFormat> none;
  for (const std::string fixture : {"qwen3-tiny", "qwen3moe-tiny"}) {
    const auto base = load_fixture(fixture, {});
    const int64_t before = int64_t(base->weight_bytes_per_token());
    for (const Flags& flags : {Flags{WeightFormat::NVFP4, none}, Flags{WeightFormat::MXFP4, none}, Flags{none, WeightFormat::FP8},
                               Flags{none, WeightFormat::MXFP4}, Flags{WeightFormat::MXFP4, WeightFormat::FP8}}) {
      const auto model = load_fixture(fixture, quantized(flags.experts, flags.dense));
      EXPECT_EQ(int64_t(model->weight_bytes_per_token()) - before, qwen3_byte_change(base->config(), flags.experts, flags.dense))
          << describe(fixture, flags);
    }
  }
}

// Quantized logits against the model's own unquantized ones, over the first reference prompt, as
// max |dlogit| / max |logit|. These random fixtures pass quantization noise on undamped, so the
// figures are large (measured: gpt-oss-tiny NVFP4 experts 0.248, FP8 dense 0.035, MXFP4 dense
// 0.371; qwen3-tiny FP8 0.066, MXFP4 0.254; qwen3moe-tiny NVFP4 experts 0.053, MXFP4 0.066).
// Quantization is deterministic, so each bound is 1.5 times its measurement: a format that loses
// precision (a truncating rounding, a scale off by a step) fails, not only a broken one. FP8 and
// NVFP4 beating MXFP4 from the same bf16 weights is checked too.
TEST(QuantizeAtLoad, LogitsMoveALittleAndOnlyWhenTheFormatChanges) {
  const std::optional<WeightFormat> none;
  struct Case {
    std::string fixture;
    Flags flags;
    double bound;
  };
  const Case cases[] = {
      {"gpt-oss-tiny", {WeightFormat::MXFP4, none}, 0.0},  // already MXFP4: exactly the same logits
      {"gpt-oss-tiny", {WeightFormat::NVFP4, none}, 0.37},
      {"gpt-oss-tiny", {none, WeightFormat::FP8}, 0.053},
      {"gpt-oss-tiny", {none, WeightFormat::MXFP4}, 0.56},
      {"qwen3-tiny", {none, WeightFormat::FP8}, 0.10},
      {"qwen3-tiny", {none, WeightFormat::MXFP4}, 0.38},
      {"qwen3moe-tiny", {WeightFormat::NVFP4, none}, 0.079},
      {"qwen3moe-tiny", {WeightFormat::MXFP4, none}, 0.099},
  };
  std::map<std::string, double> measured;
  for (const Case& c : cases) {
    const std::vector<int32_t> prompt = first_prompt(c.fixture);
    const auto base = load_fixture(c.fixture, {});
    const auto model = load_fixture(c.fixture, quantized(c.flags.experts, c.flags.dense));
    const double difference = relative_difference(prompt_logits(*model, prompt), prompt_logits(*base, prompt));
    std::printf("%s: max |dlogit| / max |logit| = %.5f\n", describe(c.fixture, c.flags).c_str(), difference);
    measured[describe(c.fixture, c.flags)] = difference;
    if (c.bound == 0.0) {
      EXPECT_EQ(difference, 0.0) << describe(c.fixture, c.flags);
    } else {
      EXPECT_GT(difference, 0.0) << describe(c.fixture, c.flags) << ": the flag changed nothing";
      EXPECT_LT(difference, c.bound) << describe(c.fixture, c.flags);
    }
  }
  const std::optional<WeightFormat> fp8 = WeightFormat::FP8, nvfp4 = WeightFormat::NVFP4, mxfp4 = WeightFormat::MXFP4;
  EXPECT_LT(measured[describe("qwen3-tiny", {none, fp8})], measured[describe("qwen3-tiny", {none, mxfp4})]);
  EXPECT_LT(measured[describe("qwen3moe-tiny", {nvfp4, none})], measured[describe("qwen3moe-tiny", {mxfp4, none})]);
}

TEST(QuantizeAtLoad, RefusedOnCuda) {
  // Checked before any GPU is touched, so this runs on machines without one. Experts quantize on
  // CUDA to every format (tests/gpu); dense layers to FP8 only.
  auto expect_refusal = [](const std::string& fixture, LoadOptions options, const std::string& why) {
    options.device = Device::Cuda;
    try {
      load_fixture(fixture, options);
      ADD_FAILURE() << "quantize flags accepted for CUDA: " << fixture;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_refusal("gpt-oss-tiny", quantized(std::nullopt, WeightFormat::MXFP4), "fp8 only");
  expect_refusal("qwen3moe-tiny", quantized(WeightFormat::NVFP4, WeightFormat::MXFP4), "fp8 only");
}

}  // namespace
}  // namespace anvil
