// anvil tokenize / detokenize: the tokenizer alone, from a model directory or a tokenizer.json.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"

namespace anvil::cli {

namespace {
struct TokenizerSource {
  std::string model_dir, tokenizer_file;

  std::unique_ptr<Tokenizer> open() const {
    if (model_dir.empty() == tokenizer_file.empty()) fail("give exactly one of --model or --tokenizer");
    if (!tokenizer_file.empty()) return Tokenizer::from_file(tokenizer_file);
    auto tokenizer = load_model_tokenizer(model_dir);
    if (!tokenizer) fail("{}: no tokenizer.json in the model directory", model_dir);
    return tokenizer;
  }

  void add_to(CLI::App& verb) {
    verb.add_option("--model", model_dir, "Model directory holding tokenizer.json");
    verb.add_option("--tokenizer", tokenizer_file, "A tokenizer.json file");
  }
};

struct TokenizeOptions {
  TokenizerSource source;
  std::optional<std::string> text;
  bool allow_special = false;
};

struct DetokenizeOptions {
  TokenizerSource source;
  std::string ids;
  bool skip_special = false;
};
}  // namespace

void register_tokenize(CLI::App& app) {
  auto tokenize = std::make_shared<TokenizeOptions>();
  CLI::App* verb = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  tokenize->source.add_to(*verb);
  verb->add_option("--text", tokenize->text, "Text to encode (default: standard input)");
  verb->add_flag("--allow-special", tokenize->allow_special, "Encode special-token text as control tokens");
  verb->callback([tokenize] {
    auto tokenizer = tokenize->source.open();
    std::string text;
    if (tokenize->text) {
      text = *tokenize->text;
    } else {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    const nlohmann::json ids = tokenizer->encode(text, tokenize->allow_special);
    std::printf("%s\n", ids.dump().c_str());
  });

  auto detokenize = std::make_shared<DetokenizeOptions>();
  CLI::App* de = app.add_subcommand("detokenize", "Print the text of comma-separated token ids");
  detokenize->source.add_to(*de);
  de->add_option("--ids", detokenize->ids, "Token ids, comma-separated")->required();
  de->add_flag("--skip-special", detokenize->skip_special, "Leave out special tokens");
  de->callback([detokenize] {
    auto tokenizer = detokenize->source.open();
    const auto ids = parse_id_list(detokenize->ids, "--ids");
    std::fputs(tokenizer->decode(ids, detokenize->skip_special).c_str(), stdout);
    std::fputs("\n", stdout);
  });
}

}  // namespace anvil::cli
