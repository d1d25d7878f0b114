#pragma once
// anvil preflight: does an OpenAI-compatible server answer correctly? Each check separates what
// any healthy server must do (the protocol: schema-valid JSON under response_format, tool calls
// in tool_calls with parseable arguments, reasoning kept out of content, honest finish_reason,
// stop strings, streamed == whole) from what needs a capable model (a right answer, a recalled
// needle, the right tool arguments), and says which part failed.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace anvil::tools {

struct PreflightOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;  // default: the first id of /v1/models
  std::string api_key;
  bool no_thinking = false;   // ask for no reasoning (chat_template_kwargs.enable_thinking=false)
  int64_t needle_ctx = 0;     // 0: 4096, or 90% of max_model_len when that is smaller
  int64_t tool_batch = 8;     // tool-call requests sent at once
  int64_t max_tokens = 1024;  // room for the answers of the quality checks (reasoning included)
  double timeout_s = 600;
  std::optional<uint64_t> seed;          // the code word and its depth; random when unset
  std::vector<std::string> only;         // run just these checks (names as in kCheckNames)
};

inline const char* const kCheckNames[] = {"models",      "smoke",     "structured_json", "needle", "tool_calls",
                                          "tool_arguments", "reasoning", "stop_finish",   "stream_equivalence"};

struct CheckResult {
  std::string name;
  bool passed = false;
  std::string reason;  // a stable phrase: what passed, or why it failed
  std::string detail;  // what was seen (excerpts, counts)
  bool quality = false;  // judges the model's answer rather than the server's protocol
  double seconds = 0;
};

struct PreflightReport {
  std::string base_url, model, engine, quantization;
  std::optional<int64_t> max_model_len;
  std::vector<CheckResult> checks;
  bool passed = false;
};

using PreflightLog = std::function<void(const std::string&)>;

PreflightReport run_preflight(const PreflightOptions& options, const PreflightLog& log);

// {"checks": [{name, passed, reason, detail, quality, seconds}], "passed", "model", ...}
nlohmann::json preflight_json(const PreflightReport& report);
// One line per check: "PASS  smoke               ..." / "FAIL  needle              reason (detail)".
std::string preflight_text(const PreflightReport& report);

}  // namespace anvil::tools
