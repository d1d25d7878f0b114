#include "cli/verbs.h"

namespace anvil::cli {

void register_verbs(CLI::App& app) {
  register_generate(app);
  register_logits(app);
  register_tokenize(app);
  register_init_demo(app);
  register_bench_cpu(app);
  register_serve(app);
  register_bench_gpu(app);
  register_doctor(app);
  register_preflight(app);
  register_bench(app);
  register_notebook(app);
  register_perplexity(app);
  register_chat(app);
  register_plan(app);
  register_rig(app);
}

}  // namespace anvil::cli
