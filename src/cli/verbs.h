#pragma once
#include <CLI/CLI.hpp>

namespace anvil::cli {

// Adds every verb's subcommand; each verb runs from its subcommand's callback.
void register_verbs(CLI::App& app);

void register_generate(CLI::App& app);
void register_logits(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_init_demo(CLI::App& app);
void register_bench_cpu(CLI::App& app);
void register_serve(CLI::App& app);
void register_bench_gpu(CLI::App& app);
void register_doctor(CLI::App& app);
void register_preflight(CLI::App& app);
void register_bench(CLI::App& app);
void register_notebook(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_chat(CLI::App& app);
void register_plan(CLI::App& app);
void register_rig(CLI::App& app);

}  // namespace anvil::cli
