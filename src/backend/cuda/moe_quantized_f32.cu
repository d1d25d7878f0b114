// gpt-oss experts with float32 activations, for the float32 compute mode (`--dtype float32`).
//
// The bf16 path rounds the expert input and the SwiGLU output to bf16 before each matrix product;
// on a model as sensitive as a tiny random one that alone moves logits by most of a unit. Here
// every value stays float32 and each weight is decoded exactly (E2M1 × 2^(scale-127); E2M1 × E4M3
// scale, with NVFP4's global scale on each 16-block's sum; E4M3, with FP8's row scale on the row's
// sum), so the result differs from the CPU's float32 reference only by summation order. One warp per output
// value on CUDA cores: correct at any size, fast at none, which the mode accepts.
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/mxfp4_common.cuh"
#include "backend/cuda/ops.h"
#include "backend/e4m3.h"

namespace anvil::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

__device__ const float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Σ_i row[i] · x[i] for one row of `in` weights (its scales start at `scales`; `global` is the
// row's NVFP4 global scale or FP8 scale); every lane of the warp gets the sum.
__device__ float expert_row_dot(const float* lut, ExpertFormat format, const uint8_t* blocks, const uint8_t* scales,
                                float global, const float* x, int64_t in) {
  const int lane = threadIdx.x % 32;
  float sum = 0.0f;
  if (format == ExpertFormat::FP8) {
    for (int64_t k = lane; k < in; k += 32) sum = fmaf(e4m3_value(blocks[fp8::expert_position(int(k))]), x[k], sum);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    return sum * global;
  }
  if (format == ExpertFormat::MXFP4) {  // mxfp4_f16_layout.h: block b's 8 codes of lane quad t
    // `blocks` is the row's piece of chunk 0; its chunk c is c tile chunks further.
    for (int b = lane; b < in / 32; b += 32) {
      const float* xb = x + b * 32;
      float block = 0.0f;
      for (int t = 0; t < 4; ++t) {
        const uint32_t word = *reinterpret_cast<const uint32_t*>(blocks + mxfp4::f16_tile_word_offset(b, t));
        for (int j = 0; j < 4; ++j)
          for (int e = 0; e < 2; ++e)
            block = fmaf(lut[mxfp4::f16_code(word, j, e)], xb[mxfp4::f16_slot(t, j) + e], block);
      }
      // A power of two: the product is exact unless it leaves float32's range.
      sum = fmaf(block, ldexpf(1.0f, int(scales[b]) - 127), sum);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    return sum;
  }
  for (int64_t b = lane; b < in / 32; b += 32) {  // NVFP4
    const uint32_t* words = reinterpret_cast<const uint32_t*>(blocks + b * 16);
    const float* xb = x + b * 32;
    float half[2] = {0.0f, 0.0f};  // codes 0-15 and 16-31 (own scales)
    for (int i = 0; i < 4; ++i) {
      const uint32_t word = mxfp4::unpack_codes_word(words[i]);  // device layout -> nibble i = code i
      for (int j = 0; j < 8; ++j) half[i / 2] = fmaf(lut[(word >> (4 * j)) & 15u], xb[8 * i + j], half[i / 2]);
    }
    sum = fmaf(half[0], e4m3_value(scales[2 * b]) * global, sum);
    sum = fmaf(half[1], e4m3_value(scales[2 * b + 1]) * global, sum);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

// Where row r of an expert matrix's codes starts: MXFP4's piece of chunk 0 in its 16-row tile,
// the other formats' rows one after another.
__device__ const uint8_t* code_row(const uint8_t* blocks, ExpertFormat format, int64_t r, int64_t row_bytes,
                                   int64_t in) {
  return blocks + (format == ExpertFormat::MXFP4 ? mxfp4::f16_piece_offset(r, 0, mxfp4::f16_chunks(int(in)))
                                                 : r * row_bytes);
}

// act[(r, slot), j] = the gated activation of (gate_j, up_j) for output j of the chosen expert;
// gate and up are the interleaved rows 2j and 2j+1 of gate_up.
__global__ void gate_up_kernel(QuantizedExperts w, const float* h, int k, const int32_t* ids, float* act) {
  const bool fp8 = w.format == ExpertFormat::FP8;
  const int64_t scale_cols = expert_scale_row_bytes(w.format, w.hidden),
                row_bytes = expert_code_row_bytes(w.format, w.hidden);
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = kE2M1[threadIdx.x];
  __syncthreads();
  const int64_t assignment = blockIdx.y;  // r * k + slot
  const int64_t j = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (j >= w.intermediate) return;
  const int64_t expert = ids[assignment], row = assignment / k;
  const float* x = h + row * w.hidden;
  const int64_t gate_row = expert * 2 * w.intermediate + 2 * j;
  auto product = [&](int64_t r) {
    const float scale = w.format == ExpertFormat::MXFP4 ? 1.0f : w.gate_up_row_scales[r];
    return expert_row_dot(lut, w.format, code_row(w.gate_up_blocks, w.format, r, row_bytes, w.hidden),
                          w.gate_up_scales + (fp8 ? 0 : r * scale_cols),
                          scale, x, w.hidden) +
           (w.gate_up_bias ? w.gate_up_bias[r] : 0.0f);
  };
  const float gate = product(gate_row), up = product(gate_row + 1);
  if (threadIdx.x % 32 == 0)
    act[assignment * w.intermediate + j] = mxfp4::gated(gate, up, w.activation == ExpertActivation::SiluMul,
                                                        w.swiglu_limit, w.swiglu_alpha);
}

// residual[r, i] += Σ_slot weight · (down_e[i] · act[(r, slot)] + b2_e[i]), slots in order, so the
// sum is the same on every run.
__global__ void down_kernel(QuantizedExperts w, int k, const int32_t* ids, const float* route_weights, const float* act,
                            float* residual) {
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = kE2M1[threadIdx.x];
  __syncthreads();
  const int64_t row = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= w.hidden) return;
  const bool fp8 = w.format == ExpertFormat::FP8;
  const int64_t scale_cols = expert_scale_row_bytes(w.format, w.intermediate),
                row_bytes = expert_code_row_bytes(w.format, w.intermediate);
  float total = 0.0f;
  for (int slot = 0; slot < k; ++slot) {
    const int64_t assignment = row * k + slot, expert = ids[assignment];
    const int64_t down_row = expert * w.hidden + i;
    const float scale = w.format == ExpertFormat::MXFP4 ? 1.0f : w.down_row_scales[down_row];
    const float y = expert_row_dot(lut, w.format, code_row(w.down_blocks, w.format, down_row, row_bytes, w.intermediate),
                                   w.down_scales + (fp8 ? 0 : down_row * scale_cols), scale,
                                   act + assignment * w.intermediate, w.intermediate) +
                    (w.down_bias ? w.down_bias[down_row] : 0.0f);
    total = fmaf(route_weights[assignment], y, total);
  }
  if (threadIdx.x % 32 == 0) residual[row * w.hidden + i] += total;
}

}  // namespace

size_t moe_quantized_f32_workspace_bytes(int64_t max_rows, int k, int64_t intermediate) {
  return size_t(max_rows * k * intermediate) * sizeof(float);
}

void moe_quantized_f32(const QuantizedExperts& weights, const float* h, int64_t m, int k, const int32_t* ids,
                   const float* route_weights, float* residual, void* workspace, size_t workspace_bytes,
                   Stream stream) {
  if (m == 0) return;
  if (weights.format == ExpertFormat::BF16)
    throw_cuda_error("moe_quantized_f32: bf16 experts take moe_bf16", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  if (workspace_bytes < moe_quantized_f32_workspace_bytes(m, k, weights.intermediate))
    throw_cuda_error("moe_quantized_f32: workspace too small", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  float* act = static_cast<float*>(workspace);
  const cudaStream_t s = as_stream(stream);
  const dim3 gate_grid(unsigned(ceil_div(weights.intermediate, kWarpsPerBlock)), unsigned(m * k));
  gate_up_kernel<<<gate_grid, 32 * kWarpsPerBlock, 0, s>>>(weights, h, k, ids, act);
  ANVIL_CUDA_LAUNCHED();
  const dim3 down_grid(unsigned(ceil_div(weights.hidden, kWarpsPerBlock)), unsigned(m));
  down_kernel<<<down_grid, 32 * kWarpsPerBlock, 0, s>>>(weights, k, ids, route_weights, act, residual);
  ANVIL_CUDA_LAUNCHED();
}

}  // namespace anvil::cuda
