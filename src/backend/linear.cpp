#include "backend/linear.h"

#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear_kernels.h"
#include "core/dtype.h"
#include "core/error.h"

namespace anvil {

namespace {

const char* format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::F16: return "F16";
    case WeightFormat::MXFP4: return "MXFP4";
  }
  return "?";
}

// Every entry point checks the same things, so a malformed layer fails loudly instead of
// reading out of bounds in whichever kernel happens to run.
void validate(const LinearWeight& weight) {
  if (weight.out_features < 0 || weight.in_features < 0) {
    fail("linear layer: negative shape [{}, {}]", weight.out_features, weight.in_features);
  }
  if (weight.data == nullptr) {
    fail("linear layer {} [{}, {}]: weight data is null", format_name(weight.format), weight.out_features,
         weight.in_features);
  }
  if (weight.format == WeightFormat::MXFP4) {
    if (weight.in_features % 32 != 0) {
      fail("linear layer MXFP4 [{}, {}]: in_features must be a multiple of 32", weight.out_features,
           weight.in_features);
    }
    if (weight.scales == nullptr) {
      fail("linear layer MXFP4 [{}, {}]: scales are null", weight.out_features, weight.in_features);
    }
  }
}

void validate_io(const float* x, int64_t tokens, const float* y) {
  if (tokens < 0) fail("linear layer: negative token count {}", tokens);
  if (tokens > 0 && (x == nullptr || y == nullptr)) fail("linear layer: null input or output");
}

void forward_avx2(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  const float* x_packed = x;
  if (cpu::linear_avx2_needs_packed_x(weight.format)) {
    // Reused across calls: decode runs this once per layer per token, and a fresh allocation
    // would cost page faults every time.
    thread_local std::vector<float> buffer;
    const size_t size = size_t(tokens) * size_t(weight.in_features);
    if (buffer.size() < size) buffer.resize(size);
    cpu::linear_avx2_pack_x(weight.format, x, tokens, weight.in_features, buffer.data());
    x_packed = buffer.data();
  }
  cpu::linear_parallel_rows(pool, weight, tokens, [&](int64_t begin, int64_t end) {
    cpu::linear_avx2_rows(weight, x_packed, tokens, y, begin, end);
  });
}

}  // namespace

size_t LinearWeight::weight_bytes() const {
  const size_t elements = size_t(out_features) * size_t(in_features);
  switch (format) {
    case WeightFormat::F32: return elements * 4;
    case WeightFormat::BF16:
    case WeightFormat::F16: return elements * 2;
    case WeightFormat::MXFP4: return elements / 2 + elements / 32;
  }
  return 0;
}

void linear_forward(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  validate(weight);
  validate_io(x, tokens, y);
  if (tokens == 0 || weight.out_features == 0) return;
  if (cpu::cpu_use_avx2()) {
    forward_avx2(weight, x, tokens, y, pool);
  } else {
    cpu::linear_forward_scalar(weight, x, tokens, y, pool);
  }
}

void linear_decode_row(const LinearWeight& weight, int64_t row, float* out) {
  validate(weight);
  if (row < 0 || row >= weight.out_features) {
    fail("linear layer: row {} out of range [0, {})", row, weight.out_features);
  }
  const int64_t in = weight.in_features;
  switch (weight.format) {
    case WeightFormat::F32: {
      const float* w = static_cast<const float*>(weight.data) + row * in;
      for (int64_t i = 0; i < in; ++i) out[i] = w[i];
      return;
    }
    case WeightFormat::BF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data) + row * in;
      for (int64_t i = 0; i < in; ++i) out[i] = bf16_to_f32(w[i]);
      return;
    }
    case WeightFormat::F16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data) + row * in;
      for (int64_t i = 0; i < in; ++i) out[i] = f16_to_f32(w[i]);
      return;
    }
    case WeightFormat::MXFP4: {
      const int64_t blocks = in / 32;
      const uint8_t* codes = static_cast<const uint8_t*>(weight.data) + row * blocks * 16;
      const uint8_t* scales = weight.scales + row * blocks;
      for (int64_t g = 0; g < blocks; ++g) {
        const float scale = e8m0_to_f32(scales[g]);
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = codes[g * 16 + j];
          out[g * 32 + 2 * j] = kFp4E2M1Values[byte & 0x0f] * scale;
          out[g * 32 + 2 * j + 1] = kFp4E2M1Values[byte >> 4] * scale;
        }
      }
      return;
    }
  }
}

void linear_forward_reference(const LinearWeight& weight, const float* x, int64_t tokens, float* y) {
  validate(weight);
  validate_io(x, tokens, y);
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  std::vector<float> w(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    linear_decode_row(weight, o, w.data());
    for (int64_t t = 0; t < tokens; ++t) {
      // Double accumulation makes the reference closer to exact than any float32 kernel, so test
      // tolerances measure the kernel's error rather than the reference's.
      double sum = 0.0;
      for (int64_t i = 0; i < in; ++i) sum += double(x[t * in + i]) * double(w[size_t(i)]);
      if (weight.bias != nullptr) sum += double(weight.bias[o]);
      y[t * out + o] = float(sum);
    }
  }
}

}  // namespace anvil
