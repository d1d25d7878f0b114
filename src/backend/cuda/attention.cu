// Paged attention for prefill and decode in one kernel family, on CUDA cores in float32.
//
// Work item: one sequence, one KV head, one tile of BQ query vectors, one split of the context.
// A query tile packs the G query heads that share the KV head (GQA) row by row, so a decode row
// of gpt-oss (G = 8) fills half of a 16-vector tile instead of one 64th of a 64-row tile. Keys and
// values stream through shared memory in tiles of BK positions (gathered through the block
// table), with an online softmax (running max and sum per query). When few work items exist
// (decode), the context is split and a second kernel merges the partial results, flash-decoding
// style. Learned sinks join the softmax denominator only, once, at the end. Steps in which every
// sequence has exactly one new row (decode) take attention_decode.cuh instead.
//
// Why CUDA cores, not tensor cores: the step's attention FLOPs are small next to its weight
// reads at decode, and at a 2048-token prefill they are ~4e10 per full layer, a few ms in all.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_decode_mma.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope.cuh"

namespace anvil::cuda {

namespace {

using namespace attn;

constexpr int kThreads = 128;      // 16 row groups x 8 column groups
constexpr int kKeysPerTile = 32;   // BK
constexpr int kMaxSplits = 16;
constexpr int64_t kMaxSplitRows = 64;  // splitting is for decode-sized steps only

// The workspace: the decode kernel's tickets (one int per row and head, a fixed size so that they
// stay at zero while the rest is reused), then the splits' partial results.
size_t ticket_bytes(int64_t num_heads) { return size_t(kMaxSplitRows * num_heads) * sizeof(int) / 256 * 256 + 256; }
size_t partial_bytes(int64_t rows, int64_t num_heads, int64_t head_dim, int64_t splits) {
  return size_t(rows * num_heads * splits * (head_dim + 2)) * sizeof(float);
}

template <int D, int BQ, KvDtype KV, typename Out>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionBatch batch, AttentionShape shape, const float* q,
                                                              KvLayerCache cache, Out* out, float* partials,
                                                              int splits, int tiles_per_sequence) {
  wait_for_predecessor();
  release_dependents();
  constexpr int TR = BQ / 16;       // query vectors per thread
  constexpr int TC = kKeysPerTile / 8;  // keys per thread in the score tile
  constexpr int TD = D / 8;         // output dims per thread
  extern __shared__ float smem[];
  float* q_tile = smem;                           // [BQ][D + 1]
  float* k_tile = q_tile + BQ * (D + 1);          // [BK][D + 1]
  float* v_tile = k_tile + kKeysPerTile * (D + 1);  // [BK][D]
  float* p_tile = v_tile + kKeysPerTile * D;      // [BQ][BK + 1]

  const int seq = blockIdx.x / tiles_per_sequence;
  const int q_tile_index = blockIdx.x % tiles_per_sequence;
  const int kv_head = blockIdx.y, split = blockIdx.z;
  const int group = int(shape.num_heads / shape.num_kv_heads);
  const int row_begin = batch.row_begin[seq], new_rows = batch.row_begin[seq + 1] - row_begin;
  const int first_vector = q_tile_index * BQ;
  const int num_vectors = min(BQ, new_rows * group - first_vector);
  if (num_vectors <= 0) return;
  const int start_pos = batch.start_pos[seq];
  const int tid = threadIdx.x, row_group = tid / 8, col_group = tid % 8;
  const int64_t q_stride = shape.num_heads * D, kv_stride = shape.num_kv_heads * D;

  // Query vector v of this tile: row first_vector + v divided by G, head kv_head * G + remainder.
  for (int i = tid; i < BQ * D; i += kThreads) {
    const int v = i / D, d = i % D;
    float value = 0.0f;
    if (v < num_vectors) {
      const int global = first_vector + v, row = row_begin + global / group, head = kv_head * group + global % group;
      value = q[int64_t(row) * q_stride + int64_t(head) * D + d];
    }
    q_tile[v * (D + 1) + d] = value;
  }

  // The keys this tile can see: up to its last query's position, and for a sliding layer from the
  // first query's window start.
  const int first_pos = start_pos + first_vector / group;
  const int last_pos = start_pos + (first_vector + num_vectors - 1) / group;
  int key_begin = 0;
  if (shape.sliding_window > 0) key_begin = max(0, first_pos - int(shape.sliding_window) + 1);
  key_begin -= key_begin % kKeysPerTile;
  const int key_tiles = (last_pos + 1 - key_begin + kKeysPerTile - 1) / kKeysPerTile;
  const int tile_lo = int(int64_t(key_tiles) * split / splits), tile_hi = int(int64_t(key_tiles) * (split + 1) / splits);

  int my_pos[TR];
  bool my_valid[TR];
  for (int i = 0; i < TR; ++i) {
    const int v = row_group * TR + i;
    my_valid[i] = v < num_vectors;
    my_pos[i] = start_pos + (first_vector + v) / group;
  }
  float row_max[TR], row_sum[TR], acc[TR][TD];
  for (int i = 0; i < TR; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
    for (int j = 0; j < TD; ++j) acc[i][j] = 0.0f;
  }
  const int block_size = int(cache.block_size);
  const int32_t* table = batch.block_tables + int64_t(seq) * batch.max_blocks;

  for (int key_tile = tile_lo; key_tile < tile_hi; ++key_tile) {
    const int tile_start = key_begin + key_tile * kKeysPerTile;
    __syncthreads();  // previous tile's k/v/p reads are done
    for (int i = tid; i < kKeysPerTile * (D / 8); i += kThreads) {
      const int key = i / (D / 8), chunk = i % (D / 8);
      const int pos = tile_start + key;
      float kf[8] = {}, vf[8] = {};
      if (pos <= last_pos) {
        const int block = table[pos / block_size];
        if (block >= 0) {
          const int64_t offset = (int64_t(block) * block_size + pos % block_size) * kv_stride + int64_t(kv_head) * D + chunk * 8;
          load8<KV>(cache.keys, offset, kf);
          load8<KV>(cache.values, offset, vf);
        }
      }
      for (int w = 0; w < 8; ++w) {
        k_tile[key * (D + 1) + chunk * 8 + w] = kf[w];
        v_tile[key * D + chunk * 8 + w] = vf[w];
      }
    }
    __syncthreads();

    float score[TR][TC];
    for (int i = 0; i < TR; ++i)
      for (int c = 0; c < TC; ++c) score[i][c] = 0.0f;
    for (int d = 0; d < D; ++d) {
      float kv[TC];
      for (int c = 0; c < TC; ++c) kv[c] = k_tile[(col_group + 8 * c) * (D + 1) + d];
      for (int i = 0; i < TR; ++i) {
        const float qv = q_tile[(row_group * TR + i) * (D + 1) + d];
        for (int c = 0; c < TC; ++c) score[i][c] = fmaf(qv, kv[c], score[i][c]);
      }
    }
    for (int i = 0; i < TR; ++i) {
      float tile_max = -INFINITY;
      for (int c = 0; c < TC; ++c) {
        const int pos = tile_start + col_group + 8 * c;
        const bool visible = my_valid[i] && pos <= my_pos[i] &&
                             (shape.sliding_window == 0 || pos > my_pos[i] - int(shape.sliding_window));
        score[i][c] = visible ? score[i][c] * shape.scale : -INFINITY;
        tile_max = fmaxf(tile_max, score[i][c]);
      }
      for (int offset = 1; offset < 8; offset *= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      const float new_max = fmaxf(row_max[i], tile_max);
      // All keys of this tile hidden so far for this row: nothing changes.
      const float correction = new_max == -INFINITY ? 1.0f : expf(row_max[i] - new_max);
      float tile_sum = 0.0f;
      for (int c = 0; c < TC; ++c) {
        const float p = new_max == -INFINITY ? 0.0f : expf(score[i][c] - new_max);
        p_tile[(row_group * TR + i) * (kKeysPerTile + 1) + col_group + 8 * c] = p;
        tile_sum += p;
      }
      for (int offset = 1; offset < 8; offset *= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
      row_sum[i] = row_sum[i] * correction + tile_sum;
      row_max[i] = new_max;
      for (int j = 0; j < TD; ++j) acc[i][j] *= correction;
    }
    __syncthreads();
    for (int key = 0; key < kKeysPerTile; ++key) {
      float vv[TD];
      for (int j = 0; j < TD; ++j) vv[j] = v_tile[key * D + col_group + 8 * j];
      for (int i = 0; i < TR; ++i) {
        const float p = p_tile[(row_group * TR + i) * (kKeysPerTile + 1) + key];
        for (int j = 0; j < TD; ++j) acc[i][j] = fmaf(p, vv[j], acc[i][j]);
      }
    }
  }

  for (int i = 0; i < TR; ++i) {
    if (!my_valid[i]) continue;
    const int global = first_vector + row_group * TR + i;
    const int row = row_begin + global / group, head = kv_head * group + global % group;
    if (splits == 1) {
      float denominator = row_sum[i];
      if (shape.sinks) denominator += expf(shape.sinks[head] - row_max[i]);
      const float inv = denominator > 0.0f ? 1.0f / denominator : 0.0f;
      Out* target = out + int64_t(row) * q_stride + int64_t(head) * D;
      for (int j = 0; j < TD; ++j) store_out(target + col_group + 8 * j, acc[i][j] * inv);
    } else {
      float* partial = partials + ((int64_t(row) * shape.num_heads + head) * splits + split) * (D + 2);
      for (int j = 0; j < TD; ++j) partial[col_group + 8 * j] = acc[i][j];
      if (col_group == 0) {
        partial[D] = row_max[i];
        partial[D + 1] = row_sum[i];
      }
    }
  }
}

// One block per (row, head): combines the splits' (max, sum, unnormalized output) and the sink.
template <typename Out>
__global__ void merge_splits_kernel(const float* partials, int splits, int64_t num_heads, int head_dim,
                                    const float* sinks, Out* out) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = blockIdx.x, head = blockIdx.y;
  const float* base = partials + (row * num_heads + head) * splits * (head_dim + 2);
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s) global_max = fmaxf(global_max, base[s * (head_dim + 2) + head_dim]);
  float denominator = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float m = base[s * (head_dim + 2) + head_dim];
    if (m != -INFINITY) denominator += base[s * (head_dim + 2) + head_dim + 1] * expf(m - global_max);
  }
  if (sinks) denominator += expf(sinks[head] - global_max);
  const float inv = denominator > 0.0f ? 1.0f / denominator : 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float value = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float m = base[s * (head_dim + 2) + head_dim];
      if (m != -INFINITY) value += base[s * (head_dim + 2) + d] * expf(m - global_max);
    }
    store_out(out + (row * num_heads + head) * head_dim + d, value * inv);
  }
}

