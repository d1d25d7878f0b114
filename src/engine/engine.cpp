#include "engine/engine.h"

#include "backend/cuda/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "engine/kv_cache.h"

namespace anvil {

namespace {

struct Sequence {
  uint64_t id = 0;
  RequestParams params;
  OutputCallback callback;
  std::vector<int32_t> tokens;  // prompt, then generated
  int64_t prompt_length = 0;
  int64_t computed = 0;  // leading tokens whose KV is in the cache
  int64_t cached_prompt_tokens = 0;
  SequenceKv kv;
  std::unique_ptr<Sampler> sampler;
  std::unordered_map<int32_t, int> output_counts;  // for presence/frequency penalties
  bool reported_prompt = false;

  int64_t generated() const { return int64_t(tokens.size()) - prompt_length; }
};

}  // namespace

size_t gpu_activation_reserve_bytes(int64_t max_num_batched_tokens) {
  return (size_t(1) << 30) + size_t(std::max<int64_t>(max_num_batched_tokens, 0)) * (size_t(1) << 16);
}

namespace {

// Blocks for each KV group out of a byte budget. Sliding-window groups need only their window
// per running sequence plus one step's chunk; full-attention groups get everything else, and at
// least half the budget (sliding groups past that preempt like any other shortage).
std::vector<int64_t> split_kv_budget(const KvLayout& layout, EngineConfig config) {
  if (!config.kv_blocks_per_group.empty()) return config.kv_blocks_per_group;
  if (layout.device == KvDevice::Cuda && !config.kv_cache_bytes_set) {
    // Leave room for one step's activations and logits beside the weights already loaded.
    const size_t total = cuda::device_total_memory(), used = total - cuda::device_free_memory();
    const size_t reserve = gpu_activation_reserve_bytes(config.max_num_batched_tokens);
    const double allowed = double(total) * config.gpu_memory_utilization;
    if (allowed <= double(used + reserve))
      fail("--gpu-memory-utilization {} leaves no room for a KV cache: {:.1f} GiB of {:.1f} GiB are in use after "
           "loading the weights",
           config.gpu_memory_utilization, double(used) / (1 << 30), double(total) / (1 << 30));
    config.kv_cache_bytes = size_t(allowed) - used - reserve;
  }
  std::vector<int64_t> blocks(size_t(layout.num_groups()), 0);
  size_t remaining = config.kv_cache_bytes;
  const bool has_full_group = layout.group_layers[0] > 0;
  for (int group = 0; group < layout.num_groups(); ++group) {
    const int64_t window = layout.group_window[size_t(group)];
    if (window <= 0) continue;
    const int64_t per_sequence = (window + config.block_size - 1) / config.block_size + 2;
    KvGroupShape shape{layout.group_layers[size_t(group)], 0, config.block_size, layout.kv_heads, layout.head_dim,
                       layout.device, layout.dtype};
    const size_t per_block = KvGroupStorage::bytes_per_block(shape);
    const size_t cap = (has_full_group ? config.kv_cache_bytes / 2 : config.kv_cache_bytes) / per_block;
    blocks[size_t(group)] = std::min<int64_t>(int64_t(cap), config.max_num_seqs * per_sequence +
                                                                 (config.max_num_batched_tokens + config.block_size - 1) /
                                                                     config.block_size);
    const size_t bytes = size_t(blocks[size_t(group)]) * per_block;
    remaining = bytes < remaining ? remaining - bytes : 0;
  }
  for (int group = 0; group < layout.num_groups(); ++group) {
    if (layout.group_window[size_t(group)] > 0 || layout.group_layers[size_t(group)] == 0) continue;
    KvGroupShape shape{layout.group_layers[size_t(group)], 0, config.block_size, layout.kv_heads, layout.head_dim,
                       layout.device, layout.dtype};
    blocks[size_t(group)] = int64_t(remaining / KvGroupStorage::bytes_per_block(shape));
  }
  return blocks;
}

float log_sum_exp(const float* logits, int64_t n) {
  const float max_value = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i] - max_value));
  return max_value + float(std::log(sum));
}

}  // namespace

