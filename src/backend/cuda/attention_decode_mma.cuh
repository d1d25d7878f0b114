#pragma once
// Decode attention on tensor cores, for a bf16 KV cache with head_dim 64 or 128 and up to 8 query
// heads per KV head (gpt-oss, Qwen3): the cases the models run by default.
//
// The CUDA-core kernel (attention_decode.cuh) spends ~1,400 dependent FMA and shared-memory
// instructions per lane on a 32-key chunk, with one warp per chunk. Here the same chunk is 32
// mma.sync: 44 % fewer instructions for a gpt-oss layer at a 256-key context. At such short
// contexts that bought little alone (ncu on an H200: 8.6-10.7 -> 8.3-9.2 us for a sliding layer,
// 13.3-13.9 -> 12.2 us for a full one: the kernel waits on memory round trips there), but in the
// decode chain its key copies before the wait (below) keep a DRAM round trip off the step's path,
// which the CUDA-core kernel pays after its wait: whole models on an H200 ran batch 1 2-4 % and
// batch 64 2-3.5 % faster with it at every context, batch 8 0.3-2 % slower (session 21,
// docs/perf/gpu.md), so the launcher takes it wherever it applies (ops.h). A block owns
// (sequence, KV head, split) as there, and the KV head's G query heads are the n8 side of both
// products, so each lane's two heads (2t, 2t+1) are the same in the scores' and the output's
// accumulators and the online softmax needs no exchange but the max over keys:
//   S[32 keys x 8 heads]   = K[32 x D] · Qᵀ        (K rows from shared memory through ldmatrix)
//   Oᵀ[D x 8 heads]       += Vᵀ[D x 32] · P         (V rows through ldmatrix.trans, P transposed
//                                                   in registers with movmatrix)
// q and p are each split into two bf16 terms (hi + lo), so every product is exact to ~2^-17 like
// the float32 kernel's; K and V are bf16 already.
//
// A decode step writes exactly one slot per sequence (its newest key, by the RoPE kernel right
// before this one); every older key was written by an earlier step. So a warp starts copying its
// first chunk's older keys before waiting for its predecessor, and only the newest key and q wait.
#include <cuda_bf16.h>

#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/phase_probe.cuh"
#include "backend/cuda/rope.cuh"

namespace anvil::cuda::attn {

// 8 warps (a 128-key window or a 256-key context in one split) where the rows fit SM120's 99 KB
// next to the rest; 4 for head_dim 128.
template <int D>
constexpr int kMmaDecodeWarps = D >= 128 ? 4 : 8;

template <int D>
constexpr bool kMmaDecodeHeadDim = D == 64 || D == 128;

// Warps of the wide head_dim-64 block, where the kernel table names it (160 KB of rows: SM90 and
// SM100 hold one, SM120 and Ada none). gpt-oss's full layers at a few hundred keys then run one
// block per KV head, merged in shared memory, instead of 8-warp splits merged through a ticket by
// the last to finish (~5 us of a full layer's ~11 at 548 keys on an H100). It was slower while its
// copies began only after RoPE's wait (one SM streaming 18 chunks: session 28); with RoPE
// releasing the attention at once they run beside qkv, and batch 1 gained a further 0.9-1.3 %
// (docs/perf/logs/h200/session29). Batches whose blocks would not fit one per SM keep 8 warps
// (decode_attention_wide_splits).
constexpr int kMmaDecodeWideWarps = 20;
constexpr int kMmaDecodeWideHeadDim = 64;

// Dynamic shared memory: each warp's key and value rows, [warp][K, V][key][D] bf16, and after the
// loop the warps' output accumulators, [warp][head][D] floats, in the same bytes.
template <int D, int G, int W = kMmaDecodeWarps<D>>
constexpr size_t mma_decode_smem_bytes() {
  const size_t rows = size_t(W) * 2 * kDecodeKeys * D * 2;
  const size_t accumulators = size_t(W) * G * D * sizeof(float);
  return rows > accumulators ? rows : accumulators;
}

// Row `row`'s 16-byte chunk `chunk` within a [key][D] bf16 tile: XOR with the row's low bits, so
// the 8 rows an ldmatrix reads fall in 8 different bank groups.
__device__ __forceinline__ int mma_decode_chunk(int row, int chunk) { return chunk ^ (row & 7); }

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t address, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}