template <KvDtype KV>
__global__ void kv_write_kernel(AttentionBatch batch, int64_t kv_width, const float* k, const float* v,
                                KvLayerCache cache) {
  wait_for_predecessor();
  release_dependents();
  const int64_t row = blockIdx.x;
  const int seq = batch.row_sequence[row], pos = batch.row_position[row];
  const int block = batch.block_tables[int64_t(seq) * batch.max_blocks + pos / cache.block_size];
  if (block < 0) return;  // cannot happen for a new token; guards a bad table from scribbling
  const int64_t offset = (int64_t(block) * cache.block_size + pos % cache.block_size) * kv_width;
  for (int64_t i = threadIdx.x; i < kv_width; i += blockDim.x) {
    store_kv<KV>(cache.keys, offset + i, k[row * kv_width + i]);
    store_kv<KV>(cache.values, offset + i, v[row * kv_width + i]);
  }
}

// One block per (row, head of q|k|v), one thread per rotated pair, as split_qkv_rope_kernel in
// ops.cu (same float32 angle and precise cos/sin, so q and k get the same values); the k and v
// heads are stored into the cache at the row's position instead of float buffers. With a q/k norm
// (Qwen3), every warp makes the head's inverse RMS as split_qkv_norm_rope_kernel does (the same
// lanes, order of additions and expressions), so the values are that kernel's too.
template <KvDtype KV>
__global__ void split_qkv_rope_cache_kernel(const float* qkv, AttentionBatch batch, int64_t heads, int64_t kv_heads,
                                            int64_t head_dim, const int32_t* positions, const float* inv_freq,
                                            float mscale, float* q, KvLayerCache cache, QkNorm qk_norm) {
  // The attention after this kernel is launched at once, while the qkv product still streams, so
  // its copies of every key but the newest (older than qkv: no attention kernel reads anything
  // newer before its wait) leave the chain's path. Measured alone on H100s: batch 1 +0.4-1.8 % (20b)
  // and +1.3 % (120b), batch 64 +0.2-0.5 %, batch 8 -0.2 % (docs/perf/logs/h200/session29).
  release_dependents();
  probe::mark(probe::kRope, 0);
  const int64_t row = blockIdx.x, head = blockIdx.y, half = head_dim / 2;
  const float* in = qkv + (row * (heads + 2 * kv_heads) + head) * head_dim;
  // Everything but the projection's output is known before the wait: the step's metadata (uploaded
  // before the step began), the slot, the first pair's rotation and norm weights. After the wait
  // only the load of `in` is left on the chain's path; these were dependent DRAM round trips
  // (a layer streams more than L2 holds) and the precise sin/cos before it.
  int64_t slot = 0;  // first element of this row's key (and value) vectors in the cache
  if (head >= heads) {
    const int seq = batch.row_sequence[row], pos = batch.row_position[row];
    const int block = batch.block_tables[int64_t(seq) * batch.max_blocks + pos / cache.block_size];
    if (block < 0) return;  // as kv_write_kernel: a bad table never scribbles
    slot = (int64_t(block) * cache.block_size + pos % cache.block_size) * kv_heads * head_dim;
  }
  const bool rotated = head < heads + kv_heads;
  const float position = rotated ? float(positions[row]) : 0.0f;
  const float* norm = head < heads ? qk_norm.q : qk_norm.k;
  const bool first_pair = rotated && threadIdx.x < half;
  const RopeTurn first_turn = first_pair ? rope_turn(position, inv_freq[threadIdx.x], mscale) : RopeTurn{0.0f, 0.0f};
  const float first_norm0 = first_pair && norm ? norm[threadIdx.x] : 0.0f;
  const float first_norm1 = first_pair && norm ? norm[threadIdx.x + half] : 0.0f;
  wait_for_predecessor();
  probe::mark(probe::kRope, 1);
  if (!rotated) {
    const int64_t offset = slot + (head - heads - kv_heads) * head_dim;
    for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) store_kv<KV>(cache.values, offset + i, in[i]);
    probe::mark(probe::kRope, probe::kProbeEnd);
    return;
  }
  float inv = 1.0f;
  if (norm) {  // block-uniform: every lane of every warp takes part in the shuffles
    float sum = 0.0f;
    for (int64_t i = threadIdx.x % 32; i < head_dim; i += 32) sum += in[i] * in[i];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    inv = rsqrtf(sum / float(head_dim) + qk_norm.eps);
  }
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const bool first = j == threadIdx.x;
    const RopeTurn turn = first ? first_turn : rope_turn(position, inv_freq[j], mscale);
    const float norm0 = !norm ? 0.0f : first ? first_norm0 : norm[j];
    const float norm1 = !norm ? 0.0f : first ? first_norm1 : norm[j + half];
    const float x0 = norm ? in[j] * inv * norm0 : in[j], x1 = norm ? in[j + half] * inv * norm1 : in[j + half];
    const float r0 = rope_first(x0, x1, turn), r1 = rope_second(x0, x1, turn);
    if (head < heads) {
      float* out = q + (row * heads + head) * head_dim;
      out[j] = r0;
      out[j + half] = r1;
    } else {
      const int64_t offset = slot + (head - heads) * head_dim;
      store_kv<KV>(cache.keys, offset + j, r0);
      store_kv<KV>(cache.keys, offset + j + half, r1);
    }
  }
  probe::mark(probe::kRope, probe::kProbeEnd);
}

