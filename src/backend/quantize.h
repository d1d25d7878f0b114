#pragma once
// Weight quantizers: a linear layer in any format anvil reads (float32, bf16, fp16, MXFP4) to
// MXFP4, NVFP4 or FP8, into storage the result owns. What `--quantize-experts` and
// `--quantize-dense` run at load; the kernels then treat the layer like one read from a file.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/linear.h"
#include "core/thread_pool.h"

namespace anvil {

// Nearest E2M1 code (ties to the even code, as float rounding does); magnitudes above 6 saturate
// to 6. The sign bit is x's, so negative values that round to zero give -0 (code 8).
uint8_t f32_to_e2m1(float x);

// Nearest FP8 E4M3 (ties to even mantissa), subnormals included; magnitudes above 448 saturate
// to 448, so the NaN codes 0x7f / 0xff never come out.
uint8_t f32_to_e4m3(float x);

// The OCP MX shared scale of a block whose largest magnitude is amax: 2^(floor(log2 amax) - 2),
// where 2 is E2M1's largest exponent, as an E8M0 byte clamped to 2^-127..2^127. amax 0 gives byte
// 0 (any scale decodes a zero block). The block's largest values then lie in [4, 8) before
// rounding, and those above 6 saturate: the spec's rule, not the least-error one.
uint8_t mxfp4_shared_scale(float amax);

// A quantized layer and the storage its weight points into. The bias pointer is the source's:
// whoever owns the source's bias keeps it alive. Moving keeps the pointers valid (the vectors'
// buffers move with them); copying would not, so it is not allowed.
class QuantizedLinear {
 public:
  QuantizedLinear() = default;
  QuantizedLinear(QuantizedLinear&&) = default;
  QuantizedLinear& operator=(QuantizedLinear&&) = default;
  QuantizedLinear(const QuantizedLinear&) = delete;
  QuantizedLinear& operator=(const QuantizedLinear&) = delete;

  const LinearWeight& weight() const { return weight_; }

 private:
  friend QuantizedLinear quantize_linear(const LinearWeight&, WeightFormat, const std::string&, ThreadPool&);
  std::vector<uint8_t> data_, scales_;
  std::vector<float> row_scales_;
  LinearWeight weight_;
};

// Quantizes every row of `source` (decoded with linear_decode_row) to `target`:
//  MXFP4: per 32 elements, the OCP shared scale (mxfp4_shared_scale) and nearest E2M1 codes.
//  NVFP4: ModelOpt's rule: global = amax(W) / (6 * 448); per 16 elements, the E4M3 scale nearest
//         block_amax / (6 * global) (a zero one replaced by 1), codes nearest W / (scale * global).
//         An all-zero tensor gets global 1.
//  FP8:   per row, scale = row_amax / 448 (1 for a zero row), codes nearest W / scale.
// Fails, naming `name`, on a non-finite weight or an in_features the target's blocks do not
// divide (32 for MXFP4, 16 for NVFP4). Runs on `pool`; the result does not depend on its size.
QuantizedLinear quantize_linear(const LinearWeight& source, WeightFormat target, const std::string& name,
                                ThreadPool& pool);

// Keeps quantized layers alive for as long as the model that points into them.
class QuantizedStore {
 public:
  // `source` quantized to `target` (the view of the stored result), or `source` itself when
  // there is no target or it already has that format (MXFP4 experts asked for MXFP4).
  LinearWeight convert(const LinearWeight& source, std::optional<WeightFormat> target, const std::string& name,
                       ThreadPool& pool);
  // How many layers were quantized.
  size_t size() const { return layers_.size(); }

 private:
  std::vector<std::unique_ptr<QuantizedLinear>> layers_;
};

}  // namespace anvil
