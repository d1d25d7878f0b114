// Quantized experts made on the device (--quantize-experts with --device cuda): gpt-oss's MXFP4
// experts, or Qwen3-MoE's bf16 ones, are already on the GPU (read from the checkpoint or
// generated), so they are re-quantized there, with no host copy. The rules and the roundings are
// the CPU quantizer's (quantize_linear, e2m1.h, e4m3.h), so both devices hold the same codes and
// scales. The kernels read their source through a Source (MXFP4 or bf16 rows, 16 weights at a
// time, decoded to float as the CPU decodes them) and write destination row dst(r) for source
// row r.
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
__device__ __forceinline__ float e8m0_value(uint32_t s) { return __uint_as_float(s != 0 ? s << 23 : 0x00400000u); }

// MXFP4 rows in checkpoint order: codes [rows, in/2], scales [rows, in/32].
struct Mxfp4Rows {
  const uint8_t* codes;
  const uint8_t* scales;
  int in;
  // Weights 16b..16b+15 of row r.
  __device__ void block(int64_t r, int64_t b, float (&v)[16]) const {
    const uint2 bytes = *reinterpret_cast<const uint2*>(codes + r * (in / 2) + b * 8);
    const float scale = e8m0_value(scales[r * (in / 32) + b / 2]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = ((i < 4 ? bytes.x : bytes.y) >> (8 * (i % 4))) & 0xFFu;
      v[2 * i] = kE2M1Values[byte & 0xFu] * scale;
      v[2 * i + 1] = kE2M1Values[byte >> 4] * scale;
    }
  }
};

// bf16 rows [rows, in].
struct Bf16Rows {
  const uint16_t* weight;
  int in;
  __device__ void block(int64_t r, int64_t b, float (&v)[16]) const {
    const uint4* src = reinterpret_cast<const uint4*>(weight + r * in + b * 16);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 q = src[h];
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        v[8 * h + 2 * w] = __uint_as_float(words[w] << 16);
        v[8 * h + 2 * w + 1] = __uint_as_float(words[w] & 0xFFFF0000u);
      }
    }
  }
};

// Destination row of source row r: first + r * step.
struct RowMap {
  int64_t first = 0, step = 1;
  __device__ int64_t operator()(int64_t r) const { return first + r * step; }
};

