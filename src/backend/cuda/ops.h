#pragma once
// The CUDA operators model files are written against. All pointers are device pointers; bf16
// values are passed as uint16_t bit patterns so callers need no CUDA headers. Activations that
// feed matrix products are bf16, accumulation and the residual stream are float32. Every launcher
// enqueues on `stream` and returns without waiting; shapes are row-major [rows, features].
#include <cstddef>
#include <cstdint>

#include "backend/cuda/mxfp4_f16_layout.h"
#include "backend/cuda/runtime.h"
#include "backend/sampling_rule.h"
#include "core/host_device.h"

namespace anvil::cuda {

// ---- dense layers (linear_dense.cu, fp8_weights.cu) ----

// y[m, out] = x[m, in] · W[out, in]ᵀ + bias[out]. W and x bf16, y and bias float32 (bias may be
// null). Picks a matrix-vector kernel for few rows and a tensor-core GEMM for many.
void linear_bf16(const uint16_t* weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
                 int64_t in_features, float* y, Stream stream);

// y[m, out] += x[m, in] · W[out, in]ᵀ + bias: the same product added into y (a residual stream),
// saving the separate add and its pass over y. Each element is y + (x·w + bias), as add_inplace
// after linear_bf16 would compute it.
void linear_bf16_add(const uint16_t* weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
                     int64_t in_features, float* y, Stream stream);

// A dense weight [out, in] on the device: bf16, or FP8 E4M3 in the device layout made by
// quantize_fp8_rows (fp8_layout.h) with one float32 scale per output row (W = code · scale).
struct DenseWeight {
  enum class Format { BF16, FP8 };
  Format format = Format::BF16;
  const void* data = nullptr;
  const float* row_scales = nullptr;  // FP8
  // At one token its product may ask for its weights before the kernel ahead of it ends (the
  // bulk-copy GEMV, gemv_bulk.cuh). Worth it after a latency-bound kernel (attention, a norm, the
  // MoE combine); after a product that streams weights itself the two streams only share the
  // memory (Qwen3-1.7B's MLP down after gate_up: batch 1 -3.5 %, docs/perf/gpu.md session 20).
  bool streams_early = false;
};

// linear_bf16 / linear_bf16_add for either format. FP8 needs in_features % 16 == 0 and 16-byte
// aligned weight and x; its row scale multiplies the float32 product, before the bias.
void linear(const DenseWeight& weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
            int64_t in_features, float* y, Stream stream);
void linear_add(const DenseWeight& weight, const float* bias, const uint16_t* x, int64_t m, int64_t out_features,
                int64_t in_features, float* y, Stream stream);
// linear of the bf16 RMSNorm of float32 x [m, in] (rms_norm_to_bf16's values, up to the order of
// the sum of squares). At one row on the bulk GEMV each block makes the norm itself from x: no
// norm kernel. Otherwise rms_norm_to_bf16 into scratch (bf16 [m, in]), then linear.
void linear_normed(const DenseWeight& weight, const float* bias, const float* x, const float* norm_weight, float eps,
                   uint16_t* scratch, int64_t m, int64_t out_features, int64_t in_features, float* y, Stream stream);

// Whether a one-token bf16 product of that shape (16-byte aligned weight and token, a weight that
// streams_early) runs on the bulk-copy GEMV (gemv_bulk.cuh) on the current device: where its
// kernel-table row has it and allow_bulk_copy_kernels has not turned it off.
bool bulk_gemv_runs(int64_t out_features, int64_t in_features);
// How many bulk-copy GEMVs this process has launched: lets a test see which kernel a call took.
uint64_t bulk_gemv_launch_count();
// A dense MLP's first half: out[m, width] = silu(gate) · up in bf16, where gate_up [2 * width, in]
// holds the gate rows, then the up rows (no bias). Where `linear` would run its matrix-vector
// kernel (few rows), one launch whose gate and up sums are linear's, bit for bit; otherwise linear
// into scratch (float32 [m, 2 * width]) and silu_mul_to_bf16.
void linear_silu_mul(const DenseWeight& gate_up, const uint16_t* x, int64_t m, int64_t width, int64_t in_features,
                     float* scratch, uint16_t* out, Stream stream);

// Quantizes a bf16 weight [rows, in] to FP8 E4M3 per row, as the CPU's quantize_linear does
// (scale = row amax / 448, codes nearest W / scale; the same bytes and scales), writing the codes
// in the device layout. Waits for the result; returns the first row holding a non-finite weight
// (its codes are then not written), or -1. in_features must be a multiple of 16.
int64_t quantize_fp8_rows(const uint16_t* weight, int64_t rows, int64_t in_features, uint8_t* codes,
                          float* row_scales, Stream stream);

// rms_norm_dual then linear_f32_input of the float32 norm (a MoE router: bf16 router [experts,
// dim], logits [rows, experts]): in one launch up to kNormRouterRows rows, which makes the norm in
// every block instead of storing it (logits then differ from the two-step result by summation
// order only); past that the two launches, through scratch_f32 [rows, dim].
constexpr int64_t kNormRouterRows = 4;
void rms_norm_router(const float* x, int64_t rows, int64_t dim, const float* norm_weight, float eps,
                     const uint16_t* router, const float* router_bias, int64_t experts, float* logits,
                     uint16_t* out_bf16, float* scratch_f32, Stream stream);

// y[m, out] = x[m, in] · W[out, in]ᵀ + bias with float32 x: for small layers whose outputs make
// discrete choices (MoE routers), where rounding x to bf16 could flip which experts are picked.
// One warp per output; not for large layers.
void linear_f32_input(const uint16_t* weight, const float* bias, const float* x, int64_t m, int64_t out_features,
                      int64_t in_features, float* y, Stream stream);
// The same for either format (--dtype float32 with --quantize-dense fp8): FP8 codes decode to
// float32 exactly and the row scale multiplies the sum.
void linear_f32_input(const DenseWeight& weight, const float* bias, const float* x, int64_t m, int64_t out_features,
                      int64_t in_features, float* y, Stream stream);

// ---- quantized mixture of experts (moe_quantized.cu, expert_weights.cu) ----

// Rewrites NVFP4 E2M1 code blocks (low nibble first, as checkpoints store them) in place into the
// device layout the MoE kernels read for NVFP4: each 32-bit word's bits permuted so that a pair of
// codes decodes in fewer instructions (mxfp4_layout.h). bytes must be a multiple of 4.
void mxfp4_pack_codes(uint8_t* codes, size_t bytes, Stream stream);

// MXFP4 experts' device layout (mxfp4_f16_layout.h): each row of K codes takes
// mxfp4_device_row_bytes(K) bytes (whole 128-code chunks, zero-padded; rows in tiles of 16, each
// chunk of a tile contiguous) and its K/32 E8M0 scales mxfp4_device_scale_row_bytes(K) (4 per
// chunk, zero-padded, row after row).
ANVIL_HOST_DEVICE inline int64_t mxfp4_device_row_bytes(int64_t in_features) {
  return mxfp4::f16_row_bytes(int(in_features));
}
ANVIL_HOST_DEVICE inline int64_t mxfp4_device_scale_row_bytes(int64_t in_features) {
  return mxfp4::f16_scale_row_bytes(int(in_features));
}
// Lays out `rows` checkpoint rows (codes [rows, K/2] low nibble first, scales [rows, K/32]) into
// that layout (device_codes rows x row bytes, device_scales [rows, scale row bytes]); out of
// place, rows a multiple of 16, K a multiple of 32. Asynchronous on `stream`.
void mxfp4_lay_out(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t in_features,
                   uint8_t* device_codes, uint8_t* device_scales, Stream stream);

// How the expert weights are stored.
//  MXFP4: E2M1 codes with one E8M0 scale per 32 inputs: W = e2m1 · 2^(scale - 127).
//  NVFP4: E2M1 codes [E, N, K/2] with one E4M3 scale per 16 inputs and the float32 global scale
//         of the row's checkpoint matrix: W = e2m1 · e4m3(scale) · row_scale[e, n]. Scales must not
//         be NaN (0x7f / 0xff); the quantizers never make one.
//  FP8:   E4M3 codes [E, N, K] with one float32 scale per row: W = e4m3 · row_scale[e, n].
//  BF16:  bf16 [E, N, K] (Qwen3-MoE as shipped), no scales, no bias; the grouped GEMM and the
//         decode kernels take them with bf16 activations (moe_bf16 is the float32 path on the same
//         bytes, for --dtype float32).
// MXFP4 codes and scales are in the device layout of mxfp4_lay_out (rows padded to whole 128-code
// chunks; the kernels scale each 32-code block's products); NVFP4 codes in that of
// mxfp4_pack_codes, E4M3 codes in fp8_layout.h's expert layout (expert_position) and bf16 in
// bf16_layout.h's, which gives NVFP4, FP8 and bf16 the same k order in the kernels.
enum class ExpertFormat { MXFP4, NVFP4, FP8, BF16 };

// The gate_up product's activation: gpt-oss's clamped SwiGLU, or Qwen's silu(gate) · up.
enum class ExpertActivation { SwigluOai, SiluMul };

// Experts with gate_up rows interleaving gate (even) and up (odd). Biases may be null (Qwen3).
struct QuantizedExperts {
  ExpertFormat format = ExpertFormat::MXFP4;
  ExpertActivation activation = ExpertActivation::SwigluOai;
  // MXFP4: [E, 2I, mxfp4_device_row_bytes(H)]; NVFP4 [E, 2I, H/2], FP8 [E, 2I, H], BF16 2 bytes each
  const uint8_t* gate_up_blocks = nullptr;
  const uint8_t* gate_up_scales = nullptr;      // [E, 2I, mxfp4_device_scale_row_bytes(H)] MXFP4, [E, 2I, H/16] NVFP4
  const float* gate_up_row_scales = nullptr;    // [E, 2I], NVFP4 and FP8
  const float* gate_up_bias = nullptr;          // [E, 2I]
  const uint8_t* down_blocks = nullptr;         // as gate_up's with K = I: [E, H, I/2] NVFP4, ...
  const uint8_t* down_scales = nullptr;         // [E, H, mxfp4_device_scale_row_bytes(I)] MXFP4, [E, H, I/16] NVFP4
  const float* down_row_scales = nullptr;       // [E, H], NVFP4 and FP8
  const float* down_bias = nullptr;             // [E, H]
  int64_t num_experts = 0, hidden = 0, intermediate = 0;
  float swiglu_limit = 7.0f;                    // SwigluOai
  float swiglu_alpha = 1.702f;
};

// Re-quantize MXFP4 experts [E, N, K] (codes [E, N, K/2] in checkpoint order, mx_scales
// [E, N, K/32]) by the CPU quantizer's rule (quantize_linear: the same bytes and scales). Both
// wait for the result and return the first flattened row (e * N + n) holding a non-finite
// weight (the load must then fail: NVFP4 writes nothing, FP8 skips the bad rows), or -1. K must
// be a multiple of 32.
// To NVFP4, in place: one global scale per expert from its largest weight, E4M3 block scales; the
// codes are overwritten (still in checkpoint order: pack them afterwards); writes nv_scales
// [E, N, K/16] and each row's global scale to row_scales [E, N].
int64_t quantize_mxfp4_experts_to_nvfp4(uint8_t* codes, const uint8_t* mx_scales, int64_t experts, int64_t rows,
                                        int64_t in_features, uint8_t* nv_scales, float* row_scales, Stream stream);
// To FP8 per row: writes fp8_codes [E, N, K] in the expert layout and row_scales [E, N].
int64_t quantize_mxfp4_experts_to_fp8(const uint8_t* codes, const uint8_t* mx_scales, int64_t experts, int64_t rows,
                                      int64_t in_features, uint8_t* fp8_codes, float* row_scales, Stream stream);

// Quantizes one bf16 matrix [rows, in] (a checkpoint's gate_proj, up_proj or down_proj of one
// expert) by the CPU quantizer's rule, as quantize_linear does it for that matrix alone, into rows
// first_row, first_row + row_step, ... of one expert of a QuantizedExperts matrix in `format`
// (row_step 2 interleaves gate and up). codes: in/2 bytes per row in checkpoint nibble order for
// MXFP4 / NVFP4 (lay the finished MXFP4 matrix out with mxfp4_lay_out, pack NVFP4 with
// mxfp4_pack_codes), in bytes per row in the expert layout for FP8; scales: in/32 (MXFP4) or in/16 (NVFP4) bytes per row; row_scales (NVFP4, FP8):
// one float per row. Waits; returns the first row of the matrix holding a non-finite weight
// (nothing is then written), or -1. in must be a multiple of 32.
int64_t quantize_bf16_expert_rows(const uint16_t* weight, int64_t rows, int64_t in, ExpertFormat format,
                                  uint8_t* codes, uint8_t* scales, float* row_scales, int64_t first_row,
                                  int64_t row_step, Stream stream);

// What one row of an expert matrix with `in` input features takes on the device, in `format`:
// its codes, its block scales (MXFP4's E8M0 and NVFP4's E4M3; none for FP8 and bf16) and its
// float32 row scale (NVFP4's global scale, FP8's scale; none for MXFP4 and bf16).
ANVIL_HOST_DEVICE inline int64_t expert_code_row_bytes(ExpertFormat format, int64_t in) {
  switch (format) {
    case ExpertFormat::MXFP4: return mxfp4_device_row_bytes(in);
    case ExpertFormat::NVFP4: return in / 2;
    case ExpertFormat::FP8: return in;
    case ExpertFormat::BF16: return in * 2;
  }
  return 0;
}
ANVIL_HOST_DEVICE inline int64_t expert_scale_row_bytes(ExpertFormat format, int64_t in) {
  return format == ExpertFormat::MXFP4 ? mxfp4_device_scale_row_bytes(in) : format == ExpertFormat::NVFP4 ? in / 16 : 0;
}
ANVIL_HOST_DEVICE inline int64_t expert_row_scale_bytes(ExpertFormat format) {
  return format == ExpertFormat::NVFP4 || format == ExpertFormat::FP8 ? 4 : 0;
}

// The bytes of one expert matrix [rows, in] in `format` (what a token routed to it reads).
inline int64_t expert_matrix_bytes(ExpertFormat format, int64_t rows, int64_t in) {
  return rows * (expert_code_row_bytes(format, in) + expert_scale_row_bytes(format, in) + expert_row_scale_bytes(format));
}

// gpt-oss routing: per row, the k largest logits (ties to the lower index), then softmax over
// those k. ids [m, k] int32, weights [m, k] float32.
void moe_topk_softmax(const float* logits, int64_t m, int64_t num_experts, int k, int32_t* ids, float* weights,
                      Stream stream);

// Scratch for moe_quantized; size from moe_quantized_workspace_bytes for the largest m a step can
// have.
size_t moe_quantized_workspace_bytes(int64_t max_rows, int k, int64_t num_experts, int64_t hidden,
                                     int64_t intermediate);
// Whether moe_quantized runs its tensor-core grouped GEMM (many tokens per expert) rather than its
// bandwidth kernels for m rows.
bool moe_quantized_takes_gemm(int64_t m, int k, int64_t num_experts, int64_t hidden, int64_t intermediate);

// What to do with the residual stream once the MoE has added into it: the next layer's input
// RMSNorm to bf16, done by the same kernel that finished the row (one launch and one pass over
// the row fewer per layer). out may be the h that moe_quantized read: it is written last.
struct NextNorm {
  const float* weight = nullptr;  // [H]
  float eps = 0.0f;
  uint16_t* out = nullptr;  // bf16 [m, H]
  // The caller can make the norm itself (linear_normed): moe_quantized_from_logits may then skip it
  // where that saves a kernel (batch 1 of MXFP4 experts, four per token: down adds the experts'
  // sum into the residual itself, and no combine runs). Its return value says which happened.
  bool may_defer = false;
};

// residual[r] += Σ_j weights[r, j] · expert_{ids[r, j]}(h[r]) for r < m, where
// expert_e(h) = W2_e · swiglu_clamped(W1_e · h + b1_e) + b2_e. h is bf16 [m, H]. With next_norm,
// also next_norm->out[r] = rms_norm(residual[r]) (as rms_norm_to_bf16, up to summation order).
void moe_quantized(const QuantizedExperts& weights, const uint16_t* h, int64_t m, int k, const int32_t* ids,
                   const float* route_weights, float* residual, void* workspace, size_t workspace_bytes,
                   Stream stream, const NextNorm* next_norm = nullptr);

// moe_quantized that first picks the experts from router_logits [m, E] (top-k, then softmax over
// the k, exactly as moe_topk_softmax), writing ids and route_weights [m, k] for the caller. At
// small m the picking runs inside the routing kernel: one kernel fewer per layer at decode.
// Returns whether next_norm->out was written (see NextNorm::may_defer); the residual is the same
// either way, bit for bit.
bool moe_quantized_from_logits(const QuantizedExperts& weights, const uint16_t* h, int64_t m, int k,
                               const float* router_logits, int32_t* ids, float* route_weights, float* residual,
                               void* workspace, size_t workspace_bytes, Stream stream,
                               const NextNorm* next_norm = nullptr);

// The post-attention norm and router that feed the experts, given to moe_quantized_from_residual.
struct MoeRouterInput {
  float* residual = nullptr;           // [m, H] float32: normalized here, and the experts add into it
  const float* norm_weight = nullptr;  // [H]
  float eps = 0.0f;
  const uint16_t* router = nullptr;    // [E, H] bf16
  const float* router_bias = nullptr;  // [E] or null
};

// rms_norm_router (into h, router_logits; h_f32 its scratch) then moe_quantized_from_logits, with
// the same results bit for bit; at batch 1, where the kernel table and the shapes allow, the norm,
// router and picks are one launch (moe_norm_route.cuh; router_logits then stays unwritten).
bool moe_quantized_from_residual(const QuantizedExperts& weights, const MoeRouterInput& in, int64_t m, int k,
                                 uint16_t* h, float* h_f32, float* router_logits, int32_t* ids, float* route_weights,
                                 void* workspace, size_t workspace_bytes, Stream stream, const NextNorm* next_norm);
// Whether that call makes the norm, router and picks in one launch for these arguments.
bool moe_routes_in_one_launch(const QuantizedExperts& weights, const MoeRouterInput& in, int64_t m, int k,
                              const uint16_t* h, const NextNorm* next_norm);

// The same with float32 h, every intermediate float32 and each weight decoded exactly: the
// float32 compute mode (moe_quantized_f32.cu). One warp per output on CUDA cores.
size_t moe_quantized_f32_workspace_bytes(int64_t max_rows, int k, int64_t intermediate);
void moe_quantized_f32(const QuantizedExperts& weights, const float* h, int64_t m, int k, const int32_t* ids,
                       const float* route_weights, float* residual, void* workspace, size_t workspace_bytes,
                       Stream stream);

// ---- bf16 mixture of experts (moe_bf16.cu: Qwen3-MoE) ----

// Both in the layout of bf16_layout.h (each group of 8 values of a row as 0, 4, 1, 5, 2, 6, 3, 7),
// which the grouped-GEMM MoE kernels read too (ExpertFormat::BF16).
struct MoeBf16Weights {
  const uint16_t* gate_up = nullptr;  // [E, 2W, H]: gate row j at 2j, up row j at 2j + 1
  const uint16_t* down = nullptr;     // [E, H, W]
  int64_t num_experts = 0, hidden = 0, intermediate = 0;
};

// Lays out bf16 experts as loaded (gate_up [E, 2W, H] with each expert's W gate rows, then its W up
// rows; down [E, H, W]) in place into MoeBf16Weights' layout. H and W must be multiples of 8, the
// pointers 16-byte aligned. Waits for the result.
void moe_bf16_pack(uint16_t* gate_up, uint16_t* down, int64_t experts, int64_t hidden, int64_t width, Stream stream);

// Qwen3-MoE routing: softmax over all experts, the k most probable (ties to the lower index),
// their probabilities renormalized to sum to 1 when `normalize` (norm_topk_prob).
void moe_softmax_topk(const float* logits, int64_t m, int64_t num_experts, int k, bool normalize, int32_t* ids,
                      float* weights, Stream stream);

// residual[r] += Σ_j weights[r, j] · down_e(silu(gate_e · h[r]) ⊙ (up_e · h[r])), e = ids[r, j];
// h float32 [m, H]. One warp per output value on CUDA cores, float32 throughout: the float32 compute
// mode's path (bf16 mode takes moe_quantized with ExpertFormat::BF16 on the same weights).
size_t moe_bf16_workspace_bytes(int64_t max_rows, int k, int64_t intermediate);
void moe_bf16(const MoeBf16Weights& weights, const float* h, int64_t m, int k, const int32_t* ids,
              const float* route_weights, float* residual, void* workspace, size_t workspace_bytes, Stream stream);

// ---- small ops (ops.cu) ----

// out[t] = float(table[ids[t]]) for a bf16 [vocab, dim] table.
void embedding_bf16(const uint16_t* table, const int32_t* ids, int64_t rows, int64_t dim, float* out, Stream stream);

// out = x · rsqrt(mean(x²) + eps) · weight per row, to bf16 (feeds a matrix product).
void rms_norm_to_bf16(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, uint16_t* out,
                      Stream stream);
// Both at once from one pass: the float32 result (for a router) and its bf16 rounding (for the
// experts). Equal to rms_norm_to_bf16's bits, and to rms_norm_f32's for dim above 128 (below,
// rms_norm_f32 uses fewer threads and so another summation order).
void rms_norm_dual(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out_f32,
                   uint16_t* out_bf16, Stream stream);
// The same in float32; out may alias x (Qwen3's per-head q/k norms, the final norm).
void rms_norm_f32(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out,
                  Stream stream);

// x += y over n floats.
void add_inplace(float* x, const float* y, int64_t n, Stream stream);

// Half-split (NeoX) rotary embedding in place for `heads` vectors of head_dim per row, at
// positions[row]; inv_freq has head_dim/2 entries, cos/sin are multiplied by mscale (YaRN).
void rope_inplace(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
                  const float* inv_freq, float mscale, Stream stream);

// Splits a fused [rows, (heads + 2 kv_heads) * head_dim] q|k|v projection into q, k, v and
// applies RoPE to q and k on the way (one launch instead of a copy and two rotations).
void split_qkv_rope(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                    const int32_t* positions, const float* inv_freq, float mscale, float* q, float* k, float* v,
                    Stream stream);

// Qwen3's attention input: as split_qkv_rope, with every q and k head RMS-normalized (weights
// [head_dim], float32) before its rotation.
void split_qkv_norm_rope(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         const float* q_norm, const float* k_norm, float eps, const int32_t* positions,
                         const float* inv_freq, float mscale, float* q, float* k, float* v, Stream stream);

// silu(gate) * up, float32 in, bf16 out (Qwen3 MLP): gate_up is [rows, 2*width] with gate first.
void silu_mul_to_bf16(const float* gate_up, int64_t rows, int64_t width, uint16_t* out, Stream stream);
// The same with float32 out (the float32 compute mode).
void silu_mul_f32(const float* gate_up, int64_t rows, int64_t width, float* out, Stream stream);

// out[i] = x[index[i]] for rows of dim floats (the rows that need logits). `index` is read before
// the kernel waits for its chained predecessor: it must come from the host (the step's metadata),
// not from the kernel just before.
void gather_rows_f32(const float* x, const int32_t* index, int64_t n, int64_t dim, float* out, Stream stream);

// Row-wise argmax over float32 logits [rows, vocab] (ties to the lower index).
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, Stream stream);

