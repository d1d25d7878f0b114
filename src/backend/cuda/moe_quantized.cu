// gpt-oss's mixture of experts with quantized weights: MXFP4 (as checkpoints ship), NVFP4 or FP8
// (--quantize-experts). NVFP4 and FP8 share one k order (the FP4 codes' per-word device layout,
// fp8_layout.h's expert layout for FP8); MXFP4 has its own layout (mxfp4_f16_layout.h, made for
// the batch-1 kernel), which the same kernels read through their Kind.
//
// One call = route (sort the (token, j) slots by expert on the device, no host round trip) →
// expert products → weighted combine into the residual. Two product paths:
// - decode (few tokens per expert): moe_decode.cuh, each active expert's weights streamed once
//   for all of its tokens, SwiGLU fused into the gate_up kernel; MXFP4 at one row takes
//   moe_decode_f16.cuh instead;
// - prefill (many): moe_gemm.cuh, a grouped tensor-core GEMM over expert-sorted row tiles with
//   the weights decoded in registers, SwiGLU fused into its epilogue.
// The combine adds each token's k contributions in slot order, so the result is deterministic.
// Launch shapes depend only on (m, k) and the weights, and the only memory used is the caller's
// workspace, so the whole call can be captured in a CUDA graph.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_decode_f16.cuh"
#include "backend/cuda/moe_down_sum_f16.cuh"
#include "backend/cuda/moe_gemm.cuh"
#include "backend/cuda/moe_common.cuh"
#include "backend/cuda/moe_norm_route.cuh"
#include "backend/cuda/moe_picks.cuh"
#include "backend/cuda/mxfp4_f16_layout.h"
#include "backend/cuda/ops.h"

namespace anvil::cuda {

namespace {

using namespace moe;

[[noreturn]] void invalid(const char* what) { throw_cuda_error(what, int(cudaErrorInvalidValue), __FILE__, __LINE__); }

// ---- routing: top-k + softmax ----

// One warp per row (moe_picks.cuh).
constexpr int kTopkWarps = 8;

// One row's picks by the calling warp, written to ids / weights.
__device__ void topk_softmax_row(const float* __restrict__ logits, int64_t row, int num_experts, int k,
                                 int32_t* __restrict__ ids, float* __restrict__ weights) {
  const WarpPick mine = pick_experts(logits + row * num_experts, num_experts, k);
  const int lane = threadIdx.x % 32;
  if (lane < k) {
    ids[row * k + lane] = mine.expert;
    weights[row * k + lane] = mine.weight;
  }
}

__global__ void __launch_bounds__(kTopkWarps * 32)
    moe_topk_softmax_kernel(const float* __restrict__ logits, int64_t m, int num_experts, int k,
                            int32_t* __restrict__ ids, float* __restrict__ weights) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = int64_t(blockIdx.x) * kTopkWarps + threadIdx.x / 32;
  if (row < m) topk_softmax_row(logits, row, num_experts, k, ids, weights);  // whole warps
}

// ---- routing: sort slots by expert ----

// Up to this many rows the routing kernel picks the experts itself (moe_quantized's
// router_logits): 8 warps take two rows each at most, cheaper than a kernel of its own.
constexpr int64_t kTopkInRouteRows = 16;

// One block. Warp w owns a contiguous segment of the slots; pass 1 counts per (warp, expert),
// a scan turns the counts into each warp's first position inside each expert, pass 2 places the
// slots. Positions are thus ordered by slot within an expert (stable, deterministic). Thread e
// also writes expert e's GEMM row tiles (tile_rows > 0) and its place in the active list.
// kRouteWarps: 8 for few slots (a small block starts and syncs faster: 3 us vs 6 us at batch 1),
// 32 for prefill (each warp's serial pass is 4x shorter).
// With logits (few rows, see kTopkInRouteRows), the block first makes ids and weights itself, a
// warp per row as moe_topk_softmax does: one kernel fewer in the chain at decode.
template <int kRouteWarps>
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_kernel(int32_t* ids, int slots, int num_experts, int tile_rows, Routing r,
                     const float* __restrict__ logits, int k, float* __restrict__ route_weights) {
  wait_for_predecessor();
  release_dependents();
  if (logits != nullptr) {
    for (int row = threadIdx.x / 32; row < slots / k; row += kRouteWarps)
      topk_softmax_row(logits, row, num_experts, k, ids, route_weights);
    __syncthreads();  // the block's global writes are visible to the whole block after it
  }
  constexpr int kRouteThreads = kRouteWarps * 32;
  static_assert(kRouteThreads >= kMaxExperts, "one thread per expert in the scan");
  __shared__ int cursor[kRouteWarps][kMaxExperts];
  __shared__ int warp_sums[3][kRouteWarps];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < kRouteWarps * kMaxExperts; i += kRouteThreads) cursor[i / kMaxExperts][i % kMaxExperts] = 0;
  __syncthreads();

