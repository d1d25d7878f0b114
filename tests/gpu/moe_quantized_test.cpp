// cuda::moe_topk_softmax and cuda::moe_quantized against a straightforward CPU MoE built from the
// reference pieces: cpu::top_k_indices + softmax for routing, linear_forward_reference for the
// MXFP4 products (bias included), cpu::swiglu_oai in between, and the routing-weighted sum added
// to the residual. Fresh random data every case; outputs poisoned or pre-filled with random
// values; both the decode (bandwidth) path and the prefill (tensor-core) path, uneven routing,
// and scales above 128. The gpt-oss-20b shapes print their speed (informational only).
#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/bf16_layout.h"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/mxfp4_f16_layout.h"
#include "backend/cuda/mxfp4_layout.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/runtime.h"
#include "backend/linear.h"
#include "backend/quantize.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "support/device_vectors.h"

namespace anvil {
namespace {

using test::Rng;
using test::to_device;
using test::to_host;

struct Shape {
  int64_t experts, hidden, intermediate;
  int k;
};

// How the synthetic experts are scaled.
enum class Scaling {
  Mxfp4,     // E8M0 around the dummy loader's choice
  Mxfp4Big,  // the same with some blocks above 128 (the second-multiply path)
  Nvfp4,     // E4M3 per 16 codes (subnormal and zero ones included) and a global scale per expert
  Fp8,       // E4M3 codes (subnormal ones included) and a scale per row
  Bf16,      // bf16 weights as Qwen3-MoE ships them (no scales)
};

// The gate_up activation and biases: gpt-oss's clamped SwiGLU with biases, or Qwen3-MoE's
// silu(gate) · up without.
enum class Gating { GptOss, Qwen };

// Host copy of one layer's experts plus their device copies.
struct Experts {
  Shape shape;
  bool nv = false, fp8 = false, qwen = false, bf16 = false;
  std::vector<uint8_t> gu_blocks, gu_scales, down_blocks, down_scales;
  // gu_global / down_global: NVFP4's global scale per expert, FP8's scale per row.
  std::vector<float> gu_bias, down_bias, gu_global, down_global;
  cuda::DeviceBuffer d_gu_blocks, d_gu_scales, d_gu_bias, d_down_blocks, d_down_scales, d_down_bias, d_gu_row_scales,
      d_down_row_scales;
  float limit = 7.0f, alpha = 1.702f;

  // Weight magnitudes around the dummy loader's choice (2^-ceil(log2(sqrt(fan_in) * 2.6))) so
  // activations stay O(1).
  Experts(const Shape& s, Rng& rng, Scaling scaling = Scaling::Mxfp4, Gating gating = Gating::GptOss)
      : shape(s), nv(scaling == Scaling::Nvfp4), fp8(scaling == Scaling::Fp8), qwen(gating == Gating::Qwen),
        bf16(scaling == Scaling::Bf16) {
    auto fill = [&](std::vector<uint8_t>& blocks, std::vector<uint8_t>& scales, std::vector<float>& global,
                    std::vector<float>& bias, int64_t rows, int64_t cols) {
      auto fill_bias = [&] {
        bias.resize(size_t(s.experts * rows));
        for (auto& b : bias) b = 0.5f * rng.uniform();
      };
      if (bf16) {  // uniform in ±sqrt(3 / fan_in): activations stay O(1)
        blocks.resize(size_t(s.experts * rows * cols * 2));
        const float bound = std::sqrt(3.0f / float(cols));
        for (size_t i = 0; i < blocks.size(); i += 2) {
          const uint16_t v = f32_to_bf16(bound * rng.uniform());
          std::memcpy(&blocks[i], &v, 2);
        }
        return fill_bias();
      }
      blocks.resize(size_t(s.experts * rows * cols / (fp8 ? 1 : 2)));
      for (size_t i = 0; i < blocks.size(); i += 8) {
        const uint64_t r = rng.next();
        for (size_t j = 0; j < 8 && i + j < blocks.size(); ++j) blocks[i + j] = uint8_t(r >> (8 * j));
      }
      const int base = 127 - int(std::ceil(std::log2(std::sqrt(double(cols)) * 2.6)));
      if (fp8) {
        // Codes up to 2^4 in magnitude (subnormals included, never NaN), row scales about 2^-3
        // of an MXFP4 block's.
        for (auto& b : blocks) b = uint8_t((b & 0x80) | (b & 0x7f) % 0x60);
        global.resize(size_t(s.experts * rows));
        for (auto& g : global) g = std::ldexp(0.5f + 0.4f * std::fabs(rng.uniform()), base - 127 - 2);
      } else if (nv) {
        // E4M3 scales from 0.25 to 3.75 (0x28-0x4e), a few subnormal or zero ones, and a global
        // scale that is not a power of two.
        scales.resize(size_t(s.experts * rows * cols / 16));
        for (auto& sc : scales) {
          const uint64_t r = rng.next();
          sc = r % 97 == 0 ? uint8_t(r % 8) : uint8_t(0x28 + (r >> 8) % 39);
        }
        global.resize(size_t(s.experts));
        for (auto& g : global) g = std::ldexp(0.6f + 0.3f * std::fabs(rng.uniform()), base - 127);
      } else {
        scales.resize(size_t(s.experts * rows * cols / 32));
        for (auto& sc : scales) {
          sc = uint8_t(base - 2 + int(rng.next() % 5));
          if (scaling == Scaling::Mxfp4Big && rng.next() % 64 == 0) sc = uint8_t(129 + rng.next() % 4);
        }
      }
      fill_bias();
    };
    fill(gu_blocks, gu_scales, gu_global, gu_bias, 2 * s.intermediate, s.hidden);
    fill(down_blocks, down_scales, down_global, down_bias, s.hidden, s.intermediate);
    // The kernels take a scale per row: NVFP4's expert-wide global scale repeated over its rows.
    auto row_scales = [&](const std::vector<float>& scales, int64_t rows) {
      if (!nv) return scales.empty() ? cuda::DeviceBuffer() : to_device(scales);
      std::vector<float> per_row;
      for (float g : scales) per_row.insert(per_row.end(), size_t(rows), g);
      return to_device(per_row);
    };
    d_gu_row_scales = row_scales(gu_global, 2 * s.intermediate);
    d_down_row_scales = row_scales(down_global, s.hidden);
    // The host copies stay in checkpoint order for the reference; the device ones are packed.
    auto device_codes = [&](const std::vector<uint8_t>& host) {
      if (bf16) {  // each group of 8 values in bf16_layout.h's order
        std::vector<uint8_t> laid_out(host.size());
        for (size_t v = 0; v < host.size() / 2; ++v) {
          const size_t at = v - v % 8 + size_t(cuda::bf16_layout::position(int(v % 8)));
          std::memcpy(&laid_out[2 * at], &host[2 * v], 2);
        }
        return to_device(laid_out);
      }
      if (nv) {
        auto buffer = to_device(host);
        cuda::mxfp4_pack_codes(buffer.get<uint8_t>(), host.size(), nullptr);
        return buffer;
      }
      std::vector<uint8_t> laid_out(host.size());  // rows are multiples of 16 bytes
      for (size_t i = 0; i < host.size(); ++i) laid_out[i - i % 16 + size_t(cuda::fp8::expert_position(int(i % 16)))] = host[i];
      return to_device(laid_out);
    };
    // MXFP4: codes and scales laid out together, by the loader's own function.
    auto lay_out = [&](const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int64_t rows,
                       int64_t cols, cuda::DeviceBuffer& d_codes, cuda::DeviceBuffer& d_scales) {
      const auto src_codes = to_device(codes), src_scales = to_device(scales);
      d_codes = cuda::DeviceBuffer(size_t(s.experts * rows * cuda::mxfp4_device_row_bytes(cols)));
      d_scales = cuda::DeviceBuffer(size_t(s.experts * rows * cuda::mxfp4_device_scale_row_bytes(cols)));
      cuda::mxfp4_lay_out(src_codes.get<uint8_t>(), src_scales.get<uint8_t>(), s.experts * rows, cols,
                          d_codes.get<uint8_t>(), d_scales.get<uint8_t>(), nullptr);
      cuda::synchronize();
    };
    if (!nv && !fp8 && !bf16) {
      lay_out(gu_blocks, gu_scales, 2 * s.intermediate, s.hidden, d_gu_blocks, d_gu_scales);
      lay_out(down_blocks, down_scales, s.hidden, s.intermediate, d_down_blocks, d_down_scales);
    } else {
      d_gu_blocks = device_codes(gu_blocks);
      if (!gu_scales.empty()) d_gu_scales = to_device(gu_scales);
      d_down_blocks = device_codes(down_blocks);
      if (!down_scales.empty()) d_down_scales = to_device(down_scales);
    }
    d_gu_bias = to_device(gu_bias);
    d_down_bias = to_device(down_bias);
  }