// The largest magnitude of row r and whether any weight is not finite, reduced over the block
// (every thread gets both).
template <class Source>
__device__ void scan_row(const Source& src, int64_t r, float& amax, bool& bad) {
  amax = 0.0f;
  bad = false;
  for (int b = threadIdx.x; b < src.in / 16; b += kThreads) {
    float v[16];
    src.block(r, b, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      bad |= !isfinite(v[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
  }
  block_max_and_any<kThreads>(amax, bad);
}

// One block per source row: its largest magnitude, or the row as the first bad one.
template <class Source>
__global__ void __launch_bounds__(kThreads) row_amax_kernel(Source src, float* __restrict__ row_amax,
                                                            int* __restrict__ first_bad_row) {
  const int64_t r = blockIdx.x;
  float amax;
  bool bad;
  scan_row(src, r, amax, bad);
  if (threadIdx.x != 0) return;
  row_amax[r] = amax;
  if (bad) atomicMin(first_bad_row, int(r));
}

// One block per group of `rows` rows (an expert's matrix): global = amax / (6 * 448), or 1 where
// that is zero (as on the CPU).
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

// One thread per NVFP4 block of 16 weights of source row r = b / (in/16): its E4M3 scale and
// codes (written over the source's own bytes when the source is the MXFP4 destination: no other
// thread reads them), and, from the row's first block, the row's global scale. Rows in groups of
// rows_per_group share global[r / rows_per_group].
template <class Source>
__global__ void __launch_bounds__(kThreads)
    quantize_nvfp4_kernel(Source src, int64_t rows, int64_t rows_per_group, const float* __restrict__ global,
                          RowMap dst, uint8_t* __restrict__ codes, uint8_t* __restrict__ nv_scales,
                          float* __restrict__ row_scales) {
  const int64_t blocks_per_row = src.in / 16, b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= rows * blocks_per_row) return;
  const int64_t r = b / blocks_per_row, within = b % blocks_per_row, out_row = dst(r);
  float v[16];
  src.block(r, within, v);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float g = global[r / rows_per_group];
  uint8_t scale = e4m3_nearest(amax / (6.0f * g));
  if ((scale & 0x7f) == 0) scale = 0x38;  // ModelOpt's 1.0 for a block scale that rounds to zero
  nv_scales[out_row * blocks_per_row + within] = scale;
  if (within == 0) row_scales[out_row] = g;
  const float divisor = e4m3_value(scale) * g;
  uint32_t word[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i) word[i / 8] |= uint32_t(e2m1_nearest(v[i] / divisor)) << (4 * (i % 8));
  *reinterpret_cast<uint2*>(codes + out_row * (src.in / 2) + within * 8) = make_uint2(word[0], word[1]);
}

// One thread per MXFP4 block of 32 weights: the OCP shared scale and the codes, as
// quantize_mxfp4_row computes them.
template <class Source>
__global__ void __launch_bounds__(kThreads)
    quantize_mxfp4_kernel(Source src, int64_t rows, RowMap dst, uint8_t* __restrict__ codes,
                          uint8_t* __restrict__ mx_scales) {
  const int64_t blocks_per_row = src.in / 32, b = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= rows * blocks_per_row) return;
  const int64_t r = b / blocks_per_row, within = b % blocks_per_row, out_row = dst(r);
  float v[32];
  src.block(r, 2 * within, *reinterpret_cast<float(*)[16]>(v));
  src.block(r, 2 * within + 1, *reinterpret_cast<float(*)[16]>(v + 16));
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
  // mxfp4_shared_scale: 2^(floor(log2 amax) - 2) as E8M0, clamped; 0 for an all-zero block.
  const int scale = amax == 0.0f ? 0 : min(max(ilogbf(amax) - 2, -127), 127) + 127;
  mx_scales[out_row * blocks_per_row + within] = uint8_t(scale);
  uint32_t word[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 32; ++i) word[i / 8] |= uint32_t(e2m1_nearest(ldexpf(v[i], 127 - scale))) << (4 * (i % 8));
  *reinterpret_cast<uint4*>(codes + out_row * (src.in / 2) + within * 16) = make_uint4(word[0], word[1], word[2], word[3]);
}

// One block per source row: its FP8 codes in the expert layout and its scale, as the CPU's
// per-row rule has them. A row with a non-finite weight is reported and left unwritten.
template <class Source>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_kernel(Source src, RowMap dst, uint8_t* __restrict__ fp8_codes, float* __restrict__ row_scales,
                        int* __restrict__ first_bad_row) {
  const int64_t r = blockIdx.x;
  float amax;
  bool bad;
  scan_row(src, r, amax, bad);
  if (bad) {
    if (threadIdx.x == 0) atomicMin(first_bad_row, int(r));
    return;  // the whole block
  }
  // As on the CPU: a row too small for amax / 448 to be nonzero is all zeros with any scale.
  const float scale = amax / 448.0f > 0.0f ? amax / 448.0f : 1.0f;
  const int64_t out_row = dst(r);
  if (threadIdx.x == 0) row_scales[out_row] = scale;
  uint8_t* out = fp8_codes + out_row * src.in;
  for (int b = threadIdx.x; b < src.in / 16; b += kThreads) {
    float v[16];
    src.block(r, b, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) out[fp8::expert_position(16 * b + i)] = e4m3_nearest(v[i] / scale);
  }
}

void check_shape(const char* what, const void* source, int64_t rows, int64_t in_features) {
  if (rows < 0 || rows >= INT32_MAX || in_features <= 0 || in_features % 32 != 0 || in_features > INT32_MAX ||
      reinterpret_cast<uintptr_t>(source) % 16 != 0)
    throw_cuda_error((std::string(what) + ": in_features must be a positive multiple of 32 and the source 16-byte "
                                          "aligned")
                         .c_str(),
                     int(cudaErrorInvalidValue), __FILE__, __LINE__);
}

// A row index above any row, for atomicMin.
DeviceBuffer no_bad_row(Stream stream) {
  DeviceBuffer flag(sizeof(int));
  memset_device(flag.get(), 0x7f, sizeof(int), stream);  // 0x7f7f7f7f
  return flag;
}

// Waits for the stream; the first bad row the kernels flagged, or -1.
int64_t first_bad_row(const DeviceBuffer& flag, int64_t rows, Stream stream) {
  int first_bad = 0;
  copy_to_host(&first_bad, flag.get(), sizeof(int), stream);
  synchronize(stream);
  return first_bad < rows ? first_bad : -1;
}

unsigned grid_for(int64_t threads) { return unsigned(ceil_div(threads, kThreads)); }

// NVFP4 from any source: row magnitudes, then one global scale per group of rows, then the blocks.
template <class Source>
int64_t to_nvfp4(const Source& src, int64_t rows, int64_t rows_per_group, RowMap dst, uint8_t* codes,
                 uint8_t* nv_scales, float* row_scales, Stream stream) {
  const cudaStream_t s = as_stream(stream);
  // A non-finite weight anywhere fails the load before anything is written (in place, the codes
  // are the source).
  DeviceBuffer row_amax(size_t(rows) * sizeof(float)), global(size_t(rows / rows_per_group) * sizeof(float));
  const DeviceBuffer flag = no_bad_row(stream);
  row_amax_kernel<<<unsigned(rows), kThreads, 0, s>>>(src, row_amax.get<float>(), flag.get<int>());
  ANVIL_CUDA_LAUNCHED();
  if (const int64_t bad = first_bad_row(flag, rows, stream); bad >= 0) return bad;
  global_scale_kernel<<<unsigned(rows / rows_per_group), kThreads, 0, s>>>(row_amax.get<float>(), int(rows_per_group),
                                                                          global.get<float>());
  ANVIL_CUDA_LAUNCHED();
  quantize_nvfp4_kernel<<<grid_for(rows * (src.in / 16)), kThreads, 0, s>>>(
      src, rows, rows_per_group, global.get<float>(), dst, codes, nv_scales, row_scales);
  ANVIL_CUDA_LAUNCHED();
  synchronize(stream);
  return -1;
}

template <class Source>
int64_t to_fp8(const Source& src, int64_t rows, RowMap dst, uint8_t* codes, float* row_scales, Stream stream) {
  const DeviceBuffer flag = no_bad_row(stream);
  quantize_fp8_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(src, dst, codes, row_scales, flag.get<int>());
  ANVIL_CUDA_LAUNCHED();
  return first_bad_row(flag, rows, stream);
}

}  // namespace