  const int per_warp = ((slots + kRouteWarps - 1) / kRouteWarps + 31) / 32 * 32;
  const int seg_begin = min(slots, warp * per_warp), seg_end = min(slots, seg_begin + per_warp);
  auto expert_of = [&](int slot) {
    if (slot >= seg_end) return -1;
    const int e = ids[slot];
    return e >= 0 && e < num_experts ? e : -1;  // out-of-range ids are dropped, never indexed
  };
  for (int base = seg_begin; base < seg_end; base += 32) {
    const int e = expert_of(base + lane);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) cursor[warp][e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();

  int total = 0;
  if (tid < num_experts) {
    for (int w = 0; w < kRouteWarps; ++w) {
      const int c = cursor[w][tid];
      cursor[w][tid] = total;
      total += c;
    }
  }
  const int tiles = tile_rows > 0 ? (total + tile_rows - 1) / tile_rows : 0;
  const int active = total > 0 ? 1 : 0;
  // Block-wide exclusive scans of (total, tiles, active) over experts.
  int inc[3] = {total, tiles, active};
  for (int offset = 1; offset < 32; offset *= 2) {
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int v = __shfl_up_sync(0xffffffffu, inc[i], offset);
      if (lane >= offset) inc[i] += v;
    }
  }
  if (lane == 31) {
#pragma unroll
    for (int i = 0; i < 3; ++i) warp_sums[i][warp] = inc[i];
  }
  __syncthreads();
  int before[3] = {0, 0, 0}, grand[3] = {0, 0, 0};
  for (int w = 0; w < kRouteWarps; ++w) {
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      if (w < warp) before[i] += warp_sums[i][w];
      grand[i] += warp_sums[i][w];
    }
  }
  const int offset = before[0] + inc[0] - total;
  const int first_tile = before[1] + inc[1] - tiles;
  const int active_index = before[2] + inc[2] - active;
  if (tid < num_experts) {
    r.offsets[tid] = offset;
    if (tid == num_experts - 1) r.offsets[num_experts] = offset + total;
    if (active) {
      r.active[active_index] = tid;
      r.active_range[2 * active_index] = offset;
      r.active_range[2 * active_index + 1] = total;
    }
    // Past the active experts: -1, so a decode block learns it has no expert from one load.
    if (tid >= grand[2]) r.active[tid] = -1;
    for (int i = 0; i < tiles; ++i) {
      r.tile_expert[first_tile + i] = tid;
      r.tile_row[first_tile + i] = offset + i * tile_rows;
    }
    for (int w = 0; w < kRouteWarps; ++w) cursor[w][tid] += offset;
  }
  if (tid == 0) {
    r.header[kTotalSlots] = grand[0];
    r.header[kNumTiles] = grand[1];
    r.header[kNumActive] = grand[2];
  }
  __syncthreads();

  const unsigned lower_lanes = (1u << lane) - 1u;
  for (int base = seg_begin; base < seg_end; base += 32) {
    const int e = expert_of(base + lane);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0) r.sorted_slot[cursor[warp][e] + __popc(peers & lower_lanes)] = base + lane;
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) cursor[warp][e] += __popc(peers);
    __syncwarp();
  }
}

// One row from its logits (a batch-1 decode step), by one warp, with no counting, scan or barrier
// (write_one_row_routing). Measured on an H200 (gpt-oss-20b, batch 1): 2.2 us of the chain per
// layer against 3.7 for moe_route_kernel<8> (docs/perf/logs/h200/routing-one-row/). The expert
// kernels still read tables: making the picks in every gate_up / down warp instead, with no
// routing kernel, was slower (same folder).
__global__ void __launch_bounds__(32)
    moe_route_one_row_kernel(const float* __restrict__ logits, int num_experts, int k, Routing r,
                             int32_t* __restrict__ ids, float* __restrict__ route_weights) {
  wait_for_predecessor();
  release_dependents();
  write_one_row_routing(pick_experts(logits, num_experts, k), num_experts, k, r, ids, route_weights);
}

// ---- combine ----

// residual[row] += Σ_j weight[row, j] · y[row * k + j], j in order; y already holds the down bias.
// One block per row; the row's ids and weights are read once into shared memory, so each thread
// then has a single round of independent loads (batch 1 is latency, not bandwidth). With
// norm_out, the block then RMS-normalizes the finished row into norm_out (the next layer's
// input), from the values it just wrote: one launch and one read of the row fewer per layer.
__global__ void __launch_bounds__(1024)
    moe_combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ ids,
                       const float* __restrict__ route_weights, int k, int num_experts, int hidden,
                       float* __restrict__ residual, const float* __restrict__ norm_weight, float eps,
                       uint16_t* __restrict__ norm_out) {
  // Only y comes from the predecessor (down). The ids and route weights (the top-k, four kernels
  // back) and the residual (the attention's output projection) are older: they are read before
  // the wait, through L2 (ld.cg), since this SM's L1 may hold the previous layer's ids. (The
  // release still comes after the wait, so no more than two grids are ever in flight.)
  __shared__ float weight[32];  // k <= 32 is checked by the launcher; invalid ids weigh 0
  __shared__ float warp_sums[32];
  const int64_t row = blockIdx.x;
  if (threadIdx.x < k) {
    const int e = __ldcg(ids + row * k + threadIdx.x);
    weight[threadIdx.x] = e >= 0 && e < num_experts ? __ldcg(route_weights + row * k + threadIdx.x) : 0.0f;
  }
  const int first = threadIdx.x * 4;
  const float4 first_residual = first < hidden ? __ldcg(reinterpret_cast<const float4*>(residual + row * hidden + first))
                                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // The next norm's weights too (constant, in DRAM by now): at the end they were one more round
  // trip on the chain's path.
  const float4 first_norm_weight = norm_weight != nullptr && first < hidden
                                       ? __ldg(reinterpret_cast<const float4*>(norm_weight + first))
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  wait_for_predecessor();
  release_dependents();
  __syncthreads();
  float squares = 0.0f;
  for (int i = first; i < hidden; i += blockDim.x * 4) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float w = weight[j];
      if (w == 0.0f) continue;  // also skips slots that were never computed (bad ids)
      const float4 v = *reinterpret_cast<const float4*>(y + (row * k + j) * hidden + i);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    float4* dst = reinterpret_cast<float4*>(residual + row * hidden + i);
    float4 value = i == first ? first_residual : *dst;
    value.x += acc.x;
    value.y += acc.y;
    value.z += acc.z;
    value.w += acc.w;
    *dst = value;
    squares += value.x * value.x + value.y * value.y + value.z * value.z + value.w * value.w;
  }
  if (norm_out == nullptr) return;  // uniform over the block
  for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_sums[warp] = squares;
  __syncthreads();
  float total = lane < warps ? warp_sums[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  const float inv = rsqrtf(total / float(hidden) + eps);
  // Each thread rereads only the values it stored itself.
  for (int i = threadIdx.x * 4; i < hidden; i += blockDim.x * 4) {
    const float4 value = *reinterpret_cast<const float4*>(residual + row * hidden + i);
    const float4 w = i == first ? first_norm_weight : *reinterpret_cast<const float4*>(norm_weight + i);
    uint16_t* out = norm_out + row * hidden + i;
    out[0] = mxfp4::to_bf16_bits(value.x * inv * w.x);
    out[1] = mxfp4::to_bf16_bits(value.y * inv * w.y);
    out[2] = mxfp4::to_bf16_bits(value.z * inv * w.z);
    out[3] = mxfp4::to_bf16_bits(value.w * inv * w.w);
  }
}

