// NVFP4 and FP8 layers against their definitions, value by value. The random-weight comparisons
// of every kernel with the reference (and batch and thread-count invariance) are in
// linear_test.cpp, which runs them for every format.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/linear.h"
#include "core/dtype.h"
#include "core/error.h"

namespace anvil {
namespace {

// E4M3 values written out from the format (sign, 4 exponent bits with bias 7, 3 mantissa bits),
// independent of the decoders under test.
struct E4m3Case {
  uint8_t bits;
  float value;
};
constexpr E4m3Case kE4m3Cases[] = {
    {0x38, 1.0f}, {0xb4, -0.75f}, {0x7e, 448.0f}, {0x01, 0x1p-9f}, {0x08, 0x1p-6f}, {0x0f, 0x1.ep-6f}, {0xd5, -13.0f},
};

// One NVFP4 row of `blocks` blocks: every code at an even and an odd position (block b starts at
// code b), block b scaled by kE4m3Cases[b], the tensor by `global`.
struct HandBuiltNvfp4 {
  std::vector<uint8_t> codes, scales;
  std::vector<float> expected;
  LinearWeight weight;

  HandBuiltNvfp4(int blocks, float global) : codes(size_t(blocks) * 8), scales(size_t(blocks)), expected(size_t(blocks) * 16) {
    for (int b = 0; b < blocks; ++b) {
      const E4m3Case& scale = kE4m3Cases[b % std::size(kE4m3Cases)];
      scales[size_t(b)] = scale.bits;
      for (int j = 0; j < 8; ++j) {
        const int low = (b + 2 * j) % 16, high = (b + 2 * j + 1) % 16;
        codes[size_t(b * 8 + j)] = uint8_t(high << 4 | low);
        expected[size_t(b * 16 + 2 * j)] = kFp4E2M1Values[low] * scale.value * global;
        expected[size_t(b * 16 + 2 * j + 1)] = kFp4E2M1Values[high] * scale.value * global;
      }
    }
    weight.format = WeightFormat::NVFP4;
    weight.out_features = 1;
    weight.in_features = blocks * 16;
    weight.data = codes.data();
    weight.scales = scales.data();
    weight.global_scale = global;
  }
};

// Two FP8 rows holding every code but the two NaNs, with different row scales.
struct HandBuiltFp8 {
  std::vector<uint8_t> codes;
  float row_scales[2] = {0.7f, 0x1p-3f};
  std::vector<float> expected;
  LinearWeight weight;

  HandBuiltFp8() {
    std::vector<uint8_t> order;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) != 0x7f) order.push_back(uint8_t(c));
    }
    for (int row = 0; row < 2; ++row) {
      for (size_t i = 0; i < order.size(); ++i) {
        const uint8_t code = row == 0 ? order[i] : order[order.size() - 1 - i];
        codes.push_back(code);
        expected.push_back(fp8_e4m3_to_f32(code) * row_scales[row]);
      }
    }
    weight.format = WeightFormat::FP8;
    weight.out_features = 2;
    weight.in_features = 254;
    weight.data = codes.data();
    weight.row_scales = row_scales;
  }
};

TEST(LinearFp8, DecoderMatchesTheFormat) {
  for (const E4m3Case& c : kE4m3Cases) EXPECT_EQ(fp8_e4m3_to_f32(c.bits), c.value) << int(c.bits);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
}

TEST(LinearNvfp4, DecodesHandBuiltBlocks) {
  HandBuiltNvfp4 layer(3, 0.3f);
  // Spot checks of the layout: byte 0 = code 1 high, code 0 low; block 1 scaled by -0.75.
  EXPECT_EQ(layer.codes[0], 0x10);
  EXPECT_EQ(layer.expected[1], 0.5f * 0.3f);
  EXPECT_EQ(layer.expected[16], 0.5f * -0.75f * 0.3f);  // block 1 starts at code 1
  std::vector<float> row(48);
  linear_decode_row(layer.weight, 0, row.data());
  for (int i = 0; i < 48; ++i) EXPECT_EQ(row[size_t(i)], layer.expected[size_t(i)]) << i;
}

// One-hot inputs make y[t] the weight element t itself, so a nibble-order, block-scale or global-
// scale mix-up in any kernel shows as a wrong value in a known place. Every product here is
// exact before the single rounding of the scale the reference also rounds once, so the kernels
// must agree exactly. Token counts cover the GEMM, register-tile and single-token paths, and with
// 48 elements the single block after the 32-element chunks.
TEST(LinearNvfp4, KernelsPickEachElementWithItsScales) {
  for (int blocks : {2, 3, 7}) {
    for (float global : {1.0f, 0.3f, 1e-3f}) {
      HandBuiltNvfp4 layer(blocks, global);
      const int64_t in = layer.weight.in_features;
      for (int64_t tokens : {in, int64_t(3), int64_t(1)}) {
        std::vector<float> x(size_t(tokens * in), 0.0f);
        for (int64_t t = 0; t < tokens; ++t) x[size_t(t * in + t)] = 1.0f;
        std::vector<float> y(static_cast<size_t>(tokens)), reference(static_cast<size_t>(tokens));
        ThreadPool pool(2);
        linear_forward(layer.weight, x.data(), tokens, y.data(), pool);
        linear_forward_reference(layer.weight, x.data(), tokens, reference.data());
        for (int64_t t = 0; t < tokens; ++t) {
          EXPECT_EQ(y[size_t(t)], layer.expected[size_t(t)]) << blocks << " blocks, global " << global << ", tokens "
                                                             << tokens << ", element " << t;
          EXPECT_EQ(reference[size_t(t)], layer.expected[size_t(t)]) << "reference, element " << t;
        }
      }
    }
  }
}

