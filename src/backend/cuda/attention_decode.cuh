#pragma once
// Attention for decode steps: every sequence has exactly one new query row.
//
// The generic kernel (attention.cu) tiles queries for prefill; at decode it ran one half-empty
// query tile per KV head, three barriers per 32-key tile, and a second launch to merge the context
// splits: 17-20 us per gpt-oss layer on an H200 for a few hundred keys (~1 MB of cache). Here a
// block owns (sequence, KV head, split) and all G <= 8 query heads of that KV head; each warp takes
// 32 keys at a time, one key per lane for the scores (its key row in registers, q broadcast from
// shared memory; the value rows meanwhile copied to shared memory with cp.async, so all of a
// chunk's loads are in flight at once) and one slice of the head dimension per lane for P·V, with
// a running max and sum per head. The block table is read before waiting for the previous kernel. The warps'
// states are merged in shared memory, and when the context is split the last block of a
// (sequence, KV head) to finish merges the splits itself (a ticket counter in the workspace, which
// that block returns to zero), so a decode step needs one launch per layer.
//
// The split count is fixed by the launcher from an upper bound on the context (CUDA graphs replay
// it); each block derives from its sequence's real length how many splits actually have keys, and
// the blocks past that return at once.
#include <cmath>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/launch.cuh"

namespace anvil::cuda::attn {

using gemm::cp_async_16;
using gemm::cp_async_commit;
using gemm::cp_async_wait;
using gemm::prefetch_l2;
using gemm::smem_u32;

// Warps per block: 8, so that a sliding window (~5 chunks) or a short context fits in one split
// and needs no merge; 4 with a float32 cache, whose value rows would not fit SM120's 99 KB.
template <KvDtype T>
constexpr int kDecodeWarps = T == KvDtype::F32 ? 4 : 8;
constexpr int kDecodeMaxGroup = 8;  // query heads per KV head; more take the generic kernel
constexpr int kDecodeKeys = 32;     // keys per warp step, one per lane

__device__ __forceinline__ float fp8_to_float(uint32_t byte) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(byte), __NV_E4M3)));
}

template <KvDtype T>
constexpr int kElementBytes = T == KvDtype::F32 ? 4 : T == KvDtype::BF16 ? 2 : 1;

constexpr int decode_warps(KvDtype t) {
  return t == KvDtype::F32 ? kDecodeWarps<KvDtype::F32> : kDecodeWarps<KvDtype::BF16>;
}

// Dynamic shared memory: the value rows, [warp][key][D] cache elements, and after the loop the
// warps' output accumulators, [warp][head][D] floats, in the same bytes.
template <int D, int G, KvDtype T>
constexpr size_t decode_smem_bytes() {
  const size_t rows = size_t(kDecodeWarps<T>) * kDecodeKeys * D * kElementBytes<T>;
  const size_t accumulators = size_t(kDecodeWarps<T>) * G * D * sizeof(float);
  return rows > accumulators ? rows : accumulators;
}

// N (= head_dim / 32: 1, 2 or 4) consecutive cache elements at `p` (shared memory) as float32.
template <KvDtype T, int N>
__device__ __forceinline__ void load_slice(const uint8_t* p, float out[N]) {
  if constexpr (T == KvDtype::F32) {
    const float* f = reinterpret_cast<const float*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = f[i];
  } else if constexpr (T == KvDtype::BF16) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __uint_as_float(uint32_t(b[i]) << 16);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = fp8_to_float(p[i]);
  }
}

// What decode block (sequence, KV head, split) covers: its sequence's newest position and first
// visible key, and its share [chunk_lo, chunk_hi) of the 32-key chunks. Splits past `active` have
// no keys (the launch's count comes from a bound, the real length is the sequence's).
struct DecodeRange {
  int seq, kv_head, split, group, row, pos, first_key, active, chunk_lo, chunk_hi;
};

