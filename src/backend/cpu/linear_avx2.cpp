// AVX2+FMA+F16C linear kernels, in three regimes:
//  - one token (decode): memory bound. Rows are streamed once; each weight vector is decoded in
//    registers and used at once, several rows at a time to cover FMA latency. MXFP4 also uses
//    these register tiles for up to 8 tokens, as its decode is too costly to repeat per tile.
//  - a few tokens of a dense format (batched decode): compute bound. Register tiles over column
//    blocks sized for L1 (batch_rows).
//  - many tokens (prefill, matrix-matrix): compute bound. Row blocks are decoded once into a float
//    buffer and a register-tiled micro-kernel reuses each weight vector across several tokens.
//
// Batch invariance: y[t] must not depend on which other tokens share the call (the server
// batches unrelated requests), so every regime computes every (row, token) dot product in one
// canonical order: a single 8-lane accumulator, acc = fma(w_j, x_j, acc) over the 8-wide weight
// vectors j in packed order; then hsum(acc); then the tail elements (in % chunk, natural order)
// one fma at a time; then + bias. Latency is hidden by working on several rows or tokens at
// once, never by splitting one dot product over several accumulators.
//
// Decoding yields weights in whatever order is cheapest for the format; x is permuted to match
// beforehand (linear_avx2_pack_x), which costs O(tokens * in) instead of a shuffle per weight.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/linear_kernels.h"
#include "backend/cpu/simd_rows.h"
#include "core/dtype.h"

