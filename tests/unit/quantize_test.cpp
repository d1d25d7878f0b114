// The quantizers behind --quantize-experts / --quantize-dense: scalar roundings against the
// formats' definitions, whole layers against error bounds derived from the formats, values each
// format represents exactly, and the edge cases (zero, negative, huge, non-finite).
#include "backend/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/e4m3.h"
#include "core/dtype.h"
#include "core/error.h"

namespace anvil {
namespace {

// The positive E4M3 codes in increasing order of value: 0x00 .. 0x7e.
float e4m3(int code) { return fp8_e4m3_to_f32(uint8_t(code)); }

TEST(QuantizeScalar, E4m3RoundTripsEveryCode) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3(code)), code) << code;
  }
}

// e4m3_value is what device code decodes scales with (NVFP4 experts on CUDA): it must be core's
// decoder for every code, NaN codes included.
TEST(QuantizeScalar, DeviceE4m3DecoderMatchesCore) {
  for (int code = 0; code < 256; ++code) {
    const float want = fp8_e4m3_to_f32(uint8_t(code)), got = e4m3_value(uint8_t(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << code << ": " << got << " vs " << want;
    }
  }
}

TEST(QuantizeScalar, E4m3RoundsToNearestEven) {
  for (int code = 0; code < 0x7e; ++code) {
    const float low = e4m3(code), high = e4m3(code + 1);
    const float mid = (low + high) / 2;  // exact: both have few significant bits
    EXPECT_EQ(f32_to_e4m3(mid), code % 2 == 0 ? code : code + 1) << "tie between " << code << " and " << code + 1;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), code) << code;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1e9f)), code + 1) << code;
    EXPECT_EQ(f32_to_e4m3(-std::nextafter(mid, 1e9f)), 0x80 | (code + 1)) << code;
  }
  // Saturation instead of NaN, and what falls below the smallest subnormal.
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(470.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: a tie, to even (zero)
  EXPECT_EQ(f32_to_e4m3(0x1.01p-10f), 0x01);
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

TEST(QuantizeScalar, E2m1RoundsToNearestEven) {
  for (int code = 0; code < 16; ++code) EXPECT_EQ(f32_to_e2m1(kFp4E2M1Values[code]), code) << code;
  // Ties: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (the even codes).
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t even[] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(f32_to_e2m1(ties[i]), even[i]) << ties[i];
    EXPECT_EQ(f32_to_e2m1(-ties[i]), 8 | even[i]) << -ties[i];
    EXPECT_EQ(f32_to_e2m1(std::nextafter(ties[i], 0.0f)), i % 2 == 0 ? even[i] : even[i] - 1) << ties[i];
    EXPECT_EQ(f32_to_e2m1(std::nextafter(ties[i], 10.0f)), i % 2 == 0 ? even[i] + 1 : even[i]) << ties[i];
  }
  EXPECT_EQ(f32_to_e2m1(6.5f), 7);
  EXPECT_EQ(f32_to_e2m1(1e30f), 7);
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
}

TEST(QuantizeScalar, Mxfp4SharedScaleFollowsTheOcpRule) {
  EXPECT_EQ(mxfp4_shared_scale(6.0f), 127);   // floor(log2 6) - 2 = 0
  EXPECT_EQ(mxfp4_shared_scale(4.0f), 127);
  EXPECT_EQ(mxfp4_shared_scale(7.99f), 127);  // still 2^0: 7.99 will saturate to 6
  EXPECT_EQ(mxfp4_shared_scale(8.0f), 128);
  EXPECT_EQ(mxfp4_shared_scale(1.0f), 125);
  EXPECT_EQ(mxfp4_shared_scale(0.0f), 0);
  EXPECT_EQ(mxfp4_shared_scale(1e-40f), 0);   // clamped to 2^-127
  EXPECT_EQ(mxfp4_shared_scale(3e38f), 252);  // 2^125
}

// A float32 layer that owns its values.
struct FloatLayer {
  std::vector<float> values;
  LinearWeight weight;
  FloatLayer(int64_t out, int64_t in, std::vector<float> v) : values(std::move(v)) {
    weight.format = WeightFormat::F32;
    weight.out_features = out;
    weight.in_features = in;
    weight.data = values.data();
  }
};

FloatLayer gaussian_layer(int64_t out, int64_t in, uint32_t seed, float sigma = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(size_t(out * in));
  for (auto& x : v) x = normal(rng);
  return FloatLayer(out, in, std::move(v));
}