template <int D, int BQ, KvDtype KV, typename Out>
void launch(const AttentionBatch& batch, const AttentionShape& shape, const float* q, const KvLayerCache& cache,
            Out* out, float* partials, int splits, cudaStream_t stream) {
  const int group = int(shape.num_heads / shape.num_kv_heads);
  const int tiles_per_sequence = int(ceil_div(batch.max_new_tokens * group, BQ));
  const size_t smem = sizeof(float) * (BQ * (D + 1) + kKeysPerTile * (D + 1) + kKeysPerTile * D + BQ * (kKeysPerTile + 1));
  static bool configured = false;  // per template instance; the attribute is per kernel
  if (!configured) {
    ANVIL_CUDA_CHECK(
        cudaFuncSetAttribute(attention_kernel<D, BQ, KV, Out>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    configured = true;
  }
  const dim3 grid(unsigned(batch.num_sequences * tiles_per_sequence), unsigned(shape.num_kv_heads), unsigned(splits));
  launch_chained(attention_kernel<D, BQ, KV, Out>, grid, kThreads, smem, stream, batch, shape, q, cache, out, partials,
                 splits, tiles_per_sequence);
  ANVIL_CUDA_LAUNCHED();
}

template <int D, KvDtype KV, typename Out>
void dispatch_tile(const AttentionBatch& batch, const AttentionShape& shape, const float* q, const KvLayerCache& cache,
                   Out* out, float* partials, int splits, cudaStream_t stream) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  if (batch.max_new_tokens * group <= 16)
    launch<D, 16, KV>(batch, shape, q, cache, out, partials, splits, stream);
  else
    launch<D, 64, KV>(batch, shape, q, cache, out, partials, splits, stream);
}

// Only the pairs the models use are compiled: float32 output goes with the float32 cache (the
// float32 compute mode), bf16 output with the bf16 and fp8 caches.
template <int D, typename Out>
void dispatch_kv(const AttentionBatch& batch, const AttentionShape& shape, const float* q, const KvLayerCache& cache,
                 Out* out, float* partials, int splits, cudaStream_t stream) {
  if constexpr (std::is_same_v<Out, float>) {
    if (cache.dtype == KvDtype::F32) return dispatch_tile<D, KvDtype::F32>(batch, shape, q, cache, out, partials, splits, stream);
  } else {
    if (cache.dtype == KvDtype::BF16) return dispatch_tile<D, KvDtype::BF16>(batch, shape, q, cache, out, partials, splits, stream);
    if (cache.dtype == KvDtype::FP8_E4M3)
      return dispatch_tile<D, KvDtype::FP8_E4M3>(batch, shape, q, cache, out, partials, splits, stream);
  }
  throw_cuda_error(std::is_same_v<Out, float> ? "paged_attention: float32 output needs a float32 KV cache"
                                              : "paged_attention: bf16 output needs a bf16 or fp8 KV cache",
                   int(cudaErrorInvalidValue), __FILE__, __LINE__);
}

}  // namespace

