// The fused CUDA operators against the unfused sequence they replace in the gpt-oss decode step:
// each must give the same bits (or, where a reduction order changes, state its tolerance), so
// fusing is a pure speed change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <numeric>
#include <random>
#include <span>

#include "backend/cuda/ops.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "models/cuda_support.h"
#include "support/device_vectors.h"
#include "support/one_layer_cache.h"

namespace anvil {
namespace {

using test::to_device;
using test::to_host;

#if !ANVIL_WITH_CUDA
TEST(CudaFusedOps, NeedACudaBuild) { GTEST_SKIP() << "this build has no CUDA backend"; }
#else
#define SKIP_WITHOUT_GPU() \
  if (cuda::devices().empty()) GTEST_SKIP() << "no CUDA GPU: " << cuda::unavailable_reason()

std::vector<float> uniform(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(n);
  for (auto& v : values) v = dist(rng);
  return values;
}

std::vector<uint16_t> bf16_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::vector<uint16_t> bits(n);
  const auto values = uniform(n, rng, scale);
  for (size_t i = 0; i < n; ++i) bits[i] = f32_to_bf16(values[i]);
  return bits;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// y += W·x + b through every kernel family: the matrix-vector path (m <= 32), the tensor-core
// GEMM (m > 32) and the generic path (inputs not 16-byte aligned).
TEST(CudaFusedOps, LinearAddEqualsLinearThenAdd) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (const auto [m, out, in] : {std::array<int64_t, 3>{1, 2880, 4096}, {5, 200, 96}, {17, 64, 256},
                                  {64, 384, 512}, {3, 33, 36}}) {
    SCOPED_TRACE("m=" + std::to_string(m) + " out=" + std::to_string(out) + " in=" + std::to_string(in));
    const auto weight = bf16_values(size_t(out * in), rng), x = bf16_values(size_t(m * in), rng);
    const auto bias = uniform(size_t(out), rng), residual = uniform(size_t(m * out), rng, 4.0f);
    const auto d_w = to_device(weight), d_x = to_device(x), d_b = to_device(bias);
    auto d_y = to_device(residual), d_sum = to_device(residual);
    cuda::DeviceBuffer d_proj(size_t(m * out) * sizeof(float));
    cuda::linear_bf16(d_w.get<uint16_t>(), d_b.get<float>(), d_x.get<uint16_t>(), m, out, in, d_proj.get<float>(),
                      nullptr);
    cuda::add_inplace(d_sum.get<float>(), d_proj.get<float>(), m * out, nullptr);
    cuda::linear_bf16_add(d_w.get<uint16_t>(), d_b.get<float>(), d_x.get<uint16_t>(), m, out, in, d_y.get<float>(),
                          nullptr);
    const auto got = to_host<float>(d_y, size_t(m * out)), want = to_host<float>(d_sum, size_t(m * out));
    EXPECT_TRUE(same_bits(got, want));
    EXPECT_FALSE(same_bits(got, residual));
  }
}

// A dense MLP's gate_up and silu(gate) · up in one launch, for bf16 and FP8 weights (quantized on
// the device), at the matrix-vector sizes that fuse (m <= 32, bf16 below cuBLASLt's rows) and
// beyond (the two-step path inside), against linear then silu_mul_to_bf16. The output is poisoned
// first: every element must be written.
TEST(CudaFusedOps, LinearSiluMulEqualsLinearThenSiluMul) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(19);
  for (const bool fp8 : {false, true})
    for (const auto [m, width, in] : {std::array<int64_t, 3>{1, 1536, 2048}, {5, 96, 256}, {12, 64, 128},
                                      {31, 40, 96}, {48, 64, 128}}) {
      SCOPED_TRACE(std::string(fp8 ? "fp8" : "bf16") + " m=" + std::to_string(m) + " width=" + std::to_string(width) +
                   " in=" + std::to_string(in));
      const auto weight = bf16_values(size_t(2 * width * in), rng, 0.2f), x = bf16_values(size_t(m * in), rng);
      const auto d_w = to_device(weight), d_x = to_device(x);
      cuda::DeviceBuffer d_codes(size_t(2 * width * in)), d_scales(size_t(2 * width) * sizeof(float));
      cuda::DenseWeight dw;
      dw.data = d_w.get();
      if (fp8) {
        ASSERT_EQ(cuda::quantize_fp8_rows(d_w.get<uint16_t>(), 2 * width, in, d_codes.get<uint8_t>(),
                                          d_scales.get<float>(), nullptr),
                  -1);
        dw = {cuda::DenseWeight::Format::FP8, d_codes.get(), d_scales.get<float>()};
      }
      cuda::DeviceBuffer d_gate_up(size_t(m * 2 * width) * sizeof(float)), d_scratch(size_t(m * 2 * width) * sizeof(float));
      cuda::DeviceBuffer d_want(size_t(m * width) * 2), d_got(size_t(m * width) * 2);
      cuda::memset_device(d_got.get(), 0xff, d_got.bytes());
      cuda::linear(dw, nullptr, d_x.get<uint16_t>(), m, 2 * width, in, d_gate_up.get<float>(), nullptr);
      cuda::silu_mul_to_bf16(d_gate_up.get<float>(), m, width, d_want.get<uint16_t>(), nullptr);
      cuda::linear_silu_mul(dw, d_x.get<uint16_t>(), m, width, in, d_scratch.get<float>(), d_got.get<uint16_t>(),
                            nullptr);
      const auto got = to_host<uint16_t>(d_got, size_t(m * width)), want = to_host<uint16_t>(d_want, size_t(m * width));
      EXPECT_TRUE(same_bits(got, want));
      EXPECT_EQ(std::count(got.begin(), got.end(), uint16_t(0xffff)), 0);
    }
}

