#pragma once
// What bench sends: vLLM's random dataset (prompts of random tokens with lengths drawn from
// [L(1-r), L(1+r)]) or a JSONL file of prompts, and where token ids and counts come from: a local
// tokenizer.json (--tokenizer), the server's /tokenize and /detokenize, or a bare vocabulary size.
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tools/openai_client.h"

namespace anvil {
class Tokenizer;
}

namespace anvil::tools {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual std::string describe() const = 0;
  // Ids random prompts are drawn from: ordinary (not special) tokens of the vocabulary.
  virtual std::vector<int32_t> pool() = 0;
  // Text for ids (chat prompts need text); throws anvil::Error when this source cannot.
  virtual std::string decode(const std::vector<int32_t>& ids) = 0;
  // Tokens in a generated text; nullopt when this source cannot count.
  virtual std::optional<int64_t> count(const std::string& text) = 0;
};

// tokenizer.json, or a model directory holding one.
std::unique_ptr<TokenSource> local_token_source(const std::string& path);
// The server's /tokenize and /detokenize (vLLM's and anvil's shape, or llama.cpp's); nullptr when
// the server has no working /tokenize.
std::unique_ptr<TokenSource> server_token_source(const OpenAiClient& client, const std::string& model);
// Ids 0..vocab_size-1 sent as they are; no text, no counting.
std::unique_ptr<TokenSource> vocab_token_source(int64_t vocab_size);

struct DatasetOptions {
  std::string name = "random";  // random | custom
  std::string path;             // custom: JSONL with a "prompt" per line
  int64_t num_prompts = 1000;
  int64_t input_len = 1024, output_len = 128, prefix_len = 0;
  double range_ratio = 0;
  uint64_t seed = 0;
  bool as_text = false;  // the endpoint needs text (chat), or --prompt-format text
};

struct BenchPrompt {
  std::vector<int32_t> ids;  // sent as the prompt when text is empty
  std::string text;
  int64_t prompt_len = 0;    // tokens, as far as known before the server counts them
  int64_t output_len = 0;
};

// Throws anvil::Error for bad options (range ratio outside [0, 1), an unreadable file, a token
// source that cannot give text when text is needed).
std::vector<BenchPrompt> make_dataset(const DatasetOptions& options, TokenSource* tokens);

// Arrival offsets (seconds) as vLLM draws them: Gamma(shape=burstiness, scale=1/(rate*burstiness))
// gaps, rescaled so the last arrives at n/rate; all 0 for an infinite rate.
std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed);

}  // namespace anvil::tools
