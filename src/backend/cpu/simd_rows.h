#pragma once
// Helpers and row decoders shared by the SIMD linear kernels (linear_avx2.cpp, linear_avx512.cpp).
//
// Include this only from files compiled for AVX2 or more (*_avx2.cpp, *_avx512.cpp). Everything
// here sits in an anonymous namespace on purpose: each kernel file gets its own copy, compiled
// for its own instruction set, so the linker can never merge an AVX-512 build of a decoder into
// code that runs on an AVX2-only CPU (see linear_kernels.h). The decoders define the canonical
// summation order (the top of linear_avx2.cpp); every kernel that includes them shares it.
#include <immintrin.h>

#include <cstdint>

#include "core/dtype.h"

namespace anvil::cpu {

namespace {
#define ANVIL_INLINE inline __attribute__((always_inline))

// --- Tables ---------------------------------------------------------------------------------

// MXFP4 weights are decoded through bf16: every E2M1 value times an E8M0 block scale,
// v * 2^(s - 127), is a float32 whose low 16 bits are zero (three significant bits at most, and
// the subnormals it reaches, down to 0.5 * 2^-127, keep them in the top half too), so its high
// half, a bf16, holds it exactly, and widening a bf16 to float32 is a 16-bit move. Per scale, two
// 16-entry byte tables give the low and the high byte of that bf16 for each of the 16 codes, so
// one pshufb per table and byte half decodes 16 weights with the scale already applied.
//
// Why not fp16 and vcvtph2ps (the previous decoder): on Zen 1 vcvtph2ps occupies the FMA pipes
// for two cycles per 8 weights, as long as the FMA itself takes, while the shuffles, shifts and
// logic this decoder uses run beside the FMAs. Measured on one Zen 1 core, 1 token, cycles per
// 32-weight block per row: 9.9-11.8 against 13.0 with 64 rows x 2880 L2-resident; 12.0 against
// 17.2 streaming from DRAM, with the prefetch of mxfp4_one_token (13.1 for the old decoder with
// it). See docs/perf/cpu.md.
//
// The entries are the reference's weights kFp4E2M1Values[code] * e8m0_to_f32(s), bit for bit:
// sign and zero as given, overflow (s = 254, |v| >= 2) to infinity, s = 255 (an infinite scale)
// to +-infinity, and 0 * infinity to the default NaN that x86 multiplication produces.
constexpr uint32_t scaled_fp4_bits(int code, int s) {
  const uint32_t sign = (code & 8) != 0 ? 0x80000000u : 0u;
  const int m = code & 7;
  if (s == 255) return m == 0 ? 0xffc00000u : (sign | 0x7f800000u);
  if (m == 0) return sign;
  // |v| = significand * 2^e with significand 1 or 1.5: m = 1 is 0.5, m = 2k or 2k + 1 is
  // 2^(k - 1) times 1 or 1.5.
  const int e = m == 1 ? -1 : (m >> 1) - 1;
  const bool half = m >= 2 && (m & 1) != 0;
  const int biased = e + s;  // the result's biased exponent: (e + s - 127) + 127
  if (biased >= 255) return sign | 0x7f800000u;
  if (biased >= 1) return sign | uint32_t(biased) << 23 | (half ? 0x400000u : 0u);
  // Subnormal: significand * 2^(biased - 127) = significand * 2^(biased + 22) units of 2^-149.
  return sign | (half ? 3u << (21 + biased) : 1u << (22 + biased));
}
struct Bf16Fp4Luts {
  // [s][0..15]: low byte of the bf16 of code c (bits 16..23 of the float), [s][16..31]: high byte.
  alignas(32) uint8_t bytes[256][32];
};
constexpr Bf16Fp4Luts make_bf16_fp4_luts() {
  Bf16Fp4Luts luts{};
  for (int s = 0; s < 256; ++s) {
    for (int code = 0; code < 16; ++code) {
      const uint32_t bits = scaled_fp4_bits(code, s);
      luts.bytes[s][code] = uint8_t(bits >> 16);
      luts.bytes[s][16 + code] = uint8_t(bits >> 24);
    }
  }
  return luts;
}
constexpr bool scaled_fp4_fits_bf16() {
  for (int s = 0; s < 256; ++s) {
    for (int code = 0; code < 16; ++code) {
      if ((scaled_fp4_bits(code, s) & 0xffffu) != 0) return false;
    }
  }
  return true;
}
static_assert(scaled_fp4_fits_bf16());
// Spot checks against kFp4E2M1Values: 6 * 2^0, -0.5 * 2^2, 1.5 * 2^-127 (subnormal), 3 * 2^-1.
static_assert(scaled_fp4_bits(7, 127) == __builtin_bit_cast(uint32_t, kFp4E2M1Values[7]));
static_assert(scaled_fp4_bits(9, 129) == __builtin_bit_cast(uint32_t, kFp4E2M1Values[9] * 4.0f));
static_assert(scaled_fp4_bits(3, 0) == 0x00600000u && scaled_fp4_bits(5, 126) == __builtin_bit_cast(uint32_t, 1.5f));
static_assert(scaled_fp4_bits(12, 254) == 0xff800000u && scaled_fp4_bits(2, 254) == 0x7f000000u);
constexpr Bf16Fp4Luts kBf16Fp4Luts = make_bf16_fp4_luts();

// NVFP4 weights are decoded the same way, with one table pair per E4M3 block scale: an E2M1 value
// (at most 2 significant bits) times an E4M3 one (at most 4) has at most 6, between 2^-10 and
// 2688, so it is a bf16 exactly. The per-tensor scale is not in the tables: it multiplies the dot
// product once (Nvfp4Row::out_scale). NaN scales (0x7f, 0xff) give the reference's NaN.
constexpr float e4m3_value(int s) {
  const int exponent = (s >> 3) & 0xf, mantissa = s & 7;
  float magnitude = exponent == 0 ? float(mantissa) / 512.0f : 1.0f + float(mantissa) / 8.0f;
  for (int e = 7; e < exponent; ++e) magnitude *= 2.0f;
  for (int e = exponent; e < 7 && exponent != 0; ++e) magnitude *= 0.5f;
  return (s & 0x80) != 0 ? -magnitude : magnitude;
}
constexpr uint32_t nvfp4_bits(int code, int s) {
  if ((s & 0x7f) == 0x7f) return 0x7fc00000u;
  return __builtin_bit_cast(uint32_t, kFp4E2M1Values[code] * e4m3_value(s));
}
constexpr Bf16Fp4Luts make_bf16_nvfp4_luts() {
  Bf16Fp4Luts luts{};
  for (int s = 0; s < 256; ++s) {
    for (int code = 0; code < 16; ++code) {
      const uint32_t bits = nvfp4_bits(code, s);
      luts.bytes[s][code] = uint8_t(bits >> 16);
      luts.bytes[s][16 + code] = uint8_t(bits >> 24);
    }
  }
  return luts;
}
constexpr bool nvfp4_fits_bf16() {
  for (int s = 0; s < 256; ++s) {
    for (int code = 0; code < 16; ++code) {
      if ((nvfp4_bits(code, s) & 0xffffu) != 0) return false;
    }
  }
  return true;
}
static_assert(nvfp4_fits_bf16());
// E4M3 spot checks: 0x38 = 1, 0x7e = 448 (the largest), 0x01 = 2^-9 (the smallest subnormal),
// 0x08 = 2^-6 (the smallest normal), 0xb4 = -0.75; and 6 * 448.
static_assert(e4m3_value(0x38) == 1.0f && e4m3_value(0x7e) == 448.0f && e4m3_value(0x01) == 0x1p-9f &&
              e4m3_value(0x08) == 0x1p-6f && e4m3_value(0xb4) == -0.75f);
static_assert(nvfp4_bits(7, 0x7e) == __builtin_bit_cast(uint32_t, 2688.0f));
constexpr Bf16Fp4Luts kBf16Nvfp4Luts = make_bf16_nvfp4_luts();

// --- Helpers --------------------------------------------------------------------------------

// Pins v to a register. GCC folds a load into every instruction that uses it, so a value loaded
// once and used twice (a weight pair feeding a shift and a mask, an x vector feeding the FMAs of
// two rows) would be loaded twice, and these loops are bound by loads.
template <typename V>
ANVIL_INLINE V in_register(V v) {
  __asm__("" : "+x"(v));
  return v;
}

// Calls f.operator()<I>() for I in [begin, end): loop bodies whose index must be a compile-time
// constant. Accumulator arrays indexed by a plain loop variable can defeat GCC's scalarization
// (it runs before unrolling) and end up on the stack, reloaded and stored every iteration.
template <int I, int End, typename F>
ANVIL_INLINE void static_for(const F& f) {
  if constexpr (I < End) {
    f.template operator()<I>();
    static_for<I + 1, End>(f);
  }
}

// Calls f.operator()<N>() with N = n for n in [1, 4] (4 for anything larger): tile widths that
// must be compile-time constants, each getting its own fully unrolled kernel.
template <typename F>
ANVIL_INLINE void with_count_1_to_4(int n, const F& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    default: f.template operator()<4>(); break;
  }
}

ANVIL_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sum + w * x with one rounding, spelled out so that every path rounds tails identically
// whatever the compiler's contraction settings.
ANVIL_INLINE float fma_scalar(float w, float x, float sum) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(w), _mm_set_ss(x), _mm_set_ss(sum)));
}