  cuda::QuantizedExperts device() const {
    cuda::QuantizedExperts w;
    w.format = bf16  ? cuda::ExpertFormat::BF16
               : fp8 ? cuda::ExpertFormat::FP8
               : nv  ? cuda::ExpertFormat::NVFP4
                     : cuda::ExpertFormat::MXFP4;
    w.activation = qwen ? cuda::ExpertActivation::SiluMul : cuda::ExpertActivation::SwigluOai;
    w.gate_up_row_scales = nv || fp8 ? d_gu_row_scales.get<float>() : nullptr;
    w.down_row_scales = nv || fp8 ? d_down_row_scales.get<float>() : nullptr;
    w.gate_up_blocks = d_gu_blocks.get<uint8_t>();
    w.gate_up_scales = bf16 || fp8 ? nullptr : d_gu_scales.get<uint8_t>();
    w.gate_up_bias = qwen ? nullptr : d_gu_bias.get<float>();
    w.down_blocks = d_down_blocks.get<uint8_t>();
    w.down_scales = bf16 || fp8 ? nullptr : d_down_scales.get<uint8_t>();
    w.down_bias = qwen ? nullptr : d_down_bias.get<float>();
    w.num_experts = shape.experts;
    w.hidden = shape.hidden;
    w.intermediate = shape.intermediate;
    w.swiglu_limit = limit;
    w.swiglu_alpha = alpha;
    return w;
  }

  WeightFormat format() const {
    return bf16 ? WeightFormat::BF16 : fp8 ? WeightFormat::FP8 : nv ? WeightFormat::NVFP4 : WeightFormat::MXFP4;
  }
  // Bytes of one expert's rows x cols codes.
  int64_t code_bytes(int64_t rows, int64_t cols) const { return bf16 ? rows * cols * 2 : rows * cols / (fp8 ? 1 : 2); }

  LinearWeight gate_up(int64_t e) const {
    const int64_t rows = 2 * shape.intermediate, cols = shape.hidden;
    LinearWeight w;
    w.format = format();
    w.out_features = rows;
    w.in_features = cols;
    w.data = gu_blocks.data() + e * code_bytes(rows, cols);
    if (fp8) w.row_scales = gu_global.data() + e * rows;
    if (!fp8 && !bf16) w.scales = gu_scales.data() + e * rows * cols / (nv ? 16 : 32);
    if (nv) w.global_scale = gu_global[size_t(e)];
    w.bias = qwen ? nullptr : gu_bias.data() + e * rows;
    return w;
  }
  LinearWeight down(int64_t e) const {
    const int64_t rows = shape.hidden, cols = shape.intermediate;
    LinearWeight w;
    w.format = format();
    w.out_features = rows;
    w.in_features = cols;
    w.data = down_blocks.data() + e * code_bytes(rows, cols);
    if (fp8) w.row_scales = down_global.data() + e * rows;
    if (!fp8 && !bf16) w.scales = down_scales.data() + e * rows * cols / (nv ? 16 : 32);
    if (nv) w.global_scale = down_global[size_t(e)];
    w.bias = qwen ? nullptr : down_bias.data() + e * rows;
    return w;
  }

  // The MoE's contribution for one token (before adding to the residual), as gpt_oss.cpp's
  // run_expert computes it (or qwen3.cpp's, with interleaved gate and up rows).
  std::vector<float> reference(const float* h, const int32_t* ids, const float* weights) const {
    const int64_t H = shape.hidden, I = shape.intermediate;
    std::vector<float> out(static_cast<size_t>(H), 0.0f), gu(static_cast<size_t>(2 * I)), act(static_cast<size_t>(I)),
        y(static_cast<size_t>(H));
    for (int j = 0; j < shape.k; ++j) {
      linear_forward_reference(gate_up(ids[j]), h, 1, gu.data());
      if (qwen) {
        for (int64_t i = 0; i < I; ++i) {
          const float gate = gu[size_t(2 * i)], up = gu[size_t(2 * i + 1)];
          act[size_t(i)] = gate / (1.0f + std::exp(-gate)) * up;
        }
      } else {
        cpu::swiglu_oai(gu.data(), 1, I, limit, act.data());
      }
      linear_forward_reference(down(ids[j]), act.data(), 1, y.data());
      for (int64_t i = 0; i < H; ++i) out[size_t(i)] += weights[j] * y[size_t(i)];
    }
    return out;
  }