TEST(CudaFusedOps, DualNormEqualsBothNorms) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (const int64_t dim : {2880, 4096, 256}) {
    const int64_t rows = 3;
    const auto x = uniform(size_t(rows * dim), rng, 3.0f), weight = uniform(size_t(dim), rng, 2.0f);
    const auto d_x = to_device(x), d_weight = to_device(weight);
    cuda::DeviceBuffer f32_a(size_t(rows * dim) * 4), f32_b(size_t(rows * dim) * 4);
    cuda::DeviceBuffer bf16_a(size_t(rows * dim) * 2), bf16_b(size_t(rows * dim) * 2);
    cuda::rms_norm_f32(d_x.get<float>(), rows, dim, d_weight.get<float>(), 1e-5f, f32_a.get<float>(), nullptr);
    cuda::rms_norm_to_bf16(d_x.get<float>(), rows, dim, d_weight.get<float>(), 1e-5f, bf16_a.get<uint16_t>(), nullptr);
    cuda::rms_norm_dual(d_x.get<float>(), rows, dim, d_weight.get<float>(), 1e-5f, f32_b.get<float>(),
                        bf16_b.get<uint16_t>(), nullptr);
    EXPECT_TRUE(same_bits(to_host<float>(f32_a, size_t(rows * dim)), to_host<float>(f32_b, size_t(rows * dim))))
        << "dim " << dim;
    EXPECT_TRUE(same_bits(to_host<uint16_t>(bf16_a, size_t(rows * dim)), to_host<uint16_t>(bf16_b, size_t(rows * dim))))
        << "dim " << dim;
  }
}

