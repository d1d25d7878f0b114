#include "tools/notebook.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fmt/format.h>
#include <map>
#include <set>
#include <tuple>

#include "backend/cuda/runtime.h"
#include "core/error.h"

namespace anvil::tools {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr const char* kSchema = R"(
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,
  created_at TEXT NOT NULL,
  base_url TEXT NOT NULL DEFAULT '',
  model TEXT NOT NULL DEFAULT '',
  quant TEXT NOT NULL DEFAULT '',
  engine TEXT NOT NULL DEFAULT '',
  gpu TEXT NOT NULL DEFAULT '',
  notes TEXT NOT NULL DEFAULT '',
  passed INTEGER,
  flags TEXT NOT NULL DEFAULT '{}',
  figures TEXT NOT NULL DEFAULT '{}'
);
)";

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

class Statement {
 public:
  Statement(sqlite3* db, const char* sql, const fs::path& path) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK)
      fail("notebook {}: {}", path.string(), sqlite3_errmsg(db));
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  void bind(int index, const std::string& text) { sqlite3_bind_text(stmt_, index, text.c_str(), int(text.size()), SQLITE_TRANSIENT); }
  void bind(int index, std::optional<bool> flag) {
    if (flag) sqlite3_bind_int(stmt_, index, *flag ? 1 : 0);
    else sqlite3_bind_null(stmt_, index);
  }
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail("notebook {}: {}", path_.string(), sqlite3_errmsg(db_));
  }
  std::string text(int column) const {
    const auto* data = sqlite3_column_text(stmt_, column);
    return data ? std::string(reinterpret_cast<const char*>(data), size_t(sqlite3_column_bytes(stmt_, column))) : std::string();
  }
  int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  bool null(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  const fs::path& path_;
};

}  // namespace

std::string local_gpu_label() {
  const auto gpus = cuda::devices();
  if (gpus.empty()) return "CPU";
  std::map<std::string, int> counts;
  std::vector<std::string> order;
  for (const auto& gpu : gpus)
    if (counts[gpu.name]++ == 0) order.push_back(gpu.name);
  std::string out;
  for (const std::string& name : order)
    out += (out.empty() ? "" : " + ") + (counts[name] > 1 ? std::to_string(counts[name]) + "x " : std::string()) + name;
  return out;
}

fs::path default_notebook_path() {
  if (const char* data = std::getenv("XDG_DATA_HOME"); data && *data && fs::path(data).is_absolute())
    return fs::path(data) / "anvil" / "notebook.sqlite";
  const char* home = std::getenv("HOME");
  return fs::path(home && *home ? home : ".") / ".local" / "share" / "anvil" / "notebook.sqlite";
}

Notebook::Notebook(const fs::path& path) : path_(path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    fail("notebook {}: cannot open ({})", path.string(), why);
  }
  sqlite3_busy_timeout(db_, 5000);  // two runs finishing at once take turns
  char* error = nullptr;
  if (sqlite3_exec(db_, kSchema, nullptr, nullptr, &error) != SQLITE_OK) {
    const std::string why = error ? error : "unknown error";
    sqlite3_free(error);
    sqlite3_close(db_);
    db_ = nullptr;
    fail("notebook {}: {} (is it an anvil notebook?)", path.string(), why);
  }
}

Notebook::~Notebook() {
  if (db_) sqlite3_close(db_);
}

