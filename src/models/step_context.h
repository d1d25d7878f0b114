#pragma once
// What every architecture derives from a StepBatch before its layers run: absolute positions
// per row, the attention view of each sequence per KV group, and which rows need logits.
#include <vector>

#include "backend/cpu/ops.h"
#include "models/model.h"

namespace anvil {

struct StepContext {
  int64_t rows = 0;
  std::vector<int64_t> positions;                                    // per row
  std::vector<std::vector<cpu::AttentionSequence>> group_sequences;  // per KV group
  std::vector<int64_t> logit_rows;                                   // rows whose logits are wanted

  StepContext(const StepBatch& batch, const KvLayout& layout, const ModelConfig& config);

  // Copies the logit rows of x [rows, dim] into a dense [logit_rows, dim] buffer.
  std::vector<float> gather_logit_rows(const std::vector<float>& x, int64_t dim) const;
};

// A group of tokens routed to one expert, with each token's routing weight.
struct ExpertAssignment {
  std::vector<int64_t> rows;
  std::vector<float> weights;
};

}  // namespace anvil
