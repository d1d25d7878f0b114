#include "backend/linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear_kernels.h"
#include "backend/vector_ops.h"
#include "core/dtype.h"
#include "core/error.h"

namespace anvil {
namespace {

const char* name_of(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32:
      return "F32";
    case WeightFormat::BF16:
      return "BF16";
    case WeightFormat::F16:
      return "F16";
    case WeightFormat::MXFP4:
      return "MXFP4";
    case WeightFormat::NVFP4:
      return "NVFP4";
    case WeightFormat::FP8:
      return "FP8";
  }
  return "?";
}

// Sets the MXFP4 activation mode for a scope.
class ScopedMxfp4Activations {
 public:
  explicit ScopedMxfp4Activations(Mxfp4Activations mode) : saved_(mxfp4_activations()) { set_mxfp4_activations(mode); }
  ~ScopedMxfp4Activations() { set_mxfp4_activations(saved_); }
  ScopedMxfp4Activations(const ScopedMxfp4Activations&) = delete;
  ScopedMxfp4Activations& operator=(const ScopedMxfp4Activations&) = delete;

 private:
  Mxfp4Activations saved_;
};

// Runs fn once per kernel family of the format: MXFP4 has one per activation mode.
template <typename Fn>
void for_each_mode(WeightFormat format, const Fn& fn) {
  if (format != WeightFormat::MXFP4) {
    fn();
    return;
  }
  for (Mxfp4Activations mode : {Mxfp4Activations::Float32, Mxfp4Activations::Int8}) {
    ScopedMxfp4Activations scoped(mode);
    fn();
  }
}

std::string kernel_name(WeightFormat format) {
  std::string name = name_of(format);
  if (format == WeightFormat::MXFP4) name += std::string("/") + mxfp4_activations_name(mxfp4_activations());
  return name;
}

// A layer with random weights that owns its storage.
struct RandomLayer {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
  std::vector<float> row_scales;
  std::vector<float> bias;
  LinearWeight weight;

  // MXFP4 block scales are drawn from [scale_min, scale_min + scale_span).
  RandomLayer(WeightFormat format, int64_t out, int64_t in, bool with_bias, uint32_t seed,
              int scale_min = 120, int scale_span = 12) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const size_t n = size_t(out * in);
    switch (format) {
      case WeightFormat::F32: {
        data.resize(n * 4);
        for (size_t i = 0; i < n; ++i) {
          const float v = uniform(rng);
          std::memcpy(data.data() + 4 * i, &v, 4);
        }
        break;
      }
      case WeightFormat::BF16:
      case WeightFormat::F16: {
        data.resize(n * 2);
        for (size_t i = 0; i < n; ++i) {
          const float v = uniform(rng);
          const uint16_t bits = format == WeightFormat::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
          std::memcpy(data.data() + 2 * i, &bits, 2);
        }
        break;
      }
      case WeightFormat::MXFP4: {
        data.resize(n / 2);
        for (auto& byte : data) byte = uint8_t(rng());
        scales.resize(n / 32);
        // Around 2^0 by default, spread enough that a scale applied to the wrong block shows.
        for (auto& s : scales) s = uint8_t(scale_min + int(rng() % uint32_t(scale_span)));
        break;
      }
      case WeightFormat::NVFP4: {
        // Any E4M3 block scale but the NaN codes: both signs, subnormals, up to 448.
        data.resize(n / 2);
        for (auto& byte : data) byte = uint8_t(rng());
        scales.resize(n / 16);
        for (auto& s : scales) {
          do s = uint8_t(rng());
          while ((s & 0x7f) == 0x7f);
        }
        weight.global_scale = 0.0371f;
        break;
      }
      case WeightFormat::FP8: {
        data.resize(n);
        for (auto& byte : data) {
          do byte = uint8_t(rng());
          while ((byte & 0x7f) == 0x7f);
        }
        row_scales.resize(size_t(out));
        for (auto& s : row_scales) s = std::ldexp(1.0f + uniform(rng) * 0.5f, int(rng() % 16) - 12);
        break;
      }
    }
    if (with_bias) {
      bias.resize(size_t(out));
      for (auto& b : bias) b = uniform(rng);
    }
    weight.format = format;
    weight.out_features = out;
    weight.in_features = in;
    weight.data = data.data();
    weight.scales = scales.empty() ? nullptr : scales.data();
    weight.row_scales = row_scales.empty() ? nullptr : row_scales.data();
    weight.bias = bias.empty() ? nullptr : bias.data();
  }
};