// ---- the device layout of the codes ----

__global__ void mxfp4_pack_codes_kernel(uint32_t* __restrict__ words, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    words[i] = mxfp4::pack_codes_word(words[i]);
}

// One thread per output word of a row (and, for a row's first chunks words, its scale word).
__global__ void mxfp4_lay_out_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                     int64_t rows, int k, uint32_t* __restrict__ out_codes,
                                     uint32_t* __restrict__ out_scales) {
  const int chunks = mxfp4::f16_chunks(k), words_per_row = 16 * chunks, blocks = k / 32;
  const int64_t total = rows * words_per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / words_per_row;
    const int within = int(i % words_per_row);  // word 4 * (4c + t) + w of the row: its chunk c's 16t + 4w
    const int c = within / 16, t = (within / 4) % 4, block = 4 * c + within % 4;
    out_codes[(mxfp4::f16_piece_offset(row, c, chunks) + 16 * t + 4 * (within % 4)) / 4] =
        block < blocks ? mxfp4::pack_word_f16(codes + row * (k / 2), block, t) : 0u;
    if (within < chunks) {
      uint32_t word = 0;
      for (int j = 0; j < 4; ++j)
        if (4 * within + j < blocks) word |= uint32_t(scales[row * blocks + 4 * within + j]) << (8 * j);
      out_scales[row * chunks + within] = word;
    }
  }
}

// ---- workspace ----

struct Layout {
  size_t header = 0, offsets = 0, active = 0, active_range = 0, sorted = 0, tile_expert = 0, tile_row = 0;
  size_t x_perm = 0, act = 0, y = 0, total = 0;
  int64_t max_tiles = 0;
};

// Row tiles of the prefill GEMM are never smaller than this, which bounds the tile list.
constexpr int kMinTileRows = 64;

Layout layout_for(int64_t rows, int k, int64_t experts, int64_t hidden, int64_t intermediate) {
  Layout l;
  const int64_t slots = rows * k;
  // Σ_e ceil(count_e / T) <= (slots + active * (T - 1)) / T, active <= min(E, slots).
  l.max_tiles = (slots + std::min(experts, slots) * (kMinTileRows - 1)) / kMinTileRows + 1;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += (bytes + 255) / 256 * 256;
    return here;
  };
  l.header = take(kHeaderInts * 4);
  l.offsets = take(size_t(experts + 1) * 4);
  l.active = take(size_t(experts) * 4);
  l.active_range = take(size_t(experts) * 8);
  l.sorted = take(size_t(slots) * 4);
  l.tile_expert = take(size_t(l.max_tiles) * 4);
  l.tile_row = take(size_t(l.max_tiles) * 4);
  l.x_perm = take(size_t(slots) * size_t(hidden) * 2);
  l.act = take(size_t(slots) * size_t(intermediate) * 2);
  l.y = take(size_t(slots) * size_t(hidden) * 4);
  l.total = at;
  return l;
}

// ---- launches ----

// How many ways a decode launch splits k: as far as its warps still fit on the GPU at once
// (batch 1 has four experts, too few to keep the memory busy otherwise).
int decode_split(const ExpertProduct& p, int active_bound, int warps_per_sm) {
  const int64_t warps = ceil_div(p.n, 16) * active_bound;
  const int64_t resident = int64_t(warps_per_sm) * current_multiprocessors();
  return 2 * warps > resident ? 1 : 4 * warps > resident ? 2 : 4;
}

