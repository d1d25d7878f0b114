// gpt-oss (GptOssForCausalLM): alternating sliding/full attention with learned sinks and YaRN
// RoPE, and a top-4 MoE whose experts are MXFP4, decoded inside the linear kernels (never
// expanded to a float copy). The whole forward pass is in forward() below; models.md §1 has the
// reference math this follows.
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "models/cuda_support.h"
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

#if ANVIL_WITH_CUDA
struct GptOssCudaLayer {
  const float *input_norm, *post_attention_norm, *sinks;
  const float *qkv_bias, *o_bias, *router_bias;
  cuda::DenseWeight qkv_proj, o_proj;  // [out, in]; q, k, v stacked in one matrix
  const uint16_t* router;              // bf16 [E, H]
  cuda::QuantizedExperts experts;
};

// --quantize-experts on CUDA; the checkpoint's MXFP4 otherwise (mxfp4 is already what it holds).
cuda::ExpertFormat cuda_expert_format(std::optional<WeightFormat> target) {
  if (target == WeightFormat::NVFP4) return cuda::ExpertFormat::NVFP4;
  if (target == WeightFormat::FP8) return cuda::ExpertFormat::FP8;
  return cuda::ExpertFormat::MXFP4;
}

struct GptOssCuda {
  explicit GptOssCuda(WeightSource& source) : weights(source) {}
  DeviceWeights weights;
  std::vector<GptOssCudaLayer> layers;
  const uint16_t *embed_tokens = nullptr, *lm_head = nullptr;
  const float *final_norm = nullptr, *inv_freq = nullptr;
  bool exact = false;  // --dtype float32
  CudaStepRunner runner;
};
#endif

class GptOss : public Model {
 public:
  GptOss(const ModelConfig& config, std::unique_ptr<WeightSource> weights, const LoadOptions& options)
      : Model(config, std::move(weights), options.device, resolve_kv_dtype(options)), rope_(config.rope, config.head_dim) {
    if (config.quant_method != QuantMethod::Mxfp4)
      fail("gpt-oss checkpoints without MXFP4 experts are not supported yet (quantization_config.quant_method)");
    if (config.hidden_size % 32 || config.intermediate_size % 32)
      fail("gpt-oss hidden_size and intermediate_size must be multiples of 32");
#if ANVIL_WITH_CUDA
    if (options.device == Device::Cuda) {
      load_cuda(options.quantize_dense == WeightFormat::FP8, cuda_expert_format(options.quantize_experts));
      cuda_->exact = options.dtype == ComputeDtype::F32;
      cuda_->runner.graphs_enabled = !options.enforce_eager;
      return;
    }
#endif
    load(options);
  }

