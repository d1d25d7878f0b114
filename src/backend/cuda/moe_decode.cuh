#pragma once
// The MoE's bandwidth path (decode: few tokens per expert). A block belongs to one active expert
// and streams 16-row tiles of its weight matrix exactly once for all the tokens routed to it (up
// to 8 * kTokenTiles per pass; more tokens take further passes). The weight rows are the mma's A
// operand (m16), the tokens its B operand (n8), so each weight byte costs a few ALU ops to
// decode and nothing else; activations come from L1/L2.
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/mxfp4_common.cuh"
#include "backend/cuda/moe_common.cuh"

namespace anvil::cuda::moe {

constexpr int kDecodeWarps = 4;
// Weight chunks (1 KB per warp each) in flight per warp. They land in a per-warp ring in shared
// memory through cp.async, which holds far more bytes in flight than registers could: batch 1
// reads each expert's slice with few warps per SM, so depth is what reaches bandwidth. Each lane
// reads back only the 32 bytes it copied itself, so no barrier is needed (cp.async.wait_group
// makes a thread's own copies visible to it). Token rows and scales (L1/L2-resident) are fetched
// one chunk ahead in registers where registers allow (up to 16 tokens per pass).
// Scales are staged once per block in shared memory (see moe_decode_kernel), so the loop's only
// global loads are the ring's and the token rows'.
#ifndef ANVIL_DECODE_MINB1
// H200, whole models (docs/perf/logs/h200/decode-occupancy/): 3 against 4 gives batch 1 +3 %
// (20b 483 against 464-472 tok/s, 120b 338-341 against 329-331) with batches 8 and 64 unchanged; 2
// loses 7 %. (Session 7's kernel-alone timing had favoured 4 at m = 8 and 64, with that kernel.)
#define ANVIL_DECODE_MINB1 3
#endif
#ifndef ANVIL_DECODE_STAGES
#define ANVIL_DECODE_STAGES 8  // H200, vs 4: 20b m=8 153 vs 162 us, 120b m=64 660 vs 721 us
#endif
constexpr int kDecodeStages = ANVIL_DECODE_STAGES;
#ifndef ANVIL_DECODE_PREFETCH_TILES
#define ANVIL_DECODE_PREFETCH_TILES 2  // widest pass whose token rows are fetched a chunk ahead
#endif
template <int kTokenTiles>
constexpr bool kDecodePrefetchX = kTokenTiles <= ANVIL_DECODE_PREFETCH_TILES;
// Resident warps per SM at each width's register cap (for choosing the k split).
template <int kTokenTiles>
constexpr int kDecodeWarpsPerSm = kTokenTiles >= 2 ? 8 : 4 * ANVIL_DECODE_MINB1;

// Warp w of a block works on row tile blockIdx.x * (kDecodeWarps / kSplitK) + w / kSplitK and
// takes every kSplitK-th chunk of k starting at w % kSplitK; the kSplitK partial sums are added
// in a fixed order in shared memory. Splitting k gives the GPU enough warps to keep the memory
// busy when few experts are active (batch 1).
// Occupancy: 8 warps per SM with 2+ token tiles, 4 * ANVIL_DECODE_MINB1 (12) with one, which
// leaves each warp up to 168 registers (no spills).
// kKind: MXFP4 (mxfp4_f16_layout.h: a lane's 16 bytes of a chunk are one word of each of 4 blocks,
// each word its own E8M0 scale, its pairs read as bf16 and scaled before the mma; the one-token
// launch takes moe_decode_f16.cuh instead); NVFP4 (two E4M3 bytes per lane block, one
// per word pair, and the row's global scale on the sum); FP8 (E4M3 codes, 16 per lane block,
// so a chunk covers 64 k instead of 128, and a row scale on the sum); Bf16 (Qwen3-MoE as shipped,
// bf16_layout.h: a lane block is 8 values whose words are already the (i, i + 4) pairs the mma
// takes, so a chunk covers 32 k and nothing is decoded or scaled).
template <int kTokenTiles, int kSplitK, bool kGateUp, Kind kKind>
__global__ void __launch_bounds__(kDecodeWarps * 32, kTokenTiles >= 2 ? 2 : ANVIL_DECODE_MINB1)
    moe_decode_kernel(ExpertProduct p, Routing r) {
  // gate_up needs the routing its predecessor just wrote. down needs from its predecessor
  // (gate_up) only the activations: the routing is older (gate_up passed its own wait on the
  // routing before it released this grid), so down's weights and scales start streaming while
  // gate_up is still finishing, and the wait comes just before the first activation load. The
  // routing is read through L2 there (ld.cg): this SM's L1 may still hold the previous layer's.
  // The release follows the wait in both, so no more than two grids are ever in flight.
  if constexpr (kGateUp) {
    wait_for_predecessor();
    release_dependents();
  }
  static_assert(kDecodeWarps % kSplitK == 0, "k split within a block");
  constexpr bool kNv = kKind == Kind::Nvfp4, kFp8 = kKind == Kind::Fp8, kBf16 = kKind == Kind::Bf16;
  constexpr bool kMx = kKind == Kind::Mxfp4;
  constexpr bool kScaled = !kFp8 && !kBf16;  // block scales (MXFP4, NVFP4)
  // Per chunk a lane reads 16 bytes of each of its two rows: 32 FP4 codes, 16 FP8 codes or 8 bf16
  // values, and the matching activations as kXLoads 16-byte loads.
  constexpr int kChunkK = kFp8 ? 64 : kBf16 ? 32 : 128, kXLoads = kChunkK / 32;
  using namespace gemm;
  using namespace mxfp4;
  auto routing = [](const int32_t* at) { return kGateUp ? *at : __ldcg(at); };
  // The routing writes -1 past the active experts: one dependent load before the weights stream.
  // The expert's token range is read beside it (by active index, not by expert), so it costs no
  // second round trip; past the active experts it is stale and unused.
  const int expert = routing(r.active + blockIdx.y);
  const int begin = routing(r.active_range + 2 * blockIdx.y), count = routing(r.active_range + 2 * blockIdx.y + 1);
  if (expert < 0) return;  // whole block: no barrier is skipped

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kpart = warp % kSplitK;
  const int row0 = (blockIdx.x * (kDecodeWarps / kSplitK) + warp / kSplitK) * 16;
  // MXFP4 rows are whole chunks (zero codes past K), so every lane's piece of a chunk is valid.
  const int row_bytes = kMx ? f16_row_bytes(p.k) : kFp8 ? p.k : kBf16 ? 2 * p.k : p.k / 2;
  const int lane_blocks = kMx ? 4 * f16_chunks(p.k) : row_bytes / 16;
  const int scale_cols = !kScaled ? 0 : kNv ? p.k / 16 : f16_scale_row_bytes(p.k);
  const int chunks = (lane_blocks + 3) / 4;
  const int my_chunks = kpart < chunks ? (chunks - kpart + kSplitK - 1) / kSplitK : 0;
  // Rows past N read row N-1 (never stored), so the loop needs no row test.
  const int row_a = min(row0 + g, p.n - 1), row_b = min(row0 + g + 8, p.n - 1);
  const int64_t base_a = int64_t(expert) * p.n + row_a, base_b = int64_t(expert) * p.n + row_b;
  // MXFP4 rows lie in 16-row tiles (a row's chunks kF16ChunkStride apart), the others row after row.
  const int64_t chunk_stride = kMx ? kF16ChunkStride : 64;
  const uint8_t* wa = p.blocks + (kMx ? f16_piece_offset(base_a, 0, chunks) : base_a * row_bytes) + t * 16;
  const uint8_t* wb = p.blocks + (kMx ? f16_piece_offset(base_b, 0, chunks) : base_b * row_bytes) + t * 16;
  // This warp's scales for all of k: 16 rows x scale_cols bytes in dynamic shared memory (the
  // launcher sizes it kDecodeWarps * 16 * scale_cols; FP8 and bf16 have none). Read from global memory once
  // per block, before the first chunk, instead of one DRAM byte load per chunk with one chunk of
  // lookahead. (Measured on an H200 this alone did not change batch 1; the loop is limited
  // elsewhere, see the commit log.)
  extern __shared__ __align__(16) uint8_t decode_scales[];
  uint8_t* const warp_scales = decode_scales + warp * 16 * scale_cols;
  const uint8_t* const sa = warp_scales + g * scale_cols + (kNv ? 2 * t : 0);
  const uint8_t* const sb = warp_scales + (g + 8) * scale_cols + (kNv ? 2 * t : 0);

  // Scales above 128 need a second multiply per pair (scale_multiplier). Real checkpoints have
  // none, so one vote over the warp's whole table, rather than one per chunk, picks the path.
  bool warp_big = false;
  // ring[warp][stage][row a / row b][lane]: 16 bytes each.
  __shared__ uint4 ring[kDecodeWarps][kDecodeStages][2][32];
  __shared__ float4 partial[kSplitK > 1 ? kDecodeWarps : 1][kTokenTiles][32];
  const uint32_t ring_lane = smem_u32(&ring[warp][0][0][lane]);

  // Chunk i of this warp is c = kpart + i * kSplitK; lane quad t takes its block 4c + t. Chunks
  // past the end are zero-filled / zero without touching memory (the product then adds nothing).
  auto chunk_ok = [&](int i) { return i < my_chunks && 4 * (kpart + i * kSplitK) + t < lane_blocks; };
  auto issue_weights = [&](int i) {
    const int c = kpart + i * kSplitK;
    const bool ok = chunk_ok(i);
    const uint32_t dst = ring_lane + uint32_t((i % kDecodeStages) * 2 * 32 * 16);
    cp_async_16(dst, ok ? wa + int64_t(c) * chunk_stride : p.blocks, ok);
    cp_async_16(dst + 32 * 16, ok ? wb + int64_t(c) * chunk_stride : p.blocks, ok);
    cp_async_commit();
  };
  // Rows a and b: four E8M0 bytes, one per word (MXFP4), or two E4M3 bytes, for words 0-1 and 2-3
  // (NVFP4).
  struct Scales {
    uint32_t a, b;
  };
  auto load_scales = [&](int i) {
    const int c = kpart + i * kSplitK;
    const bool ok = chunk_ok(i);  // past the end: another warp's bytes or none; never indexed
    if constexpr (!kScaled)
      return Scales{0u, 0u};
    else if constexpr (kNv)  // 2-byte aligned: scale_cols is even
      return Scales{ok ? uint32_t(*reinterpret_cast<const uint16_t*>(sa + c * 8)) : 0u,
                    ok ? uint32_t(*reinterpret_cast<const uint16_t*>(sb + c * 8)) : 0u};
    else  // 4-byte aligned: scale_cols is 4 per chunk
      return Scales{ok ? *reinterpret_cast<const uint32_t*>(sa + c * 4) : 0u,
                    ok ? *reinterpret_cast<const uint32_t*>(sb + c * 4) : 0u};
  };
  // Token columns past the expert's count read the first token's row: the mma keeps columns
  // apart, and those columns are never stored. MXFP4's lane quad t reads k 32b + 8t .. + 7 of each
  // of the chunk's blocks b (zero past K: the padding codes are zero, but garbage could be NaN);
  // the other kinds read their 32 contiguous k of the chunk.
  constexpr int kXStride = kMx ? 32 : 8;
  const uint16_t* xr[kTokenTiles];
  auto load_tokens = [&](int i, uint4 (&dst)[kTokenTiles][kXLoads]) {
    const int c = kpart + i * kSplitK;
    const bool ok = chunk_ok(i);
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
      for (int w = 0; w < kXLoads; ++w)
        dst[n][w] = load_cached_16(xr[n] + c * kChunkK + w * kXStride, ok && (!kMx || 4 * c + w < p.k / 32));
  };
  // Two accumulator sets (even / odd words) halve the chain of dependent mma per chunk.
  float acc[2][kTokenTiles][4];
  // One chunk: word w of the lane's block feeds mma steps 2w, 2w+1 (mxfp4_common.cuh); an FP8
  // word q feeds step q, its pairs (fp8_layout.h, expert_position) matching activations
  // (8(q/2) + 2(q%2) + {0, 1}, that + 4), as FP4 step q does.
  auto multiply = [&](const uint4& wa4, const uint4& wb4, Scales sc, const uint4 (&xs)[kTokenTiles][kXLoads],
                      auto big_tag) {
    if constexpr (kBf16) {
      // Words 0-1 are one mma step, words 2-3 the next, as an FP4 word's decoded pairs are.
      const uint32_t pa[4] = {wa4.x, wa4.y, wa4.z, wa4.w}, pb[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          uint32_t b0, b1;
          activation_pairs(xs[n][0], odd, b0, b1);
          mma_bf16_16816(acc[odd][n], pa[2 * odd], pb[2 * odd], pa[2 * odd + 1], pb[2 * odd + 1], b0, b1);
        }
    } else if constexpr (kFp8) {
      const uint32_t words_a[4] = {wa4.x, wa4.y, wa4.z, wa4.w};
      const uint32_t words_b[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t a_lo = bf16x2_mul(fp8::low_pair_raw(words_a[q]), fp8::kRawToValue);
        const uint32_t a_hi = bf16x2_mul(fp8::high_pair_raw(words_a[q]), fp8::kRawToValue);
        const uint32_t b_lo = bf16x2_mul(fp8::low_pair_raw(words_b[q]), fp8::kRawToValue);
        const uint32_t b_hi = bf16x2_mul(fp8::high_pair_raw(words_b[q]), fp8::kRawToValue);
#pragma unroll
        for (int n = 0; n < kTokenTiles; ++n) {
          uint32_t x0, x1;
          activation_pairs(xs[n][q / 2], q % 2, x0, x1);
          mma_bf16_16816(acc[q % 2][n], a_lo, b_lo, a_hi, b_hi, x0, x1);
        }
      }
    } else if constexpr (kMx) {
      constexpr bool kBig = decltype(big_tag)::value;
      const uint32_t words_a[4] = {wa4.x, wa4.y, wa4.z, wa4.w};
      const uint32_t words_b[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
      // scale_multiplier's exponent fields for the chunk's 4 blocks at once, one per byte (no
      // carries: min(s, 128) + 126 <= 254, max(s, 128) - 1 >= 127); each word then takes its byte
      // into both halves of a bf16 pair and shifts it into place.
      const uint32_t low_a = __vminu4(sc.a, 0x80808080u) + 0x7E7E7E7Eu;
      const uint32_t low_b = __vminu4(sc.b, 0x80808080u) + 0x7E7E7E7Eu;
      const uint32_t big_a = __vmaxu4(sc.a, 0x80808080u) - 0x01010101u;
      const uint32_t big_b = __vmaxu4(sc.b, 0x80808080u) - 0x01010101u;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t pick = 0x4040u + 0x0101u * uint32_t(w);  // byte w, 0, byte w, 0
        const uint32_t mul_a = __byte_perm(low_a, 0u, pick) << 7, mul_b = __byte_perm(low_b, 0u, pick) << 7;
        const uint32_t high_a = __byte_perm(big_a, 0u, pick) << 7, high_b = __byte_perm(big_b, 0u, pick) << 7;
        uint32_t pa[4], pb[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          pa[j] = decode_f16_layout_pair<kBig>(words_a[w], j, mul_a, high_a);
          pb[j] = decode_f16_layout_pair<kBig>(words_b[w], j, mul_b, high_b);
        }
        // Word w is block 4c + w: its pairs 0-1 are one mma step, 2-3 the next, against the token's
        // k 32(4c + w) + 8t .. + 7 as loaded (pairs in the same order).
#pragma unroll
        for (int n = 0; n < kTokenTiles; ++n) {
          mma_bf16_16816(acc[w % 2][n], pa[0], pb[0], pa[1], pb[1], xs[n][w].x, xs[n][w].y);
          mma_bf16_16816(acc[w % 2][n], pa[2], pb[2], pa[3], pb[3], xs[n][w].z, xs[n][w].w);
        }
      }
    } else {  // NVFP4: scales never need a second multiply (nvfp4_multiplier)
      // mul_*[0] serves words 0-1, mul_*[1] words 2-3.
      const uint32_t mul_a[2] = {nvfp4_multiplier(sc.a & 0xFFu), nvfp4_multiplier(sc.a >> 8)};
      const uint32_t mul_b[2] = {nvfp4_multiplier(sc.b & 0xFFu), nvfp4_multiplier(sc.b >> 8)};
      const uint32_t words_a[4] = {wa4.x, wa4.y, wa4.z, wa4.w};
      const uint32_t words_b[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t pa[4], pb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pa[i] = decode_pair<false, kTokenTiles == 1>(words_a[w], i, mul_a[w / 2], 0u);
          pb[i] = decode_pair<false, kTokenTiles == 1>(words_b[w], i, mul_b[w / 2], 0u);
        }
#pragma unroll
        for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
          for (int odd = 0; odd < 2; ++odd) {
            uint32_t b0, b1;
            activation_pairs(xs[n][w], odd, b0, b1);
            mma_bf16_16816(acc[w % 2][n], pa[2 * odd], pb[2 * odd], pa[2 * odd + 1], pb[2 * odd + 1], b0, b1);
          }
      }
    }
  };
  // Step i (warp-uniform): refill the ring, wait for chunk i, multiply it.
  auto step = [&](int i, Scales sc, const uint4 (&xs)[kTokenTiles][kXLoads]) {
    issue_weights(i + kDecodeStages - 1);
    cp_async_wait<kDecodeStages - 1>();
    const int stage = i % kDecodeStages;
    const uint4 wa4 = ring[warp][stage][0][lane], wb4 = ring[warp][stage][1][lane];
    if (warp_big)
      multiply(wa4, wb4, sc, xs, std::true_type{});
    else
      multiply(wa4, wb4, sc, xs, std::false_type{});
  };

