// Dummy weights generated on the GPU, value for value what models/weights.cpp generates on the
// CPU: element j of chunk c draws splitmix64 for the (j+1)-th time from state
// name_hash * 0x100000001b3 + c, which needs no sequential state, so each thread computes its own.
#include <algorithm>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/ops.h"
#include "core/splitmix64.h"

namespace anvil::cuda {

namespace {

constexpr int64_t kChunk = int64_t(1) << 16;
__device__ __forceinline__ uint64_t draw(uint64_t name_hash, int64_t chunk, int64_t index_in_chunk) {
  const uint64_t state = name_hash * 0x100000001b3ull + uint64_t(chunk);
  return splitmix64_mix(state + uint64_t(index_in_chunk + 1) * kSplitMix64Gamma);
}

__global__ void dummy_fill_kernel(void* data, int64_t numel, DummyFill fill) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t chunk = i / kChunk, j = i % kChunk;
    if (fill.kind == DummyFill::Kind::Constant) {
      static_cast<uint8_t*>(data)[i] = fill.constant;
      continue;
    }
    if (fill.kind == DummyFill::Kind::RandomBytes) {  // eight bytes per draw, little-endian
      const uint64_t random = draw(fill.name_hash, chunk, j / 8);
      static_cast<uint8_t*>(data)[i] = uint8_t(random >> (8 * (j % 8)));
      continue;
    }
    const uint64_t random = draw(fill.name_hash, chunk, j);
    // The CPU computes these in float32 without fused multiply-adds; __fmul_rn/__fadd_rn keep
    // nvcc from contracting them, so the values match bit for bit.
    const float unit = __fadd_rn(__fmul_rn(__fdiv_rn(float(random >> 40), 16777216.0f), 2.0f), -1.0f);
    const float value = fill.kind == DummyFill::Kind::Norm ? __fadd_rn(1.0f, __fmul_rn(0.1f, unit))
                                                           : __fmul_rn(fill.bound, unit);
    if (fill.type == DummyFill::Type::F32)
      static_cast<float*>(data)[i] = value;
    else
      static_cast<uint16_t*>(data)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
  }
}

}  // namespace

void dummy_fill(void* data, int64_t numel, const DummyFill& fill, Stream stream) {
  if (numel == 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(numel, 256), 65536);
  dummy_fill_kernel<<<unsigned(blocks), 256, 0, as_stream(stream)>>>(data, numel, fill);
  ANVIL_CUDA_LAUNCHED();
}

}  // namespace anvil::cuda
