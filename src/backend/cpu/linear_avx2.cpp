// AVX2+FMA+F16C linear kernels, in two regimes:
//  - few tokens (decode, matrix-vector): memory bound. Each row is streamed once; every weight
//    vector is decoded in registers and used at once for each token.
//  - many tokens (prefill, matrix-matrix): compute bound. Row blocks are decoded once into a float
//    buffer and a register-tiled micro-kernel reuses each weight vector across several tokens.
//
// Decoding yields weights in whatever order is cheapest for the format; x is permuted to match
// beforehand (linear_avx2_pack_x), which costs O(tokens * in) instead of a shuffle per weight.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/linear_kernels.h"
#include "core/dtype.h"

namespace anvil::cpu {

namespace {

// Up to this many tokens, weights are decoded in registers and used at once (matrix-vector
// regime, memory bound); beyond it they are decoded into a buffer for a GEMM micro-kernel.
constexpr int64_t kMaxRegisterTokens = 3;

#define ANVIL_INLINE inline __attribute__((always_inline))

// --- Tables ---------------------------------------------------------------------------------

// E8M0 byte s -> 2^(s - 127): a bare exponent field, except s = 0, which is the subnormal
// 2^-127, and s = 255, which becomes +inf exactly as e8m0_to_f32 (ldexp) gives.
struct ScaleTable {
  alignas(64) float values[256];
};
constexpr ScaleTable make_scale_table() {
  ScaleTable table{};
  table.values[0] = __builtin_bit_cast(float, uint32_t(0x00400000));
  for (uint32_t s = 1; s < 256; ++s) table.values[s] = __builtin_bit_cast(float, s << 23);
  return table;
}
constexpr ScaleTable kScaleTable = make_scale_table();

// Every FP4 E2M1 value is exactly representable in fp16 with a zero low byte, so one byte-wide
// table lookup (pshufb) into the high byte of a 16-bit lane whose low byte is zero gives the
// fp16 value, and vcvtph2ps widens 8 of them at once. Built from kFp4E2M1Values so the two
// cannot disagree.
constexpr uint32_t fp4_as_f16_bits(int code) {
  const float magnitude = kFp4E2M1Values[code & 7];
  uint32_t half = 0;
  if (magnitude != 0.0f) {
    int exponent = 0;
    float mantissa = magnitude;
    while (mantissa >= 2.0f) mantissa /= 2.0f, ++exponent;
    while (mantissa < 1.0f) mantissa *= 2.0f, --exponent;
    half = uint32_t(exponent + 15) << 10 | uint32_t((mantissa - 1.0f) * 1024.0f);
  }
  if (code & 8) half |= 0x8000u;
  return half;
}
struct Fp4Lut {
  alignas(16) uint8_t f16_high[16];
};
constexpr Fp4Lut make_fp4_lut() {
  Fp4Lut lut{};
  for (int code = 0; code < 16; ++code) lut.f16_high[code] = uint8_t(fp4_as_f16_bits(code) >> 8);
  return lut;
}
constexpr bool fp4_low_bytes_are_zero() {
  for (int code = 0; code < 16; ++code) {
    if ((fp4_as_f16_bits(code) & 0xffu) != 0) return false;
  }
  return true;
}
static_assert(fp4_low_bytes_are_zero());
static_assert(fp4_as_f16_bits(7) == 0x4600u && fp4_as_f16_bits(9) == 0xb800u);
constexpr Fp4Lut kFp4Lut = make_fp4_lut();

// --- Helpers --------------------------------------------------------------------------------

ANVIL_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scalar conversions for row tails. Local, and __builtin_bit_cast rather than std::bit_cast, so
// this file instantiates no inline function that other files could share (see linear_kernels.h).
ANVIL_INLINE float bf16_bits_to_f32(uint16_t bits) { return __builtin_bit_cast(float, uint32_t(bits) << 16); }
ANVIL_INLINE float f16_bits_to_f32(uint16_t bits) { return _cvtsh_ss(bits); }

// Calls f.operator()<T>() with T = n for n in [1, kMaxRegisterTokens], so every token count
// gets its own fully unrolled kernel.
template <typename F>
ANVIL_INLINE void with_tile_size(int n, const F& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    default: f.template operator()<3>(); break;
  }
}
static_assert(kMaxRegisterTokens == 3, "with_tile_size covers 1..3");

// --- Dense formats --------------------------------------------------------------------------
// A row decoder turns chunk c (kChunk weights) into kVecs vectors of 8 floats, in the order
// pack_x puts x in, and decodes single weights of the tail (in % kChunk) in natural order.

struct F32Row {
  static constexpr int64_t kChunk = 8;
  static constexpr int kVecs = 1;
  const float* w;
  ANVIL_INLINE void decode(int64_t c, __m256* v) const { v[0] = _mm256_loadu_ps(w + c * 8); }
  ANVIL_INLINE float at(int64_t i) const { return w[i]; }
};

struct F16Row {
  static constexpr int64_t kChunk = 8;
  static constexpr int kVecs = 1;
  const uint16_t* w;
  ANVIL_INLINE void decode(int64_t c, __m256* v) const {
    v[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c * 8)));
  }
  ANVIL_INLINE float at(int64_t i) const { return f16_bits_to_f32(w[i]); }
};