  // The warp's 16 scale rows are copied to shared memory once, before the first pass.
  auto stage_scales = [&] {
    // They are contiguous: rows row0..row0+15 of the expert (N % 16 == 0, so a tile is all in or
    // all out; a tile past N copies the last one, never stored). They start at a multiple of
    // 16 * K/32 bytes, so 16-byte loads work when the table is 16-aligned.
    const int src_row0 = min(row0, p.n - 16);
    const uint8_t* src = p.scales + (int64_t(expert) * p.n + src_row0) * scale_cols;
    const int bytes = 16 * scale_cols;
    constexpr int kBatch = 4;  // loads issued before their stores
    bool big = false;  // zero-filled loads past the table are 0, never big
    if ((reinterpret_cast<uintptr_t>(p.scales) & 15u) == 0) {
      const uint4* src4 = reinterpret_cast<const uint4*>(src);
      uint4* dst4 = reinterpret_cast<uint4*>(warp_scales);
      for (int base = 0; base < bytes / 16; base += 32 * kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) v[j] = load_cached_16(src4 + base + j * 32 + lane, base + j * 32 + lane < bytes / 16);
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (base + j * 32 + lane < bytes / 16) dst4[base + j * 32 + lane] = v[j];
          big |= (__vcmpgtu4(v[j].x, 0x80808080u) | __vcmpgtu4(v[j].y, 0x80808080u) |
                  __vcmpgtu4(v[j].z, 0x80808080u) | __vcmpgtu4(v[j].w, 0x80808080u)) != 0;
        }
      }
    } else {
      for (int base = 0; base < bytes; base += 32 * kBatch) {
        uint32_t v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) v[j] = load_cached_u8(src + base + j * 32 + lane, base + j * 32 + lane < bytes);
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          if (base + j * 32 + lane < bytes) warp_scales[base + j * 32 + lane] = uint8_t(v[j]);
          big |= v[j] > 128u;
        }
      }
    }
    __syncwarp();
    warp_big = !kNv && __any_sync(0xffffffffu, big);  // NVFP4 never needs a second multiply
  };

  // The epilogue's per-row constants, requested now rather than after the last chunk (a DRAM
  // round trip at the end otherwise). NVFP4 pairs are value · 2^-9 (times the row's global
  // scale); FP8 rows have a scale each.
  const bool ok_a = row0 + g < p.n, ok_b = row0 + g + 8 < p.n;
  const int64_t at_a = int64_t(expert) * p.n + row0 + g, at_b = at_a + 8;
  const float bias_a = ok_a && p.bias ? p.bias[at_a] : 0.0f;
  const float bias_b = ok_b && p.bias ? p.bias[at_b] : 0.0f;
  float scale_a = 1.0f, scale_b = 1.0f;
  if constexpr (kNv || kFp8) {
    constexpr float kPairScale = kNv ? 512.0f : 1.0f;
    scale_a = ok_a ? p.row_scales[at_a] * kPairScale : 0.0f;
    scale_b = ok_b ? p.row_scales[at_b] * kPairScale : 0.0f;
  }
  // Token rows (by sorted position) of a pass's column n.
  auto token_row = [&](int tok0, int n) -> int64_t {
    const int token = tok0 + n * 8 + g < count ? tok0 + n * 8 + g : 0;
    return kGateUp ? r.sorted_slot[begin + token] / p.top_k : int64_t(begin + token);
  };
  int64_t first_rows[kTokenTiles];
