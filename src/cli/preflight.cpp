// anvil preflight: proves an OpenAI-compatible server answers correctly, check by check.
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cli/notebook_flags.h"
#include "cli/verbs.h"
#include "tools/preflight.h"

namespace anvil::cli {

namespace {

struct PreflightFlags {
  tools::PreflightOptions options;
  std::string checks;
  uint64_t seed = 0;
  bool json = false;
  NotebookFlags notebook;
};

}  // namespace

void register_preflight(CLI::App& app) {
  auto flags = std::make_shared<PreflightFlags>();
  tools::PreflightOptions& o = flags->options;
  CLI::App* verb = app.add_subcommand(
      "preflight", "Check that an OpenAI-compatible server answers correctly (protocol and quality checks)");
  verb->add_option("--base-url", o.base_url, "Server to check, e.g. http://127.0.0.1:8000 (a /v1 suffix is fine)")
      ->capture_default_str();
  verb->add_option("--model", o.model, "Model name to ask for (default: the first of /v1/models)");
  verb->add_option("--api-key", o.api_key, "Bearer token for the server");
  verb->add_flag("--no-thinking", o.no_thinking,
                 "Ask for no reasoning (chat_template_kwargs.enable_thinking=false) and check none comes back");
  verb->add_option("--needle-ctx", o.needle_ctx, "Tokens of haystack for the needle check (default 4096, or 90% of max_model_len)");
  verb->add_option("--tool-batch", o.tool_batch, "Tool-call requests sent at once")->capture_default_str();
  verb->add_option("--max-tokens", o.max_tokens, "Room for each answer, reasoning included")->capture_default_str();
  verb->add_option("--timeout", o.timeout_s, "Seconds to wait for each reply")->capture_default_str();
  verb->add_option("--seed", flags->seed, "Seed for the needle's code word and depth (default: random)");
  verb->add_option("--checks", flags->checks,
                   "Only these checks, comma-separated: models, smoke, structured_json, needle, tool_calls, "
                   "tool_arguments, reasoning, stop_finish, stream_equivalence");
  verb->add_flag("--json", flags->json, "Print one JSON object {checks: [{name, passed, reason}], passed} on stdout");
  flags->notebook.add_to(*verb);
  verb->callback([flags, verb] {
    tools::PreflightOptions options = flags->options;
    if (verb->count("--seed")) options.seed = flags->seed;
    std::stringstream list(flags->checks);
    for (std::string name; std::getline(list, name, ',');)
      if (!name.empty()) options.only.push_back(name);
    const auto log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    const tools::PreflightReport report = tools::run_preflight(options, log);
    const nlohmann::json json = tools::preflight_json(report);
    if (flags->json) std::printf("%s\n", json.dump(2).c_str());
    else std::fputs(tools::preflight_text(report).c_str(), stdout);
    std::fflush(stdout);

    tools::NotebookRun run;
    run.kind = "preflight";
    run.base_url = report.base_url;
    run.model = report.model;
    run.passed = report.passed;
    run.figures = json;
    run.flags = {{"no_thinking", options.no_thinking}, {"tool_batch", options.tool_batch}, {"max_tokens", options.max_tokens}};
    if (options.needle_ctx > 0) run.flags["needle_ctx"] = options.needle_ctx;
    if (!options.only.empty()) run.flags["checks"] = options.only;
    flags->notebook.record(run, tools::parse_base_url(options.base_url), report.engine, report.quantization);
    // Any failed check fails the command.
    if (!report.passed) std::exit(1);
  });
}

}  // namespace anvil::cli
