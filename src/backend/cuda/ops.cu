// Elementwise and row-wise operators: embedding, RMSNorm, RoPE, residual add, activations,
// argmax. Memory-bound and small next to the matrix products; written for one pass over the data.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope.cuh"

namespace anvil::cuda {

namespace {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16_bits(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ float block_sum(float value) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__global__ void embedding_kernel(const uint16_t* table, const int32_t* ids, int64_t dim, float* out) {
  const int64_t row = blockIdx.x;
  const uint16_t* src = table + int64_t(ids[row]) * dim;
  float* dst = out + row * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = bf16_bits_to_float(src[i]);
}

// RMSNorm of one row per block: x * rsqrt(mean(x^2) + eps) * weight, written in float32 to
// out_f32 and rounded to bf16 into out_bf16, each when non-null (a router wants the first, the
// experts' matrix product the second, and one pass can give both).
__global__ void rms_norm_kernel(const float* x, int64_t dim, const float* weight, float eps, float* out_f32,
                                uint16_t* out_bf16) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = blockIdx.x;
  const float* in = x + row * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += in[i] * in[i];
  const float inv = rsqrtf(block_sum(sum) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float value = in[i] * inv * weight[i];
    if (out_f32) out_f32[row * dim + i] = value;
    if (out_bf16) out_bf16[row * dim + i] = float_to_bf16_bits(value);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  wait_for_predecessor();
  release_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// One block per row; thread i rotates pair (i, i + half) of every head.
__global__ void rope_kernel(float* x, int64_t heads, int64_t head_dim, const int32_t* positions,
                            const float* inv_freq, float mscale) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = blockIdx.x, half = head_dim / 2;
  const float position = float(positions[row]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const RopeTurn turn = rope_turn(position, inv_freq[i], mscale);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (row * heads + h) * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = rope_first(a, b, turn);
      v[i + half] = rope_second(a, b, turn);
    }
  }
}

// One block per (row, head) of q|k|v, one thread per rotated pair: a decode step has one row,
// and one block per row left all of its heads' sin/cos to a single multiprocessor (~8 us for
// gpt-oss; measured on an H200). Heads past q and k are v, copied as they are.
__global__ void split_qkv_rope_kernel(const float* qkv, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                      const int32_t* positions, const float* inv_freq, float mscale, float* q,
                                      float* k, float* v) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = blockIdx.x, head = blockIdx.y, half = head_dim / 2;
  const float* in = qkv + (row * (heads + 2 * kv_heads) + head) * head_dim;
  if (head >= heads + kv_heads) {
    float* out = v + (row * kv_heads + head - heads - kv_heads) * head_dim;
    for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) out[i] = in[i];
    return;
  }
  float* out = head < heads ? q + (row * heads + head) * head_dim : k + (row * kv_heads + head - heads) * head_dim;
  const float position = float(positions[row]);
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const RopeTurn turn = rope_turn(position, inv_freq[j], mscale);
    const float x0 = in[j], x1 = in[j + half];
    out[j] = rope_first(x0, x1, turn);
    out[j + half] = rope_second(x0, x1, turn);
  }
}

// One block per row, one warp per head: RMSNorm of each q and k head (as the CPU's rms_norm:
// mean of squares in float32, x * rsqrt(mean + eps) * weight), then the rotation; v is copied.
__global__ void split_qkv_norm_rope_kernel(const float* qkv, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                           const float* q_norm, const float* k_norm, float eps,
                                           const int32_t* positions, const float* inv_freq, float mscale, float* q,
                                           float* k, float* v) {
  wait_for_predecessor();
  release_dependents();
  extern __shared__ float normed[];  // [warps][head_dim]
  const int64_t row = blockIdx.x, half = head_dim / 2;
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  const float* in = qkv + row * width;
  const float position = float(positions[row]);
  const int warps = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  float* mine = normed + warp * head_dim;
  for (int64_t head = warp; head < heads + kv_heads; head += warps) {
    const float* x = in + head * head_dim;
    const float* weight = head < heads ? q_norm : k_norm;
    float sum = 0.0f;
    for (int64_t i = lane; i < head_dim; i += 32) sum += x[i] * x[i];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float inv = rsqrtf(sum / float(head_dim) + eps);
    for (int64_t i = lane; i < head_dim; i += 32) mine[i] = x[i] * inv * weight[i];
    __syncwarp();
    float* out = head < heads ? q + (row * heads + head) * head_dim : k + (row * kv_heads + head - heads) * head_dim;
    for (int64_t j = lane; j < half; j += 32) {
      const RopeTurn turn = rope_turn(position, inv_freq[j], mscale);
      const float a = mine[j], b = mine[j + half];
      out[j] = rope_first(a, b, turn);
      out[j + half] = rope_second(a, b, turn);
    }
    __syncwarp();
  }
  const float* v_in = in + (heads + kv_heads) * head_dim;
  for (int64_t i = threadIdx.x; i < kv_heads * head_dim; i += blockDim.x) v[row * kv_heads * head_dim + i] = v_in[i];
}