// The post-attention norm and the MoE router in one kernel (up to kNormRouterRows rows) against
// rms_norm_dual then linear_f32_input: the block makes the norm's sum itself, so logits may differ
// by summation order (relative 1e-5 here) and the bf16 norm by one unit in the last place; past
// kNormRouterRows rows it is the two launches, bit for bit.
TEST(CudaFusedOps, NormRouterEqualsNormThenRouter) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  for (const int64_t dim : {2880, 100}) {
    for (const int64_t experts : {32, 128}) {
      const std::initializer_list<int64_t> row_counts{1, 3, 5, cuda::kNormRouterRows, cuda::kNormRouterRows + 1};
      for (const int64_t rows : row_counts) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " experts " + std::to_string(experts) + " rows " + std::to_string(rows));
        const auto x = uniform(size_t(rows * dim), rng, 3.0f), norm = uniform(size_t(dim), rng, 2.0f);
        const auto bias = uniform(size_t(experts), rng);
        std::vector<uint16_t> router(size_t(experts * dim));
        for (auto& v : router) v = f32_to_bf16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
        const auto d_x = to_device(x), d_norm = to_device(norm), d_bias = to_device(bias), d_router = to_device(router);
        cuda::DeviceBuffer f32(size_t(rows * dim) * 4), bf16_a(size_t(rows * dim) * 2), bf16_b(size_t(rows * dim) * 2);
        cuda::DeviceBuffer logits_a(size_t(rows * experts) * 4), logits_b(size_t(rows * experts) * 4);
        cuda::rms_norm_dual(d_x.get<float>(), rows, dim, d_norm.get<float>(), 1e-5f, f32.get<float>(), bf16_a.get<uint16_t>(),
                            nullptr);
        cuda::linear_f32_input(d_router.get<uint16_t>(), d_bias.get<float>(), f32.get<float>(), rows, experts, dim,
                               logits_a.get<float>(), nullptr);
        cuda::rms_norm_router(d_x.get<float>(), rows, dim, d_norm.get<float>(), 1e-5f, d_router.get<uint16_t>(),
                              d_bias.get<float>(), experts, logits_b.get<float>(), bf16_b.get<uint16_t>(), f32.get<float>(),
                              nullptr);
        const auto la = to_host<float>(logits_a, size_t(rows * experts)), lb = to_host<float>(logits_b, size_t(rows * experts));
        const auto ha = to_host<uint16_t>(bf16_a, size_t(rows * dim)), hb = to_host<uint16_t>(bf16_b, size_t(rows * dim));
        if (rows > cuda::kNormRouterRows) {
          EXPECT_TRUE(same_bits(la, lb));
          EXPECT_TRUE(same_bits(ha, hb));
          continue;
        }
        double worst = 0.0, scale = 0.0;
        for (size_t i = 0; i < la.size(); ++i) {
          worst = std::max(worst, double(std::abs(la[i] - lb[i])));
          scale = std::max(scale, double(std::abs(la[i])));
        }
        EXPECT_LE(worst, 1e-5 * scale) << "logits";
        int64_t far = 0;
        for (size_t i = 0; i < ha.size(); ++i) far += std::abs(int(ha[i]) - int(hb[i])) > 1 ? 1 : 0;
        EXPECT_EQ(far, 0) << "bf16 norm values more than one unit apart";
      }
    }
  }
}

void rope_into_cache_case(int64_t head_dim, bool with_norm);

// RoPE + cache write in one kernel against split_qkv_rope then kv_cache_write, for every cache
// dtype, with scattered blocks and a sliding layer's freed block (-1) that must not be written;
// with a q/k norm (Qwen3) against split_qkv_norm_rope then kv_cache_write. At gpt-oss's and
// Qwen3's head sizes (one warp and two warps per head).
TEST(CudaFusedOps, RopeIntoCacheEqualsRopeThenCacheWrite) {
  SKIP_WITHOUT_GPU();
  for (const int64_t head_dim : {64, 128})
    for (const bool with_norm : {false, true}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + (with_norm ? " with q/k norm" : ""));
      rope_into_cache_case(head_dim, with_norm);
    }
}

