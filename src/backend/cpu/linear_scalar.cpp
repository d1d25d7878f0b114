// Portable kernel for CPUs without AVX2: decode each weight row once into a float buffer, then
// dot it against every token. Eight partial sums let the compiler use whatever SIMD the baseline
// target has without needing -ffast-math to reassociate.
#include <vector>

#include "backend/cpu/linear_kernels.h"
#include "core/dtype.h"

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

// Mxfp4Activations::Int8: exact integer block sums, then one float multiply-add per block.
void mxfp4_int8_scalar(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  const int64_t blocks = in / 32;
  std::vector<int8_t> q(size_t(tokens * in));
  std::vector<float> scales(size_t(tokens * blocks));
  for (int64_t t = 0; t < tokens; ++t) quantize_mxfp4_input(x + t * in, in, q.data() + t * in, scales.data() + t * blocks);
  const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
  linear_parallel_rows(pool, weight, tokens, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> w(static_cast<size_t>(in));
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t i = 0; i < in; i += 2) {
        const uint8_t byte = codes[o * in / 2 + i / 2];
        w[size_t(i)] = int32_t(kFp4E2M1Values[byte & 0x0f] * 2.0f);
        w[size_t(i + 1)] = int32_t(kFp4E2M1Values[byte >> 4] * 2.0f);
      }
      const float bias = weight.bias != nullptr ? weight.bias[o] : 0.0f;
      for (int64_t t = 0; t < tokens; ++t) {
        const int8_t* xq = q.data() + t * in;
        float sum = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          int32_t dot = 0;
          for (int64_t i = b * 32; i < b * 32 + 32; ++i) dot += w[size_t(i)] * int32_t(xq[i]);
          sum += float(dot) * (scales[size_t(t * blocks + b)] * e8m0_to_f32(weight.scales[o * blocks + b]));
        }
        y[t * out + o] = sum + bias;
      }
    }
  });
}

}  // namespace

void linear_forward_scalar(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  if (weight.format == WeightFormat::MXFP4 && mxfp4_activations() == Mxfp4Activations::Int8) {
    mxfp4_int8_scalar(weight, x, tokens, y, pool);
    return;
  }
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