std::vector<float> random_input(int64_t tokens, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(tokens * in));
  for (auto& v : x) v = normal(rng);
  return x;
}

struct Shape {
  int64_t out;
  int64_t in;
};

struct RowRange {
  int64_t begin;
  int64_t end;
};

// Rows [range.begin, range.end) of the layer as a layer of their own.
LinearWeight slice_rows(const LinearWeight& weight, RowRange range) {
  LinearWeight slice = weight;
  slice.out_features = range.end - range.begin;
  const int64_t in = weight.in_features;
  const uint8_t* data = static_cast<const uint8_t*>(weight.data);
  switch (weight.format) {
    case WeightFormat::F32:
      slice.data = data + range.begin * in * 4;
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      slice.data = data + range.begin * in * 2;
      break;
    case WeightFormat::MXFP4:
      slice.data = data + range.begin * in / 2;
      slice.scales = weight.scales + range.begin * in / 32;
      break;
    case WeightFormat::NVFP4:
      slice.data = data + range.begin * in / 2;
      slice.scales = weight.scales + range.begin * in / 16;
      break;
    case WeightFormat::FP8:
      slice.data = data + range.begin * in;
      slice.row_scales = weight.row_scales + range.begin;
      break;
  }
  if (weight.bias != nullptr) slice.bias = weight.bias + range.begin;
  return slice;
}

// Runs linear_forward (and the portable kernel) for each token count on a prefix of one input
// and compares the rows in `checked` with the reference (in the current MXFP4 activation mode),
// allowing float32 reassociation error: 1e-5 of sum_i |x_i * w_i| + |bias|. The reference is
// slow, so big layers check a few row ranges (including the boundary between the two threads'
// halves).
void check_against_reference(WeightFormat format, Shape shape, const std::vector<int64_t>& token_counts,
                             bool bias, uint32_t seed, std::vector<RowRange> checked = {},
                             int scale_min = 120, int scale_span = 12) {
  if (checked.empty()) checked.push_back({0, shape.out});
  RandomLayer layer(format, shape.out, shape.in, bias, seed, scale_min, scale_span);
  int64_t max_tokens = 0;
  for (int64_t t : token_counts) max_tokens = std::max(max_tokens, t);
  const std::vector<float> x = random_input(max_tokens, shape.in, seed + 1);

  struct Expected {
    RowRange rows;
    std::vector<float> y;           // [max_tokens, rows]
    std::vector<double> magnitude;  // [max_tokens, rows]
  };
  std::vector<Expected> expected;
  for (const RowRange& range : checked) {
    const LinearWeight slice = slice_rows(layer.weight, range);
    Expected e{range, std::vector<float>(size_t(max_tokens * slice.out_features)),
               std::vector<double>(size_t(max_tokens * slice.out_features))};
    linear_forward_reference(slice, x.data(), max_tokens, e.y.data(), mxfp4_activations());
    std::vector<float> w(static_cast<size_t>(shape.in));
    for (int64_t o = 0; o < slice.out_features; ++o) {
      linear_decode_row(slice, o, w.data());
      for (int64_t t = 0; t < max_tokens; ++t) {
        double sum = slice.bias != nullptr ? std::fabs(double(slice.bias[o])) : 0.0;
        for (int64_t i = 0; i < shape.in; ++i)
          sum += std::fabs(double(x[size_t(t * shape.in + i)]) * double(w[size_t(i)]));
        e.magnitude[size_t(t * slice.out_features + o)] = sum;
      }
    }
    expected.push_back(std::move(e));
  }

  auto compare = [&](const std::vector<float>& y, int64_t tokens, const std::string& what) {
    int failures = 0;
    for (const Expected& e : expected) {
      const int64_t rows = e.rows.end - e.rows.begin;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t o = 0; o < rows && failures < 5; ++o) {
          const float got = y[size_t(t * shape.out + e.rows.begin + o)];
          const float want = e.y[size_t(t * rows + o)];
          const double tolerance = 1e-5 * e.magnitude[size_t(t * rows + o)] + 1e-30;
          const double error = std::fabs(double(got) - double(want));
          if (!(error <= tolerance)) {
            ADD_FAILURE() << what << ": token " << t << " row " << e.rows.begin + o << " got " << got
                          << " expected " << want << " (error " << error << ", tolerance " << tolerance
                          << ")";
            ++failures;
          }
        }
      }
    }
  };

  ThreadPool pool(2);
  for (int64_t tokens : token_counts) {
    const std::string what = kernel_name(format) + " out=" + std::to_string(shape.out) +
                             " in=" + std::to_string(shape.in) + " tokens=" + std::to_string(tokens) +
                             (bias ? " bias" : "");
    std::vector<float> y(size_t(tokens * shape.out), NAN);
    linear_forward(layer.weight, x.data(), tokens, y.data(), pool);
    compare(y, tokens, what + " (" + cpu_kernel_isa() + ")");

    std::vector<float> y_portable(size_t(tokens * shape.out), NAN);
    cpu::linear_forward_scalar(layer.weight, x.data(), tokens, y_portable.data(), pool);
    compare(y_portable, tokens, what + " (portable kernel)");
  }
}