// One decode grid: kDecodeWarps warps per block over 16-row tiles (split ways in k), one block row
// per active expert. Dynamic shared memory past the default 48 KB (with the static) takes the opt-in.
template <typename Kernel>
void launch_decode_grid(Kernel kernel, int split, size_t smem, size_t static_smem, const ExpertProduct& p,
                        const Routing& r, int active_bound, cudaStream_t stream) {
  if (smem + static_smem > 48 * 1024) {
    if (smem > 160 * 1024) invalid("moe_quantized: hidden / intermediate too large for the decode path");
    ANVIL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  const dim3 grid(unsigned(ceil_div(p.n, 16 * kDecodeWarps / split)), unsigned(active_bound));
  launch_chained(kernel, grid, kDecodeWarps * 32, smem, stream, p, r);
  ANVIL_CUDA_LAUNCHED();
}

template <int kTokenTiles, int kSplitK, bool kGateUp, Kind kKind>
void launch_decode_split(const ExpertProduct& p, const Routing& r, int active_bound, cudaStream_t stream) {
  // The per-warp scale tables (16 rows of scale bytes each; FP8 and bf16 have none).
  const size_t smem = kKind == Kind::Fp8 || kKind == Kind::Bf16
                          ? 0
                          : size_t(kDecodeWarps) * 16 *
                                size_t(kKind == Kind::Nvfp4 ? p.k / 16 : mxfp4::f16_scale_row_bytes(p.k));
  constexpr size_t kStatic = size_t(kDecodeWarps) * kDecodeStages * 2 * 32 * 16 +
                             size_t(kSplitK > 1 ? kDecodeWarps : 1) * kTokenTiles * 32 * 16;
  launch_decode_grid(moe_decode_kernel<kTokenTiles, kSplitK, kGateUp, kKind>, kSplitK, smem, kStatic, p, r,
                     active_bound, stream);
}

template <int kTokenTiles, bool kGateUp, Kind kKind>
void launch_decode(const ExpertProduct& p, const Routing& r, int active_bound, cudaStream_t stream) {
  switch (decode_split(p, active_bound, kDecodeWarpsPerSm<kTokenTiles>)) {
    case 1: return launch_decode_split<kTokenTiles, 1, kGateUp, kKind>(p, r, active_bound, stream);
    case 2: return launch_decode_split<kTokenTiles, 2, kGateUp, kKind>(p, r, active_bound, stream);
    default: return launch_decode_split<kTokenTiles, 4, kGateUp, kKind>(p, r, active_bound, stream);
  }
}

template <int kSplitK, bool kGateUp>
void launch_decode_f16_split(const ExpertProduct& p, const Routing& r, int active_bound, cudaStream_t stream) {
  constexpr size_t kStatic = size_t(kDecodeWarps) * kF16Stages * 2 * 32 * 16;
  launch_decode_grid(moe_decode_f16_kernel<kSplitK, kGateUp>, kSplitK, f16_decode_smem(p.k, kSplitK), kStatic, p, r,
                     active_bound, stream);
}

template <bool kGateUp>
void launch_decode_f16(const ExpertProduct& p, const Routing& r, int active_bound, cudaStream_t stream) {
  switch (decode_split(p, active_bound, kF16WarpsPerSm)) {
    case 1: return launch_decode_f16_split<1, kGateUp>(p, r, active_bound, stream);
    case 2: return launch_decode_f16_split<2, kGateUp>(p, r, active_bound, stream);
    default: return launch_decode_f16_split<4, kGateUp>(p, r, active_bound, stream);
  }
}

template <int kSplitK>
void launch_down_sum_split(const ExpertProduct& p, const Routing& r, const DownSum& sum, cudaStream_t stream) {
  constexpr auto kernel = moe_down_sum_f16_kernel<kSplitK>;
  constexpr size_t kStatic = size_t(kSumWarps) * kF16Stages * 2 * 32 * 16;
  const size_t smem = down_sum_smem(p.k, kSplitK);
  if (smem + kStatic > 48 * 1024) {
    if (smem > 160 * 1024) invalid("moe_quantized: intermediate too large for the decode path");
    ANVIL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  const unsigned blocks = unsigned(ceil_div(p.n, kSumRows * kSumWarps / kSplitK));
  launch_chained(kernel, blocks, kSumWarps * 32, smem, stream, p, r, sum);
  ANVIL_CUDA_LAUNCHED();
}

// The k split as the other decode grids choose it: a warp here streams 16 rows (4 of each of the
// 4 experts), as many as a moe_decode_f16_kernel warp of one expert does.
void launch_down_sum(const ExpertProduct& p, const Routing& r, const DownSum& sum, cudaStream_t stream) {
  probe::dump_at_exit();
  switch (decode_split(p, kSumExperts, kSumWarpsPerSm)) {
    case 1: return launch_down_sum_split<1>(p, r, sum, stream);
    case 2: return launch_down_sum_split<2>(p, r, sum, stream);
    default: return launch_down_sum_split<4>(p, r, sum, stream);
  }
}

template <bool kGateUp, Kind kKind>
void launch_decode_tokens(int64_t m, int64_t experts, const ExpertProduct& p, const Routing& r, int active_bound,
                          cudaStream_t stream) {
  // An expert gets at most m tokens (a row picks distinct experts); with many experts it
  // typically gets about m * k / E. A pass covers 8 * kTokenTiles tokens and busier experts take
  // further passes (their weight slice is then re-read, mostly from L2), so the width follows
  // twice the mean rather than the worst case: a wider pass costs registers, occupancy and the
  // token prefetch (kDecodePrefetchX) for every expert.
  const int64_t expect = std::min<int64_t>(m, ceil_div(2 * m * p.top_k, experts));
  // One row (batch 1): MXFP4's FP16 form (moe_decode_f16.cuh). Not for more rows: it takes an
  // expert's tokens one pass each, which at batch 8 ran 1.3-1.6x slower than one pass of this
  // kernel for all of them (docs/perf/gpu.md, session 19).
  if constexpr (kKind == Kind::Mxfp4)
    if (m == 1) return launch_decode_f16<kGateUp>(p, r, active_bound, stream);
  if (expect <= 8) return launch_decode<1, kGateUp, kKind>(p, r, active_bound, stream);
  if (expect <= 16) return launch_decode<2, kGateUp, kKind>(p, r, active_bound, stream);
  launch_decode<4, kGateUp, kKind>(p, r, active_bound, stream);
}

// 8 warps side by side along N (each decodes a distinct 16-row weight slice: no duplicated
// decode work), 3 stages, 2 blocks per SM where shared memory allows. Measured on an H200 at
// m = 2048 against 2x4 warps and 4 stages: 1.68 ms vs 2.26 ms for the gpt-oss-20b layer.
template <int kBM>
using MoeGemm = MoeGemmConfig<kBM, 1, 8, 3, 2>;

template <int kBM, bool kGateUp, Kind kKind>
void launch_gemm(const ExpertProduct& p, const Routing& r, int64_t max_tiles, cudaStream_t stream) {
  using Cfg = MoeGemm<kBM>;
  constexpr auto kernel = moe_gemm_kernel<Cfg, kGateUp, kKind>;
  // The grant covers every K up to kMoeGemmMaxK, so one serves every call.
  allow_smem<kernel>(MoeGemm<128>::smem_bytes(kMoeGemmMaxK, kKind));
  const dim3 grid(unsigned(max_tiles), unsigned(ceil_div(p.n, Cfg::kBN)));
  launch_chained(kernel, grid, Cfg::kThreads, Cfg::smem_bytes(p.k, kKind), stream, p, r);
  ANVIL_CUDA_LAUNCHED();
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

void mxfp4_pack_codes(uint8_t* codes, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (bytes % 4 != 0 || reinterpret_cast<uintptr_t>(codes) % 4 != 0)
    invalid("mxfp4_pack_codes: codes must be whole, 4-byte aligned 32-bit words");
  const int64_t count = int64_t(bytes / 4);
  mxfp4_pack_codes_kernel<<<grid_stride_blocks(count), 256, 0, as_stream(stream)>>>(reinterpret_cast<uint32_t*>(codes),
                                                                                    count);
  ANVIL_CUDA_LAUNCHED();
}

void mxfp4_lay_out(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t in_features,
                   uint8_t* device_codes, uint8_t* device_scales, Stream stream) {
  if (rows < 0 || in_features < 32 || in_features % 32 != 0 || in_features > INT32_MAX / 2)
    invalid("mxfp4_lay_out: K must be a positive multiple of 32");
  if (rows % mxfp4::kF16TileRows != 0) invalid("mxfp4_lay_out: rows must be a multiple of 16 (whole tiles)");
  if (rows == 0) return;
  if (!codes || !scales || !device_codes || !device_scales) invalid("mxfp4_lay_out: null pointer");
  if (reinterpret_cast<uintptr_t>(device_codes) % 4 != 0 || reinterpret_cast<uintptr_t>(device_scales) % 4 != 0)
    invalid("mxfp4_lay_out: the device layout's codes and scales must be 4-byte aligned");
  const int64_t words = rows * (mxfp4_device_row_bytes(in_features) / 4);
  mxfp4_lay_out_kernel<<<grid_stride_blocks(words), 256, 0, as_stream(stream)>>>(
      codes, scales, rows, int(in_features), reinterpret_cast<uint32_t*>(device_codes),
      reinterpret_cast<uint32_t*>(device_scales));
  ANVIL_CUDA_LAUNCHED();
}

void moe_topk_softmax(const float* logits, int64_t m, int64_t num_experts, int k, int32_t* ids, float* weights,
                      Stream stream) {
  if (m < 0 || num_experts < 1 || num_experts > kMaxExperts) invalid("moe_topk_softmax: 1..256 experts");
  if (k < 1 || k > 32 || k > num_experts) invalid("moe_topk_softmax: k must be in 1..min(32, experts)");
  if (m == 0) return;
  const int64_t blocks = ceil_div(m, kTopkWarps);
  if (blocks > INT32_MAX) invalid("moe_topk_softmax: too many rows");
  launch_chained(moe_topk_softmax_kernel, unsigned(blocks), kTopkWarps * 32, 0, as_stream(stream), logits, m,
                 int(num_experts), k, ids, weights);
  ANVIL_CUDA_LAUNCHED();
}

size_t moe_quantized_workspace_bytes(int64_t max_rows, int k, int64_t num_experts, int64_t hidden, int64_t intermediate) {
  if (max_rows < 0 || k < 1 || num_experts < 1 || hidden < 1 || intermediate < 1)
    invalid("moe_quantized_workspace_bytes: bad shape");
  return layout_for(max_rows, k, num_experts, hidden, intermediate).total;
}

namespace {

// The power of two that batch 1's gate_up scales its fp16 activations by (ExpertProduct::
// act_f16_shift), or -1 for bf16 activations: for gpt-oss's clamped SwiGLU every activation is
// below limit · (limit + 1) in magnitude (gate <= limit, so gate · sigmoid(alpha · gate) < limit,
// and |up + 1| <= limit + 1), and the shift is the one down's staging picks for a part whose
// largest magnitude is that bound: it puts the bound in [2^14, 2^15), so every value within 2^28
// of it is exact in fp16. Down's values are then the bf16 staging's bit for bit wherever that
// staging's own scaling keeps them exact too (CudaMoe.SumInDownEqualsTheCombine).
int act_f16_shift(const ExpertProduct& gate_up) {
  if (gate_up.silu || !(gate_up.limit >= 1.0f && gate_up.limit <= 15.0f)) return -1;
  const float bound = gate_up.limit * (gate_up.limit + 1.0f);
  uint32_t bits = 0;
  std::memcpy(&bits, &bound, 4);
  const int exponent = int((bits >> 23) & 0xFFu);  // bf16's exponent field is float's
  return std::min(141 - exponent, 127);
}

// Batch 1 of MXFP4 experts, four per token, picked here (so four distinct valid experts: the
// kernel takes one token per active expert), where the caller can make the next norm itself:
// down adds the experts' sum into the residual (moe_down_sum_f16.cuh) and no combine runs.
bool takes_sum_in_down(const QuantizedExperts& w, int64_t m, int k, bool picks_here, const NextNorm* next_norm) {
  return m == 1 && k == kSumExperts && w.format == ExpertFormat::MXFP4 && picks_here && next_norm != nullptr &&
         next_norm->may_defer && !moe_quantized_takes_gemm(m, k, w.num_experts, w.hidden, w.intermediate) &&
         current_device_runs(kMoeBatch1SumOp, kMoeBatch1SumInDown);
}

// Whether the one-launch routing runs as a cluster of 16 blocks (SM90's non-portable size) rather
// than 8: where an 8-block cluster's share of the router would take more than 64 KB a block
// (gpt-oss-120b's 128 experts: 92 KB, which may not fit beside the output projection's blocks;
// with 16 blocks its batch 1 measured +0.4 % and +0.5-0.9 % on H100s, sessions 31-32, while 20b's
// 23 KB ran level), the experts split evenly and the GPU can place such a cluster with this kernel's
// shared memory. ANVIL_ROUTE_CLUSTER=8 or =16 at start picks one size wherever it can run (A/B).
bool wide_route_cluster(int64_t experts, int64_t hidden, dim3 threads) {
  static const int asked = [] {
    const char* v = std::getenv("ANVIL_ROUTE_CLUSTER");
    return v == nullptr ? 0 : std::string(v) == "16" ? 16 : std::string(v) == "8" ? 8 : 0;
  }();
  const bool large_share = experts / kRouteCluster * hidden * 2 > 64 * 1024;
  if (asked == 8 || (asked == 0 && !large_share)) return false;
  if (experts % kRouteWideCluster != 0 || experts / kRouteWideCluster > kRouteBlockExperts) return false;
  constexpr auto kKernel = moe_norm_route_one_row_kernel<kRouteWideCluster>;
  static std::mutex mutex;
  static std::map<int, bool> placeable;  // per device
  int device = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto known = placeable.find(device);
  if (known != placeable.end()) return known->second;
  const size_t most = norm_route_smem_bytes(kRouteBlockExperts, kRouteMaxDim);
  ANVIL_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)));
  bool ok = cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  if (ok) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kRouteWideCluster);
    config.blockDim = threads;
    config.dynamicSmemBytes = most;  // any shape's, so one answer per device serves every call
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {unsigned(kRouteWideCluster), 1, 1};
    config.attrs = &cluster;
    config.numAttrs = 1;
    int clusters = 0;
    ok = cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) == cudaSuccess && clusters > 0;
  }
  (void)cudaGetLastError();  // a refused size is an answer here, not a sticky error
  placeable[device] = ok;
  return ok;
}