// ---- paged attention (attention.cu) ----

// One step's view of the batch for attention. Rows are the step's new tokens; sequences own
// consecutive rows. Per sequence s: rows [row_begin[s], row_begin[s+1]), absolute position of its
// first new token start_pos[s], and its block table at block_tables + s * max_blocks (physical
// block ids; -1 where a sliding layer gave a block back).
struct AttentionBatch {
  int64_t num_rows = 0;
  int64_t num_sequences = 0;
  int64_t max_blocks = 0;              // block-table stride
  int64_t max_context = 0;             // longest start_pos + tokens in the batch
  int64_t max_new_tokens = 0;          // most new tokens of one sequence this step
  const int32_t* row_begin = nullptr;  // [num_sequences + 1]
  const int32_t* start_pos = nullptr;  // [num_sequences]
  const int32_t* block_tables = nullptr;
  const int32_t* row_sequence = nullptr;  // [num_rows]: the sequence each row belongs to
  const int32_t* row_position = nullptr;  // [num_rows]: absolute position
};

// The KV cache of one layer: [num_blocks, block_size, kv_heads, head_dim] of `dtype` for keys and
// values (fp8 with scale 1: values past ±448 saturate).
struct KvLayerCache {
  void* keys = nullptr;
  void* values = nullptr;
  int64_t block_size = 16;
  KvDtype dtype = KvDtype::BF16;
};

