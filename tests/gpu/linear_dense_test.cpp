// cuda::linear_bf16 and cuda::linear with FP8 weights against the CPU reference
// (linear_forward_reference) on fresh random data: every output element must be written (outputs
// are poisoned with NaN first), and the relative error over the checked rows must be small.
// Shapes cover both kernels (matrix-vector for m <= 32, tensor-core GEMM above), tails in every
// dimension, and the gpt-oss / Qwen3 layer shapes; the big ones print their speed (informational
// only). FP8 weights are quantized by the CPU quantizer and laid out on the host; the device
// quantizer is checked against the CPU one byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/runtime.h"
#include "backend/linear.h"
#include "backend/quantize.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "support/device_vectors.h"

namespace anvil {
namespace {

using test::Rng;
using test::to_device;

std::vector<uint16_t> random_bf16(size_t n, Rng& rng, float scale) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(rng.uniform() * scale);
  return v;
}

// Rows checked against the reference: all of them for small m, else the edges, the tile
// boundaries and a few random ones.
std::vector<int64_t> rows_to_check(int64_t m, Rng& rng) {
  if (m <= 64) {
    std::vector<int64_t> all(size_t(m), 0);
    for (int64_t i = 0; i < m; ++i) all[size_t(i)] = i;
    return all;
  }
  std::set<int64_t> rows = {0, 1, m - 2, m - 1};
  for (int64_t edge : {int64_t(63), int64_t(64), int64_t(127), int64_t(128), int64_t(129)})
    if (edge < m) rows.insert(edge);
  while (rows.size() < 24) rows.insert(int64_t(rng.next() % uint64_t(m)));
  return {rows.begin(), rows.end()};
}

// Which engine bf16 products of prefill size run on while it lives: cuBLASLt (when found) or
// anvil's own GEMM. The perf lines name it.
struct GemmEngine {
  explicit GemmEngine(bool cublaslt) : name(cublaslt ? "cublaslt" : "anvil") { cuda::cublaslt::allow(cublaslt); }
  ~GemmEngine() { cuda::cublaslt::allow(true); }
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;
  std::string name;
};

// Runs `body` with anvil's GEMM, then with cuBLASLt where it is found.
template <typename Body>
void for_each_engine(Body body) {
  for (bool cublaslt : {false, true}) {
    if (cublaslt && !cuda::cublaslt::available()) {
      std::printf("[ note ] cuBLASLt: %s; its runs are left out\n", cuda::cublaslt::describe().c_str());
      continue;
    }
    GemmEngine engine(cublaslt);
    SCOPED_TRACE("engine " + engine.name);
    body(engine.name);
  }
}

struct Case {
  int64_t m, out, in;
  bool bias;
  int timing_runs = 0;  // > 0: print speed
  int64_t max_checked_rows = 1 << 30;
  bool fp8 = false;
};

// FP8 codes from row-major [out, in] to the device layout (fp8_layout.h).
std::vector<uint8_t> to_device_layout(const uint8_t* codes, int64_t out, int64_t in) {
  std::vector<uint8_t> stored(size_t(out * in));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t k = 0; k < in; ++k) stored[size_t(r * in + cuda::fp8::stored_position(int(k)))] = codes[r * in + k];
  return stored;
}