#pragma unroll
  for (int n = 0; n < kTokenTiles; ++n) first_rows[n] = token_row(0, n);
  // down's output slots of the first pass's tokens (this lane's columns 2t, 2t + 1 of each tile):
  // routing, older than the predecessor, so read now rather than at the end.
  int first_slots[kTokenTiles][2] = {};
  if constexpr (!kGateUp) {
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (n * 8 + 2 * t + e < count) first_slots[n][e] = __ldcg(r.sorted_slot + begin + n * 8 + 2 * t + e);
  }

  // The first pass's weights start streaming before the scales are staged; the first pass's token
  // rows above are already on their way.
  for (int j = 0; j < kDecodeStages - 1; ++j) issue_weights(j);
  if constexpr (kScaled) stage_scales();
  if constexpr (!kGateUp) {
    wait_for_predecessor();
    release_dependents();
  }
  for (int tok0 = 0; tok0 < count; tok0 += 8 * kTokenTiles) {
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n) {
      const int64_t row = tok0 == 0 ? first_rows[n] : token_row(tok0, n);
      xr[n] = p.a + row * p.k + t * (kMx ? 8 : kChunkK / 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][n][j] = acc[1][n][j] = 0.0f;
    }

    if (tok0 > 0)
      for (int j = 0; j < kDecodeStages - 1; ++j) issue_weights(j);
    if constexpr (kDecodePrefetchX<kTokenTiles>) {
      // Two chunks per iteration, so the token double buffer's index is a constant.
      Scales sc[2];
      uint4 xs[2][kTokenTiles][kXLoads];
      sc[0] = load_scales(0);
      load_tokens(0, xs[0]);
      for (int i = 0; i < my_chunks; i += 2) {
        sc[1] = load_scales(i + 1);
        load_tokens(i + 1, xs[1]);
        step(i, sc[0], xs[0]);
        if (i + 1 < my_chunks) {
          sc[0] = load_scales(i + 2);
          load_tokens(i + 2, xs[0]);
          step(i + 1, sc[1], xs[1]);
        }
      }
    } else {
      for (int i = 0; i < my_chunks; ++i) {
        uint4 xs[kTokenTiles][kXLoads];
        load_tokens(i, xs);
        step(i, load_scales(i), xs);
      }
    }
    // Copies past the end (zero fills) may still be landing in the ring; the next pass reuses it.
    cp_async_wait<0>();
