#pragma once
// Linear layers in every weight format anvil reads. A layer carries its format, so model code
// never forks by quantization: it calls linear_forward and the backend picks the kernel.
#include <cstdint>

#include "core/thread_pool.h"

namespace anvil {

enum class WeightFormat {
  F32,   // float32 [out, in]
  BF16,  // bf16 [out, in]
  F16,   // fp16 [out, in]
  MXFP4, // E2M1 codes [out, in/32, 16] (low nibble = even element) + E8M0 scales [out, in/32]
};

struct LinearWeight {
  WeightFormat format = WeightFormat::F32;
  int64_t out_features = 0;
  int64_t in_features = 0;
  const void* data = nullptr;
  const uint8_t* scales = nullptr;  // MXFP4 only
  const float* bias = nullptr;      // [out] or null

  // Bytes of weight data read by one full pass (for bandwidth figures).
  size_t weight_bytes() const;
};

// y[t, o] = sum_i x[t, i] * W[o, i] + bias[o] for t in [0, tokens). x is [tokens, in] and y is
// [tokens, out], float32 row-major. Accumulation is float32. Uses the fastest kernel this CPU
// supports; results equal linear_forward_reference within float32 reassociation error.
void linear_forward(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool);

// The scalar reference every SIMD kernel is tested against.
void linear_forward_reference(const LinearWeight& weight, const float* x, int64_t tokens, float* y);

// Decodes row `row` of the weight to float32 (in_features values); for tests and small tensors.
void linear_decode_row(const LinearWeight& weight, int64_t row, float* out);

}  // namespace anvil