std::vector<float> decode_all(const LinearWeight& weight) {
  std::vector<float> out(size_t(weight.out_features * weight.in_features));
  for (int64_t r = 0; r < weight.out_features; ++r) linear_decode_row(weight, r, out.data() + r * weight.in_features);
  return out;
}

float block_amax(const std::vector<float>& v, size_t begin, size_t size) {
  float amax = 0.0f;
  for (size_t i = begin; i < begin + size; ++i) amax = std::max(amax, std::fabs(v[i]));
  return amax;
}

TEST(QuantizeLinear, Mxfp4ErrorStaysWithinHalfAStep) {
  // Per 32-block the scale is 2^(floor(log2 amax) - 2); the largest gap between E2M1 values is 2
  // scales (4 to 6), and values in (6, 8) scales saturate to 6: error <= 2 scales <= amax / 2.
  ThreadPool pool(2);
  FloatLayer layer = gaussian_layer(64, 320, 1);
  const QuantizedLinear q = quantize_linear(layer.weight, WeightFormat::MXFP4, "test", pool);
  ASSERT_EQ(q.weight().format, WeightFormat::MXFP4);
  const std::vector<float> got = decode_all(q.weight());
  double error = 0, norm = 0;
  for (size_t b = 0; b < got.size() / 32; ++b) {
    const float amax = block_amax(layer.values, b * 32, 32);
    const float scale = std::ldexp(1.0f, std::ilogb(amax) - 2);
    for (size_t i = b * 32; i < b * 32 + 32; ++i) {
      const float e = std::fabs(got[i] - layer.values[i]);
      // Below 4 scales the gaps are at most 1 scale: half of it; above, 1 scale or the clip.
      const float bound = std::fabs(layer.values[i]) < 4 * scale ? 0.5f * scale : 2.0f * scale;
      ASSERT_LE(e, bound) << "element " << i << " value " << layer.values[i];
      error += double(e) * e;
      norm += double(layer.values[i]) * layer.values[i];
    }
  }
  // Relative RMS error of 4-bit E2M1 with power-of-two scales on Gaussian weights: about 0.1.
  EXPECT_LT(std::sqrt(error / norm), 0.2);
  EXPECT_GT(std::sqrt(error / norm), 0.01);
}

TEST(QuantizeLinear, Mxfp4KeepsMxfp4ValuesExactly) {
  // Any MXFP4 block re-quantizes to itself: its largest value is c * 2^k with c in {0.5, ..., 6},
  // and the OCP scale then makes every element an E2M1 value again.
  std::mt19937 rng(3);
  const int64_t out = 16, in = 128;
  std::vector<uint8_t> codes(size_t(out * in / 2)), scales(size_t(out * in / 32));
  for (auto& c : codes) c = uint8_t(rng());
  for (auto& s : scales) s = uint8_t(100 + rng() % 50);
  LinearWeight source;
  source.format = WeightFormat::MXFP4;
  source.out_features = out;
  source.in_features = in;
  source.data = codes.data();
  source.scales = scales.data();
  ThreadPool pool(2);
  const QuantizedLinear q = quantize_linear(source, WeightFormat::MXFP4, "test", pool);
  EXPECT_EQ(decode_all(q.weight()), decode_all(source));
}

TEST(QuantizeLinear, Nvfp4UsesModelOptScales) {
  // Tensor amax 2688 * 0.25: global scale 0.25 exactly; a block whose amax is 6 * 0.25 * 13 gets
  // E4M3 13 (0x55); an all-zero block gets 1 (0x38).
  std::vector<float> v(64, 0.0f);
  v[3] = -2688.0f * 0.25f;
  v[16] = 6.0f * 0.25f * 13.0f;
  v[20] = -1.0f;
  FloatLayer layer(1, 64, v);
  ThreadPool pool(1);
  const QuantizedLinear q = quantize_linear(layer.weight, WeightFormat::NVFP4, "test", pool);
  const LinearWeight& w = q.weight();
  ASSERT_EQ(w.format, WeightFormat::NVFP4);
  EXPECT_EQ(w.global_scale, 0.25f);
  EXPECT_EQ(w.scales[0], 0x7e);  // 448
  EXPECT_EQ(w.scales[1], 0x55);  // 13
  EXPECT_EQ(w.scales[2], 0x38);
  EXPECT_EQ(w.scales[3], 0x38);
  const std::vector<float> got = decode_all(w);
  EXPECT_EQ(got[3], v[3]);
  EXPECT_EQ(got[16], v[16]);
  // -1 / (13 * 0.25) = -0.31: the nearest E2M1 value is -0.5, so -1.625.
  EXPECT_EQ(got[20], -0.5f * 13.0f * 0.25f);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(got[size_t(i)], 0.0f) << i;
}