__device__ __forceinline__ DecodeRange decode_range(const AttentionBatch& batch, const AttentionShape& shape,
                                                    int splits, int warps) {
  DecodeRange r;
  r.seq = blockIdx.x, r.kv_head = blockIdx.y, r.split = blockIdx.z;
  r.group = int(shape.num_heads / shape.num_kv_heads);
  r.row = batch.row_begin[r.seq], r.pos = batch.start_pos[r.seq];
  const int window = int(shape.sliding_window);
  r.first_key = window > 0 ? max(0, r.pos - window + 1) : 0;
  const int chunks = (r.pos - r.first_key) / kDecodeKeys + 1;
  // As many splits as give each warp at most one chunk, within the launch's.
  r.active = min(splits, (chunks + warps - 1) / warps);
  r.chunk_lo = int(int64_t(chunks) * r.split / r.active);
  r.chunk_hi = int(int64_t(chunks) * (r.split + 1) / r.active);
  return r;
}

// The sinks of a block's query heads, into sink_s[group] (shared memory, read after the block's
// next barrier), and what decode_finish takes for them. Asked for before the grid's wait: read at
// the end, they were a DRAM round trip (a layer streams more than L2 holds) on the chain's path.
template <int G>
__device__ __forceinline__ const float* stage_sinks(const AttentionShape& shape, int kv_head, float (&sink_s)[G]) {
  const int group = int(shape.num_heads / shape.num_kv_heads);
  if (shape.sinks == nullptr) return nullptr;
  if (int(threadIdx.x) < group) sink_s[threadIdx.x] = shape.sinks[kv_head * group + threadIdx.x];
  return sink_s;
}

// The end of a decode block: its warps' states (max_s, sum_s and acc_s, written before a
// __syncthreads) merged into one per head, then stored, or written as this split's partial; the
// last split of a (sequence, KV head) to arrive merges all of them.
template <int D, int G, int kWarps, typename Out>
__device__ __forceinline__ void decode_finish(const AttentionShape& shape, Out* out, float* partials, int* tickets,
                                              int splits, int active, int row, int kv_head, int split,
                                              const float (*max_s)[G], const float (*sum_s)[G],
                                              const float (*acc_s)[G][D], const float* sink_s, bool& last_s) {
  const int group = int(shape.num_heads / shape.num_kv_heads);
  const int64_t q_stride = shape.num_heads * D;
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int h = i / D, d = i % D, head = kv_head * group + h;
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, max_s[w][h]);
    float sum = 0.0f, value = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (max_s[w][h] == -INFINITY) continue;  // a warp that had no chunk
      const float f = expf(max_s[w][h] - m);
      sum += sum_s[w][h] * f;
      value += acc_s[w][h][d] * f;
    }
    if (active == 1) {
      const float denominator = sum + (sink_s ? expf(sink_s[h] - m) : 0.0f);
      store_out(out + int64_t(row) * q_stride + int64_t(head) * D + d, denominator > 0.0f ? value / denominator : 0.0f);
    } else {
      float* partial = partials + ((int64_t(row) * shape.num_heads + head) * splits + split) * (D + 2);
      partial[d] = value;
      if (d == 0) {
        partial[D] = m;
        partial[D + 1] = sum;
      }
    }
  }
  if (active == 1) return;

  // The last of the active splits to get here merges them all.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* ticket = tickets + int64_t(row) * shape.num_kv_heads + kv_head;
    last_s = atomicAdd(ticket, 1) == active - 1;
    if (last_s) *ticket = 0;  // every split has arrived: ready for the next call
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int h = i / D, d = i % D, head = kv_head * group + h;
    const float* base = partials + (int64_t(row) * shape.num_heads + head) * splits * (D + 2);
    float m = -INFINITY;
    for (int s = 0; s < active; ++s) m = fmaxf(m, __ldcg(base + s * (D + 2) + D));
    float sum = 0.0f, value = 0.0f;
    for (int s = 0; s < active; ++s) {
      const float f = expf(__ldcg(base + s * (D + 2) + D) - m);
      sum += __ldcg(base + s * (D + 2) + D + 1) * f;
      value += __ldcg(base + s * (D + 2) + d) * f;
    }
    const float denominator = sum + (sink_s ? expf(sink_s[h] - m) : 0.0f);
    store_out(out + int64_t(row) * q_stride + int64_t(head) * D + d, denominator > 0.0f ? value / denominator : 0.0f);
  }
}