void run_case(const Case& c, uint64_t seed, const std::string& engine = "") {
  SCOPED_TRACE("m=" + std::to_string(c.m) + " out=" + std::to_string(c.out) + " in=" + std::to_string(c.in));
  Rng rng(seed);
  const float w_scale = 1.0f / std::sqrt(float(c.in));
  const auto weight = random_bf16(size_t(c.out * c.in), rng, w_scale);
  const auto x = random_bf16(size_t(c.m * c.in), rng, 1.0f);
  std::vector<float> bias;
  if (c.bias) {
    bias.resize(size_t(c.out));
    for (auto& b : bias) b = rng.uniform();
  }
  LinearWeight lw;
  lw.format = WeightFormat::BF16;
  lw.out_features = c.out;
  lw.in_features = c.in;
  lw.data = weight.data();
  lw.bias = c.bias ? bias.data() : nullptr;
  QuantizedLinear quantized;
  cuda::DenseWeight dw;
  cuda::DeviceBuffer d_weight, d_scales;
  if (c.fp8) {
    quantized = quantize_linear(lw, WeightFormat::FP8, "test", default_thread_pool());
    lw = quantized.weight();
    d_weight = to_device(to_device_layout(static_cast<const uint8_t*>(lw.data), c.out, c.in));
    d_scales = to_device(std::vector<float>(lw.row_scales, lw.row_scales + c.out));
    dw.format = cuda::DenseWeight::Format::FP8;
    dw.row_scales = d_scales.get<float>();
  } else {
    d_weight = to_device(weight);
  }
  dw.data = d_weight.get();
  auto d_x = to_device(x);
  cuda::DeviceBuffer d_bias;
  if (c.bias) d_bias = to_device(bias);
  cuda::DeviceBuffer d_y(size_t(c.m * c.out) * sizeof(float));
  cuda::memset_device(d_y.get(), 0xff, d_y.bytes());  // NaN everywhere

  auto run = [&] {
    if (c.fp8)
      cuda::linear(dw, c.bias ? d_bias.get<float>() : nullptr, d_x.get<uint16_t>(), c.m, c.out, c.in, d_y.get<float>(),
                   nullptr);
    else
      cuda::linear_bf16(d_weight.get<uint16_t>(), c.bias ? d_bias.get<float>() : nullptr, d_x.get<uint16_t>(), c.m,
                        c.out, c.in, d_y.get<float>(), nullptr);
  };
  run();
  cuda::synchronize();
  std::vector<float> y(size_t(c.m * c.out));
  cuda::copy_to_host(y.data(), d_y.get(), d_y.bytes());
  int64_t non_finite = 0;
  for (float v : y) non_finite += std::isfinite(v) ? 0 : 1;
  EXPECT_EQ(non_finite, 0) << "outputs left unwritten or NaN";

  auto rows = rows_to_check(c.m, rng);
  if (int64_t(rows.size()) > c.max_checked_rows) rows.resize(size_t(c.max_checked_rows));
  std::vector<float> x_rows(rows.size() * size_t(c.in)), ref(rows.size() * size_t(c.out));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t i = 0; i < c.in; ++i) x_rows[r * size_t(c.in) + size_t(i)] = bf16_to_f32(x[size_t(rows[r] * c.in + i)]);
  linear_forward_reference(lw, x_rows.data(), int64_t(rows.size()), ref.data());
  double err = 0, norm = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t o = 0; o < c.out; ++o) {
      const double got = y[size_t(rows[r] * c.out + o)], want = ref[r * size_t(c.out) + size_t(o)];
      err += (got - want) * (got - want);
      norm += want * want;
    }
  const double rel = std::sqrt(err / norm);
  // Products of bf16 values (FP8 codes decode to bf16 exactly) are exact in fp32 and accumulation
  // is fp32: the error is rounding only (~1e-6); anything structural (a missed chunk, a wrong row
  // or k order, a lost scale) is far above this bar.
  EXPECT_LT(rel, 2e-3) << "relative error " << rel;

  if (c.timing_runs > 0) {
    for (int i = 0; i < 3; ++i) run();
    std::vector<double> ms;
    cuda::EventTimer timer;
    for (int i = 0; i < c.timing_runs; ++i) {
      timer.start();
      run();
      ms.push_back(timer.stop_ms());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2] * 1e-3;
    const double bytes = double(c.out * c.in * (c.fp8 ? 1 : 2) + c.m * c.in * 2 + c.m * c.out * 4);
    const double flops = 2.0 * double(c.m) * double(c.out) * double(c.in);
    std::printf("[ perf ] linear %s%s%s m=%lld out=%lld in=%lld: %.1f us, %.0f GB/s, %.1f TFLOP/s\n",
                c.fp8 ? "fp8" : "bf16", engine.empty() ? "" : " ", engine.c_str(), static_cast<long long>(c.m), static_cast<long long>(c.out), static_cast<long long>(c.in), median * 1e6,
                bytes / median * 1e-9, flops / median * 1e-12);
  }
}