  size_t expert_bytes() const {
    const int64_t H = shape.hidden, I = shape.intermediate;
    const int64_t weights = 2 * I * H + H * I;
    if (bf16) return size_t(weights * 2);
    if (fp8) return size_t(weights + (2 * I + H) * 8);
    return size_t(weights / 2 + weights / (nv ? 16 : 32) + (2 * I + H) * 4);
  }
};

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Random logits routed on the GPU; checked against the CPU routing exactly (ids) and closely
// (weights).
Routed route_on_gpu(int64_t m, const Shape& s, Rng& rng) {
  std::vector<float> logits(size_t(m * s.experts));
  for (auto& v : logits) v = 4.0f * rng.uniform();
  auto d_logits = to_device(logits);
  cuda::DeviceBuffer d_ids(size_t(m * s.k) * 4), d_w(size_t(m * s.k) * 4);
  cuda::memset_device(d_ids.get(), 0xff, d_ids.bytes());
  cuda::memset_device(d_w.get(), 0xff, d_w.bytes());
  cuda::moe_topk_softmax(d_logits.get<float>(), m, s.experts, s.k, d_ids.get<int32_t>(), d_w.get<float>(), nullptr);
  cuda::synchronize();
  Routed r{to_host<int32_t>(d_ids, size_t(m * s.k)), to_host<float>(d_w, size_t(m * s.k))};
  for (int64_t row = 0; row < m; ++row) {
    const float* x = logits.data() + row * s.experts;
    const auto chosen = cpu::top_k_indices(x, s.experts, s.k);
    std::vector<float> w(chosen.size());
    for (size_t j = 0; j < chosen.size(); ++j) w[j] = x[chosen[j]];
    cpu::softmax_inplace(w.data(), int64_t(w.size()));
    for (int j = 0; j < s.k; ++j) {
      EXPECT_EQ(r.ids[size_t(row * s.k + j)], chosen[size_t(j)]) << "row " << row << " pick " << j;
      EXPECT_NEAR(r.weights[size_t(row * s.k + j)], w[size_t(j)], 1e-6f) << "row " << row << " pick " << j;
    }
  }
  return r;
}

struct RunOptions {
  int timing_runs = 0;
  int64_t checked_rows = 24;
  int h_exponent = 0;  // h is uniform in ±2^h_exponent (the residual then starts at zero)
};

// Runs moe_quantized for h [m, H] with the given routing and checks sampled rows against the CPU.
void run_moe(const Experts& ex, int64_t m, const Routed& routed, Rng& rng, const RunOptions& options = {}) {
  const Shape& s = ex.shape;
  SCOPED_TRACE("E=" + std::to_string(s.experts) + " H=" + std::to_string(s.hidden) + " I=" +
               std::to_string(s.intermediate) + " k=" + std::to_string(s.k) + " m=" + std::to_string(m));
  std::vector<uint16_t> h(size_t(m * s.hidden));
  for (auto& v : h) v = f32_to_bf16(std::ldexp(rng.uniform(), options.h_exponent));
  std::vector<float> residual(size_t(m * s.hidden));
  // Zero with a scaled h: the contribution is read back as out - residual, which an O(1) residual
  // would swamp.
  for (auto& v : residual) v = options.h_exponent == 0 ? rng.uniform() : 0.0f;
  auto d_h = to_device(h), d_ids = to_device(routed.ids), d_w = to_device(routed.weights), d_residual = to_device(residual);
  const size_t ws_bytes = cuda::moe_quantized_workspace_bytes(m, s.k, s.experts, s.hidden, s.intermediate);
  cuda::DeviceBuffer workspace(ws_bytes);
  // Stale routing tables and activations must not matter.
  cuda::memset_device(workspace.get(), 0xff, ws_bytes);
  const auto weights = ex.device();
  cuda::moe_quantized(weights, d_h.get<uint16_t>(), m, s.k, d_ids.get<int32_t>(), d_w.get<float>(),
                  d_residual.get<float>(), workspace.get(), ws_bytes, nullptr);
  cuda::synchronize();
  const auto out = to_host<float>(d_residual, residual.size());
  int64_t non_finite = 0;
  for (float v : out) non_finite += std::isfinite(v) ? 0 : 1;
  EXPECT_EQ(non_finite, 0);

  std::set<int64_t> rows;
  if (m <= options.checked_rows) {
    for (int64_t r = 0; r < m; ++r) rows.insert(r);
  } else {
    rows = {0, m - 1};
    while (int64_t(rows.size()) < options.checked_rows) rows.insert(int64_t(rng.next() % uint64_t(m)));
  }
  double err = 0, norm = 0;
  std::vector<float> x(size_t(s.hidden));
  for (int64_t r : rows) {
    for (int64_t i = 0; i < s.hidden; ++i) x[size_t(i)] = bf16_to_f32(h[size_t(r * s.hidden + i)]);
    const auto want = ex.reference(x.data(), routed.ids.data() + r * s.k, routed.weights.data() + r * s.k);
    for (int64_t i = 0; i < s.hidden; ++i) {
      // Compare the MoE's contribution, not the residual it was added to.
      const double got = double(out[size_t(r * s.hidden + i)]) - double(residual[size_t(r * s.hidden + i)]);
      err += (got - want[size_t(i)]) * (got - want[size_t(i)]);
      norm += double(want[size_t(i)]) * want[size_t(i)];
    }
  }
  const double rel = std::sqrt(err / norm);
  // The GPU rounds the SwiGLU activations to bf16 (the CPU keeps float32): ~1e-3.
  EXPECT_LT(rel, 1e-2) << "relative error " << rel;

  {
    // With the next layer's norm fused into the combine: the same residual bit for bit, and h
    // (overwritten in place, as the model does) holding rms_norm(residual) in bf16.
    std::vector<float> norm_weight(size_t(s.hidden));
    for (auto& v : norm_weight) v = 0.5f + rng.uniform();
    auto d_norm = to_device(norm_weight), d_residual2 = to_device(residual), d_h2 = to_device(h);
    cuda::memset_device(workspace.get(), 0xff, ws_bytes);
    const cuda::NextNorm next{d_norm.get<float>(), 1e-5f, d_h2.get<uint16_t>()};
    cuda::moe_quantized(weights, d_h2.get<uint16_t>(), m, s.k, d_ids.get<int32_t>(), d_w.get<float>(),
                    d_residual2.get<float>(), workspace.get(), ws_bytes, nullptr, &next);
    const auto out2 = to_host<float>(d_residual2, residual.size());
    const auto normed = to_host<uint16_t>(d_h2, h.size());
    EXPECT_EQ(std::memcmp(out2.data(), out.data(), out.size() * sizeof(float)), 0) << "residual differs with next_norm";
    double worst = 0.0;
    for (int64_t r = 0; r < m; ++r) {
      double squares = 0.0;
      for (int64_t i = 0; i < s.hidden; ++i) squares += double(out[size_t(r * s.hidden + i)]) * out[size_t(r * s.hidden + i)];
      const double inv = 1.0 / std::sqrt(squares / double(s.hidden) + 1e-5);
      for (int64_t i = 0; i < s.hidden; ++i) {
        const double want = double(out[size_t(r * s.hidden + i)]) * inv * norm_weight[size_t(i)];
        const double got = bf16_to_f32(normed[size_t(r * s.hidden + i)]);
        worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), 1e-3));
      }
    }
    EXPECT_LT(worst, 1.0 / 128) << "fused next-layer norm, worst relative error";  // bf16 rounds at 2^-9
  }

  if (options.timing_runs > 0) {
    for (int i = 0; i < 3; ++i)
      cuda::moe_quantized(weights, d_h.get<uint16_t>(), m, s.k, d_ids.get<int32_t>(), d_w.get<float>(),
                      d_residual.get<float>(), workspace.get(), ws_bytes, nullptr);
    std::vector<double> ms;
    cuda::EventTimer timer;
    for (int i = 0; i < options.timing_runs; ++i) {
      timer.start();
      cuda::moe_quantized(weights, d_h.get<uint16_t>(), m, s.k, d_ids.get<int32_t>(), d_w.get<float>(),
                      d_residual.get<float>(), workspace.get(), ws_bytes, nullptr);
      ms.push_back(timer.stop_ms());
    }
    std::sort(ms.begin(), ms.end());
    const double seconds = ms[ms.size() / 2] * 1e-3;
    const std::set<int32_t> active(routed.ids.begin(), routed.ids.end());
    const double bytes = double(active.size()) * double(ex.expert_bytes());
    const double flops = 2.0 * double(m * s.k) * 3.0 * double(s.hidden) * double(s.intermediate);
    std::printf("[ perf ] moe_quantized %s E=%lld H=%lld I=%lld k=%d m=%lld: %.1f us, %zu experts, %.0f GB/s of expert "
                "weights, %.1f TFLOP/s; relative error %.1e\n",
                ex.bf16 ? "BF16" : ex.fp8 ? "FP8" : ex.nv ? "NVFP4" : "MXFP4", static_cast<long long>(s.experts), static_cast<long long>(s.hidden),
                static_cast<long long>(s.intermediate), s.k, static_cast<long long>(m), seconds * 1e6, active.size(),
                bytes / seconds * 1e-9, flops / seconds * 1e-12, rel);
  }
}

// The device layout is a bit permutation of each word: every checkpoint bit lands on its own
// place and comes back, and every word's pairs decode as the checkpoint's nibbles say.
TEST(CudaMoe, PackedCodesAreAPermutationOfEachWord) {
  int seen = 0;
  for (int bit = 0; bit < 32; ++bit) seen |= 1 << cuda::mxfp4::packed_position(bit);
  EXPECT_EQ(uint32_t(seen), 0xffffffffu);
  Rng rng(3);
  std::vector<uint32_t> words(1 << 16);
  for (auto& w : words) w = uint32_t(rng.next());
  words[0] = 0;
  words[1] = 0xffffffffu;
  for (uint32_t w : words) ASSERT_EQ(cuda::mxfp4::unpack_codes_word(cuda::mxfp4::pack_codes_word(w)), w);
  ANVIL_REQUIRE_GPU();
  auto d_words = to_device(words);
  cuda::mxfp4_pack_codes(d_words.get<uint8_t>(), words.size() * 4, nullptr);
  cuda::synchronize();
  const auto packed = to_host<uint32_t>(d_words, words.size());
  for (size_t i = 0; i < words.size(); ++i) ASSERT_EQ(packed[i], cuda::mxfp4::pack_codes_word(words[i])) << i;
}

