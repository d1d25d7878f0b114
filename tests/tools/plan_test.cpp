// anvil plan: numbers derived by hand from the configs, the safetensors-header path against the
// fixtures, architectures anvil does not serve, and one-line errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "support/test_support.h"
#include "tools/gpu_probe.h"
#include "tools/plan.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::run_anvil;

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }
fs::path source_dir() { return fs::path(ANVIL_SOURCE_DIR); }

json run_plan_json(const std::string& args) {
  const auto result = run_anvil("plan " + args + " --json");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  return json::parse(result.out);  // the whole of stdout is one object
}

void expect_one_line_failure(const test::CommandResult& result, const std::vector<std::string>& needles) {
  EXPECT_EQ(result.exit_code, 1) << result.out << result.err;
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  for (const auto& needle : needles)
    EXPECT_NE(result.err.find(needle), std::string::npos) << "missing '" << needle << "' in: " << result.err;
}

// The bar: gpt-oss-120b on a 96 GB GPU at 0.90 with a bf16 KV cache. Everything below follows
// from configs/gpt-oss-120b/config.json (no safetensors there, so the weights are computed):
//   H = 2880, 36 layers, 64 q heads and 8 KV heads of 64, 128 experts of I = 2880, vocab 201,088,
//   MXFP4 experts (modules_to_not_convert: attention, router, embeddings, lm_head stay bf16).
//   attention per layer: q 2880x4096 + k, v 2880x512 each + o 4096x2880 = 26,542,080 weights,
//     biases 4096 + 512 + 512 + 2880 = 8,000, sinks 64 -> 26,550,144 bf16 = 53,100,288 B;
//     x 36 = 1,911,610,368 B
//   experts per layer: 128 x 3 x 2880 x 2880 = 3,185,049,600 weights at 4.25 bits (4-bit values +
//     one E8M0 byte per 32) = 3,185,049,600 x 17/32 = 1,692,057,600 B in the checkpoint, plus biases
//     128 x (5760 + 2880) x 2 = 2,211,840 B; x 36 = 60,993,699,840 B
//   router: 36 x 128 x (2880 + 1) x 2 = 26,551,296 B
//   norms: (36 x 2 + 1) x 2880 x 2 = 420,480 B
//   embeddings = lm_head = 201,088 x 2880 x 2 = 1,158,266,880 B each
//   checkpoint = 65,248,815,744 B (65.25 GB, the spec's figure)
// On the GPU each expert row of K = 2,880 codes (90 blocks) is held as 23 whole 128-code chunks:
//   23 x 64 B of codes + 23 x 4 B of scales = 1,564 B instead of 1,530 B; 128 x (5760 + 2880) rows
//   x 1,564 B = 1,729,658,880 B per layer instead of 1,692,057,600 B, so +1,353,646,080 B over 36
//   layers: weights = 66,602,461,824 B (66.60 GB).
// KV (bf16): one layer holds 2 (K and V) x 8 heads x 64 x 2 B = 2,048 B per token.
//   18 full-attention layers: 36,864 B per token of context.
//   18 sliding layers (window 128): 36,864 B per token, at most 128 tokens = 4,718,592 B per sequence.
// Budget: 96 GiB x 0.90 = 92,771,293,593 B; activation reserve 1 GiB + 2048 x 64 KiB = 1,207,959,552 B;
//   KV cache = 92,771,293,593 - 66,602,461,824 - 1,207,959,552 = 24,960,872,217 B.
// One sequence of 131,072 (max_position_embeddings) = 36,864 x 131,072 + 4,718,592 = 4,836,556,800 B
//   -> max concurrency floor(24,960,872,217 / 4,836,556,800) = 5.
// KV tokens: (24,960,872,217 - 5 x 4,718,592) / 36,864 = 676,466 (full-attention positions once each
//   of the 5 sequences has its window).
// Longest context by memory: (24,960,872,217 - 4,718,592) / 36,864 = 676,978, capped at 131,072.
TEST(Plan, GptOss120bMatchesHandDerivation) {
  const uint64_t attention = 36ull * (2880 * 4096 + 2 * 2880 * 512 + 4096 * 2880 + 8000 + 64) * 2;
  ASSERT_EQ(attention, 1911610368ull);
  const uint64_t expert_biases = 36ull * 128 * (5760 + 2880) * 2;
  const uint64_t checkpoint_experts = 36ull * 128 * 3 * 2880 * 2880 * 17 / 32 + expert_biases;
  ASSERT_EQ(checkpoint_experts, 60993699840ull);
  const uint64_t experts = 36ull * 128 * (5760 + 2880) * (23 * 64 + 23 * 4) + expert_biases;
  const uint64_t padding = experts - checkpoint_experts;
  ASSERT_EQ(padding, 1353646080ull);
  const uint64_t router = 36ull * 128 * 2881 * 2, norms = 73ull * 2880 * 2, embeddings = 201088ull * 2880 * 2;
  const uint64_t weights = attention + experts + router + norms + 2 * embeddings;
  ASSERT_EQ(weights - padding, 65248815744ull);
  ASSERT_EQ(weights, 66602461824ull);
  const uint64_t usable = 96ull * (1ull << 30) * 9 / 10;
  ASSERT_EQ(usable, 92771293593ull);
  const uint64_t reserve = (1ull << 30) + 2048ull * 65536;
  const uint64_t kv_cache = usable - weights - reserve;
  ASSERT_EQ(kv_cache, 24960872217ull);
  const uint64_t per_token = 18ull * 8 * 64 * 2 * 2;
  ASSERT_EQ(per_token, 36864ull);
  const uint64_t window_bytes = 18ull * 8 * 64 * 2 * 2 * 128;
  const uint64_t sequence = per_token * 131072 + window_bytes;
  const uint64_t concurrency = kv_cache / sequence;
  ASSERT_EQ(concurrency, 5ull);
  const uint64_t kv_tokens = (kv_cache - concurrency * window_bytes) / per_token;
  ASSERT_EQ(kv_tokens, 676466ull);
  ASSERT_EQ((kv_cache - window_bytes) / per_token, 676978ull);

  const std::string args = quoted(source_dir() / "configs/gpt-oss-120b") +
                           " --gpu-memory 96 --gpu-memory-utilization 0.90 --kv-cache-dtype bf16";
  const json plan = run_plan_json(args);
  EXPECT_EQ(plan.at("weights_bytes").get<uint64_t>(), weights);
  const json& parts = plan.at("weights").at("by_component");
  EXPECT_EQ(parts.at("attention").get<uint64_t>(), attention);
  EXPECT_EQ(parts.at("experts").get<uint64_t>(), experts);
  EXPECT_EQ(plan.at("weights").at("checkpoint_bytes").get<uint64_t>(), weights - padding);
  EXPECT_EQ(plan.at("weights").at("layout_padding_bytes").get<uint64_t>(), padding);
  EXPECT_EQ(parts.at("router").get<uint64_t>(), router);
  EXPECT_EQ(parts.at("norms").get<uint64_t>(), norms);
  EXPECT_EQ(parts.at("embeddings").get<uint64_t>(), embeddings);
  EXPECT_EQ(parts.at("lm_head").get<uint64_t>(), embeddings);
  EXPECT_FALSE(plan.at("weights").at("exact").get<bool>());
  EXPECT_EQ(plan.at("kv_bytes_per_token").get<uint64_t>(), per_token);
  EXPECT_EQ(plan.at("usable_bytes").get<uint64_t>(), usable);
  EXPECT_EQ(plan.at("activation_reserve_bytes").get<uint64_t>(), reserve);
  EXPECT_EQ(plan.at("kv_cache_bytes").get<uint64_t>(), kv_cache);
  EXPECT_EQ(plan.at("max_model_len").get<int64_t>(), 131072);
  EXPECT_EQ(plan.at("kv_bytes_per_sequence").at("at_max_model_len").get<uint64_t>(), sequence);
  EXPECT_EQ(plan.at("max_concurrency").get<uint64_t>(), concurrency);
  EXPECT_EQ(plan.at("kv_tokens").get<uint64_t>(), kv_tokens);
  EXPECT_EQ(plan.at("max_context_tokens").get<int64_t>(), 131072);
  EXPECT_EQ(plan.at("max_context_tokens_by_memory").get<int64_t>(), 676978);
  EXPECT_TRUE(plan.at("fits").get<bool>());
  EXPECT_TRUE(plan.at("model").at("served_by_anvil").get<bool>());

  const json& types = plan.at("kv_by_layer_type");
  ASSERT_EQ(types.size(), 2u);
  EXPECT_EQ(types[0].at("type"), "full_attention");
  EXPECT_EQ(types[0].at("layers"), 18);
  EXPECT_EQ(types[0].at("bytes_per_token_per_layer"), 2048);
  EXPECT_EQ(types[1].at("type"), "sliding_attention");
  EXPECT_EQ(types[1].at("layers"), 18);
  EXPECT_EQ(types[1].at("window"), 128);
  EXPECT_EQ(types[1].at("max_bytes_per_sequence").get<uint64_t>(), window_bytes);
  EXPECT_EQ(plan.at("kv_bytes_per_sequence").at("formula"), "36864 * L + 36864 * min(L, 128)");
  // The weights are an estimate, and the plan says so.
  ASSERT_FALSE(plan.at("estimates").empty());
  EXPECT_NE(plan.at("estimates")[0].get<std::string>().find("MXFP4 experts (4.25 bits/weight"), std::string::npos);

  // The text form prints the same numbers.
  const auto text = run_anvil("plan " + args);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* needle : {"66.60 GB", "the checkpoint's 65.25 GB + 1.35 GB", "36,864 B/token", "window 128",
                             "KV tokens: 676,466", "Max concurrency at 131,072 tokens: 5 (5.16x)",
                             "131,072 tokens (the model's limit; memory allows 676,978)",
                             "[estimate]"})
    EXPECT_NE(text.out.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << text.out;
}

