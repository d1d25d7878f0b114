#pragma once
// Helpers the verbs share: option parsing and the files around a model directory.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/tokenizer.h"
#include "models/model.h"

namespace anvil::cli {

// "1,2,3" -> ids; a one-line error naming the option and the bad value otherwise.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& option);

// MODEL_DIR/tokenizer.json, or null when the directory has none.
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::filesystem::path& model_dir);

// EOS ids of config.json and generation_config.json together.
std::vector<int32_t> model_eos_ids(const std::filesystem::path& model_dir, const ModelConfig& config);

// --quantize-experts (none, mxfp4, nvfp4, fp8) and --quantize-dense (none, fp8, mxfp4) values; a
// one-line error naming the flag otherwise.
std::optional<WeightFormat> parse_quantize_experts(const std::string& value);
std::optional<WeightFormat> parse_quantize_dense(const std::string& value);

// For the long-running verbs (serve, rig): SIGINT and SIGTERM are blocked in the calling thread
// and so in every thread it starts afterwards, and SIGPIPE is ignored (a client that vanishes
// must not kill the process). Call before starting any thread.
void block_stop_signals();

// Waits on its own thread for SIGINT or SIGTERM (blocked by block_stop_signals) and then calls
// stop(signal) once. Destroying it stops the waiting: declare it after what stop() touches.
class StopSignalWatcher {
 public:
  explicit StopSignalWatcher(std::function<void(int signal)> stop);
  ~StopSignalWatcher();
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

 private:
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

// --threads N on a verb: sets the process-wide thread pool size.
void add_threads_option(CLI::App& verb, int& threads);
void apply_threads_option(int threads);

// The options every verb that loads a model shares.
struct ModelLoadFlags {
  std::string model_dir;
  std::string load_format = "auto";
  std::string rope_freq_dtype = "fp32";
  std::string device = "auto";
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  bool enforce_eager = false;
  std::string quantize_experts = "none";
  std::string quantize_dense = "none";
  int threads = 0;

  void add_to(CLI::App& verb);
  // The numerics flags, shared with serve: CUDA's --dtype, --kv-cache-dtype, --enforce-eager and
  // the CPU's --quantize-experts, --quantize-dense.
  void add_numerics_to(CLI::App& verb);
  // Applies --threads and loads the model.
  std::unique_ptr<Model> load() const;
  // --device resolved for this model: auto picks CUDA when a GPU is visible and the
  // architecture has a CUDA path, else the CPU.
  Device resolve_device(const ModelConfig& config) const;
};

}  // namespace anvil::cli
