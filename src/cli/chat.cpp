// anvil chat: a terminal chat with any model that has a chat format (harmony for gpt-oss, ChatML
// for Qwen3), rendered and parsed exactly as `anvil serve` does. One line is one user turn; the
// answer streams to stdout and the model's reasoning to stderr, so `anvil chat < questions.txt >
// answers.txt` keeps only the answers.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "engine/generator.h"
#include "server/api_error.h"
#include "server/chat_format.h"

namespace anvil::cli {

namespace {
struct ChatOptions {
  ModelLoadFlags model;
  std::string system;
  std::string reasoning_effort = "medium";
  int64_t max_tokens = 512;
  float temperature = 0.0f;
  std::optional<uint64_t> seed;
  bool hide_reasoning = false;
};

void run_chat(const ChatOptions& options) {
  auto tokenizer = load_model_tokenizer(options.model.model_dir);
  if (!tokenizer) fail("{}: no tokenizer.json in the model directory; chat needs one", options.model.model_dir);
  auto model = options.model.load();
  const server::ChatFormat format(model->config(), tokenizer.get());
  if (format.kind() == server::ChatFormatKind::None)
    fail("{}: model_type '{}' has no chat format (gpt-oss and Qwen3 have)", options.model.model_dir,
         model->config().model_type);
  const bool interactive = isatty(STDIN_FILENO) != 0;
  // Reasoning is dimmed on a terminal so the answer stands out.
  const bool dim = isatty(STDERR_FILENO) != 0;
  if (interactive)
    std::fprintf(stderr, "chatting with %s (empty line or Ctrl-D ends, /reset forgets the conversation)\n",
                 options.model.model_dir.c_str());

  const auto message = [](std::string role, std::string content, std::string reasoning = {}) {
    ChatMessage m;
    m.role = std::move(role);
    m.content = std::move(content);
    m.reasoning = std::move(reasoning);
    return m;
  };
  std::vector<ChatMessage> history;
  if (!options.system.empty()) history.push_back(message("system", options.system));
  std::string line;
  while (true) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || (interactive && line.empty())) break;
    if (line.empty()) continue;
    if (line == "/reset") {
      history.resize(options.system.empty() ? 0 : 1);
      continue;
    }
    history.push_back(message("user", line));
    server::ChatRequest request;
    request.messages = history;
    request.reasoning_effort = options.reasoning_effort;
    server::RenderedPrompt prompt;
    try {
      prompt = format.render(request);
    } catch (const server::ApiError& error) {
      fail("{}", error.what());
    }
    auto parser = format.make_parser(prompt);
    GenerateRequest generation;
    generation.prompt_ids = prompt.ids;
    generation.max_tokens = options.max_tokens;
    generation.sampling.temperature = options.temperature;
    generation.sampling.seed = options.seed;
    generation.eos_token_ids = format.stop_token_ids();
    bool in_reasoning = false;
    const auto show = [&](const ChatDelta& delta) {
      if (!delta.reasoning.empty() && !options.hide_reasoning) {
        if (!in_reasoning && dim) std::fprintf(stderr, "\033[2m");
        in_reasoning = true;
        std::fputs(delta.reasoning.c_str(), stderr);
        std::fflush(stderr);
      }
      if (!delta.content.empty()) {
        if (in_reasoning) {
          std::fprintf(stderr, dim ? "\033[0m\n" : "\n");
          in_reasoning = false;
        }
        std::fputs(delta.content.c_str(), stdout);
        std::fflush(stdout);
      }
    };
    const GenerateResult result = generate(*model, generation, [&](int32_t id) { show(parser->push(id)); });
    show(parser->finish());
    if (in_reasoning) std::fprintf(stderr, dim ? "\033[0m\n" : "\n");
    std::fputs(result.finish_reason == "length" ? " [max tokens]\n" : "\n", stdout);
    std::fflush(stdout);
    const ParsedOutput parsed = parser->result();
    history.push_back(message("assistant", parsed.content, parsed.reasoning));
  }
}
}  // namespace

void register_chat(CLI::App& app) {
  auto options = std::make_shared<ChatOptions>();
  CLI::App* verb = app.add_subcommand("chat", "Chat with a model in the terminal (one line per turn)");
  options->model.add_to(*verb);
  verb->add_option("--system", options->system, "Instructions (harmony: the developer message)");
  verb->add_option("--reasoning-effort", options->reasoning_effort, "Harmony: low, medium or high");
  verb->add_option("--max-tokens", options->max_tokens, "Tokens per answer (default 512)");
  verb->add_option("--temperature", options->temperature, "0 is greedy (the default)");
  verb->add_option("--seed", options->seed, "Sampling seed");
  verb->add_flag("--hide-reasoning", options->hide_reasoning, "Do not print the model's reasoning");
  verb->callback([options] { run_chat(*options); });
}

}  // namespace anvil::cli
