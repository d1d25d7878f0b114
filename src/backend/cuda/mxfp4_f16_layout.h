#pragma once
// The device layout of MXFP4 experts: what the loader stores (mxfp4_lay_out) and every MXFP4
// kernel reads. Measured in tools/cuda-harness/moe_probe.cu (docs/perf/logs/h200/moe-f16-probe/):
// the batch-1 gate_up 18.8 -> 16.4 us, down 12.8 -> 10.0 us on an H200 against the previous
// per-word layout (mxfp4_layout.h, which NVFP4 keeps).
//
// Why this layout: an E2M1 code whose three magnitude bits sit in an fp16's exponent's low two
// bits and its top mantissa bit, with its sign in the sign bit, reads as the code's value times
// 2^-14 exactly, subnormal codes included. So a 32-bit word of 8 codes decodes to the four fp16
// pairs an m16n8k16 A fragment takes in 7 bit operations (f16_pair_a..d), with no multiply: each
// 32-code block's E8M0 scale goes on the fp32 mma results instead, which needs every mma step to
// cover one block only. Hence, per row and per chunk of 4 blocks (128 k, 64 bytes):
//   bytes 16t + 4w .. +3   word w of lane quad t = block 4c + w's codes k = 8t .. 8t + 7 of the
//                          block, as pairs j = (8t + 2j, 8t + 2j + 1)
// (each block's 16 bytes spread over the four lane quads' 16-byte pieces). Rows are padded to
// whole chunks with zero codes (K = 2,880: 90 blocks -> 92, +2.2 % bytes), and the scales to one
// 32-bit word of 4 E8M0 bytes per chunk (zero past K), so a chunk's 4 scales are one load.
// A lane's pairs cover k in natural order, so the token side needs no permutation: lane quad t
// reads k = 32b + 8t .. + 7 of block b as one 16-byte load (bf16 or fp16), whose words are the
// B fragment's pairs j = 0, 1 (the block's first mma step) and 2, 3 (its second).
//
// Rows are stored in tiles of 16 (kF16TileRows): a tile's chunk c is its 16 rows' 64-byte pieces
// of chunk c, one after another (1 KB), and the tile's chunks follow in order. The decode warps
// stream 16 rows a chunk at a time and the prefill GEMM a tile's rows per k step, so each copy
// is one contiguous 1 KB (or half of one) instead of 16 pieces a row apart. With the kernels
// otherwise unchanged, on an H100 (session 32, two rounds' means): batch 8 +4.4-4.9 %, batch 64
// +1.8-5.4 %, prefill +2.3-2.6 %, batch 1 +0.5 % (20b) and level (120b). Matrices hold whole tiles (rows a multiple
// of 16; experts' N is a multiple of 32), so an expert's rows start at a tile.
// Plain C++ as well as CUDA, so host code and tests pack and read it too.
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace anvil::cuda::mxfp4 {

// Where a word keeps its 8 codes. Each fp16 pair holds its codes' magnitude bits (mantissa
// lowest) at bits 9-11 / 25-27 and their signs at 15 / 31: kF16PairBits. Pair a is those bits of
// the word as they lie; pair b those of the word's bit reversal; pair c those of the word shifted
// up a byte; pair d those of the reversal shifted up a byte. The four sets of source bits are
// disjoint and fill the word, so the decode is a mask per pair, one bit reversal (BREV, shared by
// b and d) and two shifts: 7 operations per word. Positions that only shift and mask (rotations)
// cannot fill a word with four copies of the pair's bit pattern (an exhaustive search: at most two
// fit), which had cost the previous placement 11 operations.
constexpr uint32_t kF16PairBits = 0x8E008E00u;

ANVIL_HOST_DEVICE inline uint32_t reverse_bits(uint32_t w) {
#if defined(__CUDA_ARCH__)
  return __brev(w);
#else
  w = ((w >> 1) & 0x55555555u) | ((w & 0x55555555u) << 1);
  w = ((w >> 2) & 0x33333333u) | ((w & 0x33333333u) << 2);
  w = ((w >> 4) & 0x0F0F0F0Fu) | ((w & 0x0F0F0F0Fu) << 4);
  w = ((w >> 8) & 0x00FF00FFu) | ((w & 0x00FF00FFu) << 8);
  return (w >> 16) | (w << 16);
#endif
}

// The fp16 pairs of a layout word: pair j = k (8t + 2j, 8t + 2j + 1) of the word's block, each
// as fp16 bits of code value * 2^-14.
ANVIL_HOST_DEVICE inline uint32_t f16_pair_a(uint32_t w) { return w & kF16PairBits; }
ANVIL_HOST_DEVICE inline uint32_t f16_pair_b(uint32_t w) { return reverse_bits(w) & kF16PairBits; }
ANVIL_HOST_DEVICE inline uint32_t f16_pair_c(uint32_t w) { return (w << 8) & kF16PairBits; }
ANVIL_HOST_DEVICE inline uint32_t f16_pair_d(uint32_t w) { return (reverse_bits(w) << 8) & kF16PairBits; }
ANVIL_HOST_DEVICE inline uint32_t f16_pair(uint32_t w, int j) {
  return j == 0 ? f16_pair_a(w) : j == 1 ? f16_pair_b(w) : j == 2 ? f16_pair_c(w) : f16_pair_d(w);
}

// An fp16 pair of codes (value * 2^-14) as the bf16 pair of value * 2^-126: the same three bits
// three places lower (bf16's exponent starts at bit 7, fp16's at bit 10), the sign where it is.
// The kernels that multiply in bf16 (the prefill GEMM, the decode kernel for several tokens) then
// scale it as they did the previous layout's pairs (mxfp4_common.cuh, scale_multiplier).
ANVIL_HOST_DEVICE inline uint32_t bf16_from_f16_pair(uint32_t pair) {
  return ((pair >> 3) & 0x01C001C0u) | (pair & 0x80008000u);
}

// The word bit that bit `bit` (one of kF16PairBits) of pair j comes from: f16_pair_a..d read
// exactly these.
ANVIL_HOST_DEVICE constexpr int f16_source_bit(int j, int bit) {
  return j == 0 ? bit : j == 1 ? 31 - bit : j == 2 ? bit - 8 : 39 - bit;
}
// Bit i of code e (0: the pair's first, 1: its second) in a pair: magnitude bits 0-2, sign bit 3.
ANVIL_HOST_DEVICE constexpr int f16_pair_bit(int e, int i) { return 16 * e + (i < 3 ? 9 + i : 15); }

// The offset within a block of lane quad t's pair j (0..3: a..d).
ANVIL_HOST_DEVICE constexpr int f16_slot(int t, int j) { return 8 * t + 2 * j; }

ANVIL_HOST_DEVICE constexpr int f16_chunks(int k) { return (k / 32 + 3) / 4; }
ANVIL_HOST_DEVICE constexpr int f16_row_bytes(int k) { return f16_chunks(k) * 64; }
ANVIL_HOST_DEVICE constexpr int f16_scale_row_bytes(int k) { return f16_chunks(k) * 4; }
constexpr int kF16TileRows = 16;
constexpr int kF16ChunkBytes = 64;                            // one row's piece of a chunk
constexpr int kF16ChunkStride = kF16TileRows * kF16ChunkBytes;  // from a row's chunk c to c + 1

// Byte offset of row `row`'s piece of chunk c in a matrix of rows with `chunks` chunks each (rows
// counted from the matrix's first).
ANVIL_HOST_DEVICE constexpr int64_t f16_piece_offset(int64_t row, int c, int chunks) {
  return ((row / kF16TileRows) * chunks + c) * int64_t(kF16ChunkStride) + (row % kF16TileRows) * kF16ChunkBytes;
}

// Byte offset of block b's word for lane quad t within a row's pieces laid end to end (the host
// packer's one-row form, pack_row_f16); in the device matrix chunk b / 4 is at f16_piece_offset.
ANVIL_HOST_DEVICE constexpr int f16_word_offset(int block, int t) { return (block / 4) * 64 + t * 16 + (block % 4) * 4; }

// The same word in the device matrix, from the row's piece of chunk 0 (f16_piece_offset(row, 0,
// chunks)): chunk b / 4 is b / 4 tile chunks further.
ANVIL_HOST_DEVICE constexpr int64_t f16_tile_word_offset(int block, int t) {
  return int64_t(block / 4) * kF16ChunkStride + f16_word_offset(block % 4, t);
}

// Code kk (0..K-1) of a checkpoint row: byte kk / 2, the low nibble for even kk.
ANVIL_HOST_DEVICE inline uint32_t checkpoint_code(const uint8_t* row, int kk) {
  return (row[kk / 2] >> (4 * (kk % 2))) & 0xFu;
}

// Block b's word for lane quad t, from a checkpoint row.
ANVIL_HOST_DEVICE inline uint32_t pack_word_f16(const uint8_t* checkpoint_row, int block, int t) {
  uint32_t word = 0;
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 2; ++e) {
      const uint32_t code = checkpoint_code(checkpoint_row, 32 * block + f16_slot(t, j) + e);
      for (int i = 0; i < 4; ++i) word |= ((code >> i) & 1u) << f16_source_bit(j, f16_pair_bit(e, i));
    }
  return word;
}

