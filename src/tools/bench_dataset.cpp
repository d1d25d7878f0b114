#include "tools/bench_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "formats/tokenizer.h"

namespace anvil::tools {

namespace {

class LocalTokens : public TokenSource {
 public:
  LocalTokens(std::unique_ptr<Tokenizer> tokenizer, std::string path) : tokenizer_(std::move(tokenizer)), path_(std::move(path)) {}
  std::string describe() const override { return path_; }
  std::vector<int32_t> pool() override {
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      if (tokenizer_->is_special(id)) continue;
      const std::string& bytes = tokenizer_->token_bytes(id);
      // Whole characters only, and no added tokens that act as markup (<think>, <tool_call>).
      if (bytes.empty() || !is_valid_utf8(bytes) || (bytes.size() > 2 && bytes.front() == '<' && bytes.back() == '>'))
        continue;
      ids.push_back(id);
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) override { return tokenizer_->decode(ids, true); }
  std::optional<int64_t> count(const std::string& text) override {
    try {
      return int64_t(tokenizer_->encode(text, false).size());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string path_;
};

// Plain words whose tokens make the pool when only the server can tokenize.
const char* const kWords[] = {
    "the",     "of",      "and",     "to",       "in",      "is",     "that",    "for",     "it",      "as",
    "was",     "with",    "be",      "by",       "on",      "not",    "he",      "this",    "are",     "or",
    "his",     "from",    "at",      "which",    "but",     "have",   "an",      "had",     "they",    "you",
    "were",    "their",   "one",     "all",      "we",      "can",    "her",     "has",     "there",   "been",
    "if",      "more",    "when",    "will",     "would",   "who",    "so",      "no",      "river",   "mountain",
    "engine",  "server",  "kernel",  "memory",   "token",   "model",  "garden",  "window",  "number",  "system",
    "market",  "history", "science", "music",    "winter",  "summer", "ocean",   "forest",  "city",    "village",
    "library", "student", "teacher", "question", "answer",  "light",  "shadow",  "signal",  "network", "battery",
    "copper",  "silver",  "golden",  "purple",   "orange",  "yellow", "quickly", "slowly",  "quietly", "bright",
    "ancient", "modern",  "simple",  "complex",  "careful", "strong", "gentle",  "heavy",   "narrow",  "wide",
    "build",   "measure", "compute", "compile",  "observe", "travel", "follow",  "explain", "imagine", "remember",
    "42",      "2025",    "3.14",    "100",      "7",       "(",      ")",       ",",       ".",       ";",
};

class ServerTokens : public TokenSource {
 public:
  ServerTokens(const OpenAiClient& client, std::string model) : client_(client), model_(std::move(model)) {}
  std::string describe() const override { return client_.url().origin() + client_.url().path("/tokenize"); }

  std::optional<std::vector<int32_t>> tokenize(const std::string& text) {
    // vLLM and anvil: {model, prompt} -> {tokens}; llama.cpp: {content} -> {tokens}.
    for (int shape = 0; shape < 2; ++shape) {
      if (llama_ && shape == 0) continue;
      const Json body = shape == 0 ? Json{{"model", model_}, {"prompt", text}, {"add_special_tokens", false}}
                                   : Json{{"content", text}, {"add_special", false}};
      const HttpReply reply = client_.post("/tokenize", body);
      if (reply.ok() && reply.json.is_object() && reply.json.contains("tokens") && reply.json["tokens"].is_array()) {
        std::vector<int32_t> ids;
        for (const Json& t : reply.json["tokens"]) {
          if (t.is_number_integer()) ids.push_back(t.get<int32_t>());
          else if (t.is_object() && t.contains("id")) ids.push_back(t["id"].get<int32_t>());
        }
        if (shape == 1) llama_ = true;
        return ids;
      }
    }
    return std::nullopt;
  }

  std::vector<int32_t> pool() override {
    std::mt19937_64 rng(12345);
    std::string corpus;
    const size_t words = sizeof(kWords) / sizeof(kWords[0]);
    for (int i = 0; i < 3000; ++i) corpus += std::string(i ? " " : "") + kWords[rng() % words];
    const auto ids = tokenize(corpus);
    if (!ids) fail("bench: {} did not tokenize", describe());
    const std::set<int32_t> distinct(ids->begin(), ids->end());
    return {distinct.begin(), distinct.end()};
  }

  std::string decode(const std::vector<int32_t>& ids) override {
    const Json body = llama_ ? Json{{"tokens", ids}} : Json{{"model", model_}, {"tokens", ids}};
    const HttpReply reply = client_.post("/detokenize", body);
    if (reply.ok() && reply.json.is_object()) {
      for (const char* key : {"prompt", "content"})
        if (reply.json.contains(key) && reply.json[key].is_string()) return reply.json[key].get<std::string>();
    }
    fail("bench: the server's /detokenize did not answer ({}); give --tokenizer for text prompts", reply.describe());
  }

  std::optional<int64_t> count(const std::string& text) override {
    if (const auto ids = tokenize(text)) return int64_t(ids->size());
    return std::nullopt;
  }

 private:
  const OpenAiClient& client_;
  std::string model_;
  bool llama_ = false;
};

class VocabTokens : public TokenSource {
 public:
  explicit VocabTokens(int64_t vocab) : vocab_(vocab) {}
  std::string describe() const override { return "ids below --vocab-size " + std::to_string(vocab_); }
  std::vector<int32_t> pool() override {
    std::vector<int32_t> ids(static_cast<size_t>(vocab_));
    for (int64_t i = 0; i < vocab_; ++i) ids[size_t(i)] = int32_t(i);
    return ids;
  }
  std::string decode(const std::vector<int32_t>&) override {
    fail("bench: text prompts need a tokenizer (--tokenizer, or a server with /detokenize), not just --vocab-size");
  }
  std::optional<int64_t> count(const std::string&) override { return std::nullopt; }

 private:
  int64_t vocab_;
};

std::pair<int64_t, int64_t> length_range(int64_t length, double ratio) {
  const int64_t low = std::max<int64_t>(1, int64_t(std::floor(double(length) * (1 - ratio))));
  const int64_t high = std::max<int64_t>(low, int64_t(std::ceil(double(length) * (1 + ratio))));
  return {low, high};
}

}  // namespace

std::unique_ptr<TokenSource> local_token_source(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file)) fail("--tokenizer {}: no tokenizer.json there", path);
  return std::make_unique<LocalTokens>(Tokenizer::from_file(file), file.string());
}

std::unique_ptr<TokenSource> server_token_source(const OpenAiClient& client, const std::string& model) {
  auto source = std::make_unique<ServerTokens>(client, model);
  if (!source->tokenize("hello world")) return nullptr;
  return source;
}

std::unique_ptr<TokenSource> vocab_token_source(int64_t vocab_size) {
  if (vocab_size <= 0) fail("--vocab-size must be positive");
  return std::make_unique<VocabTokens>(vocab_size);
}

std::vector<BenchPrompt> make_dataset(const DatasetOptions& options, TokenSource* tokens) {
  if (options.num_prompts <= 0) fail("--num-prompts must be positive");
  if (options.range_ratio < 0 || options.range_ratio >= 1) fail("--range-ratio {}: must be in [0, 1)", options.range_ratio);
  if (options.output_len <= 0) fail("--output-len must be positive");
  std::mt19937_64 rng(options.seed);
  const auto [out_low, out_high] = length_range(options.output_len, options.range_ratio);
  std::vector<BenchPrompt> prompts;

  if (options.name == "custom") {
    if (options.path.empty()) fail("--dataset-name custom needs --dataset-path FILE.jsonl");
    std::ifstream in(options.path);
    if (!in) fail("--dataset-path {}: cannot read", options.path);
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const Json row = Json::parse(line, nullptr, false);
      if (!row.is_object() || !row.contains("prompt") || !row["prompt"].is_string())
        fail("--dataset-path {} line {}: expected {{\"prompt\": \"...\"}}", options.path, number);
      BenchPrompt prompt;
      prompt.text = row["prompt"].get<std::string>();
      if (tokens) prompt.prompt_len = tokens->count(prompt.text).value_or(0);
      prompt.output_len = row.contains("output_tokens") && row["output_tokens"].is_number_integer()
                              ? row["output_tokens"].get<int64_t>()
                              : std::uniform_int_distribution<int64_t>(out_low, out_high)(rng);
      prompts.push_back(std::move(prompt));
    }
    if (prompts.empty()) fail("--dataset-path {}: no prompts", options.path);
    // vLLM samples num_prompts rows (repeating when the file is shorter), shuffled.
    std::shuffle(prompts.begin(), prompts.end(), rng);
    std::vector<BenchPrompt> out;
    for (int64_t i = 0; i < options.num_prompts; ++i) out.push_back(prompts[size_t(i) % prompts.size()]);
    return out;
  }
  if (options.name != "random") fail("--dataset-name {}: expected random or custom", options.name);
  if (options.input_len <= 0) fail("--input-len must be positive");
  if (!tokens) fail("bench: random prompts need token ids (--tokenizer, a server with /tokenize, or --vocab-size)");
  const std::vector<int32_t> pool = tokens->pool();
  if (pool.empty()) fail("bench: {} gave no ordinary tokens to build prompts from", tokens->describe());
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::vector<int32_t> prefix;
  for (int64_t i = 0; i < options.prefix_len; ++i) prefix.push_back(pool[pick(rng)]);
  const auto [in_low, in_high] = length_range(options.input_len, options.range_ratio);
  std::uniform_int_distribution<int64_t> input_len(in_low, in_high), output_len(out_low, out_high);
  for (int64_t i = 0; i < options.num_prompts; ++i) {
    BenchPrompt prompt;
    prompt.ids = prefix;
    const int64_t length = input_len(rng);
    for (int64_t t = 0; t < length; ++t) prompt.ids.push_back(pool[pick(rng)]);
    prompt.prompt_len = int64_t(prompt.ids.size());
    prompt.output_len = output_len(rng);
    prompts.push_back(std::move(prompt));
  }
  if (options.as_text)
    for (BenchPrompt& prompt : prompts) {
      prompt.text = tokens->decode(prompt.ids);
      prompt.ids.clear();
    }
  return prompts;
}

std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> times(n, 0.0);
  if (n == 0 || std::isinf(rate)) return times;
  if (rate <= 0) fail("--request-rate must be positive or inf");
  if (burstiness <= 0) fail("--burstiness must be positive");
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double total = 0;
  for (size_t i = 0; i < n; ++i) times[i] = total += gap(rng);
  if (total > 0) {
    const double scale = (double(n) / rate) / total;
    for (double& t : times) t *= scale;
  }
  return times;
}

}  // namespace anvil::tools