// The loader's MXFP4 layout (mxfp4_lay_out) is the host packer's, codes and scales, at a K with
// padding (160: 5 blocks in 2 chunks) and gpt-oss's 2,880: each row's chunk c at
// f16_piece_offset (16-row tiles), its scales row after row. Rows in part tiles are refused.
TEST(CudaMoe, LayOutMatchesTheHostPacker) {
  ANVIL_REQUIRE_GPU();
  Rng rng(17);
  {
    cuda::DeviceBuffer src(64 * 16), out(size_t(24 * cuda::mxfp4_device_row_bytes(128)));
    EXPECT_THROW(cuda::mxfp4_lay_out(src.get<uint8_t>(), src.get<uint8_t>(), 24, 128, out.get<uint8_t>(),
                                     out.get<uint8_t>(), nullptr),
                 Error);
  }
  for (const int k : {160, 2880}) {
    const int64_t rows = 48;
    std::vector<uint8_t> codes(size_t(rows * k / 2)), scales(size_t(rows * k / 32));
    for (auto& c : codes) c = uint8_t(rng.next());
    for (auto& sc : scales) sc = uint8_t(rng.next());
    const auto src_codes = to_device(codes), src_scales = to_device(scales);
    const int64_t row_bytes = cuda::mxfp4_device_row_bytes(k), scale_bytes = cuda::mxfp4_device_scale_row_bytes(k);
    cuda::DeviceBuffer d_codes(size_t(rows * row_bytes)), d_scales(size_t(rows * scale_bytes));
    cuda::mxfp4_lay_out(src_codes.get<uint8_t>(), src_scales.get<uint8_t>(), rows, k, d_codes.get<uint8_t>(),
                        d_scales.get<uint8_t>(), nullptr);
    cuda::synchronize();
    const auto got_codes = to_host<uint8_t>(d_codes, size_t(rows * row_bytes));
    const auto got_scales = to_host<uint8_t>(d_scales, size_t(rows * scale_bytes));
    std::vector<uint8_t> want(static_cast<size_t>(row_bytes)), want_scales(static_cast<size_t>(scale_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      cuda::mxfp4::pack_row_f16(&codes[size_t(r * k / 2)], want.data(), k);
      cuda::mxfp4::pack_scales_f16(&scales[size_t(r * k / 32)], want_scales.data(), k);
      std::vector<uint8_t> got_row;
      const int chunks = cuda::mxfp4::f16_chunks(k);
      for (int c = 0; c < chunks; ++c) {
        const auto piece = got_codes.begin() + cuda::mxfp4::f16_piece_offset(r, c, chunks);
        got_row.insert(got_row.end(), piece, piece + cuda::mxfp4::kF16ChunkBytes);
      }
      ASSERT_EQ(got_row, want) << "K " << k << " row " << r;
      ASSERT_EQ(std::vector<uint8_t>(got_scales.begin() + r * scale_bytes, got_scales.begin() + (r + 1) * scale_bytes),
                want_scales)
          << "K " << k << " row " << r;
    }
  }
}

TEST(CudaMoe, TopkTiesGoToTheLowerIndex) {
  ANVIL_REQUIRE_GPU();
  Rng rng(7);
  for (int64_t experts : {4, 32, 128, 200, 256}) {
    for (int k : {1, 2, 4}) {
      const int64_t m = 97;
      std::vector<float> logits(size_t(m * experts));
      // Three distinct values only: almost every pick is a tie; -0 ties with +0.
      for (auto& v : logits) {
        v = float(rng.next() % 3);
        if (v == 0.0f && rng.next() % 2 == 0) v = -0.0f;
      }
      auto d_logits = to_device(logits);
      cuda::DeviceBuffer d_ids(size_t(m * k) * 4), d_w(size_t(m * k) * 4);
      cuda::moe_topk_softmax(d_logits.get<float>(), m, experts, k, d_ids.get<int32_t>(), d_w.get<float>(), nullptr);
      cuda::synchronize();
      const auto ids = to_host<int32_t>(d_ids, size_t(m * k));
      const auto w = to_host<float>(d_w, size_t(m * k));
      for (int64_t row = 0; row < m; ++row) {
        const auto chosen = cpu::top_k_indices(logits.data() + row * experts, experts, k);
        float sum = 0;
        for (int j = 0; j < k; ++j) {
          ASSERT_EQ(ids[size_t(row * k + j)], chosen[size_t(j)]) << "E=" << experts << " k=" << k << " row " << row;
          sum += w[size_t(row * k + j)];
        }
        EXPECT_NEAR(sum, 1.0f, 1e-5f);
      }
    }
  }
}

TEST(CudaMoe, RandomRoutingSmallShapes) {
  ANVIL_REQUIRE_GPU();
  Rng rng(11);
  // H and I multiples of 64: both paths; decode for few tokens per expert, GEMM (64- and
  // 128-row tiles) once experts average 16+.
  const Experts ex({8, 256, 384, 2}, rng);
  for (int64_t m : {1, 3, 8, 17, 33, 64, 300, 2048}) {
    const auto routed = route_on_gpu(m, ex.shape, rng);
    run_moe(ex, m, routed, rng);
  }
}

TEST(CudaMoe, DecodePathOnlyShapes) {
  ANVIL_REQUIRE_GPU();
  Rng rng(13);
  // H = 288 is not a multiple of 64, so every m takes the decode kernels, many tokens in
  // several passes; I = 96 leaves a partial 128-wide chunk.
  const Experts ex({4, 288, 96, 2}, rng);
  for (int64_t m : {1, 5, 40, 300}) {
    const auto routed = route_on_gpu(m, ex.shape, rng);
    run_moe(ex, m, routed, rng);
  }
}

TEST(CudaMoe, OneExpertGetsEveryToken) {
  ANVIL_REQUIRE_GPU();
  Rng rng(17);
  const Experts ex({16, 256, 256, 4}, rng);
  for (int64_t m : {1, 9, 40, 300, 1000}) {
    Routed routed;
    for (int64_t r = 0; r < m; ++r) {
      // Expert 5 always; the other picks vary, always distinct.
      std::vector<int32_t> picks = {5};
      while (picks.size() < 4) {
        const int32_t e = int32_t(rng.next() % 16);
        if (std::find(picks.begin(), picks.end(), e) == picks.end()) picks.push_back(e);
      }
      float sum = 0;
      std::vector<float> w(4);
      for (auto& v : w) sum += (v = 0.1f + std::fabs(rng.uniform()));
      for (int j = 0; j < 4; ++j) {
        routed.ids.push_back(picks[size_t(j)]);
        routed.weights.push_back(w[size_t(j)] / sum);
      }
    }
    run_moe(ex, m, routed, rng);
  }
}

TEST(CudaMoe, ScalesAbove128) {
  ANVIL_REQUIRE_GPU();
  Rng rng(19);
  const Experts ex({8, 256, 256, 2}, rng, Scaling::Mxfp4Big);
  for (int64_t m : {2, 600}) {
    const auto routed = route_on_gpu(m, ex.shape, rng);
    run_moe(ex, m, routed, rng);
  }
}

// The gpt-oss-20b expert shapes at the given m, checked and timed (the speed is informational).
void time_gpt_oss_20b_shapes(Scaling scaling, uint64_t seed, std::initializer_list<int64_t> ms) {
  ANVIL_REQUIRE_GPU();
  Rng rng(seed);
  const Experts ex({32, 2880, 2880, 4}, rng, scaling);
  for (int64_t m : ms) {
    const auto routed = route_on_gpu(m, ex.shape, rng);
    RunOptions options;
    options.timing_runs = m >= 2048 ? 10 : 50;
    options.checked_rows = m >= 64 ? 6 : 8;
    run_moe(ex, m, routed, rng, options);
  }
}

// Both paths: the decode kernels (few tokens per expert, and H = 288, which only they take) and
// the grouped GEMM; K = 320 / 192 on both.
void check_both_paths(Scaling scaling, uint64_t seed, Gating gating = Gating::GptOss) {
  ANVIL_REQUIRE_GPU();
  Rng rng(seed);
  const Experts ex({8, 256, 384, 2}, rng, scaling, gating);
  for (int64_t m : {1, 3, 17, 64, 300, 2048}) {
    const auto routed = route_on_gpu(m, ex.shape, rng);
    run_moe(ex, m, routed, rng);
  }
  const Experts odd({4, 288, 96, 2}, rng, scaling, gating);
  for (int64_t m : {1, 40, 300}) {
    const auto routed = route_on_gpu(m, odd.shape, rng);
    run_moe(odd, m, routed, rng);
  }
  // K = 320 and 192: MXFP4 rows end in a part chunk (2 of its 4 blocks) on every path, the GEMM's
  // included (its k tiles are half chunks).
  const Experts part({4, 320, 192, 2}, rng, scaling, gating);
  for (int64_t m : {1, 5, 300, 2048}) {
    const auto routed = route_on_gpu(m, part.shape, rng);
    run_moe(part, m, routed, rng);
  }
}

// moe_quantized_from_logits (at one row the decode kernels pick the experts themselves, up to 16
// rows the routing kernel does, past that a kernel of its own) writes the ids and weights
// moe_topk_softmax writes, and gives the bits of moe_quantized on them; ties between logits
// included, every decode format, one to eight picks.
TEST(CudaMoe, FromLogitsEqualsTopkThenExperts) {
  ANVIL_REQUIRE_GPU();
  Rng rng(73);
  struct Case {
    Shape shape;
    Scaling scaling;
  };
  for (const Case& c : {Case{Shape{32, 256, 384, 4}, Scaling::Mxfp4}, Case{Shape{128, 256, 256, 4}, Scaling::Mxfp4},
                        Case{Shape{16, 256, 256, 8}, Scaling::Nvfp4}, Case{Shape{8, 256, 128, 1}, Scaling::Fp8},
                        Case{Shape{64, 256, 256, 6}, Scaling::Mxfp4Big}, Case{Shape{16, 256, 384, 4}, Scaling::Bf16}}) {
    const Shape& shape = c.shape;
    const Experts ex(shape, rng, c.scaling);
    const auto weights = ex.device();
    for (int64_t m : {1, 3, 16, 17, 64}) {
      SCOPED_TRACE("E=" + std::to_string(shape.experts) + " k=" + std::to_string(shape.k) +
                   " scaling=" + std::to_string(int(c.scaling)) + " m=" + std::to_string(m));
      std::vector<float> logits(size_t(m * shape.experts));
      for (auto& v : logits) v = std::round(8.0f * rng.uniform()) / 4.0f;  // coarse: many ties
      std::vector<uint16_t> h(size_t(m * shape.hidden));
      for (auto& v : h) v = f32_to_bf16(rng.uniform());
      std::vector<float> residual(size_t(m * shape.hidden));
      for (auto& v : residual) v = rng.uniform();
      auto d_logits = to_device(logits), d_h = to_device(h);
      const size_t ws_bytes = cuda::moe_quantized_workspace_bytes(m, shape.k, shape.experts, shape.hidden, shape.intermediate);
      cuda::DeviceBuffer workspace(ws_bytes);
      std::vector<int32_t> ids[2];
      std::vector<float> route_weights[2], out[2];
      for (int fused = 0; fused < 2; ++fused) {
        cuda::DeviceBuffer d_ids(size_t(m * shape.k) * 4), d_w(size_t(m * shape.k) * 4);
        cuda::memset_device(d_ids.get(), 0xff, d_ids.bytes());
        cuda::memset_device(d_w.get(), 0xff, d_w.bytes());
        cuda::memset_device(workspace.get(), 0xff, ws_bytes);
        auto d_residual = to_device(residual);
        if (fused) {
          cuda::moe_quantized_from_logits(weights, d_h.get<uint16_t>(), m, shape.k, d_logits.get<float>(),
                                          d_ids.get<int32_t>(), d_w.get<float>(), d_residual.get<float>(),
                                          workspace.get(), ws_bytes, nullptr);
        } else {
          cuda::moe_topk_softmax(d_logits.get<float>(), m, shape.experts, shape.k, d_ids.get<int32_t>(),
                                 d_w.get<float>(), nullptr);
          cuda::moe_quantized(weights, d_h.get<uint16_t>(), m, shape.k, d_ids.get<int32_t>(), d_w.get<float>(),
                              d_residual.get<float>(), workspace.get(), ws_bytes, nullptr);
        }
        ids[fused] = to_host<int32_t>(d_ids, size_t(m * shape.k));
        route_weights[fused] = to_host<float>(d_w, size_t(m * shape.k));
        out[fused] = to_host<float>(d_residual, residual.size());
      }
      EXPECT_EQ(ids[0], ids[1]);
      EXPECT_EQ(std::memcmp(route_weights[0].data(), route_weights[1].data(), route_weights[0].size() * 4), 0);
      EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4), 0);
    }
  }
}

