#pragma once
// The device layout of FP8 E4M3 weights ([out, in] bytes, one float32 scale per row), made by
// cuda::quantize_fp8_rows. Each row is stored in groups of 16 consecutive k; byte 4j + i of a
// group holds k = 2j + {0, 8, 1, 9}[i]. Word j of a group is then exactly what lane t = j of an
// m16n8k16 product supplies for one row (k 2j, 2j+1 and 2j+8, 2j+9), with one 32-bit load, and
// both of its bf16 pairs come out of a shift and two masks: bytes 0 and 2 (k 2j, 2j+1) after a
// left shift, bytes 1 and 3 (k 2j+8, 2j+9) after a right shift.
//
// Decoding: an E4M3 byte s.eeee.mmm placed as bf16 bits s.0000eeee.mmm0000 is its value times
// 2^-120 exactly, subnormals included (E4M3's subnormal step 2^-9 becomes 2^-129, a bf16
// subnormal), so one bf16 multiply by 2^120 restores it.
// Plain C++ as well as CUDA, so host code and tests can lay out and decode rows too.
#include <cstdint>

#include "core/host_device.h"

namespace anvil::cuda::fp8 {

constexpr int kGroup = 16;  // in_features must be a multiple

// Where element k of a row is stored within the row.
ANVIL_HOST_DEVICE constexpr int stored_position(int k) {
  const int group = k / kGroup, within = k % kGroup;
  return group * kGroup + 4 * ((within % 8) / 2) + (within % 2 ? 2 : 0) + (within >= 8 ? 1 : 0);
}

// bf16 pair (k 2j, 2j+1) of stored word j, as bits of value · 2^-120.
ANVIL_HOST_DEVICE constexpr uint32_t low_pair_raw(uint32_t word) {
  return ((word << 8) & 0x80008000u) | ((word << 4) & 0x07F007F0u);
}
// bf16 pair (k 2j+8, 2j+9) of stored word j, as bits of value · 2^-120.
ANVIL_HOST_DEVICE constexpr uint32_t high_pair_raw(uint32_t word) {
  return (word & 0x80008000u) | ((word >> 4) & 0x07F007F0u);
}

constexpr uint32_t kRawToValue = 0x7B807B80u;  // bf16 2^120 in both halves

// The MoE kernels' layout of FP8 experts (rows of [E, N, K], made by
// cuda::quantize_mxfp4_experts_to_fp8). The FP4 kernels' k order, so both formats share the
// activation order of the decode kernel and of the prefill GEMM's gathered rows: in each 16-byte
// lane block (16 consecutive k, c = k % 16), decoded pair j (0-7) is c = (8(j/4) + j%4, that + 4),
// as a device-layout MXFP4 word's pairs are, and word q holds pair 2q in bytes 0 and 2
// (low_pair_raw) and pair 2q+1 in bytes 1 and 3 (high_pair_raw).
ANVIL_HOST_DEVICE constexpr int expert_position(int k) {
  const int c = k % kGroup, half = c / 8, second = (c / 4) % 2, pair = 4 * half + c % 4;
  return k - c + 4 * (pair / 2) + pair % 2 + 2 * second;
}

}  // namespace anvil::cuda::fp8
