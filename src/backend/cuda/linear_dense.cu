// Dense layers: y[m, out] = x[m, in] · W[out, in]ᵀ (· row_scale) + bias, bf16 x, fp32 out, with
// W in bf16 or in FP8 E4M3 with one float32 scale per output row (fp8_layout.h).
//
// Few rows (decode): the weight is the whole cost, so a bandwidth kernel streams it once with
// 16-byte loads and lets the tensor cores do the arithmetic with W as the 16-row "A" operand and
// the (at most 32) token rows as "B" — no shared-memory staging and hardly any ALU work per byte
// (FP8 bytes are decoded to bf16 in registers: a few shifts and masks per pair).
// Many rows (prefill): a cp.async-pipelined mma.sync GEMM with at most 48 KB of shared memory per
// block (fits SM120's 99 KB), tile sizes picked so the grid still fills the GPU. The row scale of
// FP8 weights is applied to the fp32 result, so both formats share the kernels.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/gemv_bulk.cuh"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

using namespace gemm;

[[noreturn]] void invalid(const char* what) { throw_cuda_error(what, int(cudaErrorInvalidValue), __FILE__, __LINE__); }

// The bf16 pairs of stored FP8 word j (fp8_layout.h): k (2j, 2j+1) and k (2j+8, 2j+9).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t fp8_low_pair(uint32_t word) {
  return bf16x2_mul(fp8::low_pair_raw(word), fp8::kRawToValue);
}
__device__ __forceinline__ uint32_t fp8_high_pair(uint32_t word) {
  return bf16x2_mul(fp8::high_pair_raw(word), fp8::kRawToValue);
}

// ---------------------------------------------------------------------------------------------
// Matrix-vector path (m <= 32).
//
// A block owns 16 output rows; its 8 warps split the input dimension in 64-byte chunks (warp w
// takes chunks w, w+8, ...), so neighbouring warps read neighbouring 64-byte pieces of each row.
// Lane (g, t) loads 16 bytes of rows g and g+8 at byte 64c + 16t: for bf16 those are 8
// consecutive k, assigned to two m16n8k16 products (4 each), and the token side loads the same
// 8 k of token g; for FP8 they are one 16-k group (fp8_layout.h) and four products, word j of
// the group feeding product j, against 16 k of token g.
// Partial sums meet in shared memory in a fixed order, so results do not depend on timing.
// 8 warps per block, or 4 when 8-warp blocks would make a little more than one wave (gpt-oss's
// fused qkv: 320 blocks for 264 slots on an H200); 4-warp blocks fit 4 per SM, one wave.
// Weight chunks in flight per warp, as a ring of registers refilled every step: loads leave in
// a steady stream instead of bursts, which is what keeps small layers (a few MB, latency-bound)
// near bandwidth. Token rows (L1/L2-resident) are fetched one chunk ahead.
#ifndef ANVIL_GEMV_DEPTH1
#define ANVIL_GEMV_DEPTH1 4  // chunks in flight per warp at one token tile (harness on an H200, batch 1:
                             // 4 beat 6, 8, 10, 12 at the gpt-oss shapes, e.g. lm_head 280 vs 292 us)
#endif
template <int kTokenTiles>
constexpr int kGemvDepth = kTokenTiles >= 2 ? 4 : ANVIL_GEMV_DEPTH1;

// What a weight element is: how many k a lane's 16 bytes hold, and how many 16-byte token
// loads match them.
template <bool kFp8, int kTokenTiles>
struct GemvFormat {
  static constexpr int kLaneK = kFp8 ? 16 : 8;
  static constexpr int kChunkK = 4 * kLaneK;
  static constexpr int kTokenWords = kFp8 ? 2 : 1;
  // FP8's four products per chunk in two chains where one token tile leaves the registers (with
  // more, the tiles' chains interleave anyway, and a second set would spill).
  static constexpr int kAccSets = kFp8 && kTokenTiles == 1 ? 2 : 1;
  // FP8's token rows take twice the registers per chunk; at four tiles two chunks in flight keep
  // it within the 128-register cap.
  static constexpr int kDepth = kFp8 && kTokenTiles >= 4 ? 2 : kGemvDepth<kTokenTiles>;
};

