// anvil notebook: the results table of every preflight and bench run recorded so far.
#include <cstdio>

#include "cli/verbs.h"
#include "tools/notebook.h"

namespace anvil::cli {

namespace {

struct NotebookOptions {
  std::string path, format = "md";
  bool runs = false, json = false;
};

}  // namespace

void register_notebook(CLI::App& app) {
  auto o = std::make_shared<NotebookOptions>();
  CLI::App* verb = app.add_subcommand("notebook", "Print the results table of recorded preflight and bench runs");
  verb->add_option("--notebook", o->path, "Results notebook (default $XDG_DATA_HOME/anvil/notebook.sqlite)");
  verb->add_option("--format", o->format, "md or html")->capture_default_str()->check(CLI::IsMember({"md", "html"}));
  verb->add_flag("--runs", o->runs, "One row per run instead of one per model, quant, engine and GPU");
  verb->add_flag("--json", o->json, "Print every run as a JSON array");
  verb->callback([o] {
    const auto path = o->path.empty() ? tools::default_notebook_path() : std::filesystem::path(o->path);
    // Reading never creates a notebook: a missing one is an empty table.
    std::vector<tools::NotebookRun> runs;
    if (std::filesystem::exists(path)) runs = tools::Notebook(path).runs();
    if (o->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& run : runs)
        out.push_back({{"id", run.id}, {"kind", run.kind}, {"created_at", run.created_at}, {"base_url", run.base_url},
                       {"model", run.model}, {"quant", run.quant}, {"engine", run.engine}, {"gpu", run.gpu},
                       {"notes", run.notes}, {"passed", run.passed ? nlohmann::json(*run.passed) : nlohmann::json(nullptr)},
                       {"flags", run.flags}, {"figures", run.figures}});
      std::printf("%s\n", out.dump(2).c_str());
      return;
    }
    if (runs.empty()) std::fprintf(stderr, "notebook %s has no runs yet (anvil preflight and anvil bench record them)\n", path.c_str());
    std::fputs(tools::render_notebook(runs, o->format, o->runs).c_str(), stdout);
  });
}

}  // namespace anvil::cli