// bf16 is the top half of a float, so a 32-bit lane holding two bf16 values gives the odd one
// by masking off the low half and the even one by shifting it up: no shuffles. Chunk order is
// therefore the 8 even elements, then the 8 odd ones.
struct BF16Row {
  static constexpr int64_t kChunk = 16;
  static constexpr int kVecs = 2;
  const uint16_t* w;
  ANVIL_INLINE void decode(int64_t c, __m256* v) const {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * 16));
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  ANVIL_INLINE float at(int64_t i) const { return bf16_bits_to_f32(w[i]); }
};

template <class Row, int T>
ANVIL_INLINE void dense_step(const Row& row, int64_t c, const float* x, int64_t ldx, __m256* acc) {
  __m256 w[Row::kVecs];
  row.decode(c, w);
  const float* xc = x + c * Row::kChunk;
  for (int v = 0; v < Row::kVecs; ++v) {
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(w[v], _mm256_loadu_ps(xc + t * ldx + 8 * v), acc[t]);
  }
}

// sums[t] = dot(row, x[t]) for t < T. With few tokens one accumulator per token would leave
// the loop bound by FMA latency, so small tiles rotate over several accumulator sets.
template <class Row, int T>
ANVIL_INLINE void dense_tile(const Row& row, int64_t in, const float* x, int64_t ldx, float* sums) {
  constexpr int S = T == 1 ? 4 : (T <= 3 ? 2 : 1);
  const int64_t chunks = in / Row::kChunk;
  __m256 acc[S][T];
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < T; ++t) acc[s][t] = _mm256_setzero_ps();
  }
  int64_t c = 0;
  for (; c + S <= chunks; c += S) {
    for (int s = 0; s < S; ++s) dense_step<Row, T>(row, c + s, x, ldx, acc[s]);
  }
  for (; c < chunks; ++c) dense_step<Row, T>(row, c, x, ldx, acc[0]);
  for (int t = 0; t < T; ++t) {
    __m256 total = acc[0][t];
    for (int s = 1; s < S; ++s) total = _mm256_add_ps(total, acc[s][t]);
    sums[t] = hsum(total);
  }
  for (int64_t i = chunks * Row::kChunk; i < in; ++i) {
    const float w = row.at(i);
    for (int t = 0; t < T; ++t) sums[t] += w * x[t * ldx + i];
  }
}

// --- MXFP4 ----------------------------------------------------------------------------------
// A 16-byte block viewed as eight 16-bit words: word i holds elements 4i..4i+3 as its four
// nibbles, lowest first. Moving nibble r of every word into bits 8..11 and masking gives a
// pshufb index whose low byte is 0 (looks up +0, fp16 high byte 0) and whose high byte is the
// code, so the lookup yields eight fp16 values: elements 4i + r for i = 0..7. Block order is
// therefore position 8r + i <- element 4i + r.

ANVIL_INLINE __m256 mxfp4_lookup(__m128i lut, __m128i index) { return _mm256_cvtph_ps(_mm_shuffle_epi8(lut, index)); }

