// Probe (not part of the build): the batch-1 MoE expert products in isolation, every launch
// reading weights that are not in L2 (48 experts cycled in sets of four, ~400 MB; CUDA graphs of
// 120 launches), on a GPU machine without the project's host dependencies. Its weights are laid
// row after row, the layout before session 32's 16-row tiles (mxfp4_f16_layout.h): the project's
// kernels it runs (moe_decode_kernel) now read tiles, so their values here no longer match its
// references, and their times stand for the tiled layout only. Modes:
//   moe_probe [both|gate_up|down]  the present moe_decode_kernel at gpt-oss's shapes (m = 1)
//   moe_probe both fp8             also the FP8 tensor-core form below, with a double reference
//   moe_probe old                  the present gate_up kernel alone, for ncu
//   moe_probe copy                 the weight ring alone (cp.async, no arithmetic): 64-byte row
//                                  pieces as stored against 1 KB pieces
//   moe_probe both f16             also the FP16 form below (session 16)
//   moe_probe both bulk            also the FP16 form fed by the bulk copy engine (session 25)
// The FP8 form (session 15): a weight word decodes to two e5m2 registers in 5 ALU ops (a layout
// made for it at load), the activation is two e4m3 terms (hi + lo, exact for bf16 within 2^-10
// of the token's largest magnitude) in the mma's columns, and each 32-value block's scale
// multiplies the mma's result. On SM90 mma.sync has no FP8 form: ptxas emulates it with F2FP
// conversions and two HMMA.16816 each, and the kernel ran at 34 us against 20 us (SM89 and SM120
// have FP8 mma.sync natively).
// The FP16 form (session 16): an E2M1 code whose three magnitude bits sit in an fp16's exponent's
// low two bits and its top mantissa bit, and whose sign sits in the sign bit, is the code's value
// times 2^-14 exactly, subnormals included (bf16's wider exponent makes the same placement
// 2^-126, too small for the products, hence the present kernel's HMUL2 per pair). So a word of 8
// codes decodes in 11 masks and shifts (5 rotations, 6 LOP3: the optimum without a bit reversal,
// by exhaustive search; 7 operations with one, session 22) and no HMUL2, and each 32-value
// block's scale (times 2^14) multiplies the two mma results of its block in one FFMA per row.
// The token is fp16 in the mma's pair order (what its producer would write), so the two byte
// permutes per step go too.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a
//   --expt-relaxed-constexpr -Isrc tools/cuda-harness/moe_probe.cu -o moe_probe
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/mxfp4_f16_layout.h"
#include "harness_common.h"


namespace probe {
using namespace anvil::cuda::gemm;
constexpr int kWarps = 4;

__device__ __forceinline__ uint32_t rotl(uint32_t w, int r) { return __funnelshift_l(w, w, r); }

// Word -> (a_lo, a_hi): e5m2 bytes of code * 2^-14 for k = 4t + j and k = 16 + 4t + j.
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = rotl(w, 1) & 0x8E8E8E8Eu;
  hi = (rotl(w, 6) & 0x0E0E0E0Eu) | (w & 0x80808080u);
}

__device__ __forceinline__ void mma_fp8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ uint16_t e4m3x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float2 from_e4m3x2(uint16_t v) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&raw));
}

template <int kSplitK, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    fp8_m1(const uint8_t* blocks, const uint8_t* scales, int n, int k, const int* experts, const uint16_t* x,
           float* out) {
  const int expert = experts[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kpart = warp % kSplitK;
  const int row0 = (blockIdx.x * (kWarps / kSplitK) + warp / kSplitK) * 16;
  const int row_bytes = k / 2, nblk = k / 32, chunks = (nblk + 3) / 4, tail = nblk - 4 * (chunks - 1);
  const int my_chunks = kpart < chunks ? (chunks - kpart + kSplitK - 1) / kSplitK : 0;
  const int row_a = min(row0 + g, n - 1), row_b = min(row0 + g + 8, n - 1);
  const uint8_t* wa = blocks + (int64_t(expert) * n + row_a) * row_bytes;
  const uint8_t* wb = blocks + (int64_t(expert) * n + row_b) * row_bytes;
  __shared__ uint4 ring[kWarps][kStages][2][32];
  __shared__ uint32_t reduce_s[kWarps];
  __shared__ float4 partial[kWarps][32];
  extern __shared__ __align__(16) uint8_t dyn[];
  uint2* xb = reinterpret_cast<uint2*>(dyn);  // [4 * chunks blocks][8]
  const int sstride = 4 * chunks;
  uint8_t* wscale = dyn + size_t(chunks) * 4 * 8 * 8 + size_t(warp) * 16 * sstride;

  const uint32_t ring_lane = smem_u32(&ring[warp][0][0][lane]);
  auto issue = [&](int i) {
    const int c = kpart + i * kSplitK;
    const uint32_t dst = ring_lane + uint32_t((i % kStages) * 2 * 32 * 16);
    if (i < my_chunks) {
      if (c < chunks - 1 || tail == 4) {
        cp_async_16(dst, wa + c * 64 + t * 16, true);
        cp_async_16(dst + 512, wb + c * 64 + t * 16, true);
      } else {
        for (int w = 0; w < tail; ++w) {
          cp_async_4(dst + 4 * w, wa + c * 64 + t * 4 * tail + 4 * w);
          cp_async_4(dst + 512 + 4 * w, wb + c * 64 + t * 4 * tail + 4 * w);
        }
      }
    }
    cp_async_commit();
  };
  for (int j = 0; j < kStages - 1; ++j) issue(j);

  // The token's largest magnitude sets one power-of-two scale for its e4m3 terms.
  uint32_t m = 0;
  for (int q = threadIdx.x; q < k / 8; q += blockDim.x) {
    const uint4 v = *reinterpret_cast<const uint4*>(x + 8 * q);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) m = max(m, max(w[i] & 0x7FFFu, (w[i] >> 16) & 0x7FFFu));
  }
  m = __reduce_max_sync(0xffffffffu, m);
  if (lane == 0) reduce_s[warp] = m;
  // Scales: the warp's 16 rows, padded to 4 per chunk, zero past the row.
  {
    const uint8_t* sg = scales + (int64_t(expert) * n + min(row0, n - 16)) * nblk;
    for (int r = 0; r < 16; ++r)
      for (int b = lane; b < sstride; b += 32) wscale[r * sstride + b] = b < nblk ? sg[r * nblk + b] : 0;
  }
  __syncthreads();
  m = max(max(reduce_s[0], reduce_s[1]), max(reduce_s[2], reduce_s[3]));
  const int shift = m == 0 ? 0 : int(m >> 7) - 134;  // largest |x| * 2^-shift in [128, 256)
  const float down_scale = exp2f(float(-shift));
  for (int q = threadIdx.x; q < chunks * 16; q += blockDim.x) {
    const int blk = q / 4, tt = q % 4;
    uint32_t hi[2], lo[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int kk = 32 * blk + 16 * half + 4 * tt;
      float v[4] = {0, 0, 0, 0};
      if (kk < k) {
        const uint2 raw = *reinterpret_cast<const uint2*>(x + kk);
        v[0] = __uint_as_float(raw.x << 16) * down_scale;
        v[1] = __uint_as_float(raw.x & 0xFFFF0000u) * down_scale;
        v[2] = __uint_as_float(raw.y << 16) * down_scale;
        v[3] = __uint_as_float(raw.y & 0xFFFF0000u) * down_scale;
      }
      const uint16_t h01 = e4m3x2(v[0], v[1]), h23 = e4m3x2(v[2], v[3]);
      const float2 b01 = from_e4m3x2(h01), b23 = from_e4m3x2(h23);
      const uint16_t l01 = e4m3x2(v[0] - b01.x, v[1] - b01.y), l23 = e4m3x2(v[2] - b23.x, v[3] - b23.y);
      hi[half] = uint32_t(h01) | uint32_t(h23) << 16;
      lo[half] = uint32_t(l01) | uint32_t(l23) << 16;
    }
    xb[blk * 8 + tt] = make_uint2(hi[0], hi[1]);
    xb[blk * 8 + 4 + tt] = make_uint2(lo[0], lo[1]);
  }
  __syncthreads();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint2* xl = xb + (lane & 7);
  const uint8_t* sa = wscale + g * sstride;
  const uint8_t* sb = wscale + (g + 8) * sstride;
  for (int i = 0; i < my_chunks; ++i) {
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();
    const int c = kpart + i * kSplitK, stage = i % kStages;
    const uint4 a4 = ring[warp][stage][0][lane], b4 = ring[warp][stage][1][lane];
    const uint32_t s_a = *reinterpret_cast<const uint32_t*>(sa + 4 * c);
    const uint32_t s_b = *reinterpret_cast<const uint32_t*>(sb + 4 * c);
    const uint2* xc = xl + c * 32;
    const uint32_t wa4[4] = {a4.x, a4.y, a4.z, a4.w}, wb4[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t a0, a1, a2, a3;
      decode_word(wa4[q], a0, a2);
      decode_word(wb4[q], a1, a3);
      const uint2 bx = xc[q * 8];
      float d[4];
      mma_fp8(d, a0, a1, a2, a3, bx.x, bx.y);
      const float fa = __uint_as_float(((s_a >> (8 * q)) & 0xFFu) << 23);
      const float fb = __uint_as_float(((s_b >> (8 * q)) & 0xFFu) << 23);
      acc[0] = fmaf(fa, d[0], acc[0]);
      acc[1] = fmaf(fa, d[1], acc[1]);
      acc[2] = fmaf(fb, d[2], acc[2]);
      acc[3] = fmaf(fb, d[3], acc[3]);
    }
  }
  cp_async_wait<0>();
  float ya = acc[0] + acc[1], yb = acc[2] + acc[3];
  if constexpr (kSplitK > 1) {
    partial[warp][lane] = make_float4(ya, yb, 0, 0);
    __syncthreads();
    if (kpart == 0)
      for (int p = 1; p < kSplitK; ++p) {
        ya += partial[warp + p][lane].x;
        yb += partial[warp + p][lane].y;
      }
  }
  if (kpart == 0 && t == 0) {
    const float undo = exp2f(float(shift + 14));
    if (row0 + g < n) out[int64_t(blockIdx.y) * n + row0 + g] = ya * undo;
    if (row0 + g + 8 < n) out[int64_t(blockIdx.y) * n + row0 + g + 8] = yb * undo;
  }
}