namespace anvil::cpu {

namespace {

// --- Few tokens: decode in registers --------------------------------------------------------

// Token tiles of up to this many tokens use weights decoded in registers (one accumulator
// register per row and token); larger batches go through the GEMM path once gemm_pays_off says so.
constexpr int64_t kMaxRegisterTokens = 8;

// Rows computed together for a tile of T tokens: with one accumulator per dot product, a single
// token needs several rows in flight to cover FMA latency; rows also share each x load. (A
// single MXFP4 token goes through mxfp4_one_token instead.)
template <class Row, int T>
constexpr int kRowsPerTile = T == 1 ? 4 : (T <= 3 ? 2 : 1);

// sums[r * T + t] = dot(rows[r], x[t]) in the canonical order (see the top of the file).
template <class Row, int R, int T>
ANVIL_INLINE void register_tile(const Row* rows, int64_t in, const float* x, int64_t ldx, float* sums) {
  const int64_t chunks = in / Row::kChunk;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < chunks; ++c) {
    typename Row::Chunk chunk[R];
    for (int r = 0; r < R; ++r) chunk[r] = rows[r].load(c);
    const float* xc = x + c * Row::kChunk;
    for (int v = 0; v < Row::kVecs; ++v) {
      if constexpr (R == 1) {
        // Each x vector is used once: let it be the FMA's memory operand.
        const __m256 w = rows[0].vec(chunk[0], v);
        for (int t = 0; t < T; ++t) acc[0][t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xc + t * ldx + 8 * v), acc[0][t]);
      } else {
        __m256 xv[T];
        for (int t = 0; t < T; ++t) xv[t] = in_register(_mm256_loadu_ps(xc + t * ldx + 8 * v));
        for (int r = 0; r < R; ++r) {
          const __m256 w = rows[r].vec(chunk[r], v);
          for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float sum = hsum(acc[r][t]);
      for (int64_t i = chunks * Row::kChunk; i < in; ++i) sum = fma_scalar(rows[r].at(i), x[t * ldx + i], sum);
      sums[r * T + t] = sum;
    }
  }
}

// Calls f.operator()<T>() with T = n for n in [1, kMaxRegisterTokens], so every tile size gets
// its own fully unrolled kernel.
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
static_assert(kMaxRegisterTokens == 8, "with_tile_size covers 1..8");

// Rows are walked in blocks so a block's weights stay in cache while each token tile passes.
constexpr int64_t kRegisterRows = 16;

// group.operator()<R, T>(r, x_tile, sums) computes rows [r, r + R) of format Row for the token
// tile at x_tile into sums[R * T]; this walks every row of [row_begin, row_end) and token tile.
// make_row(r) -> the decoder of row r, for its output scale.
template <class Row, typename MakeRow, typename Group>
void register_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                   int64_t row_end, const MakeRow& make_row, const Group& group) {
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  const int64_t tiles = (tokens + kMaxRegisterTokens - 1) / kMaxRegisterTokens;
  for (int64_t block = row_begin; block < row_end; block += kRegisterRows) {
    const int64_t block_end = block + kRegisterRows < row_end ? block + kRegisterRows : row_end;
    for (int64_t i = 0; i < tiles; ++i) {
      const int64_t t0 = tokens * i / tiles;
      const int count = int(tokens * (i + 1) / tiles - t0);
      with_tile_size(count, [&]<int T>() {
        auto store = [&](int64_t r, const float* sums) {
          const float bias = weight.bias != nullptr ? weight.bias[r] : 0.0f;
          const Row row = make_row(r);
          for (int t = 0; t < T; ++t) y[(t0 + t) * out + r] = finish_output(row, sums[t], bias);
        };
        constexpr int R = kRowsPerTile<Row, T>;
        int64_t r = block;
        for (; r + R <= block_end; r += R) {
          float sums[R * T];
          group.template operator()<R, T>(r, x + t0 * in, sums);
          for (int k = 0; k < R; ++k) store(r + k, sums + k * T);
        }
        for (; r < block_end; ++r) {
          float sums[T];
          group.template operator()<1, T>(r, x + t0 * in, sums);
          store(r, sums);
        }
      });
    }
  }
}

// --- Many tokens: decode a row block once, then a float32 GEMM micro-kernel ---------------
// Decoding weights per token tile would repeat the decode tokens/tile times. Instead each block
// of kGemmRows rows is decoded (kGemmK columns at a time) into a float buffer in packed-x order,
// and a kGemmR x kGemmT register tile of accumulators (2 rows x 6 tokens: 12 accumulators, 2
// weight vectors, 1 x vector) runs over it. Each weight vector load feeds 6 FMAs and each x load
// 2, so FMA throughput, not loads, is the limit. Accumulators persist across column blocks in a
// buffer, which keeps each dot product in the canonical order.

constexpr int64_t kGemmRows = 16;    // rows decoded together
constexpr int64_t kGemmK = 512;      // columns decoded together: 16 rows x 512 floats = 32 KiB
constexpr int kGemmR = 2;            // rows per register tile
constexpr int kGemmT = 6;            // tokens per register tile
constexpr int64_t kGemmTokens = 96;  // tokens whose accumulators are kept at once (16 tiles,
                                     // 48 KiB); weights are decoded once per this many tokens
static_assert(kGemmK % 32 == 0 && kGemmRows % kGemmR == 0 && kGemmTokens % kGemmT == 0);

// Decodes columns [k0, k0 + n) of a row (k0 a multiple of kGemmK, so of every chunk size) into
// dst, in packed-x order, exactly as the row decoder's vectors and tail give them.
template <class Row>
ANVIL_INLINE void decode_columns(const Row& row, int64_t in, int64_t k0, int64_t n, float* dst) {
  const int64_t full = in / Row::kChunk * Row::kChunk;
  const int64_t vector_end = full - k0 < n ? full - k0 : n;
  for (int64_t i = 0; i < vector_end; i += Row::kChunk) {
    const typename Row::Chunk chunk = row.load((k0 + i) / Row::kChunk);
    for (int v = 0; v < Row::kVecs; ++v) _mm256_store_ps(dst + i + 8 * v, row.vec(chunk, v));
  }
  for (int64_t i = vector_end; i < n; ++i) dst[i] = row.at(k0 + i);
}

// acc[r * kGemmT + t] = fma over k < n (a multiple of 8) of w[r * ldw + k] and x[t * ldx + k],
// lane-wise and in order.
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
      const __m256 xv = in_register(_mm256_loadu_ps(x + t * ldx + k));
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

// Prefetches columns [k0, k0 + n) of a row: the GEMM reads kGemmRows rows a column block at a
// time, short strided runs that hardware prefetchers follow poorly.
ANVIL_INLINE void prefetch_columns(const char* row, int64_t bytes_per_column_x2, int64_t k0, int64_t n) {
  const char* begin = row + k0 * bytes_per_column_x2 / 2;
  const int64_t bytes = n * bytes_per_column_x2 / 2;
  for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(begin + offset, _MM_HINT_T0);
}

// make_row(r) -> the decoder of row r; row_bytes(r) -> its first byte; bytes_x2 = 2 * bytes per
// weight (1 for MXFP4 codes).
template <class Row, typename MakeRow, typename RowBytes>
void gemm_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
               int64_t row_end, const MakeRow& make_row, const RowBytes& row_bytes, int64_t bytes_x2) {
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  const int64_t vector_columns = in / Row::kChunk * Row::kChunk;
  constexpr int64_t kPairs = kGemmRows / kGemmR;
  constexpr int64_t kTiles = kGemmTokens / kGemmT;
  constexpr int64_t kSlot = kGemmR * kGemmT;
  alignas(32) float wbuf[kGemmRows * kGemmK];
  __m256 accs[kPairs * kTiles * kSlot];  // [row pair][token tile][row in pair * kGemmT + token in tile]

  for (int64_t r0 = row_begin; r0 < row_end; r0 += kGemmRows) {
    const int64_t rows = row_end - r0 < kGemmRows ? row_end - r0 : kGemmRows;
    // Token groups of equal size (100 tokens as 50 + 50, not 96 + 4).
    const int64_t groups = (tokens + kGemmTokens - 1) / kGemmTokens;
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t t0 = tokens * group / groups;
      const int64_t count = tokens * (group + 1) / groups - t0;
      // Tiles as even as possible (8 tokens as 4 + 4, not 6 + 2): small tiles waste loads.
      const int64_t tiles = (count + kGemmT - 1) / kGemmT;
      int64_t tile_begin[kTiles + 1];
      for (int64_t i = 0; i <= tiles; ++i) tile_begin[i] = count * i / tiles;
      auto acc_of = [&](int64_t r, int64_t tile, int64_t t) {
        return accs + ((r / kGemmR) * kTiles + tile) * kSlot + (r % kGemmR) * kGemmT + (t - tile_begin[tile]);
      };

      for (int64_t i = 0; i < kPairs * kTiles * kSlot; ++i) accs[i] = _mm256_setzero_ps();
      int64_t k0 = 0, n = 0;
      for (; k0 < in; k0 += kGemmK) {
        n = in - k0 < kGemmK ? in - k0 : kGemmK;
        const int64_t next = k0 + kGemmK;
        for (int64_t r = 0; r < rows; ++r) {
          decode_columns(make_row(r0 + r), in, k0, n, wbuf + r * kGemmK);
          if (next < in) prefetch_columns(row_bytes(r0 + r), bytes_x2, next, in - next < kGemmK ? in - next : kGemmK);
        }
        // The tail (in % chunk columns) is not part of the vector order; it is added after hsum.
        const int64_t n_vector = vector_columns - k0 < n ? vector_columns - k0 : n;
        for (int64_t p = 0; p < rows; p += kGemmR) {
          const float* w = wbuf + p * kGemmK;
          for (int64_t tile = 0; tile < tiles; ++tile) {
            const int nt = int(tile_begin[tile + 1] - tile_begin[tile]);
            const float* xt = x + (t0 + tile_begin[tile]) * in + k0;
            __m256* acc = acc_of(p, tile, tile_begin[tile]);
            if (rows - p >= 2) {
              gemm_tile_tokens<2>(nt, w, kGemmK, xt, in, n_vector, acc);
            } else {
              gemm_tile_tokens<1>(nt, w, kGemmK, xt, in, n_vector, acc);
            }
          }
        }
      }
      // wbuf still holds the last column block, which contains the whole tail.
      const int64_t last_k0 = k0 - kGemmK;
      for (int64_t r = 0; r < rows; ++r) {
        const float bias = weight.bias != nullptr ? weight.bias[r0 + r] : 0.0f;
        const Row row = make_row(r0 + r);
        for (int64_t tile = 0; tile < tiles; ++tile) {
          for (int64_t t = tile_begin[tile]; t < tile_begin[tile + 1]; ++t) {
            float sum = hsum(*acc_of(r, tile, t));
            for (int64_t k = vector_columns; k < in; ++k) {
              sum = fma_scalar(wbuf[r * kGemmK + (k - last_k0)], x[(t0 + t) * in + k], sum);
            }
            y[(t0 + t) * out + r0 + r] = finish_output(row, sum, bias);
          }
        }
      }
    }
  }
}