// A row's output from its dot product: formats whose decoders leave out a per-row or per-tensor
// factor (Row::kScaled: FP8, NVFP4) apply it here, fused with the bias, in every path alike.
template <class Row>
ANVIL_INLINE float finish_output(const Row& row, float sum, float bias) {
  if constexpr (Row::kScaled) {
    return fma_scalar(sum, row.out_scale(), bias);
  } else {
    return sum + bias;
  }
}

// Scalar conversions for row tails. Local, and __builtin_bit_cast rather than std::bit_cast, so
// this file instantiates no inline function that other files could share (see linear_kernels.h).
ANVIL_INLINE float bf16_bits_to_f32(uint16_t bits) { return __builtin_bit_cast(float, uint32_t(bits) << 16); }
ANVIL_INLINE float f16_bits_to_f32(uint16_t bits) { return _cvtsh_ss(bits); }

// --- Row decoders ---------------------------------------------------------------------------
// A row decoder splits a row into chunks of kChunk weights. load(c) fetches chunk c and vec(chunk,
// v) decodes its v-th vector of 8 floats (kVecs per chunk), in the order pack_x puts x in. at(i)
// decodes a single weight of the tail (the last in % kChunk, natural order). A kScaled row's
// weights are decoded up to a factor, out_scale(), applied once to the dot (finish_output).