// The 8x8 b16 matrix held as mma fragments (lane g*4+t: row g, columns 2t, 2t+1), transposed.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// (a, b) as two bf16 pairs whose sum is (a, b) to ~2^-17: hi rounds, lo rounds the remainder.
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 back = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - back.x, b - back.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// A decode step's RoPE and KV write made by the attention itself (kRope), in place of
// split_qkv_rope_cache_kernel before it: one launch fewer per layer. q and the newest key come
// rotated from the qkv product's float32 output, with the RoPE kernel's own rotation (rope.cuh),
// and the warp that takes the newest key also stores it and its value into the cache, so the
// values, the cache and the output are the two kernels' bit for bit.
struct DecodeRope {
  const float* qkv = nullptr;  // [rows][heads + 2 kv heads][D]: q, k, v heads
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;  // [D / 2]
  float mscale = 1.0f;
};

// partials, tickets, splits and the split rule: as decode_attention_kernel. G: the group rounded
// up to 2, 4 or 8 (the products always run 8 head columns; the padding heads have q = 0).
template <int D, int G, typename Out, int W = kMmaDecodeWarps<D>, bool kRope = false>
__global__ void __launch_bounds__(W * 32)
    decode_attention_mma_kernel(AttentionBatch batch, AttentionShape shape, const float* q, KvLayerCache cache,
                                Out* out, float* partials, int* tickets, int splits, DecodeRope rope) {
  static_assert(kMmaDecodeHeadDim<D> && G <= 8, "head_dim 64 or 128, at most 8 query heads per KV head");
  constexpr int kWarps = W, kSteps = D / 16, kRowChunks = D / 8;
  __shared__ float max_s[kWarps][G], sum_s[kWarps][G];
  __shared__ bool last_s;
  extern __shared__ __align__(16) uint8_t rows_s[];  // [warp][K, V][key][D] bf16, then acc_s
  float (*const acc_s)[G][D] = reinterpret_cast<float (*)[G][D]>(rows_s);

  const DecodeRange range = decode_range(batch, shape, splits, kWarps);
  if (range.split >= range.active) return;
  const int seq = range.seq, kv_head = range.kv_head, split = range.split, group = range.group, row = range.row;
  const int pos = range.pos, first_key = range.first_key, active = range.active;
  const int chunk_lo = range.chunk_lo, chunk_hi = range.chunk_hi;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  probe::mark(probe::kAttention, 0);
  const int block_size = int(cache.block_size);
  const int32_t* table = batch.block_tables + int64_t(seq) * batch.max_blocks;
  const int64_t q_stride = shape.num_heads * D, kv_stride = shape.num_kv_heads * D;
  const uint32_t keys_s = gemm::smem_u32(rows_s + size_t(warp) * 2 * kDecodeKeys * D * 2);
  const uint32_t values_s = keys_s + kDecodeKeys * D * 2;

  // Lane `lane` copies key first_key + 32c + lane of chunk c. A visible key whose block is unmapped
  // is zero-filled (score 0, value 0, as in the other kernels); keys past pos are zero-filled and
  // masked. `newest` picks the lane holding key pos (true) or the others (false).
  auto copy_rows = [&](int c, bool newest) {
    const int key = first_key + c * kDecodeKeys + lane;
    if ((key == pos) != newest) return;
    const int block = key <= pos ? table[key / block_size] : -1;
    const bool mapped = block >= 0;
    const int64_t at = mapped ? (int64_t(block) * block_size + key % block_size) * kv_stride + int64_t(kv_head) * D : 0;
    const uint16_t* k_row = static_cast<const uint16_t*>(cache.keys) + at;
    const uint16_t* v_row = static_cast<const uint16_t*>(cache.values) + at;
#pragma unroll
    for (int chunk = 0; chunk < kRowChunks; ++chunk) {
      const uint32_t offset = uint32_t((lane * kRowChunks + mma_decode_chunk(lane, chunk)) * 16);
      gemm::cp_async_16(keys_s + offset, k_row + chunk * 8, mapped);
      gemm::cp_async_16(values_s + offset, v_row + chunk * 8, mapped);
    }
  };
  // kRope: lane i's rotation of pair (i, i + D / 2) (and of i + 32 for D = 128), made before the
  // wait from the step's positions (uploaded before the step began).
  constexpr int kTurns = D / 64, kHalf = D / 2;
  RopeTurn turn[kTurns] = {};
  const int64_t qkv_row = int64_t(row) * (shape.num_heads + 2 * shape.num_kv_heads) * D;
  if constexpr (kRope) {
    const float position = float(rope.positions[row]);
#pragma unroll
    for (int u = 0; u < kTurns; ++u) turn[u] = rope_turn(position, rope.inv_freq[lane + 32 * u], rope.mscale);
  }
  // The newest key and value of chunk c, if it holds them (warp-uniform): copied from the cache, or
  // (kRope) rotated from the qkv output into the warp's rows and stored into the cache, or zeros
  // where its block is unmapped (as the RoPE kernel then stores nothing and copy_rows zero-fills).
  auto newest_rows = [&](int c) {
    if constexpr (!kRope) {
      copy_rows(c, true);
    } else {
      const int key0 = first_key + c * kDecodeKeys;
      if (pos < key0 || pos >= key0 + kDecodeKeys) return;
      const int key = pos - key0, block = table[pos / block_size];
      const float* k_in = rope.qkv + qkv_row + (shape.num_heads + kv_head) * D;
      const float* v_in = k_in + shape.num_kv_heads * D;
      const int64_t at = (int64_t(block) * block_size + pos % block_size) * kv_stride + int64_t(kv_head) * D;
      uint8_t* const key_row = rows_s + size_t(warp) * 2 * kDecodeKeys * D * 2;
      uint8_t* const value_row = key_row + kDecodeKeys * D * 2;
#pragma unroll
      for (int u = 0; u < kTurns; ++u) {
        const int j = lane + 32 * u;
        const float x0 = k_in[j], x1 = k_in[j + kHalf];
        const float k0 = rope_first(x0, x1, turn[u]), k1 = rope_second(x0, x1, turn[u]);
        const float v0 = v_in[j], v1 = v_in[j + kHalf];
        const uint16_t bits[4] = {
            block >= 0 ? __bfloat16_as_ushort(__float2bfloat16_rn(k0)) : uint16_t(0),
            block >= 0 ? __bfloat16_as_ushort(__float2bfloat16_rn(k1)) : uint16_t(0),
            block >= 0 ? __bfloat16_as_ushort(__float2bfloat16_rn(v0)) : uint16_t(0),
            block >= 0 ? __bfloat16_as_ushort(__float2bfloat16_rn(v1)) : uint16_t(0)};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = j + e * kHalf;
          const size_t offset = size_t((key * kRowChunks + mma_decode_chunk(key, d / 8)) * 16 + (d % 8) * 2);
          *reinterpret_cast<uint16_t*>(key_row + offset) = bits[e];
          *reinterpret_cast<uint16_t*>(value_row + offset) = bits[2 + e];
          if (block >= 0) {
            static_cast<uint16_t*>(cache.keys)[at + d] = bits[e];
            static_cast<uint16_t*>(cache.values)[at + d] = bits[2 + e];
          }
        }
      }
    }
  };
  const int first_chunk = chunk_lo + warp;
  if (first_chunk < chunk_hi) copy_rows(first_chunk, false);
  __shared__ float sink_s[G];
  const float* const sinks = stage_sinks(shape, kv_head, sink_s);

  wait_for_predecessor();
  release_dependents();
  probe::mark(probe::kAttention, 1);
  // The newest key (its predecessor's write) is copied before q is loaded, so the two reads of the
  // predecessor's output overlap instead of following one another: q's loads are used at once.
  if (first_chunk < chunk_hi) newest_rows(first_chunk);
  probe::mark(probe::kAttention, 2);

  // Qᵀ as the scores' B operand: lane (g, t) holds head g's dims 16s + 2t + {0, 1, 8, 9}.
  uint32_t q_hi[kSteps][2], q_lo[kSteps][2];
  {
    const float* q_head = kRope ? rope.qkv + qkv_row + (int64_t(kv_head) * group + g) * D
                                : q + int64_t(row) * q_stride + (int64_t(kv_head) * group + g) * D;
    float qv[kSteps][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const float2 a = g < group ? *reinterpret_cast<const float2*>(q_head + 16 * s + 2 * t) : make_float2(0.f, 0.f);
      const float2 b = g < group ? *reinterpret_cast<const float2*>(q_head + 16 * s + 2 * t + 8) : make_float2(0.f, 0.f);
      qv[s][0] = a.x, qv[s][1] = a.y, qv[s][2] = b.x, qv[s][3] = b.y;
    }
    if constexpr (kRope) {
      // Dim j = 16s + 2t + {0, 1, 8, 9} (s in the first half) pairs with j + D / 2, step s + kSteps / 2;
      // its rotation is lane j % 32's turn j / 32 (= s / 2 for the whole warp).
#pragma unroll
      for (int s = 0; s < kSteps / 2; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 16 * s + 2 * t + (e & 1) + (e >= 2 ? 8 : 0);
          const RopeTurn tj{__shfl_sync(0xffffffffu, turn[s / 2].c, j % 32),
                            __shfl_sync(0xffffffffu, turn[s / 2].s, j % 32)};
          const float x0 = qv[s][e], x1 = qv[s + kSteps / 2][e];
          if (g < group) {
            qv[s][e] = rope_first(x0, x1, tj);
            qv[s + kSteps / 2][e] = rope_second(x0, x1, tj);
          }
        }
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      split_bf16x2(qv[s][0], qv[s][1], q_hi[s][0], q_lo[s][0]);
      split_bf16x2(qv[s][2], qv[s][3], q_hi[s][1], q_lo[s][1]);
    }
  }
  probe::mark(probe::kAttention, 3);

  // o[i] = Oᵀ[dims 16i + g (+8)][heads 2t, 2t+1]; run_max and the lane's share of the sum per head.
  float o[kSteps][4], run_max[2] = {-INFINITY, -INFINITY}, lane_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kSteps; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[i][e] = 0.0f;

  for (int c = first_chunk; c < chunk_hi; c += kWarps) {
    if (c != first_chunk) {
      copy_rows(c, false);
      newest_rows(c);
    }
    gemm::cp_async_commit();
    gemm::cp_async_wait<0>();
    __syncwarp();
    const int chunk_first = first_key + c * kDecodeKeys;

    // Scores: m-tile mt holds keys 16mt..16mt+15; s[mt] = {S[g][2t], S[g][2t+1], S[g+8][2t], S[g+8][2t+1]}.
    float s[2][4] = {};
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const int matrix = lane / 8, key = 16 * mt + (matrix & 1) * 8 + lane % 8;
        const int chunk = 2 * ks + (matrix >> 1);
        uint32_t a0, a1, a2, a3;
        gemm::ldmatrix_x4(keys_s + uint32_t((key * kRowChunks + mma_decode_chunk(key, chunk)) * 16), a0, a1, a2, a3);
        gemm::mma_bf16_16816(s[mt], a0, a1, a2, a3, q_hi[ks][0], q_hi[ks][1]);
        gemm::mma_bf16_16816(s[mt], a0, a1, a2, a3, q_lo[ks][0], q_lo[ks][1]);
      }

    // Online softmax per head column j (head 2t + j): keys past pos are hidden; the chunk's first
    // key is always visible, so the new max is finite.
    float chunk_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = chunk_first + 16 * mt + g + (e >= 2 ? 8 : 0);
        s[mt][e] = key <= pos ? s[mt][e] * shape.scale : -INFINITY;
        chunk_max[e & 1] = fmaxf(chunk_max[e & 1], s[mt][e]);
      }
    float correction[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int step = 4; step < 32; step *= 2)
        chunk_max[j] = fmaxf(chunk_max[j], __shfl_xor_sync(0xffffffffu, chunk_max[j], step));
      const float m = fmaxf(run_max[j], chunk_max[j]);
      correction[j] = expf(run_max[j] - m);
      run_max[j] = m;
      lane_sum[j] *= correction[j];
    }