__device__ __forceinline__ void store_activation(uint16_t* p, float value) { *p = float_to_bf16_bits(value); }
__device__ __forceinline__ void store_activation(float* p, float value) { *p = value; }

template <typename Out>
__global__ void silu_mul_kernel(const float* gate_up, int64_t width, Out* out) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = blockIdx.x;
  const float* gate = gate_up + row * 2 * width;
  const float* up = gate + width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float g = gate[i];
    store_activation(out + row * width + i, g / (1.0f + expf(-g)) * up[i]);
  }
}

// One block per row: each thread keeps its best (value, index), then a tree over the block.
// Ties go to the lower index, as the CPU sampler's argmax. Rows whose start is 16-byte aligned
// are read as float4, four loads in flight per thread (one float per thread and step left the
// 201k-entry gpt-oss row latency-bound: 78 us per step on an H200 under ncu).
__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  wait_for_predecessor();
  release_dependents();
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float best = -FLT_MAX;
  int32_t best_index = 0x7fffffff;
  auto consider = [&](float value, int64_t i) {
    if (value > best) {  // strictly greater: a thread's own earlier index wins ties
      best = value;
      best_index = int32_t(i);
    }
  };
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t quads = vocab / 4;
    constexpr int kUnroll = 4;
    // A thread visits its quads in increasing order, so "strictly greater" keeps ties low.
    for (int64_t base = threadIdx.x; base < quads; base += int64_t(blockDim.x) * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t qi = base + int64_t(u) * blockDim.x;
        v[u] = qi < quads ? __ldg(row4 + qi) : make_float4(-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t qi = base + int64_t(u) * blockDim.x;
        if (qi >= quads) break;
        consider(v[u].x, 4 * qi);
        consider(v[u].y, 4 * qi + 1);
        consider(v[u].z, 4 * qi + 2);
        consider(v[u].w, 4 * qi + 3);
      }
    }
    done = quads * 4;
  }
  for (int64_t i = done + threadIdx.x; i < vocab; i += blockDim.x) consider(row[i], i);
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const int32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (other > best || (other == best && other_index < best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  __shared__ float values[32];
  __shared__ int32_t indices[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    values[warp] = best;
    indices[warp] = best_index;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    best = lane < warps ? values[lane] : -FLT_MAX;
    best_index = lane < warps ? indices[lane] : 0x7fffffff;
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int32_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (other > best || (other == best && other_index < best_index)) {
        best = other;
        best_index = other_index;
      }
    }
    if (lane == 0) out[blockIdx.x] = best_index;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* index, int64_t dim, float* out) {
  const int64_t source_row = index[blockIdx.x];  // the step's metadata, uploaded before the step began
  wait_for_predecessor();
  release_dependents();
  const float* src = x + source_row * dim;
  float* dst = out + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// One warp per (row, output): float32 activations against bf16 weights, float32 accumulation.
// One block per (output, up to kLinearRows rows): the block's threads split the input features
// and reduce in shared memory. A warp per output left a 32-output router with 32 warps for the
// whole GPU (~12 us per gpt-oss layer, measured on an H200).
constexpr int kLinearThreads = 128, kLinearRows = 4;

// An FP8 E4M3 code as a float, exactly: its bf16 placement (fp8_layout.h) as float bits is the
// value times 2^-120 (a float subnormal for the smallest codes, which the multiply keeps).
__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  return __uint_as_float((((code & 0x80u) << 8) | ((code & 0x7Fu) << 4)) << 16) * 0x1p120f;
}

// Eight bf16 values (16 bytes, in order) as float32, exactly.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& packed, float (&out)[8]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __uint_as_float(words[j] << 16);
    out[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
  }
}