struct AttentionShape {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int64_t sliding_window = 0;    // 0 = full causal; else keys in (pos - window, pos]
  const float* sinks = nullptr;  // [num_heads] learned logits in the softmax's denominator, or null
};

// Writes the rows' keys and values (float32 [rows, kv_heads*head_dim]) into the cache at their
// positions.
void kv_cache_write(const AttentionBatch& batch, const AttentionShape& shape, const float* k, const float* v,
                    const KvLayerCache& cache, Stream stream);

// Qwen3's RMSNorm of each q and k head before the rotation (weights [head_dim]).
struct QkNorm {
  const float* q = nullptr;
  const float* k = nullptr;
  float eps = 0.0f;
};

// split_qkv_rope and kv_cache_write in one launch: q goes to `q` (rotated), k (rotated) and v go
// straight into the cache, with the same values the two calls would store. With qk_norm, the same
// for split_qkv_norm_rope and kv_cache_write. The batch's tables and `positions` are read before
// the kernel waits for its chained predecessor (as paged_attention reads its block tables): they
// must come from the host, not from the kernel just before.
void split_qkv_rope_to_cache(const float* qkv, const AttentionBatch& batch, const AttentionShape& shape,
                             const int32_t* positions, const float* inv_freq, float mscale, float* q,
                             const KvLayerCache& cache, Stream stream, const QkNorm* qk_norm = nullptr);