// Two blocks (16 warps) per SM keep enough loads in flight; the 128-register cap that implies is
// met without spills.
// kSiluMul (a gate_up matrix: `out` rows, gate rows first, then as many up rows): a block takes
// 8 gate rows and their 8 up rows as its 16, so every lane holds both halves of its features and
// the epilogue writes silu(gate) · up in bf16 to y_bf16 [m, out / 2] instead of y; the sums are
// the plain kernel's, row for row.
template <int kTokenTiles, int kGemvWarps, bool kFp8, bool kSiluMul = false>
__global__ void __launch_bounds__(kGemvWarps * 32, 16 / kGemvWarps)
    gemv_kernel(const void* __restrict__ weight_bytes, const float* __restrict__ row_scales,
                const float* __restrict__ bias, const uint16_t* __restrict__ x, int m, int out, int in,
                float* __restrict__ y, bool accumulate, uint16_t* __restrict__ y_bf16) {
  using F = GemvFormat<kFp8, kTokenTiles>;
  constexpr int kDepth = F::kDepth;
  // Weight offsets count elements: 16 bytes are kLaneK of them.
  using Weight = std::conditional_t<kFp8, uint8_t, uint16_t>;
  const Weight* __restrict__ weight = static_cast<const Weight*>(weight_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  // Rows past the end read the last row (harmless, never stored).
  const int64_t feature0 = int64_t(blockIdx.x) * 8;  // kSiluMul: out / 2 is a multiple of 8
  const int64_t row_a = kSiluMul ? feature0 + g : min(row0 + g, int64_t(out) - 1);
  const int64_t row_b = kSiluMul ? out / 2 + feature0 + g : min(row0 + g + 8, int64_t(out) - 1);
  const Weight* wa = weight + row_a * in + t * F::kLaneK;
  const Weight* wb = weight + row_b * in + t * F::kLaneK;
  const uint16_t* xr[kTokenTiles];
  bool x_ok[kTokenTiles];
#pragma unroll
  for (int n = 0; n < kTokenTiles; ++n) {
    const int token = n * 8 + g;
    x_ok[n] = token < m;
    xr[n] = x + (x_ok[n] ? int64_t(token) * in : 0) + t * F::kLaneK;
  }
  const int chunks = (in + F::kChunkK - 1) / F::kChunkK;
  const int my_chunks = warp < chunks ? (chunks - warp + kGemvWarps - 1) / kGemvWarps : 0;
  // Chunk i of this warp is c = warp + 8i. in is a multiple of kLaneK, so a lane's values are
  // either all inside the row or all past it; loads past the end yield zeros without touching
  // memory.
  auto chunk_ok = [&](int i) { return i < my_chunks && (warp + i * kGemvWarps) * F::kChunkK + t * F::kLaneK < in; };
  auto load_w = [&](int i, uint4& a, uint4& b) {
    const int c = warp + i * kGemvWarps;
    const bool ok = chunk_ok(i);
    a = load_stream_16(wa + c * F::kChunkK, ok);
    b = load_stream_16(wb + c * F::kChunkK, ok);
  };
  auto load_x = [&](int i, uint4 (&dst)[kTokenTiles][F::kTokenWords]) {
    const int c = warp + i * kGemvWarps;
    const bool ok = chunk_ok(i);
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
      for (int w = 0; w < F::kTokenWords; ++w)
        dst[n][w] = load_cached_16(xr[n] + c * F::kChunkK + w * 8, ok && x_ok[n]);
  };

  float acc[F::kAccSets][kTokenTiles][4] = {};
  uint4 va[kDepth], vb[kDepth], xv[2][kTokenTiles][F::kTokenWords];
  // The weights are constant: their first loads go out while the previous kernel (which writes x
  // and, with accumulate, y) may still be running.
#pragma unroll
  for (int j = 0; j < kDepth - 1; ++j) load_w(j, va[j], vb[j]);
  // So are the epilogue's per-row constants, requested now rather than after the last chunk (a
  // DRAM round trip at the end of the product otherwise). A thread's epilogue entries below are
  // i = threadIdx.x + k * blockDim.x; the row depends on i % 128 (the feature on i % 64) and
  // blockDim.x is a multiple of 128, so each thread has one row (feature) throughout.
  const int64_t my_row = row0 + (threadIdx.x / 4) % 32 / 4 + (threadIdx.x % 4 >= 2 ? 8 : 0);
  const int64_t my_feature = feature0 + (threadIdx.x / 2) % 32 / 4;
  float my_bias = 0.0f, my_up_bias = 0.0f, my_scale = 1.0f, my_up_scale = 1.0f;
  if constexpr (kSiluMul) {
    if (bias != nullptr) my_bias = bias[my_feature], my_up_bias = bias[out / 2 + my_feature];
    if constexpr (kFp8) my_scale = row_scales[my_feature], my_up_scale = row_scales[out / 2 + my_feature];
  } else if (my_row < out) {
    if (bias != nullptr) my_bias = bias[my_row];
    if constexpr (kFp8) my_scale = row_scales[my_row];
  }
  wait_for_predecessor();
  release_dependents();
  // With accumulate, the old y of the thread's first epilogue entry (i = threadIdx.x; later ones,
  // more token tiles, read theirs at the end), on its way during the product.
  const int first_token = int(threadIdx.x / 128) * 8 + 2 * int((threadIdx.x / 4) % 4) + int(threadIdx.x % 2);
  const bool first_entry = !kSiluMul && accumulate && threadIdx.x < kTokenTiles * 128 && my_row < out && first_token < m;
  const float first_old_y = first_entry ? y[int64_t(first_token) * out + my_row] : 0.0f;
  load_x(0, xv[0]);
  for (int i0 = 0; i0 < my_chunks; i0 += kDepth) {
#pragma unroll
    for (int j = 0; j < kDepth; ++j) {
      const int i = i0 + j;
      load_w(i + kDepth - 1, va[(j + kDepth - 1) % kDepth], vb[(j + kDepth - 1) % kDepth]);
      load_x(i + 1, xv[(j + 1) % 2]);
      if (i < my_chunks) {
#pragma unroll
        for (int n = 0; n < kTokenTiles; ++n) {
          if constexpr (kFp8) {
            const uint32_t wa4[4] = {va[j].x, va[j].y, va[j].z, va[j].w};
            const uint32_t wb4[4] = {vb[j].x, vb[j].y, vb[j].z, vb[j].w};
            const uint4 lo = xv[j % 2][n][0], hi = xv[j % 2][n][1];
            const uint32_t x_lo[4] = {lo.x, lo.y, lo.z, lo.w}, x_hi[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              mma_bf16_16816(acc[w % F::kAccSets][n], fp8_low_pair(wa4[w]), fp8_low_pair(wb4[w]), fp8_high_pair(wa4[w]),
                             fp8_high_pair(wb4[w]), x_lo[w], x_hi[w]);
            }
          } else {
            const uint4 xc = xv[j % 2][n][0];
            mma_bf16_16816(acc[0][n], va[j].x, vb[j].x, va[j].y, vb[j].y, xc.x, xc.y);
            mma_bf16_16816(acc[0][n], va[j].z, vb[j].z, va[j].w, vb[j].w, xc.z, xc.w);
          }
        }
      }
    }
  }
#pragma unroll
  for (int set = 1; set < F::kAccSets; ++set)
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][n][j] += acc[set][n][j];

  __shared__ float4 partial[kGemvWarps][kTokenTiles][32];
#pragma unroll
  for (int n = 0; n < kTokenTiles; ++n)
    partial[warp][n][lane] = make_float4(acc[0][n][0], acc[0][n][1], acc[0][n][2], acc[0][n][3]);
  __syncthreads();
  const float* flat = &partial[0][0][0].x;
  if constexpr (kSiluMul) {
    // Entry (n, lane l, element e) of row g is the gate, element e + 2 (row g + 8) the up.
    const int64_t width = out / 2;
    for (int i = threadIdx.x; i < kTokenTiles * 64; i += blockDim.x) {
      const int n = i / 64, l = (i / 2) % 32, e = i % 2, at = n * 128 + l * 4 + e;
      float gate = 0.0f, up = 0.0f;
#pragma unroll
      for (int w = 0; w < kGemvWarps; ++w) {
        gate += flat[w * kTokenTiles * 128 + at];
        up += flat[w * kTokenTiles * 128 + at + 2];
      }
      const int64_t feature = feature0 + l / 4;
      const int token = n * 8 + 2 * (l % 4) + e;
      if (token < m) {
        if constexpr (kFp8) {
          gate *= my_scale;
          up *= my_up_scale;
        }
        gate += my_bias;
        up += my_up_bias;
        const float value = gate / (1.0f + expf(-gate)) * up;  // as silu_mul_to_bf16
        y_bf16[int64_t(token) * width + feature] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
      }
    }
  } else {
    for (int i = threadIdx.x; i < kTokenTiles * 128; i += blockDim.x) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kGemvWarps; ++w) sum += flat[w * kTokenTiles * 128 + i];
      const int n = i / 128, l = (i / 4) % 32, j = i % 4;
      const int64_t row = row0 + l / 4 + (j >= 2 ? 8 : 0);
      const int token = n * 8 + 2 * (l % 4) + (j & 1);
      if (row < out && token < m) {
        float* dst = y + int64_t(token) * out + row;
        if constexpr (kFp8) sum *= my_scale;
        const float value = sum + my_bias;
        *dst = accumulate ? (i == int(threadIdx.x) ? first_old_y : *dst) + value : value;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMM (m > 32). A = x [m, in] and B = W [out, in] are both k-contiguous, so both
// tiles are read with non-transposed ldmatrix. BK = 32: 64-byte smem rows, 4 chunks each.
constexpr int kGemmBK = 32;

// FP8 weight tiles: rows g and g + 4 of an n8 fragment would hit the same banks (32-byte rows);
// swapping the two chunks of every other group of four rows spreads a fragment's 32 word reads
// over all banks.
__device__ __forceinline__ int fp8_swizzle(int row, int chunk) { return chunk ^ ((row >> 2) & 1); }

// FP8 weight tiles are 32-byte rows (two 16-byte chunks, k groups of fp8_layout.h).
template <int kBM_, int kBN_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocks_, bool kFp8_>
struct GemmConfig {
  static constexpr int kBM = kBM_, kBN = kBN_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
  static constexpr int kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr bool kFp8 = kFp8_;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
  static constexpr int kMTiles = kWarpM / 16, kNTiles = kWarpN / 8;
  static constexpr int kBChunks = kFp8 ? 2 : 4;  // 16-byte chunks per weight row and stage
  static constexpr int kABytes = kBM * kGemmBK * 2;
  static constexpr int kStageBytes = kABytes + kBN * kBChunks * 16;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile is whole m16 x n16 pieces");
  static_assert((kBM * 4) % kThreads == 0 && (kBN * kBChunks) % kThreads == 0, "loads split evenly");
};

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    gemm_kernel(const uint16_t* __restrict__ x, const void* __restrict__ weight_bytes,
                const float* __restrict__ row_scales, const float* __restrict__ bias, int m, int out, int in,
                float* __restrict__ y, bool accumulate) {
  wait_for_predecessor();
  release_dependents();
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kWarpsN = Cfg::kWarpsN, kGemmStages = Cfg::kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  const int k_tiles = (in + kGemmBK - 1) / kGemmBK;

  // Each thread copies the same rows/chunks of every stage; only the k offset moves.
  constexpr int kALoads = kBM * 4 / Cfg::kThreads, kBLoads = kBN * Cfg::kBChunks / Cfg::kThreads;
  // Weight offsets count elements, as k does.
  using Weight = std::conditional_t<Cfg::kFp8, uint8_t, uint16_t>;
  const Weight* __restrict__ weight = static_cast<const Weight*>(weight_bytes);
  constexpr int kChunkElements = 16 / int(sizeof(Weight));
  const uint16_t* a_src[kALoads];
  bool a_ok[kALoads];
  uint32_t a_dst[kALoads];
  const int chunk = tid % 4;
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int row = (tid + i * Cfg::kThreads) / 4;
    a_ok[i] = m0 + row < m;
    a_src[i] = x + (a_ok[i] ? (m0 + row) * in : 0) + chunk * 8;
    a_dst[i] = (row * 4 + swizzle<4>(row, chunk)) * 16;
  }
  const Weight* b_src[kBLoads];
  bool b_ok[kBLoads];
  uint32_t b_dst[kBLoads];
  const int b_chunk = Cfg::kFp8 ? tid % Cfg::kBChunks : chunk;
#pragma unroll
  for (int i = 0; i < kBLoads; ++i) {
    const int row = (tid + i * Cfg::kThreads) / Cfg::kBChunks;
    b_ok[i] = n0 + row < out;
    b_src[i] = weight + (b_ok[i] ? (n0 + row) * in : 0) + b_chunk * kChunkElements;
    b_dst[i] = Cfg::kABytes + (Cfg::kFp8 ? row * 32 + fp8_swizzle(row, b_chunk) * 16
                                         : (row * 4 + swizzle<4>(row, b_chunk)) * 16);
  }
  const uint32_t smem_base = smem_u32(smem);
  auto load_stage = [&](int stage, int kt) {
    const uint32_t base = smem_base + uint32_t(stage) * Cfg::kStageBytes;
    const int k = kt * kGemmBK;
    const bool a_k_ok = k + chunk * 8 < in;
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const bool ok = a_ok[i] && a_k_ok;
      cp_async_16(base + a_dst[i], ok ? a_src[i] + k : x, ok);
    }
    const bool b_k_ok = k + b_chunk * kChunkElements < in;
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const bool ok = b_ok[i] && b_k_ok;
      cp_async_16(base + b_dst[i], ok ? b_src[i] + k : weight, ok);
    }
  };

  float acc[Cfg::kMTiles][Cfg::kNTiles][4] = {};