#pragma unroll
    for (int n = 0; n < kTokenTiles; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][n][j] += acc[1][n][j];

    if constexpr (kSplitK > 1) {
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n)
        partial[warp][n][lane] = make_float4(acc[0][n][0], acc[0][n][1], acc[0][n][2], acc[0][n][3]);
      __syncthreads();
      if (kpart == 0) {
        for (int part = 1; part < kSplitK; ++part) {
#pragma unroll
          for (int n = 0; n < kTokenTiles; ++n) {
            const float4 v = partial[warp + part][n][lane];
            acc[0][n][0] += v.x;
            acc[0][n][1] += v.y;
            acc[0][n][2] += v.z;
            acc[0][n][3] += v.w;
          }
        }
      }
    }

    if (kpart == 0) {
      // acc[n] = {D[row g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}, columns are tokens.
#pragma unroll
      for (int n = 0; n < kTokenTiles; ++n) {
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          v[j] = (kNv || kFp8 ? acc[0][n][j] * (j < 2 ? scale_a : scale_b) : acc[0][n][j]) + (j < 2 ? bias_a : bias_b);
        if constexpr (kGateUp) {
          // Gate rows are even, up rows odd: row g + 1 lives four lanes up.
          float up[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) up[j] = __shfl_down_sync(0xffffffffu, v[j], 4);
          if (g % 2 == 0) {
            const int width = p.n / 2;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int token = tok0 + n * 8 + 2 * t + (j & 1);
              const int row = row0 + g + (j >= 2 ? 8 : 0);
              // row + 1 < N as well, since N is even.
              if (token < count && row < p.n)
                p.act[int64_t(begin + token) * width + row / 2] = to_bf16_bits(gated(v[j], up[j], p.silu, p.limit, p.alpha));
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int token = tok0 + n * 8 + 2 * t + (j & 1);
            const bool ok = j >= 2 ? ok_b : ok_a;
            if (token < count && ok) {
              const int64_t slot = tok0 == 0 ? first_slots[n][j & 1] : r.sorted_slot[begin + token];
              p.out[slot * p.n + row0 + g + (j >= 2 ? 8 : 0)] = v[j];
            }
          }
        }
      }
    }
    if constexpr (kSplitK > 1) __syncthreads();  // partial[] is rewritten by the next pass
  }
}

}  // namespace anvil::cuda::moe
