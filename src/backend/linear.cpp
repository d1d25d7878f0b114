#include "backend/linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
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
    case WeightFormat::NVFP4: return "NVFP4";
    case WeightFormat::FP8: return "FP8";
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
  if (weight.format == WeightFormat::NVFP4) {
    if (weight.in_features % 16 != 0) {
      fail("linear layer NVFP4 [{}, {}]: in_features must be a multiple of 16", weight.out_features,
           weight.in_features);
    }
    if (weight.scales == nullptr) {
      fail("linear layer NVFP4 [{}, {}]: scales are null", weight.out_features, weight.in_features);
    }
  }
  if (weight.format == WeightFormat::FP8 && weight.row_scales == nullptr) {
    fail("linear layer FP8 [{}, {}]: row scales are null", weight.out_features, weight.in_features);
  }
}

void validate_io(const float* x, int64_t tokens, const float* y) {
  if (tokens < 0) fail("linear layer: negative token count {}", tokens);
  if (tokens > 0 && (x == nullptr || y == nullptr)) fail("linear layer: null input or output");
}

Mxfp4Activations mode_from_environment() {
  const char* value = std::getenv("ANVIL_MXFP4_ACTIVATIONS");
  if (value == nullptr || *value == '\0') return kDefaultMxfp4Activations;
  if (std::strcmp(value, "int8") == 0) return Mxfp4Activations::Int8;
  if (std::strcmp(value, "f32") == 0) return Mxfp4Activations::Float32;
  fail("ANVIL_MXFP4_ACTIVATIONS must be int8 or f32, got '{}'", value);
}

std::atomic<int>& mode_slot() {
  static std::atomic<int> mode{int(mode_from_environment())};
  return mode;
}

// Quantized input buffers, reused across calls like the packed-x buffer below.
struct Int8Buffers {
  std::vector<int8_t> q;
  std::vector<int16_t> offsets;
  std::vector<float> scales;

  cpu::Mxfp4Int8Input prepare(int64_t tokens, int64_t in) {
    const size_t n = size_t(tokens) * size_t(in);
    if (q.size() < n) {
      q.resize(n);
      offsets.resize(n / 2);
      scales.resize(n / 32);
    }
    return {q.data(), offsets.data(), scales.data()};
  }
};

void forward_int8(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  thread_local Int8Buffers buffers;
  const cpu::Mxfp4Int8Input input = buffers.prepare(tokens, weight.in_features);
  cpu::mxfp4_int8_quantize_avx2(x, tokens, weight.in_features, input);
  cpu::linear_parallel_rows(pool, weight, tokens, [&](int64_t begin, int64_t end) {
    cpu::mxfp4_int8_rows_avx2(weight, input, tokens, y, begin, end);
  });
}