int64_t Notebook::add(NotebookRun run) {
  if (run.created_at.empty()) run.created_at = utc_now();
  Statement insert(db_,
                   "INSERT INTO runs (kind, created_at, base_url, model, quant, engine, gpu, notes, passed, flags, figures) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   path_);
  insert.bind(1, run.kind);
  insert.bind(2, run.created_at);
  insert.bind(3, run.base_url);
  insert.bind(4, run.model);
  insert.bind(5, run.quant);
  insert.bind(6, run.engine);
  insert.bind(7, run.gpu);
  insert.bind(8, run.notes);
  insert.bind(9, run.passed);
  insert.bind(10, run.flags.dump());
  insert.bind(11, run.figures.dump());
  insert.step();
  return sqlite3_last_insert_rowid(db_);
}

std::vector<NotebookRun> Notebook::runs() const {
  Statement select(db_,
                   "SELECT id, kind, created_at, base_url, model, quant, engine, gpu, notes, passed, flags, figures "
                   "FROM runs ORDER BY id",
                   path_);
  std::vector<NotebookRun> out;
  while (select.step()) {
    NotebookRun run;
    run.id = select.integer(0);
    run.kind = select.text(1);
    run.created_at = select.text(2);
    run.base_url = select.text(3);
    run.model = select.text(4);
    run.quant = select.text(5);
    run.engine = select.text(6);
    run.gpu = select.text(7);
    run.notes = select.text(8);
    if (!select.null(9)) run.passed = select.integer(9) != 0;
    run.flags = Json::parse(select.text(10), nullptr, false);
    if (run.flags.is_discarded()) run.flags = Json::object();
    run.figures = Json::parse(select.text(11), nullptr, false);
    if (run.figures.is_discarded()) run.figures = Json::object();
    out.push_back(std::move(run));
  }
  return out;
}

namespace {

double number(const Json& object, const char* key, double fallback = -1) {
  return object.is_object() && object.contains(key) && object[key].is_number() ? object[key].get<double>() : fallback;
}

std::string figure(double value) {
  if (value < 0) return "?";
  if (value >= 100) return fmt::format("{:.0f}", value);
  if (value >= 10) return fmt::format("{:.1f}", value);
  return fmt::format("{:.2f}", value);
}

std::string one_point(const Json& result) {
  std::string text = fmt::format("{} tok/s out, {} req/s", figure(number(result, "output_throughput")),
                                 figure(number(result, "request_throughput")));
  if (number(result, "median_ttft_ms") >= 0) text += ", TTFT p50 " + figure(number(result, "median_ttft_ms")) + " ms";
  if (number(result, "median_tpot_ms") >= 0) text += ", TPOT p50 " + figure(number(result, "median_tpot_ms")) + " ms";
  if (number(result, "p99_itl_ms") >= 0) text += ", ITL p99 " + figure(number(result, "p99_itl_ms")) + " ms";
  if (number(result, "failed", 0) > 0) text += fmt::format(", {} failed", int64_t(number(result, "failed")));
  return text;
}

// The value a sweep point ran at ("16" for max_concurrency 16, "4" or "inf" for a rate).
std::string sweep_value(const Json& point, const std::string& key) {
  if (!point.contains(key)) return "?";
  const Json& value = point[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  if (value.is_number()) return figure(value.get<double>());
  return value.dump();
}

}  // namespace

std::string bench_figures_summary(const Json& result) {
  if (result.is_object() && result.contains("runs") && result["runs"].is_array() && !result["runs"].empty()) {
    const Json& runs = result["runs"];
    const std::string key = result.contains("sweep") ? result["sweep"].value("key", "") : "";
    size_t best = 0;
    for (size_t i = 1; i < runs.size(); ++i)
      if (number(runs[i], "output_throughput") > number(runs[best], "output_throughput")) best = i;
    std::string values;
    for (const Json& point : runs) values += (values.empty() ? "" : ",") + sweep_value(point, key);
    return fmt::format("best {} at {} {} (sweep {} {})", one_point(runs[best]), key, sweep_value(runs[best], key), key,
                       values);
  }
  return one_point(result);
}

namespace {

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const std::string& part : parts) {
    if (part.empty()) continue;
    out += (out.empty() ? "" : separator) + part;
  }
  return out;
}

// "in 1024, out 128, c 16, rate inf" plus whatever the user said the server ran with.
std::string key_flags(const NotebookRun& run) {
  const Json& f = run.flags;
  std::vector<std::string> parts;
  if (f.contains("server_flags") && f["server_flags"].is_string()) parts.push_back(f["server_flags"].get<std::string>());
  if (run.kind == "bench") {
    if (f.contains("input_len")) parts.push_back("in " + f["input_len"].dump());
    if (f.contains("output_len")) parts.push_back("out " + f["output_len"].dump());
    if (f.contains("sweep") && f["sweep"].is_string() && !f["sweep"].get<std::string>().empty())
      parts.push_back("sweep " + f["sweep"].get<std::string>());
    else {
      if (f.contains("max_concurrency") && !f["max_concurrency"].is_null()) parts.push_back("c " + f["max_concurrency"].dump());
      if (f.contains("request_rate")) {
        const Json& rate = f["request_rate"];
        parts.push_back("rate " + (rate.is_string() ? rate.get<std::string>() : rate.dump()));
      }
    }
  } else {
    if (f.value("no_thinking", false)) parts.push_back("no thinking");
    if (f.contains("needle_ctx")) parts.push_back("needle " + f["needle_ctx"].dump());
  }
  return join(parts, ", ");
}

std::string serves(const NotebookRun* preflight) {
  if (!preflight) return "untested";
  if (preflight->passed.value_or(false)) return "yes";
  std::vector<std::string> failed;
  if (preflight->figures.contains("checks") && preflight->figures["checks"].is_array())
    for (const Json& check : preflight->figures["checks"])
      if (!check.value("passed", false)) failed.push_back(check.value("name", "?"));
  return "no (" + join(failed, ", ") + ")";
}

std::string preflight_figures(const NotebookRun& run) {
  size_t passed = 0, total = 0;
  if (run.figures.contains("checks") && run.figures["checks"].is_array())
    for (const Json& check : run.figures["checks"]) {
      ++total;
      passed += check.value("passed", false);
    }
  return fmt::format("preflight {}/{} checks", passed, total);
}

std::string cell_md(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out.empty() ? "—" : out;
}

std::string cell_html(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out.empty() ? "&mdash;" : out;
}

std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                  const std::string& format) {
  std::string out;
  if (format == "html") {
    out += "<table>\n<thead><tr>";
    for (const std::string& h : header) out += "<th>" + cell_html(h) + "</th>";
    out += "</tr></thead>\n<tbody>\n";
    for (const auto& row : rows) {
      out += "<tr>";
      for (const std::string& cell : row) out += "<td>" + cell_html(cell) + "</td>";
      out += "</tr>\n";
    }
    out += "</tbody>\n</table>\n";
    return out;
  }
  out += "|";
  for (const std::string& h : header) out += " " + cell_md(h) + " |";
  out += "\n|";
  for (size_t i = 0; i < header.size(); ++i) out += " --- |";
  out += "\n";
  for (const auto& row : rows) {
    out += "|";
    for (const std::string& cell : row) out += " " + cell_md(cell) + " |";
    out += "\n";
  }
  return out;
}

}  // namespace

