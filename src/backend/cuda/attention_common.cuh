#pragma once
// Cache element access shared by the attention kernels (attention.cu, attention_decode.cuh).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace anvil::cuda::attn {

// Eight consecutive cache elements at `index` (a multiple of 8) as float32.
template <KvDtype T>
__device__ __forceinline__ void load8(const void* base, int64_t index, float out[8]) {
  if constexpr (T == KvDtype::F32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + index);
    const float4 a = p[0], b = p[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else if constexpr (T == KvDtype::BF16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + index);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + index);
    const uint32_t w[2] = {raw.x, raw.y};
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w[i] >> (16 * j)), __NV_E4M3);
        const float2 f = __half22float2(__half2(pair));
        out[4 * i + 2 * j] = f.x;
        out[4 * i + 2 * j + 1] = f.y;
      }
  }
}

template <KvDtype T>
__device__ __forceinline__ void store_kv(void* base, int64_t index, float value) {
  if constexpr (T == KvDtype::F32)
    static_cast<float*>(base)[index] = value;
  else if constexpr (T == KvDtype::BF16)
    static_cast<uint16_t*>(base)[index] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
  else
    static_cast<uint8_t*>(base)[index] = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ void store_out(uint16_t* p, float value) { *p = __bfloat16_as_ushort(__float2bfloat16_rn(value)); }
__device__ __forceinline__ void store_out(float* p, float value) { *p = value; }

}  // namespace anvil::cuda::attn