TEST(Plan, Fp8KvHalvesTheBytesPerToken) {
  const json bf16 = run_plan_json(quoted(source_dir() / "configs/gpt-oss-20b") + " --gpu-memory 32 --kv-cache-dtype bf16");
  const json fp8 = run_plan_json(quoted(source_dir() / "configs/gpt-oss-20b") + " --gpu-memory 32 --kv-cache-dtype fp8");
  EXPECT_EQ(bf16.at("kv_bytes_per_token").get<uint64_t>(), 12u * 8 * 64 * 2 * 2);
  EXPECT_EQ(fp8.at("kv_bytes_per_token").get<uint64_t>(), 12u * 8 * 64 * 2);
  EXPECT_GT(fp8.at("kv_tokens").get<uint64_t>(), bf16.at("kv_tokens").get<uint64_t>() * 19 / 10);
  // gpt-oss-20b: 24 layers, 32 experts; 13.76 GB in the checkpoint per the spec, and each expert
  // row 2.2 % more on the GPU (1,564 B for 1,530).
  EXPECT_NEAR(bf16.at("weights").at("checkpoint_bytes").get<double>() / 1e9, 13.76, 0.01);
  EXPECT_EQ(bf16.at("weights").at("layout_padding_bytes").get<uint64_t>(), 24ull * 32 * (5760 + 2880) * 34);
}

