#include "cli/common.h"

#include <pthread.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <ctime>

#include "backend/cuda/runtime.h"
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

std::optional<WeightFormat> parse_quantize_experts(const std::string& value) {
  if (value == "none") return std::nullopt;
  if (value == "mxfp4") return WeightFormat::MXFP4;
  if (value == "nvfp4") return WeightFormat::NVFP4;
  if (value == "fp8") return WeightFormat::FP8;
  fail("--quantize-experts: '{}' is not one of none, mxfp4, nvfp4, fp8", value);
}

std::optional<WeightFormat> parse_quantize_dense(const std::string& value) {
  if (value == "none") return std::nullopt;
  if (value == "fp8") return WeightFormat::FP8;
  if (value == "mxfp4") return WeightFormat::MXFP4;
  fail("--quantize-dense: '{}' is not one of none, fp8, mxfp4", value);
}

namespace {

sigset_t stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

}  // namespace

void block_stop_signals() {
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

StopSignalWatcher::StopSignalWatcher(std::function<void(int)> stop)
    : thread_([this, stop = std::move(stop)] {
        const sigset_t signals = stop_signals();
        // Wakes every 200 ms to see whether it is still wanted.
        const timespec tick{0, 200'000'000};
        while (!finished_) {
          const int signal = sigtimedwait(&signals, nullptr, &tick);
          if (signal > 0) {
            stop(signal);
            return;
          }
        }
      }) {}

StopSignalWatcher::~StopSignalWatcher() {
  finished_ = true;
  thread_.join();
}

void add_threads_option(CLI::App& verb, int& threads) {
  verb.add_option("--threads", threads, "CPU threads (default: ANVIL_THREADS or all cores)");
}

void apply_threads_option(int threads) {
  if (threads > 0) set_default_thread_count(threads);
}

void ModelLoadFlags::add_to(CLI::App& verb) {
  verb.add_option("--model", model_dir, "Hugging Face checkpoint directory")->required();
  verb.add_option("--load-format", load_format, "auto (read weights) or dummy (random weights, no files)");
  verb.add_option("--rope-freq-dtype", rope_freq_dtype,
                  "fp32 (as from_pretrained) or bf16 (as a model cast whole with .to(bfloat16))");
  verb.add_option("--device", device, "auto (a CUDA GPU when present and supported, else the CPU), cpu, cuda or cuda:N");
  add_numerics_to(verb);
  add_threads_option(verb, threads);
}

void ModelLoadFlags::add_numerics_to(CLI::App& verb) {
  verb.add_option("--dtype", dtype,
                  "CUDA activations: auto (= bfloat16 matrix inputs), bfloat16, or float32 (every activation and "
                  "the KV cache float32: slower, within float32 rounding of the reference); the CPU is float32");
  verb.add_option("--kv-cache-dtype", kv_cache_dtype, "CUDA KV cache: auto (follows --dtype), bfloat16, float32, fp8 (e4m3)");
  verb.add_flag("--enforce-eager", enforce_eager, "CUDA: run every step kernel by kernel (no CUDA graphs for decode)");
  verb.add_option("--quantize-experts", quantize_experts,
                  "Re-quantize the MoE experts at load: none (as stored), mxfp4 (E2M1 + E8M0 per 32; already "
                  "so in gpt-oss), nvfp4 (E2M1 + E4M3 per 16 + a per-tensor scale) or fp8 (E4M3, a scale per "
                  "output row); gpt-oss re-quantizes its MXFP4 values. CPU and CUDA");
  verb.add_option("--quantize-dense", quantize_dense,
                  "Re-quantize the attention projections and dense MLPs at load: none, fp8 (E4M3, a scale "
                  "per output row; CPU and CUDA) or mxfp4 (CPU). Embeddings, lm_head, routers and norms always stay "
                  "as stored");
}

Device ModelLoadFlags::resolve_device(const ModelConfig& config) const {
  if (device == "cpu") return Device::Cpu;
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) return Device::Cuda;
  if (device != "auto") fail("--device: '{}' is not one of auto, cpu, cuda, cuda:N", device);
  return !cuda::devices().empty() && architecture_has_cuda_path(config.architecture) ? Device::Cuda : Device::Cpu;
}

std::unique_ptr<Model> ModelLoadFlags::load() const {
  apply_threads_option(threads);
  LoadOptions options;
  if (load_format == "dummy") {
    options.format = LoadFormat::Dummy;
  } else if (load_format != "auto") {
    fail("--load-format: '{}' is not one of auto, dummy", load_format);
  }
  if (rope_freq_dtype == "bf16") {
    options.rope_inv_freq_bf16 = true;
  } else if (rope_freq_dtype != "fp32") {
    fail("--rope-freq-dtype: '{}' is not one of fp32, bf16", rope_freq_dtype);
  }
  const ModelConfig config = load_model_config(std::filesystem::path(model_dir) / "config.json");
  options.device = resolve_device(config);
  options.dtype = parse_compute_dtype(dtype);
  options.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  options.enforce_eager = enforce_eager;
  options.quantize_experts = parse_quantize_experts(quantize_experts);
  options.quantize_dense = parse_quantize_dense(quantize_dense);
  if (device.rfind("cuda:", 0) == 0) {
    const std::string index = device.substr(5);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos)
      fail("--device: '{}' is not cuda:N", device);
    options.cuda_device = std::stoi(index);
  }
  return load_model(model_dir, options);
}

}  // namespace anvil::cli