// Each row's sum of the block's per-thread values[r] (kLinearThreads threads), for thread r; the
// order is fixed (lanes by butterfly, then warps in turn). The block may reuse partial afterwards.
__device__ __forceinline__ float block_row_sum(const float (&values)[kLinearRows],
                                               float (&partial)[kLinearRows][kLinearThreads / 32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kLinearRows; ++r) {
    float v = values[r];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) partial[r][warp] = v;
  }
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < kLinearRows)
    for (int w = 0; w < kLinearThreads / 32; ++w) total += partial[threadIdx.x][w];
  __syncthreads();
  return total;
}

// FP8 rows (kFp8): one 16-byte group (fp8_layout.h) per thread step, the row scale applied to the
// sum. The launcher checks in % 16 == 0 and the alignment.
template <bool kFp8>
__global__ void linear_f32_input_kernel(const void* weight, const float* row_scales, const float* bias, const float* x,
                                        int64_t m, int64_t out_features, int64_t in_features, float* y) {
  wait_for_predecessor();
  release_dependents();
  const int64_t out = blockIdx.x, row0 = int64_t(blockIdx.y) * kLinearRows;
  const int rows = int(m - row0 < kLinearRows ? m - row0 : kLinearRows);
  float sum[kLinearRows] = {};
  if constexpr (kFp8) {
    const uint4* groups = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(weight) + out * in_features);
    for (int64_t group = threadIdx.x; group < in_features / 16; group += kLinearThreads) {
      const uint4 packed = __ldg(groups + group);
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      float wf[16];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        wf[2 * j] = e4m3_to_float(words[j] & 0xffu);
        wf[2 * j + 8] = e4m3_to_float((words[j] >> 8) & 0xffu);
        wf[2 * j + 1] = e4m3_to_float((words[j] >> 16) & 0xffu);
        wf[2 * j + 9] = e4m3_to_float(words[j] >> 24);
      }
#pragma unroll
      for (int r = 0; r < kLinearRows; ++r) {
        if (r >= rows) break;
        const float* xr = x + (row0 + r) * in_features + group * 16;
#pragma unroll
        for (int k = 0; k < 16; ++k) sum[r] = fmaf(xr[k], wf[k], sum[r]);
      }
    }
  } else {
    const uint16_t* w = static_cast<const uint16_t*>(weight) + out * in_features;
    // 16-byte loads (8 weights, two float4 of each row's input) when everything is aligned: the
    // router's 2880 inputs are then 2.8 loads per thread instead of 22 dependent scalar rounds.
    const bool vector = in_features % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0 &&
                        (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
    int64_t tail = 0;
    if (vector) {
      for (int64_t i8 = threadIdx.x; i8 < in_features / 8; i8 += kLinearThreads) {
        float wf[8];
        bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(w) + i8), wf);
#pragma unroll
        for (int r = 0; r < kLinearRows; ++r) {
          if (r >= rows) break;
          const float4* xr = reinterpret_cast<const float4*>(x + (row0 + r) * in_features) + 2 * i8;
          const float4 a = xr[0], b = xr[1];
          float acc = sum[r];
          acc = fmaf(a.x, wf[0], acc);
          acc = fmaf(a.y, wf[1], acc);
          acc = fmaf(a.z, wf[2], acc);
          acc = fmaf(a.w, wf[3], acc);
          acc = fmaf(b.x, wf[4], acc);
          acc = fmaf(b.y, wf[5], acc);
          acc = fmaf(b.z, wf[6], acc);
          acc = fmaf(b.w, wf[7], acc);
          sum[r] = acc;
        }
      }
      tail = in_features;
    }
    for (int64_t i = tail + threadIdx.x; i < in_features; i += kLinearThreads) {
      const float wi = bf16_bits_to_float(w[i]);
#pragma unroll
      for (int r = 0; r < kLinearRows; ++r)
        if (r < rows) sum[r] = fmaf(x[(row0 + r) * in_features + i], wi, sum[r]);
    }
  }
  __shared__ float partial[kLinearRows][kLinearThreads / 32];
  float total = block_row_sum(sum, partial);
  if (threadIdx.x < rows) {
    if constexpr (kFp8) total *= row_scales[out];
    y[(row0 + threadIdx.x) * out_features + out] = total + (bias ? bias[out] : 0.0f);
  }
}

