// Qwen3-MoE experts (bf16 weights) and their routing, on CUDA cores in float32.
//
// One warp per output value: gate and up rows of the chosen expert against the token's float32
// input, then the down rows against the float32 SwiGLU output, summed over the k choices in a
// fixed order. Each weight row is read with 16-byte loads, so at decode (few tokens, each expert
// read once per token) the kernel is bound by memory; with many tokens per expert it re-reads the
// expert per token, so those steps take the grouped GEMM (moe_quantized, ExpertFormat::BF16) on
// the same bytes: the weights are in bf16_layout.h's order for it, gate and up rows interleaved.
#include "backend/cuda/bf16_layout.h"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRoutingWarps = 4;

// Σ_i row[i] · x[i] for one bf16 row of n weights (n a multiple of 8) in bf16_layout.h's order
// (word w of a group of 8 holds values w and w + 4); every lane gets the sum.
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
      sum = fmaf(__uint_as_float(words[w] << 16), xs[w], sum);
      sum = fmaf(__uint_as_float(words[w] & 0xffff0000u), xs[w + 4], sum);
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
  const float gate = bf16_row_dot(base + 2 * j * w.hidden, x, w.hidden);
  const float up = bf16_row_dot(base + (2 * j + 1) * w.hidden, x, w.hidden);
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

// Eight natural-order bf16 values (one 16-byte group) in bf16_layout.h's order: (0,4), (1,5), (2,6), (3,7).
__device__ __forceinline__ uint4 to_layout(uint4 v) {
  static_assert(bf16_layout::position(4) == 1 && bf16_layout::position(1) == 2, "pairs (i, i + 4)");
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                    __byte_perm(v.y, v.w, 0x7632));
}

__global__ void layout_in_place_kernel(uint4* groups, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    groups[i] = to_layout(groups[i]);
}

// One expert's gate_up from src (W gate rows, then W up rows, natural order) into dst with gate row
// j at 2j, up row j at 2j + 1, each group in the layout.
__global__ void gate_up_layout_kernel(const uint4* src, uint4* dst, int64_t width, int64_t row_groups) {
  const int64_t count = 2 * width * row_groups;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_groups, group = i % row_groups;
    const int64_t to = row < width ? 2 * row : 2 * (row - width) + 1;
    dst[to * row_groups + group] = to_layout(src[i]);
  }
}

}  // namespace

void moe_bf16_pack(uint16_t* gate_up, uint16_t* down, int64_t experts, int64_t hidden, int64_t width, Stream stream) {
  if (hidden % 8 || width % 8 || reinterpret_cast<uintptr_t>(gate_up) % 16 || reinterpret_cast<uintptr_t>(down) % 16)
    throw_cuda_error("moe_bf16_pack: hidden and width must be multiples of 8, the weights 16-byte aligned",
                     int(cudaErrorInvalidValue), __FILE__, __LINE__);
  if (experts == 0) return;
  const cudaStream_t s = as_stream(stream);
  const int64_t expert_values = 2 * width * hidden;
  DeviceBuffer scratch(size_t(expert_values) * 2);
  for (int64_t e = 0; e < experts; ++e) {
    uint16_t* expert = gate_up + e * expert_values;
    ANVIL_CUDA_CHECK(cudaMemcpyAsync(scratch.get(), expert, size_t(expert_values) * 2, cudaMemcpyDeviceToDevice, s));
    gate_up_layout_kernel<<<grid_stride_blocks(expert_values / 8), 256, 0, s>>>(scratch.get<uint4>(),
                                                                       reinterpret_cast<uint4*>(expert), width, hidden / 8);
    ANVIL_CUDA_LAUNCHED();
  }
  const int64_t down_groups = experts * hidden * width / 8;
  layout_in_place_kernel<<<grid_stride_blocks(down_groups), 256, 0, s>>>(reinterpret_cast<uint4*>(down), down_groups);
  ANVIL_CUDA_LAUNCHED();
  // The scratch copy is freed on return; its last use must be done first.
  ANVIL_CUDA_CHECK(cudaStreamSynchronize(s));
}

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