// router_logits null: ids and route_weights are the caller's routing, only read. Otherwise they
// are written here first (moe_quantized_from_logits). fused: the norm, router and picks are made
// here too, in one launch (moe_routes_in_one_launch said so; router_logits is then unused).
bool moe_quantized_impl(const QuantizedExperts& w, const uint16_t* h, int64_t m, int k, const float* router_logits,
                        int32_t* ids, float* route_weights, float* residual, void* workspace, size_t workspace_bytes,
                        Stream stream, const NextNorm* next_norm, const MoeRouterInput* fused = nullptr) {
  const int64_t E = w.num_experts, H = w.hidden, I = w.intermediate;
  if (E < 1 || E > kMaxExperts) invalid("moe_quantized: 1..256 experts");
  if (H < 32 || I < 32 || H % 32 != 0 || I % 32 != 0) invalid("moe_quantized: hidden and intermediate must be multiples of 32");
  if (k < 1 || k > E || k > 32) invalid("moe_quantized: k must be in 1..min(32, experts)");
  if (m < 0) invalid("moe_quantized: negative rows");
  if (m == 0) return false;
  if (m * k > INT32_MAX / 2 || 2 * I * E > INT32_MAX || H * E > INT32_MAX) invalid("moe_quantized: shape too large");
  const bool block_scaled = w.format == ExpertFormat::MXFP4 || w.format == ExpertFormat::NVFP4;
  const bool row_scaled = w.format == ExpertFormat::NVFP4 || w.format == ExpertFormat::FP8;
  if (!w.gate_up_blocks || (block_scaled && !w.gate_up_scales) || !w.down_blocks || (block_scaled && !w.down_scales) ||
      !h || !ids ||
      !route_weights || !residual || !workspace || (row_scaled && (!w.gate_up_row_scales || !w.down_row_scales)))
    invalid("moe_quantized: null pointer");
  if (!aligned16(w.gate_up_blocks) || !aligned16(w.down_blocks) || !aligned16(h) || !aligned16(residual) ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    invalid("moe_quantized: weights, h, residual and workspace must be 16-byte aligned (workspace 256)");
  if (w.format == ExpertFormat::MXFP4 && (reinterpret_cast<uintptr_t>(w.gate_up_scales) % 4 != 0 ||
                                          reinterpret_cast<uintptr_t>(w.down_scales) % 4 != 0))
    invalid("moe_quantized: MXFP4 scales must be 4-byte aligned (mxfp4_lay_out's layout)");
  const Layout l = layout_for(m, k, E, H, I);
  if (workspace_bytes < l.total) invalid("moe_quantized: workspace too small for m rows (see moe_quantized_workspace_bytes)");

  const cudaStream_t s = as_stream(stream);
  uint8_t* base = static_cast<uint8_t*>(workspace);
  Routing r;
  r.header = reinterpret_cast<int32_t*>(base + l.header);
  r.offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  r.active = reinterpret_cast<int32_t*>(base + l.active);
  r.active_range = reinterpret_cast<int32_t*>(base + l.active_range);
  r.sorted_slot = reinterpret_cast<int32_t*>(base + l.sorted);
  r.tile_expert = reinterpret_cast<int32_t*>(base + l.tile_expert);
  r.tile_row = reinterpret_cast<int32_t*>(base + l.tile_row);
  uint16_t* x_perm = reinterpret_cast<uint16_t*>(base + l.x_perm);
  uint16_t* act = reinterpret_cast<uint16_t*>(base + l.act);
  float* y = reinterpret_cast<float*>(base + l.y);

  const int64_t slots = m * k;
  const bool use_gemm = moe_quantized_takes_gemm(m, k, E, H, I);
  const int tile_rows = !use_gemm ? 0 : slots >= 64 * E ? 128 : 64;

  const bool sum_in_down = takes_sum_in_down(w, m, k, router_logits != nullptr, next_norm);
  if (fused != nullptr && !sum_in_down) invalid("moe_quantized: one-launch routing without the sum in down");
  const bool topk_here = router_logits != nullptr && m <= kTopkInRouteRows;
  if (fused != nullptr) {
    NormRoute a;
    a.x = fused->residual;
    a.norm_weight = fused->norm_weight;
    a.eps = fused->eps;
    a.router = fused->router;
    a.bias = fused->router_bias;
    a.dim = int(H);
    a.experts = int(E);
    a.k = k;
    a.h = const_cast<uint16_t*>(h);  // the experts' input, made here
    a.ids = ids;
    a.route_weights = route_weights;
    const dim3 threads(kRouteGroups * kRouteGroupThreads);
    if (wide_route_cluster(E, H, threads)) {
      launch_chained_cluster(moe_norm_route_one_row_kernel<kRouteWideCluster>, dim3(kRouteWideCluster),
                             kRouteWideCluster, threads, norm_route_smem_bytes(int(E) / kRouteWideCluster, int(H)), s,
                             a, r);
    } else {
      allow_smem<moe_norm_route_one_row_kernel<kRouteCluster>>(norm_route_smem_bytes(kRouteBlockExperts, kRouteMaxDim));
      launch_chained_cluster(moe_norm_route_one_row_kernel<kRouteCluster>, dim3(kRouteCluster), kRouteCluster, threads,
                             norm_route_smem_bytes(int(E) / kRouteCluster, int(H)), s, a, r);
    }
  } else if (router_logits != nullptr && m == 1 && !use_gemm) {
    launch_chained(moe_route_one_row_kernel, 1, 32, 0, s, router_logits, int(E), k, r, ids, route_weights);
  } else {
    if (router_logits != nullptr && !topk_here) moe_topk_softmax(router_logits, m, E, k, ids, route_weights, stream);
    const float* logits = topk_here ? router_logits : nullptr;
    float* picked_weights = topk_here ? route_weights : nullptr;
    if (slots <= 4096)
      launch_chained(moe_route_kernel<8>, 1, 8 * 32, 0, s, ids, int(slots), int(E), tile_rows, r, logits, k,
                     picked_weights);
    else
      launch_chained(moe_route_kernel<32>, 1, 32 * 32, 0, s, ids, int(slots), int(E), tile_rows, r, logits, k,
                     picked_weights);
  }
  ANVIL_CUDA_LAUNCHED();

  ExpertProduct gate_up;
  gate_up.blocks = w.gate_up_blocks;
  gate_up.scales = w.gate_up_scales;
  gate_up.bias = w.gate_up_bias;
  gate_up.row_scales = w.gate_up_row_scales;
  gate_up.silu = w.activation == ExpertActivation::SiluMul;
  gate_up.n = int(2 * I);
  gate_up.k = int(H);
  gate_up.top_k = k;
  gate_up.act = act;
  gate_up.limit = w.swiglu_limit;
  // At batch 1 h comes from the norm + router kernel, or from the launch just before when the
  // routing is made in that launch.
  gate_up.one_row_token = m != 1 ? OneRowToken::kNone
                          : fused == nullptr ? OneRowToken::kBeforeWait
                                             : OneRowToken::kAfterWait;
  gate_up.alpha = w.swiglu_alpha;
  ExpertProduct down;
  down.a = act;
  down.blocks = w.down_blocks;
  down.scales = w.down_scales;
  down.bias = w.down_bias;
  down.row_scales = w.down_row_scales;
  down.n = int(H);
  down.k = int(I);
  down.top_k = k;
  down.out = y;

  auto products = [&](auto kind_tag) {
    constexpr Kind kKind = decltype(kind_tag)::value;
    if (use_gemm) {
      launch_chained(moe_gather_permute_kernel<kKind == Kind::Mxfp4>, unsigned(slots), 256, size_t(H) * 2, s, h, r, k, int(H), x_perm);
      ANVIL_CUDA_LAUNCHED();
      gate_up.a = x_perm;
      // Tile-list bound for this tile size (<= l.max_tiles, which assumes the smallest tiles).
      const int64_t max_tiles = (slots + std::min(E, slots) * (tile_rows - 1)) / tile_rows + 1;
      if (tile_rows == 128) {
        launch_gemm<128, true, kKind>(gate_up, r, max_tiles, s);
        launch_gemm<128, false, kKind>(down, r, max_tiles, s);
      } else {
        launch_gemm<64, true, kKind>(gate_up, r, max_tiles, s);
        launch_gemm<64, false, kKind>(down, r, max_tiles, s);
      }
    } else {
      gate_up.a = h;
      const int active_bound = int(std::min(E, slots));
      launch_decode_tokens<true, kKind>(m, E, gate_up, r, active_bound, s);
      launch_decode_tokens<false, kKind>(m, E, down, r, active_bound, s);
    }
  };
  if (sum_in_down) {
    gate_up.a = h;
    const int shift = act_f16_shift(gate_up);
    gate_up.act_f16_shift = shift;
    down.act_f16_shift = shift;
    launch_decode_tokens<true, Kind::Mxfp4>(m, E, gate_up, r, kSumExperts, s);
    launch_down_sum(down, r, DownSum{residual, route_weights, ids, int(E)}, s);
    return false;
  }
  switch (w.format) {
    case ExpertFormat::MXFP4: products(std::integral_constant<Kind, Kind::Mxfp4>{}); break;
    case ExpertFormat::NVFP4: products(std::integral_constant<Kind, Kind::Nvfp4>{}); break;
    case ExpertFormat::FP8: products(std::integral_constant<Kind, Kind::Fp8>{}); break;
    case ExpertFormat::BF16: products(std::integral_constant<Kind, Kind::Bf16>{}); break;
  }

  const int combine_threads = int(std::min<int64_t>(1024, ceil_div(H / 4, 32) * 32));
  const bool norm = next_norm != nullptr && next_norm->out != nullptr;
  if (norm && (!next_norm->weight || !aligned16(next_norm->weight)))
    invalid("moe_quantized: next_norm needs a 16-byte aligned weight");
  launch_chained(moe_combine_kernel, unsigned(m), combine_threads, 0, s, y, ids, route_weights, k, int(E), int(H),
                 residual, norm ? next_norm->weight : nullptr, norm ? next_norm->eps : 0.0f,
                 norm ? next_norm->out : nullptr);
  ANVIL_CUDA_LAUNCHED();
  return norm;
}

}  // namespace

