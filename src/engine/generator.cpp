#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/kv_cache.h"

namespace anvil {

namespace {

using Clock = std::chrono::steady_clock;

void check_prompt(const Model& model, const std::vector<int32_t>& ids) {
  if (ids.empty()) fail("the prompt is empty");
  const int64_t vocab = model.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab) fail("prompt id {} at index {} is outside the vocabulary (size {})", ids[i], i, vocab);
}

// One sequence driven step by step through the model.
class SequenceRunner {
 public:
  static constexpr int64_t kBlockSize = 16;

  SequenceRunner(Model& model, int64_t max_length, int64_t chunk)
      : model_(model),
        chunk_(chunk),
        cache_(model.kv_layout(), kv_blocks_needed(model.kv_layout(), kBlockSize, max_length, chunk), kBlockSize) {}

  // Runs `ids` at the current position; writes logits for every token or only the last.
  void step(std::span<const int32_t> ids, bool all_logits, float* logits, bool need_logits = true) {
    cache_.trim_windows(kv_, position_);
    if (!cache_.grow(kv_, position_ + int64_t(ids.size()))) fail("KV cache is full at position {}", position_);
    StepBatch batch;
    batch.tokens.assign(ids.begin(), ids.end());
    SequenceStep seq;
    seq.start_pos = position_;
    seq.num_tokens = int64_t(ids.size());
    seq.block_tables = cache_.tables(kv_);
    seq.all_logits = all_logits;
    seq.need_logits = need_logits;
    batch.sequences.push_back(seq);
    model_.forward(batch, cache_.storage(), logits);
    position_ += int64_t(ids.size());
  }

  // Prefills ids in chunks; logits for every position (all_logits) or only the last.
  void prefill(const std::vector<int32_t>& ids, bool all_logits, float* logits) {
    const int64_t vocab = model_.config().vocab_size;
    for (size_t begin = 0; begin < ids.size(); begin += size_t(chunk_)) {
      const size_t end = std::min(ids.size(), begin + size_t(chunk_));
      const bool last_chunk = end == ids.size();
      float* out = all_logits ? logits + int64_t(begin) * vocab : logits;
      step(std::span<const int32_t>(ids.data() + begin, end - begin), all_logits, out, all_logits || last_chunk);
    }
  }

 private:
  Model& model_;
  int64_t chunk_;
  KvCache cache_;
  SequenceKv kv_;
  int64_t position_ = 0;
};

}  // namespace

std::vector<float> prompt_logits(Model& model, const std::vector<int32_t>& prompt_ids, int64_t chunk) {
  check_prompt(model, prompt_ids);
  SequenceRunner runner(model, int64_t(prompt_ids.size()), chunk);
  std::vector<float> logits(prompt_ids.size() * size_t(model.config().vocab_size));
  runner.prefill(prompt_ids, true, logits.data());
  return logits;
}

GenerateResult generate(Model& model, const GenerateRequest& request, const std::function<void(int32_t)>& on_token) {
  check_prompt(model, request.prompt_ids);
  if (request.max_tokens < 0) fail("max_tokens must be >= 0, got {}", request.max_tokens);
  if (request.prefill_chunk <= 0) fail("prefill chunk must be positive");
  const int64_t vocab = model.config().vocab_size;
  const int64_t max_length = int64_t(request.prompt_ids.size()) + request.max_tokens;
  if (model.config().max_position_embeddings > 0 && max_length > model.config().max_position_embeddings)
    fail("prompt ({} tokens) plus max_tokens ({}) exceeds the model's context of {} tokens",
         request.prompt_ids.size(), request.max_tokens, model.config().max_position_embeddings);

  GenerateResult result;
  result.finish_reason = "length";
  if (request.max_tokens == 0) return result;
  Sampler sampler(request.sampling);
  SequenceRunner runner(model, max_length, request.prefill_chunk);
  std::vector<float> logits(static_cast<size_t>(vocab));

  const auto prefill_start = Clock::now();
  runner.prefill(request.prompt_ids, false, logits.data());
  result.prefill_seconds = std::chrono::duration<double>(Clock::now() - prefill_start).count();

  const auto decode_start = Clock::now();
  for (;;) {
    const int32_t token = sampler.sample(logits.data(), vocab);
    result.output_ids.push_back(token);
    if (on_token) on_token(token);
    const bool is_eos = std::find(request.eos_token_ids.begin(), request.eos_token_ids.end(), token) !=
                        request.eos_token_ids.end();
    if (is_eos && !request.ignore_eos) {
      result.finish_reason = "stop";
      break;
    }
    if (int64_t(result.output_ids.size()) >= request.max_tokens) break;
    runner.step(std::span<const int32_t>(&token, 1), false, logits.data());
    ++result.decode_steps;
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - decode_start).count();
  return result;
}

}  // namespace anvil