const WeightFormat kAllFormats[] = {WeightFormat::F32,   WeightFormat::BF16,  WeightFormat::F16,
                                    WeightFormat::MXFP4, WeightFormat::NVFP4, WeightFormat::FP8};

TEST(Linear, MatchesReferenceOnSmallShapes) {
  // Every token-tile size (1..8), uneven tiles, both the few-token and the many-token kernels,
  // odd row counts and, for the dense formats, in sizes that leave a tail after the SIMD chunks.
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 23, 40};
  for (WeightFormat format : kAllFormats) {
    std::vector<Shape> shapes = {{37, 64}, {1, 32}, {3, 96}, {130, 320}, {17, 2880}};
    if (format == WeightFormat::NVFP4) {
      // Rows of 32k + 16: one 16-element block after the 32-element chunks.
      shapes.insert(shapes.end(), {{5, 16}, {9, 48}, {33, 336}, {70, 2896}});
    } else if (format != WeightFormat::MXFP4) {
      shapes.insert(shapes.end(), {{37, 67}, {1, 1}, {5, 7}, {9, 15}, {33, 17}, {70, 301}});
    }
    for_each_mode(format, [&] {
      uint32_t seed = 1;
      for (const Shape& shape : shapes) {
        check_against_reference(format, shape, tokens, /*bias=*/seed % 2 == 0, seed);
        ++seed;
      }
    });
  }
}

TEST(LinearMxfp4, MatchesReferenceWithWideScales) {
  // Block scales far from 2^0 (2^-27..2^26), which an fp16 lookup table could not hold (it
  // covered 2^-13..2^13): first nearly every row has some, then about one block in 28.
  for_each_mode(WeightFormat::MXFP4, [] {
    check_against_reference(WeightFormat::MXFP4, {37, 320}, {1, 2, 3, 5, 8, 9, 23}, true, 77, {}, 100, 54);
    check_against_reference(WeightFormat::MXFP4, {37, 320}, {1, 2, 3, 5, 8, 9, 23}, true, 78, {}, 113, 28);
  });
}

TEST(Linear, MatchesReferenceWithManyTokens) {
  // Past one group of tokens in the many-token kernel, with uneven groups.
  uint32_t seed = 50;
  for (WeightFormat format : kAllFormats) {
    for_each_mode(format, [&] { check_against_reference(format, {50, 320}, {97, 150, 200}, /*bias=*/true, seed); });
    ++seed;
  }
}

TEST(Linear, MatchesReferenceAtGptOssShape) {
  for (WeightFormat format : kAllFormats) {
    for_each_mode(format, [&] {
      check_against_reference(format, {5760, 2880}, {1, 3, 17, 70}, /*bias=*/true, 100,
                              {{0, 40}, {2860, 2900}, {5737, 5760}});
    });
  }
}

