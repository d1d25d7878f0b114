// AVX-512 tiles for batched decode of the dense formats (F32, F16, BF16, FP8): the regime of a few
// tokens (the server decoding several sequences at once), which is bound by arithmetic, not by
// memory. On an AVX-512 server core (two 512-bit FMA ports) these tiles do twice the multiply-adds
// per instruction of the AVX2 tiles, and on Intel cores the AVX2 tiles' bf16 conversions also
// compete with the FMAs for the same two ports.
//
// Results are bit for bit those of the AVX2 kernels, so a token's output still does not depend on
// the batch or on which of the two kernels ran: every dot product keeps the canonical order of
// linear_avx2.cpp (one 8-lane accumulator over the packed 8-wide vectors, then hsum, the tail and
// the bias). A 512-bit accumulator simply holds two of them, the dot products of one row with two
// tokens: the weight vector is duplicated into both halves, and x is laid out in token pairs
// (linear_avx512_pair_x), so each half of every FMA is exactly the AVX2 FMA for its token.
//
// No column blocking, unlike the AVX2 batch_rows: a tile walks whole rows, so its accumulators stay
// in registers, and x for all tokens (a few hundred KiB at most) is read from L2, which server
// cores have enough of (1-2 MiB) to hold it beside the weights in flight.
#include <immintrin.h>

#include <cstdint>

// GCC 12's broadcast intrinsics start from _mm512_undefined_*(), which its own flow analysis then
// reports as maybe-uninitialized (a false positive inside the compiler's headers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "backend/cpu/linear_kernels.h"
#include "backend/cpu/simd_rows.h"

namespace anvil::cpu {

namespace {

// 4 rows x 4 token pairs: 16 accumulators, 4 weight vectors and an x vector in 32 registers.
// Per chunk vector each weight feeds 4 FMAs (8 tokens) and each x vector 4, so the FMA ports, not
// the loads, are the limit; a BF16 row costs one shift or mask per 4 FMAs on top.
constexpr int kTileRows = 4;
constexpr int kTilePairs = 4;

// Vector v of a chunk, decoded to 8 floats, in both 256-bit halves.
template <class Row>
ANVIL_INLINE __m512 duplicated(const Row& row, typename Row::Chunk chunk, int v) {
  return _mm512_broadcast_f32x8(row.vec(chunk, v));
}
// bf16 pairs broadcast straight from memory, then split as BF16Row::vec does: no cross-lane move.
ANVIL_INLINE __m512 duplicated(const BF16Row&, const uint16_t* chunk, int v) {
  const __m512i pairs = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk)));
  return v == 0 ? _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16))
                : _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int32_t(0xffff0000u))));
}
ANVIL_INLINE __m512 duplicated(const F32Row&, const float* chunk, int) {
  return _mm512_broadcast_f32x8(_mm256_loadu_ps(chunk));
}

// Distance, in bytes, at which a tile prefetches its rows ahead of the loads: the four rows are
// four interleaved streams, more than some cores' prefetchers keep ahead of.
constexpr uintptr_t kPrefetchBytes = 1024;

// acc[r][p] over all chunks: rows[r] times the token pairs p of xp (the tile's first pair within
// the pair layout; consecutive 8-float groups are group_stride floats apart).
template <class Row, int R, int P>
ANVIL_INLINE void pair_tile(const Row* rows, int64_t chunks, const float* xp, int64_t group_stride, __m512 (&acc)[R][P]) {
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  constexpr int64_t kChunksPerLine = 64 / Row::kChunkBytes > 0 ? 64 / Row::kChunkBytes : 1;
  for (int64_t c = 0; c < chunks; ++c) {
    typename Row::Chunk chunk[R];
    for (int r = 0; r < R; ++r) chunk[r] = rows[r].load(c);
    if (c % kChunksPerLine == 0) {
      for (int r = 0; r < R; ++r) {
        // Formed as an integer: the address may lie past the end of the matrix, which a prefetch
        // may touch but a pointer may not point at.
        _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(chunk[r]) + kPrefetchBytes),
                     _MM_HINT_T0);
      }
    }
    const float* xc = xp + c * Row::kVecs * group_stride;
    static_for<0, Row::kVecs>([&]<int v>() {
      __m512 w[R];
      for (int r = 0; r < R; ++r) w[r] = duplicated(rows[r], chunk[r], v);
      for (int p = 0; p < P; ++p) {
        const __m512 xv = in_register(_mm512_loadu_ps(xc + v * group_stride + 16 * p));
        for (int r = 0; r < R; ++r) acc[r][p] = _mm512_fmadd_ps(w[r], xv, acc[r][p]);
      }
    });
  }
}

static_assert(kTilePairs == 4, "with_count_1_to_4 covers the tile widths");