// Batch 1 with NextNorm::may_defer (MXFP4, four picks): down adds the experts' sum into the
// residual itself and no combine runs, so no norm is made (the call says so). The residual must be
// the combine path's bit for bit: the kernel takes each expert's value from its own column of the
// mma and adds them in the combine's order. Ties in the logits (coarse values), a part chunk of k
// (intermediate 192 and 320), scales above 128, rows past a warp's four (hidden 32 x 3). With
// gpt-oss's clamped SwiGLU, gate_up hands down fp16 activations scaled by their bound
// (act_f16_shift) while the combine path stages bf16 ones by their largest magnitude: the same
// bits wherever both scalings are exact; Qwen's unbounded silu keeps bf16 activations.
TEST(CudaMoe, SumInDownEqualsTheCombine) {
  ANVIL_REQUIRE_GPU();
  if (!cuda::current_device_runs(cuda::kMoeBatch1SumOp, cuda::kMoeBatch1SumInDown))
    GTEST_SKIP() << "this GPU's kernel-table row keeps the combine kernel";
  Rng rng(91);
  struct Case {
    Shape shape;
    Scaling scaling;
    Gating gating = Gating::GptOss;
  };
  for (const Case& c : {Case{Shape{32, 256, 384, 4}, Scaling::Mxfp4}, Case{Shape{8, 320, 192, 4}, Scaling::Mxfp4},
                        Case{Shape{128, 512, 320, 4}, Scaling::Mxfp4}, Case{Shape{16, 96, 128, 4}, Scaling::Mxfp4Big},
                        Case{Shape{4, 2880, 2880, 4}, Scaling::Mxfp4},
                        Case{Shape{32, 256, 384, 4}, Scaling::Mxfp4, Gating::Qwen}}) {
    const Shape& shape = c.shape;
    const Experts ex(shape, rng, c.scaling, c.gating);
    const auto weights = ex.device();
    std::vector<float> norm_weight(size_t(shape.hidden));
    for (auto& v : norm_weight) v = 0.5f + rng.uniform();
    const auto d_norm = to_device(norm_weight);
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE("E=" + std::to_string(shape.experts) + " H=" + std::to_string(shape.hidden) +
                   " I=" + std::to_string(shape.intermediate) + (c.gating == Gating::Qwen ? " qwen" : "") +
                   " trial " + std::to_string(trial));
      std::vector<float> logits(size_t(shape.experts));
      for (auto& v : logits) v = std::round(8.0f * rng.uniform()) / 4.0f;
      std::vector<uint16_t> h(size_t(shape.hidden));
      for (auto& v : h) v = f32_to_bf16(rng.uniform() * (trial + 1));
      std::vector<float> residual(size_t(shape.hidden));
      for (auto& v : residual) v = rng.uniform();
      auto d_logits = to_device(logits), d_h = to_device(h);
      const size_t ws_bytes = cuda::moe_quantized_workspace_bytes(1, shape.k, shape.experts, shape.hidden, shape.intermediate);
      cuda::DeviceBuffer workspace(ws_bytes), d_ids(size_t(shape.k) * 4), d_w(size_t(shape.k) * 4);
      cuda::DeviceBuffer d_next(size_t(shape.hidden) * 2);
      std::vector<float> out[2];
      bool normed[2] = {};
      for (int defer = 0; defer < 2; ++defer) {
        cuda::memset_device(workspace.get(), 0xff, ws_bytes);
        auto d_residual = to_device(residual);
        cuda::NextNorm next{d_norm.get<float>(), 1e-5f, d_next.get<uint16_t>()};
        next.may_defer = defer == 1;
        normed[defer] = cuda::moe_quantized_from_logits(weights, d_h.get<uint16_t>(), 1, shape.k, d_logits.get<float>(),
                                                        d_ids.get<int32_t>(), d_w.get<float>(), d_residual.get<float>(),
                                                        workspace.get(), ws_bytes, nullptr, &next);
        out[defer] = to_host<float>(d_residual, residual.size());
      }
      EXPECT_TRUE(normed[0]);
      EXPECT_FALSE(normed[1]) << "the sum in down did not run";
      int64_t differ = 0;
      for (size_t i = 0; i < out[0].size(); ++i) differ += std::memcmp(&out[0][i], &out[1][i], 4) != 0 ? 1 : 0;
      EXPECT_EQ(differ, 0) << "first values " << out[0][0] << " vs " << out[1][0];
    }
  }
}

