#pragma once
// One RoPE rotation, shared by every kernel that rotates q or k (ops.cu's rope kernels and the
// cache-writing split in attention.cu), so that fused and unfused paths store the same bits
// (CudaFusedOps.RopeIntoCache* compare them). The products and sums are spelled out (no
// contraction left to the compiler to choose per call site), and the angle is float32 with precise
// cos/sin as the reference computes it: positions reach 10^5, where __cosf loses accuracy.
#include <cuda_runtime.h>

namespace anvil::cuda {

struct RopeTurn {
  float c, s;  // cos and sin of the angle, times the attention scale (YaRN's mscale)
};

__device__ __forceinline__ RopeTurn rope_turn(float position, float inv_freq, float mscale) {
  const float angle = __fmul_rn(position, inv_freq);
  return {__fmul_rn(cosf(angle), mscale), __fmul_rn(sinf(angle), mscale)};
}

// (x0, x1) are elements i and i + head_dim / 2 of one head.
__device__ __forceinline__ float rope_first(float x0, float x1, RopeTurn t) { return __fmaf_rn(x0, t.c, -__fmul_rn(x1, t.s)); }
__device__ __forceinline__ float rope_second(float x0, float x1, RopeTurn t) { return __fmaf_rn(x1, t.c, __fmul_rn(x0, t.s)); }

}  // namespace anvil::cuda
