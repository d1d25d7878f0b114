// gpt-oss (GptOssForCausalLM): alternating sliding/full attention with learned sinks and YaRN
// RoPE, and a top-4 MoE whose experts are MXFP4, decoded inside the linear kernels (never
// expanded to a float copy). The whole forward pass is in forward() below; models.md §1 has the
// reference math this follows.
#include <cmath>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "models/model.h"
#include "models/step_context.h"

namespace anvil {

namespace {

struct GptOssLayer {
  std::vector<float> input_norm, post_attention_norm, sinks;
  std::vector<float> q_bias, k_bias, v_bias, o_bias, router_bias;
  LinearWeight q_proj, k_proj, v_proj, o_proj, router;
  std::vector<LinearWeight> gate_up;  // per expert: MXFP4 [2I, H], rows interleave gate and up
  std::vector<LinearWeight> down;     // per expert: MXFP4 [H, I]
  std::vector<float> gate_up_bias, down_bias;  // [E, 2I] and [E, H]
};

class GptOss : public Model {
 public:
  GptOss(const ModelConfig& config, std::unique_ptr<WeightSource> weights)
      : Model(config, std::move(weights)), rope_(config.rope, config.head_dim) {
    if (config.quant_method != QuantMethod::Mxfp4)
      fail("gpt-oss checkpoints without MXFP4 experts are not supported yet (quantization_config.quant_method)");
    load();
  }

  size_t weight_bytes_per_token() const override {
    const auto& c = config_;
    size_t bytes = size_t(c.hidden_size) * 2 + lm_head_.weight_bytes();  // one embedding row + lm_head
    for (const auto& layer : layers_) {
      bytes += layer.q_proj.weight_bytes() + layer.k_proj.weight_bytes() + layer.v_proj.weight_bytes() +
               layer.o_proj.weight_bytes() + layer.router.weight_bytes();
      bytes += size_t(c.num_experts_per_tok) * (layer.gate_up[0].weight_bytes() + layer.down[0].weight_bytes());
    }
    return bytes;
  }

  void forward(const StepBatch& batch, std::vector<KvGroupStorage>& kv_cache, float* logits) override {
    const auto& c = config_;
    const StepContext step(batch, kv_layout_, c);
    const int64_t rows = step.rows, hidden = c.hidden_size, head_dim = c.head_dim;
    const int64_t q_width = c.num_heads * head_dim, kv_width = c.num_kv_heads * head_dim;
    ThreadPool& pool = default_thread_pool();

    std::vector<float> x(size_t(rows * hidden)), h(x.size()), q(size_t(rows * q_width)), attn(q.size());
    std::vector<float> k(size_t(rows * kv_width)), v(k.size()), router_logits(size_t(rows * c.num_experts));
    std::vector<float> moe_out(x.size());
    cpu::embedding(embed_tokens_, batch.tokens, x.data());

    for (int64_t l = 0; l < c.num_layers; ++l) {
      const GptOssLayer& layer = layers_[size_t(l)];
      const int group = kv_layout_.layer_group[size_t(l)];

      // Attention: q/k/v with biases, YaRN RoPE (mscale on cos and sin), sinks in the softmax.
      cpu::rms_norm(x.data(), rows, hidden, layer.input_norm.data(), float(c.rms_norm_eps), h.data());
      linear_forward(layer.q_proj, h.data(), rows, q.data(), pool);
      linear_forward(layer.k_proj, h.data(), rows, k.data(), pool);
      linear_forward(layer.v_proj, h.data(), rows, v.data(), pool);
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
      params.sinks = layer.sinks.data();
      cpu::paged_attention(params, step.group_sequences[size_t(group)], q.data(), k.data(), v.data(),
                           kv_cache[size_t(group)], kv_layout_.layer_slot[size_t(l)], attn.data());
      linear_forward(layer.o_proj, attn.data(), rows, h.data(), pool);
      cpu::add_inplace(x.data(), h.data(), rows * hidden);

      // MoE: router top-k first, then softmax over the k chosen logits.
      cpu::rms_norm(x.data(), rows, hidden, layer.post_attention_norm.data(), float(c.rms_norm_eps), h.data());
      linear_forward(layer.router, h.data(), rows, router_logits.data(), pool);
      std::vector<ExpertAssignment> assignments(size_t(c.num_experts));
      for (int64_t r = 0; r < rows; ++r) {
        const float* row_logits = router_logits.data() + r * c.num_experts;
        const auto chosen = cpu::top_k_indices(row_logits, c.num_experts, c.num_experts_per_tok);
        std::vector<float> weights(chosen.size());
        for (size_t i = 0; i < chosen.size(); ++i) weights[i] = row_logits[chosen[i]];
        cpu::softmax_inplace(weights.data(), int64_t(weights.size()));
        for (size_t i = 0; i < chosen.size(); ++i) {
          assignments[size_t(chosen[i])].rows.push_back(r);
          assignments[size_t(chosen[i])].weights.push_back(weights[i]);
        }
      }
      std::fill(moe_out.begin(), moe_out.end(), 0.0f);
      for (int64_t e = 0; e < c.num_experts; ++e) run_expert(layer, e, assignments[size_t(e)], h, moe_out);
      cpu::add_inplace(x.data(), moe_out.data(), rows * hidden);
    }

    std::vector<float> last = step.gather_logit_rows(x, hidden);
    const int64_t logit_rows = int64_t(step.logit_rows.size());
    cpu::rms_norm(last.data(), logit_rows, hidden, final_norm_.data(), float(c.rms_norm_eps), last.data());
    if (logit_rows > 0) linear_forward(lm_head_, last.data(), logit_rows, logits, pool);
  }

