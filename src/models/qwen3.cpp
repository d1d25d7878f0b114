// Qwen3 (Qwen3ForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM): one decoder, whose MLP is dense
// or a softmax-then-top-k MoE per layer. Per-head q/k RMSNorm before RoPE, no biases, optional
// tied embeddings. The whole forward pass is in forward() below (and forward_cuda() for the GPU);
// models.md §3.3 has the math.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "models/cuda_support.h"
#include "models/model.h"
#include "models/step_context.h"

namespace anvil {

namespace {

struct Qwen3Expert {
  LinearWeight gate, up, down;
};

struct Qwen3Layer {
  std::vector<float> input_norm, post_attention_norm, q_norm, k_norm;
  LinearWeight q_proj, k_proj, v_proj, o_proj;
  bool moe = false;
  LinearWeight gate_proj, up_proj, down_proj;  // dense MLP
  LinearWeight router;                         // MoE: [E, H], no bias
  std::vector<Qwen3Expert> experts;
};

#if ANVIL_WITH_CUDA
struct Qwen3CudaLayer {
  const float *input_norm, *post_attention_norm, *q_norm, *k_norm;
  cuda::DenseWeight qkv_proj, o_proj;  // q, k, v stacked in one matrix
  bool moe = false;
  cuda::DenseWeight gate_up, down;  // dense MLP: gate rows then up rows
  const uint16_t* router = nullptr;
  cuda::MoeBf16Weights experts;
  // --quantize-experts: the experts in MXFP4, NVFP4 or FP8 on the quantized-MoE kernels instead.
  // Without it quantized_experts describes the bf16 experts as shipped for the same kernels
  // (bf16 mode); `experts` is their float32 path (--dtype float32).
  bool quantized = false;
  cuda::QuantizedExperts quantized_experts;
};

struct Qwen3Cuda {
  explicit Qwen3Cuda(WeightSource& source) : weights(source) {}
  DeviceWeights weights;
  std::vector<Qwen3CudaLayer> layers;
  const uint16_t *embed_tokens = nullptr, *lm_head = nullptr;
  const float *final_norm = nullptr, *inv_freq = nullptr;
  bool exact = false;  // --dtype float32
  bool any_quantized_experts = false;
  CudaStepRunner runner;
};
#endif

class Qwen3 : public Model {
 public:
  Qwen3(const ModelConfig& config, std::unique_ptr<WeightSource> weights, const LoadOptions& options)
      : Model(config, std::move(weights), options.device, resolve_kv_dtype(options)),
        rope_(config.rope, config.head_dim) {
    if (config.quant_method != QuantMethod::None)
      fail("quantized Qwen3 checkpoints are not supported yet (quantization_config.quant_method)");
#if ANVIL_WITH_CUDA
    if (options.device == Device::Cuda) {
      load_cuda(options.quantize_dense == WeightFormat::FP8, options.quantize_experts);
      cuda_->exact = options.dtype == ComputeDtype::F32;
      cuda_->runner.graphs_enabled = !options.enforce_eager;
      return;
    }
#endif
    load(options);
  }

  size_t weight_bytes_per_token() const override {
    if (device_ == Device::Cuda) {
      const auto& c = config_;
      const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
      // FP8 dense layers (--quantize-dense fp8): a byte per weight and a float per row. A routed
      // expert: bf16, or as --quantize-experts made it.
      const int64_t i = c.moe_intermediate_size;
      bool fp8 = false;
      int64_t expert = 2 * (2 * i * h + h * i);
#if ANVIL_WITH_CUDA
      fp8 = cuda_ && !cuda_->layers.empty() && cuda_->layers[0].o_proj.format == cuda::DenseWeight::Format::FP8;
      for (size_t l = 0; cuda_ && l < cuda_->layers.size(); ++l) {
        if (!cuda_->layers[l].quantized) continue;
        const cuda::ExpertFormat format = cuda_->layers[l].quantized_experts.format;
        expert = cuda::expert_matrix_bytes(format, 2 * i, h) + cuda::expert_matrix_bytes(format, h, i);
      }
#endif
      auto dense = [&](int64_t out, int64_t in) { return fp8 ? out * in + 4 * out : 2 * out * in; };
      int64_t bytes = h * 2 + c.vocab_size * h * 2;
      for (int64_t l = 0; l < c.num_layers; ++l) {
        bytes += dense(q + 2 * kv, h) + dense(h, q);
        bytes += c.is_moe_layer(l) ? 2 * c.num_experts * h + c.num_experts_per_tok * expert
                                   : dense(2 * c.intermediate_size, h) + dense(h, c.intermediate_size);
      }
      return size_t(bytes);
    }
    size_t bytes = size_t(config_.hidden_size) * 2 + lm_head_.weight_bytes();
    for (const auto& layer : layers_) {
      bytes += layer.q_proj.weight_bytes() + layer.k_proj.weight_bytes() + layer.v_proj.weight_bytes() +
               layer.o_proj.weight_bytes();
      if (layer.moe) {
        const auto& e = layer.experts[0];
        bytes += layer.router.weight_bytes() +
                 size_t(config_.num_experts_per_tok) * (e.gate.weight_bytes() + e.up.weight_bytes() + e.down.weight_bytes());
      } else {
        bytes += layer.gate_proj.weight_bytes() + layer.up_proj.weight_bytes() + layer.down_proj.weight_bytes();
      }
    }
    return bytes;
  }