// Tensor cores once experts average 16+ tokens; below that the weights dominate and the bandwidth
// kernel wastes no work on padding rows.
bool moe_quantized_takes_gemm(int64_t m, int k, int64_t num_experts, int64_t hidden, int64_t intermediate) {
#ifndef ANVIL_MOE_GEMM_MIN_PER_EXPERT
#define ANVIL_MOE_GEMM_MIN_PER_EXPERT 16
#endif
  const bool shapes = hidden % 64 == 0 && intermediate % 64 == 0 && hidden <= moe::kMoeGemmMaxK &&
                      intermediate <= moe::kMoeGemmMaxK;
  return shapes && m * k >= ANVIL_MOE_GEMM_MIN_PER_EXPERT * num_experts;
}

void moe_quantized(const QuantizedExperts& w, const uint16_t* h, int64_t m, int k, const int32_t* ids,
                   const float* route_weights, float* residual, void* workspace, size_t workspace_bytes, Stream stream,
                   const NextNorm* next_norm) {
  // Without logits the impl only reads them.
  moe_quantized_impl(w, h, m, k, nullptr, const_cast<int32_t*>(ids), const_cast<float*>(route_weights), residual,
                     workspace, workspace_bytes, stream, next_norm);
}

bool moe_routes_in_one_launch(const QuantizedExperts& w, const MoeRouterInput& in, int64_t m, int k,
                              const uint16_t* h, const NextNorm* next_norm) {
  const int64_t E = w.num_experts, H = w.hidden;
  return takes_sum_in_down(w, m, k, true, next_norm) && E % kRouteCluster == 0 &&
         E / kRouteCluster <= kRouteBlockExperts && k <= E && H % 8 == 0 && H <= kRouteMaxDim &&
         in.residual != nullptr && in.norm_weight != nullptr && in.router != nullptr && h != nullptr &&
         aligned16(in.residual) && aligned16(in.norm_weight) && aligned16(in.router) && aligned16(h) &&
         fused_routing_allowed() && bulk_copy_kernels_allowed() &&
         current_device_runs(kMoeBatch1RouteOp, kMoeBatch1RouteCluster);
}