// Causal attention of each row's query (float32 [rows, heads*head_dim]) over its sequence's
// cached keys/values (the step's own tokens must already be written). Output [rows,
// heads*head_dim] in bf16 (feeds a bf16 matrix product) or float32 (the float32 compute mode).
// workspace: attention_workspace_bytes(...) bytes for split-context partials and the decode
// kernel's tickets; zero-filled before its first use (every call leaves the tickets at zero).
size_t attention_workspace_bytes(int64_t max_rows, int64_t num_heads, int64_t head_dim);
void paged_attention(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                     const KvLayerCache& cache, uint16_t* out, void* workspace, size_t workspace_bytes,
                     Stream stream);

// split_qkv_rope_to_cache (no q/k norm) then paged_attention with bf16 output, with the same
// results bit for bit (q, the cache, the output). Decode steps that the tensor-core decode kernel
// takes (head_dim 64), where the kernel table says so, run as one launch: the attention rotates q
// and the newest key itself and writes the KV (q is then left unwritten).
void rope_then_attention(const float* qkv, const AttentionBatch& batch, const AttentionShape& shape,
                         const int32_t* positions, const float* inv_freq, float mscale, float* q,
                         const KvLayerCache& cache, uint16_t* out, void* workspace, size_t workspace_bytes,
                         Stream stream);