TEST(Linear, ResultDoesNotDependOnThreadCount) {
  ThreadPool one(1), two(2), three(3);
  for (WeightFormat format : kAllFormats) {
    RandomLayer layer(format, 1000, 640, true, 7);
    for_each_mode(format, [&] {
      for (int64_t tokens : {1, 2, 11, 50}) {
        const std::vector<float> x = random_input(tokens, 640, 8);
        const size_t count = size_t(tokens * 1000);
        std::vector<float> y1(count), y2(count), y3(count);
        linear_forward(layer.weight, x.data(), tokens, y1.data(), one);
        linear_forward(layer.weight, x.data(), tokens, y2.data(), two);
        linear_forward(layer.weight, x.data(), tokens, y3.data(), three);
        EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), count * sizeof(float))) << kernel_name(format) << " " << tokens;
        EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), count * sizeof(float))) << kernel_name(format) << " " << tokens;
      }
    });
  }
}

TEST(Linear, GroupEqualsEachLayerAlone) {
  // q, k and v (or gate and up) run as one group sharing x and one fork/join: every output must
  // be bit for bit what the layer gives alone, for row counts that split the group's rows across
  // threads mid-layer.
  ThreadPool one(1), three(3);
  for (WeightFormat format : kAllFormats) {
    const int64_t in = format == WeightFormat::MXFP4 ? 320 : format == WeightFormat::NVFP4 ? 336 : 333;
    RandomLayer a(format, 75, in, true, 21), b(format, 19, in, false, 22), c(format, 40, in, true, 23);
    for_each_mode(format, [&] {
      for (int64_t tokens : {1, 2, 7, 8, 33}) {
        const std::vector<float> x = random_input(tokens, in, 24);
        std::vector<float> ya(size_t(tokens * 75)), yb(size_t(tokens * 19)), yc(size_t(tokens * 40));
        linear_forward(a.weight, x.data(), tokens, ya.data(), one);
        linear_forward(b.weight, x.data(), tokens, yb.data(), one);
        linear_forward(c.weight, x.data(), tokens, yc.data(), one);
        for (ThreadPool* pool : {&one, &three}) {
          std::vector<float> ga(ya.size()), gb(yb.size()), gc(yc.size());
          const LinearWeight* layers[] = {&a.weight, &b.weight, &c.weight};
          float* outputs[] = {ga.data(), gb.data(), gc.data()};
          linear_forward_group(layers, x.data(), tokens, outputs, *pool);
          EXPECT_EQ(ga, ya) << kernel_name(format) << " tokens " << tokens;
          EXPECT_EQ(gb, yb) << kernel_name(format) << " tokens " << tokens;
          EXPECT_EQ(gc, yc) << kernel_name(format) << " tokens " << tokens;
        }
      }
    });
  }
}

TEST(Linear, GroupOfMixedFormatsRunsEachLayer) {
  ThreadPool pool(2);
  RandomLayer bf16(WeightFormat::BF16, 33, 320, true, 31), fp32(WeightFormat::F32, 17, 320, false, 32);
  const std::vector<float> x = random_input(3, 320, 33);
  std::vector<float> y1(3 * 33), y2(3 * 17), g1(y1.size()), g2(y2.size());
  linear_forward(bf16.weight, x.data(), 3, y1.data(), pool);
  linear_forward(fp32.weight, x.data(), 3, y2.data(), pool);
  const LinearWeight* layers[] = {&bf16.weight, &fp32.weight};
  float* outputs[] = {g1.data(), g2.data()};
  linear_forward_group(layers, x.data(), 3, outputs, pool);
  EXPECT_EQ(g1, y1);
  EXPECT_EQ(g2, y2);
  float* one_output[] = {g1.data()};
  EXPECT_THROW(linear_forward_group(layers, x.data(), 3, one_output, pool), std::exception);
}

TEST(Linear, TokenResultDoesNotDependOnBatch) {
  // A server batches unrelated requests: each token's output must be bit-identical to computing
  // it alone, whichever kernel (few-token or many-token) the batch size selects.
  ThreadPool pool(2);
  for (WeightFormat format : kAllFormats) {
    const int64_t in = format == WeightFormat::MXFP4 ? 320 : format == WeightFormat::NVFP4 ? 336 : 333;
    RandomLayer layer(format, 45, in, true, 11, 108, 40);
    const int64_t max_tokens = 70;
    const std::vector<float> x = random_input(max_tokens, in, 12);
    std::vector<float> alone(size_t(max_tokens * 45)), together(size_t(max_tokens * 45));
    for_each_mode(format, [&] {
      for (int64_t t = 0; t < max_tokens; ++t) {
        linear_forward(layer.weight, x.data() + t * in, 1, alone.data() + t * 45, pool);
      }
      for (int64_t tokens : {2, 3, 5, 8, 9, 19, 20, 31, 32, 70}) {
        linear_forward(layer.weight, x.data(), tokens, together.data(), pool);
        EXPECT_EQ(0, std::memcmp(alone.data(), together.data(), size_t(tokens * 45) * sizeof(float)))
            << kernel_name(format) << " tokens " << tokens;
      }
    });
  }
}

