#pragma once
// The MoE's tensor-core path (prefill: many tokens per expert). A grouped GEMM over row tiles of
// the expert-sorted activations: block (tile, n) multiplies kBM sorted rows of one expert by a
// 128-row slice of that expert's MXFP4, NVFP4 or FP8 matrix. Activations (bf16, columns
// pre-permuted, see mxfp4_common.cuh) and raw weight bytes flow through a multi-stage cp.async
// pipeline; each warp decodes its own weight fragments from shared memory into registers (W4A16,
// W8A16) and feeds mma.sync m16n8k16. Shared memory stays under SM120's 99 KB.
#include <type_traits>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/fp8_layout.h"
#include "backend/cuda/gemm_common.cuh"
#include "backend/cuda/mxfp4_common.cuh"
#include "backend/cuda/moe_common.cuh"

namespace anvil::cuda::moe {

template <int kBM_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocks_>
struct MoeGemmConfig {
  static constexpr int kBM = kBM_, kBN = 128, kBK = 64, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
  static constexpr int kMTiles = kWarpM / 16, kNTiles = kWarpN / 8;
  static constexpr int kABytes = kBM * kBK * 2;  // one stage of activations, 128-byte rows
  // One stage of weight codes: 32-byte rows of FP4, 64-byte rows of FP8, 128-byte rows of bf16.
  template <Kind K>
  static constexpr int kBBytes = K == Kind::Bf16 ? kBN * kBK * 2 : kBN * kBK / (K == Kind::Fp8 ? 1 : 2);
  template <Kind K>
  static constexpr int kStageBytes = kABytes + kBBytes<K>;
  static_assert(kThreads == 256 && kWarpM % 16 == 0 && kWarpN % 8 == 0, "8 warps tile the block");
  // Plus the block's scales for all of K, bytes kBN * K/32 (MXFP4) or kBN * K/16 (NVFP4), rounded
  // to 16 (FP8 has row scales only, bf16 none).
  static size_t smem_bytes(int k, Kind kind) {
    const int scale_cols = kind == Kind::Fp8 || kind == Kind::Bf16 ? 0
                           : kind == Kind::Nvfp4                   ? k / 16
                                                                   : mxfp4::f16_scale_row_bytes(k);
    const int stage = kind == Kind::Bf16  ? kStageBytes<Kind::Bf16>
                      : kind == Kind::Fp8 ? kStageBytes<Kind::Fp8>
                                          : kStageBytes<Kind::Mxfp4>;
    return size_t(kStages) * stage + size_t((kBN * scale_cols + 15) / 16 * 16);
  }
};

// Where the GEMM's activations keep physical k (0..63) of a 64-wide tile: MXFP4's layout pairs
// adjacent codes (mxfp4_f16_layout.h), the other kinds' pair codes four apart (mxfp4_common.cuh).
template <Kind kKind>
__host__ __device__ constexpr int prefill_column(int physical) {
  return kKind == Kind::Mxfp4 ? mxfp4::f16_prefill_logical_column(physical) : mxfp4::prefill_logical_column(physical);
}

// Largest K the per-block scale table allows (keeps shared memory under 99 KB at kBM = 128 with
// NVFP4's table).
constexpr int kMoeGemmMaxK = 4096;

// kKind: MXFP4 (an E8M0 scale per 32 codes, mxfp4_f16_layout.h: a k tile is half of each row's
// 64-byte chunk, lane quad t's 8 bytes of it one word of each of the tile's two blocks); NVFP4 (an
// E4M3 scale per 16 codes, which is exactly one lane quad's bytes of a k tile, and the row's global
// scale on the sum); FP8 (16 bytes per lane quad and k tile, in the expert layout of fp8_layout.h,
// and a row scale on the sum).
template <typename Cfg, bool kGateUp, Kind kKind>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    moe_gemm_kernel(ExpertProduct p, Routing r) {
  wait_for_predecessor();
  release_dependents();
  constexpr int kBM = Cfg::kBM;
  constexpr bool kNv = kKind == Kind::Nvfp4, kFp8 = kKind == Kind::Fp8, kBf16 = kKind == Kind::Bf16;
  constexpr bool kMx = kKind == Kind::Mxfp4;
  constexpr int kStageBytes = Cfg::template kStageBytes<kKind>;
  constexpr int kRowBytes = kBf16 ? Cfg::kBK * 2 : Cfg::kBK / (kFp8 ? 1 : 2);  // of one weight row per k tile
  using namespace gemm;
  using namespace mxfp4;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tile = blockIdx.x;
  if (tile >= r.header[kNumTiles]) return;  // whole block, before any barrier
  const int expert = r.tile_expert[tile];
  const int row_begin = r.tile_row[tile];
  const int rows = min(kBM, r.offsets[expert + 1] - row_begin);
  const int n0 = blockIdx.y * Cfg::kBN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  const int g = lane / 4, t = lane % 4;
  const int scale_cols = kFp8 || kBf16 ? 0 : kNv ? p.k / 16 : f16_scale_row_bytes(p.k);
  const int k_tiles = p.k / Cfg::kBK;

  // The block's scales for every k: [kBN][scale_cols] bytes, behind the pipeline stages. Plain
  // loads; the first barrier of the main loop publishes them.
  uint8_t* scale_table = smem + Cfg::kStages * kStageBytes;
  {
    const int valid_rows = min(Cfg::kBN, p.n - n0);
    const uint8_t* src = p.scales + (int64_t(expert) * p.n + n0) * scale_cols;
    const int total = Cfg::kBN * scale_cols, valid = valid_rows * scale_cols;
    for (int i = tid; i < total; i += Cfg::kThreads) scale_table[i] = i < valid ? __ldg(src + i) : uint8_t(0);
  }

  // Loads: activations kBM rows x 8 chunks, weights kBN rows x 2 chunks per stage.
  constexpr int kALoads = kBM * 8 / Cfg::kThreads;
  const int a_chunk = tid % 8;
  const uint16_t* a_src[kALoads];
  bool a_ok[kALoads];
  uint32_t a_dst[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int row = (tid + i * Cfg::kThreads) / 8;
    a_ok[i] = row < rows;
    a_src[i] = p.a + int64_t(row_begin + (a_ok[i] ? row : 0)) * p.k + a_chunk * 8;
    a_dst[i] = uint32_t(row * 128 + swizzle<8>(row, a_chunk) * 16);
  }
  // Weights: two threads per row, each copying kBLoads 16-byte chunks (a row is 32 bytes of FP4 or
  // 64 of FP8 per k tile). MXFP4's 32 bytes of a k tile are the four lane quads' 8-byte halves of
  // the row's chunk kt / 2 (half kt % 2); each thread copies two of them, to bytes 8t of the row.
  static_assert(Cfg::kBN * 2 == Cfg::kThreads, "two threads per weight row");
  constexpr int kBLoads = kRowBytes / 32;
  const int b_row = tid / 2, b_part = tid % 2;
  const bool b_ok = n0 + b_row < p.n;
  // MXFP4 rows lie in 16-row tiles, a row's chunks kF16ChunkStride apart (mxfp4_f16_layout.h).
  const int64_t b_row_bytes = int64_t(p.k) * kRowBytes / Cfg::kBK;
  const int64_t b_matrix_row = int64_t(expert) * p.n + n0 + (b_ok ? b_row : 0);
  const uint8_t* b_src = p.blocks + (kMx ? f16_piece_offset(b_matrix_row, 0, f16_chunks(p.k)) + b_part * 32
                                         : b_matrix_row * b_row_bytes + b_part * 16 * kBLoads);
  const uint32_t b_dst = uint32_t(Cfg::kABytes + b_row * kRowBytes + b_part * 16 * kBLoads);

  const uint32_t smem_base = smem_u32(smem);
  auto load_stage = [&](int stage, int kt) {
    const uint32_t base = smem_base + uint32_t(stage * kStageBytes);
#pragma unroll
    for (int i = 0; i < kALoads; ++i) cp_async_16(base + a_dst[i], a_ok[i] ? a_src[i] + kt * Cfg::kBK : p.a, a_ok[i]);
    if constexpr (kMx) {
      const uint8_t* from = b_src + (kt / 2) * kF16ChunkStride + (kt % 2) * 8;  // lane quads 2 b_part, 2 b_part + 1
      cp_async_8(base + b_dst, b_ok ? from : p.blocks, b_ok);
      cp_async_8(base + b_dst + 8, b_ok ? from + 16 : p.blocks, b_ok);
    } else {
#pragma unroll
      for (int i = 0; i < kBLoads; ++i)
        cp_async_16(base + b_dst + 16 * i, b_ok ? b_src + kt * kRowBytes + 16 * i : p.blocks, b_ok);
    }
  };

  float acc[Cfg::kMTiles][Cfg::kNTiles][4] = {};

#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  const int a_row = warp_m * Cfg::kWarpM + (lane % 16), a_sub = lane / 16;
  // Weight rows of this lane: warp_n * kWarpN + nt * 8 + g.
  const int w_row0 = warp_n * Cfg::kWarpN + g;

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();
    if (kt + Cfg::kStages - 1 < k_tiles) load_stage((kt + Cfg::kStages - 1) % Cfg::kStages, kt + Cfg::kStages - 1);
    cp_async_commit();

    const int stage = kt % Cfg::kStages;
    const uint8_t* b_tile = smem + stage * kStageBytes + Cfg::kABytes;
    const uint32_t a_base = smem_base + uint32_t(stage * kStageBytes);

    // This lane's weight bytes for the k tile: codes 16t..16t+15 of each of its rows, 8 bytes of
    // FP4 (one NVFP4 scale block, half an MXFP4 one), 16 of FP8 or 32 of bf16 (its eight pairs).
    uint4 words[Cfg::kNTiles], words_hi[Cfg::kNTiles];
    uint32_t scale[Cfg::kNTiles];
    bool any_big = false;
#pragma unroll
    for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
      const int row = w_row0 + nt * 8;
      words_hi[nt] = make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kBf16) {
        words[nt] = *reinterpret_cast<const uint4*>(b_tile + row * kRowBytes + t * 32);
        words_hi[nt] = *reinterpret_cast<const uint4*>(b_tile + row * kRowBytes + t * 32 + 16);
        scale[nt] = 0;
      } else if constexpr (kFp8) {
        words[nt] = *reinterpret_cast<const uint4*>(b_tile + row * kRowBytes + t * 16);
        scale[nt] = 0;
      } else {
        const uint2 w2 = *reinterpret_cast<const uint2*>(b_tile + row * kRowBytes + t * 8);
        words[nt] = make_uint4(w2.x, w2.y, 0u, 0u);
        // MXFP4: words x and y are blocks 2kt and 2kt + 1, a scale each (low byte: x's).
        scale[nt] = kNv ? scale_table[row * scale_cols + 4 * kt + t]
                        : *reinterpret_cast<const uint16_t*>(scale_table + row * scale_cols + 2 * kt);
      }
      any_big |= kMx && (scale[nt] & 0xFFu) > 128;
      any_big |= kMx && (scale[nt] >> 8) > 128;
    }
    // k16 step s takes pairs P[2s], P[2s+1] (P[j] = word j/4, pair j%4), decoded just before use
    // so the decode of one step overlaps the products of the previous.
    auto steps = [&](auto big_tag) {
      [[maybe_unused]] constexpr bool kBig = decltype(big_tag)::value && kMx;
      // [nt][0] for words x (steps 0-1), [1] for y (steps 2-3): different only for MXFP4.
      uint32_t mul[Cfg::kNTiles][2], high[Cfg::kNTiles][2];
#pragma unroll
      for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const uint32_t s = kMx ? (scale[nt] >> (8 * q)) & 0xFFu : scale[nt];
          mul[nt][q] = kNv ? nvfp4_multiplier(s) : kFp8 || kBf16 ? fp8::kRawToValue : scale_multiplier(s);
          high[nt][q] = scale_multiplier_high(s);
        }
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t a[Cfg::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
          const int row = a_row + mt * 16;
          ldmatrix_x4(a_base + uint32_t(row * 128 + swizzle<8>(row, 2 * ks + a_sub) * 16), a[mt][0], a[mt][1],
                      a[mt][2], a[mt][3]);
        }
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
          uint32_t b0, b1;
          if constexpr (kBf16) {  // pairs 2ks and 2ks+1 are stored as they are
            const uint4& half = ks < 2 ? words[nt] : words_hi[nt];
            b0 = ks % 2 == 0 ? half.x : half.z;
            b1 = ks % 2 == 0 ? half.y : half.w;
          } else if constexpr (kFp8) {  // word ks: pairs 2ks (low) and 2ks+1 (high)
            const uint32_t word = ks == 0 ? words[nt].x : ks == 1 ? words[nt].y : ks == 2 ? words[nt].z : words[nt].w;
            b0 = bf16x2_mul(fp8::low_pair_raw(word), mul[nt][0]);
            b1 = bf16x2_mul(fp8::high_pair_raw(word), mul[nt][0]);
          } else if constexpr (kMx) {  // step 2a + b: word a's pairs 2b, 2b + 1 (mxfp4_f16_layout.h)
            const uint32_t word = ks < 2 ? words[nt].x : words[nt].y;
            b0 = decode_f16_layout_pair<kBig>(word, 2 * (ks % 2), mul[nt][ks / 2], high[nt][ks / 2]);
            b1 = decode_f16_layout_pair<kBig>(word, 2 * (ks % 2) + 1, mul[nt][ks / 2], high[nt][ks / 2]);
          } else {
            const uint32_t word = ks < 2 ? words[nt].x : words[nt].y;
            b0 = decode_pair<false>(word, 2 * (ks % 2), mul[nt][0], 0u);
            b1 = decode_pair<false>(word, 2 * (ks % 2) + 1, mul[nt][0], 0u);
          }
