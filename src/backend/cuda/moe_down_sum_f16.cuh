#pragma once
// Batch 1's down product with the experts' weighted sum made inside it, for MXFP4 experts and
// four experts per token (gpt-oss): no combine kernel follows.
//
// Why: at batch 1 the combine held ~5.7 us of the chain per layer (4.7 % of the step, session 24)
// for a few kilobytes of work; it is a kernel boundary. The ways of moving the sum tried before
// (a ticket in down's last block, a thread-block cluster, the next products adding a pending sum)
// each made some block wait for others or reread the experts' rows, and cost what they saved.
// Here nothing waits for another block: a warp's 16 mma rows are 4 output rows of each of the 4
// experts (lane group g's rows g and g + 8 are output row g % 4 of experts g / 4 and 2 + g / 4,
// in active order), and the token operand's 8 columns are the experts' activation rows (column c
// is expert c % 4's). D[row of expert e][column e] is then exactly the value moe_decode_f16_kernel
// makes for that row (same A row, same B column, same fp32 accumulation; the other columns are
// dropped), so the warp ends up holding all four experts' values of its 4 output rows and adds
// them into the residual in the combine kernel's order: route slot order, acc += w_j y_j, then
// residual + acc. The result is the combine path's, bit for bit (a GPU test compares them). No
// next norm is made: the caller's next product normalizes its own input (linear_normed).
//
// Otherwise as moe_decode_f16_kernel (whose header says why the FP16 form): k split kSplitK ways,
// a per-warp cp.async ring of 1 KB chunks (each lane 16 bytes of two rows), E8M0 scales on the fp32
// results, 24 warps per SM where shared memory and registers allow. Four tokens instead of one:
// 8-warp blocks share them (a block's warps of one k part read the same part of each token), so
// they fit beside the rings; they are copied with cp.async (one round trip for all four), then
// rescaled into fp16 in place, each part by its own power of two as moe_decode_f16_kernel's.
// Where the activation has a bound (gpt-oss's clamped SwiGLU, ExpertProduct::act_f16_shift),
// gate_up writes them in fp16 already, scaled by the bound's power of two, and the copies are all:
// finding the four parts' largest magnitudes and rewriting them held ~2.5 us of the chain after
// this grid's wait (phase_probe.cuh on an H100, docs/perf/logs/h200/session34).
#include <cuda_fp16.h>

#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_common.cuh"
#include "backend/cuda/moe_decode_f16.cuh"
#include "backend/cuda/mxfp4_common.cuh"
#include "backend/cuda/phase_probe.cuh"