 private:
  // One expert over the rows routed to it: u = W1 h + b1; a = swiglu(u); y = W2 a + b2 (the down
  // bias goes in before the routing weight); out[row] += weight * y.
  void run_expert(const GptOssLayer& layer, int64_t expert, const ExpertAssignment& assignment,
                  const std::vector<float>& h, std::vector<float>& out) const {
    const int64_t n = int64_t(assignment.rows.size());
    if (n == 0) return;
    const auto& c = config_;
    const int64_t hidden = c.hidden_size, width = c.intermediate_size;
    std::vector<float> input(size_t(n * hidden)), gate_up(size_t(n * 2 * width)), activated(size_t(n * width));
    std::vector<float> y(size_t(n * hidden));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(h.data() + assignment.rows[size_t(i)] * hidden, hidden, input.data() + i * hidden);
    ThreadPool& pool = default_thread_pool();
    linear_forward(layer.gate_up[size_t(expert)], input.data(), n, gate_up.data(), pool);
    cpu::swiglu_oai(gate_up.data(), n, width, float(c.swiglu_limit), activated.data());
    linear_forward(layer.down[size_t(expert)], activated.data(), n, y.data(), pool);
    for (int64_t i = 0; i < n; ++i) {
      float* target = out.data() + assignment.rows[size_t(i)] * hidden;
      const float weight = assignment.weights[size_t(i)];
      for (int64_t j = 0; j < hidden; ++j) target[j] += weight * y[size_t(i * hidden + j)];
    }
  }

  void load() {
    const auto& c = config_;
    WeightSource& w = *weights_;
    const int64_t hidden = c.hidden_size, head_dim = c.head_dim, experts = c.num_experts;
    const int64_t width = c.intermediate_size;
    if (hidden % 32 || width % 32) fail("gpt-oss hidden_size and intermediate_size must be multiples of 32");
    embed_tokens_ = w.get("model.embed_tokens.weight", {c.vocab_size, hidden}, DType::BF16,
                          {DType::BF16, DType::F32, DType::F16});
    layers_.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      GptOssLayer& layer = layers_[size_t(l)];
      const std::string p = "model.layers." + std::to_string(l);
      layer.input_norm = load_f32(w, p + ".input_layernorm.weight", {hidden});
      layer.post_attention_norm = load_f32(w, p + ".post_attention_layernorm.weight", {hidden});
      layer.sinks = load_f32(w, p + ".self_attn.sinks", {c.num_heads});
      layer.q_proj = load_dense_linear(w, p + ".self_attn.q_proj", c.num_heads * head_dim, hidden, true, layer.q_bias);
      layer.k_proj = load_dense_linear(w, p + ".self_attn.k_proj", c.num_kv_heads * head_dim, hidden, true, layer.k_bias);
      layer.v_proj = load_dense_linear(w, p + ".self_attn.v_proj", c.num_kv_heads * head_dim, hidden, true, layer.v_bias);
      layer.o_proj = load_dense_linear(w, p + ".self_attn.o_proj", hidden, c.num_heads * head_dim, true, layer.o_bias);
      layer.router = load_dense_linear(w, p + ".mlp.router", experts, hidden, true, layer.router_bias);
      layer.gate_up_bias = load_f32(w, p + ".mlp.experts.gate_up_proj_bias", {experts, 2 * width});
      layer.down_bias = load_f32(w, p + ".mlp.experts.down_proj_bias", {experts, hidden});
      layer.gate_up = load_mxfp4_experts(p + ".mlp.experts.gate_up_proj", 2 * width, hidden, layer.gate_up_bias);
      layer.down = load_mxfp4_experts(p + ".mlp.experts.down_proj", hidden, width, layer.down_bias);
    }
    final_norm_ = load_f32(w, "model.norm.weight", {hidden});
    lm_head_ = load_dense_linear(w, "lm_head", c.vocab_size, hidden, false, lm_head_bias_);
  }

  std::vector<LinearWeight> load_mxfp4_experts(const std::string& prefix, int64_t out, int64_t in,
                                               const std::vector<float>& bias) {
    const int64_t experts = config_.num_experts, groups = in / 32;
    const TensorView blocks = weights_->get(prefix + "_blocks", {experts, out, groups, 16}, DType::U8, {DType::U8});
    const TensorView scales = weights_->get(prefix + "_scales", {experts, out, groups}, DType::U8, {DType::U8});
    std::vector<LinearWeight> per_expert(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      LinearWeight& weight = per_expert[size_t(e)];
      weight.format = WeightFormat::MXFP4;
      weight.out_features = out;
      weight.in_features = in;
      weight.data = static_cast<const uint8_t*>(blocks.data) + e * out * groups * 16;
      weight.scales = static_cast<const uint8_t*>(scales.data) + e * out * groups;
      weight.bias = bias.data() + e * out;
    }
    return per_expert;
  }

  RopeTable rope_;
  TensorView embed_tokens_;
  std::vector<GptOssLayer> layers_;
  std::vector<float> final_norm_, lm_head_bias_;
  LinearWeight lm_head_;
};

}  // namespace

std::unique_ptr<Model> make_gpt_oss(const ModelConfig& config, std::unique_ptr<WeightSource> weights) {
  return std::make_unique<GptOss>(config, std::move(weights));
}

}  // namespace anvil
