#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/vector_ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace anvil::cpu {

void embedding(const TensorView& table, std::span<const int32_t> ids, float* out) {
  if (table.shape.size() != 2) fail("embedding table must be 2-D, got {}", shape_string(table.shape));
  const int64_t vocab = table.shape[0], dim = table.shape[1];
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t id = ids[t];
    if (id < 0 || id >= vocab) fail("token id {} is outside the vocabulary (size {})", id, vocab);
    float* row = out + int64_t(t) * dim;
    switch (table.dtype) {
      case DType::F32:
        std::memcpy(row, static_cast<const float*>(table.data) + id * dim, size_t(dim) * sizeof(float));
        break;
      case DType::BF16: {
        const uint16_t* src = static_cast<const uint16_t*>(table.data) + id * dim;
        for (int64_t i = 0; i < dim; ++i) row[i] = bf16_to_f32(src[i]);
        break;
      }
      case DType::F16: {
        const uint16_t* src = static_cast<const uint16_t*>(table.data) + id * dim;
        for (int64_t i = 0; i < dim; ++i) row[i] = f16_to_f32(src[i]);
        break;
      }
      default:
        fail("embedding table dtype {} is not supported", dtype_name(table.dtype));
    }
  }
}

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * dim;
    float* o = out + r * dim;
    const float mean_square = dot_f32(in, in, dim) / float(dim);
    const float inv = 1.0f / std::sqrt(mean_square + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = in[i] * inv * weight[i];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  auto range = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  };
  // An exp per element: batched decode of a few sequences reaches ~50k per layer, which on one
  // thread took longer than the layer's matrix products on sixteen. Elementwise, so the split
  // does not change any result.
  constexpr int64_t kParallelElements = int64_t(1) << 14;
  if (n >= kParallelElements) {
    default_thread_pool().parallel_for(n, range, 4096);
  } else {
    range(0, n);
  }
}

void swiglu_oai(const float* gate_up, int64_t rows, int64_t width, float limit, float* out) {
  constexpr float kAlpha = 1.702f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = gate_up + r * 2 * width;
    float* o = out + r * width;
    for (int64_t i = 0; i < width; ++i) {
      const float gate = std::min(in[2 * i], limit);
      const float up = std::clamp(in[2 * i + 1], -limit, limit);
      o[i] = gate / (1.0f + std::exp(-kAlpha * gate)) * (up + 1.0f);
    }
  }
}

void softmax_inplace(float* x, int64_t n) {
  if (n <= 0) return;
  const float max_value = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

std::vector<int32_t> top_k_indices(const float* x, int64_t n, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  k = std::min(k, n);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  order.resize(size_t(k));
  return order;
}

namespace {

void store_new_kv(const AttentionParams& params, const AttentionSequence& seq, const float* k, const float* v,
                  KvGroupStorage& cache, int64_t layer) {
  const int64_t block_size = cache.shape().block_size;
  const int64_t width = params.num_kv_heads * params.head_dim;
  for (int64_t t = 0; t < seq.num_tokens; ++t) {
    const int64_t pos = seq.start_pos + t;
    const int64_t logical_block = pos / block_size;
    if (logical_block >= int64_t(seq.block_table.size()) || seq.block_table[size_t(logical_block)] < 0)
      fail("KV cache has no block for position {}", pos);
    const int64_t block = seq.block_table[size_t(logical_block)];
    std::memcpy(cache.key(layer, block, pos % block_size), k + (seq.row_begin + t) * width,
                size_t(width) * sizeof(float));
    std::memcpy(cache.value(layer, block, pos % block_size), v + (seq.row_begin + t) * width,
                size_t(width) * sizeof(float));
  }
}

}  // namespace

void paged_attention(const AttentionParams& params, std::span<const AttentionSequence> sequences, const float* q,
                     const float* k, const float* v, KvGroupStorage& cache, int64_t layer, float* out) {
  if (params.num_kv_heads <= 0 || params.num_heads % params.num_kv_heads)
    fail("attention heads {} are not a multiple of KV heads {}", params.num_heads, params.num_kv_heads);
  for (const auto& seq : sequences) store_new_kv(params, seq, k, v, cache, layer);

  // One work item per (sequence token, query head); all read the cache only.
  struct Item {
    const AttentionSequence* seq;
    int64_t token;
  };
  std::vector<Item> items;
  for (const auto& seq : sequences)
    for (int64_t t = 0; t < seq.num_tokens; ++t) items.push_back({&seq, t});
  const int64_t heads = params.num_heads, dim = params.head_dim;
  const int64_t group = heads / params.num_kv_heads;
  const int64_t block_size = cache.shape().block_size;
  const int64_t total = int64_t(items.size()) * heads;

  default_thread_pool().parallel_for(total, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t index = begin; index < end; ++index) {
      const Item& item = items[size_t(index / heads)];
      const int64_t head = index % heads, kv_head = head / group;
      const AttentionSequence& seq = *item.seq;
      const int64_t row = seq.row_begin + item.token;
      const int64_t pos = seq.start_pos + item.token;
      const int64_t first = params.sliding_window > 0 ? std::max<int64_t>(0, pos - params.sliding_window + 1) : 0;
      const float* query = q + row * heads * dim + head * dim;
      scores.resize(size_t(pos - first + 1));
      float max_score = params.sinks ? params.sinks[head] : -std::numeric_limits<float>::infinity();
      for (int64_t j = first; j <= pos; ++j) {
        const int64_t block = seq.block_table[size_t(j / block_size)];
        const float* key = cache.key(layer, block, j % block_size) + kv_head * dim;
        const float score = dot_f32(query, key, dim) * params.scale;
        scores[size_t(j - first)] = score;
        max_score = std::max(max_score, score);
      }
      float denominator = params.sinks ? std::exp(params.sinks[head] - max_score) : 0.0f;
      for (float& score : scores) {
        score = std::exp(score - max_score);
        denominator += score;
      }
      float* o = out + row * heads * dim + head * dim;
      std::fill(o, o + dim, 0.0f);
      const float inv = 1.0f / denominator;
      for (int64_t j = first; j <= pos; ++j) {
        const int64_t block = seq.block_table[size_t(j / block_size)];
        const float* value = cache.value(layer, block, j % block_size) + kv_head * dim;
        axpy_f32(scores[size_t(j - first)] * inv, value, o, dim);
      }
    }
  });
}

}  // namespace anvil::cpu