namespace anvil::cuda::moe {

constexpr int kSumExperts = 4;
constexpr int kSumRows = 16 / kSumExperts;  // output rows per warp
constexpr int kSumWarps = 8;                // per block
constexpr int kSumMinBlocks = 3;            // 60 KB each at gpt-oss's shapes; 85 registers
constexpr int kSumWarpsPerSm = kSumWarps * kSumMinBlocks;

// What down adds into (row 0 of each).
struct DownSum {
  float* residual = nullptr;             // [H]
  const float* route_weights = nullptr;  // [k]
  const int32_t* ids = nullptr;          // [k]
  int num_experts = 0;
};

// Dynamic shared memory: per warp and chunk of its k, 16 rows x 4 block scales as floats; per k
// part and chunk, the 4 tokens' 128 values as fp16. Unlike moe_decode_f16_kernel's, the scales are
// widened before they are stored: here the chunks run after the wait, on the chain, and keeping
// E8M0 words measured 0.6-1.0 % slower at batch 1 (H100, docs/perf/logs/h200/session29).
inline size_t down_sum_smem(int k, int split) {
  const size_t chunks = size_t(f16_warp_chunks(k, split));
  return size_t(kSumWarps) * chunks * 256 + size_t(split) * chunks * kSumExperts * 256;
}

template <int kSplitK>
__global__ void __launch_bounds__(kSumWarps * 32, kSumMinBlocks)
    moe_down_sum_f16_kernel(ExpertProduct p, Routing r, DownSum sum) {
  constexpr int kStages = kF16Stages;
  constexpr int kGroups = kSumWarps / kSplitK;  // warps of a block that share a k part
  static_assert(kSumWarps % kSplitK == 0, "k split within a block");
  using namespace gemm;
  using namespace mxfp4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kpart = warp % kSplitK, group = warp / kSplitK;
  const int row0 = (blockIdx.x * kGroups + group) * kSumRows;
  const int chunks = f16_chunks(p.k);
  const int my_chunks = kpart < chunks ? (chunks - kpart + kSplitK - 1) / kSplitK : 0;
  const int warp_chunks = f16_warp_chunks(p.k, kSplitK);
  const int part_words = 16 * my_chunks;  // per chunk: 16 rows of 4 scales, 16 pieces of 8 token values
  // This lane's output row (rows past N read row N - 1, never stored) and its two rows' experts.
  const int out_row = row0 + g % kSumRows;
  const bool row_ok = out_row < p.n;
  const int row = min(out_row, p.n - 1);
  const int ya = g / kSumRows, yb = 2 + g / kSumRows;

  __shared__ uint4 ring[kSumWarps][kStages][2][32];
  extern __shared__ __align__(16) uint8_t sum_smem[];
  // [16 rows][warp_chunks][4 blocks] scales per warp, then per k part [token][warp_chunks][16
  // pieces of 8 values].
  float* const warp_scales = reinterpret_cast<float*>(sum_smem) + warp * warp_chunks * 64;
  uint4* const part_tokens =
      reinterpret_cast<uint4*>(sum_smem + kSumWarps * warp_chunks * 256) + kpart * kSumExperts * warp_chunks * 16;

  // The routing, the route weights and the residual are older than this grid's predecessor
  // (gate_up passed its own wait on the routing before it released this grid, and the residual's
  // last writer is further back), so all of it is read before the wait, through L2 (this SM's L1
  // may hold the previous layer's). Lane y < 4 holds active expert y's id, token row and slot,
  // lane j < 4 slot j's weight; at one row each active expert has one token, its slot's.
  probe::mark(1, 0);
  const int y_lane = lane % kSumExperts;
  int my_expert = __ldcg(r.active + y_lane);
  const int my_begin = __ldcg(r.active_range + 2 * y_lane);
  const int my_slot = my_expert >= 0 ? __ldcg(r.sorted_slot + my_begin) : -1;
  my_expert = max(my_expert, 0);  // an address to stream; a slot of -1 is never added
  const int id = __ldcg(sum.ids + y_lane);
  const float my_weight = id >= 0 && id < sum.num_experts ? __ldcg(sum.route_weights + y_lane) : 0.0f;
  const float old_residual = __ldcg(sum.residual + row);
  const int expert_a = __shfl_sync(0xffffffffu, my_expert, ya), expert_b = __shfl_sync(0xffffffffu, my_expert, yb);

  const uint8_t* wa = p.blocks + f16_piece_offset(int64_t(expert_a) * p.n + row, 0, chunks) + t * 16;
  const uint8_t* wb = p.blocks + f16_piece_offset(int64_t(expert_b) * p.n + row, 0, chunks) + t * 16;
  const uint32_t ring_lane = smem_u32(&ring[warp][0][0][lane]);
  auto issue = [&](int i, int stage) { f16_ring_issue(ring_lane, stage, wa, wb, kpart + i * kSplitK, i < my_chunks, p.blocks); };
  for (int j = 0; j < kStages - 1; ++j) issue(j, j);
  {  // The scales, in batches of loads (each from DRAM), as moe_decode_f16_kernel's. A lane's
     // words are all of row lane % 16 (its words are 32 apart), whose expert is asked for here, by
     // the whole warp: inside the loop, where lanes past part_words drop out, the shuffle hung.
    const uint32_t* src = reinterpret_cast<const uint32_t*>(p.scales);
    const int r16 = lane % 16;
    const int64_t scale_row =
        int64_t(__shfl_sync(0xffffffffu, my_expert, r16 / kSumRows)) * p.n + min(row0 + r16 % kSumRows, p.n - 1);
    constexpr int kBatch = 8;
    for (int first = lane; first < part_words; first += 32 * kBatch) {
      uint32_t s[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = min(first + 32 * j, part_words - 1);  // a valid address; the value is unused
        s[j] = __ldg(src + (i % 16 == r16 ? scale_row : int64_t(0)) * chunks + kpart + (i / 16) * kSplitK);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = first + 32 * j;
        if (i < part_words)
          *reinterpret_cast<float4*>(warp_scales + ((i % 16) * warp_chunks + i / 16) * 4) = e8m0_word_floats(s[j]);
      }
    }
  }
  // Row g's and g + 8's biases (their experts differ).
  const float bias_a = p.bias ? p.bias[int64_t(expert_a) * p.n + row] : 0.0f;
  const float bias_b = p.bias ? p.bias[int64_t(expert_b) * p.n + row] : 0.0f;

  wait_for_predecessor();
  release_dependents();
  probe::mark(1, 1);

  // The four tokens' parts (gate_up's activations, from the predecessor), zeros past K: the warps
  // of a k part copy a share each, in one round trip.
  const uint32_t tokens_at = smem_u32(part_tokens);
  for (int y = 0; y < kSumExperts; ++y) {
    const uint16_t* x = p.a + int64_t(__shfl_sync(0xffffffffu, my_begin, y)) * p.k;
    for (int i = lane + 32 * group; i < part_words; i += 32 * kGroups) {
      const int kk = 128 * (kpart + (i / 16) * kSplitK) + 8 * (i % 16);
      const bool ok = kk < p.k;
      cp_async_16(tokens_at + uint32_t((y * warp_chunks * 16 + i) * 16), ok ? x + kk : p.a, ok);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  probe::mark(1, 2);
  __syncthreads();  // every warp's share of the copies
  // Each part's largest magnitude, found by every warp of the part alike; its power of two as
  // moe_decode_f16_kernel's stage_token. Activations gate_up wrote in fp16 already carry theirs.
  int shift_a = p.act_f16_shift, shift_b = p.act_f16_shift;
  if (p.act_f16_shift < 0) {
    float factor[kSumExperts];
#pragma unroll
    for (int y = 0; y < kSumExperts; ++y) {
      const uint4* token = part_tokens + y * warp_chunks * 16;
      uint32_t largest = 0;  // bf16 magnitudes order as integers
      for (int i = lane; i < part_words; i += 32) {
        const uint4 v = token[i];
        largest = __vmaxu2(largest, __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu),
                                             __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu)));
      }
      largest = __reduce_max_sync(0xffffffffu, max(largest & 0xFFFFu, largest >> 16));
      const int shift = min(141 - int(largest >> 7), 127);
      shift_a = ya == y ? shift : shift_a;
      shift_b = yb == y ? shift : shift_b;
      factor[y] = ldexpf(1.0f, shift);
    }
    __syncthreads();  // every warp has read the bf16 values
    probe::mark(1, 3);
    for (int y = 0; y < kSumExperts; ++y) {
      uint4* token = part_tokens + y * warp_chunks * 16;
      for (int i = lane + 32 * group; i < part_words; i += 32 * kGroups) token[i] = bf16x8_to_scaled_f16(token[i], factor[y]);
    }
    __syncthreads();  // the fp16 tokens, for every warp
  }
  probe::mark(1, 4);