// Qwen3-32B (configs/Qwen3-32B): dense, 64 layers, H = 5120, 64 q heads / 8 KV heads of 128,
// I = 25,600, vocab 151,936, bf16, untied, q_norm/k_norm.
//   attention/layer = 5120x8192 x 2 + 2 x 5120x1024 = 94,371,840 weights; mlp/layer = 3 x 5120 x 25,600
//   norms = 64 x 2 x 5120 + 5120 + 64 x 2 x 128; embeddings = lm_head = 151,936 x 5120
//   KV: 64 layers x 8 x 128 x 2 x 2 = 262,144 B per token, no sliding layers.
TEST(Plan, Qwen3DenseByHand) {
  const uint64_t attention = 64ull * 94371840 * 2, mlp = 64ull * 3 * 5120 * 25600 * 2;
  const uint64_t norms = (64ull * 2 * 5120 + 5120 + 64 * 2 * 128) * 2, embeddings = 151936ull * 5120 * 2;
  const uint64_t weights = attention + mlp + norms + 2 * embeddings;
  ASSERT_EQ(weights, 65524246528ull);  // 32.8 B parameters in bf16
  const uint64_t per_token = 64ull * 8 * 128 * 2 * 2;
  const uint64_t kv_cache = 96ull * (1ull << 30) * 9 / 10 - weights - ((1ull << 30) + 2048ull * 65536);

  const json plan = run_plan_json(quoted(source_dir() / "configs/Qwen3-32B") + " --gpu-memory 96 --max-model-len 32768");
  EXPECT_EQ(plan.at("weights_bytes").get<uint64_t>(), weights);
  EXPECT_EQ(plan.at("weights").at("by_component").at("mlp").get<uint64_t>(), mlp);
  EXPECT_EQ(plan.at("weights").at("by_component").at("experts").get<uint64_t>(), 0u);
  EXPECT_EQ(plan.at("kv_bytes_per_token").get<uint64_t>(), per_token);
  ASSERT_EQ(plan.at("kv_by_layer_type").size(), 1u);
  EXPECT_EQ(plan.at("kv_cache_bytes").get<uint64_t>(), kv_cache);
  EXPECT_EQ(plan.at("kv_tokens").get<uint64_t>(), kv_cache / per_token);
  EXPECT_EQ(plan.at("max_concurrency").get<uint64_t>(), kv_cache / (per_token * 32768));
  EXPECT_EQ(plan.at("max_context_tokens").get<int64_t>(), std::min<int64_t>(40960, int64_t(kv_cache / per_token)));
  EXPECT_EQ(plan.at("kv_bytes_per_sequence").at("formula"), "262144 * L");
}

