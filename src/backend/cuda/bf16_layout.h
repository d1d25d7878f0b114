#pragma once
// The device layout of bf16 expert weights (Qwen3-MoE as shipped). The MoE's grouped GEMM takes
// the k of each weight row as pairs (i, i + 4) of every aligned group of 8, the pairs an FP4 word
// decodes to (mxfp4_common.cuh); storing each group of 8 values as (0, 4, 1, 5, 2, 6, 3, 7) makes
// every 32-bit word such a pair, so the GEMM reads its mma fragments with no decode at all, and
// the CUDA-core kernels of moe_bf16.cu read the same bytes. Plain C++ as well as CUDA, so host
// code and tests can lay out rows too.
#include "core/host_device.h"

namespace anvil::cuda::bf16_layout {

// Where value i (0-7) of a group of 8 is stored.
ANVIL_HOST_DEVICE constexpr int position(int i) { return (i % 4) * 2 + i / 4; }

}  // namespace anvil::cuda::bf16_layout