#pragma unroll
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  // ldmatrix row addresses: A matrices are (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15,
  // 8-15); B matrices are (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15), so that the
  // registers come out in mma operand order.
  const int a_row = warp_m * Cfg::kWarpM + (lane % 16), a_chunk = lane / 16;
  const int b_row = warp_n * Cfg::kWarpN + (lane / 16) * 8 + (lane % 8), b_ldm_chunk = (lane / 8) % 2;

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kGemmStages - 2>();
    __syncthreads();  // stage kt is visible to all, and everyone is done with stage kt - 1
    if (kt + kGemmStages - 1 < k_tiles) load_stage((kt + kGemmStages - 1) % kGemmStages, kt + kGemmStages - 1);
    cp_async_commit();

    const uint32_t a_base = smem_base + uint32_t(kt % kGemmStages) * Cfg::kStageBytes;
    const uint32_t b_base = a_base + Cfg::kABytes;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t a[Cfg::kMTiles][4], b[Cfg::kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        const int row = a_row + mt * 16;
        ldmatrix_x4(a_base + (row * 4 + swizzle<4>(row, kk * 2 + a_chunk)) * 16, a[mt][0], a[mt][1], a[mt][2],
                    a[mt][3]);
      }
      if constexpr (Cfg::kFp8) {
        // Lane (g, t) takes word t of row g's 16-k group kk: exactly its B fragment.
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
          const int row = warp_n * Cfg::kWarpN + nt * 8 + lane / 4;
          uint32_t word;
          asm volatile("ld.shared.u32 %0, [%1];\n"
                       : "=r"(word)
                       : "r"(b_base + row * 32 + fp8_swizzle(row, kk) * 16 + (lane % 4) * 4));
          b[nt][0] = fp8_low_pair(word);
          b[nt][1] = fp8_high_pair(word);
        }
      } else {
#pragma unroll
        for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
          const int row = b_row + np * 16;
          ldmatrix_x4(b_base + (row * 4 + swizzle<4>(row, kk * 2 + b_ldm_chunk)) * 16, b[2 * np][0], b[2 * np][1],
                      b[2 * np + 1][0], b[2 * np + 1][1]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTiles; ++nt)
          mma_bf16_16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
    }
  }
  cp_async_wait<0>();

  const int g = lane / 4, t = lane % 4;
  // float2 stores need an even row stride and an 8-byte aligned y.
  const bool pairs = (out % 2) == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
      const int64_t col = n0 + warp_n * Cfg::kWarpN + nt * 8 + 2 * t;
      if (col >= out) continue;
      const bool second = col + 1 < out;
      const float b0 = bias != nullptr ? bias[col] : 0.0f;
      const float b1 = bias != nullptr && second ? bias[col + 1] : 0.0f;

