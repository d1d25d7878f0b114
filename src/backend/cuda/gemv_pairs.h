#pragma once
// Which rows a block of the GEMV's paired epilogues (linear_dense.cu) multiplies: 8 rows from
// first_row on (as the mma's rows 0-7) and, partner_offset further, the 8 rows its epilogue
// combines them with (rows 8-15), so every lane holds both values of its pairs.
// Plain C++ as well as CUDA, so a host test checks that the blocks cover each row exactly once.
#include <cstdint>

#include "core/host_device.h"

namespace anvil::cuda {

struct PairedRows {
  int64_t first_row, partner_offset;
};

// A gate_up matrix (out rows: the gate rows, then as many up rows): block b takes features
// 8b..8b+7, gate row f with up row f + out / 2. out / 2 is a multiple of 8.
ANVIL_HOST_DEVICE inline PairedRows silu_mul_rows(int64_t block, int64_t out) { return {8 * block, out / 2}; }

// A fused qkv matrix (heads of head_dim rows, head_dim a multiple of 16): a head is head_dim / 16
// blocks of 8 rotated pairs (i, i + head_dim / 2).
struct RopeBlock {
  int head, pair0;  // the head, and its first pair's index i
};
ANVIL_HOST_DEVICE inline RopeBlock rope_block(int block, int head_dim) {
  return {block / (head_dim / 16), block % (head_dim / 16) * 8};
}
ANVIL_HOST_DEVICE inline PairedRows rope_rows(RopeBlock b, int head_dim) {
  return {int64_t(b.head) * head_dim + b.pair0, head_dim / 2};
}

}  // namespace anvil::cuda
