#pragma once
// Running a set of requests through one batching Engine and collecting their tokens: what the
// engine-level GPU tests (graph vs eager, GPU draws vs host draws) compare.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "models/model.h"

namespace anvil::test {

// Submits every request at once to an Engine over `model` (8 sequences, 64 MiB of KV cache, no
// prefix caching, so each request computes its own prefill) and returns each request's tokens in
// submission order. Fails the calling test if they have not all finished within two minutes.
std::vector<std::vector<int32_t>> run_engine_requests(std::unique_ptr<Model> model,
                                                      std::vector<RequestParams> requests);

}  // namespace anvil::test