TEST(Plan, Qwen3MoeExpertsAndRouter) {
  // Qwen3-30B-A3B: 48 layers, all MoE, 128 experts of 768, router 128 x 2048 per layer.
  const json plan = run_plan_json(quoted(source_dir() / "configs/Qwen3-30B-A3B") + " --gpu-memory 48");
  const json& parts = plan.at("weights").at("by_component");
  EXPECT_EQ(parts.at("experts").get<uint64_t>(), 48ull * 128 * 3 * 2048 * 768 * 2);
  EXPECT_EQ(parts.at("router").get<uint64_t>(), 48ull * 128 * 2048 * 2);
  EXPECT_EQ(parts.at("mlp").get<uint64_t>(), 0u);
  EXPECT_EQ(plan.at("kv_bytes_per_token").get<uint64_t>(), 48u * 4 * 128 * 2 * 2);
  EXPECT_NEAR(plan.at("weights_bytes").get<double>() / 1e9, 61.06, 0.1);  // 30.5 B parameters
}

// With safetensors files present the weights come from their headers, exactly.
TEST(Plan, WeightsFromSafetensorsHeaders) {
  for (const char* fixture : {"qwen3-tiny", "gpt-oss-tiny", "qwen3moe-tiny"}) {
    SCOPED_TRACE(fixture);
    const fs::path dir = test::fixtures_dir() / fixture;
    const tools::Plan plan = tools::make_plan(dir, tools::PlanOptions{});
    EXPECT_TRUE(plan.weights.from_headers);
    EXPECT_EQ(plan.weights.checkpoint_total(), Checkpoint(dir).total_bytes());
    EXPECT_EQ(plan.weights.layout_padding, 0u) << "every fixture's K is whole 128-code chunks";
    EXPECT_TRUE(plan.model.served);
    EXPECT_EQ(plan.weights[tools::WeightComponent::Other], 0u) << "every fixture tensor has a component";
    EXPECT_GT(plan.weights[tools::WeightComponent::Attention], 0u);
    EXPECT_GT(plan.weights[tools::WeightComponent::Embeddings], 0u);
    EXPECT_FALSE(plan.has_budget);
  }
  const tools::Plan tiny = tools::make_plan(test::fixtures_dir() / "qwen3-tiny", tools::PlanOptions{});
  EXPECT_EQ(tiny.weights[tools::WeightComponent::LmHead], 0u);  // tied embeddings
  EXPECT_EQ(tiny.weights[tools::WeightComponent::Experts], 0u);
  const tools::Plan oss = tools::make_plan(test::fixtures_dir() / "gpt-oss-tiny", tools::PlanOptions{});
  EXPECT_GT(oss.weights[tools::WeightComponent::Experts], 0u);
  EXPECT_GT(oss.weights[tools::WeightComponent::Router], 0u);
  EXPECT_GT(oss.weights[tools::WeightComponent::LmHead], 0u);
}