// ---- copies alone: does the order of the bytes matter? ----
// Each warp streams its 16-row tile's chunks (1 KB each) through a cp.async ring and folds what
// lands into one word, as the decode kernel's ring does without its arithmetic. kContiguous:
// a chunk is 1 KB in one piece (a tiled layout); otherwise 16 pieces of 64 bytes, one per row
// (the present layout: rows of K/2 bytes).
template <bool kContiguous, int kSplitK, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    copy_probe(const uint8_t* blocks, int n, int k, const int* experts, uint32_t* sink) {
  const int expert = experts[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kpart = warp % kSplitK;
  const int row0 = (blockIdx.x * (kWarps / kSplitK) + warp / kSplitK) * 16;
  const int row_bytes = k / 2, chunks = (row_bytes + 63) / 64;
  const int my_chunks = kpart < chunks ? (chunks - kpart + kSplitK - 1) / kSplitK : 0;
  const uint8_t* tile = blocks + (int64_t(expert) * n + row0) * row_bytes;
  __shared__ uint4 ring[kWarps][kStages][2][32];
  const uint32_t ring_lane = smem_u32(&ring[warp][0][0][lane]);
  auto issue = [&](int i) {
    const int c = kpart + i * kSplitK;
    const uint32_t dst = ring_lane + uint32_t((i % kStages) * 2 * 32 * 16);
    if (i < my_chunks) {
      if (kContiguous) {
        cp_async_16(dst, tile + int64_t(c) * 1024 + lane * 32, true);
        cp_async_16(dst + 512, tile + int64_t(c) * 1024 + lane * 32 + 16, true);
      } else {
        cp_async_16(dst, tile + int64_t(g) * row_bytes + c * 64 + t * 16, true);
        cp_async_16(dst + 512, tile + int64_t(g + 8) * row_bytes + c * 64 + t * 16, true);
      }
    }
    cp_async_commit();
  };
  for (int j = 0; j < kStages - 1; ++j) issue(j);
  uint32_t fold = 0;
  for (int i = 0; i < my_chunks; ++i) {
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();
    const uint4 a = ring[warp][i % kStages][0][lane], b = ring[warp][i % kStages][1][lane];
    fold ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
  }
  cp_async_wait<0>();
  if (fold == 0x12345678u) sink[threadIdx.x] = fold;
}

// ---- the FP16 form ----
// A chunk is 4 blocks of 32 codes per row; lane quad t keeps word w = block 4c + w's 8 codes at
// k = 2t, 2t+1 (pair A), 2t+8, 2t+9 (B), 16+2t, 17+2t (C), 24+2t, 25+2t (D): the A operand pairs
// of the block's two m16n8k16 steps. In the word, pair A's bits are already an fp16x2's
// (magnitudes at 9-11 and 25-27, signs at 15 and 31); where B, C and D lie is the layout header's
// (a bit reversal, a byte shift and both since session 22; pack_row_f16 places them).
// Host and device: `moe_probe emulate` checks the layout on the CPU.
using anvil::cuda::mxfp4::f16_pair_a;  // the layout's decode (backend/cuda/mxfp4_f16_layout.h)
using anvil::cuda::mxfp4::f16_pair_b;
using anvil::cuda::mxfp4::f16_pair_c;
using anvil::cuda::mxfp4::f16_pair_d;

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// blocks: rows of chunks * 64 bytes (pack_row_f16); scales: E8M0, nblk per row; x16: the token in
// fp16, k order, chunk c's block w for lane quad t at x16[16c + 4w + t] = {b0, b1} of step 0, then
// of step 1. Scales up to 240 (real checkpoints stay near 127).

// The end of a 16-row tile in the FP16 forms: each warp's sums back from code · 2^-14 (kMode 2:
// the copies' fold instead), the k parts added in warp order by part 0, whose t == 0 lanes store
// rows row_a and row_b (those below n) of `out`.
template <int kSplitK, int kMode>
__device__ __forceinline__ void store_tile(const float (&acc)[2][2], uint32_t fold, float2 (*partial)[32], int warp,
                                           int lane, int kpart, float* out, int row_a, int row_b, int n) {
  float ya = (acc[0][0] + acc[1][0]) * 16384.0f, yb = (acc[0][1] + acc[1][1]) * 16384.0f;
  if constexpr (kMode == 2) ya = __uint_as_float(fold & 0x3fffffffu);
  if constexpr (kSplitK > 1) {
    partial[warp][lane] = make_float2(ya, yb);
    __syncthreads();
    if (kpart == 0)
      for (int q = 1; q < kSplitK; ++q) {
        ya += partial[warp + q][lane].x;
        yb += partial[warp + q][lane].y;
      }
  }
  if (kpart == 0 && lane % 4 == 0) {
    if (row_a < n) out[row_a] = ya;
    if (row_b < n) out[row_b] = yb;
  }
}

// kMode (session 18's split of the time): 0 the kernel; 1 its arithmetic alone (no weight copies:
// the ring's stale bytes are decoded); 2 its copies alone (the ring read back and folded, no
// decode or mma); 3 the kernel for eight tokens per expert (the mma's n8 all used: lane quad g
// takes token g, and each block's two results per row and token get its scale), out then being
// [expert][token][n].
template <int kSplitK, int kStages, int kMinBlocks, int kMode = 0>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    f16_m1(const uint8_t* blocks, const uint8_t* scales, int n, int k, const int* experts, const uint4* x16,
           float* out) {
  const int expert = experts[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kpart = warp % kSplitK;
  const int row0 = (blockIdx.x * (kWarps / kSplitK) + warp / kSplitK) * 16;
  const int nblk = k / 32, chunks = (nblk + 3) / 4, row_bytes = chunks * 64;
  const int my_chunks = kpart < chunks ? (chunks - kpart + kSplitK - 1) / kSplitK : 0;
  const int row_a = min(row0 + g, n - 1), row_b = min(row0 + g + 8, n - 1);
  const uint8_t* wa = blocks + (int64_t(expert) * n + row_a) * row_bytes + t * 16;
  const uint8_t* wb = blocks + (int64_t(expert) * n + row_b) * row_bytes + t * 16;
  __shared__ uint4 ring[kWarps][kStages][2][32];
  __shared__ float2 partial[kWarps][32];
  __shared__ float4 partial8[kMode == 3 ? kWarps : 1][32];
  // [kWarps][16 rows][the warp's chunks][4 blocks]: 2^(s - 127)
  extern __shared__ __align__(16) float block_scales[];
  float* wscale = block_scales + warp * 16 * 4 * ((chunks + kSplitK - 1) / kSplitK);

  const uint32_t ring_lane = smem_u32(&ring[warp][0][0][lane]);
  auto issue = [&](int i) {
    const int c = kpart + i * kSplitK;
    const uint32_t dst = ring_lane + uint32_t((i % kStages) * 2 * 32 * 16);
    const bool ok = i < my_chunks;
    if constexpr (kMode != 1) {
      cp_async_16(dst, ok ? wa + c * 64 : blocks, ok);
      cp_async_16(dst + 512, ok ? wb + c * 64 : blocks, ok);
    }
    cp_async_commit();
  };
  for (int j = 0; j < kStages - 1; ++j) issue(j);
  {
    // Scales as stored for this form: a row's E8M0 bytes padded to 4 per chunk (one 32-bit word
    // per chunk, blocks past K zero). A warp widens only its own chunks' words, lane i taking row
    // i % 16 of local chunk i / 16: my_chunks / 2 independent 4-byte loads per lane, no division.
    const uint32_t* sg = reinterpret_cast<const uint32_t*>(scales) + (int64_t(expert) * n + row0) * chunks;
    for (int i = lane; i < 16 * my_chunks; i += 32) {
      const int r = i % 16, q = i / 16, c = kpart + q * kSplitK;
      const uint32_t w = __ldg(sg + int64_t(min(r, n - 1 - row0)) * chunks + c);
      // 2^(s - 127) from the exponent bits alone (the fp16 codes' 2^-14 is taken back at the end).
      float4 f;
      f.x = __uint_as_float((w << 23) & 0x7f800000u);
      f.y = __uint_as_float((w << 15) & 0x7f800000u);
      f.z = __uint_as_float((w << 7) & 0x7f800000u);
      f.w = __uint_as_float((w >> 1) & 0x7f800000u);
      *reinterpret_cast<float4*>(wscale + (r * my_chunks + q) * 4) = f;
    }
  }
  __syncwarp();
  const float* sa = wscale + g * my_chunks * 4;
  const float* sb = wscale + (g + 8) * my_chunks * 4;
  const uint4* xl = x16 + (kMode == 3 ? int64_t(g) * chunks * 16 : 0) + t;
  auto load_x = [&](int i, uint4 (&dst)[4]) {
    const int c = kpart + i * kSplitK;
    const bool ok = i < my_chunks;
#pragma unroll
    for (int w = 0; w < 4; ++w) dst[w] = load_cached_16(xl + c * 16 + 4 * w, ok);
  };

  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [block parity][row g, row g + 8]
  float acc8[2][4] = {};  // kMode 3: [block parity][d element: rows g, g + 8 x tokens 2t, 2t + 1]
  uint32_t fold = 0;
  auto chunk = [&](int i, const uint4 (&xv)[4]) {
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();
    const int stage = i % kStages;
    const uint4 a4 = ring[warp][stage][0][lane], b4 = ring[warp][stage][1][lane];
    const float4 fa = *reinterpret_cast<const float4*>(sa + 4 * i);
    const float4 fb = *reinterpret_cast<const float4*>(sb + 4 * i);
    const uint32_t wa4[4] = {a4.x, a4.y, a4.z, a4.w}, wb4[4] = {b4.x, b4.y, b4.z, b4.w};
    const float sca[4] = {fa.x, fa.y, fa.z, fa.w}, scb[4] = {fb.x, fb.y, fb.z, fb.w};
    if constexpr (kMode == 2) {
      fold ^= a4.x ^ a4.y ^ a4.z ^ a4.w ^ b4.x ^ b4.y ^ b4.z ^ b4.w ^ xv[0].x ^ xv[3].w;
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_f16(d, f16_pair_a(wa4[w]), f16_pair_a(wb4[w]), f16_pair_b(wa4[w]), f16_pair_b(wb4[w]), xv[w].x, xv[w].y);
        mma_f16(d, f16_pair_c(wa4[w]), f16_pair_c(wb4[w]), f16_pair_d(wa4[w]), f16_pair_d(wb4[w]), xv[w].z, xv[w].w);
        if constexpr (kMode == 3) {
          acc8[w % 2][0] = fmaf(sca[w], d[0], acc8[w % 2][0]);
          acc8[w % 2][1] = fmaf(sca[w], d[1], acc8[w % 2][1]);
          acc8[w % 2][2] = fmaf(scb[w], d[2], acc8[w % 2][2]);
          acc8[w % 2][3] = fmaf(scb[w], d[3], acc8[w % 2][3]);
        } else {
          acc[w % 2][0] = fmaf(sca[w], d[0], acc[w % 2][0]);
          acc[w % 2][1] = fmaf(scb[w], d[2], acc[w % 2][1]);
        }
      }
    }
  };
  // Two chunks per iteration, so the token double buffer's index is a constant.
  uint4 xs[2][4];
  load_x(0, xs[0]);
  for (int i = 0; i < my_chunks; i += 2) {
    load_x(i + 1, xs[1]);
    chunk(i, xs[0]);
    if (i + 1 < my_chunks) {
      load_x(i + 2, xs[0]);
      chunk(i + 1, xs[1]);
    }
  }
  cp_async_wait<0>();
  if constexpr (kMode == 3) {
    float4 v = make_float4((acc8[0][0] + acc8[1][0]) * 16384.0f, (acc8[0][1] + acc8[1][1]) * 16384.0f,
                           (acc8[0][2] + acc8[1][2]) * 16384.0f, (acc8[0][3] + acc8[1][3]) * 16384.0f);
    if constexpr (kSplitK > 1) {
      partial8[warp][lane] = v;
      __syncthreads();
      if (kpart == 0)
        for (int q = 1; q < kSplitK; ++q) {
          const float4 o = partial8[warp + q][lane];
          v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
        }
    }
    if (kpart == 0) {
      float* base = out + int64_t(blockIdx.y) * 8 * n;
      if (row0 + g < n) {
        base[int64_t(2 * t) * n + row0 + g] = v.x;
        base[int64_t(2 * t + 1) * n + row0 + g] = v.y;
      }
      if (row0 + g + 8 < n) {
        base[int64_t(2 * t) * n + row0 + g + 8] = v.z;
        base[int64_t(2 * t + 1) * n + row0 + g + 8] = v.w;
      }
    }
    return;
  }
  store_tile<kSplitK, kMode>(acc, fold, partial, warp, lane, kpart, out + int64_t(blockIdx.y) * n, row0 + g,
                             row0 + g + 8, n);
}

// ---- the FP16 form fed by the bulk copy engine (session 25) ----
// f16_m1's arithmetic, bit for bit (each warp takes the same chunks in the same order), with the
// weights brought in by cp.async.bulk instead of each lane's cp.async: a block of kTiles 16-row
// tiles x kSplitK warps per tile shares a ring of kStages stages, a stage being kStageChunks
// 64-byte chunks of every row of the block (one bulk copy per row, issued by warp 0's lanes), all
// of them requested at the start. The question (docs/perf/gpu.md, session 25): f16_m1's
// arithmetic alone ran gate_up in 11.5 us and its copies alone in 12.3-13.4, both in 16.4 (H200,
// session 18); with the copies off the consumer warps and more bytes in flight, how near 11.5
// does the whole come? kMode: 0 the kernel, 1 arithmetic alone (no copies, stale ring), 2 copies
// alone (the stages folded).
template <int kTiles, int kSplitK, int kStageChunks, int kStages>
struct BulkShape {
  static constexpr int kWarps = kTiles * kSplitK, kRows = 16 * kTiles;
  static constexpr int kPitch = kStageChunks * 64 + 64;  // the pad: rows g and g + 1 in opposite bank halves
  static constexpr int kStageBytes = kRows * kPitch;
  // [barriers: kStages + 1][float scales: kRows x chunks x 4][raw scale words: kRows x chunks][ring]
  __host__ __device__ static size_t scale_floats_at() { return 128; }
  __host__ __device__ static size_t raw_at(int chunks) { return scale_floats_at() + size_t(kRows) * chunks * 16; }
  __host__ __device__ static size_t ring_at(int chunks) { return (raw_at(chunks) + size_t(kRows) * chunks * 4 + 127) / 128 * 128; }
  __host__ __device__ static size_t smem(int chunks) { return ring_at(chunks) + size_t(kStages) * kStageBytes; }
};

template <int kTiles, int kSplitK, int kStageChunks, int kStages, int kMinBlocks, int kMode = 0>
__global__ void __launch_bounds__(kTiles * kSplitK * 32, kMinBlocks)
    f16_bulk(const uint8_t* blocks, const uint8_t* scales, int n, int k, const int* experts, const uint4* x16,
             float* out) {
  using Shape = BulkShape<kTiles, kSplitK, kStageChunks, kStages>;
  constexpr int kRows = Shape::kRows, kPitch = Shape::kPitch, kStageBytes = Shape::kStageBytes;
  static_assert(kStageChunks % kSplitK == 0, "each warp's chunks in f16_m1's order");
  const int expert = experts[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int tile = warp / kSplitK, kpart = warp % kSplitK;
  const int block_row0 = blockIdx.x * kRows;  // n % kRows == 0 (the host checks)
  const int nblk = k / 32, chunks = (nblk + 3) / 4, row_bytes = chunks * 64;
  const int stages_total = (chunks + kStageChunks - 1) / kStageChunks;
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* const scales_full = full + kStages;
  float* const scale_f = reinterpret_cast<float*>(smem + Shape::scale_floats_at());
  uint32_t* const scale_raw = reinterpret_cast<uint32_t*>(smem + Shape::raw_at(chunks));
  uint8_t* const ring = smem + Shape::ring_at(chunks);

  auto issue = [&](int i) {  // warp 0
    const int slot = i % kStages, first = i * kStageChunks;
    const uint32_t piece = uint32_t(min(kStageChunks, chunks - first) * 64);
    if (lane == 0) anvil::cuda::bulk::barrier_expect_bytes(full + slot, piece * kRows);
    __syncwarp();
    for (int r = lane; r < kRows; r += 32)
      anvil::cuda::bulk::copy_to_shared(ring + slot * kStageBytes + r * kPitch,
                                        blocks + (int64_t(expert) * n + block_row0 + r) * row_bytes + first * 64,
                                        piece, full + slot);
  };
  if (threadIdx.x == 0)
    for (int i = 0; i <= kStages; ++i) anvil::cuda::bulk::barrier_init(full + i, 1);
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) {
      const uint32_t bytes = uint32_t(kRows * chunks * 4);
      anvil::cuda::bulk::barrier_expect_bytes(scales_full, bytes);
      anvil::cuda::bulk::copy_to_shared(scale_raw, scales + (int64_t(expert) * n + block_row0) * chunks * 4, bytes,
                                        scales_full);
    }
    if constexpr (kMode != 1)
      for (int i = 0; i < min(kStages, stages_total); ++i) issue(i);
  }
  // The block's scales as floats, 2^(s - 127) from the exponent bits alone, once.
  anvil::cuda::bulk::barrier_wait(scales_full, 0);
  for (int i = threadIdx.x; i < kRows * chunks; i += Shape::kWarps * 32) {
    const uint32_t w = scale_raw[i];
    *reinterpret_cast<float4*>(scale_f + 4 * i) =
        make_float4(__uint_as_float((w << 23) & 0x7f800000u), __uint_as_float((w << 15) & 0x7f800000u),
                    __uint_as_float((w << 7) & 0x7f800000u), __uint_as_float((w >> 1) & 0x7f800000u));
  }
  __syncthreads();

  const int row_a = 16 * tile + g, row_b = row_a + 8;
  const uint4* xl = x16 + t;
  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [block parity][row g, row g + 8]
  uint32_t fold = 0;
  constexpr int kPerStage = kStageChunks / kSplitK;
  for (int i = 0; i < stages_total; ++i) {
    const int slot = i % kStages, first = i * kStageChunks;
    const int here = min(kStageChunks, chunks - first);
    // The token for this stage's chunks of the warp (L1 after the first block on the SM).
    uint4 xv[kPerStage][4];
#pragma unroll
    for (int q = 0; q < kPerStage; ++q) {
      const int j = kpart + q * kSplitK;
#pragma unroll
      for (int w = 0; w < 4; ++w) xv[q][w] = load_cached_16(xl + (first + j) * 16 + 4 * w, j < here);
    }
    if constexpr (kMode != 1) anvil::cuda::bulk::barrier_wait(full + slot, uint32_t(i / kStages) & 1u);
    const uint8_t* const stage = ring + slot * kStageBytes;
#pragma unroll
    for (int q = 0; q < kPerStage; ++q) {
      const int j = kpart + q * kSplitK;
      if (j >= here) break;
      const int c = first + j;
      const uint4 a4 = *reinterpret_cast<const uint4*>(stage + row_a * kPitch + j * 64 + t * 16);
      const uint4 b4 = *reinterpret_cast<const uint4*>(stage + row_b * kPitch + j * 64 + t * 16);
      if constexpr (kMode == 2) {
        fold ^= a4.x ^ a4.y ^ a4.z ^ a4.w ^ b4.x ^ b4.y ^ b4.z ^ b4.w ^ xv[q][0].x ^ xv[q][3].w;
        continue;
      }
      const float4 fa = *reinterpret_cast<const float4*>(scale_f + (row_a * chunks + c) * 4);
      const float4 fb = *reinterpret_cast<const float4*>(scale_f + (row_b * chunks + c) * 4);
      const uint32_t wa4[4] = {a4.x, a4.y, a4.z, a4.w}, wb4[4] = {b4.x, b4.y, b4.z, b4.w};
      const float sca[4] = {fa.x, fa.y, fa.z, fa.w}, scb[4] = {fb.x, fb.y, fb.z, fb.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_f16(d, f16_pair_a(wa4[w]), f16_pair_a(wb4[w]), f16_pair_b(wa4[w]), f16_pair_b(wb4[w]), xv[q][w].x,
                xv[q][w].y);
        mma_f16(d, f16_pair_c(wa4[w]), f16_pair_c(wb4[w]), f16_pair_d(wa4[w]), f16_pair_d(wb4[w]), xv[q][w].z,
                xv[q][w].w);
        acc[w % 2][0] = fmaf(sca[w], d[0], acc[w % 2][0]);
        acc[w % 2][1] = fmaf(scb[w], d[2], acc[w % 2][1]);
      }
    }
    __syncthreads();  // every warp is done with the slot
    if constexpr (kMode != 1)
      if (warp == 0 && i + kStages < stages_total) issue(i + kStages);
  }
  __shared__ float2 partial[Shape::kWarps][32];
  store_tile<kSplitK, kMode>(acc, fold, partial, warp, lane, kpart, out + int64_t(blockIdx.y) * n,
                             block_row0 + row_a, block_row0 + row_b, n);
}