std::string render_notebook(const std::vector<NotebookRun>& runs, const std::string& format, bool all_runs) {
  if (format != "md" && format != "html") fail("--format {}: expected md or html", format);
  std::vector<std::vector<std::string>> rows;
  if (all_runs) {
    for (const NotebookRun& run : runs) {
      const std::string figures = run.kind == "bench" ? bench_figures_summary(run.figures) : preflight_figures(run);
      rows.push_back({std::to_string(run.id), run.created_at, run.kind, run.model, run.quant, run.engine, run.gpu,
                      run.kind == "preflight" ? serves(&run) : "", key_flags(run), figures, run.notes});
    }
    return table({"run", "date", "kind", "model", "quant", "engine", "GPU", "serves?", "key flags", "figures", "notes"},
                 rows, format);
  }
  // One row per model | quant | engine | GPU, in the order each first appeared.
  using Key = std::tuple<std::string, std::string, std::string, std::string>;
  std::vector<Key> order;
  std::map<Key, const NotebookRun*> preflight, bench;
  std::map<Key, std::vector<std::string>> notes;
  for (const NotebookRun& run : runs) {
    const Key key{run.model, run.quant, run.engine, run.gpu};
    if (!preflight.count(key) && !bench.count(key) && !notes.count(key)) order.push_back(key);
    if (run.kind == "preflight") preflight[key] = &run;
    if (run.kind == "bench") bench[key] = &run;
    auto& list = notes[key];
    if (!run.notes.empty() && std::find(list.begin(), list.end(), run.notes) == list.end()) list.push_back(run.notes);
  }
  for (const Key& key : order) {
    const NotebookRun* p = preflight.count(key) ? preflight[key] : nullptr;
    const NotebookRun* b = bench.count(key) ? bench[key] : nullptr;
    std::vector<std::string> flags;
    if (p) flags.push_back(key_flags(*p));
    if (b) flags.push_back(key_flags(*b));
    std::set<std::string> seen;
    std::vector<std::string> unique;
    for (const std::string& f : flags)
      if (!f.empty() && seen.insert(f).second) unique.push_back(f);
    const std::string figures = b ? bench_figures_summary(b->figures) : (p ? preflight_figures(*p) : "");
    rows.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), serves(p), join(unique, "; "),
                    figures, join(notes[key], "; ")});
  }
  return table({"model", "quant", "engine", "GPU", "serves?", "key flags", "figures", "notes"}, rows, format);
}

}  // namespace anvil::tools