// The SIMD path for layers that share x (one layer, or a group from linear_forward_group, all of
// one format and in_features): x is packed once, and one fork/join covers every layer's rows,
// split as if the layers were one matrix. Each row is computed by the same code whichever range
// it lands in, so results do not depend on the grouping or the thread count.
void forward_simd(std::span<const LinearWeight* const> layers, const float* x, int64_t tokens,
                  std::span<float* const> ys, ThreadPool& pool) {
  const LinearWeight& first = *layers[0];
  const int64_t in = first.in_features;
  const float* x_packed = x;
  if (cpu::linear_avx2_needs_packed_x(first.format)) {
    // Reused across calls: decode runs this once per layer per token, and a fresh allocation
    // would cost page faults every time.
    thread_local std::vector<float> buffer;
    const size_t size = size_t(tokens) * size_t(in);
    if (buffer.size() < size) buffer.resize(size);
    cpu::linear_avx2_pack_x(first.format, x, tokens, in, buffer.data());
    x_packed = buffer.data();
  }
  const float* x_pairs = nullptr;
  if (cpu::cpu_use_avx512() && cpu::linear_avx512_handles(first.format, tokens)) {
    thread_local std::vector<float> pairs;
    const size_t size = size_t(cpu::linear_avx512_pair_floats(tokens, in));
    if (pairs.size() < size) pairs.resize(size);
    cpu::linear_avx512_pair_x(x_packed, tokens, in, pairs.data());
    // The pointer, not the name: inside the lambda below, running on a worker, `pairs` would be
    // that worker's own (empty) thread_local vector.
    x_pairs = pairs.data();
  }
  int64_t total_rows = 0;
  for (const LinearWeight* layer : layers) total_rows += layer->out_features;
  auto rows = [&](int64_t begin, int64_t end) {
    int64_t offset = 0;
    for (size_t i = 0; i < layers.size() && offset < end; ++i) {
      const LinearWeight& layer = *layers[i];
      const int64_t lo = std::max(begin, offset) - offset, hi = std::min(end, offset + layer.out_features) - offset;
      if (lo < hi) {
        if (x_pairs != nullptr) {
          cpu::linear_avx512_rows(layer, x_packed, x_pairs, tokens, ys[i], lo, hi);
        } else {
          cpu::linear_avx2_rows(layer, x_packed, tokens, ys[i], lo, hi);
        }
      }
      offset += layer.out_features;
    }
  };
  if (pool.size() <= 1 || total_rows * in * tokens < cpu::kLinearMinParallelMacs) {
    rows(0, total_rows);
  } else {
    pool.parallel_for(total_rows, rows, cpu::kLinearRowGrain);
  }
}

}  // namespace

Mxfp4Activations mxfp4_activations() { return Mxfp4Activations(mode_slot().load(std::memory_order_relaxed)); }

void set_mxfp4_activations(Mxfp4Activations mode) { mode_slot().store(int(mode), std::memory_order_relaxed); }

const char* mxfp4_activations_name(Mxfp4Activations mode) {
  return mode == Mxfp4Activations::Int8 ? "int8" : "f32";
}

void quantize_mxfp4_input(const float* x, int64_t in, int8_t* q, float* scales) {
  if (in % 32 != 0) fail("quantize_mxfp4_input: length {} is not a multiple of 32", in);
  for (int64_t b = 0; b < in / 32; ++b) {
    const float* block = x + b * 32;
    uint32_t amax_bits = 0;
    for (int i = 0; i < 32; ++i) amax_bits = std::max(amax_bits, f32_to_bits(block[i]) & 0x7fffffffu);
    if (amax_bits >= 0x7f800000u || amax_bits < cpu::kMxfp4Int8MinBlockMaxBits) {
      std::fill(q + b * 32, q + b * 32 + 32, int8_t(0));
      scales[b] = amax_bits >= 0x7f800000u ? NAN : 0.0f;
      continue;
    }
    const float amax = f32_from_bits(amax_bits);
    const float inverse = 127.0f / amax;
    scales[b] = amax / 127.0f * 0.5f;
    for (int i = 0; i < 32; ++i) q[b * 32 + i] = int8_t(std::nearbyint(block[i] * inverse));
  }
}

size_t LinearWeight::weight_bytes() const {
  const size_t elements = size_t(out_features) * size_t(in_features);
  switch (format) {
    case WeightFormat::F32: return elements * 4;
    case WeightFormat::BF16:
    case WeightFormat::F16: return elements * 2;
    case WeightFormat::MXFP4: return elements / 2 + elements / 32;
    case WeightFormat::NVFP4: return elements / 2 + elements / 16 + sizeof(float);
    case WeightFormat::FP8: return elements + size_t(out_features) * sizeof(float);
  }
  return 0;
}

void linear_forward(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  validate(weight);
  validate_io(x, tokens, y);
  if (tokens == 0 || weight.out_features == 0) return;
  if (!cpu::cpu_use_avx2()) {
    cpu::linear_forward_scalar(weight, x, tokens, y, pool);
  } else if (weight.format == WeightFormat::MXFP4 && mxfp4_activations() == Mxfp4Activations::Int8) {
    forward_int8(weight, x, tokens, y, pool);
  } else {
    const LinearWeight* layers[] = {&weight};
    float* outputs[] = {y};
    forward_simd(layers, x, tokens, outputs, pool);
  }
}