// ---- host: the layout ----
// Code at k of a row (checkpoint: byte k/2, low nibble for even k).
inline uint32_t code_at(const uint8_t* row, int kk) { return (row[kk / 2] >> (4 * (kk % 2))) & 0xFu; }

// One row of K codes in the FP8 layout (row_bytes = K / 2).
void pack_row(const uint8_t* src, uint8_t* dst, int k) {
  const int nblk = k / 32, chunks = (nblk + 3) / 4, tail = nblk - 4 * (chunks - 1);
  for (int b = 0; b < nblk; ++b) {
    const int c = b / 4, i = b % 4, r = c == chunks - 1 ? tail : 4;
    for (int t = 0; t < 4; ++t) {
      uint32_t word = 0;
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = code_at(src, 32 * b + 4 * t + j);                 // out0 byte j
        const uint32_t hi_next = code_at(src, 32 * b + 16 + 4 * t + (j + 1) % 4);  // out1 byte j+1 magnitude
        const uint32_t hi = code_at(src, 32 * b + 16 + 4 * t + j);                 // out1 byte j sign
        const uint32_t byte = (lo & 7u) | ((lo >> 3) << 6) | ((hi_next & 7u) << 3) | ((hi >> 3) << 7);
        word |= byte << (8 * j);
      }
      std::memcpy(dst + c * 64 + t * 4 * r + i * 4, &word, 4);
    }
  }
}

