#pragma once
// The batch-1 bf16 matrix-vector product with its weights fed by the bulk copy engine
// (bulk_copy.cuh) into a ring of shared-memory stages.
//
// Why: inside a decode step the register-ring GEMV (linear_dense.cu) held gpt-oss-20b's qkv and
// o_proj products ~1.7x longer than their bytes take at the copy bandwidth, and with their weights
// already in L2 (a measurement, docs/perf/gpu.md session 20) o_proj was only ~7 % faster: the
// kernel is bound by the few kilobytes each warp keeps in flight, not by DRAM. Here one thread per
// block keeps the whole ring in flight (16 rows x 1 KB per stage), and because the weights are
// constant the ring is filled before the grid waits for its predecessor: the first stages arrive
// while the previous kernel (attention, the MoE combine) still runs.
//
// Arithmetic as linear_dense.cu's 8-warp GEMV at one token, bit for bit: the same m16n8k16
// products (W as the 16-row A operand, the token as B column 0), warp w taking 64-byte chunks
// w, w + 8, w + 16, ... of every row in that order, the warps' sums added in warp order, then the
// bias (and the old value of y when accumulating).
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/phase_probe.cuh"

namespace anvil::cuda::gemv {

constexpr int kBulkWarps = 8;
constexpr int kBulkRows = 16;
constexpr int kPieceBytes = 1024;  // of each row per stage: 16 chunks of 64 bytes, 2 per warp
// Row r of a stage starts at r * kRowPitch: with the 64-byte pad, lanes reading rows g and g + 1
// at the same offset fall in opposite halves of the banks (no conflicts).
constexpr int kRowPitch = kPieceBytes + 64;
constexpr int kStageBytes = kBulkRows * kRowPitch;
constexpr int kBulkMaxIn = 8192;  // the token is staged in shared memory whole
constexpr int kBulkMaxStages = 8;
constexpr int kBulkBlocksPerSm = 3;  // the launch bound; the launcher keeps grids within one wave

// The token as the bf16 RMSNorm of a float32 row instead (linear_normed): every block makes it
// from the row itself, which saves the norm's own kernel where nothing else makes it (the MoE's
// sum in down at batch 1 leaves the next layer's input norm to its qkv product). Values as
// rms_norm_kernel's: bf16(x · inv · weight), the sum of squares in another order.
struct GemvNorm {
  const float* x = nullptr;  // [in]; null: the token is the bf16 x
  const float* weight = nullptr;
  float eps = 0.0f;
};
constexpr int kNormMaxIn = 4096;
constexpr int kNormPerThread = kNormMaxIn / (kBulkWarps * 32 * 4);  // float4s of the row per thread

// Shared memory of one block: the ring, the token, the warps' partial sums and the barriers.
inline size_t bulk_smem_bytes(int stages, int in) {
  return size_t(stages) * kStageBytes + size_t(in) * 2 + size_t(kBulkWarps) * 32 * sizeof(float2) +
         size_t(stages) * sizeof(uint64_t);
}

// y[row] (+)= W[row] · x + bias[row] for one token x; `stages` ring stages (1..kBulkMaxStages).
// Needs in % 8 == 0, in <= kBulkMaxIn and 16-byte aligned W and x.
__global__ void __launch_bounds__(kBulkWarps * 32, kBulkBlocksPerSm)
    gemv_bulk_kernel(const uint16_t* __restrict__ weight, const float* __restrict__ bias,
                     const uint16_t* __restrict__ x, int out, int in, float* __restrict__ y, bool accumulate,
                     int stages, GemvNorm norm) {
  using gemm::mma_bf16_16816;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const ring = smem;
  uint16_t* const x_s = reinterpret_cast<uint16_t*>(smem + size_t(stages) * kStageBytes);
  float2* const partial = reinterpret_cast<float2*>(x_s + in);  // [warp][lane]
  uint64_t* const full = reinterpret_cast<uint64_t*>(partial + kBulkWarps * 32);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int probe_kernel = norm.x != nullptr ? probe::kQkv : probe::kOutProj;  // batch 1's two users
  probe::mark(probe_kernel, 0);
  const int64_t row0 = int64_t(blockIdx.x) * kBulkRows;
  const int64_t row_bytes = int64_t(in) * 2;
  const int pieces = int((row_bytes + kPieceBytes - 1) / kPieceBytes);
  auto piece_bytes = [&](int i) { return uint32_t(min(int64_t(kPieceBytes), row_bytes - int64_t(i) * kPieceBytes)); };
  const uint8_t* const bytes = reinterpret_cast<const uint8_t*>(weight);
  // Thread 0 only. Rows past `out` read the last row (never stored).
  auto issue = [&](int i) {
    const int slot = i % stages;
    const uint32_t size = piece_bytes(i);
    bulk::barrier_expect_bytes(full + slot, size * kBulkRows);
    for (int r = 0; r < kBulkRows; ++r) {
      const int64_t row = min(row0 + r, int64_t(out) - 1);
      bulk::copy_to_shared(ring + slot * kStageBytes + r * kRowPitch, bytes + row * row_bytes + int64_t(i) * kPieceBytes,
                           size, full + slot);
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bulk::barrier_init(full + s, 1);
    for (int i = 0; i < min(stages, pieces); ++i) issue(i);
  }
  // The epilogue's inputs are requested now, not after the last stage: the bias (constant, in DRAM
  // by then: a layer streams more than L2 holds) before the wait, the old y (an earlier kernel's)
  // right after it. Each was a round trip at the end of the chain's product otherwise.
  const bool epilogue_thread = threadIdx.x < kBulkRows && row0 + threadIdx.x < out;
  const float row_bias = epilogue_thread && bias != nullptr ? bias[row0 + threadIdx.x] : 0.0f;
  // The norm's weights likewise (constant).
  float4 norm_weight[kNormPerThread];
  if (norm.x != nullptr) {
#pragma unroll
    for (int j = 0; j < kNormPerThread; ++j) {
      const int k = (threadIdx.x + j * kBulkWarps * 32) * 4;
      norm_weight[j] = k < in ? __ldg(reinterpret_cast<const float4*>(norm.weight + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  wait_for_predecessor();
  release_dependents();
  probe::mark(probe_kernel, 1);
  const float old_y = epilogue_thread && accumulate ? y[row0 + threadIdx.x] : 0.0f;
  // The token, through L2: this SM's L1 may hold an earlier kernel's values at these addresses.
  if (norm.x == nullptr) {
    for (int k = threadIdx.x * 8; k < in; k += blockDim.x * 8)
      *reinterpret_cast<uint4*>(x_s + k) = __ldcg(reinterpret_cast<const uint4*>(x + k));
  } else {
    float4 v[kNormPerThread];
    float squares = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormPerThread; ++j) {
      const int k = (threadIdx.x + j * kBulkWarps * 32) * 4;
      v[j] = k < in ? __ldcg(reinterpret_cast<const float4*>(norm.x + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kNormPerThread; ++j)
      squares += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    if (lane == 0) partial[warp * 32].x = squares;  // free until the product's end
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kBulkWarps; ++w) total += partial[w * 32].x;
    const float inverse = rsqrtf(total / float(in) + norm.eps);
#pragma unroll
    for (int j = 0; j < kNormPerThread; ++j) {
      const int k = (threadIdx.x + j * kBulkWarps * 32) * 4;
      if (k >= in) continue;
      const float4 w = norm_weight[j];
      const uint32_t lo = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v[j].x * inverse * w.x))) |
                          uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v[j].y * inverse * w.y))) << 16;
      const uint32_t hi = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v[j].z * inverse * w.z))) |
                          uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v[j].w * inverse * w.w))) << 16;
      *reinterpret_cast<uint2*>(x_s + k) = make_uint2(lo, hi);
    }
  }
  __syncthreads();  // the token, and the barriers' initialization, for every thread
  probe::mark(probe_kernel, 2);

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int i = 0; i < pieces; ++i) {
    const int slot = i % stages;
    bulk::barrier_wait(full + slot, uint32_t(i / stages) & 1u);
    if (i == 0) probe::mark(probe_kernel, 3);
    const uint8_t* const stage = ring + slot * kStageBytes;
#pragma unroll
    for (int c = warp; c < kPieceBytes / 64; c += kBulkWarps) {
      const int at = c * 64 + t * 16;
      // in is a multiple of 8, so a lane's 16 bytes are all inside the row or all past it; past
      // it the stage holds stale bytes, taken as zeros.
      const bool ok = int64_t(i) * kPieceBytes + at < row_bytes;
      const uint4 a = ok ? *reinterpret_cast<const uint4*>(stage + g * kRowPitch + at) : zero;
      const uint4 b = ok ? *reinterpret_cast<const uint4*>(stage + (g + 8) * kRowPitch + at) : zero;
      const uint4 xv = ok && g == 0 ? *reinterpret_cast<const uint4*>(x_s + (int64_t(i) * kPieceBytes + at) / 2) : zero;
      mma_bf16_16816(acc, a.x, b.x, a.y, b.y, xv.x, xv.y);
      mma_bf16_16816(acc, a.z, b.z, a.w, b.w, xv.z, xv.w);
    }
    __syncthreads();  // every warp is done with this stage
    if (threadIdx.x == 0 && i + stages < pieces) issue(i + stages);
  }

  probe::mark(probe_kernel, 4);
  // Column 0 (the token) of rows g and g + 8 is d[0] and d[2] of lane (g, t = 0).
  partial[warp * 32 + lane] = make_float2(acc[0], acc[2]);
  __syncthreads();
  if (threadIdx.x < kBulkRows) {
    const int r = threadIdx.x, from = (r % 8) * 4;
    const int64_t row = row0 + r;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kBulkWarps; ++w) sum += r < 8 ? partial[w * 32 + from].x : partial[w * 32 + from].y;
    if (row < out) {
      const float value = sum + row_bias;
      y[row] = accumulate ? old_y + value : value;
    }
  }
  probe::mark(probe_kernel, probe::kProbeEnd);
}

}  // namespace anvil::cuda::gemv