struct Engine::Impl {
  Impl(Engine& engine_ref, const EngineConfig& config)
      : engine(engine_ref),
        cache(engine_ref.model_->kv_layout(), split_kv_budget(engine_ref.model_->kv_layout(), config), config.block_size) {
    for (int group = 0; group < cache.layout().num_groups(); ++group)
      if (cache.total_blocks(group) * config.block_size < config.block_size * 2)
        fail("the KV cache is too small (--kv-cache-memory / --gpu-memory-utilization): KV group {} gets {} blocks",
             group, cache.total_blocks(group));
    worker = std::thread([this] { loop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    worker.join();
  }

  Engine& engine;
  KvCache cache;
  std::thread worker;
  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  uint64_t next_id = 1;
  std::deque<std::unique_ptr<Sequence>> incoming;  // submitted, not yet seen by the engine thread
  std::unordered_set<uint64_t> cancelled;
  EngineStats published;

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;
  // Counters read live by stats(): a client that just got its answer must see them counted.
  std::atomic<int64_t> prompt_tokens_total{0}, generation_tokens_total{0};
  std::atomic<int64_t> prefix_cache_queries{0}, prefix_cache_hits{0}, preemptions_total{0};

  void loop() {
    std::vector<float> logits;
    for (;;) {
      std::unordered_set<uint64_t> to_cancel;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stopping || !incoming.empty() || !running.empty() || !waiting.empty(); });
        if (stopping) return;
        while (!incoming.empty()) {
          waiting.push_back(std::move(incoming.front()));
          incoming.pop_front();
        }
        to_cancel.swap(cancelled);
      }
      // Callbacks run without the lock: they may call back into the engine.
      apply_cancellations(to_cancel);
      try {
        step(logits);
      } catch (const std::exception& error) {
        fail_all(error.what());
      }
      publish_stats();
    }
  }

  void apply_cancellations(const std::unordered_set<uint64_t>& ids) {
    if (ids.empty()) return;  // ids not found have already finished
    auto finish_cancelled = [&](std::unique_ptr<Sequence>& seq) {
      if (!seq || !ids.count(seq->id)) return false;
      cache.release(seq->kv);
      RequestOutput out;
      out.finished = true;
      out.finish_reason = "abort";
      out.prompt_tokens = seq->prompt_length;
      seq->callback(out);
      return true;
    };
    std::erase_if(running, finish_cancelled);
    std::erase_if(waiting, finish_cancelled);
  }

  void fail_all(const std::string& message) {
    auto fail_one = [&](std::unique_ptr<Sequence>& seq) {
      cache.release(seq->kv);
      RequestOutput out;
      out.finished = true;
      out.finish_reason = "error";
      out.error = message;
      seq->callback(out);
      return true;
    };
    std::erase_if(running, fail_one);
    std::erase_if(waiting, fail_one);
  }

  // Takes the sequence's blocks back and queues it to recompute from scratch (its generated
  // tokens become part of what it prefills).
  void preempt(std::unique_ptr<Sequence> seq) {
    cache.release(seq->kv);
    seq->computed = 0;
    ++preemptions_total;
    waiting.push_front(std::move(seq));
  }

  enum class Reserved { Ok, SelfPreempted, Impossible };

  // Makes sure running sequence `seq` has blocks for `new_tokens` more positions, preempting the
  // newest running sequences (which are not scheduled yet: the schedule goes oldest first) when
  // the pool is short. When `seq` is itself the newest it goes back to the queue.
  Reserved reserve(Sequence& seq, int64_t new_tokens) {
    cache.trim_windows(seq.kv, seq.computed);
    while (!cache.grow(seq.kv, seq.computed + new_tokens)) {
      if (running.back().get() == &seq) {
        if (running.size() == 1) return Reserved::Impossible;
        auto self = std::move(running.back());
        running.pop_back();
        preempt(std::move(self));
        return Reserved::SelfPreempted;
      }
      auto victim = std::move(running.back());
      running.pop_back();
      preempt(std::move(victim));
    }
    return Reserved::Ok;
  }

  struct Scheduled {
    Sequence* seq;
    int64_t num_tokens;
  };

  void step(std::vector<float>& logits) {
    const EngineConfig& config = engine.config_;
    int64_t budget = config.max_num_batched_tokens;
    std::vector<Scheduled> plan;

    // Running sequences first (decodes and unfinished prefills), oldest first.
    for (size_t i = 0; i < running.size() && budget > 0;) {
      Sequence& seq = *running[i];
      const int64_t n = std::min<int64_t>(int64_t(seq.tokens.size()) - seq.computed, budget);
      const Reserved reserved = reserve(seq, n);
      if (reserved == Reserved::Impossible) {
        finish_with_error(running[i], "the KV cache cannot hold this sequence; raise --kv-cache-memory");
        running.erase(running.begin() + long(i));
        continue;
      }
      if (reserved == Reserved::SelfPreempted) break;
      plan.push_back({&seq, n});
      budget -= n;
      ++i;
    }

    // Then admit waiting sequences while there is room.
    while (!waiting.empty() && budget > 0 && int64_t(running.size()) < config.max_num_seqs) {
      Sequence& seq = *waiting.front();
      if (seq.computed == 0 && config.enable_prefix_caching && seq.kv.block_tables.empty()) {
        seq.computed = cache.attach_cached_prefix(seq.kv, seq.tokens);
        prefix_cache_queries += int64_t(seq.tokens.size());
        prefix_cache_hits += seq.computed;
        if (!seq.reported_prompt) seq.cached_prompt_tokens = std::min(seq.computed, seq.prompt_length);
      }
      const int64_t n = std::min<int64_t>(int64_t(seq.tokens.size()) - seq.computed, budget);
      cache.trim_windows(seq.kv, seq.computed);
      if (!cache.grow(seq.kv, seq.computed + n)) {
        if (running.empty()) {  // nothing to wait for: it can never fit
          finish_with_error(waiting.front(), "the prompt does not fit in the KV cache; raise --kv-cache-memory");
          waiting.pop_front();
          continue;
        }
        break;
      }
      running.push_back(std::move(waiting.front()));
      waiting.pop_front();
      plan.push_back({running.back().get(), n});
      budget -= n;
    }
    if (plan.empty()) return;

    StepBatch batch;
    for (const auto& s : plan) {
      Sequence& seq = *s.seq;
      batch.tokens.insert(batch.tokens.end(), seq.tokens.begin() + seq.computed,
                          seq.tokens.begin() + seq.computed + s.num_tokens);
      SequenceStep step;
      step.start_pos = seq.computed;
      step.num_tokens = s.num_tokens;
      step.block_tables = cache.tables(seq.kv);
      step.need_logits = seq.computed + s.num_tokens == int64_t(seq.tokens.size());
      batch.sequences.push_back(step);
    }
    const int64_t vocab = engine.model_->config().vocab_size;
    bool all_greedy = true, all_plain = true;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!batch.sequences[i].need_logits) continue;
      if (!plain_greedy(*plan[i].seq)) all_greedy = false;
      if (!plain_sampling(*plan[i].seq)) all_plain = false;
    }
    // Tokens picked on the model's device come back as ids alone: the argmax when every row is
    // greedy, else a GPU model's draw when no row needs the logits on the host.
    const bool on_device = all_greedy || (all_plain && engine.model_->device() == Device::Cuda);
    std::vector<int32_t> device_ids;
    if (all_greedy) {
      device_ids.resize(size_t(batch.logit_rows()));
      engine.model_->forward_argmax(batch, cache.storage(), device_ids.data());
    } else if (on_device) {
      std::vector<RowSampling> rows;
      for (size_t i = 0; i < plan.size(); ++i) {
        if (!batch.sequences[i].need_logits) continue;
        Sampler& sampler = *plan[i].seq->sampler;
        // Greedy rows draw nothing, as on the host, so a seeded stream stays in step.
        rows.push_back(to_row_sampling(sampler.params(), sampler.params().greedy() ? 0.0 : sampler.next_uniform()));
      }
      device_ids.resize(rows.size());
      engine.model_->forward_sample(batch, cache.storage(), rows.data(), device_ids.data());
    } else {
      logits.resize(size_t(batch.logit_rows() * vocab));
      engine.model_->forward(batch, cache.storage(), logits.data());
    }

    int64_t row = 0;
    std::vector<Sequence*> finished;
    for (const auto& s : plan) {
      Sequence& seq = *s.seq;
      const bool was_prefill = seq.computed < seq.prompt_length;
      if (was_prefill) prompt_tokens_total += std::min(s.num_tokens, seq.prompt_length - seq.computed);
      seq.computed += s.num_tokens;
      if (config.enable_prefix_caching)
        cache.register_full_blocks(seq.kv, std::span<const int32_t>(seq.tokens.data(), size_t(seq.computed)));
      if (!batch.sequences[size_t(&s - plan.data())].need_logits) continue;
      const bool done = on_device ? emit(seq, GeneratedToken{device_ids[size_t(row)], 0.0f, {}})
                                  : sample_and_emit(seq, logits.data() + row * vocab, vocab);
      if (done) finished.push_back(&seq);
      ++row;
    }
    std::erase_if(running, [&](std::unique_ptr<Sequence>& seq) {
      if (std::find(finished.begin(), finished.end(), seq.get()) == finished.end()) return false;
      cache.release(seq->kv);
      return true;
    });
  }

  void finish_with_error(std::unique_ptr<Sequence>& seq, const std::string& message) {
    cache.release(seq->kv);
    RequestOutput out;
    out.finished = true;
    out.finish_reason = "error";
    out.error = message;
    out.prompt_tokens = seq->prompt_length;
    seq->callback(out);
  }

  // Samples the next token from raw logits, applying penalties, min_tokens and the constraint.
  // Returns true when the sequence is finished.
  bool sample_and_emit(Sequence& seq, float* row, int64_t vocab) {
    const RequestParams& p = seq.params;
    GeneratedToken generated;
    const bool want_logprobs = p.top_logprobs >= 0;
    float normalizer = 0.0f;
    if (want_logprobs) normalizer = log_sum_exp(row, vocab);
    std::vector<float> raw;
    if (want_logprobs) raw.assign(row, row + vocab);

    if (p.repetition_penalty != 1.0f) {
      std::unordered_set<int32_t> seen(seq.tokens.begin(), seq.tokens.end());
      for (int32_t id : seen) row[id] = row[id] > 0 ? row[id] / p.repetition_penalty : row[id] * p.repetition_penalty;
    }
    for (const auto& [id, count] : seq.output_counts)
      row[id] -= p.frequency_penalty * float(count) + (count > 0 ? p.presence_penalty : 0.0f);

    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    if (seq.generated() < p.min_tokens) {
      for (int32_t id : p.eos_token_ids) row[id] = kMasked;
      for (int32_t id : p.stop_token_ids) row[id] = kMasked;
    }
    if (p.constraint) {
      std::vector<uint8_t> allowed(size_t(vocab), 0);
      p.constraint->allowed_tokens(allowed);
      const bool complete = p.constraint->is_complete();
      for (int32_t id : p.eos_token_ids) allowed[size_t(id)] = complete ? 1 : 0;
      bool any = false;
      for (int64_t i = 0; i < vocab; ++i) {
        if (!allowed[size_t(i)]) row[i] = kMasked;
        any = any || allowed[size_t(i)];
      }
      if (!any) {  // the constraint is satisfied and allows nothing more: end here
        RequestOutput out;
        out.finished = true;
        out.finish_reason = "stop";
        out.prompt_tokens = seq.prompt_length;
        out.cached_prompt_tokens = seq.cached_prompt_tokens;
        seq.callback(out);
        return true;
      }
    }
    const int32_t token = seq.sampler->sample(row, vocab);
    if (p.constraint && !is_stop_id(p, token)) p.constraint->accept(token);

    generated.token = token;
    if (want_logprobs) {
      generated.logprob = raw[size_t(token)] - normalizer;
      if (p.top_logprobs > 0) {
        std::vector<int32_t> order(static_cast<size_t>(vocab));
        for (int64_t i = 0; i < vocab; ++i) order[size_t(i)] = int32_t(i);
        const auto k = std::min<int64_t>(p.top_logprobs, vocab);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t b) { return raw[size_t(a)] > raw[size_t(b)] || (raw[size_t(a)] == raw[size_t(b)] && a < b); });
        for (int64_t i = 0; i < k; ++i)
          generated.top_logprobs.push_back({order[size_t(i)], raw[size_t(order[size_t(i)])] - normalizer});
      }
    }
    return emit(seq, std::move(generated));
  }

  static bool is_stop_id(const RequestParams& p, int32_t id) {
    return (!p.ignore_eos && std::find(p.eos_token_ids.begin(), p.eos_token_ids.end(), id) != p.eos_token_ids.end()) ||
           std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) != p.stop_token_ids.end();
  }

  // Whether this sequence's next token is the plain argmax of the raw logits, so the model may
  // pick it on its device and send back the id alone (no penalties, masks, logprobs or draws).
  static bool plain_greedy(const Sequence& seq) {
    return seq.params.sampling.greedy() && plain_sampling(seq);
  }

  // Whether this sequence's next token is a plain draw from the raw logits (temperature, top-k,
  // top-p, min-p only), which a GPU model can make on its device.
  static bool plain_sampling(const Sequence& seq) {
    const RequestParams& p = seq.params;
    return p.top_logprobs < 0 && !p.constraint && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f && seq.generated() >= p.min_tokens;
  }

  // Appends the chosen token and reports it; returns true when the sequence is finished.
  bool emit(Sequence& seq, GeneratedToken generated) {
    const RequestParams& p = seq.params;
    const int32_t token = generated.token;
    seq.tokens.push_back(token);
    seq.output_counts[token]++;
    ++generation_tokens_total;

    RequestOutput out;
    out.tokens.push_back(std::move(generated));
    out.prompt_tokens = seq.prompt_length;
    out.cached_prompt_tokens = seq.cached_prompt_tokens;
    seq.reported_prompt = true;
    if (is_stop_id(p, token)) {
      out.finished = true;
      out.finish_reason = "stop";
      out.stop_token = token;
    } else if (seq.generated() >= p.max_tokens || int64_t(seq.tokens.size()) >= engine.max_model_len()) {
      out.finished = true;
      out.finish_reason = "length";
    }
    seq.callback(out);
    return out.finished;
  }

  void publish_stats() {
    EngineStats stats;
    stats.running = int64_t(running.size());
    stats.waiting = int64_t(waiting.size());
    int64_t total = 0, free = 0;
    for (int group = 0; group < cache.layout().num_groups(); ++group) {
      total += cache.total_blocks(group);
      free += cache.free_blocks(group);
    }
    stats.kv_blocks_total = total;
    stats.kv_blocks_free = free;
    stats.kv_usage = total > 0 ? double(total - free) / double(total) : 0.0;
    std::lock_guard<std::mutex> lock(mutex);
    stats.waiting += int64_t(incoming.size());
    published = stats;
  }
};