// Whether many-token batches go through the GEMM path. Below the crossover, decoding weights per
// token tile costs less than writing them to a buffer and reading them back. Measured per core at
// 5760x2880 (GFLOP/s, registers vs GEMM): MXFP4 25.1 vs 24.7 at 16 tokens, 24.9 vs 27.6 at 24;
// bf16 27.5 vs 27.9 at 32, 27.3 vs 31.0 at 64.
// NVFP4 and FP8 were not measured: they take the thresholds of the formats they decode like.
bool gemm_pays_off(WeightFormat format, int64_t tokens) {
  return tokens >= (format == WeightFormat::MXFP4 || format == WeightFormat::NVFP4 ? 20 : kDenseGemmMinTokens);
}

// --- Small batches of a dense format: register tiles over L1-sized column blocks -----------
// A batch of a few tokens (the server decoding several sequences) is compute bound, but too
// small to amortize the GEMM path's float buffer. Weights are converted in registers (one shift
// or mask per 8 bf16 values, on a port the FMAs leave free) inside a 2-row x 4-token tile of 8
// accumulators. What keeps the FMA units fed is the blocking: a column block of every token's
// x is copied, chunk-major ([chunk][token][chunk elements]), into a buffer that stays in L1 and
// that the tile reads as one sequential stream whatever the row pitch; each tile's accumulators
// are carried in memory from one column block to the next (in order, so the canonical order
// holds); and each row's weights come from memory once, prefetched, then from L1 for the other
// token tiles.