#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + warp_m * Cfg::kWarpM + mt * 16 + g + half * 8;
        if (row >= m) continue;
        float* dst = y + row * out + col;
        float v0 = acc[mt][nt][2 * half], v1 = acc[mt][nt][2 * half + 1];
        if constexpr (Cfg::kFp8) {
          v0 *= row_scales[col];
          if (second) v1 *= row_scales[col + 1];
        }
        v0 += b0;
        v1 += b1;
        if (pairs && second) {
          float2* dst2 = reinterpret_cast<float2*>(dst);
          if (accumulate) {
            const float2 old = *dst2;
            v0 = old.x + v0;
            v1 = old.y + v1;
          }
          *dst2 = make_float2(v0, v1);
        } else {
          dst[0] = accumulate ? dst[0] + v0 : v0;
          if (second) dst[1] = accumulate ? dst[1] + v1 : v1;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Any shape or alignment: one warp per (token, output row). Only for inputs the fast paths
// cannot take (in % 8 != 0 or pointers not 16-byte aligned); no model anvil loads needs it.
__global__ void linear_bf16_generic_kernel(const uint16_t* __restrict__ weight, const float* __restrict__ bias,
                                           const uint16_t* __restrict__ x, int64_t out, int64_t in,
                                           float* __restrict__ y, bool accumulate) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t token = blockIdx.y;
  const int lane = threadIdx.x % 32;
  if (row >= out) return;
  const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(weight) + row * in;
  const __nv_bfloat16* xv = reinterpret_cast<const __nv_bfloat16*>(x) + token * in;
  float sum = 0.0f;
  for (int64_t i = lane; i < in; i += 32) sum += __bfloat162float(w[i]) * __bfloat162float(xv[i]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const float value = sum + (bias != nullptr ? bias[row] : 0.0f);
    y[token * out + row] = accumulate ? y[token * out + row] + value : value;
  }
}