  const float* const sa = warp_scales + g * warp_chunks * 4;
  const float* const sb = warp_scales + (g + 8) * warp_chunks * 4;
  // Lane group g feeds column g of the token operand: expert g % 4's activations.
  const uint4* const my_token = part_tokens + (g % kSumExperts) * warp_chunks * 16 + t;
  // [block parity][row g, row g + 8]: row g's value is column ya of its d, row g + 8's column yb
  // (lane quad t holds columns 2t and 2t + 1, so row g's lands in quad 0, row g + 8's in quad 1).
  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  auto chunk = [&](int i, int stage) {
    issue(i + kStages - 1, (stage + kStages - 1) % kStages);
    cp_async_wait<kStages - 1>();
    const float4 fa = *reinterpret_cast<const float4*>(sa + 4 * i);
    const float4 fb = *reinterpret_cast<const float4*>(sb + 4 * i);
    const float sca[4] = {fa.x, fa.y, fa.z, fa.w}, scb[4] = {fb.x, fb.y, fb.z, fb.w};
    f16_chunk_mmas(ring[warp][stage][0][lane], ring[warp][stage][1][lane], my_token + i * 16,
                   [&](int w, const float (&d)[4]) {
                     acc[w % 2][0] = fmaf(sca[w], ya == 0 ? d[0] : d[1], acc[w % 2][0]);
                     acc[w % 2][1] = fmaf(scb[w], yb == 2 ? d[2] : d[3], acc[w % 2][1]);
                   });
  };
  for (int i = 0; i < my_chunks; i += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s)
      if (i + s < my_chunks) chunk(i + s, s);
  }
  cp_async_wait<0>();
  probe::mark(1, 5);
  float va = ldexpf(acc[0][0] + acc[1][0], 14 - shift_a);
  float vb = ldexpf(acc[0][1] + acc[1][1], 14 - shift_b);
  if constexpr (kSplitK > 1) add_split_partials<kSplitK>(ring, warp, kpart, lane, va, vb);
  if (kpart != 0) return;
  va += bias_a;
  vb += bias_b;
  // Output row i's four values: experts 0 and 1 at lanes (g = i, 4 + i; t = 0) as va, experts 2
  // and 3 at lanes (g = i, 4 + i; t = 1) as vb. Lane 4i gathers them and adds row i.
  const int i_row = (lane / 4) % kSumRows;
  float value[kSumExperts];
  value[0] = __shfl_sync(0xffffffffu, va, 4 * i_row);
  value[1] = __shfl_sync(0xffffffffu, va, 4 * (kSumRows + i_row));
  value[2] = __shfl_sync(0xffffffffu, vb, 4 * i_row + 1);
  value[3] = __shfl_sync(0xffffffffu, vb, 4 * (kSumRows + i_row) + 1);
  int slot[kSumExperts];
  float weight[kSumExperts];
#pragma unroll
  for (int y = 0; y < kSumExperts; ++y) {
    slot[y] = __shfl_sync(0xffffffffu, my_slot, y);
    weight[y] = __shfl_sync(0xffffffffu, my_weight, y);
  }
  probe::mark(1, probe::kProbeEnd);
  if (lane % 4 != 0 || lane / 4 >= kSumRows || !row_ok) return;
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < kSumExperts; ++j) {
    const float w = weight[j];
    if (w == 0.0f) continue;  // as the combine: also skips slots with bad ids
    float v = 0.0f;
#pragma unroll
    for (int y = 0; y < kSumExperts; ++y) v = slot[y] == j ? value[y] : v;
    total += w * v;
  }
  sum.residual[row] = old_residual + total;
}

}  // namespace anvil::cuda::moe