// Eight consecutive floats at p (16-byte aligned) as two 16-byte loads.
__device__ __forceinline__ void load8_f32(const float* p, float (&out)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// rms_norm_dual followed by the router's linear_f32_input, for few rows: block (e, rows) makes its
// rows' inverse RMS itself from x (L2-resident: a second read costs little), then expert e's
// logits from the normalized values, made on the fly exactly as rms_norm_kernel makes them, and
// writes its 1/E share of the rows' bf16 norm (the experts' input). One kernel fewer per layer,
// and no float32 copy of the norm.
__global__ void rms_norm_router_kernel(const float* __restrict__ x, int64_t dim, const float* __restrict__ norm_weight,
                                       float eps, const uint16_t* __restrict__ router, const float* __restrict__ bias,
                                       int64_t m, int64_t experts, float* __restrict__ logits,
                                       uint16_t* __restrict__ out_bf16) {
  const int64_t expert = blockIdx.x, row0 = int64_t(blockIdx.y) * kLinearRows;
  const int rows = int(m - row0 < kLinearRows ? m - row0 : kLinearRows);
  __shared__ float partial[kLinearRows][kLinearThreads / 32];
  __shared__ float inverse[kLinearRows];

  // 16-byte loads where everything is aligned (2880 inputs: 2.8 steps per thread, not 22).
  const uint16_t* w = router + expert * dim;
  const bool vector = dim % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                      (reinterpret_cast<uintptr_t>(w) & 15u) == 0 && (reinterpret_cast<uintptr_t>(norm_weight) & 15u) == 0;
  const int64_t vector_end = vector ? dim : 0;
  // The constants (router row, norm weights, bias: in DRAM by now, a layer streams more than L2
  // holds) of the thread's first kPreloaded steps, requested before the wait; each was a round
  // trip on the chain's path after the norm's reduction otherwise.
  constexpr int kPreloaded = 4;  // 4096 inputs
  uint4 w_pre[kPreloaded];
  float4 scale_pre[kPreloaded][2];
#pragma unroll
  for (int p = 0; p < kPreloaded; ++p) {
    const int64_t i8 = threadIdx.x + int64_t(p) * kLinearThreads;
    if (i8 < vector_end / 8) {
      w_pre[p] = __ldg(reinterpret_cast<const uint4*>(w) + i8);
      scale_pre[p][0] = __ldg(reinterpret_cast<const float4*>(norm_weight) + 2 * i8);
      scale_pre[p][1] = __ldg(reinterpret_cast<const float4*>(norm_weight) + 2 * i8 + 1);
    }
  }
  const float expert_bias = bias ? bias[expert] : 0.0f;
  const int64_t share = (dim + gridDim.x - 1) / gridDim.x, first = expert * share;
  const int64_t last = first + share < dim ? first + share : dim;
  const float first_share_scale = first + threadIdx.x < last ? norm_weight[first + threadIdx.x] : 0.0f;
  wait_for_predecessor();
  release_dependents();
  float squares[kLinearRows] = {};
  for (int64_t i8 = threadIdx.x; i8 < vector_end / 8; i8 += kLinearThreads)
#pragma unroll
    for (int r = 0; r < kLinearRows; ++r)
      if (r < rows) {
        float values[8];
        load8_f32(x + (row0 + r) * dim + 8 * i8, values);
#pragma unroll
        for (int j = 0; j < 8; ++j) squares[r] = fmaf(values[j], values[j], squares[r]);
      }
  for (int64_t i = vector_end + threadIdx.x; i < dim; i += kLinearThreads)
#pragma unroll
    for (int r = 0; r < kLinearRows; ++r)
      if (r < rows) {
        const float v = x[(row0 + r) * dim + i];
        squares[r] = fmaf(v, v, squares[r]);
      }
  const float square_sum = block_row_sum(squares, partial);
  if (threadIdx.x < rows) inverse[threadIdx.x] = rsqrtf(square_sum / float(dim) + eps);
  __syncthreads();
  float inv[kLinearRows];
#pragma unroll
  for (int r = 0; r < kLinearRows; ++r) inv[r] = r < rows ? inverse[r] : 0.0f;

  float sum[kLinearRows] = {};
  int p = 0;
  for (int64_t i8 = threadIdx.x; i8 < vector_end / 8; i8 += kLinearThreads, ++p) {
    float scales[8], wf[8];
    if (p < kPreloaded) {
      // Picked by comparing p with constants (q is unrolled), so the arrays stay in registers.
#pragma unroll
      for (int q = 0; q < kPreloaded; ++q)
        if (q == p) {
          const float4 a = scale_pre[q][0], b = scale_pre[q][1];
          scales[0] = a.x, scales[1] = a.y, scales[2] = a.z, scales[3] = a.w;
          scales[4] = b.x, scales[5] = b.y, scales[6] = b.z, scales[7] = b.w;
          bf16x8_to_f32(w_pre[q], wf);
        }
    } else {
      load8_f32(norm_weight + 8 * i8, scales);
      bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(w) + i8), wf);
    }
#pragma unroll
    for (int r = 0; r < kLinearRows; ++r)
      if (r < rows) {
        float values[8];
        load8_f32(x + (row0 + r) * dim + 8 * i8, values);
#pragma unroll
        for (int j = 0; j < 8; ++j) sum[r] = fmaf(values[j] * inv[r] * scales[j], wf[j], sum[r]);
      }
  }
  for (int64_t i = vector_end + threadIdx.x; i < dim; i += kLinearThreads) {
    const float wi = bf16_bits_to_float(w[i]), scale = norm_weight[i];
#pragma unroll
    for (int r = 0; r < kLinearRows; ++r)
      if (r < rows) sum[r] = fmaf(x[(row0 + r) * dim + i] * inv[r] * scale, wi, sum[r]);
  }
  const float total = block_row_sum(sum, partial);
  if (threadIdx.x < rows) logits[(row0 + threadIdx.x) * experts + expert] = total + expert_bias;

  for (int r = 0; r < rows; ++r)
    for (int64_t i = first + threadIdx.x; i < last; i += kLinearThreads) {
      const float scale = i == first + threadIdx.x ? first_share_scale : norm_weight[i];
      out_bf16[(row0 + r) * dim + i] = float_to_bf16_bits(x[(row0 + r) * dim + i] * inv[r] * scale);
    }
}

