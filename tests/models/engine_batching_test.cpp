// The batching engine against the fixtures: many sequences in one step (chunked prefills and
// decodes mixed, paged KV, sliding windows) must give each exactly the tokens it gets alone.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "support/test_support.h"

namespace anvil {
namespace {

struct Case {
  std::vector<int32_t> prompt, greedy;
};

std::vector<Case> cases_of(const std::string& fixture) {
  const auto reference = nlohmann::json::parse(test::read_file(test::fixtures_dir() / fixture / "reference.json"));
  std::vector<Case> cases;
  for (const auto& c : reference.at("cases"))
    cases.push_back({c.at("prompt_ids").get<std::vector<int32_t>>(), c.at("greedy_ids").get<std::vector<int32_t>>()});
  return cases;
}

// Collects one request's output and lets a test wait for it.
struct Collector {
  std::mutex mutex;
  std::condition_variable done_cv;
  std::vector<int32_t> tokens;
  std::string finish_reason, error;
  int64_t cached = 0;
  bool done = false;

  OutputCallback callback() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& t : out.tokens) tokens.push_back(t.token);
      cached = out.cached_prompt_tokens;
      if (out.finished) {
        finish_reason = out.finish_reason;
        error = out.error;
        done = true;
        done_cv.notify_all();
      }
    };
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(done_cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }));
  }
};

// Stats are published after the step whose callbacks a test waited for.
EngineStats idle_stats(const Engine& engine) {
  for (int i = 0; i < 200 && engine.stats().running + engine.stats().waiting > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return engine.stats();
}

RequestParams greedy_request(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestParams params;
  params.prompt_ids = prompt;
  params.max_tokens = max_tokens;
  params.sampling.temperature = 0.0f;
  params.ignore_eos = true;
  return params;
}

LoadOptions reference_options(const std::string& fixture) {
  LoadOptions options;  // see tests/models/fixture_test.cpp on the Qwen3 references
  options.rope_inv_freq_bf16 = fixture.rfind("qwen3", 0) == 0;
  return options;
}

class EngineFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineFixtureTest, ConcurrentRequestsMatchReferenceGreedy) {
  const auto cases = cases_of(GetParam());
  EngineConfig config;
  config.max_num_batched_tokens = 13;  // forces chunked prefills mixed with decodes
  config.kv_cache_bytes = 8 << 20;
  Engine engine(load_model(test::fixtures_dir() / GetParam(), reference_options(GetParam())), config);
  std::vector<std::unique_ptr<Collector>> outputs;
  for (int round = 0; round < 3; ++round)
    for (const auto& c : cases) {
      outputs.push_back(std::make_unique<Collector>());
      engine.submit(greedy_request(c.prompt, int64_t(c.greedy.size())), outputs.back()->callback());
    }
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i]->wait();
    EXPECT_EQ(outputs[i]->tokens, cases[i % cases.size()].greedy) << "request " << i;
    EXPECT_EQ(outputs[i]->finish_reason, "length");
  }
  const EngineStats stats = idle_stats(engine);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

TEST_P(EngineFixtureTest, PreemptionUnderATinyCacheKeepsResultsExact) {
  const auto cases = cases_of(GetParam());
  const auto model_dir = test::fixtures_dir() / GetParam();
  auto model = load_model(model_dir, reference_options(GetParam()));
  EngineConfig config;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 64;
  // Full attention: room for about two of the longest sequences; sliding window (gpt-oss,
  // window 8): fewer blocks than eight sequences want at once.
  config.kv_blocks_per_group = {9};
  if (model->kv_layout().num_groups() == 2) config.kv_blocks_per_group.push_back(12);
  Engine engine(std::move(model), config);
  std::vector<std::unique_ptr<Collector>> outputs;
  for (int round = 0; round < 2; ++round)
    for (const auto& c : cases) {
      outputs.push_back(std::make_unique<Collector>());
      engine.submit(greedy_request(c.prompt, int64_t(c.greedy.size())), outputs.back()->callback());
    }
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i]->wait();
    EXPECT_EQ(outputs[i]->tokens, cases[i % cases.size()].greedy) << "request " << i << " " << outputs[i]->error;
  }
  EXPECT_GT(engine.stats().preemptions_total, 0);
}

TEST_P(EngineFixtureTest, PrefixCacheServesARepeatedPrompt) {
  const auto cases = cases_of(GetParam());
  const Case& longest = cases.back();
  EngineConfig config;
  config.kv_cache_bytes = 8 << 20;
  Engine engine(load_model(test::fixtures_dir() / GetParam(), reference_options(GetParam())), config);
  Collector first, second;
  engine.submit(greedy_request(longest.prompt, int64_t(longest.greedy.size())), first.callback());
  first.wait();
  engine.submit(greedy_request(longest.prompt, int64_t(longest.greedy.size())), second.callback());
  second.wait();
  EXPECT_EQ(first.cached, 0);
  EXPECT_EQ(second.cached, int64_t((longest.prompt.size() - 1) / 16 * 16));
  EXPECT_GT(second.cached, 0);
  EXPECT_EQ(second.tokens, longest.greedy);
  EXPECT_GT(engine.stats().prefix_cache_hits, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineFixtureTest, ::testing::Values("gpt-oss-tiny", "qwen3-tiny", "qwen3moe-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST(Engine, CancelFreesBlocksAndReportsAbort) {
  EngineConfig config;
  config.kv_cache_bytes = 8 << 20;
  Engine engine(load_model(test::fixtures_dir() / "qwen3-tiny"), config);
  Collector out;
  const uint64_t id = engine.submit(greedy_request({1, 2, 3, 4, 5}, 3000), out.callback());
  engine.cancel(id);
  out.wait();
  EXPECT_EQ(out.finish_reason, "abort");
  const EngineStats stats = idle_stats(engine);
  EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
}

TEST(Engine, RejectsRequestsItCannotServe) {
  EngineConfig config;
  config.kv_cache_bytes = 8 << 20;
  config.max_model_len = 64;
  Engine engine(load_model(test::fixtures_dir() / "qwen3-tiny"), config);
  Collector unused;
  EXPECT_THROW(engine.submit(greedy_request(std::vector<int32_t>(60, 1), 10), unused.callback()), Error);
  EXPECT_THROW(engine.submit(greedy_request({1, 5000}, 4), unused.callback()), Error);
  EXPECT_THROW(engine.submit(greedy_request({}, 4), unused.callback()), Error);
  RequestParams bad = greedy_request({1, 2}, 4);
  bad.sampling.top_p = 2.0f;
  EXPECT_THROW(engine.submit(bad, unused.callback()), Error);
}

TEST(Engine, StopsAtEosAndMinTokensHoldsItBack) {
  EngineConfig config;
  config.kv_cache_bytes = 8 << 20;
  Engine engine(load_model(test::fixtures_dir() / "qwen3-tiny", reference_options("qwen3-tiny")), config);
  // qwen3-tiny case 0 greedily repeats 900 after its first token: make 900 the stop id.
  RequestParams params = greedy_request({722}, 10);
  params.ignore_eos = false;
  params.eos_token_ids = {900};
  Collector stopped;
  engine.submit(params, stopped.callback());
  stopped.wait();
  EXPECT_EQ(stopped.tokens, (std::vector<int32_t>{948, 900}));
  EXPECT_EQ(stopped.finish_reason, "stop");
  params.min_tokens = 4;
  Collector held;
  engine.submit(params, held.callback());
  held.wait();
  ASSERT_GE(held.tokens.size(), 5u);
  EXPECT_NE(held.tokens[1], 900);
}

}  // namespace
}  // namespace anvil