size_t attention_workspace_bytes(int64_t max_rows, int64_t num_heads, int64_t head_dim) {
  return ticket_bytes(num_heads) + partial_bytes(std::min(max_rows, kMaxSplitRows), num_heads, head_dim, kMaxSplits);
}

void kv_cache_write(const AttentionBatch& batch, const AttentionShape& shape, const float* k, const float* v,
                    const KvLayerCache& cache, Stream stream) {
  if (batch.num_rows == 0) return;
  const unsigned rows = unsigned(batch.num_rows);
  const int64_t width = shape.num_kv_heads * shape.head_dim;
  const cudaStream_t s = as_stream(stream);
  switch (cache.dtype) {
    case KvDtype::BF16:
      launch_chained(kv_write_kernel<KvDtype::BF16>, rows, 128, 0, s, batch, width, k, v, cache);
      break;
    case KvDtype::F32:
      launch_chained(kv_write_kernel<KvDtype::F32>, rows, 128, 0, s, batch, width, k, v, cache);
      break;
    case KvDtype::FP8_E4M3:
      launch_chained(kv_write_kernel<KvDtype::FP8_E4M3>, rows, 128, 0, s, batch, width, k, v, cache);
      break;
  }
  ANVIL_CUDA_LAUNCHED();
}

void split_qkv_rope_to_cache(const float* qkv, const AttentionBatch& batch, const AttentionShape& shape,
                             const int32_t* positions, const float* inv_freq, float mscale, float* q,
                             const KvLayerCache& cache, Stream stream, const QkNorm* qk_norm) {
  if (batch.num_rows == 0) return;
  const QkNorm norm = qk_norm ? *qk_norm : QkNorm{};
  const dim3 grid(unsigned(batch.num_rows), unsigned(shape.num_heads + 2 * shape.num_kv_heads));
  const unsigned threads = unsigned(std::min<int64_t>(128, std::max<int64_t>(32, shape.head_dim / 2)));
  const cudaStream_t s = as_stream(stream);
  const int64_t heads = shape.num_heads, kv_heads = shape.num_kv_heads, dim = shape.head_dim;
  switch (cache.dtype) {
    case KvDtype::BF16:
      launch_chained(split_qkv_rope_cache_kernel<KvDtype::BF16>, grid, threads, 0, s, qkv, batch, heads, kv_heads, dim,
                     positions, inv_freq, mscale, q, cache, norm);
      break;
    case KvDtype::F32:
      launch_chained(split_qkv_rope_cache_kernel<KvDtype::F32>, grid, threads, 0, s, qkv, batch, heads, kv_heads, dim,
                     positions, inv_freq, mscale, q, cache, norm);
      break;
    case KvDtype::FP8_E4M3:
      launch_chained(split_qkv_rope_cache_kernel<KvDtype::FP8_E4M3>, grid, threads, 0, s, qkv, batch, heads, kv_heads,
                     dim, positions, inv_freq, mscale, q, cache, norm);
      break;
  }
  ANVIL_CUDA_LAUNCHED();
}

