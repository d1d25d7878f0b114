#include "support/engine_runs.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace anvil::test {

std::vector<std::vector<int32_t>> run_engine_requests(std::unique_ptr<Model> model,
                                                      std::vector<RequestParams> requests) {
  EngineConfig config;
  config.max_num_seqs = 8;
  config.kv_cache_bytes = size_t(64) << 20;
  config.kv_cache_bytes_set = true;
  config.enable_prefix_caching = false;
  Engine engine(std::move(model), config);
  std::mutex mutex;
  std::condition_variable done;
  std::vector<std::vector<int32_t>> outputs(requests.size());
  size_t finished = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    engine.submit(std::move(requests[r]), [&, r](const RequestOutput& output) {
      std::lock_guard lock(mutex);
      for (const auto& token : output.tokens) outputs[r].push_back(token.token);
      if (output.finished) {
        ++finished;
        done.notify_all();
      }
    });
  }
  std::unique_lock lock(mutex);
  EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(120), [&] { return finished == outputs.size(); }))
      << finished << " of " << outputs.size() << " requests finished";
  return outputs;
}

}  // namespace anvil::test