int threads_for(int64_t width) { return width >= 1024 ? 1024 : width >= 256 ? 256 : 128; }

}  // namespace

void embedding_bf16(const uint16_t* table, const int32_t* ids, int64_t rows, int64_t dim, float* out, Stream stream) {
  if (rows == 0) return;
  embedding_kernel<<<unsigned(rows), 256, 0, as_stream(stream)>>>(table, ids, dim, out);
  ANVIL_CUDA_LAUNCHED();
}

void rms_norm_to_bf16(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, uint16_t* out,
                      Stream stream) {
  if (rows == 0) return;
  launch_chained(rms_norm_kernel, unsigned(rows), threads_for(dim), 0, as_stream(stream), x, dim, weight, eps,
                 static_cast<float*>(nullptr), out);
  ANVIL_CUDA_LAUNCHED();
}

void rms_norm_dual(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out_f32,
                   uint16_t* out_bf16, Stream stream) {
  if (rows == 0) return;
  launch_chained(rms_norm_kernel, unsigned(rows), threads_for(dim), 0, as_stream(stream), x, dim, weight, eps,
                 out_f32, out_bf16);
  ANVIL_CUDA_LAUNCHED();
}

void rms_norm_router(const float* x, int64_t rows, int64_t dim, const float* norm_weight, float eps,
                     const uint16_t* router, const float* router_bias, int64_t experts, float* logits,
                     uint16_t* out_bf16, float* scratch_f32, Stream stream) {
  if (rows == 0) return;
  if (rows > kNormRouterRows) {
    rms_norm_dual(x, rows, dim, norm_weight, eps, scratch_f32, out_bf16, stream);
    return linear_f32_input(router, router_bias, scratch_f32, rows, experts, dim, logits, stream);
  }
  const dim3 grid(unsigned(experts), unsigned(ceil_div(rows, kLinearRows)));
  launch_chained(rms_norm_router_kernel, grid, kLinearThreads, 0, as_stream(stream), x, dim, norm_weight, eps, router,
                 router_bias, rows, experts, logits, out_bf16);
  ANVIL_CUDA_LAUNCHED();
}

void rms_norm_f32(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out,
                  Stream stream) {
  if (rows == 0) return;
  const int threads = dim <= 128 ? 32 * int(ceil_div(dim, 32)) : threads_for(dim);
  launch_chained(rms_norm_kernel, unsigned(rows), threads, 0, as_stream(stream), x, dim, weight, eps, out,
                 static_cast<uint16_t*>(nullptr));
  ANVIL_CUDA_LAUNCHED();
}

void add_inplace(float* x, const float* y, int64_t n, Stream stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(n, 256), 4096);
  launch_chained(add_kernel, unsigned(blocks), 256, 0, as_stream(stream), x, y, n);
  ANVIL_CUDA_LAUNCHED();
}

void rope_inplace(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
                  const float* inv_freq, float mscale, Stream stream) {
  if (rows == 0) return;
  launch_chained(rope_kernel, unsigned(rows), 64, 0, as_stream(stream), x, heads, head_dim, positions, inv_freq,
                 mscale);
  ANVIL_CUDA_LAUNCHED();
}

