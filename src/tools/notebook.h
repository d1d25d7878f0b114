#pragma once
// The results notebook: every preflight and bench run, kept in one SQLite file, and the
// "which models serve, and how" table rendered from it (Markdown or HTML).
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

struct sqlite3;

namespace anvil::tools {

struct NotebookRun {
  int64_t id = 0;
  std::string kind;        // "preflight" or "bench"
  std::string created_at;  // UTC, "2026-11-30T07:40:55Z"; set by add() when empty
  std::string base_url, model, quant, engine, gpu, notes;
  nlohmann::json flags = nlohmann::json::object();    // the options that shaped the run
  nlohmann::json figures = nlohmann::json::object();  // preflight: its report; bench: its result
  std::optional<bool> passed;                          // preflight: every check passed
};

// $XDG_DATA_HOME/anvil/notebook.sqlite, else ~/.local/share/anvil/notebook.sqlite.
std::filesystem::path default_notebook_path();

class Notebook {
 public:
  // Opens (creating the file, its folder and the table when missing); throws anvil::Error naming
  // the path when it cannot.
  explicit Notebook(const std::filesystem::path& path);
  ~Notebook();
  Notebook(const Notebook&) = delete;
  Notebook& operator=(const Notebook&) = delete;

  // Stores a run; returns its id.
  int64_t add(NotebookRun run);
  // Every run, oldest first.
  std::vector<NotebookRun> runs() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
};

// The results table: one row per model | quant | engine | GPU, from its latest preflight
// (serves?) and latest bench (key flags, figures), with every note given for it.
// format: "md" or "html". With all_runs, one row per run instead.
std::string render_notebook(const std::vector<NotebookRun>& runs, const std::string& format, bool all_runs = false);

// This host's GPUs as the notebook names them ("NVIDIA H200", "2x NVIDIA H200"), or "CPU" when
// none is visible: what a server on loopback runs on.
std::string local_gpu_label();

// One line of figures for a bench result (vLLM keys): "812 tok/s out, 6.4 req/s, TTFT p50 41 ms, ...".
std::string bench_figures_summary(const nlohmann::json& result);

}  // namespace anvil::tools
