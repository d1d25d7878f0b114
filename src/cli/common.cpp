#include "cli/common.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "core/thread_pool.h"

namespace anvil::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& option) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(begin, end - begin);
    item.erase(std::remove_if(item.begin(), item.end(), ::isspace), item.end());
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || value < INT32_MIN ||
        value > INT32_MAX)
      fail("{}: '{}' is not a token id (expected comma-separated integers)", option, item);
    ids.push_back(int32_t(value));
    begin = end + 1;
  }
  return ids;
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "tokenizer.json";
  if (!std::filesystem::exists(path)) return nullptr;
  return Tokenizer::from_file(path);
}

std::vector<int32_t> model_eos_ids(const std::filesystem::path& model_dir, const ModelConfig& config) {
  std::vector<int32_t> ids = config.eos_token_ids;
  for (int32_t id : load_generation_config(model_dir / "generation_config.json").eos_token_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

void add_threads_option(CLI::App& verb, int& threads) {
  verb.add_option("--threads", threads, "CPU threads (default: ANVIL_THREADS or all cores)");
}

void apply_threads_option(int threads) {
  if (threads > 0) set_default_thread_count(threads);
}

LoadFormat parse_load_format(const std::string& value) {
  if (value == "auto") return LoadFormat::Auto;
  if (value == "dummy") return LoadFormat::Dummy;
  fail("--load-format: '{}' is not one of auto, dummy", value);
}

}  // namespace anvil::cli