#pragma unroll
          for (int mt = 0; mt < Cfg::kMTiles; ++mt)
            mma_bf16_16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
        }
      }
    };
    // MXFP4 scales above 128 need a second multiply; the vote keeps the branch warp-uniform.
    if (kKind == Kind::Mxfp4 && __any_sync(0xffffffffu, any_big))
      steps(std::true_type{});
    else
      steps(std::false_type{});
  }
  cp_async_wait<0>();

  // acc[mt][nt] = {D[r][c], D[r][c+1], D[r+8][c], D[r+8][c+1]}: rows are sorted positions,
  // columns weight rows c = n0 + warp_n * kWarpN + nt * 8 + 2t (even: a gate/up pair for gate_up).
  // NVFP4 pairs are value · 2^-9 (times the row's global scale); FP8 rows have a scale each.
  constexpr float kPairScale = kNv ? 512.0f : 1.0f;
#pragma unroll
  for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
    const int col = n0 + warp_n * Cfg::kWarpN + nt * 8 + 2 * t;
    if (col >= p.n) continue;  // N is even, so col + 1 < N too
    const int64_t at = int64_t(expert) * p.n + col;
    const float bias0 = p.bias ? p.bias[at] : 0.0f, bias1 = p.bias ? p.bias[at + 1] : 0.0f;
    const float scale0 = kNv || kFp8 ? p.row_scales[at] * kPairScale : 1.0f;
    const float scale1 = kNv || kFp8 ? p.row_scales[at + 1] * kPairScale : 1.0f;
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m * Cfg::kWarpM + mt * 16 + g + half * 8;
        if (row >= rows) continue;
        const float v0 = (kNv || kFp8 ? acc[mt][nt][2 * half] * scale0 : acc[mt][nt][2 * half]) + bias0;
        const float v1 = (kNv || kFp8 ? acc[mt][nt][2 * half + 1] * scale1 : acc[mt][nt][2 * half + 1]) + bias1;
        const int64_t position = row_begin + row;
        if constexpr (kGateUp) {
          const int j = col / 2, width = p.n / 2;
          const int column = (j & ~63) + prefill_column<kKind>(j & 63);
          p.act[position * width + column] = to_bf16_bits(gated(v0, v1, p.silu, p.limit, p.alpha));
        } else {
          const int64_t slot = r.sorted_slot[position];
          *reinterpret_cast<float2*>(p.out + slot * p.n + col) = make_float2(v0, v1);
        }
      }
    }
  }
}

