#include "backend/vector_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/vector_kernels.h"

namespace anvil {
namespace {

std::vector<float> random_vector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(size_t(n) + 1);  // +1 so data() is never null, even for n = 0
  for (auto& x : v) x = normal(rng);
  return v;
}

using DotFn = float (*)(const float*, const float*, int64_t);
using AxpyFn = void (*)(float, const float*, float*, int64_t);

void check_dot(DotFn dot, const char* name) {
  std::mt19937 rng(1);
  for (int64_t n = 0; n <= 70; ++n) {
    const std::vector<float> a = random_vector(n, rng), b = random_vector(n, rng);
    double exact = 0.0, magnitude = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      exact += double(a[size_t(i)]) * double(b[size_t(i)]);
      magnitude += std::fabs(double(a[size_t(i)]) * double(b[size_t(i)]));
    }
    const float got = dot(a.data(), b.data(), n);
    const float reference = dot_f32_reference(a.data(), b.data(), n);
    // Both are float32 sums in different orders: each within n * eps of the exact value.
    const double tolerance = 1e-5 * magnitude + 1e-30;
    EXPECT_LE(std::fabs(got - exact), tolerance) << name << " n=" << n;
    EXPECT_LE(std::fabs(double(got) - double(reference)), 2 * tolerance) << name << " n=" << n;
  }
}

void check_axpy(AxpyFn axpy, const char* name) {
  std::mt19937 rng(2);
  for (int64_t n = 0; n <= 70; ++n) {
    const std::vector<float> x = random_vector(n, rng);
    std::vector<float> y = random_vector(n, rng);
    std::vector<float> reference = y;
    const float a = 0.75f - float(n) / 64.0f;
    const float sentinel = y[size_t(n)];
    axpy(a, x.data(), y.data(), n);
    axpy_f32_reference(a, x.data(), reference.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // One rounding (fused) versus two: at most an ulp or so of the operands apart.
      const double scale = std::fabs(double(a) * x[size_t(i)]) + std::fabs(double(reference[size_t(i)]));
      EXPECT_LE(std::fabs(double(y[size_t(i)]) - double(reference[size_t(i)])), 2.5e-7 * scale + 1e-30)
          << name << " n=" << n << " i=" << i;
    }
    EXPECT_EQ(y[size_t(n)], sentinel) << name << " wrote past the end, n=" << n;
  }
}

TEST(VectorOps, DotMatchesReference) { check_dot(dot_f32, "dot_f32"); }

TEST(VectorOps, AxpyMatchesReference) { check_axpy(axpy_f32, "axpy_f32"); }

TEST(VectorOps, Avx2KernelsMatchReference) {
  if (!cpu::cpu_use_avx2()) GTEST_SKIP() << "no AVX2+FMA on this CPU";
  check_dot(cpu::dot_f32_avx2, "dot_f32_avx2");
  check_axpy(cpu::axpy_f32_avx2, "axpy_f32_avx2");
}

TEST(VectorOps, SmallExactCases) {
  const float a[3] = {1.0f, 2.0f, 3.0f}, b[3] = {4.0f, -5.0f, 6.0f};
  EXPECT_EQ(dot_f32(a, b, 3), 12.0f);
  EXPECT_EQ(dot_f32(a, b, 0), 0.0f);
  float y[3] = {1.0f, 1.0f, 1.0f};
  axpy_f32(2.0f, a, y, 3);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], 5.0f);
  EXPECT_EQ(y[2], 7.0f);
}

}  // namespace
}  // namespace anvil
