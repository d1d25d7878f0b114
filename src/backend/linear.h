#pragma once
// Linear layers in every weight format anvil reads. A layer carries its format, so model code
// never forks by quantization: it calls linear_forward and the backend picks the kernel.
#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace anvil {

enum class WeightFormat {
  F32,   // float32 [out, in]
  BF16,  // bf16 [out, in]
  F16,   // fp16 [out, in]
  MXFP4, // E2M1 codes [out, in/32, 16] (low nibble = even element) + E8M0 scales [out, in/32]
  // NVIDIA ModelOpt's layout: E2M1 codes [out, in/2] (low nibble = even element), FP8 E4M3 block
  // scales [out, in/16] and one float32 per-tensor scale (weight_scale_2):
  // W = e2m1 * e4m3(scale) * global_scale.
  NVFP4,
  // FP8 E4M3 [out, in] with one float32 scale per output row (per-channel): W = e4m3 * row_scale.
  FP8,
};

struct LinearWeight {
  WeightFormat format = WeightFormat::F32;
  int64_t out_features = 0;
  int64_t in_features = 0;
  const void* data = nullptr;
  const uint8_t* scales = nullptr;  // MXFP4 (E8M0) and NVFP4 (E4M3)
  const float* bias = nullptr;      // [out] or null
  float global_scale = 1.0f;        // NVFP4 only
  const float* row_scales = nullptr;  // FP8 only: [out]

  // Bytes of weight data read by one full pass (for bandwidth figures).
  size_t weight_bytes() const;
};

// What MXFP4 layers multiply their weights with. Every other format (NVFP4 and FP8 included)
// always uses float32 inputs.
enum class Mxfp4Activations {
  // Exact: weights decoded to float32 and multiplied with the float32 input.
  Float32,
  // The input quantized to int8 per 32-element block with one float scale per block
  // (quantize_mxfp4_input), multiplied with the doubled E2M1 codes in exact integer arithmetic,
  // one float multiply-add per block (llama.cpp's approach). Several times fewer instructions per
  // weight; each block's input carries a relative rounding error of up to 1/254 of its largest
  // element, so results differ from Float32 by about 1e-3 relative.
  Int8,
};

// The process-wide choice. Starts as ANVIL_MXFP4_ACTIVATIONS ("int8" or "f32") when set, else
// Float32: Int8 moves gpt-oss logits by up to ~0.1 (tiny fixture model), which breaks the
// promise of matching transformers to 1e-3, so it is opt-in. Set it before running models;
// changing it while a layer runs on another thread is a race.
inline constexpr Mxfp4Activations kDefaultMxfp4Activations = Mxfp4Activations::Float32;
Mxfp4Activations mxfp4_activations();
void set_mxfp4_activations(Mxfp4Activations mode);
const char* mxfp4_activations_name(Mxfp4Activations mode);  // "int8" or "f32"

// y[t, o] = sum_i x[t, i] * W[o, i] + bias[o] for t in [0, tokens). x is [tokens, in] and y is
// [tokens, out], float32 row-major. Accumulation is float32. Uses the fastest kernel this CPU
// supports; results equal linear_forward_reference (with the current mxfp4_activations()) within
// float32 reassociation error.
void linear_forward(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool);

// Layers that read the same x (q, k and v; gate and up): ys[i] = linear_forward(*weights[i], x),
// bit for bit, but where they share format and in_features x is prepared once and one fork/join
// of the pool covers all their rows. With a few tokens on many threads the per-call fork/join
// and packing cost as much as a small layer's arithmetic.
void linear_forward_group(std::span<const LinearWeight* const> weights, const float* x, int64_t tokens,
                          std::span<float* const> ys, ThreadPool& pool);

// The scalar reference every SIMD kernel is tested against; `mxfp4` says how MXFP4 layers treat
// the input (dense formats ignore it).
void linear_forward_reference(const LinearWeight& weight, const float* x, int64_t tokens, float* y,
                              Mxfp4Activations mxfp4 = Mxfp4Activations::Float32);

// The Int8 quantization of one token's input, in natural order, as every kernel applies it: per
// 32-element block, amax = max |x|, q = round-half-even(x * (127 / amax)) (0 when amax is 0) and
// scale = amax / 127 / 2, the halving because the kernels multiply with doubled E2M1 values. So
// x ~ 2 * scale * q and a block contributes (2^(s - 127) * scale) * sum(q * 2 * e2m1). A block
// with an infinity or NaN gets q = 0 and scale NaN: its outputs become NaN, as float32 math would
// make them; one whose amax is below 2^-120 gets q = 0 and scale 0. in must be a multiple of 32.
void quantize_mxfp4_input(const float* x, int64_t in, int8_t* q, float* scales);

// Decodes row `row` of the weight to float32 (in_features values); for tests and small tensors.
void linear_decode_row(const LinearWeight& weight, int64_t row, float* out);

}  // namespace anvil