// Prefill input: the sorted rows of h with each 64-column group in the GEMM's logical k order
// (kMx: MXFP4's, mxfp4_f16_layout.h; else the other kinds', mxfp4_common.cuh).
// One block per sorted row: the row is read coalesced into shared memory, then each thread
// assembles 16-byte output chunks from it. Dynamic shared memory: hidden * 2 bytes.
template <bool kMx>
__global__ void __launch_bounds__(256)
    moe_gather_permute_kernel(const uint16_t* __restrict__ h, Routing r, int top_k, int hidden,
                              uint16_t* __restrict__ out) {
  wait_for_predecessor();
  release_dependents();
  extern __shared__ uint4 row_chunks[];
  const int64_t position = blockIdx.x;
  if (position >= r.header[kTotalSlots]) return;  // whole block
  const int64_t token = r.sorted_slot[position] / top_k;
  const int chunks = hidden / 8;
  const uint4* src = reinterpret_cast<const uint4*>(h + token * hidden);
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) row_chunks[i] = __ldg(src + i);
  __syncthreads();
  const uint32_t* words = reinterpret_cast<const uint32_t*>(row_chunks);
  uint4* dst = reinterpret_cast<uint4*>(out + position * hidden);
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
    // Output chunk q of a group holds output words 4q + e = 16a + 8b + 4h + e (t = e): logical
    // columns 32a + 16b + 8h + 2e + {0, 1}, i.e. physical k = 16e + 8a + 2b + h + {0, 4}: half h
    // of input words 8e + 4a + b and that + 2 (mxfp4_common.cuh).
    const int group = i / 8, q = i % 8;
    const int a = q >> 2, b = (q >> 1) & 1, half = q & 1;
    if constexpr (kMx) {
      // Output chunk q holds logical columns 8q + 2e + {0, 1} (e = t): physical k
      // 32a + 8e + 4b + 2h + {0, 1}, i.e. input word 16a + 4e + 2b + h, whole.
      const uint32_t* in = words + group * 32 + 16 * a + 2 * b + half;
      dst[i] = make_uint4(in[0], in[4], in[8], in[12]);
      continue;
    }
    const uint32_t* in = words + group * 32 + 4 * a + b;
    const uint32_t selector = half ? 0x7632 : 0x5410;
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = __byte_perm(in[8 * e], in[8 * e + 2], selector);
    dst[i] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace anvil::cuda::moe
