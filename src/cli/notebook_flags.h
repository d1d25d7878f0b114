#pragma once
// The options preflight and bench share for the results notebook: where it lives, and the labels
// a run is filed under when the server does not say (engine, GPU, quantization) or cannot know
// (notes, how the server was started).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tools/notebook.h"
#include "tools/openai_client.h"

namespace anvil::cli {

struct NotebookFlags {
  std::string path, engine, gpu, quant, notes, server_flags;
  bool skip = false;

  void add_to(CLI::App& verb) {
    verb.add_option("--notebook", path, "Results notebook (SQLite; default $XDG_DATA_HOME/anvil/notebook.sqlite)");
    verb.add_flag("--no-notebook", skip, "Do not record this run in the notebook");
    verb.add_option("--engine", engine, "Engine label for the notebook (default: what the server reports)");
    verb.add_option("--gpu", gpu, "GPU label for the notebook (default: this host's GPUs for a loopback server)");
    verb.add_option("--quant", quant, "Quantization label for the notebook (default: from the model's config or name)");
    verb.add_option("--notes", notes, "A note to keep with this run in the notebook");
    verb.add_option("--server-flags", server_flags, "How the server was started, e.g. \"--max-model-len 32768\"");
  }

  // Fills the labels (flags first, then what the server said) and stores the run; a note on stderr.
  void record(tools::NotebookRun run, const tools::BaseUrl& url, const std::string& engine_seen,
              const std::string& quant_seen) const {
    if (skip) return;
    run.engine = !engine.empty() ? engine : engine_seen;
    run.quant = !quant.empty() ? quant : quant_seen;
    run.gpu = !gpu.empty() ? gpu : (url.loopback() ? tools::local_gpu_label() : "");
    run.notes = notes;
    if (!server_flags.empty()) run.flags["server_flags"] = server_flags;
    const auto where = path.empty() ? tools::default_notebook_path() : std::filesystem::path(path);
    tools::Notebook notebook(where);
    const int64_t id = notebook.add(run);
    std::fprintf(stderr, "%s: recorded as run %lld in %s\n", run.kind.c_str(), static_cast<long long>(id), where.c_str());
  }
};

}  // namespace anvil::cli
