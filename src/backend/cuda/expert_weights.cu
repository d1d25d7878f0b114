// NVFP4 and FP8 experts made on the device (--quantize-experts with --device cuda): the MXFP4
// experts are already on the GPU (read from the checkpoint or generated), so they are re-quantized
// there, with no host copy. The rule and the rounding are the CPU quantizer's (quantize_linear,
// e2m1.h, e4m3.h), so both devices hold the same codes and scales.
#include <climits>
#include <string>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/ops.h"
#include "backend/e2m1.h"
#include "backend/e4m3.h"

namespace anvil::cuda {

namespace {

constexpr int kThreads = 256;

__constant__ float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(s - 127) as the CPU's e8m0_to_f32 gives it: 2^-127 is a float subnormal, 255 is infinity.
__device__ __forceinline__ float e8m0_value(uint32_t s) {
  return __uint_as_float(s != 0 ? s << 23 : 0x00400000u);
}

// The 16 MXFP4 weights of NVFP4 block b (codes 16b..16b+15) of a row, as the CPU decodes them.
__device__ __forceinline__ void decode_block(const uint8_t* codes, const uint8_t* mx_scales, int64_t b, float (&v)[16]) {
  const uint2 bytes = *reinterpret_cast<const uint2*>(codes + b * 8);
  const float scale = e8m0_value(mx_scales[b / 2]);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte = ((i < 4 ? bytes.x : bytes.y) >> (8 * (i % 4))) & 0xFFu;
    v[2 * i] = kE2M1Values[byte & 0xFu] * scale;
    v[2 * i + 1] = kE2M1Values[byte >> 4] * scale;
  }
}

// The largest magnitude of a row of `in` MXFP4 weights and whether any is not finite, reduced over
// the block (every thread gets both).
__device__ void scan_row(const uint8_t* row_codes, const uint8_t* row_mx, int in, float& amax, bool& bad) {
  amax = 0.0f;
  bad = false;
  for (int b = threadIdx.x; b < in / 16; b += kThreads) {
    float v[16];
    decode_block(row_codes, row_mx, b, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      bad |= !isfinite(v[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
  }
  block_max_and_any<kThreads>(amax, bad);
}

// One block per flattened row (e * N + n): its largest magnitude, or the row as the first bad one.
__global__ void __launch_bounds__(kThreads)
    row_amax_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ mx_scales, int in,
                    float* __restrict__ row_amax, int* __restrict__ first_bad_row) {
  const int64_t row = blockIdx.x;
  float amax;
  bool bad;
  scan_row(codes + row * (in / 2), mx_scales + row * (in / 32), in, amax, bad);
  if (threadIdx.x != 0) return;
  row_amax[row] = amax;
  if (bad) atomicMin(first_bad_row, int(row));
}

// One block per expert: global = amax / (6 * 448), or 1 where that is zero (as on the CPU).
__global__ void __launch_bounds__(kThreads)
    global_scale_kernel(const float* __restrict__ row_amax, int rows, float* __restrict__ global) {
  const float* amax_of = row_amax + int64_t(blockIdx.x) * rows;
  float amax = 0.0f;
  bool unused = false;
  for (int r = threadIdx.x; r < rows; r += kThreads) amax = fmaxf(amax, amax_of[r]);
  block_max_and_any<kThreads>(amax, unused);
  if (threadIdx.x != 0) return;
  const float scale = amax / (6.0f * 448.0f);
  global[blockIdx.x] = scale > 0.0f ? scale : 1.0f;
}

// One thread per NVFP4 block of 16 weights: its E4M3 scale and codes, written over its own 8 code
// bytes (no other thread reads them).
__global__ void __launch_bounds__(kThreads)
    quantize_blocks_kernel(uint8_t* __restrict__ codes, const uint8_t* __restrict__ mx_scales, int64_t blocks,
                           int64_t blocks_per_expert, const float* __restrict__ global,
                           uint8_t* __restrict__ nv_scales) {
  const int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= blocks) return;
  float v[16];
  decode_block(codes, mx_scales, b, v);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float g = global[b / blocks_per_expert];
  uint8_t scale = e4m3_nearest(amax / (6.0f * g));
  if ((scale & 0x7f) == 0) scale = 0x38;  // ModelOpt's 1.0 for a block scale that rounds to zero
  nv_scales[b] = scale;
  const float divisor = e4m3_value(scale) * g;
  uint32_t word[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i) word[i / 8] |= uint32_t(e2m1_nearest(v[i] / divisor)) << (4 * (i % 8));
  *reinterpret_cast<uint2*>(codes + b * 8) = make_uint2(word[0], word[1]);
}

// One block per flattened row: its largest magnitude, then its FP8 codes in the expert layout and
// its scale, as the CPU's per-row rule has them. A row with a non-finite weight is reported and
// left unwritten.
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_rows_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ mx_scales, int in,
                             uint8_t* __restrict__ fp8_codes, float* __restrict__ row_scales,
                             int* __restrict__ first_bad_row) {
  const int64_t row = blockIdx.x;
  const uint8_t* row_codes = codes + row * (in / 2);
  const uint8_t* row_mx = mx_scales + row * (in / 32);
  float amax;
  bool bad;
  scan_row(row_codes, row_mx, in, amax, bad);
  if (bad) {
    if (threadIdx.x == 0) atomicMin(first_bad_row, int(row));
    return;  // the whole block
  }
  // As on the CPU: a row too small for amax / 448 to be nonzero is all zeros with any scale.
  const float scale = amax / 448.0f > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) row_scales[row] = scale;
  uint8_t* dst = fp8_codes + row * in;
  for (int b = threadIdx.x; b < in / 16; b += kThreads) {
    float v[16];
    decode_block(row_codes, row_mx, b, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[fp8::expert_position(16 * b + i)] = e4m3_nearest(v[i] / scale);
  }
}

// The shapes both quantizers take.
void check_shape(const char* what, const uint8_t* codes, int64_t experts, int64_t rows, int64_t in_features) {
  if (experts < 0 || rows < 0 || in_features <= 0 || in_features % 32 != 0 || experts * rows >= INT32_MAX ||
      in_features > INT32_MAX || reinterpret_cast<uintptr_t>(codes) % 8 != 0)
    throw_cuda_error((std::string(what) + ": in_features must be a positive multiple of 32 and codes 8-byte aligned").c_str(),
                     int(cudaErrorInvalidValue), __FILE__, __LINE__);
}

// A row index above any row, for atomicMin.
DeviceBuffer no_bad_row(Stream stream) {
  DeviceBuffer flag(sizeof(int));
  memset_device(flag.get(), 0x7f, sizeof(int), stream);  // 0x7f7f7f7f
  return flag;
}

// Waits for the stream; the first bad row the kernels flagged, or -1.
int64_t first_bad_row(const DeviceBuffer& flag, int64_t total_rows, Stream stream) {
  int first_bad = 0;
  copy_to_host(&first_bad, flag.get(), sizeof(int), stream);
  synchronize(stream);
  return first_bad < total_rows ? first_bad : -1;
}

}  // namespace