  void forward(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, float* logits) override {
#if ANVIL_WITH_CUDA
    if (device_ == Device::Cuda) return forward_cuda(batch, kv_cache, logits, nullptr);
#endif
    const auto& c = config_;
    const StepContext step(batch, kv_layout_, c);
    const int64_t rows = step.rows, hidden = c.hidden_size, head_dim = c.head_dim;
    const int64_t q_width = c.num_heads * head_dim, kv_width = c.num_kv_heads * head_dim;
    const float eps = float(c.rms_norm_eps);
    ThreadPool& pool = default_thread_pool();

    std::vector<float> x(size_t(rows * hidden)), h(x.size()), mlp_out(x.size());
    std::vector<float> q(size_t(rows * q_width)), attn(q.size()), k(size_t(rows * kv_width)), v(k.size());
    cpu::embedding(embed_tokens_, batch.tokens, x.data());

    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Qwen3Layer& layer = layers_[size_t(l)];
      const int group = kv_layout_.layer_group[size_t(l)];

      // Attention: per-head RMSNorm on q and k, then RoPE, then causal GQA.
      cpu::rms_norm(x.data(), rows, hidden, layer.input_norm.data(), eps, h.data());
      {
        const LinearWeight* projections[] = {&layer.q_proj, &layer.k_proj, &layer.v_proj};
        float* outputs[] = {q.data(), k.data(), v.data()};
        linear_forward_group(projections, h.data(), rows, outputs, pool);
      }
      cpu::rms_norm(q.data(), rows * c.num_heads, head_dim, layer.q_norm.data(), eps, q.data());
      cpu::rms_norm(k.data(), rows * c.num_kv_heads, head_dim, layer.k_norm.data(), eps, k.data());
      for (int64_t r = 0; r < rows; ++r) {
        rope_.apply(q.data() + r * q_width, c.num_heads, head_dim, step.positions[size_t(r)]);
        rope_.apply(k.data() + r * kv_width, c.num_kv_heads, head_dim, step.positions[size_t(r)]);
      }
      cpu::AttentionParams params;
      params.num_heads = c.num_heads;
      params.num_kv_heads = c.num_kv_heads;
      params.head_dim = head_dim;
      params.scale = 1.0f / std::sqrt(float(head_dim));
      params.sliding_window = kv_layout_.group_window[size_t(group)];
      cpu::paged_attention(params, step.group_sequences[size_t(group)], q.data(), k.data(), v.data(),
                           kv_cache[size_t(group)], kv_layout_.layer_slot[size_t(l)], attn.data());
      linear_forward(layer.o_proj, attn.data(), rows, h.data(), pool);
      cpu::add_inplace(x.data(), h.data(), rows * hidden);

      cpu::rms_norm(x.data(), rows, hidden, layer.post_attention_norm.data(), eps, h.data());
      if (layer.moe) {
        moe(layer, h, rows, mlp_out);
      } else {
        dense_mlp(layer.gate_proj, layer.up_proj, layer.down_proj, h.data(), rows, mlp_out.data());
      }
      cpu::add_inplace(x.data(), mlp_out.data(), rows * hidden);
    }