ANVIL_INLINE void mxfp4_decode(const uint8_t* block, __m128i lut, __m128i mask, __m256* w) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  w[0] = mxfp4_lookup(lut, _mm_and_si128(_mm_slli_epi16(b, 8), mask));
  w[1] = mxfp4_lookup(lut, _mm_and_si128(_mm_slli_epi16(b, 4), mask));
  w[2] = mxfp4_lookup(lut, _mm_and_si128(b, mask));
  w[3] = mxfp4_lookup(lut, _mm_and_si128(_mm_srli_epi16(b, 4), mask));
}

ANVIL_INLINE __m256 mxfp4_scale(const uint8_t* scales, int64_t g) {
  return _mm256_broadcast_ss(&kScaleTable.values[scales[g]]);
}

// Accumulate the block's unscaled dot, then one FMA by the power-of-two scale (exact, so this only
// reassociates). Several accumulator sets hide FMA latency.
template <int T>
ANVIL_INLINE void mxfp4_step_partial(const uint8_t* codes, const uint8_t* scales, int64_t g, const float* x,
                                     int64_t ldx, __m128i lut, __m128i mask, __m256* acc) {
  __m256 w[4];
  mxfp4_decode(codes + g * 16, lut, mask, w);
  const __m256 scale = mxfp4_scale(scales, g);
  const float* xg = x + g * 32;
  for (int t = 0; t < T; ++t) {
    const float* xt = xg + t * ldx;
    __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xt));
    p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), p);
    p = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), p);
    p = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), p);
    acc[t] = _mm256_fmadd_ps(p, scale, acc[t]);
  }
}

template <int T>
ANVIL_INLINE void mxfp4_tile(const uint8_t* codes, const uint8_t* scales, int64_t blocks, const float* x, int64_t ldx,
                             float* sums) {
  const __m128i lut = _mm_load_si128(reinterpret_cast<const __m128i*>(kFp4Lut.f16_high));
  const __m128i mask = _mm_set1_epi16(0x0f00);
  constexpr int S = T == 1 ? 4 : 2;
  __m256 acc[S][T];
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < T; ++t) acc[s][t] = _mm256_setzero_ps();
  }
  auto step = [&](int64_t g, __m256* a) { mxfp4_step_partial<T>(codes, scales, g, x, ldx, lut, mask, a); };
  int64_t g = 0;
  for (; g + S <= blocks; g += S) {
    for (int s = 0; s < S; ++s) step(g + s, acc[s]);
  }
  for (; g < blocks; ++g) step(g, acc[0]);
  for (int t = 0; t < T; ++t) {
    __m256 total = acc[0][t];
    for (int s = 1; s < S; ++s) total = _mm256_add_ps(total, acc[s][t]);
    sums[t] = hsum(total);
  }
}

// --- Many tokens: decode a row block once, then a float32 GEMM micro-kernel ---------------
// With many tokens, decoding weights per token tile would repeat the decode tokens/tile times.
// Instead each block of kGemmRows rows is decoded (kGemmK columns at a time) into a float buffer
// in the same permuted order as packed x, and a kGemmR x kGemmT register tile of accumulators
// (2 rows x 6 tokens: 12 accumulators, 2 weight vectors, 1 x vector) runs over it. Each weight
// vector load feeds 6 FMAs and each x load 2, so FMA throughput, not loads, is the limit.
// Accumulators persist across column blocks in a buffer, so every (row, token) sum is reduced
// exactly once and in an order that does not depend on its neighbours or on the thread split.

constexpr int64_t kGemmRows = 16;   // rows decoded together
constexpr int64_t kGemmK = 512;     // columns decoded together: 16 rows x 512 floats = 32 KiB
constexpr int kGemmR = 2;           // rows per register tile
constexpr int kGemmT = 6;           // tokens per register tile
constexpr int64_t kGemmTokens = 48; // tokens whose accumulators are kept at once (8 tiles)
static_assert(kGemmK % 32 == 0 && kGemmRows % kGemmR == 0 && kGemmTokens % kGemmT == 0);