constexpr int64_t kBatchRows = 64;           // rows whose accumulators are kept together
constexpr int64_t kBatchXFloats = 4096;      // x column block, all tokens (16 KiB)
constexpr int64_t kMaxBatchTokens = 31;      // more goes through the GEMM path
constexpr int kBatchTileTokens = 4;
// 2 rows x 4 tokens: in a synthetic loop on Zen 1 (one core, L1-resident, bf16 weights converted
// in registers) it runs at 1.05 cycles per FMA, against 1.37 for 3 x 4 and 4 x 3: 12
// accumulators leave too few registers, and GCC moves some to the stack.
constexpr int kBatchTileRows = 2;

// Continues the accumulation of R rows x T tokens over chunks [c_begin, c_end): acc[r * ld + t].
// xs points at chunk c_begin of the first token in the chunk-major block; chunks are
// x_stride floats apart, tokens Row::kChunk.
template <class Row, int R, int T>
ANVIL_INLINE void batch_tile(const Row* rows, int64_t c_begin, int64_t c_end, const float* xs, int64_t x_stride,
                             __m256* acc, int64_t ld) {
  __m256 a[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) a[r][t] = acc[r * ld + t];
  }
  for (int64_t c = c_begin; c < c_end; ++c, xs += x_stride) {
    typename Row::Chunk chunk[R];
    for (int r = 0; r < R; ++r) chunk[r] = rows[r].load(c);
    static_for<0, Row::kVecs>([&]<int v>() {
      __m256 w[R];
      for (int r = 0; r < R; ++r) w[r] = rows[r].vec(chunk[r], v);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = in_register(_mm256_load_ps(xs + t * Row::kChunk + 8 * v));
        for (int r = 0; r < R; ++r) a[r][t] = _mm256_fmadd_ps(w[r], xv, a[r][t]);
      }
    });
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r * ld + t] = a[r][t];
  }
}