    std::vector<float> last = step.gather_logit_rows(x, hidden);
    const int64_t logit_rows = int64_t(step.logit_rows.size());
    cpu::rms_norm(last.data(), logit_rows, hidden, final_norm_.data(), eps, last.data());
    if (logit_rows > 0) linear_forward(lm_head_, last.data(), logit_rows, logits, pool);
  }

 private:
  // down(silu(gate(x)) * up(x)) for `rows` rows of x.
  static void dense_mlp(const LinearWeight& gate_proj, const LinearWeight& up_proj, const LinearWeight& down_proj,
                        const float* x, int64_t rows, float* out) {
    ThreadPool& pool = default_thread_pool();
    const int64_t width = gate_proj.out_features;
    std::vector<float> gate(size_t(rows * width)), up(gate.size());
    const LinearWeight* projections[] = {&gate_proj, &up_proj};
    float* outputs[] = {gate.data(), up.data()};
    linear_forward_group(projections, x, rows, outputs, pool);
    cpu::silu_mul(gate.data(), up.data(), rows * width, gate.data());
    linear_forward(down_proj, gate.data(), rows, out, pool);
  }

  // Softmax over all experts, then top-k, then (norm_topk_prob) renormalize the k weights.
  void moe(const Qwen3Layer& layer, const std::vector<float>& h, int64_t rows, std::vector<float>& out) const {
    const auto& c = config_;
    const int64_t hidden = c.hidden_size, experts = c.num_experts;
    std::vector<float> probabilities(size_t(rows * experts));
    linear_forward(layer.router, h.data(), rows, probabilities.data(), default_thread_pool());
    std::vector<ExpertAssignment> assignments(static_cast<size_t>(experts));
    for (int64_t r = 0; r < rows; ++r) {
      float* row = probabilities.data() + r * experts;
      cpu::softmax_inplace(row, experts);
      const auto chosen = cpu::top_k_indices(row, experts, c.num_experts_per_tok);
      float sum = 0.0f;
      for (int32_t e : chosen) sum += row[e];
      for (int32_t e : chosen) {
        assignments[size_t(e)].rows.push_back(r);
        assignments[size_t(e)].weights.push_back(c.norm_topk_prob ? row[e] / sum : row[e]);
      }
    }
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t e = 0; e < experts; ++e) {
      const ExpertAssignment& assignment = assignments[size_t(e)];
      const int64_t n = int64_t(assignment.rows.size());
      if (n == 0) continue;
      std::vector<float> input(size_t(n * hidden)), y(input.size());
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(h.data() + assignment.rows[size_t(i)] * hidden, hidden, input.data() + i * hidden);
      const Qwen3Expert& expert = layer.experts[size_t(e)];
      dense_mlp(expert.gate, expert.up, expert.down, input.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        float* target = out.data() + assignment.rows[size_t(i)] * hidden;
        for (int64_t j = 0; j < hidden; ++j) target[j] += assignment.weights[size_t(i)] * y[size_t(i * hidden + j)];
      }
    }
  }

#if ANVIL_WITH_CUDA
  void forward_argmax(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, int32_t* token_ids) override {
    if (device_ != Device::Cuda) return Model::forward_argmax(batch, kv_cache, token_ids);
    forward_cuda(batch, kv_cache, nullptr, token_ids);
  }
  void forward_sample(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, const RowSampling* rows,
                      int32_t* token_ids) override {
    if (device_ != Device::Cuda) return Model::forward_sample(batch, kv_cache, rows, token_ids);
    cuda_->runner.run(batch, kv_layout_, config_, kv_cache, nullptr, token_ids,
                      [&](bool argmax) { enqueue_forward(kv_cache, argmax); }, rows);
  }

  // The same pass on the GPU: bf16 weights, float32 residual stream and accumulation, bf16 matrix
  // inputs and KV cache by default, or everything float32 (`--dtype float32`). Decode steps replay
  // a CUDA graph of the whole pass (models/cuda_support.h).
  void forward_cuda(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, float* logits, int32_t* token_ids) {
    cuda_->runner.run(batch, kv_layout_, config_, kv_cache, logits, token_ids,
                      [&](bool argmax) { enqueue_forward(kv_cache, argmax); });
  }