namespace {

template <int D, int G, KvDtype KV, typename Out>
void launch_decode(const AttentionBatch& batch, const AttentionShape& shape, const float* q, const KvLayerCache& cache,
                   Out* out, float* partials, int* tickets, int splits, cudaStream_t stream) {
  constexpr auto kernel = decode_attention_kernel<D, G, KV, Out>;
  constexpr size_t smem = decode_smem_bytes<D, G, KV>();
  static bool configured = false;  // per template instance; with the static arrays past 48 KB
  if (!configured) {
    ANVIL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    configured = true;
  }
  const dim3 grid(unsigned(batch.num_sequences), unsigned(shape.num_kv_heads), unsigned(splits));
  launch_chained(kernel, grid, kDecodeWarps<KV> * 32, smem, stream, batch, shape, q, cache, out, partials, tickets, splits);
  ANVIL_CUDA_LAUNCHED();
}

std::atomic<DecodeAttentionKernel>& decode_kernel_choice() {
  static std::atomic<DecodeAttentionKernel> choice{[] {
    const char* env = std::getenv("ANVIL_ATTENTION_MMA");
    if (env && std::string(env) == "0") return DecodeAttentionKernel::CudaCores;
    if (env && std::string(env) == "1") return DecodeAttentionKernel::TensorCores;
    return DecodeAttentionKernel::Auto;
  }()};
  return choice;
}


// Warps per block of the decode kernel that will run (the split rule gives each warp one chunk).
int64_t decode_kernel_warps(bool mma, KvDtype dtype, int64_t head_dim) {
  if (mma) return head_dim == 64 ? kMmaDecodeWarps<64> : kMmaDecodeWarps<128>;
  return decode_warps(dtype);
}

template <int D, int G, typename Out, int W, bool kRope>
void launch_mma_decode_kernel(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                              const KvLayerCache& cache, Out* out, float* partials, int* tickets, int splits,
                              const DecodeRope& rope, cudaStream_t stream) {
  constexpr auto kernel = decode_attention_mma_kernel<D, G, Out, W, kRope>;
  constexpr size_t smem = mma_decode_smem_bytes<D, G, W>();
  allow_smem<kernel>(smem);
  const dim3 grid(unsigned(batch.num_sequences), unsigned(shape.num_kv_heads), unsigned(splits));
  launch_chained(kernel, grid, W * 32, smem, stream, batch, shape, q, cache, out, partials, tickets, splits, rope);
  ANVIL_CUDA_LAUNCHED();
  probe::dump_at_exit();
}

// rope.qkv set: the kernel makes the step's RoPE and KV write itself (head_dim 64 only, where
// decode_rope_in_attention allows it).
template <int D, int G, typename Out, int W = kMmaDecodeWarps<D>>
void launch_mma_decode_warps(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                             const KvLayerCache& cache, Out* out, float* partials, int* tickets, int splits,
                             const DecodeRope& rope, cudaStream_t stream) {
  if constexpr (D == kMmaDecodeWideHeadDim) {
    if (rope.qkv != nullptr)
      return launch_mma_decode_kernel<D, G, Out, W, true>(batch, shape, q, cache, out, partials, tickets, splits, rope,
                                                          stream);
  }
  if (rope.qkv != nullptr)
    throw_cuda_error("paged_attention: RoPE inside the attention needs head_dim 64", int(cudaErrorInvalidValue),
                     __FILE__, __LINE__);
  launch_mma_decode_kernel<D, G, Out, W, false>(batch, shape, q, cache, out, partials, tickets, splits, rope, stream);
}

// Whether this GPU's kernel-table row runs head_dim 64 decode in one 20-warp block per KV head
// where 8-warp blocks would need more than one split (asked once per device).
bool wide_decode_blocks() { return current_device_runs(kDecodeAttentionBlockOp, kDecodeAttentionWide); }

// The most keys a decode launch may see: what decode_attention_splits sizes its splits for.
int64_t decode_context_keys(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache) {
  return std::min(attention_context_bound(batch, shape), int64_t(batch.max_blocks) * cache.block_size);
}

template <int D, int G, typename Out>
void launch_mma_decode(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                       const KvLayerCache& cache, Out* out, float* partials, int* tickets, int splits,
                       const DecodeRope& rope, cudaStream_t stream) {
  if constexpr (D == kMmaDecodeWideHeadDim) {
    const int wide_splits = decode_attention_wide_splits(batch, shape, cache, splits, current_multiprocessors());
    if (wide_splits > 0 && wide_decode_blocks())
      return launch_mma_decode_warps<D, G, Out, kMmaDecodeWideWarps>(batch, shape, q, cache, out, partials, tickets,
                                                                     wide_splits, rope, stream);
  }
  launch_mma_decode_warps<D, G, Out>(batch, shape, q, cache, out, partials, tickets, splits, rope, stream);
}

template <int D, int G, typename Out>
void dispatch_decode_kv(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                        const KvLayerCache& cache, Out* out, float* partials, int* tickets, int splits, bool mma,
                        const DecodeRope& rope, cudaStream_t stream) {
  if constexpr (std::is_same_v<Out, float>) {
    if (cache.dtype == KvDtype::F32)
      return launch_decode<D, G, KvDtype::F32>(batch, shape, q, cache, out, partials, tickets, splits, stream);
  } else {
    if constexpr (kMmaDecodeHeadDim<D>) {
      if (mma) return launch_mma_decode<D, G>(batch, shape, q, cache, out, partials, tickets, splits, rope, stream);
    }
    if (cache.dtype == KvDtype::BF16)
      return launch_decode<D, G, KvDtype::BF16>(batch, shape, q, cache, out, partials, tickets, splits, stream);
    if (cache.dtype == KvDtype::FP8_E4M3)
      return launch_decode<D, G, KvDtype::FP8_E4M3>(batch, shape, q, cache, out, partials, tickets, splits, stream);
  }
  dispatch_kv<D>(batch, shape, q, cache, out, partials, 1, stream);  // throws the pairing error
}

template <int D, typename Out>
void dispatch_decode(const AttentionBatch& batch, const AttentionShape& shape, const float* q, const KvLayerCache& cache,
                     Out* out, float* partials, int* tickets, int splits, bool mma, const DecodeRope& rope,
                     cudaStream_t stream) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  if (group <= 2)
    return dispatch_decode_kv<D, 2>(batch, shape, q, cache, out, partials, tickets, splits, mma, rope, stream);
  if (group <= 4)
    return dispatch_decode_kv<D, 4>(batch, shape, q, cache, out, partials, tickets, splits, mma, rope, stream);
  dispatch_decode_kv<D, 8>(batch, shape, q, cache, out, partials, tickets, splits, mma, rope, stream);
}