// The estimate from config.json alone is exact, component by component, for the fixtures' real
// layouts (MXFP4 experts with biases and sinks; Qwen3 with q/k norms and tied embeddings; Qwen3-MoE).
TEST(Plan, EstimateFromConfigMatchesTheHeaders) {
  for (const char* fixture : {"qwen3-tiny", "gpt-oss-tiny", "qwen3moe-tiny"}) {
    SCOPED_TRACE(fixture);
    const fs::path dir = test::fixtures_dir() / fixture;
    const tools::WeightBytes headers = tools::weights_from_headers(tools::safetensors_files(dir));
    const tools::WeightBytes estimate = tools::estimate_weights(tools::read_model_shape(dir));
    for (size_t i = 0; i < tools::kWeightComponentCount; ++i)
      EXPECT_EQ(estimate.by_component[i], headers.by_component[i]) << tools::component_name(tools::WeightComponent(i));
  }
}

TEST(Plan, ClassifiesTensorNames) {
  using tools::WeightComponent;
  using tools::classify_tensor;
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.experts.gate_up_proj_blocks"), WeightComponent::Experts);
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.experts.17.down_proj.weight"), WeightComponent::Experts);
  EXPECT_EQ(classify_tensor("model.layers.3.block_sparse_moe.experts.2.w1.weight"), WeightComponent::Experts);
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.router.weight"), WeightComponent::Router);
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.gate.weight"), WeightComponent::Router);
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.gate_proj.weight"), WeightComponent::Mlp);
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.shared_experts.up_proj.weight"), WeightComponent::Mlp);
  EXPECT_EQ(classify_tensor("model.layers.3.self_attn.q_proj.weight"), WeightComponent::Attention);
  EXPECT_EQ(classify_tensor("model.layers.3.self_attn.sinks"), WeightComponent::Attention);
  EXPECT_EQ(classify_tensor("model.layers.3.self_attn.q_norm.weight"), WeightComponent::Norms);
  EXPECT_EQ(classify_tensor("model.layers.3.input_layernorm.weight"), WeightComponent::Norms);
  EXPECT_EQ(classify_tensor("model.norm.weight"), WeightComponent::Norms);
  EXPECT_EQ(classify_tensor("model.embed_tokens.weight"), WeightComponent::Embeddings);
  EXPECT_EQ(classify_tensor("lm_head.weight"), WeightComponent::LmHead);
  EXPECT_EQ(classify_tensor("vision_tower.patch_conv.weight"), WeightComponent::Other);
}

// Llama 3 8B's config: an architecture anvil does not serve, planned as an estimate.
const char* kLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"
})";