TEST(QuantizeLinear, Nvfp4ErrorStaysWithinTheFormatsBound) {
  // Per 16-block the effective scale s * global is within 2^-4 (E4M3's half step) of amax / 6; the
  // largest E2M1 gap is 2 effective scales, and a scale rounded down clips the top by under 6%:
  // error <= (amax / 6) * (1 + 2^-4), for every element.
  ThreadPool pool(2);
  FloatLayer layer = gaussian_layer(48, 336, 5);
  layer.values[77] = 0.5f;  // one outlier sets the global scale
  const QuantizedLinear q = quantize_linear(layer.weight, WeightFormat::NVFP4, "test", pool);
  const std::vector<float> got = decode_all(q.weight());
  double error = 0, norm = 0;
  for (size_t b = 0; b < got.size() / 16; ++b) {
    const float bound = block_amax(layer.values, b * 16, 16) / 6.0f * (1.0f + 0x1p-4f) * (1.0f + 1e-6f);
    for (size_t i = b * 16; i < b * 16 + 16; ++i) {
      ASSERT_LE(std::fabs(got[i] - layer.values[i]), bound) << "element " << i;
      error += double(got[i] - layer.values[i]) * (got[i] - layer.values[i]);
      norm += double(layer.values[i]) * layer.values[i];
    }
  }
  EXPECT_LT(std::sqrt(error / norm), 0.15);
}

TEST(QuantizeLinear, Nvfp4KeepsRepresentableValuesExactly) {
  // Values that are NVFP4 with a power-of-two global scale and a +-6 in every block (so that
  // each block's amax / 6 is its own scale) come back bit for bit, whatever the block scales.
  std::mt19937 rng(9);
  const int64_t out = 8, in = 64;
  const float global = 0x1p-12f;
  std::vector<float> v(size_t(out * in));
  for (size_t b = 0; b < v.size() / 16; ++b) {
    int scale_code = 1 + int(rng() % 0x7d);  // 0x01 .. 0x7d, positive
    if (b == 5) scale_code = 0x7e;            // the tensor's largest block: amax 6 * 448 * global
    for (size_t i = 0; i < 16; ++i) {
      const int code = i == 7 ? (rng() % 2 ? 7 : 15) : int(rng() % 16);
      v[b * 16 + i] = kFp4E2M1Values[code] * e4m3(scale_code) * global;
    }
  }
  FloatLayer layer(out, in, v);
  ThreadPool pool(2);
  const QuantizedLinear q = quantize_linear(layer.weight, WeightFormat::NVFP4, "test", pool);
  EXPECT_EQ(q.weight().global_scale, global);
  EXPECT_EQ(decode_all(q.weight()), v);
}

TEST(QuantizeLinear, Fp8ErrorAndExactValues) {
  ThreadPool pool(2);
  FloatLayer layer = gaussian_layer(32, 100, 11);
  layer.values[5] = 0.0f;
  const QuantizedLinear q = quantize_linear(layer.weight, WeightFormat::FP8, "test", pool);
  const LinearWeight& w = q.weight();
  ASSERT_EQ(w.format, WeightFormat::FP8);
  const std::vector<float> got = decode_all(w);
  for (int64_t r = 0; r < 32; ++r) {
    const float amax = block_amax(layer.values, size_t(r * 100), 100);
    EXPECT_EQ(w.row_scales[r], amax / 448.0f) << r;
    for (int64_t i = r * 100; i < r * 100 + 100; ++i) {
      // Half an E4M3 step: 2^-4 relative for normals, 2^-10 row scales for subnormals.
      const float bound = std::max(std::fabs(layer.values[size_t(i)]) * 0x1p-4f, 0x1p-10f * w.row_scales[r]) * 1.000001f;
      ASSERT_LE(std::fabs(got[size_t(i)] - layer.values[size_t(i)]), bound) << i;
    }
  }
  EXPECT_EQ(got[5], 0.0f);

  // FP8 values times a power of two, with a +-448 in every row, come back exactly.
  std::vector<float> exact(2 * 254);
  for (int c = 0, i = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    exact[size_t(i)] = e4m3(c) * 0x1p-7f;
    exact[size_t(254 + i)] = -e4m3(c) * 8.0f;
    ++i;
  }
  FloatLayer representable(2, 254, exact);
  const QuantizedLinear q2 = quantize_linear(representable.weight, WeightFormat::FP8, "test", pool);
  EXPECT_EQ(decode_all(q2.weight()), exact);
}

