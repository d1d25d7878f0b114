// Qwen3-MoE experts (bf16 weights) and their routing, on CUDA cores in float32.
//
// One warp per output value: gate and up rows of the chosen expert against the token's float32
// input, then the down rows against the float32 SwiGLU output, summed over the k choices in a
// fixed order. Each weight row is read with 16-byte loads, so at decode (few tokens, each expert
// read once per token) the kernel is bound by memory; with many tokens per expert it re-reads the
// expert per token, which a grouped GEMM would not.
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRoutingWarps = 4;

// Σ_i row[i] · x[i] for one bf16 row of n weights (n a multiple of 8); every lane gets the sum.
__device__ float bf16_row_dot(const uint16_t* row, const float* x, int64_t n) {
  const int lane = threadIdx.x % 32;
  float sum = 0.0f;
  for (int64_t i = int64_t(lane) * 8; i < n; i += 32 * 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + i);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    const float4 xa = *reinterpret_cast<const float4*>(x + i), xb = *reinterpret_cast<const float4*>(x + i + 4);
    const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      sum = fmaf(__uint_as_float(words[w] << 16), xs[2 * w], sum);
      sum = fmaf(__uint_as_float(words[w] & 0xffff0000u), xs[2 * w + 1], sum);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

__global__ void gate_up_kernel(MoeBf16Weights w, const float* h, int k, const int32_t* ids, float* act) {
  const int64_t assignment = blockIdx.y;  // row * k + choice
  const int64_t j = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (j >= w.intermediate) return;
  const int64_t expert = ids[assignment], row = assignment / k;
  const uint16_t* base = w.gate_up + expert * 2 * w.intermediate * w.hidden;
  const float* x = h + row * w.hidden;
  const float gate = bf16_row_dot(base + j * w.hidden, x, w.hidden);
  const float up = bf16_row_dot(base + (w.intermediate + j) * w.hidden, x, w.hidden);
  if (threadIdx.x % 32 == 0) act[assignment * w.intermediate + j] = gate / (1.0f + expf(-gate)) * up;
}

__global__ void down_kernel(MoeBf16Weights w, int k, const int32_t* ids, const float* route_weights, const float* act,
                            float* residual) {
  const int64_t row = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= w.hidden) return;
  float total = 0.0f;
  for (int choice = 0; choice < k; ++choice) {
    const int64_t assignment = row * k + choice, expert = ids[assignment];
    const float y = bf16_row_dot(w.down + (expert * w.hidden + i) * w.intermediate, act + assignment * w.intermediate,
                                 w.intermediate);
    total = fmaf(route_weights[assignment], y, total);
  }
  if (threadIdx.x % 32 == 0) residual[row * w.hidden + i] += total;
}

// One warp per row: softmax over all experts, then k rounds of argmax (ties to the lower index).
__global__ void softmax_topk_kernel(const float* logits, int64_t m, int num_experts, int k, bool normalize,
                                    int32_t* ids, float* weights) {
  const int64_t row = int64_t(blockIdx.x) * kRoutingWarps + threadIdx.x / 32;
  if (row >= m) return;
  const int lane = threadIdx.x % 32;
  const float* x = logits + row * num_experts;
  float max_value = -INFINITY;
  for (int e = lane; e < num_experts; e += 32) max_value = fmaxf(max_value, x[e]);
  for (int offset = 16; offset > 0; offset /= 2) max_value = fmaxf(max_value, __shfl_xor_sync(0xffffffffu, max_value, offset));
  float sum = 0.0f;
  for (int e = lane; e < num_experts; e += 32) sum += expf(x[e] - max_value);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  float chosen_sum = 0.0f;
  int32_t* row_ids = ids + row * k;
  float* row_weights = weights + row * k;
  for (int pick = 0; pick < k; ++pick) {
    float best = -INFINITY;
    int best_index = num_experts;
    for (int e = lane; e < num_experts; e += 32) {
      bool taken = false;
      for (int p = 0; p < pick; ++p) taken |= row_ids[p] == e;
      if (!taken && (x[e] > best || best_index == num_experts)) {
        best = x[e];
        best_index = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (other > best || (other == best && other_index < best_index)) {
        best = other;
        best_index = other_index;
      }
    }
    const float probability = expf(best - max_value) / sum;
    chosen_sum += probability;
    if (lane == 0) {
      row_ids[pick] = best_index;
      row_weights[pick] = probability;
    }
    __syncwarp();  // the next pick reads row_ids
  }
  if (normalize && lane < k) row_weights[lane] /= chosen_sum;
}

}  // namespace

void moe_softmax_topk(const float* logits, int64_t m, int64_t num_experts, int k, bool normalize, int32_t* ids,
                      float* weights, Stream stream) {
  if (k < 1 || k > 32 || k > num_experts)
    throw_cuda_error("moe_softmax_topk: k must be in 1..min(32, experts)", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  if (m == 0) return;
  softmax_topk_kernel<<<unsigned(ceil_div(m, kRoutingWarps)), 32 * kRoutingWarps, 0, as_stream(stream)>>>(
      logits, m, int(num_experts), k, normalize, ids, weights);
  ANVIL_CUDA_LAUNCHED();
}

size_t moe_bf16_workspace_bytes(int64_t max_rows, int k, int64_t intermediate) {
  return size_t(max_rows * k * intermediate) * sizeof(float);
}

void moe_bf16(const MoeBf16Weights& weights, const float* h, int64_t m, int k, const int32_t* ids,
              const float* route_weights, float* residual, void* workspace, size_t workspace_bytes, Stream stream) {
  if (m == 0) return;
  if (weights.hidden % 8 || weights.intermediate % 8)
    throw_cuda_error("moe_bf16: hidden and intermediate sizes must be multiples of 8", int(cudaErrorInvalidValue),
                     __FILE__, __LINE__);
  if (workspace_bytes < moe_bf16_workspace_bytes(m, k, weights.intermediate))
    throw_cuda_error("moe_bf16: workspace too small", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  float* act = static_cast<float*>(workspace);
  const cudaStream_t s = as_stream(stream);
  gate_up_kernel<<<dim3(unsigned(ceil_div(weights.intermediate, kWarpsPerBlock)), unsigned(m * k)),
                   32 * kWarpsPerBlock, 0, s>>>(weights, h, k, ids, act);
  ANVIL_CUDA_LAUNCHED();
  down_kernel<<<dim3(unsigned(ceil_div(weights.hidden, kWarpsPerBlock)), unsigned(m)), 32 * kWarpsPerBlock, 0, s>>>(
      weights, k, ids, route_weights, act, residual);
  ANVIL_CUDA_LAUNCHED();
}

}  // namespace anvil::cuda