// What the launchers pass along: the weight bytes and, for FP8, its row scales.
struct Weights {
  const void* data;
  const float* row_scales;  // FP8 only
  bool fp8;
  bool streams_early = false;  // DenseWeight::streams_early
};

// The bulk-copy GEMV (gemv_bulk.cuh) where the kernel table has it and the call fits it: one bf16
// token, a weight that streams early, no fused activation, and a grid of one wave (the register
// ring streams lm_head's 12,568 blocks faster: 285 against 313 us per gpt-oss step on an H200,
// docs/perf/gpu.md session 20).
bool takes_bulk_gemv(int64_t m, int64_t out, int64_t in, const Weights& w, const uint16_t* x) {
  const void* weight = w.data;
  return m == 1 && !w.fp8 && w.streams_early && in <= gemv::kBulkMaxIn && in % 8 == 0 &&
         ceil_div(out, gemv::kBulkRows) <= gemv::kBulkBlocksPerSm * current_multiprocessors() &&
         reinterpret_cast<uintptr_t>(weight) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         bulk_copy_kernels_allowed() && current_device_runs(kLinearDecodeOp, kLinearDecodeBulk);
}

// As many ring stages (up to the row's pieces) as let the grid's blocks share an SM in one wave
// while leaving room for the neighbouring kernels' blocks, which run beside it under chained
// launches. The gpt-oss shapes on an H200: qkv 320 blocks of 3 stages, o_proj 180 of 5.
struct BulkGemvPlan {
  int stages;
  size_t grant;  // the kernel's shared-memory grant: what its largest call needs, within the GPU's limit
};