// Whether rope_then_attention runs as one launch for this step.
bool decode_rope_in_attention(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache);
void paged_attention(const AttentionBatch& batch, const AttentionShape& shape, const float* q,
                     const KvLayerCache& cache, float* out, void* workspace, size_t workspace_bytes,
                     Stream stream);

// Which kernel runs decode attention with a bf16 cache, head_dim 64 or 128 and up to 8 query heads
// per KV head: by default (Auto) the tensor-core one (attention_decode_mma.cuh) at every context
// (H200, whole models: batch 1 +2 to +4 %, batch 64 +2 to +3.5 %, batch 8 -0.3 to -2 %; it copies
// its first keys before waiting for the previous kernel, docs/perf/gpu.md session 21); other caches
// and shapes take the CUDA-core one. ANVIL_ATTENTION_MMA=0 / =1 at start picks one kernel
// everywhere, as set_decode_attention_kernel does; for tests and A/B measurements (a captured
// graph keeps the kernel it was captured with).
enum class DecodeAttentionKernel { Auto, CudaCores, TensorCores };
void set_decode_attention_kernel(DecodeAttentionKernel kernel);
// The choice itself for a decode step (one new token per sequence) of one layer: true where the
// tensor-core kernel runs. Host code only (no GPU needed), so tests can pin it.
bool decode_attention_on_tensor_cores(const AttentionBatch& batch, const AttentionShape& shape,
                                      const KvLayerCache& cache);
