// AVX2+FMA+F16C linear kernels. Rows are computed one at a time against a tile of up to
// kTokenTile tokens: each weight vector is decoded once into a register and used for every token
// of the tile, so decode (tokens = 1) streams weights once and prefill reuses each decoded vector
// kTokenTile times. Rows are walked in blocks of kRowBlock so a block's weights stay in L1/L2
// while every token tile passes over it.
//
// Decoding yields weights in whatever order is cheapest for the format; x is permuted to match
// beforehand (linear_avx2_pack_x), which costs O(tokens * in) instead of a shuffle per weight.
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "backend/cpu/linear_kernels.h"
#include "core/dtype.h"

namespace anvil::cpu {

namespace {

constexpr int kTokenTile = 8;
constexpr int64_t kRowBlock = 16;

#define ANVIL_INLINE inline __attribute__((always_inline))

// --- Tables ---------------------------------------------------------------------------------

// E8M0 byte s -> 2^(s - 127): a bare exponent field, except s = 0, which is the subnormal
// 2^-127, and s = 255, which becomes +inf exactly as e8m0_to_f32 (ldexp) gives.
struct ScaleTable {
  alignas(64) float values[256];
};
constexpr ScaleTable make_scale_table() {
  ScaleTable table{};
  table.values[0] = std::bit_cast<float>(uint32_t(0x00400000));
  for (uint32_t s = 1; s < 256; ++s) table.values[s] = std::bit_cast<float>(s << 23);
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

// Scalar conversions for row tails, kept local so this file instantiates no shared inline code.
ANVIL_INLINE float bf16_bits_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }
ANVIL_INLINE float f16_bits_to_f32(uint16_t bits) { return _cvtsh_ss(bits); }

// Calls f.operator()<T>() with T = n for n in [1, kTokenTile], so every tile size gets its own
// fully unrolled kernel.
template <typename F>
ANVIL_INLINE void with_tile_size(int n, const F& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    default: f.template operator()<8>(); break;
  }
}
static_assert(kTokenTile == 8, "with_tile_size covers 1..8");

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

// Few tokens: accumulate the block's unscaled dot, then one FMA by the power-of-two scale (exact,
// so this only reassociates). Several accumulator sets hide FMA latency.
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

// Many tokens: scaling the 4 decoded vectors is cheaper than a per-token scale FMA.
template <int T>
ANVIL_INLINE void mxfp4_step_scaled(const uint8_t* codes, const uint8_t* scales, int64_t g, const float* x,
                                    int64_t ldx, __m128i lut, __m128i mask, __m256* acc) {
  const __m256 scale = mxfp4_scale(scales, g);
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + g * 16));
  const __m128i index[4] = {_mm_and_si128(_mm_slli_epi16(b, 8), mask), _mm_and_si128(_mm_slli_epi16(b, 4), mask),
                            _mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask)};
  const float* xg = x + g * 32;
  for (int v = 0; v < 4; ++v) {
    const __m256 w = _mm256_mul_ps(mxfp4_lookup(lut, index[v]), scale);
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xg + t * ldx + 8 * v), acc[t]);
  }
}

template <int T>
ANVIL_INLINE void mxfp4_tile(const uint8_t* codes, const uint8_t* scales, int64_t blocks, const float* x, int64_t ldx,
                             float* sums) {
  const __m128i lut = _mm_load_si128(reinterpret_cast<const __m128i*>(kFp4Lut.f16_high));
  const __m128i mask = _mm_set1_epi16(0x0f00);
  constexpr bool kPartial = T < 4;
  constexpr int S = T == 1 ? 4 : (T <= 3 ? 2 : 1);
  __m256 acc[S][T];
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < T; ++t) acc[s][t] = _mm256_setzero_ps();
  }
  auto step = [&](int64_t g, __m256* a) {
    if constexpr (kPartial) {
      mxfp4_step_partial<T>(codes, scales, g, x, ldx, lut, mask, a);
    } else {
      mxfp4_step_scaled<T>(codes, scales, g, x, ldx, lut, mask, a);
    }
  };
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

// --- Driver ---------------------------------------------------------------------------------

// tile(row, first_token, sums) for every row of [row_begin, row_end) and every token tile,
// row blocks outermost so a block's weights are reused from cache by all token tiles.
template <typename Tile>
void for_each_tile(const LinearWeight& weight, int64_t tokens, float* y, int64_t row_begin, int64_t row_end,
                   const Tile& tile) {
  const int64_t out = weight.out_features;
  for (int64_t block = row_begin; block < row_end; block += kRowBlock) {
    const int64_t block_end = block + kRowBlock < row_end ? block + kRowBlock : row_end;
    for (int64_t t0 = 0; t0 < tokens; t0 += kTokenTile) {
      const int count = tokens - t0 < kTokenTile ? int(tokens - t0) : kTokenTile;
      with_tile_size(count, [&]<int T>() {
        for (int64_t r = block; r < block_end; ++r) {
          float sums[T];
          tile.template operator()<T>(r, t0, sums);
          const float bias = weight.bias != nullptr ? weight.bias[r] : 0.0f;
          for (int t = 0; t < T; ++t) y[(t0 + t) * out + r] = sums[t] + bias;
        }
      });
    }
  }
}

template <class Row, typename Element>
void dense_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                int64_t row_end) {
  const int64_t in = weight.in_features;
  const Element* data = static_cast<const Element*>(weight.data);
  for_each_tile(weight, tokens, y, row_begin, row_end, [&]<int T>(int64_t r, int64_t t0, float* sums) {
    dense_tile<Row, T>(Row{data + r * in}, in, x + t0 * in, in, sums);
  });
}

void mxfp4_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                int64_t row_end) {
  const int64_t in = weight.in_features;
  const int64_t blocks = in / 32;
  const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
  for_each_tile(weight, tokens, y, row_begin, row_end, [&]<int T>(int64_t r, int64_t t0, float* sums) {
    mxfp4_tile<T>(codes + r * blocks * 16, weight.scales + r * blocks, blocks, x + t0 * in, in, sums);
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
  switch (weight.format) {
    case WeightFormat::F32: dense_rows<F32Row, float>(weight, x_packed, tokens, y, row_begin, row_end); return;
    case WeightFormat::BF16: dense_rows<BF16Row, uint16_t>(weight, x_packed, tokens, y, row_begin, row_end); return;
    case WeightFormat::F16: dense_rows<F16Row, uint16_t>(weight, x_packed, tokens, y, row_begin, row_end); return;
    case WeightFormat::MXFP4: mxfp4_rows(weight, x_packed, tokens, y, row_begin, row_end); return;
  }
}

}  // namespace anvil::cpu