TEST(CudaLinearBf16, MatchesReferenceAcrossRowCounts) {
  ANVIL_REQUIRE_GPU();
  for_each_engine([](const std::string&) {
    uint64_t seed = 1;
    for (int64_t m : {1, 3, 8, 9, 16, 17, 32, 33, 64, 65, 300, 2048})
      for (auto [out, in] : {std::pair<int64_t, int64_t>{2880, 4096}, {512, 2880}, {4096, 2880}})
        run_case({m, out, in, m % 2 == 1}, seed++);
  });
}

TEST(CudaLinearBf16, Tails) {
  ANVIL_REQUIRE_GPU();
  // out not a multiple of 16/64/128 (nor of 4: 130 leaves cuBLASLt's output rows unaligned, so
  // those take anvil's GEMM either way), in not a multiple of 32 (still of 8), tiny shapes.
  for_each_engine([](const std::string&) {
    uint64_t seed = 100;
    for (int64_t m : {1, 5, 16, 31, 70, 200, 333})
      for (auto [out, in] : {std::pair<int64_t, int64_t>{2888, 2888}, {24, 40}, {8, 8}, {130, 136}, {1000, 1032}})
        run_case({m, out, in, true}, seed++);
  });
}

TEST(CudaLinearBf16, UnalignedFallback) {
  ANVIL_REQUIRE_GPU();
  uint64_t seed = 200;
  // in % 8 != 0: rows are not 16-byte aligned, so the generic kernel runs.
  for (int64_t m : {1, 7, 40})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{100, 100}, {33, 61}}) run_case({m, out, in, m != 7}, seed++);
}

TEST(CudaLinearBf16, ModelShapesWithSpeed) {
  ANVIL_REQUIRE_GPU();
  uint64_t seed = 300;
  // gpt-oss-20b/120b: o_proj (2880 x 4096), qkv (5120 x 2880); Qwen3 projections.
  run_case({1, 2880, 4096, true, 50}, seed++);
  run_case({8, 2880, 4096, true, 50}, seed++);
  run_case({1, 5120, 2880, true, 50}, seed++);
  // Prefill sizes on both engines (where cuBLASLt wins is what linear_dense.cu's threshold says).
  for_each_engine([&](const std::string& engine) {
    for (int64_t m : {64, 128, 256, 512})
      run_case({m, 5120, 2880, true, 20, 16}, seed++, engine);
    run_case({2048, 5120, 2880, true, 20, 16}, seed++, engine);
    run_case({2048, 2880, 4096, true, 20, 16}, seed++, engine);
    run_case({2048, 4096, 4096, false, 20, 16}, seed++, engine);
    run_case({2048, 12288, 4096, false, 10, 8}, seed++, engine);
  });
}

TEST(CudaLinearBf16, LmHeadShapes) {
  ANVIL_REQUIRE_GPU();
  // gpt-oss lm_head (201088 x 2880, 1.16 GB) and Qwen3's (151936 x 4096).
  run_case({1, 201088, 2880, false, 20}, 400);
  run_case({4, 201088, 2880, false, 20, 4}, 401);
  run_case({1, 151936, 4096, false, 20}, 402);
  for_each_engine([](const std::string& engine) { run_case({512, 201088, 2880, false, 5, 3}, 403, engine); });
}