// moe_quantized_from_residual at batch 1 with the norm, router and picks in one cluster launch
// (where the kernel table names it) against the same call with that launch turned off
// (rms_norm_router, then the one-warp routing kernel): the bf16 norm, the picks, their weights and
// the residual bit for bit. Duplicated router rows make exact ties (the lower id wins); 16 to 128
// experts (one to sixteen per cluster block), hidden sizes of one to four pieces per thread, with
// and without a router bias.
TEST(CudaMoe, OneLaunchRoutingEqualsNormRouterThenRouting) {
  ANVIL_REQUIRE_GPU();
  if (!cuda::current_device_runs(cuda::kMoeBatch1RouteOp, cuda::kMoeBatch1RouteCluster))
    GTEST_SKIP() << "this GPU's kernel-table row keeps the norm + router and routing kernels";
  Rng rng(97);
  for (const Shape& shape : {Shape{16, 128, 128, 4}, Shape{32, 2880, 384, 4}, Shape{128, 4096, 128, 4},
                             Shape{64, 1024, 256, 4}, Shape{128, 2880, 128, 4}}) {
    const Experts ex(shape, rng, Scaling::Mxfp4);
    const auto weights = ex.device();
    const int64_t E = shape.experts, H = shape.hidden;
    std::vector<float> norm_weight(static_cast<size_t>(H));
    for (auto& v : norm_weight) v = 0.5f + rng.uniform();
    std::vector<uint16_t> router(size_t(E * H));
    for (auto& v : router) v = f32_to_bf16(0.2f * (rng.uniform() - 0.5f));
    for (int64_t e : {int64_t(5), E - 1})  // ties with rows 3 and 0
      std::copy_n(router.begin() + (e == 5 ? 3 : 0) * H, H, router.begin() + e * H);
    std::vector<float> bias(static_cast<size_t>(E));
    for (auto& v : bias) v = 0.1f * rng.uniform();
    const auto d_norm = to_device(norm_weight), d_router = to_device(router), d_bias = to_device(bias);
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE("E=" + std::to_string(E) + " H=" + std::to_string(H) + " trial " + std::to_string(trial));
      std::vector<float> residual(static_cast<size_t>(H));
      for (auto& v : residual) v = (rng.uniform() - 0.5f) * float(1 << (4 * trial));
      const size_t ws_bytes = cuda::moe_quantized_workspace_bytes(1, shape.k, E, H, shape.intermediate);
      cuda::DeviceBuffer workspace(ws_bytes), d_logits(size_t(E) * 4), d_scratch(size_t(H) * 4);
      std::vector<float> out[2], route_weights[2];
      std::vector<int32_t> ids[2];
      std::vector<uint16_t> h[2];
      for (int one_launch = 0; one_launch < 2; ++one_launch) {
        cuda::allow_fused_routing(one_launch == 1);
        auto d_residual = to_device(residual);
        cuda::DeviceBuffer d_h(size_t(H) * 2), d_ids(size_t(shape.k) * 4), d_w(size_t(shape.k) * 4);
        cuda::memset_device(d_h.get(), 0xff, d_h.bytes());
        cuda::memset_device(workspace.get(), 0xff, ws_bytes);
        cuda::NextNorm next{d_norm.get<float>(), 1e-5f, nullptr};
        next.may_defer = true;
        const cuda::MoeRouterInput in{d_residual.get<float>(), d_norm.get<float>(), 1e-5f, d_router.get<uint16_t>(),
                                      trial % 2 == 0 ? d_bias.get<float>() : nullptr};
        EXPECT_EQ(cuda::moe_routes_in_one_launch(weights, in, 1, shape.k, d_h.get<uint16_t>(), &next), one_launch == 1);
        cuda::moe_quantized_from_residual(weights, in, 1, shape.k, d_h.get<uint16_t>(), d_scratch.get<float>(),
                                          d_logits.get<float>(), d_ids.get<int32_t>(), d_w.get<float>(),
                                          workspace.get(), ws_bytes, nullptr, &next);
        out[one_launch] = to_host<float>(d_residual, residual.size());
        ids[one_launch] = to_host<int32_t>(d_ids, size_t(shape.k));
        route_weights[one_launch] = to_host<float>(d_w, size_t(shape.k));
        h[one_launch] = to_host<uint16_t>(d_h, size_t(H));
      }
      cuda::allow_fused_routing(true);
      EXPECT_EQ(ids[0], ids[1]);
      EXPECT_EQ(std::memcmp(route_weights[0].data(), route_weights[1].data(), route_weights[0].size() * 4), 0);
      EXPECT_EQ(h[0], h[1]);
      int64_t differ = 0;
      for (size_t i = 0; i < out[0].size(); ++i) differ += std::memcmp(&out[0][i], &out[1][i], 4) != 0 ? 1 : 0;
      EXPECT_EQ(differ, 0) << "first values " << out[0][0] << " vs " << out[1][0];
    }
  }
}

TEST(CudaMoe, GptOss20bShapesWithSpeed) { time_gpt_oss_20b_shapes(Scaling::Mxfp4, 23, {1, 8, 64, 2048}); }

// NVFP4 experts through both paths, with E4M3 block scales (subnormal and zero ones included) and
// a global scale per expert and matrix.
TEST(CudaMoeNvfp4, RandomRoutingBothPaths) { check_both_paths(Scaling::Nvfp4, 31); }

TEST(CudaMoeNvfp4, GptOss20bShapesWithSpeed) { time_gpt_oss_20b_shapes(Scaling::Nvfp4, 37, {1, 64, 2048}); }

// The device quantizer against the CPU's quantize_linear, byte for byte: MXFP4 experts
// re-quantized to NVFP4 on the GPU give the CPU's codes, block scales and global scale; a
// non-finite weight is reported by its row.
// Random MXFP4 experts for the device quantizers: scales from 2^-20 to 2^8 (so some NVFP4 block
// scales are subnormal), expert 1 all zero.
struct MxfpExperts {
  int64_t experts = 3, rows = 40, in = 96;
  std::vector<uint8_t> codes, mx;
  explicit MxfpExperts(Rng& rng) : codes(size_t(experts * rows * in / 2)), mx(size_t(experts * rows * in / 32)) {
    for (auto& c : codes) c = uint8_t(rng.next());
    for (auto& s : mx) s = uint8_t(107 + rng.next() % 29);
    std::fill(codes.begin() + rows * in / 2, codes.begin() + rows * in, uint8_t(0));
  }
  // Expert e quantized by the CPU's quantize_linear.
  QuantizedLinear on_cpu(int64_t e, WeightFormat target) const {
    LinearWeight source;
    source.format = WeightFormat::MXFP4;
    source.out_features = rows;
    source.in_features = in;
    source.data = codes.data() + e * rows * in / 2;
    source.scales = mx.data() + e * rows * in / 32;
    ThreadPool pool(2);
    return quantize_linear(source, target, "expert", pool);
  }
  // The MXFP4 scales with one made 255 (2^128), so a nonzero code of flattened row bad_row is
  // infinite.
  std::vector<uint8_t> mx_with_infinity(int64_t bad_row) const {
    std::vector<uint8_t> bad = mx;
    bad[size_t(bad_row * in / 32 + 1)] = 255;
    return bad;
  }
};

TEST(CudaMoeNvfp4, DeviceQuantizerMatchesTheCpu) {
  ANVIL_REQUIRE_GPU();
  Rng rng(41);
  const MxfpExperts input(rng);
  const int64_t experts = input.experts, rows = input.rows, in = input.in;
  const auto& codes = input.codes;
  auto d_codes = to_device(codes), d_mx = to_device(input.mx);
  cuda::DeviceBuffer d_nv(size_t(experts * rows * in / 16)), d_row_scales(size_t(experts * rows) * 4);
  ASSERT_EQ(cuda::quantize_mxfp4_experts_to_nvfp4(d_codes.get<uint8_t>(), d_mx.get<uint8_t>(), experts, rows, in,
                                                  d_nv.get<uint8_t>(), d_row_scales.get<float>(), nullptr),
            -1);
  const auto got_codes = to_host<uint8_t>(d_codes, codes.size());
  const auto got_scales = to_host<uint8_t>(d_nv, size_t(experts * rows * in / 16));
  const auto got_row_scales = to_host<float>(d_row_scales, size_t(experts * rows));
  for (int64_t e = 0; e < experts; ++e) {
    const QuantizedLinear want = input.on_cpu(e, WeightFormat::NVFP4);
    for (int64_t r = 0; r < rows; ++r)  // every row carries its expert's global scale
      ASSERT_EQ(got_row_scales[size_t(e * rows + r)], want.weight().global_scale) << "expert " << e << " row " << r;
    const auto* want_codes = static_cast<const uint8_t*>(want.weight().data);
    for (int64_t i = 0; i < rows * in / 2; ++i)
      ASSERT_EQ(got_codes[size_t(e * rows * in / 2 + i)], want_codes[i]) << "expert " << e << " byte " << i;
    for (int64_t i = 0; i < rows * in / 16; ++i)
      ASSERT_EQ(got_scales[size_t(e * rows * in / 16 + i)], want.weight().scales[i]) << "expert " << e << " scale " << i;
  }
  auto d_codes2 = to_device(codes), d_bad = to_device(input.mx_with_infinity(2 * rows + 7));
  EXPECT_EQ(cuda::quantize_mxfp4_experts_to_nvfp4(d_codes2.get<uint8_t>(), d_bad.get<uint8_t>(), experts, rows, in,
                                                  d_nv.get<uint8_t>(), d_row_scales.get<float>(), nullptr),
            2 * rows + 7);
}