using anvil::cuda::mxfp4::pack_row_f16;  // one row of K codes in the FP16 layout

// The token (bf16) as the FP16 form's x16: plain fp16 in k order, zero past K (the layout's
// lane quad t reads k 32b + 8t .. + 7 of block b as one uint4, mxfp4_f16_layout.h).
std::vector<uint32_t> token_f16(const std::vector<uint16_t>& x, int k) {
  const int nblk = k / 32, chunks = (nblk + 3) / 4;
  std::vector<uint32_t> out(size_t(chunks) * 4 * 16, 0);
  auto half_bits = [&](int kk) -> uint32_t {
    const __half h = __float2half_rn(kk < k ? bf(x[size_t(kk)]) : 0.0f);
    return uint32_t(__half_as_ushort(h));
  };
  for (size_t i = 0; i < out.size(); ++i) out[i] = half_bits(int(2 * i)) | half_bits(int(2 * i + 1)) << 16;
  return out;
}

// An IEEE half's value.
inline double half_value(uint32_t bits) {
  const int sign = (bits >> 15) & 1, exponent = (bits >> 10) & 31, mantissa = bits & 1023;
  const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), -24)
                                         : std::ldexp(1.0 + double(mantissa) / 1024.0, exponent - 15);
  return sign ? -magnitude : magnitude;
}