// The most keys one sequence of the batch sees in this layer (a sliding window bounds it).
int64_t attention_context_bound(const AttentionBatch& batch, const AttentionShape& shape);
// How many context splits a decode step's attention launches (the chosen kernel, `mma` as
// decode_attention_on_tensor_cores says, on a GPU of `multiprocessors`): enough for each warp to
// take one 32-key chunk of the longest context the block tables can hold, at most about two
// blocks per multiprocessor and 16. Host code only, for tests.
int decode_attention_splits(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache,
                            bool mma, int multiprocessors);
// The splits of the wide (20-warp, head_dim 64) tensor-core decode block for such a step, 0 where
// 8-warp blocks run: contexts one 8-warp block holds, and batches whose (sequence, KV head) pairs
// would leave no room for a wide block per SM (`splits` as decode_attention_splits returned).
// The kernel table decides whether a GPU runs wide blocks at all. Host code only, for tests.
int decode_attention_wide_splits(const AttentionBatch& batch, const AttentionShape& shape, const KvLayerCache& cache,
                                 int splits, int multiprocessors);

// ---- dummy weights on the device (dummy_fill.cu) ----

// Fills a tensor exactly as the CPU's dummy weight source does (models/weights.cpp: splitmix64
// streams per 65536-element chunk, seeded from the tensor name's hash), so a dummy model is the
// same on either device and 120B-parameter shapes need no host copy.
struct DummyFill {
  enum class Kind { Uniform, Norm, RandomBytes, Constant } kind = Kind::Uniform;
  enum class Type { F32, BF16, U8 } type = Type::BF16;
  uint64_t name_hash = 0;
  float bound = 0.0f;     // Uniform: U(-bound, bound); Norm: 1 + 0.1 U(-1, 1)
  uint8_t constant = 0;   // Constant (MXFP4 scales)
};
void dummy_fill(void* data, int64_t numel, const DummyFill& fill, Stream stream);

// ---- sampling (sampling.cu) ----

// out[r] = the token backend/sampling_rule.h picks from logits [rows, vocab] row r with
// params[r] (device memory): the CPU's sample_row for the same uniform. One block per row.
void sample_rows(const float* logits, int64_t rows, int64_t vocab, const RowSampling* params, int32_t* out,
                 Stream stream);

}  // namespace anvil::cuda