// The bulk-copy GEMV (gemv_bulk.cuh) against the register-ring GEMV it replaces at one token:
// the same products in the same order, so the same bits, with and without bias, accumulating
// (linear_add) or not, rows past a 16-row tile, a part 1 KB stage (in = 2888, 1032) and a part
// 64-byte chunk (in = 40, 136). Out stays <= 4,224 rows, where the register ring runs 8 warps as
// the bulk kernel does (more rows take its 4-warp form, another summation order).
TEST(CudaLinearBf16, BulkGemvEqualsTheRegisterRingBitForBit) {
  ANVIL_REQUIRE_GPU();
  if (!cuda::bulk_gemv_runs(2880, 4096)) GTEST_SKIP() << "this GPU's kernel-table row has no bulk-copy GEMV";
  struct Shape {
    int64_t out, in;
    bool bias, accumulate;
  };
  uint64_t seed = 500;
  for (const Shape& c : {Shape{2880, 4096, true, true}, Shape{2888, 2888, true, false}, Shape{1000, 1032, false, true},
                         Shape{130, 136, true, false}, Shape{24, 40, false, false}, Shape{16, 8192, true, true},
                         Shape{4224, 2880, true, false}}) {
    SCOPED_TRACE("out=" + std::to_string(c.out) + " in=" + std::to_string(c.in));
    Rng rng(seed++);
    const auto weight = random_bf16(size_t(c.out * c.in), rng, 1.0f / std::sqrt(float(c.in)));
    const auto x = random_bf16(size_t(c.in), rng, 1.0f);
    std::vector<float> bias(size_t(c.out)), start(size_t(c.out));
    for (auto& b : bias) b = rng.uniform();
    for (auto& v : start) v = rng.uniform() * 4.0f;
    const auto d_weight = to_device(weight), d_x = to_device(x), d_bias = to_device(bias);
    cuda::DenseWeight dw;
    dw.data = d_weight.get();
    dw.streams_early = true;
    auto product = [&](bool bulk) {
      cuda::allow_bulk_copy_kernels(bulk);
      auto d_y = to_device(start);
      const float* b = c.bias ? d_bias.get<float>() : nullptr;
      const uint64_t launches = cuda::bulk_gemv_launch_count();
      if (c.accumulate)
        cuda::linear_add(dw, b, d_x.get<uint16_t>(), 1, c.out, c.in, d_y.get<float>(), nullptr);
      else
        cuda::linear(dw, b, d_x.get<uint16_t>(), 1, c.out, c.in, d_y.get<float>(), nullptr);
      // Which kernel ran: otherwise the comparison below would pass with the ring on both sides.
      EXPECT_EQ(cuda::bulk_gemv_launch_count() - launches, bulk ? 1u : 0u) << (bulk ? "bulk" : "ring") << " call";
      cuda::allow_bulk_copy_kernels(true);
      return test::to_host<float>(d_y, size_t(c.out));
    };
    const auto bulk = product(true), ring = product(false);
    int64_t differ = 0;
    for (size_t i = 0; i < bulk.size(); ++i)
      differ += std::memcmp(&bulk[i], &ring[i], sizeof(float)) != 0 ? 1 : 0;
    EXPECT_EQ(differ, 0) << "first value " << bulk[0] << " vs " << ring[0];
    // And both against the reference (the bulk kernel must also have written every row).
    double err = 0, norm = 0;
    for (int64_t o = 0; o < c.out; ++o) {
      double want = (c.bias ? bias[size_t(o)] : 0.0) + (c.accumulate ? start[size_t(o)] : 0.0);
      for (int64_t k = 0; k < c.in; ++k)
        want += double(bf16_to_f32(weight[size_t(o * c.in + k)])) * double(bf16_to_f32(x[size_t(k)]));
      err += (bulk[size_t(o)] - want) * (bulk[size_t(o)] - want);
      norm += want * want;
    }
    EXPECT_LT(std::sqrt(err / norm), 2e-5);
  }
}

