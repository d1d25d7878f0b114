#include "backend/sampling_rule.h"

#include <algorithm>
#include <cmath>

namespace anvil {

namespace rule = sampling_rule;

int32_t sample_row(const float* logits, int64_t vocab, const RowSampling& row,
                   std::vector<std::pair<float, int32_t>>* scratch) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (rule::clean_logit(logits[i]) > rule::clean_logit(logits[best])) best = i;
  const float max_logit = rule::clean_logit(logits[best]);
  if (row.temperature == 0.0f || row.top_k == 1 || !std::isfinite(max_logit)) return int32_t(best);

  const float temperature = row.temperature;
  auto probability = [&](float logit) { return std::exp((rule::clean_logit(logit) - max_logit) / temperature); };
  std::vector<std::pair<float, int32_t>> local;
  auto& kept = scratch ? *scratch : local;  // (logit, id)
  kept.clear();

  const bool top_k = row.top_k > 0 && row.top_k < vocab, top_p = row.top_p < 1.0f;
  if (top_k || top_p) {
    kept.resize(size_t(vocab));
    for (int64_t i = 0; i < vocab; ++i) kept[size_t(i)] = {rule::clean_logit(logits[i]), int32_t(i)};
    auto by_rank = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    if (top_k) {
      std::partial_sort(kept.begin(), kept.begin() + row.top_k, kept.end(), by_rank);
      kept.resize(size_t(row.top_k));
    } else {
      std::sort(kept.begin(), kept.end(), by_rank);
    }
    if (top_p) {
      uint64_t total = 0;
      for (const auto& c : kept) total += rule::weight(probability(c.first));
      const uint64_t threshold = rule::top_p_threshold(row.top_p, total);
      uint64_t running = 0;
      size_t cut = 0;
      while (cut < kept.size() && running < threshold) running += rule::weight(probability(kept[cut++].first));
      kept.resize(cut);
    }
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  } else {
    kept.resize(size_t(vocab));
    for (int64_t i = 0; i < vocab; ++i) kept[size_t(i)] = {logits[i], int32_t(i)};
  }
  if (row.min_p > 0.0f) std::erase_if(kept, [&](const auto& c) { return probability(c.first) < row.min_p; });

  // Weights are recomputed rather than stored: exp is cheap next to the sorts above, and the
  // candidates stay (logit, id) pairs.
  uint64_t total = 0;
  for (const auto& c : kept) total += rule::weight(probability(c.first));
  const uint64_t target = rule::draw_target(row.uniform, total);
  uint64_t running = 0;
  for (const auto& c : kept) {
    running += rule::weight(probability(c.first));
    if (running > target) return c.second;
  }
  return int32_t(best);  // unreachable: the top token is always kept with weight 2^44
}

}  // namespace anvil