  void set_step_profiling(bool on) override {
    if (cuda_) cuda_->runner.marks.enable(on);
  }
  std::vector<std::pair<std::string, double>> step_profile() override {
    return cuda_ ? cuda_->runner.marks.times() : std::vector<std::pair<std::string, double>>{};
  }
  double graph_replay_ms() override { return cuda_ ? cuda_->runner.take_replay_ms() : 0.0; }

  void enqueue_forward(std::vector<KvGroupStorage>& kv_cache, bool argmax) {
    const auto& c = config_;
    Qwen3Cuda& g = *cuda_;
    CudaStepRunner& run = g.runner;
    const cuda::Stream stream = run.stream.get();
    const bool exact = g.exact;
    const int64_t rows = run.step.rows, hidden = c.hidden_size, head_dim = c.head_dim;
    const int64_t q_width = c.num_heads * head_dim, kv_width = c.num_kv_heads * head_dim;
    const int64_t qkv_width = q_width + 2 * kv_width;
    const int64_t width = std::max(c.intermediate_size, c.moe_intermediate_size);
    const int64_t experts = std::max<int64_t>(c.num_experts, 1), top_k = std::max<int64_t>(c.num_experts_per_tok, 1);
    const float eps = float(c.rms_norm_eps);
    float* x = run.arena.get<float>(0, rows * hidden);
    uint16_t* h = run.arena.get<uint16_t>(1, rows * std::max(hidden, std::max(q_width, width)));
    float* h_f32 = run.arena.get<float>(2, rows * std::max(hidden, std::max(q_width, width)));
    float* qkv = run.arena.get<float>(3, rows * qkv_width);
    float* q = run.arena.get<float>(4, rows * q_width);
    uint16_t* act = run.arena.get<uint16_t>(5, rows * width);  // a dense MLP's silu(gate) · up
    float* projected = run.arena.get<float>(7, rows * std::max(hidden, 2 * width));
    float* gate_up = run.arena.get<float>(8, rows * 2 * width);
    float* router_logits = run.arena.get<float>(9, rows * experts);
    int32_t* expert_ids = run.arena.get<int32_t>(10, rows * top_k);
    float* expert_weights = run.arena.get<float>(11, rows * top_k);
    const int64_t moe_width = std::max<int64_t>(c.moe_intermediate_size, 1);
    size_t moe_bytes = cuda::moe_bf16_workspace_bytes(rows, int(top_k), moe_width);
    if (g.any_quantized_experts)
      moe_bytes = std::max(moe_bytes, exact ? cuda::moe_quantized_f32_workspace_bytes(rows, int(top_k), moe_width)
                                            : cuda::moe_quantized_workspace_bytes(rows, int(top_k), experts, hidden,
                                                                                  moe_width));
    void* moe_workspace = run.arena.get<uint8_t>(12, int64_t(moe_bytes));
    const size_t attention_bytes = cuda::attention_workspace_bytes(rows, c.num_heads, head_dim);
    void* attention_workspace = run.arena.get_zeroed<uint8_t>(13, int64_t(attention_bytes), stream);

    auto normed_linear = [&](const float* input, const float* norm, const cuda::DenseWeight& weight,
                             int64_t out_features, float* y) {
      if (exact) {
        cuda::rms_norm_f32(input, rows, hidden, norm, eps, h_f32, stream);
        cuda::linear_f32_input(weight, nullptr, h_f32, rows, out_features, hidden, y, stream);
      } else {
        cuda::rms_norm_to_bf16(input, rows, hidden, norm, eps, h, stream);
        cuda::linear(weight, nullptr, h, rows, out_features, hidden, y, stream);
      }
    };

    cuda::embedding_bf16(g.embed_tokens, run.step.tokens, rows, hidden, x, stream);
    // In bf16 mode a quantized MoE's combine also makes the next layer's input norm into h.
    bool input_normed = false;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Qwen3CudaLayer& layer = g.layers[size_t(l)];
      const int group = kv_layout_.layer_group[size_t(l)];
      const int64_t slot = kv_layout_.layer_slot[size_t(l)];

      if (input_normed)
        cuda::linear(layer.qkv_proj, nullptr, h, rows, qkv_width, hidden, qkv, stream);
      else
        normed_linear(x, layer.input_norm, layer.qkv_proj, qkv_width, qkv);
      input_normed = false;
      cuda::AttentionShape shape;
      shape.num_heads = c.num_heads;
      shape.num_kv_heads = c.num_kv_heads;
      shape.head_dim = head_dim;
      shape.scale = 1.0f / std::sqrt(float(head_dim));
      shape.sliding_window = kv_layout_.group_window[size_t(group)];
      KvGroupStorage& storage = kv_cache[size_t(group)];
      const cuda::KvLayerCache cache{storage.device_keys(slot), storage.device_values(slot), storage.shape().block_size,
                                     storage.shape().dtype};
      const cuda::AttentionBatch& view = run.step.groups[size_t(group)];
      // q/k norm and RoPE on q and k, k and v straight into the cache.
      const cuda::QkNorm qk_norm{layer.q_norm, layer.k_norm, eps};
      cuda::split_qkv_rope_to_cache(qkv, view, shape, run.step.positions, g.inv_freq, rope_.attention_scale(), q,
                                    cache, stream, &qk_norm);
      if (exact) {
        cuda::paged_attention(view, shape, q, cache, h_f32, attention_workspace, attention_bytes, stream);
        cuda::linear_f32_input(layer.o_proj, nullptr, h_f32, rows, hidden, q_width, projected, stream);
        cuda::add_inplace(x, projected, rows * hidden, stream);
      } else {
        cuda::paged_attention(view, shape, q, cache, h, attention_workspace, attention_bytes, stream);
        cuda::linear_add(layer.o_proj, nullptr, h, rows, hidden, q_width, x, stream);
      }
      run.marks.record("attention block");

      // In bf16 mode every MoE layer, bf16 experts as shipped included, takes moe_quantized's
      // tensor-core kernels (the grouped GEMM for long prompts, the decode kernels otherwise);
      // the float32 mode keeps the CUDA-core kernels in float32.
      const bool tensor_core_moe = layer.moe && !exact;
      if (layer.moe && !tensor_core_moe) {
        // Routing from the float32 norm output (a discrete choice), experts in float32.
        cuda::rms_norm_f32(x, rows, hidden, layer.post_attention_norm, eps, h_f32, stream);
        cuda::linear_f32_input(layer.router, nullptr, h_f32, rows, c.num_experts, hidden, router_logits, stream);
        cuda::moe_softmax_topk(router_logits, rows, c.num_experts, int(top_k), c.norm_topk_prob, expert_ids,
                               expert_weights, stream);
        if (!layer.quantized)
          cuda::moe_bf16(layer.experts, h_f32, rows, int(top_k), expert_ids, expert_weights, x, moe_workspace,
                         moe_bytes, stream);
        else
          cuda::moe_quantized_f32(layer.quantized_experts, h_f32, rows, int(top_k), expert_ids, expert_weights, x,
                                  moe_workspace, moe_bytes, stream);
      } else if (layer.moe) {
        // The tensor-core kernels take the normed input in bf16, as every other matrix product;
        // the router still sees the float32 norm (rms_norm_router makes both in one launch at
        // decode). Top-k, then a softmax over the k, is softmax, top-k and renormalization
        // (norm_topk_prob) by another road: the routing kernel then picks the experts itself.
        cuda::rms_norm_router(x, rows, hidden, layer.post_attention_norm, eps, layer.router, nullptr, c.num_experts,
                              router_logits, h, h_f32, stream);
        cuda::NextNorm next{l + 1 < c.num_layers ? g.layers[size_t(l + 1)].input_norm : nullptr, eps, h};
        const cuda::NextNorm* next_norm = l + 1 < c.num_layers ? &next : nullptr;
        if (c.norm_topk_prob) {
          cuda::moe_quantized_from_logits(layer.quantized_experts, h, rows, int(top_k), router_logits, expert_ids,
                                          expert_weights, x, moe_workspace, moe_bytes, stream, next_norm);
        } else {
          cuda::moe_softmax_topk(router_logits, rows, c.num_experts, int(top_k), false, expert_ids,
                                 expert_weights, stream);
          cuda::moe_quantized(layer.quantized_experts, h, rows, int(top_k), expert_ids, expert_weights, x,
                              moe_workspace, moe_bytes, stream, next_norm);
        }
        input_normed = next_norm != nullptr;
      } else if (exact) {
        normed_linear(x, layer.post_attention_norm, layer.gate_up, 2 * c.intermediate_size, gate_up);
        cuda::silu_mul_f32(gate_up, rows, c.intermediate_size, h_f32, stream);
        cuda::linear_f32_input(layer.down, nullptr, h_f32, rows, hidden, c.intermediate_size, projected, stream);
        cuda::add_inplace(x, projected, rows * hidden, stream);
      } else {
        // At decode gate_up and silu(gate) · up are one launch (the activation into its own
        // buffer: h is still being read).
        cuda::rms_norm_to_bf16(x, rows, hidden, layer.post_attention_norm, eps, h, stream);
        cuda::linear_silu_mul(layer.gate_up, h, rows, c.intermediate_size, hidden, gate_up, act, stream);
        cuda::linear_add(layer.down, nullptr, act, rows, hidden, c.intermediate_size, x, stream);
      }
      run.marks.record(layer.moe ? "experts block" : "mlp block");
    }