void rope_into_cache_case(int64_t head_dim, bool with_norm) {
  std::mt19937 rng(13);
  const int64_t heads = 8, kv_heads = 2, block = 16, total_blocks = 12;
  const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  const KvLayout layout = test::one_layer_layout(kv_heads, head_dim, 0);
  const ModelConfig config = test::positions_only_config(4096);
  const std::vector<int32_t> table_a = {5, 9}, table_b = {-1, -1, -1, -1, 2};
  StepBatch batch;
  // Sequence 0: 3 new tokens at 20..22 (block table {5, 9}); sequence 1: one token at 70 in block 2.
  SequenceStep a;
  a.start_pos = 20;
  a.num_tokens = 3;
  a.block_tables = {std::span<const int32_t>(table_a)};
  SequenceStep b;
  b.start_pos = 70;
  b.num_tokens = 1;
  b.block_tables = {std::span<const int32_t>(table_b)};
  batch.sequences = {a, b};
  batch.tokens = {0, 0, 0, 0};
  const int64_t rows = 4;
  const std::vector<int32_t> positions = {20, 21, 22, 70};
  std::vector<float> inv_freq(size_t(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(150000.0f, -2.0f * float(i) / float(head_dim));
  const auto qkv = uniform(size_t(rows * (q_width + 2 * kv_width)), rng, 2.0f);
  const auto d_qkv = to_device(qkv), d_positions = to_device(positions), d_inv = to_device(inv_freq);
  const auto d_q_norm = to_device(uniform(size_t(head_dim), rng, 1.5f)), d_k_norm = to_device(uniform(size_t(head_dim), rng, 1.5f));

  for (const auto dtype : {cuda::KvDtype::BF16, cuda::KvDtype::F32, cuda::KvDtype::FP8_E4M3}) {
    SCOPED_TRACE(cuda::kv_dtype_name(dtype));
    KvGroupStorage cache_a({1, total_blocks, block, kv_heads, head_dim, KvDevice::Cuda, dtype});
    KvGroupStorage cache_b({1, total_blocks, block, kv_heads, head_dim, KvDevice::Cuda, dtype});
    const size_t cache_bytes = size_t(total_blocks * block * kv_width) * cuda::kv_dtype_bytes(dtype);
    for (auto* c : {&cache_a, &cache_b}) {
      cuda::memset_device(c->device_keys(0), 0x5a, cache_bytes);
      cuda::memset_device(c->device_values(0), 0x5a, cache_bytes);
    }
    DeviceStep step;
    step.upload(batch, layout, config, nullptr, false);
    const cuda::AttentionShape shape{heads, kv_heads, head_dim, 0.125f, 0, nullptr};
    const cuda::KvLayerCache ca{cache_a.device_keys(0), cache_a.device_values(0), block, dtype};
    const cuda::KvLayerCache cb{cache_b.device_keys(0), cache_b.device_values(0), block, dtype};
    cuda::DeviceBuffer q_a(size_t(rows * q_width) * 4), q_b(size_t(rows * q_width) * 4);
    cuda::DeviceBuffer k(size_t(rows * kv_width) * 4), v(size_t(rows * kv_width) * 4);
    const cuda::QkNorm qk_norm{d_q_norm.get<float>(), d_k_norm.get<float>(), 1e-6f};
    if (with_norm)
      cuda::split_qkv_norm_rope(d_qkv.get<float>(), rows, heads, kv_heads, head_dim, qk_norm.q, qk_norm.k, qk_norm.eps,
                                d_positions.get<int32_t>(), d_inv.get<float>(), 1.25f, q_a.get<float>(),
                                k.get<float>(), v.get<float>(), nullptr);
    else
      cuda::split_qkv_rope(d_qkv.get<float>(), rows, heads, kv_heads, head_dim, d_positions.get<int32_t>(),
                           d_inv.get<float>(), 1.25f, q_a.get<float>(), k.get<float>(), v.get<float>(), nullptr);
    cuda::kv_cache_write(step.groups[0], shape, k.get<float>(), v.get<float>(), ca, nullptr);
    cuda::split_qkv_rope_to_cache(d_qkv.get<float>(), step.groups[0], shape, d_positions.get<int32_t>(),
                                  d_inv.get<float>(), 1.25f, q_b.get<float>(), cb, nullptr,
                                  with_norm ? &qk_norm : nullptr);
    EXPECT_TRUE(same_bits(to_host<float>(q_a, size_t(rows * q_width)), to_host<float>(q_b, size_t(rows * q_width))));
    auto bytes = [&](void* p) {
      std::vector<uint8_t> host(cache_bytes);
      cuda::copy_to_host(host.data(), p, cache_bytes);
      cuda::synchronize();
      return host;
    };
    const auto keys_a = bytes(cache_a.device_keys(0)), keys_b = bytes(cache_b.device_keys(0));
    EXPECT_TRUE(same_bits(keys_a, keys_b));
    EXPECT_TRUE(same_bits(bytes(cache_a.device_values(0)), bytes(cache_b.device_values(0))));
    // Something was written: position 20 is slot 4 of sequence 0's second block, block 9.
    const size_t row20 = size_t((9 * block + 4) * kv_width) * cuda::kv_dtype_bytes(dtype);
    EXPECT_NE(keys_b[row20], 0x5a);
  }
}

// rope_then_attention with the RoPE inside the decode attention (where the kernel table names it)
// against the RoPE kernel then the attention: the output and the whole cache bit for bit. head_dim
// 64 with groups 8 (gpt-oss), 4 and 2; one sequence at 600 keys (one wide block), several at 5 to
// 1,000 keys (8-warp splits), a 128-key window; a sequence whose newest key's block is unmapped
// (nothing stored, the key reads as zeros), positions past 10^4 (precise cos/sin).
struct DecodeRopeCase {
  int64_t heads, kv_heads, window;
  std::vector<int32_t> positions;
  int unmapped_sequence = -1;
};

void rope_inside_attention_case(const DecodeRopeCase& c) {
  std::mt19937 rng(29);
  const int64_t head_dim = 64, block = 16, heads = c.heads, kv_heads = c.kv_heads;
  const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  const int64_t rows = int64_t(c.positions.size());
  int64_t total_blocks = 0;
  std::vector<std::vector<int32_t>> tables;
  for (size_t i = 0; i < c.positions.size(); ++i) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b <= c.positions[i] / block; ++b) table.push_back(int32_t(total_blocks++));
    if (int(i) == c.unmapped_sequence) table.back() = -1;
    tables.push_back(std::move(table));
  }
  const KvLayout layout = test::one_layer_layout(kv_heads, head_dim, c.window);
  const ModelConfig config = test::positions_only_config(1 << 16);
  StepBatch batch;
  for (size_t i = 0; i < c.positions.size(); ++i) {
    SequenceStep sequence;
    sequence.start_pos = c.positions[i];
    sequence.num_tokens = 1;
    sequence.block_tables = {std::span<const int32_t>(tables[i])};
    batch.sequences.push_back(sequence);
    batch.tokens.push_back(0);
  }
  std::vector<float> inv_freq(size_t(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(150000.0f, -2.0f * float(i) / float(head_dim));
  std::vector<float> sinks = uniform(size_t(heads), rng, 2.0f);
  const auto d_qkv = to_device(uniform(size_t(rows * (q_width + 2 * kv_width)), rng, 2.0f));
  const auto d_positions = to_device(c.positions), d_inv = to_device(inv_freq), d_sinks = to_device(sinks);
  const size_t cache_elements = size_t(total_blocks * block * kv_width);
  const auto old_keys = bf16_values(cache_elements, rng, 2.0f), old_values = bf16_values(cache_elements, rng, 2.0f);
  DeviceStep step;
  step.upload(batch, layout, config, nullptr, false);
  const cuda::AttentionShape shape{heads, kv_heads, head_dim, 0.125f, c.window, d_sinks.get<float>()};
  const size_t ws_bytes = cuda::attention_workspace_bytes(rows, heads, head_dim);
  std::vector<uint16_t> out[2], keys[2], values[2];
  for (int inside = 0; inside < 2; ++inside) {
    cuda::allow_rope_in_attention(inside == 1);
    KvGroupStorage cache({1, total_blocks, block, kv_heads, head_dim, KvDevice::Cuda, cuda::KvDtype::BF16});
    cuda::copy_to_device(cache.device_keys(0), old_keys.data(), cache_elements * 2);
    cuda::copy_to_device(cache.device_values(0), old_values.data(), cache_elements * 2);
    const cuda::KvLayerCache view{cache.device_keys(0), cache.device_values(0), block, cuda::KvDtype::BF16};
    EXPECT_EQ(cuda::decode_rope_in_attention(step.groups[0], shape, view), inside == 1);
    cuda::DeviceBuffer q(size_t(rows * q_width) * 4), attn(size_t(rows * q_width) * 2), workspace(ws_bytes);
    cuda::memset_device(workspace.get(), 0, ws_bytes);
    cuda::memset_device(attn.get(), 0xff, attn.bytes());
    cuda::rope_then_attention(d_qkv.get<float>(), step.groups[0], shape, d_positions.get<int32_t>(), d_inv.get<float>(),
                              1.25f, q.get<float>(), view, attn.get<uint16_t>(), workspace.get(), ws_bytes, nullptr);
    out[inside] = to_host<uint16_t>(attn, size_t(rows * q_width));
    keys[inside].resize(cache_elements);
    values[inside].resize(cache_elements);
    cuda::copy_to_host(keys[inside].data(), cache.device_keys(0), cache_elements * 2);
    cuda::copy_to_host(values[inside].data(), cache.device_values(0), cache_elements * 2);
    cuda::synchronize();
  }
  cuda::allow_rope_in_attention(true);
  EXPECT_TRUE(same_bits(out[0], out[1]));
  EXPECT_TRUE(same_bits(keys[0], keys[1]));
  EXPECT_TRUE(same_bits(values[0], values[1]));
  EXPECT_FALSE(same_bits(keys[1], old_keys)) << "no key was written";
}

TEST(CudaFusedOps, RopeInsideDecodeAttentionEqualsRopeThenAttention) {
  SKIP_WITHOUT_GPU();
  if (!cuda::current_device_runs(cuda::kDecodeRopeOp, cuda::kDecodeRopeInAttention))
    GTEST_SKIP() << "this GPU's kernel-table row keeps the RoPE kernel";
  for (const DecodeRopeCase& c :
       {DecodeRopeCase{64, 8, 0, {600}}, DecodeRopeCase{64, 8, 0, {5, 300, 1000}},
        DecodeRopeCase{64, 8, 128, {5, 140, 700}}, DecodeRopeCase{16, 4, 0, {31, 257, 12000}, 1},
        DecodeRopeCase{8, 4, 128, {64, 20000}, 0}, DecodeRopeCase{32, 4, 0, {511}}}) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " window " +
                 std::to_string(c.window) + " first position " + std::to_string(c.positions[0]));
    rope_inside_attention_case(c);
  }
}