struct F32Row {
  static constexpr int64_t kChunk = 8;
  static constexpr int kVecs = 1;
  static constexpr int64_t kChunkBytes = 32;
  static constexpr bool kScaled = false;
  using Chunk = const float*;
  const float* w;
  ANVIL_INLINE Chunk load(int64_t c) const { return w + c * 8; }
  ANVIL_INLINE __m256 vec(Chunk chunk, int) const { return _mm256_loadu_ps(chunk); }
  ANVIL_INLINE float at(int64_t i) const { return w[i]; }
};

struct F16Row {
  static constexpr int64_t kChunk = 8;
  static constexpr int kVecs = 1;
  static constexpr int64_t kChunkBytes = 16;
  static constexpr bool kScaled = false;
  using Chunk = const uint16_t*;
  const uint16_t* w;
  ANVIL_INLINE Chunk load(int64_t c) const { return w + c * 8; }
  ANVIL_INLINE __m256 vec(Chunk chunk, int) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk)));
  }
  ANVIL_INLINE float at(int64_t i) const { return f16_bits_to_f32(w[i]); }
};

// bf16 is the top half of a float, so a 32-bit lane holding two bf16 values gives the odd one
// by masking off the low half and the even one by shifting it up: no shuffles. Chunk order is
// therefore the 8 even elements, then the 8 odd ones. Each vector loads its 32 bytes again
// rather than keeping the pair in a register: loads are cheap (two per cycle, from L1), and a
// register per row of a tile is what multi-token tiles run short of.
struct BF16Row {
  static constexpr int64_t kChunk = 16;
  static constexpr int kVecs = 2;
  static constexpr int64_t kChunkBytes = 32;
  static constexpr bool kScaled = false;
  using Chunk = const uint16_t*;
  const uint16_t* w;
  ANVIL_INLINE Chunk load(int64_t c) const { return w + c * 16; }
  ANVIL_INLINE __m256 vec(Chunk chunk, int v) const {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
    return v == 0 ? _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16))
                  : _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  ANVIL_INLINE float at(int64_t i) const { return bf16_bits_to_f32(w[i]); }
};

