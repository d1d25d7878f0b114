#pragma once
// Generation for one sequence: chunked prefill, then decode until a stop token or the token
// budget. The server's batching scheduler builds on the same KV cache and model step.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "models/model.h"

namespace anvil {

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::vector<int32_t> eos_token_ids;
  int64_t prefill_chunk = 512;
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::string finish_reason;  // "stop" or "length"
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int64_t decode_steps = 0;   // steps timed in decode_seconds (the first token comes from prefill)
};

// on_token is called with each generated token as soon as it is sampled.
GenerateResult generate(Model& model, const GenerateRequest& request,
                        const std::function<void(int32_t)>& on_token = nullptr);

// Logits [prompt length, vocab] at every prompt position, prefilled in chunks.
std::vector<float> prompt_logits(Model& model, const std::vector<int32_t>& prompt_ids, int64_t chunk = 512);

}  // namespace anvil