// Decodes columns [k0, k0 + n) of a row (k0 a multiple of kGemmK) into dst, in packed-x order.
void decode_columns(const LinearWeight& weight, int64_t row, int64_t k0, int64_t n, float* dst) {
  const int64_t in = weight.in_features;
  switch (weight.format) {
    case WeightFormat::F32: {
      const float* w = static_cast<const float*>(weight.data) + row * in + k0;
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_store_ps(dst + i, _mm256_loadu_ps(w + i));
      for (; i < n; ++i) dst[i] = w[i];
      return;
    }
    case WeightFormat::F16: {
      const F16Row r{static_cast<const uint16_t*>(weight.data) + row * in + k0};
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m256 v[1];
        r.decode(i / 8, v);
        _mm256_store_ps(dst + i, v[0]);
      }
      for (; i < n; ++i) dst[i] = r.at(i);
      return;
    }
    case WeightFormat::BF16: {
      const BF16Row r{static_cast<const uint16_t*>(weight.data) + row * in + k0};
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) {
        __m256 v[2];
        r.decode(i / 16, v);
        _mm256_store_ps(dst + i, v[0]);
        _mm256_store_ps(dst + i + 8, v[1]);
      }
      for (; i < n; ++i) dst[i] = r.at(i);
      return;
    }
    case WeightFormat::MXFP4: {
      const int64_t blocks = in / 32;
      const uint8_t* codes = static_cast<const uint8_t*>(weight.data) + row * blocks * 16;
      const uint8_t* scales = weight.scales + row * blocks;
      const __m128i lut = _mm_load_si128(reinterpret_cast<const __m128i*>(kFp4Lut.f16_high));
      const __m128i mask = _mm_set1_epi16(0x0f00);
      for (int64_t i = 0; i < n; i += 32) {
        const int64_t g = (k0 + i) / 32;
        __m256 w[4];
        mxfp4_decode(codes + g * 16, lut, mask, w);
        // v * 2^k is exact, so these are the reference's weights bit for bit.
        const __m256 scale = mxfp4_scale(scales, g);
        for (int v = 0; v < 4; ++v) _mm256_store_ps(dst + i + 8 * v, _mm256_mul_ps(w[v], scale));
      }
      return;
    }
  }
}

// Prefetches columns [k0, k0 + n) of a row. The GEMM reads kGemmRows rows a column block at a
// time, a pattern of short strided runs that hardware prefetchers follow poorly; asking for the
// next block while the current one is being multiplied keeps DRAM busy.
void prefetch_columns(const LinearWeight& weight, int64_t row, int64_t k0, int64_t n) {
  const int64_t in = weight.in_features;
  const char* begin = nullptr;
  int64_t bytes = 0;
  switch (weight.format) {
    case WeightFormat::F32:
      begin = static_cast<const char*>(weight.data) + (row * in + k0) * 4;
      bytes = n * 4;
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      begin = static_cast<const char*>(weight.data) + (row * in + k0) * 2;
      bytes = n * 2;
      break;
    case WeightFormat::MXFP4:
      begin = static_cast<const char*>(weight.data) + (row * in + k0) / 2;
      bytes = n / 2;
      _mm_prefetch(reinterpret_cast<const char*>(weight.scales + (row * in + k0) / 32), _MM_HINT_T0);
      break;
  }
  for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(begin + offset, _MM_HINT_T0);
}