int64_t quantize_mxfp4_experts_to_fp8(const uint8_t* codes, const uint8_t* mx_scales, int64_t experts, int64_t rows,
                                      int64_t in_features, uint8_t* fp8_codes, float* row_scales, Stream stream) {
  check_shape("quantize_mxfp4_experts_to_fp8", codes, experts * rows, in_features);
  if (experts * rows == 0) return -1;
  return to_fp8(Mxfp4Rows{codes, mx_scales, int(in_features)}, experts * rows, RowMap{}, fp8_codes, row_scales,
                stream);
}

int64_t quantize_mxfp4_experts_to_nvfp4(uint8_t* codes, const uint8_t* mx_scales, int64_t experts, int64_t rows,
                                        int64_t in_features, uint8_t* nv_scales, float* row_scales, Stream stream) {
  check_shape("quantize_mxfp4_experts_to_nvfp4", codes, experts * rows, in_features);
  if (experts * rows == 0) return -1;
  return to_nvfp4(Mxfp4Rows{codes, mx_scales, int(in_features)}, experts * rows, rows, RowMap{}, codes, nv_scales,
                  row_scales, stream);
}

int64_t quantize_bf16_expert_rows(const uint16_t* weight, int64_t rows, int64_t in, ExpertFormat format,
                                  uint8_t* codes, uint8_t* scales, float* row_scales, int64_t first_row,
                                  int64_t row_step, Stream stream) {
  check_shape("quantize_bf16_expert_rows", weight, rows, in);
  if (rows == 0) return -1;
  const Bf16Rows src{weight, int(in)};
  const RowMap dst{first_row, row_step};
  switch (format) {
    case ExpertFormat::FP8: return to_fp8(src, rows, dst, codes, row_scales, stream);
    case ExpertFormat::NVFP4: return to_nvfp4(src, rows, rows, dst, codes, scales, row_scales, stream);
    case ExpertFormat::MXFP4: {
      // The CPU checks every weight before quantizing any.
      DeviceBuffer row_amax(size_t(rows) * sizeof(float));
      const DeviceBuffer flag = no_bad_row(stream);
      row_amax_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(src, row_amax.get<float>(), flag.get<int>());
      ANVIL_CUDA_LAUNCHED();
      if (const int64_t bad = first_bad_row(flag, rows, stream); bad >= 0) return bad;
      quantize_mxfp4_kernel<<<grid_for(rows * (in / 32)), kThreads, 0, as_stream(stream)>>>(src, rows, dst, codes,
                                                                                              scales);
      ANVIL_CUDA_LAUNCHED();
      synchronize(stream);
      return -1;
    }
    case ExpertFormat::BF16:
      throw_cuda_error("quantize_bf16_expert_rows: bf16 is not a quantized format (moe_bf16_pack lays bf16 out)",
                       int(cudaErrorInvalidValue), __FILE__, __LINE__);
  }
  return -1;
}

}  // namespace anvil::cuda