static_assert(kBatchTileTokens == 4, "with_count_1_to_4 covers the tile widths");

template <class Row, typename MakeRow>
void batch_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                int64_t row_end, const MakeRow& make_row) {
  constexpr int64_t kChunk = Row::kChunk;
  const int64_t in = weight.in_features;
  const int64_t out = weight.out_features;
  const int64_t chunks = in / kChunk;
  int64_t block_chunks = kBatchXFloats / (tokens * kChunk);
  if (block_chunks < 1) block_chunks = 1;
  const int64_t tiles = (tokens + kBatchTileTokens - 1) / kBatchTileTokens;
  alignas(32) float xblock[kBatchXFloats > kMaxBatchTokens * kChunk ? kBatchXFloats : kMaxBatchTokens * kChunk];
  __m256 accs[kBatchRows * kMaxBatchTokens];  // [row in block][token]
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kBatchRows) {
    const int64_t rows = row_end - r0 < kBatchRows ? row_end - r0 : kBatchRows;
    for (int64_t i = 0; i < rows * tokens; ++i) accs[i] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < chunks; c0 += block_chunks) {
      const int64_t c1 = c0 + block_chunks < chunks ? c0 + block_chunks : chunks;
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t t = 0; t < tokens; ++t) {
          const float* src = x + t * in + c * kChunk;
          float* dst = xblock + ((c - c0) * tokens + t) * kChunk;
          for (int64_t i = 0; i < kChunk; i += 8) _mm256_store_ps(dst + i, _mm256_loadu_ps(src + i));
        }
      }
      // One row group for every tile width, so a group's weights stay in L1 across its tiles.
      constexpr int kGroup = kBatchTileRows;
      for (int64_t r = 0; r < rows;) {
        const int group = rows - r >= kGroup ? kGroup : 1;
        // The rows' segments in a column block are short runs a row pitch apart, which hardware
        // prefetchers do not follow: fetch the next group's (or the next block's first) ahead.
        {
          const bool last = r + group >= rows;
          const int64_t pr = last ? 0 : r + group, pc0 = last ? c1 : c0;
          const int64_t pc1 = last ? (c1 + block_chunks < chunks ? c1 + block_chunks : chunks) : c1;
          for (int64_t k = pr; k < pr + kGroup && k < rows; ++k) {
            const Row row = make_row(r0 + k);
            for (int64_t c = pc0; c < pc1; c += 64 / Row::kChunkBytes) {
              _mm_prefetch(reinterpret_cast<const char*>(row.load(c)), _MM_HINT_T0);
            }
          }
        }
        for (int64_t i = 0; i < tiles; ++i) {
          const int64_t t0 = tokens * i / tiles;
          const int count = int(tokens * (i + 1) / tiles - t0);
          with_count_1_to_4(count, [&]<int T>() {
            auto run = [&]<int R>() {
              Row tile_rows[R];
              for (int k = 0; k < R; ++k) tile_rows[k] = make_row(r0 + r + k);
              batch_tile<Row, R, T>(tile_rows, c0, c1, xblock + t0 * kChunk, tokens * kChunk, accs + r * tokens + t0,
                                    tokens);
            };
            if (group == kGroup) {
              run.template operator()<kGroup>();
            } else {
              run.template operator()<1>();
            }
          });
        }
        r += group;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const Row row = make_row(r0 + r);
      const float bias = weight.bias != nullptr ? weight.bias[r0 + r] : 0.0f;
      for (int64_t t = 0; t < tokens; ++t) {
        float sum = hsum(accs[r * tokens + t]);
        for (int64_t i = chunks * kChunk; i < in; ++i) sum = fma_scalar(row.at(i), x[t * in + i], sum);
        y[t * out + r0 + r] = finish_output(row, sum, bias);
      }
    }
  }
}