// MXFP4: a chunk is one 32-element block; code byte k holds element 2k (low nibble) and 2k + 1.
// The low nibbles, looked up in the block scale's two byte tables (kBf16Fp4Luts), give the low
// and high bytes of the bf16 weights of the even elements; interleaving them (punpck{l,h}bw) makes
// eight bf16 words each: W0 = elements 0, 2, ..., 14, W1 = 16, 18, ..., 30; the high nibbles
// likewise give W2 = 1, 3, ..., 15 and W3 = 17, ..., 31. A 32-bit lane of W holds two words:
// masking off the low one leaves the odd-numbered word as a float32, shifting left by 16 makes the
// even-numbered one a float32. Vector v is those two halves of Wv, four lanes each: lanes 0..3 =
// words 0, 2, 4, 6 of Wv, lanes 4..7 = words 1, 3, 5, 7 (mxfp4_block_element spells out the
// order). The weights come out with the scale applied, bit for bit the reference's.
struct Mxfp4Row {
  static constexpr int64_t kChunk = 32;
  static constexpr int kVecs = 4;
  static constexpr int kScaleBytes = 1;  // per chunk
  static constexpr bool kScaled = false;
  struct Chunk {
    __m128i words[4];
  };
  const uint8_t* codes;
  const uint8_t* scales;
  ANVIL_INLINE Chunk load(int64_t c) const {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + c * 16));
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i even = _mm_and_si128(bytes, nibble), odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const uint8_t* lut = kBf16Fp4Luts.bytes[scales[c]];
    const __m128i low = _mm_load_si128(reinterpret_cast<const __m128i*>(lut));
    const __m128i high = _mm_load_si128(reinterpret_cast<const __m128i*>(lut + 16));
    const __m128i even_low = _mm_shuffle_epi8(low, even), even_high = _mm_shuffle_epi8(high, even);
    const __m128i odd_low = _mm_shuffle_epi8(low, odd), odd_high = _mm_shuffle_epi8(high, odd);
    Chunk chunk;
    chunk.words[0] = _mm_unpacklo_epi8(even_low, even_high);
    chunk.words[1] = _mm_unpackhi_epi8(even_low, even_high);
    chunk.words[2] = _mm_unpacklo_epi8(odd_low, odd_high);
    chunk.words[3] = _mm_unpackhi_epi8(odd_low, odd_high);
    return chunk;
  }
  // Lanes 0..3 and 4..7 of vector v, as two 128-bit halves: the single-token kernel works on
  // halves (Zen 1 splits 256-bit operations anyway, and joining halves costs a cross-lane move
  // on the FMA pipes).
  ANVIL_INLINE static __m128 low_half(const Chunk& chunk, int v) {
    return _mm_castsi128_ps(_mm_slli_epi32(chunk.words[v], 16));
  }
  ANVIL_INLINE static __m128 high_half(const Chunk& chunk, int v) {
    return _mm_castsi128_ps(_mm_and_si128(chunk.words[v], _mm_set1_epi32(int32_t(0xffff0000u))));
  }
  ANVIL_INLINE __m256 vec(const Chunk& chunk, int v) const {
    return _mm256_set_m128(high_half(chunk, v), low_half(chunk, v));
  }
  ANVIL_INLINE float at(int64_t) const { return 0.0f; }  // in % 32 == 0: there is no tail
};

// FP8 E4M3 to fp16 by moving bits: sign, the 4 exponent bits and the 3 mantissa bits become fp16's
// sign, the low 4 of its 5 exponent bits and its top 3 mantissa bits. With exponent biases 7 and
// 15, that is the value times 2^-8, for subnormals too, so vcvtph2ps decodes exactly and the 2^8
// joins the row scale (out_scale). Natural order, no packing. The NaN codes (0x7f, 0xff) would
// decode as +-1.875 instead; the quantizer never writes them.
struct Fp8Row {
  static constexpr int64_t kChunk = 16;
  static constexpr int kVecs = 2;
  static constexpr int64_t kChunkBytes = 16;
  static constexpr bool kScaled = true;
  using Chunk = const uint8_t*;
  const uint8_t* w;
  float scale;  // row_scales[r] * 2^8
  ANVIL_INLINE Chunk load(int64_t c) const { return w + c * 16; }
  ANVIL_INLINE __m256 vec(Chunk chunk, int v) const {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(chunk + 8 * v));
    // Sign-extended to 16 bits and shifted by 7: bit 15 is the sign and so is bit 14, cleared.
    const __m128i halves = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7), _mm_set1_epi16(int16_t(0xbf80)));
    return _mm256_cvtph_ps(halves);
  }
  ANVIL_INLINE float at(int64_t i) const {
    return f16_bits_to_f32(uint16_t((w[i] & 0x80u) << 8 | (w[i] & 0x7fu) << 7));
  }
  ANVIL_INLINE float out_scale() const { return scale; }
};