BulkGemvPlan plan_bulk_gemv(int64_t blocks, int in) {
  int device = 0, per_sm_bytes = 0, per_block_bytes = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&device));
  ANVIL_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  ANVIL_CUDA_CHECK(cudaDeviceGetAttribute(&per_block_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t per_sm = std::clamp<int64_t>(ceil_div(blocks, current_multiprocessors()), 1, gemv::kBulkBlocksPerSm);
  constexpr int64_t kLeftForNeighbours = 28 * 1024, kReservedPerBlock = 1024;
  const int64_t budget =
      std::min<int64_t>((per_sm_bytes - kLeftForNeighbours) / per_sm - kReservedPerBlock, per_block_bytes);
  const int64_t pieces = ceil_div(int64_t(in) * 2, gemv::kPieceBytes);
  const int64_t fit = (budget - int64_t(gemv::bulk_smem_bytes(0, in))) / gemv::kStageBytes;
  return {int(std::clamp<int64_t>(std::min<int64_t>(fit, pieces), 1, gemv::kBulkMaxStages)),
          std::min(gemv::bulk_smem_bytes(gemv::kBulkMaxStages, gemv::kBulkMaxIn), size_t(per_block_bytes))};
}

std::atomic<uint64_t> bulk_gemv_launches{0};

void launch_bulk_gemv(const void* weight, const float* bias, const uint16_t* x, int out, int in, float* y,
                      bool accumulate, cudaStream_t stream, const gemv::GemvNorm& norm = {}) {
  bulk_gemv_launches.fetch_add(1, std::memory_order_relaxed);
  const int64_t blocks = ceil_div(out, gemv::kBulkRows);
  const BulkGemvPlan plan = plan_bulk_gemv(blocks, in);
  allow_smem<gemv::gemv_bulk_kernel>(plan.grant);
  probe::dump_at_exit();
  launch_chained(gemv::gemv_bulk_kernel, unsigned(blocks), gemv::kBulkWarps * 32,
                 gemv::bulk_smem_bytes(plan.stages, in), stream, static_cast<const uint16_t*>(weight), bias, x, out, in,
                 y, accumulate, plan.stages, norm);
  ANVIL_CUDA_LAUNCHED();
}

template <int kTokenTiles, bool kFp8, bool kSiluMul>
void launch_gemv_format(const Weights& w, const float* bias, const uint16_t* x, int m, int out, int in, float* y,
                        bool accumulate, uint16_t* y_bf16, cudaStream_t stream) {
  if (kTokenTiles == 1 && !kSiluMul && takes_bulk_gemv(m, out, in, w, x))
    return launch_bulk_gemv(w.data, bias, x, out, in, y, accumulate, stream);
  const int64_t blocks = ceil_div(out, 16), sms = current_multiprocessors();
  if (blocks > 2 * sms && blocks <= 4 * sms) {
    launch_chained(gemv_kernel<kTokenTiles, 4, kFp8, kSiluMul>, unsigned(blocks), 4 * 32, 0, stream, w.data,
                   w.row_scales, bias, x, m, out, in, y, accumulate, y_bf16);
  } else {
    launch_chained(gemv_kernel<kTokenTiles, 8, kFp8, kSiluMul>, unsigned(blocks), 8 * 32, 0, stream, w.data,
                   w.row_scales, bias, x, m, out, in, y, accumulate, y_bf16);
  }
  ANVIL_CUDA_LAUNCHED();
}

template <int kTokenTiles, bool kSiluMul = false>
void launch_gemv(const Weights& w, const float* bias, const uint16_t* x, int m, int out, int in, float* y,
                 bool accumulate, cudaStream_t stream, uint16_t* y_bf16 = nullptr) {
  if (w.fp8) return launch_gemv_format<kTokenTiles, true, kSiluMul>(w, bias, x, m, out, in, y, accumulate, y_bf16, stream);
  launch_gemv_format<kTokenTiles, false, kSiluMul>(w, bias, x, m, out, in, y, accumulate, y_bf16, stream);
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN, int kStages, int kMinBlocks, bool kFp8>
void launch_gemm_format(const Weights& w, const float* bias, const uint16_t* x, int m, int out, int in, float* y,
                        bool accumulate, cudaStream_t stream) {
  using Cfg = GemmConfig<kBM, kBN, kWarpsM, kWarpsN, kStages, kMinBlocks, kFp8>;
  constexpr auto kernel = gemm_kernel<Cfg>;
  allow_smem<kernel>(Cfg::kSmemBytes);
  const dim3 grid(unsigned(ceil_div(m, kBM)), unsigned(ceil_div(out, kBN)));
  launch_chained(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, x, w.data, w.row_scales, bias, m, out, in, y,
                 accumulate);
  ANVIL_CUDA_LAUNCHED();
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN, int kStages, int kMinBlocks>
void launch_gemm(const Weights& w, const float* bias, const uint16_t* x, int m, int out, int in, float* y,
                 bool accumulate, cudaStream_t stream) {
  if (w.fp8)
    return launch_gemm_format<kBM, kBN, kWarpsM, kWarpsN, kStages, kMinBlocks, true>(w, bias, x, m, out, in, y,
                                                                                      accumulate, stream);
  launch_gemm_format<kBM, kBN, kWarpsM, kWarpsN, kStages, kMinBlocks, false>(w, bias, x, m, out, in, y, accumulate,
                                                                              stream);
}

}  // namespace

namespace {

// From how many rows cuBLASLt takes a bf16 product (ANVIL_CUBLASLT_MIN_ROWS overrides, to measure).
// Measured on an H200 (docs/perf/logs/h200/cublaslt/): gpt-oss-20b decode at batch 32 is 3.6 %
// faster with it (5,020 against 4,845 tok/s), at batch 16 0.7 % slower (the GEMV wins there), and
// every prefill-sized product about twice as fast.
constexpr int64_t kCublasLtMinRows = 32;

int64_t cublaslt_min_rows() {
  static const int64_t rows = [] {
    const char* env = std::getenv("ANVIL_CUBLASLT_MIN_ROWS");
    return env ? std::max<int64_t>(1, std::atoll(env)) : kCublasLtMinRows;
  }();
  return rows;
}

// Whether linear_impl runs the matrix-vector kernel for these m rows (with cuBLASLt found; where
// it is not, the GEMV takes up to 32 bf16 rows too). linear_silu_mul fuses exactly there.
bool takes_gemv(const Weights& w, const uint16_t* x, int64_t m, int64_t in) {
  const bool aligned = in % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0 && (!w.fp8 || in % fp8::kGroup == 0);
  return aligned && m >= 1 && (m <= 8 || (m <= 32 && (w.fp8 || m < cublaslt_min_rows())));
}

// The name in error messages is the public entry point's.
void linear_impl(const char* name, const Weights& w, const float* bias, const uint16_t* x, int64_t m,
                 int64_t out_features, int64_t in_features, float* y, bool accumulate, Stream stream) {
  auto fail = [&](const char* what) { invalid((std::string(name) + ": " + what).c_str()); };
  if (m < 0 || out_features < 0 || in_features <= 0) fail("negative or empty shape");
  if (m == 0 || out_features == 0) return;
  if (m > INT32_MAX || out_features > INT32_MAX || in_features > INT32_MAX || out_features > (int64_t(1) << 30))
    fail("dimension too large");
  if (out_features > int64_t(65535) * 64 && m > 32) fail("too many output features for the GEMM grid");
  if (w.data == nullptr || x == nullptr || y == nullptr || (w.fp8 && w.row_scales == nullptr)) fail("null pointer");
  const cudaStream_t s = as_stream(stream);
  const int mi = int(m), out = int(out_features), in = int(in_features);
  const bool aligned = in % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (w.fp8 && (!aligned || in % fp8::kGroup != 0))
    fail("FP8 weights need in_features a multiple of 16 and 16-byte aligned weight and x");
  if (!aligned) {
    const auto* weight = static_cast<const uint16_t*>(w.data);
    for (int64_t first = 0; first < m; first += 65535) {  // grid.y limit
      const dim3 grid(unsigned(ceil_div(out, 8)), unsigned(std::min<int64_t>(65535, m - first)));
      launch_chained(linear_bf16_generic_kernel, grid, 256, 0, s, weight, bias, x + first * in, out, in,
                     y + first * out, accumulate);
      ANVIL_CUDA_LAUNCHED();
    }
    return;
  }
  if (m <= 8) return launch_gemv<1>(w, bias, x, mi, out, in, y, accumulate, s);
  // bf16 products of 32+ rows go to cuBLASLt when it is found (its wgmma kernels beat this
  // file's kernels there; see kCublasLtMinRows). FP8 weights stay here: cuBLASLt's own FP8
  // products want FP8 activations (other numerics), and decoding the codes to bf16 for it first
  // measured slower (docs/perf/logs/h200/cublaslt-fp8-reverted/).
  const bool y_aligned = reinterpret_cast<uintptr_t>(y) % 16 == 0 && out % 4 == 0 &&
                         (bias == nullptr || reinterpret_cast<uintptr_t>(bias) % 16 == 0);
  if (!w.fp8 && m >= cublaslt_min_rows() && y_aligned &&
      cublaslt::matmul_bf16(static_cast<const uint16_t*>(w.data), bias, x, m, out, in, y, accumulate, s))
    return;
  if (m <= 16) return launch_gemv<2>(w, bias, x, mi, out, in, y, accumulate, s);
  if (m <= 32) return launch_gemv<4>(w, bias, x, mi, out, in, y, accumulate, s);
  // Tile shape by how well the grid fills the GPU (measured on an H200, m = 2048: 128x128 reaches
  // 305-340 TFLOP/s when its blocks make near-whole waves, 128x64 wins when they would not,
  // 64x64 when even 128x64 leaves SMs idle).
  const int64_t sms = current_multiprocessors();
  const int64_t big_tiles = ceil_div(m, 128) * ceil_div(out, 128), big_slots = 2 * sms;
  const int64_t big_waves = ceil_div(big_tiles, big_slots);
  if (big_tiles >= sms && big_tiles * 5 >= big_waves * big_slots * 4)
    return launch_gemm<128, 128, 2, 4, 3, 2>(w, bias, x, mi, out, in, y, accumulate, s);
  if (ceil_div(m, 128) * ceil_div(out, 64) >= 2 * sms)
    return launch_gemm<128, 64, 2, 2, 4, 2>(w, bias, x, mi, out, in, y, accumulate, s);
  launch_gemm<64, 64, 2, 2, 4, 1>(w, bias, x, mi, out, in, y, accumulate, s);
}

Weights bf16_weights(const uint16_t* weight) { return {weight, nullptr, false}; }

Weights dense_weights(const DenseWeight& weight) {
  return {weight.data, weight.row_scales, weight.format == DenseWeight::Format::FP8, weight.streams_early};
}

}  // namespace

void linear_bf16(const uint16_t* weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
                 int64_t in_features, float* y, Stream stream) {
  linear_impl("linear_bf16", bf16_weights(weight), bias, x, m, out_features, in_features, y, false, stream);
}

void linear_bf16_add(const uint16_t* weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
                     int64_t in_features, float* y, Stream stream) {
  linear_impl("linear_bf16_add", bf16_weights(weight), bias, x, m, out_features, in_features, y, true, stream);
}

uint64_t bulk_gemv_launch_count() { return bulk_gemv_launches.load(std::memory_order_relaxed); }

bool bulk_gemv_runs(int64_t out_features, int64_t in_features) {
  return out_features > 0 && in_features > 0 && out_features <= INT32_MAX && in_features <= INT32_MAX &&
         takes_bulk_gemv(1, out_features, in_features, Weights{nullptr, nullptr, false, true}, nullptr);
}

void linear(const DenseWeight& weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
            int64_t in_features, float* y, Stream stream) {
  linear_impl("linear", dense_weights(weight), bias, x, m, out_features, in_features, y, false, stream);
}

void linear_add(const DenseWeight& weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
                int64_t in_features, float* y, Stream stream) {
  linear_impl("linear_add", dense_weights(weight), bias, x, m, out_features, in_features, y, true, stream);
}

void linear_normed(const DenseWeight& weight, const float* bias, const float* x, const float* norm_weight, float eps,
                   uint16_t* scratch, int64_t m, int64_t out_features, int64_t in_features, float* y, Stream stream) {
  const Weights w = dense_weights(weight);
  const auto* x_bits = reinterpret_cast<const uint16_t*>(x);  // only its alignment is looked at
  if (m == 1 && in_features <= gemv::kNormMaxIn && out_features <= INT32_MAX && norm_weight != nullptr &&
      reinterpret_cast<uintptr_t>(norm_weight) % 16 == 0 && takes_bulk_gemv(1, out_features, in_features, w, x_bits))
    return launch_bulk_gemv(w.data, bias, nullptr, int(out_features), int(in_features), y, false, as_stream(stream),
                            gemv::GemvNorm{x, norm_weight, eps});
  if (scratch == nullptr) invalid("linear_normed: null scratch");
  rms_norm_to_bf16(x, m, in_features, norm_weight, eps, scratch, stream);
  linear(weight, bias, scratch, m, out_features, in_features, y, stream);
}

void linear_silu_mul(const DenseWeight& gate_up, const uint16_t* x, int64_t m, int64_t width, int64_t in_features,
                     float* scratch, uint16_t* out, Stream stream) {
  const Weights w = dense_weights(gate_up);
  // Fused where linear would run the GEMV (so the values are the two-step ones, bit for bit).
  const bool gemv = w.data != nullptr && out != nullptr && takes_gemv(w, x, m, in_features) && width % 8 == 0 &&
                    2 * width <= INT32_MAX && in_features <= INT32_MAX;
  if (!gemv) {
    linear_impl("linear_silu_mul", w, nullptr, x, m, 2 * width, in_features, scratch, false, stream);
    return silu_mul_to_bf16(scratch, m, width, out, stream);
  }
  const cudaStream_t s = as_stream(stream);
  const int mi = int(m), rows = int(2 * width), in = int(in_features);
  if (m <= 8) return launch_gemv<1, true>(w, nullptr, x, mi, rows, in, nullptr, false, s, out);
  if (m <= 16) return launch_gemv<2, true>(w, nullptr, x, mi, rows, in, nullptr, false, s, out);
  launch_gemv<4, true>(w, nullptr, x, mi, rows, in, nullptr, false, s, out);
}

}  // namespace anvil::cuda