// FP8 experts (E4M3 codes in the expert layout, a scale per row) through both paths.
TEST(CudaMoeFp8, RandomRoutingBothPaths) { check_both_paths(Scaling::Fp8, 43); }

TEST(CudaMoeFp8, GptOss20bShapesWithSpeed) { time_gpt_oss_20b_shapes(Scaling::Fp8, 47, {1, 64, 2048}); }

// The FP8 device quantizer against the CPU's quantize_linear: the same codes (in the expert
// layout) and row scales, an all-zero expert getting scale 1, and a non-finite row reported.
TEST(CudaMoeFp8, DeviceQuantizerMatchesTheCpu) {
  ANVIL_REQUIRE_GPU();
  Rng rng(53);
  const MxfpExperts input(rng);
  const int64_t experts = input.experts, rows = input.rows, in = input.in;
  auto d_codes = to_device(input.codes), d_mx = to_device(input.mx);
  cuda::DeviceBuffer d_fp8(size_t(experts * rows * in)), d_scales(size_t(experts * rows) * 4);
  ASSERT_EQ(cuda::quantize_mxfp4_experts_to_fp8(d_codes.get<uint8_t>(), d_mx.get<uint8_t>(), experts, rows, in,
                                                d_fp8.get<uint8_t>(), d_scales.get<float>(), nullptr),
            -1);
  const auto got_codes = to_host<uint8_t>(d_fp8, size_t(experts * rows * in));
  const auto got_scales = to_host<float>(d_scales, size_t(experts * rows));
  for (int64_t e = 0; e < experts; ++e) {
    const QuantizedLinear want = input.on_cpu(e, WeightFormat::FP8);
    const auto* want_codes = static_cast<const uint8_t*>(want.weight().data);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(got_scales[size_t(e * rows + r)], want.weight().row_scales[r]) << "expert " << e << " row " << r;
      for (int64_t k = 0; k < in; ++k)
        ASSERT_EQ(got_codes[size_t((e * rows + r) * in + cuda::fp8::expert_position(int(k)))], want_codes[r * in + k])
            << "expert " << e << " row " << r << " k " << k;
    }
  }
  auto d_bad = to_device(input.mx_with_infinity(2 * rows + 7));
  EXPECT_EQ(cuda::quantize_mxfp4_experts_to_fp8(d_codes.get<uint8_t>(), d_bad.get<uint8_t>(), experts, rows, in,
                                                d_fp8.get<uint8_t>(), d_scales.get<float>(), nullptr),
            2 * rows + 7);
}

// Qwen3-MoE's bf16 experts quantized on the device against the CPU's quantize_linear of each
// checkpoint matrix, byte for byte, in every format: gate and up interleaved into one matrix
// (row_step 2), rows spanning 2^-24 to 2^6 (subnormal E4M3 block scales), a zero row; a NaN is
// reported by its row.
TEST(CudaMoe, Bf16ExpertQuantizerMatchesTheCpu) {
  ANVIL_REQUIRE_GPU();
  Rng rng(71);
  const int64_t rows = 24, in = 96;
  std::vector<std::vector<uint16_t>> parts(2, std::vector<uint16_t>(size_t(rows * in)));
  for (auto& part : parts) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < in; ++i)
        part[size_t(r * in + i)] = r == 5 ? 0 : f32_to_bf16(std::ldexp(rng.uniform(), int(r) - 18 + int(i / 32)));
  }
  ThreadPool pool(2);
  for (const auto format : {cuda::ExpertFormat::MXFP4, cuda::ExpertFormat::NVFP4, cuda::ExpertFormat::FP8}) {
    SCOPED_TRACE(int(format));
    const bool fp8 = format == cuda::ExpertFormat::FP8, nv = format == cuda::ExpertFormat::NVFP4;
    const WeightFormat target = fp8 ? WeightFormat::FP8 : nv ? WeightFormat::NVFP4 : WeightFormat::MXFP4;
    const int64_t row_bytes = fp8 ? in : in / 2, scale_cols = fp8 ? 0 : in / (nv ? 16 : 32);
    cuda::DeviceBuffer codes(size_t(2 * rows * row_bytes)), scales(size_t(std::max<int64_t>(1, 2 * rows * scale_cols))),
        row_scales(size_t(2 * rows) * 4);
    for (int part = 0; part < 2; ++part) {
      auto d_part = to_device(parts[size_t(part)]);
      ASSERT_EQ(cuda::quantize_bf16_expert_rows(d_part.get<uint16_t>(), rows, in, format, codes.get<uint8_t>(),
                                                scales.get<uint8_t>(), row_scales.get<float>(), part, 2, nullptr),
                -1);
    }
    const auto got_codes = to_host<uint8_t>(codes, size_t(2 * rows * row_bytes));
    const auto got_scales = to_host<uint8_t>(scales, size_t(2 * rows * scale_cols));
    const auto got_row_scales = to_host<float>(row_scales, size_t(2 * rows));
    for (int part = 0; part < 2; ++part) {
      LinearWeight source;
      source.format = WeightFormat::BF16;
      source.out_features = rows;
      source.in_features = in;
      source.data = parts[size_t(part)].data();
      const QuantizedLinear want = quantize_linear(source, target, "expert", pool);
      const auto* want_codes = static_cast<const uint8_t*>(want.weight().data);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t out_row = 2 * r + part;
        for (int64_t i = 0; i < row_bytes; ++i) {
          const int64_t at = fp8 ? cuda::fp8::expert_position(int(i)) : i;
          ASSERT_EQ(got_codes[size_t(out_row * row_bytes + at)], want_codes[r * row_bytes + i])
              << "part " << part << " row " << r << " byte " << i;
        }
        for (int64_t i = 0; i < scale_cols; ++i)
          ASSERT_EQ(got_scales[size_t(out_row * scale_cols + i)], want.weight().scales[r * scale_cols + i])
              << "part " << part << " row " << r << " scale " << i;
        if (fp8) {
          EXPECT_EQ(got_row_scales[size_t(out_row)], want.weight().row_scales[r]) << "row " << r;
        } else if (nv) {
          EXPECT_EQ(got_row_scales[size_t(out_row)], want.weight().global_scale) << "row " << r;
        }
      }
    }
    std::vector<uint16_t> bad = parts[0];
    bad[size_t(9 * in + 40)] = 0x7FC0;  // NaN
    auto d_bad = to_device(bad);
    EXPECT_EQ(cuda::quantize_bf16_expert_rows(d_bad.get<uint16_t>(), rows, in, format, codes.get<uint8_t>(),
                                              scales.get<uint8_t>(), row_scales.get<float>(), 0, 2, nullptr),
              9);
  }
}

// The expert layout is a permutation of each 16-byte block that decodes, through the two pair
// extractions, to the FP4 kernels' pairs (c, c + 4), c = 8(j/4) + j%4.
TEST(CudaMoeFp8, ExpertLayoutPairsMatchTheFp4Order) {
  int seen = 0;
  for (int k = 0; k < 16; ++k) seen |= 1 << cuda::fp8::expert_position(k);
  EXPECT_EQ(seen, 0xffff);
  uint8_t block[16];
  for (int k = 0; k < 16; ++k) block[cuda::fp8::expert_position(k)] = uint8_t(k + 1);  // a code per k
  for (int j = 0; j < 8; ++j) {
    uint32_t word;
    std::memcpy(&word, block + 4 * (j / 2), 4);
    const uint32_t pair = j % 2 ? cuda::fp8::high_pair_raw(word) : cuda::fp8::low_pair_raw(word);
    const int c = 8 * (j / 4) + j % 4;
    // bf16 bits of code value · 2^-120 hold the code's 7 magnitude bits at bits 4-10.
    EXPECT_EQ((pair >> 4) & 0x7f, uint32_t(c + 1)) << "pair " << j;
    EXPECT_EQ((pair >> 20) & 0x7f, uint32_t(c + 5)) << "pair " << j;
  }
}