// acc[r * kGemmT + t] += sum over k < n (n a multiple of 8) of w[r * ldw + k] * x[t * ldx + k],
// lane-wise.
template <int R, int T>
ANVIL_INLINE void gemm_tile(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t n, __m256* acc) {
  __m256 a[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) a[r][t] = acc[r * kGemmT + t];
  }
  for (int64_t k = 0; k < n; k += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_load_ps(w + r * ldw + k);
    for (int t = 0; t < T; ++t) {
      __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
      // Keeps xv in a register: GCC would otherwise fold the load into each row's FMA and load
      // x kGemmR times, making the loop bound by loads rather than FMAs.
      __asm__("" : "+x"(xv));
      for (int r = 0; r < R; ++r) a[r][t] = _mm256_fmadd_ps(wv[r], xv, a[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r * kGemmT + t] = a[r][t];
  }
}

template <int R>
ANVIL_INLINE void gemm_tile_tokens(int tokens, const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t n,
                                   __m256* acc) {
  switch (tokens) {
    case 1: gemm_tile<R, 1>(w, ldw, x, ldx, n, acc); break;
    case 2: gemm_tile<R, 2>(w, ldw, x, ldx, n, acc); break;
    case 3: gemm_tile<R, 3>(w, ldw, x, ldx, n, acc); break;
    case 4: gemm_tile<R, 4>(w, ldw, x, ldx, n, acc); break;
    case 5: gemm_tile<R, 5>(w, ldw, x, ldx, n, acc); break;
    default: gemm_tile<R, 6>(w, ldw, x, ldx, n, acc); break;
  }
}
static_assert(kGemmT == 6 && kGemmR == 2, "gemm_tile_tokens and gemm_rows cover these sizes");

void gemm_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
               int64_t row_end) {
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  constexpr int64_t kPairs = kGemmRows / kGemmR;
  constexpr int64_t kTiles = kGemmTokens / kGemmT;
  constexpr int64_t kSlot = kGemmR * kGemmT;
  alignas(32) float wbuf[kGemmRows * kGemmK];
  __m256 accs[kPairs * kTiles * kSlot];  // [row pair][token tile][row in pair * kGemmT + token in tile]

  for (int64_t r0 = row_begin; r0 < row_end; r0 += kGemmRows) {
    const int64_t rows = row_end - r0 < kGemmRows ? row_end - r0 : kGemmRows;
    for (int64_t t0 = 0; t0 < tokens; t0 += kGemmTokens) {
      const int64_t count = tokens - t0 < kGemmTokens ? tokens - t0 : kGemmTokens;
      // Tiles as even as possible (8 tokens as 4 + 4, not 6 + 2): small tiles waste loads.
      const int64_t tiles = (count + kGemmT - 1) / kGemmT;
      int64_t tile_begin[kTiles + 1];
      for (int64_t i = 0; i <= tiles; ++i) tile_begin[i] = count * i / tiles;
      auto acc_of = [&](int64_t r, int64_t tile, int64_t t) {
        return accs + ((r / kGemmR) * kTiles + tile) * kSlot + (r % kGemmR) * kGemmT + (t - tile_begin[tile]);
      };

      for (int64_t i = 0; i < kPairs * kTiles * kSlot; ++i) accs[i] = _mm256_setzero_ps();
      for (int64_t k0 = 0; k0 < in; k0 += kGemmK) {
        const int64_t n = in - k0 < kGemmK ? in - k0 : kGemmK;
        for (int64_t r = 0; r < rows; ++r) {
          decode_columns(weight, r0 + r, k0, n, wbuf + r * kGemmK);
          if (k0 + kGemmK < in) prefetch_columns(weight, r0 + r, k0 + kGemmK, in - k0 - kGemmK < kGemmK ? in - k0 - kGemmK : kGemmK);
        }
        const int64_t n8 = n & ~int64_t(7);
        for (int64_t p = 0; p < rows; p += kGemmR) {
          const float* w = wbuf + p * kGemmK;
          for (int64_t tile = 0; tile < tiles; ++tile) {
            const int nt = int(tile_begin[tile + 1] - tile_begin[tile]);
            const float* xt = x + (t0 + tile_begin[tile]) * in + k0;
            __m256* acc = acc_of(p, tile, tile_begin[tile]);
            if (rows - p >= 2) {
              gemm_tile_tokens<2>(nt, w, kGemmK, xt, in, n8, acc);
            } else {
              gemm_tile_tokens<1>(nt, w, kGemmK, xt, in, n8, acc);
            }
          }
        }
        // Columns past the last multiple of 8 (dense formats, last block only) go into lane 0,
        // after all vector work on that lane.
        for (int64_t k = n8; k < n; ++k) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t tile = 0; tile < tiles; ++tile) {
              for (int64_t t = tile_begin[tile]; t < tile_begin[tile + 1]; ++t) {
                __m256* acc = acc_of(r, tile, t);
                alignas(32) float lanes[8];
                _mm256_store_ps(lanes, *acc);
                lanes[0] += wbuf[r * kGemmK + k] * x[(t0 + t) * in + k0 + k];
                *acc = _mm256_load_ps(lanes);
              }
            }
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float bias = weight.bias != nullptr ? weight.bias[r0 + r] : 0.0f;
        for (int64_t tile = 0; tile < tiles; ++tile) {
          for (int64_t t = tile_begin[tile]; t < tile_begin[tile + 1]; ++t) {
            y[(t0 + t) * out + r0 + r] = hsum(*acc_of(r, tile, t)) + bias;
          }
        }
      }
    }
  }
}