// The FP16 form's arithmetic on the CPU, fragment by fragment as f16_m1 does it (lane quad t,
// block w, the two steps' A pairs against the x16 pairs of the same k), for `rows` rows: the
// layout's bits must give exactly the reference's products.
double emulate_f16_rows(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                        const std::vector<uint16_t>& x, int k, int rows, double* worst_rel) {
  const int nblk = k / 32, chunks = (nblk + 3) / 4;
  const std::vector<uint32_t> x16 = token_f16(x, k);
  std::vector<uint8_t> packed(size_t(chunks) * 64);
  double e2 = 0, n2 = 0;
  *worst_rel = 0;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = &codes[size_t(r) * size_t(k / 2)];
    pack_row_f16(row, packed.data(), k);
    double got = 0, want = 0;
    for (int b = 0; b < nblk; ++b) {
      const double scale = std::ldexp(1.0, int(scales[size_t(r) * nblk + b]) - 113);  // f16_m1's table
      double block = 0;
      for (int t = 0; t < 4; ++t) {
        uint32_t word;
        std::memcpy(&word, &packed[size_t(b / 4) * 64 + t * 16 + (b % 4) * 4], 4);
        const uint32_t pairs[4] = {f16_pair_a(word), f16_pair_b(word), f16_pair_c(word), f16_pair_d(word)};
        const uint32_t* xs = &x16[size_t(32 * b + 8 * t) / 2];
        for (int p = 0; p < 4; ++p)
          block += half_value(pairs[p] & 0xFFFFu) * half_value(xs[p] & 0xFFFFu) +
                   half_value(pairs[p] >> 16) * half_value(xs[p] >> 16);
      }
      got += scale * block;
      for (int kk = 32 * b; kk < 32 * b + 32; ++kk)
        want += double(kFp4[code_at(row, kk)]) * std::ldexp(1.0, int(scales[size_t(r) * nblk + b]) - 127) *
                double(bf(x[size_t(kk)]));
    }
    e2 += (got - want) * (got - want);
    n2 += want * want;
    *worst_rel = std::max(*worst_rel, std::fabs(got - want) / std::max(1e-30, std::fabs(want)));
  }
  return std::sqrt(e2 / n2);
}
}  // namespace probe

using namespace anvil::cuda;

static bool g_old_only = false, g_fp8 = false, g_f16 = false, g_bulk = false;
constexpr int kPool = 48, kSets = 12, kActive = 4, kRounds = 10;

// Packs (or otherwise handles) rows 0..rows-1 on every host core.
template <typename PerRow>
static void for_rows_in_parallel(size_t rows, PerRow per_row) {
  std::vector<std::thread> pool;
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t th = 0; th < threads; ++th)
    pool.emplace_back([&, th] {
      for (size_t r = th; r < rows; r += threads) per_row(r);
    });
  for (auto& p : pool) p.join();
}

// A kernel's outputs for the experts `ids` (kActive rows of n) against a double reference from
// the checkpoint codes, E8M0 scales and the bf16 token; prints the relative RMS error.
static void check_against_double(const char* label, const char* form, const std::vector<float>& got, int n, int k,
                                 const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                 const std::vector<uint16_t>& x, const std::vector<int>& ids, double bound) {
  const size_t row_bytes = size_t(k) / 2, nblk = size_t(k) / 32;
  double e2 = 0, n2 = 0, worst = 0;
  for (int j = 0; j < kActive; ++j)
    for (int r = 0; r < n; ++r) {
      const size_t row = size_t(ids[size_t(j)]) * n + r;
      double want = 0;
      for (int kk = 0; kk < k; ++kk)
        want += double(kFp4[probe::code_at(&codes[row * row_bytes], kk)]) *
                std::ldexp(1.0, int(scales[row * nblk + kk / 32]) - 127) * double(bf(x[size_t(kk)]));
      const double d = double(got[size_t(j) * n + r]) - want;
      e2 += d * d;
      n2 += want * want;
      worst = std::max(worst, std::fabs(d));
    }
  const double rms = std::sqrt(e2 / n2);
  std::printf("CHECK %-8s %s form vs double: rel rms %.3e, max |d| %.3e%s\n", label, form, rms, worst,
              rms < bound ? "" : "  FAIL");
}

// Microseconds per launch: a graph of kRounds x kSets launches, one expert set after another.
template <typename Launch>
static double time_us(Launch launch, cudaStream_t s) {
  const double ms = graph_median_ms(
      [&] {
        for (int r = 0; r < kRounds; ++r)
          for (int set = 0; set < kSets; ++set) launch(set);
      },
      s, 1, 7);
  return ms * 1e3 / (kRounds * kSets);
}

template <int kSplitK, int kStages, int kMinBlocks>
static void run_new(const char* label, const uint8_t* blocks, const uint8_t* scales, int n, int k, int* const* sets,
                    const uint16_t* x, float* out, cudaStream_t s, double bytes) {
  constexpr auto kernel = probe::fp8_m1<kSplitK, kStages, kMinBlocks>;
  const int chunks = (k / 32 + 3) / 4;
  const size_t smem = size_t(chunks) * 4 * 64 + size_t(probe::kWarps) * 16 * 4 * chunks;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(n / (16 * probe::kWarps / kSplitK)), kActive);
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, kernel));
  const double us = time_us([&](int set) { kernel<<<grid, 128, smem, s>>>(blocks, scales, n, k, sets[set], x, out); }, s);
  std::printf("PERF %-8s new split=%d stages=%d minb=%d regs=%3d  %7.2f us  %6.0f GB/s\n", label, kSplitK, kStages,
              kMinBlocks, attr.numRegs, us, bytes / us * 1e-3);
}