// linear_normed at one token: each bulk-GEMV block makes the bf16 RMSNorm of the float32 row
// itself (no scratch is passed, so the call fails unless that path ran). Against the norm kernel
// followed by the same product: the sum of squares goes in another order, so a rare bf16 of the
// norm may round the other way; the products must agree to well under a bf16 step. Rows past
// kNormMaxIn, and a GPU without the bulk kernel, take the two kernels (bit for bit).
TEST(CudaLinearBf16, NormedTokenMatchesTheNormKernelThenTheProduct) {
  ANVIL_REQUIRE_GPU();
  struct Shape {
    int64_t out, in;
  };
  uint64_t seed = 900;
  for (const Shape& c : {Shape{5120, 2880}, Shape{2880, 4096}, Shape{1000, 1032}, Shape{24, 40}, Shape{64, 8192}}) {
    SCOPED_TRACE("out=" + std::to_string(c.out) + " in=" + std::to_string(c.in));
    Rng rng(seed++);
    const auto weight = random_bf16(size_t(c.out * c.in), rng, 1.0f / std::sqrt(float(c.in)));
    std::vector<float> x(size_t(c.in)), norm_weight(size_t(c.in)), bias(size_t(c.out));
    for (auto& v : x) v = rng.uniform() * 30.0f;
    for (auto& v : norm_weight) v = 0.5f + rng.uniform();
    for (auto& v : bias) v = rng.uniform();
    const auto d_weight = to_device(weight), d_x = to_device(x), d_norm = to_device(norm_weight), d_bias = to_device(bias);
    cuda::DenseWeight dw;
    dw.data = d_weight.get();
    dw.streams_early = true;
    const float eps = 1e-5f;
    cuda::DeviceBuffer scratch(size_t(c.in) * 2);
    cuda::DeviceBuffer d_two(size_t(c.out) * 4), d_normed(size_t(c.out) * 4);
    cuda::rms_norm_to_bf16(d_x.get<float>(), 1, c.in, d_norm.get<float>(), eps, scratch.get<uint16_t>(), nullptr);
    cuda::linear(dw, d_bias.get<float>(), scratch.get<uint16_t>(), 1, c.out, c.in, d_two.get<float>(), nullptr);
    const auto two = test::to_host<float>(d_two, size_t(c.out));
    const bool fused = c.in <= 4096 && cuda::bulk_gemv_runs(c.out, c.in);
    cuda::linear_normed(dw, d_bias.get<float>(), d_x.get<float>(), d_norm.get<float>(), eps,
                        fused ? nullptr : scratch.get<uint16_t>(), 1, c.out, c.in, d_normed.get<float>(), nullptr);
    const auto normed = test::to_host<float>(d_normed, size_t(c.out));
    if (!fused) {
      EXPECT_EQ(std::memcmp(normed.data(), two.data(), two.size() * 4), 0);
      continue;
    }
    double err = 0, norm = 0, worst = 0;
    for (size_t o = 0; o < two.size(); ++o) {
      err += (normed[o] - two[o]) * double(normed[o] - two[o]);
      norm += double(two[o]) * two[o];
      worst = std::max(worst, double(std::fabs(normed[o] - two[o])));
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-4);
    EXPECT_LT(worst, 2e-2);
  }
}

// cuBLASLt itself, called directly: the bias epilogue, accumulation into y (beta = 1, as
// linear_add uses it for the residual), and shapes with no bias.
TEST(CudaCublasLt, AccumulatesAndAddsBias) {
  ANVIL_REQUIRE_GPU();
  if (!cuda::cublaslt::available()) GTEST_SKIP() << "cuBLASLt: " << cuda::cublaslt::describe();
  uint64_t seed = 450;
  for (auto [m, out, in] : {std::tuple<int64_t, int64_t, int64_t>{64, 512, 2880}, {300, 2880, 4096}, {7, 24, 40}})
    for (bool bias : {false, true}) {
      SCOPED_TRACE("m=" + std::to_string(m) + " out=" + std::to_string(out) + " bias=" + std::to_string(bias));
      Rng rng(seed++);
      const auto weight = random_bf16(size_t(out * in), rng, 1.0f / std::sqrt(float(in)));
      const auto x = random_bf16(size_t(m * in), rng, 1.0f);
      std::vector<float> b(static_cast<size_t>(out)), y0(static_cast<size_t>(m * out));
      for (auto& v : b) v = rng.uniform();
      for (auto& v : y0) v = rng.uniform() * 4.0f;
      LinearWeight lw;
      lw.format = WeightFormat::BF16;
      lw.out_features = out;
      lw.in_features = in;
      lw.data = weight.data();
      lw.bias = bias ? b.data() : nullptr;
      std::vector<float> xf(x.size()), ref(size_t(m * out));
      for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
      linear_forward_reference(lw, xf.data(), m, ref.data());
      auto d_w = to_device(weight), d_x = to_device(x), d_b = to_device(b), d_y = to_device(y0);
      ASSERT_TRUE(cuda::cublaslt::matmul_bf16(d_w.get<uint16_t>(), bias ? d_b.get<float>() : nullptr,
                                              d_x.get<uint16_t>(), m, out, in, d_y.get<float>(), true, nullptr));
      cuda::synchronize();
      std::vector<float> y(y0.size());
      cuda::copy_to_host(y.data(), d_y.get(), d_y.bytes());
      double err = 0, norm = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        const double want = double(y0[i]) + ref[i];
        err += (y[i] - want) * (y[i] - want);
        norm += want * want;
      }
      EXPECT_LT(std::sqrt(err / norm), 2e-3);
    }
}