TEST(Linear, ZeroTokensWritesNothing) {
  RandomLayer layer(WeightFormat::BF16, 4, 16, false, 3);
  ThreadPool pool(1);
  float y = 42.0f;
  linear_forward(layer.weight, nullptr, 0, &y, pool);
  EXPECT_EQ(y, 42.0f);
}

TEST(Linear, EmptyInputGivesBias) {
  const float bias[3] = {1.0f, -2.0f, 0.5f};
  // Never read as weights (in_features is 0), but FP8 reads one row scale per output row.
  const float unused[3] = {0.0f, 0.0f, 0.0f};
  for (WeightFormat format : kAllFormats) {
    LinearWeight weight;
    weight.format = format;
    weight.out_features = 3;
    weight.in_features = 0;
    weight.data = unused;
    weight.scales = reinterpret_cast<const uint8_t*>(unused);
    weight.row_scales = unused;
    weight.bias = bias;
    const float x = 0.0f;
    ThreadPool pool(2);
    for_each_mode(format, [&] {
      for (int64_t tokens : {2, 40}) {  // both the few-token and the many-token kernels
        std::vector<float> y(size_t(tokens * 3), NAN);
        linear_forward(weight, &x, tokens, y.data(), pool);
        for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], bias[i % 3]) << kernel_name(format) << " " << i;
      }
    });
  }
}

TEST(Linear, AddsBias) {
  const float w[6] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // [3, 2]
  const float bias[3] = {0.5f, -1.0f, 100.0f};
  LinearWeight weight;
  weight.format = WeightFormat::F32;
  weight.out_features = 3;
  weight.in_features = 2;
  weight.data = w;
  weight.bias = bias;
  const float x[4] = {1.0f, 1.0f, 2.0f, -1.0f};  // two tokens
  float y[6] = {};
  ThreadPool pool(2);
  linear_forward(weight, x, 2, y, pool);
  const float expected[6] = {3.5f, 6.0f, 111.0f, 0.5f, 1.0f, 104.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], expected[i]) << i;
  linear_forward_reference(weight, x, 2, y);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], expected[i]) << i;
}

TEST(Linear, DecodeRowDenseFormats) {
  const float values[5] = {1.0f, -2.5f, 0.15625f, 65504.0f, -0.0f};
  uint16_t bf16[5], f16[5];
  for (int i = 0; i < 5; ++i) {
    bf16[i] = f32_to_bf16(values[i]);
    f16[i] = f32_to_f16(values[i]);
  }
  LinearWeight weight;
  weight.out_features = 1;
  weight.in_features = 5;
  float out[5];

  weight.format = WeightFormat::F32;
  weight.data = values;
  linear_decode_row(weight, 0, out);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], values[i]);

  weight.format = WeightFormat::BF16;
  weight.data = bf16;
  linear_decode_row(weight, 0, out);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], bf16_to_f32(bf16[i]));

  weight.format = WeightFormat::F16;
  weight.data = f16;
  linear_decode_row(weight, 0, out);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], f16_to_f32(f16[i]));
}

// One row, two blocks: block 0 holds every code at an even and an odd position, block 1 the
// reverse, with different scales.
struct HandBuiltMxfp4 {
  uint8_t codes[32];
  uint8_t scales[2];
  float expected[64];
  LinearWeight weight;

