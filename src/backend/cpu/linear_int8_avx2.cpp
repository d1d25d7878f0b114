// AVX2 int8-activation MXFP4 kernels (Mxfp4Activations::Int8).
//
// Per 32-element block, the 16 code bytes become one 256-bit vector of doubled E2M1 values
// biased by +12 (0..24, unsigned): low nibbles in the low half, high nibbles in the high half,
// by one shift, one insert, one mask and one pshufb. pmaddubsw against the int8 input gives 16
// exact pair sums, the offsets vector takes the bias back out (12 * pair sums of q), pmaddwd
// against ones gives 8 exact int32 lanes, and one float multiply-add per block applies
// 2^(s - 127) * input scale. Against the float32 kernel this replaces four fp16 conversions and
// four float FMAs per block with two integer multiplies, which is what bounds Zen-class cores.
//
// Batch invariance: for every (row, token) the arithmetic is one canonical sequence whatever the
// tile, the batch or the row split: acc = 0 (8 lanes); per block in order,
// acc = fma(float(int32 lanes), fl(2^(s - 127) * input scale), acc); then hsum(acc) + bias. The
// integer part is exact, so only that order matters.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/linear_kernels.h"
#include "core/dtype.h"

namespace anvil::cpu {





namespace {

#define ANVIL_INLINE inline __attribute__((always_inline))

// E8M0 byte s -> 2^(s - 127), as e8m0_to_f32 gives it (s = 0 is the subnormal 2^-127, s = 255
// is +inf).
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

// The bias that makes doubled E2M1 values (-12..12) unsigned for pmaddubsw's unsigned operand.
constexpr int kCodeBias = 12;

// Code -> 2 * E2M1 value + kCodeBias, twice (one copy per 128-bit lane, as pshufb looks up
// within lanes). Built from kFp4E2M1Values so the two cannot disagree.
struct BiasedCodeLut {
  alignas(32) uint8_t values[32];
};
constexpr BiasedCodeLut make_biased_code_lut() {
  BiasedCodeLut lut{};
  for (int i = 0; i < 32; ++i) lut.values[i] = uint8_t(int(kFp4E2M1Values[i % 16] * 2.0f) + kCodeBias);
  return lut;
}
constexpr BiasedCodeLut kBiasedCodeLut = make_biased_code_lut();
static_assert(kBiasedCodeLut.values[7] == 24 && kBiasedCodeLut.values[15] == 0 && kBiasedCodeLut.values[8] == 12);

ANVIL_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The constants of the block loop, loaded once per tile.
struct Constants {
  __m256i lut = _mm256_load_si256(reinterpret_cast<const __m256i*>(kBiasedCodeLut.values));
  __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  __m256i ones = _mm256_set1_epi16(1);
};

// One block's 16 code bytes -> 32 biased weights in kernel order.
ANVIL_INLINE __m256i decode_block(const uint8_t* codes, const Constants& k) {
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(c), _mm_srli_epi16(c, 4), 1);
  return _mm256_shuffle_epi8(k.lut, _mm256_and_si256(both, k.low_nibbles));
}

// sums[r * T + t] = y[t0 + t, row r] without bias, for R rows starting at `codes`/`scales` (rows
// `blocks` blocks apart).
template <int R, int T>
ANVIL_INLINE void int8_tile(const uint8_t* codes, const uint8_t* scales, int64_t blocks, const Mxfp4Int8Input& x,
                            int64_t t0, float* sums) {
  const Constants k;
  const int64_t in = blocks * 32;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i w[R];
    __m256 dw[R];
    for (int r = 0; r < R; ++r) {
      w[r] = decode_block(codes + (r * blocks + b) * 16, k);
      dw[r] = _mm256_broadcast_ss(&kScaleTable.values[scales[r * blocks + b]]);
    }
    for (int t = 0; t < T; ++t) {
      const int64_t token = t0 + t;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + token * in + b * 32));
      const __m256i offsets = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.offsets + token * (in / 2) + b * 16));
      const __m256 dx = _mm256_broadcast_ss(x.scales + token * blocks + b);
      for (int r = 0; r < R; ++r) {
        const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(w[r], q), offsets);
        const __m256 products = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, k.ones));
        acc[r][t] = _mm256_fmadd_ps(products, _mm256_mul_ps(dw[r], dx), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) sums[r * T + t] = hsum(acc[r][t]);
  }
}

// Rows walked in blocks whose codes stay in cache while every token tile passes over them.
constexpr int64_t kRowBlock = 16;
constexpr int kMaxTileTokens = 4;

// One row at a time: a block's dependency chain (decode, two integer multiplies, convert, FMA)
// is long, and more rows per iteration leave too few iterations in flight to overlap it
// (measured: 1 row 1.93 ms, 2-4 rows 2.3-2.45 ms for 5760x2880 on one Zen 1 core).
template <int T>
constexpr int kTileRows = 1;