// --- Few tokens: decode in registers --------------------------------------------------------

// tile(row, sums) for every row of [row_begin, row_end): each weight vector is decoded once and
// used for all (at most kMaxRegisterTokens) tokens while in a register.
template <typename Tile>
void for_each_row(const LinearWeight& weight, int64_t tokens, float* y, int64_t row_begin, int64_t row_end,
                  const Tile& tile) {
  const int64_t out = weight.out_features;
  with_tile_size(int(tokens), [&]<int T>() {
    for (int64_t r = row_begin; r < row_end; ++r) {
      float sums[T];
      tile.template operator()<T>(r, sums);
      const float bias = weight.bias != nullptr ? weight.bias[r] : 0.0f;
      for (int t = 0; t < T; ++t) y[t * out + r] = sums[t] + bias;
    }
  });
}

template <class Row, typename Element>
void dense_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                int64_t row_end) {
  const int64_t in = weight.in_features;
  const Element* data = static_cast<const Element*>(weight.data);
  for_each_row(weight, tokens, y, row_begin, row_end, [&]<int T>(int64_t r, float* sums) {
    dense_tile<Row, T>(Row{data + r * in}, in, x, in, sums);
  });
}

void mxfp4_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                int64_t row_end) {
  const int64_t in = weight.in_features;
  const int64_t blocks = in / 32;
  const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
  for_each_row(weight, tokens, y, row_begin, row_end, [&]<int T>(int64_t r, float* sums) {
    mxfp4_tile<T>(codes + r * blocks * 16, weight.scales + r * blocks, blocks, x, in, sums);
  });
}

}  // namespace

bool linear_avx2_needs_packed_x(WeightFormat format) {
  return format == WeightFormat::BF16 || format == WeightFormat::MXFP4;
}

void linear_avx2_pack_x(WeightFormat format, const float* x, int64_t tokens, int64_t in, float* packed) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = x + t * in;
    float* dst = packed + t * in;
    int64_t i = 0;
    if (format == WeightFormat::BF16) {
      for (; i + 16 <= in; i += 16) {
        for (int j = 0; j < 8; ++j) {
          dst[i + j] = src[i + 2 * j];
          dst[i + 8 + j] = src[i + 2 * j + 1];
        }
      }
    } else if (format == WeightFormat::MXFP4) {
      for (; i + 32 <= in; i += 32) {
        for (int r = 0; r < 4; ++r) {
          for (int j = 0; j < 8; ++j) dst[i + 8 * r + j] = src[i + 4 * j + r];
        }
      }
    }
    for (; i < in; ++i) dst[i] = src[i];
  }
}

void linear_avx2_rows(const LinearWeight& weight, const float* x_packed, int64_t tokens, float* y, int64_t row_begin,
                      int64_t row_end) {
  if (tokens > kMaxRegisterTokens) {
    gemm_rows(weight, x_packed, tokens, y, row_begin, row_end);
    return;
  }
  switch (weight.format) {
    case WeightFormat::F32: dense_rows<F32Row, float>(weight, x_packed, tokens, y, row_begin, row_end); return;
    case WeightFormat::BF16: dense_rows<BF16Row, uint16_t>(weight, x_packed, tokens, y, row_begin, row_end); return;
    case WeightFormat::F16: dense_rows<F16Row, uint16_t>(weight, x_packed, tokens, y, row_begin, row_end); return;
    case WeightFormat::MXFP4: mxfp4_rows(weight, x_packed, tokens, y, row_begin, row_end); return;
  }
}

}  // namespace anvil::cpu