template <int kSplitK, int kStages, int kMinBlocks, int kMode = 0>
static void run_f16(const char* label, const uint8_t* blocks, const uint8_t* scales, int n, int k, int* const* sets,
                    const uint4* x16, float* out, cudaStream_t s, double bytes) {
  constexpr auto kernel = probe::f16_m1<kSplitK, kStages, kMinBlocks, kMode>;
  const int chunks = (k / 32 + 3) / 4;
  const size_t smem = size_t(probe::kWarps) * 16 * 4 * ((chunks + kSplitK - 1) / kSplitK) * sizeof(float);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(n / (16 * probe::kWarps / kSplitK)), kActive);
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, kernel));
  int resident = 0;  // blocks per SM as registers and shared memory allow
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, 128, smem));
  const double us = time_us([&](int set) { kernel<<<grid, 128, smem, s>>>(blocks, scales, n, k, sets[set], x16, out); }, s);
  std::printf("PERF %-8s f16%s split=%d stages=%d minb=%d regs=%3d spill=%dB warps/SM=%2d grid warps=%5u  %7.2f us  %6.0f GB/s\n",
              label, kMode == 1 ? "-arith" : kMode == 2 ? "-copy" : kMode == 3 ? "-8tok" : "", kSplitK, kStages, kMinBlocks, attr.numRegs, int(attr.localSizeBytes), resident * probe::kWarps,
              grid.x * grid.y * probe::kWarps, us, bytes / us * 1e-3);
}

template <int kTiles, int kSplitK, int kStageChunks, int kStages, int kMinBlocks, int kMode = 0>
static void run_f16_bulk(const char* label, const uint8_t* blocks, const uint8_t* scales, int n, int k,
                         int* const* sets, const uint4* x16, float* out, cudaStream_t s, double bytes) {
  using Shape = probe::BulkShape<kTiles, kSplitK, kStageChunks, kStages>;
  constexpr auto kernel = probe::f16_bulk<kTiles, kSplitK, kStageChunks, kStages, kMinBlocks, kMode>;
  if (n % Shape::kRows != 0) return;
  const int chunks = (k / 32 + 3) / 4;
  const size_t smem = Shape::smem(chunks);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(n / Shape::kRows), kActive);
  cudaFuncAttributes attr;
  CK(cudaFuncGetAttributes(&attr, kernel));
  int resident = 0, sms = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, Shape::kWarps * 32, smem));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double us = time_us(
      [&](int set) { kernel<<<grid, Shape::kWarps * 32, smem, s>>>(blocks, scales, n, k, sets[set], x16, out); }, s);
  std::printf("PERF %-8s bulk%s tiles=%d split=%d stage=%dx64B stages=%d regs=%3d spill=%dB smem=%zuB warps/SM=%2d "
              "waves=%.2f  %7.2f us  %6.0f GB/s\n",
              label, kMode == 1 ? "-arith" : kMode == 2 ? "-copy" : "", kTiles, kSplitK, kStageChunks, kStages,
              attr.numRegs, int(attr.localSizeBytes), smem, resident * Shape::kWarps,
              double(grid.x * grid.y) / std::max(1, resident * sms), us, bytes / us * 1e-3);
}

template <int kSplitK, bool kGateUp>
static void run_old(const char* label, const uint8_t* blocks, const uint8_t* scales, int n, int k,
                    const moe::Routing* routings, const uint16_t* x, uint16_t* act, float* out, cudaStream_t s,
                    double bytes) {
  constexpr auto kernel = moe::moe_decode_kernel<1, kSplitK, kGateUp, moe::Kind::Mxfp4>;
  // blocks and scales in the loader's layout (FP16-form codes, scale rows padded to whole chunks):
  // with the checkpoint's 90-byte scale rows it staged 92 bytes a row past its shared memory.
  const size_t smem = size_t(moe::kDecodeWarps) * 16 * size_t(anvil::cuda::mxfp4::f16_scale_row_bytes(k));
  const dim3 grid(unsigned(n / (16 * moe::kDecodeWarps / kSplitK)), kActive);
  const double us = time_us(
      [&](int set) {
        moe::ExpertProduct p;
        p.a = x;
        p.blocks = blocks;
        p.scales = scales;
        p.n = n;
        p.k = k;
        p.top_k = kActive;
        p.act = act;
        p.out = out;
        p.limit = 7.0f;
        p.alpha = 1.702f;
        kernel<<<grid, 128, smem, s>>>(p, routings[set]);
      },
      s);
  std::printf("PERF %-8s present split=%d stages=%d minb=%d  %7.2f us  %6.0f GB/s\n", label, kSplitK,
              moe::kDecodeStages, ANVIL_DECODE_MINB1, us, bytes / us * 1e-3);
}