// partials: [row][head][split][D + 2] (unnormalized output, max, sum), as the generic kernel's.
// tickets: [row][kv head], zero between calls.
// G: the group (query heads per KV head) rounded up to 2, 4 or 8; the padding heads have q = 0
// and are never stored, so every loop over heads runs without a branch.
template <int D, int G, KvDtype KV, typename Out>
__global__ void __launch_bounds__(kDecodeWarps<KV> * 32)
    decode_attention_kernel(AttentionBatch batch, AttentionShape shape, const float* q, KvLayerCache cache, Out* out,
                            float* partials, int* tickets, int splits) {
  constexpr int kWarps = kDecodeWarps<KV>, kPerLane = D / 32, kRowBytes = D * kElementBytes<KV>;
  __shared__ __align__(16) float q_s[G][D];
  __shared__ __align__(16) float p_s[kWarps][kDecodeKeys][G];
  __shared__ float max_s[kWarps][G], sum_s[kWarps][G];
  __shared__ bool last_s;
  extern __shared__ __align__(16) uint8_t value_rows[];  // [warp][key][kRowBytes], then acc_s
  float (*const acc_s)[G][D] = reinterpret_cast<float (*)[G][D]>(value_rows);

  // The step's metadata and block tables were uploaded before the step began: read before the wait.
  const DecodeRange range = decode_range(batch, shape, splits, kWarps);
  if (range.split >= range.active) return;
  const int seq = range.seq, kv_head = range.kv_head, split = range.split, group = range.group, row = range.row;
  const int pos = range.pos, first_key = range.first_key, active = range.active;
  const int chunk_lo = range.chunk_lo, chunk_hi = range.chunk_hi;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int block_size = int(cache.block_size);
  const int32_t* table = batch.block_tables + int64_t(seq) * batch.max_blocks;
  auto table_entry = [&](int chunk) {
    const int key = first_key + chunk * kDecodeKeys + lane;
    return chunk < chunk_hi && key <= pos ? table[key / block_size] : -1;
  };
  int next_block = table_entry(chunk_lo + warp);
  __shared__ float sink_s[G];
  const float* const sinks = stage_sinks(shape, kv_head, sink_s);
  const int64_t q_stride = shape.num_heads * D, kv_stride = shape.num_kv_heads * D;
  // The first chunk's key and value rows are asked into L2 before the wait (every key but the
  // newest is older than the predecessor): after it, their loads are L2 round trips rather than
  // DRAM ones on the step's path. The rows have no shared memory to land in here (the
  // tensor-core kernel copies them), so this is a prefetch, not a copy.
  if (next_block >= 0) {
    const int key = first_key + (chunk_lo + warp) * kDecodeKeys + lane;
    const int64_t key_row = (int64_t(next_block) * block_size + key % block_size) * kv_stride + int64_t(kv_head) * D;
#pragma unroll
    for (int b = 0; b < kRowBytes; b += 128) {
      prefetch_l2(static_cast<const uint8_t*>(cache.keys) + key_row * kElementBytes<KV> + b);
      prefetch_l2(static_cast<const uint8_t*>(cache.values) + key_row * kElementBytes<KV> + b);
    }
  }

  wait_for_predecessor();
  release_dependents();
  const float* q_row = q + int64_t(row) * q_stride + int64_t(kv_head) * group * D;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) q_s[i / D][i % D] = i < group * D ? q_row[i] : 0.0f;
  __syncthreads();

  float run_max[G], lane_sum[G], acc[G][kPerLane];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    run_max[h] = -INFINITY;
    lane_sum[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[h][e] = 0.0f;
  }
  uint8_t* const warp_rows = value_rows + size_t(warp) * kDecodeKeys * kRowBytes;
  const uint8_t* const values = static_cast<const uint8_t*>(cache.values);

  for (int c = chunk_lo + warp; c < chunk_hi; c += kWarps) {
    const int chunk_first = first_key + c * kDecodeKeys;
    const bool valid = chunk_first + lane <= pos;
    const int block = next_block;
    // A visible key whose block is unmapped scores 0 with a zero value, as in the generic kernel;
    // its (and an invisible key's) key loads read block 0 and are discarded.
    const int64_t offset = block >= 0 ? (int64_t(block) * block_size + (chunk_first + lane) % block_size) * kv_stride +
                                            int64_t(kv_head) * D
                                      : -1;
    const int64_t read_at = offset >= 0 ? offset : 0;
    {
      const uint32_t dst = smem_u32(warp_rows + lane * kRowBytes);
#pragma unroll
      for (int b = 0; b < kRowBytes; b += 16) cp_async_16(dst + b, values + read_at * kElementBytes<KV> + b, offset >= 0);
      cp_async_commit();
    }
    float score[G];
#pragma unroll
    for (int h = 0; h < G; ++h) score[h] = 0.0f;
#pragma unroll
    for (int d0 = 0; d0 < D; d0 += 8) {
      float k8[8];
      load8<KV>(cache.keys, read_at + d0, k8);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float4 a = *reinterpret_cast<const float4*>(&q_s[h][d0]);
        const float4 b = *reinterpret_cast<const float4*>(&q_s[h][d0 + 4]);
        score[h] = fmaf(a.x, k8[0], score[h]);
        score[h] = fmaf(a.y, k8[1], score[h]);
        score[h] = fmaf(a.z, k8[2], score[h]);
        score[h] = fmaf(a.w, k8[3], score[h]);
        score[h] = fmaf(b.x, k8[4], score[h]);
        score[h] = fmaf(b.y, k8[5], score[h]);
        score[h] = fmaf(b.z, k8[6], score[h]);
        score[h] = fmaf(b.w, k8[7], score[h]);
      }
    }
    next_block = table_entry(c + kWarps);
    // The heads' reductions side by side, so their shuffles overlap.
    float chunk_max[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      score[h] = !valid ? -INFINITY : offset < 0 ? 0.0f : score[h] * shape.scale;
      chunk_max[h] = score[h];
    }