TEST(CudaLinearFp8, MatchesReferenceAcrossRowCounts) {
  ANVIL_REQUIRE_GPU();
  uint64_t seed = 500;
  for (int64_t m : {1, 3, 8, 9, 16, 17, 32, 33, 64, 300})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{2880, 4096}, {520, 2880}, {4096, 2880}})
      run_case({m, out, in, m % 2 == 1, 0, 1 << 30, true}, seed++);
}

TEST(CudaLinearFp8, Tails) {
  ANVIL_REQUIRE_GPU();
  uint64_t seed = 600;
  // out not a multiple of 16/64/128, in a multiple of 16 but not of 32 or 64, tiny shapes.
  for (int64_t m : {1, 5, 16, 31, 70, 333})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{2888, 2896}, {24, 48}, {8, 16}, {130, 144}, {1000, 1040}})
      run_case({m, out, in, true, 0, 1 << 30, true}, seed++);
}

TEST(CudaLinearFp8, ModelShapesWithSpeed) {
  ANVIL_REQUIRE_GPU();
  uint64_t seed = 700;
  // gpt-oss qkv and o_proj at batch 1 and prefill: half the bytes of bf16.
  run_case({1, 5120, 2880, true, 50, 1 << 30, true}, seed++);
  run_case({1, 2880, 4096, true, 50, 1 << 30, true}, seed++);
  run_case({8, 5120, 2880, true, 50, 1 << 30, true}, seed++);
  run_case({2048, 5120, 2880, true, 20, 16, true}, seed++);
  run_case({2048, 2880, 4096, true, 20, 16, true}, seed++);
}

TEST(CudaLinearFp8, RefusesShapesItCannotTake) {
  ANVIL_REQUIRE_GPU();
  cuda::DeviceBuffer w(64 * 40), scales(64 * 4), x(40 * 2), y(64 * 4);
  cuda::DenseWeight dw{cuda::DenseWeight::Format::FP8, w.get(), scales.get<float>()};
  // in = 40 is a multiple of 8 (bf16 would run) but not of 16.
  EXPECT_THROW(cuda::linear(dw, nullptr, x.get<uint16_t>(), 1, 64, 40, y.get<float>(), nullptr), Error);
  dw.row_scales = nullptr;
  EXPECT_THROW(cuda::linear(dw, nullptr, x.get<uint16_t>(), 1, 64, 32, y.get<float>(), nullptr), Error);
}

// The float32-input path (--dtype float32 with --quantize-dense fp8): FP8 codes decode exactly,
// so only float32 summation order separates it from the reference.
TEST(CudaLinearFp8, Float32InputMatchesTheReference) {
  ANVIL_REQUIRE_GPU();
  Rng rng(900);
  for (auto [m, out, in] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 2896}, {5, 37, 48}, {9, 130, 4096}}) {
    std::vector<uint16_t> weight(size_t(out * in));
    for (auto& w : weight) w = f32_to_bf16(rng.uniform() * 0.05f);
    std::vector<float> x(static_cast<size_t>(m * in)), bias(static_cast<size_t>(out));
    for (auto& v : x) v = rng.uniform();
    for (auto& b : bias) b = rng.uniform();
    LinearWeight lw;
    lw.format = WeightFormat::BF16;
    lw.out_features = out;
    lw.in_features = in;
    lw.data = weight.data();
    lw.bias = bias.data();
    const QuantizedLinear q = quantize_linear(lw, WeightFormat::FP8, "test", default_thread_pool());
    std::vector<float> want(size_t(m * out));
    linear_forward_reference(q.weight(), x.data(), m, want.data());
    auto d_codes = to_device(to_device_layout(static_cast<const uint8_t*>(q.weight().data), out, in));
    auto d_scales = to_device(std::vector<float>(q.weight().row_scales, q.weight().row_scales + out));
    auto d_x = to_device(x), d_bias = to_device(bias);
    cuda::DeviceBuffer d_y(size_t(m * out) * 4);
    const cuda::DenseWeight dw{cuda::DenseWeight::Format::FP8, d_codes.get(), d_scales.get<float>()};
    cuda::linear_f32_input(dw, d_bias.get<float>(), d_x.get<float>(), m, out, in, d_y.get<float>(), nullptr);
    std::vector<float> got(size_t(m * out));
    cuda::copy_to_host(got.data(), d_y.get(), got.size() * 4);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << "m=" << m << " out=" << out << " i=" << i;
  }
}