  HandBuiltMxfp4(uint8_t scale0, uint8_t scale1) {
    scales[0] = scale0;
    scales[1] = scale1;
    for (int g = 0; g < 2; ++g) {
      const float scale = std::ldexp(1.0f, int(scales[g]) - 127);
      for (int j = 0; j < 16; ++j) {
        const int low = g == 0 ? j : 15 - j;
        const int high = g == 0 ? 15 - j : j;
        codes[g * 16 + j] = uint8_t(high << 4 | low);
        expected[g * 32 + 2 * j] = kFp4E2M1Values[low] * scale;
        expected[g * 32 + 2 * j + 1] = kFp4E2M1Values[high] * scale;
      }
    }
    weight.format = WeightFormat::MXFP4;
    weight.out_features = 1;
    weight.in_features = 64;
    weight.data = codes;
    weight.scales = scales;
  }
};

TEST(LinearMxfp4, DecodesHandBuiltBlocks) {
  HandBuiltMxfp4 layer(127, 129);  // scales 1 and 4
  // Spot checks against the spec, independent of the table: byte 0 = 0xF0 -> element 0 is
  // code 0 (+0), element 1 is code 15 (-6).
  EXPECT_EQ(layer.codes[0], 0xF0);
  EXPECT_EQ(layer.expected[0], 0.0f);
  EXPECT_EQ(layer.expected[1], -6.0f);
  EXPECT_EQ(layer.expected[2 * 7], 6.0f);       // code 7, scale 1
  EXPECT_EQ(layer.expected[32 + 1], 0.0f);      // block 1: byte 0 high nibble = code 0
  EXPECT_EQ(layer.expected[32], -6.0f * 4.0f);  // block 1: byte 0 low nibble = code 15, scale 4

  float row[64];
  linear_decode_row(layer.weight, 0, row);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(row[i], layer.expected[i]) << i;
}

TEST(LinearMxfp4, KernelsPickEachElementWithItsScale) {
  // One-hot inputs make y[t] the weight element t itself, so any nibble-order or scale mix-up in
  // a SIMD kernel shows as a wrong value in a known place. 64 tokens also cover the many-token
  // path (tiles of 8) and the few-token path (the tail). The int8 kernels see the 1 as 127 with
  // scale 1/254 (rounded), so they are exact to one float rounding of that scale (and a few
  // units of 2^-149 where the product is subnormal).
  for_each_mode(WeightFormat::MXFP4, [] {
    const bool exact = mxfp4_activations() == Mxfp4Activations::Float32;
    for (const auto& scales : {std::pair<uint8_t, uint8_t>{127, 129}, {1, 140}, {0, 130}, {100, 126}, {252, 2}}) {
      HandBuiltMxfp4 layer(scales.first, scales.second);
      for (int64_t tokens : {64, 3, 1}) {
        std::vector<float> x(size_t(tokens * 64), 0.0f);
        for (int64_t t = 0; t < tokens; ++t) x[size_t(t * 64 + t)] = 1.0f;
        std::vector<float> y(static_cast<size_t>(tokens));
        ThreadPool pool(2);
        linear_forward(layer.weight, x.data(), tokens, y.data(), pool);
        for (int64_t t = 0; t < tokens; ++t) {
          const float want = layer.expected[t];
          if (exact) {
            EXPECT_EQ(y[size_t(t)], want) << "scales " << int(scales.first) << "," << int(scales.second)
                                          << " tokens " << tokens << " element " << t;
          } else {
            EXPECT_NEAR(y[size_t(t)], want, std::fabs(want) * 2e-7f + 1e-43f)
                << "int8, scales " << int(scales.first) << "," << int(scales.second) << " tokens " << tokens
                << " element " << t;
          }
        }
      }
    }
  });
}

TEST(LinearMxfp4Int8, QuantizesLikeTheDefinition) {
  // Block 0 spans signs and a tie (0.5 * 127 / 127 rounds to even), block 1 is all zero, block 2
  // tiny (below 2^-120: zero), block 3 holds an infinity and block 4 a NaN (both poison the block).
  std::vector<float> x(160, 0.0f);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = float(i - 16) / 16.0f;
  x[5] = 0.5f / 127.0f * 1.0f;  // exactly half a step: rounds to 0
  for (int i = 64; i < 96; ++i) x[size_t(i)] = 1e-38f;
  x[100] = INFINITY;
  x[140] = NAN;
  int8_t q[160];
  float scales[5];
  quantize_mxfp4_input(x.data(), 160, q, scales);
  EXPECT_EQ(scales[0], 1.0f / 127.0f * 0.5f);
  EXPECT_EQ(q[0], -127);  // -16/16 = -1 -> -127
  EXPECT_EQ(q[31], int8_t(std::nearbyint(15.0f / 16.0f * 127.0f)));
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[5], 0);
  EXPECT_EQ(scales[1], 0.0f);
  EXPECT_EQ(scales[2], 0.0f);
  for (int i = 32; i < 160; ++i) EXPECT_EQ(q[i], 0) << i;
  EXPECT_TRUE(std::isnan(scales[3]));
  EXPECT_TRUE(std::isnan(scales[4]));
  EXPECT_THROW(quantize_mxfp4_input(x.data(), 48, q, scales), Error);
}