template <class Row, typename MakeRow, typename RowBytes>
void dense_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
                int64_t row_end, const MakeRow& make_row, const RowBytes& row_bytes, int64_t bytes_x2) {
  if (gemm_pays_off(weight.format, tokens)) {
    gemm_rows<Row>(weight, x, tokens, y, row_begin, row_end, make_row, row_bytes, bytes_x2);
    return;
  }
  if (tokens > 1) {
    static_assert(kMaxBatchTokens >= 31, "every batch below the GEMM threshold fits batch_rows");
    batch_rows<Row>(weight, x, tokens, y, row_begin, row_end, make_row);
    return;
  }
  const int64_t in = weight.in_features;
  register_rows<Row>(weight, x, tokens, y, row_begin, row_end, make_row, [&]<int R, int T>(int64_t r, const float* xt, float* sums) {
    Row rows[R];
    for (int k = 0; k < R; ++k) rows[k] = make_row(r + k);
    register_tile<Row, R, T>(rows, in, xt, in, sums);
  });
}

// register_tile<Row, 4, 1> for the FP4 formats (Mxfp4Row, Nvfp4Row) spelled out, on 128-bit
// halves: the single-token case decode spends its time in. Each row's 8-lane accumulator is kept as two 4-lane halves (lanes 0..3 and
// 4..7), which is the same arithmetic lane for lane, and hsum adds the halves first exactly as
// hsum of the 256-bit register does, so the order is the canonical one. Halves avoid joining the
// decoder's 128-bit outputs into 256-bit vectors, a cross-lane move that competes with the FMAs
// on Zen 1. Four rows cover the FMA latency of each row's dependency chain (4 FMAs per block).
template <class Row>
ANVIL_INLINE void fp4_one_token(const Row* rows, int64_t in, const float* x, float* sums) {
  const int64_t blocks = in / 32;
  __m128 a0 = _mm_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
  // register_rows walks rows in order, so the next four rows are most likely the next group:
  // fetch their codes (4 x 16 bytes per block, one cache line per iteration) and scales while
  // this group computes. Four interleaved row streams are more than the hardware prefetcher
  // keeps ahead of: from DRAM this took 16.0 to 12.0 cycles per block per row on one Zen 1 core.
  // Prefetching past the end of the matrix is harmless (prefetches do not fault); the addresses
  // are formed as integers so that no out-of-bounds pointer is ever computed.
  const uintptr_t next_codes = reinterpret_cast<uintptr_t>(rows[0].codes) + uintptr_t(4 * (in / 2));
  const uintptr_t next_scales = reinterpret_cast<uintptr_t>(rows[0].scales) + uintptr_t(4 * (in / 32) * Row::kScaleBytes);
  for (int64_t c = 0; c < blocks; ++c) {
    const float* xc = x + c * 32;
    _mm_prefetch(reinterpret_cast<const char*>(next_codes + uintptr_t(c) * 64), _MM_HINT_T0);
    if (c < 8 * Row::kScaleBytes) _mm_prefetch(reinterpret_cast<const char*>(next_scales + uintptr_t(c) * 64), _MM_HINT_T0);
    auto row = [&](const Row& r, __m128& lo, __m128& hi) {
      const typename Row::Chunk chunk = r.load(c);
      static_for<0, 4>([&]<int v>() {
        lo = _mm_fmadd_ps(Row::low_half(chunk, v), _mm_loadu_ps(xc + 8 * v), lo);
        hi = _mm_fmadd_ps(Row::high_half(chunk, v), _mm_loadu_ps(xc + 8 * v + 4), hi);
      });
    };
    row(rows[0], a0, b0);
    row(rows[1], a1, b1);
    row(rows[2], a2, b2);
    row(rows[3], a3, b3);
  }
  // The tail (an NVFP4 row of 32k + 16 elements), one fma at a time after hsum, as everywhere.
  auto finish = [&](const Row& r, __m128 lo, __m128 hi) {
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (int64_t i = blocks * 32; i < in; ++i) sum = fma_scalar(r.at(i), x[i], sum);
    return sum;
  };
  sums[0] = finish(rows[0], a0, b0);
  sums[1] = finish(rows[1], a1, b1);
  sums[2] = finish(rows[2], a2, b2);
  sums[3] = finish(rows[3], a3, b3);
}