// Code e (0: the pair's first, 1: its second) of pair j of a layout word, as an E2M1 nibble.
ANVIL_HOST_DEVICE inline uint32_t f16_code(uint32_t word, int j, int e) {
  uint32_t code = 0;
  for (int i = 0; i < 4; ++i) code |= ((word >> f16_source_bit(j, f16_pair_bit(e, i))) & 1u) << i;
  return code;
}

// One checkpoint row of K codes (K / 2 bytes, K a multiple of 32) into f16_row_bytes(K) bytes.
inline void pack_row_f16(const uint8_t* checkpoint_row, uint8_t* dst, int k) {
  std::memset(dst, 0, size_t(f16_row_bytes(k)));
  for (int b = 0; b < k / 32; ++b)
    for (int t = 0; t < 4; ++t) {
      const uint32_t word = pack_word_f16(checkpoint_row, b, t);
      std::memcpy(dst + f16_word_offset(b, t), &word, 4);
    }
}

// One row's K / 32 E8M0 scales into f16_scale_row_bytes(K) bytes (zero past K).
inline void pack_scales_f16(const uint8_t* scales, uint8_t* dst, int k) {
  std::memset(dst, 0, size_t(f16_scale_row_bytes(k)));
  std::memcpy(dst, scales, size_t(k / 32));
}

// ---- the k order of the prefill GEMM on this layout ----
// Per 64-wide k tile (half a chunk: blocks 2h', 2h' + 1 of it), lane quad t reads lane quad t's 8
// bytes of that half: word x = the tile's first block, y = its second, pairs j of each. k16 step
// s = 2a + b takes word a's pairs 2b (as the mma's logical k 2t, 2t+1) and 2b + 1 (as 2t+8, 2t+9).
// So logical column L = 32a + 16b + 8h + 2t + e holds physical k P = 32a + 8t + 4b + 2h + e, and
// the activations are stored with their columns in logical order (moe_gemm.cuh).
ANVIL_HOST_DEVICE constexpr int f16_prefill_logical_column(int physical) {
  const int a = physical >> 5, t = (physical >> 3) & 3, b = (physical >> 2) & 1, h = (physical >> 1) & 1,
            e = physical & 1;
  return 32 * a + 16 * b + 8 * h + 2 * t + e;
}

}  // namespace anvil::cuda::mxfp4