TEST(Plan, UnknownDenseArchitectureIsAnEstimate) {
  test::TempDir dir;
  test::write_file(dir.path() / "config.json", kLlamaConfig);
  // 32 x (4096x4096 x 2 + 2 x 4096x1024 + 3 x 4096x14336) + 2 x 128256x4096 + (65 x 4096) = 8.03 B
  const uint64_t params = 32ull * (4096ull * 4096 * 2 + 2 * 4096 * 1024 + 3ull * 4096 * 14336) +
                          2ull * 128256 * 4096 + 65ull * 4096;
  const json plan = run_plan_json(quoted(dir.path()) + " --gpu-memory 24 --max-model-len 8192");
  EXPECT_EQ(plan.at("weights_bytes").get<uint64_t>(), params * 2);
  EXPECT_FALSE(plan.at("model").at("served_by_anvil").get<bool>());
  EXPECT_NE(plan.at("model").at("not_served_reason").get<std::string>().find("LlamaForCausalLM"), std::string::npos);
  const uint64_t per_token = 32ull * 8 * 128 * 2 * 2;
  EXPECT_EQ(plan.at("kv_bytes_per_token").get<uint64_t>(), per_token);
  const uint64_t kv_cache = 24ull * (1ull << 30) * 9 / 10 - params * 2 - ((1ull << 30) + 2048ull * 65536);
  EXPECT_EQ(plan.at("kv_tokens").get<uint64_t>(), kv_cache / per_token);
  EXPECT_EQ(plan.at("max_concurrency").get<uint64_t>(), kv_cache / (per_token * 8192));
  bool says_estimate = false;
  for (const auto& e : plan.at("estimates")) says_estimate |= e.get<std::string>().find("not serve") != std::string::npos;
  EXPECT_TRUE(says_estimate) << plan.at("estimates").dump();
}

TEST(Plan, MistralSlidingEveryLayerAndMixtralExperts) {
  test::TempDir dir;
  // Mistral 7B v0.1: every layer slides over 4096 tokens, so a sequence never holds more.
  test::write_file(dir.path() / "config.json", R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096, "torch_dtype": "bfloat16"})");
  const json mistral = run_plan_json(quoted(dir.path()) + " --gpu-memory 24");
  EXPECT_EQ(mistral.at("kv_bytes_per_token").get<uint64_t>(), 0u);
  EXPECT_EQ(mistral.at("kv_by_layer_type")[0].at("max_bytes_per_sequence").get<uint64_t>(), 32ull * 8 * 128 * 4 * 4096);
  EXPECT_EQ(mistral.at("max_context_tokens").get<int64_t>(), 32768);
  EXPECT_TRUE(mistral.at("max_context_tokens_by_memory").is_null());  // unbounded by memory

  test::TempDir moe;
  test::write_file(moe.path() / "config.json", R"({
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
    "sliding_window": null, "torch_dtype": "bfloat16"})");
  const json mixtral = run_plan_json(quoted(moe.path()) + " --gpu-memory 96");
  EXPECT_EQ(mixtral.at("weights").at("by_component").at("experts").get<uint64_t>(), 32ull * 8 * 3 * 4096 * 14336 * 2);
  EXPECT_EQ(mixtral.at("weights").at("by_component").at("router").get<uint64_t>(), 32ull * 8 * 4096 * 2);
  EXPECT_EQ(mixtral.at("kv_by_layer_type")[0].at("type"), "full_attention");
  EXPECT_NEAR(mixtral.at("weights_bytes").get<double>() / 1e9, 93.4, 0.1);  // 46.7 B parameters
  EXPECT_FALSE(mixtral.at("fits").get<bool>());
}

