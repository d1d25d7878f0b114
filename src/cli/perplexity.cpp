// anvil perplexity: sliding-window perplexity of a model over a text file, the quick check that a
// checkpoint's weights (or a quantization of them) are sane.
//
// Windowing (the same rule tools/train-demo/train.py used for the demo model's reference figure):
// the file is encoded as plain text (special-token spellings stay text, no BOS is added); windows of
// --ctx tokens start at token 0, stride, 2*stride, ... until one reaches the end; each window is run
// from an empty KV cache and scores only the tokens that no earlier window scored (the first window
// scores all but its first token). So every token after the first is scored exactly once, and after
// the first window each has at least ctx - stride tokens of context. With --stride equal to --ctx
// the windows do not overlap and the first token of each goes unscored.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "engine/generator.h"

namespace anvil::cli {

namespace {
struct PerplexityOptions {
  ModelLoadFlags model;
  std::string file;
  int64_t ctx = 512;
  int64_t stride = 0;  // 0: ctx / 2
  bool json = false;
};

// -log softmax(row)[target], in double so long texts sum without drift.
double token_nll(const float* row, int64_t vocab, int32_t target) {
  float max = row[0];
  for (int64_t i = 1; i < vocab; ++i) max = std::max(max, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - double(max));
  return std::log(sum) + double(max) - double(row[target]);
}

void progress(int64_t done, int64_t total, double seconds) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? int(kWidth * done / total) : kWidth;
  std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld tokens scored, %.1fs", filled, "==============================",
               kWidth - filled, "", static_cast<long long>(done), static_cast<long long>(total), seconds);
  std::fflush(stderr);
}

void run_perplexity(const PerplexityOptions& options) {
  if (options.ctx < 2) fail("--ctx must be at least 2, got {}", options.ctx);
  const int64_t stride = options.stride == 0 ? std::max<int64_t>(1, options.ctx / 2) : options.stride;
  if (stride < 1 || stride > options.ctx) fail("--stride must be from 1 to --ctx ({}), got {}", options.ctx, stride);
  std::ifstream in(options.file, std::ios::binary);
  if (!in) fail("{}: cannot read", options.file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  auto tokenizer = load_model_tokenizer(options.model.model_dir);
  if (!tokenizer) fail("{}: no tokenizer.json in the model directory", options.model.model_dir);
  const std::vector<int32_t> ids = tokenizer->encode(text, /*allow_special=*/false);
  if (ids.size() < 2) fail("{}: needs at least 2 tokens, has {}", options.file, ids.size());
  auto model = options.model.load();
  const int64_t vocab = model->config().vocab_size;
  const int64_t n = int64_t(ids.size());

  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double nll = 0;
  int64_t scored = 0, windows = 0, prev_end = 0;
  for (int64_t begin = 0;; begin += stride) {
    const int64_t end = std::min(begin + options.ctx, n);
    const std::vector<int32_t> window(ids.begin() + begin, ids.begin() + end);
    const std::vector<float> logits = prompt_logits(*model, window);
    for (int64_t t = std::max(prev_end, begin + 1); t < end; ++t) {
      nll += token_nll(logits.data() + (t - begin - 1) * vocab, vocab, ids[size_t(t)]);
      ++scored;
    }
    ++windows;
    prev_end = end;
    progress(scored, n - 1, elapsed());
    if (end == n) break;
  }
  std::fprintf(stderr, "\n");
  const double ppl = std::exp(nll / double(scored));
  if (options.json) {
    const nlohmann::json out = {{"perplexity", ppl}, {"mean_nll", nll / double(scored)}, {"tokens", n},
                                {"scored_tokens", scored}, {"windows", windows}, {"ctx", options.ctx},
                                {"stride", stride}, {"seconds", elapsed()}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %lld tokens (%lld windows of %lld, stride %lld)\n", ppl,
                static_cast<long long>(scored), static_cast<long long>(windows), static_cast<long long>(options.ctx),
                static_cast<long long>(stride));
  }
}
}  // namespace

void register_perplexity(CLI::App& app) {
  auto options = std::make_shared<PerplexityOptions>();
  CLI::App* verb = app.add_subcommand("perplexity", "Sliding-window perplexity of a model over a text file");
  options->model.add_to(*verb);
  verb->add_option("--file", options->file, "Text file to score")->required();
  verb->add_option("--ctx", options->ctx, "Tokens per window (default 512)");
  verb->add_option("--stride", options->stride, "Tokens between window starts (default ctx/2)");
  verb->add_flag("--json", options->json, "Print one JSON object instead of a line of text");
  verb->callback([options] { run_perplexity(*options); });
}

}  // namespace anvil::cli