// NVFP4: a chunk is 32 elements, two 16-element blocks with one E4M3 scale each. Each block's 8
// code bytes are looked up in its scale's tables (kBf16Nvfp4Luts) as in Mxfp4Row, which leaves
// words[0] = elements 0, 2, ..., 14, words[1] = 1, 3, ..., 15, words[2] = 16, 18, ..., 30 and
// words[3] = 17, ..., 31, each turned into a vector the way Mxfp4Row does (nvfp4_block_element).
struct Nvfp4Row {
  static constexpr int64_t kChunk = 32;
  static constexpr int kVecs = 4;
  static constexpr int kScaleBytes = 2;  // per chunk
  static constexpr bool kScaled = true;
  using Chunk = Mxfp4Row::Chunk;
  const uint8_t* codes;
  const uint8_t* scales;
  float scale;  // the per-tensor scale
  ANVIL_INLINE Chunk load(int64_t c) const {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + c * 16));
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i even = _mm_and_si128(bytes, nibble), odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    Chunk chunk;
    static_for<0, 2>([&]<int b>() {
      // Block b: its bytes' low nibbles, then their high nibbles.
      const __m128i index = b == 0 ? _mm_unpacklo_epi64(even, odd) : _mm_unpackhi_epi64(even, odd);
      const uint8_t* lut = kBf16Nvfp4Luts.bytes[scales[2 * c + b]];
      const __m128i low = _mm_shuffle_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(lut)), index);
      const __m128i high = _mm_shuffle_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(lut + 16)), index);
      chunk.words[2 * b] = _mm_unpacklo_epi8(low, high);
      chunk.words[2 * b + 1] = _mm_unpackhi_epi8(low, high);
    });
    return chunk;
  }
  ANVIL_INLINE static __m128 low_half(const Chunk& chunk, int v) { return Mxfp4Row::low_half(chunk, v); }
  ANVIL_INLINE static __m128 high_half(const Chunk& chunk, int v) { return Mxfp4Row::high_half(chunk, v); }
  ANVIL_INLINE __m256 vec(const Chunk& chunk, int v) const {
    return _mm256_set_m128(high_half(chunk, v), low_half(chunk, v));
  }
  // A row of 32k + 16 elements ends with one block outside the chunks.
  ANVIL_INLINE float at(int64_t i) const {
    const uint8_t* lut = kBf16Nvfp4Luts.bytes[scales[i / 16]];
    const int code = (codes[i / 2] >> (4 * (i & 1))) & 0x0f;
    return __builtin_bit_cast(float, uint32_t(lut[16 + code]) << 24 | uint32_t(lut[code]) << 16);
  }
  ANVIL_INLINE float out_scale() const { return scale; }
};

// The element of a chunk at packed position p: vector p / 8, lane p % 8 (see Nvfp4Row).
constexpr int nvfp4_block_element(int p) {
  const int v = p / 8, lane = p % 8;
  const int word = lane < 4 ? 2 * lane : 2 * (lane - 4) + 1;
  return (v >> 1) * 16 + 2 * word + (v & 1);
}
static_assert(nvfp4_block_element(0) == 0 && nvfp4_block_element(4) == 2 && nvfp4_block_element(8) == 1 &&
              nvfp4_block_element(16) == 16 && nvfp4_block_element(31) == 31);

// The element of a block at packed position p: vector p / 8, lane p % 8 (see Mxfp4Row).
constexpr int mxfp4_block_element(int p) {
  const int v = p / 8, lane = p % 8;
  const int word = lane < 4 ? 2 * lane : 2 * (lane - 4) + 1;  // word of Wv
  const int byte = (v & 1) != 0 ? word + 8 : word;            // code byte
  return v < 2 ? 2 * byte : 2 * byte + 1;
}
struct Mxfp4PackOrder {
  uint8_t element[32];
};
constexpr Mxfp4PackOrder make_mxfp4_pack_order() {
  Mxfp4PackOrder order{};
  for (int p = 0; p < 32; ++p) order.element[p] = uint8_t(mxfp4_block_element(p));
  return order;
}
constexpr Mxfp4PackOrder kMxfp4PackOrder = make_mxfp4_pack_order();
constexpr Mxfp4PackOrder make_nvfp4_pack_order() {
  Mxfp4PackOrder order{};
  for (int p = 0; p < 32; ++p) order.element[p] = uint8_t(nvfp4_block_element(p));
  return order;
}
constexpr Mxfp4PackOrder kNvfp4PackOrder = make_nvfp4_pack_order();
static_assert(mxfp4_block_element(0) == 0 && mxfp4_block_element(4) == 2 && mxfp4_block_element(8) == 16 &&
              mxfp4_block_element(16) == 1 && mxfp4_block_element(31) == 31);

}  // namespace

}  // namespace anvil::cpu
