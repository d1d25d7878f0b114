#pragma once
// What the MoE kernels share: the routing tables in the workspace and the launch parameters.
#include <cstdint>

namespace anvil::cuda::moe {

// The weight formats the kernels are instantiated for (cuda::ExpertFormat).
// Bf16 takes only the grouped GEMM (moe_gemm.cuh).
enum class Kind { Mxfp4, Nvfp4, Fp8, Bf16 };

// Routing header fields (int32 each).
enum Header : int { kTotalSlots = 0, kNumActive = 1, kNumTiles = 2, kHeaderInts = 4 };

// Most experts the routing kernel's shared-memory tables hold.
constexpr int kMaxExperts = 256;

// The routing tables, built on the device from ids without a host round trip. A "slot" is
// (token, j) for j < k, numbered token * k + j; slots are sorted by expert, stably.
struct Routing {
  int32_t* header = nullptr;       // Header fields
  int32_t* offsets = nullptr;      // [E + 1]: expert e owns sorted positions [offsets[e], offsets[e+1])
  int32_t* active = nullptr;       // [E]: experts with at least one slot, ascending, then -1
  int32_t* active_range = nullptr; // [E][2]: per active index, the expert's first sorted position
                                   // and count (offsets[e], offsets[e+1] - offsets[e])
  int32_t* sorted_slot = nullptr;  // [m * k]: slot at each sorted position
  int32_t* tile_expert = nullptr;  // [max_tiles]: expert of each GEMM row tile
  int32_t* tile_row = nullptr;     // [max_tiles]: first sorted position of each tile
};

// Where batch 1's gate_up reads its one token (ExpertProduct::one_row_token).
enum class OneRowToken : uint8_t { kNone, kBeforeWait, kAfterWait };

// One grouped product: out = act(A · W_eᵀ + b_e) over the sorted rows of each expert.
// gate_up: A = h (gathered by token), N = 2I, K = H, gate rows even and up rows odd; writes bf16
// gated activations [slots, I].
// down: A = activations, N = H, K = I; writes fp32 [slots, H] at row = slot (token * k + j).
struct ExpertProduct {
  const uint16_t* a = nullptr;
  const uint8_t* blocks = nullptr;    // [E, N, K/2] E2M1 codes, [E, N, K] E4M3 codes or bf16, device layouts
  const uint8_t* scales = nullptr;    // [E, N, K/32] E8M0 (MXFP4) or [E, N, K/16] E4M3 (NVFP4)
  const float* row_scales = nullptr;  // [E, N]: NVFP4 the row's global scale, FP8 its row scale
  const float* bias = nullptr;        // [E, N], or null
  int n = 0, k = 0;                   // N and K
  int top_k = 0;                      // slots per token (gate_up gathers A rows by slot / top_k)
  uint16_t* act = nullptr;            // gate_up output
  float* out = nullptr;               // down output
  bool silu = false;                  // gate_up: silu(gate) · up instead of gpt-oss's clamped SwiGLU
  float limit = 0.0f, alpha = 0.0f;   // the clamped SwiGLU's
  // gate_up at batch 1: its A is row 0 of h, read before the grid's wait when the kernel two back
  // wrote it, otherwise right after the wait beside the routing (no slot lookup first).
  OneRowToken one_row_token = OneRowToken::kNone;
  // Batch 1 with the sum in down, for an activation with a known bound (gpt-oss's clamped SwiGLU):
  // gate_up writes each activation as the fp16 bits of bf16(value) · 2^act_f16_shift, and down
  // takes them as they are, with no largest magnitude to find and no conversion to make (~2.5 us
  // of its chain after its wait, docs/perf/logs/h200/session34). -1: bf16 activations.
  int act_f16_shift = -1;
};

}  // namespace anvil::cuda::moe
