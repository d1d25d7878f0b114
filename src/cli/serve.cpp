// anvil serve: the OpenAI-compatible HTTP server. Flags follow `vllm serve` so scripts carry over.
#include <limits>

#include "cli/common.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "server/http_server.h"
#include "server/log.h"

namespace anvil::cli {

namespace {

struct ServeOptions {
  ModelLoadFlags model;
  std::vector<std::string> served_model_names;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;
  double kv_cache_gib = 2.0;
  bool kv_cache_gib_set = false;
  double gpu_memory_utilization = 0.9;
  bool enable_prefix_caching = true;
  bool no_prefix_caching = false;
  size_t max_body_bytes = size_t(8) << 20;
  int64_t max_queued_requests = 1024;
};

void run_serve(const ServeOptions& options) {
  if (options.model.load_format != "auto" && options.model.load_format != "dummy")
    fail("--load-format: '{}' is not one of auto, dummy", options.model.load_format);
  if (!std::filesystem::is_directory(options.model.model_dir)) fail("{}: not a model directory", options.model.model_dir);
  if (!(options.kv_cache_gib > 0.0) || options.kv_cache_gib > 1e6)
    fail("--kv-cache-memory must be a positive number of GiB, got {}", options.kv_cache_gib);
  if (options.port < 0 || options.port > 65535) fail("--port must be in [0, 65535], got {}", options.port);
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0))
    fail("--gpu-memory-utilization must be in (0, 1], got {}", options.gpu_memory_utilization);
  if (options.max_body_bytes == 0) fail("--max-body-bytes must be positive");
  if (options.max_queued_requests < 0)
    fail("--max-queued-requests must be 0 (no bound) or positive, got {}", options.max_queued_requests);

  server::ServerConfig config;
  config.host = options.host;
  config.port = options.port;
  config.model_dir = options.model.model_dir;
  config.served_model_names = options.served_model_names;
  config.api_key = options.api_key;
  config.max_body_bytes = options.max_body_bytes;
  config.version = ANVIL_VERSION;
  config.engine.max_num_seqs = options.max_num_seqs;
  config.engine.max_num_batched_tokens = options.max_num_batched_tokens;
  config.engine.max_model_len = options.max_model_len;
  config.engine.kv_cache_bytes = size_t(options.kv_cache_gib * double(size_t(1) << 30));
  config.engine.kv_cache_bytes_set = options.kv_cache_gib_set;
  config.engine.gpu_memory_utilization = options.gpu_memory_utilization;
  config.engine.enable_prefix_caching = options.enable_prefix_caching && !options.no_prefix_caching;
  config.engine.max_waiting =
      options.max_queued_requests > 0 ? options.max_queued_requests : std::numeric_limits<int64_t>::max();

  // Signals go to one thread that stops the server cleanly; the HTTP workers, the engine and the
  // loader never see them.
  block_stop_signals();
  server::OpenAiServer http(config);
  http.bind();
  const StopSignalWatcher watcher([&http](int signal) {
    server::log_info("received signal {}, shutting down", signal);
    http.stop();
  });
  const ModelLoadFlags model_flags = options.model;
  http.load_in_background([model_flags] { return model_flags.load(); });
  http.run();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* verb = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  verb->add_option("model_dir", options->model.model_dir, "Hugging Face checkpoint directory")->required();
  verb->add_option("--served-model-name", options->served_model_names,
                   "Names clients may use for the model (default: MODEL_DIR); the first names responses");
  verb->add_option("--host", options->host, "Address to listen on");
  verb->add_option("--port", options->port, "Port to listen on (0: any free port)");
  verb->add_option("--api-key", options->api_key, "Require Authorization: Bearer KEY on /v1 routes")->envname("ANVIL_API_KEY");
  verb->add_option("--max-num-seqs", options->max_num_seqs, "Sequences running at once");
  verb->add_option("--max-num-batched-tokens", options->max_num_batched_tokens, "Tokens per engine step");
  verb->add_option("--max-model-len", options->max_model_len, "Context length (default: the model's)");
  verb->add_option("--kv-cache-memory", options->kv_cache_gib,
                   "KV cache size in GiB (CPU default 2; on a GPU it overrides --gpu-memory-utilization)")
      ->each([options](const std::string&) { options->kv_cache_gib_set = true; });
  verb->add_option("--gpu-memory-utilization", options->gpu_memory_utilization,
                   "Share of the GPU's memory for weights, activations and KV cache (default 0.9)");
  verb->add_option("--device", options->model.device, "auto (a CUDA GPU when present and supported), cpu, cuda, cuda:N");
  options->model.add_numerics_to(*verb);
  verb->add_flag("--enable-prefix-caching", options->enable_prefix_caching, "Reuse KV blocks of shared prompt prefixes (default)");
  verb->add_flag("--no-enable-prefix-caching", options->no_prefix_caching, "Turn prefix caching off");
  verb->add_option("--load-format", options->model.load_format, "auto (read weights) or dummy (random weights)");
  verb->add_option("--rope-freq-dtype", options->model.rope_freq_dtype, "fp32 or bf16 (see generate)");
  verb->add_option("--max-body-bytes", options->max_body_bytes, "Largest request body accepted (413 beyond)");
  // SGLang's name for this bound, and as an alias the name vLLM's queue-bound proposals use. vLLM's
  // merged --max-num-queued-reqs is no alias: it counts running requests too.
  verb->add_option("--max-queued-requests,--max-waiting-queue-length", options->max_queued_requests,
                   "Sequences that may wait for the engine beyond the running ones (each of n counts); more "
                   "get 503 with Retry-After (0: no bound; default 1024)");
  add_threads_option(*verb, options->model.threads);
  verb->callback([options] { run_serve(*options); });
}

}  // namespace anvil::cli