// rope.qkv set (decode_rope_in_attention said so): the decode kernel makes the step's RoPE and KV
// write itself.
template <typename Out>
void paged_attention_impl(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                          const KvLayerCache& cache, Out* out, void* workspace, size_t workspace_bytes, Stream stream,
                          const DecodeRope& rope = {}) {
  if (batch.num_rows == 0) return;
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0)
    throw_cuda_error("paged_attention: num_heads must be a multiple of num_kv_heads", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  if (shape.head_dim != 32 && shape.head_dim != 64 && shape.head_dim != 128)
    throw_cuda_error("paged_attention: head_dim must be 32, 64 or 128", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const cudaStream_t s = as_stream(stream);
  const size_t tickets_size = ticket_bytes(shape.num_heads);
  if (workspace_bytes < tickets_size)
    throw_cuda_error("paged_attention: workspace smaller than attention_workspace_bytes", int(cudaErrorInvalidValue), __FILE__, __LINE__);
  int* tickets = static_cast<int*>(workspace);
  float* partials = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + tickets_size);
  const size_t partials_room = workspace_bytes - tickets_size;
  // Split until the grid has about two blocks per multiprocessor.
  const int64_t target_blocks = 2 * int64_t(current_multiprocessors());

  if (batch.max_new_tokens == 1 && batch.num_rows == batch.num_sequences && group <= kDecodeMaxGroup) {
    const bool mma = decode_attention_on_tensor_cores(batch, shape, cache);
    if (rope.qkv != nullptr && !mma)
      throw_cuda_error("paged_attention: RoPE inside the attention needs the tensor-core decode kernel",
                       int(cudaErrorInvalidValue), __FILE__, __LINE__);
    int splits = decode_attention_splits(batch, shape, cache, mma, current_multiprocessors());
    if (splits > 1 && partial_bytes(batch.num_rows, shape.num_heads, shape.head_dim, splits) > partials_room) splits = 1;
    switch (shape.head_dim) {
      case 32: return dispatch_decode<32>(batch, shape, q, cache, out, partials, tickets, splits, mma, rope, s);
      case 64: return dispatch_decode<64>(batch, shape, q, cache, out, partials, tickets, splits, mma, rope, s);
      default: return dispatch_decode<128>(batch, shape, q, cache, out, partials, tickets, splits, mma, rope, s);
    }
  }

  if (rope.qkv != nullptr)
    throw_cuda_error("paged_attention: RoPE inside the attention is for decode steps", int(cudaErrorInvalidValue),
                     __FILE__, __LINE__);
  // Split the context when the grid would leave most multiprocessors idle (decode) and each split
  // still gets a few key tiles.
  int splits = 1;
  const int64_t bq = batch.max_new_tokens * group <= 16 ? 16 : 64;
  const int64_t work_items = batch.num_sequences * ceil_div(batch.max_new_tokens * group, bq) * shape.num_kv_heads;
  if (batch.num_rows <= kMaxSplitRows && work_items < target_blocks) {
    // A sliding layer's context is one short window: one key tile per split keeps enough blocks
    // busy at decode (a single split ran 8 blocks for gpt-oss, ~20 us per layer on an H200).
    const int64_t tiles_per_split = shape.sliding_window > 0 ? 1 : 4;
    const int64_t by_length = attention_context_bound(batch, shape) / (tiles_per_split * kKeysPerTile);
    const int64_t by_occupancy = ceil_div(target_blocks, work_items);
    splits = int(std::clamp<int64_t>(std::min(by_length, by_occupancy), 1, kMaxSplits));
  }
  if (splits > 1 && partial_bytes(batch.num_rows, shape.num_heads, shape.head_dim, splits) > partials_room) splits = 1;
  switch (shape.head_dim) {
    case 32: dispatch_kv<32>(batch, shape, q, cache, out, partials, splits, s); break;
    case 64: dispatch_kv<64>(batch, shape, q, cache, out, partials, splits, s); break;
    default: dispatch_kv<128>(batch, shape, q, cache, out, partials, splits, s); break;
  }
  if (splits > 1) {
    launch_chained(merge_splits_kernel<Out>, dim3(unsigned(batch.num_rows), unsigned(shape.num_heads)), 64, 0, s,
                   partials, splits, shape.num_heads, int(shape.head_dim), shape.sinks, out);
    ANVIL_CUDA_LAUNCHED();
  }
}

}  // namespace