TEST(LinearMxfp4Int8, SimdQuantizationMatchesTheDefinition) {
  if (!cpu::cpu_use_avx2()) GTEST_SKIP() << "no AVX2";
  const int64_t tokens = 3, in = 320;
  std::vector<float> x = random_input(tokens, in, 5);
  x[7] = 1e-39f;      // a denormal in an ordinary block
  x[40] = -1e30f;     // a huge value: the rest of its block rounds to 0
  for (int i = 64; i < 96; ++i) x[size_t(i)] = 1e-37f * float(i % 5);  // below 2^-120 only for some
  std::vector<int8_t> q(size_t(tokens * in));
  std::vector<int16_t> offsets(size_t(tokens * in / 2));
  std::vector<float> scales(size_t(tokens * in / 32));
  cpu::mxfp4_int8_quantize_avx2(x.data(), tokens, in, {q.data(), offsets.data(), scales.data()});
  std::vector<int8_t> want_q(static_cast<size_t>(in));
  std::vector<float> want_scales(static_cast<size_t>(in / 32));
  for (int64_t t = 0; t < tokens; ++t) {
    quantize_mxfp4_input(x.data() + t * in, in, want_q.data(), want_scales.data());
    for (int64_t b = 0; b < in / 32; ++b) {
      EXPECT_EQ(scales[size_t(t * in / 32 + b)], want_scales[size_t(b)]) << t << " " << b;
      const int8_t* got = q.data() + t * in + b * 32;
      const int16_t* got_offsets = offsets.data() + t * in / 2 + b * 16;
      for (int j = 0; j < 16; ++j) {
        // Kernel order: the block's even elements, then its odd ones.
        EXPECT_EQ(got[j], want_q[size_t(b * 32 + 2 * j)]) << t << " " << b << " " << j;
        EXPECT_EQ(got[16 + j], want_q[size_t(b * 32 + 2 * j + 1)]) << t << " " << b << " " << j;
        EXPECT_EQ(got_offsets[j], 12 * (int(got[2 * j]) + int(got[2 * j + 1]))) << t << " " << b << " " << j;
      }
    }
  }
}

TEST(LinearMxfp4Int8, StaysCloseToFloat32) {
  // The int8 mode is an approximation: check its size on gpt-oss-like input (Gaussian), relative
  // to sum |x * w|, so a kernel that quietly lost precision (a wrong scale, a saturating sum)
  // would show even where it matched its own reference.
  RandomLayer layer(WeightFormat::MXFP4, 64, 2880, false, 21);
  const int64_t tokens = 3;
  const std::vector<float> x = random_input(tokens, 2880, 22);
  std::vector<float> exact(size_t(tokens * 64)), approx(exact.size()), w(2880);
  ThreadPool pool(2);
  {
    ScopedMxfp4Activations mode(Mxfp4Activations::Float32);
    linear_forward(layer.weight, x.data(), tokens, exact.data(), pool);
  }
  {
    ScopedMxfp4Activations mode(Mxfp4Activations::Int8);
    linear_forward(layer.weight, x.data(), tokens, approx.data(), pool);
  }
  double worst = 0.0;
  for (int64_t o = 0; o < 64; ++o) {
    linear_decode_row(layer.weight, o, w.data());
    for (int64_t t = 0; t < tokens; ++t) {
      double magnitude = 0.0;
      for (int64_t i = 0; i < 2880; ++i) magnitude += std::fabs(double(x[size_t(t * 2880 + i)]) * double(w[size_t(i)]));
      worst = std::max(worst, std::fabs(double(exact[size_t(t * 64 + o)]) - double(approx[size_t(t * 64 + o)])) / magnitude);
    }
  }
  EXPECT_GT(worst, 0.0);  // it is an approximation
  EXPECT_LT(worst, 2e-3);
}

