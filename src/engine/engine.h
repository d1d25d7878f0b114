#pragma once
// The serving engine: one thread owns the scheduler, the paged KV cache and the model. Requests
// arrive from any thread; each step admits work, schedules a batch (chunked prefills and decodes
// together), runs the model once, samples, and reports new tokens through each request's
// callback. A cancelled request stops at the next step and its blocks are freed.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/sampler.h"
#include "models/model.h"

namespace anvil {

struct EngineConfig {
  int64_t max_num_seqs = 64;             // sequences running at once
  int64_t max_num_batched_tokens = 2048;  // tokens per step (prefill chunks + decodes)
  int64_t max_model_len = 0;             // 0 = the model's max_position_embeddings
  size_t kv_cache_bytes = size_t(2) << 30;  // CPU; on a GPU only when kv_cache_bytes_set
  bool kv_cache_bytes_set = false;
  // GPU: the share of the device's memory this engine may hold (weights, activations and KV
  // cache); the KV cache gets what is left after the weights (vLLM's meaning).
  double gpu_memory_utilization = 0.9;
  std::vector<int64_t> kv_blocks_per_group;  // when set, exact pool sizes instead of kv_cache_bytes
  int64_t block_size = 16;
  bool enable_prefix_caching = true;
  int64_t max_waiting = 1024;  // queue bound; submit() fails beyond it
};

// Device memory the engine leaves free beside the weights and the KV cache for one step's
// activations, logits and workspaces: 1 GiB plus 64 KiB per token of the step's batch. `anvil
// plan` sizes the KV cache with the same figure.
size_t gpu_activation_reserve_bytes(int64_t max_num_batched_tokens);

struct RequestParams {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;  // EOS and stop ids are masked until this many tokens
  bool ignore_eos = false;
  std::vector<int32_t> eos_token_ids;   // the model's (generation_config)
  std::vector<int32_t> stop_token_ids;  // more ids that end the request (e.g. harmony <|call|>)
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  int top_logprobs = -1;  // -1 = no logprobs; 0..20 = chosen token's logprob plus that many
  std::shared_ptr<TokenConstraint> constraint;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct GeneratedToken {
  int32_t token = 0;
  float logprob = 0.0f;                   // when logprobs were asked for
  std::vector<TokenLogprob> top_logprobs;
};

struct RequestOutput {
  std::vector<GeneratedToken> tokens;  // new this step
  bool finished = false;
  std::string finish_reason;  // "stop", "length", "abort" or "error"
  std::optional<int32_t> stop_token;  // the EOS/stop id that ended it, when one did
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // served from the prefix cache
  std::string error;
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  double kv_usage = 0.0;  // fraction of KV blocks in use
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
  int64_t preemptions_total = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

class Engine {
 public:
  Engine(std::unique_ptr<Model> model, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return *model_; }
  const EngineConfig& config() const { return config_; }
  int64_t max_model_len() const;

  // Thread-safe. Validates (prompt length, ids, parameters) and queues the request; throws
  // anvil::Error with a one-line reason when it cannot be accepted (the server answers 400, or
  // 503 when the queue is full: see QueueFullError). on_output runs on the engine thread and
  // must not block; the last call has finished = true.
  uint64_t submit(RequestParams params, OutputCallback on_output);
  // Thread-safe; a finished or unknown id is ignored.
  void cancel(uint64_t request_id);
  EngineStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Model> model_;
  EngineConfig config_;
  std::unique_ptr<Impl> impl_;
};

// Thrown by submit() when max_waiting requests are already queued.
class QueueFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace anvil