// Batch 1 with MXFP4 reads its token in fp16 (moe_decode_f16.cuh) scaled by a power of two per
// warp: tokens far above fp16's range (2^20 in, so Qwen's unclamped silu · up reaches ~2^40 in
// down) and far below it (2^-30) must come out as exactly as O(1) ones.
TEST(CudaMoe, OneTokenFormKeepsTokensOutsideTheFp16Range) {
  ANVIL_REQUIRE_GPU();
  Rng rng(83);
  for (const Gating gating : {Gating::Qwen, Gating::GptOss}) {
    const Experts ex({8, 320, 192, 2}, rng, Scaling::Mxfp4, gating);
    for (const int exponent : {20, -30}) {
      SCOPED_TRACE("h in 2^" + std::to_string(exponent));
      RunOptions options;
      options.h_exponent = exponent;
      run_moe(ex, 1, route_on_gpu(1, ex.shape, rng), rng, options);
    }
  }
}

// Qwen3-MoE's experts (silu(gate) · up, no biases) in each format through both paths.
TEST(CudaMoe, QwenGatingWithoutBiasesBothPaths) {
  check_both_paths(Scaling::Mxfp4, 59, Gating::Qwen);
  check_both_paths(Scaling::Nvfp4, 61, Gating::Qwen);
  check_both_paths(Scaling::Fp8, 67, Gating::Qwen);
}

// Qwen3-MoE's bf16 experts as shipped through both tensor-core paths against the CPU: the decode
// kernels (few tokens per expert) and the grouped GEMM (16+ on average, moe_quantized_takes_gemm),
// at both tile sizes, with uneven routing and at Qwen3-30B-A3B's expert sizes.
TEST(CudaMoeBf16, DecodeAndGroupedGemmMatchTheCpu) {
  ANVIL_REQUIRE_GPU();
  Rng rng(71);
  const Experts ex({8, 256, 384, 2}, rng, Scaling::Bf16, Gating::Qwen);
  EXPECT_FALSE(cuda::moe_quantized_takes_gemm(63, 2, 8, 256, 384));
  for (int64_t m : {1, 3, 8, 17, 63}) run_moe(ex, m, route_on_gpu(m, ex.shape, rng), rng);
  for (int64_t m : {64, 300, 2048}) {
    ASSERT_TRUE(cuda::moe_quantized_takes_gemm(m, 2, 8, 256, 384));
    run_moe(ex, m, route_on_gpu(m, ex.shape, rng), rng);
  }
  const Experts wide({16, 2048, 768, 8}, rng, Scaling::Bf16, Gating::Qwen);  // Qwen3-30B-A3B's sizes, fewer experts
  for (int64_t m : {1, 8}) run_moe(wide, m, route_on_gpu(m, wide.shape, rng), rng);
  run_moe(wide, 128, route_on_gpu(128, wide.shape, rng), rng, {0, 6});
}

// moe_bf16_pack lays out experts as loaded (gate rows, then up rows) into the interleaved rows and
// bf16_layout.h's order that both bf16 paths read, and moe_bf16 (CUDA cores, float32 h) on those
// bytes agrees with the CPU to float32 rounding.
TEST(CudaMoeBf16, PackedExpertsOnCudaCoresMatchTheCpu) {
  ANVIL_REQUIRE_GPU();
  Rng rng(73);
  const Experts ex({8, 256, 384, 2}, rng, Scaling::Bf16, Gating::Qwen);
  const Shape& s = ex.shape;
  const int64_t H = s.hidden, W = s.intermediate;
  // The checkpoint's order: per expert the W gate rows (even rows of the test's gate_up), then
  // the W up rows (odd ones).
  std::vector<uint16_t> loaded(size_t(s.experts * 2 * W * H)), down(size_t(s.experts * H * W));
  for (int64_t e = 0; e < s.experts; ++e)
    for (int64_t j = 0; j < 2 * W; ++j) {
      const int64_t from = e * 2 * W + (j < W ? 2 * j : 2 * (j - W) + 1);
      std::memcpy(&loaded[size_t((e * 2 * W + j) * H)], &ex.gu_blocks[size_t(from * H * 2)], size_t(H) * 2);
    }
  std::memcpy(down.data(), ex.down_blocks.data(), down.size() * 2);
  auto d_gate_up = to_device(loaded), d_down = to_device(down);
  cuda::moe_bf16_pack(d_gate_up.get<uint16_t>(), d_down.get<uint16_t>(), s.experts, H, W, nullptr);
  EXPECT_EQ(std::memcmp(to_host<uint8_t>(d_gate_up, loaded.size() * 2).data(),
                        to_host<uint8_t>(ex.d_gu_blocks, loaded.size() * 2).data(), loaded.size() * 2),
            0);
  EXPECT_EQ(std::memcmp(to_host<uint8_t>(d_down, down.size() * 2).data(),
                        to_host<uint8_t>(ex.d_down_blocks, down.size() * 2).data(), down.size() * 2),
            0);
  cuda::MoeBf16Weights w{d_gate_up.get<uint16_t>(), d_down.get<uint16_t>(), s.experts, H, W};
  for (int64_t m : {1, 5, 40}) {
    const auto routed = route_on_gpu(m, s, rng);
    std::vector<float> h(size_t(m * H)), residual(size_t(m * H));
    for (auto& v : h) v = rng.uniform();
    for (auto& v : residual) v = rng.uniform();
    auto d_h = to_device(h), d_res = to_device(residual), d_ids = to_device(routed.ids),
         d_w = to_device(routed.weights);
    const size_t ws_bytes = cuda::moe_bf16_workspace_bytes(m, s.k, W);
    cuda::DeviceBuffer workspace(ws_bytes);
    cuda::moe_bf16(w, d_h.get<float>(), m, s.k, d_ids.get<int32_t>(), d_w.get<float>(), d_res.get<float>(),
                   workspace.get(), ws_bytes, nullptr);
    const auto out = to_host<float>(d_res, residual.size());
    double worst = 0;
    for (int64_t r = 0; r < m; ++r) {
      const auto want = ex.reference(h.data() + r * H, routed.ids.data() + r * s.k, routed.weights.data() + r * s.k);
      for (int64_t i = 0; i < H; ++i)
        worst = std::max(worst, std::abs(double(out[size_t(r * H + i)]) - residual[size_t(r * H + i)] - want[size_t(i)]));
    }
    EXPECT_LT(worst, 1e-4) << "m=" << m;
  }
}

// The float32 compute mode's experts: float32 h and intermediates, so they agree with the CPU
// reference to float32 summation-order rounding, including scales above 128.
TEST(CudaMoe, Float32PathMatchesTheCpuTightly) {
  ANVIL_REQUIRE_GPU();
  Rng rng(29);
  for (const Scaling scaling : {Scaling::Mxfp4, Scaling::Mxfp4Big, Scaling::Nvfp4, Scaling::Fp8}) {
    for (const Gating gating : {Gating::GptOss, Gating::Qwen}) {
      const Experts ex({8, 288, 96, 3}, rng, scaling, gating);
      const Shape& s = ex.shape;
      for (int64_t m : {1, 7, 40}) {
        const auto routed = route_on_gpu(m, s, rng);
        std::vector<float> h(size_t(m * s.hidden)), residual(size_t(m * s.hidden));
        for (auto& v : h) v = rng.uniform();
        for (auto& v : residual) v = rng.uniform();
        auto d_h = to_device(h), d_ids = to_device(routed.ids), d_w = to_device(routed.weights), d_residual = to_device(residual);
        const size_t bytes = cuda::moe_quantized_f32_workspace_bytes(m, s.k, s.intermediate);
        cuda::DeviceBuffer workspace(bytes);
        cuda::memset_device(workspace.get(), 0xff, bytes);
        cuda::moe_quantized_f32(ex.device(), d_h.get<float>(), m, s.k, d_ids.get<int32_t>(), d_w.get<float>(),
                            d_residual.get<float>(), workspace.get(), bytes, nullptr);
        cuda::synchronize();
        const auto out = to_host<float>(d_residual, residual.size());
        double err = 0, norm = 0;
        for (int64_t r = 0; r < m; ++r) {
          const auto want = ex.reference(h.data() + r * s.hidden, routed.ids.data() + r * s.k,
                                         routed.weights.data() + r * s.k);
          for (int64_t i = 0; i < s.hidden; ++i) {
            const double got = double(out[size_t(r * s.hidden + i)]) - double(residual[size_t(r * s.hidden + i)]);
            err += (got - want[size_t(i)]) * (got - want[size_t(i)]);
            norm += double(want[size_t(i)]) * want[size_t(i)];
          }
        }
        EXPECT_LT(std::sqrt(err / norm), 1e-5) << "m " << m << " scaling " << int(scaling) << " gating " << int(gating);
      }
    }
  }
}

}  // namespace
}  // namespace anvil
