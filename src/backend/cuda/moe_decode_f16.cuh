#pragma once
// MXFP4's batch-1 expert product (one token per active expert): the FP16 form, measured in
// tools/cuda-harness/moe_probe.cu (docs/perf/logs/h200/moe-f16-probe/). The layout's words decode
// to fp16 pairs of code · 2^-14 in a few bit operations (mxfp4_f16_layout.h), every mma step
// covers one 32-code block, and each block's E8M0 scale goes on the step pair's fp32 result with
// one FFMA per row: no multiply per weight pair, which is what held moe_decode_kernel's loop on
// its ALU pipe at batch 1.
//
// The token is read in fp16, so each warp first converts its part of it (its chunks of k) into
// shared memory, scaled by a power of two that puts the part's largest magnitude in [2^14, 2^15):
// every bf16 value within 2^28 of that maximum is then exact in fp16 (nothing overflows, whatever
// the model: Qwen3's unclamped silu · up included), and the power is taken back from the warp's
// float32 sum. So the products are the bf16 path's exact products in another summation order.
//
// Shape as moe_decode_kernel (kDecodeWarps warps, 16-row tiles, k split kSplitK ways, a per-warp
// cp.async ring of 1 KB chunks), with fewer stages and more warps per SM: the probe's best
// (24 warps per SM, 3 stages) at twice the k split of moe_decode_kernel's.
//
// In the whole model only the work after a grid's wait for its predecessor is on the step's path
// (docs/perf/gpu.md, session 19: each product skipped in turn). So gate_up stages its token (row 0
// of h at batch 1) before its wait, and the prologue's loads go out in batches: one DRAM round
// trip per scale word in turn had cost ~2 us per layer there, which the probe, whose scales stayed
// in L2, never showed.
#include <cuda_fp16.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/moe_common.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/mxfp4_common.cuh"
#include "backend/cuda/phase_probe.cuh"

