#pragma once
// Entry points of the per-ISA linear kernels behind linear_forward. Exposed so tests can run
// each kernel directly; model code calls linear_forward, which validates and dispatches.
//
// The AVX2 file holds only intrinsics and plain loops, no standard-library templates: inline
// functions it instantiated would be compiled for AVX2 and the linker could pick that copy for
// code that must run on any x86-64. Buffers and threading therefore live in linear.cpp.
#include <cstdint>

#include "backend/linear.h"
#include "core/thread_pool.h"

namespace anvil::cpu {

// Portable kernel. Takes an already validated weight and tokens > 0; writes y including bias.
// MXFP4 layers follow mxfp4_activations().
void linear_forward_scalar(const LinearWeight& weight, const float* x, int64_t tokens, float* y, ThreadPool& pool);

// AVX2+FMA+F16C kernel; call only when cpu_use_avx2() is true.
//
// The kernels decode weights into an order that is cheapest for the instruction set rather than
// the natural one, so x is first permuted the same way within each chunk (linear_avx2_pack_x).
// Returns false when the format reads x as is.
bool linear_avx2_needs_packed_x(WeightFormat format);
void linear_avx2_pack_x(WeightFormat format, const float* x, int64_t tokens, int64_t in, float* packed);
// Computes y[t, o] for all tokens and o in [row_begin, row_end), bias included. x_packed is x as
// returned by linear_avx2_pack_x (or x itself when no packing is needed), [tokens, in].
void linear_avx2_rows(const LinearWeight& weight, const float* x_packed, int64_t tokens, float* y, int64_t row_begin,
                      int64_t row_end);

// Batches of at least this many tokens of a dense format (F32, F16, BF16, FP8) go through the
// matrix-matrix path (decode a row block once, then a register-tiled micro-kernel); smaller ones
// through register tiles that convert the weights as they go.
inline constexpr int64_t kDenseGemmMinTokens = 32;

// AVX-512 tiles for the few-token regime of the dense formats (linear_avx512.cpp); call only when
// cpu_use_avx512() is true. Bit for bit the AVX2 kernels' results. handles() says which layers
// and token counts they take; the caller lays x (as returned by linear_avx2_pack_x) out in token
// pairs once per call with pair_x, into pair_floats() floats, which every thread then reads.
bool linear_avx512_handles(WeightFormat format, int64_t tokens);
int64_t linear_avx512_pair_floats(int64_t tokens, int64_t in);
void linear_avx512_pair_x(const float* x_packed, int64_t tokens, int64_t in, float* x_pairs);
void linear_avx512_rows(const LinearWeight& weight, const float* x_packed, const float* x_pairs, int64_t tokens,
                        float* y, int64_t row_begin, int64_t row_end);

// Int8-activation MXFP4 (Mxfp4Activations::Int8). The input of every token is quantized once
// per call into these buffers, [tokens, in] bytes, [tokens, in / 2] and [tokens, in / 32]:
//  q:       the int8 values of quantize_mxfp4_input, each block in kernel order (its 16 even
//           elements, then its 16 odd ones: the order one code byte's two nibbles give);
//  offsets: per block, 12 * (q[2k] + q[2k + 1]) for k < 16 in kernel order (the kernels use
//           E2M1 values biased by +12 to make them unsigned, and take this back out);
//  scales:  quantize_mxfp4_input's block scales.
// Blocks whose max |x| is below 2^-120 (this bit pattern) quantize to zero: 127 / max would
// overflow for the smallest ones, and none of them moves a float32 result anyway.
inline constexpr uint32_t kMxfp4Int8MinBlockMaxBits = 0x03800000u;
struct Mxfp4Int8Input {
  int8_t* q = nullptr;
  int16_t* offsets = nullptr;
  float* scales = nullptr;
};
void mxfp4_int8_quantize_avx2(const float* x, int64_t tokens, int64_t in, const Mxfp4Int8Input& out);
// y[t, o] for all tokens and o in [row_begin, row_end), bias included.
void mxfp4_int8_rows_avx2(const LinearWeight& weight, const Mxfp4Int8Input& input, int64_t tokens, float* y,
                          int64_t row_begin, int64_t row_end);

// Rows per parallel_for grain, and the amount of work below which threads cost more than they save.
inline constexpr int64_t kLinearRowGrain = 16;
inline constexpr int64_t kLinearMinParallelMacs = int64_t(1) << 16;

// Runs body over [0, out) on the pool, or inline when the layer is too small to be worth waking
// workers. Either way each row is computed by exactly the same code, so results do not depend on
// the thread count.
template <typename Body>
void linear_parallel_rows(ThreadPool& pool, const LinearWeight& weight, int64_t tokens, const Body& body) {
  const int64_t macs = weight.out_features * weight.in_features * tokens;
  if (pool.size() <= 1 || macs < kLinearMinParallelMacs) {
    body(0, weight.out_features);
    return;
  }
  pool.parallel_for(weight.out_features, body, kLinearRowGrain);
}

}  // namespace anvil::cpu
