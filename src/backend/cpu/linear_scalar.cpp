// Portable kernel for CPUs without AVX2: decode each weight row once into a float buffer, then
// dot it against every token. Eight partial sums let the compiler use whatever SIMD the baseline
// target has without needing -ffast-math to reassociate.
#include <vector>

#include "backend/cpu/linear_kernels.h"

namespace anvil::cpu {

namespace {
float dot_row(const float* w, const float* x, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) partial[k] += w[i + k] * x[i + k];
  }
  for (; i < n; ++i) partial[0] += w[i] * x[i];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}
}  // namespace

void linear_forward_scalar(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  linear_parallel_rows(pool, weight, tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> row(size_t(in) + 1);
    for (int64_t o = begin; o < end; ++o) {
      linear_decode_row(weight, o, row.data());
      const float bias = weight.bias != nullptr ? weight.bias[o] : 0.0f;
      for (int64_t t = 0; t < tokens; ++t) y[t * out + o] = dot_row(row.data(), x + t * in, in) + bias;
    }
  });
}

}  // namespace anvil::cpu