#pragma unroll
    for (int step = 16; step > 0; step /= 2)
#pragma unroll
      for (int h = 0; h < G; ++h) chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(0xffffffffu, chunk_max[h], step));
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float m = fmaxf(run_max[h], chunk_max[h]);  // finite: a chunk's first key is visible
      const float correction = expf(run_max[h] - m);
      const float p = expf(score[h] - m);
      lane_sum[h] = lane_sum[h] * correction + p;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[h][e] *= correction;
      run_max[h] = m;
      p_s[warp][lane][h] = p;
    }
    cp_async_wait<0>();
    __syncwarp();
    // All 32 keys: past the context p = 0 and the rows are zero-filled, and a fixed count lets the
    // shared-memory loads run ahead.
#pragma unroll
    for (int j = 0; j < kDecodeKeys; ++j) {
      float v[kPerLane];
      load_slice<KV, kPerLane>(warp_rows + j * kRowBytes + lane * kPerLane * kElementBytes<KV>, v);
      float p[G];
#pragma unroll
      for (int h = 0; h < G; h += 2) {
        const float2 pair = *reinterpret_cast<const float2*>(&p_s[warp][j][h]);
        p[h] = pair.x;
        p[h + 1] = pair.y;
      }
#pragma unroll
      for (int h = 0; h < G; ++h)
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) acc[h][e] = fmaf(p[h], v[e], acc[h][e]);
    }
    __syncwarp();  // p_s and the value rows are rewritten by the next chunk
  }

  // The warps' states into shared memory (the accumulators over the value rows, once every warp
  // is done with them), then one state per head for the block.
#pragma unroll
  for (int step = 16; step > 0; step /= 2)
#pragma unroll
    for (int h = 0; h < G; ++h) lane_sum[h] += __shfl_xor_sync(0xffffffffu, lane_sum[h], step);
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const float total = lane_sum[h];
    if (lane == 0) {
      max_s[warp][h] = run_max[h];
      sum_s[warp][h] = total;
    }
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc_s[warp][h][lane * kPerLane + e] = acc[h][e];
  }
  __syncthreads();
  decode_finish<D, G, kWarps>(shape, out, partials, tickets, splits, active, row, kv_head, split, max_s, sum_s, acc_s,
                              sinks, last_s);
}

}  // namespace anvil::cuda::attn
