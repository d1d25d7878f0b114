// Sampling on the GPU: one block per logit row picks the token backend/sampling_rule.h defines,
// without sorting the vocabulary. The rank cut-offs (top-k by count, top-p by weight) are found
// by radix selection on the logits' order keys (12, 12, then 8 bits: three histogram passes over
// the row), ties inside one key value by an ordered scan of token ids, and the draw by an ordered
// scan of the kept weights in id order. Weights are integers, so every sum is exact and the
// result does not depend on how threads split the row: the same as the CPU's sequential loop.
// Passes over the row: 1 for the max, +3 (and a scan on a tie) per top-k or top-p, +1 for the
// kept total unless top-p already gave it (min-p off), and the draw's scan stops where it lands.
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/ops.h"
#include "backend/sampling_rule.h"

namespace anvil::cuda {

namespace {

namespace rule = ::anvil::sampling_rule;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 4;  // consecutive tokens per thread in an ordered scan
constexpr int kTile = kThreads * kItems;
constexpr int kMaxBins = 4096;
constexpr unsigned kFullMask = 0xffffffffu;

struct Shared {
  unsigned long long hist[kMaxBins];
  unsigned long long warp_total[kWarps];
  unsigned long long digit_before;
  int digit;
  long long found;
};

// The inverse of rule::order_key (NaN never occurs: it was cleaned to -inf).
__device__ float key_to_logit(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

struct Row {
  const float* logits;
  int64_t vocab;
  float max_logit, temperature;
  // Written exactly as the CPU's (l - max) / T, with the division correctly rounded.
  __device__ float probability(float logit) const {
    return expf(__fdiv_rn(rule::clean_logit(logit) - max_logit, temperature));
  }
};

// Tokens kept by a rank cut: keys above `key`, and of `key` itself the ids up to last_id.
struct Cut {
  uint32_t key = 0;  // below every real key: keeps everything
  int64_t last_id = 0;
  __device__ bool keeps(uint32_t k, int64_t id) const { return k > key || (k == key && id <= last_id); }
};

// Exclusive prefix sum over the block in thread order; total gets the block's sum.
__device__ uint64_t block_exclusive_scan(uint64_t value, uint64_t& total, Shared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) sh.warp_total[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    uint64_t warps_inclusive = sh.warp_total[lane];
    for (int offset = 1; offset < 32; offset *= 2) {
      const uint64_t other = __shfl_up_sync(kFullMask, warps_inclusive, offset);
      if (lane >= offset) warps_inclusive += other;
    }
    sh.warp_total[lane] = warps_inclusive;
  }
  __syncthreads();
  const uint64_t before_warp = warp > 0 ? sh.warp_total[warp - 1] : 0;
  total = sh.warp_total[kWarps - 1];
  __syncthreads();  // warp_total is reused by the next call
  return before_warp + inclusive - value;
}

__device__ uint64_t block_sum(uint64_t value, Shared& sh) {
  uint64_t total;
  block_exclusive_scan(value, total, sh);
  return total;
}

__device__ uint64_t block_max(uint64_t value, Shared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) value = max(value, __shfl_xor_sync(kFullMask, value, offset));
  if (lane == 0) sh.warp_total[warp] = value;
  __syncthreads();
  value = sh.warp_total[lane];
  for (int offset = 16; offset > 0; offset /= 2) value = max(value, __shfl_xor_sync(kFullMask, value, offset));
  __syncthreads();
  return value;
}

// The first token id, in ascending order, at which the running sum of amount(id) exceeds
// target; -1 if it never does. Tiles of kTile ids, each thread kItems consecutive ones.
template <typename Amount>
__device__ int64_t first_exceeding(int64_t vocab, uint64_t target, Amount amount, Shared& sh) {
  if (threadIdx.x == 0) sh.found = -1;  // read only after the scan's barriers
  uint64_t carry = 0;
  for (int64_t base = 0; base < vocab; base += kTile) {
    const int64_t first = base + int64_t(threadIdx.x) * kItems;
    uint64_t local[kItems], sum = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      local[j] = first + j < vocab ? amount(first + j) : 0;
      sum += local[j];
    }
    uint64_t tile_total;
    uint64_t running = carry + block_exclusive_scan(sum, tile_total, sh);
    if (running <= target && target < running + sum) {
      for (int j = 0; j < kItems; ++j) {
        running += local[j];
        if (running > target) {
          sh.found = first + j;
          break;
        }
      }
    }
    carry += tile_total;
    __syncthreads();
    if (sh.found >= 0) break;
  }
  const int64_t found = sh.found;
  __syncthreads();
  return found;
}

struct Selected {
  uint32_t key;        // the key at which the running amount reaches the target
  uint64_t before;     // the amount of the tokens above that key
  uint64_t remaining;  // what is still missing when that key's tokens begin
  uint64_t at_key;     // the amount all tokens of that key (inside `within`) carry
};