TEST(Plan, QuantizedConfigsEstimateTheirFormat) {
  test::TempDir dir;
  // An FP8 block-quantized Qwen3-32B: linear layers 8 bits + a float32 scale per 128x128 block.
  json config = json::parse(test::read_file(source_dir() / "configs/Qwen3-32B/config.json"));
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  test::write_file(dir.path() / "config.json", config.dump());
  const json plan = run_plan_json(quoted(dir.path()) + " --gpu-memory 48");
  const uint64_t mlp_weights = 64ull * 3 * 5120 * 25600;
  EXPECT_EQ(plan.at("weights").at("by_component").at("mlp").get<uint64_t>(), mlp_weights + mlp_weights * 32 / 16384 / 8);
  EXPECT_EQ(plan.at("weights").at("by_component").at("embeddings").get<uint64_t>(), 151936ull * 5120 * 2);
  EXPECT_FALSE(plan.at("model").at("served_by_anvil").get<bool>());  // anvil reads no FP8 yet

  // An unknown method is counted as unquantized, and the plan says so.
  config["quantization_config"] = {{"quant_method", "mystery"}};
  test::write_file(dir.path() / "config.json", config.dump());
  const json unknown = run_plan_json(quoted(dir.path()) + " --gpu-memory 96");
  EXPECT_EQ(unknown.at("weights_bytes").get<uint64_t>(), 65524246528ull);
  EXPECT_NE(unknown.at("notes").dump().find("'mystery' is not modelled"), std::string::npos);
}

TEST(Plan, DetectedMemoryWithoutAGpu) {
  if (!tools::probe_gpus().gpus.empty()) GTEST_SKIP() << "a GPU is visible here";
  // The default asks the driver; without a GPU the plan still gives weights and KV per token.
  const json plan = run_plan_json(quoted(source_dir() / "configs/gpt-oss-20b"));
  EXPECT_TRUE(plan.at("kv_tokens").is_null());
  EXPECT_TRUE(plan.at("max_concurrency").is_null());
  EXPECT_GT(plan.at("weights_bytes").get<uint64_t>(), 0u);
  EXPECT_NE(plan.at("notes").dump().find("--gpu-memory"), std::string::npos);
  // Asking for detection explicitly is an error when there is nothing to detect.
  expect_one_line_failure(run_anvil("plan " + quoted(source_dir() / "configs/gpt-oss-20b") + " --gpu-memory detected"),
                          {"--gpu-memory detected", "no GPU"});
}

TEST(Plan, TooSmallAGpuDoesNotFit) {
  const json plan = run_plan_json(quoted(source_dir() / "configs/gpt-oss-120b") + " --gpu-memory 48");
  EXPECT_FALSE(plan.at("fits").get<bool>());
  EXPECT_LT(plan.at("kv_cache_bytes").get<int64_t>(), 0);
  EXPECT_EQ(plan.at("kv_tokens").get<uint64_t>(), 0u);
  EXPECT_EQ(plan.at("max_concurrency").get<int64_t>(), 0);
  EXPECT_NE(plan.at("notes").dump().find("do not fit"), std::string::npos);
}

TEST(Plan, BadInputIsOneLineNamingFileAndField) {
  test::TempDir dir;
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())), {(dir.path() / "config.json").string(), "No such file"});
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path() / "nowhere")), {"nowhere", "No such file"});

  json config = json::parse(kLlamaConfig);
  config.erase("num_hidden_layers");
  test::write_file(dir.path() / "config.json", config.dump());
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())), {"config.json", "'num_hidden_layers'", "missing"});

  config = json::parse(kLlamaConfig);
  config["num_key_value_heads"] = "8";
  test::write_file(dir.path() / "config.json", config.dump());
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())),
                          {"config.json", "'num_key_value_heads' must be an integer, got string"});

  // The same for an architecture anvil serves.
  config = json::parse(test::read_file(source_dir() / "configs/gpt-oss-20b/config.json"));
  config["hidden_size"] = 2880.5;
  test::write_file(dir.path() / "config.json", config.dump());
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())), {"config.json", "'hidden_size' must be an integer"});

  test::write_file(dir.path() / "config.json", "{ not json");
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())), {"config.json", "not valid JSON"});

  // A corrupt safetensors header: the error names the file.
  test::write_file(dir.path() / "config.json", kLlamaConfig);
  std::string corrupt(8, '\0');
  corrupt[0] = 12;
  corrupt += "{\"a\": [1, 2]";  // 12 bytes of broken JSON
  test::write_file(dir.path() / "model.safetensors", corrupt);
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())), {"model.safetensors", "header is not valid JSON"});
  std::string too_long(8, '\0');
  too_long[0] = char(0xff);
  too_long[1] = char(0xff);
  test::write_file(dir.path() / "model.safetensors", too_long + "{}");
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path())), {"model.safetensors", "header length"});

  fs::remove(dir.path() / "model.safetensors");
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path()) + " --gpu-memory-utilization 1.5"),
                          {"--gpu-memory-utilization"});
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path()) + " --gpu-memory lots"), {"--gpu-memory", "lots"});
  expect_one_line_failure(run_anvil("plan " + quoted(dir.path()) + " --kv-cache-dtype int4"), {"--kv-cache-dtype", "int4"});
}

