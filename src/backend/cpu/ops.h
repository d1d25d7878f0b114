#pragma once
// The CPU operators model files are written against. float32 activations and accumulation;
// row-major [tokens, features] buffers; parallel over the default thread pool.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/kv_storage.h"
#include "backend/linear.h"
#include "backend/rope.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace anvil::cpu {

// out[t] = table[ids[t]] as float32; table is [vocab, dim] in F32, BF16 or F16.
void embedding(const TensorView& table, std::span<const int32_t> ids, float* out);

// out = x * rsqrt(mean(x^2) + eps) * weight, per row of `dim`. out may alias x.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out);

// x += y
void add_inplace(float* x, const float* y, int64_t n);

// Qwen/Llama MLP activation: out[i] = silu(gate[i]) * up[i].
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// gpt-oss expert activation on interleaved gate/up rows [rows, 2*width] -> [rows, width]:
// gate clamped above at limit, up clamped to [-limit, limit], out = gate*sigmoid(1.702 gate)*(up+1).
void swiglu_oai(const float* gate_up, int64_t rows, int64_t width, float limit, float* out);

// In-place softmax over n values.
void softmax_inplace(float* x, int64_t n);

// Indices of the k largest values, largest first; ties go to the lower index.
std::vector<int32_t> top_k_indices(const float* x, int64_t n, int64_t k);

// One sequence's share of an attention step: its new tokens are rows [row_begin, row_begin +
// num_tokens) of q/k/v, at absolute positions start_pos ... Its KV lives in the blocks of
// block_table (index = position / block_size; -1 for blocks given back).
struct AttentionSequence {
  int64_t row_begin = 0;
  int64_t num_tokens = 0;
  int64_t start_pos = 0;
  std::span<const int32_t> block_table;
};

struct AttentionParams {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  int64_t sliding_window = 0;    // 0 = full causal; else keys in (pos - window, pos]
  const float* sinks = nullptr;  // [num_heads] learned logits joining the softmax, or null
};

// Stores the new keys/values in the cache, then computes causal attention for every new token.
// q: [rows, heads*head_dim], k/v: [rows, kv_heads*head_dim], out: [rows, heads*head_dim].
void paged_attention(const AttentionParams& params, std::span<const AttentionSequence> sequences, const float* q,
                     const float* k, const float* v, KvGroupStorage& cache, int64_t layer, float* out);

}  // namespace anvil::cpu