void linear_forward_group(std::span<const LinearWeight* const> weights, const float* x, int64_t tokens,
                          std::span<float* const> ys, ThreadPool& pool) {
  if (weights.size() != ys.size()) fail("linear group: {} layers but {} outputs", weights.size(), ys.size());
  if (weights.empty()) return;
  bool shared = cpu::cpu_use_avx2() && tokens > 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    validate(*weights[i]);
    validate_io(x, tokens, ys[i]);
    shared = shared && weights[i]->format == weights[0]->format && weights[i]->in_features == weights[0]->in_features;
  }
  const bool int8 = weights[0]->format == WeightFormat::MXFP4 && mxfp4_activations() == Mxfp4Activations::Int8;
  if (!shared || int8) {
    for (size_t i = 0; i < weights.size(); ++i) linear_forward(*weights[i], x, tokens, ys[i], pool);
    return;
  }
  forward_simd(weights, x, tokens, ys, pool);
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
    case WeightFormat::NVFP4: {
      const int64_t blocks = in / 16;
      const uint8_t* codes = static_cast<const uint8_t*>(weight.data) + row * in / 2;
      const uint8_t* scales = weight.scales + row * blocks;
      for (int64_t g = 0; g < blocks; ++g) {
        // e2m1 * e4m3 is exact in float32 (at most 6 significant bits), so only the global scale rounds.
        const float scale = fp8_e4m3_to_f32(scales[g]);
        for (int j = 0; j < 8; ++j) {
          const uint8_t byte = codes[g * 8 + j];
          out[g * 16 + 2 * j] = kFp4E2M1Values[byte & 0x0f] * scale * weight.global_scale;
          out[g * 16 + 2 * j + 1] = kFp4E2M1Values[byte >> 4] * scale * weight.global_scale;
        }
      }
      return;
    }
    case WeightFormat::FP8: {
      const uint8_t* w = static_cast<const uint8_t*>(weight.data) + row * in;
      const float scale = weight.row_scales[row];
      for (int64_t i = 0; i < in; ++i) out[i] = fp8_e4m3_to_f32(w[i]) * scale;
      return;
    }
  }
}

void linear_forward_reference(const LinearWeight& weight, const float* x, int64_t tokens, float* y,
                              Mxfp4Activations mxfp4) {
  validate(weight);
  validate_io(x, tokens, y);
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  if (weight.format == WeightFormat::MXFP4 && mxfp4 == Mxfp4Activations::Int8) {
    const int64_t blocks = in / 32;
    std::vector<int8_t> q(size_t(tokens * in));
    std::vector<float> scales(size_t(tokens * blocks));
    for (int64_t t = 0; t < tokens; ++t) quantize_mxfp4_input(x + t * in, in, q.data() + t * in, scales.data() + t * blocks);
    const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t t = 0; t < tokens; ++t) {
        double sum = 0.0;
        for (int64_t b = 0; b < blocks; ++b) {
          int64_t dot = 0;
          for (int j = 0; j < 16; ++j) {
            const uint8_t byte = codes[(o * blocks + b) * 16 + j];
            dot += int64_t(q[size_t(t * in + b * 32 + 2 * j)]) * int64_t(kFp4E2M1Values[byte & 0x0f] * 2.0f);
            dot += int64_t(q[size_t(t * in + b * 32 + 2 * j + 1)]) * int64_t(kFp4E2M1Values[byte >> 4] * 2.0f);
          }
          sum += double(scales[size_t(t * blocks + b)]) * double(e8m0_to_f32(weight.scales[o * blocks + b])) * double(dot);
        }
        if (weight.bias != nullptr) sum += double(weight.bias[o]);
        y[t * out + o] = float(sum);
      }
    }
    return;
  }
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