  size_t weight_bytes_per_token() const override {
    const auto& c = config_;
    if (device_ == Device::Cuda) {
      const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim, h = c.hidden_size;
      const int64_t i = c.intermediate_size;
      // FP8 attention projections (--quantize-dense fp8): a byte per weight and a float per row.
      // Experts: MXFP4 as stored, or as --quantize-experts made them.
      bool fp8 = false;
      int64_t expert = (2 * i * h + h * i) / 32 * 17;  // 16 bytes of codes and a scale per 32 weights
#if ANVIL_WITH_CUDA
      if (cuda_ && !cuda_->layers.empty()) {
        const GptOssCudaLayer& first = cuda_->layers[0];
        fp8 = first.o_proj.format == cuda::DenseWeight::Format::FP8;
        expert = cuda::expert_matrix_bytes(first.experts.format, 2 * i, h) +
                 cuda::expert_matrix_bytes(first.experts.format, h, i);
      }
#endif
      const int64_t projections = fp8 ? (q * h + 2 * kv * h + h * q) + 4 * (q + 2 * kv + h)
                                      : 2 * (q * h + 2 * kv * h + h * q);
      const int64_t attention = projections + 2 * c.num_experts * h;
      return size_t(h * 2 + c.vocab_size * h * 2 + c.num_layers * (attention + c.num_experts_per_tok * expert));
    }
    size_t bytes = size_t(c.hidden_size) * 2 + lm_head_.weight_bytes();  // one embedding row + lm_head
    for (const auto& layer : layers_) {
      bytes += layer.q_proj.weight_bytes() + layer.k_proj.weight_bytes() + layer.v_proj.weight_bytes() +
               layer.o_proj.weight_bytes() + layer.router.weight_bytes();
      bytes += size_t(c.num_experts_per_tok) * (layer.gate_up[0].weight_bytes() + layer.down[0].weight_bytes());
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
      {
        const LinearWeight* projections[] = {&layer.q_proj, &layer.k_proj, &layer.v_proj};
        float* outputs[] = {q.data(), k.data(), v.data()};
        linear_forward_group(projections, h.data(), rows, outputs, pool);
      }
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

  // The same pass on the GPU: bf16 weights, float32 residual stream and accumulation, and bf16
  // matrix inputs and KV cache by default, or everything float32 (`--dtype float32`). Step
  // metadata goes up once; only the logits (or, with token_ids, their argmax per row) come back.
  // Decode steps replay a CUDA graph of the whole pass (models/cuda_support.h).
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

  // Enqueues the uploaded step, from the embedding to the logits (and their argmax). Reads
  // nothing from the host, so a graph can capture it.
  void enqueue_forward(std::vector<KvGroupStorage>& kv_cache, bool argmax) {
    const auto& c = config_;
    GptOssCuda& g = *cuda_;
    CudaStepRunner& run = g.runner;
    const cuda::Stream stream = run.stream.get();
    const bool exact = g.exact;
    const int64_t rows = run.step.rows, hidden = c.hidden_size, head_dim = c.head_dim;
    const int64_t q_width = c.num_heads * head_dim, kv_width = c.num_kv_heads * head_dim;
    const int64_t qkv_width = q_width + 2 * kv_width;
    const int64_t experts = c.num_experts, top_k = c.num_experts_per_tok;
    const float eps = float(c.rms_norm_eps);
    float* x = run.arena.get<float>(0, rows * hidden);
    uint16_t* h = run.arena.get<uint16_t>(1, rows * hidden);
    float* q = run.arena.get<float>(2, rows * q_width);
    float* qkv = run.arena.get<float>(15, rows * qkv_width);
    float* h_f32 = run.arena.get<float>(16, rows * hidden);
    uint16_t* attn = exact ? nullptr : run.arena.get<uint16_t>(5, rows * q_width);
    float* attn_f32 = exact ? run.arena.get<float>(18, rows * q_width) : nullptr;
    float* projected = exact ? run.arena.get<float>(6, rows * hidden) : nullptr;
    float* router_logits = run.arena.get<float>(7, rows * experts);
    int32_t* expert_ids = run.arena.get<int32_t>(8, rows * top_k);
    float* expert_weights = run.arena.get<float>(9, rows * top_k);
    const size_t moe_bytes = exact ? cuda::moe_quantized_f32_workspace_bytes(rows, int(top_k), c.intermediate_size)
                                   : cuda::moe_quantized_workspace_bytes(rows, int(top_k), experts, hidden, c.intermediate_size);
    void* moe_workspace = run.arena.get<uint8_t>(10, int64_t(moe_bytes));
    const size_t attention_bytes = cuda::attention_workspace_bytes(rows, c.num_heads, head_dim);
    void* attention_workspace = run.arena.get_zeroed<uint8_t>(11, int64_t(attention_bytes), stream);

    cuda::embedding_bf16(g.embed_tokens, run.step.tokens, rows, hidden, x, stream);
    run.marks.record("embedding");
    // In bf16 mode each layer's input norm (h) is made by the previous layer's MoE combine, or
    // where the MoE left it (batch 1: its sum is made inside down, with no combine) by the qkv
    // product itself; the first layer's here.
    if (!exact) cuda::rms_norm_to_bf16(x, rows, hidden, g.layers[0].input_norm, eps, h, stream);
    bool h_is_input_norm = true;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const GptOssCudaLayer& layer = g.layers[size_t(l)];
      const int group = kv_layout_.layer_group[size_t(l)];
      const int64_t slot = kv_layout_.layer_slot[size_t(l)];

      if (exact) {
        cuda::rms_norm_f32(x, rows, hidden, layer.input_norm, eps, h_f32, stream);
        cuda::linear_f32_input(layer.qkv_proj, layer.qkv_bias, h_f32, rows, qkv_width, hidden, qkv, stream);
      } else if (h_is_input_norm) {
        cuda::linear(layer.qkv_proj, layer.qkv_bias, h, rows, qkv_width, hidden, qkv, stream);
      } else {
        cuda::linear_normed(layer.qkv_proj, layer.qkv_bias, x, layer.input_norm, eps, h, rows, qkv_width, hidden, qkv,
                            stream);
      }
      run.marks.record("norm + qkv");
      cuda::AttentionShape shape;
      shape.num_heads = c.num_heads;
      shape.num_kv_heads = c.num_kv_heads;
      shape.head_dim = head_dim;
      shape.scale = 1.0f / std::sqrt(float(head_dim));
      shape.sliding_window = kv_layout_.group_window[size_t(group)];
      shape.sinks = layer.sinks;
      KvGroupStorage& storage = kv_cache[size_t(group)];
      const cuda::KvLayerCache cache{storage.device_keys(slot), storage.device_values(slot), storage.shape().block_size,
                                     storage.shape().dtype};
      const cuda::AttentionBatch& view = run.step.groups[size_t(group)];
      // RoPE on q and k, k and v straight into the cache (at decode inside the attention's own
      // launch where the kernel table says so).
      if (exact) {
        cuda::split_qkv_rope_to_cache(qkv, view, shape, run.step.positions, g.inv_freq, rope_.attention_scale(), q,
                                      cache, stream);
        run.marks.record("rope + kv write");
        cuda::paged_attention(view, shape, q, cache, attn_f32, attention_workspace, attention_bytes, stream);
        run.marks.record(shape.sliding_window ? "attention (sliding)" : "attention (full)");
        cuda::linear_f32_input(layer.o_proj, layer.o_bias, attn_f32, rows, hidden, q_width, projected, stream);
        cuda::add_inplace(x, projected, rows * hidden, stream);
      } else {
        cuda::rope_then_attention(qkv, view, shape, run.step.positions, g.inv_freq, rope_.attention_scale(), q, cache,
                                  attn, attention_workspace, attention_bytes, stream);
        run.marks.record(shape.sliding_window ? "rope + attention (sliding)" : "rope + attention (full)");
        cuda::linear_add(layer.o_proj, layer.o_bias, attn, rows, hidden, q_width, x, stream);
      }
      run.marks.record("o_proj + residual");

      // The router sees the float32 norm output even in bf16 mode: routing is a discrete choice,
      // and a bf16-rounded input can flip a near-tie between experts, a large error for that token.
      if (exact) {
        cuda::rms_norm_f32(x, rows, hidden, layer.post_attention_norm, eps, h_f32, stream);
        run.marks.record("norm");
        cuda::linear_f32_input(layer.router, layer.router_bias, h_f32, rows, experts, hidden, router_logits, stream);
        run.marks.record("router");
        cuda::moe_topk_softmax(router_logits, rows, experts, int(top_k), expert_ids, expert_weights, stream);
        run.marks.record("top-k");
        cuda::moe_quantized_f32(layer.experts, h_f32, rows, int(top_k), expert_ids, expert_weights, x, moe_workspace,
                                moe_bytes, stream);
        run.marks.record("experts");
      } else {
        // The experts' bf16 input into h and the router's logits from the float32 norm; the experts
        // are picked inside the MoE call (at batch 1 in the norm's own launch where the kernel table
        // says so), and the combine also makes the next layer's input norm into h (which the
        // experts are done with).
        const bool last_layer = l + 1 == c.num_layers;
        cuda::NextNorm next{last_layer ? nullptr : g.layers[size_t(l + 1)].input_norm, eps, last_layer ? nullptr : h};
        next.may_defer = true;
        const cuda::MoeRouterInput router_input{x, layer.post_attention_norm, eps, layer.router, layer.router_bias};
        h_is_input_norm =
            cuda::moe_quantized_from_residual(layer.experts, router_input, rows, int(top_k), h, h_f32, router_logits,
                                              expert_ids, expert_weights, moe_workspace, moe_bytes, stream, &next);
        run.marks.record("norm + router + top-k + experts");
      }
    }

    const int64_t logit_rows = run.step.logit_rows;
    if (logit_rows == 0) return;
    // One row that is its own logit row (a batch-1 decode step) needs no gather: x is that row.
    float* last = rows == 1 ? x : run.arena.get<float>(12, logit_rows * hidden);
    run.device_logits = run.arena.get<float>(14, logit_rows * c.vocab_size);
    if (last != x) cuda::gather_rows_f32(x, run.step.logit_row_index, logit_rows, hidden, last, stream);
    if (exact) {
      float* normed = run.arena.get<float>(19, logit_rows * hidden);
      cuda::rms_norm_f32(last, logit_rows, hidden, g.final_norm, eps, normed, stream);
      cuda::linear_f32_input(g.lm_head, nullptr, normed, logit_rows, c.vocab_size, hidden, run.device_logits, stream);
    } else {
      uint16_t* normed = run.arena.get<uint16_t>(13, logit_rows * hidden);
      cuda::rms_norm_to_bf16(last, logit_rows, hidden, g.final_norm, eps, normed, stream);
      cuda::linear_bf16(g.lm_head, nullptr, normed, logit_rows, c.vocab_size, hidden, run.device_logits, stream);
    }
    run.marks.record("final norm + lm_head");
    if (argmax) {
      run.device_ids = run.arena.get<int32_t>(17, logit_rows);
      cuda::argmax_rows(run.device_logits, logit_rows, c.vocab_size, run.device_ids, stream);
      run.marks.record("argmax");
    }
  }

  // fp8: the attention projections quantized to FP8 on the device (--quantize-dense fp8).
  // experts: MXFP4 as stored, or re-quantized on the device (--quantize-experts nvfp4 / fp8).
  void load_cuda(bool fp8, cuda::ExpertFormat experts_format) {
    const auto& c = config_;
    cuda_ = std::make_unique<GptOssCuda>(*weights_);
    DeviceWeights& w = cuda_->weights;
    const int64_t hidden = c.hidden_size, head_dim = c.head_dim, experts = c.num_experts;
    const int64_t width = c.intermediate_size, q_width = c.num_heads * head_dim, kv_width = c.num_kv_heads * head_dim;
    cuda_->embed_tokens = w.bf16("model.embed_tokens.weight", {c.vocab_size, hidden});
    cuda_->layers.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      GptOssCudaLayer& layer = cuda_->layers[size_t(l)];
      const std::string p = "model.layers." + std::to_string(l);
      layer.input_norm = w.f32(p + ".input_layernorm.weight", {hidden});
      layer.post_attention_norm = w.f32(p + ".post_attention_layernorm.weight", {hidden});
      layer.sinks = w.f32(p + ".self_attn.sinks", {c.num_heads});
      const std::string a = p + ".self_attn.";
      layer.qkv_proj = w.dense({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {q_width, kv_width, kv_width}, hidden, fp8);
      layer.o_proj = w.dense({a + "o_proj.weight"}, {hidden}, q_width, fp8);
      // After the input norm and after attention: both latency-bound, so the projections' one-token
      // products may fetch their weights early (DenseWeight::streams_early).
      layer.qkv_proj.streams_early = layer.o_proj.streams_early = true;
      layer.router = w.bf16(p + ".mlp.router.weight", {experts, hidden});
      std::vector<float> qkv_bias = load_f32(*weights_, a + "q_proj.bias", {q_width});
      for (const char* name : {"k_proj.bias", "v_proj.bias"}) {
        const auto part = load_f32(*weights_, a + name, {kv_width});
        qkv_bias.insert(qkv_bias.end(), part.begin(), part.end());
      }
      layer.qkv_bias = w.upload(qkv_bias);
      layer.o_bias = w.f32(p + ".self_attn.o_proj.bias", {hidden});
      layer.router_bias = w.f32(p + ".mlp.router.bias", {experts});
      cuda::QuantizedExperts& e = layer.experts;
      const std::string m = p + ".mlp.experts.";
      const auto gate_up = w.experts(m + "gate_up_proj", experts, 2 * width, hidden, experts_format);
      const auto down = w.experts(m + "down_proj", experts, hidden, width, experts_format);
      e.format = experts_format;
      e.gate_up_blocks = gate_up.codes;
      e.gate_up_scales = gate_up.scales;
      e.gate_up_row_scales = gate_up.row_scales;
      e.gate_up_bias = w.f32(m + "gate_up_proj_bias", {experts, 2 * width});
      e.down_blocks = down.codes;
      e.down_scales = down.scales;
      e.down_row_scales = down.row_scales;
      e.down_bias = w.f32(m + "down_proj_bias", {experts, hidden});
      e.num_experts = experts;
      e.hidden = hidden;
      e.intermediate = width;
      e.swiglu_limit = float(c.swiglu_limit);
    }
    cuda_->final_norm = w.f32("model.norm.weight", {hidden});
    cuda_->lm_head = w.bf16("lm_head.weight", {c.vocab_size, hidden});
    cuda_->inv_freq = w.upload(rope_.inv_freq());
  }

  std::unique_ptr<GptOssCuda> cuda_;
#endif

  // --quantize-dense applies to q/k/v/o (gpt-oss has no dense MLP) and --quantize-experts to the
  // experts, re-quantized from their decoded MXFP4 values; the router, embeddings and lm_head stay.
  void load(const LoadOptions& options) {
    const auto& c = config_;
    WeightSource& w = *weights_;
    const int64_t hidden = c.hidden_size, head_dim = c.head_dim, experts = c.num_experts;
    const int64_t width = c.intermediate_size;
    ThreadPool& pool = default_thread_pool();
    auto dense = [&](const LinearWeight& weight, const std::string& name) {
      return quantized_.convert(weight, options.quantize_dense, name, pool);
    };
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
      for (auto [weight, name] : {std::pair{&layer.q_proj, "q_proj"}, {&layer.k_proj, "k_proj"}, {&layer.v_proj, "v_proj"},
                                  {&layer.o_proj, "o_proj"}}) {
        *weight = dense(*weight, p + ".self_attn." + name + ".weight");
      }
      layer.router = load_dense_linear(w, p + ".mlp.router", experts, hidden, true, layer.router_bias);
      layer.gate_up_bias = load_f32(w, p + ".mlp.experts.gate_up_proj_bias", {experts, 2 * width});
      layer.down_bias = load_f32(w, p + ".mlp.experts.down_proj_bias", {experts, hidden});
      layer.gate_up = load_mxfp4_experts(p + ".mlp.experts.gate_up_proj", 2 * width, hidden, layer.gate_up_bias);
      layer.down = load_mxfp4_experts(p + ".mlp.experts.down_proj", hidden, width, layer.down_bias);
      for (auto [per_expert, name] : {std::pair{&layer.gate_up, "gate_up_proj"}, {&layer.down, "down_proj"}}) {
        for (size_t e = 0; e < per_expert->size(); ++e) {
          (*per_expert)[e] = quantized_.convert((*per_expert)[e], options.quantize_experts,
                                                fmt::format("{}.mlp.experts.{}[{}]", p, name, e), pool);
        }
      }
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
  QuantizedStore quantized_;  // the layers that --quantize-* replaced
};

}  // namespace

std::unique_ptr<Model> make_gpt_oss(const ModelConfig& config, std::unique_ptr<WeightSource> weights,
                                    const LoadOptions& options) {
  return std::make_unique<GptOss>(config, std::move(weights), options);
}

}  // namespace anvil