void set_decode_attention_kernel(DecodeAttentionKernel kernel) { decode_kernel_choice().store(kernel); }

// The launch's bound on the keys one sequence sees: the longest context, or a sliding layer's
// window plus the step's new tokens.
int64_t attention_context_bound(const AttentionBatch& batch, const AttentionShape& shape) {
  return shape.sliding_window > 0 ? std::min(batch.max_context, shape.sliding_window + batch.max_new_tokens)
                                  : batch.max_context;
}

int decode_attention_splits(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache,
                            bool mma, int multiprocessors) {
  if (batch.num_rows > kMaxSplitRows) return 1;
  // Each warp one 32-key chunk of the longest context the block tables can hold (under CUDA
  // graphs max_context is a far fixed bound, and splits past a sequence's keys only launch blocks
  // that return at once), and about two blocks per multiprocessor.
  const int64_t keys = decode_context_keys(batch, shape, cache);
  const int64_t by_length = ceil_div(ceil_div(keys, kDecodeKeys), decode_kernel_warps(mma, cache.dtype, shape.head_dim));
  const int64_t by_occupancy = ceil_div(2 * int64_t(multiprocessors), batch.num_sequences * shape.num_kv_heads);
  return int(std::clamp<int64_t>(std::min(by_length, by_occupancy), 1, kMaxSplits));
}