TEST(LinearNvfp4, IgnoresTheMxfp4ActivationMode) {
  // NVFP4 always multiplies float32 inputs: the int8 mode must not route it to the MXFP4 kernels.
  const Mxfp4Activations saved = mxfp4_activations();
  set_mxfp4_activations(Mxfp4Activations::Int8);
  HandBuiltNvfp4 layer(2, 0.3f);
  std::vector<float> x(32 * 32, 0.0f), y(32);
  for (int t = 0; t < 32; ++t) x[size_t(t * 32 + t)] = 1.0f + 1.0f / 1024.0f;  // not int8-exact
  ThreadPool pool(1);
  linear_forward(layer.weight, x.data(), 32, y.data(), pool);
  set_mxfp4_activations(saved);
  for (int t = 0; t < 32; ++t) {
    EXPECT_FLOAT_EQ(y[size_t(t)], layer.expected[size_t(t)] * (1.0f + 1.0f / 1024.0f)) << t;
  }
}

TEST(LinearFp8, KernelsPickEachElementWithItsRowScale) {
  HandBuiltFp8 layer;
  std::vector<float> row(254);
  for (int r = 0; r < 2; ++r) {
    linear_decode_row(layer.weight, r, row.data());
    for (int i = 0; i < 254; ++i) EXPECT_EQ(row[size_t(i)], layer.expected[size_t(r * 254 + i)]) << r << " " << i;
  }
  // 40 tokens take the GEMM path, 17 the batched one; 254 leaves a tail after the 16-byte chunks.
  for (int64_t tokens : {40, 17, 3, 1}) {
    std::vector<float> x(size_t(tokens * 254), 0.0f);
    for (int64_t t = 0; t < tokens; ++t) x[size_t(t * 254 + (t * 37 + 5) % 254)] = 1.0f;
    std::vector<float> y(size_t(tokens * 2));
    ThreadPool pool(2);
    linear_forward(layer.weight, x.data(), tokens, y.data(), pool);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t i = (t * 37 + 5) % 254;
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(y[size_t(t * 2 + r)], layer.expected[size_t(r * 254 + i)]) << "tokens " << tokens << " row " << r
                                                                             << " element " << i;
      }
    }
  }
}

TEST(LinearFp8, LargestAndSmallestCodes) {
  // The extremes of the format through the SIMD decoder: +-448, the smallest subnormal, -0.
  uint8_t codes[16] = {0x7e, 0xfe, 0x01, 0x81, 0x80, 0x08, 0x38, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const float scale = 1.0f;
  LinearWeight weight;
  weight.format = WeightFormat::FP8;
  weight.out_features = 1;
  weight.in_features = 16;
  weight.data = codes;
  weight.row_scales = &scale;
  const float expected[7] = {448.0f, -448.0f, 0x1p-9f, -0x1p-9f, 0.0f, 0x1p-6f, 1.0f};
  ThreadPool pool(1);
  for (int i = 0; i < 7; ++i) {
    std::vector<float> x(16, 0.0f);
    x[size_t(i)] = 1.0f;
    float y = NAN;
    linear_forward(weight, x.data(), 1, &y, pool);
    EXPECT_EQ(y, expected[i]) << i;
  }
}

TEST(LinearNvfp4Fp8, RejectBadLayers) {
  uint8_t bytes[64] = {};
  float x[32] = {}, y[2] = {}, row[32];
  ThreadPool pool(1);
  LinearWeight nvfp4;
  nvfp4.format = WeightFormat::NVFP4;
  nvfp4.out_features = 2;
  nvfp4.in_features = 24;  // not a multiple of 16
  nvfp4.data = bytes;
  nvfp4.scales = bytes;
  EXPECT_THROW(linear_forward(nvfp4, x, 1, y, pool), Error);
  EXPECT_THROW(linear_decode_row(nvfp4, 0, row), Error);
  nvfp4.in_features = 16;
  EXPECT_NO_THROW(linear_forward(nvfp4, x, 1, y, pool));
  nvfp4.scales = nullptr;
  EXPECT_THROW(linear_forward(nvfp4, x, 1, y, pool), Error);

  LinearWeight fp8;
  fp8.format = WeightFormat::FP8;
  fp8.out_features = 2;
  fp8.in_features = 32;
  fp8.data = bytes;
  EXPECT_THROW(linear_forward(fp8, x, 1, y, pool), Error);  // no row scales
  EXPECT_THROW(linear_forward_reference(fp8, x, 1, y), Error);
  const float scales[2] = {1.0f, 1.0f};
  fp8.row_scales = scales;
  EXPECT_NO_THROW(linear_forward(fp8, x, 1, y, pool));
}

}  // namespace
}  // namespace anvil
