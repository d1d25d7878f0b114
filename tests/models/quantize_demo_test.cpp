// What re-quantizing the demo model's MXFP4 experts to NVFP4 (--quantize-experts nvfp4) does to
// them, block by block. With ModelOpt's rule the global scale is amax / (6 * 448) and a block's
// scale the E4M3 value nearest its largest value / 6 / global. So a 16-block of MXFP4 values
// v * 2^k, the largest m * 2^k, comes back exactly (to the float rounding of the global scale)
// when (a) its ideal scale 448 * (m / c) * 2^(k - K) is an E4M3 value, c * 2^K being the tensor's
// largest value, and (b) every 6 * v / m is an E2M1 value; otherwise it is rounded again. This
// checks that prediction on every block of the shipped experts, both ways, and prints how many
// blocks come back exactly (docs/perf/quality.md quotes the figures).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/quantize.h"
#include "core/dtype.h"
#include "models/weights.h"

namespace anvil {
namespace {

const std::filesystem::path kDemo = std::filesystem::path(ANVIL_SOURCE_DIR) / "models" / "demo";

struct Counts {
  int64_t blocks = 0, predicted_exact = 0, exact = 0;
  double error = 0, norm = 0;  // squared sums over every weight
};

// One expert matrix: MXFP4 as stored, and its NVFP4 re-quantization.
void compare(const LinearWeight& source, ThreadPool& pool, Counts& counts) {
  const QuantizedLinear q = quantize_linear(source, WeightFormat::NVFP4, "demo expert", pool);
  const int64_t in = source.in_features;
  std::vector<float> want(static_cast<size_t>(in)), got(static_cast<size_t>(in));
  const uint8_t* codes = static_cast<const uint8_t*>(source.data);
  // The tensor's largest value c * 2^K, from its codes and scales.
  float amax = 0.0f;
  for (int64_t r = 0; r < source.out_features; ++r) {
    linear_decode_row(source, r, want.data());
    for (float v : want) amax = std::max(amax, std::fabs(v));
  }
  for (int64_t r = 0; r < source.out_features; ++r) {
    linear_decode_row(source, r, want.data());
    linear_decode_row(q.weight(), r, got.data());
    for (int64_t b = 0; b < in / 16; ++b) {
      // The block's E2M1 magnitudes v, the largest m, and its MXFP4 scale 2^k.
      float v[16], m = 0.0f;
      for (int64_t i = 0; i < 16; ++i) {
        const uint8_t byte = codes[r * in / 2 + (b * 16 + i) / 2];
        v[i] = std::fabs(kFp4E2M1Values[(i % 2 ? byte >> 4 : byte) & 0x0f]);
        m = std::max(m, v[i]);
      }
      const float scale = e8m0_to_f32(source.scales[r * in / 32 + b / 2]);
      // m * 2^k / (6 * amax / 2688): exact in float, as every factor is a few bits times 2^n.
      const float ideal = m * scale * 448.0f / amax;
      bool predicted = m == 0.0f || fp8_e4m3_to_f32(f32_to_e4m3(ideal)) == ideal;
      for (int i = 0; i < 16 && m != 0.0f; ++i) {
        predicted = predicted && kFp4E2M1Values[f32_to_e2m1(6.0f * v[i] / m)] == 6.0f * v[i] / m;
      }
      bool exact = true;
      for (int64_t i = b * 16; i < b * 16 + 16; ++i) {
        const double e = std::fabs(double(got[size_t(i)]) - double(want[size_t(i)]));
        exact = exact && e <= std::fabs(double(want[size_t(i)])) * 0x1p-22;
        counts.error += e * e;
        counts.norm += double(want[size_t(i)]) * double(want[size_t(i)]);
      }
      ++counts.blocks;
      counts.predicted_exact += predicted;
      counts.exact += exact;
      EXPECT_EQ(predicted, exact) << "row " << r << " block " << b << ", largest E2M1 value " << m;
    }
  }
}

TEST(DemoModelNvfp4, ReQuantizedExpertsMatchThePrediction) {
  if (!std::filesystem::exists(kDemo / "config.json")) GTEST_SKIP() << "no models/demo";
  auto source = open_checkpoint_weights(kDemo);
  ThreadPool pool(2);
  Counts counts;
  // models/demo/config.json: 6 layers, 16 experts, hidden 256, intermediate 256.
  const int64_t layers = 6, experts = 16, hidden = 256, width = 256;
  for (int64_t l = 0; l < layers; ++l) {
    for (auto [name, out, in] : {std::tuple{"gate_up_proj", 2 * width, hidden}, {"down_proj", hidden, width}}) {
      const std::string prefix = "model.layers." + std::to_string(l) + ".mlp.experts." + name;
      const TensorView blocks = source->get(prefix + "_blocks", {experts, out, in / 32, 16}, DType::U8, {DType::U8});
      const TensorView scales = source->get(prefix + "_scales", {experts, out, in / 32}, DType::U8, {DType::U8});
      for (int64_t e = 0; e < experts; ++e) {
        LinearWeight w;
        w.format = WeightFormat::MXFP4;
        w.out_features = out;
        w.in_features = in;
        w.data = static_cast<const uint8_t*>(blocks.data) + e * out * in / 2;
        w.scales = static_cast<const uint8_t*>(scales.data) + e * out * in / 32;
        compare(w, pool, counts);
      }
    }
  }
  std::printf("demo experts, MXFP4 -> NVFP4: %lld 16-blocks, %lld (%.1f%%) predicted exact, %lld (%.1f%%) exact; "
              "relative RMS error of all expert weights %.4f\n",
              static_cast<long long>(counts.blocks), static_cast<long long>(counts.predicted_exact),
              100.0 * double(counts.predicted_exact) / double(counts.blocks), static_cast<long long>(counts.exact),
              100.0 * double(counts.exact) / double(counts.blocks), std::sqrt(counts.error / counts.norm));
  EXPECT_GT(counts.exact, 0);
  EXPECT_LT(counts.exact, counts.blocks);  // re-quantization is not free here
}

TEST(DemoModelNvfp4, DenseWeightErrorByFormat) {
  // What --quantize-dense does to the demo's bf16 attention projections, as relative RMS change
  // of the weights over all of them: the figure that ranks the formats, which the perplexity of
  // a 24M-parameter model on 7k tokens is too noisy to do. NVFP4 (not a --quantize-dense choice)
  // for comparison with MXFP4 at the same 4 bits.
  if (!std::filesystem::exists(kDemo / "config.json")) GTEST_SKIP() << "no models/demo";
  auto source = open_checkpoint_weights(kDemo);
  ThreadPool pool(2);
  const int64_t layers = 6, hidden = 256, q_width = 4 * 64, kv_width = 2 * 64;
  double error[3] = {}, norm = 0;
  const WeightFormat formats[3] = {WeightFormat::FP8, WeightFormat::NVFP4, WeightFormat::MXFP4};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    for (auto [name, out, in] : {std::tuple{"q_proj", q_width, hidden}, {"k_proj", kv_width, hidden},
                                 {"v_proj", kv_width, hidden}, {"o_proj", hidden, q_width}}) {
      std::vector<float> bias;
      const LinearWeight w = load_dense_linear(*source, p + name, out, in, false, bias);
      std::vector<float> want(static_cast<size_t>(in)), got(static_cast<size_t>(in));
      for (int f = 0; f < 3; ++f) {
        const QuantizedLinear q = quantize_linear(w, formats[f], p + name, pool);
        for (int64_t r = 0; r < out; ++r) {
          linear_decode_row(w, r, want.data());
          linear_decode_row(q.weight(), r, got.data());
          for (int64_t i = 0; i < in; ++i) {
            const double e = double(got[size_t(i)]) - double(want[size_t(i)]);
            error[f] += e * e;
            if (f == 0) norm += double(want[size_t(i)]) * double(want[size_t(i)]);
          }
        }
      }
    }
  }
  const double fp8 = std::sqrt(error[0] / norm), nvfp4 = std::sqrt(error[1] / norm), mxfp4 = std::sqrt(error[2] / norm);
  std::printf("demo attention projections, relative RMS change: FP8 %.4f, NVFP4 %.4f, MXFP4 %.4f\n", fp8, nvfp4, mxfp4);
  EXPECT_LT(fp8, nvfp4);
  EXPECT_LT(nvfp4, mxfp4);
  EXPECT_LT(fp8, 0.05);  // E4M3's half step is 2^-4 relative at most; about 2% on average
  EXPECT_LT(mxfp4, 0.2);
}

}  // namespace
}  // namespace anvil
