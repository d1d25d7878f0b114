// FP8 E4M3 weights made on the device (--quantize-dense fp8 with --device cuda): the bf16 weight
// is already on the GPU (read from the checkpoint or generated), so quantizing it there costs
// no host copy. The rule and the rounding are the CPU quantizer's (quantize_linear, e4m3.h), so
// both devices hold the same codes and scales.
#include <climits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/ops.h"
#include "backend/e4m3.h"

namespace anvil::cuda {

namespace {

constexpr int kQuantizeThreads = 256;

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// One block per row: the row's largest magnitude, then its codes in the device layout.
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_fp8_rows_kernel(const uint16_t* __restrict__ weight, int in, uint8_t* __restrict__ codes,
                             float* __restrict__ row_scales, int* __restrict__ first_bad_row) {
  const int64_t row = blockIdx.x;
  const uint16_t* src = weight + row * in;
  float amax = 0.0f;
  bool bad = false;
  for (int i = threadIdx.x; i < in; i += kQuantizeThreads) {
    const float v = bf16_bits_to_float(src[i]);
    bad |= !isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  block_max_and_any<kQuantizeThreads>(amax, bad);
  if (bad) {
    if (threadIdx.x == 0) atomicMin(first_bad_row, int(row));
    return;  // the whole block: the loader fails on it
  }
  // As on the CPU: a row too small for amax / 448 to be nonzero is all zeros with any scale.
  const float scale = amax / 448.0f > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) row_scales[row] = scale;
  uint8_t* dst = codes + row * in;
  for (int i = threadIdx.x; i < in; i += kQuantizeThreads)
    dst[fp8::stored_position(i)] = e4m3_nearest(bf16_bits_to_float(src[i]) / scale);
}

}  // namespace

int64_t quantize_fp8_rows(const uint16_t* weight, int64_t rows, int64_t in_features, uint8_t* codes,
                          float* row_scales, Stream stream) {
  if (rows < 0 || in_features <= 0 || in_features % fp8::kGroup != 0 || in_features > INT32_MAX || rows >= INT32_MAX)
    throw_cuda_error("quantize_fp8_rows: in_features must be a positive multiple of 16", int(cudaErrorInvalidValue),
                     __FILE__, __LINE__);
  if (rows == 0) return -1;
  DeviceBuffer flag(sizeof(int));
  memset_device(flag.get(), 0x7f, sizeof(int), stream);  // 0x7f7f7f7f: above any row
  quantize_fp8_rows_kernel<<<unsigned(rows), kQuantizeThreads, 0, as_stream(stream)>>>(
      weight, int(in_features), codes, row_scales, flag.get<int>());
  ANVIL_CUDA_LAUNCHED();
  int first_bad = 0;
  copy_to_host(&first_bad, flag.get(), sizeof(int), stream);
  synchronize(stream);
  return first_bad < rows ? first_bad : -1;
}

}  // namespace anvil::cuda