namespace anvil::cuda::moe {

constexpr int kF16Stages = 3;
constexpr int kF16MinBlocks = 6;
// Resident warps per SM on an H200 (for choosing the k split): 6 blocks fit its 228 KB of shared
// memory at gpt-oss's shapes. GPUs with less shared memory hold fewer and then split more finely
// than they need, which costs a little time, not correctness.
constexpr int kF16WarpsPerSm = kDecodeWarps * kF16MinBlocks;

// Dynamic shared memory per warp and chunk of its k: 16 rows' scale words (4 E8M0 bytes each), and
// 128 token values as fp16. The words are widened to floats only where they are used: kept as
// floats they took 4x the shared memory and its bandwidth, and the lean form measured 1.4-2.0 %
// faster at batch 1 on the H100 (docs/perf/logs/h200/session29).
constexpr int kF16SmemPerChunk = 16 * 4 + 128 * 2;
__host__ __device__ constexpr int f16_warp_chunks(int k, int split) { return (mxfp4::f16_chunks(k) + split - 1) / split; }
inline size_t f16_decode_smem(int k, int split) {
  return size_t(kDecodeWarps) * size_t(f16_warp_chunks(k, split)) * kF16SmemPerChunk;
}

// 2^(s - 127) for an E8M0 byte s (0 is 2^-127, a float subnormal).
__device__ __forceinline__ float e8m0_float(uint32_t s) { return __uint_as_float(s == 0 ? 0x00400000u : s << 23); }

// A chunk's scale word (4 E8M0 bytes, block 4c + w in byte w) as the four floats.
__device__ __forceinline__ float4 e8m0_word_floats(uint32_t s) {
  return make_float4(e8m0_float(s & 0xFFu), e8m0_float((s >> 8) & 0xFFu), e8m0_float((s >> 16) & 0xFFu),
                     e8m0_float(s >> 24));
}

// 8 bf16 token values as fp16, each times `factor` (a power of two).
__device__ __forceinline__ uint4 bf16x8_to_scaled_f16(uint4 v, float factor) {
  uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2 h = __floats2half2_rn(__uint_as_float(words[j] << 16) * factor,
                                        __uint_as_float(words[j] & 0xFFFF0000u) * factor);
    words[j] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return v;
}

// One ring stage of a lane (ring_lane: its slot of stage 0; stages 2 x 32 x 16 bytes apart): its 16
// bytes of chunk c of rows a and b, as one cp.async group. Not ok: zero fills that touch no memory
// (`mapped` is any mapped address).
__device__ __forceinline__ void f16_ring_issue(uint32_t ring_lane, int stage, const uint8_t* wa, const uint8_t* wb,
                                               int c, bool ok, const void* mapped) {
  const uint32_t dst = ring_lane + uint32_t(stage * 2 * 32 * 16);
  gemm::cp_async_16(dst, ok ? wa + int64_t(c) * mxfp4::kF16ChunkStride : mapped, ok);
  gemm::cp_async_16(dst + 32 * 16, ok ? wb + int64_t(c) * mxfp4::kF16ChunkStride : mapped, ok);
  gemm::cp_async_commit();
}

// The two mma steps of each of a chunk's 4 blocks w (weights a4 / b4 of rows g and g + 8, token
// pieces xt[4 w]), each block's d handed to take(w, d) for its scale.
template <typename Take>
__device__ __forceinline__ void f16_chunk_mmas(const uint4& a4, const uint4& b4, const uint4* xt, Take&& take) {
  using namespace mxfp4;
  const uint32_t wa4[4] = {a4.x, a4.y, a4.z, a4.w}, wb4[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint4 xv = xt[4 * w];
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    gemm::mma_f16_16816(d, f16_pair_a(wa4[w]), f16_pair_a(wb4[w]), f16_pair_b(wa4[w]), f16_pair_b(wb4[w]), xv.x, xv.y);
    gemm::mma_f16_16816(d, f16_pair_c(wa4[w]), f16_pair_c(wb4[w]), f16_pair_d(wa4[w]), f16_pair_d(wb4[w]), xv.z, xv.w);
    take(w, d);
  }
}

// With the k split kSplitK ways inside a block: each warp's (a, b) into its ring (finished with:
// every copy has landed), then warp kpart 0 of each group adds the others' in k-part order.
template <int kSplitK, typename Ring>
__device__ __forceinline__ void add_split_partials(Ring& ring, int warp, int kpart, int lane, float& a, float& b) {
  auto partial = [&](int of_warp) { return reinterpret_cast<float2*>(&ring[of_warp][0][0][0]); };
  partial(warp)[lane] = make_float2(a, b);
  __syncthreads();
  if (kpart == 0)
    for (int q = 1; q < kSplitK; ++q) {
      const float2 o = partial(warp + q)[lane];
      a += o.x;
      b += o.y;
    }
}

template <int kSplitK, bool kGateUp>
__global__ void __launch_bounds__(kDecodeWarps * 32, kF16MinBlocks)
    moe_decode_f16_kernel(ExpertProduct p, Routing r) {
  constexpr int kStages = kF16Stages;
  static_assert(kDecodeWarps % kSplitK == 0, "k split within a block");
  using namespace gemm;
  using namespace mxfp4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kpart = warp % kSplitK;
  const int row0 = (blockIdx.x * (kDecodeWarps / kSplitK) + warp / kSplitK) * 16;
  const int chunks = f16_chunks(p.k);
  const int my_chunks = kpart < chunks ? (chunks - kpart + kSplitK - 1) / kSplitK : 0;
  const int warp_chunks = f16_warp_chunks(p.k, kSplitK);  // every warp's stride in shared memory
  // Rows past N read row N-1 (never stored), so the loop needs no row test.
  const int row_a = min(row0 + g, p.n - 1), row_b = min(row0 + g + 8, p.n - 1);

  // ring[warp][stage][row a / row b][lane]: 16 bytes each; each lane reads back only its own copies.
  __shared__ uint4 ring[kDecodeWarps][kStages][2][32];
  extern __shared__ __align__(16) uint8_t f16_smem[];
  // [16 rows][warp_chunks] scale words, then [warp_chunks][16 pieces of 8 values] token.
  uint32_t* const warp_scales = reinterpret_cast<uint32_t*>(f16_smem) + warp * warp_chunks * 16;
  uint4* const warp_token = reinterpret_cast<uint4*>(f16_smem + kDecodeWarps * warp_chunks * 64) + warp * warp_chunks * 16;

  // The warp's part of a token, as bf16 into shared memory first (its largest magnitude on the
  // way), then rewritten in place as fp16 times 2^shift, which it returns. Each lane rewrites only
  // what it wrote.
  const int part_words = 16 * my_chunks;  // per chunk: 16 rows of 4 scales, 16 pieces of 8 token values
  auto stage_token = [&](int64_t x_row, bool before_wait) {
    __syncwarp();  // the previous token's reads of warp_token are done
    const uint16_t* x = p.a + x_row * p.k;
    uint32_t largest = 0;  // bf16 magnitudes order as integers
    constexpr int kBatch = 6;  // gpt-oss at the usual split: the whole part in one batch
    for (int first = lane; first < part_words; first += 32 * kBatch) {
      uint4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = first + 32 * j;
        const int kk = 128 * (kpart + (i / 16) * kSplitK) + 8 * (i % 16);
        // Zero past K (the padding codes' partners). Before this grid's wait (gate_up's early read
        // of h) through L2 only: this SM's L1 may still hold the previous layer's h.
        const bool ok = i < part_words && kk < p.k;
        if (before_wait) {  // the address stays in the row, the value is dropped
          const uint4 got = __ldcg(reinterpret_cast<const uint4*>(x + (ok ? kk : 0)));
          v[j] = ok ? got : make_uint4(0u, 0u, 0u, 0u);
        } else {
          v[j] = load_cached_16(x + kk, ok);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (first + 32 * j < part_words) warp_token[first + 32 * j] = v[j];
        largest = __vmaxu2(largest, __vmaxu2(__vmaxu2(v[j].x & 0x7FFF7FFFu, v[j].y & 0x7FFF7FFFu),
                                             __vmaxu2(v[j].z & 0x7FFF7FFFu, v[j].w & 0x7FFF7FFFu)));
      }
    }
    largest = __reduce_max_sync(0xffffffffu, max(largest & 0xFFFFu, largest >> 16));
    // The largest's bf16 exponent field E: it is in [2^(E-127), 2^(E-126)), times 2^(141-E) in
    // [2^14, 2^15). Capped where 2^shift stays a float (a part all below 2^-112 is ~0 anyway).
    const int shift = min(141 - int(largest >> 7), 127);
    const float factor = ldexpf(1.0f, shift);
    for (int i = lane; i < part_words; i += 32) warp_token[i] = bf16x8_to_scaled_f16(warp_token[i], factor);
    __syncwarp();
    return shift;
  };
  // gate_up's token for a one-row call is row 0 of h. When the kernel two back in the chain wrote
  // it (kBeforeWait), the routing kernel waited for it before it released this grid, so it is
  // staged before this grid's own wait, off the path after the routing. When the predecessor wrote
  // it (kAfterWait: norm and routing in one launch), it is staged once the expert's first weights
  // and scales are asked for, its L2 round trip under their DRAM one, with no slot lookup first.
  if constexpr (kGateUp) probe::mark(0, 0);
  const OneRowToken one_row = kGateUp ? p.one_row_token : OneRowToken::kNone;
  int row0_shift = one_row == OneRowToken::kBeforeWait ? stage_token(0, true) : 0;

  // Ordering against the neighbouring grids as moe_decode_kernel's.
  if constexpr (kGateUp) {
    wait_for_predecessor();
    release_dependents();
    probe::mark(0, 1);
  }
  auto routing = [](const int32_t* at) { return kGateUp ? *at : __ldcg(at); };
  const int expert = routing(r.active + blockIdx.y);
  const int begin = routing(r.active_range + 2 * blockIdx.y), count = routing(r.active_range + 2 * blockIdx.y + 1);
  if (expert < 0) return;  // whole block: no barrier is skipped
  if constexpr (kGateUp) probe::mark(0, 2);
  const uint8_t* wa = p.blocks + f16_piece_offset(int64_t(expert) * p.n + row_a, 0, chunks) + t * 16;
  const uint8_t* wb = p.blocks + f16_piece_offset(int64_t(expert) * p.n + row_b, 0, chunks) + t * 16;

  const uint32_t ring_lane = smem_u32(&ring[warp][0][0][lane]);
  // Chunk i of this warp is c = kpart + i * kSplitK, into ring stage `stage`; past the end the
  // copies are zero fills that touch no memory.
  auto issue = [&](int i, int stage) { f16_ring_issue(ring_lane, stage, wa, wb, kpart + i * kSplitK, i < my_chunks, p.blocks); };
  for (int j = 0; j < kStages - 1; ++j) issue(j, j);
  // The loads of a batch are all issued before the first is used: they come from DRAM, and one
  // round trip per load in turn cost microseconds in the whole model's chain. The first batch is
  // issued by every lane (addresses kept inside the row), so that the one-row token, read from L2
  // after the wait (kAfterWait), is staged while it is in flight: stage_token is warp-wide.
  {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(p.scales) + (int64_t(expert) * p.n + min(row0, p.n - 16)) * chunks;
    constexpr int kBatch = 8;
    uint32_t s[kBatch];
    auto load = [&](int first) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = max(min(first + 32 * j, part_words - 1), 0);  // a valid address; the value is unused
        s[j] = __ldg(src + int64_t(i % 16) * chunks + kpart + (i / 16) * kSplitK);
      }
    };
    auto store = [&](int first) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = first + 32 * j;
        if (i < part_words) warp_scales[(i % 16) * warp_chunks + i / 16] = s[j];
      }
    };
    load(lane);
    if (one_row == OneRowToken::kAfterWait) row0_shift = stage_token(0, false);
    if constexpr (kGateUp) probe::mark(0, 5);
    store(lane);
    for (int first = lane + 32 * kBatch; first < part_words; first += 32 * kBatch) {
      load(first);
      store(first);
    }
  }

  const bool ok_a = row0 + g < p.n, ok_b = row0 + g + 8 < p.n;
  const int64_t at_a = int64_t(expert) * p.n + row0 + g, at_b = at_a + 8;
  const float bias_a = ok_a && p.bias ? p.bias[at_a] : 0.0f;
  const float bias_b = ok_b && p.bias ? p.bias[at_b] : 0.0f;
  // down's output slot of its first token: routing, older than the predecessor (as expert above).
  const int64_t first_slot = !kGateUp && count > 0 ? __ldcg(r.sorted_slot + begin) : 0;
  if constexpr (!kGateUp) {
    wait_for_predecessor();
    release_dependents();
  }
  const uint32_t* const sa = warp_scales + g * warp_chunks;
  const uint32_t* const sb = warp_scales + (g + 8) * warp_chunks;
  if constexpr (kGateUp) probe::mark(0, 3);

  for (int token = 0; token < count; ++token) {
    if (token > 0)
      for (int j = 0; j < kStages - 1; ++j) issue(j, j);
    const int shift = token == 0 && one_row != OneRowToken::kNone
                          ? row0_shift
                          : stage_token(kGateUp ? r.sorted_slot[begin + token] / p.top_k : int64_t(begin + token), false);

    // [block parity][row g, row g + 8]: two chains of dependent FFMA instead of one.
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    auto chunk = [&](int i, int stage) {
      issue(i + kStages - 1, (stage + kStages - 1) % kStages);
      cp_async_wait<kStages - 1>();
      const float4 fa = e8m0_word_floats(sa[i]), fb = e8m0_word_floats(sb[i]);
      const float sca[4] = {fa.x, fa.y, fa.z, fa.w}, scb[4] = {fb.x, fb.y, fb.z, fb.w};
      // Word w is block 4c + w; the token's k 32(4c + w) + 8t .. + 7 is piece 4w + t of the chunk.
      f16_chunk_mmas(ring[warp][stage][0][lane], ring[warp][stage][1][lane], warp_token + i * 16 + t,
                     [&](int w, const float (&d)[4]) {
                       // Every column is this token (all lanes loaded it): d[0] row g, d[2] row g + 8.
                       acc[w % 2][0] = fmaf(sca[w], d[0], acc[w % 2][0]);
                       acc[w % 2][1] = fmaf(scb[w], d[2], acc[w % 2][1]);
                     });
    };
    // Unrolled by the ring's depth, so every stage index is a constant.
    for (int i = 0; i < my_chunks; i += kStages) {
#pragma unroll
      for (int s = 0; s < kStages; ++s)
        if (i + s < my_chunks) chunk(i + s, s);
    }
    cp_async_wait<0>();
    if constexpr (kGateUp) probe::mark(0, 4);
    // Back from code · 2^-14 and token · 2^shift; exact (powers of two) unless out of range.
    float ya = ldexpf(acc[0][0] + acc[1][0], 14 - shift), yb = ldexpf(acc[0][1] + acc[1][1], 14 - shift);
    if constexpr (kSplitK > 1) {
      add_split_partials<kSplitK>(ring, warp, kpart, lane, ya, yb);
      __syncthreads();  // the next token's copies reuse the ring
    }
    if (kpart == 0) {
      const float va = ya + bias_a, vb = yb + bias_b;
      if constexpr (kGateUp) {
        // Gate rows are even, up rows odd: row g + 1 lives four lanes up.
        const float up_a = __shfl_down_sync(0xffffffffu, va, 4), up_b = __shfl_down_sync(0xffffffffu, vb, 4);
        if (g % 2 == 0 && t == 0) {
          uint16_t* act = p.act + int64_t(begin + token) * (p.n / 2);
          auto bits = [&](float value) {
            const uint16_t bf16 = to_bf16_bits(value);
            if (p.act_f16_shift < 0) return bf16;
            // bf16 · 2^shift, exact in fp16 for every value within 2^28 of the bound (the scaling
            // down's staging would pick if a part's largest magnitude were the bound).
            const float scaled = __uint_as_float(uint32_t(bf16) << 16) * __uint_as_float(uint32_t(127 + p.act_f16_shift) << 23);
            return __half_as_ushort(__float2half_rn(scaled));
          };
          if (ok_a) act[(row0 + g) / 2] = bits(gated(va, up_a, p.silu, p.limit, p.alpha));
          if (ok_b) act[(row0 + g + 8) / 2] = bits(gated(vb, up_b, p.silu, p.limit, p.alpha));
        }
      } else if (t == 0) {
        const int64_t slot = token == 0 ? first_slot : r.sorted_slot[begin + token];
        if (ok_a) p.out[slot * p.n + row0 + g] = va;
        if (ok_b) p.out[slot * p.n + row0 + g + 8] = vb;
      }
    }
  }
  if constexpr (kGateUp) probe::mark(0, probe::kProbeEnd);
}

}  // namespace anvil::cuda::moe