template <class Row, typename MakeRow>
void pair_rows(const LinearWeight& weight, const float* x_packed, const float* x_pairs, int64_t tokens, float* y,
               int64_t row_begin, int64_t row_end, const MakeRow& make_row) {
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  const int64_t chunks = in / Row::kChunk;
  const int64_t pairs = (tokens + 1) / 2;
  const int64_t group_stride = pairs * 16;
  for (int64_t r0 = row_begin; r0 < row_end;) {
    const int64_t remaining = row_end - r0;
    auto run = [&]<int R>() {
      Row rows[R];
      for (int r = 0; r < R; ++r) rows[r] = make_row(r0 + r);
      for (int64_t p0 = 0; p0 < pairs; p0 += kTilePairs) {
        const int count = int(pairs - p0 < kTilePairs ? pairs - p0 : kTilePairs);
        with_count_1_to_4(count, [&]<int P>() {
          __m512 acc[R][P];
          pair_tile<Row, R, P>(rows, chunks, x_pairs + p0 * 16, group_stride, acc);
          for (int r = 0; r < R; ++r) {
            const float bias = weight.bias != nullptr ? weight.bias[r0 + r] : 0.0f;
            for (int p = 0; p < P; ++p) {
              const __m256 halves[2] = {_mm512_castps512_ps256(acc[r][p]), _mm512_extractf32x8_ps(acc[r][p], 1)};
              for (int h = 0; h < 2; ++h) {
                const int64_t t = 2 * (p0 + p) + h;
                if (t >= tokens) break;
                float sum = hsum(halves[h]);
                for (int64_t i = chunks * Row::kChunk; i < in; ++i) sum = fma_scalar(rows[r].at(i), x_packed[t * in + i], sum);
                y[t * out + r0 + r] = finish_output(rows[r], sum, bias);
              }
            }
          }
        });
      }
    };
    if (remaining >= kTileRows) {
      run.template operator()<kTileRows>();
      r0 += kTileRows;
    } else {
      run.template operator()<1>();
      r0 += 1;
    }
  }
}

}  // namespace

bool linear_avx512_handles(WeightFormat format, int64_t tokens) {
  const bool dense = format == WeightFormat::F32 || format == WeightFormat::F16 || format == WeightFormat::BF16 ||
                     format == WeightFormat::FP8;
  return dense && tokens >= 2 && tokens < kDenseGemmMinTokens;
}

int64_t linear_avx512_pair_floats(int64_t tokens, int64_t in) { return (in / 8) * ((tokens + 1) / 2) * 16; }

void linear_avx512_pair_x(const float* x_packed, int64_t tokens, int64_t in, float* x_pairs) {
  const int64_t groups = in / 8;
  const int64_t pairs = (tokens + 1) / 2;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t p = 0; p < pairs; ++p) {
      float* dst = x_pairs + (g * pairs + p) * 16;
      _mm256_storeu_ps(dst, _mm256_loadu_ps(x_packed + 2 * p * in + g * 8));
      // An odd batch's last pair has no second token: zeros, whose products are never stored.
      _mm256_storeu_ps(dst + 8, 2 * p + 1 < tokens ? _mm256_loadu_ps(x_packed + (2 * p + 1) * in + g * 8)
                                                   : _mm256_setzero_ps());
    }
  }
}

void linear_avx512_rows(const LinearWeight& weight, const float* x_packed, const float* x_pairs, int64_t tokens,
                        float* y, int64_t row_begin, int64_t row_end) {
  const int64_t in = weight.in_features;
  switch (weight.format) {
    case WeightFormat::F32: {
      const float* w = static_cast<const float*>(weight.data);
      pair_rows<F32Row>(weight, x_packed, x_pairs, tokens, y, row_begin, row_end,
                        [&](int64_t r) { return F32Row{w + r * in}; });
      return;
    }
    case WeightFormat::F16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data);
      pair_rows<F16Row>(weight, x_packed, x_pairs, tokens, y, row_begin, row_end,
                        [&](int64_t r) { return F16Row{w + r * in}; });
      return;
    }
    case WeightFormat::BF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data);
      pair_rows<BF16Row>(weight, x_packed, x_pairs, tokens, y, row_begin, row_end,
                         [&](int64_t r) { return BF16Row{w + r * in}; });
      return;
    }
    case WeightFormat::FP8: {
      const uint8_t* w = static_cast<const uint8_t*>(weight.data);
      pair_rows<Fp8Row>(weight, x_packed, x_pairs, tokens, y, row_begin, row_end,
                        [&](int64_t r) { return Fp8Row{w + r * in, weight.row_scales[r] * 256.0f}; });
      return;
    }
    case WeightFormat::MXFP4:
    case WeightFormat::NVFP4: return;  // not handled here: linear_avx512_handles says so
  }
}

}  // namespace anvil::cpu