// Walking the tokens inside `within` by rank (key descending), where the running amount (1 per
// token, or its weight) first reaches target (>= 1, at most the total). Radix selection on the
// key: each pass histograms one digit of the keys that share the digits found so far. By weight,
// the target is ceil(top_p * total), the total taken from the first pass's histogram.
template <bool kByWeight>
__device__ Selected radix_select(const Row& row, const Cut& within, uint64_t target, float top_p, Shared& sh) {
  constexpr int kShift[3] = {20, 8, 0}, kDigitBits[3] = {12, 12, 8};
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  uint64_t at_key = 0, before = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass], bins = 1 << kDigitBits[pass];
    for (int b = threadIdx.x; b < bins; b += kThreads) sh.hist[b] = 0;
    if (threadIdx.x == 0) {
      sh.digit = 0;  // target never exceeds the total, so some thread overwrites these
      sh.digit_before = 0;
    }
    __syncthreads();
    for (int64_t base = 0; base < row.vocab; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      uint32_t key = 0;
      uint64_t amount = 0;
      if (i < row.vocab) {
        const float logit = row.logits[i];
        key = rule::order_key(logit);
        if ((key & mask) == prefix && within.keeps(key, i))
          amount = kByWeight ? rule::weight(row.probability(logit)) : 1;
      }
      // Lanes holding equal keys (masked -inf tails, ties) add once: equal keys, equal amounts.
      const unsigned active = __ballot_sync(kFullMask, amount != 0);
      if (amount != 0) {
        const unsigned peers = __match_any_sync(active, key);
        if (lane == __ffs(peers) - 1)
          atomicAdd(&sh.hist[(key >> shift) & uint32_t(bins - 1)],
                    static_cast<unsigned long long>(amount * uint64_t(__popc(peers))));
      }
    }
    __syncthreads();
    // Bins in descending order, `per` consecutive ones per thread, then a scan over threads.
    const int per = bins >= kThreads ? bins / kThreads : 1;
    const int first = threadIdx.x * per;
    uint64_t local = 0;
    for (int j = first; j < first + per && j < bins; ++j) local += sh.hist[bins - 1 - j];
    uint64_t total;
    uint64_t running = block_exclusive_scan(local, total, sh);
    if (kByWeight && pass == 0) target = rule::top_p_threshold(top_p, total);
    if (running < target && target <= running + local) {
      for (int j = first; j < first + per; ++j) {
        const uint64_t h = sh.hist[bins - 1 - j];
        if (running + h >= target) {
          sh.digit = bins - 1 - j;
          sh.digit_before = running;
          break;
        }
        running += h;
      }
    }
    __syncthreads();
    const int digit = sh.digit;
    target -= sh.digit_before;
    before += sh.digit_before;
    at_key = sh.hist[digit];
    prefix |= uint32_t(digit) << shift;
    mask |= uint32_t(bins - 1) << shift;
    __syncthreads();  // hist and digit are rewritten by the next pass
  }
  return {prefix, before, target, at_key};
}

// Narrows `cut` to the first `n` tokens (by id) of key `key` inside it, or keeps all of them.
__device__ Cut cut_inside_key(const Row& row, const Cut& cut, uint32_t key, uint64_t n, uint64_t count_at_key,
                              Shared& sh) {
  Cut narrowed{key, key == cut.key ? cut.last_id : row.vocab};
  if (n < count_at_key) {
    narrowed.last_id = first_exceeding(
        row.vocab, n - 1,
        [&](int64_t id) -> uint64_t {
          const uint32_t k = rule::order_key(row.logits[id]);
          return k == key && cut.keeps(k, id) ? 1 : 0;
        },
        sh);
  }
  return narrowed;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t vocab,
                                                          const RowSampling* params, int32_t* out) {
  __shared__ Shared sh;
  const RowSampling p = params[blockIdx.x];
  const float* x = logits + int64_t(blockIdx.x) * vocab;

  // The largest key, ties to the lowest id (its complement is larger).
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    best = max(best, (uint64_t(rule::order_key(x[i])) << 32) | (0xffffffffu - uint32_t(i)));
  best = block_max(best, sh);
  const int64_t argmax = int64_t(0xffffffffu - uint32_t(best));
  const float max_logit = rule::clean_logit(x[argmax]);
  if (p.temperature == 0.0f || p.top_k == 1 || !isfinite(max_logit)) {
    if (threadIdx.x == 0) out[blockIdx.x] = int32_t(argmax);
    return;
  }

  const Row row{x, vocab, max_logit, p.temperature};
  Cut cut{0, vocab};
  if (p.top_k > 0 && p.top_k < vocab) {
    const Selected s = radix_select<false>(row, cut, uint64_t(p.top_k), 1.0f, sh);
    cut = cut_inside_key(row, cut, s.key, s.remaining, s.at_key, sh);
  }
  uint64_t cut_weight = 0;  // the weight the cut keeps, when known without a pass
  if (p.top_p < 1.0f) {
    const Selected s = radix_select<true>(row, cut, 0, p.top_p, sh);
    // Every token of one key has the same weight, so the count needed follows from it.
    const uint64_t w = rule::weight(row.probability(key_to_logit(s.key)));
    const uint64_t n = (s.remaining + w - 1) / w;
    cut = cut_inside_key(row, cut, s.key, n, s.at_key / w, sh);
    cut_weight = s.before + n * w;
  }

  auto kept_weight = [&](int64_t id) -> uint64_t {
    const float logit = x[id];
    if (!cut.keeps(rule::order_key(logit), id)) return 0;
    const float probability = row.probability(logit);
    if (p.min_p > 0.0f && probability < p.min_p) return 0;
    return rule::weight(probability);
  };
  uint64_t total = cut_weight;
  if (total == 0 || p.min_p > 0.0f) {
    uint64_t local = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) local += kept_weight(i);
    total = block_sum(local, sh);
  }
  const int64_t token = first_exceeding(vocab, rule::draw_target(p.uniform, total), kept_weight, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = int32_t(token >= 0 ? token : argmax);
}

}  // namespace

void sample_rows(const float* logits, int64_t rows, int64_t vocab, const RowSampling* params, int32_t* out,
                 Stream stream) {
  if (rows <= 0) return;
  sample_kernel<<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(logits, vocab, params, out);
  ANVIL_CUDA_LAUNCHED();
}

}  // namespace anvil::cuda