TEST(Plan, HeaderReaderDoesNotNeedTheData) {
  // A header whose tensors lie beyond the end of the file is refused, as the loader refuses it.
  test::TempDir dir;
  const std::string header = R"({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}})";
  std::string bytes(8, '\0');
  bytes[0] = char(header.size());
  test::write_file(dir.path() / "short.safetensors", bytes + header + std::string(16, '\0'));
  EXPECT_THROW(read_safetensors_header(dir.path() / "short.safetensors"), Error);
  test::write_file(dir.path() / "ok.safetensors", bytes + header + std::string(32, '\0'));
  const SafetensorsHeader ok = read_safetensors_header(dir.path() / "ok.safetensors");
  ASSERT_EQ(ok.tensors.size(), 1u);
  EXPECT_EQ(ok.tensors.at("w").nbytes(), 32u);
  EXPECT_EQ(ok.tensors.at("w").data, nullptr);
}

// MXFP4 experts are held in whole 128-code chunks per row on the GPU (mxfp4_f16_layout.h): from
// headers, a row of K = 2,880 (90 blocks) takes 23 x 64 B of codes and 23 x 4 B of scales, and
// other tensors (a bf16 expert bias, the attention) count as stored.
TEST(Plan, HeadersCountMxfp4ExpertsAsTheGpuHoldsThem) {
  test::TempDir dir;
  const std::string prefix = "model.layers.0.mlp.experts.";
  const std::string header = R"({")" + prefix + R"(gate_up_proj_blocks": {"dtype": "U8", "shape": [2, 6, 90, 16], "data_offsets": [0, 17280]},)" +
                             R"(")" + prefix + R"(gate_up_proj_scales": {"dtype": "U8", "shape": [2, 6, 90], "data_offsets": [17280, 18360]},)" +
                             R"(")" + prefix + R"(gate_up_proj_bias": {"dtype": "BF16", "shape": [2, 6], "data_offsets": [18360, 18384]},)" +
                             R"("model.layers.0.self_attn.q_proj.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [18384, 18416]}})";
  std::string length(8, '\0');
  for (size_t i = 0, n = header.size(); i < 8; ++i, n >>= 8) length[i] = char(n & 0xFF);
  test::write_file(dir.path() / "model.safetensors", length + header + std::string(18416, '\0'));
  const tools::WeightBytes weights = tools::weights_from_headers({dir.path() / "model.safetensors"});
  EXPECT_EQ(weights[tools::WeightComponent::Experts], 12u * 23 * 64 + 12u * 23 * 4 + 24);
  EXPECT_EQ(weights[tools::WeightComponent::Attention], 32u);
  EXPECT_EQ(weights.checkpoint_total(), 18416u);
  EXPECT_EQ(weights.layout_padding, 12u * (23 * 64 - 90 * 16) + 12u * (23 * 4 - 90));
}

}  // namespace
}  // namespace anvil