// MXFP4 and NVFP4: register tiles, with fp4_one_token for single tokens, up to gemm_pays_off.
template <class Row, typename MakeRow>
void fp4_rows(const LinearWeight& weight, const float* x, int64_t tokens, float* y, int64_t row_begin,
              int64_t row_end, const MakeRow& make_row) {
  const int64_t in = weight.in_features;
  const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
  if (gemm_pays_off(weight.format, tokens)) {
    gemm_rows<Row>(
        weight, x, tokens, y, row_begin, row_end, make_row,
        [&](int64_t r) { return reinterpret_cast<const char*>(codes + r * (in / 2)); }, 1);
    return;
  }
  register_rows<Row>(weight, x, tokens, y, row_begin, row_end, make_row, [&]<int R, int T>(int64_t r, const float* xt, float* sums) {
    Row rows[R];
    for (int k = 0; k < R; ++k) rows[k] = make_row(r + k);
    if constexpr (R == 4 && T == 1) {
      fp4_one_token(rows, in, xt, sums);
    } else {
      register_tile<Row, R, T>(rows, in, xt, in, sums);
    }
  });
}

}  // namespace

bool linear_avx2_needs_packed_x(WeightFormat format) {
  return format == WeightFormat::BF16 || format == WeightFormat::MXFP4 || format == WeightFormat::NVFP4;
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
    } else if (format == WeightFormat::MXFP4 || format == WeightFormat::NVFP4) {
      const uint8_t* order = format == WeightFormat::MXFP4 ? kMxfp4PackOrder.element : kNvfp4PackOrder.element;
      for (; i + 32 <= in; i += 32) {
        for (int p = 0; p < 32; ++p) dst[i + p] = src[i + order[p]];
      }
    }
    for (; i < in; ++i) dst[i] = src[i];
  }
}

void linear_avx2_rows(const LinearWeight& weight, const float* x_packed, int64_t tokens, float* y, int64_t row_begin,
                      int64_t row_end) {
  const int64_t in = weight.in_features;
  const char* data = static_cast<const char*>(weight.data);
  switch (weight.format) {
    case WeightFormat::F32: {
      const float* w = static_cast<const float*>(weight.data);
      dense_rows<F32Row>(
          weight, x_packed, tokens, y, row_begin, row_end, [&](int64_t r) { return F32Row{w + r * in}; },
          [&](int64_t r) { return data + r * in * 4; }, 8);
      return;
    }
    case WeightFormat::F16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data);
      dense_rows<F16Row>(
          weight, x_packed, tokens, y, row_begin, row_end, [&](int64_t r) { return F16Row{w + r * in}; },
          [&](int64_t r) { return data + r * in * 2; }, 4);
      return;
    }
    case WeightFormat::BF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data);
      dense_rows<BF16Row>(
          weight, x_packed, tokens, y, row_begin, row_end, [&](int64_t r) { return BF16Row{w + r * in}; },
          [&](int64_t r) { return data + r * in * 2; }, 4);
      return;
    }
    case WeightFormat::MXFP4: {
      const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
      fp4_rows<Mxfp4Row>(weight, x_packed, tokens, y, row_begin, row_end,
                         [&](int64_t r) { return Mxfp4Row{codes + r * (in / 2), weight.scales + r * (in / 32)}; });
      return;
    }
    case WeightFormat::NVFP4: {
      const uint8_t* codes = static_cast<const uint8_t*>(weight.data);
      fp4_rows<Nvfp4Row>(weight, x_packed, tokens, y, row_begin, row_end, [&](int64_t r) {
        return Nvfp4Row{codes + r * (in / 2), weight.scales + r * (in / 16), weight.global_scale};
      });
      return;
    }
    case WeightFormat::FP8: {
      const uint8_t* w = static_cast<const uint8_t*>(weight.data);
      dense_rows<Fp8Row>(
          weight, x_packed, tokens, y, row_begin, row_end,
          [&](int64_t r) { return Fp8Row{w + r * in, weight.row_scales[r] * 256.0f}; },
          [&](int64_t r) { return data + r * in; }, 2);
      return;
    }
  }
}

}  // namespace anvil::cpu