bool moe_quantized_from_residual(const QuantizedExperts& w, const MoeRouterInput& in, int64_t m, int k, uint16_t* h,
                                 float* h_f32, float* router_logits, int32_t* ids, float* route_weights,
                                 void* workspace, size_t workspace_bytes, Stream stream, const NextNorm* next_norm) {
  if (router_logits == nullptr) invalid("moe_quantized_from_residual: null router_logits");
  if (moe_routes_in_one_launch(w, in, m, k, h, next_norm))
    return moe_quantized_impl(w, h, m, k, router_logits, ids, route_weights, in.residual, workspace, workspace_bytes,
                              stream, next_norm, &in);
  rms_norm_router(in.residual, m, w.hidden, in.norm_weight, in.eps, in.router, in.router_bias, w.num_experts,
                  router_logits, h, h_f32, stream);
  return moe_quantized_impl(w, h, m, k, router_logits, ids, route_weights, in.residual, workspace, workspace_bytes,
                            stream, next_norm);
}

bool moe_quantized_from_logits(const QuantizedExperts& w, const uint16_t* h, int64_t m, int k,
                               const float* router_logits, int32_t* ids, float* route_weights, float* residual,
                               void* workspace, size_t workspace_bytes, Stream stream, const NextNorm* next_norm) {
  if (router_logits == nullptr) invalid("moe_quantized_from_logits: null router_logits");
  return moe_quantized_impl(w, h, m, k, router_logits, ids, route_weights, residual, workspace, workspace_bytes, stream,
                     next_norm);
}

}  // namespace anvil::cuda