int64_t quantize_mxfp4_experts_to_fp8(const uint8_t* codes, const uint8_t* mx_scales, int64_t experts, int64_t rows,
                                      int64_t in_features, uint8_t* fp8_codes, float* row_scales, Stream stream) {
  check_shape("quantize_mxfp4_experts_to_fp8", codes, experts, rows, in_features);
  const int64_t total_rows = experts * rows;
  if (total_rows == 0) return -1;
  const DeviceBuffer flag = no_bad_row(stream);
  quantize_fp8_rows_kernel<<<unsigned(total_rows), kThreads, 0, as_stream(stream)>>>(
      codes, mx_scales, int(in_features), fp8_codes, row_scales, flag.get<int>());
  ANVIL_CUDA_LAUNCHED();
  return first_bad_row(flag, total_rows, stream);
}

int64_t quantize_mxfp4_experts_to_nvfp4(uint8_t* codes, const uint8_t* mx_scales, int64_t experts, int64_t rows,
                                        int64_t in_features, uint8_t* nv_scales, float* global, Stream stream) {
  check_shape("quantize_mxfp4_experts_to_nvfp4", codes, experts, rows, in_features);
  const int64_t total_rows = experts * rows;
  if (total_rows == 0) return -1;
  const cudaStream_t s = as_stream(stream);
  // The global scale needs every row's magnitude before any block is quantized, and a non-finite
  // weight anywhere fails the load before any code is overwritten.
  DeviceBuffer row_amax(size_t(total_rows) * sizeof(float));
  const DeviceBuffer flag = no_bad_row(stream);
  row_amax_kernel<<<unsigned(total_rows), kThreads, 0, s>>>(codes, mx_scales, int(in_features),
                                                            row_amax.get<float>(), flag.get<int>());
  ANVIL_CUDA_LAUNCHED();
  if (const int64_t bad = first_bad_row(flag, total_rows, stream); bad >= 0) return bad;
  global_scale_kernel<<<unsigned(experts), kThreads, 0, s>>>(row_amax.get<float>(), int(rows), global);
  ANVIL_CUDA_LAUNCHED();
  const int64_t blocks = total_rows * (in_features / 16);
  quantize_blocks_kernel<<<unsigned(ceil_div(blocks, kThreads)), kThreads, 0, s>>>(
      codes, mx_scales, blocks, rows * (in_features / 16), global, nv_scales);
  ANVIL_CUDA_LAUNCHED();
  synchronize(stream);
  return -1;
}

}  // namespace anvil::cuda