// The FP16 form on the loader's layout (d_packed, d_scales: case_run's upload), a check on one
// expert set against a double reference (codes, scales and the bf16 token as given), then timings.
template <int kSplitK>
static void f16_case(const char* label, int n, int k, const std::vector<uint8_t>& codes,
                     const std::vector<uint8_t>& scales, const uint8_t* d_packed, const uint8_t* d_scales,
                     const std::vector<uint16_t>& x, const std::vector<int>& check_ids, int* const* sets,
                     cudaStream_t s, double bytes) {
  const size_t chunks = size_t(anvil::cuda::mxfp4::f16_chunks(k));
  const std::vector<uint32_t> x16 = probe::token_f16(x, k);
  uint4* d_x16;
  float* d_out;
  // Room for eight tokens (kMode 3): the token repeated, so each column's sum is token 0's.
  CK(cudaMalloc(&d_x16, x16.size() * 4 * 8 + 256));
  CK(cudaMalloc(&d_out, size_t(kActive) * 8 * n * 4));
  for (int tok = 0; tok < 8; ++tok)
    CK(cudaMemcpy(reinterpret_cast<uint8_t*>(d_x16) + x16.size() * 4 * tok, x16.data(), x16.size() * 4,
                  cudaMemcpyHostToDevice));
  {
    constexpr auto kernel = probe::f16_m1<kSplitK, 8, 3>;
    const size_t smem = size_t(probe::kWarps) * 16 * 4 * chunks * sizeof(float);
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CK(cudaMemset(d_out, 0xff, size_t(kActive) * n * 4));
    kernel<<<dim3(unsigned(n / (16 * probe::kWarps / kSplitK)), kActive), 128, smem, s>>>(d_packed, d_scales, n, k,
                                                                                           sets[0], d_x16, d_out);
    CK(cudaStreamSynchronize(s));
    std::vector<float> got(size_t(kActive) * n);
    CK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
    // fp16 keeps every bf16 token value here except those under 2^-14 (subnormal in fp16).
    check_against_double(label, "f16", got, n, k, codes, scales, x, check_ids, 1e-4);
    // Eight copies of the token through the eight-token form: every column must be those bits.
    constexpr auto kernel8 = probe::f16_m1<kSplitK, 8, 3, 3>;
    CK(cudaFuncSetAttribute(kernel8, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CK(cudaMemset(d_out, 0xff, size_t(kActive) * 8 * n * 4));
    kernel8<<<dim3(unsigned(n / (16 * probe::kWarps / kSplitK)), kActive), 128, smem, s>>>(d_packed, d_scales, n, k,
                                                                                            sets[0], d_x16, d_out);
    CK(cudaStreamSynchronize(s));
    std::vector<float> got8(size_t(kActive) * 8 * n);
    CK(cudaMemcpy(got8.data(), d_out, got8.size() * 4, cudaMemcpyDeviceToHost));
    size_t differing = 0;
    for (int e = 0; e < kActive; ++e)
      for (int tok = 0; tok < 8; ++tok)
        for (int r = 0; r < n; ++r)
          differing += std::memcmp(&got8[(size_t(e) * 8 + tok) * n + r], &got[size_t(e) * n + r], 4) != 0;
    std::printf("CHECK %-8s f16 eight-token form: %zu of %zu values differ from the one-token form%s\n", label,
                differing, got8.size(), differing == 0 ? "" : "  FAIL");
  }
  if (g_bulk) {
    // The bulk-fed form against f16_m1 at the same split (same chunks per warp, same order): the
    // same bits. Then f16_m1's best configuration of session 18 beside the bulk shapes.
    constexpr auto reference = probe::f16_m1<kSplitK * 2, 4, 6>;
    const size_t ref_smem = size_t(probe::kWarps) * 16 * 4 * ((chunks + kSplitK * 2 - 1) / (kSplitK * 2)) * sizeof(float);
    CK(cudaFuncSetAttribute(reference, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ref_smem)));
    CK(cudaMemset(d_out, 0xff, size_t(kActive) * n * 4));
    reference<<<dim3(unsigned(n / (16 * probe::kWarps / (kSplitK * 2))), kActive), 128, ref_smem, s>>>(
        d_packed, d_scales, n, k, sets[0], d_x16, d_out);
    CK(cudaStreamSynchronize(s));
    std::vector<float> want(size_t(kActive) * n), got(size_t(kActive) * n);
    CK(cudaMemcpy(want.data(), d_out, want.size() * 4, cudaMemcpyDeviceToHost));
    using Shape = probe::BulkShape<2, kSplitK * 2, 4, 2>;
    constexpr auto bulk = probe::f16_bulk<2, kSplitK * 2, 4, 2, 1>;
    if (n % Shape::kRows == 0) {
      CK(cudaFuncSetAttribute(bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Shape::smem(int(chunks)))));
      CK(cudaMemset(d_out, 0xff, size_t(kActive) * n * 4));
      bulk<<<dim3(unsigned(n / Shape::kRows), kActive), Shape::kWarps * 32, Shape::smem(int(chunks)), s>>>(
          d_packed, d_scales, n, k, sets[0], d_x16, d_out);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
      size_t differing = 0;
      for (size_t i = 0; i < got.size(); ++i) differing += std::memcmp(&got[i], &want[i], 4) != 0;
      std::printf("CHECK %-8s bulk-fed form: %zu of %zu values differ from f16_m1's%s\n", label, differing, got.size(),
                  differing == 0 ? "" : "  FAIL");
    }
    run_f16<kSplitK * 2, 4, 6>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16<kSplitK * 2, 4, 6, 1>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16<kSplitK * 2, 4, 6, 2>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    // Shapes at ~24 warps per SM (launch bounds as f16_m1's, 80 registers or fewer): gate_up at
    // split 2 (as the model's), down at split 4.
    constexpr int S = kSplitK * 2;
    run_f16_bulk<2, S, 4, 2, 24 / (2 * S)>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<2, S, 4, 2, 24 / (2 * S), 1>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<2, S, 4, 2, 24 / (2 * S), 2>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<2, S, 4, 3, 24 / (2 * S)>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<2, S, 8, 2, 24 / (2 * S)>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<4, S, 4, 2, 24 / (4 * S)>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<1, S, 4, 3, 24 / S>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<1, S, 4, 3, 24 / S, 1>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<1, S, 4, 3, 24 / S, 2>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    run_f16_bulk<1, S, 4, 4, 24 / S>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
    cudaFree(d_x16);
    cudaFree(d_out);
    return;
  }
  // Session 18: does the time follow the warps per SM when the grid is one wave? (split x 2 with
  // up to 24 warps per SM, against the present split at 12 and 16.) Then the time split into its
  // arithmetic alone and its copies alone (same grid, prologue and epilogue).
  run_f16<kSplitK, 8, 3>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK, 6, 4>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 6, 4>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 4, 6>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 3, 6>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 3, 8>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 4, 3, 6>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK, 6, 4, 1>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK, 6, 4, 2>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 4, 6, 1>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 4, 6, 2>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  // Eight tokens per expert (batches up to ~64 at gpt-oss's top-4 of 32 or 128 experts).
  run_f16<kSplitK, 8, 3, 3>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 4, 6, 3>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  run_f16<kSplitK * 2, 3, 6, 3>(label, d_packed, d_scales, n, k, sets, d_x16, d_out, s, bytes);
  cudaFree(d_x16);
  cudaFree(d_out);
}

