#pragma once
// MXFP4 decoding in registers and the shared pieces of the MoE kernels.
//
// Decoding: a 32-bit word holds 8 E2M1 codes. Pair p of a word is codes (p, p+4), decoded to a
// bf16 pair whose exponent field is the code's 2 exponent bits and whose top mantissa bit is the
// code's mantissa bit: that is exactly value · 2^-126 for every code, including the subnormal
// ±0.5 (which becomes a bf16 subnormal; bf16 multiplies keep subnormals, checked on an H200 by
// the random-code tests). A bf16 multiply by 2^(scale-1) then gives value · 2^(scale-127), exact,
// as the CPU decoder computes it in float32 (scales above 128 take two multiplies, see
// scale_multiplier). Because a word yields the pairs (0,4), (1,5), (2,6), (3,7) rather than
// (0,1), ..., the kernels assign k to mma lanes so that the activation side is read in that same
// order (see the permutations below). The codes are in the device layout (mxfp4_layout.h): NVFP4's.
// MXFP4 has its own (mxfp4_f16_layout.h), whose pairs are adjacent codes (decode_f16_layout_pair).
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/mxfp4_f16_layout.h"
#include "backend/cuda/mxfp4_layout.h"

namespace anvil::cuda::mxfp4 {

__device__ __forceinline__ uint32_t rotate_left(uint32_t word, int bits) {
  return bits == 0 ? word : __funnelshift_l(word, word, bits);
}

// Pair `pair` (codes pair, pair + 4) of a device-layout word as bf16 bits of code · 2^-126.
// `pair` is a constant after unrolling in every caller; the rotations of a word are shared by
// its pairs.
// Where both rotations agree, one rotation and one mask are written out: the compiler does not merge
// (x & a) | (x & b) into x & (a | b) itself (it emitted two LOP3 for pair 1 in the SASS of commit
// 7981807), and the layout was chosen for that op count.
// A rotation whose masked bits do not wrap around is a plain left shift, which ptxas issues as
// IMAD.SHL on the FMA-heavy pipe instead of a funnel shift on the integer (ALU) pipe; both run
// 16 lanes per SM quarter on SM90. With kPlainShifts four of a word's five rotations move over:
// the batch-1 decode kernel, whose ALU pipe was the busiest, gains 7 % (H200, probe harness) and
// gpt-oss batch 1 +2.6 to +4.0 %, but the two-token-tile decode kernel lost 2 % at batch 64 with it,
// so only the one-token-tile kernel takes it. The bits are the same either way.
template <bool kPlainShifts>
__device__ __forceinline__ uint32_t shift_for_mask(uint32_t word, int bits, uint32_t mask) {
  return kPlainShifts && !rotation_wraps(bits, mask) ? word << bits : rotate_left(word, bits);
}

template <bool kPlainShifts = false>
__device__ __forceinline__ uint32_t fp4_pair_raw(uint32_t word, int pair) {
  if (magnitude_rotation(pair) == sign_rotation(pair))
    return shift_for_mask<kPlainShifts>(word, magnitude_rotation(pair), kPairMagnitudeBits | kPairSignBits) &
           (kPairMagnitudeBits | kPairSignBits);
  return (shift_for_mask<kPlainShifts>(word, magnitude_rotation(pair), kPairMagnitudeBits) & kPairMagnitudeBits) |
         (shift_for_mask<kPlainShifts>(word, sign_rotation(pair), kPairSignBits) & kPairSignBits);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// An E8M0 scale byte s as multipliers for the decoded pairs: 2^(s-1) = 2^(min(s,128)-1) ·
// 2^(max(s,128)-128), each factor a normal bf16. Real checkpoints keep s <= 128 (|weight| <= 12),
// where the second factor is 1 and is skipped; a warp that sees a larger scale (legal, and the
// tests make some) votes to apply both.
__device__ __forceinline__ uint32_t scale_multiplier(uint32_t s) {
  return ((min(s, 128u) + 126u) << 7) * 0x00010001u;
}
__device__ __forceinline__ uint32_t scale_multiplier_high(uint32_t s) {
  return ((max(s, 128u) - 1u) << 7) * 0x00010001u;
}

// An NVFP4 (E4M3) scale byte s as the bf16 multiplier s · 2^117 for both halves of a pair, so that
// a decoded pair (code · 2^-126) times it is code · s · 2^-9, exact (at most 6 significant bits,
// and 2^-19 at the smallest); the kernels multiply their float32 sums by global · 2^9. Built
// through float: the byte's low 7 bits at float bits 20-26 are s · 2^-120 (a subnormal scale is a
// float subnormal, exact), · 2^118 makes it normal, and its top 16 bits with 119 added to the
// exponent field are s · 2^117 (at most 448 · 2^117, inside bf16's range). A zero scale stays 0.
__device__ __forceinline__ uint32_t nvfp4_multiplier(uint32_t s) {
  const uint32_t magnitude = s & 0x7Fu;
  const float scaled = __uint_as_float(magnitude << 20) * 0x1p118f;
  const uint32_t bits = magnitude != 0 ? (__float_as_uint(scaled) >> 16) + (119u << 7) : 0u;
  return (bits | (s & 0x80u) << 8) * 0x00010001u;
}

// Pair `pair` of `word` decoded and scaled. kBig (warp-uniform, see scale_multiplier) applies the
// second factor.
template <bool kBig, bool kPlainShifts = false>
__device__ __forceinline__ uint32_t decode_pair(uint32_t word, int pair, uint32_t multiplier, uint32_t multiplier_high) {
  const uint32_t v = bf16x2_mul(fp4_pair_raw<kPlainShifts>(word, pair), multiplier);
  return kBig ? bf16x2_mul(v, multiplier_high) : v;
}

// Pair j of an MXFP4 word in mxfp4_f16_layout.h's layout, as bf16 code · 2^-126 scaled like
// decode_pair's (the kernels that multiply in bf16: the prefill GEMM, the decode kernel for
// several tokens).
template <bool kBig>
__device__ __forceinline__ uint32_t decode_f16_layout_pair(uint32_t word, int j, uint32_t multiplier,
                                                           uint32_t multiplier_high) {
  const uint32_t v = bf16x2_mul(bf16_from_f16_pair(f16_pair(word, j)), multiplier);
  return kBig ? bf16x2_mul(v, multiplier_high) : v;
}

// gpt-oss's clamped SwiGLU, written as the CPU reference (std::min / std::clamp, which pass NaN
// through) so both sides agree on every input.
__device__ __forceinline__ float swiglu_oai(float gate, float up, float limit, float alpha) {
  gate = limit < gate ? limit : gate;
  up = up < -limit ? -limit : (limit < up ? limit : up);
  return gate / (1.0f + expf(-alpha * gate)) * (up + 1.0f);
}

// The gate_up epilogue's activation: Qwen's silu(gate) · up (as cpu::silu_mul), or gpt-oss's.
__device__ __forceinline__ float gated(float gate, float up, bool silu, float limit, float alpha) {
  return silu ? gate / (1.0f + expf(-gate)) * up : swiglu_oai(gate, up, limit, alpha);
}

__device__ __forceinline__ uint16_t to_bf16_bits(float value) { return __bfloat16_as_ushort(__float2bfloat16_rn(value)); }

// ---- the k order of the prefill GEMM ----
// Within each 64-wide k tile, lane quad t reads bytes 8t..8t+7 of a weight row (codes 16t..16t+15,
// one scale block) and decodes them to pairs P[0..7] = word0 pairs 0-3, word1 pairs 0-3. k16 step s
// uses P[2s] as the mma's logical k (2t, 2t+1) and P[2s+1] as (2t+8, 2t+9). So logical column
//   L = 32a + 16b + 8h + 2t + e   (s = 2a + b, h = which half of the step, e = element of the pair)
// holds physical k
//   P = 16t + 8a + 4e + 2b + h.
// The activation operand is stored with its columns in logical order, so ldmatrix hands the mma
// exactly the k each decoded weight pair stands for.
__host__ __device__ constexpr int prefill_logical_column(int physical) {
  const int t = physical >> 4, a = (physical >> 3) & 1, e = (physical >> 2) & 1, b = (physical >> 1) & 1,
            h = physical & 1;
  return 32 * a + 16 * b + 8 * h + 2 * t + e;
}

// ---- the k order of the decode kernel ----
// Per 128-wide k chunk, lane quad t reads block t (16 bytes, 32 codes, one scale) of a weight row.
// Its 16 pairs P[j] (word j/4, pair j%4) feed 8 mma steps q: P[2q] as logical k (2t, 2t+1) and
// P[2q+1] as (2t+8, 2t+9). The activation side loads its 32 values of the chunk (physical k
// 32t..32t+31) and builds the matching pairs with byte permutes (activation_pairs).
// For step q: word w = q/2; pairs (2(q%2), 2(q%2)+1) of it; activations x[8w..8w+7] as uint4 u.
__device__ __forceinline__ void activation_pairs(const uint4& u, int odd_step, uint32_t& b0, uint32_t& b1) {
  const uint32_t lo = odd_step ? u.y : u.x, hi = odd_step ? u.w : u.z;
  b0 = __byte_perm(lo, hi, 0x5410);  // (x[i], x[i+4]), i = 2 * odd_step
  b1 = __byte_perm(lo, hi, 0x7632);  // (x[i+1], x[i+5])
}

}  // namespace anvil::cuda::mxfp4