Engine::Engine(std::unique_ptr<Model> model, const EngineConfig& config) : model_(std::move(model)), config_(config) {
  if (config_.max_num_seqs <= 0) fail("--max-num-seqs must be positive, got {}", config_.max_num_seqs);
  if (config_.max_num_batched_tokens <= 0)
    fail("--max-num-batched-tokens must be positive, got {}", config_.max_num_batched_tokens);
  if (config_.block_size <= 0) fail("KV block size must be positive");
  const int64_t model_max = model_->config().max_position_embeddings;
  if (config_.max_model_len <= 0) config_.max_model_len = model_max;
  if (model_max > 0 && config_.max_model_len > model_max)
    fail("--max-model-len {} exceeds the model's max_position_embeddings {}", config_.max_model_len, model_max);
  impl_ = std::make_unique<Impl>(*this, config_);
}

Engine::~Engine() = default;

int64_t Engine::max_model_len() const { return config_.max_model_len; }

uint64_t Engine::submit(RequestParams params, OutputCallback on_output) {
  const int64_t vocab = model_->config().vocab_size;
  const auto& ids = params.prompt_ids;
  if (ids.empty()) fail("the prompt is empty");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab) fail("prompt token id {} at index {} is outside the vocabulary (size {})", ids[i], i, vocab);
  if (params.max_tokens < 1) fail("max_tokens must be at least 1, got {}", params.max_tokens);
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens)
    fail("min_tokens must be between 0 and max_tokens ({}), got {}", params.max_tokens, params.min_tokens);
  const int64_t total = int64_t(ids.size()) + params.max_tokens;
  if (total > max_model_len())
    fail("this model's maximum context length is {} tokens; the request needs {} ({} in the prompt, {} to generate)",
         max_model_len(), total, ids.size(), params.max_tokens);
  if (params.top_logprobs > 20) fail("top_logprobs must be at most 20, got {}", params.top_logprobs);
  if (!(params.repetition_penalty > 0.0f) || !std::isfinite(params.repetition_penalty))
    fail("repetition_penalty must be positive, got {}", params.repetition_penalty);
  if (!(std::fabs(params.presence_penalty) <= 2.0f)) fail("presence_penalty must be in [-2, 2], got {}", params.presence_penalty);
  if (!(std::fabs(params.frequency_penalty) <= 2.0f)) fail("frequency_penalty must be in [-2, 2], got {}", params.frequency_penalty);
  for (int32_t id : params.eos_token_ids)
    if (id < 0 || id >= vocab) fail("eos token id {} is outside the vocabulary", id);
  for (int32_t id : params.stop_token_ids)
    if (id < 0 || id >= vocab) fail("stop token id {} is outside the vocabulary", id);
  params.sampling.validate();

  auto seq = std::make_unique<Sequence>();
  seq->params = std::move(params);
  seq->callback = std::move(on_output);
  seq->tokens = seq->params.prompt_ids;
  seq->prompt_length = int64_t(seq->tokens.size());
  seq->sampler = std::make_unique<Sampler>(seq->params.sampling);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (int64_t(impl_->incoming.size()) + impl_->published.waiting >= config_.max_waiting)
      throw QueueFullError("the request queue is full; retry later");
    id = seq->id = impl_->next_id++;
    impl_->incoming.push_back(std::move(seq));
  }
  impl_->wake.notify_one();
  return id;
}

void Engine::cancel(uint64_t request_id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->cancelled.insert(request_id);
  }
  impl_->wake.notify_one();
}

EngineStats Engine::stats() const {
  EngineStats stats;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    stats = impl_->published;
  }
  stats.prompt_tokens_total = impl_->prompt_tokens_total;
  stats.generation_tokens_total = impl_->generation_tokens_total;
  stats.prefix_cache_queries = impl_->prefix_cache_queries;
  stats.prefix_cache_hits = impl_->prefix_cache_hits;
  stats.preemptions_total = impl_->preemptions_total;
  return stats;
}

}  // namespace anvil
