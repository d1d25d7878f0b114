// Qwen3 (Qwen3ForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM): one decoder, whose MLP is dense
// or a softmax-then-top-k MoE per layer. Per-head q/k RMSNorm before RoPE, no biases, optional
// tied embeddings. The whole forward pass is in forward() below; models.md §3.3 has the math.
#include <cmath>

#include "backend/cpu/ops.h"
#include "core/error.h"
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

class Qwen3 : public Model {
 public:
  Qwen3(const ModelConfig& config, std::unique_ptr<WeightSource> weights)
      : Model(config, std::move(weights)), rope_(config.rope, config.head_dim) {
    if (config.quant_method != QuantMethod::None)
      fail("quantized Qwen3 checkpoints are not supported yet (quantization_config.quant_method)");
    load();
  }

  size_t weight_bytes_per_token() const override {
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
      linear_forward(layer.q_proj, h.data(), rows, q.data(), pool);
      linear_forward(layer.k_proj, h.data(), rows, k.data(), pool);
      linear_forward(layer.v_proj, h.data(), rows, v.data(), pool);
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
    linear_forward(gate_proj, x, rows, gate.data(), pool);
    linear_forward(up_proj, x, rows, up.data(), pool);
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

  void load() {
    const auto& c = config_;
    WeightSource& w = *weights_;
    const int64_t hidden = c.hidden_size, head_dim = c.head_dim;
    std::vector<float> no_bias;
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
      layer.q_proj = load_dense_linear(w, p + ".self_attn.q_proj", c.num_heads * head_dim, hidden, false, no_bias);
      layer.k_proj = load_dense_linear(w, p + ".self_attn.k_proj", c.num_kv_heads * head_dim, hidden, false, no_bias);
      layer.v_proj = load_dense_linear(w, p + ".self_attn.v_proj", c.num_kv_heads * head_dim, hidden, false, no_bias);
      layer.o_proj = load_dense_linear(w, p + ".self_attn.o_proj", hidden, c.num_heads * head_dim, false, no_bias);
      layer.moe = c.is_moe_layer(l);
      if (layer.moe) {
        const int64_t width = c.moe_intermediate_size;
        layer.router = load_dense_linear(w, p + ".mlp.gate", c.num_experts, hidden, false, no_bias);
        layer.experts.resize(size_t(c.num_experts));
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string ep = p + ".mlp.experts." + std::to_string(e);
          layer.experts[size_t(e)] = {load_dense_linear(w, ep + ".gate_proj", width, hidden, false, no_bias),
                                      load_dense_linear(w, ep + ".up_proj", width, hidden, false, no_bias),
                                      load_dense_linear(w, ep + ".down_proj", hidden, width, false, no_bias)};
        }
      } else {
        const int64_t width = c.intermediate_size;
        layer.gate_proj = load_dense_linear(w, p + ".mlp.gate_proj", width, hidden, false, no_bias);
        layer.up_proj = load_dense_linear(w, p + ".mlp.up_proj", width, hidden, false, no_bias);
        layer.down_proj = load_dense_linear(w, p + ".mlp.down_proj", hidden, width, false, no_bias);
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
};

}  // namespace

std::unique_ptr<Model> make_qwen3(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                  const LoadOptions& options) {
  if (options.device != Device::Cpu) fail("Qwen3 runs on the CPU only so far (--device cpu)");
  return std::make_unique<Qwen3>(config, std::move(weights));
}

std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                      const LoadOptions& options) {
  if (options.device != Device::Cpu) fail("Qwen3-MoE runs on the CPU only so far (--device cpu)");
  return std::make_unique<Qwen3>(config, std::move(weights));
}

}  // namespace anvil
