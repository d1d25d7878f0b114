#include "models/step_context.h"

#include <cstring>

#include "core/error.h"

namespace anvil {

StepContext::StepContext(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config) {
  rows = int64_t(batch.tokens.size());
  group_sequences.resize(size_t(layout.num_groups()));
  int64_t row = 0;
  for (const auto& seq : batch.sequences) {
    if (int(seq.block_tables.size()) != layout.num_groups())
      fail("step has {} block tables for a model with {} KV groups", seq.block_tables.size(), layout.num_groups());
    if (seq.num_tokens <= 0) fail("a sequence in a step has no tokens");
    for (int64_t t = 0; t < seq.num_tokens; ++t) {
      positions.push_back(seq.start_pos + t);
      if (seq.all_logits || (seq.need_logits && t == seq.num_tokens - 1)) logit_rows.push_back(row + t);
    }
    if (config.max_position_embeddings > 0 && seq.start_pos + seq.num_tokens > config.max_position_embeddings)
      fail("sequence length {} exceeds max_position_embeddings {}", seq.start_pos + seq.num_tokens,
           config.max_position_embeddings);
    for (int group = 0; group < layout.num_groups(); ++group)
      group_sequences[size_t(group)].push_back({row, seq.num_tokens, seq.start_pos, seq.block_tables[size_t(group)]});
    row += seq.num_tokens;
  }
  if (row != rows) fail("step lists {} tokens but its sequences cover {}", rows, row);
}

std::vector<float> StepContext::gather_logit_rows(const std::vector<float>& x, int64_t dim) const {
  std::vector<float> out(logit_rows.size() * size_t(dim));
  for (size_t i = 0; i < logit_rows.size(); ++i)
    std::memcpy(out.data() + i * size_t(dim), x.data() + logit_rows[i] * dim, size_t(dim) * sizeof(float));
  return out;
}

}  // namespace anvil