    const int64_t logit_rows = run.step.logit_rows;
    if (logit_rows == 0) return;
    // One row that is its own logit row (a batch-1 decode step) needs no gather: x is that row.
    float* last = rows == 1 ? x : run.arena.get<float>(14, logit_rows * hidden);
    run.device_logits = run.arena.get<float>(15, logit_rows * c.vocab_size);
    if (last != x) cuda::gather_rows_f32(x, run.step.logit_row_index, logit_rows, hidden, last, stream);
    if (exact) {
      float* normed = run.arena.get<float>(16, logit_rows * hidden);
      cuda::rms_norm_f32(last, logit_rows, hidden, g.final_norm, eps, normed, stream);
      cuda::linear_f32_input(g.lm_head, nullptr, normed, logit_rows, c.vocab_size, hidden, run.device_logits, stream);
    } else {
      uint16_t* normed = run.arena.get<uint16_t>(17, logit_rows * hidden);
      cuda::rms_norm_to_bf16(last, logit_rows, hidden, g.final_norm, eps, normed, stream);
      cuda::linear_bf16(g.lm_head, nullptr, normed, logit_rows, c.vocab_size, hidden, run.device_logits, stream);
    }
    run.marks.record("final norm + lm_head");
    if (argmax) {
      run.device_ids = run.arena.get<int32_t>(18, logit_rows);
      cuda::argmax_rows(run.device_logits, logit_rows, c.vocab_size, run.device_ids, stream);
    }
  }

  // fp8: the attention projections and dense MLPs quantized to FP8 on the device
  // (--quantize-dense fp8); experts_format: the MoE experts quantized on the device
  // (--quantize-experts), each checkpoint matrix by the CPU quantizer's rule.
  void load_cuda(bool fp8, std::optional<WeightFormat> experts_format) {
    const auto& c = config_;
    cuda_ = std::make_unique<Qwen3Cuda>(*weights_);
    DeviceWeights& w = cuda_->weights;
    const int64_t hidden = c.hidden_size, head_dim = c.head_dim;
    const int64_t q_width = c.num_heads * head_dim, kv_width = c.num_kv_heads * head_dim;
    cuda_->embed_tokens = w.bf16("model.embed_tokens.weight", {c.vocab_size, hidden});
    cuda_->layers.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Qwen3CudaLayer& layer = cuda_->layers[size_t(l)];
      const std::string p = "model.layers." + std::to_string(l);
      const std::string a = p + ".self_attn.";
      layer.input_norm = w.f32(p + ".input_layernorm.weight", {hidden});
      layer.post_attention_norm = w.f32(p + ".post_attention_layernorm.weight", {hidden});
      layer.q_norm = w.f32(a + "q_norm.weight", {head_dim});
      layer.k_norm = w.f32(a + "k_norm.weight", {head_dim});
      layer.qkv_proj = w.dense({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {q_width, kv_width, kv_width}, hidden, fp8);
      layer.o_proj = w.dense({a + "o_proj.weight"}, {hidden}, q_width, fp8);
      // After the input norm and after attention: both latency-bound, so the projections' one-token
      // products may fetch their weights early (DenseWeight::streams_early).
      layer.qkv_proj.streams_early = layer.o_proj.streams_early = true;
      layer.moe = c.is_moe_layer(l);
      if (layer.moe) {
        const int64_t width = c.moe_intermediate_size, experts = c.num_experts;
        layer.router = w.bf16(p + ".mlp.gate.weight", {experts, hidden});
        std::vector<std::string> gate_up_names, down_names;
        std::vector<int64_t> gate_up_rows, down_rows;
        for (int64_t e = 0; e < experts; ++e) {
          const std::string ep = p + ".mlp.experts." + std::to_string(e);
          gate_up_names.insert(gate_up_names.end(), {ep + ".gate_proj.weight", ep + ".up_proj.weight"});
          gate_up_rows.insert(gate_up_rows.end(), {width, width});
          down_names.push_back(ep + ".down_proj.weight");
          down_rows.push_back(hidden);
        }
        if (experts_format) {
          const cuda::ExpertFormat format = *experts_format == WeightFormat::FP8     ? cuda::ExpertFormat::FP8
                                            : *experts_format == WeightFormat::NVFP4 ? cuda::ExpertFormat::NVFP4
                                                                                     : cuda::ExpertFormat::MXFP4;
          std::vector<std::vector<std::string>> gate_up_parts, down_parts;
          for (int64_t e = 0; e < experts; ++e) {
            gate_up_parts.push_back({gate_up_names[size_t(2 * e)], gate_up_names[size_t(2 * e + 1)]});
            down_parts.push_back({down_names[size_t(e)]});
          }
          const auto gate_up = w.quantized_experts(gate_up_parts, width, hidden, format);
          const auto down = w.quantized_experts(down_parts, hidden, width, format);
          cuda::QuantizedExperts& q = layer.quantized_experts;
          q.format = format;
          q.activation = cuda::ExpertActivation::SiluMul;
          q.gate_up_blocks = gate_up.codes;
          q.gate_up_scales = gate_up.scales;
          q.gate_up_row_scales = gate_up.row_scales;
          q.down_blocks = down.codes;
          q.down_scales = down.scales;
          q.down_row_scales = down.row_scales;
          q.num_experts = experts;
          q.hidden = hidden;
          q.intermediate = width;
          layer.quantized = true;
          cuda_->any_quantized_experts = true;
        } else {
          // Stacked as stored (each expert's gate rows, then its up rows), then laid out in place
          // for both MoE paths (moe_bf16_pack): device memory the load owns.
          auto* gate_up = const_cast<uint16_t*>(w.stacked_bf16(gate_up_names, gate_up_rows, hidden));
          auto* down = const_cast<uint16_t*>(w.stacked_bf16(down_names, down_rows, width));
          cuda::moe_bf16_pack(gate_up, down, experts, hidden, width, nullptr);
          layer.experts.gate_up = gate_up;
          layer.experts.down = down;
          layer.experts.num_experts = experts;
          layer.experts.hidden = hidden;
          layer.experts.intermediate = width;
          cuda::QuantizedExperts& q = layer.quantized_experts;
          q.format = cuda::ExpertFormat::BF16;
          q.activation = cuda::ExpertActivation::SiluMul;
          q.gate_up_blocks = reinterpret_cast<const uint8_t*>(gate_up);
          q.down_blocks = reinterpret_cast<const uint8_t*>(down);
          q.num_experts = experts;
          q.hidden = hidden;
          q.intermediate = width;
          cuda_->any_quantized_experts = true;
        }
      } else {
        const int64_t width = c.intermediate_size;
        layer.gate_up = w.dense({p + ".mlp.gate_proj.weight", p + ".mlp.up_proj.weight"}, {width, width}, hidden, fp8);
        layer.down = w.dense({p + ".mlp.down_proj.weight"}, {hidden}, width, fp8);
      }
    }
    cuda_->final_norm = w.f32("model.norm.weight", {hidden});
    // Tied checkpoints have no lm_head tensor; the embedding doubles as the output projection.
    cuda_->lm_head = c.tie_word_embeddings ? cuda_->embed_tokens : w.bf16("lm_head.weight", {c.vocab_size, hidden});
    cuda_->inv_freq = w.upload(rope_.inv_freq());
  }

  std::unique_ptr<Qwen3Cuda> cuda_;