int decode_attention_wide_splits(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache,
                                 int splits, int multiprocessors) {
  if (shape.head_dim != kMmaDecodeWideHeadDim) return 0;
  // A sliding window's 129 keys, or any context one 8-warp block holds, stay as they are.
  const int64_t chunks = ceil_div(decode_context_keys(batch, shape, cache), kDecodeKeys);
  if (chunks <= kMmaDecodeWarps<kMmaDecodeWideHeadDim>) return 0;
  // A wide block takes a whole SM's shared memory, so its grid must stay within one block per SM
  // with room for splits: at batch 8 (64 pairs, 5 splits: 320 blocks, 2.4 waves) an H200 ran a
  // 4,096-token context 2 % slower with them, and batch 64 1 % slower.
  const int64_t pairs = batch.num_sequences * shape.num_kv_heads;
  if (pairs <= 0 || 4 * pairs > multiprocessors) return 0;
  return int(std::min<int64_t>({ceil_div(chunks, kMmaDecodeWideWarps), splits, multiprocessors / pairs}));
}

// The step itself no longer matters (session 21: the tensor-core kernel measured faster at every
// context once it fetched its keys before its wait); kept in the signature for the policy's callers.
bool decode_attention_on_tensor_cores(const AttentionBatch& /*batch*/, const AttentionShape& shape,
                                      const KvLayerCache& cache) {
  if (cache.dtype != KvDtype::BF16 || (shape.head_dim != 64 && shape.head_dim != 128)) return false;
  if (shape.num_kv_heads <= 0 || shape.num_heads / shape.num_kv_heads > kDecodeMaxGroup) return false;
  return decode_kernel_choice().load() != DecodeAttentionKernel::CudaCores;
}

void paged_attention(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                     const KvLayerCache& cache, uint16_t* out, void* workspace, size_t workspace_bytes,
                     Stream stream) {
  paged_attention_impl(batch, shape, q, cache, out, workspace, workspace_bytes, stream);
}

bool decode_rope_in_attention(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache) {
  const bool decode_step = batch.num_rows > 0 && batch.max_new_tokens == 1 && batch.num_rows == batch.num_sequences;
  const bool heads = shape.head_dim == kMmaDecodeWideHeadDim && shape.num_kv_heads > 0 &&
                     shape.num_heads % shape.num_kv_heads == 0 &&
                     shape.num_heads / shape.num_kv_heads <= kDecodeMaxGroup;
  return decode_step && heads && decode_attention_on_tensor_cores(batch, shape, cache) && rope_in_attention_allowed() &&
         current_device_runs(kDecodeRopeOp, kDecodeRopeInAttention);
}

void rope_then_attention(const float* qkv, const AttentionBatch& batch, const AttentionShape& shape,
                         const int32_t* positions, const float* inv_freq, float mscale, float* q,
                         const KvLayerCache& cache, uint16_t* out, void* workspace, size_t workspace_bytes,
                         Stream stream) {
  if (!decode_rope_in_attention(batch, shape, cache)) {
    split_qkv_rope_to_cache(qkv, batch, shape, positions, inv_freq, mscale, q, cache, stream);
    return paged_attention(batch, shape, q, cache, out, workspace, workspace_bytes, stream);
  }
  paged_attention_impl(batch, shape, q, cache, out, workspace, workspace_bytes, stream,
                       DecodeRope{qkv, positions, inv_freq, mscale});
}

void paged_attention(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                     const KvLayerCache& cache, float* out, void* workspace, size_t workspace_bytes,
                     Stream stream) {
  paged_attention_impl(batch, shape, q, cache, out, workspace, workspace_bytes, stream);
}

}  // namespace anvil::cuda