// The device quantizer (--quantize-dense fp8 on CUDA) writes the CPU quantizer's bytes and scales.
TEST(CudaQuantizeFp8, MatchesTheCpuQuantizerExactly) {
  ANVIL_REQUIRE_GPU();
  Rng rng(800);
  const int64_t out = 300, in = 2896;
  std::vector<uint16_t> weight(size_t(out * in));
  for (int64_t r = 0; r < out; ++r) {
    // Rows of very different magnitudes, so scales and subnormal codes both vary; row 7 is zero.
    const float magnitude = r == 7 ? 0.0f : std::ldexp(1.0f, int(r % 40) - 20);
    for (int64_t k = 0; k < in; ++k) weight[size_t(r * in + k)] = f32_to_bf16(rng.uniform() * magnitude);
  }
  weight[size_t(11 * in + 5)] = f32_to_bf16(1e-12f);  // deep in E4M3's subnormals of its row
  LinearWeight lw;
  lw.format = WeightFormat::BF16;
  lw.out_features = out;
  lw.in_features = in;
  lw.data = weight.data();
  const QuantizedLinear cpu = quantize_linear(lw, WeightFormat::FP8, "test", default_thread_pool());
  const auto want = to_device_layout(static_cast<const uint8_t*>(cpu.weight().data), out, in);

  auto d_weight = to_device(weight);
  cuda::DeviceBuffer d_codes(size_t(out * in)), d_scales(size_t(out) * 4);
  EXPECT_EQ(cuda::quantize_fp8_rows(d_weight.get<uint16_t>(), out, in, d_codes.get<uint8_t>(), d_scales.get<float>(),
                                    nullptr),
            -1);
  std::vector<uint8_t> codes(size_t(out * in));
  std::vector<float> scales(static_cast<size_t>(out));
  cuda::copy_to_host(codes.data(), d_codes.get(), codes.size());
  cuda::copy_to_host(scales.data(), d_scales.get(), scales.size() * 4);
  for (int64_t r = 0; r < out; ++r) ASSERT_EQ(scales[size_t(r)], cpu.weight().row_scales[r]) << "row " << r;
  int64_t differing = 0;
  for (size_t i = 0; i < codes.size(); ++i) differing += codes[i] != want[i];
  EXPECT_EQ(differing, 0);
}

TEST(CudaQuantizeFp8, ReportsTheFirstNonFiniteRow) {
  ANVIL_REQUIRE_GPU();
  const int64_t out = 40, in = 32;
  std::vector<uint16_t> weight(size_t(out * in), f32_to_bf16(0.5f));
  weight[size_t(29 * in + 3)] = f32_to_bf16(INFINITY);
  weight[size_t(17 * in + 31)] = 0x7fc0;  // NaN
  auto d_weight = to_device(weight);
  cuda::DeviceBuffer d_codes(size_t(out * in)), d_scales(size_t(out) * 4);
  EXPECT_EQ(cuda::quantize_fp8_rows(d_weight.get<uint16_t>(), out, in, d_codes.get<uint8_t>(), d_scales.get<float>(),
                                    nullptr),
            17);
  EXPECT_THROW(cuda::quantize_fp8_rows(d_weight.get<uint16_t>(), out, 24, d_codes.get<uint8_t>(),
                                       d_scales.get<float>(), nullptr),
               Error);
}

}  // namespace
}  // namespace anvil