TEST(QuantizeLinear, ZeroLayers) {
  ThreadPool pool(1);
  FloatLayer zeros(2, 32, std::vector<float>(64, 0.0f));
  for (WeightFormat target : {WeightFormat::MXFP4, WeightFormat::NVFP4, WeightFormat::FP8}) {
    const QuantizedLinear q = quantize_linear(zeros.weight, target, "zeros", pool);
    for (float value : decode_all(q.weight())) EXPECT_EQ(value, 0.0f);
    if (target == WeightFormat::NVFP4) {
      EXPECT_EQ(q.weight().global_scale, 1.0f);
    }
    if (target == WeightFormat::FP8) {
      EXPECT_EQ(q.weight().row_scales[1], 1.0f);
    }
  }
}

TEST(QuantizeLinear, LargeAndNegativeValues) {
  // Near the float32 limit (bf16's range): no overflow to infinity in any scale.
  std::vector<float> v(32);
  for (int i = 0; i < 32; ++i) v[size_t(i)] = (i % 2 ? -1.0f : 1.0f) * 3e38f * (float(i + 1) / 32.0f);
  FloatLayer layer(1, 32, v);
  ThreadPool pool(1);
  for (WeightFormat target : {WeightFormat::MXFP4, WeightFormat::NVFP4, WeightFormat::FP8}) {
    const QuantizedLinear q = quantize_linear(layer.weight, target, "large", pool);
    const std::vector<float> got = decode_all(q.weight());
    for (int i = 0; i < 32; ++i) {
      ASSERT_TRUE(std::isfinite(got[size_t(i)])) << i;
      EXPECT_EQ(std::signbit(got[size_t(i)]), std::signbit(v[size_t(i)])) << i;
      // The loosest bound of the three: MXFP4's 2 scales of 2^125 (3e38 is 7.05 of them: clipped to 6).
      EXPECT_NEAR(got[size_t(i)], v[size_t(i)], 2 * 0x1p125) << i;
    }
  }
}

TEST(QuantizeLinear, SameResultOnAnyPoolSize) {
  FloatLayer layer = gaussian_layer(100, 96, 13);
  ThreadPool one(1), three(3);
  for (WeightFormat target : {WeightFormat::MXFP4, WeightFormat::NVFP4, WeightFormat::FP8}) {
    const QuantizedLinear a = quantize_linear(layer.weight, target, "t", one);
    const QuantizedLinear b = quantize_linear(layer.weight, target, "t", three);
    EXPECT_EQ(decode_all(a.weight()), decode_all(b.weight()));
  }
}

TEST(QuantizeLinear, KeepsTheBiasAndMovesSafely) {
  const float bias[2] = {1.5f, -2.0f};
  FloatLayer layer = gaussian_layer(2, 32, 17);
  layer.weight.bias = bias;
  ThreadPool pool(1);
  QuantizedStore store;
  const LinearWeight w = store.convert(layer.weight, WeightFormat::NVFP4, "t", pool);
  EXPECT_EQ(w.bias, bias);
  EXPECT_EQ(store.size(), 1u);
  // No target, or the format the layer already has: the layer itself, nothing stored.
  EXPECT_EQ(store.convert(layer.weight, std::nullopt, "t", pool).data, layer.weight.data);
  EXPECT_EQ(store.convert(w, WeightFormat::NVFP4, "t", pool).data, w.data);
  EXPECT_EQ(store.size(), 1u);
  // A moved QuantizedLinear still points at its own storage.
  QuantizedLinear q = quantize_linear(layer.weight, WeightFormat::FP8, "t", pool);
  const std::vector<float> before = decode_all(q.weight());
  QuantizedLinear moved = std::move(q);
  EXPECT_EQ(decode_all(moved.weight()), before);
}

TEST(QuantizeLinear, RejectsWhatItCannotQuantize) {
  ThreadPool pool(1);
  FloatLayer layer = gaussian_layer(3, 48, 19);
  try {
    quantize_linear(layer.weight, WeightFormat::MXFP4, "model.layers.0.self_attn.q_proj.weight", pool);
    FAIL() << "48 columns are not MXFP4 blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(quantize_linear(layer.weight, WeightFormat::NVFP4, "t", pool));  // 48 = 3 blocks of 16
  EXPECT_THROW(quantize_linear(layer.weight, WeightFormat::BF16, "t", pool), Error);
  for (float poison : {float(INFINITY), float(NAN)}) {
    layer.values[50] = poison;
    try {
      quantize_linear(layer.weight, WeightFormat::FP8, "w", pool);
      FAIL() << "non-finite weight accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[1, 2]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace anvil