#endif

  // --quantize-dense applies to q/k/v/o and the dense MLPs, --quantize-experts to the MoE experts;
  // the router, embeddings and lm_head stay as stored.
  void load(const LoadOptions& options) {
    const auto& c = config_;
    WeightSource& w = *weights_;
    const int64_t hidden = c.hidden_size, head_dim = c.head_dim;
    std::vector<float> no_bias;
    ThreadPool& pool = default_thread_pool();
    auto dense = [&](const std::string& prefix, int64_t out, int64_t in) {
      return quantized_.convert(load_dense_linear(w, prefix, out, in, false, no_bias), options.quantize_dense,
                                prefix + ".weight", pool);
    };
    auto expert = [&](const std::string& prefix, int64_t out, int64_t in) {
      return quantized_.convert(load_dense_linear(w, prefix, out, in, false, no_bias), options.quantize_experts,
                                prefix + ".weight", pool);
    };
    embed_tokens_ = w.get("model.embed_tokens.weight", {c.vocab_size, hidden}, DType::BF16,
                          {DType::BF16, DType::F32, DType::F16});
    layers_.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Qwen3Layer& layer = layers_[size_t(l)];
      const std::string p = "model.layers." + std::to_string(l);
      layer.input_norm = load_f32(w, p + ".input_layernorm.weight", {hidden});
      layer.post_attention_norm = load_f32(w, p + ".post_attention_layernorm.weight", {hidden});
      layer.q_norm = load_f32(w, p + ".self_attn.q_norm.weight", {head_dim});
      layer.k_norm = load_f32(w, p + ".self_attn.k_norm.weight", {head_dim});
      layer.q_proj = dense(p + ".self_attn.q_proj", c.num_heads * head_dim, hidden);
      layer.k_proj = dense(p + ".self_attn.k_proj", c.num_kv_heads * head_dim, hidden);
      layer.v_proj = dense(p + ".self_attn.v_proj", c.num_kv_heads * head_dim, hidden);
      layer.o_proj = dense(p + ".self_attn.o_proj", hidden, c.num_heads * head_dim);
      layer.moe = c.is_moe_layer(l);
      if (layer.moe) {
        const int64_t width = c.moe_intermediate_size;
        layer.router = load_dense_linear(w, p + ".mlp.gate", c.num_experts, hidden, false, no_bias);
        layer.experts.resize(size_t(c.num_experts));
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string ep = p + ".mlp.experts." + std::to_string(e);
          layer.experts[size_t(e)] = {expert(ep + ".gate_proj", width, hidden), expert(ep + ".up_proj", width, hidden),
                                      expert(ep + ".down_proj", hidden, width)};
        }
      } else {
        const int64_t width = c.intermediate_size;
        layer.gate_proj = dense(p + ".mlp.gate_proj", width, hidden);
        layer.up_proj = dense(p + ".mlp.up_proj", width, hidden);
        layer.down_proj = dense(p + ".mlp.down_proj", hidden, width);
      }
    }
    final_norm_ = load_f32(w, "model.norm.weight", {hidden});
    // Tied checkpoints have no lm_head tensor; the embedding doubles as the output projection.
    if (c.tie_word_embeddings) {
      lm_head_.format = embed_tokens_.dtype == DType::F32 ? WeightFormat::F32
                        : embed_tokens_.dtype == DType::BF16 ? WeightFormat::BF16
                                                             : WeightFormat::F16;
      lm_head_.out_features = c.vocab_size;
      lm_head_.in_features = hidden;
      lm_head_.data = embed_tokens_.data;
    } else {
      lm_head_ = load_dense_linear(w, "lm_head", c.vocab_size, hidden, false, no_bias);
    }
  }

  RopeTable rope_;
  TensorView embed_tokens_;
  std::vector<Qwen3Layer> layers_;
  std::vector<float> final_norm_;
  LinearWeight lm_head_;
  QuantizedStore quantized_;  // the layers that --quantize-* replaced
};

}  // namespace

std::unique_ptr<Model> make_qwen3(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                  const LoadOptions& options) {
  return std::make_unique<Qwen3>(config, std::move(weights), options);
}

std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                      const LoadOptions& options) {
  return std::make_unique<Qwen3>(config, std::move(weights), options);
}

}  // namespace anvil