template <int kSplitK>
static void case_run(const char* label, int n, int k, bool gate_up) {
  Rng rng(uint64_t(n) * 7 + k);
  const size_t row_bytes = size_t(k) / 2, nblk = size_t(k) / 32;
  const size_t code_bytes = size_t(kPool) * n * row_bytes, scale_bytes = size_t(kPool) * n * nblk;
  std::vector<uint8_t> codes(code_bytes), scales(scale_bytes), packed(code_bytes);
  for (size_t i = 0; i < code_bytes; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(&codes[i], &v, std::min<size_t>(8, code_bytes - i));
  }
  for (auto& v : scales) v = uint8_t(118 + rng.next() % 11);
  for_rows_in_parallel(size_t(kPool) * n,
                       [&](size_t r) { probe::pack_row(&codes[r * row_bytes], &packed[r * row_bytes], k); });
  std::vector<uint16_t> x(size_t(kActive) * k + 64, 0);  // down's old kernel reads a row per slot
  for (int i = 0; i < k; ++i) {
    const double u = double(int64_t(rng.next() >> 40) - (int64_t(1) << 23)) / double(1 << 23);
    x[size_t(i)] = tobf(float(u * std::exp2(double(int(rng.next() % 12)) - 8.0)));
  }
  for (int j = 1; j < kActive; ++j) std::copy(x.begin(), x.begin() + k, x.begin() + size_t(j) * k);
  uint8_t *d_codes, *d_packed, *d_scales;
  uint16_t *d_x, *d_act;
  float* d_out;
  CK(cudaMalloc(&d_codes, code_bytes + 256));
  CK(cudaMalloc(&d_packed, code_bytes + 256));
  CK(cudaMalloc(&d_scales, scale_bytes + 256));
  CK(cudaMalloc(&d_x, x.size() * 2));
  CK(cudaMalloc(&d_act, size_t(kActive) * n * 2));
  CK(cudaMalloc(&d_out, size_t(kActive) * n * 4));
  CK(cudaMemcpy(d_codes, codes.data(), code_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_packed, packed.data(), code_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_scales, scales.data(), scale_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  // Sets of four distinct experts; the routing tables the old kernel reads.
  std::vector<int*> sets(kSets);
  std::vector<moe::Routing> routings(kSets);
  std::vector<std::vector<int>> set_ids(kSets);
  for (int set = 0; set < kSets; ++set) {
    for (int j = 0; j < kActive; ++j) set_ids[size_t(set)].push_back(set * kActive + j);
    std::vector<int> tables;  // active[4], active_range[8], sorted_slot[4]
    for (int j = 0; j < kActive; ++j) tables.push_back(set_ids[size_t(set)][size_t(j)]);
    for (int j = 0; j < kActive; ++j) {
      tables.push_back(j);
      tables.push_back(1);
    }
    for (int j = 0; j < kActive; ++j) tables.push_back(j);
    int* d;
    CK(cudaMalloc(&d, tables.size() * 4));
    CK(cudaMemcpy(d, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    sets[size_t(set)] = d;
    routings[size_t(set)].active = d;
    routings[size_t(set)].active_range = d + kActive;
    routings[size_t(set)].sorted_slot = d + 3 * kActive;
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));

  // Correctness of the FP8 form on set 0 against a double reference.
  {
    float* d_check;
    CK(cudaMalloc(&d_check, size_t(kActive) * n * 4));
    constexpr auto kernel = probe::fp8_m1<kSplitK, 8, 3>;
    const int chunks = (k / 32 + 3) / 4;
    const size_t smem = size_t(chunks) * 4 * 64 + size_t(probe::kWarps) * 16 * 4 * chunks;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<dim3(unsigned(n / (16 * probe::kWarps / kSplitK)), kActive), 128, smem, s>>>(d_packed, d_scales, n, k,
                                                                                           sets[0], d_x, d_check);
    CK(cudaStreamSynchronize(s));
    std::vector<float> got(size_t(kActive) * n);
    CK(cudaMemcpy(got.data(), d_check, got.size() * 4, cudaMemcpyDeviceToHost));
    check_against_double(label, "fp8", got, n, k, codes, scales, x, set_ids[0], 1e-5);
    cudaFree(d_check);
  }

  const double bytes = double(kActive) * n * (row_bytes + nblk);
  // What the loader stores (mxfp4_f16_layout.h), not the checkpoint's rows: the present kernel's
  // input, and the FP16 forms'.
  uint8_t *d_loaded_codes, *d_loaded_scales;
  {
    const size_t rows = size_t(kPool) * n, code_row = size_t(anvil::cuda::mxfp4::f16_row_bytes(k)),
                 scale_row = size_t(anvil::cuda::mxfp4::f16_scale_row_bytes(k));
    std::vector<uint8_t> loaded_codes(rows * code_row), loaded_scales(rows * scale_row);
    for_rows_in_parallel(rows, [&](size_t r) {
      anvil::cuda::mxfp4::pack_row_f16(&codes[r * row_bytes], &loaded_codes[r * code_row], k);
      anvil::cuda::mxfp4::pack_scales_f16(&scales[r * nblk], &loaded_scales[r * scale_row], k);
    });
    CK(cudaMalloc(&d_loaded_codes, loaded_codes.size() + 256));
    CK(cudaMalloc(&d_loaded_scales, loaded_scales.size() + 256));
    CK(cudaMemcpy(d_loaded_codes, loaded_codes.data(), loaded_codes.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_loaded_scales, loaded_scales.data(), loaded_scales.size(), cudaMemcpyHostToDevice));
  }
  // And with k split twice as finely (session 18: one wave of warps when the build's
  // ANVIL_DECODE_MINB1 allows 24 per SM).
  if (gate_up) {
    run_old<kSplitK, true>(label, d_loaded_codes, d_loaded_scales, n, k, routings.data(), d_x, d_act, d_out, s, bytes);
    run_old<kSplitK * 2, true>(label, d_loaded_codes, d_loaded_scales, n, k, routings.data(), d_x, d_act, d_out, s, bytes);
  } else {
    run_old<kSplitK, false>(label, d_loaded_codes, d_loaded_scales, n, k, routings.data(), d_x, d_act, d_out, s, bytes);
    run_old<kSplitK * 2, false>(label, d_loaded_codes, d_loaded_scales, n, k, routings.data(), d_x, d_act, d_out, s, bytes);
  }
  if (g_f16)
    f16_case<kSplitK>(label, n, k, codes, scales, d_loaded_codes, d_loaded_scales, x, set_ids[0], sets.data(), s,
                      bytes);
  cudaFree(d_loaded_codes);
  cudaFree(d_loaded_scales);
  if (g_old_only || !g_fp8) return;
  run_new<kSplitK, 8, 3>(label, d_packed, d_scales, n, k, sets.data(), d_x, d_out, s, bytes);
  run_new<kSplitK, 8, 4>(label, d_packed, d_scales, n, k, sets.data(), d_x, d_out, s, bytes);
  run_new<kSplitK, 12, 3>(label, d_packed, d_scales, n, k, sets.data(), d_x, d_out, s, bytes);
  run_new<kSplitK * 2, 8, 3>(label, d_packed, d_scales, n, k, sets.data(), d_x, d_out, s, bytes);
  run_new<kSplitK * 2, 8, 4>(label, d_packed, d_scales, n, k, sets.data(), d_x, d_out, s, bytes);
  run_new<kSplitK * 2, 6, 4>(label, d_packed, d_scales, n, k, sets.data(), d_x, d_out, s, bytes);
  cudaFree(d_codes);
  cudaFree(d_packed);
  cudaFree(d_scales);
  cudaFree(d_x);
  cudaFree(d_act);
  cudaFree(d_out);
}

template <bool kContiguous, int kSplitK, int kStages, int kMinBlocks>
static void run_copy(int n, int k, const uint8_t* blocks, int* const* sets, uint32_t* sink, cudaStream_t s,
                     double bytes) {
  constexpr auto kernel = probe::copy_probe<kContiguous, kSplitK, kStages, kMinBlocks>;
  const dim3 grid(unsigned(n / (16 * probe::kWarps / kSplitK)), kActive);
  const double us = time_us([&](int set) { kernel<<<grid, 128, 0, s>>>(blocks, n, k, sets[set], sink); }, s);
  std::printf("COPY n=%d k=%d %-10s split=%d stages=%d minb=%d  %7.2f us  %6.0f GB/s\n", n, k,
              kContiguous ? "contiguous" : "64B-pieces", kSplitK, kStages, kMinBlocks, us, bytes / us * 1e-3);
}

static void copy_case(int n, int k) {
  const size_t bytes_all = size_t(kPool) * n * (k / 2);
  uint8_t* d;
  CK(cudaMalloc(&d, bytes_all + 4096));
  CK(cudaMemset(d, 0x5a, bytes_all));
  std::vector<int*> sets(kSets);
  for (int set = 0; set < kSets; ++set) {
    std::vector<int> ids;
    for (int j = 0; j < kActive; ++j) ids.push_back(set * kActive + j);
    CK(cudaMalloc(&sets[size_t(set)], 64));
    CK(cudaMemcpy(sets[size_t(set)], ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  }
  uint32_t* sink;
  CK(cudaMalloc(&sink, 4096));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const double bytes = double(kActive) * n * (k / 2);
  run_copy<false, 1, 8, 3>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<true, 1, 8, 3>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<false, 2, 4, 6>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<true, 2, 4, 6>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<false, 2, 6, 6>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<true, 2, 6, 6>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<false, 4, 4, 6>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<true, 4, 4, 6>(n, k, d, sets.data(), sink, s, bytes);
  run_copy<true, 2, 8, 4>(n, k, d, sets.data(), sink, s, bytes);
  cudaFree(d);
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "both";
  if (which == "emulate") {  // no GPU needed: the FP16 form's layout against the reference
    for (const int k : {2880, 64, 96}) {
      Rng rng{uint64_t(k)};
      const int rows = 64;
      std::vector<uint8_t> codes(size_t(rows) * k / 2), scales(size_t(rows) * k / 32);
      for (auto& v : codes) v = uint8_t(rng.next());
      for (auto& v : scales) v = uint8_t(100 + rng.next() % 40);
      std::vector<uint16_t> x(static_cast<size_t>(k));
      for (auto& v : x) v = tobf(rng.uniform() * std::exp2(float(int(rng.next() % 12)) - 8.0f));
      double worst = 0;
      const double rms = probe::emulate_f16_rows(codes, scales, x, k, rows, &worst);
      std::printf("EMULATE f16 form k=%d: rel rms %.3e, worst row rel %.3e%s\n", k, rms, worst,
                  rms < 1e-4 ? "" : "  FAIL");
    }
    return 0;
  }
  if (which == "copy") {
    copy_case(5760, 2880);
    copy_case(2880, 2880);
    return 0;
  }
  g_fp8 = argc > 2 && std::string(argv[2]) == "fp8";
  g_f16 = argc > 2 && (std::string(argv[2]) == "f16" || std::string(argv[2]) == "bulk");
  g_bulk = argc > 2 && std::string(argv[2]) == "bulk";
  if (which == "old") {  // the present kernel alone, for a profiler
    g_old_only = true;
    case_run<1>("gate_up", 5760, 2880, true);
    return 0;
  }
  if (which != "down") case_run<1>("gate_up", 5760, 2880, true);
  if (which != "gate_up") case_run<2>("down", 2880, 2880, false);
  return 0;
}
