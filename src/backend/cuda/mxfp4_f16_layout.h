#pragma once
// The FP16 form's device layout of MXFP4 experts (measured in tools/cuda-harness/moe_probe.cu,
// docs/perf/logs/h200/moe-f16-probe/: the batch-1 gate_up 18.8 -> 16.4 us, down 12.8 -> 10.0 us on
// an H200 against the present layout's kernel). Not yet what the loader stores: this is the first
// step of building that form into the MoE kernels, and the probe's layout.
//
// Why this layout: an E2M1 code whose three magnitude bits sit in an fp16's exponent's low two
// bits and its top mantissa bit, with its sign in the sign bit, reads as the code's value times
// 2^-14 exactly, subnormal codes included. So a 32-bit word of 8 codes decodes to the four fp16
// pairs an m16n8k16 A fragment takes in 11 masks and shifts (f16_pair_a..d), with no multiply:
// each 32-code block's E8M0 scale goes on the fp32 mma results instead, which needs every mma step
// to cover one block only. Hence, per row and per chunk of 4 blocks (128 k, 64 bytes):
//   bytes 16t + 4w .. +3   word w of lane quad t = block 4c + w's codes for the mma's k slots of
//                          lane t: pairs (2t, 2t+1), (2t+8, 2t+9), (2t+16, 2t+17), (2t+24, 2t+25)
// (the checkpoint's 16-byte block pieces transposed across the quad). Rows are padded to whole
// chunks with zero codes (K = 2,880: 90 blocks -> 92, +2.2 % bytes), and the scales to one 32-bit
// word of 4 E8M0 bytes per chunk (zero past K), so a chunk's 4 scales are one load.
//
// The token goes in the mma's B order as fp16 pairs (f16_token_index): for chunk c, lane quad t,
// block w, the uint32 at ((4c + t) * 4 + w) * 4 + j holds k = 32 (4c + w) + f16_slot(t, j) and the
// next k.
// Plain C++ as well as CUDA, so host code and tests pack and read it too.
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace anvil::cuda::mxfp4 {

// The fp16 pairs of a layout word: pair a = k (2t, 2t+1), b = (2t+8, 2t+9), c = (2t+16, 2t+17),
// d = (2t+24, 2t+25) of the word's block, each as fp16 bits of code value * 2^-14.
ANVIL_HOST_DEVICE inline uint32_t f16_pair_a(uint32_t w) { return w & 0x8E008E00u; }
ANVIL_HOST_DEVICE inline uint32_t f16_pair_b(uint32_t w) { return ((w >> 3) | (w << 29)) & 0x8E008E00u; }
ANVIL_HOST_DEVICE inline uint32_t f16_pair_c(uint32_t w) {
  return ((w << 6) & 0x0E000E00u) | ((w << 15) & 0x80008000u);
}
ANVIL_HOST_DEVICE inline uint32_t f16_pair_d(uint32_t w) {
  return ((w << 3) & 0x0E000E00u) | ((w << 14) & 0x80008000u);
}

// Where pair p's first code (lo) and second code (hi) keep their magnitude (3 bits, the mantissa
// bit lowest) and their sign in a layout word: f16_pair_a..d undo exactly this.
struct F16Place {
  int mag_lo, sign_lo, mag_hi, sign_hi;
};
constexpr F16Place kF16Place[4] = {{9, 15, 25, 31}, {12, 18, 28, 2}, {3, 0, 19, 16}, {6, 1, 22, 17}};

// The offset within a block of lane quad t's pair j (0..3: a..d).
ANVIL_HOST_DEVICE constexpr int f16_slot(int t, int j) { return 8 * j + 2 * t; }

ANVIL_HOST_DEVICE constexpr int f16_chunks(int k) { return (k / 32 + 3) / 4; }
ANVIL_HOST_DEVICE constexpr int f16_row_bytes(int k) { return f16_chunks(k) * 64; }
ANVIL_HOST_DEVICE constexpr int f16_scale_row_bytes(int k) { return f16_chunks(k) * 4; }

// Code kk (0..K-1) of a checkpoint row: byte kk / 2, the low nibble for even kk.
ANVIL_HOST_DEVICE inline uint32_t checkpoint_code(const uint8_t* row, int kk) {
  return (row[kk / 2] >> (4 * (kk % 2))) & 0xFu;
}

// One checkpoint row of K codes (K / 2 bytes, K a multiple of 32) into f16_row_bytes(K) bytes.
inline void pack_row_f16(const uint8_t* checkpoint_row, uint8_t* dst, int k) {
  const int blocks = k / 32;
  std::memset(dst, 0, size_t(f16_row_bytes(k)));
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < 4; ++t) {
      uint32_t word = 0;
      for (int p = 0; p < 4; ++p) {
        const int first = 32 * b + f16_slot(t, p);
        const uint32_t lo = checkpoint_code(checkpoint_row, first), hi = checkpoint_code(checkpoint_row, first + 1);
        const F16Place& at = kF16Place[p];
        word |= (lo & 7u) << at.mag_lo | (lo >> 3) << at.sign_lo | (hi & 7u) << at.mag_hi | (hi >> 3) << at.sign_hi;
      }
      std::memcpy(dst + (b / 4) * 64 + t * 16 + (b % 4) * 4, &word, 4);
    }
}

// One row's K / 32 E8M0 scales into f16_scale_row_bytes(K) bytes (zero past K).
inline void pack_scales_f16(const uint8_t* scales, uint8_t* dst, int k) {
  std::memset(dst, 0, size_t(f16_scale_row_bytes(k)));
  std::memcpy(dst, scales, size_t(k / 32));
}

// Where k (0..K-1) of the token goes: uint32 index into the fp16-pair token, and which half.
struct F16TokenIndex {
  int word, half;
};
ANVIL_HOST_DEVICE constexpr F16TokenIndex f16_token_index(int kk) {
  const int block = kk / 32, within = kk % 32, j = within / 8, t = (within % 8) / 2;
  return {((4 * (block / 4) + t) * 4 + block % 4) * 4 + j, within % 2};
}
ANVIL_HOST_DEVICE constexpr int f16_token_words(int k) { return f16_chunks(k) * 64; }

}  // namespace anvil::cuda::mxfp4