template <int T>
void rows_for_tile(const LinearWeight& weight, const Mxfp4Int8Input& x, int64_t t0, float* y, int64_t row_begin,
                   int64_t row_end) {
  const int64_t blocks = weight.in_features / 32;
  const int64_t out = weight.out_features;
  const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
  auto store = [&](int64_t row, const float* sums) {
    const float bias = weight.bias != nullptr ? weight.bias[row] : 0.0f;
    for (int t = 0; t < T; ++t) y[(t0 + t) * out + row] = sums[t] + bias;
  };
  constexpr int R = kTileRows<T>;
  int64_t r = row_begin;
  for (; r + R <= row_end; r += R) {
    float sums[R * T];
    int8_tile<R, T>(codes + r * blocks * 16, weight.scales + r * blocks, blocks, x, t0, sums);
    for (int i = 0; i < R; ++i) store(r + i, sums + i * T);
  }
  for (; r < row_end; ++r) {
    float sums[T];
    int8_tile<1, T>(codes + r * blocks * 16, weight.scales + r * blocks, blocks, x, t0, sums);
    store(r, sums);
  }
}

}  // namespace

void mxfp4_int8_quantize_avx2(const float* x, int64_t tokens, int64_t in, const Mxfp4Int8Input& out) {
  // The edge cases of quantize_mxfp4_input (see linear.h), on bit patterns of max |x|.
  constexpr uint32_t kInfinityBits = 0x7f800000u;
  constexpr uint32_t kMinBlockMaxBits = kMxfp4Int8MinBlockMaxBits;
  const int64_t blocks = in / 32;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  // Gathers the even bytes of each 128-bit lane, then the odd ones.
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i unpack = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i bias = _mm256_set1_epi8(kCodeBias);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* src = x + t * in + b * 32;
      __m256i v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm256_castps_si256(_mm256_loadu_ps(src + 8 * i));
      // max |x| over bit patterns: for non-negative floats integer order is float order, and a
      // NaN compares above infinity, so it is found like any other maximum.
      __m256i m = _mm256_max_epi32(_mm256_max_epi32(_mm256_and_si256(v[0], abs_mask), _mm256_and_si256(v[1], abs_mask)),
                                   _mm256_max_epi32(_mm256_and_si256(v[2], abs_mask), _mm256_and_si256(v[3], abs_mask)));
      __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
      m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
      m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
      const uint32_t amax_bits = uint32_t(_mm_cvtsi128_si32(m4));
      int8_t* q_out = out.q + t * in + b * 32;
      int16_t* offsets_out = out.offsets + t * (in / 2) + b * 16;
      if (amax_bits >= kInfinityBits || amax_bits < kMinBlockMaxBits) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q_out), _mm256_setzero_si256());
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(offsets_out), _mm256_setzero_si256());
        out.scales[t * blocks + b] = amax_bits >= kInfinityBits ? __builtin_nanf("") : 0.0f;
        continue;
      }
      const float amax = __builtin_bit_cast(float, amax_bits);
      out.scales[t * blocks + b] = amax / 127.0f * 0.5f;
      const __m256 inv = _mm256_set1_ps(127.0f / amax);
      __m256i n[4];
      for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(v[i]), inv));
      // packs interleaves 128-bit lanes: bytes come out as elements 0-3, 8-11, 16-19, 24-27 |
      // 4-7, 12-15, 20-23, 28-31; the dword permute restores natural order.
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
      const __m256i natural = _mm256_permutevar8x32_epi32(packed, unpack);
      // Even elements to the low half, odd ones to the high half: the kernel order.
      const __m256i q = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(natural, split), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q_out), q);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(offsets_out), _mm256_maddubs_epi16(bias, q));
    }
  }
}

void mxfp4_int8_rows_avx2(const LinearWeight& weight, const Mxfp4Int8Input& input, int64_t tokens, float* y,
                          int64_t row_begin, int64_t row_end) {
  // Token tiles as even as possible (6 tokens as 3 + 3, not 4 + 2).
  const int64_t tiles = (tokens + kMaxTileTokens - 1) / kMaxTileTokens;
  for (int64_t block = row_begin; block < row_end; block += kRowBlock) {
    const int64_t block_end = block + kRowBlock < row_end ? block + kRowBlock : row_end;
    for (int64_t i = 0; i < tiles; ++i) {
      const int64_t t0 = tokens * i / tiles;
      switch (tokens * (i + 1) / tiles - t0) {
        case 1: rows_for_tile<1>(weight, input, t0, y, block, block_end); break;
        case 2: rows_for_tile<2>(weight, input, t0, y, block, block_end); break;
        case 3: rows_for_tile<3>(weight, input, t0, y, block, block_end); break;
        default: rows_for_tile<4>(weight, input, t0, y, block, block_end); break;
      }
    }
  }
}

}  // namespace anvil::cpu