void split_qkv_rope(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                    const int32_t* positions, const float* inv_freq, float mscale, float* q, float* k, float* v,
                    Stream stream) {
  if (rows == 0) return;
  const dim3 grid(unsigned(rows), unsigned(heads + 2 * kv_heads));
  const unsigned threads = unsigned(std::min<int64_t>(128, std::max<int64_t>(32, head_dim / 2)));
  launch_chained(split_qkv_rope_kernel, grid, threads, 0, as_stream(stream), qkv, heads, kv_heads, head_dim, positions,
                 inv_freq, mscale, q, k, v);
  ANVIL_CUDA_LAUNCHED();
}

void silu_mul_to_bf16(const float* gate_up, int64_t rows, int64_t width, uint16_t* out, Stream stream) {
  if (rows == 0) return;
  launch_chained(silu_mul_kernel<uint16_t>, unsigned(rows), threads_for(width), 0, as_stream(stream), gate_up, width, out);
  ANVIL_CUDA_LAUNCHED();
}

void silu_mul_f32(const float* gate_up, int64_t rows, int64_t width, float* out, Stream stream) {
  if (rows == 0) return;
  launch_chained(silu_mul_kernel<float>, unsigned(rows), threads_for(width), 0, as_stream(stream), gate_up, width, out);
  ANVIL_CUDA_LAUNCHED();
}

void split_qkv_norm_rope(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         const float* q_norm, const float* k_norm, float eps, const int32_t* positions,
                         const float* inv_freq, float mscale, float* q, float* k, float* v, Stream stream) {
  if (rows == 0) return;
  constexpr int kWarps = 8;
  launch_chained(split_qkv_norm_rope_kernel, unsigned(rows), 32 * kWarps, size_t(kWarps * head_dim) * sizeof(float),
                 as_stream(stream), qkv, heads, kv_heads, head_dim, q_norm, k_norm, eps, positions, inv_freq, mscale, q,
                 k, v);
  ANVIL_CUDA_LAUNCHED();
}

void linear_f32_input(const uint16_t* weight, const float* bias, const float* x, int64_t m, int64_t out_features,
                      int64_t in_features, float* y, Stream stream) {
  if (m == 0 || out_features == 0) return;
  const dim3 grid(unsigned(out_features), unsigned(ceil_div(m, kLinearRows)));
  launch_chained(linear_f32_input_kernel<false>, grid, kLinearThreads, 0, as_stream(stream),
                 static_cast<const void*>(weight), static_cast<const float*>(nullptr), bias, x, m, out_features,
                 in_features, y);
  ANVIL_CUDA_LAUNCHED();
}

void linear_f32_input(const DenseWeight& weight, const float* bias, const float* x, int64_t m, int64_t out_features,
                      int64_t in_features, float* y, Stream stream) {
  if (weight.format == DenseWeight::Format::BF16)
    return linear_f32_input(static_cast<const uint16_t*>(weight.data), bias, x, m, out_features, in_features, y, stream);
  if (in_features % 16 != 0 || reinterpret_cast<uintptr_t>(weight.data) % 16 != 0 || weight.row_scales == nullptr)
    throw_cuda_error("linear_f32_input: FP8 weights need in_features % 16 == 0, 16-byte alignment and row scales",
                     int(cudaErrorInvalidValue), __FILE__, __LINE__);
  if (m == 0 || out_features == 0) return;
  const dim3 grid(unsigned(out_features), unsigned(ceil_div(m, kLinearRows)));
  launch_chained(linear_f32_input_kernel<true>, grid, kLinearThreads, 0, as_stream(stream), weight.data,
                 weight.row_scales, bias, x, m, out_features, in_features, y);
  ANVIL_CUDA_LAUNCHED();
}

void gather_rows_f32(const float* x, const int32_t* index, int64_t n, int64_t dim, float* out, Stream stream) {
  if (n == 0) return;
  launch_chained(gather_rows_kernel, unsigned(n), 256, 0, as_stream(stream), x, index, dim, out);
  ANVIL_CUDA_LAUNCHED();
}

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, Stream stream) {
  if (rows == 0) return;
  launch_chained(argmax_kernel, unsigned(rows), 1024, 0, as_stream(stream), logits, vocab, out);
  ANVIL_CUDA_LAUNCHED();
}

}  // namespace anvil::cuda
