// Decode steps replayed as CUDA graphs against the same steps run kernel by kernel
// (--enforce-eager): the graph replays the very kernels with the very arguments, so every token
// must be identical, through batch sizes that shrink as requests finish, block-table strides
// that grow with the context (a new graph), and both greedy-on-device and sampled (logits) steps.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "backend/cuda/runtime.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "models/model.h"
#include "support/engine_runs.h"
#include "support/test_support.h"

namespace anvil {
namespace {

std::unique_ptr<Model> load_tiny(bool enforce_eager, ComputeDtype dtype = ComputeDtype::Auto,
                                 const char* fixture = "gpt-oss-tiny") {
  LoadOptions options;
  options.device = Device::Cuda;
  options.enforce_eager = enforce_eager;
  options.dtype = dtype;
  return load_model(test::fixtures_dir() / fixture, options);
}

std::vector<int32_t> prompt_of(int64_t length, int32_t vocab, uint32_t seed) {
  std::vector<int32_t> ids;
  uint32_t state = seed;
  for (int64_t i = 0; i < length; ++i) {
    state = state * 1664525u + 1013904223u;
    ids.push_back(int32_t(state % uint32_t(vocab)));
  }
  return ids;
}

// A greedy request for exactly `tokens` tokens after a random prompt of `prompt_length`.
GenerateRequest greedy_request(const Model& model, int64_t prompt_length, int64_t tokens, uint32_t seed) {
  GenerateRequest request;
  request.prompt_ids = prompt_of(prompt_length, int32_t(model.config().vocab_size), seed);
  request.max_tokens = tokens;
  request.ignore_eos = true;
  request.sampling.temperature = 0.0f;
  return request;
}

class CudaGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::devices().empty()) GTEST_SKIP() << "no CUDA GPU: " << cuda::unavailable_reason();
  }
};

// Chained launches (programmatic dependent launch, where the kernel table allows it) change only
// when kernels start, never what they compute: every logit of a prompt run one token per step
// (decode graphs) and in 64-token chunks (prefill kernels) equals the stream-ordered run's, bit for
// bit, in both compute modes. A kernel that read its predecessor's output before waiting for it
// would show up here as differing logits (or differing between the repeated chained runs).
TEST_F(CudaGraphTest, ChainedLaunchesComputeExactlyWhatStreamOrderDoes) {
  for (const auto dtype : {ComputeDtype::Auto, ComputeDtype::F32}) {
    const auto prompt = prompt_of(150, 1000, 11);
    std::vector<std::vector<float>> runs;
    for (const bool chained : {false, true, true}) {
      cuda::allow_chained_launch(chained);
      auto model = load_tiny(false, dtype);
      auto decode_like = prompt_logits(*model, prompt, 1);
      const auto chunked = prompt_logits(*model, prompt, 64);
      decode_like.insert(decode_like.end(), chunked.begin(), chunked.end());
      runs.push_back(std::move(decode_like));
    }
    cuda::allow_chained_launch(true);
    ASSERT_EQ(runs[0].size(), runs[1].size());
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0)
        << "chained vs stream order, dtype " << int(dtype);
    EXPECT_EQ(std::memcmp(runs[1].data(), runs[2].data(), runs[1].size() * sizeof(float)), 0)
        << "two chained runs, dtype " << int(dtype);
  }
}

// One sequence whose context crosses 256 positions (16 blocks of 16, the smallest padded
// stride), so the second half of its decode runs under a second graph.
TEST_F(CudaGraphTest, GreedyDecodeEqualsEagerAcrossAStrideChange) {
  auto graphs = load_tiny(false), eager = load_tiny(true);
  const GenerateRequest request = greedy_request(*graphs, 230, 60, 7);
  const auto with_graphs = generate(*graphs, request).output_ids;
  const auto without = generate(*eager, request).output_ids;
  ASSERT_EQ(with_graphs.size(), 60u);
  EXPECT_EQ(with_graphs, without);
}

// The replays' device time (bench-gpu's graph_replay_ms) is reported per replay and only for
// replays: the eager model runs none, and a second call finds nothing new.
TEST_F(CudaGraphTest, ReplayTimeCoversReplaysOnly) {
  auto graphs = load_tiny(false), eager = load_tiny(true);
  const GenerateRequest request = greedy_request(*graphs, 20, 12, 3);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(generate(*graphs, request).output_ids.size(), 12u);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const double replay_ms = graphs->graph_replay_ms();
  EXPECT_GT(replay_ms, 0.0);
  EXPECT_LT(replay_ms, wall_ms / 9);  // at least 9 of the 11 decode steps are replays
  EXPECT_EQ(graphs->graph_replay_ms(), 0.0);
  ASSERT_EQ(generate(*eager, request).output_ids.size(), 12u);
  EXPECT_EQ(eager->graph_replay_ms(), 0.0);
}

// Each prompt_logits call sizes a fresh KV cache to its prompt, and a smaller one freed and
// allocated again tends to start at the address the previous one did. Decode graphs were keyed on
// that address alone, so the longer prompt's graph replayed against the shorter prompt's cache and
// wrote its later layers at the old stride, past the cache's end: on qwen3moe-tiny (bf16) into the
// step's metadata, an illegal address (session 26). Every logit must equal the eager run's.
TEST_F(CudaGraphTest, DecodeIntoCachesOfOtherSizesEqualsEager) {
  for (const char* fixture : {"gpt-oss-tiny", "qwen3moe-tiny"}) {
    auto graphs = load_tiny(false, ComputeDtype::Auto, fixture), eager = load_tiny(true, ComputeDtype::Auto, fixture);
    const int32_t vocab = int32_t(graphs->config().vocab_size);
    for (const int64_t length : {150, 40, 150, 9}) {
      const auto prompt = prompt_of(length, vocab, uint32_t(length));
      const auto with_graphs = prompt_logits(*graphs, prompt, 1);
      const auto without = prompt_logits(*eager, prompt, 1);
      ASSERT_EQ(with_graphs.size(), without.size());
      EXPECT_EQ(std::memcmp(with_graphs.data(), without.data(), without.size() * sizeof(float)), 0)
          << fixture << ", prompt of " << length;
    }
  }
}

// Several requests of different lengths through the batching engine: the decode batch shrinks
// as they finish (one graph per batch size); one request samples, so its steps bring logits back.
std::vector<std::vector<int32_t>> run_engine(std::unique_ptr<Model> model) {
  const int32_t vocab = int32_t(model->config().vocab_size);
  std::vector<RequestParams> requests(5);
  for (int r = 0; r < 5; ++r) {
    RequestParams& params = requests[size_t(r)];
    params.prompt_ids = prompt_of(5 + 17 * r, vocab, uint32_t(100 + r));
    params.max_tokens = 8 + 9 * r;
    params.ignore_eos = true;
    params.sampling.temperature = r == 2 ? 0.8f : 0.0f;
    if (r == 2) params.sampling.seed = 1234;
  }
  return test::run_engine_requests(std::move(model), std::move(requests));
}

TEST_F(CudaGraphTest, BatchedEngineEqualsEager) {
  const auto with_graphs = run_engine(load_tiny(false));
  const auto without = run_engine(load_tiny(true));
  ASSERT_EQ(with_graphs.size(), 5u);
  for (size_t slot = 0; slot < without.size(); ++slot) {
    EXPECT_EQ(without[slot].size(), 8 + 9 * slot) << "request " << slot;
    EXPECT_EQ(with_graphs[slot], without[slot]) << "request " << slot;
  }
}

}  // namespace
}  // namespace anvil