// A gpt-oss-sized row (201,088 logits) and an odd-sized, misaligned one; ties go to the lower id.
TEST(CudaFusedOps, ArgmaxOverLargeAndMisalignedRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  for (const int64_t vocab : {201088, 1001, 3}) {
    const int64_t rows = 3;
    auto logits = uniform(size_t(rows * vocab), rng, 10.0f);
    // Row 0: the maximum twice (the lower id wins); row 1: at the last id; row 2: all equal.
    logits[size_t(vocab / 3)] = 50.0f;
    logits[size_t(vocab - 1)] = 50.0f;
    logits[size_t(vocab + vocab - 1)] = 60.0f;
    std::fill(logits.begin() + 2 * vocab, logits.begin() + 3 * vocab, -1.0f);
    const auto d_logits = to_device(logits);
    cuda::DeviceBuffer ids(size_t(rows) * 4);
    cuda::argmax_rows(d_logits.get<float>(), rows, vocab, ids.get<int32_t>(), nullptr);
    const auto got = to_host<int32_t>(ids, size_t(rows));
    EXPECT_EQ(got[0], vocab / 3) << vocab;
    EXPECT_EQ(got[1], vocab - 1) << vocab;
    EXPECT_EQ(got[2], 0) << vocab;
  }
}

#endif

}  // namespace
}  // namespace anvil