TEST(LinearMxfp4Int8, NonFiniteInputGivesNan) {
  RandomLayer layer(WeightFormat::MXFP4, 5, 64, true, 31);
  ScopedMxfp4Activations mode(Mxfp4Activations::Int8);
  ThreadPool pool(1);
  for (float poison : {float(INFINITY), float(NAN)}) {
    std::vector<float> x = random_input(2, 64, 32);
    x[64 + 40] = poison;  // token 1, block 1
    std::vector<float> y(10);
    linear_forward(layer.weight, x.data(), 2, y.data(), pool);
    for (int o = 0; o < 5; ++o) {
      EXPECT_TRUE(std::isfinite(y[size_t(o)])) << o;
      EXPECT_TRUE(std::isnan(y[size_t(5 + o)])) << o;
    }
  }
}

TEST(LinearMxfp4, RejectsBadLayers) {
  uint8_t codes[48] = {};
  uint8_t scales[3] = {127, 127, 127};
  float x[48] = {}, y[2] = {}, row[48];
  ThreadPool pool(1);
  LinearWeight weight;
  weight.format = WeightFormat::MXFP4;
  weight.out_features = 2;
  weight.in_features = 48;  // not a multiple of 32
  weight.data = codes;
  weight.scales = scales;
  EXPECT_THROW(linear_forward(weight, x, 1, y, pool), Error);
  EXPECT_THROW(linear_forward_reference(weight, x, 1, y), Error);
  EXPECT_THROW(linear_decode_row(weight, 0, row), Error);

  weight.in_features = 32;
  weight.data = nullptr;
  EXPECT_THROW(linear_forward(weight, x, 1, y, pool), Error);
  weight.data = codes;
  weight.scales = nullptr;
  EXPECT_THROW(linear_forward(weight, x, 1, y, pool), Error);
  weight.scales = scales;
  EXPECT_NO_THROW(linear_forward(weight, x, 1, y, pool));
  EXPECT_THROW(linear_decode_row(weight, 2, row), Error);
}

TEST(Linear, RejectsNullData) {
  LinearWeight weight;
  weight.format = WeightFormat::BF16;
  weight.out_features = 2;
  weight.in_features = 4;
  float x[4] = {}, y[2] = {};
  ThreadPool pool(1);
  EXPECT_THROW(linear_forward(weight, x, 1, y, pool), Error);
  EXPECT_THROW(linear_forward_reference(weight, x, 1, y), Error);
}

TEST(Linear, WeightBytes) {
  LinearWeight weight;
  weight.out_features = 5760;
  weight.in_features = 2880;
  weight.format = WeightFormat::F32;
  EXPECT_EQ(weight.weight_bytes(), size_t(5760) * 2880 * 4);
  weight.format = WeightFormat::BF16;
  EXPECT_EQ(weight.weight_bytes(), size_t(5760) * 2880 * 2);
  weight.format = WeightFormat::F16;
  EXPECT_EQ(weight.weight_bytes(), size_t(5760) * 2880 * 2);
  weight.format = WeightFormat::MXFP4;
  EXPECT_EQ(weight.weight_bytes(), size_t(5760) * 90 * 17);  // 16 code bytes + 1 scale per block
  weight.format = WeightFormat::NVFP4;
  EXPECT_EQ(weight.weight_bytes(), size_t(5760) * 180 * 9 + 4);  // 8 code bytes + 1 scale per block, 1 global
  weight.format = WeightFormat::FP8;
  EXPECT_EQ(weight.weight_bytes(), size_t(5760) * 2880 + 5760 * 4);  // 1 byte per weight + 1 scale per row
}

TEST(Linear, ReportsKernelIsa) {
  const std::string isa = cpu_kernel_isa();
  EXPECT_EQ(isa, cpu::cpu_use_avx512() ? "avx512+avx2+fma" : cpu::cpu_use_avx2() ? "avx2+fma" : "scalar");
}

}  // namespace
}  // namespace anvil