#pragma unroll
    for (int i = 0; i < kSteps; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] *= correction[e & 1];

    // P as the output's B operand: k-step mt covers keys 16mt..16mt+15. The scores' fragments of
    // keys 16mt + (0..7) and 16mt + (8..15) are 8x8 matrices [key][head]; transposed, they are
    // the B fragments b0 = P[keys 2t, 2t+1][head g] and b1 = P[keys 2t+8, 2t+9][head g].
    uint32_t p_hi[2][2], p_lo[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = expf(s[mt][e] - run_max[e & 1]);
        lane_sum[e & 1] += p[e];
      }
      uint32_t hi0, lo0, hi1, lo1;
      split_bf16x2(p[0], p[1], hi0, lo0);
      split_bf16x2(p[2], p[3], hi1, lo1);
      p_hi[mt][0] = movmatrix_trans(hi0);
      p_lo[mt][0] = movmatrix_trans(lo0);
      p_hi[mt][1] = movmatrix_trans(hi1);
      p_lo[mt][1] = movmatrix_trans(lo1);
    }

    // Vᵀ as the A operand, m-tile i = dims 16i..16i+15: ldmatrix.trans of the value rows hands
    // lane (g, t) V[keys 2t, 2t+1][dim g] of each 8x8 block.
#pragma unroll
    for (int i = 0; i < kSteps; ++i)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int matrix = lane / 8, key = 16 * mt + (matrix >> 1) * 8 + lane % 8;
        const int chunk = 2 * i + (matrix & 1);
        uint32_t a0, a1, a2, a3;
        ldmatrix_x4_trans(values_s + uint32_t((key * kRowChunks + mma_decode_chunk(key, chunk)) * 16), a0, a1, a2, a3);
        gemm::mma_bf16_16816(o[i], a0, a1, a2, a3, p_hi[mt][0], p_hi[mt][1]);
        gemm::mma_bf16_16816(o[i], a0, a1, a2, a3, p_lo[mt][0], p_lo[mt][1]);
      }
    __syncwarp();  // the rows are rewritten by the next chunk
  }

  probe::mark(probe::kAttention, 4);
  // The warp's state into shared memory once every warp is done with its rows (acc_s reuses them).
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int step = 4; step < 32; step *= 2) lane_sum[j] += __shfl_xor_sync(0xffffffffu, lane_sum[j], step);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int head = 2 * t + j;
    if (head >= G) continue;
    if (g == 0) {
      max_s[warp][head] = run_max[j];
      sum_s[warp][head] = lane_sum[j];
    }
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      acc_s[warp][head][16 * i + g] = o[i][j];
      acc_s[warp][head][16 * i + g + 8] = o[i][j + 2];
    }
  }
  __syncthreads();
  probe::mark(probe::kAttention, 5);
  decode_finish<D, G, kWarps>(shape, out, partials, tickets, splits, active, row, kv_head, split, max_s, sum_s, acc_s,
                              sinks, last_s);
  probe::mark(probe::kAttention, probe::kProbeEnd);
}

}  // namespace anvil::cuda::attn
